"""``check --each-worker`` writes its report whatever happens, holds every address to a plain check's rules,
and no key survives a clip, a quote or a URL in what check writes (issue #30 items 8 and 9).

Real loopback servers: a gateway answering smg's ``GET /workers`` (:mod:`hostile_raw`), workers that answer,
stall or echo the bearer key; SIGTERM is a real signal to a real child process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli
from hostile_raw import CONTINUE, RawServer, forever, http, ordinary
from kimi_deploy.errors import ExitCode
from kimi_deploy.redact import LogRedactor, PARTIAL_CHARS, remember, redact_text, url as redact_url

REPO = Path(__file__).resolve().parent.parent
KEY = "Zq3vN8xYpL2mK7wR4tB9sD1fG6hJ0cV5nM8aQ2eU4iO"  # install-style: 43 URL-safe characters
GENEROUS_S = 90.0


def _gateway(urls: list[str]) -> RawServer:
    listing = {"workers": [{"id": str(i), "url": u, "status": "ready", "is_healthy": True, "load": 0}
                           for i, u in enumerate(urls)]}

    def answer(method, path, body, out):
        out.write(http(200, listing))

    return RawServer(answer)


def _key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


def _no_key_part(text: str) -> None:
    """No run of PARTIAL_CHARS characters of the key in ``text``."""
    for i in range(len(KEY) - PARTIAL_CHARS + 1):
        assert KEY[i:i + PARTIAL_CHARS] not in text, (KEY[i:i + PARTIAL_CHARS], text[:2000])


def _ok_worker() -> RawServer:
    return RawServer(lambda method, path, body, out: ordinary(method, path, out))


# --- item 8: --each-worker ---

def test_a_worker_url_a_plain_check_refuses_is_that_workers_failure_and_the_report_is_written(tmp_path):
    with _ok_worker() as worker:
        with _gateway(["grpc://127.0.0.1:50051", worker.url, "/var/run/worker.sock"]) as gateway:
            out = tmp_path / "workers.json"
            result = run_cli(["check", "--base-url", gateway.url, "--each-worker", "--only", "health.live",
                              "--json", str(out)])
    doc = json.loads(out.read_text())
    assert result.exit_code == doc["exit_code"] == ExitCode.USAGE
    by_url = {w["url"]: w for w in doc["workers"]}
    assert by_url["grpc://127.0.0.1:50051"]["report"] is None
    assert "http:// or https://" in by_url["grpc://127.0.0.1:50051"]["error"]
    assert by_url["/var/run/worker.sock"]["exit_code"] == ExitCode.USAGE
    assert by_url[worker.url]["exit_code"] == ExitCode.OK and by_url[worker.url]["report"]["checks"]


def test_one_deadline_bounds_the_whole_run_not_each_worker(tmp_path):
    def stall(method, path, body, out):
        forever(out, CONTINUE, 0.2)

    with RawServer(stall) as a, RawServer(stall) as b, RawServer(stall) as c:
        with _gateway([a.url, b.url, c.url]) as gateway:
            out = tmp_path / "workers.json"
            t0 = time.monotonic()
            run_cli(["check", "--base-url", gateway.url, "--each-worker", "--only", "health.*",
                     "--timeout", "30", "--deadline", "4", "--json", str(out)])
            took = time.monotonic() - t0
    doc = json.loads(out.read_text())
    assert took < GENEROUS_S
    last = doc["workers"][-1]["report"]["checks"]
    assert all("not attempted: the run's deadline of 4 s passed" in r["evidence"] for r in last)


def test_sigterm_writes_the_report_and_exits_130(tmp_path):
    def slow(method, path, body, out):
        time.sleep(60)

    out = tmp_path / "workers.json"
    with RawServer(slow) as worker, _gateway([worker.url]) as gateway:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = subprocess.Popen([sys.executable, "-m", "kimi_deploy", "check", "--base-url", gateway.url,
                                  "--each-worker", "--json", str(out)], env=env, cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + GENEROUS_S
            while not worker.requests and time.monotonic() < end:  # the worker was asked: the run is under way
                time.sleep(0.2)
            child.send_signal(signal.SIGTERM)
            _, stderr = child.communicate(timeout=GENEROUS_S)
        finally:
            child.kill()
    assert child.returncode == ExitCode.INTERRUPTED, stderr
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == ExitCode.INTERRUPTED and doc["interrupted"]["signal"] == "SIGTERM"


@pytest.mark.parametrize("url", ["http://[::1", "http://%zz:30000"])
def test_a_gateway_url_that_is_no_url_is_exit_2(tmp_path, url):
    result = run_cli(["check", "--base-url", url, "--each-worker"])
    assert result.exit_code == ExitCode.USAGE
    assert "Traceback" not in result.output


def test_a_plain_check_of_a_bad_host_is_exit_2_not_3():
    result = run_cli(["check", "--base-url", "http://%zz", "--only", "health.live"])
    assert result.exit_code == ExitCode.USAGE, result.output


def test_the_key_is_not_sent_in_clear_to_a_gateway_on_another_host(tmp_path):
    """192.0.2.1 (TEST-NET-1) is no address of this host: refused before any connection, as plain check does."""
    result = run_cli(["check", "--base-url", "http://192.0.2.1:30000", "--each-worker", "--api-key-file",
                      str(_key_file(tmp_path)), "--timeout", "1"])
    assert result.exit_code == ExitCode.USAGE
    assert "plain http" in result.stderr


# --- item 9: redaction after clipping and quoting ---

@pytest.mark.parametrize("cut", range(30, 62, 3))
def test_a_key_cut_by_a_clip_and_quoted_is_masked(cut):
    from kimi_deploy.check.results import clip

    text = "x" * cut + KEY
    for written in (clip(text, 60), repr(clip(text, 60)), f"content {clip(text, 60)!r})", text[:cut + 20],
                    repr(text[:cut + 12])):
        _no_key_part(redact_text(written, [KEY]))


def test_a_key_echoing_server_leaves_no_part_of_the_key_in_any_report(tmp_path):
    """The server echoes the Authorization header into every chat answer's content and error body, shifted so
    that each clip (60, 120 characters) cuts it somewhere; the run's JSON, JUnit, textfile and table hold no
    run of 8 characters of the key."""
    n = [0]

    def answer(method, path, body, out):
        if method != "POST":
            return ordinary(method, path, out)
        n[0] += 1
        content = "y" * (20 + 7 * n[0] % 90) + f"Bearer {KEY} tail"
        if n[0] % 2:
            out.write(http(500, {"error": {"message": content}}))
        else:
            out.write(http(200, {"id": "c", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}))

    with RawServer(answer) as server:
        paths = {k: tmp_path / f"r.{k}" for k in ("json", "xml", "prom")}
        result = run_cli(["check", "--base-url", server.url, "--api-key-file", str(_key_file(tmp_path)),
                          "--only", "health.*,contract.*", "--json", str(paths["json"]), "--junit",
                          str(paths["xml"]), "--prom", str(paths["prom"])])
    for p in paths.values():
        _no_key_part(p.read_text())
    _no_key_part(result.stdout + result.stderr)


def test_worker_urls_are_written_without_credentials_or_the_key(tmp_path):
    with _ok_worker() as worker:
        host = worker.url.split("//", 1)[1]
        listed = [f"http://admin:{KEY}@{host}", f"http://{host}/?api_key={KEY}"]
        with _gateway(listed) as gateway:
            out = tmp_path / "workers.json"
            result = run_cli(["check", "--base-url", gateway.url, "--each-worker", "--api-key-file",
                              str(_key_file(tmp_path)), "--only", "health.live", "--json", str(out)])
    text = out.read_text()
    _no_key_part(text)
    _no_key_part(result.stdout + result.stderr)
    assert "admin:<redacted>@" in text


def test_redact_url_masks_credentials_and_key_like_query_values():
    assert redact_url("http://u:p@h:1/x?token=t&b=1") == "http://u:<redacted>@h:1/x?token=<redacted>&b=1"
    assert redact_url("http://[::1") == "http://[::1"


def test_debug_log_lines_hold_no_key(caplog):
    """--debug prints httpcore's response headers; a header echoing the key is masked in the line."""
    remember(KEY)
    record = logging.LogRecord("httpcore.http11", logging.DEBUG, __file__, 1,
                               "receive_response_headers.complete return_value=%r", ((b"X-Echo", KEY.encode()),),
                               None)
    _no_key_part(LogRedactor("%(message)s").format(record))


def test_the_cli_debug_handler_redacts(tmp_path):
    run = subprocess.run([sys.executable, "-m", "kimi_deploy", "--debug", "check", "--base-url", "http://127.0.0.1:9",
                          "--api-key-file", str(_key_file(tmp_path)), "--only", "health.live", "--timeout", "1"],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         timeout=GENEROUS_S)
    assert "Authorization" not in run.stderr or KEY not in run.stderr
    _no_key_part(run.stderr)
