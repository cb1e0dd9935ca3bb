#!/usr/bin/env python3
"""Time whole ``kimi-deploy`` processes: how long a verb takes to start, print and exit.

Each command runs ``--runs`` times (after one untimed run that fills the bytecode cache) as a
fresh process with stdout and stderr discarded; the table gives, per command, the median,
minimum and maximum wall time and the median CPU time (user + system, from ``os.wait4``'s
resource usage: it moves less than wall time when other work shares the cores). The machine's
1-minute load average is printed first: the targets are for an idle machine.

Default commands: ``--help``, ``--version`` and ``render --preset kimi-k25-rtx-pro-6000-x8
--print-command`` (the targets of issue #12: at most 0.4 s wall each), and the ``--help`` of
``status``, ``check`` and ``bench`` (each imports its verb's module and nothing else).

``--importtime`` prints, per command, the modules that took longest to import (``python -X
importtime``, cumulative microseconds): where start-up goes. ``--max-s S`` exits 1 when a
command's median wall time is above S seconds. ``--json PATH`` writes the figures.

Usage::

    python benchmarks/startup.py                      # ~10 s
    python benchmarks/startup.py --runs 15 --max-s 0.4
    python benchmarks/startup.py --importtime -- render --preset kimi-k25-rtx-pro-6000-x8 --print-command
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

PRESET = "kimi-k25-rtx-pro-6000-x8"

#: (label, argv after ``kimi-deploy``); the first three carry the 0.4 s target.
DEFAULT_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("--version",),
    ("render", "--preset", PRESET, "--print-command"),
    ("status", "--help"),
    ("check", "--help"),
    ("bench", "--help"),
)


def kimi_deploy_argv() -> list[str]:
    """The console script installed beside this interpreter, else ``python -m kimi_deploy``."""
    script = Path(sys.executable).with_name("kimi-deploy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kimi_deploy"]


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """``(wall_s, cpu_s, exit_status)`` of one process; output discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def measure(argv: list[str], runs: int, env: dict[str, str]) -> dict:
    """Median/min/max wall and median CPU seconds over ``runs`` runs (after one untimed run)."""
    run_once(argv, env)
    walls, cpus, codes = [], [], set()
    for _ in range(runs):
        wall, cpu, code = run_once(argv, env)
        walls.append(wall)
        cpus.append(cpu)
        codes.add(code)
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "cpu_median_s": statistics.median(cpus), "runs": runs, "exit_status": sorted(codes)}


def import_costs(argv: list[str], env: dict[str, str], top: int) -> list[tuple[int, str]]:
    """The ``top`` slowest top-level imports of one run, as ``(cumulative_us, module)``.

    Source of the format: CPython's ``-X importtime`` lines, ``import time: self | cumulative | name``
    with two spaces of indent per nesting level.
    """
    if argv[0] == sys.executable:
        command = [sys.executable, "-X", "importtime", *argv[1:]]
    else:
        command = [sys.executable, "-X", "importtime", "-m", "kimi_deploy", *argv[1:]]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip(" "))) // 2
        if depth <= 2:
            rows.append((int(cumulative), "  " * max(depth - 1, 0) + name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="timed runs per command (default 9)")
    parser.add_argument("--max-s", type=float, default=None, help="exit 1 if a median wall time is above this")
    parser.add_argument("--importtime", action="store_true", help="also list the slowest imports per command")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write the figures here")
    parser.add_argument("command", nargs="*", help="one kimi-deploy command to time instead of the defaults "
                                                   "(after --)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    base = kimi_deploy_argv()
    env = {**os.environ, "COLUMNS": "100"}
    commands = [tuple(args.command)] if args.command else list(DEFAULT_COMMANDS)
    load1 = os.getloadavg()[0]
    print(f"{' '.join(base)}  ({args.runs} runs each, load average {load1:.2f}, {os.cpu_count()} CPUs)")
    print(f"{'command':<70} {'median':>7} {'min':>7} {'max':>7} {'cpu':>7}")
    figures, over = [], []
    for command in commands:
        argv = [*base, *command]
        row = measure(argv, args.runs, env)
        label = "kimi-deploy " + shlex.join(command)
        figures.append({"command": label, **row})
        print(f"{label:<70} {row['median_s']:7.3f} {row['min_s']:7.3f} {row['max_s']:7.3f} "
              f"{row['cpu_median_s']:7.3f}" + (f"  exit {row['exit_status']}" if row["exit_status"] != [0] else ""))
        if args.max_s is not None and row["median_s"] > args.max_s:
            over.append(label)
        if args.importtime:
            for cumulative, name in import_costs(argv, env, top=8):
                print(f"    {cumulative / 1e6:6.3f} s  {name}")
    if args.json_path:
        args.json_path.write_text(json.dumps({"load_average_1m": load1, "cpus": os.cpu_count(),
                                              "figures": figures}, indent=2) + "\n")
    if over:
        print(f"above {args.max_s:g} s (median): {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
