"""Verbs ``render``, ``presets`` and ``init``."""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy import __version__, engine, paths, targets
from kimi_deploy.targets import METRICS_OFF, TARGETS
from kimi_deploy.cli.options import echo_json, json_flag, profile_options, resolve_profile
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import (check_output_dir, check_output_paths, create_output_dir, write_atomic,
                              write_many_atomic)
from kimi_deploy.launch import node_launch
from kimi_deploy.options import OPTIONS, init_example
from kimi_deploy.catalog.models import MODELS
from kimi_deploy.host import phases
from kimi_deploy.presets import PRESETS, REFERENCE, Preset, get_preset, preset_for_model
from kimi_deploy.profile import naming_warnings, toml_value, valid_service_name
from kimi_deploy.versions import DEFAULT_SGLANG_VERSION


@click.command("render")
@profile_options
@click.option("--sglang-version", default=None, metavar="V",
              help=f"Target SGLang release for flag spellings (default {DEFAULT_SGLANG_VERSION}).")
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter: render for the SGLang version installed there and key the caches by "
                   "its flashinfer/torch/CUDA versions (imports torch there, a few seconds).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Write the units and env file into DIR, the Prometheus files into DIR/monitoring (atomically).")
@click.option("--print-command", is_flag=True,
              help="Print the launch command to paste on the host (with an API key: first the step that writes "
                   "SGLang's --config YAML from the key file).")
@click.option("--target", type=click.Choice(list(TARGETS)), default="systemd", show_default=True,
              help="What to render: " + "; ".join(f"{name}: {text}" for name, (_, text) in TARGETS.items()) + ".")
@click.option("--root", "root", type=click.Path(path_type=Path, file_okay=False), default=Path("/"),
              show_default=True, metavar="DIR",
              help="Host root where the last measured start is kept (/var/lib/<service>/start-phases.json, written "
                   "by `restart --wait`): a TimeoutStartSec= shorter than it is warned about.")
@json_flag("Print the result as JSON.")
def render_cmd(profile_path, preset, sglang_version, python, out_dir, print_command, target, root, as_json):
    """Render a profile into an SGLang launch command and hardened systemd units (or Kubernetes manifests)."""
    check_output_dir("--out", out_dir)  # the rule of every output path: nothing created on the way
    profile = resolve_profile(profile_path, preset)
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
        launch = node_launch(profile, None, sglang_version, components=components)
        for warning in (*launch.warnings, *naming_warnings(profile)):
            click.echo(f"warning: {warning}", err=True)
        click.echo(launch.shell_command(api_key_file=profile.sglang.api_key_file), nl=False)
        if not profile.sglang.enable_metrics:
            click.echo(METRICS_OFF, err=True)
        return
    options = {"components": components} if target == "systemd" else {}
    rendered = targets.render(target, profile, sglang_version, **options)  # exit 2 before anything is written
    slow = phases.timeout_warning(profile.service.name, profile.service.timeout_start_sec,
                                  paths.HostLayout(root).state_dir(profile.service.name))
    for warning in (*rendered.warnings, *naming_warnings(profile), *([slow] if slow else [])):
        click.echo(f"warning: {warning}", err=True)
    written = []
    if out_dir:
        create_output_dir(out_dir)
        written = [out_dir / name for name in rendered.files]
        write_many_atomic(dict(zip(written, rendered.files.values())))
    if as_json:
        described = rendered.describe(out_dir)
        if slow and "warnings" in described:
            described["warnings"] = [*described["warnings"], slow]
        echo_json(described)
        return
    if print_command:
        click.echo(rendered.launch.shell_command(api_key_file=profile.sglang.api_key_file), nl=False)
    for path in written:
        click.echo(f"wrote {path}", err=print_command)
    if not out_dir and not print_command:
        for name, text in rendered.files.items():
            click.echo(f"# ---- {name}")
            click.echo(text, nl=False)
    for note in rendered.notes:
        click.echo(note, err=True)


@click.command("presets")
@json_flag("Print the presets as JSON.")
def presets_cmd(as_json):
    """List the built-in presets, one line each.

    Under each: the model it deploys (facts from the model table), how it differs from the reference preset
    and what it needs measured.
    """
    if as_json:
        echo_json({name: {"summary": p.summary, "differs": p.differs, "measure": p.measure, "profile": p.data,
                          "model": MODELS[p.model].to_dict() if p.model else None}
                   for name, p in PRESETS.items()})
        return
    width = max(len(n) for n in PRESETS)
    for name, preset in PRESETS.items():
        click.echo(f"{name:<{width}}  {preset.summary}")
        if preset.model:
            click.echo(f"{'':<{width}}    model: {_model_line(MODELS[preset.model])}")
        if preset.differs:
            click.echo(f"{'':<{width}}    differs: {preset.differs}")
        if preset.measure:
            click.echo(f"{'':<{width}}    measure: {preset.measure}")


def _model_line(m) -> str:
    """One line of a model's facts (``kimi-deploy presets``; ``--json`` has them with their sources)."""
    thinking = ("thinking on by default, off with " + m.thinking.switch) if m.thinking.switch else \
        ("thinking only" if m.thinking.default_on else "no thinking")
    s = m.sampling
    sampling = "sampling unknown" if s.temperature is None else \
        f"temperature {s.temperature:g}" + (f" (instant {s.temperature_instant:g})" if s.temperature_instant else "") \
        + f", top_p {s.top_p:g}"
    context = f"context {m.context_length}" if m.context_length else "context from config.json"
    shards = f"{m.shards.count} shards" if m.shards else "shard layout unknown"
    return (f"{m.name} ({m.repo}): parsers {m.tool_call_parser}/{m.reasoning_parser}; {thinking}; "
            f"draft {m.draft_model or 'none'}; {context}; {sampling}; {m.quantisation or 'quantisation unknown'}, "
            f"{m.weights_text()}, {shards}")


@click.command("init")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--preset", default=None, metavar="NAME",
              help=f"Preset whose values the profile starts from (default: {REFERENCE}).")
@click.option("--model", "model", metavar="KEY",
              help="Start from this Kimi model's preset on the reference host (8x RTX PRO 6000): k2-thinking, "
                   "k2.5, k2.6, k2.7-code; k3 is refused with its weights against the GPU memory.")
@click.option("--name", metavar="NAME", help="Service name (default: the preset's); the API key file is named "
              "after it (/etc/kimi-deploy/NAME.api-key).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.option("--fleet", is_flag=True, help="Add [fleet] (two example copies of the model) and [gateway], "
              "every key commented.")
@click.option("--kubernetes", is_flag=True, help="Add [kubernetes] for `render --target kubernetes`, every key "
              "commented.")
def init_cmd(path: Path, preset: str | None, model: str | None, name: str | None, force: bool, fleet: bool,
             kubernetes: bool):
    """Write a commented deployment profile to PATH to start from.

    --fleet and --kubernetes add those tables (both: copies of the model in a cluster behind the gateway).
    """
    import copy

    import jinja2

    if path.exists() and not force:
        raise UsageError("the profile file already exists", value=str(path),
                         hint="choose another path or pass --force to overwrite it")
    check_output_paths({"PATH": path})  # the rule of every output path: its directory must exist
    if preset and model:
        raise UsageError("--preset and --model are mutually exclusive", value=f"{preset} / {model}",
                         hint="--model picks the model's preset; pass one of them")
    chosen = preset_for_model(model) if model else get_preset(preset or REFERENCE)
    if name:
        valid_service_name(name, "--name", installed=False)
        data = copy.deepcopy(chosen.data)
        data["service"]["name"] = name  # the key file follows it: the preset's api_key_file holds {name}
        chosen = Preset(chosen.name, chosen.summary, data, model=chosen.model)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.kit_templates_dir())),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    text = env.get_template("profile.toml.j2").render(preset=chosen, toml=toml_value, options=OPTIONS,
                                                      example=init_example, fleet=fleet, kubernetes=kubernetes,
                                                      version=__version__)
    write_atomic(path, text)
    target = " --target kubernetes" if kubernetes else ""
    click.echo(f"wrote {path} (from preset {chosen.name}); edit it, then "
               f"`kimi-deploy render{target} --profile {path}`")


COMMANDS = [render_cmd, presets_cmd, init_cmd]
