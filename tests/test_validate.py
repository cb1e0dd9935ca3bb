"""Flag validation against the real SGLang 0.5.23 parser (the SGLang test environment)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, UnsupportedVersionError
from kimi_deploy.launch import build_launch
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from kimi_deploy.validate import PLACEHOLDER_API_KEY, STAGES, validate_profile, validate_server_args

pytestmark = pytest.mark.sglang
PRESET = "kimi-k25-rtx-pro-6000-x8"


def variant(**sglang):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"].update(sglang)
    return parse_profile(data)


def test_preset_passes_with_config_merge(sglang_python):
    result = validate_profile(get_preset(PRESET).profile(), sglang_python)
    v = result.validation
    assert v.ok, v.errors
    assert v.sglang_version == "0.5.23"
    assert v.stages == STAGES
    assert v.warnings == ()
    # SGLang's ConfigArgumentMerger read api-key from the substituted YAML, not the real file.
    assert v.api_key_from_config is True
    assert v.notes == ("--config /run/kimi-k25/sglang-secrets.yaml replaced by a YAML file holding a "
                       "placeholder api-key",)
    assert PLACEHOLDER_API_KEY not in " ".join(v.server_args)


def test_bad_flags_fail_with_sglangs_message(sglang_python):
    result = validate_profile(variant(extra_args=["--enable-torch-symm-memory"]), sglang_python)
    assert result.validation.errors == ("sglang serve: error: unrecognized arguments: --enable-torch-symm-memory",)
    assert not result.ok


def test_removed_flag_is_refused_before_sglang_and_sglang_agrees(sglang_python):
    """versions.REMOVED refuses --cuda-graph-max-bs with the new spelling before rendering; SGLang's own parser,
    given the same command, calls it ambiguous."""
    with pytest.raises(UnsupportedVersionError, match="use --cuda-graph-max-bs-decode N"):
        validate_profile(variant(extra_args=["--cuda-graph-max-bs", "64"]), sglang_python)
    launch = build_launch(get_preset(PRESET).profile())
    v = validate_server_args(sglang_python, [*launch.server_args, "--cuda-graph-max-bs", "64"],
                             secrets_config=launch.secrets_config)
    assert v.errors == ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
                        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",)


def test_a_second_config_file_fails_with_sglangs_message(sglang_python):
    """A profile cannot add --config (extra_args refuses what the kit owns); a command that has two still fails."""
    launch = build_launch(get_preset(PRESET).profile())
    v = validate_server_args(sglang_python, [*launch.server_args, "--config", "/etc/kimi-deploy/other.yaml"],
                             secrets_config=launch.secrets_config)
    assert v.errors == ("--config: Multiple config files specified! Only one allowed.",)
    assert not v.ok


def test_bad_parser_name(sglang_python):
    v = validate_profile(variant(tool_call_parser="kimi_k2x"), sglang_python).validation
    assert len(v.errors) == 1
    assert v.errors[0].startswith("sglang serve: error: argument --tool-call-parser: invalid choice: 'kimi_k2x'")
    assert "'kimi_k2'" in v.errors[0]
    assert v.stages == ("config",)


def test_deprecated_fusion_flag_passes_with_a_warning(sglang_python):
    launch = build_launch(variant(flashinfer_allreduce_fusion_backend=None))
    v = validate_server_args(sglang_python, [*launch.server_args, "--enable-flashinfer-allreduce-fusion"],
                             secrets_config=launch.secrets_config)
    assert v.ok
    assert v.warnings == ("--enable-flashinfer-allreduce-fusion is deprecated. "
                          "Please use --flashinfer-allreduce-fusion-backend=auto instead.",)


def test_old_spelling_rendered_for_0_5_13_warns_on_0_5_23(sglang_python):
    """Rendering for the wrong version is caught: 0.5.13 spells fusion the old way."""
    launch = build_launch(get_preset(PRESET).profile(), "0.5.13")
    assert "--enable-flashinfer-allreduce-fusion" in launch.server_args
    v = validate_server_args(sglang_python, launch.server_args, secrets_config=launch.secrets_config)
    assert v.ok
    assert any("--flashinfer-allreduce-fusion-backend" in w for w in v.warnings)


def test_deprecated_flag_with_replacement_also_given_still_warns(sglang_python):
    """SGLang stays silent here (backend already set); its help text says Deprecated."""
    launch = build_launch(get_preset(PRESET).profile())
    v = validate_server_args(sglang_python, [*launch.server_args, "--enable-flashinfer-allreduce-fusion"],
                             secrets_config=launch.secrets_config)
    assert v.ok
    assert v.warnings == ("--enable-flashinfer-allreduce-fusion: (Deprecated: use "
                          "--flashinfer-allreduce-fusion-backend=auto) Enable FlashInfer allreduce fusion with "
                          "Residual RMSNorm.",)


def test_cli_validate_preset(cli_runner, sglang_python):
    result = cli_runner.invoke(cli, ["validate", "--preset", PRESET, "--python", sglang_python])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: SGLang 0.5.23 (")
    assert "checked: config, argparse, exact-names, record, deprecated-args" in result.stdout


def test_cli_validate_rejects_with_exit_1_and_json(cli_runner, sglang_python, tmp_path):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"]["extra_args"] = ["--cuda-graph-max-bs-decod", "64"]
    path = tmp_path / "p.toml"
    path.write_text("\n".join(
        [f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in data[sec].items())
         for sec in ("service", "sglang", "environment")]) + "\n")
    result = cli_runner.invoke(cli, ["validate", "--profile", str(path), "--python", sglang_python, "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["sglang_version"] == "0.5.23"
    assert "--cuda-graph-max-bs-decod is an abbreviation of --cuda-graph-max-bs-decode" in report["errors"][0]
    assert report["sizing"] is None  # a command SGLang refuses is not sized


def test_cli_validate_missing_interpreter(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["validate", "--preset", PRESET, "--python", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "error: the SGLang interpreter does not exist" in result.stderr
    assert "Traceback" not in result.output


def test_render_python_uses_detected_versions(cli_runner, sglang_python):
    result = cli_runner.invoke(cli, ["render", "--preset", PRESET, "--python", sglang_python, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sglang_version"] == "0.5.23"
    assert data["components"] == {"torch": "2.14.1", "cuda": "13.0"}
    assert data["cache_dir"] == "/var/cache/kimi-k25/sglang-0.5.23_torch-2.14.1_cuda-13.0"
    assert data["env"]["SGLANG_JIT_CACHE_DIR"].startswith(data["cache_dir"])


def test_render_python_and_version_exclusive(cli_runner, sglang_python):
    result = cli_runner.invoke(cli, ["render", "--preset", PRESET, "--python", sglang_python,
                                     "--sglang-version", "0.5.23"])
    assert result.exit_code == 2
    assert "mutually exclusive" in result.stderr


@pytest.mark.parametrize("preset", ["kimi-k26-rtx-pro-6000-x8", "kimi-k27-code-rtx-pro-6000-x8",
                                    "kimi-k2-thinking-rtx-pro-6000-x8", "kimi-k25-rtx-pro-6000-x8-pcie-ipc"])
def test_the_other_kimi_presets_pass_sglangs_parser(sglang_python, preset):
    result = validate_profile(get_preset(preset).profile(), sglang_python)
    assert result.ok, (result.validation.errors, result.model.errors)
    assert result.validation.stages == STAGES and result.validation.warnings == ()
    assert result.model.model == get_preset(preset).model and result.model.warnings == ()


def test_cli_validate_refuses_k3_on_the_reference_host_with_the_numbers(cli_runner, sglang_python, tmp_path):
    """SGLang 0.5.23 knows kimi_k3 and would accept the command; the model table refuses what the GPUs cannot hold,
    before the interpreter is asked (exit 4, the sentence every verb gives: tests/test_deployment.py)."""
    data = copy.deepcopy(get_preset("kimi-k26-rtx-pro-6000-x8").data)
    data["sglang"].update(model_path="/models/moonshotai/Kimi-K3", served_model_name="moonshotai/Kimi-K3",
                          tool_call_parser="kimi_k3", reasoning_parser="kimi_k3")
    profile = tmp_path / "k3.toml"
    profile.write_text("\n".join(
        [f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in data[sec].items())
         for sec in ("service", "sglang", "environment")]) + "\n")
    result = cli_runner.invoke(cli, ["validate", "--profile", str(profile), "--python", sglang_python])
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert ("Kimi K3 weights ~1.68 TB (MXFP4) vs GPU memory 8 x 96 GB RTX PRO 6000 Blackwell = "
            "~768 GB: 219%") in result.stderr
    assert "what would fit: at least 24 x RTX PRO 6000 Blackwell" in result.stderr


def test_cli_validate_gives_no_verdict_when_sglangs_resolution_stops(cli_runner, sglang_python, monkeypatch):
    """Issue 36: with an interpreter that could not finish SGLang's resolution, validate printed `error: SGLang's
    resolution stopped` and still a memory verdict ("tight"), exit 0. Now: the reason, no verdict, exit 5. The
    parse runs in SGLang's interpreter; the resolution's answer is the one an incomplete environment gave
    (a module missing), replayed."""
    from kimi_deploy.sizing import report as sizing_report
    from kimi_deploy.sizing.effective import EffectiveConfig

    stopped = "SGLang's resolution stopped: ModuleNotFoundError: No module named 'sgl_kernel'"

    def incomplete(python, server_args, gpus, **_kw):
        return EffectiveConfig(gpus=gpus, values=(), resolved={}, sources={}, failed_steps=(), errors=(stopped,),
                               notes=())

    monkeypatch.setattr(sizing_report, "resolve", incomplete)
    data = Path(__file__).parent / "data"
    args = ["validate", "--preset", "kimi-k25-rtx-pro-6000-x8", "--python", sglang_python,
            "--gpu-facts", str(data / "nvidia-smi/query-8x-workstation-570.csv"),
            "--model-facts", str(data / "models/kimi-k2.5-int4"),
            "--draft-facts", str(data / "models/kimi-k2.5-eagle3-mla")]
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == ExitCode.EXTERNAL, result.output
    assert f"FAILED: no memory verdict: {stopped}" in result.stdout
    assert "memory plan per GPU" not in result.stdout and "tight" not in result.stdout


def test_cli_validate_says_each_phase_on_stderr_off_a_terminal(cli_runner, sglang_python):
    """Issue 43 item 3: validate (17-21 s) printed nothing until the end. Off a terminal: one plain line per
    phase on stderr, in order, the report alone on stdout."""
    result = cli_runner.invoke(cli, ["validate", "--preset", PRESET, "--python", sglang_python, "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout is the report alone
    lines = result.stderr.splitlines()
    phases = [line for line in lines if line.startswith("validate: ")]
    assert phases[0] == f"validate: reading SGLang's interpreter {sglang_python} (its SGLang version and components)"
    assert phases[1] == "validate: parsing the launch command with SGLang 0.5.23's own parser"
    assert phases[-1] == "validate: resolving what SGLang picks on these GPUs, and the memory plan"
    assert "\r" not in result.stderr and "\x1b" not in result.stderr  # no spinner, no escape codes off a terminal


def test_phases_draw_one_live_line_on_a_terminal():
    """On a terminal: a spinner line naming the phase (rich, transient, as check's live line), no plain lines."""
    import io

    from rich.console import Console

    from kimi_deploy.cli.common import Phases

    out = io.StringIO()
    with Phases("validate", Console(file=out, force_terminal=True, width=120)) as phase:
        phase("parsing the launch command with SGLang 0.5.23's own parser")
        phase.progress.refresh()
        drawn = out.getvalue()
    assert "validate: parsing the launch command with SGLang 0.5.23's own parser" in drawn and "\x1b" in drawn
