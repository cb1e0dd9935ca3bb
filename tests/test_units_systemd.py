"""Rendered units pass the real `systemd-analyze verify` and meet the exposure thresholds.

Thresholds (`systemd-analyze security --offline=yes`, systemd 252): <= 3.0 at
`standard`, <= 2.0 at `strict`; Ollama's published unit scores 9.2 for comparison.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import MINIMAL, run_cli, write_profile

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")

TRUE = shutil.which("true") or "/bin/true"


def _render(tmp_path: Path, hardening: str) -> Path:
    """Render a preset-like profile whose ExecStart= binaries exist on this machine."""
    text = MINIMAL.replace('python = "/opt/sglang/.venv/bin/python"',
                           f'python = "{sys.executable}"\nkimi_deploy = "{TRUE}"\nhardening = "{hardening}"')
    text = text.replace("tp_size = 8", 'tp_size = 8\nhost = "0.0.0.0"\napi_key_file = "/etc/kimi-deploy/k.api-key"\n'
                        'tool_call_parser = "kimi_k2"\nreasoning_parser = "kimi_k2"')
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def _exposure(unit: Path) -> float:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                          capture_output=True, text=True)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


@pytest.mark.parametrize("hardening", ["standard", "strict"])
def test_every_rendered_unit_passes_verify(tmp_path, hardening):
    out = _render(tmp_path, hardening)
    units = sorted(str(p) for p in out.iterdir() if p.suffix in (".service", ".timer"))
    assert len(units) == 3
    done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


def test_verify_catches_a_broken_unit(tmp_path):
    """The verify test can fail: a missing ExecStart binary is reported."""
    out = _render(tmp_path, "standard")
    unit = out / "kimi-k25.service"
    unit.write_text(unit.read_text().replace(sys.executable, "/nonexistent/python"))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert done.returncode != 0


@pytest.mark.parametrize("hardening,limit", [("standard", 3.0), ("strict", 2.0)])
def test_server_unit_exposure(tmp_path, hardening, limit):
    score = _exposure(_render(tmp_path, hardening) / "kimi-k25.service")
    assert score <= limit, f"{hardening}: exposure {score} > {limit}"


def test_strict_is_tighter_than_standard(tmp_path):
    standard = _exposure(_render(tmp_path / "a", "standard") / "kimi-k25.service")
    strict = _exposure(_render(tmp_path / "b", "strict") / "kimi-k25.service")
    assert strict < standard


def test_check_unit_exposure(tmp_path):
    assert _exposure(_render(tmp_path, "standard") / "kimi-deploy-check@kimi-k25.service") <= 2.0


def test_check_unit_memory_is_bounded(tmp_path):
    """The nightly check runs with a hard memory bound, swap included (docs/design.md#memory-bound-of-the-nightly-check: how the bound was
    measured); `systemd-analyze verify` (above) accepts both directives."""
    unit = (_render(tmp_path, "standard") / "kimi-deploy-check@kimi-k25.service").read_text()
    service = unit.split("[Service]", 1)[1]
    assert re.search(r"^MemoryMax=2G$", service, re.M) and re.search(r"^MemorySwapMax=0$", service, re.M)


def test_strict_lists_every_gpu_device(tmp_path):
    unit = (_render(tmp_path, "strict") / "kimi-k25.service").read_text()
    for node in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset", "/dev/nvidia0", "/dev/nvidia7"]:
        assert f"DeviceAllow={node} rw" in unit
    assert "DeviceAllow=/dev/nvidia8 " not in unit
    assert "DevicePolicy=closed" in unit


@pytest.mark.parametrize("hardening", ["standard", "strict"])
def test_no_directive_known_to_break_cuda(tmp_path, hardening):
    unit = (_render(tmp_path, hardening) / "kimi-k25.service").read_text()
    active = [l for l in unit.splitlines() if l and not l.startswith("#")]
    for directive in ("PrivateDevices=", "MemoryDenyWriteExecute=", "ProcSubset=", "PrivateNetwork=",
                      "PrivateUsers="):
        assert not any(l.startswith(directive) for l in active), directive
    assert "LimitMEMLOCK=infinity" in active
