"""One error hierarchy, caught at the CLI edge, and the named exit codes.

Every error says what failed, the offending value and how to fix it. The CLI
prints ``error: <message>`` / ``  value: ...`` / ``  fix: ...`` and exits with the
error's :class:`ExitCode`; a traceback is shown only with ``--debug``.
"""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """Process exit codes of every ``kimi-deploy`` verb.

    Stable: scripts and systemd units (``SuccessExitStatus=``) depend on them.
    """

    OK = 0
    #: a check, verification or doctor probe failed (the tool itself worked)
    FAILED = 1
    #: bad command line, bad profile, bad input file
    USAGE = 2
    #: the server could not be reached at all
    UNREACHABLE = 3
    #: refused to act: a file kimi-deploy does not own, a hand-edited file, a wrong version, a model that cannot fit
    REFUSED = 4
    #: a program kimi-deploy ran (systemctl, the SGLang interpreter, ...) failed
    EXTERNAL = 5
    #: a deadline passed (restart --wait, a request timeout)
    TIMEOUT = 6
    #: another kimi-deploy run holds the lock this one needs (waited briefly, then gave up; nothing changed)
    LOCKED = 7
    #: the file system refused a write: disk full, quota, read-only file system, I/O error
    STORAGE = 8
    #: ``restart --wait`` of a replica behind a gateway left it out of rotation: it restarted and passed its
    #: checks but the gateway did not take it back, or the gateway took the removal but still listed it
    #: draining after the wait (nothing restarted)
    OUT_OF_ROTATION = 9
    #: ``restart --rollback-on-failure`` (and ``upgrade``): the new version failed its gate, the previous files
    #: were restored, and the restored version failed the same gate too: neither version is verified
    ROLLBACK_FAILED = 10
    #: stopped by Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention); check and bench first
    #: write what finished, marked as interrupted
    INTERRUPTED = 130


class KimiDeployError(Exception):
    """Base of every error kimi-deploy reports to a user.

    Args:
        message: what was wrong, one sentence.
        value: the offending value, shown verbatim (``None``: nothing to show).
        hint: how to fix it, one sentence.
    """

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, value: Any = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.value = value
        self.hint = hint

    def render(self) -> str:
        """The multi-line text the CLI prints to stderr."""
        lines = [f"error: {self.message}"]
        if self.value is not None:
            lines.append(f"  value: {self.value!r}" if not isinstance(self.value, str) else f"  value: {self.value}")
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form for ``--json`` output."""
        return {
            "error": type(self).__name__,
            "message": self.message,
            "value": None if self.value is None else str(self.value),
            "hint": self.hint,
            "exit_code": int(self.exit_code),
        }


class UsageError(KimiDeployError):
    """Bad command-line input or input file (exit 2)."""

    exit_code = ExitCode.USAGE


class ProfileError(UsageError):
    """A deployment profile that does not validate (exit 2).

    ``problems`` holds one line per problem (``location: message``) when
    validation found several at once.
    """

    def __init__(self, message: str, *, value: Any = None, hint: str | None = None,
                 problems: list[str] | None = None) -> None:
        super().__init__(message, value=value, hint=hint)
        self.problems = problems or []

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "problems": list(self.problems)}

    def render(self) -> str:
        if not self.problems:
            return super().render()
        lines = [f"error: {self.message}"]
        lines.extend(f"  - {p}" for p in self.problems)
        if self.hint:
            lines.append(f"  fix: {self.hint}")
        return "\n".join(lines)


class UnsupportedVersionError(UsageError):
    """A feature or patch series the chosen SGLang version does not have (exit 2)."""


class RefusedError(KimiDeployError):
    """kimi-deploy will not act without an explicit override (exit 4)."""

    exit_code = ExitCode.REFUSED


class ExternalCommandError(KimiDeployError):
    """A subprocess failed (exit 5).

    ``command``: the command as shown to the user (an inline ``-c`` script abbreviated, see
    :func:`kimi_deploy.proc.run`'s ``display``); ``stdout``/``stderr``: what the program printed,
    each rendered under its own label (last 15 lines).
    """

    exit_code = ExitCode.EXTERNAL

    def __init__(self, message: str, *, command: str = "", returncode: int | None = None,
                 stderr: str = "", stdout: str = "", hint: str | None = None) -> None:
        super().__init__(message, value=command or None, hint=hint)
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout

    def render(self) -> str:
        text = super().render()
        for label, output in (("stdout", self.stdout), ("stderr", self.stderr)):
            if output.strip():
                tail = output.rstrip().splitlines()[-15:]
                text += f"\n  {label}:\n" + "\n".join(f"    {line}" for line in tail)
        return text

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(stdout=self.stdout[-4000:] or None, stderr=self.stderr[-4000:] or None)
        return data


class UnreachableError(KimiDeployError):
    """The server did not answer at all (exit 3)."""

    exit_code = ExitCode.UNREACHABLE


class DeadlineError(KimiDeployError):
    """A wait ran past its deadline (exit 6)."""

    exit_code = ExitCode.TIMEOUT


class LockedError(KimiDeployError):
    """Another kimi-deploy run holds the lock (exit 7); this run changed nothing."""

    exit_code = ExitCode.LOCKED


class StorageError(KimiDeployError):
    """The file system refused a write for a reason of its own: ENOSPC, EDQUOT, EROFS, EIO (exit 8).

    Not bad input: the same command works once the disk has room or is mounted read-write.
    """

    exit_code = ExitCode.STORAGE
