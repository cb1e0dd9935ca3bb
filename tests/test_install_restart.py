"""restart --wait / --rollback-on-failure with a fake systemctl/journalctl and a loopback server.

After readiness, restart runs the real fast tier of ``kimi-deploy check`` (``health.*``,
``config.*``) against the loopback server, which answers with the arguments of the profile
installed under the test root (``FakeServer(args=...)``), like the server systemd would start.

Waits run on :class:`helpers.FakeTime` (the ``fake_time`` fixture): the clock moves only by the
sleeps between polls, so how many polls fit in ``--timeout`` does not depend on the machine's load.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

import pytest

from helpers import FakeTime
from install_fakes import snapshot
from install_fakes import STARTUP_JOURNAL, SHOW_AUTO_RESTART, SHOW_FAILED, FakeServer, sglang_server_args, write_profile
from kimi_deploy.check import check_ids
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.host.readiness import phase_of, wait_ready
from kimi_deploy.host import restart as restart_lib
from kimi_deploy.host.restart import restart
from kimi_deploy.deployment import resolve

UNIT = "etc/systemd/system/kimi-test.service"


def _install(root: Path, profile_path: Path) -> None:
    apply(plan_install(load_profile(profile_path), HostLayout(root), enable=False, create_user=False))


def _setup(tmp_path, port: int) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    v1 = write_profile(tmp_path / "v1.toml", port=port, context_length=1000)
    v2 = write_profile(tmp_path / "v2.toml", port=port, context_length=2000)
    return root, v1, v2


#: What restart --gate parser runs once the server is ready (the fast tier, then the parser tier).
FAST_TIER = check_ids.select(["health.*", "config.*"], []) + check_ids.select(["parser.*"], [])[:1]
assert "health.ready" in FAST_TIER and "config.tool_call_parser" in FAST_TIER
#: The fake answers no POST, so the parser.* tier is its one skip row ("no parser endpoints").
FAST_STATUS = {i: "skip" if i.startswith("parser.") else "pass" for i in FAST_TIER}
PROFILE_COPY = "etc/kimi-deploy/kimi-test.toml"


def _running(holder: dict, **overrides):
    """``FakeServer(args=...)``: the arguments of the profile installed under ``holder["root"]``,
    with ``overrides`` while the v2 unit (context length 2000) is installed."""
    def args():
        profile = load_profile(holder["root"] / PROFILE_COPY)
        return sglang_server_args(profile, **(overrides if _unit_is(holder["root"], 2000) else {}))
    return args


def _unit_is(root: Path, context_length: int) -> bool:
    try:
        return f"--context-length {context_length} " in (root / UNIT).read_text()
    except FileNotFoundError:
        return False


@pytest.fixture
def fake_time(monkeypatch) -> FakeTime:
    """``kimi-deploy restart`` (the CLI) waits on a :class:`FakeTime` instead of the wall clock."""
    fake = FakeTime()
    monkeypatch.setattr(restart_lib, "restart", functools.partial(restart_lib.restart, clock=fake.monotonic,
                                                                  sleep=fake.sleep))
    return fake


def test_phase_of_reads_sglang_startup_lines():
    phases = [phase_of(line) for line in STARTUP_JOURNAL]
    assert phases == [None, "loading weights", "loading weights", "weights loaded", "allocating the KV cache",
                      "capturing CUDA graphs", "capturing CUDA graphs", "warming up", "ready"]


def test_wait_ready_after_n_polls_reports_phases_and_journal(fake_systemd):
    fake_systemd.set_journal(STARTUP_JOURNAL[1:])
    seen = []
    fake = FakeTime()
    with FakeServer(ready=lambda n: n >= 4) as server:
        result = wait_ready(f"http://127.0.0.1:{server.port}", "kimi-test.service", timeout=10, poll_interval=0.01,
                            on_poll=seen.append, clock=fake.monotonic, sleep=fake.sleep)
    assert result.ready and result.polls == 4 and not result.timed_out
    assert fake.slept == [0.01] * 3 and [s.elapsed for s in seen] == pytest.approx([0, 0.01, 0.02, 0.03])
    assert [s.phase for s in seen] == ["loading weights", "loading weights", "weights loaded", "ready"]
    assert seen[1].last_line.startswith("Loading safetensors")
    assert ["-u", "kimi-test.service", "-n", "1", "-o", "cat", "--no-pager"] in fake_systemd.calls("journalctl")
    assert "/model_info" not in server.paths  # readiness is /health_generate's 1-token generation (wire.readiness)
    assert result.to_dict()["last_probe"]["words"].startswith("ready (GET http://127.0.0.1:")


@pytest.mark.parametrize("show", [SHOW_FAILED, SHOW_AUTO_RESTART], ids=["failed", "auto-restart"])
def test_wait_stops_early_when_the_unit_failed(fake_systemd, show):
    fake_systemd.set_show(show)
    fake = FakeTime()
    with FakeServer(ready=lambda n: False) as server:
        result = wait_ready(f"http://127.0.0.1:{server.port}", "kimi-test.service", timeout=30, poll_interval=0.01,
                            clock=fake.monotonic, sleep=fake.sleep)
    assert result.unit_failed and not result.ready and result.polls == 1 and fake.slept == []


def test_restart_wait_ready_after_n_polls_runs_the_fast_tier(cli_runner, tmp_path, fake_systemd):
    holder = {}
    with FakeServer(ready=lambda n: n >= 3, args=_running(holder), api_key=None) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v1)
        key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        server.api_key = key
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--poll-interval", "0.01",
                                         "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output + result.stderr
    data = json.loads(result.output)
    assert data["ok"] and data["attempts"][0]["wait"]["polls"] >= 3
    assert fake_systemd.verbs() == ["restart kimi-test.service"]
    checks = data["attempts"][0]["checks"]
    assert checks["exit_code"] == 0
    assert [r["id"] for r in checks["results"]] == FAST_TIER  # health.* and config.*, nothing else
    assert {r["id"]: r["status"] for r in checks["results"]} == FAST_STATUS
    # the checks reached this server, with the installed key (no 401), and read its facts
    assert server.unauthorized == []
    assert {"/health", "/v1/models", "/model_info", "/server_info"} <= set(server.paths)
    assert "gate parser passed (fast %d, parser 1 checks)" % (len(FAST_TIER) - 1) in data["attempts"][0]["summary"]
    gate = data["attempts"][0]["gate"]
    assert [t["tier"] for t in gate["tiers"]] == ["ready", "fast", "parser"] and gate["ok"]
    assert data["failed_tier"] is None and data["failed_checks"] == [] and not data["rolled_back"]
    assert key not in result.output


def test_restart_timeout_default_comes_from_timeout_start_sec(tmp_path, fake_systemd, monkeypatch):
    seen = {}

    def fake_wait(base_url, unit, **kw):
        seen.update(kw)
        from kimi_deploy.host.readiness import WaitResult
        return WaitResult(False, True, False, 0.0, 1, None, None, None)

    monkeypatch.setattr("kimi_deploy.host.restart.wait_ready", fake_wait)
    root, v1, _ = _setup(tmp_path, 30000)
    _install(root, v1)
    result = restart(resolve(load_profile(v1), launches=False), HostLayout(root), wait=True)
    assert seen["timeout"] == 600.0 and result.exit_code == ExitCode.TIMEOUT


def test_never_ready_without_rollback_times_out_and_keeps_the_new_files(cli_runner, tmp_path, fake_systemd,
                                                                         fake_time):
    fake_systemd.set_journal(STARTUP_JOURNAL[1:5])
    with FakeServer(ready=lambda n: False) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        _install(root, v1)
        _install(root, v2)
        new_bytes = (root / UNIT).read_bytes()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--timeout", "1.5",
                                         "--poll-interval", "0.25"], catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT
    assert server.health_calls >= 5  # more polls than journal lines: the last phase is the last line's
    assert fake_time.slept == [0.25] * (server.health_calls - 1)  # polled until 1.5 s of the test's time
    assert "new: FAILED: not ready after" in result.output
    assert "last phase: allocating the KV cache" in result.output
    # not a terminal: one progress line per phase change, with the journal line
    assert "loading weights          [2025-06-14 10:02:40 TP0] Load weight begin" in result.stderr
    assert result.stderr.count("capturing CUDA graphs") == 0 and result.stderr.count("weights loaded") == 1
    assert (root / UNIT).read_bytes() == new_bytes
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_never_ready_rolls_back_to_the_previous_bytes(cli_runner, tmp_path, fake_systemd, fake_time):
    # the "server" comes up only when the v1 unit is installed: v2 never becomes ready
    root_holder = {}
    with FakeServer(ready=lambda n: _unit_is(root_holder["root"], 1000), args=_running(root_holder)) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        root_holder["root"] = root
        _install(root, v1)
        v1_files = {p: (root / p).read_bytes() for p in (UNIT, "etc/kimi-deploy/kimi-test.env",
                                                         "etc/kimi-deploy/kimi-test.toml",
                                                         "etc/kimi-deploy/kimi-test.manifest.json")}
        _install(root, v2)
        assert (root / UNIT).read_bytes() != v1_files[UNIT]
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--rollback-on-failure",
                                         "--timeout", "0.5", "--poll-interval", "0.05", "--json"],
                                   catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT  # the new version failed, even though the rollback worked
    data = json.loads(result.output)
    new, back = data["attempts"]
    assert not new["ok"] and new["wait"]["timed_out"]
    assert back["label"] == "rollback" and back["ok"], back
    assert new["checks"] is None  # never ready: nothing to check
    assert back["checks"]["exit_code"] == 0 and [r["id"] for r in back["checks"]["results"]] == FAST_TIER
    for rel, old in v1_files.items():
        assert (root / rel).read_bytes() == old, rel
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload", "restart kimi-test.service"]
    assert data["rollback"]["had_previous_service"] is True
    # the used backup is marked, so a later rollback goes further back
    assert any(p.name.endswith(".rolled-back") for p in (root / "etc/kimi-deploy/backup/kimi-test").iterdir())


def test_a_start_job_that_fails_is_rolled_back(cli_runner, tmp_path, fake_systemd):
    # systemctl restart waits for the start job: under v2 it fails (an ExecStartPre= such as patch verify exits 1,
    # or systemd cannot attach the process to its cgroup), so systemctl exits 1; that was exit 5 with the new
    # files left in place, the service down
    holder = {}
    with FakeServer(ready=lambda n: True, args=_running(holder)) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v1)
        v1_unit = (root / UNIT).read_bytes()
        _install(root, v2)
        fake_systemd.on("restart", f"""#!{sys.executable}
import sys
if "--context-length 2000 " in open({str(root / UNIT)!r}).read():
    sys.stderr.write("Job for kimi-test.service failed because the control process exited with error code.\\n"
                     'See "systemctl status kimi-test.service" and "journalctl -xeu kimi-test.service" for details.\\n')
    sys.exit(1)
""")
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "fast",
                                         "--rollback-on-failure", "--timeout", "5", "--poll-interval", "0.05", "--json"],
                                   catch_exceptions=False)
    assert result.exit_code == ExitCode.FAILED, result.output + result.stderr
    data = json.loads(result.output)
    new, back = data["attempts"]
    assert new["summary"] == ("kimi-test.service failed to start: Job for kimi-test.service failed because the "
                              "control process exited with error code.")
    assert data["failed_tier"] == "ready" and back["ok"], back
    assert (root / UNIT).read_bytes() == v1_unit
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload", "restart kimi-test.service"]
    # without --wait the failure is systemctl's, as before (exit 5, its message)
    _install(root, v2)
    plain = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd"], catch_exceptions=False)
    assert plain.exit_code == ExitCode.EXTERNAL and "Job for kimi-test.service failed" in plain.stderr


def test_failing_config_tier_rolls_back(cli_runner, tmp_path, fake_systemd):
    # both versions start, but under v2 the server runs without parsers: the config tier fails
    holder = {}
    no_parsers = _running(holder, tool_call_parser=None, reasoning_parser=None)
    with FakeServer(ready=lambda n: True, args=no_parsers) as server:
        root, v1, v2 = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v1)
        v1_unit = (root / UNIT).read_bytes()
        _install(root, v2)
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--rollback-on-failure",
                                         "--timeout", "5", "--poll-interval", "0.05"], catch_exceptions=False)
    assert result.exit_code == ExitCode.FAILED, result.output
    assert re.search(r"new: FAILED: ready after \d+ s, but the fast tier failed: config.tool_call_parser, "
                     r"config.reasoning_parser\n", result.output)
    assert "failed tier: fast: config.tool_call_parser, config.reasoning_parser" in result.output
    assert ("  fail   config.tool_call_parser [config_mismatch]: tool-call parser differs from the profile: "
            "tool_call_parser: running None, profile 'kimi_k2'") in result.output
    assert "  fail   config.reasoning_parser [config_mismatch]: " in result.output
    assert re.search(r"rollback: ok: ready after \d+ s; gate parser passed \(fast %d, parser 1 checks\)"
                     % (len(FAST_TIER) - 1), result.output)
    assert (root / UNIT).read_bytes() == v1_unit
    # one check run per tier: the new version stopped at its failed fast tier, the rollback ran fast and parser
    assert server.paths.count("/server_info") == 3
    assert server.unauthorized == []


def test_config_mismatch_in_the_json_result(cli_runner, tmp_path, fake_systemd):
    # no rollback asked: the JSON result names the failing config checks and their kind
    holder = {}
    with FakeServer(args=_running(holder, reasoning_parser=None)) as server:
        root, _, v2 = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v2)
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--timeout", "5",
                                         "--poll-interval", "0.05", "--json"], catch_exceptions=False)
    assert result.exit_code == ExitCode.FAILED, result.output
    data = json.loads(result.output)
    (new,) = data["attempts"]
    assert not data["ok"] and new["exit_code"] == ExitCode.FAILED and new["checks"]["exit_code"] == ExitCode.FAILED
    failed = [r for r in new["checks"]["results"] if r["status"] not in ("pass", "skip")]
    assert [(r["id"], r["status"], r["kind"]) for r in failed] == [("config.reasoning_parser", "fail",
                                                                   "config_mismatch")]
    assert "running None, profile 'kimi_k2'" in failed[0]["detail"]
    assert new["summary"].endswith("but the fast tier failed: config.reasoning_parser")
    assert data["failed_tier"] == "fast" and data["failed_checks"] == ["config.reasoning_parser"]
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_rollback_of_a_first_install_stops_and_disables(cli_runner, tmp_path, fake_systemd, fake_time):
    with FakeServer(ready=lambda n: False) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        _install(root, v1)
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--gate", "parser", "--rollback-on-failure",
                                         "--timeout", "0.3", "--poll-interval", "0.05", "--json"],
                                   catch_exceptions=False)
    assert result.exit_code == ExitCode.TIMEOUT
    data = json.loads(result.output)
    assert data["rollback"]["had_previous_service"] is False and len(data["attempts"]) == 1
    assert not (root / UNIT).exists() and not (root / "etc/kimi-deploy/kimi-test.manifest.json").exists()
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload",
                                    "disable kimi-test.service kimi-deploy-check@kimi-test.timer"]
    assert ["disable", "--now", "--", "kimi-test.service", "kimi-deploy-check@kimi-test.timer"] in fake_systemd.calls()


def test_restart_reports_a_systemctl_failure(cli_runner, tmp_path, fake_systemd):
    fake_systemd.fail("restart")
    root, v1, _ = _setup(tmp_path, 1)
    _install(root, v1)
    result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd"], catch_exceptions=False)
    assert result.exit_code == ExitCode.EXTERNAL
    assert "systemctl restart -- kimi-test.service" in result.stderr and "fake failure" in result.stderr
    # --root was given: the fix does not tell the operator to pass it (restart always uses the running systemd)
    assert "restart and status always act on the running systemd" in result.stderr


def test_unreadable_api_key_is_refused_before_anything_restarts(cli_runner, tmp_path, fake_systemd):
    """The key is needed to verify the new server: a missing key file fails first, with the service untouched."""
    with FakeServer(ready=lambda n: True, args=lambda: {}, api_key=None) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        _install(root, v1)
        key_file = root / "etc/kimi-deploy/kimi-test.api-key"
        key_file.unlink()
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--rollback-on-failure",
                                         "--poll-interval", "0.01"], catch_exceptions=False)
    assert result.exit_code == 2, result.output + result.stderr
    assert "cannot read the API key file" in result.stderr
    # a host path, the --root tree named once after it
    assert f"value: /etc/kimi-deploy/kimi-test.api-key (under --root {root})" in result.stderr
    assert str(key_file) not in result.stderr
    assert fake_systemd.verbs() == []


def test_restart_wait_prints_the_phases_of_a_replayed_start_and_keeps_them(cli_runner, tmp_path, fake_systemd):
    """The server's log of this start (SGLang 0.5.23's lines, tests/data/sglang-log/start-k25-eagle3.txt) gives
    each phase and its duration; a start that reached ready is kept as the last measured one under the root."""
    log = (Path(__file__).parent / "data/sglang-log/start-k25-eagle3.txt").read_text().splitlines()
    fake_systemd.set_full_journal(log)
    holder = {}
    with FakeServer(ready=lambda n: n >= 2, args=_running(holder), api_key=None) as server:
        root, v1, _ = _setup(tmp_path, server.port)
        holder["root"] = root
        _install(root, v1)
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        # the stub server answers no chat completion: the contract tier is not what this test is about
        text = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser",
                                       "--poll-interval", "0.01"], catch_exceptions=False)
        as_json = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser",
                                          "--poll-interval", "0.01", "--json"], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert "start phases (from SGLang's log):" in out
    for line in ("weights        271.5 s  (64/64 shards (100%), KimiK25ForConditionalGeneration, 71.16 GB)",
                 "kv_cache         6.0 s  (226002 tokens, 14.79 GB, torch.bfloat16)",
                 "draft           10.9 s", "cuda_graphs    186.0 s  (target verify, draft decode)",
                 "ready           32.0 s", "total          540.0 s (first log line to ready)"):
        assert line in out, line
    assert "kept as the last measured start: /var/lib/kimi-test/start-phases.json" in out
    kept = json.loads((root / "var/lib/kimi-test/start-phases.json").read_text())
    assert kept["total_seconds"] == 540.0 and kept["kv_tokens"] == 226002
    phases = json.loads(as_json.stdout)["attempts"][0]["phases"]
    assert [p["name"] for p in phases["phases"]] == ["weights", "kv_cache", "draft", "cuda_graphs", "ready"]
    assert phases["ready"] is True


def test_restart_and_upgrade_under_a_root_never_touch_this_hosts_systemd_unless_told(cli_runner, tmp_path,
                                                                                    fake_systemd):
    """--root means the tree for every verb (issue 36): restart used to read the tree and restart this host's unit
    of the same name (production restarted, then "rollback" restored files in the tree)."""
    root, v1, v2 = _setup(tmp_path, 30000)
    _install(root, v1)
    _install(root, v2)
    before = snapshot(root)
    for args in (["restart", "--root", str(root), "--wait", "--rollback-on-failure"], ["restart", "--root", str(root)],
                 ["upgrade", "--root", str(root), "--python", sys.executable]):
        result = cli_runner.invoke(cli, args)
        assert result.exit_code == ExitCode.USAGE, (args, result.output + result.stderr)
        assert "--host-systemd" in result.stderr and "this host's running unit" in result.stderr
    assert fake_systemd.calls() == [] and fake_systemd.calls("journalctl") == []
    assert snapshot(root) == before
    assert "--host-systemd" in cli_runner.invoke(cli, ["restart", "--help"]).output


def test_restart_dry_run_shows_what_would_be_restarted_gated_and_rolled_back(cli_runner, tmp_path, fake_systemd):
    root, v1, v2 = _setup(tmp_path, 30000)
    _install(root, v1)
    _install(root, v2)
    before = snapshot(root)
    result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--dry-run", "--wait", "--rollback-on-failure",
                                     "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output + result.stderr
    plan = json.loads(result.output)
    assert plan["applied"] is False and plan["unit"] == "kimi-test.service"
    assert plan["command"].endswith("restart -- kimi-test.service")
    assert plan["tiers"] == ["ready", "fast", "parser", "contract"]
    rollback = plan["rollback"]
    assert rollback["backup"].startswith("/etc/kimi-deploy/backup/kimi-test/") and rollback["unit_existed"]
    assert {"/" + UNIT, "/" + PROFILE_COPY} <= set(rollback["restore"]) and rollback["remove"] == []
    text = cli_runner.invoke(cli, ["restart", "--root", str(root), "--dry-run", "--rollback-on-failure"],
                             catch_exceptions=False)
    assert text.exit_code == 0
    assert "  gate: ready -> fast -> parser -> contract" in text.output
    assert f"on failure: restore {rollback['backup']}: write back" in text.output
    assert "dry run: nothing was changed" in text.output
    assert fake_systemd.calls() == [] and snapshot(root) == before
