"""Helpers for the patch tests: throwaway SGLang installations built from the test environment.

A throwaway target is a venv of the SGLang test environment's interpreter with its own copy of
``sglang/`` and ``sglang-0.5.23.dist-info/`` in site-packages and a ``.pth`` listing the shared
environment's site-packages (dependencies resolve there; the copy comes first on sys.path).
The shared environment is only read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "patch_scripts"


def site_packages_of(python: str) -> Path:
    """The folder holding ``python``'s ``sglang`` package (its own copy first), else its purelib."""
    code = ("import importlib.util, os, sysconfig; s = importlib.util.find_spec('sglang'); "
            "print(os.path.dirname(list(s.submodule_search_locations)[0]) if s else sysconfig.get_paths()['purelib'])")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def make_target(sglang_python: str, directory: Path, *, bytecode: bool = False) -> str:
    """Build a throwaway SGLang installation in ``directory``; returns its python.

    ``bytecode``: also copy ``__pycache__`` (faster imports for behaviour tests).
    """
    shared = site_packages_of(sglang_python)
    subprocess.run([sglang_python, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = str(directory / "bin" / "python")
    site = site_packages_of(python)
    ignore = None if bytecode else shutil.ignore_patterns("__pycache__")
    shutil.copytree(shared / "sglang", site / "sglang", ignore=ignore, symlinks=True)
    shutil.copytree(shared / "sglang-0.5.23.dist-info", site / "sglang-0.5.23.dist-info")
    (site / "zz-kimi-deploy-shared-env.pth").write_text(f"{shared}\n")
    return python


def patched_target(sglang_python: str, directory: Path, *, with_: list[str] | None = None,
                   bytecode: bool = False) -> tuple[str, Path]:
    """A throwaway SGLang installation in ``directory/venv`` with the series applied (defaults plus
    ``with_``) and verified; returns ``(python, state_dir)`` (the record is under ``directory/state``)."""
    from kimi_deploy import patching

    python = make_target(sglang_python, directory / "venv", bytecode=bytecode)
    state = directory / "state"
    patching.apply(python, with_=with_, state_dir=state)
    assert patching.verify(python, state_dir=state).state == "applied"
    return python, state


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), ``__pycache__`` excluded."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def run_json(python: str, script: str, *args: str, timeout: float = 180) -> dict:
    """Run ``tests/patch_scripts/<script>`` in ``python``; the JSON object on its last stdout line."""
    done = subprocess.run([python, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env={"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                                "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def release_target(sglang_python: str, directory: Path, version: str) -> str:
    """A throwaway environment of another SGLang release in ``directory``; returns its python.

    A venv of the test environment's interpreter whose own site-packages gets ``sglang==version`` alone
    (``pip install --no-deps --target``: the sglang package only, from the configured index) and a ``.pth``
    listing the test environment's site-packages for the dependencies, as :func:`make_target` does.
    """
    shared = site_packages_of(sglang_python)
    subprocess.run([sglang_python, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = str(directory / "bin" / "python")
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([sglang_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(site), f"sglang=={version}"], check=True,
                   timeout=600)
    (site / "zz-kimi-deploy-shared-env.pth").write_text(f"{shared}\n")
    return python
