"""Options and helpers shared by several verbs (profile selection, JSON output)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kimi_deploy.errors import UsageError


if TYPE_CHECKING:  # imported where used: the CLI edge imports this module for every verb, --help included
    from rich.console import Console

    from kimi_deploy.profile import Profile


def profile_options(func):
    """``--profile FILE`` / ``--preset NAME`` (mutually exclusive)."""
    func = click.option("--preset", "preset", metavar="NAME",
                        help="Use a built-in preset (see `kimi-deploy presets`).")(func)
    func = click.option("--profile", "profile_path", type=click.Path(path_type=Path),
                        metavar="FILE", help="Deployment profile (TOML).")(func)
    return func


def resolve_profile(profile_path: Path | None, preset: str | None, *, required: bool = True) -> Profile | None:
    """The profile selected by ``--profile`` or ``--preset``.

    Raises:
        UsageError: both given, or neither when ``required``.
        ProfileError: the profile does not validate.
    """
    if profile_path and not preset:
        # start-up: a profile file needs the profile models (pydantic), not the preset catalogue and its model table
        from kimi_deploy.profile import load_profile

        return load_profile(profile_path)  # as select_profile would
    # start-up: pydantic and the profile models load when a verb selects a profile, not for `--help`
    from kimi_deploy.catalog.presets import select_profile

    return select_profile(profile_path, preset, required=required)


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def root_option(func):
    """``--root DIR``: the host's file tree (default ``/``); tests and image builds point it at a folder."""
    return click.option("--root", "root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"),
                        show_default=True, metavar="DIR",
                        help="Host root for kimi-deploy's files (units, manifest, backups, profile copy).")(func)


def name_option(func=None, *, neither: str = "--profile nor --preset"):
    """``--name NAME``: the installed service whose profile copy a verb reads when ``neither`` (its other ways to
    name a profile or server) is given (default: the only one installed). ``@name_option`` or
    ``@name_option(neither="--profile nor --base-url")``."""
    def decorate(f):
        return click.option("--name", "name", default=None, metavar="NAME",
                            help=f"Installed service whose profile to use when neither {neither} is given "
                                 "(default: the only one installed).")(f)
    return decorate(func) if func is not None else decorate


def profile_or_installed(profile_path: Path | None, preset: str | None, name: str | None, layout) -> Profile:
    """The profile of ``--profile``/``--preset``, else the installed one's copy in ``layout`` (``--name`` or the
    only one; :func:`resolve_installed`): the one default of every verb that takes ``--profile`` (``check`` and
    ``bench``, whose server may also be named by ``--base-url``: :func:`installed_profile_path`).

    Raises:
        UsageError / ProfileError: both given, nothing installed (the hint names --profile and --preset),
            several installed and no ``--name``, or an invalid profile.
    """
    profile = resolve_profile(profile_path, preset, required=False)
    if profile is not None:
        return profile
    records = _records()
    return records.installed_profile(layout, _find_installed(records, name, layout, "--profile FILE or --preset NAME",
                                                             "no profile given"))


def installed_profile_path(name: str | None, layout, *, given: str, what: str) -> Path:
    """The installed service's profile copy in ``layout`` (``--name`` or the only one): what ``check`` and
    ``bench`` read when neither ``--profile`` nor ``given`` (their ``--base-url``) names a server, as every other
    verb defaults to the installed profile (:func:`profile_or_installed`).

    Raises:
        UsageError: nothing installed (``what``, and the hint names ``--profile FILE`` and ``given``), several
            installed and no ``--name``.
    """
    return layout.profile_copy(_find_installed(_records(), name, layout, f"--profile FILE or {given}", what).service)


def _find_installed(records: Any, name: str | None, layout, instead: str, what: str) -> Any:
    """:func:`kimi_deploy.host.records.find_installed`, whose "nothing installed" begins with ``what`` and also
    says what to pass ``instead``."""
    try:
        return records.find_installed(layout, name)
    except UsageError as exc:
        if name is not None or records.installed_services(layout):
            raise
        raise UsageError(f"{what} and {exc.message}", value=exc.value,
                         hint=f"pass {instead}, or install the service first "
                              f"(`{layout.command('install --profile FILE')}`)") from None


def _records() -> Any:
    """:mod:`kimi_deploy.host.records`, imported on first use."""
    # start-up: the records (pydantic) load when a verb reads what was installed, not for `--help`
    from kimi_deploy.host import records

    return records


def host_systemd_option(func):
    """``--host-systemd``: with ``--root DIR``, let ``restart``/``upgrade`` act on this host's running systemd."""
    return click.option("--host-systemd", "host_systemd", is_flag=True,
                        help="With --root DIR other than /: restart (and daemon-reload) THIS host's unit of the "
                             "same name, using the files under DIR. Without it, a --root other than / is refused "
                             "(exit 2): the tree is not what this host's systemd runs.")(func)


def refuse_host_systemd(layout, host_systemd: bool, verb: str, *, dry_run: bool = False) -> None:
    """Refuse ``verb`` under a ``--root`` other than ``/`` without ``--host-systemd`` (a dry run changes nothing
    and is let through): ``--root`` means the tree for every verb, and systemctl has no tree to restart in.

    Raises:
        UsageError: as above (exit 2); nothing was read or changed.
    """
    if layout.is_host or host_systemd or dry_run:
        return
    raise UsageError(f"{verb} --root {layout.root}: the files are in that tree, but systemctl would restart this "
                     "host's running unit of the same name, which does not run them", value=str(layout.root),
                     hint=f"run `kimi-deploy {verb}` on the host that runs these files (no --root), add --dry-run "
                          f"to see what it would do, or pass --host-systemd to restart this host's unit from the "
                          "tree's files")


def resolve_installed(profile_path: Path | None, preset: str | None, name: str | None, layout):
    """``(profile, manifest)`` of an installed service: ``--profile``/``--preset`` if given (its manifest must
    exist), else the profile copy ``install`` left in ``/etc/kimi-deploy`` (``--name`` or the only one).

    Raises:
        UsageError / ProfileError: nothing installed, ambiguous, or an invalid profile.
    """
    records = _records()
    profile = resolve_profile(profile_path, preset, required=False)
    manifest = records.find_installed(layout, profile.service.name if profile else name)
    return (profile or records.installed_profile(layout, manifest)), manifest


def resolve_installed_deployment(profile_path: Path | None, preset: str | None, name: str | None, layout):
    """``(deployment, manifest)``: the installed service :func:`resolve_installed` selects, resolved
    (:func:`kimi_deploy.deployment.resolve`) for the SGLang version its manifest records, its launches built only
    when read. ``restart`` and ``status`` read the unit names, URLs, key path (and status the launch) from it.

    Raises:
        UsageError / ProfileError: as :func:`resolve_installed`.
    """
    profile, manifest = resolve_installed(profile_path, preset, name, layout)
    return _records().installed_deployment(profile, manifest), manifest


#: ``ctx.meta`` key (shared by every nested click context): this invocation prints JSON on stdout,
#: so the CLI edge prints an error as JSON there too (and its text on stderr, as always).
JSON_META = "kimi_deploy.json_stdout"


def _note_json(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    if value is True or value == "-":
        ctx.meta[JSON_META] = True
    return value


def json_flag(help: str):  # noqa: A002 - click's own keyword
    """``--json`` as a flag: print the result as JSON on stdout (errors too, as ``{"error": ...}``)."""
    return click.option("--json", "as_json", is_flag=True, callback=_note_json, help=help)


def json_path_option(help: str):  # noqa: A002
    """``--json PATH`` writing a JSON document; ``-`` means stdout (errors then go there as JSON too)."""
    return click.option("--json", "json_path", metavar="PATH", callback=_note_json, help=help)


class Seconds(click.FloatRange):
    """A duration option in seconds: :class:`click.FloatRange` that also refuses ``nan`` and ``inf``, which pass
    its range check (every comparison with nan is false; ``inf`` with no ``max``), and would make a bounded wait
    unbounded (a deadline of ``now + nan`` is never reached)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a number of seconds; give one, e.g. 300", param, ctx)
        return seconds


def _limits() -> Any:
    """:mod:`kimi_deploy.wire.limits`, imported on first use: `kimi-deploy --help` imports this module and must load
    no other kimi_deploy module (only check's and bench's options, and a byte count given, need the caps)."""
    from kimi_deploy.wire import limits  # start-up: see above

    return limits


class ByteSize(click.ParamType):
    """A byte count: ``16777216``, or with a binary suffix ``64K``/``16M``/``1G`` (also ``KiB``/``MiB``/``GiB``);
    at least :data:`kimi_deploy.wire.limits.MIN_CAP_BYTES`."""

    name = "bytes"
    _UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def convert(self, value, param, ctx):
        least = _limits().MIN_CAP_BYTES
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
            unit = text[-1:] if text[-1:] in ("K", "M", "G") else ""
            digits = text[:-1] if unit else text
            if not digits.isdigit() or len(digits) > 15:
                self.fail(f"{value!r} is not a byte count (e.g. 16777216, 64K, 16M, 1G)", param, ctx)
            n = int(digits) * self._UNITS[unit]
        if n < least:
            self.fail(f"{value!r} is below the smallest cap, {least} bytes", param, ctx)
        return n


def limit_options(func):
    """``--max-body-bytes N`` / ``--max-line-bytes N``: the byte caps of :mod:`kimi_deploy.wire.limits` (check, bench)."""
    limits = _limits()
    func = click.option("--max-line-bytes", type=ByteSize(), default=limits.DEFAULT_MAX_LINE_BYTES, show_default=True,
                        metavar="N", help="Longest SSE line (and one event's data) read before the answer is "
                        "refused as too large; suffixes K/M/G.")(func)
    func = click.option("--max-body-bytes", type=ByteSize(), default=limits.DEFAULT_MAX_BODY_BYTES, show_default=True,
                        metavar="N", help="Largest response body read (or kept) before it is refused as too large; "
                        "suffixes K/M/G.")(func)
    return func


def make_console(**kwargs: Any) -> Console:
    """A :class:`rich.console.Console` made with ``kwargs`` (the tables and progress of ``check``, ``bench``,
    ``restart``) that leaves a closed stdout to the CLI edge: rich's own answer is ``SystemExit(1)``
    (``Console.on_broken_pipe``), which this kit's exit codes read as "a check failed"; this one raises the
    ``BrokenPipeError``, which :meth:`kimi_deploy.cli.KimiGroup.invoke` ends quietly with exit 0, as for every
    other verb. rich loads on the first call, not for ``--help``."""
    return _console_class()(**kwargs)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console as RichConsole  # start-up: rich loads when a verb draws, not for --help

    class EdgeConsole(RichConsole):
        """rich's console, raising ``BrokenPipeError`` on a closed stdout instead of ``SystemExit(1)``."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("stdout closed")

    return EdgeConsole


class Phases:
    """What a long verb (``validate`` 17-21 s, ``doctor``) is doing now, on stderr, so it never sits silent.

    On a terminal: one live spinner line (rich's Progress, transient, as ``check``'s live progress line), naming
    the phase and the time so far, removed when the verb ends. Off a terminal (a log, CI, a pipe): one plain
    ``VERB: PHASE`` line per phase, never redrawn, never wrapped. Use as a context manager; call it with each
    phase's words. ``console``: where to draw (tests); default stderr.
    """

    def __init__(self, verb: str, console: Any = None) -> None:
        self.verb = verb
        self.console = console
        self.progress = None
        self.task = None

    def _terminal(self) -> bool:
        if self.console is not None:
            return bool(self.console.is_terminal)
        return bool(getattr(sys.stderr, "isatty", lambda: False)())  # the stream of the moment (a runner swaps it)

    def __enter__(self) -> "Phases":
        if self._terminal():
            from rich.console import Console  # start-up: rich only when a terminal shows the line
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn(f"{self.verb}: {{task.description}}"),
                                     TimeElapsedColumn(), console=self.console or Console(stderr=True),
                                     refresh_per_second=4, transient=True)
            self.task = self.progress.add_task("starting", total=None)
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=text)
        else:
            click.echo(f"{self.verb}: {text}", err=True)


#: The width of a report drawn off a terminal (a log, CI, a pipe): wide enough that rich never breaks a line, so a
#: grep for ``ALARM:`` or ``warning:`` sees each whole; tables keep their natural width (they do not expand).
UNWRAPPED_WIDTH = 100_000


def report_console(*, stderr: bool = False, file: Any = None, min_width: int | None = None) -> Any:
    """The rich Console a verb prints its report with: on a terminal, the terminal's width (at least
    ``min_width``: a wide table wraps inside its cells rather than dropping columns); off a terminal, no hard
    wrap at all (rich's default there is 80 columns, which split report lines in logs)."""
    console = make_console(stderr=stderr, file=file)  # a closed stdout ends quietly, as for every verb
    if not console.is_terminal:
        return make_console(stderr=stderr, file=file, width=UNWRAPPED_WIDTH, soft_wrap=True)
    if min_width:
        console.width = max(console.width, min_width)
    return console
