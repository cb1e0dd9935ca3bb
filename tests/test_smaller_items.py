"""The smaller items of issue #30 (items 6 and 12), each at the edge a user meets: exit 2 with a fix, never a
traceback or a silent default."""

from __future__ import annotations

import pytest

from helpers import MINIMAL, run_cli, write_profile
from kimi_deploy.errors import ExitCode


@pytest.mark.parametrize("char", ["\uffff", "\ufdd0", "\U0010fffe"])
def test_unicode_noncharacters_are_refused_in_a_profile(tmp_path, char):
    path = write_profile(tmp_path, MINIMAL.replace('python = "/opt/sglang/.venv/bin/python"',
                                                   f'python = "/opt/sglang{char}/bin/python"'))
    result = run_cli(["render", "--profile", str(path), "--print-command"])
    assert result.exit_code == ExitCode.USAGE and "noncharacter" in result.stderr


def test_a_toml_array_nested_600_deep_is_a_profile_error(tmp_path):
    path = write_profile(tmp_path, MINIMAL + "extra_args = " + "[" * 600 + "]" * 600 + "\n")
    result = run_cli(["render", "--profile", str(path), "--print-command"])
    assert result.exit_code == ExitCode.USAGE and "too deep" in result.stderr


def test_bench_extra_body_with_nan_is_refused_before_the_sweep():
    result = run_cli(["bench", "--base-url", "http://127.0.0.1:9", "--extra-body", '{"a": NaN}', "--no-progress"])
    assert result.exit_code == ExitCode.USAGE and "--extra-body must be a JSON object" in result.stderr


def test_a_key_file_is_read_with_a_size_cap(tmp_path):
    result = run_cli(["check", "--base-url", "http://127.0.0.1:9", "--api-key-file", "/dev/zero"])
    assert result.exit_code == ExitCode.USAGE and "a character device, not a regular file" in result.stderr
    big = tmp_path / "key"
    big.write_bytes(b"k" * 4097)
    big.chmod(0o600)
    result = run_cli(["check", "--base-url", "http://127.0.0.1:9", "--api-key-file", str(big)])
    assert result.exit_code == ExitCode.USAGE and "over 4096 bytes" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--only", ""], "--only names no patch id"),
    (["--only", "kimi-k2-tool-call-ids", "--with", "x"], "do not combine"),
])
def test_patch_only_empty_or_with_with_is_refused(tmp_path, args, message):
    result = run_cli(["patch", "apply", "--python", "/nonexistent/python", "--dry-run", *args])
    assert result.exit_code == ExitCode.USAGE and message in result.stderr, result.stderr


def test_uninstall_of_a_root_that_does_not_exist_is_refused(tmp_path):
    result = run_cli(["uninstall", "--root", str(tmp_path / "nonexistent")])
    assert result.exit_code == ExitCode.USAGE and "does not exist" in result.stderr


def test_a_misspelt_verb_gets_a_did_you_mean():
    from click.testing import CliRunner

    from kimi_deploy.cli import cli

    result = CliRunner().invoke(cli, ["rendr"])
    assert result.exit_code == ExitCode.USAGE and "Did you mean 'render'?" in result.output


def test_a_control_plane_cap_names_no_flag_the_verb_lacks():
    from kimi_deploy.wire.limits import LimitExceeded

    text = str(LimitExceeded("the body", 16 << 20, None, (16 << 20) + 1))
    assert "--max-body-bytes" not in text and "16 MiB" in text
    assert "--max-body-bytes" in str(LimitExceeded("the body", 1024, "--max-body-bytes", 2000))


def test_the_gateway_hosts_check_unit_fits_its_daily_timer_with_100_replicas():
    from kimi_deploy.targets.systemd import fleet_check_deadline_s

    assert fleet_check_deadline_s(2) == 2 * 1380 + 180  # kimi_deploy/catalog/check_budget.py: per worker, gateway
    assert fleet_check_deadline_s(100) + 180 < 24 * 3600


@pytest.mark.parametrize("args", [["check", "--base-url", "http://127.0.0.1:9", "--junit"],
                                  ["check", "--base-url", "http://127.0.0.1:9", "--prom"],
                                  ["bench", "--base-url", "http://127.0.0.1:9", "--no-progress", "--csv"]])
def test_an_output_path_that_is_a_directory_gets_the_kits_words(tmp_path, args):
    result = run_cli([*args, str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE and "is a directory" in result.stderr
    assert "Invalid value" not in result.stderr  # click's own wording
