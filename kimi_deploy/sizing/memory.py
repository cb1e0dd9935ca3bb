"""The memory plan of one GPU rank: weights (target + draft), reserves, KV cache capacity, and a verdict.

Inputs (:class:`Facts`): the GPUs (``nvidia-smi --query-gpu`` output, :mod:`kimi_deploy.facts.nvidia`), the
model's ``config.json`` and safetensors header index (:class:`HeaderIndex`: tensor names, dtypes and shapes,
never the weights), the draft model's, and the values SGLang resolves for this host (:mod:`.effective`; the
profile's values and SGLang's documented defaults stand in where resolution could not run).

The arithmetic is the kit's own, from those inputs; ``tests/test_sizing_memory.py`` checks it against SGLang
0.5.23's own code (``srt/mem_cache/kv_cache_configurator.py`` ``_profile_available_bytes`` and
``srt/model_executor/pool_configurator.py`` ``DefaultPoolConfigurator``) run in its interpreter on the same
inputs, within :data:`KV_TOKENS_TOLERANCE`. Units: bytes unless a name says otherwise; GiB is 2**30 bytes
(SGLang's "GB" in its logs is GiB too).

Per rank, the way SGLang 0.5.23 budgets it (``_profile_available_bytes``):

- ``pre_load`` = the GPU's memory less the CUDA context, NCCL and all-reduce buffers held before the weights
  load (:data:`CUDA_CONTEXT_BYTES`, an estimate; SGLang's ``Load weight begin. avail mem=`` log line measures it);
- ``static`` = ``pre_load * mem_fraction_static``: weights + KV cache;
- ``reserve`` = ``pre_load - static``: activations and CUDA graphs (SGLang sizes ``mem_fraction_static`` so this
  covers them: ``srt/arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``);
- ``kv`` = ``static - weights(target + draft) - multimodal reservation``; KV tokens = ``kv // bytes_per_token``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy.facts import nvidia
from kimi_deploy.facts.modeldir import model_shards, read_header_tensors
from kimi_deploy.errors import UsageError
from kimi_deploy.wire.inputs import INDEX_FILE_BYTES, read_regular
from kimi_deploy.wire.limits import parse_json

GIB = 1 << 30

#: Bytes per element of the safetensors dtypes (huggingface/safetensors ``Dtype``).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

#: KV cache element size by ``--kv-cache-dtype`` (``auto``: the model dtype, bf16 for Kimi K2.x).
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
                  "fp8": 1, "fp4_e2m1": 0.5}

#: Memory held per rank before the weights load: CUDA context, NCCL communicators, custom all-reduce
#: buffers. An estimate (2 GiB; SGLang's ``Load weight begin. avail mem=`` line shows the real figure:
#: the recorded 8 x RTX PRO 6000 start in tests/data/sglang-log has 95.59 - 93.51 = 2.08 GiB).
CUDA_CONTEXT_BYTES = 2 * GIB

#: SGLang 0.5.23's multimodal reservation for a multimodal model (``srt/environ.py``
#: ``SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100)``, charged by ``mm_runtime_reservation_gb``).
VLM_CACHE_BYTES = 100 << 20

#: How far this plan's KV token count may be from SGLang's own computation on the same inputs (relative).
KV_TOKENS_TOLERANCE = 0.01

#: A plan is "tight" when the KV cache holds fewer than this many max-length requests.
TIGHT_REQUESTS = 2

#: The least activation + CUDA-graph reserve SGLang 0.5.23 keeps on a GPU of more than 60 GiB when it picks
#: ``mem_fraction_static`` itself (sgl-project/sglang ``python/sglang/srt/arg_groups/memory_hook.py``
#: ``handle_gpu_memory_settings``: ``reserved_mem = max(reserved_mem, 10 * 1024)``, MiB).
MIN_RESERVE_BYTES = 10 * GIB


def sglang_reserve(resolved: Mapping[str, Any], *, mla: bool, gpu_mib: int) -> tuple[float, str] | None:
    """The activation + CUDA-graph reserve SGLang 0.5.23 itself would keep for these resolved settings, in MiB,
    with how it is made up; ``None`` when the settings it reads were not resolved (no SGLang run).

    Source: sgl-project/sglang ``python/sglang/srt/arg_groups/memory_hook.py`` ``handle_gpu_memory_settings`` (the
    branch that picks ``mem_fraction_static`` when the profile leaves it out) and ``reserve_for_graph_mb``:
    ``512 + 1.5 x max(chunked_prefill_size, 2048) + tp x pp / 8 x 1024 + 2 x decode CUDA-graph max_bs + the prefill
    CUDA graphs (1536 with MLA, else 8 per captured size)``, at least 10240 on a GPU of more than 60 GiB. Left
    out, as the kit renders none of them: disaggregation, DP attention, DeepEP buffers, XPU; and SGLang's
    multimodal reduction (``adjust_mem_fraction_for_vlm``, a further ~9 % of the GPU for Kimi K2.5's vision
    tower), which SGLang applies only to a fraction it picks itself, never to a profile's own."""
    chunk = resolved.get("chunked_prefill_size")
    graphs = resolved.get("cuda_graph_config")
    if not isinstance(chunk, int) or not isinstance(graphs, Mapping):
        return None
    tp, pp = int(resolved.get("tp_size") or 1), int(resolved.get("pp_size") or 1)
    tokens = max(chunk, 2048) if chunk > 0 else max(int(resolved.get("max_prefill_tokens") or 16384), 2048)
    decode, prefill = graphs.get("decode") or {}, graphs.get("prefill") or {}
    decode_mib = 2 * int(decode.get("max_bs") or 0) if decode.get("backend") != "disabled" else 0
    prefill_mib = (1536 if mla else 8 * len(prefill.get("bs") or ())) if prefill.get("backend") != "disabled" else 0
    total = 512 + 1.5 * tokens + tp * pp / 8 * 1024 + decode_mib + prefill_mib
    parts = (f"512 + 1.5 x {tokens} prefill tokens + {tp * pp / 8 * 1024:.0f} (tp x pp) + {decode_mib} (decode "
             f"CUDA graphs to batch {decode.get('max_bs')}) + {prefill_mib} (prefill CUDA graphs) = {total:.0f} MiB")
    if gpu_mib > 60 * 1024 and total < 10 * 1024:
        return 10 * 1024.0, f"{parts}, raised to SGLang's floor of 10240 MiB on a GPU above 60 GiB"
    return total, parts


#: Tensors SGLang keeps whole on every tensor-parallel rank (everything else is split across ranks).
#: Sources: SGLang 0.5.23 ``srt/models/deepseek_v2.py`` (``q_a_proj``/``kv_a_proj_with_mqa``: ``ReplicatedLinear``;
#: the MoE router ``gate``: ``ReplicatedLinear``), ``srt/models/kimi_k25.py`` (``mm_projector``: ``ReplicatedLinear``),
#: norms and other 1-D tensors (replicated modules).
REPLICATED = (
    re.compile(r"\.q_a_proj\."), re.compile(r"\.kv_a_proj_with_mqa\."), re.compile(r"\.mlp\.gate\.weight$"),
    re.compile(r"(^|\.)mm_projector\."), re.compile(r"patch_embed\."), re.compile(r"norm"),
)

_RANGE = re.compile(r"\{(\d+)-(\d+)\}")
_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)")


@dataclasses.dataclass(frozen=True)
class TensorGroup:
    """Tensors of one name template, dtype and shape: ``name`` has ``{A-B}`` for each numbered part
    (``layers.{1-60}.mlp.experts.{0-383}.up_proj.weight_packed``); ``count`` tensors of ``shape``."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        return math.prod(int(b) - int(a) + 1 for a, b in _RANGE.findall(self.name))

    @property
    def nbytes(self) -> int:
        """Bytes of all ``count`` tensors."""
        return self.count * math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def replicated(self) -> bool:
        """Kept whole on every TP rank (:data:`REPLICATED`, or 1-D)."""
        return len(self.shape) <= 1 or any(p.search(self.name) for p in REPLICATED)


@dataclasses.dataclass(frozen=True)
class HeaderIndex:
    """A model's tensors as its safetensors headers list them, grouped (:class:`TensorGroup`).

    ``source``: where it came from (a directory read here, or a recorded file's own note).
    """

    model: str
    source: str
    groups: tuple[TensorGroup, ...]

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def tensors(self) -> int:
        return sum(g.count for g in self.groups)

    def per_rank(self, tp_size: int, pp_size: int = 1) -> int:
        """Bytes one rank holds: split tensors / ``tp_size``, replicated ones whole; / ``pp_size`` (stages hold
        about equal shares of the layers; an approximation for pp > 1)."""
        split = sum(g.nbytes for g in self.groups if not g.replicated)
        whole = sum(g.nbytes for g in self.groups if g.replicated)
        return (split // tp_size + whole) // pp_size

    def to_dict(self) -> dict[str, Any]:
        return {"format": INDEX_FORMAT, "model": self.model, "source": self.source,
                "groups": [{"name": g.name, "dtype": g.dtype, "shape": list(g.shape)} for g in self.groups]}


INDEX_FORMAT = "kimi-deploy safetensors header index 1"


def group_tensors(tensors: Iterable[tuple[str, str, tuple[int, ...]]]) -> tuple[TensorGroup, ...]:
    """Group ``(name, dtype, shape)`` triples: numbered name parts become ``{A-B}`` when the numbers seen are a
    contiguous range for that template, dtype and shape (else each tensor stays its own group)."""
    seen: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, ...]]] = {}
    for name, dtype, shape in tensors:
        numbers = tuple(int(n) for n in _NUMBER.findall(name))
        seen.setdefault((_NUMBER.sub("#", name), dtype, tuple(shape)), []).append(numbers)
    groups: list[TensorGroup] = []
    for (template, dtype, shape), rows in sorted(seen.items()):
        ranges = [sorted({r[i] for r in rows}) for i in range(len(rows[0]))]
        full = math.prod(len(r) for r in ranges)
        contiguous = all(r == list(range(r[0], r[-1] + 1)) for r in ranges)
        if contiguous and full == len(rows) == len(set(rows)):
            parts = iter(f"{{{r[0]}-{r[-1]}}}" for r in ranges)
            groups.append(TensorGroup(re.sub("#", lambda _m: next(parts), template), dtype, shape))
        else:
            for numbers in rows:
                values = iter(f"{{{n}-{n}}}" for n in numbers)
                groups.append(TensorGroup(re.sub("#", lambda _m: next(values), template), dtype, shape))
    return tuple(groups)


def read_header_index(model_dir: str | Path) -> HeaderIndex:
    """The :class:`HeaderIndex` of a local model directory, from its shards' headers (a few KiB each).

    Raises:
        UsageError: no shard, or a shard whose header is unreadable (a partial download; ``doctor`` says which).
    """
    shards = model_shards(model_dir)
    if not shards:
        raise UsageError("no safetensors shards to size the model from", value=str(model_dir),
                         hint="download the model first, or pass a recorded header index")
    tensors: list[tuple[str, str, tuple[int, ...]]] = []
    for shard in shards:
        found = read_header_tensors(shard)
        if found is None:
            raise UsageError("a safetensors header is unreadable", value=str(shard),
                             hint="run `kimi-deploy doctor` (a truncated or partial download) and download it again")
        tensors += found
    return HeaderIndex(str(model_dir), f"headers of {len(shards)} shard(s) in {model_dir}", group_tensors(tensors))


def load_header_index(path: str | Path) -> HeaderIndex:
    """A recorded header index (``tests/data/models/*/header-index.json``, :meth:`HeaderIndex.to_dict`'s shape).

    Raises:
        UsageError: unreadable, not that format, or an unknown dtype.
    """
    try:
        data = parse_json(read_regular(path, INDEX_FILE_BYTES).decode("utf-8"))
        if data.get("format") != INDEX_FORMAT:
            raise ValueError(f"format is not {INDEX_FORMAT!r}")
        groups = tuple(TensorGroup(g["name"], g["dtype"], tuple(int(d) for d in g["shape"])) for g in data["groups"])
        for g in groups:
            if g.dtype not in DTYPE_BYTES:
                raise ValueError(f"unknown dtype {g.dtype!r} of {g.name}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"not a header index: {exc}", value=str(path),
                         hint="record it on the GPU host with `kimi-deploy facts --profile P --out DIR`") from exc
    return HeaderIndex(str(data.get("model", path)), str(data.get("source", path)), groups)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the memory plan needs from a model: its attention shape (from ``config.json``) and its tensors.

    ``text``: the language model's config (``text_config`` of multimodal Kimi K2.5/K2.6, else the top level).
    MLA models (``kv_lora_rank`` set) store ``kv_lora_rank + qk_rope_head_dim`` values per token and layer,
    the same on every TP rank; others ``2 * kv_heads/tp * head_dim``.
    """

    name: str
    architecture: str
    num_layers: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    num_kv_heads: int
    head_dim: int
    max_context: int
    multimodal: bool
    weights: HeaderIndex

    @property
    def mla(self) -> bool:
        return bool(self.kv_lora_rank)

    def kv_values_per_token_layer(self, tp_size: int) -> int:
        """Values one rank stores per token and layer (MLA: latent + rope key, not split by TP)."""
        if self.mla:
            return int(self.kv_lora_rank) + int(self.qk_rope_head_dim or 0)
        return 2 * max(1, self.num_kv_heads // tp_size) * self.head_dim

    @classmethod
    def from_config(cls, config: Mapping[str, Any], weights: HeaderIndex, name: str = "") -> ModelFacts:
        """Read the fields from a parsed ``config.json``.

        Raises:
            UsageError: a field the plan needs is missing or not a positive integer.
        """
        text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config

        def number(key: str, default: int | None = None) -> int | None:
            value = text.get(key, default)
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"config.json: {key} is not a positive integer", value=repr(value),
                                 hint="point model_path at the model's own directory (its published config.json)")
            return value

        layers = number("num_hidden_layers")
        heads = number("num_attention_heads", 1)
        if layers is None:
            raise UsageError("config.json has no num_hidden_layers", value=name,
                             hint="point model_path at the model's own directory (its published config.json)")
        head_dim = number("head_dim") or (number("hidden_size", 1) // heads)
        archs = config.get("architectures") or ["?"]
        return cls(name=name or weights.model, architecture=str(archs[0]), num_layers=layers,
                   kv_lora_rank=number("kv_lora_rank"), qk_rope_head_dim=number("qk_rope_head_dim"),
                   num_kv_heads=number("num_key_value_heads", heads), head_dim=head_dim,
                   max_context=number("max_position_embeddings", 0) or 0,
                   multimodal=isinstance(config.get("vision_config"), Mapping), weights=weights)

    @classmethod
    def load(cls, directory: str | Path, index: str | Path | None = None) -> ModelFacts:
        """``config.json`` of ``directory`` and its header index: the recorded ``index`` file when given, else
        ``directory``'s own ``header-index.json`` if it has one (a recorded model), else its shards' headers."""
        root = Path(directory)
        try:
            config = parse_json(read_regular(root / "config.json").decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError("cannot read config.json", value=str(root / "config.json"),
                             hint="point model_path at a downloaded model directory") from exc
        if not isinstance(config, dict):
            raise UsageError("config.json is not a JSON object", value=str(root / "config.json"))
        recorded = Path(index) if index else root / "header-index.json"
        weights = load_header_index(recorded) if recorded.is_file() else read_header_index(root)
        return cls.from_config(config, weights, name=weights.model)


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """The GPUs of one host: ``count``, the smallest ``memory_mib`` (SGLang sizes by the smallest), name,
    compute capability ``"12.0"``; ``source``: live ``nvidia-smi`` or a recorded file."""

    count: int
    name: str
    memory_mib: int
    compute_cap: str
    source: str

    @classmethod
    def from_query(cls, text: str, source: str) -> GpuFacts:
        """From ``nvidia-smi --query-gpu=... --format=csv`` output (:func:`kimi_deploy.facts.nvidia.parse_query_gpu`).

        Raises:
            UsageError: not that format, or no GPU in it.
        """
        try:
            gpus = nvidia.parse_query_gpu(text)
        except nvidia.ParseError as exc:
            raise UsageError(f"not nvidia-smi --query-gpu output: {exc}", value=source) from exc
        if not gpus:
            raise UsageError("nvidia-smi lists no GPU", value=source)
        small = min(gpus, key=lambda g: g.memory_mib)
        return cls(len(gpus), small.name, small.memory_mib, small.compute_cap, source)

    @classmethod
    def from_gpus(cls, gpus: Sequence[nvidia.Gpu], source: str) -> GpuFacts:
        """From parsed GPUs (:func:`kimi_deploy.doctor.probe_gpus`); the smallest memory counts."""
        small = min(gpus, key=lambda g: g.memory_mib)
        return cls(len(gpus), small.name, small.memory_mib, small.compute_cap, source)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib << 20

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Facts:
    """Everything :func:`plan` reads besides the profile.

    ``resolved``: SGLang's resolved values by field name (:attr:`.effective.EffectiveConfig.resolved`; empty
    when resolution did not run); ``sources``: field -> ``file:line`` in SGLang that set it.
    ``pre_load_bytes``: measured memory free before the weights load (a recorded start's
    ``Load weight begin. avail mem``), else ``None`` for :data:`CUDA_CONTEXT_BYTES`.
    """

    gpus: GpuFacts
    model: ModelFacts
    draft: ModelFacts | None = None
    resolved: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pre_load_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Setting:
    """One input of the plan, its value and where it came from (``profile``, ``sglang FILE:LINE``, ``default``)."""

    name: str
    value: Any
    source: str


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """:func:`plan`'s result for one rank. Bytes unless named otherwise.

    ``verdict``: ``fits`` / ``tight`` / ``will not fit`` (``unknown`` without a ``mem_fraction_static``); ``problems``: why it will not fit, each with the setting to
    change; ``warnings``: why it is tight; ``concurrency``: ``(context tokens, requests that fit at once)``.
    """

    gpu_bytes: int
    pre_load_bytes: int
    pre_load_source: str
    mem_fraction_static: Setting
    static_bytes: int
    reserve_bytes: int
    weights_bytes: int
    draft_weights_bytes: int
    multimodal_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    draft_kv_bytes_per_token: int
    kv_tokens: int
    context_length: Setting
    max_running_requests: Setting
    settings: tuple[Setting, ...]
    concurrency: tuple[tuple[int, int], ...]
    verdict: str
    problems: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.verdict != "will not fit"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["concurrency"] = [{"context": c, "requests": r} for c, r in self.concurrency]
        data["gib"] = {k: round(v / GIB, 2) for k, v in data.items() if k.endswith("_bytes") and isinstance(v, int)
                       and k not in ("kv_bytes_per_token", "draft_kv_bytes_per_token")}
        return data

    def lines(self) -> list[str]:
        """The plan as text, one figure a line (GiB)."""
        g = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
        mfs = self.mem_fraction_static
        fraction = f"{mfs.value:.3f}" if mfs.value is not None else "unknown"
        out = [f"memory plan per GPU ({g(self.gpu_bytes)}): {self.verdict}",
               f"  before weights: {g(self.pre_load_bytes)} ({self.pre_load_source})",
               f"  mem_fraction_static {fraction} ({mfs.source}): static {g(self.static_bytes)}, "
               f"reserve for activations + CUDA graphs {g(self.reserve_bytes)} (before weights x (1 - mem_fraction_static): "
               "srt/mem_cache/kv_cache_configurator.py _profile_available_bytes)",
               f"  weights per rank: target {g(self.weights_bytes)}, draft {g(self.draft_weights_bytes)}",
               f"  multimodal reservation: {g(self.multimodal_bytes)}",
               f"  KV cache: {g(self.kv_bytes)} / {self.kv_bytes_per_token + self.draft_kv_bytes_per_token} B per token "
               f"(target {self.kv_bytes_per_token}, draft {self.draft_kv_bytes_per_token}) = {self.kv_tokens} tokens",
               f"  context_length {self.context_length.value} ({self.context_length.source}), "
               f"max_running_requests {self.max_running_requests.value} ({self.max_running_requests.source})"]
        out += [f"  at {c} tokens of context: {r} request(s) at once" for c, r in self.concurrency]
        out += [f"  will not fit: {p}" for p in self.problems]
        out += [f"  tight: {w}" for w in self.warnings]
        return out


def _setting(name: str, profile_value: Any, facts: Facts, default: Any, default_source: str) -> Setting:
    """SGLang's resolved value (with its source) first, then the profile's, then ``default``."""
    if facts.resolved.get(name) is not None:
        if name in facts.sources:
            return Setting(name, facts.resolved[name], f"sglang {facts.sources[name]}")
        return Setting(name, facts.resolved[name], "profile" if profile_value is not None else "sglang default")
    if profile_value is not None:
        return Setting(name, profile_value, "profile")
    return Setting(name, default, default_source)


def plan(profile: Any, facts: Facts) -> MemoryPlan:
    """The memory plan of one rank of ``profile`` (a :class:`kimi_deploy.profile.Profile`) on ``facts``.

    Never raises for a profile that does not fit: that is the ``will not fit`` verdict with the setting to change.
    """
    s = profile.sglang
    tp = int(_setting("tp_size", s.tp_size, facts, 1, "default").value)
    pp = int(_setting("pp_size", s.pp_size, facts, 1, "sglang default 1").value or 1)
    gpu = facts.gpus.memory_bytes
    if facts.pre_load_bytes:
        pre_load, pre_source = facts.pre_load_bytes, "measured at the last start"
    else:
        pre_load, pre_source = gpu - CUDA_CONTEXT_BYTES, f"GPU less {CUDA_CONTEXT_BYTES / GIB:.0f} GiB CUDA context (estimate)"
    mfs = _setting("mem_fraction_static", s.mem_fraction_static, facts, None, "unresolved")
    context = _setting("context_length", s.context_length, facts, facts.model.max_context,
                       "config.json max_position_embeddings")
    running = _setting("max_running_requests", s.max_running_requests, facts, None, "unresolved")
    kv_dtype = _setting("kv_cache_dtype", None, facts, "auto", "sglang default auto")
    page = _setting("page_size", None, facts, 1, "sglang default 1")
    settings = (mfs, context, running, kv_dtype, page, Setting("tp_size", tp, "profile"))
    problems: list[str] = []
    warnings: list[str] = []
    weights = facts.model.weights.per_rank(tp, pp)
    draft_weights = facts.draft.weights.per_rank(tp, pp) if facts.draft else 0
    element = KV_DTYPE_BYTES.get(str(kv_dtype.value), 2)
    per_token = int(facts.model.kv_values_per_token_layer(tp) * element * math.ceil(facts.model.num_layers / pp))
    draft_per_token = int(facts.draft.kv_values_per_token_layer(tp) * element * facts.draft.num_layers) \
        if facts.draft else 0
    multimodal = VLM_CACHE_BYTES if facts.model.multimodal else 0
    if mfs.value is None:
        fraction = None
        static = reserve = kv = tokens = 0
        warnings.append("mem_fraction_static is unknown (SGLang's resolution did not run): no KV figure; set "
                        "[sglang] mem_fraction_static or run validate where SGLang is installed")
    else:
        fraction = float(mfs.value)
        static = int(pre_load * fraction)
        reserve = pre_load - static
        kv = static - weights - draft_weights - multimodal
        unit = (per_token + draft_per_token) * int(page.value or 1)
        tokens = max(0, kv) // unit * int(page.value or 1) if unit else 0
        ctx = int(context.value or 0)
        if weights + draft_weights >= static:
            need = math.ceil((weights + draft_weights + multimodal) / pre_load * 1000) / 1000
            full = math.ceil((weights + draft_weights + multimodal + ctx * (per_token + draft_per_token))
                             / pre_load * 1000) / 1000
            more = "" if need < 1 else " (more than the whole GPU: use more GPUs, a higher tp_size/pp_size)"
            problems.append(f"the weights ({(weights + draft_weights) / GIB:.2f} GiB per rank) do not fit in "
                            f"mem_fraction_static {fraction:.3f} x {pre_load / GIB:.2f} GiB = {static / GIB:.2f} GiB; "
                            f"set [sglang] mem_fraction_static above {need} for the weights alone{more}, {full} to "
                            f"also hold one request of context_length {ctx} (or lower context_length)")
        elif tokens < ctx:
            need_bytes = ctx * (per_token + draft_per_token) + weights + draft_weights + multimodal
            need = math.ceil(need_bytes / pre_load * 1000) / 1000
            fp8 = "" if element == 1 else ", or kv_cache_dtype fp8_e4m3 in extra_args (halves bytes per token)"
            problems.append(f"the KV cache holds {tokens} tokens, less than one request of context_length {ctx}; "
                            f"set [sglang] context_length = {tokens} or less, or mem_fraction_static to {need}"
                            f"{' (above 1: not possible)' if need >= 1 else ''}{fp8}")
        elif tokens < TIGHT_REQUESTS * int(context.value or 0):
            warnings.append(f"the KV cache holds {tokens} tokens: one request of context_length {context.value} "
                            f"at a time; a second long request waits (lower context_length to "
                            f"{tokens // TIGHT_REQUESTS} for two)")
    if fraction is not None and mfs.source == "profile" and not problems:
        # SGLang picks mem_fraction_static = round((GPU MiB - reserve MiB) / GPU MiB, 3) itself (memory_hook.py);
        # a profile's own fraction above what SGLang would pick for the same settings leaves the activations and
        # CUDA graphs less than SGLang's own estimate of them.
        gpu_mib = facts.gpus.memory_mib
        estimate = sglang_reserve(facts.resolved, mla=facts.model.mla, gpu_mib=gpu_mib)
        if estimate is None and gpu_mib > 60 * 1024:
            estimate = (MIN_RESERVE_BYTES / (1 << 20), "SGLang's floor of 10240 MiB on a GPU above 60 GiB; its "
                                                       "other inputs were not resolved here")
        ceiling = round((gpu_mib - estimate[0]) / gpu_mib, 3) if estimate else 1.0
        if estimate and fraction > ceiling:
            warnings.append(f"mem_fraction_static {fraction} leaves {reserve / GIB:.2f} GiB for activations and CUDA "
                            f"graphs, less than SGLang 0.5.23's own estimate for these settings ({estimate[1]}; "
                            f"srt/arg_groups/memory_hook.py), which it would meet with mem_fraction_static "
                            f"{ceiling}; CUDA graph capture may run out of memory: lower mem_fraction_static to "
                            f"{ceiling}, or lower chunked_prefill_size or max_running_requests (the decode CUDA "
                            "graphs stop at it)")
    ctx_max = int(context.value or 0)
    points = sorted({c for c in (8192, 32768, 131072, ctx_max) if 0 < c <= max(ctx_max, 1)})
    cap = int(running.value) if running.value else None
    concurrency = tuple((c, min(tokens // c, cap) if cap else tokens // c) for c in points)
    verdict = "will not fit" if problems else "unknown" if fraction is None else "tight" if warnings else "fits"
    return MemoryPlan(
        gpu_bytes=gpu, pre_load_bytes=pre_load, pre_load_source=pre_source,
        mem_fraction_static=Setting("mem_fraction_static", fraction, mfs.source), static_bytes=static,
        reserve_bytes=reserve, weights_bytes=weights, draft_weights_bytes=draft_weights, multimodal_bytes=multimodal,
        kv_bytes=max(0, kv), kv_bytes_per_token=per_token, draft_kv_bytes_per_token=draft_per_token, kv_tokens=tokens,
        context_length=context, max_running_requests=running, settings=settings, concurrency=concurrency,
        verdict=verdict, problems=tuple(problems), warnings=tuple(warnings))
