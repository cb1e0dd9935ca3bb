"""What ``tune`` reports: the candidates' table, the Pareto set, the winner's profile diff, a plot, the commands that
reproduce the winner's measurement (:func:`build`), and the files it writes next to the journal
(:func:`write_outputs`: ``report.json``, ``winner.toml``, ``winner.diff``, ``tune.png``).

Goodput is requests/s meeting every SLO (``bench``'s ``goodput_requests_per_s``: a request counts when its TTFT,
TPOT/ITL and E2E are all within the ``--slo`` limits); its interval is [min, max] of the bench runs of every
measurement of the candidate (``bench compare``'s noise rule: two candidates whose intervals overlap are not
distinguishable). The **Pareto set** is the measured candidates no other beats on both goodput (higher) and the
p99 ITL (lower): the choice an operator has when latency matters more than the last request/s.
"""

from __future__ import annotations

import difflib
import io
import json
import shlex
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import fsio
from kimi_deploy.profile import Profile, dump_profile
from kimi_deploy.tune import journal as tj
from kimi_deploy.tune import space

REPORT_FILE = "report.json"
PLOT_FILE = "tune.png"
WINNER_FILE = "winner.toml"
DIFF_FILE = "winner.diff"


def _pq(dist: Any, q: str) -> float | None:
    return dist.get(q) if isinstance(dist, dict) else None


def point_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures kept per measurement from a bench point's pooled summary (ms; req/s)."""
    return {"goodput": summary.get("goodput_requests_per_s") or 0.0, "requests_per_s": summary.get("requests_per_s"),
            "errors": summary.get("errors"), "requests": summary.get("requests"),
            **{f"{key}_{q}": _pq(summary.get(f"{key}_ms"), q) for key in ("ttft", "itl", "tpot", "e2e")
               for q in ("p50", "p99")}}


def load_text(settings: Any) -> str:
    return (f"{settings.request_rate} req/s (Poisson)" if settings.request_rate
            else f"concurrency {settings.concurrency}")


def rows(journal: tj.TuneJournal, by_id: Mapping[str, space.Candidate], baseline: space.Candidate
         ) -> list[dict[str, Any]]:
    """One row per candidate that was pruned, refused or measured: values, verdict, goodput with its interval,
    TTFT/ITL p50/p99 (of its last measurement), measurements and restarts; best goodput first."""
    out = []
    base = baseline.as_dict()
    for cid, rec in journal.candidates.items():
        ms = [m for m in journal.finished() if m.candidate == cid]
        validation = rec.validation or {}
        if rec.pruned:
            verdict, detail = f"pruned ({rec.pruned['stage']})", "; ".join(rec.pruned["problems"])[:300]
        elif validation and not validation.get("ok"):
            verdict, detail = "refused by SGLang's parser", "; ".join(validation.get("errors", []))[:300]
        elif not ms:
            continue
        elif any(m.state == "rejected" for m in ms):
            bad = next(m for m in ms if m.state == "rejected")
            verdict, detail = f"rejected: {bad.failed_tier} gate", ", ".join(bad.failed_checks)
        elif any(m.state == "failed" for m in ms):
            bad = next(m for m in ms if m.state == "failed")
            verdict, detail = "failed", bad.error or bad.failed_tier or "did not start"
        else:
            verdict, detail = "passed", ""
        runs = [x for m in ms if m.state == "measured" for x in m.goodput_runs]
        last = next((m.summary for m in reversed(ms) if m.state == "measured"), {})
        cand = by_id.get(cid)
        out.append({"id": cid, "label": cand.label(base) if cand else cid, "values": rec.values, "verdict": verdict,
                    "detail": detail, "goodput": statistics.median(runs) if runs else None,
                    "goodput_interval": [min(runs), max(runs)] if runs else None, "runs": len(runs),
                    "measurements": len(ms), "restarts": sum(1 for m in ms if m.restarted),
                    **{k: last.get(k) for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "e2e_p50")}})
    out.sort(key=lambda r: (r["goodput"] is None, -(r["goodput"] or 0.0)))
    return out


def pareto(table: list[dict[str, Any]]) -> list[str]:
    """Ids of the measured candidates no other has a higher goodput and a lower ITL p99 than (module docstring)."""
    pts = [r for r in table if r["goodput"] is not None and r["itl_p99"] is not None and r["verdict"] == "passed"]
    keep = []
    for r in pts:
        dominated = any(o is not r and o["goodput"] >= r["goodput"] and o["itl_p99"] <= r["itl_p99"]
                        and (o["goodput"] > r["goodput"] or o["itl_p99"] < r["itl_p99"]) for o in pts)
        if not dominated:
            keep.append(r["id"])
    return keep


def profile_diff(original: Profile, winner: Profile) -> str:
    """A unified diff of the two profiles' canonical TOML (``dump_profile``), ``original`` -> ``winner``."""
    return "".join(difflib.unified_diff(dump_profile(original).splitlines(True), dump_profile(winner).splitlines(True),
                                        "original.toml", "winner.toml"))


def reproduce(settings: Any, folder: str, url: str, workload: str) -> list[str]:
    """The commands that install the winner and measure it as tune did (bench with the same load, SLO and runs)."""
    slo = ",".join(f"{k}={v:g}" for k, v in settings.slo.items())
    load = (["--request-rate", f"{settings.request_rate:g}"] if settings.request_rate
            else ["--concurrency", str(settings.concurrency)])
    bench = ["kimi-deploy", "bench", "--base-url", url, *load, "--max-tokens", str(settings.max_tokens),
             "--runs", str(settings.runs), "--slo", slo, "--seed", str(settings.seed)]
    if settings.num_prompts:
        bench += ["--num-prompts", str(settings.num_prompts)]
    if settings.warmup is not None:
        bench += ["--warmup", str(settings.warmup)]
    if workload != "builtin":
        bench += ["--dataset", workload]
    bench += ["--label", "winner", "--json", f"{folder}/winner-bench.json"]
    return [f"kimi-deploy install --profile {folder}/{WINNER_FILE}",
            "kimi-deploy restart --wait --gate contract --rollback-on-failure",
            shlex.join(bench)]


def build(journal: tj.TuneJournal, outcome: Any, by_id: Mapping[str, space.Candidate], baseline: space.Candidate,
          settings: Any, *, deployed: str, folder: str, url: str) -> dict[str, Any]:
    """The report (``tune --json``, ``report.json``); ``folder``: the tune folder's host path; ``url``: where the
    candidates were measured (the replica's own URL behind a gateway)."""
    table = rows(journal, by_id, baseline)
    winner = outcome.winner
    by_row = {r["id"]: r for r in table}
    base_row, win_row = by_row.get(baseline.id), by_row.get(winner) if winner else None
    gain = (win_row["goodput"] / base_row["goodput"] - 1 if win_row and base_row and base_row["goodput"]
            else None)
    return {"service": journal.service, "sglang_version": journal.sglang_version, "method": settings.method,
            "settings": settings.to_dict(), "dimensions": journal.dimensions, "space_size": len(by_id),
            "pruned": sum(1 for r in journal.candidates.values() if r.pruned),
            "restarts": journal.restarts(), "measurements": len(journal.finished()),
            "seconds": round(sum(m.seconds or 0.0 for m in journal.measurements), 1),
            "winner": winner, "winner_values": by_id[winner].as_dict() if winner else None,
            "winner_label": by_id[winner].label(baseline.as_dict()) if winner else None,
            "baseline": baseline.id, "verdict": outcome.verdict, "gain": gain, "complete": outcome.complete,
            "notes": list(outcome.notes), "path": list(outcome.path), "finalists": list(outcome.finalists),
            "deployed": deployed, "pareto": pareto(table), "candidates": table,
            "folder": folder, "url": url,
            "reproduce": reproduce(settings, folder, url, settings.workload) if winner else []}


def write_outputs(folder: Path, journal: tj.TuneJournal, result: dict[str, Any], original: Profile,
                  by_id: Mapping[str, space.Candidate]) -> None:
    """``report.json``, and with a winner ``winner.toml`` (the profile to install), ``winner.diff`` and
    ``tune.png`` (goodput with its interval against ITL p99, the Pareto set joined), each written atomically."""
    import json

    fsio.write_atomic(folder / REPORT_FILE, json.dumps(result, indent=2, sort_keys=True) + "\n")
    winner = result.get("winner")
    if winner and winner in by_id:
        profile = space.apply(original, by_id[winner])
        fsio.write_atomic(folder / WINNER_FILE, dump_profile(profile), mode=0o600)
        fsio.write_atomic(folder / DIFF_FILE, profile_diff(original, profile))
    if any(r["goodput"] is not None for r in result["candidates"]):
        fsio.write_atomic(folder / PLOT_FILE, plot_png(result))


def plot_png(result: dict[str, Any]) -> bytes:
    """The PNG: each measured candidate's median goodput (its interval as an error bar) against its ITL p99; the
    Pareto set joined by a line, the winner and the baseline named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in result["candidates"] if r["goodput"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for r in pts:
        lo, hi = r["goodput_interval"]
        x = r["itl_p99"] or 0.0
        color = "tab:green" if r["id"] == result["winner"] else "tab:gray" if r["id"] == result["baseline"] else \
            "tab:blue"
        ax.errorbar([x], [r["goodput"]], yerr=[[r["goodput"] - lo], [hi - r["goodput"]]], fmt="o", color=color,
                    capsize=4)
        if r["id"] in (result["winner"], result["baseline"]):
            ax.annotate("winner" if r["id"] == result["winner"] else "original", (x, r["goodput"]),
                        textcoords="offset points", xytext=(6, 6))
    front = sorted((r for r in pts if r["id"] in result["pareto"]), key=lambda r: r["itl_p99"] or 0.0)
    if len(front) > 1:
        ax.plot([r["itl_p99"] for r in front], [r["goodput"] for r in front], "--", color="tab:orange",
                label="Pareto set")
        ax.legend()
    ax.set_xlabel("ITL p99 (ms)")
    ax.set_ylabel("goodput (requests/s meeting every SLO)")
    ax.set_title(f"kimi-deploy tune {result['service']}: {len(pts)} measured, {result['restarts']} restarts")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def table_lines(result: dict[str, Any], width: int = 118) -> list[str]:
    """The human table: one line per candidate, then the winner, the Pareto set and the commands."""
    lines = [f"{'candidate':<44} {'verdict':<26} {'goodput req/s [interval]':<26} {'TTFT p50/p99':>14} "
             f"{'ITL p50/p99':>12}"]

    def num(v: Any, d: int = 0) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    for r in result["candidates"]:
        gp = "-" if r["goodput"] is None else \
            f"{r['goodput']:.2f} [{r['goodput_interval'][0]:.2f}, {r['goodput_interval'][1]:.2f}]"
        mark = "*" if r["id"] == result["winner"] else " "
        lines.append(f"{mark}{r['label'][:43]:<43} {r['verdict'][:26]:<26} {gp:<26} "
                     f"{num(r['ttft_p50']) + '/' + num(r['ttft_p99']):>14} "
                     f"{num(r['itl_p50'], 1) + '/' + num(r['itl_p99'], 1):>12}")
        if r["detail"] and not r["verdict"].startswith("passed"):
            lines.append(f"   {r['detail'][:width - 3]}")
    return lines
