"""Issue 41, item 5: ``quality.certify`` judges the quality sample as smg-project/providers-verifier certifies a
provider: tool-trigger F1 and tool-schema accuracy >= 0.98 with their intervals, think-leak rate 0, each request the
majority of its repeats; the bars stated in the report, the profile's own bars honoured."""

from __future__ import annotations

import json

import jsonschema

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.integrity import Breach
from kimi_deploy.check.quality import certify
from kimi_deploy.check.quality.accuracy import Sample, expects_call
from kimi_deploy.check.quality.settings import QualitySettings, resolve
from kimi_deploy.paths import check_report_schema
from kimi_deploy.profile import Profile
from quality_server import QualityServer


def _s(i, valid, expect=True, leak=False, answered=True):
    return Sample(i, "tool_calls" if valid is not None else "stop", valid, answered=answered, expect_call=expect,
                  breaches=(Breach("think_leak", "x"),) if leak else ())


def test_the_majority_of_repeats_decides_each_request_and_a_tie_fails():
    samples = [_s(0, True), _s(1, False), _s(2, True),      # request 0: valid, valid... see below
               _s(3, None), _s(4, None), _s(5, True)]       # request 1: 2 of 3 did not trigger
    rows = certify.per_request(samples, 3)
    assert rows == [{"expected": True, "triggered": True, "valid": True, "leak": False},
                    {"expected": True, "triggered": False, "valid": None, "leak": False}]
    tie = certify.per_request([_s(0, True), _s(1, False)], 2)
    assert tie[0]["valid"] is False  # one valid, one not: no majority for valid
    lost = certify.per_request([_s(0, None, answered=False), _s(1, True)], 2)
    assert lost[0]["triggered"] is True  # a repeat without an answer does not vote


def test_f1_counts_missed_and_extra_calls_and_its_interval_is_seeded():
    rows = [{"expected": True, "triggered": True}] * 90 + [{"expected": True, "triggered": False}] * 5 + \
        [{"expected": False, "triggered": True}] * 5
    assert certify.f1(rows) == 2 * 90 / (2 * 90 + 5 + 5)
    lo, hi = certify.f1_interval(rows)
    assert lo < certify.f1(rows) < hi and certify.f1_interval(rows) == (lo, hi)
    assert certify.f1([{"expected": False, "triggered": False}]) is None


def test_what_is_due_comes_from_the_label_else_tool_choice():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert expects_call({"tools": tools}) is True
    assert expects_call({"tools": tools, "tool_choice": "none"}) is False
    assert expects_call({"tools": tools, "_expect_tool_call": False}) is False
    assert expects_call({"messages": []}) is False


def _certify(url: str, **options):
    report = run_checks(CheckOptions(base_url=url, only=["quality.accuracy", "quality.certify"], deadline=300,
                                     **options))
    doc = report.to_json()
    jsonschema.Draft202012Validator(json.loads(check_report_schema().read_text())).validate(doc)
    return {r.id: r for r in report.results}, doc["quality"]


def test_a_good_server_is_certified_with_the_bars_stated():
    with QualityServer() as server:
        rows, quality = _certify(server.url, sample=50, repeats=3)
    assert len(server.requests) == 150  # every request three times
    row = rows["quality.certify"]
    assert row.status == "pass", row.detail
    assert "50 requests x 3 (majority of repeats)" in row.detail and "tool-trigger F1 >= 1.0000" in row.detail
    assert "(bar 0.98)" in row.detail and "think-leak rate 0.0000 (bar <= 0)" in row.detail
    cert = quality["certify"]
    assert cert["tool_trigger_f1"]["bar"] == cert["tool_schema_accuracy"]["bar"] == 0.98
    assert cert["think_leak_rate"]["bar"] == 0.0 and quality["accuracy"]["repeats"] == 3


def test_schema_errors_in_a_minority_of_repeats_pass_and_in_most_fail():
    """With every 3rd answer broken, majority of 3 repeats hides what a single answer shows."""
    with QualityServer(invalid_rate=0.1, seed=2) as server:
        rows, quality = _certify(server.url, sample=60, repeats=3)
    cert = quality["certify"]
    assert cert["tool_schema_accuracy"]["estimate"] > quality["accuracy"]["schema_accuracy"]["estimate"]
    with QualityServer(invalid_rate=0.5, seed=2) as server:
        rows, quality = _certify(server.url, sample=60, repeats=1)
    row = rows["quality.certify"]
    assert (row.status, row.kind) == ("fail", "schema_accuracy_low"), row.detail
    assert "schema accuracy >=" in row.detail and "(bar 0.98)" in row.detail


def test_a_leak_fails_the_certifier_and_the_profile_sets_its_own_bars():
    with QualityServer(think_leak_rate=1.0) as server:
        rows, _ = _certify(server.url, sample=10)
    assert (rows["quality.certify"].status, rows["quality.certify"].kind) == ("fail", "think_leak")
    profile = Profile.model_validate({"service": {"name": "k"}, "sglang": {"model_path": "/m"},
                                      "quality": {"min_tool_trigger_f1": 0.5, "certify_min_schema_accuracy": 0.4,
                                                  "repeats": 3}})
    settings = resolve(CheckOptions(), profile)
    assert (settings.min_tool_trigger_f1, settings.certify_min_schema_accuracy, settings.repeats) == (0.5, 0.4, 3)
    assert resolve(CheckOptions(repeats=5), profile).repeats == 5
    assert QualitySettings().min_tool_trigger_f1 == QualitySettings().certify_min_schema_accuracy == 0.98


def test_calls_missing_where_due_are_tool_trigger_low():
    """A server that answers every request in prose: F1 0, whole interval below 0.98."""
    rows = [{"expected": True, "triggered": False, "valid": None, "leak": False}] * 30
    cert = certify.measure(rows, QualitySettings(), 1)
    out = certify.outcome(cert)
    assert (out.status, out.kind) == ("fail", "tool_trigger_low")
    assert cert["tool_trigger_f1"]["estimate"] == 0.0
