"""Atomic file writes, the file-operation gateway and the lock: every file is either its old bytes or
its new bytes, never half.

Writes go to a temporary file in the target's directory (``.<name>.XXXXXXXX.tmp``, :data:`TEMP_RE`),
are fsynced, then ``os.replace``d over the target (POSIX rename is atomic within a file system).
:func:`check_output_paths` refuses report paths up front, before a long run produces them.

Every operation that changes a file or folder of the host (create, rename, link, unlink, mkdir,
rmtree, chmod) goes through :func:`_mutation` first. With ``$KIMI_DEPLOY_TEST_KILL_AT=N`` the process
SIGKILLs itself just before its N-th such operation (the fault-injection tests kill a run at every
one in turn); ``$KIMI_DEPLOY_TEST_OPS_LOG=FILE`` appends one ``N op path`` line per operation.
An OSError becomes :class:`UsageError` (exit 2: permissions, a path in the way) or, when the file
system itself refused (:data:`STORAGE_ERRNOS`), :class:`StorageError` (exit 8).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from kimi_deploy.errors import KimiDeployError, LockedError, StorageError, UsageError

#: Environment variable: SIGKILL this process just before its N-th mutating file operation (tests only).
KILL_AT_ENV = "KIMI_DEPLOY_TEST_KILL_AT"
#: Environment variable: append ``N op path`` for each mutating file operation to this file (tests only).
OPS_LOG_ENV = "KIMI_DEPLOY_TEST_OPS_LOG"
_ops_done = 0

#: errno values that mean the file system, not the input, is at fault (errno(3)).
STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
                  errno.EROFS: "the file system is read-only", errno.EIO: "the disk reported an I/O error"}

#: A temporary file of :func:`write_many_atomic` (``tempfile.mkstemp``: 8 random characters) and the
#: hard link :func:`_swap_in` keeps of a replaced target: leftovers of a killed run; group 1 is the
#: target's file name.
TEMP_RE = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.tmp")
BACKUP_LINK_RE = re.compile(r"\.(.+)\.[0-9]+\.bak")


def _mutation(op: str, path: object) -> None:
    """Called before every mutating file operation (the fault-injection point, see the module doc)."""
    global _ops_done
    kill_at = os.environ.get(KILL_AT_ENV)
    log = os.environ.get(OPS_LOG_ENV)
    if not kill_at and not log:
        return
    _ops_done += 1
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{_ops_done} {op} {path}\n")
    if kill_at and _ops_done == int(kill_at):
        os.kill(os.getpid(), signal.SIGKILL)


def os_failure(exc: OSError, message: str, *, value: str, hint: str) -> KimiDeployError:
    """The error to raise for ``exc``: :class:`StorageError` with a hint about the disk when the file system
    refused (:data:`STORAGE_ERRNOS`), else :class:`UsageError` with ``hint``.

    ``message`` is the sentence without the cause; the cause (``strerror``) is appended.
    """
    cause = exc.strerror or str(exc)
    if exc.errno in STORAGE_ERRNOS:
        where = value or "the target"
        return StorageError(f"{message}: {cause}", value=value,
                            hint=f"{STORAGE_ERRNOS[exc.errno]} where {where} lives: free space (df -h), remount it "
                                 "read-write or replace the disk, then run the same command again")
    return UsageError(f"{message}: {cause}", value=value, hint=hint)


def replace(src: str | Path, dst: str | Path) -> None:
    """``os.replace`` through the gateway."""
    _mutation("replace", dst)
    os.replace(src, dst)


def unlink(path: str | Path, *, missing_ok: bool = True) -> None:
    """Remove a file through the gateway (absent is fine with ``missing_ok``)."""
    _mutation("unlink", path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def rmtree(path: Path) -> None:
    """Remove a folder tree through the gateway (absent is fine; a symlink is unlinked, never followed)."""
    _mutation("rmtree", path)
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def mkdir(path: Path, *, mode: int = 0o755) -> None:
    """``mkdir -p`` through the gateway."""
    if path.is_dir():
        return
    _mutation("mkdir", path)
    path.mkdir(parents=True, exist_ok=True, mode=mode)


def rename(src: Path, dst: Path) -> None:
    """``os.rename`` through the gateway."""
    _mutation("rename", dst)
    os.rename(src, dst)


#: Seconds a run waits for a lock another run holds (:func:`exclusive_lock`), then gives up.
LOCK_WAIT_S = 10.0


@contextlib.contextmanager
def exclusive_lock(path: Path, *, what: str, wait: float | None = None, poll: float = 0.2,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold an exclusive ``flock(2)`` on ``path`` (created 0600 when missing) for the ``with`` block.

    The kernel drops the lock when the holder exits, even by SIGKILL, so a killed run never
    leaves a stale lock. The holder may unlink ``path`` (``uninstall --purge``): a waiter that then
    gets the lock on the unlinked file notices (inode check) and locks the new one.
    ``what`` names the locked thing in the error (``service kimi-k25``); ``wait`` (seconds, default
    :data:`LOCK_WAIT_S`) is how long to retry every ``poll`` seconds; ``clock``/``sleep`` are injectable.

    Raises:
        LockedError: still held by another process after ``wait`` seconds (exit 7).
        UsageError / StorageError: the lock file cannot be created.
    """
    wait = LOCK_WAIT_S if wait is None else wait
    deadline = clock() + wait
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise os_failure(exc, f"cannot create the lock file {path}", value=str(path),
                             hint="run as a user who can write there (root for /etc)") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if clock() >= deadline:
                raise LockedError(f"another kimi-deploy run is working on {what}", value=str(path),
                                  hint=f"wait until it has finished (`fuser -v {path}` names it) and run this "
                                       "command again; nothing was changed") from None
            sleep(poll)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the previous holder removed the file: lock the current one
            os.close(fd)
            continue
        try:
            yield
        finally:
            os.close(fd)
        return


def check_output_paths(paths: Mapping[str, Path | None], *, unwritable_hint: str | None = None) -> None:
    """Refuse output paths that cannot be written, before the work that produces them starts.

    ``paths`` maps the option that gave a path (``"--json"``) to the path (``None``: not asked
    for). Each parent directory must exist and be a writable directory (nothing is created:
    a typo must not make a tree under ``/``), the path itself must not be a directory, and no
    two options may name the same file. ``-`` (stdout) is the caller's to leave out.

    Raises:
        UsageError: the first bad path, with the option that gave it (exit 2).
    """
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        path = Path(path)
        resolved = path.resolve()
        if resolved in seen:
            raise UsageError(f"{option} and {seen[resolved]} name the same file", value=str(path),
                             hint="give each output its own path")
        seen[resolved] = option
        parent = path.parent
        if not parent.exists():
            raise UsageError(f"{option}: the directory {parent} does not exist", value=str(path),
                             hint=f"create it first (mkdir -p {parent}) or write the file elsewhere")
        if not parent.is_dir():
            raise UsageError(f"{option}: {parent} is not a directory", value=str(path),
                             hint="give a path inside an existing directory")
        if path.is_dir():
            raise UsageError(f"{option}: {path} is a directory", value=str(path),
                             hint=f"give a file name, e.g. {path / ('out' + _SUFFIX.get(option, ''))}")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{option}: the directory {parent} is not writable by this user", value=str(path),
                             hint=unwritable_hint or "write the file into a directory this user can write to")


#: File name suffix per output option, for the example in a "give a file name" hint.
_SUFFIX = {"--json": ".json", "--junit": ".xml", "--prom": ".prom", "--csv": ".csv", "--plot": ".png"}


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
            mkdir(path.parent)
            _mutation("create", path.parent / f".{path.name}.XXXXXXXX.tmp")
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            _mutation("chmod", tmp)
            os.chmod(tmp, (modes or {}).get(path, mode))
    except OSError as exc:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                unlink(tmp)
        raise os_failure(exc, f"cannot write {exc.filename or 'output'}", value=str(exc.filename or ""),
                         hint="choose a directory you can write to (or fix its permissions); nothing was changed") \
            from exc
    _swap_in(staged)
    for directory in sorted({p.parent for _, p in staged}):
        with contextlib.suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _swap_in(staged: list[tuple[str, Path]]) -> None:
    """Rename every staged file over its target; on a failure put back the targets already replaced.

    Before the first rename each existing target gets a hard link (same file system,
    no copy), so a rename failing half-way (a target that turned out to be a folder,
    say) can be undone and every target keeps its old bytes.

    Raises:
        UsageError: a rename failed; every target is back to its old bytes.
    """
    backups: dict[Path, str | None] = {}
    try:
        for _, path in staged:
            if path.is_file():
                backup = f"{path.parent}/.{path.name}.{os.getpid()}.bak"
                if os.path.lexists(backup):
                    unlink(backup)
                _mutation("link", backup)
                os.link(path, backup)
                backups[path] = backup
            else:
                backups[path] = None
        done: list[Path] = []
        try:
            for tmp, path in staged:
                replace(tmp, path)
                done.append(path)
        except OSError as exc:
            for path in done:
                backup = backups.get(path)
                if backup:
                    replace(backup, path)
                    backups[path] = None
                else:
                    with contextlib.suppress(OSError):
                        unlink(path)
            for tmp, _ in staged:
                with contextlib.suppress(OSError):
                    unlink(tmp)
            target = str(exc.filename2 or exc.filename or "")
            raise os_failure(exc, f"cannot replace {target}", value=target,
                             hint="remove or rename what is in the way; every file was left as it was") from exc
    finally:
        for backup in backups.values():
            if backup:
                with contextlib.suppress(OSError):
                    unlink(backup)
