"""scripts/sglang-testenv's choice of base interpreter (issue 13 item 6): the kit runs on Python >= 3.11,
the SGLang test environment needs 3.11; the refusal says so, and how to get one, before anything is built.

The interpreter it finds is a stand-in that reports 3.12 (PATH and KIMI_DEPLOY_SGLANG_BASE_PYTHON), so
the script stops at its version check: nothing is created, nothing is downloaded.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "sglang-testenv"


def fake_python(folder: Path, name: str, version: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("via", ["path", "env"])
def test_a_python_other_than_311_is_refused_with_the_way_out(tmp_path, via):
    bin_dir = tmp_path / "bin"
    fake_python(bin_dir, "python3.11", "3.12")  # what the script finds on PATH
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "KIMI_DEPLOY_SGLANG_ENV": str(tmp_path / "env")}
    env.pop("KIMI_DEPLOY_SGLANG_BASE_PYTHON", None)
    chosen = bin_dir / "python3.11"
    if via == "env":
        chosen = fake_python(tmp_path / "other", "python", "3.12")
        env["KIMI_DEPLOY_SGLANG_BASE_PYTHON"] = str(chosen)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert f"{chosen} is Python 3.12" in done.stderr
    assert "the kit itself runs on >= 3.11" in done.stderr and "KIMI_DEPLOY_SGLANG_BASE_PYTHON" in done.stderr
    assert not (tmp_path / "env").exists()
