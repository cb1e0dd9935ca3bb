"""Issue 41, item 4: ``contract.concurrency.*`` sends the contract's tool-call cases N at once and reports each
case's failure rate, so a failure that appears only under load is seen (sglang issue 23341: empty answers with
``finish_reason=stop`` under concurrency). The scripted server gathers each burst before it answers (its level is
the burst's size, never a race with the clock) and fails from 8 at once; the replays of SGLang 0.5.23 and vLLM
0.33.0 raise no alarm at 8 at once."""

from __future__ import annotations

import re

import pytest

from conftest import SGLANG_API_KEY, VLLM_API_KEY
from kimi_deploy.check import CheckOptions, concurrency, run_checks
from kimi_deploy.check.context import Context
from kimi_deploy.check.check_ids import all_ids
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from quality_server import QualityServer


def _run(url: str, n: int | None, **options):
    report = run_checks(CheckOptions(base_url=url, only=["contract.concurrency.*"], concurrency=n, deadline=300,
                                     repeat=0, **options))
    return {r.id: r for r in report.results}


def test_ids_and_the_level_from_the_profile():
    assert concurrency.check_ids() == [i for i in all_ids() if i.startswith("contract.concurrency.")]
    ctx = Context(clients=None, profile=None, model=None, expected_model=None, repeat=0)  # type: ignore[arg-type]
    assert concurrency.level(ctx) == concurrency.DEFAULT_CONCURRENCY == 8
    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    for running, want in ((48, 48), (256, 64)):
        profile = parse_profile({**data, "sglang": {**data["sglang"], "max_running_requests": running}})
        ctx.profile = profile
        assert concurrency.level(ctx) == want
    ctx.concurrency = 3
    assert concurrency.level(ctx) == 3


def test_failures_only_at_eight_at_once_are_named_with_their_rate_per_case():
    with QualityServer(conversation=True, gather=8, fail_from_concurrency=8, concurrency_fault_rate=0.5, seed=11) as server:
        rows = _run(server.url, 8)
    assert set(rows) == set(concurrency.check_ids())
    assert set(server.levels) == {8} and len(server.levels) == 8 * len(rows)
    total = 0
    for row in rows.values():
        if row.status == "pass":
            assert row.detail == "8 requests at once, none failed (0.0 %)"
            continue
        # an empty answer where a call was due is a dropped call; where text was due (reasoning_on), an empty one
        kind = "empty_answer" if row.id.endswith(".reasoning_on") else "tool_call_dropped"
        assert (row.status, row.kind) == ("fail", kind), row
        m = re.match(rf"(\d+) of 8 requests sent at once failed \((\d+\.\d) %: {kind} \1\)", row.detail)
        assert m and float(m.group(2)) == pytest.approx(100 * int(m.group(1)) / 8, abs=0.05), row.detail
        total += int(m.group(1))
    assert total == server.faults["concurrency"] > 0  # every struck answer counted, none other
    assert any(r.status == "fail" for r in rows.values())


def test_the_same_server_passes_four_at_once():
    with QualityServer(conversation=True, gather=4, fail_from_concurrency=8, concurrency_fault_rate=0.5, seed=11) as server:
        rows = _run(server.url, 4)
    assert {i: r.status for i, r in rows.items()} == {i: "pass" for i in concurrency.check_ids()}
    assert set(server.levels) == {4} and sum(bool(b.get("stream")) for b in server.requests) == 2 * len(rows)


def test_the_reasoning_burst_skips_where_no_reasoning_parser_is_expected_as_its_single_rows_do():
    """No profile and no /model_info (a server that does not say it has a reasoning parser): reasoning_on is not
    judged, one at a time or 4 at once; nothing is sent for the burst."""
    with QualityServer(conversation=True, model_info=False) as server:
        report = run_checks(CheckOptions(base_url=server.url, only=["contract.reasoning_on.*",
                                                                    "contract.concurrency.reasoning_on"],
                                         concurrency=4, deadline=120, repeat=0))
        sent = len(server.requests)
    assert {r.id: r.status for r in report.results} == {
        "contract.reasoning_on.nonstream": "skip", "contract.reasoning_on.stream": "skip",
        "contract.concurrency.reasoning_on": "skip"}
    assert sent == 0


def test_a_passed_deadline_sends_nothing_and_says_so():
    from kimi_deploy.check.concurrency import verdict

    out = verdict([], 8)
    assert (out.status, out.kind) == ("fail", "timeout") and "none of the 8 requests" in out.detail


@pytest.mark.sglang
def test_sglang_replay_raises_no_alarm_at_eight_at_once(replay):
    rows = _run(replay["unpatched"].url(), 8, api_key=SGLANG_API_KEY, model="moonshotai/Kimi-K2.5")
    assert {i: (r.status, r.kind) for i, r in rows.items()} == {i: ("pass", None) for i in concurrency.check_ids()}


def _k25_profile():
    """The K2.5 preset (its kimi_k2 parsers: reasoning is due) without a key file: vLLM has no /model_info to say so."""
    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    sglang = {k: v for k, v in data["sglang"].items() if k != "api_key_file"}
    return parse_profile({**data, "sglang": {**sglang, "host": "127.0.0.1"}})


@pytest.mark.vllm
def test_vllm_replay_raises_no_alarm_at_eight_at_once(vllm_replay):
    rows = _run(vllm_replay["parsers"].url(), 8, api_key=VLLM_API_KEY, model="moonshotai/Kimi-K2.5",
                profile=_k25_profile())
    assert {i: (r.status, r.kind) for i, r in rows.items()} == {i: ("pass", None) for i in concurrency.check_ids()}
