"""``kimi-deploy status``: one report of the installed service.

Sources: the manifest and files (:mod:`kimi_deploy.hostfiles`), ``systemctl show`` (unit state,
MainPID, NRestarts), the running launch command (SGLang 0.5.23 ``GET /server_info`` field
``launch_command``, else ``/proc/<MainPID>/cmdline``) compared with a fresh render, the patch
series state (:func:`patch_state`), ``GET /health_generate``, and the nightly check's
``/var/lib/<name>/check-report.json``.

SGLang 0.5.23 builds ``launch_command`` after merging the ``--config`` YAML into argv
(``srt/server_args.py`` ``prepare_server_args``), so it contains ``--api-key <key>`` and lacks
``--config``: :func:`normalize_args` drops both before comparing, and :func:`redact` hides key values.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from kimi_deploy import systemd
from kimi_deploy.errors import ExitCode, KimiDeployError
from kimi_deploy.hostfiles import Manifest, read_bytes, sha256
from kimi_deploy.patching import status as series_status
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile
from kimi_deploy.readiness import get_json, probe_ready
from kimi_deploy.render import render
from kimi_deploy.restart import read_api_key

#: Options whose value is a secret (SGLang 0.5.23 ``--api-key``, ``--admin-api-key``).
SECRET_OPTIONS = ("--api-key", "--admin-api-key")
#: Options that differ between the unit's argv and SGLang's merged ``launch_command`` by design.
IGNORED_OPTIONS = ("--config", *SECRET_OPTIONS)


def redact(args: list[str]) -> list[str]:
    """``args`` with the value of every secret option replaced by ``<redacted>``."""
    out, hide = [], False
    for arg in args:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg in SECRET_OPTIONS:
            out.append(arg)
            hide = True
        elif arg.startswith(tuple(o + "=" for o in SECRET_OPTIONS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def _entries(args: list[str]) -> list[str]:
    """Group argv into ``--flag value`` / ``--flag`` entries (``--flag=value`` split), ignored options dropped."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        if arg.startswith("--") and eq:
            entry, i = [flag, value], i + 1
        elif arg.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            entry, i = [arg, args[i + 1]], i + 2
        else:
            entry, i = [arg], i + 1
        if entry[0] not in IGNORED_OPTIONS:
            out.append(" ".join(entry))
    return out


def normalize_args(args: list[str]) -> list[str]:
    """Server arguments as sorted ``--flag value`` entries, without ``--config`` and secret options."""
    return sorted(_entries(args))


def server_args_from_cmdline(argv: list[str]) -> list[str] | None:
    """The SGLang server arguments in a process's argv (after ``-m sglang.launch_server`` or
    ``.../launch_server.py``), or None when it is not an SGLang server."""
    for i, arg in enumerate(argv):
        if arg in ("sglang.launch_server", "sglang.srt.server") or arg.endswith("launch_server.py"):
            return argv[i + 1:]
    return None


@dataclasses.dataclass(frozen=True)
class Drift:
    """Running launch vs a fresh render: ``missing`` (rendered, not running), ``unexpected`` (running only)."""

    source: str
    running: list[str]
    missing: list[str]
    unexpected: list[str]

    @property
    def in_sync(self) -> bool:
        return not self.missing and not self.unexpected

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "in_sync": self.in_sync, "running": self.running,
                "missing": self.missing, "unexpected": self.unexpected}


def compare_launch(running_args: list[str], rendered_args: list[str], source: str) -> Drift:
    """Compare server arguments as multisets of ``--flag value`` entries (order-free: SGLang puts the
    ``--config`` values first)."""
    run, want = Counter(_entries(running_args)), Counter(_entries(rendered_args))
    return Drift(source, redact(running_args), sorted((want - run).elements()), sorted((run - want).elements()))


def running_launch(base_url: str, api_key: str | None, main_pid: int | None) -> tuple[list[str], str] | None:
    """``(server args, source)`` of the running server: ``/server_info`` ``launch_command``, else
    ``/proc/<pid>/cmdline``; None when neither is available."""
    info = get_json(base_url, "/server_info", api_key)
    if info and isinstance(info.get("launch_command"), str):
        return shlex.split(info["launch_command"]), "/server_info launch_command"
    if main_pid:
        raw = read_bytes(Path(f"/proc/{main_pid}/cmdline"))
        if raw:
            args = server_args_from_cmdline([a.decode(errors="replace") for a in raw.split(b"\0") if a])
            if args is not None:
                return args, f"/proc/{main_pid}/cmdline"
    return None


def patch_state(python: str) -> dict[str, Any]:
    """The patch series state of the SGLang in ``python`` (:func:`kimi_deploy.patching.status`, as a dict).

    ``state`` is one of applied, not_applied, drifted, partial, no_series; ``error`` (with
    ``detail``: the reason and the offending value) when the state cannot be read (the interpreter
    is missing or has no SGLang, a damaged record). The record is looked up in
    :func:`kimi_deploy.paths.patch_state_dir` (``$KIMI_DEPLOY_STATE_DIR``, else
    ``/var/lib/kimi-deploy``), where ``patch apply`` writes it.
    """
    try:
        return series_status(python).to_dict()
    except KimiDeployError as exc:
        value = f": {exc.value}" if exc.value is not None else ""
        return {"state": "error", "detail": exc.message + value}


def last_check(path: Path) -> dict[str, Any] | None:
    """Summary of the nightly check report at ``path``: time, exit code, counts by status; None when absent."""
    raw = read_bytes(path)
    if raw is None:
        return None
    when = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    try:
        data = json.loads(raw)
    except ValueError:
        return {"path": str(path), "modified_at": when, "exit_code": None, "detail": "not valid JSON"}
    results = data.get("results") if isinstance(data, dict) else None
    counts = Counter(str(r.get("status")) for r in results if isinstance(r, dict)) if isinstance(results, list) else {}
    return {"path": str(path), "modified_at": when,
            "exit_code": data.get("exit_code") if isinstance(data, dict) else None, "counts": dict(counts)}


@dataclasses.dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` found; ``problems`` lists what is wrong (empty: healthy, exit 0)."""

    service: str
    files: dict[str, str]
    unit: dict[str, Any] | None
    launch: Drift | None
    patches: dict[str, Any]
    health: dict[str, Any]
    last_check: dict[str, Any] | None
    problems: list[str]

    @property
    def exit_code(self) -> int:
        return int(ExitCode.FAILED if self.problems else ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "ok": not self.problems, "problems": self.problems, "files": self.files,
                "unit": self.unit, "launch": self.launch.to_dict() if self.launch else None,
                "patches": self.patches, "health": self.health, "last_check": self.last_check}


def file_states(layout: HostLayout, manifest: Manifest) -> dict[str, str]:
    """Host path -> ``ok`` | ``modified`` | ``missing`` for every file in the manifest."""
    out = {}
    for hp, record in sorted(manifest.files.items()):
        data = read_bytes(layout.under(hp))
        out[hp] = "missing" if data is None else ("ok" if sha256(data) == record.sha256 else "modified")
    return out


def status(profile: Profile, layout: HostLayout, manifest: Manifest) -> StatusReport:
    """Collect the status of ``profile``'s installed service (never raises for a down server)."""
    problems: list[str] = []
    unit_name = f"{profile.service.name}.service"
    files = file_states(layout, manifest)
    problems += [f"{hp} is {state}" for hp, state in files.items() if state != "ok"]
    unit = None
    try:
        state = systemd.show(unit_name)
        unit = state.to_dict()
        if not state.is_active:
            problems.append(f"{unit_name} is {state.active_state}/{state.sub_state}")
    except KimiDeployError as exc:
        problems.append(f"systemctl show failed: {exc.message}")
    try:
        api_key = read_api_key(profile, layout)
    except KimiDeployError as exc:
        problems.append(f"API key: {exc.message} ({exc.value})")
        api_key = None
    probe = probe_ready(profile.base_url, api_key)
    health = {"ready": probe.ready, "endpoint": probe.stage, "http_status": probe.http_status, "detail": probe.detail}
    if not probe.ready:
        problems.append(f"not ready: {probe.stage} {probe.detail}")
    rendered = render(profile, manifest.sglang_version)
    found = running_launch(profile.base_url, api_key, unit.get("main_pid") if unit else None)
    drift = None
    if found:
        drift = compare_launch(found[0], list(rendered.launch.server_args), found[1])
        if not drift.in_sync:
            problems.append("the running launch command differs from the profile (restart to apply, or re-install)")
    patches = patch_state(profile.service.python)
    if patches.get("state") in ("drifted", "partial", "error"):
        problems.append(f"patch series is {patches['state']}")
    check = last_check(layout.check_report(profile.service.name))
    if check and check.get("exit_code") not in (None, 0):
        problems.append(f"the last nightly check failed (exit {check['exit_code']})")
    return StatusReport(profile.service.name, files, unit, drift, patches, health, check, problems)
