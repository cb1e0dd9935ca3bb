"""The same profile renders the spelling each SGLang release accepts; missing features name their release."""

from __future__ import annotations

import pytest

from kimi_deploy.errors import UnsupportedVersionError, UsageError
from kimi_deploy.launch import build_launch
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile

PRESET = get_preset("kimi-k25-rtx-pro-6000-x8")

#: The reference deployment's launch arguments, flag for flag (shared/notes/sglang-0.5.23.md).
REFERENCE_0_5_23 = [
    "--model-path", "/models/moonshotai/Kimi-K2.5",
    "--served-model-name", "moonshotai/Kimi-K2.5",
    "--trust-remote-code",
    "--host", "0.0.0.0", "--port", "30000", "--tp-size", "8",
    # the memory settings that fit 8 x RTX PRO 6000 (presets.MEMORY; SGLang's own choice does not hold the weights)
    "--context-length", "65536", "--mem-fraction-static", "0.895", "--max-running-requests", "48",
    "--chunked-prefill-size", "4096",
    "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2",
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/models/lightseekorg/kimi-k2.5-eagle3-mla",
    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--flashinfer-allreduce-fusion-backend", "auto",
    "--enable-torch-symm-mem",
    "--enable-metrics",  # issue 16: Prometheus metrics on in the preset
    "--config", "/run/kimi-k25/sglang-secrets.yaml",
]


def _with(**sglang):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in PRESET.data.items()}
    data["sglang"] = {**data["sglang"], **sglang}
    return parse_profile(data)


def test_preset_matches_the_reference_deployment_at_0_5_23():
    launch = build_launch(PRESET.profile(), "0.5.23")
    assert launch.argv[:3] == ("/opt/sglang/.venv/bin/python", "-m", "sglang.launch_server")
    assert list(launch.server_args) == REFERENCE_0_5_23
    env = dict(launch.env)
    assert "SGLANG_ENABLE_SPEC_V2" not in env, "removed in 0.5.14: v2 is implicit"
    assert env["SGLANG_CACHE_DIR"] == "/var/cache/kimi-k25/sglang-0.5.23"
    assert env["SGLANG_JIT_CACHE_DIR"].startswith(env["SGLANG_CACHE_DIR"] + "/")


def test_before_0_5_14_the_old_fusion_flag_and_the_spec_v2_env():
    launch = build_launch(PRESET.profile(), "0.5.12")
    args = list(launch.server_args)
    assert "--enable-flashinfer-allreduce-fusion" in args
    assert "--flashinfer-allreduce-fusion-backend" not in args
    assert dict(launch.env)["SGLANG_ENABLE_SPEC_V2"] == "1"


@pytest.mark.parametrize("version,has_env", [("0.5.4", None), ("0.5.5", True), ("0.5.13", True),
                                             ("0.5.14", False), ("0.5.21", False)])
def test_spec_v2_env_only_for_0_5_5_to_0_5_13(version, has_env):
    profile = _with(speculative_algorithm="EAGLE", flashinfer_allreduce_fusion_backend=None,
                    enable_torch_symm_mem=False)
    if has_env is None:
        with pytest.raises(UnsupportedVersionError, match=r"enable_spec_v2 needs SGLang >= 0\.5\.5"):
            build_launch(profile, version)
        return
    assert ("SGLANG_ENABLE_SPEC_V2" in dict(build_launch(profile, version).env)) is has_env


@pytest.mark.parametrize("field,value,version,added", [
    ("enable_torch_symm_mem", True, "0.5.2", "0.5.3"),
    ("enable_pcie_ipc_allreduce", True, "0.5.20", "0.5.21"),
    ("enforce_disable_flashinfer_allreduce_fusion", True, "0.5.9", "0.5.10"),
])
def test_missing_feature_names_the_release_that_added_it(field, value, version, added):
    changes = {field: value}
    if field == "enforce_disable_flashinfer_allreduce_fusion":
        changes["flashinfer_allreduce_fusion_backend"] = None
    profile = _with(**changes, speculative_algorithm=None, speculative_draft_model_path=None,
                    speculative_num_steps=None, speculative_eagle_topk=None, speculative_num_draft_tokens=None,
                    enable_spec_v2=None, **({} if field == "enable_torch_symm_mem" else
                                            {"enable_torch_symm_mem": False}))
    with pytest.raises(UnsupportedVersionError) as err:
        build_launch(profile, version)
    assert f"needs SGLang >= {added}" in err.value.message
    assert f"upgrade SGLang to {added}" in err.value.hint


def test_eagle3_for_kimi_needs_0_5_10():
    with pytest.raises(UnsupportedVersionError, match=r"EAGLE3.*needs SGLang >= 0\.5\.10"):
        build_launch(PRESET.profile(), "0.5.9")


def test_fusion_backend_other_than_auto_needs_0_5_14():
    with pytest.raises(UnsupportedVersionError, match=r"needs SGLang >= 0\.5\.14"):
        build_launch(_with(flashinfer_allreduce_fusion_backend="trtllm"), "0.5.12")


def test_pcie_ipc_allreduce_is_an_env_variable():
    launch = build_launch(_with(enable_pcie_ipc_allreduce=True), "0.5.23")
    assert dict(launch.env)["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"


def test_spec_v2_off_cannot_be_honoured_from_0_5_14():
    with pytest.raises(UnsupportedVersionError, match="always use the v2 worker"):
        build_launch(_with(enable_spec_v2=False), "0.5.23")
    assert dict(build_launch(_with(enable_spec_v2=False), "0.5.12").env)["SGLANG_ENABLE_SPEC_V2"] == "0"


def test_newer_release_renders_newest_spelling_with_a_warning():
    launch = build_launch(PRESET.profile(), "0.5.30")
    assert "--flashinfer-allreduce-fusion-backend" in launch.server_args
    assert launch.warnings and "newer than the newest release" in launch.warnings[0]


@pytest.mark.parametrize("text", ["latest", "0.4.9", "1.0.0", ""])
def test_bad_versions_are_usage_errors(text):
    with pytest.raises(UsageError):
        build_launch(PRESET.profile(), text)


def test_cache_key_follows_the_stack():
    launch = build_launch(PRESET.profile(), "0.5.23",
                          components={"flashinfer": "0.7.2", "torch": "2.14.1", "cuda": "13.0"})
    assert launch.cache_dir == "/var/cache/kimi-k25/sglang-0.5.23_flashinfer-0.7.2_torch-2.14.1_cuda-13.0"


def test_no_api_key_means_no_config_file():
    profile = _with(host="127.0.0.1", api_key_file=None)
    launch = build_launch(profile, "0.5.23")
    assert "--config" not in launch.server_args and launch.secrets_config is None
