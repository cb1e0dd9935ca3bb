"""Issue 43 item 11: the README starts with the operator. What it is, the two commands (set-up + the main job,
set-up + the tests), Try-it, then the operator's path; one table row per verb with a link; the test
infrastructure in docs/development.md; and `.ci/run` runs exactly the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

from kimi_deploy.cli import VERBS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def _commands() -> list[tuple[int, str]]:
    """(line number, command) of every line inside a ```sh block, in order."""
    out, inside = [], False
    for number, line in enumerate(README.splitlines(), 1):
        if line.startswith("```"):
            inside = line.strip() == "```sh" and not inside
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            out.append((number, line.strip()))
    return out


def test_the_first_runnable_command_is_within_the_first_40_lines():
    number, command = _commands()[0]
    assert number <= 40, (number, command)
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/kimi-deploy render")


def test_ci_runs_exactly_the_readmes_test_command():
    (test_command,) = [c for _, c in _commands() if c.startswith("./scripts/test")]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == test_command


def test_the_sections_come_in_the_operators_order():
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings[:4] == ["Two commands", "Try it (any Linux machine, no GPU)", "The operator's path",
                            "What each verb does"]
    assert "Shell completion" in headings and any("CPU-only SGLang interpreter" in h for h in headings)


def test_every_verb_has_one_row_with_a_link():
    rows = [line for line in README.splitlines() if line.startswith("| `")]
    for verb in VERBS:
        mine = [row for row in rows if re.match(rf"\| [^|]*`{re.escape(verb)}`", row)]
        assert mine, f"README's verb table has no row for {verb}"
        assert all("](docs/" in row for row in mine), mine


def test_test_infrastructure_lives_in_docs_development():
    development = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    for words in ("KIMI_DEPLOY_SGLANG_PYTHON", "KIMI_DEPLOY_REQUIRE_CONTAINERS", "Why 6.3 GB"):
        assert words in development and words not in README
