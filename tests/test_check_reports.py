"""Report formats of `kimi-deploy check`: JSON (against the shipped schema), JUnit XML, Prometheus textfile.

Golden files for a fixed report live in tests/golden/check/; regenerate after an intended change with
exactly:

    KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_check_reports.py

and review the diff before committing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console

from kimi_deploy import paths
from kimi_deploy.check import ALL_KINDS, FAILURE_KINDS, CheckReport, CheckResult
from kimi_deploy.check import reports
from kimi_deploy.errors import ExitCode, UsageError

GOLDEN = Path(__file__).parent / "golden" / "check"
UPDATE = os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1"


def schema() -> dict:
    return json.loads(paths.check_report_schema().read_text())


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker()).validate(doc)


def sample(unreachable: bool = False) -> CheckReport:
    results = [
        CheckResult("health.live", "pass", None, "GET /health: HTTP 200", "", 0.002),
        CheckResult("config.tool_call_parser", "fail", "config_mismatch",
                    "tool-call parser differs from the profile: tool_call_parser: running None, profile 'kimi_k2'",
                    "tool_call_parser: running None, profile 'kimi_k2'", 0.001),
        CheckResult("contract.tool_auto.stream", "fail", "markup_leak",
                    'special token <|...|> \'<|tool_calls_section_begin|>\' in content (+4 more)',
                    'it.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0', 0.0123),
        CheckResult("contract.parallel.nonstream", "warn", "model_declined",
                    "a tool call was due; the model answered in prose", 'Say "quote" & <b>', 0.5),
        CheckResult("contract.reasoning_on.nonstream", "skip", None, "no reasoning parser expected", "", 0.0),
    ]
    if unreachable:
        results = [CheckResult("health.live", "fail", "unreachable", "connect: ConnectError", "refused", 0.0)]
    return CheckReport(base_url="http://127.0.0.1:30000", model="moonshotai/Kimi-K2.5",
                       started_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), duration_s=1.25,
                       server={"version": "0.5.23", "tool_call_parser": None}, results=results,
                       profile="/etc/kimi-deploy/kimi-k25.toml", service="kimi-k25")


def test_schema_kind_vocabulary_is_the_code_vocabulary():
    s = schema()
    assert s["$defs"]["kind"]["enum"] == list(ALL_KINDS)
    assert len(FAILURE_KINDS) == 34 and ALL_KINDS[-1] == "model_declined"
    assert s["properties"]["schema"]["const"] == "kimi-deploy.check/1"


def test_json_report_validates_and_counts():
    report = sample()
    doc = report.to_json()
    validate(doc)
    assert report.exit_code == ExitCode.FAILED and doc["exit_code"] == 1
    assert doc["summary"] == {"pass": 1, "warn": 1, "fail": 2, "skip": 1}
    assert doc["failures_by_kind"]["markup_leak"] == 1 and doc["failures_by_kind"]["model_declined"] == 1
    assert sample(unreachable=True).exit_code == ExitCode.UNREACHABLE


@pytest.mark.parametrize("breakage", [
    lambda d: d.update(schema="kimi-deploy.check/2"),
    lambda d: d["checks"][1].update(kind="parser_broken"),             # not in the vocabulary
    lambda d: d["checks"][1].update(kind=None),                        # a fail needs a kind
    lambda d: d["checks"][3].update(kind="markup_leak"),               # a warn is model_declined only
    lambda d: d["checks"][0].update(kind="markup_leak"),               # a pass has no kind
    lambda d: d["checks"][0].update(evidence="x" * 121),               # evidence is one short line
    lambda d: d.update(extra=1),
])
def test_schema_rejects_broken_reports(breakage):
    doc = sample().to_json()
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_warn_only_exits_ok():
    report = sample()
    report.results = [r for r in report.results if r.status != "fail"]
    assert report.exit_code == ExitCode.OK


def test_junit_shape():
    root = ET.fromstring(reports.to_junit(sample()))
    assert root.tag == "testsuite" and root.get("tests") == "5" and root.get("failures") == "2"
    assert root.get("hostname") == "127.0.0.1"  # the host; the URL is a property
    assert {p.get("name"): p.get("value") for p in root.iter("property")}["base_url"] == "http://127.0.0.1:30000"
    assert root.get("skipped") == "1"
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["contract.tool_auto.stream"].find("failure")
    assert failure.get("type") == "markup_leak" and "<|tool_calls_section_begin|>" in failure.text
    assert cases["contract.tool_auto.stream"].get("classname") == "contract"
    assert cases["contract.reasoning_on.nonstream"].find("skipped") is not None
    assert "model_declined" in cases["contract.parallel.nonstream"].find("system-out").text


def test_prometheus_textfile_shape():
    text = reports.to_prometheus(sample())
    sample_line = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)+\})? -?[0-9.e+]+$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample_line.match(line), line
    svc = 'service="kimi-k25"'
    assert f'kimi_deploy_check_status{{{svc},check="contract.tool_auto.stream",kind="markup_leak"}} 2' in text
    assert f'kimi_deploy_check_status{{{svc},check="health.live",kind=""}} 0' in text
    for kind in ALL_KINDS:
        assert f'kimi_deploy_check_failures{{{svc},kind="{kind}"}} ' in text
    assert f"kimi_deploy_check_last_run_timestamp_seconds{{{svc}}} 1767323045.000" in text
    assert f"kimi_deploy_check_exit_code{{{svc}}} 1" in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert all(line.startswith("kimi_deploy_check_") and "{" + svc in line for line in samples)


def test_prometheus_textfile_without_a_profile_has_no_service_label():
    """No profile, no service name: the label is absent (not "unknown"); the scrape job's target label applies."""
    report = sample()
    report.service = None
    text = reports.to_prometheus(report)
    assert "service=" not in text
    assert 'kimi_deploy_check_status{check="health.live",kind=""} 0' in text
    assert "kimi_deploy_check_exit_code 1" in text
    assert text == reports.to_prometheus(sample()).replace('service="kimi-k25",', "").replace(
        '{service="kimi-k25"}', "")


def test_prometheus_service_label_is_escaped():
    report = sample()
    report.service = 'a"b\\c'
    assert 'kimi_deploy_check_exit_code{service="a\\"b\\\\c"} 1' in reports.to_prometheus(report)


def test_reports_match_golden():
    report = sample()
    rendered = {"report.json": reports.to_json_text(report), "report.xml": reports.to_junit(report),
                "check.prom": reports.to_prometheus(report)}
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            (GOLDEN / name).write_text(text)
        pytest.skip(f"golden files rewritten in {GOLDEN}")
    for name, text in rendered.items():
        assert (GOLDEN / name).read_text() == text, f"{name} differs from {GOLDEN / name}"


def test_table_has_one_row_per_check_and_clipped_evidence():
    report = sample()
    report.results[2].evidence = "E" * 119
    console = Console(record=True, width=400, force_terminal=False)
    reports.render_table(report, console)
    text = console.export_text()
    for r in report.results:
        assert r.id in text
    assert "1 pass, 1 warn, 2 fail, 1 skip" in text and "exit 1 (FAILED)" in text


def test_write_reports_is_all_or_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    good = tmp_path / "out" / "r.json"
    with pytest.raises(UsageError, match="does not exist"):  # no directory is created on the way
        reports.write_reports(sample(), json_path=good)
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    with pytest.raises(UsageError):
        reports.write_reports(sample(), json_path=good, prom_path=blocker / "check.prom")
    assert not good.exists()
    written = reports.write_reports(sample(), json_path=good, junit_path=tmp_path / "out" / "r.xml",
                                    prom_path=tmp_path / "out" / "c.prom")
    assert [p.name for p in written] == ["r.json", "r.xml", "c.prom"]
    validate(json.loads(good.read_text()))
