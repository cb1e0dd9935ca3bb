"""Stream-shape validator: the SSE framing of a streamed chat completion.

Rules (OpenAI chat-completions streaming; issue #5): no ``{"error": ...}`` frame; the stream
ends with ``data: [DONE]``; each choice gets exactly one non-null ``finish_reason``; tool-call
``index`` values are integers, dense from 0; each call's ``id`` and ``function.name`` are sent
once (in its first delta) and never changed; the concatenated ``arguments`` equal the
non-streamed ones (compared as JSON when both parse). The streamed message is then
assembled so that :func:`kimi_deploy.check.completion_rules.check_message` can judge it like a
non-streamed one. A malformed stream is the root cause of what follows from it
(:func:`root_cause`): the check reports ``stream_shape``, the consequences go in its detail.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kimi_deploy.check.results import clip
from kimi_deploy.check.completion_rules import PRIORITY, Finding, Message, ToolCall
from kimi_deploy.wire.sse import frame_all


#: At most this many items of a list (tool-call indices, consequences of a root cause) are written into one
#: detail: a stream of 50,000 calls must not make a detail of megabytes (issue #30).
SHOWN = 10


@dataclasses.dataclass
class SSE:
    """A parsed event stream: ``frames`` (JSON objects in order), ``done`` (``[DONE]`` seen),
    ``errors`` (frames carrying ``error``), ``bad`` (data lines that are not JSON)."""

    frames: list[dict[str, Any]]
    done: bool
    errors: list[dict[str, Any]]
    bad: list[str]


def parse_sse(raw: str) -> SSE:
    """Parse server-sent events text with the kit's one framer (:class:`kimi_deploy.wire.sse.Framer`: CRLF, LF
    or CR line ends, ``data:`` lines joined with LF, comments and other fields ignored).

    An event the stream left without its final blank line is still read (a server ending with
    ``data: [DONE]`` and no blank line is not blamed for a missing ``[DONE]``). The body was read
    under the run's caps (:class:`kimi_deploy.check.client.RecordingTransport`), so no cap here.
    """
    events, last = frame_all(raw.encode("utf-8", "surrogatepass"))
    if last is not None:
        events.append(last)
    frames, errors, bad, done = [], [], [], False
    for event in events:
        data = event.decode("utf-8", "replace")
        if not data.strip():
            continue
        if data.strip() == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # not JSON, or nested past the stack
            bad.append(data)
            continue
        if isinstance(obj, dict) and obj.get("error") is not None:
            errors.append(obj)
        elif isinstance(obj, dict):
            frames.append(obj)
        else:
            bad.append(data)
    return SSE(frames, done, errors, bad)


def assemble(frames: list[dict[str, Any]], choice_index: int = 0) -> Message:
    """The message a client builds from ``chat.completion.chunk`` frames (one choice)."""
    content, reasoning = [], []
    calls: dict[int, ToolCall] = {}
    pieces: dict[int, list[str]] = {}  # arguments joined once at the end: appending to a str is quadratic
    finish = None
    tokens = None
    for frame in frames:
        if frame.get("usage"):
            tokens = frame["usage"].get("completion_tokens", tokens)
        for choice in frame.get("choices") or []:
            if choice.get("index", 0) != choice_index:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if r:
                reasoning.append(r)
            for tc in delta.get("tool_calls") or []:
                idx = tc.get("index")
                idx = idx if isinstance(idx, int) else len(calls)
                fn = tc.get("function") or {}
                call = calls.setdefault(idx, ToolCall(None, None, ""))
                call.id = call.id or tc.get("id")
                call.name = call.name or fn.get("name")
                if fn.get("arguments"):
                    pieces.setdefault(idx, []).append(fn["arguments"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    for idx, parts in pieces.items():
        calls[idx].arguments = "".join(parts)  # a piece that is not a string: TypeError, an unreadable answer
    return Message(content="".join(content) if content else None,
                   reasoning="".join(reasoning) if reasoning else None,
                   tool_calls=[calls[k] for k in sorted(calls)], finish_reason=finish,
                   completion_tokens=tokens)


def _same_arguments(a: Any, b: Any) -> bool:
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b)
    except (TypeError, ValueError):
        return False


def check_shape(sse: SSE, nonstream: Message | None = None) -> list[Finding]:
    """Framing findings (``error_frame``, ``stream_shape``) for a parsed stream.

    ``nonstream``: the non-streamed answer to the same request; when given, the streamed
    calls' arguments must equal its calls' arguments, call by call.
    """
    out: list[Finding] = []
    for err in sse.errors:
        e = err.get("error")
        message = e.get("message") if isinstance(e, dict) else e
        out.append(Finding("error_frame", "the stream carried an error frame", clip(message)))
    if sse.bad:
        out.append(Finding("stream_shape", f"{len(sse.bad)} data line(s) are not JSON", clip(sse.bad[0]), cause=True))
    if not sse.done:
        out.append(Finding("stream_shape", "the stream ended without data: [DONE]",
                           clip(json.dumps(sse.frames[-1])) if sse.frames else ""))
    finishes: dict[int, int] = {}
    seen_id: dict[tuple[int, int], str] = {}
    seen_name: dict[tuple[int, int], str] = {}
    indices: dict[int, list[int]] = {}  # first-seen order; membership in ``known``: linear in the calls
    known: dict[int, set[int]] = {}
    for frame in sse.frames:
        for choice in frame.get("choices") or []:
            ci = choice.get("index", 0)
            if choice.get("finish_reason") is not None:
                finishes[ci] = finishes.get(ci, 0) + 1
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                idx = tc.get("index")
                if not isinstance(idx, int) or isinstance(idx, bool):
                    out.append(Finding("stream_shape", f"tool_call delta index {idx!r} is not an integer",
                                       clip(json.dumps(tc)), cause=True))
                    continue
                order, got = indices.setdefault(ci, []), known.setdefault(ci, set())
                if idx not in got:
                    got.add(idx)
                    order.append(idx)
                fn = tc.get("function") or {}
                for key, value, seen in (("id", tc.get("id"), seen_id), ("name", fn.get("name"), seen_name)):
                    if value:
                        if (ci, idx) in seen:
                            out.append(Finding("stream_shape", f"tool call {idx}: {key} sent again "
                                               f"({seen[(ci, idx)]!r} then {value!r})", clip(json.dumps(tc)),
                                               cause=True))
                        else:
                            seen[(ci, idx)] = value
    for ci in sorted(set(finishes) | {c.get("index", 0) for f in sse.frames for c in f.get("choices") or []}):
        n = finishes.get(ci, 0)
        if n != 1 and not sse.errors:
            out.append(Finding("stream_shape", f"choice {ci} got {n} finish_reason values (expected exactly one)"))
    for ci, order in indices.items():
        if order != list(range(len(order))):
            shown = ", ".join(map(str, order[:SHOWN])) + (f", ... ({len(order)} in all)" if len(order) > SHOWN else "")
            out.append(Finding("stream_shape", f"tool_call indices of choice {ci} are [{shown}], "
                               "not dense from 0 in order", clip(shown), cause=True))
        for key, seen in (("an id", seen_id), ("a function name", seen_name)):
            missing = [idx for idx in order if (ci, idx) not in seen]
            if missing:
                more = f" (and {len(missing) - 1} more calls)" if len(missing) > 1 else ""
                out.append(Finding("stream_shape", f"tool call {missing[0]} never got {key}{more}", cause=True))
    if nonstream is not None and not sse.errors:
        streamed = assemble(sse.frames)
        a = [(c.name, c.arguments) for c in streamed.tool_calls]
        b = [(c.name, c.arguments) for c in nonstream.tool_calls]
        if len(a) == len(b):
            for (name, sa), (_, na) in zip(a, b):
                if not _same_arguments(sa, na):
                    out.append(Finding("stream_shape", f"streamed arguments of {name} differ from the "
                                       "non-streamed ones", clip(f"{sa!r} vs {na!r}")))
                    break
    return out


def root_cause(findings: list[Finding]) -> list[Finding]:
    """Root cause first: when the stream itself is malformed (a finding with ``cause``, e.g.
    tool-call deltas without an integer ``index``), the check reports ``stream_shape`` and the
    consequences it caused (a call with no name, invalid arguments) go into its detail.

    ``findings``: the stream-shape and message findings of one answer. Returns them unchanged
    when there is no root cause; else the first root cause (detail extended with every other
    finding's kind and detail) followed by the other root causes.
    """
    causes = [f for f in findings if f.cause]
    if not causes:
        return findings
    top, rest = causes[0], [f for f in findings if not f.cause]
    rest.sort(key=lambda f: PRIORITY.index(f.kind) if f.kind in PRIORITY else len(PRIORITY))
    if rest:
        distinct = list(dict.fromkeys(f"{f.kind}: {f.detail}" for f in rest))
        caused = "; ".join(distinct[:SHOWN]) + (f"; and {len(distinct) - SHOWN} more" if len(distinct) > SHOWN
                                                 else "")
        top = dataclasses.replace(top, detail=f"{top.detail}; as a result: {caused}")
    return [top, *causes[1:]]
