"""docs/reference/ agrees with the code: generated blocks are what ``scripts/gen-reference`` generates now, and the
hand-written tables list exactly what the code has (failure kinds, doctor checks, check ids, rendered and cached
files, check metrics, read caps), so a page and the code cannot drift apart unnoticed.

After changing a generated block's source, rewrite the blocks with ``.venv/bin/python scripts/gen-reference``.
"""

from __future__ import annotations

import fnmatch
import re
import runpy
from pathlib import Path

import pytest

from kimi_deploy import options
from kimi_deploy.check import check_ids
from kimi_deploy.check.results import ALL_KINDS, WARN_KINDS
from kimi_deploy.errors import ExitCode
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LINE_BYTES

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "reference"
#: scripts/gen-reference's namespace (a script, not a module: loaded without running its main).
GEN = runpy.run_path(str(REPO / "scripts" / "gen-reference"), run_name="gen_reference")


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n") + len(heading) + 1
    end = re.search(rf"^#{{1,{level}}} ", text[start:], re.M)
    return text[start:start + end.start()] if end else text[start:]


def first_column(table_text: str) -> list[str]:
    """The first cell of every body row of the markdown tables in ``table_text``."""
    lines = table_text.splitlines()
    separator = re.compile(r"\|(-+\|)+$")
    return [line.split(" | ")[0][2:].strip() for i, line in enumerate(lines)
            if line.startswith("| ") and not (i + 1 < len(lines) and separator.match(lines[i + 1]))]


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# ---------------------------------------------------------------- generated blocks


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.md")), ids=lambda p: p.name)
def test_generated_blocks_are_what_the_code_generates(path):
    text = path.read_text()
    assert GEN["regenerate"](text) == text, (
        f"{path.relative_to(REPO)} is stale: run .venv/bin/python scripts/gen-reference and commit the result")


def test_every_generator_has_its_block_once():
    names = [m.group(1) for p in sorted(REFERENCE.glob("*.md")) for m in GEN["BLOCK"].finditer(p.read_text())]
    assert sorted(names) == sorted(GEN["BLOCKS"])


def test_the_check_mode_says_which_page_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "x.md"
    stale.write_text("a\n" + GEN["BEGIN"].format(name="exit-codes") + "\nold\n" + GEN["END"].format(name="exit-codes")
                     + "\nb\n")
    monkeypatch.setitem(GEN["main"].__globals__, "REFERENCE", tmp_path)
    monkeypatch.setitem(GEN["main"].__globals__, "REPO", tmp_path)
    assert GEN["main"](["--check"]) == 1 and "stale: x.md" in capsys.readouterr().out
    assert GEN["main"]([]) == 0 and "| 130 | `INTERRUPTED` |" in stale.read_text()
    assert GEN["main"](["--check"]) == 0


def test_the_generated_pages_carry_the_facts():
    """Spot checks that the blocks hold what they claim (not just whatever the generator prints)."""
    assert options.markdown_table() in page("profile.md")
    assert all(f"| {code.value} | `{code.name}` |" in page("exit-codes.md") for code in ExitCode)
    ids = page("check-ids.md")
    assert all(f"`{check_id}`" in ids for check_id in check_ids.all_ids())
    cli = page("cli.md")
    assert "### `kimi-deploy restart`" in cli and "`--rollback-on-failure`" in cli and "`--drain-timeout`" in cli


# ---------------------------------------------------------------- hand-written tables checked against the code


def test_failure_kinds_page_lists_every_kind_once():
    kinds = [ticked(cell)[0] for cell in first_column(page("failure-kinds.md"))]
    assert sorted(kinds) == sorted(ALL_KINDS) and len(kinds) == len(set(kinds))
    for kind in WARN_KINDS:
        assert f"| `{kind}` (warn) |" in page("failure-kinds.md")


def test_doctor_checks_page_lists_what_doctor_evaluates():
    """The page's names are exactly the names the doctor checks module reports (read off its source: a check
    name is the first argument of failed/passed/warned, or a ``name = "..."``), plus the per-option
    ``sglang.<option>`` rows; and every check a reference host's facts produce is on the page."""
    from test_doctor_checks import facts

    from kimi_deploy.doctor import checks
    from kimi_deploy.doctor.checks import evaluate

    source = Path(checks.__file__).read_text()
    in_code = set(re.findall(r'(?:\bname(?:, \w+)? = |\b(?:failed|passed|warned|_not_checked|check_model)\()"([\w.]+)"',
                             source))
    documented = {name for cell in first_column(page("doctor-checks.md")) for name in ticked(cell)}
    assert documented - {"sglang.<option>"} == in_code
    assert "sglang.<option>" in documented and 'f"sglang.{hit.gate.setting}"' in source
    assert {c.name for c in evaluate(facts())} <= documented


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^}]+)\}", pattern)
    if not m:
        return [re.sub(r"<[^>]+>", "*", pattern)]
    return [x for alt in m.group(1).split(",") for x in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def test_what_is_checked_covers_every_check_id():
    patterns = []
    for cell in first_column(section(page("check-ids.md"), "## What is checked")):
        for name in ticked(cell):
            patterns += _expand(("contract" + name) if name.startswith(".") else name)
    for check_id in check_ids.all_ids():
        base = re.sub(r"\.(nonstream|stream)$", "", check_id)
        assert any(fnmatch.fnmatchcase(base, p) for p in patterns), f"check-ids.md does not describe {check_id}"
    assert len(patterns) > 20


def test_files_page_names_every_rendered_file():
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.targets.systemd import render

    text = page("files.md")
    rendered = render(get_preset("kimi-k25-rtx-pro-6000-x8").profile()).files
    for name in rendered:
        generic = name.replace("kimi-k25", "<name>")
        assert f"`{generic}`" in text or f"`{generic.rsplit('/', 1)[-1]}`" in text, name


def test_files_page_names_the_host_paths_the_kit_uses():
    """The installed-files section names each host path :mod:`kimi_deploy.paths` builds for a service."""
    from kimi_deploy import paths

    text = section(page("files.md"), "## Installed files")
    for build in (paths.service_env_file, paths.service_profile_copy, paths.service_api_key_file,
                  paths.service_state_dir, paths.service_cache_dir, paths.service_runtime_dir):
        assert build("NAME") in text, build.__name__
    assert f"{paths.SYSTEMD_DIR}/NAME.service" in text and str(paths.patch_state_dir()) in text


def test_monitoring_page_lists_the_check_metrics_the_textfile_has():
    textfile = (REPO / "tests" / "golden" / "check" / "check.prom").read_text()
    written = re.findall(r"^# TYPE (\S+) ", textfile, re.M)
    documented = [ticked(cell)[0] for cell in first_column(section(page("monitoring.md"), "## Check metrics"))]
    assert documented == written


def test_limits_page_states_the_default_caps():
    text = page("limits.md")
    for flag, value in (("--max-body-bytes", DEFAULT_MAX_BODY_BYTES), ("--max-line-bytes", DEFAULT_MAX_LINE_BYTES)):
        assert value % 2**20 == 0
        assert f"| `{flag} N` | {value // 2**20} MiB |" in text


def test_runbook_names_every_exit_code():
    runbook = (REPO / "docs" / "runbook.md").read_text()
    summary = runbook[runbook.index("Every verb shares the [exit codes]"):]
    summary = summary[:summary.index("\n\n")]
    assert [int(n) for n in re.findall(r"(?<![\w-])(\d+)\s[a-z]", summary)] == [int(c) for c in ExitCode]
