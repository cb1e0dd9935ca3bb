"""One notion of "is it ready" shared by check, status and restart, in the same words (issue #30 item 4).

New-operator trial: against a server whose ``/health`` answers 200 and ``/model_info`` 404 (the kit's synthetic
server; any OpenAI-compatible server that is not SGLang; SGLang behind a proxy forwarding ``/v1`` and ``/health``)
``status`` said "health NOT READY (HTTP 404)" and ``restart --wait`` never saw it ready, while ``check`` passed
``health.ready`` with a 1-token chat completion. Each of the three now prints the verdict of
:func:`kimi_deploy.wire.readiness.probe`, word for word. Real loopback servers, the real verbs (systemctl and
journalctl are the recorded fakes of tests/install_fakes.py).
"""

from __future__ import annotations

import json

import pytest

from install_fakes import write_profile
from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.cli import cli
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.wire.readiness import NOT_READY, READY, UNREACHABLE, probe_url
from loopback import Loopback, QuietHandler, free_port

COMPLETION = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "length"}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class NotSglang(QuietHandler):
    """``/health`` 200, ``/model_info`` and ``/health_generate`` 404; it lists a model and completes chats."""

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            return self._send(200, b"")
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "kimi", "object": "model"}]})
        return self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/chat/completions":
            return self._send(200, COMPLETION)
        return self._send(404, {"detail": "Not Found"})


class Starting(QuietHandler):
    """SGLang while it loads: ``/health_generate`` 503."""

    def do_GET(self):  # noqa: N802
        self._send(503, {"detail": "starting"})


def _installed(tmp_path, port):
    root = tmp_path / "root"
    path = write_profile(tmp_path / "p.toml", port=port)
    apply(plan_install(load_profile(path), HostLayout(root), enable=False, create_user=False))
    return root


def _check_row(url):
    report = run_checks(CheckOptions(base_url=url, only=["health.ready"], timeout=10, deadline=60))
    (row,) = report.results
    return row


def _status_health(cli_runner, root):
    text = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False).output
    data = json.loads(cli_runner.invoke(cli, ["status", "--root", str(root), "--json"],
                                        catch_exceptions=False).output)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("health ")]
    return line.split(None, 1)[1], data["health"]


def test_health_200_and_no_model_info_is_one_verdict_in_check_status_and_restart(cli_runner, tmp_path,
                                                                                    fake_systemd):
    fake_systemd.serve_from_this_process()  # the loopback server is the unit's listener
    with Loopback(NotSglang) as server:
        verdict = probe_url(server.url, model="kimi")
        row = _check_row(server.url)
        root = _installed(tmp_path, server.port)
        status_words, health = _status_health(cli_runner, root)
        restarted = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "ready",
                                            "--poll-interval", "0.01", "--timeout", "5"], catch_exceptions=False)
    assert verdict.state == READY and verdict.method == "POST", verdict
    assert verdict.url == f"{server.url}/v1/chat/completions" and "HTTP 404" in verdict.reason
    words = verdict.words
    assert words.startswith(f"ready (POST {server.url}/v1/chat/completions: HTTP 200 OK, a 1-token chat completion")
    assert (row.status, row.detail) == ("pass", words)
    assert status_words == words and health["ready"] is True and health["state"] == READY
    assert health["url"] == verdict.url and health["words"] == words
    assert restarted.exit_code == 0, restarted.output
    assert f"  health {words}" in restarted.output.splitlines()


def test_a_starting_server_is_not_ready_in_the_same_words_everywhere(cli_runner, tmp_path, fake_systemd):
    fake_systemd.serve_from_this_process()  # the loopback server is the unit's listener
    with Loopback(Starting) as server:
        verdict = probe_url(server.url, model="kimi")
        row = _check_row(server.url)
        root = _installed(tmp_path, server.port)
        status_words, health = _status_health(cli_runner, root)
        restarted = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "ready",
                                            "--poll-interval", "0.5", "--timeout", "0.4"], catch_exceptions=False)
    words = f"NOT READY (GET {server.url}/health_generate: HTTP 503 Service Unavailable: the server cannot " \
            "generate yet)"
    assert verdict.state == NOT_READY and verdict.words == words
    assert row.status == "fail" and row.kind == "server_error" and row.detail == words
    assert status_words == words and health["ready"] is False and health["http_status"] == 503
    assert restarted.exit_code == 6, restarted.output
    assert f"  health {words}" in restarted.output.splitlines()


def test_nothing_listening_is_unreachable_in_check_and_status(cli_runner, tmp_path, fake_systemd):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    verdict = probe_url(url)
    row = _check_row(url)
    status_words, health = _status_health(cli_runner, _installed(tmp_path, port))
    assert verdict.state == UNREACHABLE and verdict.words.startswith(f"UNREACHABLE (GET {url}/health_generate: "
                                                                      "no connection (ConnectError")
    assert row.status == "fail" and row.kind == "unreachable" and row.detail.startswith(verdict.words)
    assert status_words == verdict.words and health["state"] == UNREACHABLE


@pytest.mark.parametrize(("answer", "state", "why"), [
    ((200, b"<html>Welcome to nginx!</html>", "text/html"), NOT_READY, "no chat.completion"),
    ((401, b'{"error": "Unauthorized"}', "application/json"), NOT_READY, "the API key is missing or refused"),
])
def test_what_is_not_a_generation_is_not_ready(answer, state, why):
    """A web page on every path (POST included) is no generation; a 401 is a key to give, not readiness."""
    status, body, ctype = answer

    class Page(QuietHandler):
        def do_GET(self):  # noqa: N802
            self._send(status, body, ctype)

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(status, body, ctype)

    with Loopback(Page) as server:
        verdict = probe_url(server.url, model="kimi")
    assert verdict.state == state and why in verdict.reason, verdict


def test_a_password_in_the_base_url_is_not_in_the_words():
    with Loopback(NotSglang) as server:
        verdict = probe_url(server.url.replace("http://", "http://user:s3cret@"), model="kimi")
    assert verdict.ready and "s3cret" not in verdict.words and verdict.url.startswith(server.url)
