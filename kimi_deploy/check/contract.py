"""The ``contract.*`` tier: chat completions through the official ``openai`` client, as agents send them.

Every case runs non-streaming (``contract.<case>.nonstream``) and streaming
(``contract.<case>.stream``) at temperature 0 (a model whose own API requires other sampling gets that:
:attr:`kimi_deploy.check.context.Context.sampling`); every response goes through the leak scanner
and the response validators, every stream also through the stream-shape validator. A case
whose call is due but whose model answers in clean prose is retried up to ``repeat`` times,
then reported ``warn``/``model_declined``: model variance is not a server fault.

The id round trip (``contract.id_roundtrip.<style>``) replays a conversation whose history
carries a tool-call id in one of the styles clients send back (tool-call-failures.md items 2
and 4): Kimi copies that style into its next call, and SGLang 0.5.23's ``kimi_k2`` parser
silently drops ids it does not recognise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import openai

from kimi_deploy.check import stream as stream_v
from kimi_deploy.check.client import openai_finding, status_kind, status_label
from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome, openai_failure, unreadable
from kimi_deploy.check.results import clip, clip_body
from kimi_deploy.check.completion_rules import (Expectation, Finding, Message, check_message, completion_problem, first,
                                        message_from_completion, stream_problem)

GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City and country, e.g. Paris, France"}},
        "required": ["city"]}}}
GET_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in an IANA time zone.",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "description": "IANA time zone, e.g. Asia/Tokyo"}},
        "required": ["timezone"]}}}


def _record_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "record", "description": "Store a record verbatim.",
                                             "parameters": parameters}}


#: Argument edge cases: (name, arguments, schema). The large value is over 8 KiB.
ARGUMENT_CASES: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("empty", {}, {"type": "object", "properties": {}, "additionalProperties": False}),
    ("unicode", {"text": "Grüße aus Köln, 東京の天気, naïve café ☕ 🚀 — ok"},
     {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}}, "required": ["text"]}),
    ("nested", {"order": {"id": 7, "items": [{"sku": "a-1", "qty": 2}, {"sku": "b-2", "qty": 1}],
                          "tags": ["x", "y"], "meta": {"gift": True, "note": None}}},
     {"type": "object", "required": ["order"], "properties": {"order": {
         "type": "object", "required": ["id", "items"], "properties": {
             "id": {"type": "integer"},
             "items": {"type": "array", "minItems": 1, "items": {
                 "type": "object", "required": ["sku", "qty"],
                 "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}}}},
             "tags": {"type": "array", "items": {"type": "string"}},
             "meta": {"type": "object"}}}}}),
    ("braces_quotes", {"code": 'if (a) { return "}"; } // {"k": [1, {"x": "]"}]} \\ \'q\''},
     {"type": "object", "properties": {"code": {"type": "string", "minLength": 1}}, "required": ["code"]}),
    ("large", {"blob": ("The quick brown fox jumps over the lazy dog {0}. " * 200)[:8500]},
     {"type": "object", "properties": {"blob": {"type": "string", "minLength": 8193}}, "required": ["blob"]}),
)

#: History id styles for the round trip (tool-call-failures.md items 2 and 4).
ID_STYLES: tuple[tuple[str, str], ...] = (
    ("canonical", "functions.get_weather:0"),
    ("sanitised", "functions_get_weather_0"),
    ("openai", "call_8f3a9c2e4b1d4e6f9a0b7c5d"),
    ("anthropic", "toolu_01A09q90qw90lq917835lq9"),
    ("uuid", "3f2b8c1e-9d4a-4c7e-8b1f-2a6d5e9c0b7a"),
    ("counter", "0"),
)


#: ``max_tokens`` of a case whose answer is a sentence or one or two calls: room for Kimi K2.x's
#: reasoning block (on by default; a few hundred tokens on these one-line prompts) plus the answer
#: (under 100 tokens). A server that always generates ``max_tokens`` (benchmarks/synthetic_server.py,
#: SGLang with ``ignore_eos``) costs this many tokens per request, not 4096. docs/reference/check-ids.md#what-each-case-asks-the-server-to-generate.
REPLY_TOKENS = 512


def argument_budget(args: dict[str, Any]) -> int:
    """``max_tokens`` for an ``arguments.*`` case: :data:`REPLY_TOKENS` plus one token per two
    characters of the arguments' JSON (English runs at about 4 characters per token in Kimi's
    tokenizer, so this is a 2x margin), rounded up to a multiple of 256."""
    need = REPLY_TOKENS + len(json.dumps(args, ensure_ascii=False)) // 2
    return -(-need // 256) * 256


@dataclasses.dataclass(frozen=True)
class Case:
    """One request shape. ``call``/``named``/``thinking`` as in :class:`Expectation`;
    ``thinking="server"`` means: required when a reasoning parser is expected, else unchecked;
    ``needs_reasoning``: skip unless a reasoning parser is expected."""

    name: str
    summary: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    call: str = "none"
    named: str | None = None
    thinking: Any = None
    extra_body: dict[str, Any] | None = None
    max_tokens: int = REPLY_TOKENS
    needs_reasoning: bool = False


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _roundtrip_messages(call_id: str) -> tuple[dict[str, Any], ...]:
    return (
        _user("What is the weather in Paris, France?"),
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris, France"})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 °C, sunny"},
        {"role": "assistant", "content": "It is 18 °C and sunny in Paris."},
        _user("And what is the weather in Rome, Italy?"),
    )


def _directive(args: dict[str, Any]) -> str:
    return "Call the tool `record` with exactly these arguments: " + json.dumps(args, ensure_ascii=False)


CASES: tuple[Case, ...] = (
    Case("plain", "plain chat, no tools", (_user("Say hello in one short sentence."),), thinking="server"),
    Case("tool_auto", "tool_choice auto: one call", (_user("What is the weather in Melbourne, Australia?"),),
         tools=(GET_WEATHER, GET_TIME), tool_choice="auto", call="one"),
    Case("tool_required", "tool_choice required: a call", (_user("What is the weather in Paris, France?"),),
         tools=(GET_WEATHER,), tool_choice="required", call="some"),
    Case("tool_named", "tool_choice names get_time: only that tool",
         (_user("What time is it in Tokyo? Use the time zone Asia/Tokyo."),), tools=(GET_WEATHER, GET_TIME),
         tool_choice={"type": "function", "function": {"name": "get_time"}}, call="some", named="get_time"),
    Case("tool_none", "tool_choice none: no call, no markup", (_user("What is the weather in Paris, France?"),),
         tools=(GET_WEATHER,), tool_choice="none", call="none"),
    Case("parallel", "two calls in one turn",
         (_user("Get the weather in Paris and in Tokyo: make one get_weather call per city, both in this turn."),),
         tools=(GET_WEATHER,), tool_choice="auto", call="two"),
    *(Case(f"id_roundtrip.{style}", f"history id {example!r} ({style}): the next call still parses",
           _roundtrip_messages(example), tools=(GET_WEATHER,), tool_choice="auto", call="one")
      for style, example in ID_STYLES),
    Case("reasoning_on", "thinking on: reasoning separated from content",
         (_user("Is 17 a prime number? Answer yes or no."),), thinking=True, needs_reasoning=True),
    Case("reasoning_off", "chat_template_kwargs.thinking=false: no reasoning",
         (_user("Is 17 a prime number? Answer yes or no."),), thinking=False, needs_reasoning=True,
         extra_body={"chat_template_kwargs": {"thinking": False}}),
    *(Case(f"arguments.{name}", f"arguments edge case: {name}", (_user(_directive(args)),),
           tools=(_record_tool(schema),), tool_choice="auto", call="one", max_tokens=argument_budget(args))
      for name, args, schema in ARGUMENT_CASES),
)

MODES = ("nonstream", "stream")


def check_ids() -> list[str]:
    """Every contract check id, in run order."""
    ids = [f"contract.{c.name}.{m}" for c in CASES for m in MODES]
    ids += [f"contract.multi_turn.{m}" for m in MODES]
    ids.append("contract.malformed")
    return ids


@dataclasses.dataclass
class Answer:
    """One request's outcome: the message (``None`` when the request failed) and findings."""

    message: Message | None
    findings: list[Finding]


def _request(ctx: Context, case: Case, messages: list[dict[str, Any]], *, stream: bool,
             exp: Expectation, nonstream: Message | None = None) -> Answer:
    kwargs: dict[str, Any] = {"model": ctx.model, "messages": messages, **ctx.sampling,
                              "max_tokens": case.max_tokens}
    if case.tools:
        kwargs["tools"] = list(case.tools)
    if case.tool_choice is not None:
        kwargs["tool_choice"] = case.tool_choice
    if case.extra_body:
        kwargs["extra_body"] = case.extra_body
    what = "POST /v1/chat/completions" + (" (stream)" if stream else "")
    try:
        if not stream:
            completion = ctx.clients.chat(**kwargs)
            # extras (reasoning_content) included; a body that is not a JSON object comes back as it is
            data = completion.model_dump(warnings=False) if hasattr(completion, "model_dump") else completion
            problem = completion_problem(data, clip_body(ctx.clients.recorder.last_text))
            if problem is not None:
                return Answer(None, [problem])
            msg = message_from_completion(data)
            return Answer(msg, check_message(msg, exp))
        for _chunk in ctx.clients.chat(stream=True, **kwargs):
            pass
    except openai.OpenAIError as exc:
        raw = ctx.clients.recorder.last_text
        finding = openai_failure(exc, what, streaming=stream, raw=raw)
        if stream and finding.kind == "error_frame":
            shape = stream_v.check_shape(stream_v.parse_sse(raw))
            errors = [f for f in shape if f.kind == "error_frame"]
            if errors:
                finding = errors[0]
        return Answer(None, [finding])
    except (ValueError, TypeError, RecursionError) as exc:  # bytes not UTF-8, JSON nested too deep
        return Answer(None, [unreadable(exc, what, ctx.clients.recorder.last_body)])
    sse = stream_v.parse_sse(ctx.clients.recorder.last_text)
    problem = None if sse.errors else stream_problem(sse.frames, clip_body(ctx.clients.recorder.last_text))
    if problem is not None:
        return Answer(None, [problem])
    msg = stream_v.assemble(sse.frames)
    findings = stream_v.root_cause(stream_v.check_shape(sse, nonstream) + check_message(msg, exp))
    return Answer(msg, findings)


def _expectation(ctx: Context, case: Case, history_ids: tuple[str, ...] = ()) -> Expectation:
    thinking = case.thinking
    if thinking == "server":
        thinking = True if ctx.reasoning_parser else None
    return Expectation(tools=case.tools, call=case.call, choice=case.tool_choice, named=case.named,
                       thinking=thinking, id_parser=ctx.id_parser, history_ids=history_ids)


def _history_ids(messages: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(tc["id"] for m in messages for tc in (m.get("tool_calls") or []) if tc.get("id"))


def _with_retries(ctx: Context, run: Callable[[], Answer]) -> Answer:
    """``run`` again while the model answered in prose (``model_declined``), at most ``ctx.repeat``
    times; not after an answer cut at ``max_tokens`` (finish_reason ``length``): at temperature 0
    the same budget ends the same way, and a server that always fills it would pay it again."""
    answer = run()
    for _ in range(max(0, ctx.repeat)):
        top = first(answer.findings)
        if top is None or top.kind != "model_declined":
            break
        if answer.message is not None and answer.message.finish_reason == "length":
            break
        answer = run()
    return answer


def run_case(ctx: Context, case: Case, mode: str, cache: dict[str, Message | None]) -> Outcome:
    """Run one case in one mode.

    ``cache`` keeps the non-streamed message per case so the streamed arguments can be compared.
    """
    if case.needs_reasoning and not ctx.reasoning_parser:
        return Outcome.skipped("no reasoning parser expected (profile) or reported (/model_info)")
    exp = _expectation(ctx, case, _history_ids(case.messages))
    answer = _with_retries(ctx, lambda: _request(ctx, case, list(case.messages), stream=mode == "stream",
                                                 exp=exp, nonstream=cache.get(case.name)))
    if mode == "nonstream":
        cache[case.name] = answer.message
    return Outcome.judged(answer.findings, _summary(answer.message))


def _summary(msg: Message | None) -> str:
    if msg is None:
        return ""
    if msg.tool_calls:
        calls = ", ".join(f"{c.name}#{c.id}" for c in msg.tool_calls)
        return f"finish_reason={msg.finish_reason}; calls: {calls}"
    return f"finish_reason={msg.finish_reason}; content {clip(msg.content or '', 60)!r}"


def run_multi_turn(ctx: Context, mode: str) -> Outcome:
    """Three turns with real tool results: call → result → answer → new question → call.

    Ids the server returned must stay unique across the whole conversation.
    """
    stream = mode == "stream"
    case = Case("multi_turn", "", (), tools=(GET_WEATHER,), tool_choice="auto")
    messages: list[dict[str, Any]] = [_user("What is the weather in Paris, France?")]
    notes = []
    for n, call in enumerate(("one", "any", "one"), start=1):
        exp = Expectation(tools=case.tools, call=call, choice="auto", id_parser=ctx.id_parser,  # type: ignore[arg-type]
                          history_ids=_history_ids(messages))
        answer = _with_retries(ctx, lambda: _request(ctx, case, messages, stream=stream, exp=exp))
        if answer.findings:  # fail, or warn (the model declined)
            return Outcome.judged(dataclasses.replace(f, detail=f"turn {n}: {f.detail}") for f in answer.findings)
        msg = answer.message
        assert msg is not None
        notes.append(_summary(msg))
        assistant: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            assistant["tool_calls"] = [{"id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}}
                                       for c in msg.tool_calls]
        messages.append(assistant)
        messages.extend({"role": "tool", "tool_call_id": c.id, "content": "18 °C, sunny"} for c in msg.tool_calls)
        if n == 2:
            messages.append(_user("And what is the weather in Rome, Italy?"))
    return Outcome.passed(" | ".join(notes))


def run_malformed(ctx: Context) -> Outcome:
    """A request with ``messages`` not a list must get a 4xx JSON error, not a 5xx or a 200."""
    try:
        ctx.clients.chat(model=ctx.model, messages="this is not a list", temperature=0, max_tokens=8)
    except openai.APIStatusError as exc:
        body = exc.response.text
        if exc.status_code in (401, 403):  # refused before the request was read: says nothing of validation
            return Outcome.failed(openai_finding(exc, streaming=False))  # a status error: no broken exchange
        if not 400 <= exc.status_code < 500:
            return Outcome.failed(Finding(status_kind(exc.status_code),
                                          f"a malformed request got {status_label(exc.status_code)}, not a 4xx",
                                          clip(body)))
        try:
            json.loads(body)
        except ValueError:
            return Outcome.failed(Finding("server_error", f"{status_label(exc.status_code)} with a body that is not "
                                                          "JSON", clip(body)))
        return Outcome.passed(f"{status_label(exc.status_code)} with a JSON error")
    except openai.OpenAIError as exc:
        return Outcome.failed(openai_failure(exc, "POST /v1/chat/completions", streaming=False,
                                             raw=ctx.clients.recorder.last_text))
    return Outcome.failed(Finding("http_error", "a malformed request (messages not a list) was accepted with 2xx",
                                  clip(ctx.clients.recorder.last_text)))


def run(ctx: Context, check_id: str, cache: dict[str, Message | None]) -> Outcome:
    """Run the contract check ``check_id`` (one of :func:`check_ids`)."""
    if check_id == "contract.malformed":
        return run_malformed(ctx)
    _, rest = check_id.split(".", 1)
    name, mode = rest.rsplit(".", 1)
    if name == "multi_turn":
        return run_multi_turn(ctx, mode)
    case = next(c for c in CASES if c.name == name)
    return run_case(ctx, case, mode, cache)
