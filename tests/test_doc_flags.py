"""Every ``kimi-deploy VERB [SUB] ... --flag`` that README.md and the documents under docs/ show (fenced code
blocks, indented code and inline code) names an option that verb has: a new operator pastes these lines.
And no operator step was lost when production.md became docs/: every ``VERB --flag`` it showed at 3cb78fc
(frozen in ``tests/data/production_md_flags.txt``) still appears under docs/.

Read off the CLI itself (click's command tree), not off ``--help`` text, so a wrapped help line cannot hide a flag.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from kimi_deploy.cli import cli

REPO = Path(__file__).resolve().parent.parent
_GLOBAL = {"--debug", "-v", "--verbose"}
#: The VERB --flag pairs production.md showed at commit 3cb78fc, before it was split into docs/ (frozen once from
#: ``git show 3cb78fc:production.md`` with :func:`doc_flag_uses`, so the test needs no git history).
FROZEN = REPO / "tests" / "data" / "production_md_flags.txt"


def documents() -> list[Path]:
    """README.md and every markdown file under docs/, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _command(words: list[str]) -> tuple[click.Command | None, list[str], int]:
    """The (sub)command ``words`` start with, its path, and how many words named it."""
    cmd: click.Command = cli
    path: list[str] = []
    used = 0
    while isinstance(cmd, click.Group) and used < len(words):
        sub = cmd.get_command(click.Context(cmd), words[used].split("|")[0])
        if sub is None:
            break
        cmd, used = sub, used + 1
        path.append(sub.name)
    return (cmd if path else None), path, used


def _flags(cmd: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in cmd.params:
        names.update(getattr(param, "opts", ()), getattr(param, "secondary_opts", ()))
    return names


def doc_flag_uses(text: str) -> Iterator[tuple[click.Command, list[str], str, str]]:
    """``(command, path, flag, line)`` for each ``--flag`` a ``kimi-deploy VERB ...`` command line in ``text`` gives
    its verb: in fenced code blocks, indented (4-space) code lines and inline code."""
    snippets = (re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]*kimi-deploy [^`\n]*)`", text)
                + re.findall(r"^    (.*kimi-deploy .*)$", text, re.M))
    for snippet in snippets:
        for line in snippet.replace("\\\n", " ").splitlines():
            for match in re.finditer(r"kimi-deploy((?:\s+[^\s|;&#]+)+)", line):
                words = match.group(1).split()
                while words and words[0] in _GLOBAL:
                    words.pop(0)
                cmd, path, used = _command(words)
                if cmd is None:
                    continue
                for word in words[used:]:
                    flag = re.match(r"(--[a-z][a-z0-9-]*)", word.strip("[](),.'\"").split("=")[0])
                    if flag:
                        yield cmd, path, flag.group(1), line.strip()


def doc_flag_problems(text: str) -> list[str]:
    """``kimi-deploy VERB has no --flag  <- line`` for each flag a command line in ``text`` gives its verb
    but the verb lacks."""
    return [f"kimi-deploy {' '.join(path)} has no {flag}  <- {line}"
            for cmd, path, flag, line in doc_flag_uses(text) if flag not in _flags(cmd)]


def test_every_documented_flag_exists_on_its_verb():
    assert (REPO / "docs" / "runbook.md") in documents()
    problems = [f"{p.relative_to(REPO)}: {m}" for p in documents() for m in doc_flag_problems(p.read_text())]
    assert problems == []


def test_no_operator_step_of_production_md_was_lost():
    """Each ``VERB --flag`` production.md showed still appears in some document under docs/."""
    frozen = {line for line in FROZEN.read_text().splitlines() if line and not line.startswith("#")}
    assert len(frozen) > 50
    shown = {f"{' '.join(path)} {flag}" for p in sorted((REPO / "docs").rglob("*.md"))
             for _, path, flag, _ in doc_flag_uses(p.read_text())}
    assert sorted(frozen - shown) == []


def test_the_reader_catches_a_wrong_flag_in_a_block_and_inline():
    text = ("```sh\nkimi-deploy check --base-url X --no-such-flag\nsudo kimi-deploy patch apply --pyton P\n```\n"
            "and `kimi-deploy bench compare a.json b.json --plots x` or `kimi-deploy -v status --jsn`\n"
            "\n    kimi-deploy doctor --profile P --stat-dir D\n")
    assert [p.split("  <-")[0] for p in doc_flag_problems(text)] == [
        "kimi-deploy check has no --no-such-flag", "kimi-deploy patch apply has no --pyton",
        "kimi-deploy bench compare has no --plots", "kimi-deploy status has no --jsn",
        "kimi-deploy doctor has no --stat-dir"]
