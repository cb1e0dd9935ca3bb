"""Every ``kimi-deploy VERB [SUB] ... --flag`` that README.md and production.md show (code blocks and inline code)
names an option that verb has: a new operator pastes these lines.

Read off the CLI itself (click's command tree), not off ``--help`` text, so a wrapped help line cannot hide a flag.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from kimi_deploy.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "production.md")
_GLOBAL = {"--debug", "-v", "--verbose"}


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


def doc_flag_problems(text: str) -> list[str]:
    """``kimi-deploy VERB has no --flag  <- line`` for each flag a command line in ``text`` gives its verb
    but the verb lacks."""
    snippets = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]*kimi-deploy [^`\n]*)`", text)
    problems = []
    for snippet in snippets:
        for line in snippet.replace("\\\n", " ").splitlines():
            for match in re.finditer(r"kimi-deploy((?:\s+[^\s|;&#]+)+)", line):
                words = [w for w in match.group(1).split()]
                while words and words[0] in _GLOBAL:
                    words.pop(0)
                cmd, path, used = _command(words)
                if cmd is None:
                    continue
                known = _flags(cmd)
                for word in words[used:]:
                    flag = re.match(r"(--[a-z][a-z0-9-]*)", word.strip("[](),.'\"").split("=")[0])
                    if flag and flag.group(1) not in known:
                        problems.append(f"kimi-deploy {' '.join(path)} has no {flag.group(1)}  <- {line.strip()}")
    return problems


def test_every_documented_flag_exists_on_its_verb():
    problems = [f"{name}: {p}" for name in DOCS for p in doc_flag_problems((REPO / name).read_text())]
    assert problems == []


def test_the_reader_catches_a_wrong_flag_in_a_block_and_inline():
    text = ("```sh\nkimi-deploy check --base-url X --no-such-flag\nsudo kimi-deploy patch apply --pyton P\n```\n"
            "and `kimi-deploy bench compare a.json b.json --plots x` or `kimi-deploy -v status --jsn`\n")
    assert [p.split("  <-")[0] for p in doc_flag_problems(text)] == [
        "kimi-deploy check has no --no-such-flag", "kimi-deploy patch apply has no --pyton",
        "kimi-deploy bench compare has no --plots", "kimi-deploy status has no --jsn"]
