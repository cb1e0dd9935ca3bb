"""Issue 41, item 3: speculative and KV-cache guards before a start (kimi_deploy/catalog/spec_guard.py), in
``validate`` and ``doctor``. The drafts are recorded ``config.json`` files (tests/data/models/): the EAGLE-3 draft of K2.5
(``Eagle3DeepseekV2ForCausalLM``) and an EAGLE draft (``LlamaForCausalLMEagle``)."""

from __future__ import annotations

import copy
import json
import shutil

from pathlib import Path

import pytest

from kimi_deploy.catalog import spec_guard
from kimi_deploy.cli import cli
from kimi_deploy.errors import ProfileError
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from test_doctor_checks import by_name, facts

MODELS = Path(__file__).parent / "data" / "models"
EAGLE3_DRAFT = MODELS / "kimi-k2.5-eagle3-mla"
EAGLE_DRAFT = MODELS / "eagle-llama-draft"
PRESET = "kimi-k25-rtx-pro-6000-x8"


def _profile(algorithm: str = "EAGLE3", draft: Path | str | None = EAGLE3_DRAFT, extra_args=()):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"]["speculative_algorithm"] = algorithm
    data["sglang"]["speculative_draft_model_path"] = str(draft) if draft else None
    if not draft:
        del data["sglang"]["speculative_draft_model_path"]
    data["sglang"]["extra_args"] = list(extra_args)
    return parse_profile(data)


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_the_draft_declares_its_kind_in_its_own_config():
    assert spec_guard.draft_kind(_config(EAGLE3_DRAFT)) == "EAGLE3"
    assert spec_guard.draft_kind(_config(EAGLE_DRAFT)) == "EAGLE"
    assert spec_guard.draft_kind(_config(MODELS / "kimi-k2.5-int4")) is None  # a target model, no draft
    assert spec_guard.draft_kind({"architectures": ["LlamaForCausalLM"],
                                  "eagle_config": {"use_aux_hidden_state": True}}) == "EAGLE3"
    assert spec_guard.read_draft_config(str(EAGLE3_DRAFT)) == _config(EAGLE3_DRAFT)
    assert spec_guard.read_draft_config("lightseekorg/kimi-k2.5-eagle3-mla") is None  # a hub id: not here


@pytest.mark.parametrize("algorithm, draft, kind", [("EAGLE", EAGLE3_DRAFT, "EAGLE3"), ("EAGLE3", EAGLE_DRAFT, "EAGLE")])
def test_an_algorithm_the_draft_does_not_declare_is_refused_with_the_source(algorithm, draft, kind):
    guard = spec_guard.problems(_profile(algorithm, draft), _config(draft), "NVIDIA RTX PRO 6000 Blackwell")
    (error,) = guard.errors
    assert error.startswith(f"sglang.speculative_algorithm: {algorithm} with an ")
    assert "accept length of exactly 1.0" in error and "sglang PR 21272" in error
    assert f'set speculative_algorithm = "{kind}"' in error


def test_a_matching_draft_and_an_unreadable_one_are_not_refused():
    assert spec_guard.problems(_profile(), _config(EAGLE3_DRAFT), "RTX PRO 6000 Blackwell") == \
        spec_guard.Guard((), (), "EAGLE3")
    assert spec_guard.problems(_profile("EAGLE"), None, "RTX PRO 6000 Blackwell").errors == ()


def test_eagle3_without_a_draft_is_refused_by_the_profile_with_its_source():
    with pytest.raises(ProfileError) as err:
        _profile(draft=None)
    (line,) = [p for p in err.value.problems if "draft" in p]
    assert "EAGLE3 needs a draft model" in line and "sglang issue 36528" in line


@pytest.mark.parametrize("args", [["--kv-cache-dtype", "fp8_e4m3"], ["--kv-cache-dtype=fp8_e5m2"]])
def test_fp8_kv_cache_on_k25_and_rtx_pro_6000_warns_with_the_measurement(args):
    guard = spec_guard.problems(_profile(extra_args=args), _config(EAGLE3_DRAFT),
                                "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    (warning,) = guard.warnings
    assert "16 tok/s" in warning and "73-90 tok/s" in warning and "local-inference-lab/rtx6kpro" in warning
    assert guard.errors == ()
    # no measurement elsewhere: another card, or a BF16 cache
    assert spec_guard.problems(_profile(extra_args=args), None, "NVIDIA H100 80GB HBM3").warnings == ()
    assert spec_guard.problems(_profile(extra_args=["--kv-cache-dtype", "bf16"]), None,
                               "RTX PRO 6000 Blackwell").warnings == ()


def test_doctor_says_the_same_for_the_installed_profile():
    bad = by_name(facts(profile=_profile("EAGLE"), draft_config=_config(EAGLE3_DRAFT)))
    row = bad["speculative.draft"]
    assert row.status == "fail" and "PR 21272" in row.evidence and 'speculative_algorithm = "EAGLE3"' in row.hint
    good = by_name(facts(profile=_profile(), draft_config=_config(EAGLE3_DRAFT)))
    assert good["speculative.draft"].status == "pass" and "kv_cache.dtype" not in good
    unknown = by_name(facts(profile=_profile(), draft_config=None))
    assert unknown["speculative.draft"].status == "warn"
    kv = by_name(facts(profile=_profile(extra_args=["--kv-cache-dtype", "fp8_e4m3"]),
                       draft_config=_config(EAGLE3_DRAFT)))["kv_cache.dtype"]
    assert kv.status == "warn" and "16 tok/s" in kv.evidence


def test_cli_validate_refuses_the_mismatch_after_sglang_accepts_it(cli_runner, sglang_python, tmp_path):
    """SGLang 0.5.23's own parser accepts EAGLE with an EAGLE-3 draft; the guard refuses it (exit 1)."""
    draft = tmp_path / "draft"
    shutil.copytree(EAGLE3_DRAFT, draft)
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"].update(speculative_algorithm="EAGLE", speculative_draft_model_path=str(draft),
                          extra_args=["--kv-cache-dtype", "fp8_e4m3"])
    path = tmp_path / "p.toml"
    path.write_text("\n".join(
        [f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in data[sec].items())
         for sec in ("service", "sglang", "environment")]) + "\n")
    result = cli_runner.invoke(cli, ["validate", "--profile", str(path), "--python", sglang_python])
    assert result.exit_code == 1, result.output
    assert "ok: SGLang 0.5.23" in result.stdout
    assert "speculative: FAILED: sglang.speculative_algorithm: EAGLE with an EAGLE-3 draft" in result.stdout
    assert "kv_cache: warning: kv_cache_dtype fp8_e4m3 on Kimi K2.5" in result.stdout
    report = json.loads(cli_runner.invoke(cli, ["validate", "--profile", str(path), "--python", sglang_python,
                                                "--json"]).stdout)
    assert report["ok"] is False and report["guards"]["draft_kind"] == "EAGLE3"
    assert report["problems"][-1].startswith("speculative: sglang.speculative_algorithm: EAGLE")
