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
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from kimi_deploy.errors import UsageError
from kimi_deploy.paths import service_api_key_file
from kimi_deploy.profile import Profile, load_profile, parse_profile


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named profile: ``data`` has the shape of a profile TOML document.

    ``differs``: how it differs from the reference preset (empty for the reference itself);
    ``measure``: what an operator must measure before trusting it (``kimi-deploy presets`` prints both).
    """

    name: str
    summary: str
    data: dict[str, Any]
    differs: str = ""
    measure: str = ""

    def profile(self) -> Profile:
        """The preset validated as a :class:`Profile`."""
        return parse_profile(self.data, source=f"preset {self.name}")


REFERENCE = "kimi-k25-rtx-pro-6000-x8"
PCIE_IPC = "kimi-k25-rtx-pro-6000-x8-pcie-ipc"

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
        "model_path": "/models/moonshotai/Kimi-K2.5",
        "served_model_name": "moonshotai/Kimi-K2.5",
        "host": "0.0.0.0",
        "port": 30000,
        "tp_size": 8,
        "trust_remote_code": True,
        "tool_call_parser": "kimi_k2",
        "reasoning_parser": "kimi_k2",
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/lightseekorg/kimi-k2.5-eagle3-mla",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "enable_spec_v2": True,
        "flashinfer_allreduce_fusion_backend": "auto",
        "enable_torch_symm_mem": True,
        "enable_metrics": True,
        "api_key_file": service_api_key_file("kimi-k25"),
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
                    f"{PCIE_IPC} (production.md section 4): upstream closed the same fusion gates after a "
                    "TP4 PCIe regression, the only positive figure is TP2",
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
                    "`doctor` first: peer-memory writes ignore NCCL_P2P_DISABLE and hang on ACS/IOMMU hosts",
        ),
    )
}


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
