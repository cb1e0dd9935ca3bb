"""Verb ``patch``: ``list``, ``status``, ``apply``, ``revert``, ``verify`` on the SGLang of ``--python``."""

from __future__ import annotations

import click

from kimi_deploy import engine as target
from kimi_deploy import patching
from kimi_deploy.cli.common import echo_json, json_flag
from kimi_deploy.errors import ExitCode, UsageError
from kimi_deploy.versions import DEFAULT_SGLANG_VERSION

_STATE_HELP = "kimi-deploy's state directory (default $KIMI_DEPLOY_STATE_DIR or /var/lib/kimi-deploy)."


def _ids(value: tuple[str, ...], option: str = "--only") -> list[str] | None:
    """The ids of a repeatable, comma-separated option; ``None`` when it was not given.

    Raises:
        UsageError: it was given but names no id (``--only ''`` applied the whole default set; exit 2).
    """
    out = [i.strip() for v in value for i in v.split(",") if i.strip()]
    if value and not out:
        raise UsageError(f"{option} names no patch id", value=", ".join(map(repr, value)),
                         hint=f"give ids (`kimi-deploy patch list` shows them), or drop {option} for the default set")
    return out or None


def _python_option(func):
    return click.option("--python", "python", required=True, metavar="P",
                        help="Interpreter of SGLang's virtual environment (e.g. /opt/sglang/.venv/bin/python).")(func)


def _state_option(func):
    return click.option("--state-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
                        help=_STATE_HELP)(func)


def _only_option(func):
    return click.option("--only", multiple=True, metavar="IDS",
                        help="Comma-separated patch ids to act on instead of the default set.")(func)


@click.group("patch")
def patch_group():
    """Source patches for the installed SGLang (series in patches/<sglang-version>/)."""


@patch_group.command("list")
@click.option("--sglang-version", default=DEFAULT_SGLANG_VERSION, show_default=True, metavar="V",
              help="Series of this SGLang release.")
@json_flag("Print the series as JSON.")
def list_cmd(sglang_version, as_json):
    """List the patches of a series: order, id, default, risk, purpose, upstream links."""
    series = patching.require_series(sglang_version)
    if as_json:
        echo_json({"sglang_version": series.sglang_version,
                   "patches": [dict(p.model_dump(), files=series.files_of(p)) for p in series.patch]})
        return
    click.echo(f"patch series for SGLang {series.sglang_version} ({series.directory})")
    for n, spec in enumerate(series.patch, 1):
        stage = ", experimental" if spec.experimental else ""
        click.echo(f"{n}. {spec.id}  [{'on' if spec.default else 'off'} by default{stage}]")
        click.echo(f"   {spec.purpose}")
        click.echo(f"   risk: {spec.risk}")
        click.echo(f"   files: {', '.join(series.files_of(spec))}")
        for gate in spec.needed_by:
            click.echo(f"   needed by: {gate.setting} ({', '.join(gate.flags)}) on compute capability "
                       f"{', '.join(f'{m}.x' for m in gate.compute_capability_major)} (without it "
                       f"{'SGLang fails to start' if gate.without == 'fails' else 'SGLang starts with the feature off'})"
                       + (f"; the patch opens it on {', '.join(gate.patched_compute_capability)} only"
                          if gate.patched_compute_capability else ""))
        for url in spec.upstream:
            click.echo(f"   upstream: {url}")


def _print_recovered(note: str) -> None:
    if note:
        click.echo(f"note: {note}", err=True)


def _print_status(result: patching.SeriesStatus) -> None:
    _print_recovered(result.recovered)
    click.echo(f"SGLang {result.sglang_version} at {result.sglang_location}: {result.state}")
    if result.recorded:
        click.echo(f"record: {result.state_file} (applied {result.recorded['applied_at']} by kimi-deploy "
                   f"{result.recorded['kit_version']})")
    for p in result.patches:
        mark = "*" if p.selected else " "
        line = f" {mark} {p.id:<36} {p.state:<12} {'on' if p.default else 'off'} by default"
        click.echo(line + (f"  ({p.detail})" if p.detail else ""))
    if result.patches:
        click.echo("   (* = checked: --only, else the recorded set, else the defaults)")
    for problem in result.problems:
        click.echo(f"problem: {problem}", err=True)
    if result.fix:
        click.echo(f"fix: {result.fix}", err=True)


@patch_group.command("status")
@_python_option
@_only_option
@_state_option
@json_flag("Print the status as JSON.")
@click.pass_context
def status_cmd(ctx, python, only, state_dir, as_json):
    """Say whether the series is applied, not applied, drifted (changed after patching), partial or
    interrupted (a killed run's change could not be finished).

    Finishes a change a killed `patch apply`/`revert` left half done, when this user can.
    Exit status as `verify`: 0 applied, 1 anything else (each problem and the fix printed).
    """
    result = patching.status(python, only=_ids(only), state_dir=state_dir)
    if as_json:
        echo_json(result.to_dict())
    else:
        _print_status(result)
    if not result.ok:
        ctx.exit(int(ExitCode.FAILED))


@patch_group.command("verify")
@_python_option
@_only_option
@_state_option
@json_flag("Print the status as JSON (on failure: the error as JSON).")
def verify_cmd(python, only, state_dir, as_json):
    """Exit 0 only when the series is fully applied and undrifted (the unit's ExecStartPre=)."""
    result = patching.status(python, only=_ids(only), state_dir=state_dir)
    if not as_json:
        _print_recovered(result.recovered)
    patching.require_applied(result)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(f"ok: SGLang {result.sglang_version} carries {', '.join(result.selected)}")


def _print_change(result: patching.ChangeResult, as_json: bool) -> None:
    if as_json:
        echo_json(result.to_dict())
        return
    _print_recovered(result.recovered)
    click.echo(result.message)
    for path in result.files:
        click.echo(f"  {'would write' if result.dry_run else 'wrote'} {path}")
    if result.removed_bytecode:
        click.echo(f"  removed {len(result.removed_bytecode)} stale .pyc file(s)")
    if not result.dry_run and result.action == "apply" and (result.changed or result.recovered):
        click.echo(f"  record: {result.state_file}")


@patch_group.command("apply")
@_python_option
@_only_option
@click.option("--with", "with_", multiple=True, metavar="IDS",
              help="Comma-separated patch ids to apply in addition to the defaults (e.g. off-by-default ones).")
@_state_option
@click.option("--dry-run", is_flag=True, help="Check that every patch applies; write nothing.")
@json_flag("Print the result as JSON.")
def apply_cmd(python, only, with_, state_dir, dry_run, as_json):
    """Apply the series all-or-nothing (a no-op when already applied); restart SGLang afterwards."""
    if only and with_:  # --with adds to the default set; with --only it was dropped without a word
        raise UsageError("--with adds patches to the default set; --only replaces that set, so the two do not "
                         "combine", value=f"--only {','.join(only)} --with {','.join(with_)}",
                         hint="list every patch in --only (--only A,B), or drop --only and use --with")
    result = patching.apply(python, only=_ids(only), with_=_ids(with_, "--with"), state_dir=state_dir,
                            dry_run=dry_run)
    _print_change(result, as_json)


@patch_group.command("revert")
@_python_option
@_state_option
@click.option("--force", is_flag=True, help="Restore the saved originals even over files changed since patching.")
@click.option("--dry-run", is_flag=True, help="Show what would be restored; write nothing.")
@json_flag("Print the result as JSON.")
def revert_cmd(python, state_dir, force, dry_run, as_json):
    """Restore the original bytes of every patched file and delete the record."""
    result = patching.revert(python, state_dir=state_dir, force=force, dry_run=dry_run)
    _print_change(result, as_json)


@patch_group.command("port")
@click.option("--python", "python", default=None, metavar="P",
              help="Interpreter of the environment holding the OTHER SGLang release (only read).")
@click.option("--source", "source", type=click.Path(file_okay=False, exists=True), default=None, metavar="DIR",
              help="Instead of --python: a folder holding that release's sglang/ (an unpacked wheel).")
@click.option("--series", "series_version", default=None, metavar="V",
              help="The series to try (default: the newest the kit ships).")
@json_flag("Print the report as JSON.")
def port_cmd(python, source, series_version, as_json):
    """Try every patch of the newest series on another SGLang release; report per patch and hunk.

    For the kit's maintainers porting patches/<version>/: applies, applies at an offset or with fuzz, fails
    (with the upstream code now at that place), and when a patch's purpose looks already met upstream. Reads
    the target only."""
    from pathlib import Path

    from kimi_deploy.patching import port  # start-up: the porting engine loads when `patch port` runs

    if (python is None) == (source is None):
        raise UsageError("give exactly one of --python and --source", hint="--python /opt/sglang-new/bin/python")
    if python is not None:
        version, location = target.require_sglang(target.probe(python))
        site = Path(location).parent
    else:
        site = Path(source)
        version = port.source_version(site)
    report = port.port_report(site, version, series_version)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(port.format_report(report), nl=False)


COMMANDS = [patch_group]

__all__ = ["COMMANDS", "ExitCode"]

