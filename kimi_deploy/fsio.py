"""Atomic file writes: every file is either its old bytes or its new bytes, never half.

Writes go to a temporary file in the target's directory, are fsynced, then
``os.replace``d over the target (POSIX rename is atomic within a file system).
:func:`check_output_paths` refuses report paths up front, before a long run produces them.
:func:`exclusive_lock` serialises kimi-deploy runs that change the same thing.
An OSError becomes :class:`UsageError` (exit 2: permissions, a path in the way) or, when the file
system itself refused (:data:`STORAGE_ERRNOS`: disk full, read-only, I/O error),
:class:`StorageError` (exit 8) with a hint about the disk (:func:`os_failure`).

The kit's file writes and deletes go through this module (:func:`write_many_atomic`,
:func:`remove`, :func:`remove_tree`), each announced to :func:`fault_point` first: the
fault-injection tests set ``KIMI_DEPLOY_FAULT_KILL_AT=N`` to SIGKILL the process just before
its N-th mutating operation (``KIMI_DEPLOY_FAULT_TRACE=FILE`` appends one line per operation,
to count them). Both are test hooks; unset, they cost one environment lookup per operation.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from kimi_deploy.errors import KimiDeployError, LockedError, StorageError, UsageError

#: Test hook: SIGKILL this process just before its N-th mutating file operation (1-based).
FAULT_KILL_ENV = "KIMI_DEPLOY_FAULT_KILL_AT"
#: Test hook: append ``N OP PATH`` for every mutating file operation to this file.
FAULT_TRACE_ENV = "KIMI_DEPLOY_FAULT_TRACE"
_fault_count = 0


def fault_point(op: str, path: str | os.PathLike[str]) -> None:
    """Announce a mutating file operation ``op`` on ``path`` (see the module docstring).

    Kills the process with SIGKILL (no cleanup, no ``finally``) when this is operation
    number ``$KIMI_DEPLOY_FAULT_KILL_AT``; records it in ``$KIMI_DEPLOY_FAULT_TRACE`` first.
    """
    global _fault_count
    trace, kill_at = os.environ.get(FAULT_TRACE_ENV), os.environ.get(FAULT_KILL_ENV)
    if not trace and not kill_at:
        return
    _fault_count += 1
    if trace:
        with open(trace, "a", encoding="utf-8") as fh:
            fh.write(f"{_fault_count} {op} {os.fspath(path)}\n")
    if kill_at and kill_at.isdigit() and int(kill_at) == _fault_count:
        os.kill(os.getpid(), signal.SIGKILL)


#: errno values that mean the file system, not the input, is at fault (errno(3)).
STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
                  errno.EROFS: "the file system is read-only", errno.EIO: "the disk reported an I/O error"}

#: A temporary file of :func:`write_many_atomic` (``tempfile.mkstemp``: 8 random characters) and the
#: hard link :func:`_swap_in` keeps of a replaced target: what a killed run leaves; group 1 is the
#: target's file name.
TEMP_RE = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.tmp")
BACKUP_LINK_RE = re.compile(r"\.(.+)\.[0-9]+\.bak")


def os_failure(exc: OSError, message: str, *, value: str, hint: str) -> KimiDeployError:
    """The error to raise for ``exc``: :class:`StorageError` with a hint about the disk when the file system
    refused (:data:`STORAGE_ERRNOS`), else :class:`UsageError` with ``hint``.

    ``message`` is the sentence without the cause; the cause (``strerror``) is appended.
    """
    cause = exc.strerror or str(exc)
    if exc.errno in STORAGE_ERRNOS:
        return StorageError(f"{message}: {cause}", value=value,
                            hint=f"{STORAGE_ERRNOS[exc.errno]} where {value or 'the target'} lives: free space "
                                 "(df -h), remount it read-write or replace the disk, then run the same command again")
    return UsageError(f"{message}: {cause}", value=value, hint=hint)


def mkdir(path: Path) -> None:
    """``mkdir -p path`` (announced to :func:`fault_point` when it creates something)."""
    if path.is_dir():
        return
    fault_point("mkdir", path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_failure(exc, f"cannot create the folder {path}", value=str(path),
                         hint="run as a user that can write there (root for /etc and /var)") from exc


def rename(src: Path, dst: Path) -> None:
    """``os.rename`` (announced to :func:`fault_point`).

    Raises:
        UsageError / StorageError: the rename failed.
    """
    fault_point("rename", dst)
    try:
        os.rename(src, dst)
    except OSError as exc:
        raise os_failure(exc, f"cannot rename {src}", value=str(dst),
                         hint="remove what is in the way, then run again") from exc


def remove(path: Path) -> bool:
    """Delete the file ``path`` (a missing file is fine); whether it existed.

    Raises:
        UsageError: it exists and cannot be deleted.
    """
    return _delete(path, "unlink", os.unlink)


def remove_tree(path: Path) -> bool:
    """Delete the folder ``path`` and everything under it (missing is fine); whether it existed.

    Raises:
        UsageError: it exists and cannot be deleted completely.
    """
    return _delete(path, "rmtree", shutil.rmtree)


def _delete(path: Path, operation: str, delete: Callable[[Path], object]) -> bool:
    """``delete(path)`` announced to :func:`fault_point` as ``operation``; False when nothing was there.
    The error names what could not be deleted (the file inside a tree, for rmtree)."""
    if not os.path.lexists(path):
        return False
    fault_point(operation, path)
    try:
        delete(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise os_failure(exc, f"cannot delete {path}", value=str(exc.filename or path),
                         hint="run as a user that can write that directory") from exc
    return True


#: How long a second run waits for the lock before it gives up (seconds): long enough for a
#: short verb to finish (a patch apply takes about a second), short enough for a unit's ExecStartPre.
LOCK_WAIT_S = 10.0
#: Environment variable that changes :data:`LOCK_WAIT_S` (seconds, a number >= 0).
LOCK_WAIT_ENV = "KIMI_DEPLOY_LOCK_WAIT_S"
_LOCK_POLL_S = 0.1
_UNAVAILABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def exclusive_lock(path: Path, *, what: str, wait_s: float | None = None,
                   unavailable_ok: bool = False,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[Path | None]:
    """Hold an exclusive ``flock(2)`` on the file ``path`` (created 0644 with its parents) for the block; an
    existing directory is locked as it is (opened read-only, nothing created or written in it).

    The kernel releases the lock when the holder exits, however it dies, so a killed run
    never leaves a stale lock; the file itself stays (it holds the last holder's pid, for
    the message). A second holder polls every 0.1 s for ``wait_s`` seconds (default
    ``$KIMI_DEPLOY_LOCK_WAIT_S``, else :data:`LOCK_WAIT_S`; ``clock`` and ``sleep`` drive that
    wait, tests inject them), then gives up.

    ``what``: the guarded thing, for the message (``"patch run on /opt/sglang/..."``).
    ``unavailable_ok``: when this user cannot create or open the lock file (EACCES, EPERM,
    EROFS: a read-only check by an unprivileged user), yield ``None`` instead of failing.

    Yields:
        ``path`` while held (``None``: see ``unavailable_ok``).

    Raises:
        LockedError: another process held it for all of ``wait_s`` (exit 7).
        UsageError: the lock file cannot be created or opened; a bad ``$KIMI_DEPLOY_LOCK_WAIT_S``.
    """
    if wait_s is None:
        wait_s = lock_wait_s()
    directory = path.is_dir()
    try:
        if directory:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if unavailable_ok and exc.errno in _UNAVAILABLE:
            yield None
            return
        raise UsageError(f"cannot open the lock file {path}: {exc.strerror}", value=str(path),
                         hint="run as a user that can write that directory (usually root)") from exc
    try:
        deadline = clock() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    holder = _lock_holder(fd)
                    raise LockedError(
                        f"another kimi-deploy {what} is running (waited {wait_s:g} s for its lock)",
                        value=f"{path}" + (f" (held by pid {holder})" if holder else ""),
                        hint="let it finish, then run this command again; nothing was changed (the lock goes "
                             "away with the process that holds it, even when it is killed)") from None
                sleep(_LOCK_POLL_S)
        if not directory:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def lock_wait_s() -> float:
    """``$KIMI_DEPLOY_LOCK_WAIT_S`` as seconds, else :data:`LOCK_WAIT_S`.

    Raises:
        UsageError: not a finite number >= 0.
    """
    text = os.environ.get(LOCK_WAIT_ENV, "").strip()
    if not text:
        return LOCK_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"{LOCK_WAIT_ENV} must be a number of seconds >= 0", value=text,
                         hint=f"unset it for the default {LOCK_WAIT_S:g} s, or give e.g. {LOCK_WAIT_ENV}=30")
    return value


def _lock_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
    return ""


def check_output_paths(paths: Mapping[str, Path | None], *, unwritable_hint: str | None = None) -> None:
    """Refuse output paths that cannot be written, before the work that produces them starts.

    ``paths`` maps the option that gave a path (``"--json"``) to the path (``None``: not asked
    for). Each parent directory must exist and be a writable directory (nothing is created:
    a typo must not make a tree under ``/``), the path itself must not be a directory or anything else that is
    not a regular file (:func:`not_a_file`: a device, a pipe), and no two options may name the same file. ``-``
    (stdout) is the caller's to leave out.

    Raises:
        UsageError: the first bad path, with the option that gave it (exit 2).
        StorageError: its directory is on a read-only file system (exit 8).
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
        what = not_a_file(path)
        if what:
            stdout = "; `--json -` prints the report on stdout" if option == "--json" else ""
            raise UsageError(f"{option}: {path} is {what}, not a file", value=str(path),
                             hint="kimi-deploy writes a file atomically (a temporary file renamed over the target), "
                                  f"which would replace it: give a file path{stdout}")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise _unwritable(option, parent, path,
                              unwritable_hint or "write the file into a directory this user can write to")


def not_a_file(path: Path) -> str | None:
    """What ``path`` is when it exists (symlinks followed) and is neither a regular file nor a directory:
    ``a character device`` (``/dev/null``, a terminal), ``a pipe (FIFO)`` (``/dev/stdout`` of a pipeline), ``a
    block device``, ``a socket``; ``None`` otherwise (missing, or a dangling link: a write creates it).

    The atomic writers rename a temporary file over their target: run as root, ``--json /dev/stdout`` or
    ``--csv /dev/null`` once replaced the host's ``/dev/stdout`` and ``/dev/null`` with regular files.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def _unwritable(option: str, directory: Path, path: Path, hint: str) -> KimiDeployError:
    """Why ``directory`` refuses writes: :class:`StorageError` (exit 8, remount) when its file system is mounted
    read-only (``statvfs`` ``ST_RDONLY``: root too is refused there, and no permission fixes it), else
    :class:`UsageError` (exit 2) with ``hint``."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return StorageError(f"{option}: the directory {directory} is on a read-only file system", value=str(path),
                            hint=f"{STORAGE_ERRNOS[errno.EROFS]} where {directory} lives: remount it read-write "
                                 "(`mount -o remount,rw MOUNTPOINT`) or write the file elsewhere")
    return UsageError(f"{option}: the directory {directory} is not writable by this user", value=str(path), hint=hint)


def check_output_dir(option: str, path: Path | None) -> None:
    """Refuse an output *directory* (``render --out DIR``) by :func:`check_output_paths`' rule.

    ``path`` may exist (then it must be a writable directory) or be created by the caller, one
    level only: its parent must exist and be a writable directory. Nothing is created here.

    Raises:
        UsageError: the first problem, with ``option`` and the path (exit 2).
        StorageError: the directory (or its parent) is on a read-only file system (exit 8).
    """
    if path is None:
        return
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{option}: {path} exists and is not a directory", value=str(path),
                             hint="give a directory (it is created when missing, its parent must exist)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _unwritable(option, path, path, "write into a directory this user can write to")
        return
    check_output_paths({option: path})


def create_output_dir(path: Path) -> None:
    """Create ``path`` (one level; its parent was checked by :func:`check_output_dir`).

    Raises:
        UsageError: it cannot be created (the parent went away, permissions).
    """
    try:
        Path(path).mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the directory {path}: {exc.strerror}", value=str(path),
                         hint="create its parent first or choose another directory") from exc


#: File name suffix per output option, for the example in a "give a file name" hint.
_SUFFIX = {"--out": "", "PATH": ".toml", "--json": ".json", "--junit": ".xml", "--prom": ".prom", "--csv": ".csv", "--plot": ".png"}


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
        UsageError: a directory cannot be created or written (permissions, a path in the way), or a target is a
            device or a pipe (:func:`not_a_file`); nothing was changed.
        StorageError: the file system refused (disk full, read-only, I/O error); nothing was changed.
    """
    for path in files:  # never rename a file over a device or a pipe (/dev/null, /dev/stdout): before any change
        what = not_a_file(path)
        if what:
            raise UsageError(f"cannot write {path}: it is {what}, not a file", value=str(path),
                             hint="kimi-deploy replaces files atomically and would replace it: choose another path "
                                  "(or remove what is there); nothing was changed")
    staged: list[tuple[str, Path]] = []
    path = None
    try:
        for path, data in files.items():
            payload = data.encode() if isinstance(data, str) else data
            path.parent.mkdir(parents=True, exist_ok=True)
            fault_point("create", path)
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
        # name the path the caller gave, never the temporary file staged next to it
        target = exc.filename if path is None or exc.filename == str(path.parent) else path
        raise os_failure(exc, f"cannot write {target or 'output'}", value=str(target or ""),
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
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(backup)
                fault_point("link", backup)
                os.link(path, backup)
                backups[path] = backup
            else:
                backups[path] = None
        done: list[Path] = []
        try:
            for tmp, path in staged:
                fault_point("replace", path)
                os.replace(tmp, path)
                done.append(path)
        except OSError as exc:
            for path in done:
                backup = backups.get(path)
                if backup:
                    os.replace(backup, path)
                    backups[path] = None
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            for tmp, _ in staged:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            target = str(exc.filename2 or exc.filename or "")
            raise os_failure(exc, f"cannot replace {target}", value=target,
                             hint="remove or rename what is in the way; every file was left as it was") from exc
    finally:
        for backup in backups.values():
            if backup:
                fault_point("unlink", backup)
                with contextlib.suppress(OSError):
                    os.unlink(backup)
