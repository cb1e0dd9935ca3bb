"""Errors at the CLI edge: click's own usage errors under --json, and --name checked by the profile's rule.

No server and no host tree needed: every case stops at the edge (exit 2) before anything is read
or sent.
"""

from __future__ import annotations

import json
from pathlib import Path

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


@pytest.mark.parametrize("args", [
    ["bench", "--concurrency", "0", "--json", "-"],
    ["bench", "--json", "-", "--concurrency", "0"],
    ["bench", "--runs", "nan", "--json=-", "--base-url", "http://127.0.0.1:9"],
    ["bench", "--slo", "ttft=-1", "--json", "-"],
])
def test_option_check_errors_are_json_on_stdout_in_any_order(args):
    """Issue 13 item 4: a refusal by an option's own check comes before the --json callback ran."""
    result = run_cli(args)
    assert result.exit_code == ExitCode.USAGE
    error = json.loads(result.stdout)["error"]
    assert error["exit_code"] == 2 and error["hint"]
    assert "error:" in result.stderr


@pytest.mark.parametrize("args", [
    ["check", "--base-url", "http://127.0.0.1:9", "--deadline", "nan"],
    ["check", "--base-url", "http://127.0.0.1:9", "--timeout", "inf"],
    ["restart", "--preset", "kimi-k25-rtx-pro-6000-x8", "--wait", "--timeout", "nan"],
    ["restart", "--preset", "kimi-k25-rtx-pro-6000-x8", "--wait", "--poll-interval", "0"],
    ["restart", "--preset", "kimi-k25-rtx-pro-6000-x8", "--wait", "--drain-timeout", "nan"],
])
def test_a_duration_that_is_no_number_of_seconds_is_refused_before_anything_runs(args):
    """nan passes click's FloatRange (every comparison with it is false) and inf one without a max: a
    deadline of now + nan is never reached, so a bounded wait (check's --deadline, restart's readiness and
    drain waits) would be unbounded. One option type (cli.common.Seconds) refuses both."""
    result = run_cli(args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "Traceback" not in result.output and ("not a number of seconds" in result.stderr
                                                 or "not in the range" in result.stderr), result.stderr


def test_option_check_errors_stay_text_with_json_to_a_file(tmp_path):
    result = run_cli(["bench", "--concurrency", "0", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == ExitCode.USAGE
    assert result.stdout == "" and "error:" in result.stderr


@pytest.mark.parametrize("args", [
    lambda d: ["init", str(d / "missing" / "deeper" / "x.toml")],
    lambda d: ["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--out", str(d / "missing" / "out")],
    lambda d: ["check", "--base-url", "http://127.0.0.1:9", "--json", str(d / "missing" / "r.json")],
    lambda d: ["bench", "--base-url", "http://127.0.0.1:9", "--csv", str(d / "missing" / "r.csv")],
])
def test_every_output_path_follows_one_rule_nothing_created_on_the_way(tmp_path, args):
    """Issue 13 item 8: init and render --out created missing parents; check and bench refused."""
    result = run_cli(args(tmp_path))
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert "does not exist" in result.stderr and "mkdir -p" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_render_out_creates_its_own_directory_but_no_parents(tmp_path):
    result = run_cli(["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--out", str(tmp_path / "rendered")])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "rendered" / "kimi-k25.service").is_file()
    (tmp_path / "afile").write_text("")
    result = run_cli(["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--out", str(tmp_path / "afile")])
    assert result.exit_code == ExitCode.USAGE
    assert "is a file" in result.stderr


def test_write_error_names_the_path_given_not_the_temp_file(tmp_path):
    """Issue 13 item 10: `cannot write /sys/.r.json.kxa5b_cf.tmp` named the staging file."""
    import os

    from kimi_deploy.errors import UsageError
    from kimi_deploy.fsio import write_atomic

    target = tmp_path / "ro" / "r.json"
    target.parent.mkdir()
    target.parent.chmod(0o500)
    if os.access(target.parent, os.W_OK):  # root: a folder where no file can be created, whoever asks
        target = Path("/sys/r.json") if Path("/sys/kernel").is_dir() else pytest.skip("no /sys here")
    try:
        with pytest.raises(UsageError) as info:
            write_atomic(target, "{}")
    finally:
        (tmp_path / "ro").chmod(0o700)
    assert info.value.value == str(target)
    assert f"cannot write {target}:" in info.value.render()
    assert ".tmp" not in info.value.render()
