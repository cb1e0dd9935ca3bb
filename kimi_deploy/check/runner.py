"""Run the selected checks against one server and collect a :class:`CheckReport`."""

from __future__ import annotations

import sys

import datetime as _dt
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from kimi_deploy.check import concurrency, contract, followup, health, parser, prefix_cache, check_ids
from kimi_deploy.check.quality import tier as quality
from kimi_deploy.check.quality.settings import resolve as quality_settings
from kimi_deploy.check.client import Clients, Deadline
from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome, transport_failure, unreadable
from kimi_deploy.check.reports import redact_report
from kimi_deploy.check.results import CheckOptions, CheckReport, CheckResult, clip, fix_for
from kimi_deploy.deployment import resolve
from kimi_deploy.wire.apikey import guard_transport, resolve_key
from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.errors import UsageError
from kimi_deploy.wire.limits import Limits
from kimi_deploy.catalog.models import required_sampling
from kimi_deploy.profile import Profile, load_profile
from kimi_deploy.topology import local_rank, refuse_http_proof

log = logging.getLogger(__name__)


def _resolve_profile(value: object) -> tuple[Profile | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, Profile):
        return value, None
    path = Path(value)  # type: ignore[arg-type]
    return load_profile(path), str(path)


def refuse_on_a_silent_rank(profile_path: str | Path | None) -> None:
    """Refuse to check from a rank >= 1 of a multi-node group (its ``/health`` is SGLang's dummy 200, no proof of
    anything): the profile at ``profile_path`` and this host's rank (:func:`kimi_deploy.topology.local_rank`).

    Raises:
        UsageError: this host runs a rank >= 1 (the hint names rank 0's URL). ProfileError: an invalid profile.
    """
    if profile_path is None:
        return
    profile = load_profile(Path(profile_path))
    refuse_http_proof(profile, local_rank(profile), "check")


def _result(check_id: str, outcome: Outcome, duration: float) -> CheckResult:
    return CheckResult(check_id, outcome.status, outcome.kind, outcome.detail, outcome.evidence, duration)


#: Kinds that mean "no HTTP answer": when every health check got one of these, nothing else is sent.
NO_ANSWER_KINDS = ("unreachable", "timeout")


def _not_attempted(check_id: str, kind: str, detail: str, evidence: str) -> CheckResult:
    return CheckResult(check_id, "fail", kind, detail, clip(evidence), 0.0, attempted=False)  # type: ignore[arg-type]


def _past_deadline(check_id: str, deadline: Deadline, t0: float) -> CheckResult:
    return _not_attempted(check_id, "timeout",
                          f"the run reached its deadline (--deadline {deadline.seconds:g} s) after "
                          f"{deadline.clock() - t0:.1f} s; this check was not started",
                          f"not attempted: the run's deadline of {deadline.seconds:g} s passed")


def _no_answer(results: list[CheckResult]) -> CheckResult | None:
    """The first health result when every one of them got no HTTP answer, else ``None``."""
    if results and any(r.attempted for r in results) and all(
            r.status == "fail" and r.kind in NO_ANSWER_KINDS for r in results):
        return next(r for r in results if r.attempted)
    return None


#: ``progress(check_id, done, total, result)``: called before each check starts (``result`` None,
#: ``done`` = checks finished so far) and after it ends (with its result), for a live display.
Progress = Callable[[str, int, int, "CheckResult | None"], None]


def guard_key(base_url: str, api_key: str | None, workers: Sequence[str] = (), *, insecure: bool,
              note: bool = True) -> None:
    """:func:`kimi_deploy.wire.apikey.guard_transport` for a check of ``base_url``, except that one of ``workers``,
    the worker URLs the profile itself names (``[fleet]``: :attr:`kimi_deploy.deployment.Deployment.worker_urls`),
    is the operator's own fleet, where SGLang's
    gateway sends the same key over the same network anyway (one ``note:`` line on stderr says so when it goes
    over plain http to another host, unless ``note`` is False); a URL only a gateway lists is guarded.

    Raises:
        UsageError: plain http with a key to a host that is neither local nor a profile's worker (exit 2).
    """
    own = {url.rstrip("/") for url in workers}
    if base_url.rstrip("/") not in own or insecure:
        guard_transport(base_url, api_key, insecure=insecure)
        return

    def say(_warning: str) -> None:  # instead of --insecure's warning: the operator declared this worker
        if note:
            print(f"note: the API key goes to {base_url} over plain http, as the gateway sends it there ([fleet] "
                  "replicas lists it); anyone on that network path can read it", file=sys.stderr)

    guard_transport(base_url, api_key, insecure=True, warn=say)


def run_checks(options: CheckOptions, progress: Progress | None = None, *,
               clock: Callable[[], float] = time.monotonic, deadline: Deadline | None = None) -> CheckReport:
    """Run the checks ``options`` select against one OpenAI-compatible server.

    Order: ``health.*``, ``config.*``, ``parser.*``, ``contract.*`` (see :mod:`kimi_deploy.check.check_ids`);
    where the ``parser.*`` tier cannot run (not SGLang, no ``kimi_k2`` parser) it reports one
    ``skip`` row and its other ids are left out of the report.
    When the server does not answer the health tier (every selected health check
    ``unreachable`` or ``timeout``; with no health check selected, a ``GET /v1/models`` probe),
    nothing else is sent: every other check is ``fail`` with that kind and evidence
    ``not attempted: the server did not answer health.live``, and
    :attr:`CheckReport.exit_code` is UNREACHABLE (3). With ``options.deadline``, no request
    waits past it, and checks not started by then are ``fail``/``timeout``, not attempted.
    ``progress`` (optional) hears of every check as it starts and ends (:data:`Progress`).
    Interrupted (``KeyboardInterrupt``; :class:`Interrupted` names another signal), it returns the
    checks that finished, with :attr:`CheckReport.interrupted` and ``not_run`` set (exit 130).
    ``clock`` (seconds, monotonic) times the run, its checks and the deadline; ``deadline``: one shared with
    other runs (``check --each-worker``: one for the whole fleet) instead of ``options.deadline``.
    Whatever a check raises (an answer nobody foresaw) is that check's ``fail``/``invalid_response`` row,
    never the end of the run: one catch per check (:func:`_run_one`), the traceback at debug level.

    Raises:
        UsageError / ProfileError: no base URL or one :func:`kimi_deploy.wire.baseurl.check_base_url` refuses, a bad
            profile, an unreadable key file,
            an ``only``/``skip`` glob that matches nothing, a key bound for plain http to a host that
            is not local without ``options.insecure`` (exit 2).
    """
    profile, profile_path = _resolve_profile(options.profile)
    # base URL, key and name, as bench reads them; no launch is built (a profile installed for another release)
    deployment = resolve(profile, launches=False) if profile is not None else None
    base_url = options.base_url or (deployment.base_url if deployment else None)
    if not base_url:
        raise UsageError("no server to check", hint="pass --base-url http://HOST:PORT or --profile FILE")
    base_url = check_base_url(base_url)
    api_key = options.api_key
    if api_key is None and deployment is not None:
        api_key = resolve_key(profile_key_file=deployment.api_key_file)
    guard_key(base_url, api_key, deployment.worker_urls if deployment else (), insecure=options.insecure)  # first
    ids = check_ids.select(options.only, options.skip, quality=options.quality)
    settings = quality_settings(options, profile)
    quality.prepare(ids, settings)  # a dataset that cannot be read is exit 2 before anything is sent
    expected = options.model or (deployment.served_model if deployment else None)
    report = CheckReport(base_url=base_url, model=expected, started_at=_dt.datetime.now(_dt.timezone.utc),
                         profile=profile_path, service=profile.service.name if profile else None)
    t0 = clock()
    deadline = deadline or Deadline(options.deadline, clock)
    clients = Clients.open(base_url, api_key, options.timeout, deadline,
                           Limits(options.max_body_bytes, options.max_line_bytes))
    health_ids = [i for i in ids if check_ids.tier(i) == "health"]
    rest = [i for i in ids if i not in health_ids]

    finished: list[str] = []  # ids run to the end, including parser.* ids the tier's skip row stands for
    absorbed: list[str] = []  # parser.* ids the tier's one skip row stands for: no row of their own

    def run_one(check_id: str, cache: dict) -> None:
        # progress counts rows of the report (done = rows so far, total = rows it will have), not ids
        if progress is not None:
            progress(check_id, len(report.results), len(ids) - len(absorbed), None)
        result = _run_one(ctx, check_id, cache, deadline, t0)
        if result is not None:  # None: a parser.* id on a server where the tier already said why it skips
            report.results.append(result)
        else:
            absorbed.append(check_id)
        finished.append(check_id)
        if progress is not None:
            progress(check_id, len(report.results), len(ids) - len(absorbed), result)

    ctx = Context(clients=clients, profile=profile, model=expected, expected_model=expected,
                  repeat=options.repeat, quality=settings, concurrency=options.concurrency,
                  sampling=request_sampling(options.sampling, profile, expected), sampling_mode=options.sampling)
    try:
        for check_id in health_ids:
            run_one(check_id, {})
        silent = None if clients.answered else _no_answer(report.results)  # a byte back is an answer
        gate = (silent.id, silent.kind, silent.detail) if silent else None if health_ids else _probe(clients)
        if gate is not None:
            what, kind, detail = gate
            report.answered = False
            report.results += [_not_attempted(i, kind, f"the server did not answer {what} ({detail}); nothing "
                                                       "more was sent", f"not attempted: the server did not answer {what}")
                               for i in rest]
            if progress is not None and rest:
                progress(rest[-1], len(report.results), len(report.results), report.results[-1])
            return report
        if not deadline.passed():
            _load_facts(ctx, report, ids)
        cache: dict = {}
        for check_id in rest:
            run_one(check_id, cache)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI's handler (Interrupted)
        report.interrupted = getattr(exc, "signal", "SIGINT")
        report.not_run = [i for i in ids if i not in finished and i not in {r.id for r in report.results}]
    finally:
        clients.close()
        if ctx.quality_results:
            report.quality = dict(ctx.quality_results)
        report.duration_s = clock() - t0
        _add_fixes(report, profile)
        redact_report(report, [api_key])  # no key in any report or table (kimi_deploy.redact)
    return report


class Interrupted(KeyboardInterrupt):
    """Raised (by a signal handler) to stop a run the way Ctrl-C does; ``signal`` names the signal."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


def _add_fixes(report: CheckReport, profile: Profile | None) -> None:
    """Fill the profile's interpreter and service name into every ``fail``/``warn`` row's fix
    (:class:`CheckResult` sets the generic one itself)."""
    python = profile.service.python if profile else None
    name = profile.service.name if profile else None
    for r in report.results:
        if r.status in ("fail", "warn") and profile is not None:
            r.fix = fix_for(r.kind, python=python, name=name, detail=r.detail)


def _load_facts(ctx: Context, report: CheckReport, ids: list[str]) -> None:
    """What the server says of itself into ``report.server`` (strings only: a value of another JSON type is
    shown as its clipped text) and, when no model was given, the served one. A fact the server answers
    unreadably stays unknown: the checks that need it say so."""
    try:
        ctx.load_facts()
        kind = ctx.identify()
        report.server = {k: v if isinstance(v, str) else clip(v) for k, v in {
            "kind": kind,
            "version": ctx.server_version,
            "tool_call_parser": ctx.server_value("tool_call_parser"),
            "reasoning_parser": ctx.server_value("reasoning_parser"),
            "served_model_name": ctx.server_value("served_model_name"),
        }.items() if v is not None}
        if ctx.model is None and any(check_ids.tier(i) in ("contract", "quality") for i in ids):
            ctx.model = ctx.served_model()
            report.model = ctx.model
            if ctx.sampling_mode == "model" and ctx.profile is None:  # the served name may be a catalog model
                ctx.sampling = request_sampling("model", None, ctx.model)
    except Exception:  # noqa: BLE001 - a hostile answer to a fact must not cost the run its reports
        log.debug("reading the server's facts failed", exc_info=True)


def _run_one(ctx: Context, check_id: str, cache: dict, deadline: Deadline, t0: float) -> CheckResult | None:
    """Run one check; whatever it raises (but an interrupt) becomes its ``fail``/``invalid_response`` row
    (the traceback is logged at debug level: ``kimi-deploy --debug check`` prints it)."""
    if deadline.passed():
        return _past_deadline(check_id, deadline, t0)
    started = deadline.clock()
    ctx.clients.recorder.last_body = bytearray()  # the evidence of a failure is this check's answer, not older
    try:
        outcome = _dispatch(ctx, check_id, cache)
    except httpx.TransportError as exc:  # cut off mid-stream (the deadline, a broken chunk): openai does not wrap it
        outcome = Outcome.failed(transport_failure(exc, f"a request of {check_id}"))
    except Exception as exc:  # noqa: BLE001 - the one catch per check (issue #11): a verdict, never a lost report
        log.debug("check %s raised", check_id, exc_info=True)
        outcome = Outcome.failed(unreadable(exc, body=ctx.clients.recorder.last_body))
    if outcome is None:  # a parser.* id on a server where the tier already said why it skips
        return None
    return _result(check_id, outcome, deadline.clock() - started)


def _dispatch(ctx: Context, check_id: str, cache: dict) -> Outcome | None:
    outcome: Outcome | None
    if check_id in health.CHECKS:
        outcome = health.CHECKS[check_id](ctx)
    elif check_ids.tier(check_id) == "parser":  # needs no model: it posts raw text to the parsers
        outcome = parser.run(ctx, check_id, cache)
    elif ctx.model is None:
        outcome = health.no_model(ctx)
    elif check_ids.tier(check_id) == "quality":
        outcome = quality.run(ctx, check_id, cache)
    elif check_id == prefix_cache.CHECK_ID:
        outcome = prefix_cache.run(ctx)
    elif check_id.startswith("contract.concurrency."):
        outcome = concurrency.run(ctx, check_id)
    elif check_id.startswith("contract.followup."):
        outcome = followup.run(ctx, check_id, cache)
    else:
        outcome = contract.run(ctx, check_id, cache)
    return outcome


def request_sampling(mode: str, profile: Profile | None, model: str | None) -> dict[str, float]:
    """The sampling every contract request carries: the catalog model's required sampling (its
    :meth:`kimi_deploy.catalog.models.Sampling.request`) in ``model`` mode when the profile's model or ``model``
    is one with such a rule, else (and always in ``greedy`` mode) ``{"temperature": 0}``."""
    if mode == "model":
        names = (profile.sglang.model_path, profile.sglang.served_model_name) if profile is not None else ()
        required = required_sampling(*names, model)
        if required:
            return required
    return {"temperature": 0}


def _probe(clients: Clients) -> tuple[str, str, str] | None:
    """``GET /v1/models`` when no health check is selected: ``None`` on any HTTP answer (readable or not), else
    ("GET /v1/models", ``unreachable``/``timeout``, detail)."""
    what = "GET /v1/models"
    try:
        clients.get_json("/v1/models")
    except httpx.TransportError as exc:
        finding = transport_failure(exc, what)
        silent = finding.kind in NO_ANSWER_KINDS and not clients.answered  # a byte back is an answer
        return (what, finding.kind, finding.detail) if silent else None
    except Exception:  # noqa: BLE001 - it answered, unreadably (JSON nested too deep): the checks will say so
        log.debug("%s answered unreadably", what, exc_info=True)
    return None
