"""The anchor map: every link into docs/ resolves to a file and a heading that exist.

Checked: relative markdown links in README.md and docs/**/*.md (``[text](runbook.md#patches)``), every
``docs/<path>.md#anchor`` mentioned in code, unit templates, scripts and golden files (hints such as "see
docs/runbook.md#patches"), and the ``runbook_url`` of every alert the reference preset renders. Anchors are
GitHub's: the heading text in lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a repeated
heading suffixed ``-1``, ``-2``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
#: Where code may mention a docs/ path: the package, unit templates, scripts, benchmarks, patches, golden files.
CODE_TREES = ("kimi_deploy", "systemd", "scripts", "benchmarks", "patches", "tests/golden")
DOC_REF = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (markdown emphasis and code marks dropped)."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of the markdown file ``path``: its headings' (outside code blocks) and explicit ``id``s."""
    seen: dict[str, int] = {}
    out = set(re.findall(r'<a id="([\w-]+)"', path.read_text()))
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.+)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def resolve(target: Path, anchor: str | None) -> str | None:
    """None when ``target`` exists and has ``anchor`` (or no anchor is asked), else what is wrong."""
    if not target.is_file():
        return f"no file {target.relative_to(REPO) if target.is_relative_to(REPO) else target}"
    if anchor and anchor not in anchors(target):
        return f"{target.relative_to(REPO)} has no heading #{anchor}"
    return None


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_slug_is_githubs():
    assert slug("The 0.5.23 series") == "the-0523-series"
    assert slug("`KimiServerDown`") == "kimiserverdown"
    assert slug("## `[monitoring.slo]`".lstrip("# ")) == "monitoringslo"
    assert slug("Kubernetes: what the offline checks cover") == "kubernetes-what-the-offline-checks-cover"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_in_the_docs_resolves(doc):
    problems = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for link in MD_LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if (problem := resolve(target, anchor or None)) and target.suffix == ".md":
            problems.append(f"{link}: {problem}")
        elif not target.exists():
            problems.append(f"{link}: no such file")
    assert problems == []


def test_every_docs_link_in_code_resolves():
    problems, seen = [], 0
    for tree in CODE_TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if not path.is_file() or path.suffix in {".pyc", ".png"} or "__pycache__" in path.parts:
                continue
            for m in DOC_REF.finditer(path.read_text(errors="replace")):
                seen += 1
                if problem := resolve(DOCS / m.group(1), m.group(2)):
                    problems.append(f"{path.relative_to(REPO)}: docs/{m.group(1)}#{m.group(2)}: {problem}")
    assert problems == []
    assert seen > 20  # the kit's hints and rendered files do point into docs/


def test_no_link_is_left_to_production_md():
    """production.md became docs/; nothing the kit ships or renders names it any more."""
    hits = []
    for tree in (*CODE_TREES, "README.md"):
        root = REPO / tree
        for path in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            for line in path.read_text(errors="replace").splitlines():
                # the one kept mention: the default the first profiles hashed (kimi_deploy.profile.Profile.digest)
                if "production.md" in line and "RUNBOOK_DEFAULT_DIGESTED = " not in line:
                    hits.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert hits == []


def test_every_rendered_alert_links_to_its_runbook_entry():
    """The rendered rules' runbook_url (default base docs/runbook.md) names a heading of the runbook."""
    import yaml

    from kimi_deploy.targets.prometheus import rules_text

    profile = _all_alerts_profile()
    rules = yaml.safe_load(rules_text(profile, "#"))
    urls = [r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(urls) == 17  # KimiNightlyCheckInterrupted (issue #30) is the 16th, KimiStartSlower (#42) the 17th
    for url in urls:
        base, _, anchor = url.partition("#")
        assert base == "docs/runbook.md"
        assert resolve(REPO / base, anchor) is None, url


def _all_alerts_profile():
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.profile import parse_profile

    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    monitoring = {**data.get("monitoring", {}), "gateway": "127.0.0.1:29000",
                  "slo": {"ttft": 2000.0, "tpot": 100.0, "e2e": 60000.0}}
    return parse_profile({**data, "monitoring": monitoring})


def test_the_runbook_move_changes_no_profile_digest():
    """The default runbook_url moved from production.md to docs/runbook.md; a profile that leaves it unset keeps
    the digest installed manifests and rendered headers recorded (kimi_deploy.profile.RUNBOOK_DEFAULT_DIGESTED)."""
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.profile import parse_profile

    data = get_preset("kimi-k25-rtx-pro-6000-x8").data
    default = parse_profile(data)
    assert default.monitoring.runbook_url == "docs/runbook.md"
    old = parse_profile({**data, "monitoring": {**data.get("monitoring", {}), "runbook_url": "production" + ".md"}})
    moved = parse_profile({**data, "monitoring": {**data.get("monitoring", {}), "runbook_url": "https://x/runbook.md"}})
    assert default.digest() == old.digest() != moved.digest()
    golden = REPO / "tests" / "golden" / "render" / "kimi-k25-rtx-pro-6000-x8-0.5.23" / "kimi-k25.service"
    assert f"profile sha256:{default.digest()[:16]} " in golden.read_text()
