"""Issue 41, item 7: ``contract.prefix_cache`` in the restart gate's contract tier: the same long prompt twice,
cached tokens reported on the second, the same answer where the server is deterministic (scripted loopback server,
tests/quality_server.py: a cache that hits, one that never hits, one that changes the answer; the SGLang replay)."""

from __future__ import annotations

import pytest

from conftest import SGLANG_API_KEY, VLLM_API_KEY
from kimi_deploy.check import CheckOptions, prefix_cache, run_checks
from kimi_deploy.host import gate
from quality_server import QualityServer


def _row(url: str, **options):
    report = run_checks(CheckOptions(base_url=url, only=[prefix_cache.CHECK_ID], deadline=120, **options))
    (row,) = report.results
    return row


def test_it_is_in_the_gate_and_sends_a_long_prompt_twice():
    assert prefix_cache.CHECK_ID in gate.CONTRACT_SUBSET
    assert len(prefix_cache.PROMPT) > 4 * prefix_cache.PROMPT_TOKENS  # ~4 characters a token
    with QualityServer(prefix_cache="hit", deterministic=True, prompt_tokens=lambda b: 2100) as server:
        row = _row(server.url)
    assert row.status == "pass", row.detail
    assert row.detail == "2100 of 2100 prompt tokens cached on the second; answers equal"
    assert len(server.requests) == 2 and server.requests[0]["messages"] == server.requests[1]["messages"]
    assert server.requests[0]["temperature"] == 0


def test_a_cache_that_never_hits_is_prefix_cache_miss():
    with QualityServer(prefix_cache="miss") as server:
        row = _row(server.url)
    assert (row.status, row.kind) == ("fail", "prefix_cache_miss")
    assert "cached_tokens': 0" in row.evidence and "--disable-radix-cache" in row.fix


def test_a_cache_that_changes_the_answer_is_prefix_cache_mismatch_where_deterministic():
    with QualityServer(prefix_cache="changes", deterministic=True) as server:
        row = _row(server.url)
    assert (row.status, row.kind) == ("fail", "prefix_cache_mismatch")
    assert "(from cache)" in row.evidence
    with QualityServer(prefix_cache="changes") as server:  # not deterministic: a difference proves nothing
        row = _row(server.url)
    assert row.status == "pass" and "answers differ (not compared" in row.detail


def test_a_server_that_reports_neither_is_skipped_with_the_flags():
    with QualityServer() as server:
        row = _row(server.url)
    assert row.status == "skip" and "--enable-cache-report" in row.detail


@pytest.mark.sglang
def test_sglang_replay_raises_no_alarm(replay):
    """SGLang 0.5.23's own usage code reports the replay's cached tokens (--enable-cache-report)."""
    row = _row(replay["unpatched"].url(), api_key=SGLANG_API_KEY, model="moonshotai/Kimi-K2.5")
    assert row.status == "pass", (row.detail, row.evidence)
    assert "prompt tokens cached on the second" in row.detail and not row.detail.startswith("0 of")


@pytest.mark.vllm
def test_vllm_replay_raises_no_alarm(vllm_replay):
    row = _row(vllm_replay["parsers"].url(), api_key=VLLM_API_KEY, model="moonshotai/Kimi-K2.5")
    assert row.status in ("pass", "skip") and row.kind is None, (row.detail, row.evidence)
