"""The ``kimi-deploy`` command line: a thin layer over library functions.

Each verb lives in a module of this package named after it, parses options,
calls one library function and prints its result (``--json`` where offered).
Errors derived from :class:`kimi_deploy.errors.KimiDeployError` are caught here,
at the edge, and printed as ``error:`` / ``value:`` / ``fix:`` lines on stderr with the
error's exit code (and as ``{"error": {...}}`` on stdout when the verb was asked for
JSON there); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import sys

import click

from kimi_deploy import __version__
from kimi_deploy.cli.options import JSON_META, echo_json
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


class KimiGroup(click.Group):
    """Click group that turns :class:`KimiDeployError` into a message and a named exit code.

    Click's own usage errors (unknown option, bad value) keep click's text on stderr and exit 2,
    and are also printed as ``{"error": ...}`` on stdout when the verb was asked for JSON there.
    """

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
                echo_json({"error": exc.to_dict()})
            click.echo(exc.render(), err=True)
            ctx.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=KimiGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kimi-deploy")
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


#: Modules under kimi_deploy.cli that define verbs (each exports COMMANDS), in `--help` order.
VERB_MODULES = ("render", "validate", "doctor", "patch", "install", "restart", "status", "check", "bench")


def _register() -> None:
    import importlib

    for name in VERB_MODULES:
        for command in importlib.import_module(f"kimi_deploy.cli.{name}").COMMANDS:
            cli.add_command(command)


_register()


def main() -> None:
    """Console-script entry point (``kimi-deploy``)."""
    cli(obj={}, prog_name="kimi-deploy")


__all__ = ["cli", "main", "ExitCode"]
