"""Built-in deployment presets: profiles known to work, one place for their values.

``kimi-k25-rtx-pro-6000-x8`` is the reference deployment: moonshotai Kimi K2.5
INT4 (~547 GB) on one host with 8x NVIDIA RTX PRO 6000 Blackwell (SM120, PCIe
Gen5, no NVLink): TP=8, EAGLE-3 with topk 1 and spec v2 (steps 3, draft tokens 4:
the SGLang cookbook's Kimi recipe), FlashInfer all-reduce fusion, torch symmetric
memory, both ``kimi_k2`` parsers, 0.0.0.0:30000, trust-remote-code. Both all-reduce settings need the
kit's opt-in patches on SM120 (SGLang 0.5.23 gates them to SM90/SM100).

``kimi-k25-rtx-pro-6000-x8-pcie-ipc`` is the same deployment on upstream's path for exactly this host:
``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1`` (sglang PR 34528 + flashinfer PR 4393, in 0.5.21+), decode-sized
all-reduces on FlashInfer's PCIe IPC kernels, everything larger on NCCL, no source patch. Its docstring
(``srt/distributed/device_communicators/pcie_ipc_ar.py``) reports TP8 TPOT 21.1 -> 13.6 ms on 8x SM120;
nothing here was measured on GPUs. Fusion is left out on purpose: once a fusion backend is set,
FlashInfer's all-reduce takes every all-reduce up to 2048 tokens before PCIe IPC is considered
(``GroupCoordinator.all_reduce`` in ``srt/distributed/parallel_state.py``).

The other Kimi models on the same host (``kimi-k26-...``, ``kimi-k27-code-...``, ``kimi-k2-thinking-...``)
are the PCIe IPC deployment with that model's facts from :data:`kimi_deploy.catalog.models.MODELS` (model
path, served name, parsers, the draft model or none): no preset copies a model fact, and
:data:`MODEL_PRESETS` says which preset ``init --model`` starts from. K3 has none: its weights do not fit
8 x 96 GB (:func:`kimi_deploy.catalog.models.weights_fit`).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from kimi_deploy.catalog.models import MODELS, ModelFacts, REFERENCE_GPUS, get_model, weights_fit
from kimi_deploy.errors import UsageError
from kimi_deploy.paths import service_api_key_file
from kimi_deploy.profile import Profile, load_profile, parse_profile


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named profile: ``data`` has the shape of a profile TOML document.

    ``differs``: how it differs from the reference preset (empty for the reference itself);
    ``measure``: what an operator must measure before trusting it (``kimi-deploy presets`` prints both);
    ``model``: the key of the model it deploys in :data:`kimi_deploy.catalog.models.MODELS`.
    """

    name: str
    summary: str
    data: dict[str, Any]
    differs: str = ""
    measure: str = ""
    model: str | None = None

    def profile(self) -> Profile:
        """The preset validated as a :class:`Profile`."""
        return parse_profile(self.data, source=f"preset {self.name}")


REFERENCE = "kimi-k25-rtx-pro-6000-x8"
PCIE_IPC = "kimi-k25-rtx-pro-6000-x8-pcie-ipc"
K26 = "kimi-k26-rtx-pro-6000-x8"
K27_CODE = "kimi-k27-code-rtx-pro-6000-x8"
K2_THINKING = "kimi-k2-thinking-rtx-pro-6000-x8"

#: Where the presets expect a model's weights: ``/models/<Hugging Face repository>``.
MODELS_DIR = "/models"

_K25 = MODELS["k2.5"]


def model_keys(model: ModelFacts) -> dict[str, Any]:
    """The ``[sglang]`` keys a model's facts decide: weights and draft under :data:`MODELS_DIR`, the served
    name (its repository), both parsers, and EAGLE-3 (steps 3, topk 1, draft tokens 4: the SGLang
    cookbook's Kimi recipe, with spec v2) only where the model has a draft."""
    keys: dict[str, Any] = {
        "model_path": f"{MODELS_DIR}/{model.repo}",
        "served_model_name": model.repo,
        "tool_call_parser": model.tool_call_parser,
        "reasoning_parser": model.reasoning_parser,
    }
    if model.draft_model:
        keys.update({
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": f"{MODELS_DIR}/{model.draft_model}",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
            "enable_spec_v2": True,
        })
    return keys


#: The memory settings of every reference-host preset, written out so that the plan holds on 8 x RTX PRO 6000
#: (97887 MiB; 2 GiB of CUDA context leaves 93.59 GiB before the weights load) as written. Left to SGLang 0.5.23,
#: it picks mem_fraction_static 0.758 for Kimi K2.5 on this GPU (sgl-project/sglang
#: python/sglang/srt/arg_groups/memory_hook.py ``handle_gpu_memory_settings``): it reserves 512 + 1.5 x
#: chunked_prefill_size 8192 + 1024 (TP8) + 2 x decode CUDA-graph batch 512 + 1536 (MLA prefill graphs) =
#: 16384 MiB -> 0.833, then takes a further 9 % for the vision tower (``adjust_mem_fraction_for_vlm``): 0.758 x
#: 93.59 GiB = 70.93 GiB, less than the 71.91 GiB of weights per rank (target 71.16 + EAGLE-3 draft 0.75), so
#: the KV cache gets nothing ("Loaded weights leave no GPU memory for the KV cache",
#: python/sglang/srt/mem_cache/kv_cache_configurator.py).
#:
#: - ``chunked_prefill_size = 4096`` and, with a draft, ``max_running_requests = 48`` (SGLang's own EAGLE value,
#:   speculative_hook.py; set here it also stops the decode CUDA graphs at batch 48, memory_hook.py) bring
#:   SGLang's own reserve estimate to 512 + 1.5 x 4096 + 1024 + 2 x 48 + 1536 = 9312 MiB (10240 without a draft,
#:   decode graphs to batch 512), which its floor for a GPU above 60 GiB raises to 10240 MiB.
#: - ``mem_fraction_static = 0.895`` is what SGLang computes for that reserve, round((97887 - 10240) / 97887, 3):
#:   static 0.895 x 93.59 = 83.76 GiB; the reserve left for activations and CUDA graphs is the rest, 9.83 GiB
#:   (kv_cache_configurator.py ``_profile_available_bytes``: pre-load memory x (1 - mem_fraction_static)).
#: - ``context_length = 65536``: KV cache 83.76 - 71.91 - 0.10 (multimodal reservation) = 11.76 GiB at 71,424
#:   bytes per token (MLA (512 + 64) x 61 layers x 2 bytes, plus the draft's layer) = 176,757 tokens: 2.7
#:   requests of 65536 at once ("fits" needs 2); 131072 would hold one at a time ("tight"). K2.6 and
#:   K2-Thinking (no draft, 71.16 and 70.95 GiB per rank) hold about 3.
#:
#: Not measured on GPUs: compare the KV tokens of the first start (``restart --wait`` shows them) and watch CUDA
#: graph capture; with images (K2.5, K2.6) SGLang's own choice would keep ~8 GiB more for the vision tower.
MEMORY = {"mem_fraction_static": 0.895, "context_length": 65536, "chunked_prefill_size": 4096}
#: With an EAGLE-3 draft: SGLang's own pick, written out (see :data:`MEMORY`).
MEMORY_WITH_DRAFT = {**MEMORY, "max_running_requests": 48}


def memory_keys(model: ModelFacts) -> dict[str, Any]:
    """The ``[sglang]`` memory settings of ``model`` on the reference host (:data:`MEMORY`, the arithmetic)."""
    return dict(MEMORY_WITH_DRAFT if model.draft_model else MEMORY)


#: The ``[sglang]`` keys of EAGLE-3 speculative decoding, in the option table's order.
SPECULATIVE = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "enable_spec_v2")

_REFERENCE_DATA: dict[str, Any] = {
    "service": {
        "name": "kimi-k25",
        "description": "SGLang serving moonshotai Kimi K2.5 INT4 (TP8, EAGLE-3)",
        "user": "sglang",
        "group": "sglang",
        "python": "/opt/sglang/.venv/bin/python",
        "kimi_deploy": "/usr/local/bin/kimi-deploy",
        "gpu_count": 8,
        "hardening": "standard",
        "timeout_start_sec": 1200,
    },
    "sglang": {
        "model_path": model_keys(_K25)["model_path"],
        "served_model_name": model_keys(_K25)["served_model_name"],
        "host": "0.0.0.0",
        "port": 30000,
        "tp_size": 8,
        "trust_remote_code": True,
        **memory_keys(_K25),
        **{k: v for k, v in model_keys(_K25).items() if k not in ("model_path", "served_model_name")},
        "flashinfer_allreduce_fusion_backend": "auto",
        "enable_torch_symm_mem": True,
        "enable_metrics": True,
        "api_key_file": service_api_key_file("{name}"),  # named after [service] name, whatever it becomes
    },
    "environment": {
        "NCCL_IB_DISABLE": "1",
    },
    "monitoring": {
        "slo": {"ttft": 2000.0, "tpot": 100.0},
    },
}


def _pcie_ipc_data() -> dict[str, Any]:
    """The reference deployment on upstream's PCIe IPC all-reduce: no fusion, no torch symm mem, no patch."""
    data = copy.deepcopy(_REFERENCE_DATA)
    sglang = data["sglang"]
    del sglang["flashinfer_allreduce_fusion_backend"], sglang["enable_torch_symm_mem"]
    sglang["enable_pcie_ipc_allreduce"] = True
    data["service"]["description"] = "SGLang serving moonshotai Kimi K2.5 INT4 (TP8, EAGLE-3, PCIe IPC all-reduce)"
    return data


def _model_data(model: ModelFacts, name: str) -> dict[str, Any]:
    """``model`` on the reference host over upstream's PCIe IPC all-reduce (:data:`PCIE_IPC`'s settings, no
    source patch), with the model's own keys (:func:`model_keys`) and service name ``name``."""
    data = _pcie_ipc_data()
    sglang = data["sglang"]
    for key in (*SPECULATIVE, *MEMORY_WITH_DRAFT):
        sglang.pop(key, None)
    sglang.update(memory_keys(model))
    sglang.update(model_keys(model))
    sglang["api_key_file"] = service_api_key_file("{name}")  # follows [service] name, as the reference's
    quant = f" {model.quantisation}" if model.quantisation else ""
    draft = "EAGLE-3, " if model.draft_model else ""
    data["service"].update(name=name, description=f"SGLang serving {model.repo}{quant} (TP8, {draft}PCIe IPC "
                                                  "all-reduce)")
    return data


def _no_draft(model: ModelFacts) -> str:
    return f"no EAGLE-3 ({model.sources['draft_model']})"


#: What every K2.5 preset leaves to measure about start time (issue #42): SGLang 0.5.23's weight-loading options
#: are rows of the option table, none set by a preset because none is measured on the reference host.
START_MEASURE = ("; start time: the weights phase cold and warm (docs/runbook.md#warm-and-cold-restarts), then with "
                 "load_format fastsafetensors or instanttensor (their packages installed), "
                 "weight_loader_prefetch_checkpoints, or startup_weight_load_mode = \"overlap\": none is a default "
                 "until measured")

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name=REFERENCE,
            summary="Kimi K2.5 INT4 on 8x RTX PRO 6000 Blackwell (SM120, PCIe): TP8, EAGLE-3 topk1 spec v2, "
                    "FlashInfer AR fusion, torch symm mem, kimi_k2 parsers, 0.0.0.0:30000",
            data=_REFERENCE_DATA,
            measure="needs the opt-in patches sm120-flashinfer-allreduce-fusion and sm120-torch-symm-mem "
                    "(experimental); measure at TP8 against an NCCL-only baseline and against "
                    f"{PCIE_IPC} (docs/runbook.md#measuring-an-all-reduce-change): upstream closed the same fusion gates after a "
                    "TP4 PCIe regression, the only positive figure is TP2" + START_MEASURE,
        ),
        Preset(
            name=PCIE_IPC,
            summary="as the reference, but upstream's PCIe IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, "
                    "decode sizes; NCCL for the rest), no fusion, no torch symm mem, no source patch",
            data=_pcie_ipc_data(),
            differs=f"vs {REFERENCE}: flashinfer_allreduce_fusion_backend and enable_torch_symm_mem removed "
                    "(fusion would take every all-reduce up to 2048 tokens before PCIe IPC), "
                    "enable_pcie_ipc_allreduce = true; no patch beyond the defaults",
            measure="TPOT and output tok/s at decode concurrency (upstream: TP8 TPOT 21.1 -> 13.6 ms on 8x SM120) "
                    "and TTFT on long prompts (should stay level with NCCL) against an NCCL-only baseline; "
                    "`doctor` first: peer-memory writes ignore NCCL_P2P_DISABLE and hang on ACS/IOMMU hosts"
                    + START_MEASURE,
        ),
        Preset(
            name=K26,
            summary="Kimi K2.6 INT4 on 8x RTX PRO 6000 Blackwell: TP8, PCIe IPC all-reduce, kimi_k2 parsers, "
                    "no draft model, 0.0.0.0:30000",
            data=_model_data(MODELS["k2.6"], "kimi-k26"),
            differs=f"vs {PCIE_IPC}: model moonshotai/Kimi-K2.6 (K2.5's architecture); "
                    + _no_draft(MODELS["k2.6"]),
            measure="TPOT and output tok/s against an NCCL-only baseline, as for the PCIe IPC preset; no draft "
                    "means no speculative speed-up: compare with K2.5 + EAGLE-3 before switching a workload",
            model="k2.6",
        ),
        Preset(
            name=K27_CODE,
            summary="Kimi K2.7-Code on 8x RTX PRO 6000 Blackwell: TP8, PCIe IPC all-reduce, kimi_k2 parsers, "
                    "thinking only, no draft model, 0.0.0.0:30000",
            data=_model_data(MODELS["k2.7-code"], "kimi-k27-code"),
            differs=f"vs {PCIE_IPC}: model moonshotai/Kimi-K2.7-Code (thinking only: "
                    'chat_template_kwargs {"thinking": false} does not turn it off); ' + _no_draft(MODELS["k2.7-code"]),
            measure="its weight size, quantisation and context are not in the kit's sources: run `kimi-deploy "
                    "doctor` with the weights downloaded (gpu.memory compares the shards with the GPUs) and "
                    "`kimi-deploy check` after the first start (it reads the server's parsers from /model_info)",
            model="k2.7-code",
        ),
        Preset(
            name=K2_THINKING,
            summary="Kimi K2-Thinking INT4 on 8x RTX PRO 6000 Blackwell: TP8, PCIe IPC all-reduce, kimi_k2 "
                    "parsers, thinking only, no draft model, 0.0.0.0:30000",
            data=_model_data(MODELS["k2-thinking"], "kimi-k2-thinking"),
            differs=f"vs {PCIE_IPC}: model moonshotai/Kimi-K2-Thinking (thinking only, text only); "
                    + _no_draft(MODELS["k2-thinking"]),
            measure=f"{weights_fit(MODELS['k2-thinking'], REFERENCE_GPUS).evidence()}: Moonshot sizes it as TP8 "
                    "on 8xH200 for 256k context, which leaves about three times this host's KV cache room; measure "
                    "the context and concurrency that fit (doctor's gpu.memory, then max_total_num_tokens in "
                    "SGLang's start-up log) before promising 256k",
            model="k2-thinking",
        ),
    )
}
for _name in (REFERENCE, PCIE_IPC):
    PRESETS[_name] = dataclasses.replace(PRESETS[_name], model=_K25.key)

#: The preset ``init --model KEY`` starts from: each catalog model's first preset (K2.5: the reference).
MODEL_PRESETS: dict[str, str] = {}
for _preset in PRESETS.values():
    if _preset.model:
        MODEL_PRESETS.setdefault(_preset.model, _preset.name)


def too_large_for_reference() -> list[str]:
    """The catalog keys without a preset whose weights do not fit the reference host's GPUs (``init --model``'s
    help lists them as refused; :func:`kimi_deploy.catalog.models.weights_fit`, the same rule as every verb's)."""
    return [k for k, m in MODELS.items() if k not in MODEL_PRESETS and weights_fit(m, REFERENCE_GPUS).fits is False]


def preset_for_model(key: str) -> Preset:
    """The reference-host preset of catalog model ``key`` (``init --model``).

    Raises:
        UsageError: an unknown model (the keys there are), or one whose weights do not fit the reference host
            (the numbers from :func:`kimi_deploy.catalog.models.weights_fit` and what would fit; exit 2).
    """
    try:
        model = get_model(key)
    except KeyError:
        raise UsageError("no such model", value=key,
                         hint=f"models: {', '.join(MODELS)} (`kimi-deploy presets` shows their presets)") from None
    if model.key in MODEL_PRESETS:
        return PRESETS[MODEL_PRESETS[model.key]]
    fit = weights_fit(model, REFERENCE_GPUS)
    if fit.fits is False:
        raise UsageError(f"{model.name} does not fit the reference host", value=fit.evidence(),
                         hint=f"{fit.what_fits()}; the kit has no preset for it")
    raise UsageError(f"no preset for {model.name}", value=key,
                     hint=f"start from --preset {PCIE_IPC} and set model_path and the parsers "
                          f"({model.tool_call_parser}/{model.reasoning_parser})")


def get_preset(name: str) -> Preset:
    """Look a preset up by name.

    Raises:
        UsageError: no such preset; the message lists the ones there are (exit 2).
    """
    try:
        return PRESETS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, PRESETS, n=1)
        raise UsageError(
            "no such preset", value=name,
            hint=(f"did you mean {close[0]}? " if close else "")
            + f"presets: {', '.join(PRESETS)} (`kimi-deploy presets` lists them)",
        ) from None


def select_profile(profile_path: Path | None, preset: str | None, *, required: bool = True) -> Profile | None:
    """The profile ``--profile FILE`` or ``--preset NAME`` selects (the rule of every verb that takes one).

    Raises:
        UsageError: both given, or neither when ``required`` (exit 2).
        ProfileError: the profile does not validate (exit 2).
    """
    if profile_path and preset:
        raise UsageError("--profile and --preset are mutually exclusive", value=f"{profile_path} / {preset}",
                         hint="give one of them")
    if profile_path:
        return load_profile(profile_path)
    if preset:
        return get_preset(preset).profile()
    if required:
        raise UsageError("no profile given", hint="pass --profile FILE or --preset NAME "
                         "(`kimi-deploy presets` lists presets; `kimi-deploy init` writes a profile)")
    return None
