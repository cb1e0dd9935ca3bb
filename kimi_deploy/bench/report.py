"""Result files of ``kimi-deploy bench``: the versioned JSON, the CSV rows, the terminal table.

JSON (``"schema": "kimi-deploy.bench/1"``)::

    {"schema", "label", "created", "kimi_deploy_version", "definitions": {metric: text},
     "config": {base_url, model, mode, concurrency, request_rates, max_in_flight, num_prompts, max_tokens,
                temperature, ignore_eos, warmup, runs, seed, slo, request_timeout, flush_cache, extra_body},
     "model", "profile_sha256", "dataset": {name, path, sha256, conversations},
     "server": {"server_info": {...} | null, "server_info_status": str},
     "client": {http, json, event_loop, pool_limit},
     "points": [{"concurrency", "request_rate", "num_prompts", "warmup",
                 "summary": WindowSummary, "spec_accept_length": float | null,
                 "runs": [{"index", "flush_cache", "spec_accept_length", "summary": WindowSummary,
                           "requests": [per-request row]}]}],
     "interrupted": null | {"signal": "SIGINT" | "SIGTERM", "during": "c=8", "complete_points": ["c=1", ...]}}

``WindowSummary`` and the per-request row are defined in :mod:`kimi_deploy.bench.metrics`.
CSV: one row per point, columns :data:`CSV_COLUMNS`; the last, ``partial``, is ``true`` in every row of a run
that was interrupted (its JSON's ``interrupted``: only the points that completed are rows) and ``false`` otherwise,
so a reader of the CSV alone (``pandas.read_csv`` reads it as a bool column) can tell. A result is read back with
:func:`load_result`, which checks the schema tag.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from kimi_deploy import __version__
from kimi_deploy.bench.prompts import Dataset
from kimi_deploy.bench.loadgen import BenchRun
from kimi_deploy.bench.metrics import DEFINITIONS
from kimi_deploy.profile import load_profile
from kimi_deploy.errors import UsageError
from kimi_deploy.wire.inputs import read_json, shape_problem
from kimi_deploy.wire.printable import markup, printable
from kimi_deploy.redact import redact

SCHEMA = "kimi-deploy.bench/1"

CSV_COLUMNS = [
    "label", "concurrency", "request_rate", "runs", "requests", "completed", "errors", "requests_without_usage",
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "ttft_ms_mean",
    "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "tpot_ms_mean",
    "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "itl_ms_mean",
    "e2e_ms_p50", "e2e_ms_p90", "e2e_ms_p99", "e2e_ms_mean",
    "tokens_per_chunk_mean", "output_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "chunks_per_s",
    "spec_accept_length", "window_s", "partial",
]


def build_result(run: BenchRun, dataset: Dataset, profile_sha256: str | None = None) -> dict[str, Any]:
    """The result JSON object of one benchmark (layout in the module docstring), redacted
    (:func:`redact_result` with the key the run sent): no key reaches a file, the table or stdout."""
    points = []
    for p in run.points:
        accepts = [r.spec_accept_length for r in p.runs if r.spec_accept_length is not None]
        points.append({
            "concurrency": p.concurrency,
            "request_rate": p.request_rate,
            "num_prompts": p.num_prompts,
            "warmup": p.warmup,
            "summary": p.summary.to_dict(),
            "spec_accept_length": accepts[-1] if accepts else None,
            "runs": [{"index": r.index, "flush_cache": r.flush_cache, "spec_accept_length": r.spec_accept_length,
                      "summary": r.summary.to_dict(), "requests": [rec.row() for rec in r.records]}
                     for r in p.runs],
        })
    return redact_result({
        "schema": SCHEMA,
        "label": run.config.label or run.model,
        "created": datetime.fromtimestamp(run.started, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(run.finished - run.started, 3),
        "kimi_deploy_version": __version__,
        "definitions": DEFINITIONS,
        "config": run.config.to_dict(),
        "model": run.model,
        "profile_sha256": profile_sha256,
        "dataset": dataset.describe(),
        "server": {"server_info": run.server_info, "server_info_status": run.server_info_status},
        "client": run.client,
        "points": points,
        # null, or {"signal": "SIGINT", "during": "c=8", "complete_points": ["c=1", ...]}: the sweep was
        # stopped early; "points" holds only the complete ones
        "interrupted": run.interrupted,
    }, [getattr(run.config, "_api_key", None)])


def redact_result(result: dict[str, Any], secrets: Iterable[str | None] = ()) -> dict[str, Any]:
    """``result`` with ``secrets`` and key-like fields masked everywhere (:func:`kimi_deploy.redact.redact`):
    SGLang 0.5.23 without the redact-api-key patch reports ``api_key`` and ``--api-key KEY`` inside
    ``launch_command`` in ``/server_info``, and an error body may echo anything."""
    return redact(result, secrets)


def to_json_text(result: dict[str, Any]) -> str:
    """The result as JSON text (indent 1, trailing newline), strictly RFC 8259.

    ``allow_nan=False``: a non-finite number can never be written as ``NaN``/``Infinity``
    (not JSON; most readers refuse it). The inputs are checked up front
    (:mod:`kimi_deploy.bench.params`) and the server's own answers are read with
    non-finite constants as ``null`` (:mod:`kimi_deploy.bench.client`), so this is a last guard.

    Raises:
        ValueError: a non-finite number reached the result (a defect of the kit, never of input).
    """
    return json.dumps(result, indent=1, allow_nan=False) + "\n"


def point_name(point: dict[str, Any]) -> str:
    """``c=8`` (closed loop) or ``rate=2/s`` (open loop)."""
    return f"c={point['concurrency']}" if point["request_rate"] is None else f"rate={point['request_rate']:g}/s"


def failed_points(result: dict[str, Any]) -> list[str]:
    """Names (:func:`point_name`) of the points where no request succeeded: their figures measure nothing."""
    return [point_name(p) for p in result["points"] if not p["summary"]["completed"]]


def csv_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per point with the keys of :data:`CSV_COLUMNS` (``partial``: the run was interrupted)."""
    rows = []
    partial = bool(result.get("interrupted"))
    for p in result["points"]:
        s = p["summary"]
        row: dict[str, Any] = {
            "label": result["label"], "concurrency": p["concurrency"], "request_rate": p["request_rate"],
            "runs": len(p["runs"]), "spec_accept_length": p["spec_accept_length"],
        }
        for key in ("requests", "completed", "errors", "requests_without_usage", "output_tokens_per_s",
                    "requests_per_s", "goodput_requests_per_s", "chunks_per_s", "window_s"):
            row[key] = s[key]
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            for stat in ("p50", "p90", "p99", "mean"):
                row[f"{metric}_{stat}"] = (s[metric] or {}).get(stat)
        row["tokens_per_chunk_mean"] = (s["tokens_per_chunk"] or {}).get("mean")
        row["partial"] = partial
        rows.append(row)
    return rows


def to_csv(result: dict[str, Any]) -> str:
    """The CSV text (header + one row per point)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in csv_rows(result):
        writer.writerow({k: _fmt(v) for k, v in row.items()})
    return out.getvalue()


def _fmt(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if v == v else ""
    return "" if v is None else v


_COUNT = {"type": "integer", "minimum": 0, "maximum": 10**12}
_NUMBER = {"type": ["number", "null"], "minimum": 0, "maximum": 1e15}
_DIST = {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
    "p50": _NUMBER, "p90": _NUMBER, "p99": _NUMBER, "mean": _NUMBER, "n": _COUNT}}]}
_SUMMARY = {"type": "object", "required": ["completed"], "properties": {
    "requests": _COUNT, "completed": _COUNT, "errors": _COUNT, "requests_without_usage": _COUNT,
    "output_tokens": _COUNT, "chunks": _COUNT, "window_s": _NUMBER,
    "error_kinds": {"type": "object", "additionalProperties": _COUNT},
    **{k: _DIST for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "tokens_per_chunk")},
    **{k: _NUMBER for k in ("output_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "chunks_per_s")}}}
_ACCEPT = {"type": ["number", "null"], "minimum": 0, "maximum": 1000}

#: What ``bench compare`` reads of a result, as JSON Schema 2020-12 (the layout in the module docstring): types and
#: ranges of every field it computes with (a point's ``concurrency`` at most the sweep's 1,000,000, a rate a finite
#: positive number, latencies and rates non-negative and finite), so a hand-edited or foreign file is a usage error
#: naming the field, never a traceback or a ratio of nonsense.
RESULT_SHAPE: dict[str, Any] = {
    "type": "object", "required": ["schema", "config", "points"],
    "properties": {
        "schema": {"const": SCHEMA},
        "label": {"type": ["string", "null"], "maxLength": 200},
        "model": {"type": ["string", "null"], "maxLength": 1000},
        "config": {"type": "object", "required": ["mode"], "properties": {
            "mode": {"enum": ["closed-loop", "open-loop"]},
            "max_tokens": {"type": ["integer", "null"], "minimum": 0, "maximum": 10**9},
            "runs": {"type": ["integer", "null"], "minimum": 1, "maximum": 10**6}}},
        "dataset": {"type": ["object", "null"]},
        "server": {"type": ["object", "null"]},
        "points": {"type": "array", "maxItems": 100_000, "items": {
            "type": "object", "required": ["concurrency", "request_rate", "summary"], "properties": {
                "concurrency": {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000},
                "request_rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1e9},
                "num_prompts": {"type": ["integer", "null"], "minimum": 0, "maximum": 10**12},
                "summary": _SUMMARY, "spec_accept_length": _ACCEPT,
                "runs": {"type": ["array", "null"], "items": {"type": "object", "properties": {
                    "summary": {"anyOf": [{"type": "null"}, _SUMMARY]}, "spec_accept_length": _ACCEPT}}}},
            "anyOf": [{"properties": {"concurrency": {"type": "integer"}}},
                      {"properties": {"request_rate": {"type": "number"}}}]}},
    },
}


def load_result(path: Path) -> dict[str, Any]:
    """Read a result JSON written by ``kimi-deploy bench --json``: a regular file of at most
    :data:`kimi_deploy.wire.inputs.REPORT_FILE_BYTES`, strict JSON, checked against :data:`RESULT_SHAPE`.

    Raises:
        UsageError: unreadable, not a regular file, too large, not JSON, not a ``kimi-deploy.bench/1`` result, or
            a field of the wrong type or out of range (the message names the field), exit 2.
    """
    hint = "pass files written by `kimi-deploy bench --json PATH`"
    data = read_json(path, f"the benchmark result {path}", hint)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UsageError(f"not a {SCHEMA} result (schema: {printable(str(found))[:80]!r})", value=str(path),
                         hint="pass files written by `kimi-deploy bench --json PATH` of this kimi-deploy version")
    problem = shape_problem(data, RESULT_SHAPE)
    if problem:
        raise UsageError(f"the benchmark result {path} is not one bench wrote: {problem}", value=str(path), hint=hint)
    return data


def summary_table(result: dict[str, Any]):
    """A rich Table: one line per point with medians, throughput and flags."""
    from rich.table import Table

    table = Table(title=f"kimi-deploy bench: {markup(result['label'])}  (model {markup(result['model'])}, "
                        f"max_tokens {result['config']['max_tokens']}, {result['config']['mode']})")
    for col in ("point", "ok/err", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50 ms", "tok/chunk",
                "E2E p50 ms", "out tok/s", "req/s", "goodput", "accept", "no usage"):
        table.add_column(col, justify="right")
    for p in result["points"]:
        s = p["summary"]
        point = f"c={p['concurrency']}" if p["request_rate"] is None else f"{p['request_rate']:g}/s"
        table.add_row(
            point, f"{s['completed']}/{s['errors']}",
            _pair(s["ttft_ms"]), _pair(s["tpot_ms"]), _num((s["itl_ms"] or {}).get("p50"), 2),
            _num((s["tokens_per_chunk"] or {}).get("mean"), 2), _num((s["e2e_ms"] or {}).get("p50"), 0),
            _num(s["output_tokens_per_s"], 0), _num(s["requests_per_s"], 2), _num(s["goodput_requests_per_s"], 2),
            _num(p["spec_accept_length"], 2),
            f"[bold red]{s['requests_without_usage']}[/]" if s["requests_without_usage"] else "0",
        )
    return table


def _pair(dist: dict | None) -> str:
    if not dist:
        return "-"
    return f"{dist['p50']:.1f} / {dist['p99']:.1f}"


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def warnings_of(result: dict[str, Any]) -> list[str]:
    """Lines the operator must read: requests without usage, errors, flush failures, a point under its load."""
    out = []
    stopped = result.get("interrupted")
    if stopped:
        done = ", ".join(stopped["complete_points"]) or "none"
        out.append(f"interrupted by {stopped['signal']} during {stopped['during'] or 'the start'}: only the complete "
                   f"points are written ({done}); the point in flight was left out")
    for p in result["points"]:
        s = p["summary"]
        point = point_name(p)
        if p["request_rate"] is None and p["num_prompts"] < p["concurrency"]:
            out.append(f"{point}: only {p['num_prompts']} prompt(s) per run, so at most {p['num_prompts']} request(s) "
                       f"were in flight, not {p['concurrency']}: this point measures less load than it says "
                       f"(give --num-prompts >= {p['concurrency']}, or leave it out for max(32, 4 x concurrency))")
        if s["requests_without_usage"]:
            out.append(f"{point}: {s['requests_without_usage']} response(s) had no usage block; their tokens are "
                       "not counted and their TPOT is unknown (the server ignored stream_options.include_usage)")
        if s["errors"]:
            kinds = ", ".join(f"{k} x{n}" for k, n in s["error_kinds"].items())
            out.append(f"{point}: {s['errors']} request(s) failed ({kinds})")
        flushes = {r["flush_cache"] for r in p["runs"]}
        bad = [f for f in flushes if f.startswith("failed")]
        if bad:
            out.append(f"{point}: prefix cache flush {bad[0]}")
    return out


def profile_digest(path: str | Path) -> str:
    """The sha256 of the profile at ``path`` (:meth:`kimi_deploy.profile.Profile.digest`) that a result records
    (``bench --profile FILE``: which deployment was measured).

    Raises:
        ProfileError: the file is missing or not a valid profile (exit 2).
    """
    return load_profile(Path(path)).digest()
