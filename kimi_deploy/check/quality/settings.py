"""The quality tier's settings for one run: the command line first, then the profile's ``[quality]``, then defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kimi_deploy.profile import Profile
from kimi_deploy.wire.inputs import DATASET_FILE_BYTES, DATASET_LINE_BYTES

#: Requests of ``quality.accuracy`` by default: at a true accuracy of 95.5 % the 95 % interval is then about
#: +-3 points wide (stats.py), enough to see K2VV's vLLM figure (87.22 %) apart from its SGLang one.
DEFAULT_SAMPLE = 200
DEFAULT_CONCURRENCY = 4
DEFAULT_DEADLINE_S = 600.0
#: K2VV's published schema accuracy of SGLang serving K2-Thinking (2025-11-15, temperature 1.0; Moonshot's own API
#: 100.00 %, vLLM 87.22 %): MoonshotAI/K2-Vendor-Verifier, README.
DEFAULT_MIN_SCHEMA_ACCURACY = 0.9552
#: The bars of ``quality.reasoning`` (rates, fractions): 0, the think-leak bar of smg-project/providers-verifier.
DEFAULT_REASONING_BAR = 0.0
#: ``quality.certify``'s bars, smg-project/providers-verifier's: tool-trigger F1 and tool-schema accuracy >= 0.98.
DEFAULT_CERTIFY_BAR = 0.98


@dataclasses.dataclass(frozen=True)
class QualitySettings:
    """``sample`` requests from ``dataset`` (``None``: the kit's samples), ``concurrency`` in flight, within
    ``deadline_s`` seconds, judged against ``min_schema_accuracy`` (a fraction); ``model_dir`` and
    ``sglang_python`` for the pre-flight checks (``None``: unknown); ``max_line_bytes`` / ``max_file_bytes``: the
    dataset's caps (:mod:`kimi_deploy.wire.inputs`)."""

    sample: int = DEFAULT_SAMPLE
    dataset: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    deadline_s: float = DEFAULT_DEADLINE_S
    min_schema_accuracy: float = DEFAULT_MIN_SCHEMA_ACCURACY
    model_dir: str | None = None
    sglang_python: str | None = None
    max_line_bytes: int = DATASET_LINE_BYTES
    max_file_bytes: int = DATASET_FILE_BYTES
    max_think_leak_rate: float = DEFAULT_REASONING_BAR
    max_empty_stop_rate: float = DEFAULT_REASONING_BAR
    max_missing_reasoning_rate: float = DEFAULT_REASONING_BAR
    repeats: int = 1
    min_tool_trigger_f1: float = DEFAULT_CERTIFY_BAR
    certify_min_schema_accuracy: float = DEFAULT_CERTIFY_BAR

    @property
    def reasoning_bars(self) -> dict[str, float]:
        """``rule -> bar`` for :func:`kimi_deploy.check.integrity.rates`."""
        return {"think_leak": self.max_think_leak_rate, "empty_stop": self.max_empty_stop_rate,
                "missing_reasoning": self.max_missing_reasoning_rate}


def resolve(options: Any, profile: Profile | None) -> QualitySettings:
    """The settings of a run from ``options`` (a :class:`kimi_deploy.check.results.CheckOptions`) and ``profile``.

    ``model_dir`` falls back to the profile's ``model_path`` when that is a directory on this host (a hub id
    such as ``moonshotai/Kimi-K2.5`` is not), ``sglang_python`` to the profile's ``[service] python``.
    """
    q = profile.quality if profile is not None else None  # None: no [quality] table

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is not None:
            return value
        return getattr(q, name) if q is not None else default

    model_dir = options.model_dir
    if model_dir is None and profile is not None and Path(profile.sglang.model_path).is_dir():
        model_dir = profile.sglang.model_path
    python = options.sglang_python or (profile.service.python if profile is not None else None)
    return QualitySettings(
        sample=pick(options.sample, "sample", DEFAULT_SAMPLE),
        dataset=str(options.dataset) if options.dataset is not None else (q.dataset if q is not None else None),
        concurrency=pick(options.quality_concurrency, "concurrency", DEFAULT_CONCURRENCY),
        deadline_s=pick(options.quality_deadline, "deadline_s", DEFAULT_DEADLINE_S),
        min_schema_accuracy=pick(options.min_schema_accuracy, "min_schema_accuracy", DEFAULT_MIN_SCHEMA_ACCURACY),
        model_dir=str(model_dir) if model_dir is not None else None,
        sglang_python=str(python) if python else None,
        max_line_bytes=getattr(options, "max_dataset_line_bytes", DATASET_LINE_BYTES),
        max_file_bytes=getattr(options, "max_dataset_bytes", DATASET_FILE_BYTES),
        max_think_leak_rate=pick(None, "max_think_leak_rate", DEFAULT_REASONING_BAR),
        max_empty_stop_rate=pick(None, "max_empty_stop_rate", DEFAULT_REASONING_BAR),
        max_missing_reasoning_rate=pick(None, "max_missing_reasoning_rate", DEFAULT_REASONING_BAR),
        repeats=pick(getattr(options, "repeats", None), "repeats", 1),
        min_tool_trigger_f1=pick(None, "min_tool_trigger_f1", DEFAULT_CERTIFY_BAR),
        certify_min_schema_accuracy=pick(None, "certify_min_schema_accuracy", DEFAULT_CERTIFY_BAR))
