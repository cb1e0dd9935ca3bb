#!/usr/bin/env python3
"""Figures for issue #38: memory of the quality tier's dataset reader, and time of a hostile ``pattern``.

Memory: each scenario runs in its own child process (its peak RSS, ``VmHWM``, KiB -> MiB), which loads a
dataset with :func:`kimi_deploy.check.quality.dataset.load` and reads every drawn case as the send pass does:

- ``100 MB line, default cap``: one 100 MB line (over the 16 MiB line cap: skipped unread) and one small line;
- ``100 MB line, cap raised``: the same with ``--max-dataset-line-bytes 128M`` (the line parsed once, in the
  reading pass, and again when sent: the cost of a line that big);
- ``--sample 400 of a 340 KB line``: 400 cases drawn from a one-line 340 KB file (read and parsed one at a time).

Time: ``^(a+)+$`` against ``a`` x N + ``!`` in Python's ``re`` (what ``jsonschema`` ran; exponential: N = 24 only)
and in :func:`kimi_deploy.check.schemas.search` (RE2) at N = 40 and 8 MiB; the lookahead pattern
``^(?=a)(a|aa)+$`` (RE2 refuses it) in ``regex`` under the per-match timeout (its overshoot on this host).

Usage: ``python benchmarks/bench_dataset_bounds.py`` (about a minute and 1.5 GB of /tmp on a 2-core host).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The child's own peak RSS (KiB): ``VmHWM`` of its memory map. ``ru_maxrss`` would also hold this process's RSS
#: at fork (Linux folds the old memory map's peak into it at exec), and this process builds 100 MB strings.
PEAK = "int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"

CHILD = f"""
import sys
from kimi_deploy.check.quality import dataset
d = dataset.load(sys.argv[1], sample=int(sys.argv[2]), max_line_bytes=int(sys.argv[3]))
with d.reader() as r:
    for case in d.sample():
        body = r.request(case).body
        del body
print({PEAK})
"""

BASELINE = f"""
from kimi_deploy.check.quality import dataset
print({PEAK})
"""


def _line(chars: int) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "x" * chars}],
                       "tools": [{"type": "function", "function": {"name": "t", "parameters": {
                           "type": "object", "properties": {"x": {"type": "string"}}}}}]})


def _rss(args: list[str], script: str = CHILD) -> float:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO,
                          check=True)
    return int(done.stdout.split()[-1]) / 1024


def memory() -> None:
    print("memory (peak RSS of a child process, VmHWM, MiB)")
    print(f"  {'import only':<40} {_rss([], BASELINE):8.0f}")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.jsonl"
        big.write_text(_line(100 << 20) + "\n" + _line(10) + "\n")
        print(f"  {'100 MB line, default cap (16 MiB)':<40} {_rss([str(big), '1', str(16 << 20)]):8.0f}")
        print(f"  {'100 MB line, cap raised to 128 MiB':<40} {_rss([str(big), '1', str(128 << 20)]):8.0f}")
        mid = Path(tmp) / "mid.jsonl"
        mid.write_text(_line(340 << 10) + "\n")
        print(f"  {'--sample 400 of a 340 KB line':<40} {_rss([str(mid), '400', str(16 << 20)]):8.0f}")


def regexes() -> None:
    from kimi_deploy.check import schemas

    print("time of one match (s)")
    t = time.perf_counter()
    re.search(r"^(a+)+$", "a" * 24 + "!")
    print(f"  {'re ^(a+)+$, n=24':<40} {time.perf_counter() - t:8.3f}   (x2 per extra a: n=40 ~ days)")
    for n in (40, 8 << 20):
        t = time.perf_counter()
        schemas.search(r"^(a+)+$", "a" * n + "!")
        print(f"  {f'RE2 ^(a+)+$, n={n}':<40} {time.perf_counter() - t:8.3f}")
    for i in range(3):
        t = time.perf_counter()
        try:
            schemas.search(rf"^(?=a)(a|aa)+$(?#{i})", "a" * 90 + "!")
        except schemas.PatternTimeout:
            pass
        print(f"  {f'regex lookahead, timeout {schemas.PATTERN_TIMEOUT_S} s (try {i + 1})':<40} "
              f"{time.perf_counter() - t:8.3f}")


if __name__ == "__main__":
    memory()
    regexes()
