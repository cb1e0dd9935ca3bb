#!/usr/bin/env python3
"""Restarts each search needs to reach 95 % of the optimum: ``tune``'s descent against a grid, random search and
successive halving, on the same speed model, several seeds.

The model is tests/replay/speed_model.py (what the replay server of the end-to-end tests serves): goodput of a
closed loop at ``--concurrency`` over ``max_running_requests``, ``chunked_prefill_size`` (its planted value 2048
is the fastest and breaks tool calls: the gate rejects it, at the cost of its restart),
``enable_pcie_ipc_allreduce`` and ``mem_fraction_static`` (0.9 is pruned, as the memory plan prunes what cannot
fit). Each measurement is ``--runs`` bench runs with ``--noise`` relative run-to-run noise; a measurement of the
configuration already running costs no restart. The strategies are kimi_deploy.tune.search's own, driven as
kimi_deploy.tune.run drives them.

Per method: restarts until the best measured so far is truly within 95 % of the optimum ("to 95 %": known only in
hindsight, a grid or random search does not know it got there), restarts to finish, and the finished pick's true
goodput / the optimum ("final"), as median [min, max] over the seeds. ``random@N`` is random search stopped after
the descent's median number of restarts (``tune --method random --budget N``): the same cost, its result.
On a host multiply the restarts by the cold start (~9.5 min on the reference host: docs/runbook.md#tune-a-host).

    python benchmarks/tune_search.py --seeds 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "replay"))

import speed_model  # noqa: E402

from kimi_deploy.tune import search  # noqa: E402
from kimi_deploy.tune.space import Candidate, Dimension  # noqa: E402

#: In the options table's visiting order (kimi_deploy/options.py TUNABLES), the baseline value first.
SPACE = (
    Dimension("enable_pcie_ipc_allreduce", (False, True), False, ""),
    Dimension("max_running_requests", (48, 8, 16, 24, 32, 64), 48, ""),
    Dimension("chunked_prefill_size", (8192, 2048, 4096, 16384), 8192, ""),
    Dimension("mem_fraction_static", (0.85, 0.8, 0.88, 0.9), 0.85, ""),
)
PRUNED_VALUES = {("mem_fraction_static", 0.9)}


def truth(c: Candidate, args: argparse.Namespace) -> float:
    return speed_model.expected_goodput(speed_model.flags_for(c.as_dict()), concurrency=args.concurrency,
                                        chunks=args.chunks, slo_ttft_ms=args.slo_ttft, slo_step_ms=args.slo_step)


def planted(c: Candidate) -> bool:
    flags = speed_model.flags_for(c.as_dict())
    return flags.get(speed_model.PLANTED[0]) == speed_model.PLANTED[1]


def run(method: str, seed: int, args: argparse.Namespace, budget: int | None = None) -> dict[str, float]:
    dims = SPACE
    cands = [Candidate(tuple(zip((d.key for d in dims), combo)))
             for combo in __import__("itertools").product(*(d.values for d in dims))]
    by_id = {c.id: c for c in cands}
    base = Candidate(tuple((d.key, d.baseline) for d in dims))
    pruned = frozenset(c.id for c in cands if any((k, v) in PRUNED_VALUES for k, v in c.values))
    feasible = [c for c in cands if c.id not in pruned and not planted(c)]
    opt = max(truth(c, args) for c in feasible)
    strat = search.strategy(method, dims, cands, base, seed=seed)
    rng = random.Random(seed * 7919 + 1)
    runs: dict[str, list[list[float] | None]] = {}
    live, restarts, reached = base.id, 0, None
    while True:
        step = search.next_step(strat, search.Evidence(runs, pruned, live))
        if isinstance(step, search.Outcome):
            break
        cand = by_id[step.candidate]
        if step.candidate != live:
            if budget is not None and restarts >= budget:  # as tune --budget N: the best measured so far wins
                step = strat.best_so_far(search.Evidence(runs, pruned, live))
                break
            restarts += 1
        if planted(cand):
            runs.setdefault(cand.id, []).append(None)  # the gate rejects it; the previous version is rolled back
        else:
            flags = speed_model.flags_for(cand.as_dict())
            runs.setdefault(cand.id, []).append([
                speed_model.sample_goodput(flags, rng, args.noise, concurrency=args.concurrency, chunks=args.chunks,
                                           slo_ttft_ms=args.slo_ttft, slo_step_ms=args.slo_step)
                for _ in range(args.runs)])
            live = cand.id
        ev = search.Evidence(runs, pruned, live)
        measured = [c for c in runs if not ev.rejected(c)]
        if reached is None and measured and truth(by_id[max(measured, key=ev.median)], args) >= 0.95 * opt:
            reached = restarts
    final = truth(by_id[step.winner], args) / opt if step.winner else 0.0
    return {"to95": reached if reached is not None else float("nan"), "restarts": restarts, "final": final,
            "space": len(cands), "feasible": len(feasible)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--runs", type=int, default=3, help="bench runs per measurement")
    p.add_argument("--noise", type=float, default=0.04, help="relative run-to-run noise of goodput (Gaussian sd)")
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--chunks", type=int, default=20, help="decode steps per request")
    p.add_argument("--slo-ttft", type=float, default=400.0)
    p.add_argument("--slo-step", type=float, default=22.0)
    args = p.parse_args(argv)
    first = run("grid", 0, args)
    print(f"space: {first['space']} candidates, {first['feasible']} feasible (the rest pruned by memory or "
          f"rejected by the gate); {args.seeds} seeds, {args.runs} runs a measurement, noise {args.noise:.0%}")
    print(f"{'method':<10} {'restarts to 95 %':>22} {'restarts to finish':>22} {'final / optimum':>24}")
    descent = [run("descent", seed, args) for seed in range(args.seeds)]
    same = int(statistics.median(r["restarts"] for r in descent))
    for method in [*search.METHODS, f"random@{same}"]:
        if method == "descent":
            rows = descent
        elif "@" in method:  # random search given the descent's median restarts (tune --budget N)
            rows = [run("random", seed, args, budget=same) for seed in range(args.seeds)]
        else:
            rows = [run(method, seed, args) for seed in range(args.seeds)]

        def col(key: str, fmt: str) -> str:
            xs = [r[key] for r in rows if r[key] == r[key]]
            if not xs:
                return "never"
            return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}, {max(xs):{fmt}}]"

        never = sum(1 for r in rows if r["to95"] != r["to95"])
        miss = f" ({never} seeds never)" if never else ""
        print(f"{method:<10} {col('to95', '.0f') + miss:>22} {col('restarts', '.0f'):>22} {col('final', '.3f'):>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
