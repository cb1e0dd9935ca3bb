"""status: the systemctl show parser, launch drift (/server_info and /proc), patch state, nightly report.

The patch state is the real ``kimi_deploy.patching.status`` of the profile's ``[service] python``:
the SGLang test environment (not_applied, only read), the session's patched copy (applied), a
copy of its own edited after apply (drifted). The record directory comes from
``KIMI_DEPLOY_STATE_DIR`` (``kimi_deploy.paths.patch_state_dir``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from install_fakes import (FAKE_MAIN_PID, NO_SYSTEMD_STDERR, SHOW_ACTIVE, SHOW_FAILED, FakeServer, sglang_server_args,
                           write_profile)
from kimi_deploy.cli import cli
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.targets.systemd import render
from kimi_deploy.host.status import (compare_launch, launch_entries, parse_launch_command, redact,
                                server_args_from_cmdline)
from kimi_deploy.facts.units import parse_show
from patch_helpers import patched_target, site_packages_of

#: A file the default series patches (kimi-k2-tool-call-ids).
DETECTOR = "sglang/srt/function_call/kimik2_detector.py"


def test_parse_show_active_and_failed():
    active = parse_show(SHOW_ACTIVE.format(pid=FAKE_MAIN_PID))
    assert (active.unit, active.active_state, active.sub_state, active.unit_file_state) == \
        ("kimi-test.service", "active", "running", "enabled")
    assert active.main_pid == FAKE_MAIN_PID and active.n_restarts == 2 and active.is_active
    assert active.started_at == "Sat 2025-06-14 10:02:11 UTC"
    failed = parse_show(SHOW_FAILED)
    assert failed.active_state == "failed" and failed.main_pid is None and failed.result == "exit-code"
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
    assert launch_entries(["--port=1", "--trust-remote-code"]) == ["--port 1", "--trust-remote-code"]


def test_server_args_from_cmdline():
    assert server_args_from_cmdline(["/v/bin/python", "-m", "sglang.launch_server", "--port", "1"]) == ["--port", "1"]
    assert server_args_from_cmdline(["/usr/bin/python", "x.py"]) is None


@pytest.fixture
def drifted_sglang(sglang_python, tmp_path, monkeypatch) -> str:
    """A throwaway SGLang copy, patched, then one patched file edited by hand; its record in
    ``KIMI_DEPLOY_STATE_DIR``."""
    python, state = patched_target(sglang_python, tmp_path / "drifted")
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(state))
    detector = site_packages_of(python) / DETECTOR
    detector.write_text(detector.read_text() + "\n# edited by hand\n")
    return python


def _installed(tmp_path, port, **kw):
    root = tmp_path / "root"
    path = write_profile(tmp_path / "p.toml", port=port, **kw)
    apply(plan_install(load_profile(path), HostLayout(root), enable=False, create_user=False))
    return root, load_profile(path)


@pytest.mark.sglang
def test_status_json_healthy_in_sync(cli_runner, tmp_path, fake_systemd, patched_sglang, monkeypatch):
    python, state = patched_sglang
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(state))
    holder = {}

    def running():
        args = list(render(holder["profile"]).launch.server_args)
        i = args.index("--config")
        return sglang_server_args(holder["profile"], launch_command=" ".join(
            ["--api-key", holder["key"], *args[:i], *args[i + 2:]]))

    with FakeServer(args=running) as server:
        root, profile = _installed(tmp_path, server.port, python=python)
        holder["profile"] = profile
        holder["key"] = server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        fake_systemd.set_show(SHOW_ACTIVE.format(pid=FAKE_MAIN_PID))
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] and data["problems"] == []
    assert data["unit"]["main_pid"] == FAKE_MAIN_PID and data["unit"]["n_restarts"] == 2
    assert data["launch"]["in_sync"] and data["launch"]["source"] == "/server_info launch_command"
    patches = data["patches"]
    assert patches["state"] == "applied" and patches["python"] == python and patches["problems"] == []
    assert patches["sglang_version"] == "0.5.23" and patches["sglang_location"].startswith(str(state.parent))
    assert patches["state_file"].startswith(str(state / "patches"))  # found through KIMI_DEPLOY_STATE_DIR
    assert {p["id"] for p in patches["patches"] if p["state"] == "applied"} >= {"kimi-k2-tool-call-ids",
                                                                                 "sm120-torch-symm-mem"}
    assert data["health"]["ready"] is True
    assert holder["key"] not in result.output
    assert ["show", "--property=Id,LoadState,ActiveState,SubState,UnitFileState,MainPID,"
            "NRestarts,ExecMainStartTimestamp,ExecMainStatus,Result,FragmentPath,ControlGroup", "--", "kimi-test.service"
            ] in fake_systemd.calls()


@pytest.mark.sglang
def test_status_finds_drift_in_proc_cmdline_and_reports_problems(cli_runner, tmp_path, fake_systemd,
                                                                 drifted_sglang):
    # not up: no /server_info, so the launch command comes from /proc/<pid>/cmdline
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, profile = _installed(tmp_path, server.port, python=drifted_sglang)
        args = [a if a != "1000" else "8192" for a in render(profile).launch.server_args]
        script = tmp_path / "launch_server.py"
        script.write_text("import sys\nsys.stdin.read()\n")  # runs until the test closes its stdin
        child = subprocess.Popen([sys.executable, str(script), *args], stdin=subprocess.PIPE)
        try:
            fake_systemd.set_show(SHOW_ACTIVE.format(pid=child.pid))
            (root / "var/lib/kimi-test").mkdir(parents=True)
            (root / "var/lib/kimi-test/check-report.json").write_text(json.dumps(
                {"exit_code": 1, "results": [{"id": "a", "status": "pass"}, {"id": "b", "status": "fail"}]}))
            (root / "etc/kimi-deploy/kimi-test.env").write_text("edited\n")
            result = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
        finally:
            child.stdin.close()
            child.kill()
            child.wait()
    assert result.exit_code == 1
    out = result.output
    assert f"launch    DRIFT (from /proc/{child.pid}/cmdline)" in out
    assert "- --context-length 1000" in out and "+ --context-length 8192" in out
    assert "patches   drifted" in out
    assert "files     5 installed, 1 modified: /etc/kimi-deploy/kimi-test.env\n" in out  # no Python dict
    assert "{" not in out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert all("); fix: " in line for line in problems), problems  # what (evidence); fix: how
    assert any(line.startswith("problem: SGLang patch series is drifted: a patched SGLang file changed")
               and DETECTOR in line and f"kimi-deploy patch apply --python {drifted_sglang}" in line
               and f"then `kimi-deploy restart --wait --host-systemd --root {root}`" in line  # issue 13 item 10: --root kept
               for line in problems), problems
    assert any(line.startswith("problem: the last nightly check failed (exit 1 at ") and "1 fail, 1 pass" in line
               and "report /var/lib/kimi-test/check-report.json" in line for line in problems), problems
    assert any(line.startswith("problem: /etc/kimi-deploy/kimi-test.env was changed after install (its sha256")
               for line in problems), problems
    assert "NOT READY" in out


@pytest.mark.sglang
def test_status_of_a_failed_unit(cli_runner, tmp_path, fake_systemd, sglang_python, monkeypatch):
    # the pristine SGLang test environment (status only reads it) and an empty record directory
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, _ = _installed(tmp_path, server.port, python=sglang_python)
        fake_systemd.set_show(SHOW_FAILED)
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert result.exit_code == 1
    assert "kimi-test.service is failed/failed (systemctl show: Result=exit-code, ExecMainStatus=1); fix: read " \
           "`journalctl -u kimi-test.service -n 50`, fix the cause, then " \
           f"`kimi-deploy restart --wait --host-systemd --root {root}`" in data["problems"]
    assert data["launch"] is None
    assert data["patches"]["state"] == "not_applied" and data["patches"]["recorded"] is None
    assert data["patches"]["python"] == sglang_python
    assert not any("patch" in p for p in data["problems"]), data["problems"]  # not applied is not a fault
    assert not (tmp_path / "state").exists()  # status writes no record


@pytest.mark.sglang
def test_status_reads_the_patch_record_where_patch_apply_kept_it(cli_runner, tmp_path, fake_systemd, sglang_python,
                                                                 monkeypatch):
    # a trial found `patch apply --state-dir DIR` followed by status saying "not applied": status had no --state-dir
    from patch_helpers import patched_target

    python, state = patched_target(sglang_python, tmp_path / "sglang")
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "elsewhere"))
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, _ = _installed(tmp_path, server.port, python=python)
        default = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
        given = cli_runner.invoke(cli, ["status", "--root", str(root), "--state-dir", str(state), "--json"],
                                  catch_exceptions=False)
    assert json.loads(default.output)["patches"]["state"] != "applied"
    assert json.loads(given.output)["patches"]["state"] == "applied", given.output


def test_status_reports_an_unreadable_patch_state(cli_runner, tmp_path, fake_systemd):
    # [service] python names no interpreter: the state is an error, and a problem
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, _ = _installed(tmp_path, server.port, python=str(tmp_path / "no-such-venv/bin/python"))
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert data["patches"]["state"] == "error" and "no-such-venv" in data["patches"]["detail"]
    (line,) = [p for p in data["problems"] if "patch" in p]
    assert line.startswith("cannot read the SGLang patch series state (") and "no-such-venv" in line
    assert "; fix: make [service] python name the server's SGLang interpreter" in line and result.exit_code == 1


def test_parse_launch_command_splits_like_sglang_joins_and_hides_keys():
    # SGLang 0.5.23 joins argv with single spaces: quotes are plain characters, a key may hold spaces
    text = """--api-key ab"c d'e --port 1 --admin-api-key=x y --host 0.0.0.0 --api-key"""
    assert parse_launch_command(text) == ["--api-key", "<redacted>", "--port", "1", "--admin-api-key=<redacted>",
                                          "--host", "0.0.0.0", "--api-key", "<redacted>"]
    assert parse_launch_command("") == []


#: An API key with a double quote, a single quote and a space: shell rules cannot split SGLang's launch_command.
QUOTED_KEY = """sk-ab"c d'ef"""


@pytest.mark.sglang
def test_status_with_a_quoted_api_key_in_launch_command(cli_runner, tmp_path, fake_systemd, sglang_python,
                                                        monkeypatch):
    """launch_command built by SGLang's own code (no redact-api-key patch): no crash, in sync, key never shown."""
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    holder = {}

    def running():
        return sglang_server_args(holder["profile"], launch_command=holder["launch_command"])

    with FakeServer(args=running) as server:
        root, profile = _installed(tmp_path, server.port, python=sglang_python)
        (root / "etc/kimi-deploy/kimi-test.api-key").write_text(QUOTED_KEY + "\n")
        (root / "etc/kimi-deploy/kimi-test.api-key").chmod(0o600)  # the key-file rule: nothing for other users
        server.api_key = QUOTED_KEY
        args = list(render(profile).launch.server_args)
        i = args.index("--config")
        argv = ["--api-key", QUOTED_KEY, *args[:i], *args[i + 2:]]  # what prepare_server_args sees after the merge
        done = subprocess.run([sglang_python, "-c", "import json, sys\n"
                               "from sglang.srt.sampling.watermarking.core import redact_watermark_command_line\n"
                               "print(redact_watermark_command_line(json.load(sys.stdin), None))"],
                              input=json.dumps(argv), capture_output=True, text=True, check=True)
        holder.update(profile=profile, launch_command=done.stdout.rstrip("\n"))
        assert QUOTED_KEY in holder["launch_command"]  # SGLang 0.5.23 leaves it in, unquoted
        fake_systemd.set_show(SHOW_ACTIVE.format(pid=FAKE_MAIN_PID))
        as_json = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
        text = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
    data = json.loads(as_json.output)
    assert data["launch"]["source"] == "/server_info launch_command" and data["launch"]["in_sync"], data["launch"]
    assert data["launch"]["running"][:2] == ["--api-key", "<redacted>"]
    # both outputs in the message: the text call once exited 1 in a full-suite run while the JSON call was clean
    assert data["problems"] == [] and as_json.exit_code == 0 and text.exit_code == 0, (as_json.output, text.output)
    for out in (as_json.output, text.output):
        for piece in ('ab"c', "d'ef"):
            assert piece not in out
    assert "launch    matches the profile (from /server_info launch_command)" in text.output


def test_status_when_systemctl_show_fails_says_why_and_how_to_fix(cli_runner, tmp_path, fake_systemd):
    fake_systemd.fail("show", NO_SYSTEMD_STDERR)  # systemd 252 in a container without systemd as PID 1
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, _ = _installed(tmp_path, server.port, python=str(tmp_path / "no-such-venv/bin/python"))
        result = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
    assert result.exit_code == 1
    (line,) = [p for p in result.output.splitlines() if "state of kimi-test.service" in p]
    assert line.startswith("problem: cannot read the state of kimi-test.service (`systemctl show --property=")
    assert "System has not been booted with systemd as init system (PID 1)" in line
    assert "command failed with exit status" not in line
    # --root was given: the fix is not "pass --root", it is where the unit state can be read
    assert "pass --root DIR" not in line, line
    assert f"; fix: --root {root} reads kimi-deploy's files from that tree, but the unit state comes from the " \
           "running systemd" in line and "run `kimi-deploy status` on the host booted from the tree" in line
    assert "service   kimi-test.service: ?/?" in result.output


def test_status_systemd_hint_on_the_host_does_not_suggest_root():
    """Without --root, status still reads the running systemd: --root would not help, so it is not offered."""
    from pathlib import Path

    from kimi_deploy.errors import ExternalCommandError
    from kimi_deploy.host.status import _systemctl_failure

    exc = ExternalCommandError("systemctl failed", command="systemctl show x.service", stderr=NO_SYSTEMD_STDERR)
    host = _systemctl_failure("x.service", exc, HostLayout(Path("/")))
    tree = _systemctl_failure("x.service", exc, HostLayout(Path("/tmp/img")))
    assert "is systemd running on this host?" in host and "--root" not in host
    assert "--root /tmp/img reads kimi-deploy's files" in tree


def test_status_json_has_the_phases_of_this_start_and_the_last_measured_one(cli_runner, tmp_path, fake_systemd):
    """While the server starts, status shows the phases so far from SGLang's log (here: capturing the draft's
    CUDA graphs); the last complete start kept on the host (by `restart --wait`) is there too."""
    from pathlib import Path

    from kimi_deploy.host import phases

    log = (Path(__file__).parent / "data/sglang-log/start-k25-eagle3.txt").read_text().splitlines()
    fake_systemd.set_full_journal(log[:14])
    with FakeServer(ready=lambda n: False, args=lambda: None) as server:
        root, _ = _installed(tmp_path, server.port, python=str(tmp_path / "no-such-venv/bin/python"))
        phases.save_last(HostLayout(root).state_dir("kimi-test"), phases.parse_start(log))
        result = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
        text = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
    data = json.loads(result.output)
    now = data["start_phases"]
    assert [p["name"] for p in now["phases"]] == ["weights", "kv_cache", "draft", "cuda_graphs"]
    assert now["phases"][-1]["end"] is None and now["ready"] is False and now["kv_tokens"] == 226002
    assert data["last_start"]["total_seconds"] == 540.0
    assert "start     this start (2026-12-01 08:00:02): not ready yet" in text.output
    assert "cuda_graphs  running  (target verify, draft decode)" in text.output


# --- issue 43: status names the process that answers before calling its answer the service's health -------------

#: /proc/net/tcp and tcp6 as Linux 6.1 prints them: a listener on 127.0.0.1:30000 (0x7530), one on [::]:30000, a
#: connection to :30000 (not a listener), a listener on another port
NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4711 1 0 100 0 0 10 0
   1: 0100007F:9C40 0100007F:7530 01 00000000:00000000 00:00000000 00000000   999        0 4712 1 0 20 4 30 10 -1
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4713 1 0 100 0 0 10 0
"""
NET_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4714 1 0 100 0 0 10 0
"""


def test_listening_sockets_and_cgroups_parse_from_recorded_proc_text():
    from kimi_deploy.host.answering import in_group, parse_cgroup, parse_net_tcp

    assert parse_net_tcp(NET_TCP, 30000) == {4711} and parse_net_tcp(NET_TCP6, 30000) == {4714}
    assert parse_net_tcp(NET_TCP, 8080) == {4713} and parse_net_tcp("garbage\n  0: x y 0A", 30000) == set()
    assert parse_cgroup("0::/system.slice/kimi-k25.service\n") == "/system.slice/kimi-k25.service"  # v2
    assert parse_cgroup("12:name=systemd:/system.slice/kimi-k25.service\n3:cpu:/\n") == \
        "/system.slice/kimi-k25.service"  # v1 only
    assert parse_cgroup("") is None
    unit = "/system.slice/kimi-k25.service"
    assert in_group(unit, unit) and in_group(unit + "/payload", unit)
    assert in_group("/system.slice/kimi-k25.service-other", unit) is False and in_group("/user.slice", unit) is False
    assert in_group(None, unit) is None and in_group(unit, None) is None


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


@pytest.mark.parametrize("case", ["no main PID", "another cgroup", "the unit's"])
def test_status_names_the_process_answering_before_calling_it_the_services_health(cli_runner, tmp_path,
                                                                                 fake_systemd, case):
    """A different process on the profile's port passed as the service ("health ready" with no main PID). The
    listener here is this test's own loopback server (this process); the unit is the fake systemctl's."""
    import os

    from kimi_deploy.host.answering import PROC, parse_cgroup

    own = parse_cgroup((PROC / "self" / "cgroup").read_text())
    other = _sleeper()
    try:
        with FakeServer(args=lambda: None) as server:
            root, _ = _installed(tmp_path, server.port, python=str(tmp_path / "no-such-venv/bin/python"))
            pid, cgroup = {"no main PID": (0, ""), "another cgroup": (other.pid, "/system.slice/kimi-test.service"),
                           "the unit's": (os.getpid(), own)}[case]
            fake_systemd.set_show(SHOW_ACTIVE.format(pid=pid) + f"ControlGroup={cgroup}\n")
            as_json = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
            text = cli_runner.invoke(cli, ["status", "--root", str(root)], catch_exceptions=False)
    finally:
        other.stdin.close()
        other.wait()
    data = json.loads(as_json.output)
    who = data["health"]["answering"]
    assert data["health"]["ready"] is True and who["port"] == server.port
    assert [p["pid"] for p in who["listeners"]] == [os.getpid()] and who["listeners"][0]["cgroup"] == own
    foreign = [p for p in data["problems"] if p.startswith(f"the process answering on :{server.port} is not ")]
    assert f"answer    :{server.port} held by PID {os.getpid()} (" in text.output
    if case == "the unit's":
        assert who["ours"] is True and foreign == [] and "the unit's" in text.output
        assert "NOT the unit" not in text.output
    else:
        assert who["ours"] is False and as_json.exit_code == 1 and text.exit_code == 1
        (line,) = foreign
        assert ("it has no main PID" if pid == 0 else f"its main PID is {pid}") in line
        assert f"PID {os.getpid()}" in line and f"ss -ltnp 'sport = :{server.port}'" in line
        assert "health    NOT the unit answering (see answer): ready (GET http" in text.output, text.output
