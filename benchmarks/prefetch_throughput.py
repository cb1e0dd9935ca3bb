#!/usr/bin/env python3
"""Throughput of the weights prefetch (``kimi-deploy prefetch``, :mod:`kimi_deploy.host.prefetch`) from a cold page
cache, against ``cat`` and a single reader.

A synthetic sharded checkpoint (``--shards`` files of ``--shard-mib`` MiB of random bytes and a
``model.safetensors.index.json``; 8 x 512 MiB = 4 GiB by default) is written into a fresh folder under ``$TMPDIR``
and deleted at the end. Before every run the shards are made cold: ``fsync`` then ``POSIX_FADV_DONTNEED`` on each
file (their pages are clean, so the kernel drops them), or with ``--drop-caches`` the whole page cache
(``echo 3 > /proc/sys/vm/drop_caches``, root only: it also drops every other program's cache on the machine). The
residency is read back with ``mincore(2)`` (as root it answers truthfully) and printed: a run that did not start
cold says so.

Readers, each ``--runs`` times, taking turns so that a change of load falls on all alike:

- ``cat``: ``cat SHARD... > /dev/null``, one process reading the shards one after the other;
- ``single``: the kit's reader with one thread (:func:`kimi_deploy.host.prefetch.read_shards`);
- ``prefetch-N``: the kit's reader with N threads (``--threads``, default 2, 4, 8; the unit's default is 8).

Per reader: the median seconds and GiB/s over the runs, and min-max. The disk and file system under ``$TMPDIR`` are
printed first (``findmnt``, ``/sys/block/*/queue/rotational``). ``--json PATH`` writes the figures.

Usage::

    PYTHONPATH=. python benchmarks/prefetch_throughput.py                  # ~2 min on the 2-core machine
    PYTHONPATH=. python benchmarks/prefetch_throughput.py --shards 4 --shard-mib 256 --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kimi_deploy.host.prefetch import Shard, read_shards, resident_bytes

MIB = 1024**2
GIB = 1024**3


def disk_of(folder: Path) -> dict[str, str]:
    """The device and file system ``folder`` lives on, and whether the kernel calls it rotational."""
    out = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "-T", str(folder)], capture_output=True, text=True)
    source, _, fstype = out.stdout.strip().partition(" ")
    name = Path(source).name.rstrip("0123456789") if source.startswith("/dev/") else source
    rotational = Path(f"/sys/block/{name}/queue/rotational")
    model = Path(f"/sys/block/{name}/device/model")
    return {"source": source, "fstype": fstype.strip(),
            "rotational": rotational.read_text().strip() if rotational.exists() else "unknown",
            "model": model.read_text().strip() if model.exists() else "unknown (a virtual disk?)"}


def write_checkpoint(folder: Path, shards: int, shard_mib: int) -> list[Path]:
    """``shards`` files of random bytes (one 64 MiB random block per file, repeated with a per-MiB stamp, so no
    two MiB are alike) and an index naming them."""
    folder.mkdir()
    block = bytearray(os.urandom(64 * MIB))
    files = []
    for i in range(1, shards + 1):
        path = folder / f"model-{i:05d}-of-{shards:05d}.safetensors"
        with path.open("wb") as fh:
            for mib in range(shard_mib):
                offset = (mib % 64) * MIB
                block[offset:offset + 8] = (i * 1_000_003 + mib).to_bytes(8, "little")
                fh.write(block[offset:offset + MIB])
        files.append(path)
    weight_map = {f"layers.{i}.w": p.name for i, p in enumerate(files)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def make_cold(files: list[Path], drop_caches: bool) -> int:
    """Drop ``files`` from the page cache; returns the bytes still resident (``-1``: unknown)."""
    if drop_caches:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    else:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    total = 0
    for path in files:
        got = resident_bytes(str(path), path.stat().st_size)
        if got is None:
            return -1
        total += got
    return total


def run_cat(files: list[Path]) -> float:
    start = time.monotonic()
    with open(os.devnull, "wb") as sink:
        subprocess.run(["cat", *map(str, files)], stdout=sink, check=True)
    return time.monotonic() - start


def run_kit(files: list[Path], threads: int) -> float:
    shards = [Shard("model", str(p), p.stat().st_size) for p in files]
    start = time.monotonic()
    read, _found, done, errors, timed_out, _ = read_shards(shards, threads=threads, deadline_s=3600)
    assert not errors and not timed_out and done == len(shards), (errors, timed_out, done)
    assert read == sum(s.size for s in shards), (read, "the shards were not cold")
    return time.monotonic() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mib", type=int, default=512)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", default="2,4,8", help="thread counts of the kit's reader, comma-separated")
    parser.add_argument("--drop-caches", action="store_true", help="drop the whole page cache (root) before each run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("note: not root: mincore(2) may not tell the truth about residency; the cold check may say -1")
    folder = Path(tempfile.mkdtemp(prefix="kimi-prefetch-bench-"))
    try:
        disk = disk_of(folder)
        print(f"disk: {disk['source']} ({disk['fstype']}), rotational={disk['rotational']}, model {disk['model']}; "
              f"folder {folder}")
        start = time.monotonic()
        files = write_checkpoint(folder / "ckpt", args.shards, args.shard_mib)
        total = sum(p.stat().st_size for p in files)
        print(f"wrote {len(files)} shards, {total / GIB:.2f} GiB in {time.monotonic() - start:.1f} s")
        readers = {"cat": run_cat, "single": lambda f: run_kit(f, 1),
                   **{f"prefetch-{n}": (lambda f, n=n: run_kit(f, n)) for n in map(int, args.threads.split(","))}}
        times: dict[str, list[float]] = {name: [] for name in readers}
        for run in range(args.runs):
            for name, reader in readers.items():
                left = make_cold(files, args.drop_caches)
                if left != 0:
                    print(f"  run {run + 1} {name}: not cold ({left} bytes resident before it)")
                seconds = reader(files)
                times[name].append(seconds)
                print(f"  run {run + 1} {name:<12} {seconds:6.2f} s  {total / GIB / seconds:6.2f} GiB/s")
        print(f"\n{'reader':<12} {'median s':>9} {'GiB/s':>7} {'min-max GiB/s':>15}")
        figures = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            figures[name] = {"seconds": ts, "median_s": med, "gib_s": total / GIB / med}
            print(f"{name:<12} {med:9.2f} {total / GIB / med:7.2f} "
                  f"{total / GIB / max(ts):7.2f}-{total / GIB / min(ts):.2f}")
        if args.json:
            args.json.write_text(json.dumps({"disk": disk, "bytes": total, "shards": len(files),
                                             "cold": "drop_caches" if args.drop_caches else "fadvise_dontneed",
                                             "readers": figures}, indent=1))
    finally:
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
