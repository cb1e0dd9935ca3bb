"""Small helpers shared by tests: writing profiles, running the CLI."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from kimi_deploy.cli import cli


def run_cli(args: list[str], runner: CliRunner | None = None) -> Result:
    """Run ``kimi-deploy ARGS`` in-process; the result has exit_code, stdout, stderr."""
    runner = runner or _runner()
    return runner.invoke(cli, args, obj={}, catch_exceptions=False)


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


MINIMAL = """\
[service]
name = "kimi-k25"
python = "/opt/sglang/.venv/bin/python"

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
tp_size = 8
"""


def write_profile(tmp_path: Path, text: str, name: str = "profile.toml") -> Path:
    """Write ``text`` as a profile file under ``tmp_path``; returns its path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(text)
    return path
