"""status: the systemctl show parser, launch drift (/server_info and /proc), patch state, nightly report.

STAND-IN NOTICE (for the merge): tests using ``patching_stand_in`` replace ``kimi_deploy.patching``
in ``sys.modules`` with a local module implementing ``status(python) -> SeriesStatus`` (``.state``,
``.to_dict()``); switch them to the real module once it is on main.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from install_fakes import SHOW_ACTIVE, SHOW_FAILED, FakeServer, FakeSystemd, sglang_server_args, write_profile
from kimi_deploy.cli import cli
from kimi_deploy.install import apply, plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.render import render
from kimi_deploy.status import compare_launch, normalize_args, redact, server_args_from_cmdline
from kimi_deploy.systemd import parse_show


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch) -> FakeSystemd:
    fake = FakeSystemd(tmp_path)
    monkeypatch.setenv("FAKE_SYSTEMD_DIR", str(fake.dir))
    monkeypatch.setenv("PATH", f"{fake.bin}:{__import__('os').environ['PATH']}")
    return fake


@pytest.fixture
def patching_stand_in(monkeypatch):
    """STAND-IN for kimi_deploy.patching (see module docstring)."""
    module = types.ModuleType("kimi_deploy.patching")
    module.state = "applied"

    class SeriesStatus:
        def __init__(self, state):
            self.state = state

        def to_dict(self):
            return {"state": self.state, "patches": []}

    module.status = lambda python: SeriesStatus(module.state)
    monkeypatch.setitem(sys.modules, "kimi_deploy.patching", module)
    return module


def test_parse_show_active_and_failed():
    active = parse_show(SHOW_ACTIVE.format(pid=48213))
    assert (active.unit, active.active_state, active.sub_state, active.unit_file_state) == \
        ("kimi-test.service", "active", "running", "enabled")
    assert active.main_pid == 48213 and active.n_restarts == 2 and active.is_active
    assert active.started_at == "Sat 2025-06-14 10:02:11 UTC"
    failed = parse_show(SHOW_FAILED)
    assert failed.is_failed and failed.main_pid is None and failed.result == "exit-code"
    empty = parse_show("", "x.service")
    assert empty.unit == "x.service" and empty.main_pid is None and empty.n_restarts is None


def test_launch_command_with_merged_config_is_in_sync_and_redacted(tmp_path):
    profile = load_profile(write_profile(tmp_path / "p.toml"))
    rendered = list(render(profile).launch.server_args)
    assert "--config" in rendered  # the API key comes through SGLang's --config YAML
    # SGLang 0.5.23 prepends the YAML's values and drops --config from launch_command
    i = rendered.index("--config")
    running = ["--api-key", "SECRET-KEY", *rendered[:i], *rendered[i + 2:]]
    drift = compare_launch(running, rendered, "/server_info launch_command")
    assert drift.in_sync, drift.to_dict()
    assert "SECRET-KEY" not in json.dumps(drift.to_dict())
    assert redact(["--api-key=abc", "--admin-api-key", "x"]) == ["--api-key=<redacted>", "--admin-api-key",
                                                                  "<redacted>"]
    changed = [a if a != "1000" else "4096" for a in running]
    drift = compare_launch(changed, rendered, "x")
    assert drift.missing == ["--context-length 1000"] and drift.unexpected == ["--context-length 4096"]
    assert normalize_args(["--port=1", "--trust-remote-code"]) == ["--port 1", "--trust-remote-code"]


def test_server_args_from_cmdline():
    assert server_args_from_cmdline(["/v/bin/python", "-m", "sglang.launch_server", "--port", "1"]) == ["--port", "1"]
    assert server_args_from_cmdline(["/usr/bin/python", "x.py"]) is None


def _installed(tmp_path, port, **kw):
    root = tmp_path / "root"
    path = write_profile(tmp_path / "p.toml", port=port, **kw)
    apply(plan_install(load_profile(path), HostLayout(root), enable=False, create_user=False))
    return root, load_profile(path)


def test_status_json_healthy_in_sync(cli_runner, tmp_path, fake_systemd, patching_stand_in):
    holder = {}

    def running():
        args = list(render(holder["profile"]).launch.server_args)
        i = args.index("--config")
        return sglang_server_args(holder["profile"], launch_command=" ".join(
            ["--api-key", holder["key"], *args[:i], *args[i + 2:]]))

    with FakeServer(args=running) as server:
        root, profile = _installed(tmp_path, server.port)
        holder["profile"] = profile
        holder["key"] = server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        fake_systemd.set_show(SHOW_ACTIVE.format(pid=48213))
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] and data["problems"] == []
    assert data["unit"]["main_pid"] == 48213 and data["unit"]["n_restarts"] == 2
    assert data["launch"]["in_sync"] and data["launch"]["source"] == "/server_info launch_command"
    assert data["patches"]["state"] == "applied"
    assert data["health"]["ready"] is True
    assert holder["key"] not in result.output
    assert ["show", "kimi-test.service", "--property=Id,LoadState,ActiveState,SubState,UnitFileState,MainPID,"
            "NRestarts,ExecMainStartTimestamp,ExecMainStatus,Result,FragmentPath"] in fake_systemd.calls()


def test_status_finds_drift_in_proc_cmdline_and_reports_problems(cli_runner, tmp_path, fake_systemd,
                                                                 patching_stand_in):
    # no /server_info: falls back to /proc/<pid>/cmdline
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, profile = _installed(tmp_path, server.port)
        args = [a if a != "1000" else "8192" for a in render(profile).launch.server_args]
        script = tmp_path / "launch_server.py"
        script.write_text("import time\ntime.sleep(60)\n")
        child = subprocess.Popen([sys.executable, str(script), *args])
        try:
            fake_systemd.set_show(SHOW_ACTIVE.format(pid=child.pid))
            patching_stand_in.state = "drifted"
            (root / "var/lib/kimi-test").mkdir(parents=True)
            (root / "var/lib/kimi-test/check-report.json").write_text(json.dumps(
                {"exit_code": 1, "results": [{"id": "a", "status": "pass"}, {"id": "b", "status": "fail"}]}))
            (root / "etc/kimi-deploy/kimi-test.env").write_text("edited\n")
            result = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
        finally:
            child.kill()
            child.wait()
    assert result.exit_code == 1
    out = result.output
    assert f"launch    DRIFT (from /proc/{child.pid}/cmdline)" in out
    assert "- --context-length 1000" in out and "+ --context-length 8192" in out
    assert "problem: patch series is drifted" in out
    assert "problem: the last nightly check failed (exit 1)" in out
    assert "problem: /etc/kimi-deploy/kimi-test.env is modified" in out
    assert "NOT READY" in out


def test_status_of_a_failed_unit(cli_runner, tmp_path, fake_systemd):
    with FakeServer(ready=lambda n: False) as server:
        root, _ = _installed(tmp_path, server.port)
        fake_systemd.set_show(SHOW_FAILED)
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert result.exit_code == 1 and "kimi-test.service is failed/failed" in data["problems"]
    assert data["launch"] is None
