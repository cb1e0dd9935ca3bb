"""Issue 43 item 10: product code, docs and comments cite public sources (a repository and path, a release note,
an issue), never the project's working notes in ``shared/`` beside the clone, which a user does not have.

``src/shared/...`` of systemd's own tree is a public path and stays allowed: the rule is the project's folder,
``shared/notes``, ``shared/k8s`` or ``../shared``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: What a user ships or reads: the package, the docs, the scripts and benchmarks, the unit templates, CI.
SCANNED = ("kimi_deploy", "docs", "benchmarks", "scripts", "systemd", "patches", ".ci", "README.md",
           "pyproject.toml")

#: A reference to the project's working notes or their files.
PRIVATE = re.compile(r"(?<![\w./-])(?:\.\./)?shared/(?:notes|k8s)\b|\.\./shared\b")


def _files():
    for name in SCANNED:
        path = REPO / name
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)


def test_no_product_file_cites_the_projects_shared_notes():
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, "cite the public source instead:\n" + "\n".join(hits)


def test_the_rule_catches_the_forms_seen_and_spares_systemds_own_paths():
    for line in ("see ../shared/notes/sglang-0.5.23.md", "``shared/notes/benchmark-metrics.md``",
                 "the CRD in shared/k8s", "(`../shared/k8s/`)", "read ../shared"):
        assert PRIVATE.search(line), line
    for line in ("src/shared/conf-parser.c", "systemd 252's ``src/shared/bus-wait-for-jobs.c``",
                 "KIMI_DEPLOY_SHARED_DIR", "a shared host"):
        assert not PRIVATE.search(line), line
