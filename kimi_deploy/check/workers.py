"""``check --each-worker``: the selected checks against every worker SGLang's gateway lists, one report each, then
the checks the gateway's own path can change, through the gateway.

Through the gateway a bad replica hides behind retries (smg sends a failed request to another worker); run
against each worker URL directly, it cannot. The worker list is the gateway's own (``GET /workers``, read
through the check's own bounded client and parsed by :func:`kimi_deploy.wire.workers.parse_workers`; the caller
may pass it instead), so a worker the profile no longer names but the gateway still routes to
is checked too.

What clients see is the gateway's answer, so the selected checks of :data:`THROUGH_GATEWAY` also run against the
gateway itself, after the workers (issue 41): the concurrency pass (``contract.concurrency.*``, its level the
per-server level, ``--concurrency`` or the profile's, x the workers listed, at most :data:`GATEWAY_CAP`: smg spreads
a burst over the workers, so each is loaded as a direct run loads it) and the
reasoning split (``contract.reasoning_*``): a fault only under load or only on the gateway's path (its own parser,
its relaying of streams) shows there with its rate per case.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import httpx

from kimi_deploy.check.client import Clients, Deadline
from kimi_deploy.check.concurrency import profile_level
from kimi_deploy.check.outcome import transport_failure
from kimi_deploy.check.check_ids import select
from kimi_deploy.check.results import CheckOptions, CheckReport
from kimi_deploy.check.runner import _resolve_profile, guard_key, run_checks
from kimi_deploy.deployment import resolve
from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.errors import ExitCode, KimiDeployError, UsageError
from kimi_deploy.wire.limits import Limits
from kimi_deploy.wire.printable import printable
from kimi_deploy.redact import redact_text, url as redact_url
from kimi_deploy.wire.apikey import resolve_key
from kimi_deploy.wire.workers import parse_workers

#: ``schema`` of the JSON document :meth:`FleetReport.to_json` returns.
SCHEMA = "kimi-deploy.check-workers/1"
#: Checks run on each worker when ``--only`` is not given: the health tier, then the API contract.
DEFAULT_ONLY = ("health.*", "contract.*")
#: Checks also run through the gateway (those of them the run selects): what the gateway's path can change.
THROUGH_GATEWAY = ("contract.concurrency.*", "contract.reasoning_on.*", "contract.reasoning_off.*")
#: Most requests at once through the gateway (the per-server level x the workers listed; a larger ``--concurrency``
#: itself is kept).
GATEWAY_CAP = 256
#: The order in which one worker's exit status outranks another's for the run's (:attr:`FleetReport.exit_code`).
WORST_FIRST = (ExitCode.INTERRUPTED, ExitCode.USAGE, ExitCode.UNREACHABLE, ExitCode.FAILED)


@dataclasses.dataclass
class WorkerRun:
    """One listed worker: its check report, or why the check refused to contact it (``error``, exit
    ``error_code``: the URL or key rule a plain ``check --base-url URL`` would refuse it by, exit 2)."""

    url: str
    report: CheckReport | None = None
    error: str | None = None
    error_code: ExitCode = ExitCode.USAGE

    @property
    def exit_code(self) -> ExitCode:
        return self.report.exit_code if self.report is not None else self.error_code


@dataclasses.dataclass
class FleetReport:
    """One :class:`WorkerRun` per worker URL the gateway at ``gateway`` listed, in its order.

    ``error``: the gateway's listing failed (``error_code``: 3 no answer, 1 not smg's list); ``interrupted``
    names the signal that stopped the run (``not_run``: the listed workers not checked); ``secrets``: the key
    the run sent, masked (with URL credentials) in every URL written (:func:`kimi_deploy.redact.url`);
    ``through_gateway``: the report of :data:`THROUGH_GATEWAY` against the gateway (``None``: not run: none of
    them selected, no worker listed, or the run stopped first).
    """

    gateway: str
    runs: list[WorkerRun] = dataclasses.field(default_factory=list)
    through_gateway: CheckReport | None = None
    error: str | None = None
    error_code: ExitCode = ExitCode.FAILED
    interrupted: str | None = None
    not_run: list[str] = dataclasses.field(default_factory=list)
    secrets: tuple[str, ...] = ()

    @property
    def reports(self) -> list[tuple[str, CheckReport]]:
        """``(url, report)`` of every worker that was checked, then the gateway's own (its URL) when it ran."""
        out = [(run.url, run.report) for run in self.runs if run.report is not None]
        return out + ([(self.gateway, self.through_gateway)] if self.through_gateway is not None else [])

    @property
    def exit_code(self) -> ExitCode:
        """Interrupted (130), else the worst of the workers' and the listing's (:data:`WORST_FIRST`); no worker
        listed: failed."""
        if self.interrupted:
            return ExitCode.INTERRUPTED
        codes = [run.exit_code for run in self.runs] + ([self.error_code] if self.error else []) + \
            ([self.through_gateway.exit_code] if self.through_gateway is not None else [])
        if not codes:
            return ExitCode.FAILED
        for worst in WORST_FIRST:
            if worst in codes:
                return worst
        return max(codes)

    def shown(self, url: str) -> str:
        """``url`` as every output writes it: credentials and the key masked, control bytes escaped."""
        return printable(redact_url(url, self.secrets))

    def said(self, text: str) -> str:
        """A message to write (a refusal quoting a listed URL): the key masked, control bytes escaped."""
        return printable(redact_text(text, self.secrets))

    def to_json(self) -> dict[str, Any]:
        """``{"schema", "gateway", "exit_code", "error", "interrupted", "workers": [{"url", "exit_code", "checks",
        "failed", "error", "report"}], "through_gateway"}``; ``report`` is that worker's kimi-deploy.check/1 document
        (``null`` for a worker the check refused to contact: ``error`` says why), ``failed`` its failed check ids;
        ``through_gateway``: ``{"exit_code", "checks", "failed", "report"}`` of the checks run through the gateway,
        ``null`` when none ran."""
        gw = self.through_gateway
        return {"schema": SCHEMA, "gateway": self.shown(self.gateway), "exit_code": int(self.exit_code),
                "error": self.said(self.error) if self.error else None,
                "interrupted": {"signal": self.interrupted, "not_run": [self.shown(u) for u in self.not_run]}
                if self.interrupted else None,
                "workers": [{"url": self.shown(run.url), "exit_code": int(run.exit_code),
                             "checks": len(run.report.results) if run.report else 0,
                             "failed": [r.id for r in run.report.results if r.status == "fail"] if run.report else [],
                             "error": self.said(run.error) if run.error else None,
                             "report": run.report.to_json() if run.report else None} for run in self.runs],
                "through_gateway": None if gw is None else {
                    "exit_code": int(gw.exit_code), "checks": len(gw.results),
                    "failed": [r.id for r in gw.results if r.status == "fail"], "report": gw.to_json()}}


def _refusal(exc: KimiDeployError) -> str:
    return exc.message + (f" ({exc.value})" if exc.value else "") + (f"; fix: {exc.hint}" if exc.hint else "")


def list_workers(clients: Clients, fleet: FleetReport) -> list[str]:
    """The worker URLs smg's ``GET /workers`` lists, read through the check's own bounded client (the run's
    deadline, the byte caps); a failure is ``fleet.error`` (3: no answer, 1: not smg's list) and ``[]``."""
    not_smg = (f"is {fleet.gateway} SGLang's gateway (smg)? a worker or another server has no worker list: give the "
               "gateway's address (the profile's [gateway] bind/port)")
    try:
        status, body = clients.get_json("/workers")
    except httpx.TransportError as exc:
        finding = transport_failure(exc, "GET /workers")
        fleet.error, fleet.error_code = f"the gateway at {fleet.gateway} did not answer: {finding.detail}; fix: is the " \
            "gateway unit (<service>-gateway.service) running on the gateway host, and [gateway] host/port right?", \
            ExitCode.UNREACHABLE if finding.kind in ("unreachable", "timeout") else ExitCode.FAILED
        return []
    if status != 200:
        hint = "give the profile's API key (the gateway uses the workers' key)" if status in (401, 403) else not_smg
        fleet.error = f"the gateway answered GET /workers with {status}; fix: {hint}"
        return []
    try:
        return [w.url for w in parse_workers(body if not isinstance(body, str) else None)]
    except ValueError as exc:
        fleet.error = f"the gateway's GET /workers answer is not smg's worker list: {exc}; fix: {not_smg}"
        return []


def check_each_worker(options: CheckOptions, gateway_url: str, progress=None, *,
                      urls: Sequence[str] | None = None,
                      clock: Callable[[], float] = time.monotonic) -> FleetReport:
    """Run :func:`kimi_deploy.check.run_checks` with ``options`` against each worker the gateway lists.

    ``options.base_url`` is replaced by each worker's URL; without ``options.only`` :data:`DEFAULT_ONLY` runs.
    Then the selected checks of :data:`THROUGH_GATEWAY` run against the gateway itself (:attr:`FleetReport.
    through_gateway`; the per-server level, ``options.concurrency`` or the profile's, x the workers listed, at most
    :data:`GATEWAY_CAP`). ``options.deadline`` bounds the whole run, listing, every worker and the gateway's pass
    together (one :class:`Deadline`): workers reached after it get a report whose checks are all not attempted.

    Every address is held to a plain check's rules: the gateway's and each worker's URL
    (:func:`kimi_deploy.wire.baseurl.check_base_url`: a ``grpc://`` worker smg lists, a path) and the key's
    transport (:func:`kimi_deploy.check.runner.guard_key`: workers ``options.profile`` declares in ``[fleet]``
    get the key over plain http as the gateway does). A worker refused by either is that worker's failure
    (exit 2, not contacted); the others are still checked. Interrupted (Ctrl-C, or SIGTERM through the CLI's
    handler), it returns what ran, ``interrupted`` set. Every outcome is a report: nothing here loses one.

    Raises:
        UsageError: the gateway's own URL breaks a rule, or the key would go to it in clear text (exit 2,
            nothing sent).
    """
    gateway = check_base_url(gateway_url)
    profile = _resolve_profile(options.profile)[0]
    workers = resolve(profile, launches=False).worker_urls if profile is not None else ()  # the fleet it declares
    guard_key(gateway, options.api_key, workers, insecure=options.insecure)
    fleet = FleetReport(gateway=gateway, secrets=(options.api_key,) if options.api_key else ())
    deadline = Deadline(options.deadline, clock)
    only = tuple(options.only) or DEFAULT_ONLY
    listed, urls = urls, []
    done = 0
    try:
        clients = Clients.open(gateway, options.api_key, options.timeout, deadline,
                               Limits(options.max_body_bytes, options.max_line_bytes))
        try:
            urls = list(listed) if listed is not None else list_workers(clients, fleet)
        finally:
            clients.close()
        for url in urls:
            try:
                url = check_base_url(url, option="the gateway's worker URL")
                guard_key(url, options.api_key, workers, insecure=options.insecure, note=False)
            except UsageError as exc:
                if "plain http" in exc.message:
                    exc = UsageError(f"the gateway lists {url}, which is not in the profile's [fleet] replicas: "
                                     "refusing to send it the API key in clear text over plain http", value=None,
                                     hint="remove it from the gateway (DELETE /workers/ID) or list it in [fleet] "
                                          "replicas; --insecure sends the key anyway")
                fleet.runs.append(WorkerRun(url, error=_refusal(exc)))
                done += 1
                continue
            report = run_checks(dataclasses.replace(options, base_url=url, only=only, profile=profile), progress,
                                clock=clock, deadline=deadline)
            fleet.runs.append(WorkerRun(url, report))
            done += 1
            if report.interrupted:
                fleet.interrupted = report.interrupted
                break
        through = gateway_checks(only, options.skip) if fleet.runs and not fleet.interrupted else []
        if through:
            per_server = options.concurrency or profile_level(profile)
            level = min(per_server * len(urls), max(GATEWAY_CAP, per_server))
            fleet.through_gateway = run_checks(
                dataclasses.replace(options, base_url=gateway, only=through, skip=(), profile=profile,
                                    concurrency=level), progress, clock=clock, deadline=deadline)
            if fleet.through_gateway.interrupted:
                fleet.interrupted = fleet.through_gateway.interrupted
    except KeyboardInterrupt as exc:  # between workers, or while listing them
        fleet.interrupted = getattr(exc, "signal", "SIGINT")
    if fleet.interrupted:
        fleet.not_run = urls[done:]
    return fleet


def gateway_checks(only: Sequence[str], skip: Sequence[str] = ()) -> list[str]:
    """The ids of :data:`THROUGH_GATEWAY` that ``only``/``skip`` select (:func:`kimi_deploy.check.check_ids.select`),
    in run order; ``[]`` when none is selected (``--only 'health.*'``: no pass through the gateway)."""
    chosen = set(select(only, skip))
    return [i for i in select(THROUGH_GATEWAY) if i in chosen]


def gateway_options(options: CheckOptions) -> tuple[CheckOptions, str | None]:
    """``(options for each worker, the gateway's URL)`` of a ``check --each-worker`` run: ``options.profile``
    loaded (a path becomes its :class:`kimi_deploy.profile.Profile`), the gateway ``options.base_url`` or the
    profile's ``[gateway]`` (:attr:`~kimi_deploy.profile.Profile.gateway_url`), the key ``options.api_key`` or the
    profile's (:func:`kimi_deploy.wire.apikey.resolve_key`); the options' ``base_url`` is cleared (each worker's
    replaces it).

    Raises:
        ProfileError: an invalid profile. UsageError: no ``[gateway]`` and no URL; an unreadable key file (exit 2).
    """
    base_url, api_key, profile = options.base_url, options.api_key, None
    if options.profile:
        profile = _resolve_profile(options.profile)[0]
        deployment = resolve(profile, launches=False)
        if base_url is None:
            base_url = deployment.gateway_url
            if base_url is None:
                raise UsageError("the profile has no [gateway]", hint="add a [gateway] table "
                                 "(docs/runbook.md#replicas-behind-a-gateway), or pass --base-url GATEWAY_URL")
        if api_key is None:
            api_key = resolve_key(profile_key_file=deployment.api_key_file)
    return dataclasses.replace(options, base_url=None, api_key=api_key, profile=profile), base_url
