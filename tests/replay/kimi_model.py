"""A scripted stand-in for Kimi K2.5: reads the rendered prompt, writes the raw text the model would.

Pure Python (standard library only) so that both the replay server (SGLang's interpreter) and
the kit's tests can import it. It is not a language model: it follows a few fixed rules that
cover the prompts ``kimi-deploy check`` sends, and copies the habits of the real model that
matter to a server (moonshotai Kimi K2.x, ../shared/notes/tool-call-failures.md):

- tool calls are special-token markup,
  ``<|tool_calls_section_begin|><|tool_call_begin|>ID<|tool_call_argument_begin|>{JSON}<|tool_call_end|>...``;
- the id imitates the style of the ids in the history (canonical ``functions.NAME:N``, sanitised
  ``functions_NAME_N``, ``call_<hex>``, ``toolu_...``, a UUID, a bare counter), with N counting the
  calls of the whole conversation;
- with thinking on (the template pre-fills ``<think>``) the output starts inside reasoning and
  closes it with ``</think>``; with thinking off (``<think></think>`` pre-filled) there is none;
- "time zone Area/City" with ``get_time`` offered is a ``get_time`` call, "weather in X" (and "in Y") one
  ``get_weather`` call per city;
- under a grammar constraint (``tool_choice`` required or named) it must call a tool; without one,
  a ``json_schema`` constraint makes it write SGLang's JSON-array form instead;
- with ``KIMI_REPLAY_INVALID_RATE`` (a fraction) and ``KIMI_REPLAY_SEED`` in the environment (the servers'
  ``--invalid-args-rate``/``--seed``), the i-th answer with a call (i counted by the process from 0) drops the
  first required property of its first call's arguments when ``random.Random(f"{seed}:{i}").random() < rate``:
  schema-invalid arguments at a known, seeded rate (the quality tier's tests).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import uuid

MARKERS = (
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_end|>", "<|im_user|>",
    "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<think>", "</think>", "[BOS]", "[EOS]",
)
_SEGMENT = re.compile(r"<\|im_(system|user|assistant)\|>([^<]*)<\|im_middle\|>(.*?)(?=<\|im_end\|>|$)", re.S)
_HISTORY_ID = re.compile(r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>", re.S)
_ARGS_DIRECTIVE = re.compile(r"[Cc]all the tool `?([A-Za-z0-9_.-]+)`? with exactly these arguments:\s*(\{.*\})\s*$", re.S)
_WEATHER = re.compile(r"weather in ([A-Z][A-Za-z .'-]*?(?:, [A-Z][A-Za-z .'-]*?)?)(?= and |[?.!,:;]|$)")


def _tools(prompt: str) -> list[dict]:
    m = re.search(r"<\|im_system\|>tool_declare<\|im_middle\|>(.*?)<\|im_end\|>", prompt, re.S)
    if not m:
        return []
    try:
        return [t.get("function", t) for t in json.loads(m.group(1))]
    except json.JSONDecodeError:
        return []


def _segments(prompt: str) -> list[tuple[str, str]]:
    """(role, text) of each turn; role is user/assistant/tool/system (tool_declare skipped)."""
    out = []
    for kind, name, text in _SEGMENT.findall(prompt):
        if name == "tool_declare":
            continue
        out.append((name if kind == "system" else kind, text))
    return out


def next_id(history_ids: list[str], name: str, counter: int) -> str:
    """The id the model writes for its next call, imitating the last history id's style.

    ``counter`` is the number of tool calls so far in the conversation (the model's ``N``).
    """
    last = history_ids[-1] if history_ids else ""
    seed = hashlib.sha256(f"{last}|{name}|{counter}".encode()).hexdigest()
    if not last or re.fullmatch(r"functions\.[\w.-]+:\d+", last):
        return f"functions.{name}:{counter}"
    if re.fullmatch(r"functions_.+_\d+", last):
        return f"functions_{name}_{counter}"
    if re.fullmatch(r"[\w.-]+:\d+", last):
        return f"{name}:{counter}"
    if re.fullmatch(r"\d+", last):
        return str(counter)
    if re.fullmatch(r"call\d+", last):
        return f"call{counter:05d}"
    if last.startswith("call_"):
        return "call_" + seed[:24]
    if last.startswith("toolu_"):
        return "toolu_01" + seed[:22]
    try:
        uuid.UUID(last)
        return str(uuid.UUID(seed[:32]))
    except ValueError:
        return f"functions.{name}:{counter}"


def _example(schema: dict) -> object:
    """A small value valid against a JSON schema fragment (for forced calls without a directive)."""
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: _example(props[k]) for k in schema.get("required", [])}
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": []}.get(kind, "x")


def _planned_calls(user: str, tools: list[dict], forced: bool) -> list[tuple[str, dict]]:
    names = {t.get("name") for t in tools}
    m = _ARGS_DIRECTIVE.search(user)
    if m and m.group(1) in names:
        return [(m.group(1), json.loads(m.group(2)))]
    zone = re.search(r"time zone ([A-Za-z_]+/[A-Za-z_]+)", user)
    if zone and "get_time" in names:
        return [("get_time", {"timezone": zone.group(1)})]
    if "get_weather" in names:
        cities = _WEATHER.findall(user)
        extra = re.findall(r" and in ([A-Z][A-Za-z .'-]*?)(?=[?.!,:;]| and |$)", user)
        cities = cities + extra
        if cities:
            return [("get_weather", {"city": c.strip()}) for c in cities]
    if forced and tools:
        tool = tools[0]
        return [(tool["name"], _example(tool.get("parameters") or {}))]
    return []


_ANSWERS_WITH_CALLS = itertools.count()
#: How many answers were broken on purpose (read by nothing but a debugger; the tests count on their side).
BROKEN = []


def _maybe_break(calls: list[tuple[str, dict]], tools: list[dict]) -> list[tuple[str, dict]]:
    """``calls`` with the first call's first required property dropped, at the seeded rate (module docstring)."""
    rate = float(os.environ.get("KIMI_REPLAY_INVALID_RATE") or 0)
    if not calls or rate <= 0:
        return calls
    i = next(_ANSWERS_WITH_CALLS)
    if random.Random(f"{os.environ.get('KIMI_REPLAY_SEED', '0')}:{i}").random() >= rate:
        return calls
    name, args = calls[0]
    schema = next((t.get("parameters") or {} for t in tools if t.get("name") == name), {})
    required = [k for k in schema.get("required") or [] if k in args]
    if not required:
        return calls
    BROKEN.append(i)
    return [(name, {k: v for k, v in args.items() if k != required[0]}), *calls[1:]]


def respond(prompt: str, sampling_params: dict | None = None) -> str:
    """Raw completion text (markers included) for a rendered Kimi-style ``prompt``.

    ``sampling_params`` are SGLang's (``structural_tag``/``json_schema``/``ebnf`` mean a grammar
    constraint is forcing a tool call); ``canonical_ids`` true: every call id is ``functions.NAME:N``
    whatever the history's style (vLLM's structural tag admits no other). Deterministic: the same
    prompt gives the same text.
    """
    params = sampling_params or {}
    thinking = prompt.endswith("<think>")
    tools = _tools(prompt)
    segments = _segments(prompt)
    history_ids = _HISTORY_ID.findall(prompt)
    last_role, last_text = segments[-1] if segments else ("user", "")
    # the open assistant turn itself is the last segment; look at the one before it
    if last_role == "assistant" and not last_text.replace("<think>", "").replace("</think>", ""):
        last_role, last_text = segments[-2] if len(segments) > 1 else ("user", "")
    user = next((t for r, t in reversed(segments) if r == "user"), "")
    json_forced = "json_schema" in params and "structural_tag" not in params
    forced = any(k in params and params[k] for k in ("structural_tag", "json_schema", "ebnf"))

    reasoning = ""
    if last_role == "tool":
        results = [t.split("\n", 1)[-1] for r, t in segments if r == "tool"][-2:]
        reasoning = "The tool returned a result; I will summarise it for the user."
        answer = "Here is what I found: " + "; ".join(r.strip() for r in results) + "."
        calls: list[tuple[str, dict]] = []
    else:
        calls = _maybe_break(_planned_calls(user, tools, forced), tools)
        if calls:
            reasoning = f"The user asks for something {calls[0][0]} can answer; I will call it."
            answer = ""
        elif "weather" in user.lower():
            reasoning = "I have no tool for live weather here, so I answer from general knowledge."
            answer = "I cannot look up live weather right now, but you can check a local forecast service."
        elif "prime" in user.lower():
            reasoning = "17 has no divisors other than 1 and itself, so it is prime."
            answer = "Yes."
        else:
            reasoning = "The user greets me; a short friendly reply is enough."
            answer = "Hello! How can I help you today?"

    out = []
    if thinking:
        out.append(reasoning + "</think>")
    if json_forced and calls:
        out.append(json.dumps([{"name": n, "parameters": a} for n, a in calls], ensure_ascii=False))
        return "".join(out)
    out.append(answer)
    if calls:
        out.append("<|tool_calls_section_begin|>")
        for k, (name, args) in enumerate(calls):
            call_id = (f"functions.{name}:{len(history_ids) + k}" if params.get("canonical_ids")
                       else next_id(history_ids, name, len(history_ids) + k))
            out.append(f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>"
                       f"{json.dumps(args, ensure_ascii=False)}<|tool_call_end|>")
        out.append("<|tool_calls_section_end|>")
    return "".join(out)


def pieces(text: str, width: int = 4) -> list[str]:
    """Split raw text into "tokens": each marker whole, other text in runs of ``width`` characters."""
    out: list[str] = []
    pattern = "(" + "|".join(re.escape(m) for m in MARKERS) + ")"
    for part in re.split(pattern, text):
        if not part:
            continue
        if part in MARKERS:
            out.append(part)
        else:
            out.extend(part[i:i + width] for i in range(0, len(part), width))
    return out


#: Tokens per streamed chunk, cycled: EAGLE-3 with 4 draft tokens accepts 1-4 tokens a step,
#: so several markers can arrive in one chunk (tool-call-failures.md, item 8).
CHUNK_SIZES = (1, 3, 1, 4, 2, 4)


def chunks(parts: list[str]) -> list[list[str]]:
    """Group pieces into streamed chunks of ``CHUNK_SIZES`` tokens (deterministic)."""
    out, i, k = [], 0, 0
    while i < len(parts):
        n = CHUNK_SIZES[k % len(CHUNK_SIZES)]
        out.append(parts[i:i + n])
        i += n
        k += 1
    return out
