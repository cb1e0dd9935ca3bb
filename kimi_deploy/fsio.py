"""Atomic file writes: every file is either its old bytes or its new bytes, never half.

Writes go to a temporary file in the target's directory, are fsynced, then
``os.replace``d over the target (POSIX rename is atomic within a file system).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from kimi_deploy.errors import UsageError


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, creating parent directories.

    Raises:
        UsageError: the directory cannot be created or written (permissions, read-only FS).
    """
    write_many_atomic({path: data}, mode=mode)


def write_many_atomic(files: Mapping[Path, bytes | str], *, mode: int = 0o644,
                      modes: Mapping[Path, int] | None = None) -> None:
    """Write several files so that a failure leaves every target untouched.

    ``modes`` gives a permission mode per path (default ``mode``).

    All contents are first staged as temporary files next to their targets; only
    when every one is on disk are they renamed into place. A failure while
    staging removes the staged files and leaves every target as it was.

    Raises:
        UsageError: a directory cannot be created or written.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            payload = data.encode() if isinstance(data, str) else data
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, (modes or {}).get(path, mode))
    except OSError as exc:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise UsageError(
            f"cannot write {exc.filename or 'output'}: {exc.strerror}",
            value=str(exc.filename or ""),
            hint="choose a directory you can write to (or fix its permissions); nothing was changed",
        ) from exc
    for tmp, path in staged:
        os.replace(tmp, path)
    for directory in {p.parent for _, p in staged}:
        with contextlib.suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
