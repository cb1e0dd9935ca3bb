"""Issue 27, statistical tool-call accuracy: the 95 % interval covers the true schema accuracy in >= 95 % of seeded
runs, and the verdict flips at the profile's threshold.

Coverage is shown twice: cheaply, by running the estimator over 2,000 seeded simulated samples (the outcomes a
server with a known invalid-argument rate produces); and end to end, by a few real HTTP runs of
``quality.accuracy`` against a scripted loopback server (tests/quality_server.py) that breaks arguments at a
known, seeded rate.
"""

from __future__ import annotations

import json
import math
import random

import jsonschema
import pytest

from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.quality import accuracy, dataset, stats
from kimi_deploy.check.reports import to_prometheus
from kimi_deploy.errors import UsageError
from kimi_deploy.paths import check_report_schema
from quality_server import QualityServer

#: K2VV's published schema accuracy of vLLM serving K2-Thinking: the true accuracy of the simulated server.
TRUE_ACCURACY = 0.8722
N = 200
RUNS = 2000


def _exact_coverage(n: int, p: float, interval) -> float:
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)
               if interval(k, n)[0] <= p <= interval(k, n)[1])


def test_interval_covers_the_true_accuracy_in_at_least_95_percent_of_2000_seeded_runs():
    covered = 0
    for seed in range(RUNS):
        rng = random.Random(seed)
        valid = sum(rng.random() < TRUE_ACCURACY for _ in range(N))
        lo, hi = stats.wilson_interval(valid, N)
        covered += lo <= TRUE_ACCURACY <= hi
    assert covered / RUNS >= 0.95, covered / RUNS
    print(f"coverage {100 * covered / RUNS:.2f} % of {RUNS} seeded runs (n={N}, p={TRUE_ACCURACY})")


def test_exact_coverage_of_the_interval_is_at_least_nominal_over_the_range_that_matters():
    worst = min(_exact_coverage(n, p / 1000, stats.wilson_interval)
                for n in (30, 100, 200, 500) for p in range(500, 996, 15))
    assert worst >= 0.95, worst


def _plain_wilson(k: int, n: int) -> tuple[float, float]:
    z = stats.Z95
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z / d * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return c - h, c + h


def test_why_the_continuity_correction_plain_wilson_falls_short_here():
    assert _exact_coverage(N, TRUE_ACCURACY, _plain_wilson) < 0.95 <= _exact_coverage(N, TRUE_ACCURACY,
                                                                                     stats.wilson_interval)


def test_interval_edges():
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = stats.wilson_interval(200, 200)
    assert hi == 1.0 and 0.97 < lo < 1.0
    lo, hi = stats.wilson_interval(0, 50)
    assert lo == 0.0 and hi < 0.1
    with pytest.raises(ValueError):
        stats.wilson_interval(3, 2)


@pytest.mark.parametrize("valid, threshold, verdict", [
    (180, 0.9552, "fail"),   # 90 %: interval 84.9-93.9 %, all below 95.52 %
    (186, 0.9552, "pass"),   # 93 %: interval reaches 95.9 %, within noise of the threshold
])
def test_verdict_flips_at_the_threshold(valid, threshold, verdict):
    samples = [accuracy.Sample(i, "tool_calls", i < valid) for i in range(200)]
    acc = accuracy.summary(samples, planned=200, threshold=threshold)
    assert acc["verdict"] == verdict
    upper = acc["schema_accuracy"]["upper"]
    # just above the upper bound it fails, at it it passes: the flip is at the threshold
    assert accuracy.summary(samples, planned=200, threshold=upper + 1e-9)["verdict"] == "fail"
    assert accuracy.summary(samples, planned=200, threshold=upper)["verdict"] == "pass"
    outcome = accuracy.outcome({**acc, "dataset": {}, "deadline_s": 1}, samples)
    assert outcome.status == verdict and (outcome.kind == "schema_accuracy_low" or verdict == "pass")


def _bodies(data: dataset.Dataset) -> list[dict]:
    with data.reader() as reader:
        return [reader.request(case).body for case in data.sample()]


def test_kit_dataset_loads_and_every_tool_schema_has_a_required_property():
    data = dataset.load(sample=1000)
    assert data.requests >= 20 and data.invalid_count == 0
    for body in _bodies(data):
        assert body["messages"] and body["tools"]
        assert all(m["role"] != "_input" for m in body["messages"])  # K2VV's _input is sent as system
        for tool in body["tools"]:
            jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
            assert tool["function"]["parameters"]["required"]


def test_k2vv_format_is_read_and_hostile_files_are_refused(tmp_path):
    good = tmp_path / "k2vv.jsonl"
    good.write_bytes(b"\xef\xbb\xbf" + json.dumps({"model": "kimi-k2", "messages": [{"role": "_input", "content": "s"},
                     {"role": "user", "content": "hi"}], "tools": [], "temperature": 1.0}).encode() + b"\n\n")
    data = dataset.load(good, sample=5)
    assert _bodies(data) == [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                              "tools": [], "temperature": 1.0}] * 5
    for content, words in ((b"{not json\n", "line 1: not JSON"), (b'{"tools": []}\n', "messages"),
                           (b'{"messages": [{"role": "user"}], "tools": [{"function": {"name": "f", '
                            b'"parameters": {"type": "objekt"}}}]}\n', "not a valid 2020-12 schema"),
                           (b"\xff\xfe\n", "not UTF-8"), (b"\n\n", "no request")):
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(content)
        with pytest.raises(UsageError, match=words):
            dataset.load(bad)


def _accuracy_run(server: QualityServer, sample: int, threshold: float | None = None, concurrency: int = 4):
    return run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy"], sample=sample,
                                   quality_concurrency=concurrency, min_schema_accuracy=threshold, deadline=300))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_real_http_runs_contain_the_servers_true_rate(seed):
    """Three seeded runs of 200 requests against a server breaking arguments at 12.78 % (1 - K2VV's vLLM figure)."""
    with QualityServer(invalid_rate=1 - TRUE_ACCURACY, seed=seed) as server:
        report = _accuracy_run(server, N, threshold=0.95)
    acc = report.quality["accuracy"]
    assert acc["sent"] == acc["answered"] == acc["tool_call_answers"] == N
    assert acc["valid"] == N - server.invalid  # every broken answer was counted, no valid one was
    sa = acc["schema_accuracy"]
    assert sa["lower"] <= TRUE_ACCURACY <= sa["upper"]
    assert acc["error_classes"] == {"schema_violation": server.invalid}
    row = report.results[0]
    assert row.id == "quality.accuracy" and row.status == "fail" and row.kind == "schema_accuracy_low"
    assert row.fix and "check compare" in row.fix
    doc = report.to_json()
    jsonschema.Draft202012Validator(json.loads(check_report_schema().read_text())).validate(doc)
    prom = to_prometheus(report)
    assert f"kimi_deploy_check_schema_accuracy_lower_ratio {sa['lower']:.6g}" in prom
    assert f"kimi_deploy_check_schema_accuracy_upper_ratio {sa['upper']:.6g}" in prom


def test_a_healthy_server_passes_and_streamed_bodies_are_judged_too(tmp_path):
    data = tmp_path / "d.jsonl"
    lines = [json.loads(line) for line in dataset.KIT_SAMPLES.read_text().splitlines()]
    data.write_text("".join(json.dumps({**b, "stream": k % 2 == 0}) + "\n" for k, b in enumerate(lines)))
    with QualityServer() as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy"], sample=48, dataset=data,
                                         deadline=120))
    acc = report.quality["accuracy"]
    assert report.results[0].status == "pass", report.results[0].detail
    assert acc["valid"] == acc["tool_call_answers"] == 48 and acc["finish_reasons"] == {"tool_calls": 48}
    assert sum(bool(b.get("stream")) for b in server.requests) == 24


def test_the_tiers_deadline_bounds_the_sample():
    with QualityServer() as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy"], sample=100,
                                         quality_deadline=0.000001, deadline=60))
    acc = report.quality["accuracy"] if report.quality else None
    row = report.results[0]
    assert row.status == "fail" and row.kind == "timeout", row
    assert acc is not None and acc["sent"] == 0


def test_an_unreadable_dataset_is_exit_2_before_anything_is_sent(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    with QualityServer() as server:
        with pytest.raises(UsageError):
            run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy"], dataset=bad))
    assert server.requests == []


@pytest.mark.parametrize("every, status, kind", [(2, "fail", "server_error"), (25, "pass", None)])
def test_requests_without_an_answer_are_error_classes_and_fail_the_check_past_10_percent(every, status, kind):
    with QualityServer(error_every=every) as server:
        report = _accuracy_run(server, 100, concurrency=1)
    acc, row = report.quality["accuracy"], report.results[0]
    assert acc["errors"] == 100 // every and acc["error_classes"] == {"server_error": 100 // every}
    assert acc["answered"] == acc["tool_call_answers"] == acc["valid"] == 100 - 100 // every
    assert (row.status, row.kind) == (status, kind), row.detail
    if status == "pass":
        assert "errors: server_error 4" in row.detail


def test_a_named_forced_call_ending_with_stop_is_a_tool_call_answer():
    """vLLM 0.33.0 (and OpenAI's API) end a call forced by a named tool_choice with finish_reason stop."""
    from kimi_deploy.check.completion_rules import Message, ToolCall

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": ["a"]}}}]
    msg = Message(None, None, [ToolCall("functions.f:0", "f", '{"a": 1}')], "stop")
    assert accuracy.classify(0, msg, tools, named=True).valid is True
    unnamed = accuracy.classify(0, msg, tools)
    assert unnamed.valid is None and unnamed.kind == "finish_reason_mismatch"
