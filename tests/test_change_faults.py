"""A change killed at any instant: ``restart --wait --rollback-on-failure`` and ``upgrade``, each gate passing or failing.

The harness of tests/test_install_faults.py (:mod:`fault_harness`): the real CLI in a forked child, SIGKILLed just
before its N-th mutating file operation, for every N until a run completes. After each kill:

- ``status`` exits 1 exactly while something is unfinished (the change's record or litter on disk, or the running
  server is not the version of the files), 0 otherwise;
- the same command run again ends at one complete version (the sha256 of every managed file): the new one only when
  it passed its gate, else the old one; the server runs that version (``status`` exit 0); nothing is left
  (no ``.tmp``/``.bak``, no record, no index-less backup set);
- systemctl never stopped or disabled the service, which was installed before.

systemctl is the recorded fake (``fake_systemd``) whose ``restart`` starts "what the unit file says": it copies the
unit to ``running.unit``, and the loopback server (:class:`install_fakes.FakeServer`) answers as the version whose
unit that is. The failing version runs without its parsers: the gate's fast tier (``config.*``) fails it.

Cost: 196 kill points, 7 min 52 s for the module on the shared 2-core machine under load (about 2.4 s a kill point:
4 to 5 forked CLI runs); figures per test in docs/design.md#a-change-killed-at-any-instant-the-journal.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from fault_harness import fork_cli, reap, spawn_cli
from install_fakes import FakeServer, sglang_server_args, write_profile
from kimi_deploy import fsio
from kimi_deploy.host import journal, records
from kimi_deploy.host import status as status_lib
from kimi_deploy.host import upgrade as upgrade_lib
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.deployment import resolve

# what a run loads lazily (the gate's check tiers: openai, jsonschema; rich), loaded once here: each forked child
# would load it again (about 1.2 s a run on 2 shared cores)
importlib.import_module("kimi_deploy.check.runner")
importlib.import_module("kimi_deploy.host.gate")
importlib.import_module("rich.console")

pytestmark = pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl (systemctl --root)")

UNIT = "etc/systemd/system/kimi-test.service"
OLD_PY, NEW_PY = "/opt/sglang-old/bin/python", "/opt/sglang-new/bin/python"


def leftovers(root: Path) -> list[str]:
    """Temp files, rename links, records of interrupted runs and index-less backup sets anywhere in the tree."""
    out = [p.relative_to(root).as_posix() for p in root.rglob("*")
           if fsio.TEMP_RE.fullmatch(p.name) or fsio.BACKUP_LINK_RE.fullmatch(p.name)
           or p.name.endswith((".intent.json", ".change"))]
    backups = root / "etc/kimi-deploy/backup"
    if backups.is_dir():
        out += [p.relative_to(root).as_posix() for p in backups.glob("*/*")
                if p.is_dir() and not p.name.endswith(".rolled-back") and not (p / "backup.json").exists()]
    return sorted(out)


def version(root: Path) -> dict[str, str | None]:
    """Host path -> sha256 of every managed file (the manifest's files and the manifest itself)."""
    layout = HostLayout(root)
    manifest_hp = layout.host_path(layout.manifest("kimi-test"))
    manifest = records.load_manifest(layout, "kimi-test")
    paths = sorted({manifest_hp, *(manifest.files if manifest else {})})
    return journal.hashes(journal.current(layout, paths))


class Host:
    """A --root tree with v1 installed and running, the fake systemd that starts what the unit says, and the
    loopback server answering as the running version."""

    def __init__(self, tmp_path: Path, fake_systemd, *, new_fails: bool, upgrade: bool) -> None:
        self.root = tmp_path / "root"
        self.root.mkdir()
        self.fake = fake_systemd
        fake_systemd.serve_from_this_process()  # the loopback server below is the unit's listener
        self.running = fake_systemd.dir / "running.unit"
        fake_systemd.on("restart", f"#!{sys.executable}\nimport shutil\n"
                                   f"shutil.copyfile({str(self.root / UNIT)!r}, {str(self.running)!r})\n")
        self.new_fails = new_fails
        self.server = FakeServer(args=self._args).__enter__()
        port = self.server.port
        self.v1 = write_profile(tmp_path / "v1.toml", port=port, context_length=1000, python=OLD_PY)
        self.v2 = write_profile(tmp_path / "v2.toml", port=port, context_length=1000 if upgrade else 2000,
                                python=OLD_PY if upgrade else None)
        self.profiles = {"v1": load_profile(self.v1), "v2": load_profile(self.v2)}
        self._install(self.v1)
        self.versions = {"v1": version(self.root)}
        shutil.copyfile(self.root / UNIT, self.running)
        self.units = {"v1": (self.root / UNIT).read_bytes()}
        self.server.api_key = (self.root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()

    def _install(self, profile: Path) -> None:
        apply(plan_install(load_profile(profile), HostLayout(self.root), enable=False, create_user=False))

    def _args(self):
        running = self.running.read_bytes() if self.running.exists() else b""
        is_v2 = running == self.units.get("v2")  # the server is what the unit launches: the new version only
        profile = self.profiles["v2" if is_v2 else "v1"]  # with the new unit, else one the old profile describes
        broken = {"tool_call_parser": None, "reasoning_parser": None} if is_v2 and self.new_fails else {}
        unit = running.decode().replace("\\\n", " ")  # the unit's continuation lines joined
        launch = next((line.split("sglang.launch_server", 1)[1] for line in unit.splitlines()
                       if line.startswith("ExecStart=")), None)
        return sglang_server_args(profile, launch_command=launch, **broken)

    def snapshot(self, where: Path) -> None:
        shutil.copytree(self.root, where, symlinks=True)
        self.saved = (where, self.running.read_bytes())

    def reset(self) -> None:
        where, running = self.saved
        shutil.rmtree(self.root)
        shutil.copytree(where, self.root, symlinks=True)
        self.running.write_bytes(running)

    def running_version(self) -> str:
        unit = self.running.read_bytes()
        return next((v for v, data in self.units.items() if data == unit), "other")

    def files_version(self) -> str:
        now = version(self.root)
        return next((v for v, hashes in self.versions.items() if hashes == now), "mixed")

    def stops(self) -> list[str]:
        return [v for v in self.fake.verbs() if v.split()[0] in ("stop", "disable", "kill", "mask")]

    def status(self) -> int:
        return fork_cli(["status", "--root", str(self.root), "--name", "kimi-test"])

    def close(self) -> None:
        self.server.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def no_patch_series(monkeypatch):
    """``status`` reads the patch series state of the profile's SGLang interpreter, which these trees do not have:
    it reads as "no series" (tests/test_install_status.py covers that part against a real environment)."""
    monkeypatch.setattr(status_lib, "patch_state", lambda python, state_dir=None: {"state": "no_series"})


@pytest.fixture
def stub_interpreters(monkeypatch):
    """``upgrade`` without SGLang environments: the two interpreters' probes and the new one's validation are
    stubbed (what they check is tested in tests/test_upgrade.py against real environments); the forked children
    inherit the stubs. Nothing else is: the plan, the install, the journal, the restart and the gate are real."""
    envs = {OLD_PY: upgrade_lib.Environment(OLD_PY, "0.5.22", "/opt/sglang-old/lib/sglang"),
            NEW_PY: upgrade_lib.Environment(NEW_PY, "0.5.23", "/opt/sglang-new/lib/sglang")}
    monkeypatch.setattr(upgrade_lib.Environment, "probe", classmethod(lambda cls, python: envs[python]))

    class Valid:
        def to_dict(self):
            return {"ok": True, "problems": [], "warnings": []}

    monkeypatch.setattr(upgrade_lib, "validate_profile", lambda profile, python: Valid())
    monkeypatch.setattr(upgrade_lib.patching, "find_series", lambda version: None)


RESTART = ["restart", "--host-systemd", "--wait", "--gate", "fast", "--rollback-on-failure", "--timeout", "30",
           "--poll-interval", "0.01"]
UPGRADE = ["upgrade", "--host-systemd", "--python", NEW_PY, "--gate", "fast", "--timeout", "30",
           "--poll-interval", "0.01"]


def _prepare(tmp_path, fake_systemd, *, new_fails: bool, upgrade: bool) -> tuple[Host, list[str]]:
    host = Host(tmp_path, fake_systemd, new_fails=new_fails, upgrade=upgrade)
    if upgrade:
        args = [*UPGRADE, "--root", str(host.root)]
        # what the new version's files are: an upgrade run to its end on a copy, with a passing gate
        probe = tmp_path / "probe-root"
        shutil.copytree(host.root, probe, symlinks=True)
        new_fails, host.new_fails = host.new_fails, False
        real = host.root
        host.root = probe
        fake_systemd.on("restart", f"#!{sys.executable}\nimport shutil\n"
                                   f"shutil.copyfile({str(probe / UNIT)!r}, {str(host.running)!r})\n")
        assert fork_cli([*UPGRADE, "--root", str(probe)]) == 0
        host.versions["v2"] = version(probe)
        host.units["v2"] = (probe / UNIT).read_bytes()
        host.root, host.new_fails = real, new_fails
        fake_systemd.on("restart", f"#!{sys.executable}\nimport shutil\n"
                                   f"shutil.copyfile({str(real / UNIT)!r}, {str(host.running)!r})\n")
        shutil.copyfile(real / UNIT, host.running)
    else:
        host._install(host.v2)  # installed, not yet restarted: the restart is the change
        host.versions["v2"] = version(host.root)
        host.units["v2"] = (host.root / UNIT).read_bytes()
        args = [*RESTART, "--root", str(host.root)]
    host.snapshot(tmp_path / "before")
    return host, args


def _unfinished(host: Host) -> bool:
    """What status must call a problem: the change's record or litter on disk, or the running server is not the
    version of the files."""
    return bool(leftovers(host.root)) or host.running_version() != host.files_version()


def _after_kill(host: Host, args: list[str], where: object, *, new_fails: bool) -> None:
    """What must hold once a run of ``args`` was killed (``where``: the kill point, for the messages): status says
    whether something is unfinished; the same command run again ends at one complete version, the one that
    passed its gate or the old one, running, with nothing left; systemctl never stopped or disabled the service."""
    assert host.stops() == [], (where, host.stops())
    unfinished = _unfinished(host)
    assert host.status() == (1 if unfinished else 0), (where, leftovers(host.root), host.running_version(),
                                                       host.files_version())
    again = fork_cli(args)
    assert again in (0, 1), (where, again)
    final = host.files_version()
    assert final == "v1" if new_fails else final in ("v1", "v2"), (where, final)
    assert host.running_version() == final, (where, host.running_version(), final)
    assert leftovers(host.root) == [], (where, leftovers(host.root))
    assert host.stops() == [], (where, host.stops())
    assert host.status() == 0, where


def _every_kill_point(host: Host, args: list[str], *, new_fails: bool, limit: int = 400) -> int:
    """Kill ``args`` at its operation 1, 2, ... (each from the same tree) and check :func:`_after_kill`; the
    number of kill points the run has."""
    for n in range(1, limit):
        host.reset()
        (host.fake.dir / "argv.log").unlink(missing_ok=True)
        code = fork_cli(args, kill_at=n)
        if code != -signal.SIGKILL:
            assert code == (1 if new_fails else 0), (n, code)
            done = host.files_version()
            assert done == ("v1" if new_fails else "v2") and leftovers(host.root) == []
            if not new_fails:  # run again once done: nothing to do (an upgrade in place, a restart gated again)
                assert fork_cli(args) == 0 and host.files_version() == done and leftovers(host.root) == []
            return n - 1
        _after_kill(host, args, n, new_fails=new_fails)
    raise AssertionError(f"the run still had mutating operations after {limit}")


@pytest.mark.parametrize("new_fails", [True, False], ids=["gate-fails", "gate-passes"])
def test_restart_rollback_killed_at_every_file_operation(tmp_path, fake_systemd, new_fails):
    host, args = _prepare(tmp_path, fake_systemd, new_fails=new_fails, upgrade=False)
    try:
        points = _every_kill_point(host, args, new_fails=new_fails)
    finally:
        host.close()
    print(f"restart --rollback-on-failure ({'gate fails' if new_fails else 'gate passes'}): {points} kill points")
    assert points >= (10 if new_fails else 4)


@pytest.mark.parametrize("new_fails", [True, False], ids=["gate-fails", "gate-passes"])
def test_upgrade_killed_at_every_file_operation(tmp_path, fake_systemd, stub_interpreters, new_fails):
    host, args = _prepare(tmp_path, fake_systemd, new_fails=new_fails, upgrade=True)
    try:
        points = _every_kill_point(host, args, new_fails=new_fails)
    finally:
        host.close()
    print(f"upgrade ({'gate fails' if new_fails else 'gate passes'}): {points} kill points")
    assert points >= 20


def test_upgrade_killed_at_random_instants(tmp_path, fake_systemd, stub_interpreters):
    """SIGKILL at seeded random delays (not at file operations): whatever it interrupts, the re-run ends at one
    complete version. The delay is drawn from the span a full run takes here, so each kill lands somewhere in
    it; which instruction it lands on is up to the scheduler, and every outcome is checked the same way."""
    host, args = _prepare(tmp_path, fake_systemd, new_fails=True, upgrade=True)
    rng = random.Random(37)
    try:
        host.reset()
        started = time.monotonic()
        assert fork_cli(args) == 1
        span = time.monotonic() - started
        for _ in range(8):
            host.reset()
            (host.fake.dir / "argv.log").unlink(missing_ok=True)
            pid = spawn_cli(args)
            delay = rng.uniform(0, span)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            assert reap(pid) in (-signal.SIGKILL, 1)
            _after_kill(host, args, f"random kill {delay:.3f} s in", new_fails=True)
    finally:
        host.close()


class RecordingGateway:
    """Stands for smg's worker API (:class:`kimi_deploy.host.gateway.Gateway`'s ``remove``/``add``): records."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.added: list[str] = []

    def remove(self, url: str) -> str:
        self.removed.append(url)
        return "w-1"

    def add(self, url: str) -> None:
        self.added.append(url)


def _drained_restart(host: Host, gateway) -> object:
    from kimi_deploy.host import restart as restart_lib

    url = f"http://127.0.0.1:{host.server.port}"
    return restart_lib.restart(resolve(load_profile(host.root / "etc/kimi-deploy/kimi-test.toml"), launches=False),
                               HostLayout(host.root),
                               wait=True, rollback_on_failure=True, gate="fast", timeout=30, poll_interval=0.01,
                               drain=restart_lib.Drain(gateway, url, idle_timeout=5))


@pytest.mark.parametrize("old_passes", [True, False], ids=["old-passes", "old-fails-too"])
def test_a_replica_whose_restart_was_interrupted_rejoins_the_gateway_only_once_gated(tmp_path, fake_systemd,
                                                                                      old_passes):
    """A fleet roll killed after the replica left the gateway and its new version started: the next run puts the
    old version back, restarts and gates it, and adds the replica back only when that passed."""
    host, _args = _prepare(tmp_path, fake_systemd, new_fails=True, upgrade=False)
    try:
        pid = os.fork()
        if pid == 0:  # the first run, killed once its record says the new version was started
            os.environ[fsio.FAULT_KILL_ENV] = "9"
            fsio._fault_count = 0
            try:
                _drained_restart(host, RecordingGateway())
            finally:
                os._exit(0)
        assert reap(pid) == -signal.SIGKILL
        change = journal.load(HostLayout(host.root), "kimi-test")
        assert change is not None and change.restarted and change.replica.endswith(f":{host.server.port}")
        assert host.status() == 1
        if not old_passes:
            host.units["v2"] = host.units["v1"]  # the server answers without parsers whichever unit it runs
        gateway = RecordingGateway()
        result = _drained_restart(host, gateway)
        assert gateway.removed == []  # already out: the interrupted run took it out
        assert host.files_version() == "v1" and leftovers(host.root) == []
        assert host.running_version() == "v1" or not old_passes
        if old_passes:
            assert gateway.added == [change.replica] and result.gateway["readded"] and result.exit_code == 1
        else:
            assert gateway.added == [] and not result.gateway["readded"] and result.exit_code == 10
            assert any("stays out until a version passes its gate" in n for n in result.notes)
    finally:
        host.close()
