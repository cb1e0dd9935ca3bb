"""Speculative-decoding and KV-cache guards before a start: settings SGLang accepts that run slow or not at all.

- ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft (or ``EAGLE3`` with an EAGLE draft) starts, but every
  draft is rejected: an accept length of exactly 1.0, slower than no speculation (sgl-project/sglang PR 21272).
  The draft says what it is in its own ``config.json`` (:func:`draft_kind`).
- ``EAGLE3`` without a draft path loads the target model a second time as its draft and runs out of memory
  (sglang issue 36528): the profile's rules refuse it (:func:`kimi_deploy.profile.rules`), with this source.
- An FP8 KV cache where it is measured to be slow (:data:`SLOW_FP8_KV`): a warning with the measurement.

:func:`problems` is pure over the profile and the draft's parsed ``config.json``; :func:`read_draft_config` reads it.
``validate`` refuses on :attr:`Guard.errors` and prints :attr:`Guard.warnings`; ``doctor`` reports both for the
installed profile (``speculative.draft``, ``kv_cache.dtype``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kimi_deploy.catalog.models import identify
from kimi_deploy.wire.inputs import read_regular

#: Read no more of a draft's config.json than this (a config is a few KiB).
MAX_CONFIG_BYTES = 1 << 20

#: ``(model keys, GPU name fragment) -> (measured, source)``: FP8 KV caches measured slow. K2.6 shares K2.5's
#: architecture and attention (MLA), so the measurement stands for both.
SLOW_FP8_KV: dict[tuple[tuple[str, ...], str], tuple[str, str]] = {
    (("k2.5", "k2.6"), "RTX PRO 6000 Blackwell"): (
        "SGLang decode 16 tok/s with an FP8 KV cache against 73-90 tok/s with BF16, K2.5's original checkpoint on "
        "8x RTX PRO 6000",
        "local-inference-lab/rtx6kpro, inference-engines/sglang.md"),
}


@dataclasses.dataclass(frozen=True)
class Guard:
    """What the guards found: ``errors`` (the start would run slow or fail: refuse), ``warnings``, and
    ``draft_kind`` (``EAGLE3``, ``EAGLE`` or ``None``: not known from its config)."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    draft_kind: str | None = None


def read_draft_config(path: str | None) -> dict[str, Any] | None:
    """The draft directory's ``config.json`` as a JSON object, or ``None`` when there is no path, it is not a
    directory on this host (a hub id), or the file is missing, over :data:`MAX_CONFIG_BYTES`, or not an object."""
    if not path:
        return None
    file = Path(path) / "config.json"
    try:
        if not file.is_file():
            return None
        data = json.loads(read_regular(file, MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def draft_kind(config: dict[str, Any] | None) -> str | None:
    """``EAGLE3`` or ``EAGLE`` as the draft's ``config.json`` declares it, ``None`` when it says neither.

    EAGLE-3: an architecture naming ``Eagle3`` (SGLang 0.5.23 ``Eagle3DeepseekV2ForCausalLM``,
    ``LlamaForCausalLMEagle3``) or ``eagle_config.use_aux_hidden_state`` true (EAGLE-3 drafts read the target's
    auxiliary hidden states; SpecForge writes it). EAGLE (1/2): an architecture naming ``Eagle`` without the 3
    (``LlamaForCausalLMEagle``, ``DeepseekV3ForCausalLMEagle``).
    """
    if not config:
        return None
    archs = [str(a) for a in config.get("architectures") or [] if isinstance(a, str)]
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if any("eagle3" in a.lower() for a in archs) or eagle.get("use_aux_hidden_state") is True:
        return "EAGLE3"
    if any("eagle" in a.lower() for a in archs):
        return "EAGLE"
    return None


def kv_cache_dtype(extra_args: list[str] | tuple[str, ...]) -> str | None:
    """The ``--kv-cache-dtype`` value among ``extra_args`` (``--kv-cache-dtype X`` or ``=X``), else ``None``."""
    args = [str(a) for a in extra_args]
    for i, arg in enumerate(args):
        if arg == "--kv-cache-dtype" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--kv-cache-dtype="):
            return arg.split("=", 1)[1]
    return None


def slow_fp8_kv(profile: Any, gpu_name: str) -> str | None:
    """The warning for an FP8 KV cache on ``profile``'s model and ``gpu_name`` where :data:`SLOW_FP8_KV` has a
    measurement, else ``None``."""
    dtype = kv_cache_dtype(profile.sglang.extra_args)
    if not dtype or not dtype.lower().startswith("fp8"):
        return None
    model = identify(profile.sglang.model_path, profile.sglang.served_model_name)
    for (keys, card), (measured, source) in SLOW_FP8_KV.items():
        if model is not None and model.key in keys and card.lower() in gpu_name.lower():
            return (f"kv_cache_dtype {dtype} on {model.name} with {card}: {measured} ({source}); drop "
                    "--kv-cache-dtype from extra_args (BF16, SGLang's auto) unless a benchmark here says otherwise")
    return None


def problems(profile: Any, draft_config: dict[str, Any] | None, gpu_name: str) -> Guard:
    """The guards over ``profile`` (a :class:`kimi_deploy.profile.Profile`), its draft's parsed ``config.json``
    (``None``: not readable here, nothing judged of it) and the GPU kind ``gpu_name``."""
    s = profile.sglang
    errors: list[str] = []
    kind = draft_kind(draft_config)
    algo = s.speculative_algorithm
    if algo in ("EAGLE", "EAGLE3") and kind is not None and kind != algo:
        what = "EAGLE-3" if kind == "EAGLE3" else "EAGLE"
        errors.append(
            f"sglang.speculative_algorithm: {algo} with an {what} draft ({s.speculative_draft_model_path}: "
            f"config.json architectures {draft_config.get('architectures') if draft_config else None}): SGLang "
            f"starts, but every draft is rejected, an accept length of exactly 1.0, slower than no speculation "
            f"(sgl-project/sglang PR 21272); set speculative_algorithm = \"{kind}\"")
    warning = slow_fp8_kv(profile, gpu_name)
    return Guard(tuple(errors), (warning,) if warning else (), kind)
