"""Issue 41, item 2: reasoning integrity. Each rule on one answer (:mod:`kimi_deploy.check.integrity`), and
``quality.reasoning``'s rates over a sample: a server that leaks its reasoning into content in 2 % of answers fails
with ``think_leak`` and the measured rate against the bar of 0; a well-behaved server passes (the scripted loopback
server, tests/quality_server.py; SGLang 0.5.23's and vLLM 0.33.0's own serving code, the replays)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import SGLANG_API_KEY, VLLM_API_KEY
from kimi_deploy.check import CheckOptions, integrity, run_checks
from kimi_deploy.check.quality.settings import QualitySettings, resolve
from kimi_deploy.paths import check_report_schema
from kimi_deploy.profile import Profile
from quality_server import QualityServer

THOUGHT = "The user asks for the weather in Paris; get_weather answers that, so I will call it now."


def _rules(content, reasoning, finish="stop", calls=False, thinking=True):
    return [b.rule for b in integrity.judge(content, reasoning, finish_reason=finish, has_calls=calls,
                                            thinking=thinking)]


@pytest.mark.parametrize("content, reasoning, finish, calls, thinking, rules", [
    ("It is 18 °C.", THOUGHT, "stop", False, True, []),
    (None, THOUGHT, "tool_calls", True, True, []),                                   # a call: no text due
    (THOUGHT + "</think>It is 18 °C.", None, "stop", False, True, ["think_leak", "missing_reasoning"]),
    ("<think>" + THOUGHT + "</think>Yes.", "", "stop", False, None, ["think_leak"]),  # no parser: still a leak
    (THOUGHT + "\n\nIt is 18 °C.", THOUGHT, "stop", False, True, ["think_leak"]),    # the reasoning twice
    ("Yes.", "Yes.", "stop", False, True, []),                                      # a short thought is no leak
    ("", THOUGHT, "stop", False, True, ["empty_stop"]),                              # Kimi-K2 issue 128's shape
    ("   ", THOUGHT, "length", False, True, []),                                    # cut: model_declined's business
    ("It is 18 °C.", None, "stop", False, True, ["missing_reasoning"]),
    ("It is 18 °C.", None, "stop", False, False, []),                                # thinking off: none due
])
def test_each_rule_on_one_answer(content, reasoning, finish, calls, thinking, rules):
    assert _rules(content, reasoning, finish, calls, thinking) == rules


def test_thinking_is_due_unless_switched_off_and_only_with_a_reasoning_parser():
    assert integrity.thinking_on({}, True) is True
    assert integrity.thinking_on({"chat_template_kwargs": {"thinking": False}}, True) is False
    assert integrity.thinking_on({"chat_template_kwargs": {"enable_thinking": False}}, True) is False
    assert integrity.thinking_on({"chat_template_kwargs": {"thinking": False}}, False) is None


def _reasoning(url: str, sample: int = 100, **options):
    report = run_checks(CheckOptions(base_url=url, only=["quality.reasoning"], sample=sample, deadline=300,
                                     **options))
    (row,) = report.results
    doc = report.to_json()
    jsonschema.Draft202012Validator(json.loads(check_report_schema().read_text())).validate(doc)
    return row, doc["quality"]["reasoning"]


def test_a_server_that_leaks_reasoning_in_two_percent_of_answers_fails_think_leak_with_the_rate():
    with QualityServer(think_leak_rate=0.02, seed=5) as server:
        row, rates = _reasoning(server.url, sample=200)
    leaked = server.faults["think_leak"]
    assert 1 <= leaked <= 10  # about 2 % of 200, seeded: the same count every run
    rule = rates["rules"]["think_leak"]
    assert (rule["count"], rule["of"], rule["bar"], rule["verdict"]) == (leaked, 200, 0.0, "fail")
    assert rule["rate"] == pytest.approx(leaked / 200)
    assert (row.status, row.kind) == ("fail", "think_leak")
    assert f"think_leak {leaked} of 200 ({100 * leaked / 200:.2f} %, bar 0.00 %)" in row.detail
    assert "</think>" in row.evidence and "--reasoning-parser kimi_k2" in row.fix
    assert rates["verdict"] == "fail"


def test_the_profile_sets_its_own_bars():
    profile = Profile.model_validate({"service": {"name": "k"}, "sglang": {"model_path": "/m"},
                                      "quality": {"max_think_leak_rate": 0.05}})
    settings = resolve(CheckOptions(), profile)
    assert settings.reasoning_bars == {"think_leak": 0.05, "empty_stop": 0.0, "missing_reasoning": 0.0}
    assert QualitySettings().reasoning_bars == {"think_leak": 0.0, "empty_stop": 0.0, "missing_reasoning": 0.0}
    with QualityServer(think_leak_rate=0.02, seed=5) as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["quality.reasoning"], sample=200, deadline=300,
                                         profile=profile))
    assert report.results[0].status == "pass", report.results[0]
    assert report.quality["reasoning"]["rules"]["think_leak"]["bar"] == 0.05


def test_a_well_behaved_server_passes_and_shares_the_accuracy_sample():
    with QualityServer() as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy", "quality.reasoning"],
                                         sample=40, deadline=300))
    assert [(r.id, r.status) for r in report.results] == [("quality.accuracy", "pass"), ("quality.reasoning", "pass")]
    assert len(server.requests) == 40  # one sample, two verdicts
    rules = report.quality["reasoning"]["rules"]
    assert {k: r["count"] for k, r in rules.items()} == {"think_leak": 0, "empty_stop": 0, "missing_reasoning": 0}
    assert rules["missing_reasoning"]["of"] == 40  # the scripted server reports kimi_k2: thinking is due


def test_no_reasoning_where_thinking_is_due_is_missing_reasoning():
    with QualityServer(thinking="never") as server:
        row, rates = _reasoning(server.url, sample=20)
    assert (row.status, row.kind) == ("fail", "missing_reasoning")
    assert rates["rules"]["missing_reasoning"]["count"] == 20


@pytest.mark.sglang
def test_sglang_replay_has_no_reasoning_breach(replay):
    row, rates = _reasoning(replay["unpatched"].url(), sample=24, api_key=SGLANG_API_KEY,
                            model="moonshotai/Kimi-K2.5")
    assert row.status == "pass", (row.detail, row.evidence)
    assert rates["answers"] == 24 and rates["rules"]["missing_reasoning"]["of"] > 0


@pytest.mark.vllm
def test_vllm_replay_has_no_reasoning_breach(vllm_replay):
    row, rates = _reasoning(vllm_replay["parsers"].url(), sample=24, api_key=VLLM_API_KEY,
                            model="moonshotai/Kimi-K2.5")
    assert row.status == "pass", (row.detail, row.evidence)
    assert rates["answers"] == 24
