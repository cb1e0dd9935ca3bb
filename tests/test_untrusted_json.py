"""JSON from outside the kit nested 100,000 deep, or of the wrong shape, is bad input, never a traceback.

``json.loads`` raises RecursionError past Python's stack, which nobody's ``except ValueError`` caught:
``bench --extra-body``, a ``bench --dataset`` line, a results file for ``bench compare`` (files meant for
sharing), a safetensors header ``doctor`` reads from downloaded weights, and the nightly report ``status``
summarises. One helper (:func:`kimi_deploy.wire.limits.parse_json`) turns it into the ValueError each caller
handles. A results file with the right schema name but missing fields stopped ``bench compare`` with a
KeyError traceback.
"""

from __future__ import annotations

import json
import struct

import pytest

from helpers import run_cli
from kimi_deploy.facts.modeldir import safetensors_expected_size
from kimi_deploy.errors import ExitCode
from kimi_deploy.wire.limits import parse_json
from kimi_deploy.host.status import last_check

DEEP = "[" * 100_000 + "]" * 100_000


def test_parse_json_turns_deep_nesting_into_a_value_error():
    with pytest.raises(ValueError, match="nested too deep"):
        parse_json(DEEP)
    assert parse_json('{"a": [1]}') == {"a": [1]}


def test_bench_extra_body_nested_too_deep_is_a_usage_error():
    deep = "[" * 30_000 + "]" * 30_000  # one argv string is at most 128 KiB
    result = run_cli(["bench", "--base-url", "http://127.0.0.1:9", "--extra-body", deep, "--num-prompts", "1"])
    assert result.exit_code == ExitCode.USAGE and "--extra-body must be a JSON object" in result.stderr


def test_a_dataset_line_nested_too_deep_is_a_usage_error(tmp_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"messages": ' + DEEP + "}\n")
    result = run_cli(["bench", "--base-url", "http://127.0.0.1:9", "--dataset", str(dataset), "--num-prompts", "1"])
    assert result.exit_code == ExitCode.USAGE and "dataset line 1 is not JSON" in result.stderr, result.stderr


@pytest.mark.parametrize("text, words", [
    (DEEP, "nested too deep"),
    (json.dumps({"schema": "kimi-deploy.bench/1", "points": [{"concurrency": "x"}]}), "is not one bench wrote"),
], ids=["nested too deep", "schema name without the fields"])
def test_bench_compare_of_a_bad_results_file_is_a_usage_error(tmp_path, text, words):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = run_cli(["bench", "compare", str(bad), str(bad)])
    assert result.exit_code == ExitCode.USAGE and words in result.stderr, result.stderr


@pytest.mark.parametrize("header", [DEEP.encode(), b"[1, 2]"], ids=["nested too deep", "not an object"])
def test_a_safetensors_header_that_is_no_object_has_no_expected_size(tmp_path, header):
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(struct.pack("<Q", len(header)) + header)
    assert safetensors_expected_size(shard) is None


def test_a_nightly_report_nested_too_deep_reads_as_not_valid_json(tmp_path):
    report = tmp_path / "check-report.json"
    report.write_text(DEEP)
    assert last_check(report)["detail"] == "not valid JSON"
