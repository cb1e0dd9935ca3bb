"""restart --wait / --rollback-on-failure with a fake systemctl/journalctl and a loopback server.

STAND-IN NOTICE (for the merge): the tests using the ``check_stand_in`` fixture replace
``kimi_deploy.check`` in ``sys.modules`` with a tiny local module implementing the agreed
interface (``CheckOptions``, ``run_checks -> CheckReport(.exit_code, .results)``). Once the real
module is on main, drop the fixture and let the real fast tier run against the same servers.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import httpx
import pytest

from install_fakes import STARTUP_JOURNAL, SHOW_FAILED, FakeServer, FakeSystemd, write_profile
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.install import apply, plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.readiness import phase_of, wait_ready
from kimi_deploy.restart import restart

UNIT = "etc/systemd/system/kimi-test.service"


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch) -> FakeSystemd:
    fake = FakeSystemd(tmp_path)
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(fake.dir))
    monkeypatch.setenv("PATH", f"{fake.bin}:{__import__('os').environ['PATH']}")
    return fake


@pytest.fixture
def check_stand_in(monkeypatch):
    """STAND-IN for kimi_deploy.check (see module docstring): health + the tool parser from /model_info."""
    calls: list = []

    @dataclasses.dataclass
    class CheckOptions:
        base_url: str
        model: str
        api_key: str | None
        profile: object
        only: list
        timeout: float

    @dataclasses.dataclass
    class Result:
        id: str
        status: str
        kind: str
        detail: str
        evidence: dict

    @dataclasses.dataclass
    class CheckReport:
        exit_code: ExitCode
        results: list

    def run_checks(options: CheckOptions) -> CheckReport:
        calls.append(options)
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        health = httpx.get(options.base_url + "/health_generate", timeout=options.timeout)
        info = httpx.get(options.base_url + "/model_info", headers=headers, timeout=options.timeout).json()
        want = options.profile.sglang.tool_call_parser
        results = [
            Result("health.generate", "pass" if health.status_code == 200 else "fail", "health",
                   f"HTTP {health.status_code}", {}),
            Result("config.tool_call_parser", "pass" if info.get("tool_call_parser") == want else "fail", "config",
                   f"server {info.get('tool_call_parser')!r}, profile {want!r}", {}),
        ]
        failed = any(r.status == "fail" for r in results)
        return CheckReport(ExitCode.FAILED if failed else ExitCode.OK, results)

    module = types.ModuleType("kimi_deploy.check")
    module.CheckOptions, module.run_checks, module.calls = CheckOptions, run_checks, calls
    monkeypatch.setitem(sys.modules, "kimi_deploy.check", module)
    return module


def _install(root: Path, profile_path: Path) -> None:
    apply(plan_install(load_profile(profile_path), HostLayout(root), enable=False, create_user=False))


def _setup(tmp_path, port: int) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    v1 = write_profile(tmp_path / "v1.toml", port=port, context_length=1000)
    v2 = write_profile(tmp_path / "v2.toml", port=port, context_length=2000)
    return root, v1, v2


def _unit_is(root: Path, context_length: int) -> bool:
    try:
        return f"--context-length {context_length} " in (root / UNIT).read_text()
    except FileNotFoundError:
        return False


def test_phase_of_reads_sglang_startup_lines():
    phases = [phase_of(line) for line in STARTUP_JOURNAL]
    assert phases == [None, "loading weights", "loading weights", "weights loaded", "allocating the KV cache",
                      "capturing CUDA graphs", "capturing CUDA graphs", "warming up", "ready"]


def test_wait_ready_after_n_polls_reports_phases_and_journal(fake_systemd):
    fake_systemd.set_journal(STARTUP_JOURNAL[1:])
    seen = []
    with FakeServer(ready=lambda n: n >= 4) as server:
        result = wait_ready(f"http://127.0.0.1:{server.port}", "kimi-test.service", timeout=10, poll_interval=0.01,
                            on_poll=seen.append)
    assert result.ready and result.polls == 4 and not result.timed_out
    assert [s.phase for s in seen] == ["loading weights", "loading weights", "weights loaded", "ready"]
    assert seen[1].last_line.startswith("Loading safetensors")
    assert ["-u", "kimi-test.service", "-n", "1", "-o", "cat", "--no-pager"] in fake_systemd.calls("journalctl")
    assert server.paths.count("/model_info") == 1  # asked only once /health_generate said 200


def test_wait_ready_needs_model_info_too(fake_systemd):
    with FakeServer(ready=lambda n: True, api_key="k") as server:
        base = f"http://127.0.0.1:{server.port}"
        no_key = wait_ready(base, "kimi-test.service", timeout=0.3, poll_interval=0.1)
        with_key = wait_ready(base, "kimi-test.service", api_key="k", timeout=1, poll_interval=0.1)
    assert not no_key.ready and no_key.timed_out and no_key.last_probe.http_status == 401
    assert with_key.ready


def test_wait_stops_early_when_the_unit_failed(fake_systemd):
    fake_systemd.set_show(SHOW_FAILED)
    with FakeServer(ready=lambda n: False) as server:
        result = wait_ready(f"http://127.0.0.1:{server.port}", "kimi-test.service", timeout=30, poll_interval=0.01)
    assert result.unit_failed and not result.ready and result.polls == 1


def test_restart_wait_ready_after_n_polls_runs_the_fast_tier(cli_runner, tmp_path, fake_systemd, check_stand_in):
    with FakeServer(ready=lambda n: n >= 3, api_key=None) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        _install(root, v1)
        key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        server.api_key = key
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--wait", "--poll-interval", "0.01",
                                         "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output + result.stderr
    data = json.loads(result.output)
    assert data["ok"] and data["attempts"][0]["wait"]["polls"] >= 3
    assert fake_systemd.verbs() == ["restart kimi-test.service"]
    (options,) = check_stand_in.calls  # [STAND-IN]
    assert options.only == ["health.*", "config.*"] and options.api_key == key
    assert options.base_url == f"http://127.0.0.1:{server.port}"
    assert key not in result.output


def test_restart_timeout_default_comes_from_timeout_start_sec(tmp_path, fake_systemd, monkeypatch):
    seen = {}

    def fake_wait(base_url, unit, **kw):
        seen.update(kw)
        from kimi_deploy.readiness import WaitResult
        return WaitResult(False, True, False, 0.0, 1, None, None, None)

    monkeypatch.setattr("kimi_deploy.restart.wait_ready", fake_wait)
    root, v1, _ = _setup(tmp_path, 30000)
    _install(root, v1)
    result = restart(load_profile(v1), HostLayout(root), wait=True)
    assert seen["timeout"] == 600.0 and result.exit_code == ExitCode.TIMEOUT


def test_never_ready_without_rollback_times_out_and_keeps_the_new_files(cli_runner, tmp_path, fake_systemd):
    fake_systemd.set_journal(STARTUP_JOURNAL[1:5])
    with FakeServer(ready=lambda n: False) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        _install(root, v1)
        _install(root, v2)
        new_bytes = (root / UNIT).read_bytes()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--wait", "--timeout", "1.5",
                                         "--poll-interval", "0.05"], catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT
    assert server.health_calls >= 5  # more polls than journal lines: the last phase is the last line's
    assert "new: FAILED: not ready after" in result.output
    assert "last phase: allocating the KV cache" in result.output
    # not a terminal: one progress line per phase change, with the journal line
    assert "loading weights          [2025-06-14 10:02:40 TP0] Load weight begin" in result.stderr
    assert result.stderr.count("capturing CUDA graphs") == 0 and result.stderr.count("weights loaded") == 1
    assert (root / UNIT).read_bytes() == new_bytes
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_never_ready_rolls_back_to_the_previous_bytes(cli_runner, tmp_path, fake_systemd, check_stand_in):
    # the "server" comes up only when the v1 unit is installed: v2 never becomes ready
    root_holder = {}
    with FakeServer(ready=lambda n: _unit_is(root_holder["root"], 1000)) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        root_holder["root"] = root
        _install(root, v1)
        v1_files = {p: (root / p).read_bytes() for p in (UNIT, "etc/kimi-deploy/kimi-test.env",
                                                         "etc/kimi-deploy/kimi-test.toml",
                                                         "etc/kimi-deploy/kimi-test.manifest.json")}
        _install(root, v2)
        assert (root / UNIT).read_bytes() != v1_files[UNIT]
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--wait", "--rollback-on-failure",
                                         "--timeout", "0.5", "--poll-interval", "0.05", "--json"],
                                   catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT  # the new version failed, even though the rollback worked
    data = json.loads(result.output)
    new, back = data["attempts"]
    assert not new["ok"] and new["wait"]["timed_out"]
    assert back["label"] == "rollback" and back["ok"], back
    for rel, old in v1_files.items():
        assert (root / rel).read_bytes() == old, rel
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload", "restart kimi-test.service"]
    assert data["rollback"]["had_previous_service"] is True
    # the used backup is marked, so a later rollback goes further back
    assert any(p.name.endswith(".rolled-back") for p in (root / "etc/kimi-deploy/backup/kimi-test").iterdir())


def test_failing_config_tier_rolls_back(cli_runner, tmp_path, fake_systemd, check_stand_in):
    # both versions start, but under v2 the server reports the wrong tool parser: the config tier fails
    holder = {}

    def model_info():
        return {"tool_call_parser": "kimi_k2" if _unit_is(holder["root"], 1000) else "qwen25"}

    with FakeServer(ready=lambda n: True, model_info=model_info) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v1)
        v1_unit = (root / UNIT).read_bytes()
        _install(root, v2)
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--wait", "--rollback-on-failure",
                                         "--timeout", "5", "--poll-interval", "0.05"], catch_exceptions=False)
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "new: FAILED" in result.output and "config.tool_call_parser" in result.output
    assert "rollback: ok" in result.output
    assert (root / UNIT).read_bytes() == v1_unit
    assert len(check_stand_in.calls) == 2  # [STAND-IN] once per attempt


def test_rollback_of_a_first_install_stops_and_disables(cli_runner, tmp_path, fake_systemd):
    with FakeServer(ready=lambda n: False) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        _install(root, v1)
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--rollback-on-failure",
                                         "--timeout", "0.3", "--poll-interval", "0.05", "--json"],
                                   catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT
    data = json.loads(result.output)
    assert data["rollback"]["had_previous_service"] is False and len(data["attempts"]) == 1
    assert not (root / UNIT).exists() and not (root / "etc/kimi-deploy/kimi-test.manifest.json").exists()
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload",
                                    "disable kimi-test.service kimi-deploy-check.timer"]
    assert ["disable", "--now", "kimi-test.service", "kimi-deploy-check.timer"] in fake_systemd.calls()


def test_restart_reports_a_systemctl_failure(cli_runner, tmp_path, fake_systemd):
    fake_systemd.fail("restart")
    root, v1, _ = _setup(tmp_path, 1)
    _install(root, v1)
    result = cli_runner.invoke(cli, ["restart", "--root", str(root)], catch_exceptions=False)
    assert result.exit_code == ExitCode.EXTERNAL
    assert "systemctl restart kimi-test.service" in result.stderr and "fake failure" in result.stderr
