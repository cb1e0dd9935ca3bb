"""Every start's phase durations, kept on the host, their medians, and each phase's budget (issue #42).

:func:`kimi_deploy.host.phases.parse_start` reads one start's phases from SGLang's log (weights, KV cache, draft,
CUDA graphs, ready); ``restart --wait`` (and ``upgrade``, which restarts through it) hands each start that reached
ready to :func:`record`. The records live in ``/var/lib/<service>/start-history.json`` (the unit's
``StateDirectory=``), beside ``start-phases.json`` (the last start, whole): ``upgrade`` moves the interpreter and
the profile, never the state directory, so the history spans upgrades; ``uninstall --purge`` removes it.

File format (version 1)::

    {"version": 1, "starts": [{"started": "2026-12-05 15:40:01", "total": 571.0,
                               "phases": {"weights": 402.3, "kv_cache": 6.0, ...}}, ...]}

oldest first, at most :data:`MAX_STARTS`; written whole and atomically (:func:`kimi_deploy.fsio.write_atomic`).
An unreadable or hostile file reads as no history (never an error: the records inform, they do not fail a
restart), and a record is rewritten from scratch on the next start.

A phase's **budget** (:func:`budgets`) is ``[startup] budget_sec`` for that phase when the profile sets one, else
the median of the previous recorded starts times ``[startup] budget_factor`` once :data:`MIN_STARTS` are recorded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import fsio
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.paths import service_state_dir
from kimi_deploy.profile import load_profile
from kimi_deploy.host.phases import PHASES, StartPhases
from kimi_deploy.profile.startup import BUDGET_PHASES, Startup

#: Records kept (the oldest go first): two a day for seven weeks.
MAX_STARTS = 100
#: The medians read the last this many starts: recent enough to follow a new SGLang or driver.
WINDOW = 20
#: Starts needed before a median is a budget: one slow first start (cold JIT caches) is no baseline.
MIN_STARTS = 3
#: Largest history file read (100 records are ~20 KB).
MAX_FILE_BYTES = 1024 * 1024
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class StartRecord:
    """One recorded start: ``started`` (SGLang's first log line, ``YYYY-MM-DD HH:MM:SS``), ``total`` seconds
    (first log line to ready), ``phases``: phase -> seconds (the phases the log showed)."""

    started: str
    total: float
    phases: dict[str, float]

    def seconds(self, phase: str) -> float | None:
        """Seconds of ``phase`` (``"total"`` included), or ``None`` when this start had no such phase."""
        return self.total if phase == "total" else self.phases.get(phase)

    def to_dict(self) -> dict[str, Any]:
        return {"started": self.started, "total": self.total, "phases": dict(self.phases)}


@dataclasses.dataclass(frozen=True)
class Budget:
    """A phase's budget: ``seconds``; ``source``: ``"profile"`` or ``"median"``; ``median`` and ``starts``: the
    median of the previous starts and how many (``None``/0 for a profile budget without history)."""

    phase: str
    seconds: float
    source: str
    median: float | None
    starts: int

    def describe(self, factor: float) -> str:
        if self.source == "profile":
            return f"[startup] budget_sec.{self.phase} = {self.seconds:g} s"
        return f"{factor:g} x the median {self.median:.0f} s of the previous {self.starts} starts"


def history_path(directory: str | Path) -> Path:
    """``<directory>/start-history.json``; ``directory`` is the service's state directory (``/var/lib/<service>``)."""
    return Path(directory) / "start-history.json"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def load(directory: str | Path) -> list[StartRecord]:
    """The recorded starts, oldest first; ``[]`` when there is no file or it is unreadable, too large, not this
    format, or hostile (entries of the wrong shape are left out one by one)."""
    path = history_path(directory)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return []
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION or not isinstance(data.get("starts"), list):
        return []
    out = []
    for entry in data["starts"][-MAX_STARTS:]:
        if not isinstance(entry, dict) or not isinstance(entry.get("started"), str) or \
                not isinstance(entry.get("phases"), dict):
            continue
        total = _number(entry.get("total"))
        phases = {k: v for k, v in ((k, _number(v)) for k, v in entry["phases"].items()) if k in PHASES and v is not None}
        if total is not None:
            out.append(StartRecord(entry["started"][:32], total, phases))
    return out


def record(directory: str | Path, start: StartPhases) -> StartRecord | None:
    """Append ``start`` to the history when it reached ready and is not recorded yet (same ``started``); returns
    the record, or ``None`` when nothing was added.

    Raises:
        KimiDeployError: the state directory cannot be written (:mod:`kimi_deploy.fsio`).
    """
    if not start.ready or start.total_seconds is None or not start.started:
        return None
    history = load(directory)
    if any(r.started == start.started for r in history):
        return None
    new = StartRecord(start.started, float(start.total_seconds),
                      {p.name: float(p.seconds) for p in start.phases if p.seconds is not None})
    history = [*history, new][-MAX_STARTS:]
    path = history_path(directory)
    fsio.mkdir(path.parent)
    fsio.write_atomic(path, json.dumps({"version": FORMAT_VERSION, "starts": [r.to_dict() for r in history]},
                                       indent=1) + "\n")
    return new


def medians(history: Sequence[StartRecord]) -> dict[str, tuple[float, int]]:
    """Phase (``total`` included) -> ``(median seconds, starts)`` over the last :data:`WINDOW` records that have it."""
    out = {}
    for phase in BUDGET_PHASES:
        values = [s for r in history[-WINDOW:] if (s := r.seconds(phase)) is not None]
        if values:
            out[phase] = (statistics.median(values), len(values))
    return out


def budgets(startup: Startup, previous: Sequence[StartRecord]) -> dict[str, Budget]:
    """Each phase's budget: ``[startup] budget_sec``, else ``budget_factor`` x the median of ``previous`` (the
    starts before the one judged) when at least :data:`MIN_STARTS` have the phase."""
    mids = medians(previous)
    out = {}
    for phase in BUDGET_PHASES:
        median, starts = mids.get(phase, (None, 0))
        if phase in startup.budget_sec:
            out[phase] = Budget(phase, startup.budget_sec[phase], "profile", median, starts)
        elif median is not None and starts >= MIN_STARTS:
            out[phase] = Budget(phase, median * startup.budget_factor, "median", median, starts)
    return out


def over_budget(startup: Startup, start: StartRecord, previous: Sequence[StartRecord]) -> list[str]:
    """One line per phase of ``start`` over its budget (:func:`budgets` of the starts before it)."""
    out = []
    for phase, budget in budgets(startup, previous).items():
        seconds = start.seconds(phase)
        if seconds is not None and seconds > budget.seconds:
            out.append(f"{phase} took {seconds:.0f} s, over its budget of {budget.seconds:.0f} s "
                       f"({budget.describe(startup.budget_factor)})")
    return out


def summary(startup: Startup, directory: str | Path) -> dict[str, Any] | None:
    """What ``status`` and the nightly check's textfile show: the last recorded start, the medians of the starts
    (``{phase: {"median", "starts"}}``), each phase's budget for the next start, and the last start's phases
    over budget (judged against the starts before it); ``None`` without a record."""
    history = load(directory)
    if not history:
        return None
    last, previous = history[-1], history[:-1]
    return {"starts": len(history), "last": last.to_dict(),
            "medians": {k: {"median": m, "starts": n} for k, (m, n) in medians(history).items()},
            "budgets": {k: {"seconds": b.seconds, "source": b.source}
                        for k, b in budgets(startup, history).items()},
            "last_budgets": {k: b.seconds for k, b in budgets(startup, previous).items()},
            "over_budget": over_budget(startup, last, previous)}


def summary_lines(data: dict[str, Any] | None) -> list[str]:
    """``status``'s lines for :func:`summary` (``[]`` without one)."""
    if not data:
        return []
    order = [p for p in BUDGET_PHASES if p in data["medians"]]
    mids = ", ".join(f"{p} {data['medians'][p]['median']:.0f} s" for p in order)
    out = [f"starts    {data['starts']} recorded; median per phase: {mids}"]
    out += [f"          over budget: {line}" for line in data["over_budget"]]
    return out


def recorded(profile_path: str | Path) -> dict[str, Any] | None:
    """:func:`summary` of the service ``profile_path`` describes, read from its state directory on this host
    (``/var/lib/<service>``: the nightly check unit's ``StateDirectory=``); ``None`` when the profile does not load
    (the check has already said so) or nothing is recorded."""
    try:
        profile = load_profile(Path(profile_path))
    except KimiDeployError:
        return None
    return summary(profile.start, service_state_dir(profile.service.name))
