"""Model revisions, as the runbook's K2.5 -> K2.6 step takes them: `init --model KEY --name NAME` keeps the installed
service's name, `upgrade --profile` with another name is refused with that way named (never "install it", which
would start a second 8-GPU service), `init --model`'s help comes from the model catalog, and each model's profile
shows its own draft model or says it has none."""

from __future__ import annotations

import tomllib

import pytest

from helpers import run_cli

from kimi_deploy.catalog.models import MODELS
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.catalog.presets import MODEL_PRESETS, SPECULATIVE
from kimi_deploy.profile import load_profile


def _init(tmp_path, name: str, *args: str):
    path = tmp_path / name
    result = run_cli(["init", str(path), *args])
    assert result.exit_code == 0, result.stderr
    return path


def test_init_model_with_name_keeps_the_service_name_and_its_key_file(tmp_path):
    path = _init(tmp_path, "k26.toml", "--model", "k2.6", "--name", "kimi-k25")
    data = tomllib.loads(path.read_text())
    assert data["service"]["name"] == "kimi-k25"
    assert data["sglang"]["model_path"] == "/models/moonshotai/Kimi-K2.6"
    assert load_profile(path).sglang.api_key_file == "/etc/kimi-deploy/kimi-k25.api-key"


def test_init_model_help_comes_from_the_catalog():
    result = run_cli(["init", "--help"])
    text = " ".join(result.stdout.split())
    for key in MODELS:
        assert key in text
    refused = [k for k in MODELS if k not in MODEL_PRESETS]
    assert refused and all(f"{k} refused" in text for k in refused)
    assert "keeps the installed service's name: add --name NAME" in text


@pytest.mark.parametrize("key", sorted(MODEL_PRESETS))
def test_each_models_profile_shows_its_own_draft_or_says_it_has_none(tmp_path, key):
    """No profile carries another model's draft, not even in a comment."""
    model = MODELS[key]
    text = _init(tmp_path, "p.toml", "--model", key).read_text()
    data = tomllib.loads(text)["sglang"]
    if model.draft_model:
        assert data["speculative_draft_model_path"] == f"/models/{model.draft_model}"
        assert "has no draft model" not in text
    else:
        assert not any(k in data for k in SPECULATIVE)
        assert "/models/lightseekorg/" not in text and "# speculative_" not in text
        assert f"{model.name} has no draft model" in text


@pytest.fixture
def installed_k25(tmp_path, fake_systemd):
    """A --root tree with `init --model k2.5` installed (service kimi-k25)."""
    root = tmp_path / "root"
    root.mkdir()
    profile = _init(tmp_path, "k25.toml", "--model", "k2.5")
    apply(plan_install(load_profile(profile), HostLayout(root), enable=False, create_user=False))
    return root


def test_a_revision_under_another_service_name_is_refused_with_the_way_to_keep_the_name(tmp_path, installed_k25):
    """`init --model k2.6` names the service kimi-k26: `upgrade --profile` says how to keep kimi-k25, and never
    suggests installing it (a second 8-GPU service beside the first)."""
    renamed = _init(tmp_path, "k26.toml", "--model", "k2.6")
    result = run_cli(["upgrade", "--root", str(installed_k25), "--profile", str(renamed), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "names service kimi-k26, not the installed service kimi-k25" in result.stderr
    assert "kimi-deploy init --model k2.6 --name kimi-k25" in result.stderr
    assert 'set [service] name = "kimi-k25"' in result.stderr
    assert "install it" not in result.stderr
    kept = _init(tmp_path, "k26-kept.toml", "--model", "k2.6", "--name", "kimi-k25")
    result = run_cli(["upgrade", "--root", str(installed_k25), "--profile", str(kept), "--dry-run"])
    # past the service check: what stops this dry run is the SGLang interpreter the preset names, not on this machine
    assert "names service" not in result.stderr and "not installed" not in result.stderr, result.stderr
    assert "the SGLang interpreter does not exist" in result.stderr, result.stderr


def test_a_name_that_contradicts_the_new_profile_is_refused(tmp_path, installed_k25):
    kept = _init(tmp_path, "k26.toml", "--model", "k2.6", "--name", "kimi-k25")
    result = run_cli(["upgrade", "--root", str(installed_k25), "--profile", str(kept), "--name", "other",
                      "--dry-run"])
    assert result.exit_code == 2 and "names service kimi-k25, not --name other" in result.stderr
