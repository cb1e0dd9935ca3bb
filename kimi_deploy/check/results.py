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
from kimi_deploy.wire.inputs import DATASET_FILE_BYTES, DATASET_LINE_BYTES
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LINE_BYTES
from kimi_deploy.wire.printable import printable

REPORT_SCHEMA = "kimi-deploy.check/1"

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[str, ...] = ("pass", "warn", "fail", "skip")

#: The fixed vocabulary of failure kinds (issue #5); ``model_declined`` is the one warn kind.
#: Documented in docs/reference/failure-kinds.md; part of the JSON schema.
FAILURE_KINDS: tuple[str, ...] = (
    "unreachable",             # no TCP/HTTP answer at all
    "http_error",              # an unexpected HTTP status below 500 (404 on a route, 401, 2xx where 4xx was due)
    "server_error",            # HTTP 5xx, or a body that is not JSON where JSON was due
    "invalid_response",        # an answer the check could not read: bytes not UTF-8, JSON nested too deep, the
                               # wrong JSON type, no choices/message, an event stream where JSON was due, or an
                               # HTTP exchange broken mid-answer (bad chunk header, body cut short)
    "error_frame",             # a streamed response carried an SSE {"error": ...} frame
    "markup_leak",             # a model-family marker (<|tool_call_begin|>, <think>, <|channel|> ...) in content/reasoning
    "reasoning_leak",          # reasoning returned although thinking was switched off
    "missing_reasoning",       # thinking on, but no reasoning_content/reasoning field
    "tool_call_dropped",       # a call was due and the model produced one, but none reached the client
    "empty_answer",            # text was due, the answer has neither content nor a tool call
    "finish_reason_mismatch",  # finish_reason "tool_calls" without calls, or calls without it (named choice: stop too)
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
    "schema_accuracy_low",     # quality.accuracy: the 95 % interval of schema accuracy lies below the threshold
    "dataset_invalid",         # quality.accuracy: no drawn case could be sent and judged (the dataset's fault)
    "thinking_switch",         # chat_template_kwargs.thinking true/false not honoured (quality.preflight.thinking_*)
    "sampling_defaults",       # the server's default sampling differs from the model's recommended values
    "prompt_tokens_mismatch",  # usage.prompt_tokens differs from the model's own tokenizer and chat template
    "empty_followup",          # contract.followup.*: the answer to a tool result has no content and no call
    "stop_without_calls",      # contract.followup.*: a call was due, the answer ended with stop and no tool_calls
    "wrong_tool_after_round",  # contract.followup.*: from round 2 on, a call to another of the request's tools
    "think_leak",              # quality.reasoning: a think tag or the reasoning in content, over the bar's rate
    "tool_trigger_low",        # quality.certify: the 95 % interval of tool-trigger F1 lies below the bar (0.98)
    "sampling_not_enforced",   # quality.preflight.sampling.required: sampling the model's own API refuses is answered
    "prefix_cache_miss",       # contract.prefix_cache: the same long prompt twice, the second reports 0 cached tokens
    "prefix_cache_mismatch",   # contract.prefix_cache: deterministic inference, the cached prefix changed the answer
)
WARN_KINDS: tuple[str, ...] = ("model_declined",)
ALL_KINDS: tuple[str, ...] = FAILURE_KINDS + WARN_KINDS

#: What to do about each kind: the "what to do" column of docs/reference/failure-kinds.md,
#: as one line. ``{python}`` is the profile's SGLang interpreter and ``{name}`` its service name
#: (placeholders when the run had no profile); :func:`fix_for` fills them in.
FIXES: dict[str, str] = {
    "unreachable": "is the server up? `systemctl status {name}` (during the ~10 min cold start this is expected); "
                   "check host and port",
    "timeout": "the server is overloaded or stuck: `journalctl -u {name}`; raise --timeout (per request) or "
               "--deadline (whole run) for slow generations",
    "http_error": "401/403: pass --api-key-file FILE; 404: check --base-url and --model; a 2xx where a 4xx was "
                  "due: the server does not validate requests (report it upstream)",
    "server_error": "read the evidence and the server's journal (`journalctl -u {name}`); behind a proxy, its "
                    "upstream's error",
    "invalid_response": "the server (or a proxy in front of it) answered something that is not an OpenAI-compatible "
                        "answer: read the evidence, check --base-url points at the server itself, and "
                        "`journalctl -u {name}`; `--debug` shows where reading it failed",
    "error_frame": "read the error frame and `journalctl -u {name}`; one quoting Kimi markup is a server choking on "
                   "a tool-call id: `kimi-deploy patch apply --python {python}`",
    "markup_leak": "launch with --tool-call-parser kimi_k2 --reasoning-parser kimi_k2 (profile: tool_call_parser, "
                   "reasoning_parser), then `kimi-deploy install` and `kimi-deploy restart --wait`",
    "reasoning_leak": "the chat template or reasoning parser ignores chat_template_kwargs.thinking=false: check "
                      "reasoning_parser and the model's chat template",
    "missing_reasoning": "set reasoning_parser = \"kimi_k2\" in the profile (reasoning then no longer lands in "
                         "content), or check that the template pre-fills <think>",
    "tool_call_dropped": "apply the kit's patch series (kimi-k2-tool-call-ids, kimi-k2-canonical-history-ids): "
                         "`kimi-deploy patch apply --python {python}`, then `kimi-deploy restart --wait`; or stop "
                         "the client from rewriting tool-call ids",
    "empty_answer": "with tool_choice none: the server still puts the tools in the prompt, Kimi writes a call and "
                    "the parser swallows it; vLLM: launch with --exclude-tools-when-tool-choice-none; otherwise "
                    "read the server's log (`journalctl -u {name}`) for what the model generated",
    "finish_reason_mismatch": "a parser/serving bug: report it upstream with this evidence; "
                              "`kimi-deploy patch status --python {python}` shows what is applied",
    "invalid_arguments": "a parser bug or model output the parser cannot repair: "
                         "`kimi-deploy patch apply --python {python}`, else report it upstream with this evidence",
    "schema_violation": "usually the model; a truncated or garbled value points at the parser (braces, quotes, "
                        "> 8 KiB): report it upstream with this evidence",
    "unknown_tool": "the parser merged or mangled tool names: `kimi-deploy patch apply --python {python}`, else "
                    "report it upstream",
    "wrong_tool": "the parser attributes a call to another tool of the request (the tool-call id attribution "
                  "bug): `kimi-deploy patch apply --python {python}` (kimi-k2-tool-call-ids), then "
                  "`kimi-deploy restart --wait`",
    "tool_choice_violation": "the server ignores tool_choice: agents relying on it need another server or parser",
    "duplicate_id": "the server's history count is off: `kimi-deploy patch apply --python {python}` "
                    "(kimi-k2-canonical-history-ids), then `kimi-deploy restart --wait`",
    "noncanonical_id": "the model copies this id style next turn and the call is dropped: "
                       "`kimi-deploy patch apply --python {python}`, then `kimi-deploy restart --wait`",
    "stream_shape": "a streaming parser bug that strict clients break on: report it upstream with this evidence",
    "config_mismatch": "the server runs another command line than the profile's: compare `kimi-deploy render "
                       "--profile P --print-command` with /server_info's launch_command; `kimi-deploy install`, "
                       "then `kimi-deploy restart --wait`",
    "model_declined": "model variance, not a server fault; if frequent, check the system prompt and chat template",
    "schema_accuracy_low": "compare with the last good report (`kimi-deploy check compare OLD.json NEW.json`); "
                           "read the error classes: invalid_arguments/unknown_tool point at the parser "
                           "(`kimi-deploy patch status --python {python}`), schema_violation at the model, its "
                           "sampling or the chat template; a change since the last upgrade: roll it back",
    "dataset_invalid": "the dataset's fault, not the server's: fix or drop the lines the report's "
                       "quality.accuracy.dataset_invalid lists (a schema invalid under its own $schema draft, a $ref "
                       "outside the tool's schema, NaN, a lone surrogate, a line over --max-dataset-line-bytes)",
    "thinking_switch": "the server ignores chat_template_kwargs.thinking: launch with --reasoning-parser kimi_k2 "
                       "and the model's own chat template (no --chat-template override), then `kimi-deploy "
                       "restart --wait`; behind a proxy, check that it forwards chat_template_kwargs",
    "sampling_defaults": "serve the model's recommended defaults (temperature 1.0 thinking / 0.6 instant, top_p "
                         "0.95): SGLang --sampling-defaults model with the model's generation_config.json, no "
                         "--preferred-sampling-params overriding them; clients in instant mode send temperature 0.6",
    "prompt_tokens_mismatch": "the server renders prompts differently from the model's chat template (a "
                              "--chat-template override, an old tokenizer, tool declarations rendered "
                              "differently): serve the model's own tokenizer and template, then `kimi-deploy "
                              "restart --wait`",
    "empty_followup": "the model closed its turn right after </think> (MoonshotAI/Kimi-K2 issue 128): turn "
                      "speculative decoding off to see whether it is the cause (profile speculative_algorithm, "
                      "then `kimi-deploy install` and `kimi-deploy restart --wait`), check the reasoning parser "
                      "and chat template are the model's own; an agent sees an empty reply and stops",
    "stop_without_calls": "the model wrote a call the parser did not match, most often because the history holds "
                          "ids in a client's own form (callNNNNN, call_<hex>, toolu_...; sglang issue 25358): "
                          "`kimi-deploy patch apply --python {python}` (kimi-k2-tool-call-ids, "
                          "kimi-k2-canonical-history-ids), then `kimi-deploy restart --wait`; or keep the "
                          "server's ids in the history",
    "prefix_cache_miss": "the prefix cache does not hit: check that the server was not started with "
                         "--disable-radix-cache, and after an upgrade the cache's release notes (SGLang 0.5.21 made "
                         "the Rust prefix cache the default); `journalctl -u {name}`",
    "prefix_cache_mismatch": "a cached prefix changes the answer: a prefix-cache bug; restart with "
                             "--disable-radix-cache to confirm, roll back the upgrade, and report it upstream with "
                             "the evidence",
    "sampling_not_enforced": "clients must send the model's own sampling (check and bench do by default): tell "
                             "them (K2.7-Code: temperature 1.0, top_p 0.95), or enforce it in a proxy in front of "
                             "the server (a LiteLLM hook); SGLang's --preferred-sampling-params only sets defaults",
    "tool_trigger_low": "calls missing where due, or made where none was: read quality.certify in the JSON report "
                        "and quality.accuracy's error classes; dropped calls point at the parser (`kimi-deploy "
                        "patch status --python {python}`), extra ones at the chat template or sampling",
    "think_leak": "the reasoning parser does not split the answer where the template pre-fills <think>: launch "
                  "with --reasoning-parser kimi_k2 (profile reasoning_parser; through a gateway, its own reasoning "
                  "parser must match the model), keep the model's own chat template, then `kimi-deploy restart "
                  "--wait`",
    "wrong_tool_after_round": "the call of a later round went to another tool (sglang issue 25218): compare with "
                              "thinking off and without speculative decoding, `kimi-deploy patch status --python "
                              "{python}`; report it upstream with the evidence",
}

#: The fix of a ``model_declined`` answer cut at ``max_tokens`` (its detail says "until max_tokens").
CUT_AT_MAX_TOKENS_FIX = ("the answer ran to max_tokens before any call or text: a server that always generates max_tokens "
                         "(ignore_eos, benchmarks/synthetic_server.py) cannot show calls; on a real model the "
                         "reasoning outgrew the case's budget (docs/reference/check-ids.md#what-each-case-asks-the-server-to-generate)")


#: The fix of a ``config_mismatch`` from a server that refused tools for want of a parser (its detail says
#: "without a tool-call parser": :func:`kimi_deploy.check.client.no_tool_parser_finding`).
NO_TOOL_PARSER_FIX = ("restart the server with a Kimi tool-call parser: vLLM `--enable-auto-tool-choice "
                      "--tool-call-parser kimi_k2 --reasoning-parser kimi_k2`; SGLang: profile tool_call_parser and "
                      "reasoning_parser = \"kimi_k2\", then `kimi-deploy install` and `kimi-deploy restart --wait`; "
                      "llama.cpp: `--jinja`")


#: The fix of ``quality.accuracy``'s ``tool_call_dropped`` when no answer called a tool at all (its detail says
#: "no schema accuracy to measure"): no id was dropped, so the patch series (:data:`FIXES`) is not the cure; a
#: server without a tool-call parser, or one that ignores ``tool_choice``, is (issue 43).
NO_TOOL_CALL_ANSWER_FIX = ("no answer called a tool, so no tool-call id was dropped: the server answers in prose "
                           "(the quality.schema.* rows show it); " + NO_TOOL_PARSER_FIX)


#: The parts of the ``http_error`` fix, each for the answer its detail names (a fix hints only at the status it
#: explains: a 2xx row got the 401/403 and 404 hints too, issue #30 item 4).
HTTP_ERROR_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("2xx",), "the server does not validate requests (report it upstream)"),
    (("HTTP 401", "HTTP 403"), "pass --api-key-file FILE"),
    (("HTTP 404",), "check --base-url and --model"),
)


def fix_for(kind: str | None, *, python: str | None = None, name: str | None = None, detail: str = "") -> str:
    """The one-line fix for ``kind`` (:data:`FIXES`), with the profile's interpreter and service name
    filled in (``<SGLang python>``/``<name>`` without a profile); ``""`` for no kind or an unknown one.
    ``http_error``: only the part for the status ``detail`` names (:data:`HTTP_ERROR_FIXES`), else all."""
    text = FIXES.get(kind or "", "")
    if kind == "http_error":
        text = next((fix for marks, fix in HTTP_ERROR_FIXES if any(m in detail for m in marks)), text)
    if kind == "model_declined" and "until max_tokens" in detail:
        text = CUT_AT_MAX_TOKENS_FIX
    if kind == "config_mismatch" and "without a tool-call parser" in detail:
        text = NO_TOOL_PARSER_FIX
    if kind == "tool_call_dropped" and "no schema accuracy to measure" in detail:
        text = NO_TOOL_CALL_ANSWER_FIX
    return text.replace("{python}", python or "<SGLang python>").replace("{name}", name or "<name>")


#: Evidence is cut to this many characters (one table line).
EVIDENCE_CHARS = 120

#: A cut moves back to the last space when one is this close to the limit, so a word is not cut in two.
WORD_CHARS = 20


def clip(text: Any, limit: int = EVIDENCE_CHARS) -> str:
    """``text`` as one printable line (:func:`printable`: ``\\n``, ``\\x00``, ``\\ud800``), cut to ``limit``
    characters with an ellipsis; the cut falls after the last whole word when a space is within
    :data:`WORD_CHARS` characters of it (a long token is still cut where the limit falls)."""
    s = printable(str(text))
    if len(s) <= limit:
        return s
    cut = s[: limit - 1]
    space = cut.rfind(" ")
    if s[limit - 1] != " " and space >= limit - 1 - WORD_CHARS:
        cut = cut[:space]
    return cut + "…"


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
        insecure: send the key over plain http to a host that is not local anyway (with a warning);
            without it such a run is refused (:func:`kimi_deploy.wire.apikey.guard_transport`).
        max_body_bytes / max_line_bytes: byte caps on every answer's body and on one SSE line or
            event (:mod:`kimi_deploy.wire.limits`); past one the check fails with the evidence.
        quality: put the ``quality.*`` tier into a run without ``only`` (``--sample``/``--dataset`` set it).
        sample: requests of ``quality.accuracy`` (``None``: the profile's ``[quality] sample``, else
            :data:`kimi_deploy.check.quality.accuracy.DEFAULT_SAMPLE`).
        dataset: a JSONL of chat-completion request bodies (K2VV's format); ``None``: the kit's own samples.
        quality_concurrency: requests of ``quality.accuracy`` in flight at once (``None``: the profile's, else 4).
        quality_deadline: seconds ``quality.accuracy`` may take (``None``: the profile's, else 600); requests
            not sent by then are left out of the sample, and the report says how many were sent.
        min_schema_accuracy: the verdict's threshold, a fraction (``None``: the profile's, else K2VV's SGLang
            figure, :data:`kimi_deploy.check.quality.accuracy.DEFAULT_MIN_SCHEMA_ACCURACY`).
        model_dir: the model's directory on this host (``generation_config.json``, tokenizer, chat template)
            for the pre-flight checks (``None``: the profile's ``model_path`` when it is a directory here).
        sglang_python: SGLang's interpreter for the prompt-token count (``None``: the profile's).
        max_dataset_line_bytes / max_dataset_bytes: caps on the dataset's lines and file
            (:mod:`kimi_deploy.wire.inputs`); a longer line is a ``dataset_invalid`` case.
        repeats: times ``quality.accuracy`` sends each request, for ``quality.certify``'s majority (``None``:
            the profile's ``[quality] repeats``, else 1).
        sampling: ``model`` (the contract's requests carry the model's required sampling when the catalog has one,
            K2.7-Code: temperature 1.0, top_p 0.95; else temperature 0) or ``greedy`` (temperature 0 always).
        concurrency: requests at once of ``contract.concurrency.*`` (``None``: the profile's
            ``max_running_requests``, at most 64, else 8; :func:`kimi_deploy.check.concurrency.level`).
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
    insecure: bool = False
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES
    quality: bool = False
    sample: int | None = None
    dataset: Any = None
    quality_concurrency: int | None = None
    quality_deadline: float | None = None
    min_schema_accuracy: float | None = None
    model_dir: Any = None
    sglang_python: str | None = None
    max_dataset_line_bytes: int = DATASET_LINE_BYTES
    max_dataset_bytes: int = DATASET_FILE_BYTES
    concurrency: int | None = None
    repeats: int | None = None
    sampling: str = "model"


@dataclasses.dataclass
class CheckResult:
    """One check's outcome.

    ``kind`` is one of :data:`FAILURE_KINDS` for ``fail``, ``model_declined`` for ``warn``,
    ``None`` otherwise. ``evidence`` is the offending text, at most :data:`EVIDENCE_CHARS`
    characters; ``detail`` and ``evidence`` are :func:`printable` (a server's control bytes escaped). ``duration_s`` is wall time in seconds. ``attempted`` is ``False`` for a check
    that sent nothing (the server did not answer the health tier, or the run's deadline passed):
    it is ``fail`` with the kind that stopped the run and evidence starting ``not attempted:``.
    ``fix``: what to do, one line (:func:`fix_for`); set on every ``fail`` and ``warn``.
    """

    id: str
    status: Status
    kind: str | None = None
    detail: str = ""
    evidence: str = ""
    duration_s: float = 0.0
    attempted: bool = True
    fix: str = ""

    def __post_init__(self) -> None:
        self.detail = printable(self.detail)  # whatever a server sent, every report can carry the row
        self.evidence = clip(self.evidence) if self.evidence else ""
        if self.status in ("fail", "warn"):  # every failed row says what was seen and what to do
            self.fix = self.fix or fix_for(self.kind, detail=self.detail)
            self.evidence = self.evidence or clip(self.detail)

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "status": self.status, "kind": self.kind, "detail": printable(self.detail),
               "evidence": printable(self.evidence), "duration_s": round(self.duration_s, 4)}
        if self.fix:
            out["fix"] = printable(self.fix)
        return out


@dataclasses.dataclass
class CheckReport:
    """A whole run: where, what server, when, and every selected check's result.

    ``answered`` is ``False`` when the server gave no HTTP answer to the health tier (then every
    other check is not attempted and :attr:`exit_code` is UNREACHABLE). ``interrupted`` names the
    signal that stopped the run (``SIGINT``, ``SIGTERM``); ``results`` then holds the checks that
    finished and ``not_run`` the ids left (the one in flight included).
    """

    base_url: str
    model: str | None
    started_at: _dt.datetime
    duration_s: float = 0.0
    server: dict[str, Any] = dataclasses.field(default_factory=dict)
    results: list[CheckResult] = dataclasses.field(default_factory=list)
    profile: str | None = None
    #: The profile's ``[service] name`` (``None`` without a profile): the ``service`` label of the textfile.
    service: str | None = None
    answered: bool = True
    interrupted: str | None = None
    not_run: list[str] = dataclasses.field(default_factory=list)
    #: What the quality tier measured (``{"accuracy": {...}}``, report.schema.json ``$defs/accuracy``); ``None``
    #: when it did not run.
    quality: dict[str, Any] | None = None
    #: The service's recorded starts (``kimi_deploy.host.start_history.summary``: ``last``, ``medians``,
    #: ``last_budgets``), read by ``check --profile`` from the host's state directory for the textfile; ``None``
    #: without a profile or a record. Not part of the JSON report.
    starts: dict[str, Any] | None = None

    @property
    def unreachable(self) -> bool:
        """The server did not answer at all (``answered`` is False) or refused a connection."""
        return not self.answered or any(r.kind == "unreachable" for r in self.results)

    @property
    def exit_code(self) -> ExitCode:
        """INTERRUPTED (130) when the run was stopped (a partial report), UNREACHABLE (3) when the server
        did not answer, FAILED (1) on any fail, else OK (warns allowed).

        "Did not answer": every health check (or, with none selected, the ``GET /v1/models``
        probe) got no HTTP answer (``unreachable`` or ``timeout``), or any check was refused.
        """
        if self.interrupted:
            return ExitCode.INTERRUPTED
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
        """The ``kimi-deploy.check/1`` document (validates against ``report.schema.json``); every string a
        server or a user gave is :func:`printable`, so the document encodes as UTF-8 whatever they sent."""
        def text(value: Any) -> Any:
            return printable(value) if isinstance(value, str) else value

        return {
            "schema": REPORT_SCHEMA,
            "kimi_deploy_version": __version__,
            "base_url": text(self.base_url),
            "model": text(self.model),
            "profile": text(self.profile),
            "server": {k: text(v) for k, v in self.server.items()},
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "duration_s": round(self.duration_s, 3),
            "exit_code": int(self.exit_code),
            "summary": self.counts(),
            "failures_by_kind": self.failures_by_kind(),
            "checks": [r.to_dict() for r in self.results],
            "interrupted": {"signal": self.interrupted, "not_run": list(self.not_run)} if self.interrupted else None,
            **({"quality": self.quality} if self.quality else {}),
        }
