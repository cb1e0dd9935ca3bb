"""The ``contract.followup.*`` checks: agent conversations several tool rounds deep, as the field reports them.

``contract.multi_turn`` asks one follow-up. The failures Kimi operators report most often now appear only
deeper in a conversation (issue #41):

- an empty answer to a tool result, ``<|im_end|>`` right after ``</think>``: about 13 of 15 follow-ups on
  SGLang 0.5.11 with EAGLE-3 and vLLM 0.21, none on Moonshot's API (MoonshotAI/Kimi-K2 issue 128):
  ``empty_followup``;
- ids a client minted in its own form (``callNNNNN``, ``call_<hex>``, ``toolu_...``) in the history: the model
  copies the form, the server's parser does not match it, and the answer ends with ``finish_reason=stop`` and
  no call (sgl-project/sglang issue 25358): ``stop_without_calls``;
- the wrong tool from round 2 on (sglang issue 25218): ``wrong_tool_after_round``;
- the streaming parser dropping or hanging on a long argument deep in a conversation (sglang issue 23363):
  the contract's own kinds (``schema_violation``, ``stream_shape`` against the non-streamed answer, ``timeout``).

Ids: ``contract.followup.<shape>.<thinking>.<mode>``; ``<thinking>`` is ``think`` (the template's default:
thinking on) or ``nothink`` (``chat_template_kwargs.thinking=false``), ``<mode>`` ``nonstream`` or ``stream``.
A round is: a user question with the tool call(s) it makes due, the tool results, and the answer to them (text,
or further calls, which get results too, at most :data:`EXTRA_CALL_ROUNDS` more times). Every request is judged by the
contract's rules (:func:`kimi_deploy.check.completion_rules.check_message`); the first turn with a finding decides, and its
detail and evidence start ``turn N:`` (N counts the requests of the conversation from 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kimi_deploy.check.context import Context
from kimi_deploy.check.contract import (GET_TIME, GET_WEATHER, REPLY_TOKENS, Case, _history_ids, _request, _summary,
                                        _with_retries, argument_budget)
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.results import clip
from kimi_deploy.check.completion_rules import Expectation, Finding, Message

#: Further tool rounds a model may start in answer to a tool result before text is due.
EXTRA_CALL_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class Round:
    """One user question: its text, the tool the answer must call (``None``: any of the request's), how many
    calls at least (2: parallel calls in one turn), the tool result each call gets, and the turn's
    ``max_tokens`` (``None``: the contract's :data:`kimi_deploy.check.contract.REPLY_TOKENS`)."""

    user: str
    tool: str | None
    calls: int = 1
    result: str = "18 °C, sunny"
    max_tokens: int | None = None


@dataclasses.dataclass(frozen=True)
class Shape:
    """One conversation: its rounds, the tools every request offers, and the id form the client writes back
    (``None``: the server's own ids, unchanged; else a key of :data:`CLIENT_ID_FORMS`)."""

    name: str
    summary: str
    rounds: tuple[Round, ...]
    tools: tuple[str, ...]
    client_ids: str | None = None
    thinking_variants: tuple[str, ...] = ("think", "nothink")


def _client_id(form: str, n: int) -> str:
    """The id a client in ``form`` mints for the conversation's ``n``-th call (from 0), deterministically."""
    digest = hashlib.sha256(f"{form}:{n}".encode()).hexdigest()
    return {"call_digits": f"call{n + 1:05d}", "openai": "call_" + digest[:24],
            "anthropic": "toolu_01" + digest[:22]}[form]


#: Id forms clients write back into the history (sglang issue 25358: ``callNNNNN``; OpenAI's ``call_<24 hex>``,
#: which LiteLLM and OpenAI-shaped clients mint; Anthropic's ``toolu_01...`` from Claude-shaped clients).
CLIENT_ID_FORMS: tuple[str, ...] = ("call_digits", "openai", "anthropic")

#: The long argument of ``long_argument`` (over 8 KiB, as ``contract.arguments.large``).
LONG_BLOB = ("Log line {0}: the quick brown fox jumps over the lazy dog. " * 160)[:8400]
LONG_RECORD = {"type": "function", "function": {
    "name": "record", "description": "Store a record verbatim.",
    "parameters": {"type": "object", "properties": {"blob": {"type": "string", "minLength": 8193}},
                   "required": ["blob"]}}}

_PARIS = Round("What is the weather in Paris, France?", "get_weather")
_ROME = Round("And what is the weather in Rome, Italy?", "get_weather", result="24 °C, clear")

SHAPES: tuple[Shape, ...] = (
    Shape("depth", "three rounds, each call answered by a tool result; round 3 switches to get_time",
          (_PARIS, _ROME,
           Round("What time is it in Tokyo right now? Use get_time with the time zone Asia/Tokyo.", "get_time",
                 result="09:41 JST")),
          tools=("get_weather", "get_time")),
    Shape("parallel", "two parallel calls answered in one turn, then another round",
          (Round("Get the weather in Paris and in Tokyo: make one get_weather call per city, both in this turn.",
                 "get_weather", calls=2, result="19 °C, cloudy"), _ROME),
          tools=("get_weather",)),
    Shape("long_argument", "a round, then a call with an 8.4 KB argument (streamed: compared with non-streamed)",
          (_PARIS, Round("Call the tool `record` with exactly these arguments: "
                         + json.dumps({"blob": LONG_BLOB}), "record", result="stored")),
          tools=("get_weather", "record"), thinking_variants=("think",)),
    *(Shape(f"ids.{form}", f"the client writes its own ids ({_client_id(form, 0)}, ...) into the history",
            (_PARIS, _ROME), tools=("get_weather",), client_ids=form, thinking_variants=("think",))
      for form in CLIENT_ID_FORMS),
)

MODES = ("nonstream", "stream")


def check_ids() -> list[str]:
    """Every ``contract.followup.*`` id, in run order."""
    return [f"contract.followup.{s.name}.{t}.{m}" for s in SHAPES for t in s.thinking_variants for m in MODES]


def _tools(shape: Shape) -> tuple[dict[str, Any], ...]:
    table = {"get_weather": GET_WEATHER, "get_time": GET_TIME, "record": LONG_RECORD}
    return tuple(table[name] for name in shape.tools)


def _relabel(finding: Finding, turn: int, *, answers_results: bool, due: bool, message: Message | None) -> Finding:
    """``finding`` in this tier's words: an empty answer to a tool result is ``empty_followup``, a due call
    missing from an answer that ended with ``stop`` is ``stop_without_calls``; every detail and evidence
    starts ``turn N:``."""
    kind, detail = finding.kind, finding.detail
    if kind == "empty_answer" and answers_results:
        kind, detail = "empty_followup", "the answer to the tool result(s) is empty: " + detail
    elif kind == "tool_call_dropped" and due and message is not None and message.finish_reason == "stop" \
            and not message.tool_calls:
        kind, detail = "stop_without_calls", "a call was due; the answer ended with finish_reason=stop and no " \
                                             "tool_calls: " + detail
    return dataclasses.replace(finding, kind=kind, detail=f"turn {turn}: {detail}",
                               evidence=clip(f"turn {turn}: {finding.evidence}"))


def _wrong_tool(msg: Message, due: str | None, round_no: int, tools: tuple[str, ...]) -> Finding | None:
    """``wrong_tool_after_round`` when round ``round_no`` (from 2 on) called an offered tool other than ``due``."""
    if due is None or round_no < 2:
        return None
    wrong = [c.name for c in msg.tool_calls if c.name != due and c.name in tools]
    if not wrong:
        return None
    return Finding("wrong_tool_after_round", f"round {round_no} asked for {due}; the answer called {wrong[0]}",
                   clip(", ".join(str(c.name) for c in msg.tool_calls)))


class _Conversation:
    """The messages so far and the ids the client writes back (rewritten when the shape says so)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.messages: list[dict[str, Any]] = []
        self.calls = 0

    def add_answer(self, msg: Message, results: list[str]) -> None:
        """Append the assistant turn and one tool result per call (``results`` cycled)."""
        assistant: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        ids = []
        for call in msg.tool_calls:
            ids.append(_client_id(self.shape.client_ids, self.calls) if self.shape.client_ids else call.id)
            self.calls += 1
        if msg.tool_calls:
            assistant["tool_calls"] = [{"id": i, "type": "function",
                                        "function": {"name": c.name, "arguments": c.arguments}}
                                       for i, c in zip(ids, msg.tool_calls)]
        self.messages.append(assistant)
        self.messages.extend({"role": "tool", "tool_call_id": i, "content": results[k % len(results)]}
                             for k, i in enumerate(ids))


def run(ctx: Context, check_id: str, cache: dict[str, Message | None]) -> Outcome:
    """Run ``contract.followup.<shape>.<thinking>.<mode>`` (one of :func:`check_ids`).

    ``cache`` keeps each non-streamed turn's message (``followup.<shape>.<thinking>#<turn>``) so the streamed
    conversation's calls are compared with it (``stream_shape`` when the arguments differ).
    """
    rest = check_id.removeprefix("contract.followup.")
    name, thinking, mode = rest.rsplit(".", 2)
    shape = next(s for s in SHAPES if s.name == name)
    stream = mode == "stream"
    tools = _tools(shape)
    extra = {"chat_template_kwargs": {"thinking": False}} if thinking == "nothink" else None
    reasoning_expected = bool(ctx.reasoning_parser)
    think = (thinking == "think") if reasoning_expected else None
    conv = _Conversation(shape)
    notes: list[str] = []
    turn = 0

    def ask(call: str, due_tool: str | None, max_tokens: int, round_no: int, answers_results: bool) \
            -> tuple[Message | None, list[Finding]]:
        nonlocal turn
        turn += 1
        case = Case(f"followup.{name}", "", (), tools=tools, tool_choice="auto", extra_body=extra,
                    max_tokens=max_tokens)
        exp = Expectation(tools=tools, call=call, choice="auto", thinking=think,  # type: ignore[arg-type]
                          id_parser=ctx.id_parser, history_ids=_history_ids(conv.messages))
        key = f"followup.{name}.{thinking}#{turn}"
        answer = _with_retries(ctx, lambda: _request(ctx, case, list(conv.messages), stream=stream, exp=exp,
                                                     nonstream=cache.get(key)))
        if not stream:
            cache[key] = answer.message
        findings = list(answer.findings)
        if answer.message is not None:
            wrong = _wrong_tool(answer.message, due_tool, round_no, shape.tools)
            findings += [wrong] if wrong else []
        due = call in ("one", "two", "some")
        return answer.message, [_relabel(f, turn, answers_results=answers_results, due=due, message=answer.message)
                                for f in findings]

    for round_no, rnd in enumerate(shape.rounds, start=1):
        conv.messages.append({"role": "user", "content": rnd.user})
        budget = argument_budget({"blob": LONG_BLOB}) if rnd.tool == "record" else (rnd.max_tokens or REPLY_TOKENS)
        msg, findings = ask("two" if rnd.calls >= 2 else "one", rnd.tool, budget, round_no, False)
        if findings:
            return Outcome.judged(findings)
        assert msg is not None
        notes.append(f"turn {turn}: {_summary(msg)}")
        conv.add_answer(msg, [rnd.result])
        for _ in range(EXTRA_CALL_ROUNDS + 1):  # a model that keeps calling is not judged on it
            msg, findings = ask("any", None, REPLY_TOKENS, round_no, True)
            if findings:
                return Outcome.judged(findings)
            assert msg is not None
            notes.append(f"turn {turn}: {_summary(msg)}")
            conv.add_answer(msg, [rnd.result])
            if not msg.tool_calls:
                break
    return Outcome.passed(f"{turn} turns, {len(shape.rounds)} rounds | " + " | ".join(notes))
