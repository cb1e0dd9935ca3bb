"""The porting report (kimi_deploy/patching/port.py, `kimi-deploy patch port`) on real SGLang source trees:
0.5.23 (the series' own release), 0.5.22 (a throwaway environment of the release before) and a 0.5.23 copy with
the series applied (its purpose already met). The targets are only read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from patch_helpers import site_packages_of, tree_hashes
from kimi_deploy.cli import cli
from kimi_deploy.patching import find_series
from kimi_deploy.patching.port import parse_hunks, port_report, source_version

pytestmark = pytest.mark.sglang

SERIES = find_series("0.5.23")


def _touched(site: Path) -> dict[str, str]:
    return {k: v for k, v in tree_hashes(site / "sglang").items()
            if any(f"sglang/{k}" in SERIES.files_of(p) for p in SERIES.patch)}


def test_every_hunk_of_the_series_is_parsed():
    for spec in SERIES.patch:
        text = SERIES.diff_path(spec).read_text()
        hunks = parse_hunks(text)
        assert len(hunks) == len(re.findall(r"^@@ ", text, re.M)), spec.id
        assert {h.file for h in hunks} == set(SERIES.files_of(spec))
        for h in hunks:  # each hunk's old side is as long as its header says
            assert len(h.old_side) == h.old_len, (spec.id, h.file, h.index)


def test_on_its_own_release_every_patch_applies_exactly(sglang_python):
    site = site_packages_of(sglang_python)
    report = port_report(site, source_version(site))
    assert report.target_version == "0.5.23" and report.series_version == "0.5.23"
    assert {p.id: p.verdict for p in report.patches} == {p.id: "applies" for p in SERIES.patch}
    assert report.all_exact and not any(p.upstream_note for p in report.patches)


def test_on_0_5_22_each_hunk_is_named_with_the_upstream_code_where_one_fails(sglang_0522, cli_runner):
    site = site_packages_of(sglang_0522)
    before = _touched(site)
    result = cli_runner.invoke(cli, ["patch", "port", "--python", sglang_0522, "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    data = json.loads(result.output)
    assert data["target_version"] == "0.5.22" and not data["all_exact"]
    by_id = {p["id"]: p for p in data["patches"]}
    assert by_id["kimi-k2-tool-call-ids"]["verdict"] == "applies"  # the detector did not change in 0.5.23
    history = by_id["kimi-k2-canonical-history-ids"]
    assert history["verdict"] == "fails"
    failed = [h for h in history["hunks"] if h["state"] == "fails"]
    assert failed and all(h["upstream"] and h["where"] for h in failed)
    # the excerpt is 0.5.22's code, numbered with its own lines
    lines = (site / failed[0]["file"]).read_text().splitlines()
    first = failed[0]["upstream"].splitlines()[0]
    number, code = int(first[:5]), first[7:]
    assert lines[number - 1] == code
    redact = by_id["redact-api-key"]
    assert redact["verdict"] == "offset" and {h["state"] for h in redact["hunks"]} == {"offset"}
    assert all(h["offset"] != 0 for h in redact["hunks"])
    assert _touched(site) == before  # read only
    text = cli_runner.invoke(cli, ["patch", "port", "--python", sglang_0522]).output
    assert "kimi-k2-canonical-history-ids: fails (default)" in text and "upstream code at line" in text
    assert "next: copy patches/0.5.23/ to patches/0.5.22/" in text


def test_a_patch_whose_purpose_is_already_upstream_is_said_so(patched_sglang):
    python, _state = patched_sglang
    site = site_packages_of(python)
    report = port_report(site, "0.5.23")
    for p in report.patches:
        assert p.verdict == "already_applied", (p.id, [h.state for h in p.hunks])
        assert "already holds the patched code" in p.upstream_note


def test_port_needs_one_target(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["patch", "port"])
    assert result.exit_code == 2 and "give exactly one of --python and --source" in result.stderr
    result = cli_runner.invoke(cli, ["patch", "port", "--source", str(tmp_path)])
    assert result.exit_code == 2 and "cannot tell the SGLang version" in result.stderr
