"""Which all-reduce path the server really runs, read from SGLang's own log lines after the start.

A profile asks for FlashInfer all-reduce fusion, torch symmetric memory or the PCIe IPC all-reduce; SGLang
0.5.23 may skip each of them with a log line and serve on NCCL, so a benchmark would measure "not that
path". :func:`parse_log` matches the lines SGLang 0.5.23 writes (sources below; ``journalctl -o cat``
prints the bare message, the ``[time TPn]`` prefix SGLang adds is ignored) and :func:`judge` turns them
into one :class:`PathReport` per path: ``engaged``, ``skipped`` (SGLang turned it off and said so),
``not_seen`` (no line either way) or ``not_asked``. A path the profile asks for that the log says was
skipped is a failure with that log line as evidence.

Sources (SGLang 0.5.23, ``sglang/srt/``):

- ``layers/flashinfer_comm_fusion.py``: ``FlashInfer AllReduce Fusion enabled and workspace initialized:
  backend=...`` (engaged); ``FlashInfer workspace preflight probe failed (...). Skipping allreduce
  fusion.``, ``FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank. Skipping
  allreduce fusion ...``, ``Failed to initialize FlashInfer workspace (backend=...): ... Disabling
  flashinfer allreduce fusion permanently.``, ``FlashInfer allreduce fusion disabled globally because
  workspace initialization failed on at least one rank.``, ``FlashInfer AllReduce fusion disabled: the N
  ranks of this group are not confirmed to share one NVLink clique ...``, ``FlashInfer comm not available,
  skipping workspace initialization``, ``flashinfer.comm ... allreduce_fusion API is not available ...``
  (skipped); ``FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.`` (raised: the start fails).
- ``distributed/device_communicators/pcie_ipc_ar.py``: ``FlashInfer PCIe-IPC all-reduce enabled (world=N,
  ...)`` and ``FlashInfer PCIe-IPC workspace built (world=N, max_numel=M, hidden=H)`` (engaged; the runner
  builds the workspace during warmup); ``FlashInfer PCIe-IPC workspace (max_numel=M) failed: ...;
  reductions stay on NCCL``, ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no
  pcie_ipc_comm; falling back to NCCL all-reduce.``, ``Deterministic inference is on; leaving PCIe-IPC
  all-reduce off.`` (skipped); ``distributed/parallel_state.py``: ``Setup FlashInfer PCIe-IPC allreduce
  failed with ...`` (skipped).
- ``distributed/device_communicators/torch_symm_mem.py``: ``TorchSymmMemCommunicator: Device capability N
  not supported, communicator is not available.``, ``... World size N not supported ...``, ``...
  torch symmetric memory multicast operations are not supported.`` (skipped). It logs nothing when it
  engages, so without a skip line its state is ``not_seen``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from kimi_deploy import proc
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.deployment import Deployment
from kimi_deploy.profile import Profile

Path_ = Literal["fusion", "pcie_ipc", "torch_symm_mem"]
State = Literal["engaged", "skipped", "not_seen", "not_asked"]

#: The line SGLang 0.5.23 logs once the HTTP server is up (``srt/entrypoints/http_server.py``): startup
#: lines end there.
READY_LINE = "The server is fired up and ready to roll!"

#: (path, outcome, pattern) in SGLang 0.5.23's wording; ``raised`` is a fusion refusal that fails the start.
PATTERNS: tuple[tuple[Path_, Literal["engaged", "skipped", "raised"], re.Pattern[str]], ...] = tuple(
    (path, outcome, re.compile(rx)) for path, outcome, rx in (
        ("fusion", "engaged", r"FlashInfer AllReduce Fusion enabled and workspace initialized: backend=(?P<detail>\w+)"),
        ("fusion", "skipped", r"FlashInfer workspace preflight probe failed"),
        ("fusion", "skipped", r"FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank"),
        ("fusion", "skipped", r"Failed to initialize FlashInfer workspace \(backend="),
        ("fusion", "skipped", r"FlashInfer allreduce fusion disabled globally because workspace initialization failed"),
        ("fusion", "skipped", r"FlashInfer AllReduce fusion disabled: the \d+ ranks of this group"),
        ("fusion", "skipped", r"FlashInfer comm not available, skipping workspace initialization"),
        ("fusion", "skipped", r"flashinfer\.comm (unified )?allreduce_fusion API is not available"),
        ("fusion", "raised", r"FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs"),
        ("pcie_ipc", "engaged", r"FlashInfer PCIe-IPC workspace built \((?P<detail>[^)]*)\)"),
        ("pcie_ipc", "engaged", r"FlashInfer PCIe-IPC all-reduce enabled \((?P<detail>world=\d+)"),
        ("pcie_ipc", "skipped", r"FlashInfer PCIe-IPC workspace \(max_numel=\d+\) failed"),
        ("pcie_ipc", "skipped", r"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm"),
        ("pcie_ipc", "skipped", r"Deterministic inference is on; leaving PCIe-IPC all-reduce off"),
        ("pcie_ipc", "skipped", r"Setup FlashInfer PCIe-IPC allreduce failed with"),
        ("torch_symm_mem", "skipped", r"TorchSymmMemCommunicator: Device capability \d+ not supported"),
        ("torch_symm_mem", "skipped", r"TorchSymmMemCommunicator: World size \d+ not supported"),
        ("torch_symm_mem", "skipped", r"TorchSymmMemCommunicator: torch symmetric memory multicast operations are not "
                                      r"supported"),
    )
)

LABELS: dict[Path_, str] = {"fusion": "FlashInfer all-reduce fusion", "pcie_ipc": "PCIe IPC all-reduce",
                            "torch_symm_mem": "torch symmetric memory"}


@dataclasses.dataclass(frozen=True)
class LogEvent:
    """One matched line: the path, ``engaged``/``skipped``/``raised``, a detail (backend, sizes), the line."""

    path: Path_
    outcome: str
    detail: str
    line: str


def parse_log(lines: Iterable[str]) -> tuple[list[LogEvent], bool]:
    """Match SGLang 0.5.23's all-reduce lines in ``lines`` (``journalctl -o cat`` of one start).

    Returns the events in log order and whether the ready line (:data:`READY_LINE`) was seen.
    """
    events: list[LogEvent] = []
    ready = False
    for raw in lines:
        line = raw.rstrip("\n")
        if READY_LINE in line:
            ready = True
        for path, outcome, rx in PATTERNS:
            m = rx.search(line)
            if m:
                detail = m.groupdict().get("detail") or ""
                events.append(LogEvent(path, outcome, detail, line.strip()))
                break
    return events, ready


@dataclasses.dataclass(frozen=True)
class PathReport:
    """What the log says about one path: ``asked`` by the profile, its ``state`` and the ``evidence`` line."""

    path: Path_
    asked: bool
    state: State
    evidence: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        """Asked for, and the log says SGLang skipped it (or refused it)."""
        return self.asked and self.state == "skipped"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "label": LABELS[self.path], "asked": self.asked, "state": self.state,
                "detail": self.detail, "evidence": self.evidence, "failed": self.failed}


@dataclasses.dataclass(frozen=True)
class AllreduceReport:
    """The all-reduce paths after one start: per path, and the one sentence of what runs."""

    paths: tuple[PathReport, ...]
    in_use: str
    log_source: str
    complete: bool

    @property
    def failures(self) -> list[PathReport]:
        return [p for p in self.paths if p.failed]

    def problems(self) -> list[str]:
        """One line per path asked for but skipped: what, the log line, the fix."""
        out = []
        for p in self.failures:
            out.append(f"{LABELS[p.path]} was asked for but SGLang skipped it: the log says `{p.evidence}`; "
                       f"fix: {FIXES[p.path]}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"in_use": self.in_use, "log_source": self.log_source, "complete": self.complete,
                "paths": [p.to_dict() for p in self.paths], "problems": self.problems()}


#: What to do when an asked-for path was skipped.
FIXES: dict[Path_, str] = {
    "fusion": "read the lines before it (workspace allocation, preflight) in the journal; on SM120 apply the "
              "sm120-flashinfer-allreduce-fusion patch, or remove flashinfer_allreduce_fusion_backend (a benchmark "
              "of this start measured no fusion)",
    "pcie_ipc": "check the FlashInfer build (0.7.2+ has pcie_ipc_comm) and `kimi-deploy doctor`'s fabric checks, "
                "or remove enable_pcie_ipc_allreduce (this start runs NCCL)",
    "torch_symm_mem": "on SM12x apply the sm120-torch-symm-mem patch (experimental), or remove enable_torch_symm_mem "
                      "(this start runs without it)",
}


def asked_paths(profile: Profile) -> dict[Path_, bool]:
    """Which paths ``profile`` asks for."""
    s = profile.sglang
    return {"fusion": bool(s.flashinfer_allreduce_fusion_backend and not s.enforce_disable_flashinfer_allreduce_fusion),
            "pcie_ipc": bool(s.enable_pcie_ipc_allreduce), "torch_symm_mem": bool(s.enable_torch_symm_mem)}


def judge(profile: Profile, lines: Sequence[str], *, source: str = "journal") -> AllreduceReport:
    """The :class:`AllreduceReport` of ``profile`` from the log ``lines`` of one start (pure).

    Per path any skip line wins over an engaged line (SGLang turns fusion off on every rank when one rank
    fails, and one start's log holds every rank's lines); ``raised`` fusion lines count as skipped.
    """
    events, ready = parse_log(lines)
    asked = asked_paths(profile)
    reports = []
    for path in ("fusion", "pcie_ipc", "torch_symm_mem"):
        mine = [e for e in events if e.path == path]
        skip = [e for e in mine if e.outcome in ("skipped", "raised")]
        engaged = [e for e in mine if e.outcome == "engaged"]
        if skip:
            reports.append(PathReport(path, asked[path], "skipped", skip[0].line))
        elif engaged:
            detail = next((e.detail for e in reversed(engaged) if e.detail), "")
            reports.append(PathReport(path, asked[path], "engaged", engaged[-1].line, detail))
        else:
            state: State = "not_seen" if asked[path] else "not_asked"
            evidence = "no log line about it" + (" (SGLang 0.5.23 logs only when it turns torch symmetric memory "
                                                 "off)" if path == "torch_symm_mem" else "")
            reports.append(PathReport(path, asked[path], state, evidence))
    by = {r.path: r for r in reports}
    parts = []
    if by["fusion"].state == "engaged":
        parts.append(f"FlashInfer all-reduce fusion ({by['fusion'].detail or 'engaged'}) for all-reduces up to 2048 "
                     "tokens" + (" (PCIe IPC pre-empted)" if by["pcie_ipc"].state == "engaged" else ""))
    elif by["pcie_ipc"].state == "engaged":
        parts.append(f"PCIe IPC all-reduce ({by['pcie_ipc'].detail or 'engaged'}) for decode-sized all-reduces")
    if asked["torch_symm_mem"] and by["torch_symm_mem"].state != "skipped":
        parts.append("torch symmetric memory within its size row (no log line confirms it)")
    parts.append("NCCL for the rest" if parts else "NCCL for every all-reduce")
    return AllreduceReport(tuple(reports), "; ".join(parts), source, ready)


def journal_command(unit: str, since: str | None) -> list[str]:
    """argv reading ``unit``'s messages since its main process started (``ExecMainStartTimestamp``, in
    systemd's timestamp format, which ``--since`` accepts; systemd.time(7)); without it, the last 20000."""
    window = ["--since", since] if since else ["-n", "20000"]
    return ["journalctl", "-u", unit, *window, "-o", "cat", "--no-pager"]


def read_start_log(unit: str, since: str | None) -> tuple[list[str] | None, str]:
    """The log lines of ``unit``'s current start up to the ready line, and the command that read them;
    ``(None, reason)`` when journalctl cannot be run or fails. Never raises."""
    argv = journal_command(unit, since)
    try:
        done = proc.run(argv, check=False, timeout=120.0)
    except KimiDeployError as exc:
        return None, exc.message
    if not done.ok:
        return None, f"`{done.command}` failed: " + (done.stderr.strip() or f"exit {done.returncode}").splitlines()[0]
    lines = []
    for line in done.stdout.splitlines():
        lines.append(line)
        if READY_LINE in line:
            break
    return lines, done.command


def report_for(deployment: Deployment, since: str | None) -> tuple[AllreduceReport | None, str | None]:
    """Read the journal of ``deployment``'s server unit for the current start and judge it against its profile:
    ``(report, None)`` or ``(None, why the log could not be read)``."""
    lines, source = read_start_log(deployment.units.server, since)
    if lines is None:
        return None, source
    return judge(deployment.profile, lines, source=source), None
