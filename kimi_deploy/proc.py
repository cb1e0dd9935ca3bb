"""The one gateway through which kimi-deploy runs other programs.

Every call logs the exact command as a line a user could paste into a shell
(``shlex.join``) on the ``kimi_deploy.proc`` logger; ``--verbose`` shows it.
Nothing else in the package calls :mod:`subprocess`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from kimi_deploy.errors import DeadlineError, ExternalCommandError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Completed:
    """Result of :func:`run`: argv as run, exit status, captured text (str, UTF-8, errors replaced).

    ``display``: argv as shown in error messages (:func:`run`'s ``display``), default ``argv``.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    display: tuple[str, ...] | None = None

    @property
    def command(self) -> str:
        """The command as one pasteable shell line."""
        return shlex.join(self.argv)

    @property
    def shown(self) -> str:
        """The command as error messages show it (an inline script abbreviated)."""
        return shown_command(self.display or self.argv)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def shown_command(argv: Sequence[str]) -> str:
    """``shlex.join`` of ``argv``, except that an ``<abbreviation>`` placeholder stays unquoted."""
    return " ".join(a if a.startswith("<") and a.endswith(">") and "\n" not in a else shlex.quote(a)
                    for a in argv)


def which(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """``shutil.which`` on ``env['PATH']`` (default: this process's PATH)."""
    path = (env or os.environ).get("PATH")
    return shutil.which(name, path=path)


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float | None = 120.0,
    cwd: str | os.PathLike[str] | None = None,
    hint: str | None = None,
    display: Sequence[str] | None = None,
    stream_stderr: bool = False,
) -> Completed:
    """Run ``argv`` (no shell), capture stdout/stderr as text, log the exact command.

    Args:
        argv: program and arguments; ``argv[0]`` is looked up on PATH.
        check: raise :class:`ExternalCommandError` on a non-zero exit.
        input: text fed to stdin.
        env: full environment (default: this process's); ``extra_env`` is laid over it.
        timeout: seconds before the program is killed (``None``: no limit).
        hint: the fix shown when the command fails or is missing.
        display: argv as error messages show it (e.g. an inline ``-c`` script replaced by
            ``<probe script>``, no environment prefix); the log line (``-v``) always has the
            full, pasteable command.
        stream_stderr: the program's stderr goes straight to this process's stderr as it is written
            (progress of a long step, e.g. into the journal) instead of being captured (``stderr`` is ``""``).

    Raises:
        ExternalCommandError: the program is missing, or exits non-zero with ``check``.
        DeadlineError: the program ran past ``timeout`` seconds.
    """
    argv = [os.fspath(a) for a in argv]
    command = shlex.join(argv)
    run_env = dict(env if env is not None else os.environ)
    if extra_env:
        run_env.update(extra_env)
        command = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items()) + " " + command
    shown = command if display is None else shown_command(display)
    log.info("$ %s", command)
    try:
        proc = subprocess.run(
            argv, input=input, stdout=subprocess.PIPE, stderr=None if stream_stderr else subprocess.PIPE,
            text=True, errors="replace", env=run_env, timeout=timeout, cwd=cwd, check=False,
        )
    except FileNotFoundError as exc:
        raise ExternalCommandError(
            f"program not found: {argv[0]}", command=shown,
            hint=hint or f"install {argv[0]} or put it on PATH",
        ) from exc
    except PermissionError as exc:
        raise ExternalCommandError(
            f"program not executable: {argv[0]}", command=shown,
            hint=hint or f"check the permissions of {argv[0]}",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise DeadlineError(
            f"command ran past its {timeout:g} s limit", value=shown,
            hint=hint or "raise the timeout or look at why the program hangs",
        ) from exc
    done = Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr or "",
                     tuple(display) if display is not None else None)
    if check and not done.ok:
        raise ExternalCommandError(
            f"command failed with exit status {proc.returncode}",
            command=shown, returncode=proc.returncode, stdout=proc.stdout, stderr=done.stderr,
            hint=hint,
        )
    return done
