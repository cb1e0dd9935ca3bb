#!/usr/bin/env python3
"""CPU cost of whole ``kimi-deploy`` processes: what a verb costs to start, print and exit, against ``--version``.

Each command runs as a fresh ``python -m kimi_deploy`` process (whatever ``kimi_deploy`` is first on
``PYTHONPATH``: run it once per checkout) with stdout and stderr discarded, ``--runs`` times after one untimed
run that writes the bytecode cache (``PYTHONDONTWRITEBYTECODE`` is dropped from the children's environment: an
installed kit has its ``.pyc`` files, and compiling ~40 modules on every run would be charged to ``render``). The
commands take turns, one run each per round, so a change of load on the machine falls on all of them alike.

The figure is CPU time, user + system, of the child (``os.wait4``'s resource usage), not wall time: on a shared
machine it moves far less with the neighbours' load. Per command: the median, minimum and maximum CPU
milliseconds, the median wall milliseconds, and the ratio of the median CPU to ``--version``'s median CPU in
the same run (issue 24: ``render --print-command`` at most 1.5x).

Default commands: ``--version``, ``--help``, ``render --print-command`` of the reference preset and of a profile
file ``kimi-deploy init`` writes into a temporary folder, ``check --base-url 'http://[::1'`` (a usage error, exit
2), and the ``--help`` of ``status``, ``check`` and ``bench``. Then one reference row that is not a verb:
``python -c`` importing click and the profile models (pydantic), the part of ``render`` that a profile's
validation needs whatever the CLI does.

``--importtime`` prints, per command, the modules that took longest to import (``python -X importtime``,
cumulative microseconds): where start-up goes. ``--max-ratio R`` exits 1 when ``render --print-command``'s ratio
is above R. ``--json PATH`` writes the figures.

Usage::

    PYTHONPATH=. python benchmarks/startup.py                     # ~30 s on 2 cores
    PYTHONPATH=. python benchmarks/startup.py --runs 21 --max-ratio 1.5
    PYTHONPATH=. python benchmarks/startup.py --importtime -- render --preset kimi-k25-rtx-pro-6000-x8 --print-command
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "kimi-k25-rtx-pro-6000-x8"
#: Stands for the profile file ``init`` writes (replaced by its path when the commands run).
PROFILE = "PROFILE"
#: The label of the command every ratio is taken against.
BASELINE = ("--version",)
#: The commands whose ratio ``--max-ratio`` bounds.
PRINT_COMMANDS = (("render", "--preset", PRESET, "--print-command"),
                  ("render", "--profile", PROFILE, "--print-command"))

#: argv after ``kimi-deploy``.
DEFAULT_COMMANDS: tuple[tuple[str, ...], ...] = (
    BASELINE,
    ("--help",),
    *PRINT_COMMANDS,
    ("check", "--base-url", "http://[::1"),
    ("status", "--help"),
    ("check", "--help"),
    ("bench", "--help"),
)

#: Not a verb: what validating a profile costs in any process (click, pydantic, the profile models).
FLOOR = ("python -c 'import click, kimi_deploy.profile'", [sys.executable, "-c", "import click, kimi_deploy.profile"])


def child_env() -> dict[str, str]:
    """This environment, with bytecode caching on, a fixed terminal width and ``PYTHONPATH`` made absolute.

    The children run in a temporary folder: ``python -m`` and ``python -c`` put the working directory first on
    ``sys.path``, so from a checkout they would import its ``kimi_deploy`` whatever ``PYTHONPATH`` says.
    """
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


def run_once(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float, int]:
    """``(wall_s, cpu_s, exit_status)`` of one process run in ``cwd``; output discarded."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def measure(commands: dict[str, list[str]], runs: int, env: dict[str, str], cwd: Path) -> dict[str, dict]:
    """Per label: median/min/max CPU and median wall milliseconds over ``runs`` rounds (after one untimed round).

    One round runs every command once, in order, so that load changes during the run reach every command.
    """
    for argv in commands.values():
        run_once(argv, env, cwd)
    walls: dict[str, list[float]] = {label: [] for label in commands}
    cpus: dict[str, list[float]] = {label: [] for label in commands}
    codes: dict[str, set[int]] = {label: set() for label in commands}
    for _ in range(runs):
        for label, argv in commands.items():
            wall, cpu, code = run_once(argv, env, cwd)
            walls[label].append(wall * 1000)
            cpus[label].append(cpu * 1000)
            codes[label].add(code)
    return {label: {"cpu_median_ms": statistics.median(cpus[label]), "cpu_min_ms": min(cpus[label]),
                    "cpu_max_ms": max(cpus[label]), "wall_median_ms": statistics.median(walls[label]),
                    "runs": runs, "exit_status": sorted(codes[label])} for label in commands}


def import_costs(argv: list[str], env: dict[str, str], cwd: Path, top: int) -> list[tuple[int, str]]:
    """The ``top`` slowest imports (nesting depth <= 2) of one run, as ``(cumulative_us, module)``.

    Source of the format: CPython's ``-X importtime`` lines, ``import time: self | cumulative | name``
    with two spaces of indent per nesting level.
    """
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env,
                          cwd=cwd)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip(" "))) // 2
        if depth <= 2:
            rows.append((int(cumulative), "  " * max(depth - 1, 0) + name.strip()))
    return sorted(rows, reverse=True)[:top]


def write_profile(folder: Path, env: dict[str, str]) -> Path:
    """A profile file from ``kimi-deploy init`` (the reference preset) in ``folder``."""
    path = folder / "profile.toml"
    subprocess.run([sys.executable, "-m", "kimi_deploy", "init", str(path)], check=True, env=env, cwd=folder,
                   stdout=subprocess.DEVNULL)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command (default 11)")
    parser.add_argument("--max-ratio", type=float, default=None,
                        help="exit 1 if render --print-command's median CPU is above this times --version's")
    parser.add_argument("--importtime", action="store_true", help="also list the slowest imports per command")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write the figures here")
    parser.add_argument("command", nargs="*", help="one kimi-deploy command to time beside --version instead of "
                                                   "the defaults (after --)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    env = child_env()
    base = [sys.executable, "-m", "kimi_deploy"]
    chosen = [BASELINE, tuple(args.command)] if args.command else list(DEFAULT_COMMANDS)
    with tempfile.TemporaryDirectory(prefix="kimi-startup-") as tmp:
        profile = str(write_profile(Path(tmp), env))
        commands = {"kimi-deploy " + shlex.join(c): [*base, *(profile if a == PROFILE else a for a in c)]
                    for c in chosen}
        if not args.command:
            commands[FLOOR[0]] = FLOOR[1]
        load1 = os.getloadavg()[0]
        origin = subprocess.run([sys.executable, "-c", "import kimi_deploy; print(kimi_deploy.__file__)"], env=env,
                                cwd=tmp, capture_output=True, text=True).stdout.strip()
        print(f"kimi_deploy: {origin}")
        print(f"{' '.join(base)}  ({args.runs} rounds, load average {load1:.2f} at the start, {os.cpu_count()} CPUs; "
              f"PROFILE: a profile from `kimi-deploy init`)")
        figures = measure(commands, args.runs, env, Path(tmp))
        base_cpu = figures["kimi-deploy " + shlex.join(BASELINE)]["cpu_median_ms"]
        width = max(len(label) for label in commands)
        print(f"{'command':<{width}} {'cpu ms':>7} {'min':>6} {'max':>6} {'wall ms':>8} {'ratio':>6}")
        for label, argv in commands.items():
            row = figures[label]
            row["ratio"] = row["cpu_median_ms"] / base_cpu
            shown = label.replace(profile, "PROFILE")
            exit_note = f"  exit {row['exit_status']}" if row["exit_status"] != [0] else ""
            print(f"{shown:<{width}} {row['cpu_median_ms']:7.0f} {row['cpu_min_ms']:6.0f} {row['cpu_max_ms']:6.0f} "
                  f"{row['wall_median_ms']:8.0f} {row['ratio']:5.2f}x{exit_note}")
            if args.importtime:
                for cumulative, name in import_costs(argv, env, Path(tmp), top=8):
                    print(f"    {cumulative / 1000:7.1f} ms  {name}")
        load_end = os.getloadavg()[0]
        print(f"load average {load_end:.2f} at the end; ratio: median CPU over `kimi-deploy --version`'s")
        over = [label.replace(profile, "PROFILE") for label in commands
                if any(label == "kimi-deploy " + shlex.join(c) for c in PRINT_COMMANDS)
                and args.max_ratio is not None and figures[label]["ratio"] > args.max_ratio]
        if args.json_path:
            args.json_path.write_text(json.dumps({
                "load_average_1m": [load1, load_end], "cpus": os.cpu_count(),
                "figures": [{"command": label.replace(profile, "PROFILE"), **figures[label]} for label in commands],
            }, indent=2) + "\n")
    if over:
        print(f"above {args.max_ratio:g}x --version (median CPU): {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
