"""The container tier's harness (tests/systemd_container.py) leaves no container behind: not when a
test fails (the fixtures power off in ``finally``), not when the test process itself is killed
outright (a CI timeout): systemd-nspawn gets SIGTERM then and powers its container off, and not when a
command inside hangs: the boot's watchdog kills the container and the command fails, saying so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_host import skip_or_fail
from systemd_container import CannotBoot, Container, WatchdogExpired, unavailable

TESTS = Path(__file__).resolve().parent

BOOT = """
import sys, pathlib
sys.path.insert(0, {tests!r})
from systemd_container import CannotBoot, Container
box = Container(pathlib.Path({workdir!r}), name={name!r})
box.workdir.mkdir()
try:
    box.boot(timeout=120)
except CannotBoot as exc:
    print("CANNOT", exc, flush=True)
    raise SystemExit(0)
print("INIT", box.init_pid, flush=True)
sys.stdin.read()  # until killed
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs and is no zombie (gone between the two looks: not alive)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


@pytest.mark.container
def test_a_test_process_killed_outright_leaves_no_container(tmp_path):
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    code = BOOT.format(tests=str(TESTS), workdir=str(tmp_path / "box"), name=f"kimi-harness-{os.getpid()}")
    runner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = runner.stdout.readline()
    except BaseException:
        runner.kill()
        raise
    if line.startswith("CANNOT"):
        runner.wait(30)
        skip_or_fail(f"systemd-nspawn cannot boot a container here: {line[:2000]}")
    assert line.startswith("INIT "), line
    init = int(line.split()[1])
    runner.kill()  # SIGKILL: no finally, no fixture teardown runs in it
    runner.wait(30)
    deadline = time.monotonic() + 60
    while _alive(init) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(init):
        os.kill(init, signal.SIGKILL)  # do not leave it to the next test either
        pytest.fail(f"the container (PID 1 = host PID {init}) still ran 60 s after its test process died")


@pytest.mark.container
def test_the_watchdog_ends_a_command_that_hangs(tmp_path):
    """A hung start or command ends when the boot's watchdog fires: the command returns (its processes
    die with the container's PID namespace) and it and every later one fail naming the watchdog."""
    reason = unavailable()
    if reason:
        skip_or_fail(reason)
    box = Container(tmp_path / "box", name=f"kimi-watchdog-{os.getpid()}")
    box.workdir.mkdir()
    try:
        box.boot(timeout=120)
    except CannotBoot as exc:
        skip_or_fail(f"systemd-nspawn cannot boot a container here: {str(exc)[:2000]}")
    try:
        box.arm_watchdog(3)  # armed once the boot is done, so a slow boot cannot race it
        with pytest.raises(WatchdogExpired, match=r"`sleep infinity`: the container's watchdog killed it after 3 s"):
            box.run("sleep infinity", timeout=300)  # the timeout only bounds a watchdog that failed
        box.proc.wait(timeout=60)
        with pytest.raises(WatchdogExpired):
            box.run("true", check=False)
    finally:
        box.shutdown(timeout=60)
    assert box.proc.poll() is not None


def test_the_tier_skips_with_its_reason_unless_required(monkeypatch):
    monkeypatch.delenv("KIMI_DEPLOY_REQUIRE_CONTAINERS", raising=False)
    monkeypatch.setenv("CI", "true")  # a CI variable alone does not turn a skip into a failure
    with pytest.raises(pytest.skip.Exception, match="no root here"):
        skip_or_fail("no root here")
    monkeypatch.setenv("KIMI_DEPLOY_REQUIRE_CONTAINERS", "1")
    with pytest.raises(pytest.fail.Exception, match=r"must run here .* but no root here"):
        skip_or_fail("no root here")


def test_root_of_a_user_namespace_skips_with_its_reason(tmp_path):
    """Root of a user namespace (a rootless CI container) cannot boot one: ``unavailable()`` says so, and
    a boot tried anyway ends in CannotBoot (which the tier turns into a skip), not in an error."""
    code = (f"import sys, pathlib; sys.path.insert(0, {str(TESTS)!r})\n"
            "from systemd_container import CannotBoot, Container, unavailable\n"
            "print('REASON', unavailable(), flush=True)\n"
            f"box = Container(pathlib.Path({str(tmp_path / 'box')!r}), name='kimi-userns-{os.getpid()}')\n"
            "box.workdir.mkdir()\n"
            "try:\n    box.boot(timeout=60)\nexcept CannotBoot as exc:\n    print('CANNOT', exc)\n"
            "else:\n    box.kill()\n")
    try:
        r = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("unshare (util-linux) is not installed")
    if "REASON" not in r.stdout:
        pytest.skip(f"no user namespace can be made here: {r.stderr.strip()[-500:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REASON root here is root of a user namespace (uid_map 0 " in r.stdout, r.stdout
    assert "\nCANNOT " in r.stdout, r.stdout + r.stderr


def test_every_container_module_is_in_the_one_work_unit_and_no_other_module_is():
    """conftest.work_unit keeps the container modules on one xdist worker (the machine boots one container at a
    time): each module with container tests maps to it, by the name collection enforces, and nothing else does."""
    from conftest import CONTAINER_MODULES, work_unit

    marked = {p.name for p in TESTS.glob("test_*.py") if "mark.container" in p.read_text()}
    assert marked and all(name.startswith(CONTAINER_MODULES) for name in marked), marked
    for path in TESTS.glob("test_*.py"):
        unit = work_unit(f"tests/{path.name}::test_x[a::b]")
        assert (unit == "containers") == (path.name in marked), (path.name, unit)
    assert work_unit("tests/test_validate.py::test_x") == "tests/test_validate.py"


def test_a_run_without_xdist_loads_the_suites_hooks(tmp_path):
    """`./scripts/test -p no:xdist` (README) runs serially: conftest's xdist-only hook must not stop it."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
                        "--collect-only", "-q", str(TESTS / "test_argv.py")],
                       cwd=TESTS.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
