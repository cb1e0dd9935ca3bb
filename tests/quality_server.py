"""A scripted OpenAI-compatible server for the quality tier's tests (real HTTP over loopback).

It answers like SGLang with the ``kimi_k2`` parsers (``/model_info``, ``/server_info``, ``/v1/models``,
``/v1/chat/completions`` streamed and not, canonical ``functions.NAME:N`` ids) and follows a few rules:

- a user message "Call the tool `NAME` with exactly these arguments: {JSON}" (the schema corpus) is answered
  with that call and those arguments; any other request offering tools gets a call of the first tool the
  request forces or offers, with arguments made valid against its schema by :func:`valid_value`;
- ``invalid_rate``/``seed``: the i-th tool-call answer (i counted by the server from 0) carries arguments that
  break the schema (a required property dropped) when ``random.Random(f"{seed}:{i}").random() < invalid_rate``,
  so a run of N requests has a known, seeded number of invalid answers whatever order they arrive in;
- ``mutate``: ``{tool name: function(args) -> args}`` applied to the directed arguments (a broken shape);
- ``thinking``: ``"honour"`` (reasoning with ``chat_template_kwargs.thinking`` true or absent, none with false),
  ``"always"`` (reasoning whatever the switch says), ``"never"`` (no reasoning even when asked);
- ``server_info``: extra ``/server_info`` fields (``sampling_defaults``, ``preferred_sampling_params``);
- ``prompt_tokens``: ``function(request body) -> int`` for ``usage.prompt_tokens`` (default: 10);
- ``error_every``: every k-th chat request is answered HTTP 500;
- ``conversation``: answer like an agent's model, as the ``contract.followup.*`` checks need: a tool result is
  answered with text, a question with the call it asks for ("weather in X" and "in Y": ``get_weather`` per city;
  "time zone Z": ``get_time``), ids ``functions.NAME:N`` counted over the conversation (SGLang's history count);
  and with it the field's faults (issue #41), each seeded by ``random.Random(f"{seed}:{fault}:{i}")``, i
  counting that fault's chances from 0:
  ``empty_followup_rate`` (the answer to the 2nd or later round of tool results is empty: reasoning, then
  ``<|im_end|>``, MoonshotAI/Kimi-K2 issue 128), ``drop_client_ids`` (a history id not ``functions.NAME:N``: the
  call is not parsed, ``finish_reason=stop`` with no call, sglang issue 25358), ``wrong_tool_from_round`` (from
  that round, counted in user messages, the call goes to another offered tool, sglang issue 25218);
- ``think_leak_rate`` (any mode): the answer's reasoning and ``</think>`` are put in front of its content, as a
  server whose reasoning parser does not split them returns it (the template pre-filled ``<think>``), at that
  seeded rate (``faults["think_leak"]`` counts the leaked answers);
- ``gather``: every chat request waits until that many are in flight, then the burst is answered (its level:
  that count; tests only, where the client sends exactly that many at once: no clock decides the level);
  ``fail_from_concurrency``: at a level of at least that many, an answer is empty (content ``""``,
  ``finish_reason=stop``, no call; sglang issue 23341) at the seeded ``concurrency_fault_rate``
  (``faults["concurrency"]``);
- ``refuse_sampling``: ``{"temperature": t, "top_p": p}``: a chat request with other values (or without them)
  is refused HTTP 400, as Moonshot's API refuses sampling other than K2.7-Code's own;
- ``prefix_cache``: ``usage.prompt_tokens_details.cached_tokens`` is reported: ``"hit"`` (a prompt seen before is
  all cached), ``"miss"`` (always 0), ``"changes"`` (hits, and the answer to a cached prompt differs: a cache
  that corrupts what it returns); ``deterministic``: ``/server_info`` says ``enable_deterministic_inference``.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from loopback import Loopback, QuietHandler

DIRECTIVE = re.compile(r"[Cc]all the tool `?([A-Za-z0-9_.-]+)`? with exactly these arguments:\s*(\{.*\})\s*$", re.S)
MODEL = "moonshotai/Kimi-K2.5"


def _resolve(root: dict, ref: str) -> dict:
    node: Any = root
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


FORMATS = {"email": "ops@example.com", "date": "2026-12-02", "date-time": "2026-12-02T03:04:05Z",
           "ipv4": "10.0.0.7", "ipv6": "::1", "regex": "^x+$", "uuid": "3f2b8c1e-9d4a-4c7e-8b1f-2a6d5e9c0b7a"}


#: Strings for the patterns of the kit's samples.
PATTERNS = {"^[A-Z]{3}$": "EUR"}


def valid_value(schema: Any, root: dict | None = None) -> Any:
    """A small value valid against ``schema`` (the subset of JSON Schema the tests' tools use)."""
    root = root if root is not None else schema
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        return valid_value(_resolve(root, schema["$ref"]), root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return valid_value(schema[key][0], root)
    if "allOf" in schema:
        out: dict = {}
        for part in schema["allOf"]:
            out.update(valid_value(part, root) or {})
        return out
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: valid_value(props.get(k, {"type": "string"}), root) for k in schema.get("required", [])}
    if kind == "array":
        return [valid_value(schema.get("items", {"type": "string"}), root)
                for _ in range(schema.get("minItems", 1))]
    if kind == "string":
        if "format" in schema:
            return FORMATS[schema["format"]]
        if "pattern" in schema:
            return PATTERNS[schema["pattern"]]
        return "x" * max(1, schema.get("minLength", 1))
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "x"


def broken(args: dict, schema: dict) -> dict:
    """``args`` with the schema's first required property dropped (invalid by construction)."""
    required = schema.get("required") or []
    assert required, f"an invalid answer needs a schema with a required property: {schema}"
    return {k: v for k, v in args.items() if k != required[0]}


class QualityServer:
    """The scripted server; ``url`` once started (a context manager)."""

    def __init__(self, *, invalid_rate: float = 0.0, seed: int = 0, mutate: dict[str, Callable] | None = None,
                 thinking: str = "honour", server_info: dict | None = None,
                 prompt_tokens: Callable[[dict], int] | None = None, model_info: bool = True,
                 error_every: int = 0, conversation: bool = False, empty_followup_rate: float = 0.0,
                 drop_client_ids: bool = False, wrong_tool_from_round: int = 0, think_leak_rate: float = 0.0,
                 gather: int = 0, fail_from_concurrency: int = 0, concurrency_fault_rate: float = 1.0,
                 refuse_sampling: dict | None = None, prefix_cache: str | None = None,
                 deterministic: bool = False) -> None:
        self.invalid_rate, self.seed, self.mutate = invalid_rate, seed, mutate or {}
        self.thinking, self.extra_info, self.model_info = thinking, server_info or {}, model_info
        self.prompt_tokens = prompt_tokens or (lambda body: 10)
        self.error_every = error_every  # every k-th chat request gets HTTP 500 (0: none)
        self.conversation, self.empty_followup_rate = conversation, empty_followup_rate
        self.drop_client_ids, self.wrong_tool_from_round = drop_client_ids, wrong_tool_from_round
        self.think_leak_rate = think_leak_rate
        self.refuse_sampling = refuse_sampling
        self.prefix_cache, self.deterministic = prefix_cache, deterministic
        self.seen_prompts: set[str] = set()
        self.gather, self.fail_from_concurrency = gather, fail_from_concurrency
        self.concurrency_fault_rate = concurrency_fault_rate
        self.cond = threading.Condition()
        self.in_flight = 0                  # chat requests being answered
        self.burst: int | None = None       # the in-flight count the current burst was released at
        self.levels: list[int] = []         # that count, per chat request answered
        self.chances: dict[str, int] = {}   # fault -> chances so far
        self.faults: dict[str, int] = {}    # fault -> times it struck
        self.lock = threading.Lock()
        self.calls = 0          # tool-call answers given so far
        self.invalid = 0        # of which broken on purpose
        self.requests: list[dict] = []
        self.loop = Loopback(self._handler(), start=False)
        self.url = self.loop.url

    def __enter__(self) -> "QualityServer":
        self.loop.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.close()

    def _next_broken(self) -> bool:
        with self.lock:
            i = self.calls
            self.calls += 1
            bad = random.Random(f"{self.seed}:{i}").random() < self.invalid_rate
            self.invalid += bad
            return bad

    def enter(self) -> int:
        """Count a chat request in; with ``gather``, wait until the burst is complete. Returns its level."""
        with self.cond:
            self.in_flight += 1
            if self.gather:
                if self.burst is None and self.in_flight >= self.gather:
                    self.burst = self.in_flight
                    self.cond.notify_all()
                # a test whose client does not send `gather` at once is broken: fail it rather than hang it
                assert self.cond.wait_for(lambda: self.burst is not None, timeout=120), "burst never gathered"
            level = self.burst if self.burst is not None else self.in_flight
            self.levels.append(level)
            return level

    def leave(self) -> None:
        with self.cond:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.burst = None

    def _strikes(self, fault: str, rate: float) -> bool:
        """Whether ``fault`` strikes at its next chance (seeded; module docstring)."""
        with self.lock:
            i = self.chances.get(fault, 0)
            self.chances[fault] = i + 1
            hit = random.Random(f"{self.seed}:{fault}:{i}").random() < rate
            self.faults[fault] = self.faults.get(fault, 0) + hit
            return hit

    def converse(self, body: dict) -> dict:
        """:meth:`answer` in ``conversation`` mode (module docstring)."""
        messages = body.get("messages") or []
        tools = [t.get("function", t) for t in body.get("tools") or []]
        names = [t["name"] for t in tools]
        on = (body.get("chat_template_kwargs") or {}).get("thinking", True) is not False
        reasoning = "Let me think about it." if on else None
        if messages and messages[-1].get("role") == "tool":
            rounds = sum(1 for k, m in enumerate(messages) if m.get("role") == "tool"
                         and (k == 0 or messages[k - 1].get("role") != "tool"))
            if rounds >= 2 and self.empty_followup_rate and self._strikes("empty_followup", self.empty_followup_rate):
                return {"content": "", "reasoning": reasoning, "calls": []}
            results = [m.get("content") for m in messages if m.get("role") == "tool"][-2:]
            return {"content": "Here is what I found: " + "; ".join(map(str, results)) + ".", "reasoning": reasoning,
                    "calls": []}
        history = [tc.get("id") for m in messages for tc in m.get("tool_calls") or []]
        user = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "") or ""
        calls: list[tuple[str, str]] = []
        m = DIRECTIVE.search(user)
        if m and m.group(1) in names:
            calls = [(m.group(1), m.group(2))]
        elif "get_time" in names and (zone := re.search(r"time zone ([A-Za-z_]+/[A-Za-z_]+)", user)):
            calls = [("get_time", json.dumps({"timezone": zone.group(1)}))]
        elif "get_weather" in names:
            cities = re.findall(r"(?:weather in|and in) ([A-Z][a-z]+(?:, [A-Z][a-z]+)?)", user)
            calls = [("get_weather", json.dumps({"city": c})) for c in cities]
        turn = sum(1 for m in messages if m.get("role") == "user")
        if calls and self.wrong_tool_from_round and turn >= self.wrong_tool_from_round:
            other = next((n for n in names if n != calls[0][0]), None)
            if other is not None:
                schema = next(t.get("parameters") or {} for t in tools if t["name"] == other)
                calls = [(other, json.dumps(valid_value(schema)))]
        if calls and self.drop_client_ids and any(not re.fullmatch(r"functions\.[\w.-]+:\d+", str(i))
                                                  for i in history):
            return {"content": "", "reasoning": reasoning, "calls": []}
        content = None if calls else "I can answer that without a tool."
        return {"content": content, "reasoning": reasoning, "calls": calls, "first_id": len(history)}

    def answer(self, body: dict) -> dict:
        """The assistant message parts for ``body``: content, reasoning, calls [(name, arguments JSON)]."""
        a = self.converse(body) if self.conversation else self._answer(body)
        if self.think_leak_rate and self._strikes("think_leak", self.think_leak_rate):
            a = {**a, "content": f"{a['reasoning'] or ''}</think>{a['content'] or ''}", "reasoning": None}
        return a

    def _answer(self, body: dict) -> dict:
        messages = body.get("messages") or []
        tools = [t.get("function", t) for t in body.get("tools") or []]
        user = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "") or ""
        kwargs = body.get("chat_template_kwargs") or {}
        on = kwargs.get("thinking", True) is not False
        reasoning = {"honour": on, "always": True, "never": False}[self.thinking]
        choice = body.get("tool_choice")
        calls: list[tuple[str, str]] = []
        m = DIRECTIVE.search(user if isinstance(user, str) else "")
        if tools and choice != "none":
            if m and m.group(1) in {t["name"] for t in tools}:
                name, args = m.group(1), json.loads(m.group(2))
                args = self.mutate.get(name, lambda a: a)(args)
                calls = [(name, json.dumps(args, ensure_ascii=False))]
            else:
                tool = tools[0]
                if isinstance(choice, dict):
                    tool = next(t for t in tools if t["name"] == choice["function"]["name"])
                schema = tool.get("parameters") or {"type": "object"}
                args = valid_value(schema)
                if self._next_broken():
                    args = broken(args, schema)
                calls = [(tool["name"], json.dumps(args, ensure_ascii=False))]
        content = None if calls else "Yes."
        return {"content": content, "reasoning": "Let me think about it." if reasoning else None, "calls": calls}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                 "owned_by": "sglang"}]})
                elif self.path in ("/health", "/health_generate", "/ready"):
                    self._send(200, b"", "text/plain")
                elif self.path == "/model_info" and server.model_info:
                    self._send(200, {"model_path": "/models/kimi", "tool_call_parser": "kimi_k2",
                                     "reasoning_parser": "kimi_k2", "served_model_name": MODEL})
                elif self.path == "/server_info" and server.model_info:
                    self._send(200, {"version": "0.5.23", "tool_call_parser": "kimi_k2",
                                     "reasoning_parser": "kimi_k2",
                                     **({"enable_deterministic_inference": True} if server.deterministic else {}),
                                     **server.extra_info})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.requests.append(body)
                    count = len(server.requests)
                if server.error_every and count % server.error_every == 0:
                    self._send(500, {"object": "error", "message": "scripted failure", "code": 500})
                    return
                rule = server.refuse_sampling
                if rule and any(body.get(k) != v for k, v in rule.items()):
                    self._send(400, {"object": "error", "code": 400, "message": f"invalid sampling: only {rule} "
                                                                                "is allowed for this model"})
                    return
                if not isinstance(body.get("messages"), list):
                    self._send(400, {"object": "error", "message": "messages must be a list", "code": 400})
                    return
                level = server.enter()
                try:
                    a = server.answer(body)
                    if server.fail_from_concurrency and level >= server.fail_from_concurrency and \
                            server._strikes("concurrency", server.concurrency_fault_rate):
                        a = {**a, "content": "", "calls": []}
                finally:
                    server.leave()
                usage = {"prompt_tokens": server.prompt_tokens(body), "completion_tokens": 12, "total_tokens": 0}
                if server.prefix_cache:
                    key = json.dumps(body.get("messages"), sort_keys=True)
                    with server.lock:
                        seen = key in server.seen_prompts
                        server.seen_prompts.add(key)
                    hit = seen and server.prefix_cache != "miss"
                    usage["prompt_tokens_details"] = {"cached_tokens": usage["prompt_tokens"] if hit else 0}
                    if hit and server.prefix_cache == "changes" and a["content"]:
                        a = {**a, "content": a["content"] + " (from cache)"}
                finish = "tool_calls" if a["calls"] else "stop"
                first = a.get("first_id", 0)
                calls = [{"id": f"functions.{n}:{first + k}", "type": "function",
                          "function": {"name": n, "arguments": args}} for k, (n, args) in enumerate(a["calls"])]
                if not body.get("stream"):
                    msg = {"role": "assistant", "content": a["content"], "reasoning_content": a["reasoning"],
                           "tool_calls": calls or None}
                    self._send(200, {"id": "cmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
                                     "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                                     "usage": usage})
                    return
                frames = [{"role": "assistant", "content": ""}]
                if a["reasoning"]:
                    frames.append({"reasoning_content": a["reasoning"]})
                if a["content"]:
                    frames.append({"content": a["content"]})
                for k, call in enumerate(calls):
                    args = call["function"]["arguments"]
                    frames.append({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
                    for i in range(0, len(args), 7):
                        frames.append({"tool_calls": [{"index": k, "function": {"arguments": args[i:i + 7]}}]})
                chunks = [{"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                           "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in frames]
                chunks.append({"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                               "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage})
                data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

        return Handler
