"""Result types of ``kimi-deploy check``: options, one result per check, the report.

The JSON form of :class:`CheckReport` is the versioned document ``kimi-deploy.check/1``,
described by ``report.schema.json`` next to this module (``kimi_deploy.paths.check_report_schema``).
"""

from __future__ import annotations

import dataclasses
import json
import datetime as _dt
from collections import Counter
from typing import Any, Literal

from kimi_deploy import __version__
from kimi_deploy.errors import ExitCode

REPORT_SCHEMA = "kimi-deploy.check/1"

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[str, ...] = ("pass", "warn", "fail", "skip")

#: The fixed vocabulary of failure kinds (issue #5); ``model_declined`` is the one warn kind.
#: Documented in production.md ("Reading a failed check"); part of the JSON schema.
FAILURE_KINDS: tuple[str, ...] = (
    "unreachable",             # no TCP/HTTP answer at all
    "http_error",              # an unexpected HTTP status below 500 (404 on a route, 401, 2xx where 4xx was due)
    "server_error",            # HTTP 5xx, or a body that is not JSON where JSON was due
    "error_frame",             # a streamed response carried an SSE {"error": ...} frame
    "markup_leak",             # a model-family marker (<|tool_call_begin|>, <think>, <|channel|> ...) in content/reasoning
    "reasoning_leak",          # reasoning returned although thinking was switched off
    "missing_reasoning",       # thinking on, but no reasoning_content/reasoning field
    "tool_call_dropped",       # a call was due and the model produced one, but none reached the client
    "finish_reason_mismatch",  # finish_reason "tool_calls" without calls, or calls without it
    "invalid_arguments",       # arguments is not a string holding a JSON object
    "schema_violation",        # arguments do not validate against the tool's JSON schema
    "unknown_tool",            # a call names a tool the request did not offer
    "wrong_tool",              # a call given to a tool of the request the model did not name (parser.* tier)
    "tool_choice_violation",   # tool_choice none/required/named not honoured
    "duplicate_id",            # a tool-call id already used in the conversation
    "noncanonical_id",         # kimi_k2 servers must return functions.NAME:N ids
    "stream_shape",            # [DONE] missing, finish_reason repeated, index gaps, id/name resent, args differ
    "config_mismatch",         # a running setting differs from the profile (parsers, speculative, TP, model name)
    "timeout",                 # no answer within --timeout seconds, or the run's --deadline passed
)
WARN_KINDS: tuple[str, ...] = ("model_declined",)
ALL_KINDS: tuple[str, ...] = FAILURE_KINDS + WARN_KINDS

#: Evidence is cut to this many characters (one table line).
EVIDENCE_CHARS = 120


def clip(text: Any, limit: int = EVIDENCE_CHARS) -> str:
    """``text`` as one line, cut to ``limit`` characters with an ellipsis."""
    s = str(text).replace("\r", "\\r").replace("\n", "\\n")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def clip_body(body: Any, limit: int = EVIDENCE_CHARS) -> str:
    """An HTTP body as evidence: JSON re-serialised compactly, every whitespace run (newlines of an
    HTML page) collapsed to one space, cut to ``limit`` characters with an ellipsis."""
    text = json.dumps(body, ensure_ascii=False) if isinstance(body, (dict, list)) else str(body)
    return clip(" ".join(text.split()), limit)


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """What to check and how; every field has the CLI option of the same name.

    Args:
        base_url: server root (``http://HOST:PORT``; a trailing ``/v1`` is accepted). ``None``:
            from the profile (``Profile.base_url``).
        model: served model name for requests. ``None``: the profile's served name, else the
            first model ``/v1/models`` lists.
        api_key: bearer key. ``None``: none (or the profile's ``api_key_file`` when readable).
        profile: a profile path or a loaded :class:`kimi_deploy.profile.Profile`; gives expected values.
        only / skip: shell-style globs over check ids (``health.*``, ``contract.id_roundtrip.*``).
        timeout: seconds per HTTP request.
        repeat: retries of a call check when the model answered in clean prose (then ``warn``).
        deadline: seconds the whole run may take (``None``: unbounded). Every request's timeout
            is capped by the time left; checks not started by then are ``fail``/``timeout``,
            not attempted.
    """

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    profile: Any = None
    only: tuple[str, ...] | list[str] = ()
    skip: tuple[str, ...] | list[str] = ()
    timeout: float = 30.0
    repeat: int = 2
    deadline: float | None = None


@dataclasses.dataclass
class CheckResult:
    """One check's outcome.

    ``kind`` is one of :data:`FAILURE_KINDS` for ``fail``, ``model_declined`` for ``warn``,
    ``None`` otherwise. ``evidence`` is the offending text, at most :data:`EVIDENCE_CHARS`
    characters. ``duration_s`` is wall time in seconds. ``attempted`` is ``False`` for a check
    that sent nothing (the server did not answer the health tier, or the run's deadline passed):
    it is ``fail`` with the kind that stopped the run and evidence starting ``not attempted:``.
    """

    id: str
    status: Status
    kind: str | None = None
    detail: str = ""
    evidence: str = ""
    duration_s: float = 0.0
    attempted: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "kind": self.kind, "detail": self.detail,
                "evidence": self.evidence, "duration_s": round(self.duration_s, 4)}


@dataclasses.dataclass
class CheckReport:
    """A whole run: where, what server, when, and every selected check's result.

    ``answered`` is ``False`` when the server gave no HTTP answer to the health tier (then every
    other check is not attempted and :attr:`exit_code` is UNREACHABLE).
    """

    base_url: str
    model: str | None
    started_at: _dt.datetime
    duration_s: float = 0.0
    server: dict[str, Any] = dataclasses.field(default_factory=dict)
    results: list[CheckResult] = dataclasses.field(default_factory=list)
    profile: str | None = None
    answered: bool = True

    @property
    def unreachable(self) -> bool:
        """The server did not answer at all (``answered`` is False) or refused a connection."""
        return not self.answered or any(r.kind == "unreachable" for r in self.results)

    @property
    def exit_code(self) -> ExitCode:
        """UNREACHABLE (3) when the server did not answer, FAILED (1) on any fail, else OK (warns allowed).

        "Did not answer": every health check (or, with none selected, the ``GET /v1/models``
        probe) got no HTTP answer (``unreachable`` or ``timeout``), or any check was refused.
        """
        if self.unreachable:
            return ExitCode.UNREACHABLE
        if any(r.status == "fail" for r in self.results):
            return ExitCode.FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        """Number of checks per status (every status present, 0 when none)."""
        c = Counter(r.status for r in self.results)
        return {s: c.get(s, 0) for s in STATUSES}

    def failures_by_kind(self) -> dict[str, int]:
        """Number of failed (and warned) checks per kind, every kind of :data:`ALL_KINDS` present."""
        c = Counter(r.kind for r in self.results if r.status in ("fail", "warn") and r.kind)
        return {k: c.get(k, 0) for k in ALL_KINDS}

    def to_json(self) -> dict[str, Any]:
        """The ``kimi-deploy.check/1`` document (validates against ``report.schema.json``)."""
        return {
            "schema": REPORT_SCHEMA,
            "kimi_deploy_version": __version__,
            "base_url": self.base_url,
            "model": self.model,
            "profile": self.profile,
            "server": dict(self.server),
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "duration_s": round(self.duration_s, 3),
            "exit_code": int(self.exit_code),
            "summary": self.counts(),
            "failures_by_kind": self.failures_by_kind(),
            "checks": [r.to_dict() for r in self.results],
        }
