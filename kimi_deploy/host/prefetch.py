"""``kimi-deploy prefetch``: read the model's and the draft model's shards into the page cache before SGLang starts.

Why: weight loading was 495 of 527 s of one SGLang start (lm-sys blog, 2026-08-21); after a reboot, or once the
page cache was evicted, SGLang reads a ~550 GB checkpoint shard by shard. Prefetching a 551 GB checkpoint into the
page cache took a start from 25-30 min to 2 min 36 s (tokenspeed issue 833). The server unit runs this as
``ExecStartPre=-`` (the ``-``: whatever happens here, SGLang starts; systemd.service(5), "ExecStart=").

What it does, in order (:func:`prefetch`):

1. **plan** (:func:`plan_shards`): the shards of ``[sglang] model_path`` then of ``speculative_draft_model_path``
   (SGLang loads the target model first, then the EAGLE draft), each model's in the order SGLang 0.5.23 reads them:
   ``DefaultModelLoader._prepare_weights`` (``python/sglang/srt/model_loader/loader.py``) keeps the
   ``*.safetensors`` files the index names (``filter_duplicate_safetensors_files``,
   ``model_loader/weight_utils.py``) and sorts them by name (:func:`sglang_order`); its loader threads
   (``enable_multithread_load``, on by default, 8 threads) read them in that order. A path that is no local folder (a hub repo id) or a shard that is missing or no regular
   file is listed and left out; the rest is read.
2. **residency** (:func:`resident_bytes`): ``mincore(2)`` over a read-only ``mmap`` of each shard says how many of
   its bytes are already in the page cache; a warm host reads nothing. The kernel answers truthfully only to a
   process that owns the file or may write it (or has ``CAP_FOWNER``): to anyone else it reports every page
   resident (``can_do_mincore()`` in ``mm/mincore.c``, Linux >= 5.0; a page-cache side channel fix). The unit's
   user reading root's shards is such a process, so there residency is unknown (:func:`mincore_truthful`) and each
   chunk is first read with ``preadv2(RWF_NOWAIT)``, which copies what is cached and refuses to wait for the disk;
   only the rest is read from the disk.
3. **room** (:func:`room`): ``MemAvailable`` of ``/proc/meminfo`` (proc(5): what can be allocated without
   swapping, page cache counted) must hold the bytes still to read plus ``[startup] prefetch_reserve_gib``;
   else the step is **skipped** with one line in the journal (reading more than fits would evict the first
   shards before SGLang reads them, and squeeze SGLang's own host memory). Where residency is unknown every shard
   counts as still to read; cached shards count in MemAvailable too, so a warm host with room still passes.
4. **read** (:func:`read_shards`): ``prefetch_threads`` threads take shards in plan order, each reading its
   shard sequentially in :data:`CHUNK_BYTES` chunks (``posix_fadvise(POSIX_FADV_SEQUENTIAL)`` on the file,
   ``POSIX_FADV_WILLNEED`` on the next chunk so the disk works while this one is copied), skipping chunks
   known resident, at most ``prefetch_max_mib_s`` MiB/s together when set.
5. **deadline**: every thread stops at the deadline (checked between chunks); the step then returns at once
   (a read stuck in the kernel is left to a daemon thread, which the process exit ends), so it ends before
   systemd's ``TimeoutStartSec=`` could kill the start (``render`` gives it at most half of it,
   :func:`deadline_for`).

Every line goes to stdout (the journal, under the unit), prefixed ``prefetch:``; :class:`Prefetch` is the outcome.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy.facts.meminfo import MEMINFO, read_meminfo
from kimi_deploy.facts.modeldir import INDEX_NAME, SINGLE_NAME
from kimi_deploy.errors import ExitCode
from kimi_deploy.profile import Profile
from kimi_deploy.wire.limits import parse_json

GIB = 1024**3
MIB = 1024**2
#: Bytes each thread reads per call (and advises ahead): large enough that one read() is one long sequential
#: request, small enough that a deadline or a rate cap is checked often (at 2 GB/s, every 8 ms).
CHUNK_BYTES = 16 * MIB
#: Largest ``model.safetensors.index.json`` read (the Kimi K2.5 index is ~7 MB: 100k+ tensor names).
MAX_INDEX_BYTES = 256 * MIB

#: Outcomes, stable (``--json``'s ``outcome``): ``off`` (``[startup] prefetch = false``), ``nothing`` (no local
#: shard), ``warm`` (everything resident), ``no_room`` (skipped: MemAvailable too small), ``done``, ``deadline``
#: (stopped at the deadline), ``failed`` (a shard could not be read).
OUTCOMES = ("off", "nothing", "warm", "no_room", "done", "deadline", "failed")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One file to read: ``model`` (``"model"`` or ``"draft"``), its absolute ``path``, ``size`` in bytes."""

    model: str
    path: str
    size: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """The shards to read, in order, and what was left out: ``missing`` (path, why) and ``notes``."""

    shards: tuple[Shard, ...]
    missing: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


@dataclasses.dataclass(frozen=True)
class Prefetch:
    """The outcome of :func:`prefetch` (one of :data:`OUTCOMES`); byte counts are of the plan's shards.

    ``cached_bytes``: in the page cache already (by ``mincore``, or found by ``RWF_NOWAIT`` reads); ``need_bytes``:
    the rest, to read from the disk; ``read_bytes``: read from the disk by this run; ``available_bytes``: MemAvailable (``None`` when unreadable); ``errors``: ``path: reason``.
    """

    outcome: str
    shards: int
    total_bytes: int
    cached_bytes: int
    need_bytes: int
    read_bytes: int
    shards_done: int
    seconds: float
    deadline_s: float
    threads: int
    available_bytes: int | None
    reserve_bytes: int
    missing: tuple[tuple[str, str], ...] = ()
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """OK for off/nothing/warm/no_room/done (nothing is wrong with the host); TIMEOUT for ``deadline``;
        FAILED when a shard was missing or unreadable. The unit ignores it (``ExecStartPre=-``)."""
        if self.outcome == "deadline":
            return ExitCode.TIMEOUT
        if self.outcome == "failed" or self.missing:
            return ExitCode.FAILED
        return ExitCode.OK

    @property
    def rate_bytes_s(self) -> float | None:
        return self.read_bytes / self.seconds if self.seconds > 0 and self.read_bytes else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["missing"] = [list(m) for m in self.missing]
        data["errors"], data["notes"] = list(self.errors), list(self.notes)
        data["exit_code"] = int(self.exit_code)
        return data

    def summary(self) -> str:
        """The step's last journal line: what it did, in GiB and seconds."""
        gib = size_text
        where = f"{self.shards} shards, {gib(self.total_bytes)}"
        if self.outcome == "off":
            return "off ([startup] prefetch = false)"
        if self.outcome == "nothing":
            return "nothing to read: " + ("; ".join(self.notes) or "no local shard")
        if self.outcome == "warm":
            return f"warm: {where} already in the page cache"
        if self.outcome == "no_room":
            avail = "unknown" if self.available_bytes is None else gib(self.available_bytes)
            return (f"skipped: MemAvailable {avail} cannot hold the {gib(self.need_bytes)} still to read of {where} "
                    f"plus the {gib(self.reserve_bytes)} reserve ([startup] prefetch_reserve_gib); SGLang reads "
                    "them from disk")
        rate = self.rate_bytes_s
        speed = f" ({rate / GIB:.2f} GiB/s)" if rate else ""
        done = (f"read {gib(self.read_bytes)} of {gib(self.need_bytes)} in {self.seconds:.1f} s{speed} with "
                f"{self.threads} threads; {gib(self.cached_bytes)} was cached; {self.shards_done} of {self.shards} "
                "shards complete")
        if self.outcome == "deadline":
            return (f"stopped at its deadline ({self.deadline_s:g} s): {done}; SGLang reads the rest from disk "
                    "(raise [startup] prefetch_timeout_sec and TimeoutStartSec=)")
        if self.outcome == "failed":
            return f"finished with errors: {done}; " + "; ".join(self.errors[:3])
        return f"done: {done}"


def size_text(n: int) -> str:
    """``n`` bytes as ``"1.5 GiB"``, or ``"26.0 MiB"`` below 1 GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


# -- 1. plan -----------------------------------------------------------------------------------------------------

def sglang_order(names: Iterable[str]) -> list[str]:
    """``names`` (one folder's shard files) in the order SGLang 0.5.23 reads them: deduplicated and sorted as
    strings. Source: ``python/sglang/srt/model_loader/loader.py``, ``DefaultModelLoader._prepare_weights``:
    ``hf_weights_files.sort()`` unless ``SGLANG_SORT_WEIGHT_FILES`` is -1 (its default, 0, sorts; a k > 0
    staggers each TP rank's start by ``rank * k`` files of the same sorted list, which this order still leads)."""
    return sorted(set(names))


def shard_names(folder: Path) -> tuple[list[str], str | None]:
    """``(shard file names in SGLang's order, problem)`` of one model folder: those the index
    (``model.safetensors.index.json``'s ``weight_map`` values) names, else ``model.safetensors``, else every
    ``*.safetensors`` (SGLang's ``_prepare_weights`` globs the same). ``problem``: why the index was not usable."""
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise ValueError(f"larger than {MAX_INDEX_BYTES // MIB} MiB")
            weight_map = parse_json(index.read_bytes())["weight_map"]
            names = [v for v in weight_map.values() if isinstance(v, str)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return [], f"{index} is not a usable index ({type(exc).__name__}: {str(exc)[:200]})"
        bad = [n for n in names if "/" in n or n in ("", ".", "..")]
        if bad:
            return [], f"{index} names a shard outside its folder: {bad[0][:200]!r}"
        return sglang_order(names), None
    if (folder / SINGLE_NAME).is_file():
        return [SINGLE_NAME], None
    return sglang_order(p.name for p in folder.glob("*.safetensors")), None


def plan_shards(models: Sequence[tuple[str, str | None]]) -> Plan:
    """The :class:`Plan` of ``models``: ``(label, path)`` pairs in load order (``("model", ...)``, then
    ``("draft", ...)``); a ``None`` path is skipped. Never raises: what cannot be read becomes ``missing`` or a
    note."""
    shards: list[Shard] = []
    missing: list[tuple[str, str]] = []
    notes: list[str] = []
    for label, path in models:
        if not path:
            continue
        folder = Path(path)
        if not folder.is_dir():
            notes.append(f"{label} {path} is not a local folder (a hub id is downloaded by SGLang): not prefetched")
            continue
        names, problem = shard_names(folder)
        if problem:
            notes.append(problem)
        if not names and not problem:
            notes.append(f"{label} {path} has no *.safetensors shards")
        for name in names:
            file = folder / name
            try:
                st = file.stat()
            except OSError as exc:
                missing.append((str(file), exc.strerror or type(exc).__name__))
                continue
            if not stat.S_ISREG(st.st_mode):
                missing.append((str(file), "not a regular file"))
                continue
            shards.append(Shard(label, str(file), st.st_size))
    return Plan(tuple(shards), tuple(missing), tuple(notes))


def profile_models(profile: Profile) -> list[tuple[str, str | None]]:
    """``[("model", model_path), ("draft", speculative_draft_model_path)]``: the order SGLang loads them."""
    s = profile.sglang
    return [("model", s.model_path), ("draft", s.speculative_draft_model_path)]


def deadline_for(profile: Profile) -> int:
    """The step's ``--deadline`` in the unit, seconds (:meth:`kimi_deploy.profile.Startup.prefetch_deadline`:
    ``[startup] prefetch_timeout_sec``, at most half of ``TimeoutStartSec=``)."""
    return profile.start.prefetch_deadline(profile.service.timeout_start_sec)


# -- 2. residency ------------------------------------------------------------------------------------------------

_PROT_READ, _MAP_SHARED = mmap.PROT_READ, mmap.MAP_SHARED
#: Each mincore() byte: bit 0 is "resident"; the others are reserved (mincore(2)).
_LOW_BIT = bytes(b & 1 for b in range(256))


class _Mincore:
    """``mincore(2)`` through libc (Python has no binding). ``None`` from :meth:`vector` when unavailable."""

    def __init__(self) -> None:
        self.page = mmap.PAGESIZE
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int64]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            self.libc: Any = libc
        except (OSError, AttributeError):
            self.libc = None

    def vector(self, fd: int, size: int) -> bytes | None:
        """One byte per page of the open file ``fd`` (``size`` bytes): 1 resident, 0 not; ``None`` on failure."""
        if self.libc is None or size <= 0:
            return None
        addr = self.libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + self.page - 1) // self.page
            vec = (ctypes.c_ubyte * pages)()
            if self.libc.mincore(addr, size, vec) != 0:
                return None
            return bytes(vec).translate(_LOW_BIT)
        finally:
            self.libc.munmap(addr, size)


_MINCORE = _Mincore()


def mincore_truthful(path: str, st: os.stat_result) -> bool:
    """True when the kernel's ``mincore(2)`` tells this process the truth about ``path``'s page cache: it runs as
    root (``CAP_FOWNER``), owns the file, or may write it (``can_do_mincore()``, ``mm/mincore.c``); otherwise
    Linux >= 5.0 reports every page of a file mapping resident."""
    return os.geteuid() == 0 or st.st_uid == os.geteuid() or os.access(path, os.W_OK)


def resident_bytes(path: str, size: int) -> int | None:
    """Bytes of ``path`` (``size`` long) in the page cache now (``mincore(2)``), or ``None`` when unknown (the
    file cannot be opened, mincore is unavailable, or it would not answer truthfully: :func:`mincore_truthful`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        vec = _MINCORE.vector(fd, size) if mincore_truthful(path, os.fstat(fd)) else None
    finally:
        os.close(fd)
    return None if vec is None else min(size, vec.count(1) * _MINCORE.page)


# -- 3. room -----------------------------------------------------------------------------------------------------

def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in bytes, or ``None`` when ``meminfo`` cannot be read or has no such field."""
    info = read_meminfo(meminfo)
    return None if info is None else info.get("MemAvailable")


def room(need_bytes: int, available: int | None, reserve_bytes: int) -> bool:
    """True when ``available`` (MemAvailable) holds ``need_bytes`` plus ``reserve_bytes``; an unknown
    ``available`` is no room (reading blind could push SGLang's own memory out)."""
    return available is not None and need_bytes + reserve_bytes <= available


def warm_restart_need(total_bytes: int, reserve_bytes: int) -> int:
    """RAM a warm restart needs, bytes: every shard in the page cache plus the reserve (what ``doctor`` prints)."""
    return total_bytes + reserve_bytes


# -- 4. read -----------------------------------------------------------------------------------------------------


class _Progress:
    """Shared state of the reader threads: the next shard, bytes read, the rate cap; thread-safe."""

    def __init__(self, shards: Sequence[Shard], deadline: float, max_bytes_s: float | None,
                 clock: Callable[[], float]):
        self.shards, self.deadline, self.max_bytes_s, self.clock = shards, deadline, max_bytes_s, clock
        self.lock = threading.Lock()
        self.next = 0
        self.read = 0
        self.cached = 0  # found in the page cache while reading (RWF_NOWAIT), when mincore could not say
        self.done = 0
        self.errors: list[str] = []
        self.started = clock()
        self.timed_out = False

    def take(self) -> Shard | None:
        with self.lock:
            if self.next >= len(self.shards) or self.expired():
                return None
            shard = self.shards[self.next]
            self.next += 1
            return shard

    def expired(self) -> bool:
        if self.clock() >= self.deadline:
            self.timed_out = True
        return self.timed_out

    def add(self, n: int, cached: int = 0) -> None:
        with self.lock:
            self.read += n
            self.cached += cached

    def pace(self, sleep: Callable[[float], None]) -> bool:
        """Wait while the rate cap is exceeded; False when the deadline came first."""
        while self.max_bytes_s:
            with self.lock:
                ahead = self.read / self.max_bytes_s - (self.clock() - self.started)
            if ahead <= 0:
                break
            if self.clock() + ahead >= self.deadline:
                self.timed_out = True
                return False
            sleep(min(ahead, 1.0))
        return not self.expired()


def _cached_part(fd: int, view: memoryview, offset: int) -> int:
    """Bytes of ``view`` filled from the page cache alone at ``offset`` (``preadv2`` with ``RWF_NOWAIT``: it never
    waits for the disk); 0 when the first page is not cached or the file system does not take the flag."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return 0
    try:
        return os.preadv(fd, [view], offset, flag)
    except OSError:  # EAGAIN (not cached), EOPNOTSUPP (no RWF_NOWAIT on this file system)
        return 0


def _read_one(shard: Shard, progress: _Progress, sleep: Callable[[float], None]) -> None:
    """Read ``shard`` sequentially, chunk by chunk, skipping chunks mincore says are resident (else taking what
    ``RWF_NOWAIT`` finds cached and reading only the rest); stop at the deadline."""
    try:
        fd = os.open(shard.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        with progress.lock:
            progress.errors.append(f"{shard.path}: {exc.strerror or exc}")
        return
    try:
        st = os.fstat(fd)
        size = st.st_size
        vec = _MINCORE.vector(fd, size) if mincore_truthful(shard.path, st) else None
        pages_per_chunk = CHUNK_BYTES // _MINCORE.page
        with _fadvise_ok():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        for i, offset in enumerate(range(0, size, CHUNK_BYTES)):
            if vec is not None and 0 not in vec[i * pages_per_chunk:(i + 1) * pages_per_chunk]:
                continue  # resident already
            if not progress.pace(sleep):
                return
            length = min(CHUNK_BYTES, size - offset)
            cached = 0 if vec is not None else _cached_part(fd, view[:length], offset)
            if cached == length:
                progress.add(0, cached)
                continue
            with _fadvise_ok():
                os.posix_fadvise(fd, offset + CHUNK_BYTES, CHUNK_BYTES, os.POSIX_FADV_WILLNEED)
            n = os.preadv(fd, [view[cached:length]], offset + cached)
            progress.add(n, cached)
            if n == 0:
                break  # the file shrank under us: what is left is SGLang's problem, not ours
        with progress.lock:
            progress.done += 1
    except OSError as exc:
        with progress.lock:
            progress.errors.append(f"{shard.path}: {exc.strerror or exc}")
    finally:
        os.close(fd)


class _fadvise_ok:
    """posix_fadvise is advice: a file system that does not take it (EINVAL, ENOSYS) still reads."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, OSError)


def read_shards(shards: Sequence[Shard], *, threads: int, deadline_s: float, max_bytes_s: float | None = None,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> tuple[int, int, int, list[str], bool, float]:
    """Read ``shards`` with ``threads`` threads (each takes the next shard in order) until done or ``deadline_s``
    seconds passed (``clock``); returns ``(bytes read, bytes found cached, shards complete, errors, timed out,
    seconds)``.

    Returns at the deadline even when a thread is stuck in a read (daemon threads: the process exit ends them).
    """
    start = clock()
    progress = _Progress(shards, start + deadline_s, max_bytes_s, clock)

    def work() -> None:
        while (shard := progress.take()) is not None:
            _read_one(shard, progress, sleep)

    workers = [threading.Thread(target=work, name=f"prefetch-{i}", daemon=True)
               for i in range(max(1, min(threads, len(shards))))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=max(0.0, progress.deadline - clock()) + 0.5)
        if w.is_alive():
            progress.timed_out = True
            break
    with progress.lock:
        timed_out = progress.timed_out and progress.done < len(shards)
        return progress.read, progress.cached, progress.done, list(progress.errors), timed_out, clock() - start


# -- the step ----------------------------------------------------------------------------------------------------


def prefetch(profile: Profile, *, deadline_s: float | None = None, threads: int | None = None,
             meminfo: Path = MEMINFO, say: Callable[[str], None] = print,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Prefetch:
    """Warm the page cache with ``profile``'s shards (the module docstring's steps 1-5); never raises for a
    missing or unreadable shard, a full RAM or the deadline: each is an outcome (:data:`OUTCOMES`).

    Args:
        deadline_s: seconds for the whole step (default :func:`deadline_for`).
        threads: readers (default ``[startup] prefetch_threads``).
        say: where progress lines go (the journal, under the unit).
    """
    t0 = clock()
    st = profile.start
    deadline = float(deadline_for(profile) if deadline_s is None else deadline_s)
    threads = threads or st.prefetch_threads
    reserve = st.prefetch_reserve_gib * GIB
    base = dict(deadline_s=deadline, threads=threads, reserve_bytes=reserve)
    if not st.prefetch:
        return Prefetch("off", 0, 0, 0, 0, 0, 0, 0.0, available_bytes=None, **base)
    plan = plan_shards(profile_models(profile))
    for path, why in plan.missing:
        say(f"prefetch: {path}: {why}; SGLang will fail to load it")
    for note in plan.notes:
        say(f"prefetch: {note}")
    counts = dict(shards=len(plan.shards), total_bytes=plan.total_bytes, missing=plan.missing, notes=plan.notes)
    if not plan.shards:
        return Prefetch("nothing", cached_bytes=0, need_bytes=0, read_bytes=0, shards_done=0, seconds=0.0,
                        available_bytes=None, **counts, **base)
    cached = 0
    for shard in plan.shards:
        cached += resident_bytes(shard.path, shard.size) or 0
    need = plan.total_bytes - cached
    available = mem_available(meminfo)
    common = dict(cached_bytes=cached, need_bytes=need, available_bytes=available, **counts, **base)
    if need <= 0:
        return Prefetch("warm", read_bytes=0, shards_done=len(plan.shards), seconds=clock() - t0, **common)
    if not room(need, available, reserve):
        return Prefetch("no_room", read_bytes=0, shards_done=0, seconds=clock() - t0, **common)
    threads = max(1, min(threads, len(plan.shards)))
    common["threads"] = threads
    say(f"prefetch: reading {size_text(need)} of {len(plan.shards)} shards ({size_text(plan.total_bytes)}, "
        f"{size_text(cached)} cached) with {threads} threads, up to {deadline:g} s")
    cap = st.prefetch_max_mib_s * MIB or None
    read, found, done, errors, timed_out, _ = read_shards(plan.shards, threads=threads,
                                                   deadline_s=max(0.0, deadline - (clock() - t0)),
                                                   max_bytes_s=cap, clock=clock, sleep=sleep)
    outcome = "deadline" if timed_out else "failed" if errors else "done"
    common.update(cached_bytes=cached + found, need_bytes=need - found)
    return Prefetch(outcome, read_bytes=read, shards_done=done, seconds=clock() - t0, errors=tuple(errors), **common)
