"""fsio's run lock (exclusive_lock) and its fault-injection gateway (fault_point), with real flock(2)
and real processes; the wait is driven by an injected clock, never the wall clock."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import FakeTime
from kimi_deploy import fsio
from kimi_deploy.errors import ExitCode, LockedError, UsageError


def test_second_holder_waits_then_fails_with_its_own_exit_code(tmp_path):
    lock = tmp_path / "state" / "x.lock"
    fake = FakeTime()
    with fsio.exclusive_lock(lock, what="patch run") as held:
        assert held == lock and lock.read_text().strip() == str(os.getpid())
        with pytest.raises(LockedError) as exc:
            # a second open file description conflicts under flock(2), even in one process
            with fsio.exclusive_lock(lock, what="patch run", wait_s=2.0, clock=fake.monotonic, sleep=fake.sleep):
                pytest.fail("got a lock another holder has")
    assert exc.value.exit_code == ExitCode.LOCKED == 7
    assert "another kimi-deploy patch run is running" in exc.value.message
    assert f"held by pid {os.getpid()}" in exc.value.value
    assert "nothing was changed" in exc.value.hint
    assert sum(fake.slept) == pytest.approx(2.0) and len(fake.slept) >= 10  # it polled for the whole wait
    # released at the end of the block: the next holder gets it at once
    with fsio.exclusive_lock(lock, what="patch run", wait_s=0, clock=fake.monotonic, sleep=fake.sleep) as held:
        assert held == lock


HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kimi_deploy import fsio
    with fsio.exclusive_lock(Path(sys.argv[1]), what="install run"):
        print("held", flush=True)
        sys.stdin.read()
""")


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError) as exc:
            with fsio.exclusive_lock(lock, what="install run", wait_s=0):
                pass
        assert f"held by pid {holder.pid}" in exc.value.value
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with fsio.exclusive_lock(lock, what="install run", wait_s=0) as held:
        assert held == lock


def test_unavailable_lock_file_is_an_error_unless_allowed(tmp_path, monkeypatch):
    lock = tmp_path / "x.lock"
    real_open = os.open

    def denied(path, *args, **kwargs):  # an unprivileged user on a root-owned state directory
        if Path(path) == lock:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(fsio.os, "open", denied)
    with fsio.exclusive_lock(lock, what="patch run", unavailable_ok=True) as held:
        assert held is None
    with pytest.raises(UsageError, match="cannot open the lock file"):
        with fsio.exclusive_lock(lock, what="patch run"):
            pass


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kimi_deploy import fsio
    d = Path(sys.argv[1])
    fsio.write_many_atomic({d / "a": b"new a", d / "b": b"new b"})
    fsio.remove(d / "a")
""")


def test_fault_point_counts_and_kills_before_the_chosen_operation(tmp_path):
    (tmp_path / "a").write_bytes(b"old a")
    trace = tmp_path / "trace"
    env = dict(os.environ, **{fsio.FAULT_TRACE_ENV: str(trace)})
    env.pop(fsio.FAULT_KILL_ENV, None)
    subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], env=env, check=True)
    ops = [line.split()[1] for line in trace.read_text().splitlines()]
    # stage a, stage b, hard-link a's backup, rename a, rename b, drop the backup, delete a
    assert ops == ["create", "create", "link", "replace", "replace", "unlink", "unlink"]

    (tmp_path / "a").write_bytes(b"old a")
    (tmp_path / "b").unlink()
    trace.unlink()
    env[fsio.FAULT_KILL_ENV] = "5"  # just before b is renamed into place
    done = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], env=env)
    assert done.returncode == -signal.SIGKILL
    assert len(trace.read_text().splitlines()) == 5
    assert (tmp_path / "a").read_bytes() == b"new a" and not (tmp_path / "b").exists()


@pytest.mark.parametrize(("text", "wait"), [("", 10.0), ("2.5", 2.5), ("0", 0.0)])
def test_lock_wait_from_the_environment(monkeypatch, text, wait):
    monkeypatch.setenv(fsio.LOCK_WAIT_ENV, text)
    assert fsio.lock_wait_s() == wait


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "soon"])
def test_bad_lock_wait_is_refused(monkeypatch, text):
    monkeypatch.setenv(fsio.LOCK_WAIT_ENV, text)
    with pytest.raises(UsageError, match="KIMI_DEPLOY_LOCK_WAIT_S must be a number"):
        fsio.lock_wait_s()
