"""The base of every profile table: unknown keys are errors, every string passes one rule.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from kimi_deploy.values import check_text


#: Upper bound of ``StartLimitBurst=``: systemd parses it as an unsigned int and ignores larger values.
UINT_MAX = 2**32 - 1


#: Upper bound of every time span in ``[service]`` (seconds): one week. systemd stores spans in
#: microseconds and silently falls back to its default on a value it cannot parse (e.g. 10^14 s is
#: "Numerical result out of range"), and TimeoutStartSec= falling back to 90 s kills every cold start.
MAX_SPAN_SEC = 7 * 24 * 3600


class Section(BaseModel):
    """Base of every profile table: unknown keys are errors, and every string passes :func:`check_text`."""

    # strict: TOML has real types, so `tp_size = "8"` is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _clean_text(cls, v: Any) -> Any:
        """The one rule for strings (no control/format characters, bounded length), for every field."""
        return check_text(v)
