"""`kimi-deploy check` against servers that do not answer, answer too slowly, or answer errors.

Real loopback servers: a socket that accepts TCP but never answers (the kernel completes the
handshake from the listen backlog), an HTTP server whose health tier is fine but whose chat
completions hang or trickle one byte at a time, and one that answers every request with a
chosen HTTP status. The report paths are checked before the first request.

No test reads the wall clock: what a silent server was sent is read back from its listen backlog
after the run, and the deadline runs on :class:`helpers.FakeTime`, moved by the slow server itself.
"""

from __future__ import annotations

import json
import re
import socket
import functools
import time
from pathlib import Path

import jsonschema
import pytest

from helpers import FakeTime, run_cli
from loopback import Loopback, QuietHandler
from kimi_deploy import paths
from kimi_deploy.check import check_ids
from kimi_deploy.check.client import status_kind, status_label
from kimi_deploy.check.runner import run_checks
from kimi_deploy.cli.check import DEFAULT_DEADLINE_S
from kimi_deploy.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent


def validate(doc: dict) -> None:
    schema = json.loads(paths.check_report_schema().read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


#: What the health tier sends (health.live, health.ready, health.models), one connection each.
HEALTH_TIER_REQUESTS = ["GET /health", "GET /health_generate", "GET /v1/models"]


@pytest.fixture
def silent_url(silent):
    return silent.url


class _Quiet(QuietHandler):
    protocol_version = "HTTP/1.1"


def _serve(handler: type[QuietHandler]) -> Loopback:
    return Loopback(handler, wait_on_close=False)  # handlers still sleeping must not hold up the test


class SlowChatHandler(_Quiet):
    """Health tier fine; ``/hang/...`` chats never answer (the connection closes after 20 s),
    ``/trickle/...`` chats send a byte every 0.1 s, 200 of them, then close.

    ``time`` (a :class:`FakeTime`, when a test sets it) is the checking run's clock, moved by this
    server: a hanging chat moves it 2 s at once, a trickling one 0.1 s per byte (sent every 0.02 s).
    """

    time: FakeTime | None = None

    def _advance(self, seconds: float) -> None:
        if SlowChatHandler.time is not None:
            SlowChatHandler.time.advance(seconds)

    def do_GET(self):
        path = self.path.split("/", 2)[2] if self.path.count("/") >= 2 else ""
        if path in ("health", "health_generate"):
            self._send(200, b"{}")
        elif path == "v1/models":
            self._send(200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True  # the end of a chat is the end of its connection: no keep-alive wait
        if self.path.startswith("/hang/"):
            self._advance(2.0)
            time.sleep(20)
            return
        # headers at once, then an SSE comment byte every 0.1 s: no single read ever times out
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(200):
            try:
                self.wfile.write(b":")
                self.wfile.flush()
            except OSError:
                return
            self._advance(0.1)
            time.sleep(0.1 if SlowChatHandler.time is None else 0.02)


@pytest.fixture(scope="module")
def slow_chat():
    with _serve(SlowChatHandler) as server:
        yield server.url


def _json(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "r.json").read_text())


def test_silent_server_stops_after_the_health_tier_and_exits_3(tmp_path, silent, silent_url):
    """Accepts TCP, never answers: 3 health timeouts, then nothing else is sent; all reports written."""
    result = run_cli(["check", "--base-url", silent_url, "--timeout", "0.3", "--model", "m",
                      "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
                      "--prom", str(tmp_path / "c.prom")])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert silent.sent() == HEALTH_TIER_REQUESTS, "checks after the health tier were sent"
    doc = _json(tmp_path)
    validate(doc)
    assert doc["exit_code"] == 3 and len(doc["checks"]) == len(check_ids.select())  # a default run: quality.* is off
    checks = {c["id"]: c for c in doc["checks"]}
    for cid in ("health.live", "health.ready", "health.models"):
        assert (checks[cid]["status"], checks[cid]["kind"]) == ("fail", "timeout"), checks[cid]
        assert not checks[cid]["evidence"].startswith("not attempted")
    rest = [c for c in doc["checks"] if not c["id"].startswith("health.")]
    assert {(c["status"], c["kind"], c["evidence"]) for c in rest} == {
        ("fail", "timeout", "not attempted: the server did not answer health.live")}
    assert (tmp_path / "r.xml").is_file() and "kimi_deploy_check_exit_code 3" in (tmp_path / "c.prom").read_text()
    # the terminal collapses the 45 not-attempted checks into one row; the JSON keeps every id
    assert result.stdout.count(f"({len(rest)} more checks)") == 1, result.stdout
    assert "config.tool_call_parser" not in result.stdout and "contract." not in result.stdout


def test_silent_server_without_health_checks_is_probed_once(tmp_path, silent, silent_url):
    # 2 s, not 0.3: the request must be written before its time runs out, which a loaded machine did not always
    # do in 0.3 s (the silent socket then saw a connection with no request, '?')
    result = run_cli(["check", "--base-url", silent_url, "--timeout", "2", "--model", "m",
                      "--only", "contract.plain,contract.tool_auto", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    doc = _json(tmp_path)
    assert {(c["status"], c["kind"], c["evidence"]) for c in doc["checks"]} == {
        ("fail", "timeout", "not attempted: the server did not answer GET /v1/models")}
    assert len(doc["checks"]) == 4 and silent.sent() == ["GET /v1/models"]


def test_refused_connection_marks_the_rest_not_attempted(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli(["check", "--base-url", f"http://127.0.0.1:{port}", "--only", "health.*,contract.plain",
                      "--json", str(tmp_path / "r.json")])
    assert result.exit_code == ExitCode.UNREACHABLE
    checks = _json(tmp_path)["checks"]
    assert [c["evidence"].startswith("not attempted") for c in checks] == [False, False, False, True, True]
    assert {c["kind"] for c in checks} == {"unreachable"}


@pytest.fixture
def slow_chat_time(monkeypatch):
    """The checking run's clock, a :class:`FakeTime` that :class:`SlowChatHandler` moves."""
    fake = FakeTime()
    monkeypatch.setattr("kimi_deploy.check.run_checks", functools.partial(run_checks, clock=fake.monotonic))
    monkeypatch.setattr(SlowChatHandler, "time", fake)
    return fake


@pytest.mark.parametrize("mode", ["hang", "trickle"])
def test_deadline_bounds_the_run_and_reports_the_rest(tmp_path, slow_chat, slow_chat_time, mode):
    """A chat that hangs (or trickles a byte every 0.1 s, so no read times out) stops at --deadline.

    The hanging chat moves the run's clock past the deadline: its request must have been given no
    more than the 1.5 s left (else it would wait the full generation timeout, 6 x 5 s, and see the
    server close the connection after 20 s: no answer instead of a timeout). The trickling one moves
    it 0.1 s per byte: the run must stop reading at 1.5 s of its clock (else the stream ends after
    200 bytes and the check fails on its shape). Either way the checks after it are not attempted.
    """
    first_mode = "nonstream" if mode == "hang" else "stream"
    result = run_cli(["check", "--base-url", f"{slow_chat}/{mode}", "--timeout", "5", "--deadline", "1.5",
                      "--only", f"health.live,contract.plain.{first_mode},contract.tool_auto,contract.malformed",
                      "--json", str(tmp_path / "r.json"), "--prom", str(tmp_path / "c.prom")])
    assert result.exit_code == ExitCode.FAILED, result.output
    doc = _json(tmp_path)
    validate(doc)
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["health.live"]["status"] == "pass"
    first = checks[f"contract.plain.{first_mode}"]
    assert (first["status"], first["kind"]) == ("fail", "timeout") and not first["evidence"].startswith("not")
    late = [c for c in doc["checks"] if c["evidence"].startswith("not attempted")]
    assert late and {(c["status"], c["kind"], c["evidence"]) for c in late} == {
        ("fail", "timeout", "not attempted: the run's deadline of 1.5 s passed")}
    assert checks["contract.malformed"] in late
    assert (tmp_path / "c.prom").is_file()


def test_nightly_unit_outlives_the_default_deadline():
    """TimeoutStartSec= of kimi-deploy-check@NAME.service leaves >= 2 min after --deadline; the runbook says so."""
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.targets.systemd import render

    unit = render(get_preset("kimi-k25-rtx-pro-6000-x8").profile()).files["kimi-deploy-check@kimi-k25.service"]
    timeout_start = int(re.search(r"^TimeoutStartSec=(\d+)$", unit, re.M).group(1))
    assert DEFAULT_DEADLINE_S + 120 <= timeout_start
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "--deadline" not in exec_start or f"--deadline {DEFAULT_DEADLINE_S:g}" in exec_start
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    section = runbook[runbook.index("## Check the server"):runbook.index("## Benchmark a configuration")]
    assert f"`--deadline S` ({DEFAULT_DEADLINE_S:g})" in section and f"TimeoutStartSec={timeout_start}" in section
    assert f"({DEFAULT_DEADLINE_S:g} s by default)" in unit


class CountingHandler(_Quiet):
    seen: list[str] = []

    def do_GET(self):
        CountingHandler.seen.append(self.path)
        self._send(200, b"{}")

    do_POST = do_GET


@pytest.fixture(scope="module")
def counting_server():
    with _serve(CountingHandler) as server:
        yield server.url


@pytest.fixture
def counting(counting_server):
    CountingHandler.seen = []
    return counting_server


@pytest.mark.parametrize("make, needle", [
    (lambda t: ["--json", str(t / "nonexistent" / "dir" / "r.json")], "does not exist"),
    (lambda t: ["--junit", str(t / "missing" / "r.xml")], "does not exist"),
    (lambda t: ["--prom", str(t / "file" / "check.prom")], "is not a directory"),
    (lambda t: ["--json", str(t)], "is a directory"),
    (lambda t: ["--json", str(t / "same"), "--prom", str(t / "same")], "name the same file"),
])
def test_bad_report_paths_exit_2_before_any_request(tmp_path, counting, make, needle):
    (tmp_path / "file").write_text("not a directory")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_cli(["check", "--base-url", counting, "--only", "health.live", *make(tmp_path)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert CountingHandler.seen == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created


def test_json_dash_is_still_stdout(counting):
    result = run_cli(["check", "--base-url", counting, "--only", "health.live", "--json", "-"])
    assert result.exit_code == ExitCode.OK, result.output
    assert json.loads(result.stdout)["checks"][0]["id"] == "health.live"
    assert CountingHandler.seen


class StatusHandler(_Quiet):
    """``/sNNN/...`` answers every request with HTTP NNN and a short body."""

    def _status(self):
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = int(self.path.split("/")[1][1:])
        self._send(status, json.dumps({"error": {"message": f"status {status}"}}).encode())

    do_GET = do_POST = _status


@pytest.fixture(scope="module")
def status_server():
    with _serve(StatusHandler) as server:
        yield server.url


STATUSES = [(400, "HTTP 400 Bad Request"), (402, "HTTP 402 Payment Required"), (404, "HTTP 404 Not Found"),
            (405, "HTTP 405 Method Not Allowed"), (413, "HTTP 413 Request Entity Too Large"),
            (429, "HTTP 429 Too Many Requests"), (500, "HTTP 500 Internal Server Error"),
            (501, "HTTP 501 Not Implemented"), (502, "HTTP 502 Bad Gateway"),
            (503, "HTTP 503 Service Unavailable"), (504, "HTTP 504 Gateway Timeout"), (599, "HTTP 599")]


@pytest.mark.parametrize("status, label", STATUSES)
def test_http_errors_are_labelled_by_their_status(tmp_path, status_server, status, label):
    """The openai client raises InternalServerError for every 5xx: the label is the status, not the class."""
    assert status_label(status) == label
    kind = "server_error" if status >= 500 else "http_error"
    assert status_kind(status) == kind
    result = run_cli(["check", "--base-url", f"{status_server}/s{status}", "--model", "m",
                      "--only", "health.live,health.models,contract.plain.nonstream,contract.plain.stream",
                      "--json", str(tmp_path / "r.json")])
    checks = {c["id"]: c for c in _json(tmp_path)["checks"]}
    for c in checks.values():
        assert "Error)" not in c["detail"] and "APIStatusError" not in c["detail"], c
    assert checks["health.models"]["detail"] == f"GET /v1/models answered {label}"
    assert checks["health.models"]["kind"] == kind
    if status >= 500:  # a 5xx stops at /health
        assert checks["health.live"]["detail"] == f"GET /health answered {label}"
    else:  # 4xx: /ready and /v1/models are tried too, and every one is named with its status
        detail, evidence = checks["health.live"]["detail"], checks["health.live"]["evidence"]
        for path in ("/health", "/ready", "/v1/models"):
            assert f"GET {path}: {label}" in detail and f"GET {path} {status}" in evidence, checks["health.live"]
    # health.live answered (an HTTP error is an answer): the contract checks were sent
    for cid in ("contract.plain.nonstream", "contract.plain.stream"):
        assert (checks[cid]["kind"], checks[cid]["detail"]) == (kind, label), checks[cid]
    assert result.exit_code == ExitCode.FAILED


def test_malformed_request_accepted_with_a_non_4xx_status_is_labelled(tmp_path, status_server):
    result = run_cli(["check", "--base-url", f"{status_server}/s501", "--model", "m",
                      "--only", "contract.malformed", "--json", str(tmp_path / "r.json")])
    (check,) = _json(tmp_path)["checks"]
    assert (check["kind"], check["detail"]) == ("server_error", "a malformed request got HTTP 501 Not Implemented, "
                                                                "not a 4xx")
    assert result.exit_code == ExitCode.FAILED
