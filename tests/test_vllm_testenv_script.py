"""scripts/vllm-testenv refuses a base interpreter other than Python 3.11 before building anything, and says how
to get one or reuse an existing env (as scripts/sglang-testenv does: tests/test_sglang_testenv_script.py).

The interpreter it finds is a stand-in that reports 3.12, so the script stops at its version check: nothing is
created, nothing is downloaded.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_sglang_testenv_script import fake_python

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "vllm-testenv"


@pytest.mark.parametrize("via", ["path", "env"])
def test_a_python_other_than_311_is_refused_with_the_way_out(tmp_path, via):
    bin_dir = tmp_path / "bin"
    fake_python(bin_dir, "python3.11", "3.12")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "KIMI_DEPLOY_VLLM_ENV": str(tmp_path / "env"),
           "TMPDIR": str(tmp_path)}
    env.pop("KIMI_DEPLOY_VLLM_BASE_PYTHON", None)
    chosen = bin_dir / "python3.11"
    if via == "env":
        chosen = fake_python(tmp_path / "other", "python", "3.12")
        env["KIMI_DEPLOY_VLLM_BASE_PYTHON"] = str(chosen)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert f"{chosen} is Python 3.12" in done.stderr and "vLLM 0.33.0 test environment" in done.stderr
    assert "KIMI_DEPLOY_VLLM_BASE_PYTHON" in done.stderr and "KIMI_DEPLOY_VLLM_PYTHON" in done.stderr
    assert not (tmp_path / "env").exists()
    assert done.stdout == ""  # nothing for scripts/test to take as an interpreter


def test_the_env_is_reused_while_its_stamp_matches(tmp_path):
    """A second run against a current env prints its python and builds nothing (scripts/test calls it every run)."""
    env_dir = REPO / ".vllm-env"
    if not (env_dir / ".kimi-deploy-vllm-testenv.stamp").exists():
        pytest.skip("no built vLLM test environment at .vllm-env (scripts/vllm-testenv builds it)")
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KIMI_DEPLOY_VLLM_ENV": str(env_dir)})
    assert done.returncode == 0 and "reusing" in done.stderr
    assert done.stdout.splitlines()[-1] == str(env_dir / "bin" / "python")
