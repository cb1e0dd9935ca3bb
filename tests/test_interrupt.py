"""Ctrl-C and SIGTERM during `bench` and `check` (issue 13 item 2): what finished is written, marked
interrupted, exit 130.

The verbs run as child processes against a loopback server in this process that answers a fixed
number of chat requests and then holds the next one open: its arrival (a threading.Event) is the
moment the test sends the signal, so no test sleeps or races the clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from loopback import Loopback, QuietHandler

REPO = Path(__file__).resolve().parent.parent


class GateServer:
    """Answers ``free`` chat requests, then sets ``reached`` and holds every later one until closed."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.count = 0
        self.reached = threading.Event()
        self.release = threading.Event()
        gate = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.0"  # close-delimited bodies

            def do_GET(self):
                if self.path in ("/health", "/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": "gate", "object": "model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                with threading.Lock():
                    gate.count += 1
                    n = gate.count
                if n > gate.free:
                    gate.reached.set()
                    gate.release.wait(60)
                    return
                if not body.get("stream"):
                    self._send(200, {"id": f"c{n}", "object": "chat.completion", "created": 0, "model": "gate",
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."},
                                                  "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for frame in ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]},
                              {"choices": [{"index": 0, "delta": {"content": "."}}]},
                              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                                        "total_tokens": 7}}):
                    self.wfile.write(b"data: " + json.dumps({"id": f"c{n}", "object": "chat.completion.chunk",
                                                             "created": 0, "model": "gate", **frame}).encode()
                                     + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = Loopback(Handler)
        self.url = self.server.url

    def close(self) -> None:
        self.release.set()
        self.server.close()


@pytest.fixture
def gate(request):
    server = GateServer(request.param)
    yield server
    server.close()


def run_until_gate(args: list[str], gate: GateServer, sig: signal.Signals) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "kimi_deploy", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        assert gate.reached.wait(120), "the run never reached the held request"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("gate", [2], indirect=True)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_bench_interrupted_writes_the_finished_points(gate, sig, tmp_path):
    """c=1 (2 requests) finishes; the signal comes while c=2 waits for its first answer."""
    result = run_until_gate(["bench", "--base-url", gate.url, "--model", "gate", "--concurrency", "1,2",
                             "--num-prompts", "2", "--warmup", "0", "--no-flush-cache", "--max-tokens", "8",
                             "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")], gate, sig)
    assert result.returncode == 130, result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["interrupted"] == {"signal": sig.name, "during": "c=2", "complete_points": ["c=1"]}
    assert [p["concurrency"] for p in doc["points"]] == [1]
    assert doc["points"][0]["summary"]["completed"] == 2
    header, row = (tmp_path / "r.csv").read_text().splitlines()  # header + c=1, marked partial (#30 item 6)
    assert header.endswith(",partial") and row.endswith(",true")
    assert "c=1" in result.stdout  # the table of what finished
    assert f"interrupted by {sig.name} during c=2" in result.stdout + result.stderr


@pytest.mark.parametrize("gate", [1], indirect=True)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_check_interrupted_writes_what_ran_marked_partial(gate, sig, tmp_path):
    """health.ready's one-token completion is answered; contract.plain.nonstream is held."""
    result = run_until_gate(["check", "--base-url", gate.url, "--only", "health.*,contract.plain.*",
                             "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
                             "--prom", str(tmp_path / "r.prom")], gate, sig)
    assert result.returncode == 130, result.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [c["id"] for c in doc["checks"]] == ["health.live", "health.ready", "health.models"]
    assert doc["interrupted"] == {"signal": sig.name,
                                  "not_run": ["contract.plain.nonstream", "contract.plain.stream"]}
    assert doc["exit_code"] == 130
    assert "interrupted" in (tmp_path / "r.xml").read_text()
    assert "kimi_deploy_check_exit_code 130" in (tmp_path / "r.prom").read_text()
    assert f"interrupted by {sig.name}" in result.stdout


def test_report_schema_accepts_an_interrupted_report():
    import datetime as dt

    import jsonschema

    from kimi_deploy import paths
    from kimi_deploy.check import CheckReport, CheckResult

    report = CheckReport(base_url="http://127.0.0.1:1", model=None, started_at=dt.datetime.now(dt.timezone.utc),
                         results=[CheckResult("health.live", "pass")], interrupted="SIGINT",
                         not_run=["health.ready"])
    jsonschema.validate(report.to_json(), json.loads(paths.check_report_schema().read_text()))
