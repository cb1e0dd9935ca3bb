"""Verb ``status``: unit state, launch drift, patch series, health and the last nightly check."""

from __future__ import annotations

import click

from kimi_deploy.cli.common import (echo_json, json_flag, profile_options, resolve_installed_deployment,
                                     root_option)
from kimi_deploy.paths import HostLayout


@click.command("status")
@profile_options
@root_option
@click.option("--name", default=None, metavar="NAME", help="Installed service (default: the only one).")
@click.option("--host", "host", default=None, metavar="NAME",
              help="Multi-node: which node of the profile this is (default: found by this machine's addresses); "
                   "ranks >= 1 serve no HTTP, so no health is asked of them.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Where `patch apply --state-dir` kept the patch record (default $KIMI_DEPLOY_STATE_DIR or "
                   "/var/lib/kimi-deploy).")
@json_flag("Print the report as JSON.")
@click.pass_context
def status_cmd(ctx, profile_path, preset, root, name, host, state_dir, as_json):
    """Show the installed service's state; exit 1 when something is wrong (the problems are listed)."""
    # start-up: the status library (its probes: httpx) loads when the verb runs, not for --help
    from kimi_deploy.host import status as status_lib

    layout = HostLayout(root)
    deployment, manifest = resolve_installed_deployment(profile_path, preset, name, layout)
    report = status_lib.status(deployment, layout, manifest, host, state_dir)
    view = status_lib.gateway_view(deployment, layout)
    code = status_lib.exit_code(report, view)
    if as_json:
        echo_json({**report.to_dict(), "gateway": view} if view else report.to_dict())
        ctx.exit(code)
    for line in status_lib.report_lines(report, view):
        click.echo(line)
    ctx.exit(code)


COMMANDS = [status_cmd]
