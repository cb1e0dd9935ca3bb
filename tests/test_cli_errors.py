"""Errors at the CLI edge: click's own usage errors under --json, and --name checked by the profile's rule.

No server and no host tree needed: every case stops at the edge (exit 2) before anything is read
or sent.
"""

from __future__ import annotations

import json

import pytest

from helpers import run_cli
from kimi_deploy.errors import ExitCode


@pytest.mark.parametrize("args", [
    ["status", "--json", "--bogus"],
    ["status", "--bogus", "--json"],
    ["check", "--timeout", "0", "--json", "-"],
    ["check", "--json=-", "--repeat", "x"],
    ["uninstall", "--json", "--no-such-flag"],
    ["patch", "status", "--json", "--bogus"],
])
def test_click_usage_errors_are_json_on_stdout_when_json_was_asked(args):
    result = run_cli(args)
    assert result.exit_code == ExitCode.USAGE == 2
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 2 and error["message"] and error["hint"].endswith("--help`")
    assert "Usage: " in result.stderr and "Error: " in result.stderr  # click's text on stderr, as always


@pytest.mark.parametrize("args", [
    ["status", "--bogus"],
    ["check", "--timeout", "0", "--json", "report.json"],  # --json PATH: the report goes to a file, not stdout
    ["check", "--timeout", "0", "--", "--json"],
])
def test_click_usage_errors_stay_text_without_json_on_stdout(args):
    result = run_cli(args)
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout == "" and "Error:" in result.stderr


@pytest.mark.parametrize("verb", [["uninstall"], ["uninstall", "--purge"], ["status"], ["restart"]])
@pytest.mark.parametrize("name", ["../../tmp/zz", "bad name/x", "x.service", "..", ""])
def test_name_is_a_service_name(tmp_path, verb, name):
    result = run_cli([*verb, "--root", str(tmp_path), "--name", name])
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert "--name: not a service name" in result.stderr and "fix: " in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing looked up outside the tree


def test_bad_name_under_json_is_a_json_error(tmp_path):
    result = run_cli(["status", "--root", str(tmp_path), "--name", "../../tmp/zz", "--json"])
    assert result.exit_code == ExitCode.USAGE
    error = json.loads(result.stdout)["error"]
    assert error["value"] == "../../tmp/zz" and "letters, digits" in error["message"]


def test_profile_name_rule_is_the_same_rule():
    from kimi_deploy.profile import check_service_name

    assert check_service_name("kimi-k25") == "kimi-k25"
    for bad in ("../../tmp/zz", "bad name/x", "kimi.service", "..", "kimi-deploy-check"):
        with pytest.raises(ValueError):
            check_service_name(bad)
