"""Verb ``tune``: search this host's best SGLang configuration for a workload and SLO, gated on the contract."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from kimi_deploy.bench import params
from kimi_deploy.cli.common import (Seconds, echo_json, host_systemd_option, json_flag, profile_options,
                                     refuse_host_systemd, resolve_profile, root_option)
from kimi_deploy.errors import UsageError
from kimi_deploy.paths import HostLayout

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)\s*$", re.I)


def parse_budget(text: str | None) -> tuple[int | None, float | None]:
    """``--budget``: ``N`` restarts, or a duration (``90m``, ``4h``, ``600s``) -> ``(restarts, seconds)``.

    Raises:
        UsageError: neither (with examples).
    """
    if text is None:
        return None, None
    if text.strip().isdigit() and int(text) > 0:
        return int(text), None
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError("--budget takes a number of restarts or a duration", value=text,
                         hint="e.g. --budget 12 (restarts), --budget 4h, --budget 90m")
    unit = match.group(2).lower()
    return None, float(match.group(1)) * {"s": 1, "m": 60, "min": 60, "h": 3600}[unit]


@click.command("tune")
@profile_options
@root_option
@click.option("--slo", required=True, metavar="ttft=MS,tpot=MS,e2e=MS",
              help="The SLO a request must meet to count in goodput (milliseconds; as bench --slo).")
@click.option("--workload", default="builtin", show_default=True, metavar="FILE|builtin",
              help="The conversations to send: a JSONL dataset (as bench --dataset) or the kit's built-in prompts.")
@click.option("--concurrency", type=click.IntRange(1, params.MAX_CONCURRENCY), default=16, show_default=True,
              metavar="N", help="Closed-loop clients of each measurement (the SLO's load).")
@click.option("--request-rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="R",
              help="Poisson arrivals (requests/s) instead of a closed loop; --concurrency caps what is in flight.")
@click.option("--num-prompts", type=click.IntRange(1, params.MAX_REQUESTS), default=None, metavar="N",
              help="Measured requests per bench run (default as bench).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True, metavar="M")
@click.option("--runs", type=click.IntRange(1, params.MAX_RUNS), default=3, show_default=True, metavar="K",
              help="Bench runs per measurement: goodput's interval is their range (3 or more for a noise verdict).")
@click.option("--warmup", type=click.IntRange(0, params.MAX_REQUESTS), default=None, metavar="N",
              help="Requests before each measurement (default: the concurrency).")
@click.option("--budget", default=None, metavar="TIME|N",
              help="Stop the search after N restarts or this long (4h, 90m); the best measured so far wins.")
@click.option("--space", "space_items", multiple=True, metavar="KEY=V1,V2",
              help="Tune only these options, over these values (repeat; default: every tunable row of the options "
                   "table for this SGLang release).")
@click.option("--method", type=click.Choice(["descent", "grid", "random", "halving"]), default="descent",
              show_default=True, help="The search (docs/design.md#tune): descent visits the fewest configurations.")
@click.option("--gate", type=click.Choice(["ready", "fast", "parser", "contract"]), default="contract", show_default=True,
              help="The gate each candidate passes before it is measured (the result always passes contract).")
@click.option("--apply", "apply_winner", is_flag=True,
              help="Keep the winner when it beats the original beyond noise (default: the original comes back).")
@click.option("--resume", is_flag=True, help="Continue the tune on record (after a kill, a reboot or Ctrl-C) with "
              "the settings it began with: finished candidates are not run again.")
@click.option("--timeout", type=Seconds(min=0, min_open=True), default=None, metavar="S",
              help="Seconds each start may take (default: the unit's TimeoutStartSec=).")
@click.option("--poll-interval", type=Seconds(min=0, min_open=True, max=3600), default=5.0, show_default=True,
              metavar="S", help="Seconds between readiness probes.")
@click.option("--host", "host", default=None, metavar="NAME",
              help="With [gateway]: this replica (drained from the gateway before each restart, as restart does).")
@click.option("--drain-timeout", type=Seconds(min=0, max=86400), default=600.0, show_default=True, metavar="S",
              help="With [gateway]: seconds to wait for the replica's requests before each restart.")
@click.option("--gpu-facts", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              metavar="FILE", help="Recorded nvidia-smi --query-gpu CSV for the memory plan (default: this host's).")
@click.option("--model-facts", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              metavar="DIR", help="The model's config.json and header index (default: the model directory).")
@click.option("--seed", type=int, default=0, show_default=True, help="Bench prompt order and random search.")
@click.option("--dry-run", is_flag=True, help="Show the space, what the profile rules, the memory plan and SGLang's "
              "parser prune, and the restarts the search needs with their cost; restart nothing, write nothing.")
@host_systemd_option
@json_flag("Print the report as JSON (each candidate: values, gate verdict, goodput with interval, TTFT/ITL).")
def tune_cmd(profile_path, preset, root, slo, workload, concurrency, request_rate, num_prompts, max_tokens, runs,
             warmup, budget, space_items, method, gate, apply_winner, resume, timeout, poll_interval, host,
             drain_timeout, gpu_facts, model_facts, seed, dry_run, host_systemd, as_json):
    """Search this host's best SGLang configuration for a workload and SLO, each candidate gated on the contract.

    Each candidate (the options table's tunable rows, limited by --space) is checked by the profile rules, the
    memory plan and SGLang's own parser before it is started; it then goes live through install and restart
    --wait --gate contract --rollback-on-failure (a candidate that breaks the contract is rejected with its
    failing checks) and is measured with bench: goodput = requests/s meeting every SLO, with its interval over
    the runs. Every step is journalled (tune --resume continues after a kill); Ctrl-C puts the original
    configuration back (exit 130). At the end the host runs the original, or with --apply the winner, gated.
    Exit 0 when done; 2 bad options; 4 refused (not the installed profile, or the running one fails its gate);
    7 another tune runs; 10 a rollback failed its gate too."""
    # the host, bench and check libraries load when the verb runs, not for --help
    from kimi_deploy.tune import report, run as tune_lib, space

    layout = HostLayout(root)
    refuse_host_systemd(layout, host_systemd, "tune", dry_run=dry_run)
    profile = resolve_profile(profile_path, preset)
    restarts, seconds = parse_budget(budget)
    if workload != "builtin" and not Path(workload).is_file():
        raise UsageError("--workload: no such file", value=workload, hint="give a JSONL dataset or 'builtin'")
    settings = tune_lib.Settings(
        slo=params.slo(slo), workload=workload, concurrency=concurrency, request_rate=request_rate,
        num_prompts=num_prompts, max_tokens=max_tokens, runs=runs, warmup=warmup, budget_restarts=restarts,
        budget_seconds=seconds, gate=gate, method=method,
        space={k: list(v) for k, v in space.parse_space(space_items).items()}, apply=apply_winner,
        timeout=timeout, poll_interval=poll_interval, host=host, drain_timeout=drain_timeout, seed=seed)
    if not resume:  # before the interpreter is asked: the cheap refusal first
        tune_lib.installed_profile(layout, profile)
    version, components = tune_lib.probe(profile.service.python)
    facts = tune_lib.memory_facts(profile, gpu_facts, model_facts)

    def say(line: str) -> None:
        click.echo(line, err=True)

    host_facts = tune_lib.Host(layout, profile, version, components, facts, say)
    if dry_run:
        _show_plan(tune_lib.plan(host_facts, settings), as_json)
        return

    result = tune_lib.tune(host_facts, settings, resume=resume).result or {}
    if as_json:
        echo_json(result)
        return
    for line in report.table_lines(result):
        click.echo(line)
    folder = layout.tune_dir(profile.service.name)
    if result.get("winner"):
        gain = f" ({result['gain']:+.1%} goodput)" if result.get("gain") is not None else ""
        click.echo(f"winner: {result['winner_label']}{gain}; {result['verdict']} against the original")
    click.echo(f"Pareto set (goodput against ITL p99): {', '.join(result.get('pareto') or []) or 'none'}")
    click.echo(f"restarts: {result.get('restarts')}, measurements: {result.get('measurements')}, "
               f"method {result.get('method')}")
    running = "the winner" if result.get("deployed") != result.get("baseline") else "the original configuration"
    click.echo(f"running now: {running} (passed the contract gate)")
    click.echo(f"files: {folder}/{{report.json,winner.toml,winner.diff,tune.png}}")
    for command in result.get("reproduce") or []:
        click.echo(f"reproduce: {command}")
    sys.stdout.flush()


def _show_plan(plan: dict, as_json: bool) -> None:
    if as_json:
        echo_json(plan)
        return
    for d in plan["dimensions"]:
        click.echo(f"{d['key']}: {', '.join(str(v) for v in d['values'])} (now {d['baseline']})")
    click.echo(f"space: {plan['space']} candidates; {len(plan['pruned'])} pruned before any restart"
               + ("" if plan["memory_planned"] else " (no GPU or model facts: memory not planned)"))
    for row in plan["pruned"][:20]:
        click.echo(f"  pruned ({row['stage']}): {row['label']}: {row['problem'][:160]}")
    if len(plan["pruned"]) > 20:
        click.echo(f"  ... and {len(plan['pruned']) - 20} more (--json lists them all)")
    click.echo(f"{plan['method']}: about {plan['restarts']} restarts, {plan['hours']} h at {plan['start_seconds']:.0f} s "
               f"a start ({plan['start_source']}); a grid: {plan['grid_restarts']} restarts, {plan['grid_hours']} h")
    click.echo("dry run: nothing was restarted or written")


COMMANDS = [tune_cmd]
