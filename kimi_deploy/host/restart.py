"""``restart [--wait] [--gate TIER] [--rollback-on-failure]``: restart the server, gate it, roll back.

Sequence: a change that drops ``--tool-call-parser``/``--reasoning-parser`` against the previous install is
refused before anything restarts (:func:`kimi_deploy.host.gate.refuse_parser_removal`, exit 4); then
``systemctl restart NAME.service`` (with ``wait``, a start job that failed, e.g. an ``ExecStartPre=``, fails the
ready tier instead of raising); with ``wait``, the gate (:mod:`kimi_deploy.host.gate`): ready
(:func:`kimi_deploy.host.readiness.wait_ready` until ready or the deadline, default the unit's ``TimeoutStartSec=``,
``[service] timeout_start_sec``) → fast (``health.*``, ``config.*``) → parser (``parser.*``) → contract (tool
calls, the id round trip, reasoning separation), as far as ``gate`` (default ``contract``), stopping at the
first tier that fails; then the server's own log of this start for the all-reduce path in use
(:mod:`kimi_deploy.host.allreduce`): a path the profile asks for that SGLang skipped fails the attempt with the log
line as evidence.
When that fails and ``rollback_on_failure`` is set, the version of the newest install backup is put back
(:func:`kimi_deploy.host.journal.restore_old`), systemd reloaded, the service restarted and
verified with the same gate; the result reports both attempts, the tier that failed and its failed checks.
A rollback whose restored version fails the gate too is exit 10 (:attr:`ExitCode.ROLLBACK_FAILED`).
With ``rollback_on_failure`` the whole change is journaled (:mod:`kimi_deploy.host.journal`): a run killed at any
instant leaves a record the next run finishes or undoes first (:func:`restart` then reports that and starts
no new restart); :func:`plan_restart` says what a run would do (``--dry-run``).

Behind SGLang's gateway (``drain``, :class:`Drain`: a replica of a profile with ``[gateway]``), the replica
is first removed from the gateway (smg's worker API: new requests go to the other replicas; smg 1.13.0 waits a
fixed 5 s before it drops the worker), then the kit waits for the requests still running on the replica
(:func:`wait_idle`, its ``/v1/loads``), restarts it, waits for and checks it at its own worker URL, and adds it
back only when that passed. On failure it stays out of the gateway's rotation: the exit status is the
attempt's (1 failed, 6 not ready in time), or 9 (:attr:`ExitCode.OUT_OF_ROTATION`) when the restart passed but
the gateway did not take the replica back, or the gateway still listed it draining, or it still ran requests
after ``Drain.idle_timeout`` (nothing restarted in those two).
A gateway that does not answer (3) or refuses the removal (1) restarts nothing, and the error says the
replica was not taken out of rotation; a restart that raises after the removal says it stays out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kimi_deploy.host import allreduce
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.host import systemd
from kimi_deploy.wire import apikey
from kimi_deploy.errors import ExitCode, ExternalCommandError, KimiDeployError, UsageError
from kimi_deploy.host import gate as gates
from kimi_deploy.host import journal, phases, start_history
from kimi_deploy.host.records import BackupSet, Restored, list_backups, service_lock
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile, load_profile
from kimi_deploy.host.readiness import WaitResult, WaitState, wait_ready
from kimi_deploy.deployment import Deployment, Units, resolve
from kimi_deploy.host.gateway import DrainTimeout, Gateway
from kimi_deploy.wire.http import control_client, request_capped
from kimi_deploy.topology import is_node, local_rank, pick_host, refuse_http_proof

#: The gate's fast tier (``kimi-deploy check`` groups): quick, and they prove the configuration took. Read when a
#: restart runs (tests narrow it); the parser and contract tiers follow it (:mod:`kimi_deploy.host.gate`).
FAST_TIER = gates.FAST_TIER


@dataclasses.dataclass(frozen=True)
class CheckSummary:
    """The fast check tier's outcome: ``exit_code`` (the :class:`kimi_deploy.check.CheckReport`'s,
    an :class:`ExitCode` value) and its results as dicts (``id``, ``status``, ``kind``, ``detail``)."""

    exit_code: int
    results: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    @property
    def failed(self) -> list[str]:
        """Ids of the checks whose status is ``fail``."""
        return [r["id"] for r in self.results if r["status"] == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Drain:
    """A replica behind a gateway: ``gateway`` (a :class:`kimi_deploy.host.gateway.Gateway` client, or anything with
    its ``remove(url)``/``add(url)``), the replica's worker ``url`` (``http://{nodes[0]}:{port}``) and
    ``idle_timeout``: seconds to wait, once the gateway dropped it, for the requests still running on it
    (:func:`wait_idle`; ``restart --drain-timeout``)."""

    gateway: Any
    url: str
    idle_timeout: float = 600.0


def drain_for(deployment: Deployment, layout: HostLayout, host: str | None, *, wait: bool,
              idle_timeout: float = 600.0) -> Drain | None:
    """The :class:`Drain` of this node's replica (``host``: ``--host``, else found by
    :func:`kimi_deploy.topology.pick_host`), or None without ``[gateway]``: the gateway's URL, the replica's worker
    URL and the key path read from ``deployment``.

    Raises:
        UsageError: ``host`` without ``[gateway]`` or multi-node replicas; this host runs the gateway only, or
            a rank >= 1 (the group restarts from rank 0); no ``wait`` (a drained replica goes back into the
            gateway only once ready and checked); an unreadable key file (exit 2).
    """
    profile = deployment.profile
    if profile.gateway is None:
        if host is not None and profile.nodes_per_copy < 2:
            raise UsageError("--host is for a profile with [gateway] or multi-node replicas", value=host,
                             hint="drop --host")
        return None
    this = pick_host(profile, host)
    if not is_node(profile, this):
        raise UsageError(f"{this} runs the gateway only; restart it with systemctl", value=this,
                         hint=f"systemctl restart {deployment.units.gateway}")
    replica = next(nodes for nodes in profile.replicas if this in nodes)
    if replica[0] != this:
        raise UsageError(f"{this} is rank {replica.index(this)} of a multi-node replica; restart its group from "
                         "rank 0", value=this, hint=f"run restart on {replica[0]}")
    if not wait:
        raise UsageError("a replica behind a gateway is restarted with --wait (it goes back into the gateway "
                         "only once it is ready and checked)", hint="add --wait")
    key = apikey.resolve_key(profile_key_file=deployment.api_key_file, layout=layout)
    return Drain(Gateway(deployment.gateway_url, key), deployment.worker_url(this), idle_timeout)


def wait_idle(url: str, api_key: str | None, *, timeout: float, poll: float, clock: Callable[[], float],
              sleep: Callable[[float], None]) -> str | None:
    """Wait until the SGLang server at ``url`` runs and queues no request, polling ``GET /v1/loads?include=core``
    every ``poll`` seconds (SGLang 0.5.23 ``sglang/srt/entrypoints/v1_loads.py``: ``{"loads": [{"dp_rank",
    "num_running_reqs", "num_waiting_reqs", ...}, ...]}``, one entry per data-parallel rank).

    smg 1.13.0 drains a removed worker for a fixed 5 s and then drops it, whatever still runs there; a
    restart right after would cut a long generation. Returns None once every rank is idle, or a note when
    the server cannot tell (no answer, no ``/v1/loads``, an answer of another shape): the restart then goes on
    after the gateway's own drain.

    Raises:
        DrainTimeout: requests still running or queued after ``timeout`` seconds (exit 9); nothing restarted.
    """
    import httpx

    deadline = clock() + timeout
    with control_client(base_url=url, timeout=max(poll, 10.0), api_key=api_key) as client:
        while True:
            try:
                status, body = request_capped(client, "GET", "/v1/loads", params={"include": "core"})
            except httpx.HTTPError as exc:
                return f"{url} did not answer /v1/loads ({exc.__class__.__name__}): restarted after the gateway's drain"
            busy = _busy(body) if status == 200 else None
            if busy is None:
                return (f"{url} reports no request counts (GET /v1/loads: HTTP {status}): restarted after the "
                        "gateway's drain, which may cut a request still running")
            if busy == 0:
                return None
            if clock() >= deadline:
                raise DrainTimeout(f"{busy} request(s) still running or queued on {url} after {timeout:g} s",
                                   value=url)
            sleep(poll)


def _busy(body: Any) -> int | None:
    """Running plus waiting requests over every rank of a ``/v1/loads`` answer; None when it is not one."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    total = 0
    for load in loads:
        counts = [load.get(k) for k in ("num_running_reqs", "num_waiting_reqs")] if isinstance(load, dict) else [None]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            return None
        total += sum(counts)
    return total


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One restart and its verification: ``label`` is ``new`` or ``rollback``.

    ``exit_code``: OK, TIMEOUT (not ready in time), FAILED (the unit or its start job failed, or a check failed),
    or the check report's own code. ``gate``: the tiers that ran (None without ``wait``); ``checks``: every
    check row of those tiers in one summary.
    """

    label: str
    command: str
    wait: WaitResult | None
    checks: CheckSummary | None
    exit_code: int
    summary: str
    allreduce: dict[str, Any] | None = None
    gate: gates.GateResult | None = None
    #: the phases of this start from the server's log (:func:`start_phases`), or ``{"error": why}``
    phases: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "command": self.command, "ok": self.ok, "exit_code": self.exit_code,
                "summary": self.summary, "wait": self.wait.to_dict() if self.wait else None,
                "checks": self.checks.to_dict() if self.checks else None, "allreduce": self.allreduce,
                "gate": self.gate.to_dict() if self.gate else None, "phases": self.phases}


@dataclasses.dataclass(frozen=True)
class RestartResult:
    """Both outcomes: the new version's attempt, and the rollback's (when one ran).

    ``exit_code`` is the new version's (a rolled-back deployment still failed), except that a rollback whose
    restored version failed the gate too is ROLLBACK_FAILED (10): the service runs neither version verified.
    """

    service: str
    attempts: list[Attempt]
    rollback: Restored | None
    notes: list[str]
    #: behind a gateway: ``{"url", "removed", "readded", "error"}`` (None without one)
    gateway: dict[str, Any] | None = None
    #: an interrupted change this run finished or undid instead of restarting anew
    #: (:meth:`kimi_deploy.host.journal.Recovery.to_dict`); None when there was none
    recovered: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        if self.recovered is not None:
            if self.attempts and not self.attempts[-1].ok:
                return int(ExitCode.ROLLBACK_FAILED)
            if self.recovered["target"] != "new":
                return int(ExitCode.FAILED)
            if self.gateway is not None and not self.gateway.get("readded"):
                return int(ExitCode.OUT_OF_ROTATION)
            return int(ExitCode.OK)
        code = self.attempts[0].exit_code
        if len(self.attempts) > 1 and not self.attempts[-1].ok:
            return int(ExitCode.ROLLBACK_FAILED)
        if code == ExitCode.OK and self.gateway is not None and not self.gateway.get("readded"):
            return int(ExitCode.OUT_OF_ROTATION)
        return code

    @property
    def failed_tier(self) -> str | None:
        """The gate tier the new version failed (``ready``, ``fast``, ``parser``, ``contract``), or None."""
        if self.recovered is not None:
            return None
        first = self.attempts[0]
        if first.gate is not None and first.gate.failed_tier:
            return first.gate.failed_tier
        return "allreduce" if not first.ok and first.gate is not None else None

    @property
    def failed_checks(self) -> list[str]:
        """The check ids the new version failed in :attr:`failed_tier`."""
        if self.recovered is not None or not self.attempts[0].gate:
            return []
        return self.attempts[0].gate.failed_checks

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "exit_code": self.exit_code, "ok": self.exit_code == ExitCode.OK,
                "failed_tier": self.failed_tier, "failed_checks": self.failed_checks,
                "rolled_back": self.rollback is not None, "attempts": [a.to_dict() for a in self.attempts],
                "rollback": self.rollback.to_dict() if self.rollback else None, "notes": self.notes,
                "gateway": self.gateway, "recovered": self.recovered}


def _attempt(label: str, deployment: Deployment, layout: HostLayout, *, api_key: str | None, wait: bool, timeout: float,
             poll_interval: float, on_poll: Callable[[str, WaitState], None] | None,
             clock: Callable[[], float], sleep: Callable[[float], None], base_url: str | None = None,
             gate: str = gates.DEFAULT_GATE) -> Attempt:
    unit = deployment.units.server
    try:
        done = unit_facts.systemctl("restart", unit)
    except ExternalCommandError as exc:
        # systemctl waits for the start job: a start that ran and failed (an ExecStartPre= such as patch verify,
        # a cgroup systemd could not attach to) is the new version failing, so it is rolled back like one that
        # failed after starting; systemctl failing by itself (no such unit, no systemd) still raises
        failed = systemd.failed_job(exc.stderr, unit) if wait else None
        if failed is None:
            raise
        verdict = gates.GateResult(gate, [gates.TierResult("ready", int(ExitCode.FAILED), 0.0)])
        return Attempt(label, exc.command, None, None, int(ExitCode.FAILED), f"{unit} failed to start: {failed}",
                       gate=verdict, phases=start_phases(deployment, layout))
    if not wait:
        return Attempt(label, done.command, None, None, int(ExitCode.OK), f"{unit} restarted (not waited for)")
    base_url = base_url or deployment.base_url
    result = wait_ready(base_url, unit, api_key=api_key, model=deployment.served_model, timeout=timeout,
                        poll_interval=poll_interval, on_poll=(lambda s: on_poll(label, s)) if on_poll else None,
                        clock=clock, sleep=sleep)
    if not result.ready:
        why = (f"{unit} failed while starting" if result.unit_failed
               else f"not ready after {result.elapsed:.0f} s (timeout {timeout:g} s)")
        last = f"; last phase: {result.phase}" if result.phase else ""
        code = ExitCode.FAILED if result.unit_failed else ExitCode.TIMEOUT
        verdict = gates.GateResult(gate, [gates.TierResult("ready", int(code), result.elapsed)])
        return Attempt(label, done.command, result, None, int(code), why + last,
                       gate=verdict, phases=start_phases(deployment, layout))
    started = start_phases(deployment, layout)
    verdict = gates.run_gate(gate, deployment, api_key, ready_seconds=result.elapsed, base_url=base_url,
                             timeout=min(120.0, max(10.0, timeout)), fast=FAST_TIER)
    checks = CheckSummary(verdict.exit_code, verdict.results()) if len(verdict.tiers) > 1 else None
    paths = engaged_paths(deployment)
    if not verdict.ok:
        return Attempt(label, done.command, result, checks, verdict.exit_code,
                       f"ready after {result.elapsed:.0f} s, but the {verdict.failed_tier} tier failed: "
                       f"{', '.join(verdict.failed_checks) or 'no check row'}", paths, verdict, started)
    if paths and paths.get("problems"):
        return Attempt(label, done.command, result, checks, int(ExitCode.FAILED),
                       f"ready after {result.elapsed:.0f} s, but {paths['problems'][0]}", paths, verdict, started)
    in_use = f"; all-reduce: {paths['in_use']}" if paths and paths.get("in_use") else ""
    ran = ", ".join(f"{t.tier} {len(t.results)}" for t in verdict.tiers[1:])
    return Attempt(label, done.command, result, checks, int(ExitCode.OK),
                   f"ready after {result.elapsed:.0f} s; gate {gate} passed"
                   + (f" ({ran} checks)" if ran else "") + in_use, paths, verdict, started)


def start_phases(deployment: Deployment, layout: HostLayout) -> dict[str, Any]:
    """The phases of the unit's current start from its journal (:func:`kimi_deploy.host.phases.parse_start`),
    kept as the last measured start under ``layout``'s state directory for the service when it reached ready
    (``render`` compares ``TimeoutStartSec=`` with it); ``{"error": why}`` when the journal cannot be read or the
    record cannot be written. Never raises: the phases inform, they do not fail a restart."""
    profile = deployment.profile
    unit = deployment.units.server
    try:
        since = unit_facts.show(unit).properties.get("ExecMainStartTimestamp") or None
    except KimiDeployError:
        since = None
    lines, source = allreduce.read_start_log(unit, since)
    if lines is None:
        return {"error": source}
    start = phases.parse_start(lines, source=source)
    data = start.to_dict()
    try:
        kept = phases.save_last(layout.state_dir(profile.service.name), start)
    except KimiDeployError as exc:
        data["kept"] = None
        data["keep_error"] = exc.message
    else:
        data["kept"] = layout.host_path(kept) if kept else None
    data.update(budget_check(profile, layout, start))
    return data


def budget_check(profile: Profile, layout: HostLayout, start: phases.StartPhases) -> dict[str, Any]:
    """Record ``start`` in the service's start history (:mod:`kimi_deploy.host.start_history`) and judge it against
    the budgets of the starts before it: ``{"over_budget": [line, ...]}``, or ``{"history_error": why}``."""
    directory = layout.state_dir(profile.service.name)
    previous = start_history.load(directory)
    try:
        new = start_history.record(directory, start)
    except KimiDeployError as exc:
        return {"over_budget": [], "history_error": exc.message}
    if new is None:
        return {"over_budget": []}
    return {"over_budget": start_history.over_budget(profile.start, new, previous)}


def engaged_paths(deployment: Deployment) -> dict[str, Any]:
    """The all-reduce paths of the current start as the server's journal tells them
    (:meth:`kimi_deploy.host.allreduce.AllreduceReport.to_dict`), or ``{"error": why}`` when it cannot be read.
    Never raises: a missing journal is reported, not a failed restart."""
    unit = deployment.units.server
    try:
        since = unit_facts.show(unit).properties.get("ExecMainStartTimestamp") or None
    except KimiDeployError:
        since = None
    report, why = allreduce.report_for(deployment, since)
    return report.to_dict() if report else {"error": why}


def restart(deployment: Deployment, layout: HostLayout, *, wait: bool = False, timeout: float | None = None,
            rollback_on_failure: bool = False, poll_interval: float = 5.0,
            on_poll: Callable[[str, WaitState], None] | None = None,
            on_event: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, drain: Drain | None = None,
            node: str | None = None, gate: str = gates.DEFAULT_GATE,
            allow_parser_removal: bool = False, change: journal.Change | None = None,
            hold_lock: bool = True) -> RestartResult:
    """Restart ``deployment``'s service (its unit, URL and key path as resolved:
    :func:`kimi_deploy.deployment.resolve`); with ``wait``, gate it and optionally roll back.

    Args:
        gate: the last gate tier to run (:data:`kimi_deploy.host.gate.TIERS`: ready, fast, parser, contract);
            the rollback is verified with the same gate.
        allow_parser_removal: restart even when ``profile`` drops a parser the previous install had.
        timeout: seconds to wait for readiness (default ``[service] timeout_start_sec``).
        poll_interval: seconds between probes.
        on_poll: progress callback ``(attempt label, WaitState)`` after each probe.
        on_event: called with one line per milestone (restart, rollback) for the display.
        clock, sleep: the readiness wait's time source and sleep (:func:`kimi_deploy.host.readiness.wait_ready`).
        drain: a replica behind a gateway (needs ``wait``): removed from the gateway, restarted once the
            requests still running there ended (:func:`wait_idle`), waited for and checked at ``drain.url``,
            added back only when that passed.
        node: this host as ``[fleet] replicas`` lists it (default: found by its addresses,
            :func:`kimi_deploy.topology.local_rank`).
        change: the journal of the change this restart is part of (``upgrade`` and ``tune`` begin it); None: the
            restart finishes or undoes an interrupted change it finds first (:func:`kimi_deploy.host.journal.recover`;
            the result is then that, and no new restart), and with ``rollback_on_failure`` journals its own.
        hold_lock: take the service's lock (False: the caller holds it, as ``upgrade`` does).

    Raises:
        RefusedError: ``profile`` drops ``--tool-call-parser``/``--reasoning-parser`` that the previous install's
            profile had (:func:`previous_profile`) and not ``allow_parser_removal`` (exit 4); nothing restarted.
        UsageError: ``wait`` and the profile's API key file is unreadable or empty, or ``wait`` on a rank >= 1
            of a multi-node group (it serves no HTTP: :func:`kimi_deploy.topology.refuse_http_proof`); checked
            before anything is restarted.
        ExternalCommandError: systemctl failed (the restart itself, not the server).
        LockedError: an install, uninstall or restart of the service is running (exit 7); it holds
            :func:`kimi_deploy.host.records.service_lock` for its whole run, and so does this one.
    """
    if drain is not None and not wait:
        raise UsageError("a replica behind a gateway is restarted with --wait (it goes back into the gateway "
                         "only once it is ready and checked)", hint="add --wait")
    profile = deployment.profile
    if wait:
        refuse_http_proof(profile, local_rank(profile, node), "restart --wait")
    gates.tiers_through(gate)  # an unknown gate fails here, before anything restarts
    api_key = apikey.resolve_key(profile_key_file=deployment.api_key_file, layout=layout) if wait else None
    with service_lock(layout, profile.service.name) if hold_lock else contextlib.nullcontext():
        if change is None:
            recovery = journal.recover(layout, profile.service.name, live=True, restart_unit=False,
                                       on_event=on_event)
            if recovery is not None and recovery.changed_anything:
                result = _resumed(recovery, deployment, layout, wait=wait, timeout=timeout,
                                  poll_interval=poll_interval, on_poll=on_poll, on_event=on_event, clock=clock,
                                  sleep=sleep, base_url=drain.url if drain else None, gate=gate)
                return _rejoin(result, recovery, drain, on_event)
        if not allow_parser_removal:
            gates.refuse_parser_removal(previous_profile(layout, profile.service.name), profile,
                                        what=f"restart {profile.service.name}", override="--allow-parser-removal")
        if drain is None:
            return _restart(deployment, layout, api_key=api_key, wait=wait, timeout=timeout,
                            rollback_on_failure=rollback_on_failure, poll_interval=poll_interval, on_poll=on_poll,
                            on_event=on_event, clock=clock, sleep=sleep, gate=gate, change=change)
        return _restart_drained(deployment, layout, drain, api_key=api_key, timeout=timeout,
                                rollback_on_failure=rollback_on_failure, poll_interval=poll_interval,
                                on_poll=on_poll, on_event=on_event, clock=clock, sleep=sleep, gate=gate,
                                change=change)


@dataclasses.dataclass(frozen=True)
class RestartPlan:
    """What ``restart`` would do (``restart --dry-run``; :func:`plan_restart`), nothing done: the unit it restarts,
    the gate's tiers, the rollback (the backup set, the files it would write back or remove, or a first install's
    stop), the gateway drain, an interrupted change it would finish or undo instead, and a refusal."""

    service: str
    unit: str
    command: str
    tiers: list[str]
    rollback: dict[str, Any] | None
    drain: dict[str, Any] | None
    pending: dict[str, Any] | None
    refused: str | None
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "applied": False}

    def lines(self) -> list[str]:
        """The plan in words, one line each."""
        if self.refused:
            return [f"restart {self.service}: REFUSED: {self.refused}"]
        if self.pending:
            p = self.pending
            return [f"restart {self.service}: an interrupted {p['kind']} is on record ({p['phase']}): this run would "
                    f"only {'finish it (the new version passed its gate)' if p['verdict'] == 'pass' else 'undo it: ' + p['from'] + ' back'}"
                    + (", then restart and gate that version" if p.get("restarted") and p["verdict"] != "pass" else ""),
                    "dry run: nothing was changed"]
        out = [f"restart {self.service}:"]
        if self.drain:
            out.append(f"  remove {self.drain['url']} from the gateway {self.drain['gateway']}, wait up to "
                       f"{self.drain['idle_timeout']:g} s for its requests to end")
        out.append(f"  run: {self.command}")
        out.append("  gate: " + (" -> ".join(self.tiers) if len(self.tiers) > 0 else "none (no --wait)"))
        rb = self.rollback
        if rb is None:
            out.append("  on failure: nothing is rolled back (no --rollback-on-failure)")
        elif rb.get("backup") is None:
            out.append("  on failure: no install backup to roll back to; the files stay")
        else:
            out.append(f"  on failure: restore {rb['backup']}: write back {len(rb['restore'])} file(s)"
                       + (f" ({', '.join(rb['restore'])})" if rb["restore"] else "")
                       + (f", remove {', '.join(rb['remove'])}" if rb["remove"] else "")
                       + ("; then daemon-reload, restart and the same gate" if rb["unit_existed"] else
                          "; that was a first install: stop and disable the units"))
        if self.drain:
            out.append(f"  add {self.drain['url']} back to the gateway only once the gate passed")
        out += [f"  note: {n}" for n in self.notes]
        out.append("dry run: nothing was changed")
        return out


def plan_restart(deployment: Deployment, layout: HostLayout, *, wait: bool, gate: str, rollback_on_failure: bool,
                 drain: Drain | None = None, allow_parser_removal: bool = False) -> RestartPlan:
    """What :func:`restart` would do with these arguments; reads the tree, changes nothing, runs no systemctl.

    Raises:
        UsageError: an unreadable journal or backup set (as :func:`restart` would).
    """
    profile = deployment.profile
    svc = deployment.name
    unit = deployment.units.server
    pending = journal.load(layout, svc)
    tiers = gates.tiers_through(gate) if wait else []
    command = " ".join(unit_facts.systemctl_argv("restart", unit))
    refused = None
    if not allow_parser_removal:
        try:
            gates.refuse_parser_removal(previous_profile(layout, svc), profile, what=f"restart {svc}",
                                        override="--allow-parser-removal")
        except KimiDeployError as exc:
            refused = exc.message
    rollback = None
    if rollback_on_failure:
        found = journal.old_version_from_backup(layout, svc)
        rollback = {"backup": None, "restore": [], "remove": [], "unit_existed": True}
        if found is not None:
            backup, old = found
            now = journal.current(layout, old.keys())
            unit_hp = layout.host_path(layout.unit_path(unit))
            rollback = {"backup": layout.host_path(backup.path),
                        "restore": sorted(hp for hp, data in old.items() if data is not None and now[hp] != data),
                        "remove": sorted(hp for hp, data in old.items() if data is None and now[hp] is not None),
                        "unit_existed": (old[unit_hp] is not None) if unit_hp in old
                        else layout.unit_path(unit).exists()}
    notes = [] if layout.is_host else [f"--root {layout.root}: systemctl acts on this host's manager (--host-systemd)"]
    return RestartPlan(svc, unit, command, tiers, rollback,
                       {"url": drain.url, "gateway": getattr(drain.gateway, "base_url", "?"),
                        "idle_timeout": drain.idle_timeout} if drain else None,
                       {"kind": pending.kind, "phase": pending.phase, "verdict": pending.verdict,
                        "from": pending.old_label, "to": pending.new_label, "restarted": pending.restarted}
                       if pending else None, refused, notes)


def previous_profile(layout: HostLayout, service: str) -> Profile | None:
    """The profile copy the newest install backup saved (the version before the installed one), or None when
    there is none or it does not load (an older kit's format: nothing to compare with)."""
    backup: BackupSet | None = next((b for b in list_backups(layout, service) if b.operation == "install"), None)
    if backup is None:
        return None
    copy_hp = layout.host_path(layout.profile_copy(service))
    if backup.entries.get(copy_hp) != "replaced":
        return None
    try:
        return load_profile(backup.saved(copy_hp))
    except KimiDeployError:
        return None


def _restart_drained(deployment: Deployment, layout: HostLayout, drain: Drain, *, on_event, **kw: Any) -> RestartResult:
    """Remove ``drain.url`` from the gateway, restart and verify there, add it back when that passed.

    Raises:
        UnreachableError (exit 3) / GatewayError (exit 1): the gateway did not take the replica out; nothing was
            restarted and it is still in rotation (the message says so).
        DrainTimeout: the gateway took the removal but still lists the replica (draining) after the wait, or
            the replica still runs requests after ``drain.idle_timeout`` (:func:`wait_idle`); nothing was
            restarted and it is out of rotation (exit 9).
        KimiDeployError: the restart itself failed (systemctl, exit 5); the replica is out of rotation and the
            message says so (its exit code is the failure's).
    """

    say = on_event or (lambda _m: None)
    say(f"removing {drain.url} from the gateway (smg stops sending it requests, then drops it)")
    again = "rerun `kimi-deploy restart --wait` on this node (it restarts it and adds it back)"
    try:
        removed = drain.gateway.remove(drain.url)
    except DrainTimeout as exc:
        raise _annotated(exc, f"; nothing was restarted, and {drain.url} is out of the gateway's rotation",
                         f"once its in-flight requests ended, {again}") from None
    except KimiDeployError as exc:
        raise _annotated(exc, f"; nothing was restarted and {drain.url} was not taken out of the gateway's rotation",
                         exc.hint or f"check the gateway unit ({deployment.units.gateway}) on "
                                     f"{gw.host if (gw := deployment.profile.gateway) else 'the gateway host'}") from None
    say(f"waiting for the requests still running on {drain.url} to end (at most {drain.idle_timeout:g} s)")
    try:
        idle_note = wait_idle(drain.url, kw["api_key"], timeout=drain.idle_timeout,
                              poll=min(kw["poll_interval"], 2.0), clock=kw["clock"], sleep=kw["sleep"])
    except DrainTimeout as exc:
        raise _annotated(exc, f"; nothing was restarted, and {drain.url} is out of the gateway's rotation",
                         f"once they ended, {again} (--drain-timeout S waits longer)") from None
    state: dict[str, Any] = {"url": drain.url, "removed": removed, "readded": False, "error": None}
    try:
        result = _restart(deployment, layout, wait=True, on_event=on_event, base_url=drain.url, **kw)
    except KimiDeployError as exc:
        raise _annotated(exc, f"; {drain.url} was taken out of the gateway's rotation for the restart and stays "
                              "out", exc.hint and f"{exc.hint}; then {again}" or again) from None
    final = result.attempts[-1]
    notes = ([idle_note] if idle_note else []) + list(result.notes)
    if final.ok:
        say(f"adding {drain.url} back to the gateway")
        _readd(drain, drain.url, state, notes, "is ready")
    else:
        notes.append(f"the replica failed its restart: it stays out of the gateway's rotation ({drain.url})")
    return dataclasses.replace(result, notes=notes, gateway=state)


def _annotated(exc: KimiDeployError, state: str, hint: str | None) -> KimiDeployError:
    """A copy of ``exc`` (same class and exit code) whose message ends with ``state`` (where the replica is)."""
    copy = type(exc).__new__(type(exc))
    copy.__dict__.update(exc.__dict__)
    Exception.__init__(copy, exc.message + state)
    copy.message, copy.hint = exc.message + state, hint
    return copy


def resume_command(layout: HostLayout, service: str) -> str:
    """The command that finishes or undoes ``service``'s interrupted change (``status`` prints it)."""
    flag = "" if layout.is_host else " --host-systemd"
    return layout.command(f"restart --name {service} --wait --rollback-on-failure{flag}")


def _begin(layout: HostLayout, service: str, gate: str, replica: str | None = None) -> journal.Change | None:
    """Record a ``restart --rollback-on-failure`` before it restarts anything (:mod:`kimi_deploy.host.journal`):
    from the newest install backup's version to the installed files; None when there is no backup (nothing to
    roll back to, nothing to journal).

    Raises:
        UsageError: a file the backup set lists is missing from it.
    """
    found = journal.old_version_from_backup(layout, service)
    if found is None:
        return None
    backup, old = found
    now = journal.current(layout, old.keys())
    unit = Units.of(service).server
    unit_hp = layout.host_path(layout.unit_path(unit))
    existed = (old[unit_hp] is not None) if unit_hp in old else layout.unit_path(unit).exists()
    change = journal.Change(kind="restart", service=service, started_at=journal.stamp(),
                            old_label=f"the previous install (backup {backup.path.name})",
                            new_label="the installed files", old=journal.hashes(old), new=journal.hashes(now),
                            touches_files=False, backup=layout.host_path(backup.path),
                            backups_before=journal.backup_names(layout, service), unit_existed=existed, gate=gate,
                            replica=replica, resume=resume_command(layout, service))
    return journal.begin(layout, change, old)


def _restart(deployment: Deployment, layout: HostLayout, *, api_key: str | None, wait: bool, timeout: float | None,
             rollback_on_failure: bool, poll_interval: float, on_poll: Callable[[str, WaitState], None] | None,
             on_event: Callable[[str], None] | None, clock: Callable[[], float],
             sleep: Callable[[float], None], base_url: str | None = None,
             gate: str = gates.DEFAULT_GATE, change: journal.Change | None = None) -> RestartResult:
    """The restart, its gate and the rollback, journaled (:mod:`kimi_deploy.host.journal`) when it may roll
    back: ``change`` (an upgrade's, already begun) or one begun here; a kill at any instant leaves a record
    the next command finishes or undoes."""
    timeout = float(timeout if timeout is not None else deployment.profile.service.timeout_start_sec)
    say = on_event or (lambda _m: None)
    svc = deployment.name
    if rollback_on_failure and wait and change is None:
        change = _begin(layout, svc, gate, replica=base_url)
    if change is not None:
        change = journal.update(layout, change, restarted=True, replica=change.replica or base_url)
    say(f"restarting {deployment.units.server}")
    first = _attempt("new", deployment, layout, api_key=api_key, wait=wait, timeout=timeout,
                     poll_interval=poll_interval, on_poll=on_poll, clock=clock, sleep=sleep, base_url=base_url,
                     gate=gate)
    attempts, notes = [first], []
    if first.ok or not rollback_on_failure:
        if change is not None:
            if first.ok:
                change = journal.update(layout, change, verdict="pass")
            journal.finish(layout, change)
        return RestartResult(svc, attempts, None, notes)
    say(f"new version failed ({first.summary}); rolling back")
    if change is None:
        notes.append("no install backup to roll back to: the files stay as they are")
        return RestartResult(svc, attempts, None, notes)
    tier = first.gate.failed_tier if first.gate and first.gate.failed_tier else "allreduce"
    change = journal.update(layout, change, verdict="fail", failed_tier=tier,
                            failed_checks=first.gate.failed_checks if first.gate else [])
    attempts += _roll_back(layout, change, deployment, notes, wait=True, timeout=timeout, poll_interval=poll_interval,
                           on_poll=on_poll, on_event=on_event, clock=clock, sleep=sleep, base_url=base_url,
                           gate=gate)
    journal.finish(layout, change)
    return RestartResult(svc, attempts, _restored(layout, change), notes)


def _restored(layout: HostLayout, change: journal.Change) -> Restored:
    """The rollback in :class:`kimi_deploy.host.records.Restored`'s shape (``restart --json`` prints it)."""
    restored = sorted(hp for hp, digest in change.old.items() if digest is not None and change.new.get(hp) != digest)
    removed = sorted(hp for hp, digest in change.old.items() if digest is None and change.new.get(hp) is not None)
    backup = layout.under(change.backup) if change.backup else layout.change_dir(change.service)
    return Restored(backup=backup, restored=restored, removed=removed, had_previous_service=change.unit_existed)


def _roll_back(layout: HostLayout, change: journal.Change, deployment: Deployment, notes: list[str], *,
               wait: bool, restart_unit: bool = True, **kw: Any) -> list[Attempt]:
    """Put ``change``'s old version back (:func:`kimi_deploy.host.journal.restore_old`), reload systemd and,
    when the unit existed before, restart and gate the old version (the attempt labelled ``rollback``); a
    first install's unit is stopped and disabled instead. The attempts run (empty or one)."""
    units = Units.of(change.service)
    restored = journal.restore_old(layout, change)
    notes.append(f"restored {len(restored.restored)} file(s) and removed {len(restored.removed)} of "
                 f"{change.old_label}")
    unit_facts.systemctl("daemon-reload")
    if not change.unit_existed:
        try:
            unit_facts.systemctl("disable", "--now", units.server, units.check_timer)
        except KimiDeployError as exc:
            notes.append(f"could not disable the units: {exc.message}")
        notes.append("that was a first install: no previous version to start; the service is stopped and disabled")
        return []
    if not restart_unit:
        return []
    return [_restart_previous(layout, deployment, notes, wait=wait, **kw)]


def _restart_previous(layout: HostLayout, fallback: Deployment, notes: list[str], *, wait: bool, gate: str,
                      on_event: Callable[[str], None] | None, **kw: Any) -> Attempt:
    """Restart the service on the old version's files (back on disk) and gate it: the ``rollback`` attempt."""
    (on_event or (lambda _m: None))(f"restarting {fallback.units.server} with the previous files")
    previous = deployment_after_rollback(layout, fallback)
    previous_key = None
    if wait:
        try:
            previous_key = apikey.resolve_key(profile_key_file=previous.api_key_file, layout=layout)
        except KimiDeployError as exc:
            notes.append(f"the previous version's API key is unreadable ({exc.message}); checking it without a key")
    attempt = _attempt("rollback", previous, layout, api_key=previous_key, wait=wait, gate=gate, **kw)
    if not attempt.ok:
        notes.append(f"the restored version failed the {gate} gate too ({attempt.summary}): neither version "
                     f"is verified; see `journalctl -u {previous.units.server}` and run `kimi-deploy check`")
    return attempt


def _rejoin(result: RestartResult, recovery: journal.Recovery, drain: Drain | None,
            on_event: Callable[[str], None] | None) -> RestartResult:
    """A fleet roll's replica after its interrupted change was finished or undone: the change took it out of the
    gateway's rotation (``Change.replica``); it goes back only when the version it now runs passed its gate (the
    new one before the kill, or the old one's gated restart in this run), else it stays out, and the notes say so."""
    url = recovery.change.replica
    if url is None:
        return result
    state: dict[str, Any] = {"url": url, "removed": None, "readded": False, "error": None}
    verified = recovery.target == "new" or bool(
        result.attempts and result.attempts[-1].ok and result.attempts[-1].gate is not None)
    notes = list(result.notes)
    if verified and drain is not None:
        (on_event or (lambda _m: None))(f"adding {url} back to the gateway")
        _readd(drain, url, state, notes, "passed its gate")
    else:
        notes.append(f"the interrupted change had taken {url} out of the gateway's rotation; it stays out until a "
                     "version passes its gate here: rerun `kimi-deploy restart --wait` on this node")
    return dataclasses.replace(result, notes=notes, gateway=state)


def _resumed(recovery: journal.Recovery, fallback: Deployment, layout: HostLayout, *, wait: bool,
             timeout: float | None, **kw: Any) -> RestartResult:
    """The result of a run that found an interrupted change and finished or undid it
    (:func:`kimi_deploy.host.journal.recover`): when the old version's files came back while the new version may
    still run, the old version is restarted and (with ``wait``) gated, as the interrupted rollback would have."""
    notes = recovery.lines()
    attempts = []
    if recovery.restart_needed:
        timeout_s = float(timeout if timeout is not None else fallback.profile.service.timeout_start_sec)
        attempts.append(_restart_previous(layout, fallback, notes, wait=wait, timeout=timeout_s, **kw))
    notes.append("this run finished the interrupted change and started no new one"
                 + ("" if recovery.target == "new" else
                    "; the new version is not installed: install it again to retry"))
    return RestartResult(fallback.name, attempts, None, notes, recovered=recovery.to_dict())


def deployment_after_rollback(layout: HostLayout, fallback: Deployment) -> Deployment:
    """The restored profile copy, resolved (its port, key path and units may differ from the failed one's), else
    ``fallback``."""

    try:
        return resolve(load_profile(layout.profile_copy(fallback.name)), fallback.sglang_version, launches=False)
    except KimiDeployError:
        return fallback


def result_lines(result: RestartResult) -> list[str]:
    """``restart``'s text: per attempt its verdict, its last readiness verdict (``health ...``, the words of
    ``status`` and ``check``'s ``health.ready``), then its fast checks and the all-reduce paths the profile
    asked for (or that engaged), then the notes."""
    out: list[str] = []
    for attempt in result.attempts:
        mark = "ok" if attempt.ok else "FAILED"
        out.append(f"{attempt.label}: {mark}: {attempt.summary}")
        if attempt.wait and attempt.wait.last_probe:  # the readiness verdict in status's and check's words
            out.append(f"  health {attempt.wait.last_probe.words}")
        if attempt.gate and len(attempt.gate.tiers) > 0:
            out.append("  gate " + attempt.gate.gate + ": " + ", ".join(
                f"{t.tier} {'ok' if t.ok else 'FAILED'} {t.seconds:.1f} s" for t in attempt.gate.tiers))
        if attempt.checks:
            for r in attempt.checks.results:
                kind = f" [{r['kind']}]" if r.get("kind") else ""
                out.append(f"  {r['status']:<6} {r['id']}{kind}" + (f": {r['detail']}" if r.get("detail") else ""))
        for p in (attempt.allreduce or {}).get("paths", []):
            if p["asked"] or p["state"] == "engaged":
                out.append(f"  {'fail' if p['failed'] else p['state']:<6} allreduce.{p['path']}: {p['evidence']}")
        if attempt.allreduce and attempt.allreduce.get("error"):
            out.append(f"  note   allreduce: server log unreadable ({attempt.allreduce['error']})")
        out += phase_lines(attempt.phases)
    for note in result.notes:
        out.append(f"note: {note}")
    if result.failed_tier:
        failed = f": {', '.join(result.failed_checks)}" if result.failed_checks else ""
        out.append(f"failed tier: {result.failed_tier}{failed}")
    return out


def phase_lines(data: dict[str, Any] | None) -> list[str]:
    """The start's phases from the server's log (:mod:`kimi_deploy.host.phases`), one line each."""
    if not data:
        return []
    if data.get("error"):
        return [f"  note   start phases: server log unreadable ({data['error']})"]
    out = ["  start phases (from SGLang's log):"]
    out += [f"  {line}" for line in phases.StartPhases.from_dict(data).lines()]
    if data.get("kept"):
        out.append(f"  kept as the last measured start: {data['kept']}")
    elif data.get("keep_error"):
        out.append(f"  note   not kept: {data['keep_error']}")
    out += [f"  warn   start phase over budget: {line}" for line in data.get("over_budget", [])]
    if data.get("history_error"):
        out.append(f"  note   start history not written: {data['history_error']}")
    return out


def _readd(drain: Any, url: str, state: dict[str, Any], notes: list[str], how: str) -> None:
    """Add ``url`` back to ``drain``'s gateway: ``state["readded"]``, or ``state["error"]`` and a note saying the
    replica (which ``how``: "is ready", "passed its gate") stays out of rotation."""
    try:
        drain.gateway.add(url)
        state["readded"] = True
    except KimiDeployError as exc:
        state["error"] = exc.message
        notes.append(f"the replica {how} but the gateway did not take it back ({exc.message}); it stays out of "
                     "rotation: add it with the gateway's worker API once fixed")
