"""`kimi-deploy check` against servers that answer, but not as an OpenAI-compatible SGLang does.

Real loopback servers: the standard library's static file server (``python -m http.server``:
an HTML 404 page for every API path), and the SGLang-shaped fake of tests/install_fakes.py
with an API key (401 without it, as SGLang 0.5.23's API-key middleware). Report paths: ``-``
is stdout for ``--json`` only.
"""

from __future__ import annotations

import functools
import json
from http.server import SimpleHTTPRequestHandler

import pytest

from helpers import run_cli
from install_fakes import FakeServer, write_profile
from loopback import Loopback, QuietHandler
from kimi_deploy.check import check_ids
from kimi_deploy.check.results import EVIDENCE_CHARS
from kimi_deploy.errors import ExitCode


class _QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def file_server(tmp_path_factory):
    """``python -m http.server`` on loopback, serving an empty folder."""
    handler = functools.partial(_QuietFiles, directory=str(tmp_path_factory.mktemp("www")))
    with Loopback(handler) as server:
        yield server.url


def _report(tmp_path, *args):
    result = run_cli(["check", *args, "--json", str(tmp_path / "r.json")])
    return result, {c["id"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}


def test_a_static_file_server_is_named_as_not_openai_compatible(tmp_path, file_server):
    result, checks = _report(tmp_path, "--base-url", file_server)
    assert result.exit_code == ExitCode.FAILED
    live = checks["health.live"]
    for path in ("/health", "/ready", "/v1/models"):  # every endpoint tried, with its status
        assert f"GET {path}: HTTP 404 Not Found" in live["detail"], live
        assert f"GET {path} 404" in live["evidence"], live
    for c in checks.values():  # bodies one line, whitespace collapsed, cut
        assert "\\n" not in c["evidence"] and "\n" not in c["evidence"] and "  " not in c["evidence"], c
        assert len(c["evidence"]) <= EVIDENCE_CHARS, c
    assert "<!DOCTYPE HTML> <html" in checks["health.models"]["evidence"]
    contract = [c for i, c in checks.items() if check_ids.tier(i) == "contract"]
    assert len(contract) == len([i for i in check_ids.select([], []) if check_ids.tier(i) == "contract"])
    for c in contract:  # not a silent skip: the user learns this is no OpenAI-compatible server
        assert (c["status"], c["kind"]) == ("fail", "http_error"), c
        assert "not an OpenAI-compatible server" in c["detail"] and "GET /v1/models 404" in c["evidence"], c


class _EmptyListHandler(QuietHandler):
    """Healthy, and ``/v1/models`` lists no model (an OpenAI-compatible server with nothing loaded)."""

    def do_GET(self):  # noqa: N802
        self._send(200, b'{"object": "list", "data": []}' if self.path == "/v1/models" else b"{}")


def test_an_empty_model_list_still_skips_the_contract_checks(tmp_path):
    with Loopback(_EmptyListHandler) as server:
        result, checks = _report(tmp_path, "--base-url", server.url, "--only", "contract.plain.*")
    assert {c["status"] for c in checks.values()} == {"skip"}, checks
    assert result.exit_code == ExitCode.OK


def test_a_keyed_server_without_the_key_says_a_key_is_needed(tmp_path):
    with FakeServer(api_key="sk-test") as server:
        profile = write_profile(tmp_path / "p.toml", port=server.port, api_key=False)
        result, checks = _report(tmp_path, "--profile", str(profile), "--only", "health.*,config.*")
    assert result.exit_code == ExitCode.FAILED
    config = [c for i, c in checks.items() if i.startswith("config.")]
    assert len(config) == 4
    for c in config + [checks["health.models"]]:  # with a profile: fail, never "not SGLang?" skip
        assert (c["status"], c["kind"]) == ("fail", "http_error"), c
        assert c["evidence"] == "HTTP 401: an API key is needed", c
        assert "--api-key-file" in c["detail"], c


def test_a_keyed_server_with_the_key_passes_the_config_tier(tmp_path):
    with FakeServer(api_key="sk-test") as server:
        profile = write_profile(tmp_path / "p.toml", port=server.port, api_key=False)
        key = tmp_path / "key"
        key.write_text("sk-test\n")
        key.chmod(0o600)  # the key-file rule: nothing for other users (apikey.key_file_problem)
        result, checks = _report(tmp_path, "--profile", str(profile), "--api-key-file", str(key),
                                 "--only", "config.tool_call_parser,config.tp_size")
    assert {c["status"] for c in checks.values()} == {"pass"}, checks
    assert result.exit_code == ExitCode.OK


@pytest.mark.parametrize("args", [
    ["--junit", "-"], ["--prom", "-"], ["--json", "-", "--junit", "-"], ["--json", "-", "--prom", "-"]])
def test_only_json_may_write_to_stdout(tmp_path, monkeypatch, file_server, args):
    monkeypatch.chdir(tmp_path)
    result = run_cli(["check", "--base-url", file_server, "--only", "health.live", *args])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "cannot write to stdout ('-')" in result.stderr and "fix: " in result.stderr
    assert list(tmp_path.iterdir()) == []  # no file named '-'
