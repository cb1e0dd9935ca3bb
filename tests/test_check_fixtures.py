"""`kimi-deploy check` against small loopback servers that behave like other stacks, and bad input.

The MLX-cluster-like server replays tool-call-failures.md item 2 as one MLX-based server answered
it: a history id sanitised to ``functions_get_weather_0`` gets HTTP 500 with a non-JSON body
(non-streaming) and an SSE ``{"error": {"message": "<raw markup>"}}`` frame (streaming); other
requests get a well-formed answer, so only the round trip fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import run_cli
from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.errors import ExitCode
from loopback import Loopback, QuietHandler, free_port

RAW_MARKUP = ('<|tool_calls_section_begin|><|tool_call_begin|>functions_get_weather_1<|tool_call_argument_begin|>'
              '{"city": "Rome, Italy"}<|tool_call_end|><|tool_calls_section_end|>')


class MLXLikeHandler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b'{"status": "ok"}', "application/json")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "mlx-community/Kimi-K2.5",
                                                                     "object": "model"}]}).encode(),
                       "application/json")
        else:
            self._send(404, b'{"detail": "Not Found"}', "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sanitised = any(re.fullmatch(r"functions_\w+_\d+", tc.get("id", ""))
                        for m in body.get("messages", []) if isinstance(m, dict)
                        for tc in m.get("tool_calls") or [])
        stream = body.get("stream")
        if sanitised and not stream:
            self._send(500, f"Internal Server Error: could not parse tool call: {RAW_MARKUP}".encode(), "text/plain")
            return
        if sanitised:
            frame = json.dumps({"error": {"message": RAW_MARKUP}})
            payload = ('data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
                       '"delta":{"role":"assistant"},"finish_reason":null}]}\n\n' f"data: {frame}\n\n").encode()
            self._send(200, payload, "text/event-stream")
            return
        self._send(400, b'{"error": {"message": "unsupported in this fixture"}}', "application/json")


@pytest.fixture(scope="module")
def mlx_like():
    with Loopback(MLXLikeHandler) as server:
        yield server.url


def by_id(report):
    return {r.id: r for r in report.results}


def test_mlx_like_sanitised_id_gives_server_error_and_error_frame(mlx_like):
    report = run_checks(CheckOptions(base_url=mlx_like, only=["contract.id_roundtrip.sanitised.*", "health.live"],
                                     timeout=5))
    results = by_id(report)
    assert results["health.live"].status == "pass"
    nonstream = results["contract.id_roundtrip.sanitised.nonstream"]
    stream = results["contract.id_roundtrip.sanitised.stream"]
    assert (nonstream.status, nonstream.kind) == ("fail", "server_error")
    assert "HTTP 500" in nonstream.detail and "Internal Server Error" in nonstream.evidence
    assert (stream.status, stream.kind) == ("fail", "error_frame")
    assert "<|tool_calls_section_begin|>" in stream.evidence
    assert report.exit_code == ExitCode.FAILED
    assert report.model == "mlx-community/Kimi-K2.5"  # no profile, no --model: the first listed


def test_unreachable_server_exits_3_with_every_check_unreachable(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = run_cli(["check", "--base-url", url, "--only", "health.*,contract.plain.*",
                      "--json", str(tmp_path / "r.json"), "--prom", str(tmp_path / "c.prom"), "--timeout", "2"])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["exit_code"] == 3
    assert [c["id"] for c in doc["checks"]] == ["health.live", "health.ready", "health.models",
                                                "contract.plain.nonstream", "contract.plain.stream"]
    assert {(c["status"], c["kind"]) for c in doc["checks"]} == {("fail", "unreachable")}
    assert 'kimi_deploy_check_failures{kind="unreachable"} 5' in (tmp_path / "c.prom").read_text()


@pytest.mark.parametrize("args, needle", [
    (["check"], "no server to check"),
    (["check", "--base-url", "http://127.0.0.1:9", "--only", "helth.*"], "no check id matches 'helth.*'"),
    (["check", "--base-url", "127.0.0.1:9"], "must start with http://"),
    (["check", "--base-url", "http://127.0.0.1:9", "--api-key-file", "/nonexistent/key"], "cannot read the API key"),
    (["check", "--profile", "/nonexistent/profile.toml"], "profile file not found"),
])
def test_usage_errors_exit_2_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "r.json"
    result = run_cli([*args, "--json", str(out)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_bad_profile_exits_2(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text('[sglang]\nmodel_path = "/m"\ntp_size = 3\n[service]\ngpu_count = 8\n')
    result = run_cli(["check", "--profile", str(profile)])
    assert result.exit_code == ExitCode.USAGE
    assert "tp_size" in result.stderr


def test_list_prints_stable_ids():
    result = run_cli(["check", "--list"])
    assert result.exit_code == 0
    ids = result.stdout.split()
    assert ids[:7] == ["health.live", "health.ready", "health.models", "config.tool_call_parser",
                       "config.reasoning_parser", "config.speculative", "config.tp_size"]
    for must in ("contract.id_roundtrip.sanitised.stream", "contract.arguments.large.nonstream",
                 "contract.tool_none.stream", "contract.multi_turn.stream", "contract.malformed"):
        assert must in ids
    assert len(ids) == len(set(ids))
    only = run_cli(["check", "--list", "--only", "contract.id_roundtrip", "--skip", "*.stream"]).stdout.split()
    assert only == [f"contract.id_roundtrip.{s}.nonstream"
                    for s in ("canonical", "sanitised", "openai", "anthropic", "uuid", "counter")]


def test_nightly_unit_command_line_is_accepted(tmp_path):
    """The ExecStart= of kimi-deploy-check@NAME.service (targets/systemd.py) parses: check --profile --api-key-file --json ..."""
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.targets.systemd import render

    unit = render(get_preset("kimi-k25-rtx-pro-6000-x8").profile()).files["kimi-deploy-check@kimi-k25.service"]
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.split("=", 1)[1].split()
    assert argv[1:3] == ["check", "--profile"] and "--api-key-file" in argv and "--prom" in argv
    key = tmp_path / "api-key"
    key.write_text("sk-test\n")
    key.chmod(0o600)  # what LoadCredential= gives: nothing for other users
    # host paths -> tmp paths; the profile points at a port nothing listens on
    profile = tmp_path / "kimi-k25.toml"
    profile.write_text(f'[service]\nname = "kimi-k25"\n[sglang]\nmodel_path = "/m"\nport = {free_port()}\n'
                       'tp_size = 8\n')
    mapping = {"/etc/kimi-deploy/kimi-k25.toml": str(profile), "%d/api-key": str(key)}
    args = [mapping.get(a, a.replace("/var/lib/kimi-deploy-check", str(tmp_path)).replace("/var/lib/kimi-k25",
                                                                                          str(tmp_path)))
            for a in argv[1:]]
    result = run_cli([*args, "--only", "health.live", "--timeout", "2"])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    for name in ("check-report.json", "check-report.xml", "check.prom"):
        assert (tmp_path / name).is_file(), name
    assert Path(tmp_path / "check-report.json").read_text().startswith('{\n  "schema": "kimi-deploy.check/1"')
