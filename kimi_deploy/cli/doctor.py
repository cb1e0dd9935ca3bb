"""Verb ``doctor``: check the host and SGLang environment before a (re)start."""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy import doctor as doctor_lib
from kimi_deploy.cli.common import Phases, echo_json, json_flag, name_option, profile_options, profile_or_installed
from kimi_deploy.errors import ExitCode
from kimi_deploy.paths import HostLayout

_LABEL = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}
#: Names longer than this (a gated feature's SGLang option) overflow instead of widening every line.
_WIDTH = 22


@click.command("doctor")
@profile_options
@name_option
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter (default: [service] python of the profile).")
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"), show_default=True,
              help="Root under which the installed unit is compared with a fresh render.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="kimi-deploy's state directory, where the patch record is read (default "
                   "$KIMI_DEPLOY_STATE_DIR or /var/lib/kimi-deploy, as the unit's `patch verify`).")
@json_flag("Print the report as JSON.")
@click.pass_context
def doctor_cmd(ctx, profile_path, preset, name, python, root, state_dir, as_json):
    """Check GPUs, driver, torch, topology, models, disk, port, SGLang flags and the installed unit.

    Each check prints PASS / WARN / FAIL, one line of evidence and a fix. Exit 1 if any check fails; 4 (refused,
    before any check) when the profile's model cannot fit its GPUs by the model table, with the same numbers as
    every other verb. Without --profile/--preset: the installed profile (under --root).
    """
    profile = profile_or_installed(profile_path, preset, name, HostLayout(root))
    doctor_lib.refuse_unfit(profile)  # a model that cannot fit: the same refusal as render, validate, install
    with Phases("doctor") as phase:  # stderr: what runs now, never silent
        report = doctor_lib.run_doctor(profile, python=python, root=root, state_dir=state_dir, phase=phase)
    verbose = ctx.find_root().params.get("verbose")
    if as_json:
        echo_json(report.to_dict())
    else:
        width = min(max(len(c.name) for c in report.checks), _WIDTH)
        for check in report.checks:
            click.echo(f"{_LABEL[check.status]}  {check.name:<{width}}  {check.evidence}")
            if check.hint and check.status != "pass":
                click.echo(f"      {'':<{width}}  fix: {check.hint}")
            if check.details and verbose:
                click.echo(check.details)
        n = report.counts()
        click.echo(f"{n['pass']} passed, {n['warn']} warnings, {n['fail']} failed")
    if not report.ok:
        ctx.exit(int(ExitCode.FAILED))


COMMANDS = [doctor_cmd]
