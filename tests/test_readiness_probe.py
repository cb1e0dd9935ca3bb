"""The readiness verdict (:func:`kimi_deploy.wire.readiness.probe`: status, restart --wait, check's health.ready)
against a web server that answers every path with 200.

New-operator trial: an nginx welcome page on the profile's port read as a ready SGLang (both probes were 200).
SGLang 0.5.23's ``/health_generate`` answers an empty body; a page there is no generation, and the 1-token chat
completion that decides instead gets a page too, which is no ``chat.completion``.
"""

from __future__ import annotations

from kimi_deploy.wire.readiness import probe_url
from loopback import Loopback, QuietHandler


class Page(QuietHandler):
    def do_GET(self):  # noqa: N802
        self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")

    do_POST = do_GET  # noqa: N815


class Sglang(QuietHandler):
    def do_GET(self):  # noqa: N802
        self._send(200, b"" if self.path == "/health_generate" else b'{"model_path": "/m"}')


def test_a_web_page_is_not_ready_and_says_why():
    with Loopback(Page) as server:
        probe = probe_url(server.url, model="kimi")
    assert not probe.ready and probe.path == "/v1/chat/completions" and "another server on this port" in probe.reason
    assert "a web page" in probe.reason


def test_sglang_answers_are_ready():
    with Loopback(Sglang) as server:
        probe = probe_url(server.url)
    assert probe.ready and probe.path == "/health_generate" and "a 1-token generation" in probe.reason
