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

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kimi_deploy.check.registry import tier
from kimi_deploy.check.results import CheckReport, CheckResult, clip
from kimi_deploy.wire.printable import markup, printable
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import check_output_paths as fsio_check_output_paths, write_many_atomic
from kimi_deploy.redact import Redactor

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
    report.base_url = r.text(report.base_url)
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


def to_prometheus(report: CheckReport) -> str:
    """Prometheus text exposition format (version 0.0.4) for node_exporter's textfile collector.

    Every series carries ``service="<name>"`` when ``report.service`` is set (a run with a profile); without
    one the text is as it always was, with no ``service`` label (not ``"unknown"``: the scrape job that
    reads the file then gives it its own ``service`` target label, and no made-up service shows in alerts).
    """
    first = {"service": report.service} if report.service else {}

    def series(name: str, **labels: str) -> str:
        spelled = ",".join(f'{k}="{_label(v)}"' for k, v in {**first, **labels}.items())
        return f"{name}{{{spelled}}}" if spelled else name

    lines = [
        "# HELP kimi_deploy_check_status Result of each check in the last run: 0 pass, 1 warn, 2 fail, 3 skip.",
        "# TYPE kimi_deploy_check_status gauge",
    ]
    for r in report.results:
        lines.append(f"{series('kimi_deploy_check_status', check=r.id, kind=r.kind or '')} {STATUS_VALUE[r.status]}")
    lines += ["# HELP kimi_deploy_check_failures Checks of the last run that failed (or warned) with each kind.",
              "# TYPE kimi_deploy_check_failures gauge"]
    for kind, n in report.failures_by_kind().items():
        lines.append(f"{series('kimi_deploy_check_failures', kind=kind)} {n}")
    lines += [
        "# HELP kimi_deploy_check_last_run_timestamp_seconds Unix time the last check run started.",
        "# TYPE kimi_deploy_check_last_run_timestamp_seconds gauge",
        f"{series('kimi_deploy_check_last_run_timestamp_seconds')} {report.started_at.timestamp():.3f}",
        "# HELP kimi_deploy_check_exit_code Exit code of the last run: 0 ok, 1 a check failed, 3 unreachable, "
        "130 interrupted.",
        "# TYPE kimi_deploy_check_exit_code gauge",
        f"{series('kimi_deploy_check_exit_code')} {int(report.exit_code)}",
        "# HELP kimi_deploy_check_duration_seconds Wall time of the last run.",
        "# TYPE kimi_deploy_check_duration_seconds gauge",
        f"{series('kimi_deploy_check_duration_seconds')} {report.duration_s:.3f}",
    ]
    return "\n".join(lines) + "\n"


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
