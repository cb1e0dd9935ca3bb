"""What a hostile server names itself reaches the terminal as literal text (kimi_deploy/wire/printable.py).

A real loopback server (``http.server``) calls its model ``m[/]`` plus an ESC sequence that sets the
window title and clears the screen, a carriage return and a right-to-left override, and reports a
version in the same style. Before the fix ``check`` and ``bench`` printed the ESC bytes raw (a server
could overwrite a ``fail`` row with ``pass``) and stopped with Rich's ``MarkupError`` traceback on the
``[/]`` (exit 1, as if a check had failed).
"""

from __future__ import annotations

import json

import pytest

from helpers import run_cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.wire.printable import markup, printable
from loopback import Loopback, QuietHandler

#: A model name and a version a hostile server may report: Rich markup, an OSC title, a clear screen, CR, RLO.
NAME = "m[/][bold]\x1b]0;PWNED\x07\x1b[2J\r\u202e"
VERSION = "0.5.23[/]\x1b[31m"
SHOWN = "m\\[/]\\[bold]\\x1b]0;PWNED\\x07\\x1b[2J\\r\\u202e"


def test_printable_escapes_controls_and_bidi_and_markup_escapes_tags():
    assert printable("a\x1b[2Jb\u202ec\u2066d\u200fe\x85") == "a\\x1b[2Jb\\u202ec\\u2066d\\u200fe\\x85"
    assert printable("caf\u00e9 \u4e2d \U0001f600 \u200d") == "caf\u00e9 \u4e2d \U0001f600 \u200d"  # text stays
    assert markup(NAME) == SHOWN
    assert markup(3) == "3"


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": NAME, "object": "model"}]})
        if self.path in ("/server_info", "/get_server_info"):
            return self._send(200, {"version": VERSION})
        if self.path in ("/health", "/health_generate"):
            return self._send(200, b"")
        return self._send(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/chat/completions":  # bench's /flush_cache
            return self._send(200, b"")
        request = json.loads(raw)
        if request.get("stream"):
            events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            return self._send(200, data, "text/event-stream")
        return self._send(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": "hi"}}]})


@pytest.fixture
def server():
    with Loopback(_Handler) as http:
        yield http.url


def _assert_literal(output: str) -> None:
    # run_cli does not catch exceptions: Rich's MarkupError would fail the test where it is raised
    assert "\x1b" not in output and "\u202e" not in output and "\x07" not in output, output


def test_check_shows_a_hostile_model_name_and_version_as_text(server, tmp_path):
    result = run_cli(["check", "--base-url", server, "--only", "health.*,contract.plain.nonstream", "--json",
                      str(tmp_path / "r.json")])
    _assert_literal(result.output)
    assert result.exit_code in (ExitCode.OK, ExitCode.FAILED), result.output
    assert f"({printable(NAME)})" in result.output and printable(VERSION) in result.output, result.output
    assert (tmp_path / "r.json").is_file()


def test_bench_shows_a_hostile_model_name_as_text(server, tmp_path):
    result = run_cli(["bench", "--base-url", server, "--concurrency", "1", "--num-prompts", "1", "--max-tokens", "4",
                      "--json", str(tmp_path / "b.json")])
    _assert_literal(result.output)
    assert result.exit_code == ExitCode.OK, result.output
    assert f"(model {printable(NAME)}," in result.output, result.output
    assert json.loads((tmp_path / "b.json").read_text())["model"] == NAME  # the result keeps the real name
