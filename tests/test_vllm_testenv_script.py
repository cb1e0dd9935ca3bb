"""scripts/vllm-testenv and scripts/litellm-testenv refuse a base interpreter other than Python 3.11 before
building anything, and say how to get one or reuse an existing env (as scripts/sglang-testenv does:
tests/test_sglang_testenv_script.py); a built env is reused while its stamp matches.

The interpreter they find is a stand-in that reports 3.12, so each script stops at its version check: nothing
is created, nothing is downloaded.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_sglang_testenv_script import fake_python

REPO = Path(__file__).resolve().parent.parent

#: (script, its environment variables' infix, what the refusal names, the default env folder)
SCRIPTS = [("vllm-testenv", "VLLM", "vLLM 0.33.0 test environment", ".vllm-env"),
           ("litellm-testenv", "LITELLM", "LiteLLM 1.108.7 test environment", ".litellm-env")]


@pytest.mark.parametrize("script,var,label,_folder", SCRIPTS)
@pytest.mark.parametrize("via", ["path", "env"])
def test_a_python_other_than_311_is_refused_with_the_way_out(tmp_path, via, script, var, label, _folder):
    bin_dir = tmp_path / "bin"
    fake_python(bin_dir, "python3.11", "3.12")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", f"KIMI_DEPLOY_{var}_ENV": str(tmp_path / "env"),
           "TMPDIR": str(tmp_path)}
    env.pop(f"KIMI_DEPLOY_{var}_BASE_PYTHON", None)
    chosen = bin_dir / "python3.11"
    if via == "env":
        chosen = fake_python(tmp_path / "other", "python", "3.12")
        env[f"KIMI_DEPLOY_{var}_BASE_PYTHON"] = str(chosen)
    done = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 1
    assert f"{chosen} is Python 3.12" in done.stderr and label in done.stderr
    assert f"KIMI_DEPLOY_{var}_BASE_PYTHON" in done.stderr and f"KIMI_DEPLOY_{var}_PYTHON" in done.stderr
    assert not (tmp_path / "env").exists()
    assert done.stdout == ""  # nothing for scripts/test to take as an interpreter


@pytest.mark.parametrize("script,var,label,folder", SCRIPTS)
def test_the_env_is_reused_while_its_stamp_matches(script, var, label, folder):
    """A second run against a current env prints its python and builds nothing (scripts/test calls it every run)."""
    env_dir = REPO / folder
    if not any(env_dir.glob(".kimi-deploy-*-testenv.stamp")):
        pytest.skip(f"no built environment at {folder} (scripts/{script} builds it)")
    done = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, f"KIMI_DEPLOY_{var}_ENV": str(env_dir)})
    assert done.returncode == 0 and "reusing" in done.stderr
    assert done.stdout.splitlines()[-1] == str(env_dir / "bin" / "python")
