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
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import proc
from kimi_deploy.versions import DEFAULT_SGLANG_VERSION
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


def sglang_check_command(python: str | Path) -> str:
    """The shell line an operator runs to see whether ``python`` can import SGLang."""
    return f"{shlex.quote(str(python))} -c 'import sglang; print(sglang.__file__)'"


def interpreter_hint(python: str | Path) -> str:
    """The fix shown when ``python`` ran but did not answer like SGLang's interpreter."""
    return (f"is {python} SGLang's interpreter? `{sglang_check_command(python)}` must print SGLang's path; "
            "if not, pass --python with the python of SGLang's virtual environment or fix [service] python "
            "(`kimi-deploy -v ...` logs the full command that was run)")


def _missing_hint(path: Path) -> str:
    """A next step for a missing interpreter: a python beside it, or how to create the environment."""
    folder = path.parent
    beside = sorted(str(c) for c in folder.glob("python*") if c.is_file() and os.access(c, os.X_OK)) \
        if folder.is_dir() else []
    if beside:
        return f"{folder} holds {', '.join(beside)}: pass --python {beside[0]} or fix [service] python"
    venv = folder.parent if folder.name == "bin" else None
    create = (f"create the environment (`python3 -m venv {venv} && {venv}/bin/pip install "
              f"sglang=={DEFAULT_SGLANG_VERSION}`), or " if venv and not venv.exists() else "")
    return (f"{create}find SGLang's interpreter where SGLang is installed "
            "(`python3 -c 'import sglang, sys; print(sys.executable)'` in that environment) and pass it "
            "with --python or set [service] python")


def check_interpreter(python: str | Path) -> str:
    """Validate that ``python`` is an existing executable file; returns it as str.

    Raises:
        UsageError: missing, a folder, or a file without execute permission (exit 2); the
            hint names a next step for each case.
    """
    path = Path(python)
    if not path.exists():
        raise UsageError("the SGLang interpreter does not exist", value=str(python), hint=_missing_hint(path))
    if path.is_dir():
        inside = next((str(c) for c in (path / "bin" / "python", path / "bin" / "python3", path / "python")
                       if c.is_file()), None)
        raise UsageError("the SGLang interpreter is a folder, not a program", value=str(python),
                         hint=(f"pass the python binary inside it: --python {inside}" if inside else
                               "pass the python binary of SGLang's virtual environment (VENV/bin/python), "
                               "not a folder"))
    if not path.is_file() or not (path.stat().st_mode & 0o111):
        raise UsageError("the SGLang interpreter is not executable (a file without execute permission)",
                         value=str(python),
                         hint="pass the python binary of SGLang's virtual environment (VENV/bin/python); "
                              f"`ls -l {shlex.quote(str(python))}` shows its mode")
    return str(python)


def run_script(python: str | Path, script: str, args: Sequence[str] = (), *,
               timeout: float = 180.0, env: dict[str, str] | None = None,
               label: str = "script", stream_stderr: bool = False) -> dict[str, Any]:
    """Run ``script`` with ``python -c`` and return the JSON object printed on its last stdout line.

    Args:
        python: the target interpreter.
        script: Python source; must print one JSON object as its last line.
        args: ``sys.argv[1:]`` of the script.
        timeout: seconds.
        env: extra environment variables (``HF_HUB_OFFLINE=1`` is always set).
        label: how errors show the script (``python -c <label> ARGS``; the full command is
            logged with ``-v``).
        stream_stderr: the script's stderr (progress lines) goes to this process's stderr as it is
            written instead of into the error (:func:`kimi_deploy.proc.run`).

    Raises:
        UsageError: the interpreter is missing, a folder or not executable.
        ExternalCommandError: the script failed or printed no JSON; the error shows the
            command with the script abbreviated, stdout and stderr under their own labels, and
            how to check that ``python`` is SGLang's interpreter.
    """
    interpreter = check_interpreter(python)
    extra = {"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    display = [interpreter, "-c", f"<{label}>", *args]
    hint = interpreter_hint(interpreter)
    done = proc.run([interpreter, "-c", script, *args], extra_env=extra, timeout=timeout, hint=hint,
                    display=display, stream_stderr=stream_stderr)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ExternalCommandError(
            "the target interpreter printed no JSON result" + ("" if lines else " (no output at all)"),
            command=done.shown, returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
            hint=hint) from None
    if not isinstance(data, dict):
        raise ExternalCommandError("the target interpreter printed JSON that is not an object",
                                   command=done.shown, returncode=done.returncode, stdout=done.stdout,
                                   stderr=done.stderr, hint=hint)
    return data


def probe(python: str | Path, *, with_torch: bool = False) -> TargetInfo:
    """Versions and locations in the target interpreter (sglang, torch, flashinfer, ...).

    ``with_torch`` imports torch there (slower, seconds) for its CUDA version, arch
    list and NCCL version.

    Raises:
        UsageError / ExternalCommandError: as :func:`run_script`.
    """
    data = run_script(python, PROBE_SCRIPT, ["1" if with_torch else "0"], label="probe script")
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


def target_versions(python: str) -> tuple[str, dict[str, str]]:
    """SGLang version and cache-key components (``flashinfer``, ``torch``, ``cuda``) found in ``python``.

    Imports torch in the target interpreter (:func:`probe` with torch) so
    that the CUDA version is known.

    Raises:
        UsageError: the interpreter is missing or has no SGLang.
        ExternalCommandError: the interpreter failed.
    """
    info = probe(python, with_torch=True)
    version, _ = require_sglang(info)
    return version, info.components()
