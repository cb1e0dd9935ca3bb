"""One check's verdict, as every tier returns it: :class:`Outcome`.

The ``health.*``/``config.*`` (:mod:`.health`), ``parser.*`` (:mod:`.parser`) and ``contract.*``
(:mod:`.contract`) checks all return an :class:`Outcome`; :mod:`.runner` adds the check id and the
duration to make a :class:`kimi_deploy.check.results.CheckResult` row of it. Also here: the findings for an
answer the check could not read (``invalid_response``): :func:`broken_exchange`, :func:`unreadable`; and
:func:`chat_once`, one non-streamed request whose failure is already such a finding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import httpx
import openai

from kimi_deploy.check.client import openai_finding, transport_finding
from kimi_deploy.check.results import EVIDENCE_CHARS, Status, clip, clip_body
from kimi_deploy.check.completion_rules import Finding, completion_problem, first

if TYPE_CHECKING:  # annotations only: the context imports the client, not this module
    from kimi_deploy.check.context import Context


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one check found: ``status`` (``pass``/``warn``/``fail``/``skip``), a one-sentence ``detail``,
    and for ``fail``/``warn`` the ``kind`` (:data:`kimi_deploy.check.results.FAILURE_KINDS`, or
    ``model_declined``) and the offending text as ``evidence``.

    Build it with :meth:`passed`, :meth:`skipped`, :meth:`failed` (one finding) or :meth:`judged`
    (every finding of an answer: the status follows from the most telling one).
    """

    status: Status
    detail: str = ""
    kind: str | None = None
    evidence: str = ""

    @classmethod
    def passed(cls, detail: str) -> Outcome:
        return cls("pass", detail)

    @classmethod
    def skipped(cls, detail: str) -> Outcome:
        return cls("skip", detail)

    @classmethod
    def failed(cls, finding: Finding) -> Outcome:
        """``fail`` with ``finding``'s kind, detail and evidence."""
        return cls.judged([finding])

    @classmethod
    def judged(cls, findings: Iterable[Finding], detail: str = "") -> Outcome:
        """The verdict on an answer's ``findings``: ``pass`` with ``detail`` when there are none; else the
        most telling one (:func:`kimi_deploy.check.completion_rules.first`) decides: ``warn`` for
        ``model_declined``, ``fail`` otherwise, its detail followed by the other kinds seen
        (``" (also: markup_leak, stream_shape)"``)."""
        findings = list(findings)
        top = first(findings)
        if top is None:
            return cls("pass", detail)
        others = sorted({f.kind for f in findings} - {top.kind})
        text = top.detail + (f" (also: {', '.join(others)})" if others else "")
        return cls("warn" if top.kind == "model_declined" else "fail", text, top.kind, top.evidence)


#: httpcore's message when a connection closed before any byte of a response (``httpcore/_sync/http11.py``):
#: no answer at all, so it stays ``unreachable``.
NO_RESPONSE = "without sending a response"


def broken_exchange(exc: BaseException, what: str) -> Finding | None:
    """``invalid_response`` when ``exc`` (or the exception the ``openai`` client wrapped in it) is an HTTP
    protocol error once the server had begun to answer: a bad status line or chunk header, a body cut
    short of its length (``httpx.ProtocolError``). ``None`` for anything else, and for a connection
    closed before any response (that is no answer: ``unreachable``).

    The server answered, so this is a broken answer and not an unreachable server: the run goes on and
    exits 1, not 3.
    """
    cause = exc if isinstance(exc, httpx.ProtocolError) else exc.__cause__ or exc.__context__
    if not isinstance(cause, httpx.ProtocolError) or NO_RESPONSE in str(cause):
        return None
    return Finding("invalid_response", f"{what}: the HTTP exchange broke mid-answer ({type(cause).__name__}: "
                                       f"{clip(cause, 200)})", clip(cause))


def transport_failure(exc: httpx.TransportError, what: str) -> Finding:
    """The finding for a transport error of ``what`` (``GET /health``): :func:`broken_exchange`, else
    :func:`kimi_deploy.check.client.transport_finding` (``unreachable``/``timeout``)."""
    return broken_exchange(exc, what) or transport_finding(exc, what)


def openai_failure(exc: Exception, what: str, *, streaming: bool, raw: str = "") -> Finding:
    """The finding for an error the ``openai`` client raised: :func:`broken_exchange`, else
    :func:`kimi_deploy.check.client.openai_finding`."""
    return broken_exchange(exc, what) or openai_finding(exc, streaming=streaming, raw=raw)


def unreadable(exc: BaseException, what: str | None = None, body: bytes | bytearray = b"") -> Finding:
    """``invalid_response`` for an answer the check could not read (``UnicodeDecodeError``,
    ``RecursionError`` on JSON nested too deep, a wrong type where an object was due ...).

    ``what``: the request (``POST /v1/chat/completions``), when known. ``body``: the raw bytes of the
    answer, when known; its start, with bytes that are not UTF-8 written as ``\\xNN``, is the evidence
    (else the exception's text).
    """
    shown = bytes(body[:4 * EVIDENCE_CHARS]).decode("utf-8", "backslashreplace") if body else ""
    return Finding("invalid_response", f"the answer{f' to {what}' if what else ''} could not be read "
                                       f"({type(exc).__name__}: {clip(exc, 200)})",
                   clip_body(shown) if shown else clip(f"{type(exc).__name__}: {exc}"))


def chat_once(ctx: Context, **kwargs: Any) -> tuple[dict[str, Any] | None, Finding | None]:
    """One non-streamed ``POST /v1/chat/completions`` of ``kwargs`` (the served model added): ``(completion dict,
    None)``, or ``(None, finding)`` when the request failed or the answer is not a completion a client can read
    (:func:`openai_failure`, :func:`unreadable`, :func:`kimi_deploy.check.completion_rules.completion_problem`)."""
    what = "POST /v1/chat/completions"
    try:
        completion = ctx.clients.chat(model=ctx.model, **kwargs)
    except openai.OpenAIError as exc:
        return None, openai_failure(exc, what, streaming=False, raw=ctx.clients.recorder.last_text)
    except (ValueError, TypeError, RecursionError) as exc:
        return None, unreadable(exc, what, ctx.clients.recorder.last_body)
    data = completion.model_dump(warnings=False) if hasattr(completion, "model_dump") else completion
    problem = completion_problem(data, clip_body(ctx.clients.recorder.last_text))
    return (None, problem) if problem is not None else (data, None)
