"""Verbs ``bench`` (run a sweep) and ``bench compare`` (ratios table; PNG with ``--plot``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kimi_deploy.wire.apikey import ARGV_REFUSAL, ENV_VAR, guard_transport, resolve_key
from kimi_deploy.wire.baseurl import check_base_url
from kimi_deploy.bench import params
from kimi_deploy.errors import ExitCode, KimiDeployError, UsageError
from kimi_deploy.redact import redact_text
from kimi_deploy.fsio import check_output_paths, write_atomic
from kimi_deploy.paths import HostLayout
from kimi_deploy.wire.printable import markup, printable
from kimi_deploy.cli.dataset_options import dataset_limit_options
from kimi_deploy.cli.common import (installed_profile_path, json_flag, json_path_option, limit_options, make_console,
                                     name_option, report_console)
from kimi_deploy.wire.limits import parse_json


class Checked(click.ParamType):
    """A click type whose conversion is one validator of :mod:`kimi_deploy.bench.params`.

    The validator's :class:`UsageError` (exit 2, with the bad value and a fix) passes through
    click unchanged to the CLI edge, so every bad number reads the same way.
    """

    def __init__(self, name: str, check) -> None:
        self.name = name
        self.check = check

    def convert(self, value, param, ctx):
        if value is None or (not isinstance(value, str) and self.name.endswith("list")):
            return value  # a default already converted, or none
        return self.check(value)


def _num(option: str, kind: type = float, *, minimum: float | None = None, open_min: bool = False,
         maximum: float | None = None, example: str = "") -> Checked:
    return Checked("integer" if kind is int else "number",
                   lambda v: params.number(v, option=option, kind=kind, minimum=minimum, open_min=open_min,
                                           maximum=maximum, example=example))


def _list(option: str, kind: type, *, minimum: float, open_min: bool = False, maximum: float | None = None,
          example: str) -> Checked:
    return Checked(f"{kind.__name__} list",
                   lambda v: params.number_list(v, option=option, kind=kind, minimum=minimum, open_min=open_min,
                                                maximum=maximum, example=example))


SLO = Checked("slo", params.slo)

#: Exit status of a sweep stopped by SIGINT/SIGTERM (128 + SIGINT, the shell's convention for Ctrl-C),
#: after the finished points were written.
EXIT_INTERRUPTED = 130


class _RichProgress:
    """Progress on stderr, redrawn twice a second (the client's loop must not pay for drawing)."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.errors = 0
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn(),
                                 console=make_console(stderr=True), refresh_per_second=2, transient=False)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def start(self, description: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[self.task].total)
        self.errors = 0
        self.task = self.progress.add_task(description, total=total, errors=0)

    def advance(self, ok: bool) -> None:
        if not ok:
            self.errors += 1
        self.progress.update(self.task, advance=1, errors=self.errors)


def _api_key(path: Path | None, argv_value: str | None, profile_key_file: str | None = None) -> str | None:
    """The key to send: ``--api-key-file``, else the ``--profile``'s ``api_key_file``, else env
    ``KIMI_DEPLOY_API_KEY`` (stripped; empty means none), else None (:func:`kimi_deploy.wire.apikey.resolve_key`,
    the order ``check`` uses too).

    Raises:
        UsageError: ``--api-key`` was given (argv is public), or the file is unreadable or empty (exit 2).
    """
    if argv_value is not None:
        raise UsageError(f"--api-key is not accepted: {ARGV_REFUSAL}", value="--api-key <hidden>",
                         hint=f"put the key in a file (mode 0600) and pass --api-key-file FILE, or export {ENV_VAR}")
    return resolve_key(path, profile_key_file=profile_key_file, from_env=True)


def _redacted(exc: KimiDeployError, api_key: str | None) -> KimiDeployError:
    """``exc`` with ``api_key`` masked in its message, value and hint (:func:`kimi_deploy.redact.redact_text`)."""
    exc.message = redact_text(exc.message, [api_key])
    exc.args = (exc.message,)
    if isinstance(exc.value, str):
        exc.value = redact_text(exc.value, [api_key])
    if exc.hint:
        exc.hint = redact_text(exc.hint, [api_key])
    return exc


@click.group("bench", invoke_without_command=True,
             context_settings={"show_default": True})
@click.option("--base-url", metavar="URL", help="Server root, e.g. http://127.0.0.1:30000 (a /v1 suffix is fine; "
                                               "default: the --profile's, as check).")
@click.option("--model", metavar="NAME", help="Served model name (default: the --profile's, else the first of "
                                              "/v1/models).")
@click.option("--concurrency", default="1,2,4,8,16,32,64", metavar="N,N,...",
              type=_list("--concurrency", int, minimum=1, maximum=params.MAX_CONCURRENCY, example="1,8,32,64"),
              help="Closed-loop points; with --request-rate: one cap on requests in flight.")
@click.option("--request-rate", metavar="R,R,...",
              type=_list("--request-rate", float, minimum=0, open_min=True, example="2,4,8"), help="Open-loop Poisson arrivals (requests/s) instead.")
@click.option("--num-prompts", type=_num("--num-prompts", int, minimum=1, maximum=params.MAX_REQUESTS, example="64"), default=None, metavar="N",
              help="Measured requests per run [default: max(32, 4 x concurrency); 200 open loop].")
@click.option("--max-tokens", type=_num("--max-tokens", int, minimum=1, example="256"), default=256, metavar="M", help="max_tokens of every request.")
@click.option("--temperature", type=_num("--temperature", minimum=0, example="0"), default=None,
              help="temperature of every request [default: 0; for a model whose own API refuses other sampling "
                   "(K2.7-Code, named by --model or the profile) its required temperature 1.0 and top_p 0.95].")
@click.option("--ignore-eos", is_flag=True, help="Send ignore_eos (SGLang): every answer runs to max_tokens.")
@click.option("--warmup", type=_num("--warmup", int, minimum=0, maximum=params.MAX_REQUESTS, example="8"), default=None, metavar="N",
              help="Requests before each point, not measured [default: the concurrency].")
@click.option("--runs", type=_num("--runs", int, minimum=1, maximum=params.MAX_RUNS, example="3"), default=1, metavar="K",
              help="Measured runs per point (cache flushed before each).")
@click.option("--dataset", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE.jsonl",
              help="JSONL of {\"messages\": [...]} [default: the kit's natural prompts].")
@click.option("--long-prompts", is_flag=True,
              help="Send the kit's generated long prompts (25, about 8k to 32k tokens, no download) instead: "
                   "prefill-sized all-reduces, TTFT under long context.")
@click.option("--seed", type=_num("--seed", int, example="0"), default=0,
              help="Seed of prompt order and Poisson arrivals.")
@click.option("--slo", type=SLO, metavar="ttft=MS,tpot=MS,e2e=MS", help="SLOs for goodput (milliseconds).")
@click.option("--label", metavar="NAME", help="Name of this configuration in compare tables and plots.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Deployment profile: its base URL, served model and API key file (each unless given), as "
                   "`check --profile` reads them; its sha256 is recorded in the result (default, without "
                   "--base-url: the installed profile).")
@name_option(neither="--profile nor --base-url")
@json_path_option("Write the result JSON to PATH ('-': stdout).")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path), metavar="PATH",
              help="Write one CSV row per point to PATH.")
@click.option("--request-timeout", type=_num("--request-timeout", minimum=0, open_min=True, example="600"),
              default=600.0, metavar="S",
              help="Seconds per request before 'timeout'; also bounds every connection attempt (TCP and TLS) and "
                   "each metadata call (/server_info, /v1/models, /flush_cache: at most 30 s).")
@click.option("--no-flush-cache", is_flag=True, help="Do not POST /flush_cache before each run.")
@click.option("--extra-body", metavar="JSON", help="JSON object merged into every request body.")
@click.option("--api-key-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="File holding the API key, sent as a Bearer token (default: the --profile's api_key_file, "
                   "else env KIMI_DEPLOY_API_KEY). "
                   "Neither the key nor any key the server reports is written to a result.")
@click.option("--api-key", "api_key_argv", hidden=True, metavar="KEY",
              help="Refused: a key in argv is visible to every user (ps); use --api-key-file or KIMI_DEPLOY_API_KEY.")
@click.option("--insecure", is_flag=True,
              help="Send the API key over plain http to a host that is not this one (refused without it: anyone "
                   "on the path could read the key); a warning goes to stderr.")
@click.option("--no-progress", is_flag=True, help="No progress display.")
@limit_options
@dataset_limit_options(streamed=False)
@click.pass_context
def bench_cmd(ctx, base_url, model, concurrency, request_rate, num_prompts, max_tokens, temperature, ignore_eos,
              warmup, runs, dataset, long_prompts, seed, slo, label, profile_path, name, json_path, csv_path, request_timeout,
              no_flush_cache, extra_body, api_key_file, api_key_argv, insecure, no_progress, max_body_bytes,
              max_line_bytes, max_dataset_line_bytes, max_dataset_bytes):
    """Benchmark a running OpenAI-compatible server: closed-loop concurrency sweep (or Poisson rates).

    Streams /v1/chat/completions with stream_options.include_usage and reports TTFT, TPOT,
    ITL with tokens per chunk, E2E (p50/p90/p99/mean), output tokens/s, requests/s and
    goodput per point. `kimi-deploy bench compare A.json B.json` compares results.

    Exit status: 0 every point had successful requests, 1 a point had none (results still
    written), 2 bad input, or a key bound for plain http to another host without --insecure
    (nothing sent, nothing written), 3 the server did not answer, 130 interrupted (Ctrl-C or
    SIGTERM): the finished points are written and printed. The JSON result is written 0600
    (it records the server's /server_info); every file and line is redacted (kimi_deploy.redact).
    """
    if ctx.invoked_subcommand is not None:
        return
    deployment = None
    if not profile_path and not base_url:  # the installed profile, as every verb (--name: which one)
        profile_path = installed_profile_path(name, HostLayout(Path("/")), given="--base-url http://HOST:PORT",
                                              what="--base-url is required")
    if profile_path:
        # start-up: the profile and its resolved deployment load only with --profile
        from kimi_deploy.deployment import resolve_file

        deployment = resolve_file(profile_path, launches=False)  # the server's URL, key and name only
        base_url = base_url or deployment.base_url
        model = model or deployment.served_model
    base_url = check_base_url(base_url)
    api_key = _api_key(api_key_file, api_key_argv, deployment.api_key_file if deployment else None)
    guard_transport(base_url, api_key, insecure=insecure)
    to_stdout = json_path == "-"
    outputs = {"--json": Path(json_path) if json_path and not to_stdout else None, "--csv": csv_path}
    check_output_paths(outputs)  # before any request: a bad path must not cost a sweep
    body_extra = {}
    if extra_body:
        try:
            body_extra = parse_json(extra_body, parse_constant=_no_constant)  # NaN/Infinity: no JSON a server reads
        except ValueError:
            body_extra = None
        if not isinstance(body_extra, dict):
            raise UsageError("--extra-body must be a JSON object", value=extra_body,
                             hint='e.g. --extra-body \'{"chat_template_kwargs": {"thinking": false}}\'')
    rates = request_rate or ()
    conc_given = ctx.get_parameter_source("concurrency") != click.core.ParameterSource.DEFAULT
    if rates and len(concurrency) > 1 and conc_given:
        raise UsageError("with --request-rate, --concurrency is one cap on requests in flight, not a sweep",
                         value=",".join(map(str, concurrency)), hint="give one --concurrency value, or none for no cap")
    if long_prompts and dataset:
        raise UsageError("--dataset and --long-prompts are mutually exclusive", value=str(dataset),
                         hint="--long-prompts is a generated dataset; pass one of the two")

    # start-up: the bench library (httpx, httptools, rich) loads once the arguments are read: usage errors first
    from kimi_deploy.bench import loadgen, longprompts, prompts, report

    profile_sha = None
    if profile_path:
        profile_sha = report.profile_digest(profile_path)
    if temperature is None:
        temperature, body_extra = loadgen.model_sampling(model, profile_path, body_extra)
    cfg = loadgen.BenchConfig(
        base_url=base_url, model=model, concurrency=() if rates else concurrency, request_rates=rates,
        max_in_flight=concurrency[0] if rates and conc_given else None,
        num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos,
        warmup=warmup, runs=runs, seed=seed, slo=slo or {}, label=label, request_timeout=request_timeout,
        flush_cache=not no_flush_cache, extra_body=body_extra, api_key=api_key,
        max_body_bytes=max_body_bytes, max_line_bytes=max_line_bytes)
    if long_prompts:
        data = longprompts.dataset()
    else:
        data = prompts.load_dataset(dataset, max_line_bytes=max_dataset_line_bytes,
                                        max_file_bytes=max_dataset_bytes)
    show = not no_progress and sys.stderr.isatty()
    try:
        if show:
            with _RichProgress() as progress:
                run = loadgen.run_bench(cfg, data, progress)
        else:
            run = loadgen.run_bench(cfg, data)
    except KimiDeployError as exc:  # its value may quote a server body that echoed the key
        raise _redacted(exc, api_key) from None
    result = report.build_result(run, data, profile_sha)
    text = report.to_json_text(result)
    console = report_console(stderr=to_stdout, min_width=150)  # 12 columns; off a terminal: no hard wrap
    check_output_paths(outputs)  # again: the directory may have gone during the run
    if outputs["--json"]:
        write_atomic(outputs["--json"], text, mode=0o600)  # server metadata: the owner's to share
    if csv_path:
        write_atomic(csv_path, report.to_csv(result))
    console.print(report.summary_table(result))
    for line in report.warnings_of(result):
        console.print(f"[yellow]warning:[/] {markup(line)}")
    if to_stdout:
        click.echo(text, nl=False)
    else:
        for path in (json_path, csv_path):
            if path:
                console.print(f"wrote {markup(path)}")
    if run.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    failed = report.failed_points(result)
    if failed:
        click.echo(f"error: no successful request at {', '.join(failed)}; the figures of "
                   f"{'that point' if len(failed) == 1 else 'those points'} measure nothing (results written)\n"
                   "  fix: read the error kinds above; check the server (`kimi-deploy check`) and --request-timeout",
                   err=True)
        ctx.exit(int(ExitCode.FAILED))


def _no_constant(name: str) -> None:
    """``json.loads``'s hook for ``NaN``/``Infinity``/``-Infinity``: refused, as strict JSON has none (the bench
    ran the whole sweep, then its report could not be written: a traceback)."""
    raise ValueError(f"{name} is not JSON")


@bench_cmd.command("compare")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, metavar="PATH",
              help="Also write a PNG plot (output tok/s and TPOT p50 against concurrency) to PATH.")
@click.option("--no-fail-on-alarm", "alarms_warn", is_flag=True,
              help="Print ALARM lines but exit 0 (default: exit 1 when any ALARM is printed, so a CI gate on the "
                   "exit status stops a change the comparison flags).")
@json_flag("Print the comparison as JSON.")
@click.pass_context
def compare_cmd(ctx, results, plot_path, as_json, alarms_warn):
    """Compare results (the first is the baseline): ratios per point; with --runs >= 3, whether each
    difference is beyond run-to-run noise; speculative accept-length alarms; KV capacity; --plot PATH.

    Exit status: 0, or 1 when an ALARM was printed (a correctness alarm: the speculative accept length dropped;
    --no-fail-on-alarm demotes it to exit 0), 2 bad input or nothing to compare (a result without any successful
    request)."""
    import dataclasses

    # start-up: the comparison (matplotlib for --plot) loads when `bench compare` runs
    from kimi_deploy.bench import abtest, compare as compare_lib, report

    check_output_paths({"--plot": plot_path})
    loaded = [report.load_result(p) for p in results]
    try:
        cmp = compare_lib.compare(loaded)
        verdicts = abtest.ab(loaded, cmp.labels)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, ArithmeticError) as exc:
        # load_result checks the fields compare reads (report.RESULT_SHAPE); what that shape does not pin down
        # (hand-edited, truncated, hostile) is bad input still, not a traceback
        raise UsageError(f"a result file has the {report.SCHEMA} name but not its fields "
                         f"({type(exc).__name__}: {printable(str(exc))[:120]})", value=", ".join(map(str, results)),
                         hint="pass files written by `kimi-deploy bench --json PATH` of this kimi-deploy version"
                         ) from None
    if plot_path:
        compare_lib.plot(loaded, plot_path)
        cmp = dataclasses.replace(cmp, plot=str(plot_path))
    console = report_console(stderr=as_json)  # off a terminal: no hard wrap (ALARM: lines stay whole for greps)
    if as_json:
        click.echo(json.dumps(dict(cmp.to_dict(), ab=verdicts.to_dict()), indent=2, allow_nan=False))
    else:
        console.print(compare_lib.comparison_table(cmp))
        console.print(f"beyond noise? ({verdicts.test})", highlight=False)
        for line in abtest.verdict_lines(verdicts):
            console.print(f"  {markup(line)}", highlight=False)
        kv = ", ".join(f"{k} {v:,}" if v else f"{k} ?" for k, v in verdicts.kv_tokens.items())
        console.print(f"KV capacity (tokens): {markup(kv)}", highlight=False)
    for line in verdicts.alarms:
        console.print(f"[red]ALARM:[/] {markup(line)}", highlight=False)
    for line in cmp.warnings + verdicts.notes:
        console.print(f"[yellow]warning:[/] {markup(line)}")
    if cmp.plot and not as_json:
        console.print(f"wrote {markup(cmp.plot)}")
    if verdicts.alarms and not alarms_warn:  # every verdict printed is in the exit status
        console.print(f"exit 1: {len(verdicts.alarms)} ALARM(s) (--no-fail-on-alarm to exit 0 anyway)",
                      highlight=False)
        ctx.exit(int(ExitCode.FAILED))


COMMANDS = [bench_cmd]
