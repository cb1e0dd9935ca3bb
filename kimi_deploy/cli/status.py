"""Verb ``status``: unit state, launch drift, patch series, health and the last nightly check."""

from __future__ import annotations

import click

from kimi_deploy import status as status_lib
from kimi_deploy.cli.options import echo_json, profile_options, resolve_installed, root_option
from kimi_deploy.paths import HostLayout


@click.command("status")
@profile_options
@root_option
@click.option("--name", default=None, metavar="NAME", help="Installed service (default: the only one).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def status_cmd(ctx, profile_path, preset, root, name, as_json):
    """Show the installed service's state; exit 1 when something is wrong (the problems are listed)."""
    layout = HostLayout(root)
    profile, manifest = resolve_installed(profile_path, preset, name, layout)
    report = status_lib.status(profile, layout, manifest)
    if as_json:
        echo_json(report.to_dict())
        ctx.exit(report.exit_code)
    unit = report.unit or {}
    click.echo(f"service   {report.service}.service: {unit.get('active_state', '?')}/{unit.get('sub_state', '?')}"
               f", enabled: {unit.get('unit_file_state', '?')}, main PID {unit.get('main_pid') or '-'}"
               f", restarts {unit.get('n_restarts') if unit.get('n_restarts') is not None else '?'}")
    changed = {hp: s for hp, s in report.files.items() if s != "ok"}
    click.echo(f"files     {len(report.files)} installed" + (f", {changed}" if changed else ", all unmodified"))
    h = report.health
    click.echo(f"health    {'ready' if h['ready'] else 'NOT READY'} ({h['endpoint']}: {h['detail']})")
    if report.launch:
        d = report.launch
        click.echo(f"launch    {'matches the profile' if d.in_sync else 'DRIFT'} (from {d.source})")
        for entry in d.missing:
            click.echo(f"          - {entry}   (in the profile, not running)")
        for entry in d.unexpected:
            click.echo(f"          + {entry}   (running, not in the profile)")
    else:
        click.echo("launch    unknown (no /server_info answer and no main PID)")
    click.echo(f"patches   {report.patches.get('state')}" +
               (f" ({report.patches['detail']})" if report.patches.get("detail") else ""))
    c = report.last_check
    click.echo("check     " + ("no nightly report yet" if not c else
                               f"exit {c.get('exit_code')} at {c['modified_at']} {c.get('counts') or ''}"))
    for problem in report.problems:
        click.echo(f"problem: {problem}")
    ctx.exit(report.exit_code)


COMMANDS = [status_cmd]
