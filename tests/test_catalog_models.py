"""The Kimi model table (kimi_deploy.catalog.models): sourced facts, the presets and `init --model` built from
it, the weights-vs-memory rule that refuses K3 on the reference host, and doctor's shard-layout check."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from doctor_helpers import make_model_dir
from helpers import run_cli

from kimi_deploy.catalog.models import (FACT_FIELDS, GB, MODELS, REFERENCE_GPU, ModelFacts, gpus_needed, identify,
                                        weights_fit)
from kimi_deploy.doctor import checks
from kimi_deploy.doctor.checks import Facts
from kimi_deploy.facts.modeldir import inspect_model_dir
from kimi_deploy.catalog.presets import MODEL_PRESETS, PRESETS, REFERENCE, get_preset, model_keys
from kimi_deploy.profile import load_profile, parse_profile
from kimi_deploy.validate import check_model

from test_doctor_checks import gpus


def k3_profile(gpu_count=8, **sglang):
    """The K2.6 preset pointed at K3 with K3's parsers: what an operator would try on the reference host."""
    data = copy.deepcopy(get_preset("kimi-k26-rtx-pro-6000-x8").data)
    data["service"]["gpu_count"] = gpu_count
    data["sglang"].update({"model_path": "/models/moonshotai/Kimi-K3", "served_model_name": "moonshotai/Kimi-K3",
                           "tool_call_parser": "kimi_k3", "reasoning_parser": "kimi_k3", **sglang})
    return parse_profile(data)


def test_every_fact_has_a_source_and_a_row_without_one_is_refused():
    for m in MODELS.values():
        assert set(FACT_FIELDS) <= set(m.sources), m.key
        assert all(m.sources[f].strip() for f in FACT_FIELDS)
        # a missing value says why: "unknown: ..." or "none: ..." (draft)
        for field in ("context_length", "quantisation", "weights_bytes", "shards"):
            if getattr(m, field) is None:
                assert m.sources[field].startswith("unknown:"), (m.key, field)
        if m.draft_model is None:
            assert m.sources["draft_model"].startswith("none:"), m.key
    with pytest.raises(ValueError, match="no source for released"):
        ModelFacts(**{**{f.name: getattr(MODELS["k2.6"], f.name) for f in dataclasses.fields(ModelFacts)},
                      "sources": {}})


def test_the_family_facts_the_issue_names():
    assert MODELS["k2.5"].draft_model == "lightseekorg/kimi-k2.5-eagle3-mla"
    assert all(MODELS[k].draft_model is None for k in ("k2-thinking", "k2.6", "k2.7-code", "k3"))
    assert (MODELS["k3"].tool_call_parser, MODELS["k3"].reasoning_parser) == ("kimi_k3", "kimi_k3")
    assert MODELS["k3"].weights_bytes == 1680 * GB and MODELS["k3"].quantisation == "MXFP4"
    assert MODELS["k2.7-code"].thinking.switch is None and MODELS["k2.5"].thinking.switch
    assert MODELS["k2-thinking"].shards.count == 62 and MODELS["k2.5"].shards.count == 64
    assert MODELS["k2.5"].shards.names()[0] == "model-00001-of-000064.safetensors"


@pytest.mark.parametrize(("names", "key"), [
    (("/models/moonshotai/Kimi-K2.6",), "k2.6"), (("/srv/w/kimi-k2-thinking/",), "k2-thinking"),
    (("/models/x", "moonshotai/Kimi-K3"), "k3"), (("/models/my-finetune", "finetune"), None),
])
def test_a_profiles_model_is_known_by_path_or_served_name(names, key):
    found = identify(*names)
    assert (found.key if found else None) == key


def test_presets_take_their_model_keys_from_the_table():
    """No preset copies a model fact: each one's model keys are the table's (model_keys)."""
    assert set(MODEL_PRESETS) == {"k2-thinking", "k2.5", "k2.6", "k2.7-code"} and MODEL_PRESETS["k2.5"] == REFERENCE
    for preset in PRESETS.values():
        sglang = preset.data["sglang"]
        for key, value in model_keys(MODELS[preset.model]).items():
            assert sglang[key] == value, (preset.name, key)
        assert ("speculative_algorithm" in sglang) == bool(MODELS[preset.model].draft_model), preset.name
        preset.profile()  # each one is a valid profile
        if preset.model != "k2.5":  # the other models: upstream's PCIe IPC path, no source patch
            assert sglang["enable_pcie_ipc_allreduce"] and "flashinfer_allreduce_fusion_backend" not in sglang


def test_presets_list_the_k2x_presets_with_their_model_facts():
    result = run_cli(["presets"])
    assert result.exit_code == 0
    for name in ("kimi-k26-rtx-pro-6000-x8", "kimi-k27-code-rtx-pro-6000-x8", "kimi-k2-thinking-rtx-pro-6000-x8"):
        assert name in result.stdout
    assert "model: Kimi K2.7-Code (moonshotai/Kimi-K2.7-Code): parsers kimi_k2/kimi_k2; thinking only; draft none" \
        in result.stdout
    data = json.loads(run_cli(["presets", "--json"]).stdout)
    assert data["kimi-k26-rtx-pro-6000-x8"]["model"]["sources"]["draft_model"].startswith("none:")


def test_init_model_writes_that_models_preset(tmp_path):
    path = tmp_path / "k26.toml"
    result = run_cli(["init", str(path), "--model", "K2.6"])
    assert result.exit_code == 0, result.stderr
    assert load_profile(path).digest() == get_preset("kimi-k26-rtx-pro-6000-x8").profile().digest()
    named = run_cli(["init", str(tmp_path / "t.toml"), "--model", "k2-thinking", "--name", "think"])
    assert named.exit_code == 0 and load_profile(tmp_path / "t.toml").service.name == "think"


def test_init_model_k3_is_refused_with_the_numbers_and_what_fits(tmp_path):
    path = tmp_path / "k3.toml"
    result = run_cli(["init", str(path), "--model", "k3"])
    assert result.exit_code == 2 and not path.exists()
    assert "Kimi K3 does not fit the reference host" in result.stderr
    assert "~1.68 TB (MXFP4) vs GPU memory 8 x 96 GB RTX PRO 6000 Blackwell = ~768 GB: 219%" in result.stderr
    assert "24 x RTX PRO 6000 Blackwell (3 hosts of 8" in result.stderr and "8 x B300 288 GB (one host)" in result.stderr


@pytest.mark.parametrize("args", [["--model", "k9"], ["--model", "k2.6", "--preset", REFERENCE]])
def test_init_model_refuses_unknown_and_ambiguous(tmp_path, args):
    result = run_cli(["init", str(tmp_path / "x.toml"), *args])
    assert result.exit_code == 2
    assert ("no such model" in result.stderr and "k2.7-code" in result.stderr) or "mutually exclusive" in result.stderr


def test_weights_fit_numbers():
    k3 = MODELS["k3"]
    assert weights_fit(k3, 8).fits is False and weights_fit(k3, 8).total_bytes == 768 * GB
    assert weights_fit(k3, 24).fits is True  # 3 hosts: 2304 GB x 0.85 = 1958 GB >= 1680 GB
    assert gpus_needed(k3.weights_bytes, REFERENCE_GPU) == 24
    assert all(weights_fit(MODELS[k], 8).fits for k in ("k2-thinking", "k2.5", "k2.6"))
    assert weights_fit(MODELS["k2.7-code"], 8).fits is None  # size unknown: not refused, not promised


def test_validate_model_check_refuses_k3_and_passes_a_fleet_that_holds_it():
    refused = check_model(k3_profile())
    assert refused.model == "k3" and len(refused.errors) == 1
    assert "~1.68 TB (MXFP4) vs GPU memory 8 x 96 GB" in refused.errors[0] and "what would fit" in refused.errors[0]
    held = check_model(k3_profile(gpu_count=24, pp_size=3))  # 24 GPUs of one replica: tp 8 x pp 3
    assert held.errors == () and held.notes
    wrong = check_model(k3_profile(tool_call_parser="kimi_k2"))
    assert wrong.warnings == (
        'Kimi K3 needs tool_call_parser = "kimi_k3", the profile has \'kimi_k2\' (' + MODELS["k3"].sources[
            "tool_call_parser"] + ")",)
    assert check_model(get_preset(REFERENCE).profile()).errors == ()


def test_doctor_refuses_k3_on_the_reference_gpus_with_the_numbers():
    f = Facts(profile=k3_profile(), gpus=gpus())
    c = checks.check_gpu_memory(f)
    assert c.status == "fail"
    assert c.evidence == ("8 x 97887 MiB = 764.7 GiB; weights 1564.6 GiB (205%); Kimi K3's published ~1.68 TB, "
                          "no downloaded shards measured")
    assert c.hint.startswith("Kimi K3 does not fit 8 x 97887 MiB: at least 24 x NVIDIA RTX PRO 6000")


def test_doctor_model_check_knows_the_published_shard_layout(tmp_path):
    k26 = MODELS["k2.6"]
    good = inspect_model_dir(make_model_dir(tmp_path / "good", 64, width=6))
    c = checks.check_model("model", good, "model_path", k26)
    assert c.status == "pass" and c.evidence.endswith("Kimi K2.6's published layout")
    other = inspect_model_dir(make_model_dir(tmp_path / "other", 63, width=6))  # complete, but not K2.6's files
    c = checks.check_model("model", other, "model_path", k26)
    assert c.status == "warn"
    assert "Kimi K2.6 publishes 64 shards (model-00001-of-000064.safetensors .. model-00064-of-000064.safetensors)" \
        in c.evidence and "not in the published layout: model-00001-of-000063.safetensors" in c.evidence
    assert "hf download moonshotai/Kimi-K2.6" in c.hint
    unknown = checks.check_model("model", other, "model_path", MODELS["k2.7-code"])
    assert unknown.status == "pass" and "published shard layout is unknown" in unknown.evidence


def test_doctor_compares_the_layout_only_of_a_directory_named_after_the_model(tmp_path):
    """A local copy served under the model's name is checked for completeness, not against the published layout;
    the weights-vs-memory check still knows the model by its served name."""
    def facts(model_path):
        data = copy.deepcopy(get_preset("kimi-k26-rtx-pro-6000-x8").data)
        data["sglang"]["model_path"] = str(model_path)
        return Facts(profile=parse_profile(data), gpus=gpus(), model=inspect_model_dir(model_path))

    local = facts(make_model_dir(tmp_path / "house-copy", 3))
    assert local.known_model_dir is None and local.known_model.key == "k2.6"
    assert {c.name: c.status for c in checks.evaluate(local)}["model"] == "pass"
    named = facts(make_model_dir(tmp_path / "moonshotai" / "Kimi-K2.6", 3))
    model = {c.name: c for c in checks.evaluate(named)}["model"]
    assert model.status == "warn" and "Kimi K2.6 publishes 64 shards" in model.evidence
