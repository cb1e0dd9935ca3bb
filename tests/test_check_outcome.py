"""The one verdict type every check tier returns (issue #12): :class:`kimi_deploy.check.outcome.Outcome`."""

from __future__ import annotations

import dataclasses

import pytest

from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.completion_rules import Finding


def test_judged_reports_the_most_telling_finding_and_names_the_others():
    outcome = Outcome.judged([Finding("stream_shape", "no [DONE]", "s"), Finding("markup_leak", "leak", "<think>"),
                              Finding("invalid_response", "unreadable", "{}")], "unused")
    assert outcome == Outcome("fail", "unreadable (also: markup_leak, stream_shape)", "invalid_response", "{}")


def test_pass_warn_skip_and_fail():
    assert Outcome.judged([], "fine") == Outcome.passed("fine") == Outcome("pass", "fine")
    assert Outcome.judged([Finding("model_declined", "prose", "Sure")]).status == "warn"
    assert Outcome.skipped("why") == Outcome("skip", "why")
    assert Outcome.failed(Finding("timeout", "slow", "e")) == Outcome("fail", "slow", "timeout", "e")


def test_an_outcome_cannot_change_after_a_tier_returned_it():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Outcome.passed("x").status = "fail"  # type: ignore[misc]
