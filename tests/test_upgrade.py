"""kimi-deploy upgrade from SGLang 0.5.22 to 0.5.23, both real source trees, through the contract gate.

The environments:
- old: a throwaway SGLang 0.5.22 (``release_target``: ``pip install --no-deps sglang==0.5.22`` over the test
  environment's dependencies) with the one patch of the 0.5.23 series that the porting report says applies to it
  exactly (kimi-k2-tool-call-ids, applied with GNU patch as a maintainer's port would): a host the kit's gate
  accepts;
- new: a throwaway copy of the 0.5.23 test environment (``make_target``); the upgrade applies the series to it.

What systemd would start is played by a ``systemctl restart`` hook (FakeSystemd.on): it stops the replay server
it started last and starts tests/replay/server.py with the interpreter the installed unit's ``ExecStart=`` names,
on the profile's port. So the gate talks to SGLang's serving layer of whichever environment the unit points at:
0.5.23 patched by the upgrade, 0.5.22 after a rollback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from install_fakes import snapshot, write_profile
from patch_helpers import make_target, release_target, site_packages_of, tree_hashes
from replay_process import SGLANG_SERVER
from kimi_deploy import patching
from kimi_deploy.cli import cli
from kimi_deploy.deployment import resolve
from kimi_deploy.errors import ExitCode
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.targets.systemd import _exec_start

pytestmark = pytest.mark.sglang

UNIT = "etc/systemd/system/kimi-test.service"


@pytest.fixture(scope="module")
def old_env(sglang_python, tmp_path_factory) -> str:
    """SGLang 0.5.22 with the detector patch the porting report finds exact there (module docstring)."""
    python = release_target(sglang_python, tmp_path_factory.mktemp("old") / "venv", "0.5.22")
    series = patching.find_series("0.5.23")
    diff = series.diff_path(series.get("kimi-k2-tool-call-ids"))
    subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-d", str(site_packages_of(python)), "-i", str(diff)],
                   check=True, capture_output=True)
    return python


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """The ``systemctl restart`` hook's side: the replay server the unit's interpreter runs (module docstring)."""

    def __init__(self, tmp: Path, root: Path, port: int) -> None:
        self.pidfile, self.log = tmp / "engine.pid", tmp / "engine.log"
        self.hook = f"""#!{sys.executable}
import os, re, signal, subprocess, time
unit = open({str(root / UNIT)!r}).read()
python = re.search(r"^ExecStart=(\\S+)", unit, re.M).group(1)
try:
    old = int(open({str(self.pidfile)!r}).read())
    os.kill(old, signal.SIGTERM)
    while os.path.exists(f"/proc/{{old}}") and open(f"/proc/{{old}}/stat").read().split()[2] != "Z":
        time.sleep(0.05)
except (FileNotFoundError, ProcessLookupError, ValueError):
    pass
with open({str(self.log)!r}, "a") as log:
    log.write(f"--- {{python}}\\n")
    log.flush()
    new = subprocess.Popen([python, "-W", "ignore", {str(SGLANG_SERVER)!r}, "--port", "{port}", "--tp-size", "8",
                            "--no-speculative"], stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                           env={{"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}})
open({str(self.pidfile)!r}, "w").write(str(new.pid))
"""

    def started(self) -> list[str]:
        """The interpreters the hook started, in order."""
        return [ln[4:] for ln in self.log.read_text().splitlines() if ln.startswith("--- ")]

    def stop(self) -> None:
        try:
            os.kill(int(self.pidfile.read_text()), signal.SIGTERM)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass


@pytest.fixture
def host(tmp_path, fake_systemd, old_env):
    """A --root tree with the service installed on the old environment; the restart hook in place."""
    root = tmp_path / "root"
    root.mkdir()
    port = _free_port()
    profile = write_profile(tmp_path / "v1.toml", port=port, python=old_env, gpu_count=8,
                            sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"',))
    apply(plan_install(load_profile(profile), HostLayout(root), sglang_version="0.5.22", enable=False,
                       create_user=False))
    engine = Engine(tmp_path, root, port)
    fake_systemd.on("restart", engine.hook)
    yield root, profile, engine
    engine.stop()


def _files(root: Path) -> dict[str, bytes]:
    """The tree but the service's lock file: ``upgrade`` holds the lock while it recovers an interrupted change
    and plans (the file stays, holding the last holder's pid, as after any install)."""
    return {rel: data for rel, data in snapshot(root).items() if not rel.endswith(".kimi-test.lock")}


def _old_files(python: str) -> dict[str, str]:
    site = site_packages_of(python)
    return {**tree_hashes(site / "sglang"), **tree_hashes(site / "sglang-0.5.22.dist-info")}


def _upgrade(cli_runner, root: Path, state: Path, *args: str):
    return cli_runner.invoke(cli, ["upgrade", "--root", str(root), "--host-systemd", "--state-dir", str(state), "--timeout", "400",
                                   "--poll-interval", "0.5", *args], catch_exceptions=False)


def test_dry_run_shows_the_plan_and_changes_nothing(cli_runner, host, tmp_path, sglang_python, old_env):
    root, _, engine = host
    new = make_target(sglang_python, tmp_path / "new", bytecode=True)
    before, new_before = snapshot(root), tree_hashes(site_packages_of(new) / "sglang")
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--dry-run")
    assert result.exit_code == 0, result.output + result.stderr
    out = result.output
    assert f"SGLang: 0.5.22 ({old_env}) -> 0.5.23 ({new})" in out
    assert "patches (series 0.5.23, into the new environment only): kimi-k2-tool-call-ids, " \
           "kimi-k2-canonical-history-ids, redact-api-key [applies" in out
    assert "validate against the new interpreter: ok" in out
    assert f"+ExecStart={new} -m sglang.launch_server" in out and f"-ExecStart={old_env} -m" in out
    assert "dry run: nothing was changed" in out
    assert snapshot(root) == before and tree_hashes(site_packages_of(new) / "sglang") == new_before
    data = json.loads(_upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--dry-run", "--json").output)
    assert data["version_change"] == "0.5.22 -> 0.5.23" and data["applied"] is False
    assert isinstance(data["spelling_changes"], list) and data["problems"] == []
    assert not engine.pidfile.exists()  # nothing restarted


def test_a_model_that_cannot_fit_is_refused_before_any_interpreter_with_the_numbers(cli_runner, host, tmp_path,
                                                                                    sglang_python, old_env):
    # Kimi-K2.5 on one GPU: the model table refuses it before the new interpreter is asked, with the sentence every
    # verb gives (kimi_deploy.deployment.require_fit), not a plan with a bare "FAILED"
    root, _, engine = host
    one_gpu = write_profile(tmp_path / "v2.toml", port=30000, python=old_env,
                            sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"',))
    new = make_target(sglang_python, tmp_path / "new", bytecode=True)
    before = _files(root)
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--profile", str(one_gpu))
    assert result.exit_code == ExitCode.REFUSED, result.output + result.stderr
    assert "Kimi K2.5 does not fit one replica's GPUs" in result.stderr and "1 x 96 GB" in result.stderr
    assert _files(root) == before and not engine.pidfile.exists()


def test_the_plan_carries_the_opt_in_patches_the_profile_needs(cli_runner, host, tmp_path, sglang_python, old_env):
    """Issue 36: a profile that turns on the SM120 all-reduce fusion and torch symmetric memory needs the two opt-in
    patches; the upgrade applied only the series' defaults (a failed start about 10 minutes in, then the rollback's).
    Now the plan lists them, required by the profile's features, and they are what apply would apply."""
    root, _, _ = host
    v2 = write_profile(tmp_path / "v2.toml", port=30000, python=old_env, gpu_count=8,
                       sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"',
                                     'flashinfer_allreduce_fusion_backend = "auto"', "enable_torch_symm_mem = true"))
    new = make_target(sglang_python, tmp_path / "new", bytecode=True)
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--profile", str(v2), "--dry-run",
                      "--json")
    data = json.loads(result.output)
    assert {"sm120-flashinfer-allreduce-fusion", "sm120-torch-symm-mem"} <= set(data["patches"]), data["patches"]
    assert data["patches"] == data["required_patches"] == data["deployment"]["required_patches"]
    assert data["patch_check"]["ok"] is True, data["patch_check"]
    # the plan's argv is the deployment's for the new release: what it validated there and the unit it would install
    d = resolve(load_profile(v2).model_copy(update={"service": load_profile(v2).service.model_copy(
        update={"python": new})}), "0.5.23")
    assert data["deployment"] == json.loads(json.dumps(d.to_dict()))
    assert data["validation"]["server_args"] == list(d.launch.server_args)
    unit, = (f for f in data["install"]["files"] if f["host_path"] == f"/etc/systemd/system/{d.units.server}")
    after = "\n".join(line[1:] for line in unit["diff"].splitlines()[2:] if line[:1] in "+ ")  # the unit it writes
    assert _exec_start(d.launch) in after
    text = _upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--profile", str(v2), "--dry-run").output
    assert ("required by the profile's features: sm120-flashinfer-allreduce-fusion "
            "(--flashinfer-allreduce-fusion-backend), sm120-torch-symm-mem (--enable-torch-symm-mem)") in text


def test_the_installed_environment_is_never_the_target(cli_runner, host, tmp_path, old_env):
    root, _, _ = host
    before = _files(root)
    # the installed environment, its recorded SGLang and the installed profile: an upgrade in place (a re-run of
    # one that finished, issue 37), nothing to do; it was refused with "create a new env"
    again = _upgrade(cli_runner, root, tmp_path / "state", "--python", old_env)
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output + again.stderr
    changed = write_profile(tmp_path / "v2.toml", port=30000, python=old_env, gpu_count=8, context_length=2000,
                            sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"',))
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", old_env, "--profile", str(changed))
    assert result.exit_code == ExitCode.REFUSED, result.output + result.stderr
    assert "never changes the running one in place" in result.stderr and _files(root) == before
    missing = _upgrade(cli_runner, root, tmp_path / "state", "--python", str(tmp_path / "no" / "python"))
    assert missing.exit_code == ExitCode.USAGE and "Traceback" not in missing.stderr, missing.stderr
    nothing = _upgrade(cli_runner, root, tmp_path / "state")
    assert nothing.exit_code == ExitCode.USAGE and "nothing to upgrade" in nothing.stderr
    assert _files(root) == before


def test_upgrade_to_0_5_23_passes_the_gate_and_leaves_0_5_22_untouched(cli_runner, host, tmp_path, sglang_python,
                                                                         old_env, fake_systemd):
    root, _, engine = host
    old_files = _old_files(old_env)
    new = make_target(sglang_python, tmp_path / "new", bytecode=True)
    # the start records of earlier starts (issue #42) live in the unit's state directory, not the environment
    history = root / "var/lib/kimi-test/start-history.json"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text(json.dumps({"version": 1, "starts": [
        {"started": "2026-12-01 08:00:02", "total": 540.0, "phases": {"weights": 271.52}}]}))
    started = time.monotonic()
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", new, "--json")
    assert result.exit_code == 0, result.output + result.stderr + engine.log.read_text()[-3000:]
    kept = json.loads(history.read_text())["starts"]
    assert kept[0] == {"started": "2026-12-01 08:00:02", "total": 540.0, "phases": {"weights": 271.52}}
    data = json.loads(result.output)
    assert not data["rolled_back"] and data["restart"]["attempts"][0]["gate"]["ok"]
    assert [t["tier"] for t in data["restart"]["attempts"][0]["gate"]["tiers"]] == [
        "ready", "fast", "parser", "contract"]
    assert engine.started() == [new]
    assert f"ExecStart={new} -m sglang.launch_server" in (root / UNIT).read_text()
    assert patching.verify(new, state_dir=tmp_path / "state").state == "applied"
    assert _old_files(old_env) == old_files  # byte-identical
    print(f"upgrade 0.5.22 -> 0.5.23 with the contract gate: {time.monotonic() - started:.0f} s; tiers: "
          + ", ".join(f"{t['tier']} {t['seconds']} s" for t in data["restart"]["attempts"][0]["gate"]["tiers"]))


def test_a_new_release_with_broken_tool_calls_is_rolled_back_to_the_untouched_old_environment(
        cli_runner, host, tmp_path, sglang_python, old_env, monkeypatch):
    """0.5.23 as released (the kit has no series for it here: patches/ emptied), whose kimi_k2 parser drops
    the sanitised ids clients send back: the gate stops it, the unit points at 0.5.22 again, which passes."""
    root, _, engine = host
    old_files = _old_files(old_env)
    v1_unit = (root / UNIT).read_bytes()
    empty = tmp_path / "no-series"
    empty.mkdir()
    monkeypatch.setattr("kimi_deploy.paths.patches_dir", lambda: empty)
    new = make_target(sglang_python, tmp_path / "new", bytecode=True)
    result = _upgrade(cli_runner, root, tmp_path / "state", "--python", new)
    assert result.exit_code == ExitCode.FAILED, result.output + result.stderr + engine.log.read_text()[-3000:]
    out = result.output
    assert "note: the kit has no patch series for SGLang 0.5.23" in out
    assert "new: FAILED: ready after" in out and "but the parser tier failed: parser.tool_calls." in out
    assert "rollback: ok:" in out and "gate contract passed" in out
    assert f"rolled back: the unit runs {old_env} (SGLang 0.5.22) again" in out
    assert "failed tier: parser: parser.tool_calls.notes.item2_sanitised_id" in out
    assert engine.started() == [new, old_env]
    assert (root / UNIT).read_bytes() == v1_unit
    assert _old_files(old_env) == old_files


def test_a_model_revision_goes_through_the_same_gate(cli_runner, host, tmp_path, old_env):
    root, v1, engine = host
    v2 = tmp_path / "v2.toml"
    v2.write_text(v1.read_text().replace("/models/moonshotai/Kimi-K2.5", "/models/moonshotai/Kimi-K2.6"))
    result = _upgrade(cli_runner, root, tmp_path / "state", "--profile", str(v2))
    assert result.exit_code == 0, result.output + result.stderr + engine.log.read_text()[-3000:]
    assert "model:  /models/moonshotai/Kimi-K2.5 -> /models/moonshotai/Kimi-K2.6" in result.output
    assert "[unchanged]" in result.output.splitlines()[1]  # the same SGLang
    assert "gate contract passed" in result.output and engine.started() == [old_env]
    assert "--model-path /models/moonshotai/Kimi-K2.6" in (root / UNIT).read_text()


def test_spelling_changes_come_from_the_option_table(tmp_path):
    from kimi_deploy.host.upgrade import spelling_changes

    profile = load_profile(write_profile(tmp_path / "p.toml", sglang_lines=(
        'flashinfer_allreduce_fusion_backend = "auto"',)))
    found = spelling_changes("0.5.13", "0.5.23", profile)
    changes = {c.feature: (c.old, c.new) for c in found}
    assert {c.feature for c in found if c.in_profile} == {"flashinfer_allreduce_fusion_backend"}
    assert changes["enable_spec_v2"] == ("env SGLANG_ENABLE_SPEC_V2", "implicit")
    assert changes["flashinfer_allreduce_fusion_backend"] == ("--enable-flashinfer-allreduce-fusion",
                                                              "--flashinfer-allreduce-fusion-backend")
    assert changes["enable_pcie_ipc_allreduce"] == (None, "env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
    assert spelling_changes("0.5.22", "0.5.23") == []  # the table has no spelling that changed in 0.5.23
