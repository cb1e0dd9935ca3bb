"""Switches an SGLang release removed or ignores are refused for that release with the new spelling
(kimi_deploy.versions.REMOVED): before any unit is rendered, not after a 10-minute start."""

from __future__ import annotations

import copy

import pytest

from kimi_deploy.cli import cli
from kimi_deploy.errors import ProfileError, UnsupportedVersionError
from kimi_deploy.launch import build_launch
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from kimi_deploy.versions import parse_version, removed_switches

PRESET = "kimi-k25-rtx-pro-6000-x8"


def variant(environment=None, **sglang):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"].update(sglang)
    data["environment"].update(environment or {})
    return parse_profile(data)


@pytest.mark.parametrize("extra", [["--cuda-graph-max-bs", "64"], ["--cuda-graph-max-bs=64"]])
def test_removed_cuda_graph_flag_refused_with_the_new_spelling(extra):
    with pytest.raises(UnsupportedVersionError) as err:
        build_launch(variant(extra_args=extra), "0.5.23")
    message = err.value.message
    assert "SGLang 0.5.23 refuses --cuda-graph-max-bs (removed in 0.5.23" in message
    assert "use --cuda-graph-max-bs-decode N and/or --cuda-graph-max-bs-prefill N" in message
    # the new spellings pass
    build_launch(variant(extra_args=["--cuda-graph-max-bs-decode", "64"]), "0.5.23")


def test_spec_v2_variable_refused_as_ignored():
    with pytest.raises(ProfileError) as err:
        variant(environment={"SGLANG_ENABLE_SPEC_V2": "1"})
    assert ("environment.SGLANG_ENABLE_SPEC_V2: kimi-deploy sets this variable itself (and SGLang 0.5.14+ ignored "
            "it: set there, it changes nothing); use [sglang] enable_spec_v2") in err.value.problems
    assert removed_switches(parse_version("0.5.23"), env_names=["SGLANG_ENABLE_SPEC_V2"]) == [
        "environment: SGLang 0.5.23 silently ignores SGLANG_ENABLE_SPEC_V2 (ignored in 0.5.14; sglang PR #27964 "
        "removed it in 0.5.14; from 0.5.21 not even a warning (0.5.23 source)); use [sglang] enable_spec_v2 (the "
        "kit spells it for the release: the variable before 0.5.14, nothing from 0.5.14, where EAGLE/EAGLE3 always "
        "use spec v2; disable_overlap_schedule = true turns overlap off)"]
    # a release that still reads it: nothing to say
    assert removed_switches(parse_version("0.5.13"), env_names=["SGLANG_ENABLE_SPEC_V2"]) == []


def test_spec_v2_false_refused_for_a_release_where_it_is_always_on():
    with pytest.raises(UnsupportedVersionError) as err:
        build_launch(variant(enable_spec_v2=False), "0.5.23")
    assert "set disable_overlap_schedule = true" in err.value.hint
    assert ("SGLANG_ENABLE_SPEC_V2", "0") in build_launch(variant(enable_spec_v2=False), "0.5.13").env


def test_render_refuses_before_writing(cli_runner, tmp_path):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"]["extra_args"] = ["--cuda-graph-max-bs", "64"]
    import tomli_w

    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))
    result = cli_runner.invoke(cli, ["render", "--profile", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "--cuda-graph-max-bs-decode" in result.stderr
    assert not (tmp_path / "out").exists()
