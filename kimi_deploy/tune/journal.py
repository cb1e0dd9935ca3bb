"""The tune journal: every candidate's state and result, persisted as it happens, so ``tune --resume`` continues.

One file, ``/var/lib/kimi-deploy/tune/<service>/journal.json`` (:meth:`kimi_deploy.paths.HostLayout.tune_dir`),
canonical JSON (sorted keys, 2-space indent) written atomically with :func:`kimi_deploy.fsio.write_atomic` (a
temporary file in the same folder, fsynced, renamed over: a kill at any instant leaves the old record or the new
one, never half of one), as :mod:`kimi_deploy.host.journal` writes a change's record. The shape is
:class:`TuneJournal` (pydantic, ``extra="forbid"``): a hand edit or a disk fault is an error with the fix, never a
guess.

What a kill leaves, and what ``--resume`` does with it:

- a measurement whose ``state`` is ``deploying`` or ``measuring`` never finished: it is dropped and its candidate
  measured again (never counted twice: only ``measured``/``rejected``/``failed`` rows count);
- a finished measurement is kept and never re-run: the search (:mod:`kimi_deploy.tune.search`) is a pure function
  of the finished rows, so it takes the same decisions again and asks for the next one;
- the host's own change in flight (a restart killed mid-gate) is :mod:`kimi_deploy.host.journal`'s: the next
  restart finishes or undoes it first, as every verb does.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kimi_deploy import __version__, fsio
from kimi_deploy.errors import UsageError
from kimi_deploy.host.records import read_bytes

JOURNAL_FORMAT = 1
JOURNAL_FILE = "journal.json"

#: A measurement's states: ``deploying`` (files written or being written, restart and gate running),
#: ``measuring`` (gate passed, bench running), then one of the final three: ``measured`` (goodput known),
#: ``rejected`` (the gate failed: ``failed_tier``/``failed_checks``; the previous version was rolled back) or
#: ``failed`` (it did not start, or the bench could not measure it).
State = Literal["deploying", "measuring", "measured", "rejected", "failed"]
FINAL: tuple[str, ...] = ("measured", "rejected", "failed")


def now() -> str:
    """UTC now, ISO 8601 with seconds (``2026-12-05T19:02:11Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CandidateRecord(BaseModel):
    """What is known of one candidate before any restart: its ``values`` (tuned key -> value), ``pruned``
    (``{"stage", "problems"}``: never started) and SGLang's parser's verdict once run (``validation``:
    ``{"ok", "errors", "warnings"}``)."""

    model_config = ConfigDict(extra="forbid")

    values: dict[str, Any]
    pruned: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None


class Measurement(BaseModel):
    """One deployment and benchmark of one candidate (the ``n``-th of it, 0-based).

    ``restarted``: it cost a restart (False: it was live already). ``goodput_runs``: requests/s meeting every SLO,
    one figure per bench run (the interval is their range). ``summary``: the pooled bench figures (``goodput``,
    ``requests_per_s``, ``ttft_ms``/``itl_ms``/``tpot_ms``/``e2e_ms`` p50/p99, ``errors``). ``gate``: the gate's
    verdict (``{"ok", "failed_tier", "failed_checks", "seconds"}``). ``bench``: the bench result file (host path).
    """

    model_config = ConfigDict(extra="forbid")

    candidate: str
    n: int
    state: State
    started_at: str
    finished_at: str | None = None
    restarted: bool = True
    seconds: float | None = None
    gate: dict[str, Any] | None = None
    failed_tier: str | None = None
    failed_checks: list[str] = []
    error: str | None = None
    goodput_runs: list[float] = []
    summary: dict[str, Any] = {}
    bench: str | None = None


class TuneJournal(BaseModel):
    """``journal.json``: one tune of one service.

    ``profile``: the original profile, as TOML text (what Ctrl-C and the end restore); ``settings``: what the run
    was asked (SLO, workload, load, runs, budget, gate, space, apply), so ``--resume`` runs the same search;
    ``live``: the candidate the host runs now, having passed its gate (``None``: unknown, after a kill while
    deploying); ``phase``: ``searching``, ``restoring`` (putting the original or the winner back), ``done``.
    ``result``: the report once done (:mod:`kimi_deploy.tune.report`).
    """

    model_config = ConfigDict(extra="forbid")

    format: int = JOURNAL_FORMAT
    kimi_deploy_version: str = __version__
    service: str
    started_at: str
    updated_at: str
    sglang_version: str
    profile: str
    profile_sha256: str
    baseline: str
    settings: dict[str, Any]
    dimensions: list[dict[str, Any]]
    candidates: dict[str, CandidateRecord] = {}
    measurements: list[Measurement] = []
    live: str | None = None
    phase: Literal["searching", "restoring", "done"] = "searching"
    interrupted: int = 0
    lost_restarts: int = 0
    result: dict[str, Any] | None = None

    def finished(self) -> list[Measurement]:
        """The measurements that ended (``measured``, ``rejected``, ``failed``), in run order."""
        return [m for m in self.measurements if m.state in FINAL]

    def restarts(self) -> int:
        """Restarts spent so far: the measurements' that restarted, and those of unfinished ones a kill dropped
        (``lost_restarts``)."""
        return sum(1 for m in self.measurements if m.restarted) + self.lost_restarts

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


def path(folder: Path) -> Path:
    return folder / JOURNAL_FILE


def load(folder: Path) -> TuneJournal | None:
    """The journal in ``folder``; ``None`` when there is none.

    Raises:
        UsageError: it is not the shape :class:`TuneJournal` gives (a hand edit or a disk fault), with the fix.
    """
    raw = read_bytes(path(folder))
    if raw is None:
        return None
    try:
        return TuneJournal.model_validate_json(raw)
    except ValidationError as exc:
        raise UsageError("the tune journal is unreadable", value=str(path(folder)),
                         hint=f"it is written atomically, so this is a hand edit or a disk fault "
                              f"({exc.error_count()} problems): move it aside and run tune without --resume") from None


def save(folder: Path, journal: TuneJournal) -> TuneJournal:
    """Write ``journal`` (``updated_at`` set now) atomically, 0600 (it holds the profile). Returns what was written.

    Raises:
        StorageError: the file system refused (:func:`kimi_deploy.fsio.write_atomic`).
    """
    journal = journal.model_copy(update={"updated_at": now()})
    fsio.mkdir(folder)
    fsio.write_atomic(path(folder), journal.to_bytes(), mode=0o600)
    return journal


def drop_unfinished(journal: TuneJournal) -> tuple[TuneJournal, list[Measurement]]:
    """``journal`` without its unfinished measurements (a kill's), and those dropped (module docstring)."""
    keep = [m for m in journal.measurements if m.state in FINAL]
    dropped = [m for m in journal.measurements if m.state not in FINAL]
    lost = journal.lost_restarts + sum(1 for m in dropped if m.restarted)
    return journal.model_copy(update={"measurements": keep, "lost_restarts": lost}), dropped
