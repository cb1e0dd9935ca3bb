"""Metric arithmetic on hand-built event timelines: exact values (definitions in kimi_deploy.bench.metrics)."""

from __future__ import annotations

import numpy
import pytest

from kimi_deploy.bench.loadgen import spec_accept_length
from kimi_deploy.bench.metrics import RequestRecord, distribution, percentile, summarize


def burst_request(t0: float = 0.0) -> RequestRecord:
    """TTFT 200 ms, then a 4-token chunk every 20 ms: 4 chunks, 16 tokens, stream ends with the last chunk."""
    times = [t0 + 0.200, t0 + 0.220, t0 + 0.240, t0 + 0.260]
    return RequestRecord(t_sent=t0, t_end=t0 + 0.260, chunk_times=times, output_tokens=16, prompt_tokens=10,
                         text_chars=64)


def test_multi_token_chunks_give_exact_ttft_tpot_itl_and_tokens_per_chunk():
    r = burst_request()
    assert r.ok and not r.usage_missing
    assert r.ttft == pytest.approx(0.200, abs=1e-12)
    assert r.e2e == pytest.approx(0.260, abs=1e-12)
    # (E2E - TTFT) / (tokens - 1) = 60 ms / 15, not 60 ms / 3 chunks
    assert r.tpot == pytest.approx(0.004, abs=1e-12)
    assert r.itls == pytest.approx([0.020, 0.020, 0.020])
    assert r.tokens_per_chunk == 4.0
    row = r.row()
    assert row["ttft_ms"] == 200.0 and row["tpot_ms"] == 4.0 and row["e2e_ms"] == 260.0 and row["chunks"] == 4


def test_summary_pools_requests_and_divides_by_the_window():
    a = burst_request(0.0)
    b = burst_request(0.100)  # overlapping: window 0 -> 0.360 s
    b.chunk_times = [0.100 + 0.300, 0.100 + 0.330]  # TTFT 300 ms, two 8-token chunks
    b.t_end = 0.100 + 0.330
    b.output_tokens = 16
    s = summarize([[a, b]], slo={"ttft": 250})
    assert s.requests == 2 and s.completed == 2 and s.errors == 0
    assert s.window_s == pytest.approx(0.430)
    assert s.output_tokens == 32
    assert s.output_tokens_per_s == pytest.approx(32 / 0.430)
    assert s.requests_per_s == pytest.approx(2 / 0.430)
    assert s.goodput_requests_per_s == pytest.approx(1 / 0.430)  # b misses TTFT 250 ms
    assert s.ttft_ms["p50"] == pytest.approx(250.0) and s.ttft_ms["mean"] == pytest.approx(250.0)
    assert s.tpot_ms["p50"] == pytest.approx((4.0 + 30 / 15) / 2)
    assert s.itl_ms["n"] == 4 and s.itl_ms["p50"] == pytest.approx(20.0)
    assert s.tokens_per_chunk["p50"] == pytest.approx(6.0)  # 4 and 8
    assert s.chunks == 6 and s.chunks_per_s == pytest.approx(6 / 0.430)


def test_missing_usage_is_flagged_never_guessed():
    r = burst_request()
    r.output_tokens = None
    assert r.ok and r.usage_missing
    assert r.tpot is None and r.tokens_per_chunk is None
    assert r.meets({"ttft": 1000}) is True
    assert r.meets({"tpot": 1000}) is False  # unknown TPOT cannot meet a TPOT SLO
    s = summarize([[r, burst_request(1.0)]], slo={"tpot": 10})
    assert s.requests_without_usage == 1
    assert s.output_tokens == 16  # only the request that reported usage
    assert s.tpot_ms["n"] == 1
    assert s.goodput_requests_per_s == pytest.approx(1 / s.window_s)
    only = summarize([[r]])
    assert only.output_tokens_per_s is None and only.requests_without_usage == 1
    assert r.row()["usage_missing"] is True and r.row()["tpot_ms"] is None


def test_error_mid_stream_is_excluded_and_counted():
    bad = RequestRecord(t_sent=0.0, t_end=0.230, chunk_times=[0.200, 0.220], error="error frame: out of memory")
    good = burst_request(0.0)
    s = summarize([[good, bad]])
    assert not bad.ok and bad.tpot is None
    assert s.completed == 1 and s.errors == 1 and s.error_kinds == {"error frame": 1}
    assert s.ttft_ms["n"] == 1 and s.itl_ms["n"] == 3
    assert s.output_tokens == 16
    assert s.window_s == pytest.approx(0.260)


def test_timed_out_request_counts_in_window_not_in_latencies():
    late = RequestRecord(t_sent=0.0, chunk_times=[0.200, 0.900], error="timeout")  # never ended
    s = summarize([[burst_request(0.0), late]])
    assert s.errors == 1 and s.error_kinds == {"timeout": 1}
    assert s.window_s == pytest.approx(0.900)  # up to its last chunk
    assert s.e2e_ms["n"] == 1 and s.e2e_ms["p50"] == pytest.approx(260.0)
    assert late.row()["ok"] is False and late.row()["e2e_ms"] is None


def test_request_without_text_is_not_a_success():
    empty = RequestRecord(t_sent=0.0, t_end=0.1, output_tokens=0)
    s = summarize([[empty]])
    assert s.completed == 0 and s.error_kinds == {"no text": 1}
    assert s.ttft_ms is None and s.output_tokens_per_s is None


def test_one_token_answer_has_no_tpot_but_meets_a_tpot_slo():
    r = RequestRecord(t_sent=0.0, t_end=0.2, chunk_times=[0.2], output_tokens=1)
    assert r.tpot is None and r.meets({"tpot": 1.0, "ttft": 300})


def test_runs_are_pooled_with_windows_summed():
    s = summarize([[burst_request(0.0)], [burst_request(10.0)]])
    assert s.window_s == pytest.approx(0.520)
    assert s.output_tokens_per_s == pytest.approx(32 / 0.520)


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0], [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0], list(range(101))])
def test_percentiles_match_numpy_linear(values):
    ordered = sorted(values)
    for q in (50, 90, 99):
        assert percentile(ordered, q) == pytest.approx(float(numpy.percentile(values, q)))
    d = distribution(values)
    assert d["mean"] == pytest.approx(float(numpy.mean(values))) and d["n"] == len(values)


def test_spec_accept_length_read_as_sglang_reports_it():
    assert spec_accept_length({"internal_states": [{"avg_spec_accept_length": 2.75}]}) == 2.75
    assert spec_accept_length({"decode": [{"internal_states": [{"avg_spec_accept_length": 3}]}]}) == 3.0
    assert spec_accept_length({"internal_states": [{}]}) is None
    assert spec_accept_length({"internal_states": []}) is None
    assert spec_accept_length("Not Found") is None
