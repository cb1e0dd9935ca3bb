"""Verb ``check``: health tiers and the API-contract suite against a running server."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kimi_deploy.catalog import check_budget
from kimi_deploy.wire.apikey import resolve_key
from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.errors import ExitCode, UsageError
from kimi_deploy.fsio import write_atomic
from kimi_deploy.paths import HostLayout
from kimi_deploy.cli.dataset_options import dataset_limit_options
from kimi_deploy.cli.common import (Seconds, installed_profile_path, json_flag, json_path_option, limit_options,
                                     make_console, name_option, report_console)

if TYPE_CHECKING:  # the check library (openai, httpx, rich) loads when the verb runs, not for its --help
    from rich.console import Console

    from kimi_deploy.check import CheckOptions

#: Default ``--deadline``: the fast tiers' budget on the reference host (:data:`kimi_deploy.catalog.check_budget.
#: DEADLINE_S`, 1380 s: the requests a full run sends x K2.5's per-request time), the nightly unit's too; its
#: ``TimeoutStartSec=`` leaves 3 minutes past it for start-up, the last request and the reports.
DEFAULT_DEADLINE_S = float(check_budget.DEADLINE_S)


class LiveProgress:
    """One live line on a terminal while checks run: the check in flight, how many are done and
    left, failures so far, elapsed time (rich, redrawn twice a second; removed when the run ends).

    Used only when stderr is a terminal and the report does not go to stdout (``--json -``).
    """

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.failed = 0
        self.progress = Progress(TextColumn("check {task.fields[current]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[left]} left, {task.fields[failed]} failed"),
                                 TimeElapsedColumn(), console=console, refresh_per_second=2, transient=True)
        self.task = self.progress.add_task("check", total=None, current="", left="?", failed=0)

    def __enter__(self) -> "LiveProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, check_id: str, done: int, total: int, result) -> None:
        if result is not None and result.status == "fail":
            self.failed += 1
        self.progress.update(self.task, completed=done, total=total, current=check_id, left=total - done,
                             failed=self.failed)


def _globs(values: tuple[str, ...]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@click.group("check", invoke_without_command=True)
@click.option("--base-url", metavar="URL", help="Server root, e.g. http://127.0.0.1:30000 (default: the profile's "
              "host and port).")
@click.option("--model", metavar="NAME", help="Served model name (default: the profile's, else the first listed).")
@click.option("--api-key-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="File holding the API key (default: the profile's api_key_file).")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Deployment profile: base URL, model, key and the expected parsers/speculative/TP (default, "
                   "without --base-url: the installed profile).")
@name_option(neither="--profile nor --base-url")
@click.option("--only", multiple=True, metavar="IDS", help="Run only checks matching these globs "
              "(repeat or comma-separate: 'health.*,config.*').")
@click.option("--skip", multiple=True, metavar="IDS", help="Leave out checks matching these globs.")
@json_path_option("Write the JSON report (kimi-deploy.check/1); '-' = stdout.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), metavar="PATH",
              help="Write a JUnit XML report (a file; only --json takes '-').")
@click.option("--prom", "prom_path", type=click.Path(path_type=Path), metavar="PATH",
              help="Write a Prometheus textfile for node_exporter's textfile collector (a file, not '-').")
@click.option("--timeout", type=Seconds(min=0.1), default=30.0, show_default=True, metavar="S",
              help="Seconds per HTTP request (chat completions may take 6x this to generate).")
@click.option("--repeat", type=click.IntRange(min=0), default=2, show_default=True, metavar="N",
              help="Retries when a call was due under tool_choice auto and the model answered in prose (then: warn "
                   "model_declined; a forced call answered in prose fails at once: tool_choice_violation).")
@click.option("--deadline", type=Seconds(min=1), default=DEFAULT_DEADLINE_S, show_default=True, metavar="S",
              help="Seconds the whole run may take; checks not done by then fail as 'timeout' (not attempted). "
                   "Keep it under the nightly unit's TimeoutStartSec=.")
@click.option("--insecure", is_flag=True,
              help="Send the API key over plain http to a host that is not this one (refused without it: anyone "
                   "on the path could read the key); a warning goes to stderr.")
@click.option("--sample", type=click.IntRange(min=1, max=100_000), metavar="N",
              help="Run the quality tier; quality.accuracy sends N requests (default: the profile's [quality] "
                   "sample, else 200).")
@click.option("--dataset", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Run the quality tier on this JSONL of chat-completion request bodies (K2VV's format; default: "
                   "the kit's agentic samples).")
@click.option("--sampling", type=click.Choice(["model", "greedy"]), default="model", show_default=True,
              help="Sampling of the contract's requests: model = the model's required sampling where its own API "
                   "refuses others (K2.7-Code: temperature 1.0, top_p 0.95), else temperature 0; greedy = "
                   "temperature 0 always.")
@click.option("--concurrency", type=click.IntRange(min=1, max=512), metavar="N",
              help="Requests at once of each contract.concurrency.* case (default: the profile's "
                   "max_running_requests, at most 64, else 8).")
@click.option("--quality-concurrency", type=click.IntRange(min=1, max=256), metavar="N",
              help="quality.accuracy requests in flight at once (default: the profile's, else 4).")
@click.option("--repeats", type=click.IntRange(min=1, max=15), metavar="K",
              help="quality.accuracy sends every request K times; quality.certify judges each by the majority of its "
                   "repeats (default: the profile's [quality] repeats, else 1).")
@click.option("--quality-deadline", type=Seconds(min=1), metavar="S",
              help="Seconds quality.accuracy may take (default: the profile's, else 600; capped by --deadline).")
@click.option("--min-schema-accuracy", type=click.FloatRange(0, 1), metavar="F",
              help="quality.accuracy fails when the 95 % interval of schema accuracy lies below F (a fraction; "
                   "default: the profile's, else 0.9552, K2VV's SGLang figure).")
@click.option("--model-dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="The model's directory on this host (generation_config.json, tokenizer, chat template) for the "
                   "quality pre-flight (default: the profile's model_path when it is a directory).")
@click.option("--sglang-python", metavar="PATH",
              help="SGLang's interpreter, to count prompt tokens with the model's tokenizer (default: the profile's).")
@limit_options
@dataset_limit_options(streamed=True)
@click.option("--list", "list_only", is_flag=True, help="Print the check ids and exit.")
@click.option("--pushgateway", "pushgateway", metavar="URL",
              help="Also push the Prometheus text (as --prom writes it) to this Prometheus Pushgateway, group "
                   "job=<[monitoring] check_job>/service=<name> (a check run as a Kubernetes Job has no textfile "
                   "directory). A push that fails is reported on stderr and turns exit 0 into 1.")
@click.option("--each-worker", is_flag=True,
              help="--base-url (or the profile's [gateway]) is SGLang's gateway: run the checks (default: health "
                   "and contract tiers) against every worker it lists, one report each, then the concurrency "
                   "pass and the reasoning checks through the gateway itself; exit status of the worst.")
@click.pass_context
def check_cmd(ctx, base_url, model, api_key_file, profile_path, name, only, skip, json_path, junit_path, prom_path,
              timeout, repeat, deadline, insecure, sampling, concurrency, sample, dataset, quality_concurrency, repeats,
              quality_deadline, min_schema_accuracy, model_dir, sglang_python, max_body_bytes, max_line_bytes,
              max_dataset_line_bytes, max_dataset_bytes, list_only, pushgateway, each_worker):
    """Check a running OpenAI-compatible server: health, configuration, API contract.

    Tool-call quality (schema corpus, accuracy with its 95 % interval, Kimi pre-flight) with --sample/--dataset
    or --only 'quality.*'; `check compare A.json B.json` says whether accuracy changed beyond sampling noise.

    Exit status: 0 no failure (warnings allowed), 1 a check failed, 2 usage or profile
    error, or a key bound for plain http to another host without --insecure (nothing sent,
    nothing written), 3 the server did not answer at all, 130 interrupted (Ctrl-C or SIGTERM:
    the reports hold the checks that finished, marked interrupted).
    """
    if ctx.invoked_subcommand is not None:  # `check compare A.json B.json`
        return
    if not list_only:
        if not base_url and not profile_path:  # the installed profile, as every verb (--name: which one)
            profile_path = installed_profile_path(name, HostLayout(Path("/")), given="--base-url http://HOST:PORT",
                                                  what="no server to check")
        if base_url:
            check_base_url(base_url)  # run_checks' own rule, applied before the client libraries load

    # start-up: the check library (openai, httpx) loads once the arguments are read, so usage errors come first
    from kimi_deploy.check import CheckOptions, pushgateway as push_lib, check_ids, reports, run_checks, runner, workers

    if list_only:
        for check_id in check_ids.select(_globs(only), _globs(skip), quality=True):
            click.echo(check_id)
        return
    to_stdout = json_path == "-"
    outputs = {"json_path": Path(json_path) if json_path and not to_stdout else None,
               "junit_path": junit_path, "prom_path": prom_path}
    reports.check_output_paths(**outputs)
    if not base_url:
        runner.refuse_on_a_silent_rank(profile_path)  # a rank >= 1 of a multi-node group serves no HTTP
    api_key = resolve_key(api_key_file)
    options = CheckOptions(base_url=base_url, model=model, api_key=api_key, profile=profile_path,
                           only=_globs(only), skip=_globs(skip), timeout=timeout, repeat=repeat, deadline=deadline,
                           insecure=insecure, max_body_bytes=max_body_bytes, max_line_bytes=max_line_bytes,
                           quality=sample is not None or dataset is not None, sample=sample, dataset=dataset,
                           sampling=sampling, concurrency=concurrency, quality_concurrency=quality_concurrency,
                           repeats=repeats, quality_deadline=quality_deadline,
                           min_schema_accuracy=min_schema_accuracy, model_dir=model_dir, sglang_python=sglang_python,
                           max_dataset_line_bytes=max_dataset_line_bytes, max_dataset_bytes=max_dataset_bytes)
    if pushgateway and not pushgateway.startswith(("http://", "https://")):
        raise UsageError(f"--pushgateway {pushgateway!r} is not an http(s) URL",
                         hint="e.g. --pushgateway http://pushgateway.monitoring.svc:9091")
    if each_worker:
        ctx.exit(int(_each_worker(workers, reports, runner, push_lib, options, json_path, junit_path, prom_path,
                                  pushgateway)))

    def on_sigterm(signum, frame) -> None:
        raise runner.Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)  # stop like Ctrl-C: report what ran
    try:
        if sys.stderr.isatty() and not to_stdout:
            with LiveProgress(make_console(stderr=True)) as progress:
                report = run_checks(options, progress)
        else:
            report = run_checks(options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if profile_path is not None:
        # start-up: the host's start records load only for a run with a profile, after the checks ran
        from kimi_deploy.host.start_history import recorded

        report.starts = recorded(profile_path)
    reports.write_reports(report, **outputs)
    reports.render_table(report, report_console(file=sys.stderr if to_stdout else sys.stdout))
    if to_stdout:
        click.echo(reports.to_json_text(report), nl=False)
    code = int(report.exit_code)
    if pushgateway:
        code = _push(push_lib, runner, pushgateway, profile_path, reports.to_prometheus(report), report.service,
                     code)
    ctx.exit(code)


def _push(push_lib, runner, url: str, profile_source, text: str, service: str | None, code: int) -> int:
    """Push ``text`` (:mod:`kimi_deploy.check.pushgateway`) as the profile's check job; the exit code after it."""
    job = "kimi-deploy-check"
    if profile_source is not None:
        profile = runner._resolve_profile(profile_source)[0]  # a path is loaded, a Profile kept
        job = profile.monitoring.check_job or f"{profile.service.name}-check"
        service = service or profile.service.name
    try:
        where = push_lib.push(url, job, service, text)
    except push_lib.PushError as exc:
        click.echo(f"error: the check's result did not reach the Pushgateway, so no alert can read it: {exc}; "
                   "fix: check --pushgateway and that the Pushgateway runs", err=True)
        return code or 1
    click.echo(f"pushed to {where}", err=True)
    return code


def _each_worker(workers, reports, runner, push_lib, options: CheckOptions, json_path, junit_path, prom_path,
                 pushgateway=None) -> int:
    """``check --each-worker``: one report per worker of the gateway (:mod:`kimi_deploy.check.workers`);
    ``options`` as for one server, its ``base_url`` (or the profile's ``[gateway]``) naming the gateway; the check
    modules are passed in by :func:`check_cmd` (loaded once the arguments are read).

    Once the run starts its JSON report is written whatever happens: a worker refused or failing, the gateway
    not answering, the deadline, Ctrl-C or SIGTERM (exit 130, like a plain check)."""
    import time

    if junit_path:
        raise UsageError("--junit writes one server's report; --each-worker writes --json and --prom (one series "
                         "set per worker, labelled worker=URL)",
                         hint="drop --junit, or run `check --base-url WORKER` per worker for it")
    started = time.time()
    options, base_url = workers.gateway_options(options)
    profile = options.profile
    to_stdout = json_path == "-"
    if (json_path and not to_stdout) or prom_path:
        reports.check_output_paths(json_path=Path(json_path) if json_path and not to_stdout else None,
                                   prom_path=prom_path)
    def on_sigterm(signum, frame) -> None:
        raise runner.Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)  # stop like Ctrl-C: report what ran
    try:
        fleet = workers.check_each_worker(options, base_url)
    finally:
        signal.signal(signal.SIGTERM, previous)
    text = json.dumps(fleet.to_json(), indent=2, ensure_ascii=False) + "\n"
    if json_path and not to_stdout:
        write_atomic(Path(json_path), text)
    prom_text = reports.workers_to_prometheus(fleet.reports, service=profile.service.name if profile else None,
                                              exit_code=int(fleet.exit_code), started_at=started)
    if prom_path:
        write_atomic(Path(prom_path), prom_text)
    out = sys.stderr if to_stdout else sys.stdout
    for run in fleet.runs:
        if run.report is None:
            print(f"{fleet.shown(run.url)}: exit {int(run.exit_code)}, not checked: {fleet.said(run.error)}", file=out)
            continue
        failed = [r.id for r in run.report.results if r.status == "fail"]
        print(f"{fleet.shown(run.url)}: exit {int(run.exit_code)}, {len(run.report.results)} checks, "
              f"{len(failed)} failed{': ' + ', '.join(failed[:5]) if failed else ''}", file=out)
    if fleet.through_gateway is not None:
        gw = fleet.through_gateway
        failed = [f"{r.id} ({r.detail.split(';', 1)[0]})" if r.id.startswith("contract.concurrency.") else r.id
                  for r in gw.results if r.status == "fail"]
        print(f"{fleet.shown(fleet.gateway)} (through the gateway): exit {int(gw.exit_code)}, {len(gw.results)} "
              f"checks, {len(failed)} failed{': ' + ', '.join(failed[:5]) if failed else ''}", file=out)
    if fleet.error:
        print(f"{fleet.shown(fleet.gateway)}: {fleet.said(fleet.error)}", file=sys.stderr)
    elif not fleet.runs and not fleet.interrupted:
        print(f"{fleet.shown(fleet.gateway)}: the gateway lists no worker", file=out)
    if fleet.interrupted:
        print(f"interrupted by {fleet.interrupted}: a partial report, {len(fleet.not_run)} worker(s) not checked",
              file=out)
    if to_stdout:
        click.echo(text, nl=False)
    if pushgateway:
        return _push(push_lib, runner, pushgateway, profile, prom_text, profile.service.name if profile else None,
                     int(fleet.exit_code))
    return fleet.exit_code


@check_cmd.command("compare")
@click.argument("reports", nargs=2, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
              show_default=True, help="Significance level of the two-proportion test.")
@json_flag("Print the comparison as JSON.")
@click.pass_context
def compare_cmd(ctx, reports, alpha, as_json):
    """Compare two check reports' schema accuracy (A before, B after): is the change beyond sampling noise?

    Both reports come from `kimi-deploy check --sample N --json PATH`. Exit status: 0 within noise or a
    rise, 1 a drop beyond sampling noise (two-proportion z test), 2 a file that is no such report or nothing to
    compare (a report without a single tool-call answer).
    """
    import json

    from kimi_deploy.check.quality.compare import compare  # start-up: loaded when `check compare` runs

    result = compare(Path(reports[0]), Path(reports[1]), alpha)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        for line in result.lines():
            click.echo(line)
    ctx.exit(int(ExitCode.FAILED if result.verdict == "drop" else ExitCode.OK))


COMMANDS = [check_cmd]
