"""Root cause first: a malformed stream is reported as ``stream_shape``, its consequences in the detail.

A server that streams tool-call deltas without ``index`` makes a client assemble calls with no name
and argument fragments; the check used to report the consequence (``unknown_tool``) as its kind.
"""

from __future__ import annotations

import json

import pytest

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.stream import assemble, check_shape, parse_sse, root_cause
from kimi_deploy.check.completion_rules import Expectation, check_message, first
from loopback import Loopback, QuietHandler

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def frames(index: bool = False) -> list[dict]:
    """One call streamed in three deltas; ``index`` omitted unless asked (the malformed server)."""
    deltas = [{"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather",
                                                                                "arguments": ""}},
              {"function": {"arguments": '{"city": '}}, {"function": {"arguments": '"Melbourne"}'}}]
    if index:
        for d in deltas:
            d["index"] = 0
    out = [{"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}]
    out += [{"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"tool_calls": [d]}, "finish_reason": None}]} for d in deltas]
    out.append({"id": "c", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return out


def sse(items: list[dict]) -> str:
    return "".join(f"data: {json.dumps(f)}\n\n" for f in items) + "data: [DONE]\n\n"


def test_deltas_without_index_are_stream_shape_with_the_consequences_in_the_detail():
    parsed = parse_sse(sse(frames()))
    msg = assemble(parsed.frames)
    findings = root_cause(check_shape(parsed) + check_message(msg, Expectation(tools=(WEATHER,), call="one")))
    top = first(findings)
    assert top.kind == "stream_shape" and "index None is not an integer" in top.detail
    assert "as a result: unknown_tool: call names None" in top.detail and "invalid_arguments" in top.detail


def test_a_well_formed_stream_is_unchanged():
    parsed = parse_sse(sse(frames(index=True)))
    msg = assemble(parsed.frames)
    findings = root_cause(check_shape(parsed) + check_message(msg, Expectation(tools=(WEATHER,), call="one")))
    assert findings == []


class NoIndexHandler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path in ("/health", "/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": "kimi", "object": "model"}]}).encode(),
                       "application/json")
        else:
            self._send(404, b'{"detail": "Not Found"}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, sse(frames()).encode(), "text/event-stream")


@pytest.fixture
def no_index_server():
    with Loopback(NoIndexHandler) as server:
        yield server.url


def test_check_reports_the_malformed_stream_not_the_unknown_tool(no_index_server):
    report = run_checks(CheckOptions(base_url=no_index_server, only=["contract.tool_auto.stream"], timeout=5,
                                     repeat=0))
    [row] = [r for r in report.results if r.id == "contract.tool_auto.stream"]
    assert (row.status, row.kind) == ("fail", "stream_shape"), row
    assert "not an integer" in row.detail and "as a result: unknown_tool" in row.detail
