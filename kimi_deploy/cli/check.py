"""Verb ``check``: health tiers and the API-contract suite against a running server."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kimi_deploy.wire.apikey import resolve_key
from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import write_atomic
from kimi_deploy.cli.options import Seconds, json_path_option, limit_options
from kimi_deploy.wire.printable import printable

if TYPE_CHECKING:  # the check library (openai, httpx, rich) loads when the verb runs, not for its --help
    from rich.console import Console

    from kimi_deploy.check import CheckOptions

#: Default ``--deadline``: 12 minutes, well inside the nightly unit's ``TimeoutStartSec=900``
#: (systemd/check.service.j2), leaving 3 minutes for start-up, the last request and the reports.
DEFAULT_DEADLINE_S = 720.0


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


@click.command("check")
@click.option("--base-url", metavar="URL", help="Server root, e.g. http://127.0.0.1:30000 (default: the profile's "
              "host and port).")
@click.option("--model", metavar="NAME", help="Served model name (default: the profile's, else the first listed).")
@click.option("--api-key-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="File holding the API key (default: the profile's api_key_file).")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Deployment profile: base URL, model, key and the expected parsers/speculative/TP.")
@click.option("--only", multiple=True, metavar="IDS", help="Run only checks matching these globs "
              "(repeat or comma-separate: 'health.*,config.*').")
@click.option("--skip", multiple=True, metavar="IDS", help="Leave out checks matching these globs.")
@json_path_option("Write the JSON report (kimi-deploy.check/1); '-' = stdout.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path, dir_okay=False), metavar="PATH",
              help="Write a JUnit XML report (a file; only --json takes '-').")
@click.option("--prom", "prom_path", type=click.Path(path_type=Path, dir_okay=False), metavar="PATH",
              help="Write a Prometheus textfile for node_exporter's textfile collector (a file, not '-').")
@click.option("--timeout", type=Seconds(min=0.1), default=30.0, show_default=True, metavar="S",
              help="Seconds per HTTP request (chat completions may take 6x this to generate).")
@click.option("--repeat", type=click.IntRange(min=0), default=2, show_default=True, metavar="N",
              help="Retries when a call was due and the model answered in prose (then: warn model_declined).")
@click.option("--deadline", type=Seconds(min=1), default=DEFAULT_DEADLINE_S, show_default=True, metavar="S",
              help="Seconds the whole run may take; checks not done by then fail as 'timeout' (not attempted). "
                   "Keep it under the nightly unit's TimeoutStartSec=.")
@click.option("--insecure", is_flag=True,
              help="Send the API key over plain http to a host that is not this one (refused without it: anyone "
                   "on the path could read the key); a warning goes to stderr.")
@limit_options
@click.option("--list", "list_only", is_flag=True, help="Print the check ids and exit.")
@click.option("--each-worker", is_flag=True,
              help="--base-url (or the profile's [gateway]) is SGLang's gateway: run the checks (default: health "
                   "and contract tiers) against every worker it lists, one report each; exit status of the worst.")
@click.pass_context
def check_cmd(ctx, base_url, model, api_key_file, profile_path, only, skip, json_path, junit_path, prom_path,
              timeout, repeat, deadline, insecure, max_body_bytes, max_line_bytes, list_only, each_worker):
    """Check a running OpenAI-compatible server: health, configuration, API contract.

    Exit status: 0 no failure (warnings allowed), 1 a check failed, 2 usage or profile
    error, or a key bound for plain http to another host without --insecure (nothing sent,
    nothing written), 3 the server did not answer at all, 130 interrupted (Ctrl-C or SIGTERM:
    the reports hold the checks that finished, marked interrupted).
    """
    if not list_only:
        if not base_url and not profile_path:
            raise UsageError("no server to check", hint="pass --base-url http://HOST:PORT or --profile FILE")
        if base_url:
            check_base_url(base_url)  # run_checks' own rule, applied before the client libraries load
    from rich.console import Console

    # start-up: the check library (openai, httpx) loads once the arguments are read, so usage errors come first
    from kimi_deploy.check import CheckOptions, registry, reports, run_checks, runner, workers

    if list_only:
        for check_id in registry.select(_globs(only), _globs(skip)):
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
                           insecure=insecure, max_body_bytes=max_body_bytes, max_line_bytes=max_line_bytes)
    if each_worker:
        ctx.exit(int(_each_worker(workers, reports, options, json_path, junit_path, prom_path)))

    def on_sigterm(signum, frame) -> None:
        raise runner.Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)  # stop like Ctrl-C: report what ran
    try:
        if sys.stderr.isatty() and not to_stdout:
            with LiveProgress(Console(stderr=True)) as progress:
                report = run_checks(options, progress)
        else:
            report = run_checks(options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    reports.write_reports(report, **outputs)
    reports.render_table(report, Console(file=sys.stderr if to_stdout else sys.stdout, width=160
                                         if not sys.stdout.isatty() else None))
    if to_stdout:
        click.echo(reports.to_json_text(report), nl=False)
    ctx.exit(int(report.exit_code))


def _each_worker(workers, reports, options: CheckOptions, json_path, junit_path, prom_path) -> int:
    """``check --each-worker``: one report per worker of the gateway (:mod:`kimi_deploy.check.workers`, passed in
    with :mod:`kimi_deploy.check.reports` by :func:`check_cmd`); ``options`` as for one server, its ``base_url``
    (or the profile's ``[gateway]``) naming the gateway."""
    if junit_path or prom_path:
        raise UsageError("--junit and --prom write one server's report; --each-worker writes --json only",
                         hint="drop --junit/--prom, or run `check --base-url WORKER` per worker for them")
    options, base_url = workers.gateway_options(options)
    to_stdout = json_path == "-"
    if json_path and not to_stdout:
        reports.check_output_paths(json_path=Path(json_path))
    # start-up: the gateway's client (host side: check code never imports it) loads for --each-worker only
    from kimi_deploy.host.gateway import Gateway

    with Gateway(base_url, options.api_key, timeout=options.timeout) as gw:  # exit 3 unanswered, 1 refused
        urls = [w.url for w in gw.workers()]
    fleet = workers.check_each_worker(options, base_url, urls)
    text = json.dumps(fleet.to_json(), indent=2, ensure_ascii=False) + "\n"
    if json_path and not to_stdout:
        write_atomic(Path(json_path), text)
    out = sys.stderr if to_stdout else sys.stdout
    for url, report in fleet.reports:
        failed = [r.id for r in report.results if r.status == "fail"]
        print(f"{printable(url)}: exit {int(report.exit_code)}, {len(report.results)} checks, "
              f"{len(failed)} failed{': ' + ', '.join(failed[:5]) if failed else ''}", file=out)
    if not fleet.reports:
        print(f"{printable(base_url)}: the gateway lists no worker", file=out)
    if to_stdout:
        click.echo(text, nl=False)
    return fleet.exit_code


COMMANDS = [check_cmd]
