"""The Kimi family: one table of model facts (:data:`MODELS`), every value with its source.

A row (:class:`ModelFacts`) says what a correct SGLang deployment of that model must say: the parsers,
how thinking behaves (default and the switch a client uses), the EAGLE-3 draft model (or that there is
none), the context length, the recommended sampling, the quantisation, the weight size and the shard
layout ``doctor`` compares a downloaded model directory with. The presets (:mod:`kimi_deploy.catalog.presets`),
``init --model``, ``validate``/``doctor``'s fit check and the tool-call id rules
(:mod:`kimi_deploy.tool_ids`, by parser name) read this table; nothing copies its values.

Sources, abbreviated in :attr:`ModelFacts.sources`:

- ``moonshot``: what Moonshot publishes: the model cards and file lists (``huggingface.co/moonshotai/<repo>``),
  ``MoonshotAI/Kimi-K2``'s ``deploy_guidance.md``, and its vendor verifiers (``MoonshotAI/K2-Vendor-Verifier``:
  the published K2VV results; the Kimi Vendor Verifier's ``verify_params.py``: sampling defaults);
- ``sglang-docs``: SGLang's docs and release notes (``docs.sglang.io`` ``basic_usage/kimi_k2``, ``kimi_k2_5``;
  ``sgl-project/sglang`` releases);
- ``sglang 0.5.23 <path>``: the released wheel's own source (``sglang/<path>``);
- ``hf <repo>``: the model repository's published files as named there (file list, docs).

A value the sources do not give is ``None`` and its source says so ("unknown: ..."); a value carried over
from a sibling model is marked "inferred: ...". Nothing here was measured on GPUs.

:func:`weights_fit` is the one fit rule for now: the published weight size against the aggregate memory
of one replica's GPUs with :data:`WEIGHTS_SHARE` headroom. The memory plan (``kimi_deploy.sizing``,
issue 28: KV cache, CUDA graphs, draft model) is meant to subsume it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

GB = 10**9
TB = 10**12

NOTES = "moonshot (the model card on huggingface.co/moonshotai)"
VERIFIER = ("moonshot (Kimi Vendor Verifier verify_params.py: "
            "sampling defaults, temperature 1.0 thinking / 0.6 instant, top_p 0.95)")
K2_REASONING = ("sglang 0.5.23 srt/parser/reasoning_parser.py KimiK2Detector reasoning_default='thinking': on "
                "unless chat_template_kwargs.thinking is false (serving_chat._get_reasoning_from_request)")
K3_REASONING = ("sglang 0.5.23 srt/parser/reasoning_parser.py KimiK3Detector reasoning_default='thinking': on "
                "unless chat_template_kwargs.thinking is false")
THINKING_SWITCH = 'chat_template_kwargs: {"thinking": false}'

#: Weights may take at most this share of one replica's aggregate GPU memory; the rest is for the KV cache,
#: CUDA graphs (~20 GB at start-up, public SGLang and vLLM issue reports on Kimi K2.x), activations and a draft model. The same
#: share ``doctor``'s gpu.memory check warns above (SGLang's --mem-fraction-static defaults near 0.8-0.9).
WEIGHTS_SHARE = 0.85


@dataclasses.dataclass(frozen=True)
class Thinking:
    """How a model thinks: ``default_on`` when a request says nothing; ``switch``: what a request sends to
    turn it off (``None``: it cannot be turned off, e.g. a thinking-only model)."""

    default_on: bool
    switch: str | None


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Recommended sampling: ``temperature`` with thinking on, ``temperature_instant`` with it off (``None``:
    no instant mode, or unknown), ``top_p``. ``None`` everywhere: the sources give none. ``required``: the
    model's own API refuses any other sampling (``check`` and ``bench`` then send it: :meth:`request`)."""

    temperature: float | None
    temperature_instant: float | None
    top_p: float | None
    required: bool = False

    def request(self) -> dict[str, float] | None:
        """``{"temperature": ..., "top_p": ...}`` every request must carry when :attr:`required`, else ``None``."""
        if not self.required or self.temperature is None or self.top_p is None:
            return None
        return {"temperature": self.temperature, "top_p": self.top_p}


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """The safetensors shards a complete download holds: ``count`` files named
    ``model-{i:05d}-of-{count:06d}.safetensors`` (i = 1..count) and ``model.safetensors.index.json``
    (transformers' sharded checkpoint naming with a six-digit total, as Moonshot publishes it)."""

    count: int

    def names(self) -> tuple[str, ...]:
        """Every shard file name, in order."""
        return tuple(f"model-{i:05d}-of-{self.count:06d}.safetensors" for i in range(1, self.count + 1))


#: The fields of :class:`ModelFacts` that are facts and need a source.
FACT_FIELDS = ("released", "tool_call_parser", "reasoning_parser", "thinking", "draft_model", "context_length",
               "sampling", "quantisation", "weights_bytes", "shards", "multimodal")


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """One model of the family. ``key``: the short name ``init --model`` takes (``k2.6``); ``repo``: the
    Hugging Face repository (also the served name the presets use); ``weights_bytes``: on-disk size of the
    published weights, bytes (decimal GB/TB as published; ``None``: unknown); ``context_length``: tokens;
    ``draft_model``: the EAGLE-3 draft repository or ``None`` (its source says why there is none);
    ``sources``: field name -> where the value comes from (every field of :data:`FACT_FIELDS`).

    Raises:
        ValueError: at import, a fact without a source (the table's invariant).
    """

    key: str
    name: str
    repo: str
    released: str
    tool_call_parser: str
    reasoning_parser: str
    thinking: Thinking
    draft_model: str | None
    context_length: int | None
    sampling: Sampling
    quantisation: str | None
    weights_bytes: int | None
    shards: ShardLayout | None
    multimodal: bool | None
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        missing = [f for f in FACT_FIELDS if not self.sources.get(f)]
        if missing:
            raise ValueError(f"model {self.key}: no source for {', '.join(missing)}")

    def weights_text(self) -> str:
        """The weight size as people say it (``~595 GB``, ``~1.68 TB``; ``unknown``)."""
        return "unknown" if self.weights_bytes is None else _size(self.weights_bytes)

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form (``kimi-deploy presets --json`` shows it per preset)."""
        data = dataclasses.asdict(self)
        data["sources"] = dict(self.sources)
        return data


def _size(n: float) -> str:
    return f"~{n / TB:.2f} TB" if n >= TB else f"~{n / GB:.0f} GB"


MODELS: dict[str, ModelFacts] = {m.key: m for m in (
    ModelFacts(
        key="k2-thinking", name="Kimi K2-Thinking", repo="moonshotai/Kimi-K2-Thinking", released="2025-11",
        tool_call_parser="kimi_k2", reasoning_parser="kimi_k2",
        thinking=Thinking(default_on=True, switch=None), draft_model=None, context_length=262144,
        sampling=Sampling(temperature=1.0, temperature_instant=None, top_p=0.95),
        quantisation="INT4", weights_bytes=595 * GB, shards=ShardLayout(62),
        multimodal=False,
        sources={
            "released": NOTES,
            "tool_call_parser": "sglang-docs (parsers: --tool-call-parser kimi_k2 for the K2 family)",
            "reasoning_parser": "sglang-docs (--reasoning-parser kimi_k2 for the K2 family)",
            "thinking": "moonshot (a thinking model; K2VV judged it with thinking at temperature 1.0); " + K2_REASONING
                        + "; its template has no instant mode, so no switch is offered",
            "draft_model": "none: Moonshot's published facts name EAGLE-3 drafts for K2.5 only (lightseekorg/kimi-k2.5-eagle3*)",
            "context_length": "moonshot ('TP8 on 8xH200 for 256k context'): 256 x 1024 tokens",
            "sampling": "moonshot (K2VV published for K2-Thinking at temperature 1.0); top_p from " + VERIFIER,
            "quantisation": "moonshot (INT4)",
            "weights_bytes": "hf moonshotai/Kimi-K2-Thinking: 62 shards of ~9.8 GB (~595 GB; a public deployment "
                             "measured 554 GiB on disk)",
            "shards": "hf moonshotai/Kimi-K2-Thinking file list: model-00001-of-000062 .. model-00062-of-000062"
                      ".safetensors + model.safetensors.index.json (as vllm-ascend's Kimi-K2-Thinking guide lists it)",
            "multimodal": "moonshot (only K2.5 is listed multimodal)",
        }),
    ModelFacts(
        key="k2.5", name="Kimi K2.5", repo="moonshotai/Kimi-K2.5", released="2026-01",
        tool_call_parser="kimi_k2", reasoning_parser="kimi_k2",
        thinking=Thinking(default_on=True, switch=THINKING_SWITCH),
        draft_model="lightseekorg/kimi-k2.5-eagle3-mla", context_length=262144,
        sampling=Sampling(temperature=1.0, temperature_instant=0.6, top_p=0.95),
        quantisation="INT4", weights_bytes=595 * GB, shards=ShardLayout(64),
        multimodal=True,
        sources={
            "released": NOTES,
            "tool_call_parser": "sglang-docs; docs.sglang.io basic_usage/kimi_k2_5 (kimi_k2 required for tool calls)",
            "reasoning_parser": "sglang-docs; docs.sglang.io basic_usage/kimi_k2_5",
            "thinking": "docs.sglang.io basic_usage/kimi_k2_5 (thinking on by default; instant mode with "
                        "chat_template_kwargs.thinking=false); " + K2_REASONING,
            "draft_model": "moonshot and sglang-docs (lightseekorg/kimi-k2.5-eagle3-mla, current; the reference "
                           "preset's draft)",
            "context_length": "docs.sglang.io basic_usage/kimi_k2_5 ('256K context'): 256 x 1024 tokens",
            "sampling": VERIFIER,
            "quantisation": "moonshot (INT4)",
            "weights_bytes": "moonshot (~595 GB on disk)",
            "shards": "hf moonshotai/Kimi-K2.5 file list: model-00001-of-000064 .. model-00064-of-000064"
                      ".safetensors + model.safetensors.index.json",
            "multimodal": "moonshot (multimodal: MoonViT vision encoder)",
        }),
    ModelFacts(
        key="k2.6", name="Kimi K2.6", repo="moonshotai/Kimi-K2.6", released="2026-04",
        tool_call_parser="kimi_k2", reasoning_parser="kimi_k2",
        thinking=Thinking(default_on=True, switch=THINKING_SWITCH), draft_model=None, context_length=262144,
        sampling=Sampling(temperature=1.0, temperature_instant=0.6, top_p=0.95),
        quantisation="INT4", weights_bytes=595 * GB, shards=ShardLayout(64),
        multimodal=True,
        sources={
            "released": NOTES + " (~2026-04)",
            "tool_call_parser": "inferred: moonshot ('K2.5's architecture'), K2.5's parser",
            "reasoning_parser": "inferred: moonshot ('K2.5's architecture'), K2.5's parser",
            "thinking": "inferred: moonshot ('K2.5's architecture'), K2.5's template switch; " + K2_REASONING,
            "draft_model": "none: no EAGLE-3 draft published for K2.6 in Moonshot's published facts; K2.5's drafts were trained on "
                           "K2.5 outputs and their accept length on K2.6 is unmeasured",
            "context_length": "inferred: moonshot ('K2.5's architecture'), K2.5's 256K",
            "sampling": VERIFIER,
            "quantisation": "inferred: moonshot ('K2.5's architecture'), K2.5's INT4",
            "weights_bytes": "inferred: moonshot ('K2.5's architecture'), K2.5's ~595 GB",
            "shards": "inferred: K2.5's 64-shard layout (a public K2.6 checkout names model-00064-of-000064"
                      ".safetensors)",
            "multimodal": "inferred: moonshot ('K2.5's architecture', multimodal)",
        }),
    ModelFacts(
        key="k2.7-code", name="Kimi K2.7-Code", repo="moonshotai/Kimi-K2.7-Code", released="2026-06",
        tool_call_parser="kimi_k2", reasoning_parser="kimi_k2",
        thinking=Thinking(default_on=True, switch=None), draft_model=None, context_length=None,
        sampling=Sampling(temperature=1.0, temperature_instant=None, top_p=0.95, required=True),
        quantisation=None, weights_bytes=None, shards=None, multimodal=None,
        sources={
            "released": NOTES,
            "tool_call_parser": "inferred: a K2.x model; Moonshot's published facts name kimi_k3 for K3 only. Confirm with "
                                "`kimi-deploy check` (/model_info) after the first start",
            "reasoning_parser": "inferred: a K2.x model, as tool_call_parser",
            "thinking": "moonshot ('thinking only'): on, and no switch turns it off",
            "draft_model": "none: no EAGLE-3 draft published for K2.7-Code in Moonshot's published facts",
            "context_length": "unknown: not in Moonshot's published facts; SGLang reads max_position_embeddings from config.json",
            "sampling": "moonshot (thinking only: no instant temperature; Moonshot's API rejects sampling other than "
                        "temperature 1.0 / top_p 0.95: required); values from " + VERIFIER,
            "quantisation": "unknown: not in Moonshot's published facts",
            "weights_bytes": "unknown: not in Moonshot's published facts; doctor measures the downloaded shards",
            "shards": "unknown: not in Moonshot's published facts; doctor checks the directory against its own index",
            "multimodal": "unknown: not in Moonshot's published facts",
        }),
    ModelFacts(
        key="k3", name="Kimi K3", repo="moonshotai/Kimi-K3", released="2026-07",
        tool_call_parser="kimi_k3", reasoning_parser="kimi_k3",
        thinking=Thinking(default_on=True, switch=THINKING_SWITCH), draft_model=None, context_length=1048576,
        sampling=Sampling(temperature=None, temperature_instant=None, top_p=None),
        quantisation="MXFP4", weights_bytes=1680 * GB, shards=None, multimodal=None,
        sources={
            "released": NOTES,
            "tool_call_parser": "moonshot (parsers kimi_k3); sglang 0.5.23 srt/parser/template_detection.py "
                                "(KimiK3 architecture -> kimi_k3, kimi_k3)",
            "reasoning_parser": "moonshot (parsers kimi_k3); sglang 0.5.23 srt/parser/reasoning_parser.py",
            "thinking": K3_REASONING,
            "draft_model": "none: no draft model for K3 in Moonshot's published facts",
            "context_length": "moonshot ('1M context'), read as 1024 x 1024 tokens; config.json not quoted",
            "sampling": "unknown: Moonshot publishes no K3 sampling defaults",
            "quantisation": "moonshot (MXFP4)",
            "weights_bytes": "moonshot (~1.68 TB; 2.8T-parameter MoE)",
            "shards": "unknown: Moonshot quotes no K3 file list",
            "multimodal": "unknown: not in Moonshot's published facts",
        }),
)}


def get_model(key: str) -> ModelFacts:
    """The row for ``key`` (``k2.6``; case-insensitive, ``_`` for ``.`` accepted).

    Raises:
        KeyError: no such model; the message lists the keys there are.
    """
    wanted = key.strip().lower().replace("_", ".")
    for m in MODELS.values():
        if wanted in (m.key, m.key.replace("-", "."), m.repo.lower(), m.repo.lower().split("/")[-1]):
            return m
    raise KeyError(f"no model {key!r}; models: {', '.join(MODELS)}")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def identify(*names: str | None) -> ModelFacts | None:
    """The model a profile deploys, read off its ``model_path`` and ``served_model_name`` (in that order):
    the first whose last path component is a known repository's name (``/models/moonshotai/Kimi-K2.6`` and
    ``Kimi-K2.6`` are K2.6; case, ``.``/``_``/``-`` ignored). ``None``: no known model (a local fine-tune
    under another name is not guessed)."""
    by_name = {_norm(m.repo.split("/")[-1]): m for m in MODELS.values()}
    for name in names:
        if name:
            found = by_name.get(_norm(str(name).rstrip("/").rsplit("/", 1)[-1]))
            if found:
                return found
    return None


def required_sampling(*names: str | None) -> dict[str, float] | None:
    """The sampling every request must carry for the model :func:`identify` finds in ``names`` (its
    :meth:`Sampling.request`: K2.7-Code, whose own API refuses others), ``None`` for any other model or none."""
    model = identify(*names)
    return model.sampling.request() if model is not None else None


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU kind for the fit rule: ``memory_bytes`` as its vendor lists it (decimal GB)."""

    name: str
    memory_bytes: int
    source: str


#: The reference host's GPU: NVIDIA RTX PRO 6000 Blackwell, 96 GB GDDR7 (NVIDIA's product page; the kit's
#: reference host has 8 of them).
REFERENCE_GPU = Gpu("RTX PRO 6000 Blackwell", 96 * GB, "NVIDIA RTX PRO 6000 Blackwell: 96 GB GDDR7")
REFERENCE_GPUS = 8

#: GPU kinds :func:`what_fits` suggests, smallest first (vendor-listed memory per GPU).
LARGER_GPUS: tuple[Gpu, ...] = (
    Gpu("H200", 141 * GB, "NVIDIA H200: 141 GB HBM3e"),
    Gpu("B200", 180 * GB, "NVIDIA DGX B200: 1,440 GB over 8 GPUs"),
    Gpu("B300", 288 * GB, "NVIDIA B300 (Blackwell Ultra): 288 GB HBM3e"),
)


@dataclasses.dataclass(frozen=True)
class Fit:
    """:func:`weights_fit`'s verdict. ``usable_bytes`` = ``gpus * gpu.memory_bytes * share``;
    ``fits``: ``weights_bytes <= usable_bytes``; ``None`` when the weight size is unknown."""

    model: ModelFacts
    gpu: Gpu
    gpus: int
    share: float

    @property
    def total_bytes(self) -> int:
        return self.gpus * self.gpu.memory_bytes

    @property
    def usable_bytes(self) -> float:
        return self.total_bytes * self.share

    @property
    def fits(self) -> bool | None:
        return None if self.model.weights_bytes is None else self.model.weights_bytes <= self.usable_bytes

    def evidence(self) -> str:
        """One line with the numbers: weights vs aggregate memory and the share they take."""
        memory = f"{self.gpus} x {self.gpu.memory_bytes / GB:.0f} GB {self.gpu.name} = {_size(self.total_bytes)}"
        if self.model.weights_bytes is None:
            return f"{self.model.name} weights: unknown ({self.model.sources['weights_bytes']}); GPU memory {memory}"
        share = self.model.weights_bytes / self.total_bytes
        quant = f" ({self.model.quantisation})" if self.model.quantisation else ""
        text = f"{self.model.name} weights {self.model.weights_text()}{quant} vs GPU memory {memory}: {share:.0%}"
        if self.fits:
            return text + f" (at most {self.share:.0%})"
        return text + f" of it, over the {self.share:.0%} the weights may take (the rest is KV cache and CUDA graphs)"

    def what_fits(self) -> str:
        """The smallest GPU groups that hold the weights with the same headroom (:func:`what_fits`)."""
        return what_fits(self.model, self.gpu, share=self.share)


def weights_fit(model: ModelFacts, gpus: int, gpu: Gpu = REFERENCE_GPU, *, share: float = WEIGHTS_SHARE) -> Fit:
    """Whether ``model``'s published weights fit ``gpus`` x ``gpu`` (one replica: tp_size x pp_size GPUs)
    leaving ``1 - share`` of the memory for everything else. Weights only: no KV cache sizing (issue 28's
    memory plan does that)."""
    return Fit(model=model, gpu=gpu, gpus=gpus, share=share)


def gpus_needed(weights_bytes: int, gpu: Gpu, *, share: float = WEIGHTS_SHARE, step: int = 8) -> int:
    """The smallest multiple of ``step`` GPUs (whole 8-GPU hosts by default) of kind ``gpu`` whose memory
    times ``share`` holds ``weights_bytes``."""
    least = math.ceil(weights_bytes / (gpu.memory_bytes * share))
    return max(step, math.ceil(least / step) * step)


def what_fits(model: ModelFacts, gpu: Gpu = REFERENCE_GPU, *, share: float = WEIGHTS_SHARE) -> str:
    """A sentence naming what would hold ``model``'s weights: the same GPUs in whole 8-GPU hosts (a
    multi-node ``[fleet]`` replica), then one or two hosts of larger GPUs."""
    if model.weights_bytes is None:
        return "unknown: the weight size is not published in the kit's sources"
    same = gpus_needed(model.weights_bytes, gpu, share=share)
    options = [f"{same} x {gpu.name} ({_hosts(same)})"]
    for big in LARGER_GPUS:
        n = gpus_needed(model.weights_bytes, big, share=share)
        options.append(f"{n} x {big.name} {big.memory_bytes / GB:.0f} GB ({_hosts(n)})")
    return "at least " + "; or ".join(options) + f" (weights at most {share:.0%} of GPU memory)"


def _hosts(gpus: int) -> str:
    return "one host" if gpus <= 8 else f"{math.ceil(gpus / 8)} hosts of 8 as one multi-node [fleet] replica"


def parser_mismatches(model: ModelFacts, tool_call_parser: str | None, reasoning_parser: str | None) -> list[str]:
    """One line per parser a profile sets differently from ``model``'s (``None`` set counts: without both
    parsers tool calls come back as raw text in content)."""
    out = []
    for key, have, want in (("tool_call_parser", tool_call_parser, model.tool_call_parser),
                            ("reasoning_parser", reasoning_parser, model.reasoning_parser)):
        if have != want:
            out.append(f"{model.name} needs {key} = \"{want}\", the profile has {have!r} "
                       f"({model.sources[key]})")
    return out
