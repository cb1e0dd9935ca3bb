"""``kimi-deploy doctor`` end to end: fake nvidia-smi on PATH (real subprocess path), real
model directories, a real port bind, an installed unit under --root."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path

import pytest
from doctor_helpers import install_fake_nvidia_smi, make_model_dir

from kimi_deploy import render as render_lib
from kimi_deploy.cli import cli
from kimi_deploy.presets import get_preset
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


def test_reference_host_with_sglang_env(cli_runner, bin_dir, host, sglang_python):
    """8x RTX PRO 6000 (recorded), real SGLang 0.5.23 interpreter, complete tiny models, installed unit."""
    install_fake_nvidia_smi(bin_dir, "query-8x-server-580.csv", "topo-8x-dual-socket.txt")
    profile = parse_profile(host["data"])
    version, components = render_lib.target_versions(sglang_python)
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
    lines = result.output.splitlines()
    port = next(line for line in lines if " port " in line)
    assert port.startswith("FAIL") and "Address already in use" in port
    model = next(line for line in lines if line.startswith("FAIL  model "))
    assert "1 of 3 shards missing (first: model-00002-of-00003.safetensors)" in model
    assert any(line.startswith("WARN  unit.installed") and "not installed" in line for line in lines)
