"""Verb ``status``: unit state, launch drift, patch series, health and the last nightly check."""

from __future__ import annotations

import click

from kimi_deploy.cli.options import echo_json, json_flag, profile_options, resolve_installed, root_option
from kimi_deploy.paths import HostLayout
from kimi_deploy.wire.printable import printable


@click.command("status")
@profile_options
@root_option
@click.option("--name", default=None, metavar="NAME", help="Installed service (default: the only one).")
@click.option("--host", "host", default=None, metavar="NAME",
              help="Multi-node: which node of the profile this is (default: found by this machine's addresses); "
                   "ranks >= 1 serve no HTTP, so no health is asked of them.")
@json_flag("Print the report as JSON.")
@click.pass_context
def status_cmd(ctx, profile_path, preset, root, name, host, as_json):
    """Show the installed service's state; exit 1 when something is wrong (the problems are listed)."""
    # start-up: the status library (its probes: httpx) loads when the verb runs, not for --help
    from kimi_deploy.host import status as status_lib

    layout = HostLayout(root)
    profile, manifest = resolve_installed(profile_path, preset, name, layout)
    report = status_lib.status(profile, layout, manifest, host)
    view = status_lib.gateway_view(profile, layout)
    code = max(report.exit_code, 1 if view and view["problems"] else 0)
    if as_json:
        echo_json({**report.to_dict(), "gateway": view} if view else report.to_dict())
        ctx.exit(code)
    unit = report.unit or {}
    click.echo(f"service   {report.unit_name}: {unit.get('active_state', '?')}/{unit.get('sub_state', '?')}"
               f", enabled: {unit.get('unit_file_state', '?')}, main PID {unit.get('main_pid') or '-'}"
               f", restarts {unit.get('n_restarts') if unit.get('n_restarts') is not None else '?'}")
    click.echo(f"files     {len(report.files)} installed, " + _file_summary(report.files))
    h = report.health
    if h is None:  # the gateway host: no SGLang here (the gateway's view of the workers follows)
        click.echo("role      gateway host: no SGLang server here")
    elif h["ready"] is None:
        click.echo(f"health    not served here ({h['detail']})")
    else:
        click.echo(f"health    {'ready' if h['ready'] else 'NOT READY'} ({h['endpoint']}: {h['detail']})")
    if report.launch:
        d = report.launch
        click.echo(f"launch    {'matches the profile' if d.in_sync else 'DRIFT'} (from {d.source})")
        for entry in d.missing:
            click.echo(f"          - {printable(entry)}   (in the profile, not running)")
        for entry in d.unexpected:
            click.echo(f"          + {printable(entry)}   (running, not in the profile)")
    elif h is not None:
        click.echo("launch    unknown (no /server_info answer and no main PID)")
    state = report.patches.get("state")
    if h is not None:
        click.echo(f"patches   {'unreadable' if state == 'error' else str(state).replace('_', ' ')}" +
                   (f" ({report.patches['detail']})" if report.patches.get("detail") else ""))
    ar = report.allreduce
    if ar and ar.get("error"):
        click.echo(f"allreduce unknown (server log unreadable: {ar['error']})")
    elif ar:
        click.echo(f"allreduce {ar['in_use']}")
        for p in ar["paths"]:
            if p["asked"] or p["state"] == "engaged":
                click.echo(f"          {p['label']}: {'SKIPPED' if p['failed'] else p['state'].replace('_', ' ')}"
                           f" ({p['evidence']})")
    c = report.last_check
    if not c:
        click.echo(f"check     no nightly report yet ({report.check_timer})")
    else:
        counts = ", ".join(f"{n} {k}" for k, n in sorted((c.get("counts") or {}).items()))
        click.echo(f"check     exit {c.get('exit_code')} at {c['modified_at']}" + (f" ({counts})" if counts else "")
                   + (f" ({printable(str(c['detail']))})" if c.get("detail") else "") + f", {report.check_timer}")
    if view:
        _show_gateway(view)
    for problem in [*report.problems, *(view["problems"] if view else [])]:
        click.echo(f"problem: {printable(problem)}")
    ctx.exit(code)


def _show_gateway(view) -> None:
    click.echo(f"gateway   {view['url']}: " + (f"UNREADABLE ({printable(view['error'])})" if view["error"] else
                                               f"{len(view['workers'])} worker(s)"))
    for w in view["workers"]:
        # the gateway's own words (its /workers answer): shown as literal text (kimi_deploy.wire.printable)
        click.echo(printable(f"          {w['url']}: {w['status']}, {'healthy' if w['healthy'] else 'UNHEALTHY'}, "
                             f"{w['load']} in flight"))


def _file_summary(files: dict[str, str]) -> str:
    """``all unmodified`` or ``1 modified: /etc/...; 1 missing: /etc/...`` (host paths)."""
    by_state: dict[str, list[str]] = {}
    for hp, state in files.items():
        if state != "ok":
            by_state.setdefault(state, []).append(hp)
    if not by_state:
        return "all unmodified"
    return "; ".join(f"{len(paths)} {state}: {', '.join(paths)}" for state, paths in sorted(by_state.items()))


COMMANDS = [status_cmd]
