"""The ``contract.concurrency.*`` checks: the contract's tool-call cases, N requests at once.

Several failures Kimi operators report appear only under load: empty content with ``finish_reason=stop`` under 100
concurrent workers (sgl-project/sglang issue 23341), follow-ups that fail with EAGLE-3 batches (MoonshotAI/Kimi-K2
issue 128); the other contract checks send one request at a time. Behind SGLang's gateway ``check --each-worker``
also sends them through the gateway (:mod:`kimi_deploy.check.workers`). Each ``contract.concurrency.<case>`` sends
:func:`level` requests of that case at once (every second one streamed), each from its own connection, judges
every answer by the contract's rules (:func:`kimi_deploy.check.contract._request`), and reports the failure rate:
``fail`` with the most frequent kind when any request failed (bar 0), ``warn``/``model_declined`` when the only
misses are prose answers, else ``pass``. Requests not sent before the run's ``--deadline`` are left out and the
detail says how many were sent.
"""

from __future__ import annotations

import collections
import dataclasses
from concurrent.futures import ThreadPoolExecutor

from kimi_deploy.check.client import Clients
from kimi_deploy.check.context import Context
from kimi_deploy.check.contract import CASES, Answer, _expectation, _history_ids, _request
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.completion_rules import Finding, first
from kimi_deploy.profile import Profile

#: Requests at once without a profile's ``max_running_requests`` or ``--concurrency``: the level from which the
#: field's under-load failures are reported (issue 41's reproduction fails from 8 on).
DEFAULT_CONCURRENCY = 8
#: At most this many at once from the profile's ``max_running_requests`` (SGLang's default with EAGLE is 48; a
#: profile's 256 would make every case a 256-request burst): ``--concurrency`` may ask for more.
PROFILE_CAP = 64

#: The contract cases sent at once: those that make a tool call due, and ``reasoning_on`` (an answer in text with
#: thinking on: the reasoning split under load, each answer judged for a think tag in content, empty content and
#: missing reasoning, so a leak in a fraction of answers shows as a rate; smg issue 1873, sglang PR 33995).
CASE_NAMES: tuple[str, ...] = ("tool_auto", "tool_required", "tool_named", "parallel", "id_roundtrip.canonical",
                               "reasoning_on")


def check_ids() -> list[str]:
    """Every ``contract.concurrency.*`` id, in run order."""
    return [f"contract.concurrency.{name}" for name in CASE_NAMES]


def level(ctx: Context) -> int:
    """Requests at once: ``--concurrency``, else :func:`profile_level`."""
    return ctx.concurrency or profile_level(ctx.profile)


def profile_level(profile: Profile | None) -> int:
    """Requests at once for one server of ``profile``: its ``max_running_requests`` (at most :data:`PROFILE_CAP`),
    else :data:`DEFAULT_CONCURRENCY`."""
    running = profile.sglang.max_running_requests if profile is not None else None
    return min(running, PROFILE_CAP) if running else DEFAULT_CONCURRENCY


def run(ctx: Context, check_id: str) -> Outcome:
    """Run ``contract.concurrency.<case>`` (one of :func:`check_ids`)."""
    name = check_id.removeprefix("contract.concurrency.")
    case = next(c for c in CASES if c.name == name)
    if case.needs_reasoning and not ctx.reasoning_parser:  # as the case's one-at-a-time rows (contract.run_case)
        return Outcome.skipped("no reasoning parser expected (profile) or reported (/model_info)")
    n = level(ctx)
    exp = _expectation(ctx, case, _history_ids(case.messages))

    def one(k: int) -> Answer | None:
        if ctx.clients.deadline.passed():
            return None
        clients = Clients.open(ctx.clients.root, ctx.clients.api_key, ctx.clients.timeout, ctx.clients.deadline,
                               ctx.clients.limits)
        try:
            worker = dataclasses.replace(ctx, clients=clients)
            return _request(worker, case, list(case.messages), stream=k % 2 == 1, exp=exp)
        finally:
            clients.close()

    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="concurrency") as pool:
        answers = [a for a in pool.map(one, range(n)) if a is not None]
    return verdict(answers, n)


def verdict(answers: list[Answer], n: int) -> Outcome:
    """The outcome over ``answers`` of ``n`` requests sent at once (module docstring)."""
    sent = len(answers)
    if not sent:
        return Outcome.failed(Finding("timeout", f"none of the {n} requests was sent before the run's deadline",
                                      "not attempted"))
    tops = [first(a.findings) for a in answers]
    failed = [f for f in tops if f is not None and f.kind != "model_declined"]
    declined = [f for f in tops if f is not None and f.kind == "model_declined"]
    cut = f"; {sent} of {n} sent before the run's deadline" if sent < n else ""
    if failed:
        kinds = collections.Counter(f.kind for f in failed)
        kind, count = kinds.most_common(1)[0]
        example = next(f for f in failed if f.kind == kind)
        listed = ", ".join(f"{k} {c}" for k, c in kinds.most_common())
        return Outcome.failed(Finding(kind, f"{len(failed)} of {sent} requests sent at once failed "
                                            f"({100 * len(failed) / sent:.1f} %: {listed}); e.g. {example.detail}"
                                            f"{cut}", example.evidence))
    if declined:
        return Outcome.judged([dataclasses.replace(declined[0], detail=f"{len(declined)} of {sent} requests sent "
                                                                       f"at once answered in prose{cut}")])
    return Outcome.passed(f"{sent} requests at once, none failed (0.0 %){cut}")
