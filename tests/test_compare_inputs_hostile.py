"""``check compare`` and ``bench compare`` on files from someone else (issue #38): a file that is not one the kit
wrote is exit 2 naming the field, never a traceback, and exit 1 is kept for a measured regression.

Before: ``Infinity`` or a 400-digit count in a check report raised OverflowError (exit 1, the "accuracy dropped"
code); floats and strings were turned into counts; a huge concurrency or a string median in a bench result raised.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import run_cli
from kimi_deploy.check.quality.compare import load as load_report
from kimi_deploy.check.quality.stats import Proportion, two_proportion_test
from kimi_deploy.errors import ExitCode, UsageError

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def real_report(tmp_path_factory):
    """A report written by a real run of the quality tier (so it validates against the schema as the kit writes it)."""
    from kimi_deploy.check import CheckOptions, run_checks
    from quality_server import QualityServer

    with QualityServer() as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["quality.accuracy"], sample=20, deadline=120))
    return report.to_json()


def _with_counts(doc: dict, valid: int, n: int) -> dict:
    out = copy.deepcopy(doc)
    acc = out["quality"]["accuracy"]
    p = Proportion(valid, n)
    lo, hi = p.interval
    acc.update(requests=n, sent=n, answered=n, tool_call_answers=n, valid=valid, finish_reasons={"tool_calls": n})
    acc["schema_accuracy"].update(estimate=p.estimate, lower=lo, upper=hi)
    return out


def _compare(tmp_path: Path, a: object, b: object | str):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(b if isinstance(b, str) else json.dumps(b))
    return run_cli(["check", "compare", str(pa), str(pb)])


@pytest.mark.parametrize("field, raw, words", [
    ("valid", "Infinity", "Infinity is not a JSON number"),
    ("valid", "1e400", "out of a double's range"),
    ("tool_call_answers", "1" + "0" * 400, "tool_call_answers"),
    ("valid", "17.5", "quality.accuracy.valid"),
    ("valid", '"17"', "quality.accuracy.valid"),
    ("valid", "true", "quality.accuracy.valid"),
    ("valid", "-1", "quality.accuracy.valid"),
])
def test_a_bad_count_is_exit_2_naming_the_field(tmp_path, real_report, field, raw, words):
    good = _with_counts(real_report, 19, 20)
    text = json.dumps(good).replace(f'"{field}": {good["quality"]["accuracy"][field]}', f'"{field}": {raw}', 1)
    result = _compare(tmp_path, good, text)
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert words in result.stderr, result.stderr


def test_exit_1_only_for_a_drop_beyond_noise(tmp_path, real_report):
    assert _compare(tmp_path, _with_counts(real_report, 20, 20), _with_counts(real_report, 19, 20)).exit_code == 0
    big_a, big_b = _with_counts(real_report, 1990, 2000), _with_counts(real_report, 1700, 2000)
    assert _compare(tmp_path, big_a, big_b).exit_code == ExitCode.FAILED


_values = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.integers(10**300, 10**400),
                    st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=6), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value) -> None:
    """Set ``path`` of ``doc`` to ``value``; nothing when an earlier mutation removed its parent."""
    node = doc
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)):
        node[path[-1]] = value


@FUZZ
@given(data=st.data())
def test_fuzz_check_compare_never_tracebacks_and_exit_1_means_a_drop(tmp_path, real_report, data):
    a = _with_counts(real_report, data.draw(st.integers(0, 50)), 50)
    b = copy.deepcopy(a)
    paths = sorted(_paths(b), key=str)
    counts = [("quality", "accuracy", k) for k in ("valid", "tool_call_answers", "requests", "sent")]
    for _ in range(data.draw(st.integers(1, 3))):  # half the mutations hit the counts compare computes with
        _set(b, data.draw(st.one_of(st.sampled_from(counts), st.sampled_from(paths))), data.draw(_values))
    result = _compare(tmp_path, a, b)  # run_cli does not catch exceptions: a traceback fails the test
    assert result.exit_code in (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE), result.stderr
    if result.exit_code == ExitCode.FAILED:
        pa, pb = load_report(tmp_path / "a.json"), load_report(tmp_path / "b.json")
        test = two_proportion_test(pa.proportion, pb.proportion)
        assert test.significant and test.drop


# -- bench compare --------------------------------------------------------------------------------------------------

def _bench(conc=(1, 2), tpot=20.0) -> dict:
    points = [{"concurrency": c, "request_rate": None, "num_prompts": 8, "warmup": 0, "spec_accept_length": None,
               "runs": [], "summary": {"completed": 8, "requests": 8, "errors": 0, "output_tokens_per_s": 100.0,
                                       "tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 60.0},
                                       "e2e_ms": {"p50": 130.0}}} for c in conc]
    return {"schema": "kimi-deploy.bench/1", "label": "x", "model": "m",
            "config": {"mode": "closed-loop", "max_tokens": 32}, "dataset": {"sha256": "x"}, "points": points}


def _bench_compare(tmp_path: Path, a: object, b: object | str):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(b if isinstance(b, str) else json.dumps(b))
    return run_cli(["bench", "compare", str(pa), str(pb)])


@pytest.mark.parametrize("path, value, words", [
    (("points", 0, "concurrency"), 10**400, "points[0].concurrency"),
    (("points", 0, "summary", "tpot_ms", "p50"), "fast", "points[0].summary.tpot_ms"),
    (("points", 0, "request_rate"), -3, "points[0]"),
    (("config", "mode"), 7, "config.mode"),
    (("points",), "none", "points"),
])
def test_a_bad_bench_field_is_exit_2_naming_it(tmp_path, path, value, words):
    b = _bench()
    _set(b, path, value)
    result = _bench_compare(tmp_path, _bench(), b)
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert words in result.stderr, result.stderr


@FUZZ
@given(data=st.data())
def test_fuzz_bench_compare_never_tracebacks(tmp_path, data):
    b = _bench()
    paths = sorted(_paths(b), key=str)
    hot = [("points", 0, "concurrency"), ("points", 1, "summary", "tpot_ms", "p50"), ("points", 0, "request_rate"),
           ("points", 1, "summary", "output_tokens_per_s"), ("config", "mode")]
    for _ in range(data.draw(st.integers(1, 3))):
        _set(b, data.draw(st.one_of(st.sampled_from(hot), st.sampled_from(paths))), data.draw(_values))
    result = _bench_compare(tmp_path, _bench(), b)
    assert result.exit_code in (ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE), result.stderr


def test_a_report_read_is_bounded(tmp_path, monkeypatch):
    from kimi_deploy.wire import inputs

    monkeypatch.setattr(inputs, "REPORT_FILE_BYTES", 1024)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 4096}))
    with pytest.raises(UsageError, match="over"):
        inputs.read_json(big, "the report", "hint", max_bytes=1024)
