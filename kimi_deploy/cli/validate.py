"""Verb ``validate``: check the rendered command with SGLang's own parser in its interpreter."""

from __future__ import annotations

import click

from kimi_deploy import validate as validate_lib
from kimi_deploy.cli.options import echo_json, json_flag, profile_options, resolve_profile
from kimi_deploy.errors import ExitCode


@click.command("validate")
@profile_options
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter (default: [service] python of the profile).")
@click.option("--gateway", "gateway", is_flag=True,
              help="Check the [gateway] command instead: against the pinned smg's --version and its own "
                   "`launch --help` (exact option names).")
@click.option("--smg", "smg", metavar="PATH", help="With --gateway: the smg executable (default: [gateway] smg).")
@json_flag("Print the result as JSON.")
@click.pass_context
def validate_cmd(ctx, profile_path, preset, python, gateway, smg, as_json):
    """Render for the installed SGLang version and parse the command with SGLang's own argparse.

    Exit 0: SGLang accepts every flag (warnings allowed); 1: it rejects one.
    """
    profile = resolve_profile(profile_path, preset)
    if gateway:
        checked = validate_lib.validate_smg(profile, smg)
        if as_json:
            echo_json(checked.to_dict())
        elif checked.ok:
            click.echo(f"ok: {checked.version} ({checked.smg}) has every option of the gateway command")
        else:
            click.echo(f"FAILED: {checked.version} ({checked.smg}) rejects the gateway command")
            for error in checked.errors:
                click.echo(f"error: {error}")
        ctx.exit(0 if checked.ok else int(ExitCode.FAILED))
    result = validate_lib.validate_profile(profile, python)
    if as_json:
        echo_json(result.to_dict())
    else:
        for warning in result.launch.warnings:
            click.echo(f"warning: {warning}")
        where = result.info.sglang_location
        checked = [(f"rank {r.rank.rank} ({r.rank.node}): ", r.validation) for r in result.ranks] \
            or [("", result.validation)]
        for label, v in checked:
            _report(label, v, where)
        if result.ranks:
            click.echo(f"note: the other replicas' ranks differ only in --dist-init-addr "
                       f"({len(result.ranks)} rank(s) of replica 0 checked)")
        if not result.ok:
            click.echo("fix: correct the flag in the profile ([sglang] or extra_args) and run validate again")
    if not result.ok:
        ctx.exit(int(ExitCode.FAILED))


def _report(label: str, v: validate_lib.Validation, where: str | None) -> None:
    """One command's outcome: ok/FAILED, then SGLang's errors, warnings and the check's notes."""
    if v.ok:
        click.echo(f"{label}ok: SGLang {v.sglang_version} ({where}) accepts the rendered command "
                   f"({len(v.server_args)} arguments; checked: {', '.join(v.stages)})")
    else:
        click.echo(f"{label}FAILED: SGLang {v.sglang_version} ({where}) rejects the rendered command")
    for error in v.errors:
        click.echo(f"{label}error: {error}")
    for warning in v.warnings:
        click.echo(f"{label}warning: {warning}")
    for note in v.notes:
        click.echo(f"{label}note: {note}")


COMMANDS = [validate_cmd]
