"""Issue 41: the fast tiers gained ~114 requests, and check's default ``--deadline`` and the nightly unit's were one
number (720 s) derived before them. ``kimi_deploy/catalog/check_budget.py`` derives both from what a full run sends x
K2.5's per-request time on the reference host; these tests count what a full run really sends (the scripted server
of the quality tests, answering as SGLang with the kimi_k2 parsers and as an agent's model) and fail when a tier
sends more than its row says, so a tier cannot outgrow the budget unnoticed."""

from __future__ import annotations

import pytest

from kimi_deploy.catalog import check_budget
from kimi_deploy.check import CheckOptions, concurrency, run_checks
from kimi_deploy.check.check_ids import select
from kimi_deploy.check.workers import gateway_checks
from kimi_deploy.cli.check import DEFAULT_DEADLINE_S
from kimi_deploy.targets import systemd
from quality_server import QualityServer

#: Each row of check_budget.TIERS by the --only globs that select it from a full run.
SELECTS = {
    "health.*, config.*": ["health.*", "config.*"],
    "parser.*": ["parser.*"],
    "contract.* but followup and concurrency": ["contract.*"],
    "contract.followup.*": ["contract.followup.*"],
    "contract.concurrency.*": ["contract.concurrency.*"],
}


def _ids(row: str) -> list[str]:
    ids = select(SELECTS[row])
    if row.startswith("contract.* but"):
        ids = [i for i in ids if not i.startswith(("contract.followup.", "contract.concurrency."))]
    return ids


def test_one_number_for_the_check_and_the_units():
    assert check_budget.DEADLINE_S == 1380 == DEFAULT_DEADLINE_S == systemd.CHECK_DEADLINE_S
    assert systemd.CHECK_DEADLINE_PER_WORKER_S == check_budget.DEADLINE_S
    assert systemd.CHECK_SLACK_S == check_budget.SLACK_S
    # the arithmetic the module states: 35 reads x 1 s + 119 completions x 10 s + 6 bursts x 20 s = 1345 s -> 1380
    assert sum(t.seconds() for t in check_budget.TIERS) == 1345
    assert check_budget.GATEWAY_PASS_S == 180 and systemd.fleet_check_deadline_s(2) == 2 * 1380 + 180
    assert check_budget.derive((check_budget.Tier("x", requests=6),)) == 60
    assert check_budget.derive((check_budget.Tier("x", requests=7),)) == 120


def test_the_rows_cover_a_full_run_exactly_once():
    """Every check id of a run without --only (the quality tier is off) is in exactly one row."""
    rows = [set(_ids(t.ids)) for t in check_budget.TIERS]
    assert set().union(*rows) == set(select()) and sum(map(len, rows)) == len(select())
    assert {t.ids for t in check_budget.TIERS} == set(SELECTS)


@pytest.fixture(scope="module")
def sent():
    """Per row: the chat completions and parser posts the scripted server received for that row's checks (one run
    of them), and the row's ids."""
    out = {}
    with QualityServer(conversation=True, prefix_cache="hit") as server:
        for tier in check_budget.TIERS:
            ids = _ids(tier.ids)
            before = len(server.requests)
            report = run_checks(CheckOptions(base_url=server.url, only=ids, deadline=600, concurrency=8))
            out[tier.ids] = (len(server.requests) - before, ids, report)
    return out


@pytest.mark.parametrize("tier", check_budget.TIERS, ids=[t.ids for t in check_budget.TIERS])
def test_no_tier_sends_more_than_its_row(sent, tier):
    """A grown tier fails here: raise its row in kimi_deploy/catalog/check_budget.py (the deadline follows)."""
    posts, ids, report = sent[tier.ids]
    assert all(r.kind != "timeout" for r in report.results), "the run itself must not have been cut"
    if tier.bursts:
        assert len(ids) <= tier.bursts and posts == len(ids) * 8  # one burst of 8 per case
    elif tier.reads:
        # one read per check: a health/config GET (answered in ms), or one raw output posted to the server's own
        # parser (the scripted server has none: the tier stops at its first 404, SGLang's answers all 28)
        assert len(ids) <= tier.reads and posts <= len(ids)
    else:
        assert posts <= tier.reads + tier.requests, (posts, tier)
        assert posts >= tier.reads + tier.requests - 2, "the row overstates the tier: lower it to what is sent"


def test_the_concurrency_row_is_one_burst_per_case_and_the_gateway_pass_its_row():
    assert len(concurrency.CASE_NAMES) == next(t.bursts for t in check_budget.TIERS if t.bursts)
    through = gateway_checks(["health.*", "contract.*"])  # what check --each-worker sends through the gateway
    bursts = [i for i in through if i.startswith("contract.concurrency.")]
    assert check_budget.GATEWAY_PASS.bursts == len(bursts)
    assert check_budget.GATEWAY_PASS.requests == len(through) - len(bursts)  # one request per other check
