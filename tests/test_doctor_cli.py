"""``kimi-deploy doctor`` end to end: fake nvidia-smi on PATH (real subprocess path), real
model directories, a real port bind, an installed unit under --root."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest
from doctor_helpers import install_fake_nvidia_smi, make_model_dir

from kimi_deploy import engine
from kimi_deploy.targets import systemd as render_lib
from kimi_deploy.cli import cli
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile

PRESET = "kimi-k25-rtx-pro-6000-x8"


def toml_profile(path: Path, data: dict) -> Path:
    lines = []
    for section in ("service", "sglang", "environment"):
        lines.append(f"[{section}]")
        for key, value in data.get(section, {}).items():
            lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    """An empty PATH of its own: only what a test puts there (a fake nvidia-smi) is found."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", str(d))
    return d


@pytest.fixture
def host(tmp_path) -> dict:
    """A profile on tiny local models, a free loopback port and a cache dir under tmp."""
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"]["model_path"] = str(make_model_dir(tmp_path / "models" / "kimi", 3))
    data["sglang"]["speculative_draft_model_path"] = str(make_model_dir(tmp_path / "models" / "draft", 1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        data["sglang"]["port"] = s.getsockname()[1]
    data["sglang"]["host"] = "127.0.0.1"
    data["service"]["cache_dir"] = str(tmp_path / "cache")
    data["environment"]["NCCL_P2P_LEVEL"] = "SYS"
    return {"data": data, "path": toml_profile(tmp_path / "kimi.toml", data), "root": tmp_path / "root"}


def doctor(cli_runner, *args):
    result = cli_runner.invoke(cli, ["doctor", *map(str, args)], catch_exceptions=False)
    return result


def test_cpu_machine_no_nvidia_smi(cli_runner, bin_dir):
    result = doctor(cli_runner, "--preset", PRESET)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "FAIL  gpu.devices" in result.output
    assert "no NVIDIA GPU: nvidia-smi not found on PATH" in result.output
    assert "fix: run doctor on the serving host" in result.output
    assert result.output.rstrip().endswith("failed")


def test_json_report(cli_runner, bin_dir):
    result = doctor(cli_runner, "--preset", PRESET, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["profile"] == "kimi-k25"
    names = [c["name"] for c in report["checks"]]
    assert names[:3] == ["gpu.devices", "gpu.compute_capability", "gpu.memory"]
    assert {"model", "draft_model", "sglang", "sglang.patches", "sglang.flags", "disk.cache", "port",
            "unit.installed"} <= set(names)
    for check in report["checks"]:
        assert check["status"] in ("pass", "warn", "fail") and check["evidence"]
        if check["status"] != "pass":
            assert check["hint"]


def test_driver_not_loaded(cli_runner, bin_dir):
    install_fake_nvidia_smi(bin_dir, None, error_file="driver-not-loaded.txt", returncode=9)
    report = json.loads(doctor(cli_runner, "--preset", PRESET, "--json").stdout)
    gpu = next(c for c in report["checks"] if c["name"] == "gpu.devices")
    assert gpu["status"] == "fail"
    assert "couldn't communicate with the NVIDIA driver" in gpu["evidence"]
    assert "nvidia-smi --query-gpu=" in gpu["evidence"]


def test_four_gpus_tp8_fails(cli_runner, bin_dir, host):
    install_fake_nvidia_smi(bin_dir, "query-4x-workstation-580.csv", "topo-4x-workstation.txt")
    result = doctor(cli_runner, "--profile", host["path"], "--root", host["root"], "--python", "/nonexistent/python")
    assert result.exit_code == 1
    assert "FAIL  gpu.devices" in result.output
    assert "4 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition; tp_size 8 needs 8" in result.output


def test_reference_host_with_sglang_env(cli_runner, bin_dir, host, sglang_python, tmp_path, monkeypatch):
    """8x RTX PRO 6000 (recorded), real SGLang 0.5.23 interpreter, complete tiny models, installed unit."""
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    install_fake_nvidia_smi(bin_dir, "query-8x-server-580.csv", "topo-8x-dual-socket.txt")
    profile = parse_profile(host["data"])
    version, components = engine.target_versions(sglang_python)
    rendered = render_lib.render(profile, version, components=components)
    svc_dir = host["root"] / "etc/systemd/system"
    env_dir = host["root"] / "etc/kimi-deploy"
    svc_dir.mkdir(parents=True)
    env_dir.mkdir(parents=True)
    (svc_dir / rendered.service_unit).write_text(rendered.files[rendered.service_unit])
    (env_dir / rendered.env_file).write_text(rendered.files[rendered.env_file])

    result = doctor(cli_runner, "--profile", host["path"], "--root", host["root"], "--python", sglang_python,
                    "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    status = {name: c["status"] for name, c in checks.items()}
    assert status["gpu.devices"] == status["gpu.compute_capability"] == status["gpu.memory"] == "pass"
    assert status["driver"] == "pass"                      # 580.95.05 vs torch 2.14.1+cu130
    assert "CUDA 13.0 needs driver >= 580.65.06" in checks["driver"]["evidence"]
    # The fake GPUs are not visible to the real torch: a true finding, reported as such.
    assert status["torch.arch"] == "fail" and "is_available() is False" in checks["torch.arch"]["evidence"]
    assert status["pcie.topology"] == "pass" and "NCCL_P2P_LEVEL=SYS" in checks["pcie.topology"]["evidence"]
    assert status["model"] == status["draft_model"] == "pass"
    assert status["sglang"] == "pass" and "SGLang 0.5.23" in checks["sglang"]["evidence"]
    assert status["sglang.flags"] == "pass"
    assert status["port"] == "pass"
    assert status["unit.installed"] == "pass", checks["unit.installed"]
    # The test environment's SGLang is unpatched: `patch verify` (the unit's ExecStartPre=) exits 1 there,
    # and the preset's fusion/torch symm mem meet SGLang's SM90/SM100-only gates on these SM120 GPUs.
    assert status["sglang.patches"] == "fail" and "not applied" in checks["sglang.patches"]["evidence"]
    assert checks["sglang.patches"]["hint"].startswith("`kimi-deploy patch apply --python ")
    assert status["sglang.flashinfer_allreduce_fusion_backend"] == "fail"
    assert status["sglang.enable_torch_symm_mem"] == "warn"
    assert result.exit_code == 1



def test_installed_unit_same_then_drifted(cli_runner, bin_dir, host):
    """Installed files compared with a fresh render (default SGLang version: no interpreter here)."""
    profile = parse_profile(host["data"])
    rendered = render_lib.render(profile)
    unit = host["root"] / "etc/systemd/system" / rendered.service_unit
    env = host["root"] / "etc/kimi-deploy" / rendered.env_file
    for path, name in ((unit, rendered.service_unit), (env, rendered.env_file)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered.files[name])
    args = ("--profile", host["path"], "--root", host["root"], "--python", "/nonexistent/python", "--json")
    same = {c["name"]: c for c in json.loads(doctor(cli_runner, *args).stdout)["checks"]}
    assert same["unit.installed"]["status"] == "pass"

    # Drift: the installed unit still has an old port.
    unit.write_text(unit.read_text().replace(f"--port {profile.sglang.port}", "--port 30001"))
    drift = {c["name"]: c for c in json.loads(doctor(cli_runner, *args).stdout)["checks"]}["unit.installed"]
    assert drift["status"] == "fail"
    assert f"{rendered.service_unit}: +1 -1 lines, first `+ --port {profile.sglang.port} \\`" in drift["evidence"]
    assert "-    --port 30001 \\" in drift["details"]

    env.unlink()
    half = {c["name"]: c for c in json.loads(doctor(cli_runner, *args).stdout)["checks"]}["unit.installed"]
    assert half["status"] == "fail" and half["evidence"].startswith(f"{rendered.env_file} missing")


def test_port_in_use_and_missing_shard(cli_runner, bin_dir, host, tmp_path):
    install_fake_nvidia_smi(bin_dir, "query-8x-server-580.csv", "topo-8x-dual-socket.txt")
    shard = Path(host["data"]["sglang"]["model_path"]) / "model-00002-of-00003.safetensors"
    shard.unlink()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", host["data"]["sglang"]["port"]))
        busy.listen()
        result = doctor(cli_runner, "--profile", host["path"], "--root", host["root"], "--python", "/nonexistent/py")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()  # the report (stderr says the phases)
    port = next(line for line in lines if " port " in line)
    assert port.startswith("FAIL") and "Address already in use" in port
    model = next(line for line in lines if line.startswith("FAIL  model "))
    assert "1 of 3 shards missing (first: model-00002-of-00003.safetensors)" in model
    assert any(line.startswith("WARN  unit.installed") and "not installed" in line for line in lines)


def test_patches_follow_patch_verify(cli_runner, bin_dir, host, sglang_python, patched_sglang, tmp_path):
    """The doctor's sglang.patches agrees with `patch verify` (the unit's ExecStartPre=), on a real unpatched
    copy and on the session's patched copy (defaults + both SM120 opt-ins)."""
    from patch_helpers import make_target

    install_fake_nvidia_smi(bin_dir, "query-8x-server-580.csv", "topo-8x-dual-socket.txt")
    state = tmp_path / "state"
    pristine = make_target(sglang_python, tmp_path / "venv")

    def run(python, state_dir):
        verify = cli_runner.invoke(cli, ["patch", "verify", "--python", python, "--state-dir", str(state_dir)])
        result = doctor(cli_runner, "--profile", host["path"], "--root", host["root"], "--python", python,
                        "--state-dir", state_dir, "--json")
        return verify, {c["name"]: c for c in json.loads(result.stdout)["checks"]}, result.stdout

    verify, checks, _ = run(pristine, state)
    assert verify.exit_code == 1
    patches = checks["sglang.patches"]
    # the fix names the state directory the record was read from (doctor --state-dir), as patch verify needs it
    assert patches["status"] == "fail"
    assert f"`kimi-deploy patch apply --python {pristine} --state-dir {state}`" in patches["hint"]
    fusion = checks["sglang.flashinfer_allreduce_fusion_backend"]
    assert fusion["status"] == "fail"
    assert fusion["hint"].startswith(f"`kimi-deploy patch apply --python {pristine} --with "
                                     f"sm120-flashinfer-allreduce-fusion,sm120-torch-symm-mem --state-dir {state}`")
    assert checks["sglang.enable_torch_symm_mem"]["status"] == "warn"

    # verify_patches = false: the unit has no ExecStartPre=patch verify, so a warning
    data = copy.deepcopy(host["data"])
    data["service"]["verify_patches"] = False
    off = doctor(cli_runner, "--profile", toml_profile(tmp_path / "off.toml", data), "--root", host["root"],
                 "--python", pristine, "--state-dir", state, "--json")
    assert {c["name"]: c for c in json.loads(off.stdout)["checks"]}["sglang.patches"]["status"] == "warn"

    python, patched_state = patched_sglang
    verify, checks, out = run(python, patched_state)
    assert verify.exit_code == 0, verify.output
    assert checks["sglang.patches"]["status"] == "pass"
    assert checks["sglang.flashinfer_allreduce_fusion_backend"]["status"] == "pass"
    assert checks["sglang.enable_torch_symm_mem"]["status"] == "pass"


def test_ipv6_bind_address_is_bracketed(cli_runner, bin_dir, host, tmp_path):
    data = copy.deepcopy(host["data"])
    data["sglang"]["host"] = "::"
    data["sglang"]["api_key_file"] = "/etc/kimi-deploy/kimi-k25.api-key"
    result = doctor(cli_runner, "--profile", toml_profile(tmp_path / "v6.toml", data), "--root", host["root"],
                    "--python", "/nonexistent/python")
    port = next(line for line in result.output.splitlines() if line.split()[1:2] == ["port"])
    assert f"[::]:{data['sglang']['port']}" in port and ":::" not in port


def test_doctor_says_what_runs_now_on_stderr_off_a_terminal(cli_runner, bin_dir):
    """Issue 43 item 3: doctor printed nothing until the end. Off a terminal: one plain line per probe on stderr,
    the report on stdout."""
    result = doctor(cli_runner, "--preset", PRESET)
    phases = [line for line in result.stderr.splitlines() if line.startswith("doctor: ")]
    assert phases[:2] == ["doctor: reading the GPUs (nvidia-smi)",
                          "doctor: reading the fabric (ACS, IOMMU, uvm_disable_hmm, P2P)"]
    assert any(p.startswith("doctor: reading SGLang's interpreter ") for p in phases)
    assert phases[-1] == "doctor: reading the disk, the port and the installed unit"
    assert "doctor:" not in result.stdout and result.stdout.rstrip().endswith("failed")
