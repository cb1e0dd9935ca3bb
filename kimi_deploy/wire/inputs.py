"""Files someone else wrote (datasets, reports, results of other runs), read within stated bounds (issue #38).

- **Regular files only.** A path is opened with ``O_NONBLOCK`` (a FIFO without a writer does not block the open)
  and ``fstat``-ed: a FIFO, a device (``/dev/zero``), a socket or a directory is refused with
  :class:`~kimi_deploy.errors.UsageError` (exit 2) before a byte is read.
- **Bounded.** A file over its cap is refused from its size and again while it is read (it may grow); a JSON Lines
  file is read one line at a time (:func:`iter_lines`), a line over its cap is skipped to the next ``\\n`` without
  keeping it, so memory follows the cap, not the file.
- **JSON Lines split on ``\\n`` only** (RFC 7464's sibling, jsonlines.org: "each line is terminated by ``\\n``");
  ``str.splitlines`` also splits on U+2028, U+0085, ``\\x1c``-``\\x1e`` and ``\\r`` alone, which a JSON string may hold
  unescaped, and refused such valid lines. A ``\\r`` before the ``\\n`` is JSON whitespace.
- **Strict JSON.** ``NaN``, ``Infinity`` and ``-Infinity`` (Python's ``json`` extensions) are refused.

The caps (:data:`DATASET_LINE_BYTES`, :data:`DATASET_FILE_BYTES`, :data:`REPORT_FILE_BYTES`) are documented in
docs/reference/limits.md; ``check`` and ``bench`` raise the dataset caps with ``--max-dataset-line-bytes`` and
``--max-dataset-bytes``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kimi_deploy.errors import UsageError
from kimi_deploy.wire.limits import human, parse_json
from kimi_deploy.wire.printable import printable

#: 16 MiB: the longest dataset line (one request body) the kit reads. K2VV's longest request (a long agent
#: history with tools) is a few hundred KiB; a parsed line costs ~8x its bytes in Python objects, so a line at the
#: cap costs ~130 MiB per request in flight (measured: benchmarks/bench_dataset_bounds.py).
DATASET_LINE_BYTES = 16 << 20

#: 4 GiB: the largest dataset file. The file is streamed (a line at a time; the sample is drawn by index), so
#: this bounds the time of the reading pass, not memory.
DATASET_FILE_BYTES = 4 << 30

#: 256 MiB: the largest ``bench --dataset`` file. ``bench`` keeps the prompts it sends (each is sent many times),
#: so its file is held parsed, ~8x its bytes: the kit's own prompts file is 144 KiB.
BENCH_DATASET_FILE_BYTES = 256 << 20

#: 64 MiB: the largest report or result file ``check compare`` / ``bench compare`` read (the largest real report
#: is under 1 MiB; a parsed file costs ~8x its bytes).
REPORT_FILE_BYTES = 64 << 20

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def not_regular(mode: int) -> str | None:
    """What a non-regular file of ``st_mode`` is (``a FIFO (named pipe)`` ...), ``None`` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_stat(path: str | Path) -> tuple[int, os.stat_result]:
    """``path`` opened read-only with ``O_NONBLOCK`` (a FIFO without a writer does not block the open) and its
    ``fstat``; the caller closes the descriptor.

    Raises:
        OSError: the open or the ``fstat`` failed (the descriptor is closed then).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str | Path, what: str, hint: str, *, max_bytes: int | None = None,
                 reader: str = "the kit", cap_flag: str | None = None) -> IO[bytes]:
    """``path`` opened for reading when it is a regular file (symlinks followed) of at most ``max_bytes`` (``None``:
    any size; the size is the open file's, so a file swapped after the check is still held to it).

    Raises:
        UsageError: missing, unreadable, or not a regular file (``what`` names it: ``the dataset``); over
            ``max_bytes`` (the message says what ``reader`` reads, the hint names ``cap_flag``, which raises the
            cap), exit 2.
    """
    try:
        fd, st = _open_stat(path)
    except OSError as exc:
        raise UsageError(f"cannot read {what} ({exc.strerror or exc})", value=str(path), hint=hint) from None
    try:
        kind = not_regular(st.st_mode)
        if kind is not None:
            raise UsageError(f"{what} is {kind}, not a regular file: the kit reads only regular files (a pipe or "
                             "a device may never end)", value=str(path),
                             hint=f"copy it to a file first; {hint}")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UsageError(f"{what} is {human(st.st_size)}, over the {human(max_bytes)} {reader} reads",
                             value=str(path), hint=f"raise the cap with {cap_flag} N" if cap_flag else hint)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | Path, what: str, hint: str) -> None:
    """Refuse ``path`` now unless it is a readable regular file (:func:`open_regular`, then closed)."""
    open_regular(path, what, hint).close()


def refuse_constant(name: str) -> Any:
    """``json`` ``parse_constant`` hook: ``NaN``/``Infinity``/``-Infinity`` are not JSON (RFC 8259 section 6)."""
    raise ValueError(f"{name} is not a JSON number")


def finite_float(text: str) -> float:
    """``json`` ``parse_float`` hook: a number that overflows a double (``1e400``) is refused, not made infinite."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of a double's range")
    return value


def field_path(parts: Any) -> str:
    """``points[0].summary.completed`` for a JSON path (keys and indices), ``(root)`` for the document."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def shape_problem(doc: Any, schema: dict[str, Any]) -> str | None:
    """The first way ``doc`` breaks ``schema`` (the kit's own JSON Schema 2020-12 of a file it writes, no
    ``$ref`` outside it) as ``field: message`` (the message clipped, the field printable), ``None`` when it fits."""
    import jsonschema  # start-up: only the compare verbs read a file this way
    from jsonschema.exceptions import best_match

    try:
        error = best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    except RecursionError:
        return "(root): nested too deep"
    if error is None:
        return None
    return f"{printable(field_path(error.absolute_path))[:200]}: {printable(error.message)[:200]}"


def lone_surrogate(value: Any) -> str | None:
    """The first string (or key) of parsed JSON ``value`` holding a lone surrogate (``"\\ud800"``: JSON allows
    the escape, no UTF-8 request can carry it), iteratively; ``None`` when there is none."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return node
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def read_json(path: str | Path, what: str, hint: str, max_bytes: int = REPORT_FILE_BYTES) -> Any:
    """The JSON document in the regular file ``path`` (UTF-8, a leading BOM dropped), at most ``max_bytes``.

    Raises:
        UsageError: not a regular file, unreadable, over ``max_bytes``, not UTF-8, not strict JSON (exit 2).
    """
    with open_regular(path, what, hint) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {what} ({exc.strerror or exc})", value=str(path), hint=hint) from None
    if len(data) > max_bytes:
        raise UsageError(f"{what} is over {human(max_bytes)}: not a file the kit wrote", value=str(path), hint=hint)
    try:
        return parse_json(data.decode("utf-8-sig"), parse_constant=refuse_constant, parse_float=finite_float)
    except ValueError as exc:
        raise UsageError(f"{what} is not JSON ({str(exc)[:160]})", value=str(path), hint=hint) from None


@dataclasses.dataclass(frozen=True)
class Line:
    """One line of a JSON Lines file: ``number`` (1-based), byte ``offset`` and ``length`` (without the ``\\n``),
    ``data`` (the bytes, ``None`` when the line ran past the cap and was skipped unread)."""

    number: int
    offset: int
    length: int
    data: bytes | None


def iter_lines(fh: IO[bytes], *, max_line_bytes: int, max_file_bytes: int, what: str, where: str,
               flag: str = "", hasher: Any = None) -> Iterator[Line]:
    """The lines of ``fh`` split on ``\\n`` only, each kept only when it is at most ``max_line_bytes``;
    ``hasher`` (a ``hashlib`` object), when given, is fed every byte read.

    Raises:
        UsageError: the file grew past ``max_file_bytes`` while read (``flag`` names the option that raises
            it), or a read failed (exit 2).
    """
    number = offset = 0
    while True:
        try:
            chunk = fh.readline(max_line_bytes + 1)
            if not chunk:
                return
            number += 1
            start, total, last = offset, len(chunk), chunk
            kept = chunk.endswith(b"\n") or len(chunk) <= max_line_bytes
            if hasher is not None:
                hasher.update(chunk)
            while not kept and last and not last.endswith(b"\n") and start + total <= max_file_bytes:
                last = fh.readline(1 << 20)  # the rest of an over-long line, a block at a time, not kept
                total += len(last)
                if hasher is not None:
                    hasher.update(last)
        except OSError as exc:
            raise UsageError(f"cannot read {what} ({exc.strerror or exc})", value=where) from None
        offset += total
        if offset > max_file_bytes:
            raise UsageError(f"{what} is over {human(max_file_bytes)}", value=where,
                             hint=f"raise the cap with {flag} N" if flag else None)
        newline = last.endswith(b"\n")
        yield Line(number, start, total - newline, (chunk[:-1] if newline else chunk) if kept else None)


def read_at(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the open file ``fd`` (``os.pread``: safe from several threads).

    Raises:
        OSError: the read failed; ``EIO`` when the file is now shorter (it changed while the run read it).
    """
    out = b""
    while len(out) < length:
        piece = os.pread(fd, length - len(out), offset + len(out))
        if not piece:
            raise OSError(errno.EIO, "the file is shorter than when it was first read")
        out += piece
    return out


#: 1 MiB: the largest small document the kit reads whole (a profile: ``init`` writes ~9 KiB; a model's or a
#: draft's ``config.json`` / ``generation_config.json``: K2.5's is 3.6 KiB; a recorded ``nvidia-smi`` query).
SMALL_FILE_BYTES = 1 << 20

#: 256 MiB: the largest ``model.safetensors.index.json`` or recorded header index the kit reads whole. K2.5's
#: index, estimated from its config.json: 61 layers x 384 experts x 3 projections x 3 INT4 tensors (packed weight,
#: scale, shape) ~ 211k entries of ~100 bytes ~ 20 MiB, so over 10x headroom.
INDEX_FILE_BYTES = 256 << 20


class IrregularFile(OSError):
    """A path that is not a regular file, or a regular file over its cap (an :class:`OSError`, so a caller's
    ``except OSError`` reports it with :attr:`strerror` like any other read failure)."""


def read_regular(path: str | Path, max_bytes: int = SMALL_FILE_BYTES) -> bytes:
    """The whole of the regular file ``path`` (symlinks followed), at most ``max_bytes``.

    Opened and ``fstat``-ed as :func:`open_regular` opens (:func:`_open_stat`), so a FIFO without a writer, a
    device (``/dev/zero``) or a directory is refused before a byte is read instead of blocking or filling memory.

    Raises:
        FileNotFoundError, PermissionError, OSError: the open or the read failed (``IsADirectoryError`` for a
            directory, as :meth:`pathlib.Path.read_bytes` raises).
        IrregularFile: a FIFO, a device or a socket (``strerror``: ``a FIFO (named pipe), not a regular file``),
            or a file over ``max_bytes`` (``strerror``: ``larger than 1 MiB``), also when it grows while read.
    """
    fd, st = _open_stat(path)
    try:
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        kind = not_regular(st.st_mode)
        if kind is not None:
            raise IrregularFile(errno.EINVAL, f"{kind}, not a regular file", str(path))
        if st.st_size > max_bytes:
            raise IrregularFile(errno.EFBIG, f"larger than {human(max_bytes)}", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise IrregularFile(errno.EFBIG, f"larger than {human(max_bytes)}", str(path))
    return data
