"""``readiness.probe_ready`` (status, restart --wait) against a web server that answers every path with 200.

New-operator trial: an nginx welcome page on the profile's port read as a ready SGLang (both probes are 200).
SGLang 0.5.23's ``/model_info`` is a JSON object; anything else on that port is not the server.
"""

from __future__ import annotations

from kimi_deploy.host.readiness import probe_ready
from loopback import Loopback, QuietHandler


class Page(QuietHandler):
    def do_GET(self):  # noqa: N802
        self._send(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")


class Sglang(QuietHandler):
    def do_GET(self):  # noqa: N802
        self._send(200, b"" if self.path == "/health_generate" else b'{"model_path": "/m"}')


def test_a_web_page_is_not_ready_and_says_why():
    with Loopback(Page) as server:
        probe = probe_ready(server.url)
    assert not probe.ready and probe.stage == "/model_info" and "another server on this port" in probe.detail


def test_sglang_answers_are_ready():
    with Loopback(Sglang) as server:
        assert probe_ready(server.url).ready
