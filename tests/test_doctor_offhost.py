"""doctor off the GPU host (issue #30 item 1): with no SGLang and no GPU, the reference preset's gated features
(fusion, torch symm mem: opt-in SM120 patches) still get their rows, read from the profile and the patch series
it renders for, and say "not checked on this host" rather than nothing."""

from __future__ import annotations

from helpers import run_cli


def test_gate_rows_come_from_the_profile_when_sglang_is_unknown(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    path.write_text(path.read_text().replace('python = "/opt/sglang/.venv/bin/python"',
                                             f'python = "{tmp_path}/no-such/python"'))
    result = run_cli(["doctor", "--profile", str(path)])
    out = " ".join(result.output.split())
    for row, patch in (("sglang.flashinfer_allreduce_fusion_backend", "sm120-flashinfer-allreduce-fusion"),
                       ("sglang.enable_torch_symm_mem", "sm120-torch-symm-mem")):
        assert row in out, out[-3000:]
        assert f"needs patch {patch}" in out
    assert "not checked on this host" in out and "SGLang 0.5.23 patch series" in out
