"""A/B verdicts for ``bench compare``: is a difference beyond run-to-run noise, did speculation get worse,
did the KV cache shrink.

Input: result dicts as ``kimi-deploy bench --runs K --json`` writes them (``points[].runs[].summary``, each
run's own summary; ``points[].runs[].spec_accept_length``; ``server.server_info``).

**The test** (stated, so an operator can redo it by hand): per point and metric, take each run's own figure
(the p50 of TPOT, TTFT, E2E within that run; its output tokens/s). The run-to-run spread of a side is
max - min over its runs, shown relative to its median. A difference is **beyond noise** only when the two
sides' [min, max] ranges do not overlap: every run of one side beat every run of the other. For m and n
runs that is a Mann-Whitney U of 0, whose exact one-sided p-value is 1 / C(m + n, m) (3 vs 3 runs: 0.05;
5 vs 5: 0.004): :func:`exact_p` gives it. Overlapping ranges are **not distinguishable**, however far the
medians are apart. With fewer than :data:`MIN_RUNS` runs on either side the verdict is **too few runs**:
one run has no spread, and 2 vs 2 cannot reach p 0.05 (1/6). No library is needed (scipy is not a
dependency of the kit).

**Speculative accept length** (SGLang's ``avg_spec_accept_length`` read after each run): an all-reduce
change must not change what the model computes, so a lower accept length is a correctness alarm, not a
speed result: it is raised when the other side's runs all lie below the baseline's (the same rule), or,
with fewer than :data:`MIN_RUNS` runs, when the drop exceeds :data:`ACCEPT_DROP_ALARM`.

**KV capacity**: ``max_total_num_tokens`` of the recorded ``/server_info`` (SGLang 0.5.23: the KV cache
size in tokens, from ``Scheduler.get_init_info``). Workspaces of fusion, symmetric memory or PCIe IPC take
GPU memory; a smaller KV cache changes high-concurrency results by itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

#: Runs per side below which no verdict is given.
MIN_RUNS = 3
#: Relative accept-length drop that raises the alarm when there are too few runs for the range rule.
ACCEPT_DROP_ALARM = 0.03

#: (summary key, label, lower is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("tpot_ms", "TPOT p50", True), ("ttft_ms", "TTFT p50", True), ("e2e_ms", "E2E p50", True),
    ("output_tokens_per_s", "out tok/s", False))

Verdict = Literal["better beyond noise", "worse beyond noise", "not distinguishable", "too few runs", "not measured"]


def _value(summary: dict[str, Any], key: str) -> float | None:
    v = summary.get(key)
    if isinstance(v, dict):
        v = v.get("p50")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def run_values(point: dict[str, Any], key: str) -> list[float]:
    """Each run's own figure of ``key`` at ``point`` (runs without a summary or a value are left out)."""
    out = []
    for run in point.get("runs") or []:
        if run.get("summary") and run["summary"].get("completed"):
            v = _value(run["summary"], key)
            if v is not None:
                out.append(v)
    return out


def exact_p(m: int, n: int) -> float:
    """One-sided exact p-value of a Mann-Whitney U of 0 with ``m`` and ``n`` samples: 1 / C(m + n, m)."""
    return 1.0 / math.comb(m + n, m)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclasses.dataclass(frozen=True)
class MetricVerdict:
    """One metric at one point: both sides' run values, spreads (relative to the median), the change of the
    medians (other / baseline - 1) and the verdict with its p-value when beyond noise."""

    metric: str
    base_runs: list[float]
    other_runs: list[float]
    base_spread: float | None
    other_spread: float | None
    change: float | None
    verdict: Verdict
    p_value: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def judge_metric(metric: str, base: list[float], other: list[float], lower_is_better: bool) -> MetricVerdict:
    """The verdict of one metric (pure; the rule is in the module docstring)."""
    def spread(xs: list[float]) -> float | None:
        med = _median(xs) if xs else 0.0
        return (max(xs) - min(xs)) / med if len(xs) > 1 and med else None

    change = _median(other) / _median(base) - 1 if base and other and _median(base) else None
    if not base or not other:
        return MetricVerdict(metric, base, other, spread(base), spread(other), change, "not measured", None)
    if min(len(base), len(other)) < MIN_RUNS:
        return MetricVerdict(metric, base, other, spread(base), spread(other), change, "too few runs", None)
    if max(other) < min(base) or min(other) > max(base):
        lower = max(other) < min(base)
        verdict: Verdict = "better beyond noise" if lower == lower_is_better else "worse beyond noise"
        return MetricVerdict(metric, base, other, spread(base), spread(other), change, verdict,
                             exact_p(len(base), len(other)))
    return MetricVerdict(metric, base, other, spread(base), spread(other), change, "not distinguishable", None)


@dataclasses.dataclass(frozen=True)
class PointVerdict:
    """Every metric of one result at one point against the baseline, and its accept-length alarm."""

    label: str
    point: str
    metrics: list[MetricVerdict]
    accept_base: list[float]
    accept_other: list[float]
    accept_alarm: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "point": self.point, "metrics": [m.to_dict() for m in self.metrics],
                "accept_base": self.accept_base, "accept_other": self.accept_other, "accept_alarm": self.accept_alarm}


def _accepts(point: dict[str, Any]) -> list[float]:
    vals = [r.get("spec_accept_length") for r in point.get("runs") or []]
    vals = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals and isinstance(point.get("spec_accept_length"), (int, float)):
        vals = [float(point["spec_accept_length"])]
    return vals


def accept_alarm(base: list[float], other: list[float], point: str, label: str, base_label: str) -> str | None:
    """The correctness alarm for a speculative accept-length drop at ``point``, or None."""
    if not base or not other:
        return None
    mb, mo = _median(base), _median(other)
    if min(len(base), len(other)) >= MIN_RUNS:
        dropped = max(other) < min(base)
        rule = f"every run below every {base_label} run"
    else:
        dropped = mb > 0 and (mb - mo) / mb > ACCEPT_DROP_ALARM
        rule = f"more than {ACCEPT_DROP_ALARM:.0%} lower, too few runs for the range rule"
    if not dropped:
        return None
    return (f"correctness alarm: {label} at {point}: speculative accept length {mo:.2f} vs {base_label}'s "
            f"{mb:.2f} ({rule}); an all-reduce change must not change what the model computes: check output "
            "quality (`kimi-deploy check`) before trusting any speed-up")


def _point_name(point: dict[str, Any]) -> str:
    if point.get("request_rate") is not None:
        return f"rate={float(point['request_rate']):g}/s"
    return f"c={point['concurrency']}"


def kv_capacity(result: dict[str, Any]) -> int | None:
    """``max_total_num_tokens`` of the recorded ``/server_info`` (KV cache size in tokens), or None."""
    info = (result.get("server") or {}).get("server_info")
    if isinstance(info, dict) and isinstance(info.get("decode"), list) and info["decode"]:
        info = info["decode"][0]  # a disaggregated router answers per role
    v = info.get("max_total_num_tokens") if isinstance(info, dict) else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


@dataclasses.dataclass(frozen=True)
class ABReport:
    """Every result against the baseline: per point verdicts, alarms, KV capacities (tokens, None unknown)."""

    labels: list[str]
    points: list[PointVerdict]
    kv_tokens: dict[str, int | None]
    alarms: list[str]
    notes: list[str]
    test: str

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "test": self.test, "kv_tokens": self.kv_tokens, "alarms": self.alarms,
                "notes": self.notes, "points": [p.to_dict() for p in self.points]}


TEST = (f"per point and metric, each run's own figure; beyond noise only when the sides' min-max ranges do not "
        f"overlap (Mann-Whitney U = 0, exact one-sided p = 1/C(m+n, m): 0.05 for 3 vs 3 runs); overlapping: not "
        f"distinguishable; fewer than {MIN_RUNS} runs a side: too few runs")


def ab(results: list[dict[str, Any]], labels: list[str]) -> ABReport:
    """The :class:`ABReport` of ``results[1:]`` against ``results[0]`` (``labels`` as ``bench compare`` names
    them)."""
    base = results[0]
    base_points = {_point_name(p): p for p in base["points"]}
    points, alarms, notes = [], [], []
    for label, result in zip(labels[1:], results[1:]):
        for p in result["points"]:
            name = _point_name(p)
            ref = base_points.get(name)
            if ref is None:
                continue
            metrics = [judge_metric(key, run_values(ref, key), run_values(p, key), lower)
                       for key, _, lower in METRICS]
            acc_b, acc_o = _accepts(ref), _accepts(p)
            alarm = accept_alarm(acc_b, acc_o, name, label, labels[0])
            if alarm:
                alarms.append(alarm)
            points.append(PointVerdict(label, name, metrics, acc_b, acc_o, alarm))
    kv = {label: kv_capacity(r) for label, r in zip(labels, results)}
    if kv[labels[0]]:
        for label in labels[1:]:
            if kv[label] and kv[label] != kv[labels[0]]:
                ratio = kv[label] / kv[labels[0]]
                notes.append(f"KV capacity differs: {label} holds {kv[label]:,} tokens, {ratio:.3f}x {labels[0]}'s "
                             f"{kv[labels[0]]:,} (max_total_num_tokens in /server_info): at high concurrency part of "
                             "any throughput difference is memory, not the all-reduce")
    if any(v is None for v in kv.values()):
        notes.append("KV capacity unknown for " + ", ".join(k for k, v in kv.items() if v is None)
                     + " (no max_total_num_tokens in the recorded /server_info)")
    few = sorted({label for label, r in zip(labels, results) if int(r["config"].get("runs") or 1) < MIN_RUNS})
    if few:
        notes.append(f"{', '.join(few)} measured fewer than {MIN_RUNS} runs per point: no verdict beyond noise "
                     f"is possible; rerun with --runs {MIN_RUNS} or more")
    return ABReport(labels, points, kv, alarms, notes, TEST)


def verdict_lines(report: ABReport) -> list[str]:
    """One line per result and point: each metric's verdict, the change of medians and both spreads."""
    labels = {key: label for key, label, _ in METRICS}
    lines = []
    for pv in report.points:
        parts = []
        for m in pv.metrics:
            if m.verdict == "not measured":
                continue
            change = f"{m.change:+.1%}" if m.change is not None else "?"
            spreads = "/".join("-" if s is None else f"{s:.1%}" for s in (m.base_spread, m.other_spread))
            p = f", p={m.p_value:.3g}" if m.p_value is not None else ""
            parts.append(f"{labels[m.metric]} {change} {m.verdict} (spread {spreads}{p})")
        lines.append(f"{pv.label} {pv.point}: " + ("; ".join(parts) or "no runs to compare"))
    return lines
