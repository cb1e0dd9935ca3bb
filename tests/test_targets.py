"""The target registry (issue 24): every target renders through it, and the two new ones say what they should.

``monitoring`` writes the files the ``systemd`` target puts in ``monitoring/`` (byte for byte), and nothing
when ``enable_metrics`` is off; ``litellm`` writes a LiteLLM proxy config whose upstream is the profile's server
(or gateway) and whose callback is the kit's hook. ``render --target`` writes what the registry returned.
"""

from __future__ import annotations

import copy
import json

import yaml
from helpers import run_cli

from kimi_deploy import targets
from kimi_deploy.targets import registry
from kimi_deploy.litellm_hook import CALLBACK
from kimi_deploy.catalog.presets import REFERENCE, get_preset
from kimi_deploy.profile import parse_profile


def reference(**changes):
    data = copy.deepcopy(get_preset(REFERENCE).data)
    for table, values in changes.items():
        data.setdefault(table, {}).update(values)
    return parse_profile(data)


def test_the_monitoring_target_is_the_systemd_targets_monitoring_folder():
    profile = reference()
    systemd = registry.render("systemd", profile)
    monitoring = registry.render("monitoring", profile)
    assert monitoring.files and {f"monitoring/{n}": t for n, t in monitoring.files.items()} == \
        {n: t for n, t in systemd.files.items() if n.startswith("monitoring/")}
    off = registry.render("monitoring", reference(sglang={"enable_metrics": False}))
    assert off.files == {} and off.notes == (targets.METRICS_OFF,)


def test_the_litellm_target_proxies_the_profiles_server_through_the_hook():
    profile = reference()
    config = yaml.safe_load(registry.render("litellm", profile).files["litellm-config.yaml"])
    (model,) = config["model_list"]
    assert model["model_name"] == (profile.sglang.served_model_name or profile.sglang.model_path)
    assert model["litellm_params"]["api_base"] == f"{profile.base_url}/v1"
    assert model["litellm_params"]["api_key"] == "os.environ/KIMI_DEPLOY_API_KEY"  # the profile has a key
    assert config["litellm_settings"]["callbacks"] == CALLBACK


def test_render_writes_what_the_registry_returned(tmp_path):
    out = tmp_path / "out"
    result = run_cli(["render", "--preset", REFERENCE, "--target", "monitoring", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    written = json.loads(result.stdout)["files"]
    expected = registry.render("monitoring", get_preset(REFERENCE).profile()).files
    assert set(written) == set(expected)
    assert {name: (out / name).read_text() for name in expected} == dict(expected)


def test_print_command_is_refused_for_a_target_without_a_command():
    result = run_cli(["render", "--preset", REFERENCE, "--target", "litellm", "--print-command"])
    assert result.exit_code == 2
    assert "--print-command and --python are for the systemd target" in result.stderr
