"""The fault-injection harness: the real CLI in a forked child, killed at its N-th mutating file operation.

The child runs ``kimi-deploy ARGS`` with the kit already imported (a run costs milliseconds, not an interpreter
start) and ``$KIMI_DEPLOY_FAULT_KILL_AT=N``: it SIGKILLs itself just before its N-th mutating file operation
(:func:`kimi_deploy.fsio.fault_point`). What the parent monkeypatched (PATH to a fake systemctl, a stub) the
child inherits.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kimi_deploy import fsio
from kimi_deploy.cli import cli

#: A child that has not exited after this many seconds is hung (not slow): it is killed and the test fails.
HANG_GUARD_S = 600


def spawn_cli(args: list[str], *, kill_at: int | None = None) -> int:
    """Start ``kimi-deploy ARGS`` in a forked child (output discarded); its pid."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 70
        try:
            fsio._fault_count = 0
            os.environ.pop(fsio.FAULT_KILL_ENV, None)
            if kill_at is not None:
                os.environ[fsio.FAULT_KILL_ENV] = str(kill_at)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            try:
                cli.main(args=args, prog_name="kimi-deploy", standalone_mode=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os._exit(code)
    return pid


def reap(pid: int) -> int:
    """The child's exit status, or ``-signal`` when it was killed."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"kimi-deploy child {pid} hung")
        time.sleep(0.01)


def fork_cli(args: list[str], *, kill_at: int | None = None) -> int:
    """Run ``kimi-deploy ARGS`` in a forked child; its exit status, or ``-signal`` when killed."""
    return reap(spawn_cli(args, kill_at=kill_at))


