"""Verb ``render`` (``presets`` and ``init`` are in :mod:`kimi_deploy.cli.presets`).

``render --print-command`` loads what the command needs and no more (issue 24): the profile, its resolved
deployment (:mod:`kimi_deploy.deployment`) and the target registry's names, not a target module, not the preset catalogue for a ``--profile`` file, not the
host's start records. ``tests/test_cli_startup.py`` holds it to that; ``benchmarks/startup.py`` measures it.
"""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy import engine, paths
from kimi_deploy.deployment import resolve
from kimi_deploy.targets import METRICS_OFF, TARGETS
from kimi_deploy.cli.common import echo_json, json_flag, name_option, profile_options, profile_or_installed
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import check_output_dir, create_output_dir, write_many_atomic
from kimi_deploy.profile import naming_warnings
from kimi_deploy.profile.examples import refuse_example_values
from kimi_deploy.versions import DEFAULT_SGLANG_VERSION


@click.command("render")
@profile_options
@name_option
@click.option("--sglang-version", default=None, metavar="V",
              help=f"Target SGLang release for flag spellings (default {DEFAULT_SGLANG_VERSION}).")
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter: render for the SGLang version installed there and key the caches by "
                   "its flashinfer/torch/CUDA versions (imports torch there, a few seconds).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Write the units and env file into DIR, the Prometheus files into DIR/monitoring (atomically); "
                   "other services' files in DIR are kept, the shared prometheus.yml merged, and this service's "
                   "files it no longer renders removed.")
@click.option("--print-command", is_flag=True,
              help="Print the launch command to paste on the host (with an API key: first the step that writes "
                   "SGLang's --config YAML from the key file).")
@click.option("--target", type=click.Choice(list(TARGETS)), default="systemd", show_default=True,
              help="What to render: " + "; ".join(f"{name}: {text}" for name, text in TARGETS.items()) + ".")
@click.option("--root", "root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"),
              show_default=True, metavar="DIR",
              help="Host root where the last measured start is kept (/var/lib/<service>/start-phases.json, written "
                   "by `restart --wait`): a TimeoutStartSec= shorter than it is warned about; and where the "
                   "installed profile is read without --profile/--preset.")
@json_flag("Print the result as JSON.")
def render_cmd(profile_path, preset, name, sglang_version, python, out_dir, print_command, target, root, as_json):
    """Render a profile into an SGLang launch command and hardened systemd units (or Kubernetes manifests).

    Without --profile/--preset: the installed profile (under --root), as every verb."""
    check_output_dir("--out", out_dir)  # the rule of every output path: nothing created on the way
    profile = profile_or_installed(profile_path, preset, name, paths.HostLayout(root))
    if target != "systemd" and (print_command or python):
        raise UsageError("--print-command and --python are for the systemd target",
                         value="--print-command" if print_command else f"--python {python}",
                         hint="the image's SGLang is the one that runs: give --sglang-version V matching the image "
                              "tag" if target == "kubernetes" else f"drop them for --target {target}")
    components = None
    if python:
        if sglang_version:
            raise UsageError("--sglang-version and --python are mutually exclusive",
                             value=f"{sglang_version} / {python}",
                             hint="give --python to use the installed SGLang's version, or --sglang-version alone")
        sglang_version, components = engine.target_versions(python)
    if print_command and not out_dir and not as_json:  # the command alone: no unit, no monitoring file rendered
        refuse_example_values(profile)  # as the target registry does: no example address pasted on a host
        deployment = resolve(profile, sglang_version, components=components)
        deployment.require_fit()  # a model that cannot fit is refused by every verb, with the same numbers
        launch = deployment.launch
        for warning in (*launch.warnings, *naming_warnings(profile)):
            click.echo(f"warning: {warning}", err=True)
        click.echo(launch.shell_command(api_key_file=deployment.api_key_file), nl=False)
        if not profile.sglang.enable_metrics:
            click.echo(METRICS_OFF, err=True)
        return
    options = {"components": components} if target == "systemd" else {}
    # the registry loads every target module (and outdir, the --out folder's manifest): not for --print-command
    from kimi_deploy.targets import outdir, registry

    rendered = registry.render(target, profile, sglang_version, **options)  # exit 2/4 before anything is written
    # start-up: the host's start records only when units are rendered (--print-command alone never reads them)
    from kimi_deploy.host import phases

    slow = phases.timeout_warning(profile.service.name, profile.service.timeout_start_sec,
                                  paths.HostLayout(root).state_dir(profile.service.name))
    for warning in (*rendered.warnings, *naming_warnings(profile), *([slow] if slow else [])):
        click.echo(f"warning: {warning}", err=True)
    written, removed = [], []
    if out_dir:  # other services' files kept, the shared prometheus.yml merged, this service's stale ones removed
        create_output_dir(out_dir)
        planned = outdir.plan(out_dir, profile.service.name, target, rendered.files)
        written = [out_dir / name for name in rendered.files]
        write_many_atomic({out_dir / name: text for name, text in planned.files.items()})
        removed = outdir.remove_stale(out_dir, planned.stale)
    if as_json:
        described = rendered.describe(out_dir)
        if slow and "warnings" in described:
            described["warnings"] = [*described["warnings"], slow]
        echo_json(described)
        return
    if print_command:
        key_file = resolve(profile, sglang_version, launches=False).api_key_file  # the one the units read
        click.echo(rendered.launch.shell_command(api_key_file=key_file), nl=False)
    for path in written:
        click.echo(f"wrote {path}", err=print_command)
    for path in removed:
        click.echo(f"removed {path} (this service's last render wrote it; this one does not)", err=print_command)
    if not out_dir and not print_command:  # one stream: `| kubectl apply -f -`, or split at the `# file:` lines
        click.echo(rendered.stdout_text(), nl=False)
    for note in rendered.notes:
        click.echo(note, err=True)


COMMANDS = [render_cmd]
