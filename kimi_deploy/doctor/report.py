"""Doctor results: one :class:`Check` per finding, gathered in a :class:`DoctorReport`."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Status = Literal["pass", "warn", "fail"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding. ``evidence``: one line of what was seen; ``hint``: how to fix it (warn/fail);
    ``details``: optional longer text (a diff), shown with ``--json`` and ``-v``."""

    name: str
    status: Status
    evidence: str
    hint: str | None = None
    details: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def passed(name: str, evidence: str) -> Check:
    return Check(name, "pass", evidence)


def warned(name: str, evidence: str, hint: str, details: str | None = None) -> Check:
    return Check(name, "warn", evidence, hint, details)


def failed(name: str, evidence: str, hint: str, details: str | None = None) -> Check:
    return Check(name, "fail", evidence, hint, details)


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """Every check in run order; ``ok`` when none failed (warnings allowed)."""

    profile_name: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        """``{"pass": n, "warn": n, "fail": n}``."""
        out = {"pass": 0, "warn": 0, "fail": 0}
        for check in self.checks:
            out[check.status] += 1
        return out

    def get(self, name: str) -> Check:
        """The check called ``name`` (KeyError if absent)."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile_name, "ok": self.ok, "counts": self.counts(),
                "checks": [c.to_dict() for c in self.checks]}
