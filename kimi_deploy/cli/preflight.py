"""Verb ``preflight``: a bounded gloo rendezvous of one rank of a multi-node group (:mod:`kimi_deploy.host.preflight`)."""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy.cli.common import Seconds, echo_json, json_flag, name_option, profile_options, profile_or_installed
from kimi_deploy.host import preflight as preflight_lib
from kimi_deploy.paths import HostLayout
from kimi_deploy.deployment import resolve
from kimi_deploy.topology import PREFLIGHT_TIMEOUT_SEC

#: Longest --timeout accepted (a day): a rendezvous that waits longer waits for nothing.
MAX_TIMEOUT_SEC = 86400.0


@click.command("preflight")
@profile_options
@name_option
@click.option("--host", "node", required=True, metavar="NAME",
              help="This host as [fleet] replicas lists it (the rank units pass their own).")
@click.option("--timeout", type=Seconds(min=0.1, max=MAX_TIMEOUT_SEC), default=float(PREFLIGHT_TIMEOUT_SEC),
              show_default=True, metavar="SECONDS",
              help="How long to wait for the other ranks (every rank must start within it).")
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter, which has torch (default: [service] python of the profile).")
@json_flag("Print the result as JSON.")
@click.pass_context
def preflight_cmd(ctx, profile_path, preset, name, node, timeout, python, as_json):
    """Rendezvous with the other ranks of this node's multi-node group over gloo; name what is wrong.

    Exit 0: every rank joined and gloo connected over [fleet] nic; 1: a wrong host, NIC or port; 6: a rank
    did not come within --timeout. Run on every node of the group (the rank units run it as ExecStartPre=).
    Without --profile/--preset: the installed profile, as every verb.
    """
    profile = profile_or_installed(profile_path, preset, name, HostLayout(Path("/")))
    rank = resolve(profile, launches=False).rank_of(node)  # the deployment's rank table, no launch built
    result = preflight_lib.preflight(profile, rank, timeout=timeout, python=python)
    if as_json:
        echo_json(result.to_dict())
    elif result.ok:
        click.echo(f"ok: rank {rank.rank} of {rank.nnodes} ({rank.node}) met every rank of replica {rank.replica} "
                   f"at {rank.rank0}:{result.port} and over {result.nic} in {result.seconds:.1f} s")
    else:
        click.echo(f"FAILED ({result.stage}): {result.error}")
        click.echo(f"fix: {result.fix}")
    ctx.exit(int(result.exit_code))


COMMANDS = [preflight_cmd]
