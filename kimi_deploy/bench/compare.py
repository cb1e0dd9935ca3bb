"""``bench compare``: ratios of several results against the first, as a table and a PNG plot.

Points are matched by concurrency (closed loop) or request rate (open loop). For every
point of the baseline (the first file) and every other result, the ratio other/baseline of
median TPOT, median TTFT, median E2E (lower is better) and output tokens/s (higher is
better). The plot (matplotlib, Agg backend) has two panels, output tokens/s vs concurrency
and median TPOT vs concurrency, one line per result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kimi_deploy.errors import UsageError

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
        UsageError: fewer than two results, or results of different load modes.
    """
    if len(results) < 2:
        raise UsageError("compare needs at least two results", value=len(results),
                         hint="kimi-deploy bench compare BASELINE.json OTHER.json [...]")
    modes = {r["config"]["mode"] for r in results}
    if len(modes) > 1:
        raise UsageError("the results mix closed-loop and open-loop runs", value=", ".join(sorted(modes)),
                         hint="compare concurrency sweeps with concurrency sweeps, rates with rates")
    labels = _labels(results)
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
    return Comparison(labels=labels, rows=rows, warnings=_unequal_work(results, labels))


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

    table = Table(title=f"ratios vs {cmp.labels[0]}  (TPOT/TTFT/E2E: < 1 is faster; out tok/s: > 1 is more)")
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
        table.add_row(f"{row.x:g}", row.label, *cells)
    return table


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    """Write the PNG: output tokens/s and median TPOT against concurrency (or rate), one line per result.

    Raises:
        UsageError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kimi_deploy.fsio import write_atomic

    labels = _labels(results)
    fig, (ax_tput, ax_tpot) = plt.subplots(1, 2, figsize=(12, 4.8))
    axis = "concurrency"
    for label, result in zip(labels, results):
        pts = sorted(result["points"], key=lambda p: _x(p)[1])
        if not pts:
            continue
        axis = _x(pts[0])[0]
        xs = [_x(p)[1] for p in pts]
        ax_tput.plot(xs, [p["summary"]["output_tokens_per_s"] or float("nan") for p in pts], marker="o", label=label)
        ax_tpot.plot(xs, [_value(p["summary"], "tpot_ms") or float("nan") for p in pts], marker="o", label=label)
    xlabel = "concurrency (closed loop)" if axis == "concurrency" else "request rate (req/s, open loop)"
    for ax, ylabel, title in ((ax_tput, "output tokens/s", "Throughput"),
                              (ax_tpot, "TPOT p50 (ms)", "Time per output token")):
        if axis == "concurrency":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    model = results[0].get("model", "")
    fig.suptitle(f"kimi-deploy bench compare: {model}  (max_tokens {results[0]['config']['max_tokens']})")
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(Path(path), buf.getvalue())
    return Path(path)
