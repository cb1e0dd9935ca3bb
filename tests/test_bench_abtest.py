"""bench compare's A/B verdicts: run-to-run spread, "beyond noise" only for non-overlapping run ranges
(Mann-Whitney U = 0, exact p), the speculative accept-length alarm and KV capacity from /server_info.

Results are built in the layout `kimi-deploy bench --runs K --json` writes (kimi_deploy/bench/report.py)."""

from __future__ import annotations

import json
import math

import pytest

from kimi_deploy.bench import abtest
from kimi_deploy.cli import cli


def point(c, tpots, *, ttft=60.0, tput=None, accept=None):
    runs = []
    for i, tpot in enumerate(tpots):
        runs.append({"index": i, "flush_cache": "ok", "spec_accept_length": accept[i] if accept else None,
                     "summary": {"completed": 8, "requests": 8, "tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": ttft + i},
                                 "e2e_ms": {"p50": 130.0 + i},
                                 "output_tokens_per_s": (tput[i] if tput else 1000.0 / tpot)}})
    summary = {"completed": 8 * len(tpots), "requests": 8 * len(tpots), "tpot_ms": {"p50": sorted(tpots)[len(tpots) // 2]},
               "ttft_ms": {"p50": ttft}, "e2e_ms": {"p50": 130.0}, "output_tokens_per_s": 1000.0 / tpots[0]}
    return {"concurrency": c, "request_rate": None, "num_prompts": 32, "warmup": 0, "summary": summary,
            "spec_accept_length": accept[-1] if accept else None, "runs": runs}


def result(label, points, runs=3, kv=None):
    return {"schema": "kimi-deploy.bench/1", "label": label, "model": "kimi",
            "config": {"mode": "closed-loop", "max_tokens": 256, "ignore_eos": False, "temperature": 0.0,
                       "extra_body": {}, "seed": 0, "runs": runs},
            "dataset": {"sha256": "x", "name": "d"},
            "server": {"server_info": {"max_total_num_tokens": kv} if kv else None, "server_info_status": "200"},
            "points": points}


NCCL = result("nccl", [point(1, [21.0, 21.3, 21.1], accept=[3.2, 3.21, 3.19]),
                       point(16, [30.0, 31.5, 29.8], accept=[3.2, 3.2, 3.21])], kv=443_000)
IPC = result("pcie-ipc", [point(1, [13.6, 13.8, 13.7], accept=[3.2, 3.22, 3.2]),
                          point(16, [29.5, 31.0, 30.2], accept=[3.2, 3.19, 3.21])], kv=431_000)


def test_the_rule_non_overlapping_ranges_with_the_exact_p_value():
    better = abtest.judge_metric("tpot_ms", [21.0, 21.3, 21.1], [13.6, 13.8, 13.7], lower_is_better=True)
    assert better.verdict == "better beyond noise" and better.p_value == pytest.approx(0.05)
    assert better.change == pytest.approx(13.7 / 21.1 - 1)
    assert better.base_spread == pytest.approx(0.3 / 21.1)
    overlap = abtest.judge_metric("tpot_ms", [30.0, 31.5, 29.8], [29.5, 31.0, 30.2], lower_is_better=True)
    assert overlap.verdict == "not distinguishable" and overlap.p_value is None
    worse = abtest.judge_metric("output_tokens_per_s", [100, 101, 102], [90, 91, 92], lower_is_better=False)
    assert worse.verdict == "worse beyond noise"
    assert abtest.judge_metric("tpot_ms", [20, 21], [10, 11], True).verdict == "too few runs"
    assert abtest.judge_metric("tpot_ms", [], [10, 11, 12], True).verdict == "not measured"
    assert abtest.exact_p(5, 5) == pytest.approx(1 / 252) and abtest.exact_p(3, 3) == pytest.approx(1 / math.comb(6, 3))


def test_a_large_median_gap_with_one_wild_run_is_not_distinguishable():
    """The medians are 10% apart, but one baseline run is as fast as the candidate: noise, not a gain."""
    v = abtest.judge_metric("tpot_ms", [20.0, 20.1, 17.9], [18.0, 18.1, 18.2], lower_is_better=True)
    assert v.verdict == "not distinguishable" and v.change < -0.09


def test_ab_report_per_point_and_the_kv_capacity():
    rep = abtest.ab([NCCL, IPC], ["nccl", "pcie-ipc"])
    by = {p.point: {m.metric: m.verdict for m in p.metrics} for p in rep.points}
    assert by["c=1"]["tpot_ms"] == "better beyond noise" and by["c=1"]["output_tokens_per_s"] == "better beyond noise"
    assert by["c=16"]["tpot_ms"] == "not distinguishable"
    assert by["c=1"]["ttft_ms"] == "not distinguishable"  # identical runs on both sides
    assert rep.alarms == []
    assert rep.kv_tokens == {"nccl": 443_000, "pcie-ipc": 431_000}
    assert any("KV capacity differs: pcie-ipc holds 431,000 tokens, 0.973x nccl's 443,000" in n for n in rep.notes)
    lines = abtest.verdict_lines(rep)
    assert lines[0].startswith("pcie-ipc c=1: TPOT p50 -35.1% better beyond noise (spread 1.4%/1.5%, p=0.05)")


def test_an_accept_length_drop_is_a_correctness_alarm():
    drop = result("fused", [point(1, [13.0, 13.1, 13.2], accept=[2.71, 2.75, 2.70]),
                            point(16, [29.0, 29.1, 29.2], accept=[3.19, 3.2, 3.22])])
    rep = abtest.ab([NCCL, drop], ["nccl", "fused"])
    (alarm,) = rep.alarms
    assert alarm.startswith("correctness alarm: fused at c=1: speculative accept length 2.71 vs nccl's 3.20")
    assert "every run below every nccl run" in alarm
    one_run = result("one", [point(1, [13.0], accept=[3.0])], runs=1)
    rep = abtest.ab([NCCL, one_run], ["nccl", "one"])
    assert rep.alarms and "more than 3% lower" in rep.alarms[0]
    assert any("fewer than 3 runs" in n for n in rep.notes)
    assert {m.verdict for p in rep.points for m in p.metrics} == {"too few runs"}


def test_compare_cli_prints_verdicts_alarms_and_json(tmp_path, cli_runner):
    paths = []
    for r in (NCCL, IPC, result("fused", [point(1, [13.0, 13.1, 13.2], accept=[2.71, 2.75, 2.70])])):
        paths.append(tmp_path / f"{r['label']}.json")
        paths[-1].write_text(json.dumps(r))
    res = cli_runner.invoke(cli, ["bench", "compare", *map(str, paths)])
    assert res.exit_code == 1, res.output  # an ALARM printed is in the exit status (issue #30 item 2)
    out = " ".join(res.output.split())
    assert "exit 1: 1 ALARM(s)" in out
    assert "beyond noise? (per point and metric" in out and "Mann-Whitney U = 0" in out
    assert "pcie-ipc c=1: TPOT p50 -35.1% better beyond noise" in out
    assert "pcie-ipc c=16: TPOT p50" in out and "not distinguishable" in out
    assert "ALARM: correctness alarm: fused at c=1" in out
    assert "KV capacity (tokens): nccl 443,000, pcie-ipc 431,000, fused ?" in out
    as_json = cli_runner.invoke(cli, ["bench", "compare", *map(str, paths), "--json"])
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["ab"]["kv_tokens"]["nccl"] == 443_000 and len(data["ab"]["alarms"]) == 1
    assert data["ab"]["points"][0]["metrics"][0]["verdict"] == "better beyond noise"


def test_compare_alarms_exit_1_unless_demoted_and_no_alarm_exits_0(tmp_path, cli_runner):
    paths = []
    for r in (NCCL, result("fused", [point(1, [13.0, 13.1, 13.2], accept=[2.71, 2.75, 2.70])])):
        paths.append(tmp_path / f"{r['label']}.json")
        paths[-1].write_text(json.dumps(r))
    demoted = cli_runner.invoke(cli, ["bench", "compare", *map(str, paths), "--no-fail-on-alarm"])
    assert demoted.exit_code == 0 and "ALARM: correctness alarm" in demoted.output
    (tmp_path / "ipc.json").write_text(json.dumps(IPC))
    quiet = cli_runner.invoke(cli, ["bench", "compare", str(paths[0]), str(tmp_path / "ipc.json")])
    assert quiet.exit_code == 0 and "ALARM" not in quiet.output


def test_off_a_terminal_no_report_line_is_hard_wrapped(tmp_path, cli_runner):
    """Issue 43 item 3: off a terminal, bench compare wrapped at rich's 80 columns and split the ALARM: line, so a
    log grep for it found half. Every ALARM:, warning: and verdict line is now whole, however long."""
    label = "fused-allreduce-candidate-with-a-long-descriptive-label"
    paths = []
    for r in (NCCL, result(label, [point(1, [13.0, 13.1, 13.2], accept=[2.71, 2.75, 2.70])])):
        paths.append(tmp_path / f"{len(paths)}.json")
        paths[-1].write_text(json.dumps(r))
    res = cli_runner.invoke(cli, ["bench", "compare", *map(str, paths)])
    lines = res.output.splitlines()
    (alarm,) = [line for line in lines if line.startswith("ALARM:")]
    assert len(alarm) > 80 and alarm.startswith(f"ALARM: correctness alarm: {label} at c=1: speculative accept")
    assert "every run below every nccl run" in alarm  # the end of the alarm, on the same line
    assert max(len(line) for line in lines) > 80  # nothing was folded at 80 columns
