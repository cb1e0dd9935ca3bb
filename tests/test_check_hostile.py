"""`kimi-deploy check` against hostile servers: every answer gets a verdict, every report is written.

Real loopback servers (the standard library's ``http.server``, HTTP/1.1) that answer health like an
OpenAI-compatible server and then answer chat completions (or one endpoint) with what nobody here
wrote: bytes that are not UTF-8, JSON nested 100,000 deep, an event stream to a non-streaming
request, the wrong JSON type, bodies without ``choices``, chunked-encoding garbage, a body cut short.
Issue #11 items 8 and 10: each is a ``fail`` row (``invalid_response``), never a lost report, and a
broken answer after a live health tier is not ``unreachable`` (exit 1, not 3). Plus a property:
whatever text a row or the server's name carries, the JUnit file parses and the JSON report encodes.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import run_cli
from kimi_deploy import paths
from kimi_deploy.check import CheckReport, CheckResult, check_ids, reports
from kimi_deploy.check.results import EVIDENCE_CHARS
from kimi_deploy.wire.printable import UNPRINTABLE
from kimi_deploy.errors import ExitCode
from loopback import JSON, Loopback, QuietHandler, send

SSE = "text/event-stream"

#: A POST answer: (raw bytes to write after the request was read), or a function writing them itself.
Answer = Callable[[BaseHTTPRequestHandler, bool], None]


def body(nonstream: bytes, ctype: str = JSON, stream: bytes | None = None) -> Answer:
    """Answer ``nonstream`` (as ``ctype``) to a non-streaming request, ``stream`` (SSE) to a streaming one."""
    def answer(handler: BaseHTTPRequestHandler, streaming: bool) -> None:
        if streaming and stream is not None:
            send(handler, 200, stream, SSE)
        else:
            send(handler, 200, nonstream, ctype)
    return answer


def raw(data: bytes) -> Answer:
    """Write ``data`` as the whole response (status line included), then close the connection."""
    def answer(handler: BaseHTTPRequestHandler, streaming: bool) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()
        handler.close_connection = True
    return answer


CHUNKED_GARBAGE = raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zzzz\r\ngarbage\r\n")
CUT_SHORT = raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"choices\": [")
DEEP = b"[" * 100_000 + b"]" * 100_000


def _sse(*frames: object) -> bytes:
    return b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames) + b"data: [DONE]\n\n"


class Hostile:
    """A loopback server: healthy ``/health`` and ``/v1/models`` (model ``m``) unless ``gets`` says
    otherwise, 404 elsewhere; every POST answered by ``post``."""

    def __init__(self, post: Answer, gets: dict[str, Answer] | None = None) -> None:
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                if self.path in outer.gets:
                    return outer.gets[self.path](self, False)
                if self.path == "/v1/models":
                    return self._send(200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')
                if self.path == "/health":
                    return self._send(200, b"{}")
                return self._send(404, b'{"error": "not found"}')

            def do_POST(self):  # noqa: N802
                request = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    streaming = bool(json.loads(request).get("stream"))
                except (ValueError, AttributeError):
                    streaming = False
                outer.post(self, streaming)

        self.post, self.gets = post, gets or {}
        self.server = Loopback(Handler)
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def hostile():
    servers: list[Hostile] = []

    def start(post: Answer, gets: dict[str, Answer] | None = None) -> str:
        servers.append(Hostile(post, gets))
        return servers[-1].url

    yield start
    for server in servers:
        server.close()


def schema() -> dict:
    return json.loads(paths.check_report_schema().read_text())


def run_check(tmp_path: Path, url: str, only: str, *extra: str):
    """``kimi-deploy check`` with all three reports; returns (result, JSON document, rows by id)."""
    out = {"--json": tmp_path / "r.json", "--junit": tmp_path / "r.xml", "--prom": tmp_path / "r.prom"}
    args = ["check", "--base-url", url, "--model", "m", "--only", only, "--timeout", "10", *extra]
    result = run_cli(args + [a for option, path in out.items() for a in (option, str(path))])
    for path in out.values():  # every report written, whatever the server answered
        assert path.is_file(), (path, result.output)
    doc = json.loads(out["--json"].read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema())
    ET.parse(out["--junit"])  # parses: no raw control byte or lone surrogate
    assert "kimi_deploy_check_failures{kind=\"invalid_response\"}" in out["--prom"].read_text()
    rows = {c["id"]: c for c in doc["checks"]}
    for row in rows.values():
        assert len(row["evidence"]) <= EVIDENCE_CHARS and not UNPRINTABLE.search(row["evidence"]), row
        assert not UNPRINTABLE.search(row["detail"]), row
    return result, doc, rows


HOSTILE_ANSWERS = {
    "bytes that are not UTF-8": body(b'{"choices": [{"message": {"content": "\xff\xfe caf\xe9"}}]}',
                                     stream=b'data: {"choices": [{"delta": {"content": "\xff\xfe"}}]}\n\n'),
    "JSON nested 100k deep": body(DEEP, stream=b"data: " + DEEP + b"\n\ndata: [DONE]\n\n"),
    "an event stream to a non-streaming request": body(_sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]}),
                                                       SSE),
    "a JSON array": body(b"[1, 2, 3]", stream=_sse([1, 2, 3])),
    "a JSON string": body(b'"hello"', stream=_sse("hello")),
    "tool_calls that are not a list": body(
        b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": "x"}, '
        b'"finish_reason": "tool_calls"}]}',
        stream=_sse({"choices": [{"index": 0, "delta": {"tool_calls": "x"}, "finish_reason": "tool_calls"}]})),
}


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS.values(), ids=HOSTILE_ANSWERS.keys())
def test_a_hostile_chat_answer_is_a_failed_row_and_every_report_is_written(tmp_path, hostile, answer):
    url = hostile(answer)
    result, doc, rows = run_check(tmp_path, url, "health.*,contract.plain.*,contract.tool_auto.*")
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "Traceback" not in result.output
    assert (rows["health.live"]["status"], rows["health.models"]["status"]) == ("pass", "pass")
    unreadable = ["contract.plain.nonstream", "contract.tool_auto.nonstream"]
    if answer is not HOSTILE_ANSWERS["tool_calls that are not a list"]:  # else a 1-token answer is fine
        unreadable.append("health.ready")
    for check_id in unreadable:
        assert (rows[check_id]["status"], rows[check_id]["kind"]) == ("fail", "invalid_response"), rows[check_id]
        assert rows[check_id]["evidence"] and "fix" in rows[check_id], rows[check_id]
    for check_id in ("contract.plain.stream", "contract.tool_auto.stream"):
        assert rows[check_id]["status"] == "fail", rows[check_id]
    assert doc["failures_by_kind"]["invalid_response"] >= 3


def test_undecodable_bytes_show_as_escapes_in_the_evidence(tmp_path, hostile):
    url = hostile(HOSTILE_ANSWERS["bytes that are not UTF-8"])
    _, _, rows = run_check(tmp_path, url, "contract.plain.nonstream")
    row = rows["contract.plain.nonstream"]
    assert "\\xff\\xfe caf\\xe9" in row["evidence"] and "UnicodeDecodeError" in row["detail"], row


def test_control_bytes_and_a_lone_surrogate_in_the_answer_reach_every_report_escaped(tmp_path, hostile):
    content = "<|tool_call_begin|> \ud800 \x01\x1b[31m \x7f \u2028 end"
    url = hostile(body(json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": content}}]}).encode()))
    _, _, rows = run_check(tmp_path, url, "contract.plain.nonstream")
    row = rows["contract.plain.nonstream"]
    assert (row["status"], row["kind"]) == ("fail", "markup_leak")
    assert "\\ud800 \\x01\\x1b[31m \\x7f \\u2028 end" in row["evidence"], row
    failure = ET.parse(tmp_path / "r.xml").getroot().find("testcase/failure")
    assert "\\ud800 \\x01\\x1b[31m" in failure.text


NO_CHOICES = {
    "{}": ({}, {}),
    "choices missing, other fields there": ({"id": "x", "object": "chat.completion", "model": "m"},
                                            {"id": "x", "object": "chat.completion.chunk"}),
    "choices empty": ({"choices": []}, {"choices": []}),
    "choices null": ({"choices": None}, {"choices": None}),
    "choices a string": ({"choices": "x"}, {"choices": "x"}),
    "a choice without message": ({"choices": [{"index": 0, "finish_reason": "stop"}]},
                                 {"choices": [{"index": 0, "delta": "x", "finish_reason": "stop"}]}),
    "message null": ({"choices": [{"index": 0, "message": None, "finish_reason": "stop"}]},
                     {"choices": [5]}),
}


@pytest.mark.parametrize("nonstream, chunk", NO_CHOICES.values(), ids=NO_CHOICES.keys())
def test_an_answer_without_choices_fails_every_contract_check(tmp_path, hostile, nonstream, chunk):
    url = hostile(body(json.dumps(nonstream).encode(), stream=_sse(chunk)))
    result, _, rows = run_check(tmp_path, url, "contract.*", "--repeat", "0")
    assert result.exit_code == ExitCode.FAILED
    contract = [i for i in check_ids.select(["contract.*"]) if i in rows]
    assert len(contract) == len(check_ids.select(["contract.*"]))
    for check_id in contract:
        row = rows[check_id]
        # no reasoning parser expected: not asked at all (one at a time, or N at once)
        if check_id.startswith("contract.reasoning_") or check_id == "contract.concurrency.reasoning_on":
            assert row["status"] == "skip", row
            continue
        assert row["status"] == "fail", row
        if check_id != "contract.malformed":  # a 200 to a malformed request is http_error
            assert row["kind"] == "invalid_response", row


@pytest.mark.parametrize("answer", [CHUNKED_GARBAGE, CUT_SHORT], ids=["chunked garbage", "body cut short"])
def test_a_broken_exchange_after_a_live_health_tier_is_invalid_response_not_unreachable(tmp_path, hostile, answer):
    url = hostile(answer, gets={"/health_generate": answer})
    result, doc, rows = run_check(tmp_path, url, "health.*,contract.plain.*,contract.malformed")
    assert result.exit_code == ExitCode.FAILED, result.output  # 1, not 3: the server answered
    assert doc["failures_by_kind"]["unreachable"] == 0
    for check_id in ("health.ready", "contract.plain.nonstream", "contract.plain.stream", "contract.malformed"):
        assert (rows[check_id]["status"], rows[check_id]["kind"]) == ("fail", "invalid_response"), rows[check_id]
        assert "the HTTP exchange broke mid-answer" in rows[check_id]["detail"], rows[check_id]


def test_a_broken_model_list_is_invalid_response(tmp_path, hostile):
    url = hostile(body(b"{}"), gets={"/v1/models": CHUNKED_GARBAGE})
    result, _, rows = run_check(tmp_path, url, "health.live,health.models")
    assert result.exit_code == ExitCode.FAILED
    assert (rows["health.models"]["status"], rows["health.models"]["kind"]) == ("fail", "invalid_response")


def test_a_server_listing_no_model_fails_instead_of_skipping_to_exit_0(tmp_path, hostile):
    """New-operator trial: /health 200 and an empty /v1/models list made every check that needs a model skip,
    and the run ended "1 pass, 48 skip, exit 0 (OK)": a green nightly check of a server that serves nothing."""
    url = hostile(body(b"{}"), gets={"/v1/models": body(b'{"object": "list", "data": []}')})
    result = run_cli(["check", "--base-url", url, "--timeout", "10", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == ExitCode.FAILED, result.output
    rows = {c["id"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}
    assert (rows["health.models"]["status"], rows["health.models"]["kind"]) == ("fail", "config_mismatch")
    assert "lists no model" in rows["health.models"]["detail"] and "--model NAME" in rows["health.models"]["detail"]


def test_a_redirect_is_followed_by_nothing_and_the_row_says_where_it_points(tmp_path, hostile):
    """New-operator trial: a server answering 302 to another port had its GETs followed (health.live passed and
    the report's server was the redirect target's: "server version synthetic") while every POST failed with a
    bare "HTTP 302 Found" and the 401/404 fix. Now nothing is followed; each row names the Location and the fix."""
    seen: list[str] = []

    class Target(QuietHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self._send(200, {"version": "target", "object": "list", "data": [{"id": "m"}]})

        do_POST = do_GET

    with Loopback(Target) as target:
        def moved(handler, _streaming):
            handler.send_response(302)
            handler.send_header("Location", f"{target.url}{handler.path}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()

        url = hostile(moved, gets={p: moved for p in ("/health", "/ready", "/v1/models", "/health_generate",
                                                      "/server_info", "/model_info", "/get_server_info")})
        result = run_cli(["check", "--base-url", url, "--model", "m", "--only", "health.*,contract.plain.*",
                          "--timeout", "10", "--json", str(tmp_path / "r.json")])
        bare = run_cli(["check", "--base-url", url, "--only", "health.ready", "--json", "-"])  # no --model
    assert "redirect to" in json.loads(bare.stdout)["checks"][0]["detail"], bare.stdout
    assert result.exit_code == ExitCode.FAILED, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert seen == [] and doc["server"].get("version") != "target"
    rows = {c["id"]: c for c in doc["checks"]}
    for check_id in ("health.live", "health.ready", "health.models", "contract.plain.nonstream",
                     "contract.plain.stream"):
        row = rows[check_id]
        assert (row["status"], row["kind"]) == ("fail", "http_error"), row
        assert f"redirect to {target.url}/" in row["detail"] and "follows no redirect" in row["detail"], row


@pytest.mark.parametrize(("workers", "message"), [
    (body(b"<html>Welcome to nginx!</html>", "text/html"), "answer is not smg's worker list"),
    (body(b'[{"url": "http://x"}]'), "answer is not smg's worker list"),
    (body(b'{"workers": [{"url": "http://x", "load": "high"}]}'), "answer is not smg's worker list"),
    (lambda handler, _s: send(handler, 404, b'{"detail": "Not Found"}'), "answered GET /workers with 404"),
], ids=["html", "a list", "a load that is no number", "404"])
def test_each_worker_against_something_that_is_not_the_gateway_says_so(tmp_path, hostile, workers, message):
    """New-operator trial: --each-worker against a worker or a web server was a JSONDecodeError traceback (HTML
    200), or exit 1 with the fix "401: give the profile's API key" for a 404."""
    url = hostile(body(b"{}"), gets={"/workers": workers})
    result = run_cli(["check", "--base-url", url, "--each-worker", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == ExitCode.FAILED, result.output
    assert message in result.stderr and "SGLang's gateway (smg)?" in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_a_web_page_at_health_generate_is_no_generation(tmp_path, hostile):
    """New-operator trial: a server answering an HTML 200 to every path passed health.ready with "GET
    /health_generate: HTTP 200 (1-token generation)". SGLang answers an empty body; the chat completion decides."""
    page = body(b"<html><body>Welcome to nginx!</body></html>", "text/html")
    url = hostile(page, gets={"/health_generate": page})
    _, _, rows = run_check(tmp_path, url, "health.ready")
    assert rows["health.ready"]["status"] == "fail" and "1-token generation" not in rows["health.ready"]["detail"]
    assert rows["health.ready"]["kind"] == "invalid_response", rows["health.ready"]
    url = hostile(page, gets={p: page for p in ("/health", "/ready", "/v1/models")})  # and health.live too
    _, _, rows = run_check(tmp_path, url, "health.live")
    assert (rows["health.live"]["status"], rows["health.live"]["kind"]) == ("fail", "invalid_response")
    assert "GET /health: HTTP 200 OK, an HTML page" in rows["health.live"]["detail"], rows["health.live"]


def test_a_connection_closed_before_any_answer_is_still_unreachable(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    stop = threading.Event()

    def close_all():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    threading.Thread(target=close_all, daemon=True).start()
    try:
        result, _, rows = run_check(tmp_path, f"http://127.0.0.1:{listener.getsockname()[1]}",
                                    "health.*,contract.plain.nonstream")
    finally:
        stop.set()
        listener.close()
    assert result.exit_code == ExitCode.UNREACHABLE
    assert (rows["health.live"]["status"], rows["health.live"]["kind"]) == ("fail", "unreachable")


def test_an_unreadable_answer_is_a_row_and_health_reads_status_only(tmp_path, hostile):
    """JSON nested 100k deep on every answer. The health checks read /health and /health_generate by status
    only, the capped reader refuses the model list, and the chat answer reaches the openai client, whose parser
    raises RecursionError: each is a row, none loses the report."""
    deep = body(DEEP)
    url = hostile(deep, gets={"/health": deep, "/v1/models": deep, "/health_generate": deep})
    result, _, rows = run_check(tmp_path, url, "health.*,contract.plain.nonstream")
    assert "Traceback" not in result.output
    assert result.exit_code == ExitCode.FAILED
    for check_id in ("health.live", "health.ready"):  # SGLang's /health body is empty: only the status counts
        assert rows[check_id]["status"] == "pass", rows[check_id]
    for check_id in ("health.models", "contract.plain.nonstream"):
        assert (rows[check_id]["status"], rows[check_id]["kind"]) == ("fail", "invalid_response"), rows[check_id]
    assert "RecursionError" in rows["contract.plain.nonstream"]["detail"], rows["contract.plain.nonstream"]


#: A check with a bug: no server answer reaches the runner's catch-all any more, so the bug is put in by hand.
BUGGY_CHECK = """
import sys
from kimi_deploy.check import health
def buggy(ctx):
    raise LookupError("a bug in the check itself")
health.CHECKS["health.live"] = buggy
from kimi_deploy.cli import main
sys.argv[0] = "kimi-deploy"
main()
"""


@pytest.mark.parametrize("debug", [False, True])
def test_an_exception_in_a_check_is_its_row_and_only_debug_shows_the_traceback(tmp_path, hostile, debug):
    url = hostile(body({"object": "list", "data": []}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get(
        "PYTHONPATH", "")])}
    argv = ["--debug"] * debug + ["check", "--base-url", url, "--model", "m", "--only", "health.live,health.models",
                                  "--json", str(tmp_path / "d.json")]
    run = subprocess.run([sys.executable, "-c", BUGGY_CHECK, *argv], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == ExitCode.FAILED, run.stderr
    assert ("Traceback" in run.stderr and "LookupError" in run.stderr) == debug, run.stderr
    rows = {c["id"]: c for c in json.loads((tmp_path / "d.json").read_text())["checks"]}
    assert (rows["health.live"]["status"], rows["health.live"]["kind"]) == ("fail", "invalid_response")
    assert "LookupError" in rows["health.live"]["detail"]
    assert "health.models" in rows  # the run went on after the bug


# Any text at all, lone surrogates and every control character included.
ANY_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=300)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evidence=ANY_TEXT, detail=ANY_TEXT, model=ANY_TEXT, version=ANY_TEXT, warn=ANY_TEXT)
def test_every_report_is_written_and_parses_whatever_text_a_row_carries(evidence, detail, model, version, warn):
    report = CheckReport(base_url="http://127.0.0.1:30000", model=model,
                         started_at=_dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=_dt.timezone.utc),
                         server={"version": version})
    report.results += [
        CheckResult("contract.plain.nonstream", "fail", "markup_leak", detail, evidence, 0.5),
        CheckResult("contract.tool_auto.stream", "warn", "model_declined", warn, warn, 0.5),
        CheckResult("health.live", "skip", None, detail),
    ]
    report.results[0].evidence += evidence  # a row changed after it was made still reaches XML escaped
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        reports.write_reports(report, json_path=out / "r.json", junit_path=out / "r.xml", prom_path=out / "r.prom")
        root = ET.parse(out / "r.xml").getroot()
        doc = json.loads((out / "r.json").read_text(encoding="utf-8"))
    assert [c.get("name") for c in root.iter("testcase")] == [r.id for r in report.results]
    assert root.find("testcase/failure").get("type") == "markup_leak"
    assert doc["checks"][0]["kind"] == "markup_leak" and doc["failures_by_kind"]["markup_leak"] == 1


VLLM_MODELS = body(b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}')


@pytest.mark.parametrize("version", [CUT_SHORT, CHUNKED_GARBAGE, body(DEEP), body(b'{"version": 7}')],
                         ids=["cut short", "chunked garbage", "nested 100k deep", "version not a string"])
def test_a_vllm_whose_version_answer_is_broken_is_still_identified(tmp_path, hostile, version):
    """/v1/models says owned_by vllm (vLLM 0.33.0's ModelCard); /version answers brokenly: the server is vLLM
    with no version, and the report keeps that (identification must not lose the server block)."""
    url = hostile(body(b"{}"), gets={"/v1/models": VLLM_MODELS, "/version": version})
    result, doc, _ = run_check(tmp_path, url, "health.live,health.models")
    assert "Traceback" not in result.output
    assert doc["server"] == {"kind": "vllm"}, doc["server"]


def status(code: int, data: bytes) -> Answer:
    """Answer every POST with HTTP ``code`` and the JSON ``data``."""
    def answer(handler: BaseHTTPRequestHandler, streaming: bool) -> None:
        send(handler, code, data)
    return answer


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}}).encode()


#: What servers launched without tool support answer a request with tools, in their own words.
NO_TOOL_PARSER_ANSWERS = {
    "vLLM auto": (400, _error('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                              "set"), "vLLM"),
    "vLLM named": (400, _error('tool_choice=function "get_time" requires --tool-call-parser to be set'), "vLLM"),
    "vLLM required": (400, _error('tool_choice="required" requires --tool-call-parser to be set'), "vLLM"),
    "llama.cpp": (400, _error("tools param requires --jinja flag"), "llama.cpp"),
    "llama.cpp before b4400 (HTTP 500)": (500, json.dumps({"error": {
        "code": 500, "message": "tools param requires --jinja flag", "type": "server_error"}}).encode(), "llama.cpp"),
    "vLLM text, not JSON": (400, b'"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser', "vLLM"),
}


@pytest.mark.parametrize("code,data,server", NO_TOOL_PARSER_ANSWERS.values(), ids=NO_TOOL_PARSER_ANSWERS.keys())
def test_a_server_refusing_tools_for_want_of_a_parser_is_config_mismatch(tmp_path, hostile, code, data, server):
    url = hostile(status(code, data))
    _, _, rows = run_check(tmp_path, url, "contract.tool_auto.*,contract.tool_named.*")
    for row in rows.values():
        assert (row["status"], row["kind"]) == ("fail", "config_mismatch"), row
        assert "without a tool-call parser" in row["detail"] and f"HTTP {code}" in row["detail"], row
        assert server in row["detail"], row
        assert row["fix"].startswith("restart the server with a Kimi tool-call parser"), row


#: 4xx/5xx answers to a request with tools that say nothing of a missing parser: they keep their status kind.
OTHER_REFUSALS = {
    "validation error": (400, _error("1 validation error: messages.0.content: field required")),
    "about tools, no flag": (400, _error("tool_choice must be one of none, auto, required")),
    "a flag of another subject": (400, _error("max_tokens is too large; raise --max-model-len")),
    "a tool parser crashed": (500, _error("kimi_k2 tool parser: IndexError in tool_call_parser")),
    "a flag quoted as a word": (400, _error("unknown field 'tool-call-parser' in request")),
}


@pytest.mark.parametrize("code,data", OTHER_REFUSALS.values(), ids=OTHER_REFUSALS.keys())
def test_other_refusals_of_a_request_with_tools_keep_their_status_kind(tmp_path, hostile, code, data):
    url = hostile(status(code, data))
    _, _, rows = run_check(tmp_path, url, "contract.tool_auto.nonstream")
    row = rows["contract.tool_auto.nonstream"]
    assert (row["status"], row["kind"]) == ("fail", "server_error" if code >= 500 else "http_error"), row
