"""``tune`` on a host: prune, validate, deploy each candidate through install + gated restart, bench it, journal it.

The loop (:func:`tune`): the search (:mod:`kimi_deploy.tune.search`) names the next measurement; it is made as an
operator would make it by hand, with the kit's own verbs as libraries:

1. the candidate's profile (:func:`kimi_deploy.tune.space.apply`), pruned before anything runs by the profile rules
   and the memory plan (:func:`kimi_deploy.tune.space.prune`), then parsed by SGLang's own parser in its interpreter
   (:func:`kimi_deploy.validate.validate_server_args` on the resolved launch, as ``validate`` does);
2. ``install`` (:func:`kimi_deploy.host.install.install_plan.plan_install`, applied under the service's and the
   shared lock as the verb does), then ``restart --wait --gate GATE --rollback-on-failure``
   (:func:`kimi_deploy.host.restart.restart`, with the drain of a replica behind a gateway): a candidate that fails
   its gate is rejected with the failing checks, and the previous version (which passed) is back;
3. ``bench`` at the SLO's load (:func:`kimi_deploy.bench.loadgen.run_bench`): goodput per run, the pooled figures.

Each step is written to the journal before it starts and after it ends (:mod:`kimi_deploy.tune.journal`).
The end (:func:`finish`): the winner (``--apply`` and better than the original beyond noise) or the original is
installed and gated with the contract gate, unless it is already the one running: the host never stays on an
untested configuration. Ctrl-C (and SIGTERM) stop the search and put the original back the same way (exit 130).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import engine, fsio
from kimi_deploy.bench.prompts import load_dataset
from kimi_deploy.bench.loadgen import BenchConfig, run_bench
from kimi_deploy.bench.report import build_result, redact_result, to_json_text
from kimi_deploy.deployment import Deployment, Units, resolve
from kimi_deploy.doctor import probe_gpus
from kimi_deploy.errors import ExitCode, KimiDeployError, RefusedError, UsageError
from kimi_deploy.host import gate as gates
from kimi_deploy.host import journal as change_journal
from kimi_deploy.host import start_history
from kimi_deploy.host.install.apply import apply, refuse
from kimi_deploy.host.install.facts import this_host
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.host.records import service_lock, shared_lock
from kimi_deploy.host.restart import drain_for, restart, resume_command
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile, dump_profile, load_profile
from kimi_deploy.sizing.memory import Facts, GpuFacts, ModelFacts
from kimi_deploy.tune import journal as tj
from kimi_deploy.tune import report, search, space
from kimi_deploy.validate import check_env, validate_many
from kimi_deploy.wire import apikey

#: The gate the final configuration passes, whatever ``--gate`` the candidates had.
FINAL_GATE = "contract"


class TuneInterrupted(KimiDeployError):
    """Ctrl-C or SIGTERM stopped ``tune``; the original configuration was put back (exit 130)."""

    exit_code = ExitCode.INTERRUPTED


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one tune is asked (recorded in the journal; ``--resume`` reuses it).

    ``slo``: ms per ``ttft``/``tpot``/``itl``... key as ``bench --slo`` takes them; ``workload``: ``builtin`` or a
    JSONL dataset path; ``concurrency`` (closed loop) or ``request_rate`` (Poisson, requests/s); ``num_prompts``,
    ``max_tokens``, ``runs`` (bench runs per measurement: the interval), ``warmup``; ``budget_restarts`` /
    ``budget_seconds``: the search stops when either is spent (``None``: no limit); ``gate``: the candidates' gate
    (:data:`kimi_deploy.host.gate.TIERS`); ``method``: :data:`kimi_deploy.tune.search.METHODS`; ``space``: ``--space``;
    ``apply``: keep the winner (else the original comes back); ``timeout``/``poll_interval``: the readiness wait;
    ``host``: this node (a replica behind a gateway is drained first); ``finalists``/``remeasure``/``passes``/``seed``:
    the search's knobs.
    """

    slo: dict[str, float]
    workload: str = "builtin"
    concurrency: int | None = 16
    request_rate: float | None = None
    num_prompts: int | None = None
    max_tokens: int = 256
    runs: int = 3
    warmup: int | None = None
    budget_restarts: int | None = None
    budget_seconds: float | None = None
    gate: str = gates.DEFAULT_GATE
    method: str = "descent"
    space: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    apply: bool = False
    timeout: float | None = None
    poll_interval: float = 5.0
    host: str | None = None
    drain_timeout: float = 600.0
    finalists: int = 3
    remeasure: int = 2
    passes: int = 3
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Settings:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass
class Host:
    """Where the tune acts: the ``layout`` (``--root``), the original ``profile`` (installed and running), the SGLang
    interpreter's ``version`` and ``components``, the memory ``facts`` (``None``: no memory stage), ``events``:
    one line per milestone for the display, ``clock``."""

    layout: HostLayout
    profile: Profile
    version: str
    components: Mapping[str, str] | None = None
    facts: Any = None
    events: Callable[[str], None] = lambda _line: None
    clock: Callable[[], float] = time.monotonic


def installed_profile(layout: HostLayout, profile: Profile) -> None:
    """Refuse unless ``profile`` is the installed one (the original configuration ``tune`` restores).

    Raises:
        RefusedError: nothing installed, or the installed profile copy differs (exit 4), with the fix.
    """
    copy = layout.profile_copy(profile.service.name)
    name = profile.service.name
    if not copy.is_file():
        raise RefusedError(f"{name} is not installed here: tune starts from the running, installed configuration",
                           value=layout.describe(layout.host_path(copy)),
                           hint=f"`{layout.command('install --profile P')}` and "
                                f"`{layout.command('restart --wait --rollback-on-failure')}` first")
    installed = load_profile(copy)
    if installed.digest() != profile.digest():
        raise RefusedError(f"the profile differs from the installed one of {name}: tune restores the installed "
                           "configuration at the end, so it must be the one it starts from",
                           value=layout.describe(layout.host_path(copy)),
                           hint=f"tune --profile {layout.host_path(copy)}, or install this profile and restart first")


def open_journal(host: Host, settings: Settings, *, resume: bool) -> tuple[tj.TuneJournal, Settings]:
    """A new journal (refusing to overwrite one that is not done), or the one to resume (its settings win).

    Raises:
        UsageError: ``--resume`` without a journal, or of another profile; a new run over an unfinished one.
    """
    folder = host.layout.tune_dir(host.profile.service.name)
    old = tj.load(folder)
    if resume:
        if old is None:
            raise UsageError("--resume: no tune journal to resume", value=str(tj.path(folder)),
                             hint="run tune without --resume")
        if old.profile_sha256 != host.profile.digest():
            raise UsageError("--resume: the journal is of another profile", value=str(tj.path(folder)),
                             hint="resume with the profile it began with, or move the journal aside")
        old, dropped = tj.drop_unfinished(old)
        for m in dropped:
            host.events(f"resume: candidate {m.candidate} was {m.state} when the run stopped: measured again")
        return old.model_copy(update={"live": None if dropped else old.live}), Settings.from_dict(old.settings)
    if old is not None and old.phase != "done":
        raise UsageError("an unfinished tune of this service is on record", value=str(tj.path(folder)),
                         hint="continue it with `tune --resume`, or move the journal aside to start over")
    dims = space.dimensions(host.profile, host.version, settings.space or None)
    base = space.baseline(dims)
    stamp = tj.now()
    return tj.TuneJournal(service=host.profile.service.name, started_at=stamp, updated_at=stamp,
                          sglang_version=host.version, profile=dump_profile(host.profile),
                          profile_sha256=host.profile.digest(), baseline=base.id, settings=settings.to_dict(),
                          dimensions=[d.to_dict() for d in dims]), settings


def _dims(journal: tj.TuneJournal) -> tuple[space.Dimension, ...]:
    return tuple(space.Dimension(d["key"], tuple(d["values"]), d["baseline"], d["why"]) for d in journal.dimensions)


def evidence(journal: tj.TuneJournal) -> search.Evidence:
    """The search's view of the journal: finished measurements' runs (``None`` for a rejected or failed one)."""
    runs: dict[str, list[list[float] | None]] = {}
    for m in journal.finished():
        runs.setdefault(m.candidate, []).append(list(m.goodput_runs) if m.state == "measured" else None)
    pruned = frozenset(cid for cid, rec in journal.candidates.items()
                       if rec.pruned or (rec.validation is not None and not rec.validation.get("ok")))
    return search.Evidence(runs, pruned, journal.live)


class Tuner:
    """One tune run over ``host`` (see the module docstring); :meth:`run` returns the finished journal."""

    def __init__(self, host: Host, settings: Settings, journal: tj.TuneJournal) -> None:
        self.host = host
        self.settings = settings
        self.journal = journal
        self.folder = host.layout.tune_dir(host.profile.service.name)
        self.dims = _dims(journal)
        self.space = space.candidates(self.dims)
        self.by_id = {c.id: c for c in self.space}
        self.baseline = self.by_id[journal.baseline]
        self.strategy = search.strategy(settings.method, self.dims, self.space, self.baseline,
                                        finalists=settings.finalists, remeasure=settings.remeasure,
                                        passes=settings.passes, seed=settings.seed, end_on_best=settings.apply)
        self.original = self.deployment(host.profile)
        self.key = apikey.resolve_key(profile_key_file=self.original.api_key_file, layout=host.layout)
        self.dataset = load_dataset(None if settings.workload == "builtin" else Path(settings.workload))
        self.drain = drain_for(self.original, host.layout, settings.host, wait=True,
                               idle_timeout=settings.drain_timeout)

    def deployment(self, profile: Profile) -> Deployment:
        """``profile`` (the original or a candidate) resolved for the host's SGLang: what install, the gate and
        bench read (unit names, URLs, key path)."""
        return resolve(profile, self.host.version, components=self.host.components)

    # -- journal ----------------------------------------------------------------------------------------------
    def save(self, **fields: Any) -> None:
        self.journal = tj.save(self.folder, self.journal.model_copy(update=fields))

    def _set_measurement(self, m: tj.Measurement) -> None:
        rows = [x for x in self.journal.measurements if not (x.candidate == m.candidate and x.n == m.n)]
        self.save(measurements=[*rows, m])

    # -- pruning ----------------------------------------------------------------------------------------------
    def prune_all(self) -> None:
        """Record every candidate with its profile/memory verdict (cheap: no interpreter, no restart)."""
        records = dict(self.journal.candidates)
        for cand in self.space:
            if cand.id in records:
                continue
            why = space.prune(self.host.profile, cand, self.host.facts)
            records[cand.id] = tj.CandidateRecord(values=cand.as_dict(), pruned=why.to_dict() if why else None)
        self.save(candidates=records)
        out = sum(1 for r in records.values() if r.pruned)
        self.host.events(f"space: {len(self.space)} candidates over {len(self.dims)} options; {out} pruned by the "
                         f"profile rules and the memory plan before any restart"
                         + ("" if self.host.facts is not None else " (no GPU or model facts: memory not planned)"))

    def validate_all(self) -> None:
        """SGLang's own parser on every candidate the profile rules and the memory plan let through, in one
        interpreter start (:func:`kimi_deploy.validate.validate_many`), before any restart; recorded, so a resumed
        run does not ask again. A candidate it refuses is never started."""
        todo = [cid for cid, rec in self.journal.candidates.items() if not rec.pruned and rec.validation is None]
        if not todo:
            return
        self.host.events(f"validating {len(todo)} candidates with SGLang {self.host.version}'s own parser")
        launches = []
        for cid in todo:
            profile = space.apply(self.host.profile, self.by_id[cid])
            launch = resolve(profile, self.host.version, components=self.host.components).launch
            launches.append((launch.server_args, launch.secrets_config, check_env(launch)))
        results = validate_many(self.host.profile.service.python, launches, sglang_version=self.host.version)
        records = dict(self.journal.candidates)
        for cid, v in zip(todo, results):
            records[cid] = records[cid].model_copy(update={"validation": {
                "ok": v.ok, "errors": list(v.errors), "warnings": list(v.warnings)}})
            if not v.ok:
                self.host.events(f"candidate {cid} refused by SGLang's parser: {v.errors[0]}")
        self.save(candidates=records)

    # -- budget and progress ----------------------------------------------------------------------------------
    def spent_seconds(self) -> float:
        return sum(m.seconds or 0.0 for m in self.journal.measurements)

    def out_of_budget(self, need: search.Need) -> str | None:
        s = self.settings
        restarts = self.journal.restarts() + (0 if need.candidate == self.journal.live else 1)
        if s.budget_restarts is not None and restarts > s.budget_restarts:
            return f"the budget of {s.budget_restarts} restarts is spent"
        if s.budget_seconds is not None and self.spent_seconds() >= s.budget_seconds:
            return f"the budget of {s.budget_seconds:.0f} s is spent"
        return None

    def estimate(self) -> int:
        """Measurements the method needs (an estimate for the progress line: one descent pass and the finalists)."""
        feasible = sum(1 for r in self.journal.candidates.values() if not r.pruned)
        if self.settings.method == "descent":
            return min(feasible, 1 + sum(len(d.values) - 1 for d in self.dims)) + self.settings.finalists + 1
        return feasible

    def progress(self, need: search.Need) -> None:
        done = len(self.journal.finished())
        total = max(self.estimate(), done + 1)
        mean = self.spent_seconds() / done if done else None
        left = f", about {_duration(mean * (total - done))} left" if mean else ""
        if self.settings.budget_seconds is not None:
            left += f" (budget {_duration(max(0.0, self.settings.budget_seconds - self.spent_seconds()))})"
        label = self.by_id[need.candidate].label(self.baseline.as_dict())
        self.host.events(f"candidate {done + 1} of ~{total}{left}: {label} ({need.why})")

    # -- one measurement --------------------------------------------------------------------------------------
    def measure(self, need: search.Need) -> None:
        cid = need.candidate
        started = self.host.clock()
        live = cid == self.journal.live
        # the first measurement: the configuration running now (nothing restarted yet), gated where it runs
        first = cid == self.journal.baseline and self.journal.live is None and not self.journal.lost_restarts \
            and not any(x.restarted for x in self.journal.measurements)
        m = tj.Measurement(candidate=cid, n=need.n, state="deploying", started_at=tj.now(),
                           restarted=not (live or first))
        self._set_measurement(m)
        profile = space.apply(self.host.profile, self.by_id[cid])
        if live:
            gate_info = {"ok": True, "note": "already running: gated when deployed"}
        elif first:
            gate_info = self.gate_running(profile)
            if not gate_info["ok"]:
                raise RefusedError("the configuration running now fails its own gate: tune starts from a verified one",
                                   value=", ".join(gate_info.get("failed_checks") or [gate_info.get("failed_tier")]),
                                   hint=f"fix it first (`{self.host.layout.command('check --profile P')}`), or "
                                        f"tune with --gate ready")
        else:
            gate_info = self.deploy(profile, self.settings.gate)
        if not gate_info["ok"]:
            state = "rejected" if gate_info.get("failed_tier") not in (None, "ready") else "failed"
            m = m.model_copy(update={"state": state, "finished_at": tj.now(), "gate": gate_info,
                                     "failed_tier": gate_info.get("failed_tier"),
                                     "failed_checks": gate_info.get("failed_checks") or [],
                                     "seconds": self.host.clock() - started})
            self._set_measurement(m)
            self.host.events(f"candidate {cid} {state}: " + (", ".join(m.failed_checks) or m.failed_tier or "")
                             + "; the previous version is back")
            return
        self.save(live=cid)
        m = m.model_copy(update={"state": "measuring", "gate": gate_info})
        self._set_measurement(m)
        m = self.bench(m, profile)
        self._set_measurement(m.model_copy(update={"seconds": self.host.clock() - started}))

    def gate_running(self, profile: Profile) -> dict[str, Any]:
        result = gates.run_gate(self.settings.gate, self.deployment(profile), self.key, ready_seconds=0.0,
                                base_url=self.drain.url if self.drain else None)
        return {"ok": result.ok, "failed_tier": result.failed_tier, "failed_checks": result.failed_checks,
                "seconds": round(sum(t.seconds for t in result.tiers), 3), "restart": False}

    def deploy(self, profile: Profile, gate: str) -> dict[str, Any]:
        """Install ``profile`` and restart it gated, rolling back on failure; the gate's verdict as a dict.

        Journalled as ``upgrade`` is (:func:`begin_change`): the host's change record holds the version running
        now (the files as on disk) before the install's first write, so a kill at any instant leaves a change the
        next command finishes (the candidate passed its gate) or undoes (anything else), whatever the install's
        backup sets hold.

        Raises:
            KimiDeployError: the rollback's restored version failed the gate too (exit 10), or the install or
                systemctl failed: the search cannot go on from an unknown state.
        """
        layout, name = self.host.layout, self.host.profile.service.name
        change = None
        with service_lock(layout, name):
            change_journal.recover(layout, name, live=True)  # a kill's change first: one complete version on disk
            with shared_lock(layout):
                plan = plan_install(profile, layout, enable=False, create_user=False,
                                    host=this_host(profile, self.settings.host))
                refuse(plan)
                if not plan.is_noop:
                    change = begin_change(plan, layout, gate, self.by_label(profile))
                    installed = apply(plan)
                    if installed.backup is not None:
                        change = change_journal.update(layout, change, backup=layout.host_path(installed.backup))
            # no change: the files are the candidate's already (a run killed after its gate passed); restarted and
            # gated, without a rollback to a version the files do not differ from
            result = restart(self.deployment(profile), layout, wait=True, timeout=self.settings.timeout,
                             rollback_on_failure=change is not None, poll_interval=self.settings.poll_interval,
                             gate=gate, drain=self.drain, change=change, hold_lock=False,
                             on_event=lambda line: self.host.events(f"  {line}"))
        if result.exit_code == ExitCode.ROLLBACK_FAILED:
            raise KimiDeployError("a candidate failed its gate and the version restored after it failed the gate "
                                  "too: neither is verified", value=name,
                                  hint=f"see `{layout.command('status')}`; then `tune --resume` restores the "
                                       "original configuration")
        first = result.attempts[0] if result.attempts else None
        return {"ok": result.exit_code == ExitCode.OK, "exit_code": int(result.exit_code),
                "failed_tier": result.failed_tier or (None if result.exit_code == ExitCode.OK else "ready"),
                "failed_checks": result.failed_checks, "rolled_back": result.rollback is not None,
                "seconds": round(sum(t.seconds for t in first.gate.tiers), 3) if first and first.gate else None,
                "summary": first.summary if first else None}

    def by_label(self, profile: Profile) -> str:
        """The words a change record gives a candidate (``tune candidate max_running_requests=32 ...``)."""
        values = {d.key: getattr(profile.sglang, d.key) for d in self.dims}
        cand = space.Candidate(tuple(values.items()))
        return f"tune candidate {cand.id} ({cand.label(self.baseline.as_dict())})"

    def bench(self, m: tj.Measurement, profile: Profile) -> tj.Measurement:
        s = self.settings
        cfg = self.bench_config(profile, f"{m.candidate}-{m.n}")
        try:
            run = run_bench(cfg, self.dataset)
        except KimiDeployError as exc:
            return m.model_copy(update={"state": "failed", "finished_at": tj.now(), "error": exc.message})
        if run.interrupted:
            raise KeyboardInterrupt(str(run.interrupted.get("signal", "SIGINT")))
        result = redact_result(build_result(run, self.dataset), [self.key])
        where = self.folder / "bench" / f"{m.candidate}-{m.n}.json"
        fsio.mkdir(where.parent)
        fsio.write_atomic(where, to_json_text(result))
        point = result["points"][0] if result["points"] else None
        runs = [float(r["summary"]["goodput_requests_per_s"] or 0.0) for r in (point or {}).get("runs", [])
                if r.get("summary")]
        if not point or not runs:
            return m.model_copy(update={"state": "failed", "finished_at": tj.now(), "error": "no run measured",
                                        "bench": str(where)})
        summary = report.point_summary(point["summary"])
        self.host.events(f"candidate {m.candidate}: goodput {summary['goodput']:.2f} req/s "
                         f"[{min(runs):.2f}, {max(runs):.2f}] over {len(runs)} runs at {report.load_text(s)}")
        return m.model_copy(update={"state": "measured", "finished_at": tj.now(), "goodput_runs": runs,
                                    "summary": summary, "bench": str(where)})

    def bench_config(self, profile: Profile, label: str) -> BenchConfig:
        s = self.settings
        url = self.drain.url if self.drain else self.deployment(profile).base_url
        return BenchConfig(base_url=url, model=profile.sglang.served_model_name or profile.sglang.model_path,
                           concurrency=(s.concurrency,) if not s.request_rate else (),
                           request_rates=(s.request_rate,) if s.request_rate else (),
                           max_in_flight=s.concurrency if s.request_rate else None, num_prompts=s.num_prompts,
                           max_tokens=s.max_tokens, warmup=s.warmup, runs=s.runs, seed=s.seed, slo=dict(s.slo),
                           label=label, api_key=self.key)

    # -- the loop ---------------------------------------------------------------------------------------------
    def search(self) -> search.Outcome:
        while True:
            step = search.next_step(self.strategy, evidence(self.journal))
            if isinstance(step, search.Outcome):
                return step
            why = self.out_of_budget(step)
            if why:
                self.host.events(f"stop: {why}")
                return self.strategy.best_so_far(evidence(self.journal))
            self.progress(step)
            self.measure(step)

    def restore(self, target: str, why: str) -> None:
        """Put ``target`` (a candidate id; the baseline is the original) live, gated with :data:`FINAL_GATE`."""
        self.save(phase="restoring")
        layout, name = self.host.layout, self.host.profile.service.name
        change_journal.recover_locked(layout, name, live=True)  # a restart a kill interrupted: finished or undone
        if self.journal.live == target and self.settings.gate == FINAL_GATE:
            self.host.events(f"{why}: {self.by_id[target].label(self.baseline.as_dict())} is running and passed "
                             f"the {FINAL_GATE} gate")
            return
        self.host.events(f"{why}: installing {self.by_id[target].label(self.baseline.as_dict())}, restart, "
                         f"{FINAL_GATE} gate")
        verdict = self.deploy(space.apply(self.host.profile, self.by_id[target]), FINAL_GATE)
        if not verdict["ok"]:
            raise KimiDeployError(f"the configuration tune put back failed the {FINAL_GATE} gate "
                                  f"({verdict.get('failed_tier')}: {', '.join(verdict.get('failed_checks') or [])}); "
                                  "the version before it was restored", value=target,
                                  hint=f"see `{layout.command('status')}` and the journal {tj.path(self.folder)}")
        self.save(live=target)

    def run(self) -> tj.TuneJournal:
        if self.journal.phase == "done":
            return self.journal
        try:
            if self.journal.phase == "restoring":  # a kill while putting a configuration back: finish that first
                if self.journal.result is not None:  # the end's: the result is known, only its deployment was cut
                    self.restore(self.journal.result["deployed"], "resume")
                    return self.done(self.journal.result)
                self.restore(self.baseline.id, "resume")  # an interruption's: the original back, then search on
                self.save(phase="searching")
            # a restart a kill interrupted is finished or undone first (as every verb does), so the next restart
            # starts a candidate, not the recovery of the last one
            change_journal.recover_locked(self.host.layout, self.host.profile.service.name, live=True)
            self.prune_all()
            self.validate_all()
            outcome = self.search()
        except KeyboardInterrupt:
            self.save(interrupted=self.journal.interrupted + 1)
            self.host.events("interrupted: putting the original configuration back")
            self.restore(self.baseline.id, "interrupted")
            # the measurement Ctrl-C cut is dropped now, so --resume knows the original runs, gated (no restart)
            journal, _dropped = tj.drop_unfinished(self.journal)
            self.journal = journal
            self.save(phase="searching")  # --resume continues the search from the journal
            raise TuneInterrupted("tune was interrupted; the original configuration is back and passed its gate",
                                  value=str(tj.path(self.folder)),
                                  hint="continue with `tune --resume` (finished candidates are not run again)")
        keep = outcome.winner if (self.settings.apply and outcome.winner
                                  and outcome.verdict == "better beyond noise") else self.baseline.id
        url = self.drain.url if self.drain else self.original.base_url
        result = report.build(self.journal, outcome, self.by_id, self.baseline, self.settings, deployed=keep,
                              folder=self.host.layout.host_path(self.folder), url=url)
        self.save(result=result)
        why = "apply: the winner" if keep != self.baseline.id else (
            "no --apply: the original" if not self.settings.apply else
            f"the winner is {outcome.verdict} against the original: the original")
        try:
            self.restore(keep, why)
        except KeyboardInterrupt:
            self.restore(self.baseline.id, "interrupted")
            self.save(result={**result, "deployed": self.baseline.id})  # --resume ends on the original, as asked
            raise TuneInterrupted("tune was interrupted while putting the result in place; the original "
                                  "configuration is back", value=str(tj.path(self.folder)),
                                  hint=f"`tune --resume` writes the report, the original staying; to keep the winner "
                                       f"afterwards install {self.host.layout.host_path(self.folder)}/winner.toml and "
                                       "restart --wait --rollback-on-failure") from None
        return self.done(result)

    def done(self, result: dict[str, Any]) -> tj.TuneJournal:
        report.write_outputs(self.folder, self.journal, result, self.host.profile, self.by_id)
        self.save(phase="done")
        return self.journal


def begin_change(plan: Any, layout: HostLayout, gate: str, label: str) -> change_journal.Change:
    """Record a candidate's deployment before the install's first write (:mod:`kimi_deploy.host.journal`, kind
    ``tune``): every file of the install plan as on disk now (the version running) and as the plan writes it.

    Raises:
        UsageError / StorageError: the journal cannot be written; nothing changed.
    """
    old = {f.host_path: f.old for f in plan.files}
    new = {f.host_path: f.new if f.action != "unchanged" else f.old for f in plan.files}
    service = plan.service
    unit = layout.unit_path(Units.of(service).server)
    unit_hp = layout.host_path(unit)
    existed = old[unit_hp] is not None if unit_hp in old else unit.exists()
    change = change_journal.Change(kind="tune", service=service, started_at=change_journal.stamp(),
                                   old_label="the configuration running before this candidate", new_label=label,
                                   old=change_journal.hashes(old), new=change_journal.hashes(new), touches_files=True,
                                   backups_before=change_journal.backup_names(layout, service), unit_existed=existed,
                                   gate=gate, resume=resume_command(layout, service))
    return change_journal.begin(layout, change, old)


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def memory_facts(profile: Profile, gpu_facts: Path | None, model_facts: Path | None) -> Any:
    """The memory plan's inputs (:class:`kimi_deploy.sizing.memory.Facts`): the GPUs from ``gpu_facts`` (a recorded
    ``nvidia-smi --query-gpu`` CSV) or this host's ``nvidia-smi``, the model from ``model_facts`` or the profile's
    model directory (and the draft's, when it is a directory here). ``None`` when either is missing: the memory
    stage is then skipped, and ``tune`` says so.

    Raises:
        UsageError: a facts file or directory that cannot be read.
    """
    if gpu_facts is not None:
        gpus = GpuFacts.from_query(gpu_facts.read_text(encoding="utf-8", errors="replace"), str(gpu_facts))
    else:
        found, _why = probe_gpus()
        gpus = GpuFacts.from_gpus(found, "this host's nvidia-smi") if found else None
    model_dir = model_facts or (Path(profile.sglang.model_path) if profile.sglang.model_path else None)
    if gpus is None or model_dir is None or not (model_dir / "config.json").is_file():
        return None
    draft = profile.sglang.speculative_draft_model_path
    draft_facts = ModelFacts.load(draft) if draft and (Path(draft) / "config.json").is_file() else None
    return Facts(gpus=gpus, model=ModelFacts.load(model_dir), draft=draft_facts)


def probe(python: str) -> tuple[str, Mapping[str, str]]:
    """SGLang's version and components in ``python`` (one interpreter start).

    Raises:
        UsageError: no SGLang there, or a version the kit does not know.
    """
    info = engine.probe(python)
    version, _ = engine.require_sglang(info)
    return version, info.components()


#: A cold start on the reference host (8x RTX PRO 6000, K2.5 INT4, EAGLE-3): docs/runbook.md#warm-and-cold-restarts.
REFERENCE_START_S = 570.0


def plan(host: Host, settings: Settings) -> dict[str, Any]:
    """What ``tune --dry-run`` shows, changing nothing and restarting nothing: the dimensions, the space, what the
    profile rules, the memory plan and SGLang's parser prune, and the restarts the method needs with what they
    cost at this host's recorded start time (the median of ``start-history.json``, else the reference host's).

    Raises:
        RefusedError / UsageError: as :func:`tune` for a new run.
    """
    installed_profile(host.layout, host.profile)
    dims = space.dimensions(host.profile, host.version, settings.space or None)
    cands = space.candidates(dims)
    pruned = {c.id: space.prune(host.profile, c, host.facts) for c in cands}
    left = [c for c in cands if pruned[c.id] is None]
    launches = []
    for c in left:
        launch = resolve(space.apply(host.profile, c), host.version, components=host.components).launch
        launches.append((launch.server_args, launch.secrets_config, check_env(launch)))
    refused = {c.id: v.errors[0] for c, v in zip(left, validate_many(host.profile.service.python, launches,
                                                                       sglang_version=host.version)) if not v.ok}
    feasible = len(left) - len(refused)
    if settings.method == "descent":
        restarts = min(feasible, sum(len(d.values) - 1 for d in dims) + settings.finalists + 1)
    elif settings.method == "halving":
        restarts = feasible * 2
    else:
        restarts = max(0, feasible - 1)
    history = start_history.load(host.layout.state_dir(host.profile.service.name))
    if history:
        start = statistics.median(r.total for r in history)
        source = f"the median of this host's {len(history)} recorded starts"
    else:
        start, source = REFERENCE_START_S, "a cold start on the reference host (no start recorded here)"
    base = space.baseline(dims)
    reasons = [{"candidate": c.id, "label": c.label(base.as_dict()), "stage": why.stage, "problem": why.problems[0]}
               for c in cands if (why := pruned[c.id]) is not None]
    reasons += [{"candidate": cid, "label": next(c for c in cands if c.id == cid).label(base.as_dict()),
                 "stage": "sglang", "problem": err} for cid, err in refused.items()]
    return {"dimensions": [d.to_dict() for d in dims], "space": len(cands), "pruned": reasons,
            "feasible": feasible, "method": settings.method, "restarts": restarts, "grid_restarts": max(0, feasible - 1),
            "start_seconds": round(start, 1), "start_source": source,
            "hours": round(restarts * start / 3600, 1), "grid_hours": round(max(0, feasible - 1) * start / 3600, 1),
            "memory_planned": host.facts is not None}


def tune(host: Host, settings: Settings, *, resume: bool = False) -> tj.TuneJournal:
    """Run (or resume) a tune of ``host`` (module docstring). Returns the finished journal (``result`` filled).

    Raises:
        RefusedError: ``host.profile`` is not the installed profile (a new run; a resumed one must be the journal's);
            the running configuration fails its gate.
        UsageError: see :func:`open_journal`; a bad ``--space``.
        TuneInterrupted: Ctrl-C/SIGTERM (the original configuration is back; exit 130).
        LockedError: another tune of the service runs (exit 7).
        KimiDeployError: what install, restart or the final gate raised.
    """
    if not resume:  # a resumed tune may stop on a candidate's files: the journal holds the original
        installed_profile(host.layout, host.profile)
    folder = host.layout.tune_dir(host.profile.service.name)
    fsio.mkdir(folder)
    with fsio.exclusive_lock(folder / ".tune.lock", what=f"the tune of {host.profile.service.name}"), sigterm_as_ctrl_c():
        journal, settings = open_journal(host, settings, resume=resume)
        journal = tj.save(folder, journal)
        return Tuner(host, settings, journal).run()


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``systemctl stop`` of a unit running tune, ``kill``) ends the search as Ctrl-C does: the original
    configuration goes back. Only where Python lets a handler be set (the main thread)."""
    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


