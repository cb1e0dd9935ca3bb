"""Response validators: what every chat completion must hold, streamed or not.

Rules (issue #5; OpenAI's Chat Completions reference for the shapes, MoonshotAI/Kimi-K2's
tool_call_guidance.md for Kimi's):
no marker in content or reasoning; finish_reason ``tool_calls`` iff non-empty ``tool_calls``, except
that a call forced by a named ``tool_choice`` may end with ``stop`` (OpenAI's own API does, streamed
and not, while ``required`` ends with ``tool_calls``: measured against gpt-4o in vLLM PR #25054, "Align
finish_reason when tool is called with OpenAI", and kept by vLLM 0.33.0 ``resolve_finish_reason`` "for
which OpenAI reports stop"; any other finish_reason, ``length`` included, still fails); text where text
is due (no call allowed, or either allowed): an answer with neither content (``null``, ``""`` or
whitespace; reasoning is not content) nor calls is ``empty_answer``, or ``model_declined`` (warn)
when it ran until ``max_tokens`` (the case's budget, not the server, but never a pass); a due call
answered in prose is ``model_declined`` (warn) only under ``tool_choice`` ``auto``, and
``tool_choice_violation`` where the request forced a call (``required`` or named: :func:`forced_choice`);
each call names a requested tool and its ``arguments`` string parses to a JSON object valid
against that tool's ``parameters`` schema as written (JSON Schema through :mod:`kimi_deploy.check.schemas`:
offline, bounded regexes, the schema's own draft; ``false`` rejects every call); ids
unique across the conversation and in the form the server's parser mints (:mod:`kimi_deploy.tool_ids`):
``functions.NAME:N`` on ``kimi_k2``, ``NAME:N`` on ``kimi_k3`` (SGLang 0.5.23
``serving_chat._process_tool_call_id``); reasoning present with thinking on
(``reasoning_content`` as SGLang names it, or ``reasoning`` as vLLM does) and absent with
thinking off.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from kimi_deploy.check import leaks
from kimi_deploy.check.schemas import MAX_INSTANCE_DEPTH, compile_schema, depth, iter_errors
from kimi_deploy.check.results import clip
from kimi_deploy.wire.limits import parse_json
from kimi_deploy.tool_ids import ID_FORMATS, id_format

#: Kimi K2's canonical id (tool-call-failures.md): functions.NAME:N, N a conversation-wide counter.
CANONICAL_KIMI_ID = ID_FORMATS["kimi_k2"].pattern  # fullmatch: no trailing newline

#: Most telling kind first: a check reports the first finding in this order.
PRIORITY: tuple[str, ...] = (
    "unreachable", "timeout", "error_frame", "server_error", "invalid_response", "http_error", "wrong_tool",
    "markup_leak", "think_leak", "wrong_tool_after_round", "stop_without_calls", "empty_followup",
    "tool_call_dropped", "empty_answer", "finish_reason_mismatch", "unknown_tool", "invalid_arguments",
    "schema_violation", "tool_choice_violation", "duplicate_id", "noncanonical_id",
    "reasoning_leak", "missing_reasoning", "stream_shape", "config_mismatch", "thinking_switch",
    "sampling_defaults", "prompt_tokens_mismatch", "schema_accuracy_low", "tool_trigger_low", "sampling_not_enforced",
    "prefix_cache_mismatch", "prefix_cache_miss", "dataset_invalid",
    "model_declined",
)


def forced_choice(exp: "Expectation") -> bool:
    """True when the request forces a call: ``tool_choice`` ``required`` or a named function (OpenAI API
    ``tool_choice``). Only under ``auto`` may the model decline (``model_declined``, a warning)."""
    return exp.choice == "required" or isinstance(exp.choice, dict) or exp.named is not None


def _shown_choice(exp: "Expectation") -> str:
    return repr(exp.choice) if isinstance(exp.choice, str) else f"naming {exp.named or 'a function'}"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One violated rule: ``kind`` (failure vocabulary), a sentence, the offending text.

    ``cause``: a root cause (a malformed stream) that makes other findings of the same answer
    follow (a call with no name, invalid arguments); it is reported before them whatever its kind.
    """

    kind: str
    detail: str
    evidence: str = ""
    cause: bool = False


def first(findings: list[Finding]) -> Finding | None:
    """The finding to report: a root cause (``cause``) first, then the lowest :data:`PRIORITY` index."""
    if not findings:
        return None
    return min(findings, key=lambda f: (not f.cause, PRIORITY.index(f.kind) if f.kind in PRIORITY
                                        else len(PRIORITY)))


@dataclasses.dataclass
class ToolCall:
    """A returned call: ``id``, function ``name``, ``arguments`` as sent (a string, or not)."""

    id: str | None
    name: str | None
    arguments: Any


@dataclasses.dataclass
class Message:
    """The parts of one choice a client acts on, from a completion or an assembled stream."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    completion_tokens: int | None = None


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (``object``, ``array``, ``string`` ...)."""
    for kind, name in ((dict, "an object"), (list, "an array"), (str, "a string"), (bool, "a boolean"),
                       ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def completion_problem(data: Any, evidence: str = "") -> Finding | None:
    """``invalid_response`` when ``data`` (a parsed non-streamed answer) is not a ``chat.completion``
    a client can read: not a JSON object, no ``choices`` array, an empty one, or a first choice
    without a ``message`` object (OpenAI API: ``choices[].message``). ``None`` when it is.

    ``evidence``: the raw body, shown when the answer is wrong (cut by the caller).
    """
    if not isinstance(data, dict):
        what = "text, not JSON" if isinstance(data, str) else f"JSON {_json_type(data)}"
        return Finding("invalid_response", f"the answer is {what}: not a chat.completion object", evidence)
    choices = data.get("choices")
    if "choices" not in data:
        return Finding("invalid_response", "the answer has no choices (a chat.completion object holds an array "
                                           "of them)", evidence)
    if not isinstance(choices, list) or not choices:
        shown = "an empty array" if isinstance(choices, list) else _json_type(choices)
        return Finding("invalid_response", f"choices is {shown}, not an array with at least one choice", evidence)
    if not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        return Finding("invalid_response", "choices[0] has no message object", evidence)
    return None


def stream_problem(frames: list[Any], evidence: str = "") -> Finding | None:
    """``invalid_response`` when the ``chat.completion.chunk`` frames of a stream carry no choice a client
    can read: a ``choices`` that is not an array of objects (each with a ``delta`` object when it has one),
    or no choice in any frame. ``None`` otherwise.
    """
    seen = False
    for frame in frames:
        choices = frame.get("choices") if isinstance(frame, dict) else None
        if choices is None:
            continue
        if not isinstance(choices, list):
            return Finding("invalid_response", f"a chunk's choices is {_json_type(choices)}, not an array", evidence)
        if not all(isinstance(c, dict) and isinstance(c.get("delta", {}), dict) for c in choices):
            return Finding("invalid_response", "a chunk's choices hold something other than choice objects with "
                                               "a delta object", evidence)
        seen = seen or bool(choices)
    if not seen:
        return Finding("invalid_response", f"none of the stream's {len(frames)} chunk(s) carried a choice",
                       evidence)
    return None


def message_from_completion(data: dict[str, Any]) -> Message:
    """A :class:`Message` from a ``chat.completion`` object (dict, OpenAI API shape), first choice.

    Accepts ``reasoning_content`` (SGLang) or ``reasoning`` (vLLM). Check the shape with
    :func:`completion_problem` first: a missing choice or message reads here as an empty message.
    """
    choice = (data.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    calls = [ToolCall(tc.get("id"), (tc.get("function") or {}).get("name"),
                      (tc.get("function") or {}).get("arguments"))
             for tc in (msg.get("tool_calls") or [])]
    usage = data.get("usage") or {}
    return Message(content=msg.get("content"), reasoning=msg.get("reasoning_content") or msg.get("reasoning"),
                   tool_calls=calls, finish_reason=choice.get("finish_reason"),
                   completion_tokens=usage.get("completion_tokens"))


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What a request allows and demands.

    Args:
        tools: the request's ``tools`` (OpenAI shape: ``{"type": "function", "function": {...}}``).
        call: ``none`` (no call allowed), ``one`` or ``some`` (at least one), ``two`` (at least two
            in one turn: parallel calls), ``any`` (either).
        choice: the request's ``tool_choice`` (for messages only).
        named: the one function name allowed (named ``tool_choice``).
        thinking: ``True`` reasoning required, ``False`` reasoning forbidden, ``None`` not checked.
        id_parser: the server's tool-call parser: ids must be in the form it mints
            (:func:`kimi_deploy.tool_ids.id_format`; no rule for parsers without one).
        kimi_ids: shorthand for ``id_parser="kimi_k2"`` (ids ``functions.NAME:N``).
        history_ids: ids already used in the conversation.
    """

    tools: tuple[dict[str, Any], ...] = ()
    call: Literal["none", "one", "two", "some", "any"] = "any"
    choice: Any = None
    named: str | None = None
    thinking: bool | None = None
    kimi_ids: bool = False
    history_ids: tuple[str, ...] = ()
    id_parser: str | None = None


def tool_schemas(tools: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, Any]:
    """``name -> parameters schema`` of OpenAI-shaped tools, as written (absent or ``null``:
    ``{"type": "object"}``; ``false`` stays ``false``: no arguments are valid)."""
    out = {}
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters")
        out[fn["name"]] = {"type": "object"} if params is None else params
    return out


def check_arguments(call: ToolCall, schemas: dict[str, Any],
                    validators: dict[str, Any] | None = None) -> list[Finding]:
    """``unknown_tool``, ``invalid_arguments`` or ``schema_violation`` for one call (empty: fine).

    ``validators``: a cache of one schema validator per tool name, shared by the calls of one answer (building
    one per call made 50,000 calls cost tens of seconds), or built ahead by the caller
    (:func:`kimi_deploy.check.schemas.compile_schema`).

    Raises:
        kimi_deploy.check.schemas.Unjudgeable: the tool's schema cannot be judged (the dataset's fault, not the
            answer's): a ``$ref`` outside it, a regex that backtracks without end, a schema that loops.
    """
    if call.name not in schemas:
        return [Finding("unknown_tool", f"call names {call.name!r}, not one of the request's tools "
                                        f"({', '.join(sorted(schemas)) or 'none'})", clip(call.name))]
    if not isinstance(call.arguments, str):
        return [Finding("invalid_arguments", f"arguments of {call.name} is a {type(call.arguments).__name__}, "
                                             "not a string (OpenAI API: a JSON-encoded string)",
                        clip(call.arguments))]
    try:
        args = parse_json(call.arguments)
    except ValueError as exc:
        why = f"{exc.msg} at {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        return [Finding("invalid_arguments", f"arguments of {call.name} is not JSON ({why})",
                        clip(call.arguments))]
    if not isinstance(args, dict):
        return [Finding("invalid_arguments", f"arguments of {call.name} is JSON {type(args).__name__}, "
                                             "not an object", clip(call.arguments))]
    if depth(args, MAX_INSTANCE_DEPTH) > MAX_INSTANCE_DEPTH:
        return [Finding("schema_violation", f"arguments of {call.name} are nested over {MAX_INSTANCE_DEPTH} levels "
                                            "deep, deeper than the kit validates", clip(call.arguments))]
    validators = {} if validators is None else validators
    validator = validators.get(call.name)
    if validator is None:
        validator = validators[call.name] = compile_schema(schemas[call.name])
    errors = sorted(iter_errors(validator, args),
                    key=lambda e: [(isinstance(p, str), str(p)) for p in e.absolute_path])
    if errors:
        err = errors[0]
        where = "/".join(map(str, err.absolute_path)) or "(root)"
        return [Finding("schema_violation", f"arguments of {call.name} violate its schema at {where}: "
                                            f"{err.message}", clip(call.arguments))]
    return []


def check_message(msg: Message, exp: Expectation) -> list[Finding]:
    """Every rule :class:`Message` breaks under :class:`Expectation` (empty: it passes).

    A due call that is missing is ``tool_call_dropped`` when the client got nothing to read
    (empty content although tokens were generated, or finish_reason ``tool_calls`` with no
    call); with clean prose in ``content`` it is ``model_declined`` (the model chose not to
    call, which is not a server fault) where ``tool_choice`` lets it, else ``tool_choice_violation``.
    """
    out: list[Finding] = []
    found = leaks.scan_message(msg.content, msg.reasoning)
    if found:
        leak = found[0]
        text = msg.content if leak.field == "content" else msg.reasoning
        out.append(Finding("markup_leak", f"{leak.family} {leak.marker!r} in {leak.field}"
                                          + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""),
                           clip(leak.excerpt(text or ""))))
    calls = msg.tool_calls
    if msg.finish_reason == "tool_calls" and not calls:
        out.append(Finding("finish_reason_mismatch", "finish_reason is tool_calls but tool_calls is empty",
                           clip(msg.content or "")))
    elif calls and msg.finish_reason != "tool_calls" and not (exp.named and msg.finish_reason == "stop"):
        out.append(Finding("finish_reason_mismatch",
                           f"{len(calls)} tool call(s) but finish_reason is {msg.finish_reason!r}",
                           clip(calls[0].name)))
    due = exp.call in ("one", "two", "some")
    if due and not calls:
        content = (msg.content or "").strip()
        if found and any(x.field == "content" for x in found):
            pass  # markup_leak already says why
        elif not content or msg.finish_reason == "tool_calls":
            out.append(Finding("tool_call_dropped", "a tool call was due, the model generated "
                               f"{msg.completion_tokens if msg.completion_tokens is not None else 'some'} tokens, "
                               f"but the client got no call (finish_reason {msg.finish_reason!r}, "
                               f"content {clip(content, 40)!r})",
                               clip(msg.content or f"finish_reason={msg.finish_reason}; completion_tokens="
                                                   f"{msg.completion_tokens}; no tool_calls, empty content")))
        elif forced_choice(exp):
            # tool_choice required or named: the server constrains decoding to a call (SGLang 0.5.23
            # serving_chat.py builds a JSON-schema/EBNF constraint from it; OpenAI API: "the model must call"), so
            # prose is the server ignoring tool_choice, not a model's choice
            out.append(Finding("tool_choice_violation", f"tool_choice {_shown_choice(exp)} forced a call; the answer "
                               f"has none, only prose (finish_reason {msg.finish_reason!r})", clip(content)))
        else:
            cut = " until max_tokens (finish_reason 'length'; not retried)" if msg.finish_reason == "length" else ""
            out.append(Finding("model_declined", f"a tool call was due; the model answered in prose{cut}",
                               clip(content)))
    text_due = exp.call in ("none", "any") and not calls and not (msg.content or "").strip() and not found
    if text_due and msg.finish_reason == "length":
        tokens = msg.completion_tokens if msg.completion_tokens is not None else "some"
        out.append(Finding("model_declined", "text was due; the answer ran until max_tokens with no content "
                           f"(finish_reason 'length', {tokens} completion tokens; not retried)",
                           clip(msg.reasoning or f"finish_reason=length; content={msg.content!r}")))
    elif text_due and msg.finish_reason != "tool_calls":
        why = (f" with tool_choice {exp.choice!r} and tools in the request: most likely the server rendered the tools and "
               "its parser swallowed the call the model wrote" if exp.tools and exp.choice == "none" else "")
        tokens = msg.completion_tokens if msg.completion_tokens is not None else "some"
        out.append(Finding("empty_answer", f"text was due but the answer has no content and no tool call{why} "
                           f"(finish_reason {msg.finish_reason!r}, {tokens} completion tokens)",
                           clip(f"finish_reason={msg.finish_reason}; completion_tokens={msg.completion_tokens}; "
                                f"content={msg.content!r}; no tool_calls")))
    if exp.call == "two" and calls and len(calls) < 2:
        out.append(Finding("tool_call_dropped", f"two calls were due in one turn, got {len(calls)}",
                           clip(", ".join(str(c.name) for c in calls))))
    if exp.call == "none" and calls:
        out.append(Finding("tool_choice_violation", f"tool_choice {exp.choice!r} allows no call, got "
                           f"{len(calls)}", clip(", ".join(str(c.name) for c in calls))))
    schemas = tool_schemas(exp.tools)
    validators: dict[str, Any] = {}
    for call in calls:
        out.extend(check_arguments(call, schemas, validators))
        if exp.named and call.name != exp.named and call.name in schemas:
            out.append(Finding("tool_choice_violation", f"tool_choice names {exp.named}, the call is {call.name}",
                               clip(call.name)))
    seen = set(exp.history_ids)
    ids = id_format(exp.id_parser or ("kimi_k2" if exp.kimi_ids else None))
    for call in calls:
        if not call.id:
            out.append(Finding("stream_shape", f"call {call.name} has no id", ""))
            continue
        if call.id in seen:
            out.append(Finding("duplicate_id", f"id {call.id!r} is already used in this conversation",
                               clip(call.id)))
        seen.add(call.id)
        if ids and not ids.matches(call.id):
            out.append(Finding("noncanonical_id", f"{ids.parser} server returned id {call.id!r}, not {ids.form}",
                               clip(call.id)))
    if exp.thinking is True and not (msg.reasoning or "").strip():
        out.append(Finding("missing_reasoning", "thinking is on but the message has no reasoning_content/reasoning",
                           clip(msg.content or "")))
    if exp.thinking is False and (msg.reasoning or "").strip():
        out.append(Finding("reasoning_leak", "chat_template_kwargs.thinking=false but reasoning was returned",
                           clip(msg.reasoning)))
    return out
