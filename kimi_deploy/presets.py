"""Built-in deployment presets: profiles known to work, one place for their values.

``kimi-k25-rtx-pro-6000-x8`` is the reference deployment: moonshotai Kimi K2.5
INT4 (~547 GB) on one host with 8x NVIDIA RTX PRO 6000 Blackwell (SM120, PCIe
Gen5, no NVLink): TP=8, EAGLE-3 with topk 1 and spec v2 (steps 3, draft tokens 4:
the SGLang cookbook's Kimi recipe), FlashInfer all-reduce fusion, torch symmetric
memory, both ``kimi_k2`` parsers, 0.0.0.0:30000, trust-remote-code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kimi_deploy.errors import UsageError
from kimi_deploy.profile import Profile, parse_profile


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named profile: ``data`` has the shape of a profile TOML document."""

    name: str
    summary: str
    data: dict[str, Any]

    def profile(self) -> Profile:
        """The preset validated as a :class:`Profile`."""
        return parse_profile(self.data, source=f"preset {self.name}")


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="kimi-k25-rtx-pro-6000-x8",
            summary="Kimi K2.5 INT4 on 8x RTX PRO 6000 Blackwell (SM120, PCIe): TP8, EAGLE-3 topk1 spec v2, "
                    "FlashInfer AR fusion, torch symm mem, kimi_k2 parsers, 0.0.0.0:30000",
            data={
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
                    "api_key_file": "/etc/kimi-deploy/kimi-k25.api-key",
                },
                "environment": {
                    "NCCL_IB_DISABLE": "1",
                },
                "monitoring": {
                    "slo": {"ttft": 2000.0, "tpot": 100.0},
                },
            },
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
