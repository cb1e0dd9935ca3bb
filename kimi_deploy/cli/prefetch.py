"""Verb ``prefetch``: read the model's and the draft's shards into the page cache (:mod:`kimi_deploy.host.prefetch`)."""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy.cli.common import Seconds, echo_json, json_flag, name_option, profile_options, profile_or_installed
from kimi_deploy.host import prefetch as prefetch_lib
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import MAX_PREFETCH_THREADS, MAX_SPAN_SEC


@click.command("prefetch")
@profile_options
@name_option
@click.option("--deadline", type=Seconds(min=0.001, max=float(MAX_SPAN_SEC)), metavar="SECONDS",
              help="Stop reading after this long (default: [startup] prefetch_timeout_sec, at most half "
                   "of [service] timeout_start_sec).")
@click.option("--threads", type=click.IntRange(1, MAX_PREFETCH_THREADS), metavar="N",
              help="Shards read at once (default: [startup] prefetch_threads).")
@json_flag("Print the result as JSON.")
@click.pass_context
def prefetch_cmd(ctx, profile_path, preset, name, deadline, threads, as_json):
    """Read the model's and the draft's shards into the page cache, in SGLang's order, before it starts.

    The server unit runs it as ExecStartPre=- (it never fails the start). Skipped when MemAvailable cannot hold
    the shards still to read plus [startup] prefetch_reserve_gib. Exit 0: read, already warm, skipped or off;
    1: a shard missing or unreadable; 6: stopped at the deadline. Without --profile/--preset: the installed
    profile, as every verb.
    """
    profile = profile_or_installed(profile_path, preset, name, HostLayout(Path("/")))
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    result = prefetch_lib.prefetch(profile, deadline_s=deadline, threads=threads, say=say)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(f"prefetch: {result.summary()}")
    ctx.exit(int(result.exit_code))


COMMANDS = [prefetch_cmd]
