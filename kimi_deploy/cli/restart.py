"""Verb ``restart``: restart the service, wait for readiness with a live display, verify, roll back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kimi_deploy.cli.common import (Seconds, echo_json, host_systemd_option, json_flag, make_console,
                                     profile_options, refuse_host_systemd, resolve_installed_deployment,
                                     root_option)
from kimi_deploy.paths import HostLayout
from kimi_deploy.wire.printable import markup, printable

if TYPE_CHECKING:  # restart's library (httpx, rich, the check tiers) loads when the verb runs, not for --help
    from kimi_deploy.host.readiness import WaitState


def _line(label: str, state: WaitState) -> str:
    minutes, seconds = divmod(int(state.elapsed), 60)
    phase = state.phase or "starting"
    last = (state.last_line or "")[:100]
    prefix = "rollback " if label == "rollback" else ""
    return f"{prefix}{minutes:02d}:{seconds:02d}  {phase:<24} {last}"


@click.command("restart")
@profile_options
@root_option
@click.option("--name", default=None, metavar="NAME", help="Installed service (default: the only one).")
@click.option("--wait", is_flag=True, help="Wait until the server is ready (/health_generate answers, else a "
              "1-token chat completion: the verdict of status and check's health.ready), then run the gate's tiers "
              "(see --gate).")
@click.option("--gate", type=click.Choice(["ready", "fast", "parser", "contract"]), default="contract",
              show_default=True, help="How far --wait verifies, each tier after the one before: ready; fast "
              "(health, config checks); parser (the parser.* corpus through the server's own parsers); contract "
              "(tool calls streamed and not, the id round trip, reasoning separation).")
@click.option("--allow-parser-removal", is_flag=True, help="Restart even though the installed profile drops "
              "--tool-call-parser or --reasoning-parser that the previous install had (refused otherwise, exit 4).")
@click.option("--timeout", type=Seconds(min=0, min_open=True), default=None, metavar="S",
              help="Seconds to wait for readiness (default: the unit's TimeoutStartSec=).")
@click.option("--rollback-on-failure", is_flag=True,
              help="If the new version fails any tier of the gate, restore the previous installed files, reload, "
                   "restart and verify them with the same gate (exit 10 when they fail it too).")
@click.option("--poll-interval", type=Seconds(min=0, min_open=True, max=3600), default=5.0, show_default=True,
              metavar="S", help="Seconds between readiness probes.")
@click.option("--host", "host", default=None, metavar="NAME",
              help="Which node of the profile this is (default: found by this machine's addresses). With [gateway] "
                   "its replica is removed from the gateway first and added back once ready and checked; on a rank "
                   ">= 1 of a multi-node group --wait is refused (it serves no HTTP).")
@click.option("--drain-timeout", type=Seconds(min=0, max=86400), default=600.0, show_default=True,
              metavar="S", help="With [gateway]: seconds to wait, once the gateway dropped the replica, for the "
                                "requests still running on it (its /v1/loads) before restarting; past it nothing "
                                "is restarted (exit 9).")
@host_systemd_option
@click.option("--dry-run", is_flag=True, help="Show what would be restarted, gated and rolled back (the backup set "
              "and the files it would write back), or the interrupted change it would finish or undo; change "
              "nothing, run no systemctl.")
@json_flag("Print the result as JSON.")
@click.pass_context
def restart_cmd(ctx, profile_path, preset, root, name, wait, gate, allow_parser_removal, timeout, rollback_on_failure,
                poll_interval, host, drain_timeout, host_systemd, dry_run, as_json):
    """Restart the server; with --wait, show its progress and gate it (exit 6: not ready in time).

    The gate (--gate, default contract) runs ready, fast, parser and contract tiers in turn and stops at the
    first that fails; the result names that tier and its failed checks (exit 1). With --rollback-on-failure
    the previous files come back and pass the same gate, or it is exit 10.

    Behind a gateway ([gateway] in the profile): the replica leaves the gateway first and comes back only
    after it is ready and its gate passed; on failure it stays out (exit 1 or 6; exit 9 when it
    passed but the gateway did not take it back, or stayed draining). A gateway that is down (exit 3) or
    refuses the removal (exit 1) restarts nothing: the message says the replica was not taken out."""

    # start-up: the restart library (httpx, the readiness probes) loads when the verb runs, not for --help
    from kimi_deploy.host import restart as restart_lib

    if rollback_on_failure and not wait:
        wait = True  # a rollback needs a verdict
    layout = HostLayout(root)
    deployment, _manifest = resolve_installed_deployment(profile_path, preset, name, layout)
    refuse_host_systemd(layout, host_systemd, "restart", dry_run=dry_run)
    drain = restart_lib.drain_for(deployment, layout, host, wait=wait, idle_timeout=drain_timeout)
    if dry_run:
        plan = restart_lib.plan_restart(deployment, layout, wait=wait, gate=gate, rollback_on_failure=rollback_on_failure,
                                        drain=drain, allow_parser_removal=allow_parser_removal)
        refused_here = not layout.is_host and not host_systemd  # what the real run says (refuse_host_systemd)
        if as_json:
            echo_json({**plan.to_dict(), "refused_without_host_systemd": refused_here})
        else:
            show_result(plan.lines())
            if refused_here:
                click.echo(f"note: without --host-systemd the real run is refused (exit 2): --root {layout.root} holds "
                           "the files, and systemctl would restart this host's unit, which does not run them",
                           err=True)
        ctx.exit(4 if plan.refused else 0)
    console = make_console(stderr=True)
    if as_json or not console.is_terminal:
        status = None
        last_phase: dict[str, str | None] = {}

        def on_poll(label, state):
            # not a terminal (a log, CI): one line per phase change instead of a live display
            if not as_json and state.phase != last_phase.get(label, ""):
                last_phase[label] = state.phase
                click.echo(printable(_line(label, state)), err=True)
    else:
        status = console.status("restarting")
        status.start()

        def on_poll(label, state):
            status.update(markup(_line(label, state)))  # a server log line is not markup

    def on_event(message):
        if not as_json:
            console.print(markup(message), highlight=False)

    try:
        result = restart_lib.restart(deployment, layout, wait=wait, timeout=timeout,
                                     rollback_on_failure=rollback_on_failure, poll_interval=poll_interval,
                                     on_poll=on_poll, on_event=on_event, drain=drain, node=host, gate=gate,
                                     allow_parser_removal=allow_parser_removal)
    finally:
        if status:
            status.stop()
    if as_json:
        echo_json(result.to_dict())
    else:
        show_result(restart_lib.result_lines(result))
    ctx.exit(result.exit_code)


def show_result(lines) -> None:
    """The human form of a :class:`kimi_deploy.host.restart.RestartResult` (upgrade prints it too): the lines of
    :func:`kimi_deploy.host.restart.result_lines`."""
    for line in lines:
        click.echo(line)


COMMANDS = [restart_cmd]
