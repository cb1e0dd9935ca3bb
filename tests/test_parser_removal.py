"""A profile change that drops --tool-call-parser or --reasoning-parser is refused before anything restarts.

The server would come back healthy and serve tool calls as plain text (the first incident behind this project):
``install`` refuses to write such a profile over one that has the parsers, and ``restart`` refuses to start one
that the previous install's profile had them for (an install forced through with ``--allow-parser-removal``, or
made by an older kit). Both are exit 4 with the dropped flag named; ``--allow-parser-removal`` lets it through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from install_fakes import write_profile
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, RefusedError
from kimi_deploy.host.gate import parser_removal
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile


def _without(path: Path, *fields: str) -> Path:
    text = path.read_text()
    for field in fields:
        text = text.replace(f'{field} = "kimi_k2"\n', "")
    path.write_text(text)
    return path


def _install(root: Path, profile: Path, **kw) -> None:
    apply(plan_install(load_profile(profile), HostLayout(root), enable=False, create_user=False, **kw))


@pytest.fixture
def installed(tmp_path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    _install(root, write_profile(tmp_path / "v1.toml"))
    return root


def test_parser_removal_names_each_dropped_flag(tmp_path):
    old = load_profile(write_profile(tmp_path / "old.toml"))
    assert parser_removal(old, old) == [] and parser_removal(None, old) == []
    new = load_profile(_without(write_profile(tmp_path / "a.toml"), "tool_call_parser"))
    assert parser_removal(old, new) == ["--tool-call-parser"]
    both = load_profile(_without(write_profile(tmp_path / "b.toml"), "tool_call_parser", "reasoning_parser"))
    assert parser_removal(old, both) == ["--tool-call-parser", "--reasoning-parser"]
    assert parser_removal(both, old) == []  # adding them back is always fine


@pytest.mark.parametrize("field, flag", [("tool_call_parser", "--tool-call-parser"),
                                         ("reasoning_parser", "--reasoning-parser")])
def test_install_refuses_a_profile_that_drops_a_parser(cli_runner, installed, tmp_path, fake_systemd, field, flag):
    before = {p: p.read_bytes() for p in installed.rglob("*") if p.is_file()}
    v2 = _without(write_profile(tmp_path / "v2.toml", context_length=2000), field)
    for dry in ([], ["--dry-run"]):
        result = cli_runner.invoke(cli, ["install", "--profile", str(v2), "--root", str(installed), "--no-enable",
                                         "--no-create-user", *dry])
        assert result.exit_code == ExitCode.REFUSED, result.output + result.stderr
        assert f"the new profile drops {flag}" in result.stderr and f"value: {field}" in result.stderr
        assert "--allow-parser-removal" in result.stderr and "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in installed.rglob("*") if p.is_file()} == before
    with pytest.raises(RefusedError):
        plan_install(load_profile(v2), HostLayout(installed), enable=False, create_user=False)


def test_restart_refuses_an_installed_change_that_dropped_a_parser(cli_runner, installed, tmp_path, fake_systemd):
    v2 = _without(write_profile(tmp_path / "v2.toml", context_length=2000), "tool_call_parser")
    _install(installed, v2, allow_parser_removal=True)  # forced through at install
    assert "--tool-call-parser" not in (installed / "etc/systemd/system/kimi-test.service").read_text()
    result = cli_runner.invoke(cli, ["restart", "--root", str(installed), "--host-systemd", "--wait", "--rollback-on-failure"])
    assert result.exit_code == ExitCode.REFUSED, result.output + result.stderr
    assert "refusing to restart kimi-test: the new profile drops --tool-call-parser" in result.stderr
    assert fake_systemd.verbs() == []  # nothing restarted
    result = cli_runner.invoke(cli, ["restart", "--root", str(installed), "--host-systemd", "--allow-parser-removal"])
    assert result.exit_code == 0, result.output + result.stderr
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_a_change_that_keeps_the_parsers_is_not_refused(cli_runner, installed, tmp_path, fake_systemd):
    _install(installed, write_profile(tmp_path / "v2.toml", context_length=2000))
    result = cli_runner.invoke(cli, ["restart", "--root", str(installed), "--host-systemd"])
    assert result.exit_code == 0 and fake_systemd.verbs() == ["restart kimi-test.service"]
