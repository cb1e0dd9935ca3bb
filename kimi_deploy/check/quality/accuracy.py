"""``quality.accuracy``: statistical tool-call accuracy over N requests, the way K2VV measures vendors.

K2 Vendor Verifier (``tool_calls_eval.py``, MoonshotAI/K2-Vendor-Verifier): each request body of the dataset is
sent as it is (the run's model); an answer whose ``finish_reason`` is ``tool_calls`` is a *tool-call answer*, and
it is *valid* when every call names a tool of the request and its ``arguments`` parse to a JSON value that
``jsonschema`` validates against that tool's ``parameters``. Schema accuracy = valid / tool-call answers (K2VV's
``successful_tool_call_count / finish_tool_calls``); a call forced by a named ``tool_choice`` that ends with
``stop`` counts as a tool-call answer (OpenAI's API and vLLM end it so). As in K2VV, formats are not checked here
(``jsonschema`` does not by default), so the figure compares with K2VV's published ones; the schema corpus
(:mod:`.conformance`) checks formats.

Reported: requests planned/sent/answered, the count per ``finish_reason``, the tool-call answers, the valid ones,
the schema accuracy with its 95 % interval (:func:`kimi_deploy.check.quality.stats.wilson_interval`), the error
classes (the kit's failure kinds: ``schema_violation``, ``invalid_arguments``, ``unknown_tool``,
``finish_reason_mismatch`` among tool-call answers; ``markup_leak`` for an answer with call markup in its text;
``http_error``, ``server_error``, ``timeout`` ... for requests without an answer) and the verdict against the
threshold (:func:`kimi_deploy.check.quality.stats.below_threshold`).

A case of the dataset the kit cannot send or judge (:mod:`.dataset`: a line over the cap, ``NaN``, a lone
surrogate, a schema invalid under its own draft, a ``$ref`` outside it; or, found while judging, a ``pattern`` that
backtracks catastrophically) is ``dataset_invalid``: listed by line in the report's ``dataset_invalid`` and left out
of every count of the server's (sent, answered, errors, tool-call answers).

Bounded: ``concurrency`` requests in flight (each worker thread has its own clients), and the tier's own deadline
(``deadline_s``, capped by the run's ``--deadline``): requests not sent by then are left out of the sample.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from kimi_deploy.check import integrity, leaks
from kimi_deploy.check import stream as stream_v
from kimi_deploy.check.client import Clients, Deadline
from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome, openai_failure, unreadable
from kimi_deploy.check.quality import dataset as ds
from kimi_deploy.check.quality.settings import QualitySettings
from kimi_deploy.check.quality.stats import Proportion, below_threshold
from kimi_deploy.check.results import clip
from kimi_deploy.check.schemas import Unjudgeable
from kimi_deploy.check.completion_rules import (Finding, Message, check_arguments, completion_problem,
                                        message_from_completion, stream_problem, tool_schemas)

log = logging.getLogger(__name__)

CHECK_ID = "quality.accuracy"

#: Keys of a request body the ``openai`` client takes as arguments; the others go in ``extra_body``.
_OPENAI_KEYS = frozenset(inspect.signature(openai.resources.chat.completions.Completions.create).parameters) \
    - {"self", "extra_headers", "extra_query", "extra_body", "timeout", "model"}

#: The error class of a case the kit cannot send or judge (the dataset's fault, not the server's).
DATASET_INVALID = "dataset_invalid"

#: Share of sent requests that may fail without an answer before the verdict is that failure, not the accuracy.
MAX_ERROR_SHARE = 0.10


@dataclasses.dataclass(frozen=True)
class Sample:
    """One request's outcome: ``finish_reason`` as the answer gave it (``None`` without one, or when the answer
    carried none), ``valid`` (``True``/``False`` for a tool-call answer, ``None`` otherwise), ``kind`` (its error
    class, ``None`` when fine), ``detail``, ``evidence``; ``answered``: the request got an answer a client can
    read (False: an HTTP error, a timeout, an unreadable body: the request is left out of the accuracy)."""

    index: int
    finish_reason: str | None
    valid: bool | None
    kind: str | None = None
    detail: str = ""
    evidence: str = ""
    answered: bool = True
    line: int | None = None

    @property
    def excluded(self) -> bool:
        """The case was the dataset's fault (``dataset_invalid``): left out of the server's counts."""
        return self.kind == DATASET_INVALID
    #: Whether the request asked for reasoning (:func:`kimi_deploy.check.integrity.thinking_on`) and the reasoning
    #: integrity rules the answer broke (:func:`kimi_deploy.check.integrity.judge`), for ``quality.reasoning``.
    thinking: bool | None = None
    breaches: tuple[integrity.Breach, ...] = ()
    #: Whether the request should trigger a call (:func:`expects_call`), for ``quality.certify``'s trigger F1.
    expect_call: bool = True


#: A dataset body's own label of whether a tool call is due (``true``/``false``); never sent to the server.
EXPECT_KEY = "_expect_tool_call"


def expects_call(body: dict[str, Any]) -> bool:
    """Whether ``body`` should trigger a tool call: its :data:`EXPECT_KEY` when a boolean, else ``False`` for
    ``tool_choice`` ``none`` or no tools, else ``True`` (``required``, a named function, or ``auto`` with tools:
    the kit's samples and K2VV's requests are agent turns that act)."""
    label = body.get(EXPECT_KEY)
    if isinstance(label, bool):
        return label
    return bool(body.get("tools")) and body.get("tool_choice") != "none"


def failed(index: int, finding: Finding) -> Sample:
    """The sample of a request that got no usable answer."""
    return Sample(index, None, None, finding.kind, finding.detail, finding.evidence, answered=False)


def classify(index: int, msg: Message, tools: list[dict[str, Any]], named: bool = False,
             validators: dict[str, Any] | None = None, line: int | None = None,
             thinking: bool | None = None) -> Sample:
    """Judge one answer (K2VV's rule, module docstring). ``named``: the request's ``tool_choice`` names a function,
    whose forced call may end with ``finish_reason`` ``stop`` (OpenAI's own API does, and vLLM 0.33.0 follows it:
    :mod:`kimi_deploy.check.completion_rules`): such an answer with calls is a tool-call answer too. ``validators``: the
    tools' validators built when the case was read (:class:`kimi_deploy.check.quality.dataset.Request`); a schema
    found unjudgeable now makes the sample ``dataset_invalid`` (``line``: the case's line). ``thinking``: reasoning
    is due (the sample's ``breaches`` are judged with it)."""
    breaches = tuple(integrity.judge(msg.content, msg.reasoning, finish_reason=msg.finish_reason,
                                     has_calls=bool(msg.tool_calls), thinking=thinking))
    return dataclasses.replace(_classify(index, msg, tools, named, validators, line), thinking=thinking,
                               breaches=breaches)


def _classify(index: int, msg: Message, tools: list[dict[str, Any]], named: bool,
              validators: dict[str, Any] | None, line: int | None) -> Sample:
    if msg.finish_reason == "tool_calls" or (named and msg.finish_reason == "stop" and msg.tool_calls):
        if not msg.tool_calls:
            return Sample(index, msg.finish_reason, False, "finish_reason_mismatch",
                          "finish_reason is tool_calls but tool_calls is empty", clip(msg.content or ""))
        schemas = tool_schemas(tools)
        validators = dict(validators or {})
        for call in msg.tool_calls:
            try:
                found = check_arguments(call, schemas, validators)
            except Unjudgeable as exc:
                return Sample(index, msg.finish_reason, None, DATASET_INVALID,
                              f"the schema of tool {call.name[:60]!r} cannot be judged: {exc}", answered=False,
                              line=line)
            if found:
                return Sample(index, msg.finish_reason, False, found[0].kind, found[0].detail, found[0].evidence)
        return Sample(index, msg.finish_reason, True)
    leak = leaks.scan_message(msg.content, msg.reasoning)
    if leak:
        return Sample(index, msg.finish_reason, None, "markup_leak",
                      f"{leak[0].family} {leak[0].marker!r} in {leak[0].field}: a call returned as text",
                      clip(msg.content or msg.reasoning or ""))
    if msg.tool_calls:
        return Sample(index, msg.finish_reason, None, "finish_reason_mismatch",
                      f"{len(msg.tool_calls)} tool call(s) but finish_reason is {msg.finish_reason!r}")
    return Sample(index, msg.finish_reason, None)


def send(clients: Clients, model: str, request: ds.Request, index: int, reasoning_expected: bool = False) -> Sample:
    """Send ``request`` (a dataset case) with ``clients`` and judge the answer; ``reasoning_expected``: the server
    has a reasoning parser (reasoning is then due unless the request switches thinking off)."""
    body = request.body
    judge = {"validators": request.validators, "line": request.case.line}
    thinking = integrity.thinking_on(body, reasoning_expected)
    expect = expects_call(body)
    body = {k: v for k, v in body.items() if k != EXPECT_KEY}
    stream = bool(body.get("stream"))
    kwargs = {k: v for k, v in body.items() if k in _OPENAI_KEYS}
    extra = {k: v for k, v in body.items() if k not in _OPENAI_KEYS and k != "model"}
    kwargs["model"] = model
    if extra:
        kwargs["extra_body"] = extra
    what = "POST /v1/chat/completions" + (" (stream)" if stream else "")
    tools = body.get("tools") or []
    named = isinstance(body.get("tool_choice"), dict)
    return dataclasses.replace(_send(clients, kwargs, what, stream, tools, named, thinking, judge, index),
                               expect_call=expect)


def _send(clients: Clients, kwargs: dict[str, Any], what: str, stream: bool, tools: list[dict[str, Any]],
          named: bool, thinking: bool | None, judge: dict[str, Any], index: int) -> Sample:
    try:
        if not stream:
            completion = clients.chat(**kwargs)
            data = completion.model_dump(warnings=False) if hasattr(completion, "model_dump") else completion
            problem = completion_problem(data, clip(clients.recorder.last_text))
            if problem is not None:
                return failed(index, problem)
            return classify(index, message_from_completion(data), tools, named, thinking=thinking, **judge)
        for _chunk in clients.chat(**kwargs):
            pass
    except openai.OpenAIError as exc:
        return failed(index, openai_failure(exc, what, streaming=stream, raw=clients.recorder.last_text))
    except (ValueError, TypeError, RecursionError) as exc:
        return failed(index, unreadable(exc, what, clients.recorder.last_body))
    sse = stream_v.parse_sse(clients.recorder.last_text)
    problem: Finding | None = None
    if sse.errors:
        problem = Finding("error_frame", f"the stream carried an error frame: {clip(json.dumps(sse.errors[0]))}",
                          clip(json.dumps(sse.errors[0])))
    problem = problem or stream_problem(sse.frames, clip(clients.recorder.last_text))
    if problem is not None:
        return failed(index, problem)
    return classify(index, stream_v.assemble(sse.frames), tools, named, thinking=thinking, **judge)


def measure(ctx: Context, settings: QualitySettings) -> tuple[dict[str, Any], list[Sample]]:
    """Send ``settings.sample`` requests of the dataset, ``settings.concurrency`` at a time, until done or the
    tier's deadline; returns the report's ``accuracy`` object (see :func:`summary`) and the samples.

    Raises:
        UsageError: the dataset cannot be read (:func:`kimi_deploy.check.quality.dataset.load`).
    """
    data = ds.load(settings.dataset, sample=settings.sample, max_line_bytes=settings.max_line_bytes,
                   max_file_bytes=settings.max_file_bytes)
    repeats = max(1, settings.repeats)
    cases = [case for case in data.sample(settings.sample) for _ in range(repeats)]  # request i: i // repeats
    run_left = ctx.clients.deadline.left()
    seconds = settings.deadline_s if run_left is None else max(0.0, min(settings.deadline_s, run_left))
    deadline = Deadline(seconds, ctx.clients.deadline.clock)
    clock = ctx.clients.deadline.clock
    started = clock()
    lock = threading.Lock()
    queue = iter(enumerate(cases))
    samples: list[Sample] = []

    stop = threading.Event()  # set on an interrupt: no worker takes another request
    reasoning_expected = bool(ctx.reasoning_parser)

    def worker(reader: ds.Reader) -> None:
        clients = Clients.open(ctx.clients.root, ctx.clients.api_key, ctx.clients.timeout, deadline,
                               ctx.clients.limits)
        try:
            while not deadline.passed() and not stop.is_set():
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                index, case = item
                try:
                    sample = send(clients, ctx.model or "", reader.request(case), index, reasoning_expected)
                except ds.CaseError as exc:
                    sample = Sample(index, None, None, DATASET_INVALID, f"line {case.line}: {exc}", answered=False,
                                    line=case.line)
                except Exception as exc:  # noqa: BLE001 - one request's surprise is that request's error class
                    log.debug("quality request %d raised", index, exc_info=True)
                    sample = failed(index, unreadable(exc, "POST /v1/chat/completions", clients.recorder.last_body))
                with lock:
                    samples.append(sample)
        finally:
            clients.close()

    workers = max(1, min(settings.concurrency, len(cases)))
    with data.reader() as reader, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quality") as pool:
        try:
            for future in [pool.submit(worker, reader) for _ in range(workers)]:
                future.result()
        except BaseException:  # Ctrl-C/SIGTERM (the runner reports what finished): the requests in flight end
            stop.set()
            raise
    samples.sort(key=lambda s: s.index)
    out = summary(samples, planned=len(cases), threshold=settings.min_schema_accuracy, dataset=data)
    out.update({"dataset": data.describe(), "concurrency": workers, "repeats": repeats,
                "deadline_s": round(seconds, 3),
                "duration_s": round(clock() - started, 3)})
    return out, samples


def summary(samples: list[Sample], *, planned: int, threshold: float,
            dataset: ds.Dataset | None = None) -> dict[str, Any]:
    """The report's ``accuracy`` object for ``samples`` (shape in report.schema.json, ``$defs/accuracy``);
    ``dataset_invalid`` counts the dataset's invalid lines (``dataset``'s reading pass) and the drawn cases found
    unjudgeable, and lists the first :data:`kimi_deploy.check.quality.dataset.MAX_LISTED_INVALID` by line."""
    excluded = [s for s in samples if s.excluded]
    samples = [s for s in samples if not s.excluded]
    answered = [s for s in samples if s.answered]
    calls = [s for s in samples if s.valid is not None]
    listed = [{"line": i.line, "detail": i.detail} for i in (dataset.invalid if dataset else ())]
    seen = {item["line"] for item in listed}
    for s in excluded:
        if s.line not in seen and len(listed) < ds.MAX_LISTED_INVALID:
            listed.append({"line": s.line, "detail": s.detail})
            seen.add(s.line)
    p = Proportion(sum(1 for s in calls if s.valid), len(calls))
    lo, hi = p.interval
    finish = collections.Counter(s.finish_reason or "none" for s in answered)
    classes = collections.Counter(s.kind for s in samples if s.kind)
    verdict = "no_sample" if not p.n else "fail" if below_threshold(p, threshold) else "pass"
    return {
        "requests": planned, "sent": len(samples), "answered": len(answered),
        "errors": len(samples) - len(answered),
        "finish_reasons": dict(sorted(finish.items())),
        "tool_call_answers": p.n, "valid": p.successes,
        "schema_accuracy": {"estimate": p.estimate, "lower": lo if p.n else None, "upper": hi if p.n else None,
                            "confidence": 0.95, "method": "wilson-score-cc"},
        "threshold": threshold, "verdict": verdict,
        "error_classes": dict(sorted(classes.items())),
        "dataset_invalid": {"lines": (dataset.invalid_count if dataset else 0) + len({s.line for s in excluded}),
                            "samples": len(excluded), "listed": sorted(listed, key=lambda i: i["line"] or 0)},
    }


def outcome(acc: dict[str, Any], samples: list[Sample]) -> Outcome:
    """The check's verdict on :func:`measure`'s result.

    ``fail`` with the most frequent error kind when more than :data:`MAX_ERROR_SHARE` of the sent requests got
    no answer (or all did); ``tool_call_dropped`` when no answer ended with ``tool_calls`` (nothing to measure);
    ``schema_accuracy_low`` when the interval lies below the threshold; else ``pass``.
    """
    p = Proportion(acc["valid"], acc["tool_call_answers"])
    sent, errors = acc["sent"], acc["errors"]
    threshold = acc["threshold"]
    invalid = acc.get("dataset_invalid") or {}
    cut = f"; {sent} of {acc['requests']} sent before the tier's deadline" if sent + invalid.get("samples", 0) \
        < acc["requests"] else ""
    if invalid.get("lines"):
        first = (invalid.get("listed") or [{}])[0]
        cut += (f"; {invalid['lines']} dataset line(s) left out as dataset_invalid (line {first.get('line')}: "
                f"{str(first.get('detail', ''))[:120]})")
    if sent == 0 and invalid.get("samples"):
        first = (invalid.get("listed") or [{}])[0]
        return Outcome.failed(Finding(DATASET_INVALID, f"every drawn case was the dataset's fault "
                                                       f"({invalid['samples']} dataset_invalid; line "
                                                       f"{first.get('line')}: {first.get('detail', '')})",
                                      clip(first.get("detail", ""))))
    if sent == 0:
        return Outcome.failed(Finding("timeout", f"no request was sent before the tier's deadline "
                                                 f"({acc['deadline_s']:g} s)", "not attempted"))
    failures = [s for s in samples if not s.answered]
    if errors and errors > MAX_ERROR_SHARE * sent:
        kind, n = collections.Counter(s.kind for s in failures).most_common(1)[0]
        example = next(s for s in failures if s.kind == kind)
        return Outcome.failed(Finding(kind, f"{errors} of {sent} requests got no usable answer ({n} {kind}: "
                                            f"{example.detail}){cut}", example.evidence))
    if not p.n:
        return Outcome.failed(Finding("tool_call_dropped", f"none of the {acc['answered']} answers ended with "
                                                           f"finish_reason tool_calls (finish reasons: "
                                                           f"{acc['finish_reasons']}): no schema accuracy to "
                                                           f"measure{cut}", clip(acc["error_classes"])))
    classes = ", ".join(f"{k} {n}" for k, n in acc["error_classes"].items())
    text = (f"schema accuracy {p.text()} of finish_reason tool_calls answers; {acc['answered']} of "
            f"{sent} requests answered; threshold {100 * threshold:.2f} %" + (f"; errors: {classes}" if classes
                                                                               else "") + cut)
    if acc["verdict"] == "fail":
        bad = next((s for s in samples if s.valid is False), None)
        return Outcome.failed(Finding("schema_accuracy_low", f"{text}: the whole 95 % interval is below the "
                                                             "threshold", bad.evidence if bad else ""))
    return Outcome.passed(text)


def run(ctx: Context) -> Outcome:
    """Run ``quality.accuracy``; its measurement goes into ``ctx.quality_results["accuracy"]`` for the report."""
    settings = ctx.quality or QualitySettings()
    started = time.monotonic()
    acc, samples = measure(ctx, settings)
    log.debug("quality.accuracy: %d requests in %.1f s", acc["sent"], time.monotonic() - started)
    keep(ctx, acc, samples, settings)
    return outcome(acc, samples)


def keep(ctx: Context, acc: dict[str, Any], samples: list[Sample], settings: QualitySettings) -> None:
    """Put the sample's measurements where the report and the later quality checks read them."""
    ctx.quality_results["accuracy"] = acc
    ctx.quality_results["reasoning"] = reasoning_rates(samples, settings)
    ctx.quality_samples = list(samples)


def reasoning_rates(samples: list[Sample], settings: QualitySettings) -> dict[str, Any]:
    """The report's ``reasoning`` object over the answered ``samples`` (:func:`kimi_deploy.check.integrity.rates`)."""
    answered = [s for s in samples if s.answered]
    return integrity.rates([list(s.breaches) for s in answered], settings.reasoning_bars,
                           thinking_answers=sum(1 for s in answered if s.thinking))
