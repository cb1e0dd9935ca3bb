"""Report formats of a check run: a rich table, the JSON document, JUnit XML, a Prometheus textfile.

- JSON: ``kimi-deploy.check/1`` (:meth:`CheckReport.to_json`), validated by ``report.schema.json``.
- JUnit XML: one ``<testcase>`` per check (classname = tier); ``fail`` → ``<failure type=KIND>``,
  ``skip`` → ``<skipped>``, ``warn`` → a passing case with the warning in ``<system-out>``
  (the JUnit XML schema as read by Jenkins/GitLab has no "warning" state).
- Prometheus: the text exposition format for node_exporter's textfile collector
  (``--collector.textfile.directory``): ``kimi_deploy_check_status{check=...}``,
  ``kimi_deploy_check_failures{kind=...}`` (every kind, 0 when none),
  ``kimi_deploy_check_last_run_timestamp_seconds``, ``kimi_deploy_check_exit_code``,
  ``kimi_deploy_check_duration_seconds``. A run with a profile puts ``service="<[service] name>"`` first on
  every series, so two services' textfiles in one node_exporter directory (two services on one host, or a
  gateway host checking its workers) are different series; without a profile the label is absent and the
  scrape job's own ``service`` target label applies (:func:`kimi_deploy.targets.prometheus.scrape_configs`).
"""

from __future__ import annotations

import datetime as _dt
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kimi_deploy.check.check_ids import tier
from kimi_deploy.check.results import CheckReport, CheckResult, clip
from kimi_deploy.wire.printable import markup, printable
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import check_output_paths as fsio_check_output_paths, write_many_atomic
from kimi_deploy.redact import Redactor, url as redact_url

#: Value of kimi_deploy_check_status per status (documented in the HELP line).
STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "skip": 3}
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def redact_report(report: CheckReport, secrets: Iterable[str | None] = ()) -> CheckReport:
    """The redaction hook: mask ``secrets`` (the key the run sent) and key-like fields in every text of
    ``report`` that a report format or the table shows, in place; returns ``report``.

    Rules: :mod:`kimi_deploy.redact`. ``run_checks`` calls it on every report it returns, so the JSON,
    JUnit and Prometheus files and the table hold no key, whatever the server echoed into evidence.
    """
    r = Redactor(secrets)
    report.base_url = redact_url(report.base_url, secrets)
    report.model = r.text(report.model) if report.model else report.model
    report.profile = r.text(report.profile) if report.profile else report.profile
    report.server = r.value(report.server)
    for result in report.results:
        result.detail, result.fix = r.text(result.detail), r.text(result.fix)
        result.evidence = clip(r.text(result.evidence))  # the mask may be longer than what it hides
    return report


def render_table(report: CheckReport, console: Console) -> None:
    """Print one row per check (status, kind, one line of evidence) and a summary line.

    Checks that were not attempted (:attr:`CheckResult.attempted` False) with the same kind and
    evidence share one row ("(45 more checks)"); the JSON report keeps each.
    """
    # the model name and the version are the server's: shown as literal text (kimi_deploy.wire.printable)
    table = Table(title=f"kimi-deploy check {markup(report.base_url)}" + (f" ({markup(report.model)})" if report.model
                                                                         else ""),
                  expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("detail / evidence", overflow="fold")
    def add(check: str, r: CheckResult, detail: str, evidence: str) -> None:
        text = escape(clip(detail, 120))
        if evidence:
            evidence = escape(clip(evidence, 120))
            text += f"\n[dim]{evidence}[/dim]" if console.is_terminal else f" | {evidence}"
        if r.fix:
            text += f"\nfix: {escape(r.fix)}" if console.is_terminal else f" | fix: {escape(r.fix)}"
        table.add_row(escape(check), f"[{_STYLE[r.status]}]{r.status}[/]", r.kind or "", text)

    skipped: dict[tuple[str | None, str], list[CheckResult]] = {}
    for r in report.results:
        if r.attempted:
            add(r.id, r, r.detail, r.evidence)
        else:
            skipped.setdefault((r.kind, r.evidence), []).append(r)
    for group in skipped.values():
        first, n = group[0], len(group)
        add(f"({n} more checks)" if n > 1 else first.id, first, first.detail,
            first.evidence + (" (each id in the JSON report)" if n > 1 else ""))
    console.print(table)
    c = report.counts()
    server = report.server.get("version")
    console.print(f"{c['pass']} pass, {c['warn']} warn, {c['fail']} fail, {c['skip']} skip in "
                  f"{report.duration_s:.1f} s" + (f" (server version {markup(server)})" if server else "")
                  + f"; exit {int(report.exit_code)} ({report.exit_code.name})")
    if report.interrupted:
        console.print(f"interrupted by {report.interrupted}: a partial report, {len(report.not_run)} check(s) "
                      "not run (the reports list them under interrupted.not_run)")


def to_json_text(report: CheckReport) -> str:
    """The JSON document, indented, with a trailing newline."""
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"


def _xml(value: str) -> str:
    """``value`` with every character XML 1.0 forbids (C0 controls but tab/LF/CR, lone surrogates,
    U+FFFE/U+FFFF) and DEL, C1 controls and U+2028/U+2029 escaped (:func:`printable`): ElementTree
    escapes markup but writes these raw, which makes the file unparseable."""
    return printable(value, keep="\t\n\r")


def to_junit(report: CheckReport) -> str:
    """JUnit XML (one testsuite ``kimi-deploy check``), UTF-8 text with an XML declaration.

    ``hostname`` is the checked server's host (``10.0.0.5``); the whole URL is the ``base_url`` property.
    Every attribute and text goes through :func:`_xml`: the file parses whatever the server answered.
    """
    c = report.counts()
    suite = ET.Element("testsuite", {
        "name": "kimi-deploy check", "tests": str(len(report.results)), "failures": str(c["fail"]),
        "errors": "0", "skipped": str(c["skip"]), "time": f"{report.duration_s:.3f}",
        "timestamp": report.started_at.isoformat(timespec="seconds"),
        "hostname": _xml(_hostname(report.base_url)),
    })
    props = ET.SubElement(suite, "properties")
    for name, value in (("base_url", report.base_url), ("model", report.model or ""),
                        ("server_version", str(report.server.get("version") or "")),
                        *((("interrupted", f"{report.interrupted}; not run: {', '.join(report.not_run)}"),)
                          if report.interrupted else ())):
        ET.SubElement(props, "property", {"name": name, "value": _xml(value)})
    for r in report.results:
        case = ET.SubElement(suite, "testcase", {"classname": tier(r.id), "name": _xml(r.id),
                                                 "time": f"{r.duration_s:.3f}"})
        if r.status == "fail":
            failure = ET.SubElement(case, "failure", {"type": r.kind or "", "message": _xml(
                r.detail + (f"; fix: {r.fix}" if r.fix else ""))})
            failure.text = _xml(r.evidence + (f"\nfix: {r.fix}" if r.fix else ""))
        elif r.status == "skip":
            ET.SubElement(case, "skipped", {"message": _xml(r.detail)})
        elif r.status == "warn":
            out = ET.SubElement(case, "system-out")
            out.text = _xml(f"warn {r.kind}: {r.detail}\n{r.evidence}" + (f"\nfix: {r.fix}" if r.fix else ""))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _hostname(url: str) -> str:
    """The host of ``url``, or ``url`` itself when it has none (or cannot be split)."""
    try:
        return urlsplit(url).hostname or url
    except ValueError:
        return url


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


#: (HELP text, TYPE) of each metric family of the check textfile, in the order the file lists them.
PROM_FAMILIES = {
    "kimi_deploy_check_status": "Result of each check in the last run: 0 pass, 1 warn, 2 fail, 3 skip.",
    "kimi_deploy_check_failures": "Checks of the last run that failed (or warned) with each kind.",
    "kimi_deploy_check_last_run_timestamp_seconds": "Unix time the last check run started.",
    "kimi_deploy_check_exit_code": "Exit code of the last run: 0 ok, 1 a check failed, 3 unreachable, 130 interrupted.",
    "kimi_deploy_check_interrupted": "1 when a signal stopped the last run before it finished (exit 130; the report "
                                     "is partial), else 0.",
    "kimi_deploy_check_duration_seconds": "Wall time of the last run.",
}


def _samples(report: CheckReport, labels: dict[str, str]) -> dict[str, list[str]]:
    """Family name -> sample lines of one report, every series carrying ``labels`` first."""
    def series(name: str, **more: str) -> str:
        spelled = ",".join(f'{k}="{_label(v)}"' for k, v in {**labels, **more}.items())
        return f"{name}{{{spelled}}}" if spelled else name

    return {
        "kimi_deploy_check_status": [f"{series('kimi_deploy_check_status', check=r.id, kind=r.kind or '')} "
                                     f"{STATUS_VALUE[r.status]}" for r in report.results],
        "kimi_deploy_check_failures": [f"{series('kimi_deploy_check_failures', kind=kind)} {n}"
                                       for kind, n in report.failures_by_kind().items()],
        "kimi_deploy_check_last_run_timestamp_seconds": [
            f"{series('kimi_deploy_check_last_run_timestamp_seconds')} {report.started_at.timestamp():.3f}"],
        "kimi_deploy_check_exit_code": [f"{series('kimi_deploy_check_exit_code')} {int(report.exit_code)}"],
        "kimi_deploy_check_interrupted": [
            f"{series('kimi_deploy_check_interrupted')} {1 if report.interrupted else 0}"],
        "kimi_deploy_check_duration_seconds": [
            f"{series('kimi_deploy_check_duration_seconds')} {report.duration_s:.3f}"],
        **_quality_series(report, series),
        **_start_series(report, series),
    }


def _exposition(parts: list[dict[str, list[str]]]) -> str:
    """Every family of :data:`PROM_FAMILIES` (HELP and TYPE even without a sample), then each of
    :data:`QUALITY_GAUGES` that some part has samples of."""
    lines: list[str] = []
    families = [*PROM_FAMILIES.items(), *((name, text) for name, text, _ in QUALITY_GAUGES
                                          if any(part.get(name) for part in parts)),
                *((name, text) for name, text in START_GAUGES if any(part.get(name) for part in parts))]
    for name, help_text in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for part in parts:
            lines += part.get(name, [])
    return "\n".join(lines) + "\n"


def to_prometheus(report: CheckReport) -> str:
    """Prometheus text exposition format (version 0.0.4) for node_exporter's textfile collector.

    Every series carries ``service="<name>"`` when ``report.service`` is set (a run with a profile); without
    one the text is as it always was, with no ``service`` label (not ``"unknown"``: the scrape job that
    reads the file then gives it its own ``service`` target label, and no made-up service shows in alerts).
    """
    return _exposition([_samples(report, {"service": report.service} if report.service else {})])


def workers_to_prometheus(reports: list[tuple[str, CheckReport]], *, service: str | None, exit_code: int,
                          started_at: float) -> str:
    """The textfile of ``check --each-worker``: every worker's series as :func:`to_prometheus` writes them, with
    ``worker="<url>"`` after ``service``, so each alert on them fires per replica. A gateway that listed no worker
    has no worker series: then one ``kimi_deploy_check_exit_code`` (``exit_code``) and last-run time without
    ``worker`` say that the run failed. ``started_at``: Unix time of the run."""
    first = {"service": service} if service else {}
    parts = [_samples(report, {**first, "worker": url}) for url, report in reports]
    if not reports:
        spelled = ",".join(f'{k}="{_label(v)}"' for k, v in first.items())
        suffix = f"{{{spelled}}}" if spelled else ""
        parts.append({"kimi_deploy_check_exit_code": [f"kimi_deploy_check_exit_code{suffix} {exit_code}"],
                      "kimi_deploy_check_last_run_timestamp_seconds": [
                          f"kimi_deploy_check_last_run_timestamp_seconds{suffix} {started_at:.3f}"]})
    return _exposition(parts)


#: The quality tier's gauges: (name, HELP, the accuracy object's value). Written only when quality.accuracy ran
#: and measured something (a run without the tier leaves them out, and Prometheus keeps the last sample's series
#: stale rather than zero: an alert never reads an absent measurement as 0 % accuracy).
QUALITY_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("kimi_deploy_check_schema_accuracy_ratio", "Schema accuracy of the last quality.accuracy sample (K2VV: valid "
                                                "arguments / finish_reason tool_calls answers).", "estimate"),
    ("kimi_deploy_check_schema_accuracy_lower_ratio", "Lower bound of its 95 % interval (Wilson score, continuity "
                                                      "corrected).", "lower"),
    ("kimi_deploy_check_schema_accuracy_upper_ratio", "Upper bound of its 95 % interval.", "upper"),
    ("kimi_deploy_check_schema_accuracy_threshold_ratio", "The profile's [quality] min_schema_accuracy.",
     "threshold"),
    ("kimi_deploy_check_tool_call_answers", "Answers of the sample that ended with finish_reason tool_calls.",
     "tool_call_answers"),
    ("kimi_deploy_check_quality_requests", "Requests of the last quality.accuracy sample that were sent.", "sent"),
)


#: The start-time gauges (issue #42): (name, HELP). One series per phase (label ``phase``: weights, kv_cache,
#: draft, cuda_graphs, ready, total), from the service's start history on the host (``check --profile``); none
#: without a record. The ``KimiStartSlower`` alert compares the first with the third.
START_GAUGES: tuple[tuple[str, str], ...] = (
    ("kimi_deploy_check_start_phase_seconds", "Seconds each phase of the last recorded start took (SGLang's log)."),
    ("kimi_deploy_check_start_phase_median_seconds", "Median seconds of each phase over the recorded starts."),
    ("kimi_deploy_check_start_phase_budget_seconds", "Each phase's budget for the last start: [startup] budget_sec, "
                                                     "else budget_factor x the median of the starts before it."),
    ("kimi_deploy_check_last_start_timestamp_seconds", "Unix time of the last recorded start's first log line."),
)


def _start_series(report: CheckReport, series) -> dict[str, list[str]]:
    """Family name -> sample lines of :data:`START_GAUGES` of ``report.starts`` (none without a record)."""
    starts = report.starts
    if not starts:
        return {}
    last = starts["last"]
    phase_seconds = {**last["phases"], "total": last["total"]}
    out = {
        "kimi_deploy_check_start_phase_seconds": [
            f"{series('kimi_deploy_check_start_phase_seconds', phase=p)} {s:.3f}" for p, s in phase_seconds.items()],
        "kimi_deploy_check_start_phase_median_seconds": [
            f"{series('kimi_deploy_check_start_phase_median_seconds', phase=p)} {m['median']:.3f}"
            for p, m in starts["medians"].items()],
        "kimi_deploy_check_start_phase_budget_seconds": [
            f"{series('kimi_deploy_check_start_phase_budget_seconds', phase=p)} {b:.3f}"
            for p, b in starts["last_budgets"].items()],
    }
    try:
        # SGLang logs the host's local time; the check runs on the same host
        stamp = _dt.datetime.strptime(last["started"], "%Y-%m-%d %H:%M:%S")
        out["kimi_deploy_check_last_start_timestamp_seconds"] = [
            f"{series('kimi_deploy_check_last_start_timestamp_seconds')} {stamp.timestamp():.0f}"]
    except ValueError:
        pass
    return out


def _quality_series(report: CheckReport, series) -> dict[str, list[str]]:
    """Family name -> the sample line of each of :data:`QUALITY_GAUGES` of ``report`` (none without a measured
    accuracy)."""
    acc = (report.quality or {}).get("accuracy")
    if not acc or not acc.get("tool_call_answers"):
        return {}
    values = {**acc["schema_accuracy"], **acc}
    return {name: [f"{series(name)} {float(values[key]):.6g}"] for name, _, key in QUALITY_GAUGES}


def check_output_paths(*, json_path: Path | None = None, junit_path: Path | None = None,
                       prom_path: Path | None = None) -> None:
    """Refuse report paths that cannot be written, before anything is checked.

    The rule is :func:`kimi_deploy.fsio.check_output_paths` (shared with ``bench``); ``-``
    (stdout) is refused for ``--junit``/``--prom``: only the JSON report goes to stdout (the
    caller passes ``json_path=None`` for ``--json -``).

    Raises:
        UsageError: the first bad path, with the option that gave it (exit 2).
    """
    for option, path in (("--junit", junit_path), ("--prom", prom_path)):
        if path is not None and str(path) == "-":
            raise UsageError(f"{option} cannot write to stdout ('-')", value="-",
                             hint=f"give {option} a file path; only --json accepts '-' (stdout)")
    fsio_check_output_paths({"--json": json_path, "--junit": junit_path, "--prom": prom_path},
                            unwritable_hint="write the report into a directory this user owns (the nightly unit "
                                            "uses its StateDirectory=)")


def write_reports(report: CheckReport, *, json_path: Path | None = None, junit_path: Path | None = None,
                  prom_path: Path | None = None) -> list[Path]:
    """Write the requested report files atomically, all or none (:mod:`kimi_deploy.fsio`).

    Raises:
        UsageError: a path :func:`check_output_paths` refuses, or a directory cannot be written;
            no file was changed.
    """
    check_output_paths(json_path=json_path, junit_path=junit_path, prom_path=prom_path)
    files: dict[Path, Any] = {}
    if json_path:
        files[json_path] = to_json_text(report)
    if junit_path:
        files[junit_path] = to_junit(report)
    if prom_path:
        files[prom_path] = to_prometheus(report)
    if files:
        write_many_atomic(files, mode=0o644)
    return list(files)
