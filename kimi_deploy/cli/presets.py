"""Verbs ``presets`` and ``init``: the built-in presets, and a commented profile to start from.

Apart from ``render`` (:mod:`kimi_deploy.cli.render`) so that rendering a profile file loads neither the preset
catalogue with its model table nor the profile template.
"""

from __future__ import annotations

from pathlib import Path

import click

import kimi_deploy
from kimi_deploy import paths
from kimi_deploy.catalog.models import MODELS
from kimi_deploy.cli.common import echo_json, json_flag
from kimi_deploy.errors import UsageError
from kimi_deploy.deployment import resolve
from kimi_deploy.fsio import check_output_paths, write_atomic
from kimi_deploy.options import OPTIONS, init_example
from kimi_deploy.catalog.presets import (MODEL_PRESETS, PRESETS, REFERENCE, SPECULATIVE, Preset, get_preset,
                                         preset_for_model, too_large_for_reference)
from kimi_deploy.profile import toml_value, valid_service_name


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


def _model_help() -> str:
    """``init --model``'s help, from the model catalog: the keys with a reference-host preset, then the others (too
    large for the reference host, or with no preset yet)."""
    keys = [f"{key} (the reference)" if PRESETS[name].name == REFERENCE else key
            for key, name in sorted(MODEL_PRESETS.items())]
    too_large = too_large_for_reference()
    no_preset = [k for k in MODELS if k not in MODEL_PRESETS and k not in too_large]
    return ("Start from this Kimi model's preset on the reference host (8x RTX PRO 6000): " + ", ".join(keys)
            + (f"; {', '.join(too_large)} refused, with its weights against the GPU memory" if too_large else "")
            + (f"; {', '.join(no_preset)} refused, no preset yet" if no_preset else "")
            + ". A new revision of an installed model keeps the installed service's name: add --name NAME.")


@click.command("init")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--preset", default=None, metavar="NAME",
              help=f"Preset whose values the profile starts from (default: {REFERENCE}).")
@click.option("--model", "model", metavar="KEY", help=_model_help())
@click.option("--name", metavar="NAME", help="Service name (default: the preset's); the API key file is named "
              "after it (/etc/kimi-deploy/NAME.api-key). `upgrade --profile` to a new model revision needs "
              "the installed service's name.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.option("--fleet", is_flag=True, help="Add [fleet] (two copies of the model) and [gateway]: the hosts are "
              "live keys holding documentation addresses (RFC 5737), which render and install refuse until "
              "replaced; the optional keys commented.")
@click.option("--kubernetes", is_flag=True, help="Add [kubernetes] for `render --target kubernetes`: the images "
              "are live keys holding registry.example placeholders, which render refuses until replaced; the "
              "optional keys commented.")
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
    # the unit names the comments name are the resolved deployment's, as every verb reads them
    units = resolve(chosen.profile(), launches=False).units
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.kit_templates_dir())),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True)
    text = env.get_template("profile.toml.j2").render(preset=chosen, toml=toml_value, options=OPTIONS,
                                                      example=init_example, fleet=fleet, kubernetes=kubernetes,
                                                      version=kimi_deploy.__version__, speculative=SPECULATIVE,
                                                      units=units,
                                                      model=MODELS[chosen.model] if chosen.model else None)
    write_atomic(path, text)
    target = " --target kubernetes" if kubernetes else ""
    examples = (" (replace the example addresses and images, and set an absolute [monitoring] runbook_url, first: "
                "render refuses them)"
                if fleet or kubernetes else "")
    click.echo(f"wrote {path} (from preset {chosen.name}); edit it{examples}, then "
               f"`kimi-deploy render{target} --profile {path}`")


COMMANDS = [presets_cmd, init_cmd]
