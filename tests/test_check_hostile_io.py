"""`kimi-deploy check` against servers whose answers are too big, never end, or are compressed
although ``identity`` was asked for (issue #11 item 9): every one ends as a failed row with its
evidence, the reports are written, and nothing past the caps is read.

One real loopback HTTP server; the first path segment picks its behaviour (``BASE/<mode>/health``),
so each test points ``--base-url`` at ``http://127.0.0.1:PORT/<mode>``. The health tier answers
normally except where a mode makes ``/health`` itself hostile.
"""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from install_fakes import write_profile
from helpers import run_cli
from loopback import send
from kimi_deploy.check.client import REFUSED_KIND
from kimi_deploy.check.stream import parse_sse
from kimi_deploy.errors import ExitCode

GZIP_BOMB = gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # 64 MiB of zeros in ~64 KiB
PIECE = b"x" * 65536


class Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    #: bytes each mode managed to write before the client hung up
    written: dict[str, int] = {}

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _endless(self, mode: str, first: bytes, piece: bytes, ctype: str) -> None:
        """Chunked, never ending: only the client's cap stops it (the connection closes then)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(first), first))
            while sent < (1 << 30):  # 1 GiB at most, should the client never stop
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except OSError:
            pass
        Hostile.written[mode] = sent

    def _mode_path(self) -> tuple[str, str]:
        parts = self.path.split("/", 2)
        return parts[1], parts[2] if len(parts) > 2 else ""

    def do_GET(self):  # noqa: N802
        mode, path = self._mode_path()
        if path in ("model_info", "server_info") and mode == "bigfacts":  # SGLang's facts, 32 MiB of them
            self._send(200, b'{"version": "0.5.23", "pad": "' + b"x" * (32 << 20) + b'"}')
        elif path == "health" and mode == "declared":  # says 1 GiB is coming
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            try:
                for _ in range(16):
                    self.wfile.write(PIECE)
            except OSError:
                pass
        elif path == "health" and mode == "endless":
            self._endless(mode, b"{", PIECE, "application/json")
        elif path == "health" and mode == "gzip":
            send(self, 200, GZIP_BOMB, headers={"Content-Encoding": "gzip"})
        elif path in ("health", "health_generate"):
            self._send(200, b"{}")
        elif path == "v1/models":
            self._send(200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self):  # noqa: N802
        mode, _ = self._mode_path()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        delta = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        if body.get("stream") and mode == "stream":  # chunks forever
            self._endless(mode, delta, delta * 500, "text/event-stream")
        elif body.get("stream") and mode == "line":  # one line that never ends
            self._endless(mode, b'data: {"choices":[{"delta":{"content":"', PIECE, "text/event-stream")
        elif mode == "stream" or mode == "line":
            self._send(200, json.dumps({"id": "c", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}).encode())
        else:  # a JSON body that never ends
            self._endless(mode, b'{"choices": [', b" " * 65536, "application/json")


@pytest.fixture(scope="module")
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    server.block_on_close = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _check(tmp_path, url, *args):
    result = run_cli(["check", "--base-url", url, "--model", "m", *args, "--json", str(tmp_path / "r.json"),
                      "--junit", str(tmp_path / "r.xml")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert (tmp_path / "r.xml").exists()
    return result, {c["id"]: c for c in report["checks"]}


def test_a_declared_1_gib_body_is_refused_unread(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/declared", "--only", "health.live")
    live = checks["health.live"]
    assert result.exit_code == ExitCode.FAILED, result.output
    assert (live["status"], live["kind"]) == ("fail", REFUSED_KIND), live
    assert "Content-Length 1073741824 is over --max-body-bytes 16777216 (16 MiB)" in live["detail"], live
    assert "Content-Length: 1073741824" in live["evidence"]


def test_an_endless_body_stops_at_the_cap(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/endless", "--only", "health.live", "--max-body-bytes", "1M")
    live = checks["health.live"]
    assert (live["status"], live["kind"]) == ("fail", REFUSED_KIND), live
    assert "the body exceeded --max-body-bytes 1048576 (1 MiB)" in live["detail"], live
    assert result.exit_code == ExitCode.FAILED  # an answer, too big: not "unreachable" (3)


def test_a_gzip_bomb_is_refused_not_decoded(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/gzip", "--only", "health.live")
    live = checks["health.live"]
    assert (live["status"], live["kind"]) == ("fail", REFUSED_KIND), live
    assert "Content-Encoding: gzip" in live["evidence"] and "not decoded" in live["detail"], live


def test_an_endless_stream_fails_its_row_and_the_run_goes_on(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/stream", "--only", "contract.plain.*", "--max-body-bytes", "1M")
    stream, plain = checks["contract.plain.stream"], checks["contract.plain.nonstream"]
    assert (stream["status"], stream["kind"]) == ("fail", REFUSED_KIND), stream
    assert "/v1/chat/completions was refused" in stream["detail"] and "--max-body-bytes" in stream["detail"], stream
    assert plain["status"] == "pass", plain
    assert result.exit_code == ExitCode.FAILED


def test_a_line_that_never_ends_is_refused_at_the_line_cap(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/line", "--only", "contract.plain.stream",
                            "--max-line-bytes", "64K")
    row = checks["contract.plain.stream"]
    assert (row["status"], row["kind"]) == ("fail", REFUSED_KIND), row
    assert "an SSE line exceeded --max-line-bytes 65536" in row["detail"], row
    assert Hostile.written["line"] < (16 << 20)  # the client hung up long before the server's 1 GiB


def test_an_endless_non_streamed_answer_stops_at_the_cap(tmp_path, hostile):
    result, checks = _check(tmp_path, f"{hostile}/json", "--only", "contract.plain.nonstream",
                            "--max-body-bytes", "1M")
    row = checks["contract.plain.nonstream"]
    assert (row["status"], row["kind"]) == ("fail", REFUSED_KIND), row
    assert "the body exceeded --max-body-bytes" in row["detail"], row


def test_stream_text_is_framed_by_the_shared_framer():
    """CR-only line ends (allowed by the SSE spec) and one leading space kept after the first."""
    sse = parse_sse('data: {"choices": []}\r\rdata:  {"a":\rdata: 1}\r\rdata: [DONE]')
    assert sse.done and sse.frames == [{"choices": []}, {"a": 1}] and not sse.bad


def test_deeply_nested_frames_are_bad_frames_not_a_crash():
    sse = parse_sse("data: " + "[" * 100_000 + "\n\ndata: [DONE]\n\n")
    assert sse.done and len(sse.bad) == 1


def test_facts_refused_unread_fail_the_config_and_parser_tiers_rather_than_skip(tmp_path, hostile):
    """/model_info and /server_info answer, over --max-body-bytes: with a profile that expects SGLang's
    facts, that is a hostile or broken answer (a failed row), not a server without the facts (a skip)."""
    profile = write_profile(tmp_path / "p.toml", api_key=False)
    result, checks = _check(tmp_path, f"{hostile}/bigfacts", "--profile", str(profile), "--only",
                            "config.*,parser.*")
    assert result.exit_code == ExitCode.FAILED, result.output
    assert checks and all((c["status"], c["kind"]) == ("fail", REFUSED_KIND) for c in checks.values()), checks
    assert all("over --max-body-bytes" in c["detail"] or "exceeded --max-body-bytes" in c["detail"]
               for c in checks.values()), checks

