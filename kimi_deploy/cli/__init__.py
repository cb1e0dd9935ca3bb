"""The ``kimi-deploy`` command line: a thin layer over library functions.

Each verb lives in a module of this package named after it, parses options,
calls one library function and prints its result (``--json`` where offered).
A verb's module is imported only when that verb runs (:data:`VERBS`), so that
``--help``, ``--version`` and a light verb such as ``render`` do not pay for the
libraries of the heavy ones (``openai``, ``rich``, ``httpx``, ``matplotlib``).
Errors derived from :class:`kimi_deploy.errors.KimiDeployError` are caught here,
at the edge, and printed as ``error:`` / ``value:`` / ``fix:`` lines on stderr with the
error's exit code (and as ``{"error": {...}}`` on stdout when the verb was asked for
JSON there); ``--debug`` shows the traceback instead.

A reader that closes stdout early (``kimi-deploy render | head``) ends the verb quietly with exit 0, whatever
the verb: no traceback, no "Exception ignored" line, not click's exit 1 (which here means "a check failed").
That is decided here, once (:meth:`KimiGroup.invoke`, :func:`main`); a rich console hands a closed stdout to
this edge too (:func:`kimi_deploy.cli.common.make_console`).
"""

from __future__ import annotations

import importlib
import logging
import os
import select
import sys

import click

from kimi_deploy.cli.common import JSON_META, echo_json
from kimi_deploy.errors import ExitCode, KimiDeployError


def _asks_json_stdout(command: click.Command | None, args: list[str]) -> bool:
    """Whether ``args`` (a verb's raw arguments) ask for JSON on stdout: ``--json`` where it is a
    flag, ``--json -`` / ``--json=-`` where it takes a path. Read before click parsed them, since a
    usage error stops parsing before the ``--json`` callback (:data:`JSON_META`) runs."""
    while isinstance(command, click.Group) and args and args[0] in command.commands:
        command, args = command.commands[args[0]], args[1:]  # `patch apply --json`: the verb's own verb
    option = next((p for p in (command.params if command else []) if isinstance(p, click.Option)
                   and "--json" in p.opts), None)
    if option is None:
        return False
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if option.is_flag and arg == "--json":
            return True
        if not option.is_flag and (arg == "--json=-" or (arg == "--json" and args[i + 1:i + 2] == ["-"])):
            return True
    return False


def stdout_closed() -> bool:
    """Whether stdout's reader has gone (a pipe whose read end is closed, a hung-up socket): ``poll(2)``
    reports ``POLLERR``/``POLLHUP`` on the write end. Asked after a ``BrokenPipeError``, so that an EPIPE
    from anything else (a child's stdin, a socket) is not taken for it."""
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ else 1
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no stdout at all, or not a file (a test runner's buffer)
        return False


def quiet_stdout() -> None:
    """Point stdout's file descriptor at ``/dev/null``, so that the interpreter's last flush of what is still
    buffered finds no closed pipe (the recipe of https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
    finally:
        os.close(devnull)


#: Verb name -> (module under :mod:`kimi_deploy.cli` that defines it in ``COMMANDS``, the first paragraph
#: of its help). The help is repeated here so that ``kimi-deploy --help`` lists the verbs without importing
#: their modules; ``tests/test_cli_startup.py`` keeps each entry equal to the verb's own docstring.
VERBS: dict[str, tuple[str, str]] = {
    "render": ("render", "Render a profile into an SGLang launch command and hardened systemd units (or Kubernetes manifests)."),
    "presets": ("presets", "List the built-in presets, one line each."),
    "init": ("presets", "Write a commented deployment profile to PATH to start from."),
    "validate": ("validate", "Parse the command with SGLang's own argparse, then show what SGLang resolves here "
                             "and the memory plan."),
    "facts": ("validate", "Record on the GPU host what the memory plan needs, to size the profile elsewhere."),
    "doctor": ("doctor", "Check GPUs, driver, torch, topology, models, disk, port, SGLang flags and the installed "
                         "unit."),
    "preflight": ("preflight", "Rendezvous with the other ranks of this node's multi-node group over gloo; name "
                               "what is wrong."),
    "prefetch": ("prefetch", "Read the model's and the draft's shards into the page cache, in SGLang's order, "
                             "before it starts."),
    "patch": ("patch", "Source patches for the installed SGLang (series in patches/<sglang-version>/)."),
    "install": ("install", "Install the rendered units, env file and profile on the host (plan, diff, apply)."),
    "uninstall": ("install", "Stop, disable and remove what kimi-deploy installed (only unmodified files; never "
                             "foreign ones)."),
    "restart": ("restart", "Restart the server; with --wait, show its progress and gate it (exit 6: not ready "
                           "in time)."),
    "upgrade": ("upgrade", "Move the installed service to a new SGLang environment or model revision, gated; "
                           "roll back on failure."),
    "status": ("status", "Show the installed service's state; exit 1 when something is wrong (the problems are "
                         "listed)."),
    "check": ("check", "Check a running OpenAI-compatible server: health, configuration, API contract."),
    "bench": ("bench", "Benchmark a running OpenAI-compatible server: closed-loop concurrency sweep (or Poisson "
                       "rates)."),
    "tune": ("tune", "Search this host's best SGLang configuration for a workload and SLO, each candidate gated on "
                     "the contract."),
}


class KimiGroup(click.Group):
    """Click group that loads a verb's module on first use and turns :class:`KimiDeployError` into a
    message and a named exit code.

    Click's own usage errors (unknown option, bad value) keep click's text on stderr and exit 2,
    and are also printed as ``{"error": ...}`` on stdout when the verb was asked for JSON there.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *VERBS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in VERBS:
            for command in importlib.import_module(f"kimi_deploy.cli.{VERBS[cmd_name][0]}").COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """Click's, plus "did you mean" for a verb that is not one (``rendr`` -> ``render``)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            import difflib  # stdlib, only on this error path

            name = args[0] if args else ""
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            if close and exc.message.startswith("No such command"):
                exc.message = f"{exc.message} Did you mean '{close[0]}'?"
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's command list, from :data:`VERBS` for the verbs not loaded (same text, same truncation)."""
        rows = [(name, self.commands.get(name) or click.Command(name, help=VERBS[name][1]))
                for name in self.list_commands(ctx)]
        rows = [(name, command) for name, command in rows if not command.hidden]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in rows])

    def invoke(self, ctx: click.Context):
        args = [*getattr(ctx, "_protected_args", []), *ctx.args]
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if exc.ctx is not None and exc.ctx is not ctx and args \
                    and _asks_json_stdout(self.get_command(ctx, args[0]), args[1:]):
                echo_json({"error": {"error": type(exc).__name__, "message": exc.format_message(), "value": None,
                                     "hint": f"see `{exc.ctx.command_path} --help`", "exit_code": exc.exit_code}})
            raise  # click prints its usage text on stderr and exits 2
        except KimiDeployError as exc:
            if ctx.find_root().params.get("debug") or (ctx.obj or {}).get("debug"):
                raise
            # an option's own check (bench's numbers) can refuse before the --json callback ran
            if ctx.meta.get(JSON_META) or (args and _asks_json_stdout(self.get_command(ctx, args[0]), args[1:])):
                try:
                    echo_json({"error": exc.to_dict()})
                except BrokenPipeError:  # the reader has gone: the error still goes to stderr, with its code
                    quiet_stdout()
            click.echo(exc.render(), err=True)
            ctx.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            if not stdout_closed():  # an EPIPE from a child or a socket: not ours to hide
                raise
            quiet_stdout()  # the reader of stdout has gone (`| head`): nothing more to say, nothing failed
            ctx.exit(0)

    def main(self, *args, **kwargs):
        """Click's, except that a stdout closed while click itself writes (``--help | head``) exits 0: click
        marks that case by wrapping stdout in its ``_PacifyFlushWrapper`` before its ``sys.exit(1)``."""
        try:
            return super().main(*args, **kwargs)
        except SystemExit as exc:
            pacified = type(sys.stdout).__name__ == "_PacifyFlushWrapper"
            if pacified and exc.code == 1 and stdout_closed():
                quiet_stdout()
                raise SystemExit(0) from None
            raise


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: click's ``version_option`` text, with the version looked up only when asked."""
    if value and not ctx.resilient_parsing:
        # start-up: importlib.metadata (about 30 ms) is paid by --version only (kimi_deploy.__getattr__)
        from kimi_deploy import __version__

        click.echo(f"kimi-deploy, version {__version__}")
        ctx.exit()


@click.group(cls=KimiGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("-v", "--verbose", is_flag=True, help="Log every command kimi-deploy runs, as a pasteable line.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """Render, validate, patch, install, check and benchmark an SGLang deployment of Kimi K2.x."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else (logging.INFO if verbose else logging.WARNING),
        format="%(message)s" if not debug else "%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if debug or verbose:  # --debug prints response headers: no key in any line
        from kimi_deploy.redact import LogRedactor  # local: --help and --version load no module but the CLI's

        for handler in logging.getLogger().handlers:
            handler.setFormatter(LogRedactor(handler.formatter._fmt if handler.formatter else None))


def main() -> None:
    """Console-script entry point (``kimi-deploy``): the verb's exit code; a stdout whose reader left after the
    verb finished writing (the last buffered bytes) keeps that code and prints nothing more."""
    try:
        cli(obj={}, prog_name="kimi-deploy")
    finally:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            quiet_stdout()
        except (OSError, ValueError):
            pass


__all__ = ["cli", "main", "ExitCode"]
