"""Issue 27, `kimi-deploy check compare A.json B.json`: a change of schema accuracy beyond sampling noise exits 1
on a drop; within noise, or a rise, exits 0; files that are no such report exit 2. The reports come from the real
CLI (`check --sample N --json PATH --prom PATH`) against scripted loopback servers (tests/quality_server.py)."""

from __future__ import annotations

import json
import math

import pytest

from helpers import run_cli
from kimi_deploy.check.quality.stats import Proportion, two_proportion_test
from quality_server import QualityServer


def test_two_proportion_test_matches_a_hand_computation():
    # 190/200 against 170/200: pooled 0.9, se = sqrt(0.9*0.1*(2/200)) = 0.03, z = -0.1/0.03 = -3.333
    c = two_proportion_test(Proportion(190, 200), Proportion(170, 200))
    assert math.isclose(c.z, -10 / 3, rel_tol=1e-9)
    assert math.isclose(c.p_value, math.erfc(10 / 3 / math.sqrt(2)), rel_tol=1e-12) and c.p_value < 0.001
    assert c.drop and c.significant
    same = two_proportion_test(Proportion(190, 200), Proportion(188, 200))
    assert not same.significant and not same.drop
    assert two_proportion_test(Proportion(5, 5), Proportion(5, 5)).p_value == 1.0
    assert two_proportion_test(Proportion(0, 0), Proportion(5, 5)).p_value == 1.0


def _report(tmp_path, name: str, invalid_rate: float, seed: int, sample: int = 150):
    path, prom = tmp_path / f"{name}.json", tmp_path / f"{name}.prom"
    with QualityServer(invalid_rate=invalid_rate, seed=seed) as server:
        result = run_cli(["check", "--base-url", server.url, "--only", "quality.accuracy", "--sample", str(sample),
                          "--min-schema-accuracy", "0.5", "--json", str(path), "--prom", str(prom)])
    assert result.exit_code == 0, result.stdout + result.stderr
    return path, prom


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    return {"good": _report(tmp, "good", 0.02, 1), "same": _report(tmp, "same", 0.02, 2),
            "bad": _report(tmp, "bad", 0.20, 3)}


def test_the_cli_writes_the_accuracy_into_json_and_prom(reports):
    path, prom = reports["good"]
    acc = json.loads(path.read_text())["quality"]["accuracy"]
    assert acc["requests"] == acc["sent"] == 150 and acc["verdict"] == "pass"
    text = prom.read_text()
    for name in ("schema_accuracy_ratio", "schema_accuracy_lower_ratio", "schema_accuracy_upper_ratio",
                 "schema_accuracy_threshold_ratio", "tool_call_answers"):
        assert f"kimi_deploy_check_{name} " in text


def test_a_drop_beyond_noise_exits_1(reports):
    result = run_cli(["check", "compare", str(reports["good"][0]), str(reports["bad"][0])])
    assert result.exit_code == 1, result.stdout
    assert "a drop beyond sampling noise" in result.stdout


def test_a_rise_and_a_change_within_noise_exit_0(reports):
    rise = run_cli(["check", "compare", str(reports["bad"][0]), str(reports["good"][0]), "--json"])
    assert rise.exit_code == 0 and json.loads(rise.stdout)["verdict"] == "rise"
    same = run_cli(["check", "compare", str(reports["good"][0]), str(reports["same"][0]), "--json"])
    doc = json.loads(same.stdout)
    assert same.exit_code == 0 and doc["verdict"] == "within_noise" and doc["same_dataset"] is True


def test_files_that_are_no_accuracy_report_exit_2(reports, tmp_path):
    plain = tmp_path / "plain.json"
    doc = json.loads(reports["good"][0].read_text())
    doc.pop("quality")
    plain.write_text(json.dumps(doc))
    for bad, words in ((plain, "no quality.accuracy"), (reports["good"][1], "is not JSON"),
                       (tmp_path / "missing.json", "cannot read")):
        result = run_cli(["check", "compare", str(reports["good"][0]), str(bad)])
        assert result.exit_code == 2 and words in result.stderr, result.stderr


def test_a_report_that_measured_nothing_leaves_nothing_to_compare_exit_2(reports, tmp_path):
    """Issue 43: a server whose every quality request failed gives a report with no tool-call answer; comparing it
    said "within sampling noise", exit 0, and a CI gate built on it passed. Now exit 2, naming the empty side."""
    empty = tmp_path / "empty.json"
    with QualityServer(error_every=1) as server:  # every chat request answered HTTP 500
        run_cli(["check", "--base-url", server.url, "--only", "quality.accuracy", "--sample", "10", "--json",
                 str(empty)])
    assert json.loads(empty.read_text())["quality"]["accuracy"]["tool_call_answers"] == 0
    good = str(reports["good"][0])
    for a, b, named in ((good, str(empty), [str(empty)]), (str(empty), good, [str(empty)]),
                        (str(empty), str(empty), [str(empty)])):
        for extra in ([], ["--json"]):
            result = run_cli(["check", "compare", a, b, *extra])
            assert result.exit_code == 2, result.stdout + result.stderr
            assert "nothing to compare" in result.stderr and all(n in result.stderr for n in named)
            assert "within sampling noise" not in result.stdout
