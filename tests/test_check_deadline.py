"""``check --deadline`` and ``--timeout`` are wall-clock bounds whatever the server sends (issue #30 item 7).

Real loopback servers (:mod:`hostile_raw`) that keep a request alive without ever answering it: endless
``HTTP/1.1 100 Continue`` heads (httpcore skips 1xx heads, each within the read timeout), a body one byte at a
time; one that answers without an HTTP status line (HTTP/0.9 style). Each test asserts what the report says
(which bound ended the request, that the server did answer) and that the run ends within a bound generous
enough never to race the clock (the servers keep going for 120 s; before the fix the runs lasted that long).
"""

from __future__ import annotations

import gc
import json
import math
import time

import httpx

from helpers import run_cli
from hostile_raw import CONTINUE, RawServer, forever, ordinary
from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.client import Clients, Deadline
from kimi_deploy.check.stream import assemble, check_shape, parse_sse, root_cause
from kimi_deploy.errors import ExitCode

#: Far below the 120 s the hostile servers keep a request alive, far above what the bounded runs take.
GENEROUS_S = 60.0



def _check(tmp_path, url: str, *args: str) -> tuple[int, dict, float]:
    out = tmp_path / "report.json"
    t0 = time.monotonic()
    result = run_cli(["check", "--base-url", url, "--json", str(out), *args])
    return result.exit_code, json.loads(out.read_text()), time.monotonic() - t0


def _rows(report: dict) -> dict[str, dict]:
    return {row["id"]: row for row in report["checks"]}


def test_endless_100_continue_heads_end_at_the_request_time_and_the_deadline(tmp_path):
    def answer(method, path, body, out):
        forever(out, CONTINUE, 0.2)

    with RawServer(answer) as server:
        code, report, took = _check(tmp_path, server.url, "--timeout", "1", "--deadline", "5")
    assert took < GENEROUS_S
    rows = _rows(report)
    live = rows["health.live"]
    assert live["kind"] == "timeout" and "ran past its time of 1 s" in live["detail"]
    assert "100 Continue" in live["evidence"]
    assert any("deadline" in r["detail"] for r in report["checks"])
    # bytes came back: the server answered, so the run is not "unreachable" (exit 3) but failed
    assert code == report["exit_code"] == ExitCode.FAILED


def test_100_continue_to_every_post_ends_at_the_deadline(tmp_path):
    def answer(method, path, body, out):
        if method == "POST":
            forever(out, CONTINUE, 0.2)
        else:
            ordinary(method, path, out)

    with RawServer(answer) as server:
        code, report, took = _check(tmp_path, server.url, "--timeout", "30", "--deadline", "4",
                                    "--only", "health.*,contract.*")
    assert took < GENEROUS_S
    assert report["duration_s"] < GENEROUS_S
    rows = _rows(report)
    assert rows["health.live"]["status"] == "pass"
    sent = [r for r in report["checks"] if r["id"].startswith("contract.") and "not attempted" not in r["evidence"]]
    assert sent and all(r["kind"] == "timeout" and "deadline (--deadline 4 s)" in r["detail"] for r in sent)
    assert code == ExitCode.FAILED


def test_a_body_trickled_byte_by_byte_ends_at_the_request_time(tmp_path):
    def answer(method, path, body, out):
        out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        forever(out, b" ", 0.1)

    with RawServer(answer) as server:
        code, report, took = _check(tmp_path, server.url, "--timeout", "1", "--deadline", "600",
                                    "--only", "health.live")
    assert took < GENEROUS_S
    live = _rows(report)["health.live"]
    assert live["kind"] == "timeout" and "ran past its time" in live["detail"]
    assert code == ExitCode.FAILED


def test_an_http_0_9_answer_is_a_broken_answer_not_an_unreachable_server(tmp_path):
    def answer(method, path, body, out):
        out.write(b'{"status": "ok"}')  # no status line, no headers, then the connection closes

    with RawServer(answer) as server:
        code, report, _ = _check(tmp_path, server.url, "--only", "health.live")
    live = _rows(report)["health.live"]
    assert live["kind"] == "invalid_response" and "not HTTP/1.x" in live["detail"]
    assert '{"status": "ok"}' in live["evidence"]
    assert code == ExitCode.FAILED


def test_a_connection_closed_with_no_byte_is_still_unreachable(tmp_path):
    with RawServer(lambda method, path, body, out: None) as server:
        code, report, _ = _check(tmp_path, server.url, "--only", "health.live")
    assert _rows(report)["health.live"]["kind"] == "unreachable"
    assert code == ExitCode.UNREACHABLE


def test_the_clients_still_use_an_httpx_connection_pool_they_can_bound():
    """httpx 0.28 takes no network backend: the check replaces ``HTTPTransport._pool``; an httpx that stops
    using it must fail here, not leave the deadline unenforced."""
    clients = Clients.open("http://127.0.0.1:9", None, 1.0, Deadline(5))
    try:
        transport = clients.http._transport
        assert type(transport._inner._pool._network_backend).__name__ == "_BoundedBackend"
        with httpx.Client(transport=transport) as plain:  # the same transport, used by hand
            try:
                plain.get("http://127.0.0.1:9/")
            except httpx.TransportError:
                pass
    finally:
        clients.close()


def _stream(n: int) -> str:
    frames = [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": f"functions.f:{i}", "type":
              "function", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": None}]} for i in range(n)]
    frames.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"


def _cpu(text: str, repeats: int = 3) -> float:
    """The least CPU time, in seconds, of ``repeats`` checks of one stream (``check_shape`` and ``assemble``),
    with the cyclic garbage collector off. A collection's cost is not the code's: the collector rescans what the
    parsed stream holds, and the large stream sets off full collections the small one does not (on a quiet
    machine 20-23x for 8x the calls with it on, 10-11x with it off), so with it on the old bound (24x for 8x
    the calls) was one busy moment from failing, and failed CI at 26.6x. The least of several runs drops what
    other processes on a busy host cost this one (cache, frequency)."""
    sse = parse_sse(text)
    best = math.inf
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t = time.process_time()
            check_shape(sse)
            assemble(sse.frames)
            best = min(best, time.process_time() - t)
    finally:
        if was_enabled:
            gc.enable()
    return best


def test_tool_call_indices_cost_linear_time():
    """12.5k / 25k / 50k indices cost 5.6 / 14.5 / 39.6 s before (a list scan per delta). Here 16x the calls
    cost 15-23x the time (see :func:`_cpu`; with three busy loops on 2 cores too), and 189x with that list scan
    put back; the bound, 50x, leaves each side more than twice its figure."""
    small, large = _cpu(_stream(2500)), _cpu(_stream(40000))
    assert large < 50 * max(small, 0.005)


def test_a_long_run_of_out_of_order_indices_makes_a_short_detail():
    frames = [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i}]}}]} for i in range(50000, 0, -1)]
    sse = parse_sse("".join(f"data: {json.dumps(f)}\n\n" for f in frames))
    findings = root_cause(check_shape(sse))
    assert findings and all(len(f.detail) < 2000 for f in findings)
    assert "50000 in all" in findings[0].detail


def test_run_checks_against_a_flood_reports_the_deadline_not_unreachable():
    def answer(method, path, body, out):
        forever(out, CONTINUE, 0.2)

    with RawServer(answer) as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["health.*"], timeout=30, deadline=3))
    assert report.answered and report.exit_code == ExitCode.FAILED
    assert "deadline (--deadline 3 s)" in report.results[0].detail
