"""The search: which candidate to measure next, as a pure function of what was measured (resumable by design).

**Why not a grid, and why not successive halving.** On the reference host a candidate costs a restart, a cold start
of ~9.5 minutes (docs/runbook.md#tune-a-host), against ~1 minute of benchmark: the cost of a search is its
restarts. A grid restarts once per point of the space (4 x 2 x 3 x 4 = 96 points: 15 hours). Successive halving
saves *measurement* time by measuring everyone briefly and the best longer, but every re-measurement of a candidate
that is not running is one more restart: it spends more restarts than the grid it prunes (benchmarks/tune_search.py
measures all three). What saves restarts is visiting fewer points.

**Coordinate descent with noise-aware acceptance** (:class:`CoordinateDescent`, the default): start at the running
configuration (the baseline, measured without a restart); for each dimension in the options table's visiting order,
measure the incumbent's neighbours along it (every other value of that key, the rest held); the best by median
goodput replaces the incumbent. When the two are closer than noise (their bench runs' ranges overlap:
:func:`kimi_deploy.bench.abtest.judge_metric`, the rule ``bench compare`` uses), both are re-measured, up to
``remeasure`` more times, before the higher pooled median is taken. A pass over all dimensions that changes nothing
ends the descent (at most ``passes``). Then the **finalists** (the ``finalists`` best measured, the baseline always
among them) are deployed and measured once more, interleaved, and the winner is the best pooled median; its verdict
against the baseline (better beyond noise, or not distinguishable) decides what ``--apply`` keeps. Cost: one pass is
sum(len(values) - 1) restarts (7 for the table's 4 x 2 x 3 x 4 space) where the grid needs their product (96).
Interactions between dimensions are caught by the next pass, not by a model.

:class:`Grid` and :class:`RandomSearch` measure every point once (in space order, or a seeded random order) and
:class:`SuccessiveHalving` measures every point, then the better half again, and so on: they exist for the benchmark.

Every strategy is written as straight-line code over :class:`Evidence`; asking for a measurement not yet made raises
:class:`Need`, which the runner (:mod:`kimi_deploy.tune.run`) or the benchmark answers by measuring, then it asks the
strategy again from the start. The strategy holds no state: after a kill it takes the same decisions from the
journal's finished rows and asks for the first measurement that is missing.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_deploy.bench.abtest import judge_metric
from kimi_deploy.tune.space import Candidate, Dimension

#: Strategies by ``--method`` name.
METHODS = ("descent", "grid", "random", "halving")


class Need(Exception):
    """The strategy needs measurement number ``n`` (1-based) of ``candidate`` (an id); ``why`` says what for."""

    def __init__(self, candidate: str, n: int, why: str) -> None:
        super().__init__(f"{candidate} #{n}: {why}")
        self.candidate, self.n, self.why = candidate, n, why


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What was measured: candidate id -> the goodput runs of each finished measurement (``None`` for one whose gate
    or start failed: the candidate is out). ``pruned``: ids never started. ``live``: the id the host runs now."""

    runs: Mapping[str, Sequence[Sequence[float] | None]]
    pruned: frozenset[str] = frozenset()
    live: str | None = None

    def count(self, cid: str) -> int:
        return len(self.runs.get(cid, ()))

    def rejected(self, cid: str) -> bool:
        return cid in self.pruned or any(r is None for r in self.runs.get(cid, ()))

    def pooled(self, cid: str) -> list[float]:
        return [x for r in self.runs.get(cid, ()) if r is not None for x in r]

    def median(self, cid: str) -> float:
        runs = self.pooled(cid)
        return statistics.median(runs) if runs else float("-inf")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The strategy's answer: the ``winner`` id (``None``: nothing passed), the ``finalists`` (ids, best first),
    the ``path`` of incumbents, ``verdict`` of the winner against the baseline (``better beyond noise``,
    ``not distinguishable``, ``worse beyond noise``, ``too few runs``, ``baseline``), ``complete``: False when the
    budget ended it early (the best measured so far)."""

    winner: str | None
    finalists: tuple[str, ...]
    path: tuple[str, ...]
    verdict: str
    complete: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Strategy:
    """Base: ``dims``, the candidates by id (``space``: every point; the baseline's id), the evidence."""

    name = "base"

    def __init__(self, dims: Sequence[Dimension], space: Sequence[Candidate], baseline: Candidate, *,
                 finalists: int = 3, remeasure: int = 2, passes: int = 3, seed: int = 0,
                 end_on_best: bool = False) -> None:
        self.dims = tuple(dims)
        self.space = {c.id: c for c in space}
        self.order = [c.id for c in space]
        self.baseline = baseline.id
        self.n_finalists = finalists
        self.remeasure = remeasure
        self.passes = passes
        self.seed = seed
        self.end_on_best = end_on_best

    # -- helpers over the evidence --------------------------------------------------------------------------
    # Every judgment reads only the measurements the strategy asked for so far in this replay (``used``): a
    # later measurement (a finalist round, a re-measurement) never changes a decision taken before it, so a replay
    # after a kill takes exactly the decisions the killed run took.
    def start(self) -> None:
        self.used: dict[str, int] = {}

    def ensure(self, ev: Evidence, cid: str, n: int, why: str) -> None:
        """Raise :class:`Need` unless ``cid`` has ``n`` finished measurements (or is out)."""
        if cid in ev.pruned:
            return
        have = ev.count(cid)
        if have < n and not self.rejected(ev, cid, have):
            raise Need(cid, have + 1, why)
        self.used[cid] = max(self.used.get(cid, 0), min(n, have))

    def rejected(self, ev: Evidence, cid: str, upto: int | None = None) -> bool:
        n = self.used.get(cid, 0) if upto is None else upto
        return cid in ev.pruned or any(r is None for r in list(ev.runs.get(cid, ()))[:n])

    def pooled(self, ev: Evidence, cid: str) -> list[float]:
        n = self.used.get(cid, 0)
        return [x for r in list(ev.runs.get(cid, ()))[:n] if r is not None for x in r]

    def median(self, ev: Evidence, cid: str) -> float:
        runs = self.pooled(ev, cid)
        return statistics.median(runs) if runs else float("-inf")

    def ensure_pair(self, ev: Evidence, a: str, b: str, n: int, why: str) -> None:
        """:meth:`ensure` both, the live one first (its measurement costs no restart)."""
        for cid in sorted((a, b), key=lambda c: c != ev.live):
            self.ensure(ev, cid, n, why)

    def alive(self, ev: Evidence, ids: Sequence[str]) -> list[str]:
        return [c for c in ids if self.used.get(c) and not self.rejected(ev, c)]

    def best(self, ev: Evidence, ids: Sequence[str]) -> str | None:
        alive = self.alive(ev, ids)
        return max(alive, key=lambda c: (self.median(ev, c), c == self.baseline)) if alive else None

    def judge(self, ev: Evidence, base: str, other: str) -> str:
        return judge_metric("goodput", self.pooled(ev, base), self.pooled(ev, other), lower_is_better=False).verdict

    def finish(self, ev: Evidence, ranked: Sequence[str], path: Sequence[str], notes: Sequence[str] = ()) -> Outcome:
        """Re-measure the finalists (the best ``finalists`` of ``ranked`` and the baseline), each once more than the
        search had measured it, then rank them by pooled median. The order saves the restarts it can: the one running
        first, and last the one the end keeps running (``end_on_best``: the best so far, as ``--apply`` will likely
        keep it; else the baseline, which the end puts back)."""
        finalists = list(dict.fromkeys([*self.alive(ev, ranked)[:self.n_finalists], self.baseline]))
        targets = {c: self.used.get(c, 0) + 1 for c in finalists}
        last = finalists[0] if self.end_on_best else self.baseline
        order = sorted(finalists, key=lambda c: (c == last, c != ev.live))
        for cid in order:
            self.ensure(ev, cid, targets[cid], "finalist, measured again")
        return self.conclude(ev, finalists, path, complete=True, notes=notes)

    def conclude(self, ev: Evidence, ids: Sequence[str], path: Sequence[str], *, complete: bool,
                 notes: Sequence[str] = ()) -> Outcome:
        alive = sorted(self.alive(ev, list(dict.fromkeys(ids))),
                       key=lambda c: (self.median(ev, c), c == self.baseline), reverse=True)
        winner = alive[0] if alive else None
        if winner is None:
            verdict = "nothing passed"
        elif winner == self.baseline:
            verdict = "baseline"
        else:
            verdict = self.judge(ev, self.baseline, winner) if self.used.get(self.baseline) else "too few runs"
        return Outcome(winner, tuple(alive), tuple(path), verdict, complete, tuple(notes))

    def best_so_far(self, ev: Evidence, path: Sequence[str] = ()) -> Outcome:
        """The outcome when the budget ends the search: the best measured, on every measurement made (no finalist
        round)."""
        self.used = {c: ev.count(c) for c in self.order if ev.count(c)}
        return self.conclude(ev, list(self.used), path or (self.baseline,), complete=False,
                             notes=("the budget ended the search before it finished: the winner is the best "
                                    "measured so far, not re-measured",))

    def run(self, ev: Evidence) -> Outcome:
        """The outcome, or :class:`Need` raised for the first measurement missing."""
        self.start()
        return self.search(ev)

    def search(self, ev: Evidence) -> Outcome:  # pragma: no cover - abstract
        raise NotImplementedError


class CoordinateDescent(Strategy):
    """The default (module docstring)."""

    name = "descent"

    def neighbours(self, inc: Candidate, dim: Dimension) -> list[str]:
        out = []
        for value in dim.values:
            if value == inc.as_dict()[dim.key]:
                continue
            values = tuple((k, value if k == dim.key else v) for k, v in inc.values)
            out.append(Candidate(values).id)
        return [c for c in out if c in self.space]

    def search(self, ev: Evidence) -> Outcome:
        inc = self.baseline
        path = [inc]
        notes: list[str] = []
        self.ensure(ev, inc, 1, "the baseline: the configuration running now")
        for pass_no in range(1, self.passes + 1):
            changed = False
            for dim in self.dims:
                near = [c for c in self.neighbours(self.space[inc], dim) if c not in ev.pruned]
                for cid in sorted(near, key=lambda c: c != ev.live):
                    self.ensure(ev, cid, max(1, self.used.get(cid, 0)), f"pass {pass_no}, {dim.key}")
                best = self.best(ev, [inc, *near])
                if best is None or best == inc:
                    continue
                n = max(self.used.get(inc, 0), self.used.get(best, 0))
                verdict = self.judge(ev, inc, best)
                while verdict in ("not distinguishable", "too few runs") and n < 1 + self.remeasure \
                        and not self.rejected(ev, best) and not self.rejected(ev, inc):
                    n += 1
                    self.ensure_pair(ev, inc, best, n, f"pass {pass_no}, {dim.key}: closer than noise, measured again")
                    verdict = self.judge(ev, inc, best)
                if self.rejected(ev, best) or self.rejected(ev, inc):
                    inc = inc if not self.rejected(ev, inc) else best
                    continue
                if self.median(ev, best) > self.median(ev, inc):
                    if verdict != "better beyond noise":
                        notes.append(f"{dim.key}: {self.space[best].label(self.space[inc].as_dict())} taken on its "
                                     f"pooled median; {verdict} after {n} measurements")
                    inc = best
                    path.append(inc)
                    changed = True
            if not changed:
                break
        ranked = sorted(self.alive(ev, self.order), key=lambda c: self.median(ev, c), reverse=True)
        return self.finish(ev, list(dict.fromkeys([inc, *ranked])), path, notes)


class Grid(Strategy):
    """Every candidate once, in space order; the best pooled median wins (no finalist round)."""

    name = "grid"

    def visit_order(self) -> list[str]:
        return list(self.order)

    def search(self, ev: Evidence) -> Outcome:
        for cid in self.visit_order():
            if cid not in ev.pruned:
                self.ensure(ev, cid, 1, f"{self.name}: every candidate once")
        return self.conclude(ev, self.order, [self.baseline], complete=True)


class RandomSearch(Grid):
    """Every candidate once, in a seeded random order (the baseline first, as it is running)."""

    name = "random"

    def visit_order(self) -> list[str]:
        rest = [c for c in self.order if c != self.baseline]
        random.Random(self.seed).shuffle(rest)
        return [self.baseline, *rest]


class SuccessiveHalving(Strategy):
    """Every candidate once, then the better half again, and so on down to the finalists (Jamieson & Talwalkar,
    2016): each rung is a re-measurement, and on a host each is a restart."""

    name = "halving"

    def search(self, ev: Evidence) -> Outcome:
        alive = [c for c in self.order if c not in ev.pruned]
        rung = 1
        while True:
            for cid in alive:
                self.ensure(ev, cid, rung, f"halving rung {rung}")
            alive = [c for c in alive if not self.rejected(ev, c)]
            alive.sort(key=lambda c: self.median(ev, c), reverse=True)
            if len(alive) <= self.n_finalists:
                return self.conclude(ev, alive, [self.baseline], complete=True)
            alive = alive[:max(self.n_finalists, len(alive) // 2)]
            rung += 1


def strategy(method: str, dims: Sequence[Dimension], space: Sequence[Candidate], baseline: Candidate,
             **kw: Any) -> Strategy:
    """The strategy named ``method`` (one of :data:`METHODS`)."""
    kinds = {"descent": CoordinateDescent, "grid": Grid, "random": RandomSearch, "halving": SuccessiveHalving}
    return kinds[method](dims, space, baseline, **kw)


def next_step(strat: Strategy, ev: Evidence) -> Outcome | Need:
    """The outcome, or the next measurement the strategy needs."""
    try:
        return strat.run(ev)
    except Need as need:
        return need
