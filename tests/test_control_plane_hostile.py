"""The kit's own control-plane clients against hostile answers (issue #11, the kind of items 8 and 9).

``status`` and ``restart --wait`` read the server's ``/server_info`` and probe its health; ``restart``
behind a gateway, ``status`` on a gateway host and ``check --each-worker`` read smg's ``GET /workers``.
Before, they read every body whole with httpx's transparent decompression (a 500 KB gzip body of
512 MB cost ``status`` 1 GB of RSS), and JSON nested 100,000 deep raised RecursionError (a traceback)
or a /workers answer that was not an object raised AttributeError. Now they read as ``check`` does
(:func:`kimi_deploy.wire.http.request_capped`): identity only, at most 16 MiB, unreadable JSON is no answer.
Real loopback servers (``http.server``).
"""

from __future__ import annotations

import gzip
import json

import pytest

from kimi_deploy.host.gateway import Gateway, GatewayError
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES
from kimi_deploy.host.readiness import get_json
from kimi_deploy.wire.readiness import probe_url
from loopback import Loopback, QuietHandler, send

INFO = json.dumps({"version": "0.5.23", "launch_command": "python -m sglang.launch_server"}).encode()
DEEP = b"[" * 100_000 + b"]" * 100_000


def _server(answer):
    """A loopback server answering every GET and POST with ``answer(handler)``."""
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's naming
            answer(self)

        do_POST = do_DELETE = do_GET  # noqa: N815

    return Loopback(Handler)


def _gzip(handler):
    send(handler, 200, gzip.compress(INFO), headers={"Content-Encoding": "gzip"})


def _declared_too_large(handler):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(DEFAULT_MAX_BODY_BYTES + 1))
    handler.end_headers()
    handler.close_connection = True  # nothing of the body is sent: the client must not wait for it


ANSWERS = {
    "gzip not asked for": _gzip,
    "JSON nested 100k deep": lambda h: send(h, 200, DEEP),
    "a body declared over the cap": _declared_too_large,
    "not JSON": lambda h: send(h, 200, b"\xff\xfe<html>", "text/html"),
}


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
def test_server_info_that_cannot_be_read_as_asked_is_no_answer(answer):
    with _server(answer) as server:
        assert get_json(server.url, "/server_info") is None


def test_a_plain_server_info_is_read_and_the_request_asks_for_identity():
    seen = []

    def plain(handler):
        seen.append(handler.headers.get("Accept-Encoding"))
        send(handler, 200, INFO)

    with _server(plain) as server:
        assert get_json(server.url, "/server_info") == json.loads(INFO)
    assert seen == ["identity"]


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
def test_health_generate_is_read_for_its_status_and_a_completion_must_be_one(answer):
    """SGLang's /health_generate body is empty, so its status alone counts, whatever the body (a page aside); where
    it is not served, the 1-token completion must be a chat.completion read within the caps (a gzip, oversized,
    deep or non-JSON one is none)."""
    with _server(answer) as server:
        probe = probe_url(server.url)
    assert probe.ready and probe.path == "/health_generate", probe
    with _server(lambda h: send(h, 404, b"") if h.path == "/health_generate" else answer(h)) as server:
        probe = probe_url(server.url, model="kimi")
    assert not probe.ready and probe.path == "/v1/chat/completions" and "no chat.completion" in probe.reason


WORKERS = {
    **ANSWERS,
    "a JSON list": lambda h: send(h, 200, b"[1, 2]"),
    "workers not a list": lambda h: send(h, 200, b'{"workers": 5}'),
    "a worker that is no object": lambda h: send(h, 200, b'{"workers": ["http://10.0.0.1:30000"]}'),
}


@pytest.mark.parametrize("answer", WORKERS.values(), ids=WORKERS.keys())
def test_a_gateway_worker_list_that_is_no_list_is_a_gateway_error(answer):
    with _server(answer) as server, Gateway(server.url, None) as gateway:
        with pytest.raises(GatewayError) as err:
            gateway.workers()
    assert err.value.exit_code == 1 and "not smg's worker list" in err.value.message
    assert len(str(err.value.value)) <= 200
