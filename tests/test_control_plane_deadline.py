"""The control-plane clients (the readiness verdict behind status and restart --wait, status's JSON reads, the
gateway's worker API, restart's idle wait) end each request at its time whatever the server sends.

A trial after issue 30 found ``status`` and ``restart --wait --timeout 20`` still running after 300 s against
servers that keep a request alive without ever answering it (a head one byte at a time, endless ``100 Continue``
heads, an endless body): httpx's timeouts bound each socket read, not an answer. They now go through
:func:`kimi_deploy.wire.http.control_client` (:mod:`kimi_deploy.wire.bounded` at the socket).

Real loopback servers (:mod:`hostile_raw`) that keep going for 120 s; each call runs in a thread that the test
waits for up to :data:`GENEROUS_S`, far above the bound under test and far below the servers' 120 s, so the
test never races the clock: before the fix every call was still running when the wait ended.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from hostile_raw import CONTINUE, RawServer, forever
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.host.gateway import Gateway
from kimi_deploy.host.readiness import get_json
from kimi_deploy.host.restart import wait_idle
from kimi_deploy.wire.readiness import probe_url

GENEROUS_S = 60.0


def _slow_head(method, path, body, out):
    forever(out, b"H", 0.2)  # "HTTP/1.1 200 ..." never completes


def _continues(method, path, body, out):
    forever(out, CONTINUE, 0.2)


def _endless_body(method, path, body, out):
    out.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    forever(out, b"1\r\n \r\n", 0.2)


SERVERS = {"a head one byte at a time": _slow_head, "endless 100 Continue heads": _continues,
           "an endless body": _endless_body}


def _within(call: Callable[[], Any]) -> Any:
    """``call()``'s result (or the KimiDeployError it raised), asserting it returned within GENEROUS_S."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except KimiDeployError as exc:
            box["result"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GENEROUS_S)
    assert not thread.is_alive(), "the request was still running: the server held it open"
    return box["result"]


@pytest.mark.parametrize("answer", SERVERS.values(), ids=SERVERS.keys())
def test_the_readiness_verdict_ends_at_its_timeout(answer):
    with RawServer(answer) as server:
        verdict = _within(lambda: probe_url(server.url, "sk-test", "m", timeout=1.0))
    assert not verdict.ready and verdict.state != "unreachable", verdict.to_dict()


@pytest.mark.parametrize("answer", SERVERS.values(), ids=SERVERS.keys())
def test_status_reads_of_server_info_end_at_their_timeout(answer):
    with RawServer(answer) as server:
        assert _within(lambda: get_json(server.url, "/server_info", "sk-test", timeout=1.0)) is None


@pytest.mark.parametrize("answer", SERVERS.values(), ids=SERVERS.keys())
def test_the_gateway_worker_list_ends_at_its_timeout(answer):
    with RawServer(answer) as server:
        client = Gateway(server.url, "sk-test", timeout=1.0)
        try:
            failure = _within(client.workers)
        finally:
            client.close()
    assert isinstance(failure, KimiDeployError), failure


def test_restarts_idle_wait_ends_at_its_request_time():
    # one poll, whose request may take max(poll, 10) s: the wait goes on after the gateway's drain
    with RawServer(_slow_head) as server:
        note = _within(lambda: wait_idle(server.url, "sk-test", timeout=1.0, poll=0.1, clock=lambda: 0.0,
                                         sleep=lambda s: None))
    assert "did not answer /v1/loads" in note
