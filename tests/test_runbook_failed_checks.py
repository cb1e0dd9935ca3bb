"""Issue 41: the runbook's failed-check table (docs/runbook.md#reading-a-failed-check) has a row, with what to do, for
every failure kind the field's checks added and for each check family that emits one (``contract.followup.*``,
``contract.concurrency.*``, ``contract.prefix_cache``, ``quality.reasoning``, ``quality.certify``, the sampling
pre-flight), and validate's table one for each speculative, KV-cache and gateway-parser guard. Every kind of the
vocabulary has its row in docs/reference/failure-kinds.md (tests/test_docs_reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kimi_deploy.check.quality import certify, reasoning
from kimi_deploy.check.results import FAILURE_KINDS

RUNBOOK = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()


def _rows(heading: str) -> dict[str, str]:
    """First cell -> second cell of the first table after ``heading``."""
    section = RUNBOOK[RUNBOOK.index(heading):]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) >= 2 and not set(cells[0]) <= {"-"} and cells[0] not in ("kind", "result"):
            rows[cells[0]] = cells[-1]
    return rows


FAILED = _rows("### Reading a failed check")
#: The kinds issue 41's checks added: every kind of the vocabulary from ``empty_followup`` on (a kind added later
#: lands after them, and needs its row too).
NEW_KINDS = FAILURE_KINDS[FAILURE_KINDS.index("empty_followup"):]
#: Each family of issue 41's checks and the kinds it reports (read off the code where the code has the table).
FAMILIES: dict[str, tuple[str, ...]] = {
    "contract.followup.*": ("empty_followup", "stop_without_calls", "wrong_tool_after_round"),
    "contract.concurrency.*": ("any kind",),
    "contract.prefix_cache": ("prefix_cache_miss", "prefix_cache_mismatch"),
    "quality.reasoning": tuple(reasoning.KINDS.values()),
    "quality.certify": tuple(certify.KINDS.values()),
    "quality.preflight.sampling.required": ("sampling_not_enforced",),
}


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_every_new_kind_has_a_row_with_what_to_do(kind):
    rows = [(first, todo) for first, todo in FAILED.items() if f"`{kind}`" in first]
    assert rows, f"docs/runbook.md's failed-check table has no row for `{kind}`"
    assert all(len(todo) > 40 for _, todo in rows)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_names_each_kind_it_reports_beside_its_id(family):
    for kind in FAMILIES[family]:
        named = f"`{kind}`" if kind != "any kind" else kind
        assert any(named in first and f"`{family}" in first for first in FAILED), (family, kind)


def test_the_table_is_read_and_holds_the_older_rows():
    assert len(FAILED) >= 15 and "`unreachable`" in FAILED and "`model_declined` (warn)" in FAILED


def test_validate_has_a_row_for_each_guard():
    rows = _rows("### Does SGLang accept the command?")
    firsts = " ".join(rows)
    for guard in ("`speculative: FAILED`", "`kv_cache: warning`", "needs a draft model",
                  "`gateway: FAILED: gateway.reasoning_parser:"):
        assert guard in firsts, guard
