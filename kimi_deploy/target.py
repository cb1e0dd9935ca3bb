"""Gateway to the target interpreter: the Python that SGLang is installed in.

kimi-deploy never imports sglang, torch or flashinfer itself (SGLang pins its own
openai/transformers versions). Instead it runs a small script in the target
interpreter through :func:`kimi_deploy.proc.run` and reads one JSON object back
from the last line of stdout. Every module that needs facts from the SGLang
installation goes through :func:`run_script` / :func:`probe`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import proc
from kimi_deploy.errors import ExternalCommandError, UsageError

#: Runs inside the target interpreter; standard library only until torch is asked for.
PROBE_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, os, sys
want_torch = sys.argv[1] == "1"
out = {"python": sys.executable, "python_version": ".".join(map(str, sys.version_info[:3])),
       "packages": {}, "sglang_location": None, "torch": None}
for dist in ("sglang", "torch", "flashinfer-python", "flashinfer_python", "transformers", "triton",
             "nvidia-nccl-cu12", "nvidia-nccl-cu13", "openai", "xgrammar"):
    try:
        out["packages"][dist.replace("_", "-")] = md.version(dist)
    except md.PackageNotFoundError:
        pass
spec = importlib.util.find_spec("sglang")
if spec is not None and spec.submodule_search_locations:
    out["sglang_location"] = os.path.realpath(list(spec.submodule_search_locations)[0])
if want_torch and "torch" in out["packages"]:
    try:
        import torch
        info = {"version": torch.__version__, "cuda": torch.version.cuda,
                "arch_list": list(torch.cuda.get_arch_list()) if hasattr(torch.cuda, "get_arch_list") else [],
                "cuda_available": bool(torch.cuda.is_available()), "nccl": None}
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:
            info["nccl_error"] = repr(exc)[:200]
        out["torch"] = info
    except Exception as exc:
        out["torch"] = {"error": repr(exc)[:500]}
print(json.dumps(out))
"""


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """What :func:`probe` learnt about the target interpreter.

    ``packages`` maps distribution name (``sglang``, ``torch``, ``flashinfer-python``,
    ``transformers``, ``triton``, ``nvidia-nccl-cu13``, ...) to version; absent = not
    installed. ``sglang_location`` is the real path of the ``sglang`` package folder.
    ``torch`` holds ``version``, ``cuda`` (e.g. ``"13.0"``), ``arch_list``
    (``["sm_90", "sm_120", ...]``), ``nccl`` when torch was probed, else ``None``.
    """

    python: str
    python_version: str
    packages: dict[str, str]
    sglang_location: str | None
    torch: dict[str, Any] | None

    @property
    def sglang_version(self) -> str | None:
        return self.packages.get("sglang")

    def components(self) -> dict[str, str]:
        """Stack versions for the cache key: ``flashinfer``, ``torch``, ``cuda`` (those known)."""
        out = {}
        if fi := self.packages.get("flashinfer-python"):
            out["flashinfer"] = fi
        if self.torch and self.torch.get("version"):
            out["torch"] = str(self.torch["version"]).split("+")[0]
        elif tv := self.packages.get("torch"):
            out["torch"] = tv.split("+")[0]
        if self.torch and self.torch.get("cuda"):
            out["cuda"] = str(self.torch["cuda"])
        return out


def check_interpreter(python: str | Path) -> str:
    """Validate that ``python`` is an existing executable file; returns it as str.

    Raises:
        UsageError: missing or not executable (exit 2).
    """
    path = Path(python)
    if not path.exists():
        raise UsageError("the SGLang interpreter does not exist", value=str(python),
                         hint="pass --python with the interpreter of SGLang's virtual environment "
                              "(e.g. /opt/sglang/.venv/bin/python) or fix [service] python in the profile")
    if not path.is_file() or not (path.stat().st_mode & 0o111):
        raise UsageError("the SGLang interpreter is not an executable file", value=str(python),
                         hint="point --python at the python binary itself, not its folder")
    return str(python)


def run_script(python: str | Path, script: str, args: Sequence[str] = (), *,
               timeout: float = 180.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script`` with ``python -c`` and return the JSON object printed on its last stdout line.

    Args:
        python: the target interpreter.
        script: Python source; must print one JSON object as its last line.
        args: ``sys.argv[1:]`` of the script.
        timeout: seconds.
        env: extra environment variables (``HF_HUB_OFFLINE=1`` is always set).

    Raises:
        UsageError: the interpreter is missing.
        ExternalCommandError: the script failed or printed no JSON.
    """
    interpreter = check_interpreter(python)
    extra = {"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    done = proc.run([interpreter, "-c", script, *args], extra_env=extra, timeout=timeout,
                    hint="run the command shown by hand to see the whole error")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ExternalCommandError("the target interpreter printed no JSON result", command=done.command,
                                   stderr=done.stderr + done.stdout) from None
    if not isinstance(data, dict):
        raise ExternalCommandError("the target interpreter printed JSON that is not an object",
                                   command=done.command, stderr=done.stdout)
    return data


def probe(python: str | Path, *, with_torch: bool = False) -> TargetInfo:
    """Versions and locations in the target interpreter (sglang, torch, flashinfer, ...).

    ``with_torch`` imports torch there (slower, seconds) for its CUDA version, arch
    list and NCCL version.

    Raises:
        UsageError / ExternalCommandError: as :func:`run_script`.
    """
    data = run_script(python, PROBE_SCRIPT, ["1" if with_torch else "0"])
    return TargetInfo(python=data["python"], python_version=data["python_version"],
                      packages=data["packages"], sglang_location=data["sglang_location"], torch=data["torch"])


def require_sglang(info: TargetInfo) -> tuple[str, str]:
    """``(version, location)`` of SGLang in ``info``.

    Raises:
        UsageError: SGLang is not installed in that interpreter.
    """
    if not info.sglang_version or not info.sglang_location:
        raise UsageError("SGLang is not installed in the target interpreter", value=info.python,
                         hint="pass --python with the interpreter SGLang is installed in")
    return info.sglang_version, info.sglang_location
