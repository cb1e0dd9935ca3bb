"""``bench compare``: ratios of several results against the first, as a table and a PNG plot.

Points are matched by concurrency (closed loop) or request rate (open loop). For every
point of the baseline (the first file) and every other result, the ratio other/baseline of
median TPOT, median TTFT, median E2E (lower is better) and output tokens/s (higher is
better). The plot (matplotlib, Agg backend; written only when asked for) has four panels,
output tokens/s and median TPOT, TTFT and E2E vs concurrency, one line per result, with the
run-to-run spread of ``--runs`` > 1 and the points that measured less load than they claim marked.

What would mislead is said, not drawn: :attr:`Comparison.warnings` names results that differ
in workload, share no point with the baseline (no ratio can be formed), measured a point the
other did not, or have points with no successful request. The plot labels only measured points (plain numbers, no offset or
scientific notation), starts both y axes at 0 so a sub-microsecond change draws flat, names every
result and model in its title, and leaves out (with a note) results with no successful request.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kimi_deploy.errors import UsageError
from kimi_deploy.wire.printable import markup
from kimi_deploy.fsio import write_atomic

METRICS = (("tpot_ms", "TPOT p50"), ("ttft_ms", "TTFT p50"), ("e2e_ms", "E2E p50"),
           ("output_tokens_per_s", "out tok/s"))


def _x(point: dict[str, Any]) -> tuple[str, float]:
    if point["request_rate"] is not None:
        return "rate", float(point["request_rate"])
    return "concurrency", float(point["concurrency"])


def _value(summary: dict[str, Any], key: str) -> float | None:
    v = summary.get(key)
    if isinstance(v, dict):
        return v.get("p50")
    return v


@dataclasses.dataclass(frozen=True)
class CompareRow:
    """One point of one result against the baseline: absolute values and ratios (``None``: not measured)."""

    label: str
    axis: str
    x: float
    values: dict[str, float | None]
    baseline: dict[str, float | None]
    ratios: dict[str, float | None]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The rows of ``bench compare``; ``labels[0]`` is the baseline."""

    labels: list[str]
    rows: list[CompareRow]
    warnings: list[str] = dataclasses.field(default_factory=list)
    plot: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare(results: list[dict[str, Any]]) -> Comparison:
    """Rows of ratios of ``results[1:]`` against ``results[0]`` (dicts as loaded by ``load_result``).

    Raises:
        UsageError: fewer than two results, results of different load modes, or a result that measured nothing
            (:func:`require_measurements`).
    """
    if len(results) < 2:
        raise UsageError("compare needs at least two results", value=len(results),
                         hint="kimi-deploy bench compare BASELINE.json OTHER.json [...]")
    modes = {r["config"]["mode"] for r in results}
    if len(modes) > 1:
        raise UsageError("the results mix closed-loop and open-loop runs", value=", ".join(sorted(modes)),
                         hint="compare concurrency sweeps with concurrency sweeps, rates with rates")
    labels = _labels(results)
    require_measurements(results, labels)
    base = {_x(p): p["summary"] for p in results[0]["points"]}
    rows = []
    for label, result in zip(labels[1:], results[1:]):
        for p in result["points"]:
            key = _x(p)
            ref = base.get(key)
            values = {m: _value(p["summary"], m) for m, _ in METRICS}
            refs = {m: (_value(ref, m) if ref else None) for m, _ in METRICS}
            ratios = {m: (values[m] / refs[m] if values[m] is not None and refs[m] else None) for m, _ in METRICS}
            rows.append(CompareRow(label=label, axis=key[0], x=key[1], values=values, baseline=refs, ratios=ratios))
    rows.sort(key=lambda r: (r.x, labels.index(r.label)))
    warnings = [f"not the same workload: {line}" for line in _unequal_work(results, labels)]
    warnings += _no_success(results, labels) + _no_shared_point(results, labels) + _unmatched_points(results, labels)
    return Comparison(labels=labels, rows=rows, warnings=warnings)


def _succeeded(point: dict[str, Any]) -> bool:
    return bool(point["summary"].get("completed"))


def _point_name(axis: str, x: float) -> str:
    return f"c={x:g}" if axis == "concurrency" else f"rate={x:g}/s"


def require_measurements(results: list[dict[str, Any]], labels: list[str]) -> None:
    """The rule of "nothing to compare": every result must hold a point with a successful request (a comparison
    against a run that measured nothing would print no ratio and exit 0, so a CI gate on it passed on no data).

    Raises:
        UsageError: a result without any successful request (exit 2), naming it.
    """
    empty = [label for label, r in zip(labels, results) if not any(_succeeded(p) for p in r["points"])]
    if empty:
        raise UsageError("nothing to compare: " + ", ".join(empty) + " measured nothing (no successful request "
                         "at any point)", value=", ".join(empty),
                         hint="read that run's error kinds (`kimi-deploy bench` prints them), fix the server, and "
                              "run the benchmark again")


def _no_success(results: list[dict[str, Any]], labels: list[str]) -> list[str]:
    out = []
    for label, r in zip(labels, results):
        failed = [_point_name(*_x(p)) for p in r["points"] if not _succeeded(p)]
        if failed:  # a result with no success at all is refused (require_measurements)
            out.append(f"{label}: no successful request at {', '.join(failed)}: no figures there")
    return out


def _no_shared_point(results: list[dict[str, Any]], labels: list[str]) -> list[str]:
    base = [_x(p) for p in results[0]["points"]]
    out = []
    for label, r in zip(labels[1:], results[1:]):
        mine = [_x(p) for p in r["points"]]
        if mine and base and not set(mine) & set(base):
            axis = mine[0][0]
            out.append(f"{label} shares no {axis} point with {labels[0]} ({labels[0]}: "
                       f"{', '.join(f'{x:g}' for _, x in base)}; {label}: {', '.join(f'{x:g}' for _, x in mine)}): "
                       "its rows show absolute values only, no ratios; rerun with the same points")
    return out


def _unmatched_points(results: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """Points measured by one side only, for results that share some points with the baseline (no
    shared point at all is :func:`_no_shared_point`'s warning)."""
    base = {_x(p) for p in results[0]["points"]}
    out = []
    for label, r in zip(labels[1:], results[1:]):
        mine = {_x(p) for p in r["points"]}
        if not mine & base:
            continue
        lacking = sorted(base - mine, key=lambda k: k[1])
        extra = sorted(mine - base, key=lambda k: k[1])
        if lacking:
            out.append(f"{label} has no {', '.join(_point_name(*k) for k in lacking)} (measured in {labels[0]}): "
                       "no row and no ratio there")
        if extra:
            out.append(f"{label} has {', '.join(_point_name(*k) for k in extra)}, which {labels[0]} lacks: "
                       "absolute values only, no ratio")
    return out


#: Settings that change the work a server does: results that differ in them do not compare equal work.
WORKLOAD_KEYS = ("max_tokens", "ignore_eos", "temperature", "extra_body", "seed")


def _unequal_work(results: list[dict[str, Any]], labels: list[str]) -> list[str]:
    out = []
    base = results[0]
    for label, r in zip(labels[1:], results[1:]):
        for key in WORKLOAD_KEYS:
            if r["config"].get(key) != base["config"].get(key):
                out.append(f"{label}: {key} {r['config'].get(key)!r} differs from {labels[0]}'s "
                           f"{base['config'].get(key)!r}")
        if r["dataset"]["sha256"] != base["dataset"]["sha256"]:
            out.append(f"{label}: prompts differ from {labels[0]}'s ({r['dataset']['name']} vs "
                       f"{base['dataset']['name']})")
    return out


def _labels(results: list[dict[str, Any]]) -> list[str]:
    labels: list[str] = []
    for i, r in enumerate(results):
        label = str(r.get("label") or f"run{i + 1}")
        labels.append(label if label not in labels else f"{label} ({i + 1})")
    return labels


def comparison_table(cmp: Comparison):
    """A rich Table: one line per point and result, each metric as ``ratio (value)``."""
    from rich.table import Table

    table = Table(title=f"ratios vs {markup(cmp.labels[0])}  (TPOT/TTFT/E2E: < 1 is faster; out tok/s: > 1 is more)")
    table.add_column(cmp.rows[0].axis if cmp.rows else "point", justify="right")
    table.add_column("result")
    for _, title in METRICS:
        table.add_column(title, justify="right")
    for row in cmp.rows:
        cells = []
        for m, _ in METRICS:
            ratio, value = row.ratios[m], row.values[m]
            if ratio is None:
                cells.append("-" if value is None else f"({value:,.1f})")
            else:
                better = ratio > 1 if m == "output_tokens_per_s" else ratio < 1
                color = "green" if better and abs(ratio - 1) >= 0.02 else ("red" if abs(ratio - 1) >= 0.02 else "")
                text = f"{ratio:.3f}x ({value:,.1f})"
                cells.append(f"[{color}]{text}[/]" if color else text)
        table.add_row(f"{row.x:g}", markup(row.label), *cells)
    return table


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    """Write :func:`figure` of ``results`` as a PNG to ``path`` (atomically).

    Raises:
        UsageError: the file cannot be written.
    """
    import io

    import matplotlib.pyplot as plt

    fig = figure(results)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(Path(path), buf.getvalue())
    return Path(path)


#: The plot's panels: (summary key, y label, title); the order of ``Figure.axes``.
PANELS = (("output_tokens_per_s", "output tokens/s", "Throughput"),
          ("tpot_ms", "TPOT p50 (ms)", "Time per output token"),
          ("ttft_ms", "TTFT p50 (ms)", "Time to first token"),
          ("e2e_ms", "E2E p50 (ms)", "End-to-end latency"))


#: Width (points) of the caps at both ends of a run-to-run spread bar: wider than a point's marker (matplotlib's
#: default ``lines.markersize``, 6 pt), so that a spread a few pixels tall (~1 % of the axis) still shows.
SPREAD_CAP_PT = 16


def under_load(point: dict[str, Any]) -> bool:
    """A closed-loop point given fewer prompts per run than its concurrency: it never had that many
    requests in flight, so it measured less load than it claims (``bench`` warns about it too)."""
    return point["request_rate"] is None and point["num_prompts"] < point["concurrency"]


def run_spread(point: dict[str, Any], key: str) -> tuple[float, float] | None:
    """(min, max) over the point's runs of each run's own p50 of ``key`` (its value for output tok/s);
    ``None`` with fewer than two runs that measured it."""
    values = [_value(r["summary"], key) for r in point.get("runs") or [] if r.get("summary")]
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if len(values) > 1 else None


def figure(results: list[dict[str, Any]]):
    """The matplotlib Figure: four panels (:data:`PANELS`: output tokens/s, median TPOT, TTFT and
    E2E) against concurrency (or rate), one line per result.

    x: the measured points only, labelled with their plain values (log2 scale for concurrency);
    y: from 0, plain numbers (no offset such as ``+1.9998e1``, no scientific notation). With
    ``--runs`` > 1 a vertical bar at each point spans the run-to-run spread (min to max of the
    runs' own figures), capped at both ends by a tick :data:`SPREAD_CAP_PT` wide (``gid`` ``spread-cap``), so that
    any non-zero spread is visible beside the point's marker; runs that agree exactly draw none. A point that
    measured less load than it claims (:func:`under_load`) is circled in red and named in a note under the plots. A result with no successful request is
    left out and named in the last note; a point with no successful request is a gap in its line.
    The title names every result with its model. The caller closes it (``matplotlib.pyplot.close``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, ScalarFormatter

    labels = _labels(results)
    fig, grid = plt.subplots(2, 2, figsize=(12, 9.5))
    axes = list(grid.flat)
    axis = _x(results[0]["points"][0])[0] if results[0]["points"] else "concurrency"
    xs_all: set[float] = set()
    tops = [0.0] * len(PANELS)
    left_out, thin = [], []
    for label, result in zip(labels, results):
        pts = sorted(result["points"], key=lambda p: _x(p)[1])
        if not any(_succeeded(p) for p in pts):
            left_out.append(label)
            continue
        xs = [_x(p)[1] for p in pts]
        xs_all.update(xs)
        failed = [_point_name(*_x(p)) for p in pts if not _succeeded(p)]
        name = f"{label} (no successful request at {', '.join(failed)})" if failed else label
        low = [p for p in pts if under_load(p) and _succeeded(p)]
        if low:
            thin.append(f"{label} at {', '.join(_point_name(*_x(p)) for p in low)}")
        for i, (ax, (key, _, _)) in enumerate(zip(axes, PANELS)):
            ys = [_value(p["summary"], key) if _succeeded(p) else None for p in pts]
            (line,) = ax.plot(xs, [float("nan") if v is None else v for v in ys], marker="o", label=name)
            tops[i] = max([tops[i], *(v for v in ys if v is not None)])
            for p, x in zip(pts, xs):
                spread = run_spread(p, key) if _succeeded(p) else None
                if spread and spread[1] > spread[0]:
                    ax.vlines(x, *spread, colors=line.get_color(), linewidth=4, alpha=0.35)
                    # caps wider than the point's marker: a spread of ~1 % is a few pixels, hidden under it
                    ax.scatter([x, x], spread, marker="_", s=SPREAD_CAP_PT ** 2, color=line.get_color(),
                               linewidths=1.5, zorder=3, gid="spread-cap")
                    tops[i] = max(tops[i], spread[1])
            marks = [(x, y) for p, x, y in zip(pts, xs, ys) if y is not None and under_load(p)]
            if marks:
                ax.scatter([m[0] for m in marks], [m[1] for m in marks], s=160, facecolors="none",
                           edgecolors="firebrick", linewidths=1.5, zorder=3)
    xlabel = "concurrency (closed loop)" if axis == "concurrency" else "request rate (req/s, open loop)"
    ticks = sorted(xs_all)
    for ax, (key, ylabel, title), top in zip(axes, PANELS, tops):
        if axis == "concurrency":
            ax.set_xscale("log", base=2)
        if ticks:
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.xaxis.set_minor_locator(NullLocator())
        plain = ScalarFormatter(useOffset=False)
        plain.set_scientific(False)
        ax.yaxis.set_major_formatter(plain)
        ax.set_ylim(0, top * 1.1 if top > 0 else 1)  # from 0, with headroom
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend()
    names = ", ".join(f"{label} [{r.get('model', '?')}]" for label, r in zip(labels, results))
    max_tokens = sorted({str(r["config"].get("max_tokens")) for r in results})
    runs = sorted({int(r["config"].get("runs") or 1) for r in results})
    spread_note = f"; bars: run-to-run spread, min to max of up to {max(runs)} runs" if max(runs) > 1 else ""
    fig.suptitle(f"kimi-deploy bench compare: {names}  (max_tokens {'/'.join(max_tokens)}{spread_note})")
    notes = []
    if thin:
        notes.append(("circled: fewer prompts than concurrency, so less load than the point claims: "
                      + "; ".join(thin), "firebrick"))
    if left_out:
        notes.append((f"not drawn (no successful request at any point): {', '.join(left_out)}", "firebrick"))
    for n, (text, color) in enumerate(notes):
        fig.text(0.5, 0.01 + 0.025 * (len(notes) - 1 - n), text, ha="center", color=color)
    fig.tight_layout(rect=(0, 0.025 * len(notes) + (0.01 if notes else 0), 1, 1))
    return fig
