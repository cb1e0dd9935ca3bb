"""Verb ``validate``: check the rendered command with SGLang's own parser in its interpreter."""

from __future__ import annotations

from pathlib import Path

import click

from kimi_deploy import validate as validate_lib
from kimi_deploy.doctor import probe_gpus
from kimi_deploy.cli.common import Phases, echo_json, json_flag, name_option, profile_options, profile_or_installed
from kimi_deploy.errors import ExitCode, KimiDeployError, UsageError
from kimi_deploy.fsio import check_output_dir, create_output_dir, write_many_atomic
from kimi_deploy.paths import HostLayout
from kimi_deploy.sizing import report as sizing
from kimi_deploy.doctor.recorded import record_facts
from kimi_deploy.sizing.memory import GpuFacts
from kimi_deploy.wire.inputs import read_regular


@click.command("validate")
@profile_options
@name_option
@click.option("--python", "python", metavar="PATH",
              help="SGLang's interpreter (default: [service] python of the profile).")
@click.option("--gateway", "gateway", is_flag=True,
              help="Check the [gateway] command instead: against the pinned smg's --version and its own "
                   "`launch --help` (exact option names).")
@click.option("--smg", "smg", metavar="PATH", help="With --gateway: the smg executable (default: [gateway] smg).")
@click.option("--gpu-facts", "gpu_facts", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              metavar="FILE", help="Recorded `nvidia-smi --query-gpu=index,name,pci.bus_id,compute_cap,memory.total,"
                                   "driver_version --format=csv` output to size for (default: this host's GPUs).")
@click.option("--model-facts", "model_facts", type=click.Path(path_type=Path, file_okay=False, exists=True),
              metavar="DIR", help="A directory with the model's config.json and header-index.json, standing in for "
                                  "model_path where the weights are not on this machine.")
@click.option("--draft-facts", "draft_facts", type=click.Path(path_type=Path, file_okay=False, exists=True),
              metavar="DIR", help="The same for speculative_draft_model_path.")
@click.option(sizing.ACCEPT_FLAG, "accept_memory_risk", is_flag=True,
              help=f"Pass a profile whose memory plan will not fit. Risky: {sizing.ACCEPT_RISK}.")
@json_flag("Print the result as JSON.")
@click.pass_context
def validate_cmd(ctx, profile_path, preset, name, python, gateway, smg, gpu_facts, model_facts, draft_facts,
                 accept_memory_risk, as_json):
    """Parse the command with SGLang's own argparse, then show what SGLang resolves here and the memory plan.

    Exit 0: SGLang accepts every flag (warnings allowed); 1: it rejects one; 4: refused: the profile's model is one
    of the kit's model table whose weights do not fit its GPUs (Kimi K3 on 8 x 96 GB; before any interpreter is
    asked), with the numbers, or the memory plan says the profile will not fit (the setting to change is printed;
    --accept-memory-risk passes it); 5: SGLang's interpreter could not finish resolving the command here (no
    verdict). Without --profile/--preset: the installed profile.
    """
    profile = profile_or_installed(profile_path, preset, name, HostLayout(Path("/")))
    if gateway:
        checked = validate_lib.validate_smg(profile, smg)
        if as_json:
            echo_json(checked.to_dict())
        elif checked.ok:
            click.echo(f"ok: {checked.version} ({checked.smg}) has every option of the gateway command")
        else:
            click.echo(f"FAILED: the gateway command does not pass against {checked.version} ({checked.smg})")
            for error in checked.errors:
                click.echo(f"error: {error}")
        ctx.exit(0 if checked.ok else int(ExitCode.FAILED))
    with Phases("validate") as phase:  # stderr: what runs now (17-21 s in all), never silent
        gpus, gpu_hint = _gpu_facts(gpu_facts)
        result = validate_lib.validate_profile(profile, python, gpus=gpus, phase=phase)  # a model that cannot fit: exit 4
        sized = None
        if result.ok:
            phase("resolving what SGLang picks on these GPUs, and the memory plan")
            try:
                sized = sizing.size_profile(profile, result.info.python, result.launch.server_args, gpus=gpus,
                                            model_facts=model_facts, draft_facts=draft_facts,
                                            env=validate_lib.check_env(result.launch), gpu_hint=gpu_hint)
            except KimiDeployError as exc:  # e.g. a partial download: the parser's verdict still stands
                sized = sizing.Sizing(None, None,
                                      (f"{exc.message}: {exc.value}" + (f" ({exc.hint})" if exc.hint else ""),))
    refused = bool(sized and sized.refused)
    unfinished = sized.unfinished if sized else ()
    deployment = result.deployment.refine(sized.plan if sized else None) if result.deployment else None
    if as_json:
        data = result.to_dict()
        data["sizing"] = sized.to_dict() if sized else None
        data["refused"] = refused and not accept_memory_risk
        data["unfinished"] = list(unfinished)
        data["deployment"] = deployment.to_dict() if deployment else None
        echo_json(data)
    else:
        for warning in result.launch.warnings:
            click.echo(f"warning: {warning}")
        where = result.info.sglang_location
        checked = [(f"rank {r.rank.rank} ({r.rank.node}): ", r.validation) for r in result.ranks] \
            or [("", result.validation)]
        for label, v in checked:
            _report(label, v, where)
        if result.ranks:
            click.echo(f"note: the other replicas' ranks differ only in --dist-init-addr "
                       f"({len(result.ranks)} rank(s) of replica 0 checked)")
        m = result.model
        for error in m.errors:  # a [gateway] parser that does not match the model is labelled as the gateway's
            click.echo(f"{'gateway' if error.startswith('gateway.') else 'model'}: FAILED: {error}")
        for warning in m.warnings:
            click.echo(f"model: warning: {warning}")
        for note in m.notes:
            click.echo(f"model: note: {note}")
        for error in result.guard.errors:
            click.echo(f"speculative: FAILED: {error}")
        for warning in result.guard.warnings:
            click.echo(f"kv_cache: warning: {warning}")
        if result.guard.errors:
            click.echo("fix: set speculative_algorithm to what the draft's config.json declares, then run validate "
                       "again")
        if any(not e.startswith("gateway.") for e in m.errors):  # a gateway line carries its own fix
            click.echo("fix: deploy this model on GPUs that hold it (a [fleet] of hosts, or larger GPUs), or "
                       "choose a model that fits (`kimi-deploy presets`)")
        elif not result.ok and not m.errors:
            click.echo("fix: correct the flag in the profile ([sglang] or extra_args) and run validate again")
        for line in sized.lines() if sized else ():
            click.echo(line)
        for reason in unfinished:
            click.echo(f"FAILED: no memory verdict: {reason}")
        if unfinished:
            click.echo("fix: repair SGLang's environment (`kimi-deploy doctor` names what is missing; --python "
                       "chooses another interpreter), then run validate again")
        if refused:
            word = "accepted with --accept-memory-risk" if accept_memory_risk else "refused"
            click.echo(f"{word}: the memory plan says this profile will not fit; {sized.plan.problems[0]}")
            if not accept_memory_risk:
                click.echo(f"fix: change that setting and run validate again, or pass {sizing.ACCEPT_FLAG} "
                           f"(risky: {sizing.ACCEPT_RISK})")
    if not result.ok:
        ctx.exit(int(ExitCode.FAILED))
    if unfinished:
        ctx.exit(int(ExitCode.EXTERNAL))
    if refused and not accept_memory_risk:
        ctx.exit(int(ExitCode.REFUSED))


@click.command("facts")
@profile_options
@name_option
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), required=True, metavar="DIR",
              help="Write gpus.csv, model/ and draft/ (config.json, header-index.json) into DIR.")
@json_flag("Print the result as JSON.")
def facts_cmd(profile_path, preset, name, out_dir, as_json):
    """Record on the GPU host what the memory plan needs, to size the profile elsewhere.

    Writes this host's nvidia-smi GPU query and the model's (and draft's) config.json and safetensors header index
    into DIR; elsewhere, `kimi-deploy validate --gpu-facts DIR/gpus.csv --model-facts DIR/model` sizes the profile
    as here. Exit 2: a model directory that cannot be read. Without --profile/--preset: the installed profile, as
    every verb.
    """
    check_output_dir("--out", out_dir)
    profile = profile_or_installed(profile_path, preset, name, HostLayout(Path("/")))
    recorded = record_facts(profile)
    create_output_dir(out_dir)
    for folder in {name.split("/", 1)[0] for name in recorded.files if "/" in name}:
        (out_dir / folder).mkdir(exist_ok=True)
    write_many_atomic({out_dir / name: text for name, text in recorded.files.items()})
    if as_json:
        echo_json(recorded.to_dict(out_dir))
        return
    for name in recorded.files:
        click.echo(f"wrote {out_dir / name}")
    for line in recorded.skipped:
        click.echo(f"warning: not recorded: {line}", err=True)
    where = str(profile_path) if profile_path else "PROFILE"
    click.echo(f"then, on any machine with SGLang's interpreter: {recorded.validate_command(where, out_dir)}")


def _facts_text(path: Path) -> str:
    """The recorded ``nvidia-smi`` query at ``path`` (:func:`~kimi_deploy.wire.inputs.read_regular`: a regular
    file of at most 1 MiB).

    Raises:
        UsageError: missing, unreadable, not a regular file, or too large (exit 2).
    """
    try:
        return read_regular(path).decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read the GPU facts file ({exc.strerror or exc})", value=str(path),
                         hint="pass the gpus.csv that `kimi-deploy facts` wrote on the GPU host") from None


def _gpu_facts(path: Path | None) -> tuple[GpuFacts | None, str | None]:
    """The GPUs to size for: the recorded query at ``path``, else this host's ``nvidia-smi`` (``None`` and why
    when there is none)."""
    if path is not None:
        return GpuFacts.from_query(_facts_text(path), str(path)), None
    gpus, why = probe_gpus()
    if not gpus:
        return None, f"no GPU facts ({why}): run on the GPU host or pass --gpu-facts FILE"
    return GpuFacts.from_gpus(gpus, "this host's nvidia-smi"), None


def _report(label: str, v: validate_lib.Validation, where: str | None) -> None:
    """One command's outcome: ok/FAILED, then SGLang's errors, warnings and the check's notes."""
    if v.ok:
        click.echo(f"{label}ok: SGLang {v.sglang_version} ({where}) accepts the rendered command "
                   f"({len(v.server_args)} arguments; checked: {', '.join(v.stages)})")
    else:
        click.echo(f"{label}FAILED: SGLang {v.sglang_version} ({where}) rejects the rendered command")
    for error in v.errors:
        click.echo(f"{label}error: {error}")
    for warning in v.warnings:
        click.echo(f"{label}warning: {warning}")
    for note in v.notes:
        click.echo(f"{label}note: {note}")


COMMANDS = [validate_cmd, facts_cmd]
