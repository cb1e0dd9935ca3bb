"""install/uninstall under hard kills, concurrent runs, hostile paths and a failing disk.

The fault-injection harness runs the real CLI in a forked child (the kit already imported, so a
run costs milliseconds, not an interpreter start) with ``$KIMI_DEPLOY_FAULT_KILL_AT=N``: the child
SIGKILLs itself just before its N-th mutating file operation (:func:`kimi_deploy.fsio.fault_point`).
For every N until a run completes, the next plain run must end in a recorded, verified state:
every file the manifest lists holds the recorded bytes, no temp/rename leftovers, no intent
record, and a further run plans nothing. Real ``systemctl --root`` on a tmp tree.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from fault_harness import fork_cli, reap, spawn_cli
from install_fakes import snapshot, write_profile
from kimi_deploy import fsio
from kimi_deploy.host import records as hostfiles
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, LockedError, UsageError
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile
from kimi_deploy.deployment import resolve

pytestmark = pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl (systemctl --root)")

KEY = "etc/kimi-deploy/kimi-test.api-key"
LEFTOVER = re.compile(r"\..+\.([a-z0-9_]{8}\.tmp|[0-9]+\.bak)$")


def leftovers(root: Path) -> list[str]:
    """Temp files, rename links, intent records and index-less backup sets anywhere in the tree."""
    out = [p.relative_to(root).as_posix() for p in root.rglob("*")
           if LEFTOVER.match(p.name) or p.name.endswith(".intent.json")]
    backups = root / "etc/kimi-deploy/backup"
    if backups.is_dir():
        out += [p.relative_to(root).as_posix() for p in backups.glob("*/*")
                if p.is_dir() and not p.name.endswith(".rolled-back") and not (p / "backup.json").exists()]
    return sorted(out)


def assert_installed(root: Path, profile: Path) -> None:
    """The recorded, verified state of an install of ``profile``."""
    layout = HostLayout(root)
    manifest = hostfiles.load_manifest(layout, "kimi-test")
    assert manifest is not None
    assert manifest.profile_sha256 == load_profile(profile).digest()
    changed = [hp for hp, r in manifest.files.items() if hostfiles.sha256(layout.under(hp).read_bytes()) != r.sha256]
    assert changed == []
    assert manifest.api_key_file_created == "/" + KEY and (root / KEY).stat().st_mode & 0o777 == 0o600
    assert leftovers(root) == []
    assert plan_install(load_profile(profile), layout, enable=False).is_noop


def assert_uninstalled(root: Path) -> None:
    """No file of the service left but its lock file (the last holder's pid); empty folders may stay."""
    locks = ["etc/kimi-deploy/.kimi-test.lock", "etc/kimi-deploy/.shared@kimi-deploy.lock"]  # pids, nothing else
    assert set(snapshot(root)) <= set(locks)


def install_args(profile: Path, root: Path, *extra: str) -> list[str]:
    return ["install", "--profile", str(profile), "--root", str(root), *extra]


#: The kill loops leave systemctl out (--no-enable): it is no file operation of the kit, and it
#: costs a process start per run.
QUICK = "--no-enable"


def kill_every_step(args: list[str], prepare, verify, *, limit: int = 200) -> int:
    """Kill a run of ``args`` at operation 1, 2, ... (each from a fresh ``prepare()``), rerun it plainly,
    ``verify()``; returns how many kill points the run has."""
    for n in range(1, limit):
        prepare()
        code = fork_cli(args, kill_at=n)
        if code == 0:
            return n - 1
        assert code == -signal.SIGKILL, (n, code)
        again = fork_cli(args)
        assert again == 0, (n, again)
        verify(n)
    raise AssertionError(f"the run still had mutating operations after {limit}")


@pytest.fixture
def profiles(tmp_path) -> tuple[Path, Path]:
    return (write_profile(tmp_path / "v1.toml", context_length=1000),
            write_profile(tmp_path / "v2.toml", context_length=2000))


def test_a_first_install_killed_at_every_file_operation_is_completed_by_the_next_run(root, profiles):
    v1, _ = profiles

    def fresh():
        shutil.rmtree(root)
        root.mkdir()

    points = kill_every_step(install_args(v1, root, QUICK), fresh, lambda n: assert_installed(root, v1))
    assert points >= 15  # intent, key, backup, 6 files staged and renamed, intent removed


def test_an_upgrade_killed_at_every_file_operation_leaves_files_the_next_install_and_uninstall_own(root, profiles,
                                                                                                  tmp_path):
    v1, v2 = profiles
    assert fork_cli(install_args(v1, root, QUICK)) == 0
    installed = tmp_path / "installed"
    shutil.copytree(root, installed, symlinks=True)

    def from_v1():
        shutil.rmtree(root)
        shutil.copytree(installed, root, symlinks=True)

    points = kill_every_step(install_args(v2, root, QUICK), from_v1, lambda n: assert_installed(root, v2))
    assert points >= 10
    # killed mid-way, the tree is not hand-edited: uninstall (no --force) takes everything away
    for n in range(1, points + 1):
        from_v1()
        assert fork_cli(install_args(v2, root, QUICK), kill_at=n) == -signal.SIGKILL
        code = fork_cli(["uninstall", "--root", str(root), "--purge"])
        assert code == 0, n
        assert_uninstalled(root)


def test_an_uninstall_purge_killed_at_every_file_operation_is_finished_by_the_next_run(root, profiles, tmp_path):
    v1, _ = profiles
    assert fork_cli(install_args(v1, root, QUICK)) == 0
    installed = tmp_path / "installed"
    shutil.copytree(root, installed, symlinks=True)
    args = ["uninstall", "--root", str(root), "--purge", "--name", "kimi-test"]

    def from_installed():
        shutil.rmtree(root)
        shutil.copytree(installed, root, symlinks=True)

    points = kill_every_step(args, from_installed, lambda n: assert_uninstalled(root))
    assert points >= 8


def test_a_run_killed_after_creating_the_key_records_it_for_purge(root, profiles, tmp_path):
    v1, _ = profiles
    log = tmp_path / "ops.log"
    os.environ[fsio.FAULT_TRACE_ENV] = str(log)
    try:
        assert fork_cli(install_args(v1, root)) == 0
    finally:
        del os.environ[fsio.FAULT_TRACE_ENV]
    ops = log.read_text().splitlines()
    after_key = next(i for i, line in enumerate(ops, 1) if "kimi-test.api-key" in line and " replace " in line) + 1
    shutil.rmtree(root)
    root.mkdir()
    assert fork_cli(install_args(v1, root), kill_at=after_key) == -signal.SIGKILL
    assert (root / KEY).exists() and hostfiles.load_manifest(HostLayout(root), "kimi-test") is None
    assert fork_cli(["uninstall", "--root", str(root), "--purge"]) == 0
    assert not (root / KEY).exists()
    assert_uninstalled(root)


def test_a_failed_install_takes_the_key_it_created_with_it(cli_runner, root, profiles, monkeypatch):
    v1, _ = profiles
    real = os.replace

    def full_disk(src, dst):
        if str(dst).endswith(".service"):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    result = cli_runner.invoke(cli, install_args(v1, root), catch_exceptions=False)
    assert result.exit_code == ExitCode.STORAGE, result.output + result.stderr
    assert "No space left on device" in result.stderr and "df -h" in result.stderr
    assert "choose a directory" not in result.stderr  # not an input problem
    assert not (root / KEY).exists()
    assert leftovers(root) == []
    assert not (root / "etc/systemd/system/kimi-test.service").exists()


def test_a_read_only_file_system_is_a_storage_error_not_bad_input(cli_runner, tmp_path):
    out = tmp_path / "units"
    out.mkdir()
    real = os.replace

    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    profile = write_profile(tmp_path / "p.toml")
    os.replace = read_only
    try:
        result = cli_runner.invoke(cli, ["render", "--profile", str(profile), "--out", str(out)])
    finally:
        os.replace = real
    assert result.exit_code == ExitCode.STORAGE, result.output + result.stderr
    assert "read-only" in result.stderr


def test_install_into_a_root_that_does_not_exist_is_refused_and_makes_no_tree(cli_runner, tmp_path, profiles):
    """New-operator trial: `install --root /tmp/typo` made the whole tree (units, env file, a new API key)."""
    v1, _ = profiles
    typo = tmp_path / "rooot"
    for extra in ((), ("--dry-run",)):
        result = cli_runner.invoke(cli, install_args(v1, typo, *extra))
        assert result.exit_code == ExitCode.USAGE, result.output
        assert f"--root: the directory {typo} does not exist" in result.stderr and "mkdir -p" in result.stderr
    assert not typo.exists()


NOT_FILES = {
    "check --json": ["check", "--base-url", "http://127.0.0.1:9", "--json", "{target}"],
    "check --prom": ["check", "--base-url", "http://127.0.0.1:9", "--prom", "{target}"],
    "bench --csv": ["bench", "--base-url", "http://127.0.0.1:9", "--csv", "{target}"],
    "init --force": ["init", "{target}", "--force"],
}


@pytest.mark.parametrize("link", [False, True], ids=["fifo", "a link to a fifo"])
@pytest.mark.parametrize("args", NOT_FILES.values(), ids=NOT_FILES.keys())
def test_an_output_that_is_a_pipe_or_device_is_refused_and_left_as_it_is(cli_runner, tmp_path, args, link):
    """New-operator trial, run as root: `check --json /dev/stdout` and `bench --csv /dev/null` renamed a temporary
    file over the host's /dev/stdout and /dev/null, leaving regular files there. Shown here with a FIFO of the
    test's own (never a real device): it must still be a FIFO afterwards, and the verb exit 2 before any work."""
    import stat

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    target = fifo
    if link:
        target = tmp_path / "stdout"
        target.symlink_to(fifo)
    result = cli_runner.invoke(cli, [a.format(target=target) for a in args])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "is a pipe (FIFO), not a file" in result.stderr and "fix:" in result.stderr, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and (not link or target.is_symlink())


def test_the_atomic_writer_never_renames_over_a_pipe(tmp_path):
    import stat

    fifo, other = tmp_path / "p", tmp_path / "ok.txt"
    os.mkfifo(fifo)
    with pytest.raises(fsio.UsageError, match="is a pipe"):
        fsio.write_many_atomic({other: "x", fifo: "y"})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not other.exists()  # nothing was changed
    assert leftovers(tmp_path) == []


READ_ONLY_OUTPUTS = {
    "init": (["init", "{ro}/k.toml"], "PATH"),
    "render --out": (["render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--out", "{ro}/out"], "--out"),
    "check --json": (["check", "--base-url", "http://127.0.0.1:9", "--json", "{ro}/r.json"], "--json"),
    "bench --csv": (["bench", "--base-url", "http://127.0.0.1:9", "--csv", "{ro}/r.csv"], "--csv"),
}


@pytest.mark.parametrize(("args", "option"), READ_ONLY_OUTPUTS.values(), ids=READ_ONLY_OUTPUTS.keys())
def test_an_output_on_a_read_only_mount_is_exit_8_remount_not_a_permission_problem(tmp_path, args, option):
    """New-operator trial: on a read-only mount every output path was refused as "not writable by this user",
    exit 2, fix "write into a directory this user can write to" (wrong as root: no permission fixes it).
    A real read-only tmpfs in a mount namespace of its own (``unshare -rm``)."""
    import subprocess
    import sys

    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -rm (user and mount namespaces)")
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = [a.format(ro=ro) for a in args]
    run = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o ro tmpfs "{ro}" && exec "$@"', "sh",
                          sys.executable, "-m", "kimi_deploy", *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert run.returncode == ExitCode.STORAGE, run.stderr
    assert f"{option}: the directory {ro} is on a read-only file system" in run.stderr and "remount" in run.stderr
    assert "Traceback" not in run.stderr


def test_stale_temp_files_of_a_killed_run_are_cleaned_by_install_and_by_purge(cli_runner, root, profiles):
    v1, _ = profiles
    assert cli_runner.invoke(cli, install_args(v1, root)).exit_code == 0
    litter = [root / "etc/systemd/system/.kimi-test.service.ab12cd_9.tmp",
              root / "etc/kimi-deploy/.kimi-test.env.4242.bak",
              root / "etc/kimi-deploy/backup/kimi-test/20250101T000000000000Z/files/x"]
    for path in litter:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    foreign = root / "etc/systemd/system/.other.service.ab12cd_9.tmp"
    foreign.write_text("not ours")
    result = cli_runner.invoke(cli, install_args(v1, root))
    assert result.exit_code == 0, result.output + result.stderr
    assert "left by an interrupted kimi-deploy run" in result.output
    assert not any(p.exists() for p in litter[:2]) and not litter[2].parent.parent.exists()
    assert foreign.exists()  # another file's temp file is not this service's to remove

    litter[0].write_text("half")
    purged = cli_runner.invoke(cli, ["uninstall", "--root", str(root), "--purge"])
    assert purged.exit_code == 0, purged.output + purged.stderr
    assert not litter[0].exists()


# ---------------------------------------------------------------- concurrency

def test_a_second_run_on_a_locked_service_waits_then_exits_7_and_changes_nothing(cli_runner, root, profiles,
                                                                                monkeypatch):
    v1, v2 = profiles
    assert cli_runner.invoke(cli, install_args(v1, root)).exit_code == 0
    slept = []
    clock = iter(range(0, 1000)).__next__
    real_lock = fsio.exclusive_lock

    def fake_clock_lock(path, **kw):  # drive the wait with a fake clock: no real sleeping
        return real_lock(path, **{**kw, "clock": lambda: float(clock()), "sleep": slept.append})

    layout = HostLayout(root)
    with fsio.exclusive_lock(layout.lock_file("kimi-test"), what="test"):
        before = snapshot(root)
        monkeypatch.setattr(fsio, "exclusive_lock", fake_clock_lock)
        for args in (install_args(v2, root), ["uninstall", "--root", str(root)]):
            result = cli_runner.invoke(cli, args)
            assert result.exit_code == ExitCode.LOCKED, result.output + result.stderr
            assert "install, uninstall or restart of service kimi-test is running" in result.stderr
            assert snapshot(root) == before
        assert len(slept) >= 10  # it waited (on the injected clock) before giving up
        # a dry run only reads: it takes no lock
        assert cli_runner.invoke(cli, install_args(v2, root) + ["--dry-run"]).exit_code == 0
    monkeypatch.setattr(fsio, "exclusive_lock", real_lock)
    assert cli_runner.invoke(cli, install_args(v2, root)).exit_code == 0


def test_restart_takes_the_same_lock(root, profiles, fake_systemd):
    from kimi_deploy.host.restart import restart

    v1, _ = profiles
    layout = HostLayout(root)
    apply(plan_install(load_profile(v1), layout, enable=False))
    with fsio.exclusive_lock(layout.lock_file("kimi-test"), what="test"):
        with pytest.raises(LockedError):
            with hostfiles.service_lock(layout, "kimi-test", wait=0):
                pass
        fsio_wait = fsio.LOCK_WAIT_S
        fsio.LOCK_WAIT_S = 0
        try:
            with pytest.raises(LockedError):
                restart(resolve(load_profile(v1), launches=False), layout)
        finally:
            fsio.LOCK_WAIT_S = fsio_wait
    assert fake_systemd.verbs() == []  # nothing restarted while another run held the service
    restart(resolve(load_profile(v1), launches=False), layout)
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_two_concurrent_installs_of_one_service_end_in_one_recorded_state(root, profiles):
    v1, v2 = profiles
    for _ in range(3):
        pids = [spawn_cli(install_args(profile, root)) for profile in (v1, v2)]
        codes = [reap(pid) for pid in pids]
        assert set(codes) <= {0, ExitCode.LOCKED}, codes
        layout = HostLayout(root)
        manifest = hostfiles.load_manifest(layout, "kimi-test")
        winner = v1 if manifest.profile_sha256 == load_profile(v1).digest() else v2
        assert_installed(root, winner)


# ---------------------------------------------------------------- containment under --root

@pytest.mark.parametrize("field", ["api_key_file", "cache_dir"])
def test_a_dotdot_path_never_leaves_the_root(cli_runner, root, tmp_path, field):
    outside = tmp_path / "outside"
    outside.mkdir()
    escape = f"/../../../..{outside}/stolen"
    profile = write_profile(tmp_path / "p.toml", api_key=field != "api_key_file",
                            cache_dir=escape if field == "cache_dir" else None)
    if field == "api_key_file":
        profile.write_text(profile.read_text() + f'api_key_file = "{escape}"\n')
    result = cli_runner.invoke(cli, install_args(profile, root))
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert list(outside.iterdir()) == []


def test_a_manifest_naming_a_path_outside_the_root_is_never_purged(cli_runner, root, profiles, tmp_path):
    v1, _ = profiles
    assert cli_runner.invoke(cli, install_args(v1, root)).exit_code == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    layout = HostLayout(root)
    manifest = hostfiles.load_manifest(layout, "kimi-test")
    tampered = manifest.model_copy(update={"state_dir": f"/../../../..{victim}",
                                           "api_key_file_created": f"/../../../..{victim}/keep"})
    layout.manifest("kimi-test").write_bytes(tampered.to_bytes())
    result = cli_runner.invoke(cli, ["uninstall", "--root", str(root), "--purge"])
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert "not a normalised absolute host path" in result.stderr
    assert (victim / "keep").read_text() == "precious"


def test_a_symlink_in_the_tree_pointing_outside_is_not_followed(cli_runner, root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "etc").mkdir()
    (root / "etc/kimi-deploy").symlink_to(outside)
    profile = write_profile(tmp_path / "p.toml")
    result = cli_runner.invoke(cli, install_args(profile, root))
    assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
    assert "leads out of the --root tree" in result.stderr
    assert list(outside.iterdir()) == []


def test_two_services_installs_take_the_hosts_shared_lock(cli_runner, root, tmp_path):
    """Two services sharing a port and a not-yet-existing key file: the service lock is per service, so both
    installs planned the port free and the key file missing and both applied, one key replacing the other
    (issue #30 item 10). Each install now plans again and applies under the host's shared lock: while one holds
    it the other waits (exit 7 here, with no wait), and once it is free the second is refused the port."""
    a = write_profile(tmp_path / "a.toml", name="kimi-a")
    b = write_profile(tmp_path / "b.toml", name="kimi-b")
    layout = HostLayout(root)
    fsio_wait = fsio.LOCK_WAIT_S
    fsio.LOCK_WAIT_S = 0
    try:
        with fsio.exclusive_lock(layout.shared_lock_file(), what="another service's install"):
            before = snapshot(root)
            held = cli_runner.invoke(cli, install_args(b, root, QUICK))
            assert held.exit_code == ExitCode.LOCKED, held.output + held.stderr
            assert "ports, key files and folders" in held.stderr
            unlocked = lambda snap: {k: v for k, v in snap.items() if not k.endswith(".lock")}  # noqa: E731
            assert unlocked(snapshot(root)) == unlocked(before)
    finally:
        fsio.LOCK_WAIT_S = fsio_wait
    assert cli_runner.invoke(cli, install_args(a, root, QUICK)).exit_code == 0
    key = (root / "etc/kimi-deploy").glob("*.api-key")
    keys_before = {p: p.read_bytes() for p in key}
    second = cli_runner.invoke(cli, install_args(b, root, QUICK))
    assert second.exit_code == ExitCode.REFUSED and "port 30000" in second.output + second.stderr
    assert {p: p.read_bytes() for p in keys_before} == keys_before


def test_a_backup_index_edited_by_hand_is_a_clear_error_not_a_traceback(cli_runner, root, profiles):
    """``backup.json`` is written atomically, so a bad one is a hand edit or a disk fault: the verbs that read
    backup sets (here ``uninstall --purge``, which looks for the last uninstall's manifest) say which set to move
    aside, exit 2, and change nothing."""
    v1, _ = profiles
    assert cli_runner.invoke(cli, install_args(v1, root, QUICK)).exit_code == 0
    assert cli_runner.invoke(cli, ["uninstall", "--root", str(root)]).exit_code == 0
    layout = HostLayout(root)
    index = max(layout.service_backup_dir("kimi-test").glob("*/backup.json"))  # the uninstall's (sets sort by age)
    for bad in ('{"operation": "install", "created_at": "x", "entries": {"/etc/x": "gone"}}', '{"operation":'):
        index.write_text(bad)
        before = snapshot(root)
        result = cli_runner.invoke(cli, ["uninstall", "--root", str(root), "--purge"])
        assert result.exit_code == ExitCode.USAGE, result.output + result.stderr
        assert "a backup set's index is unreadable" in result.stderr and "Traceback" not in result.stderr
        assert f"move {layout.host_path(index.parent)} out of" in result.stderr
        assert snapshot(root) == before


def test_a_rollback_whose_saved_file_is_gone_restores_nothing(root, profiles):
    """A backup set that lists a file it no longer holds is refused before anything is written back, so a
    rollback never leaves half the old files and half the new."""
    v1, v2 = profiles
    layout = HostLayout(root)
    for profile in (v1, v2):
        apply(plan_install(load_profile(profile), layout))
    (backup,) = [b for b in hostfiles.list_backups(layout, "kimi-test") if b.operation == "install"
                 and "replaced" in b.entries.values()]
    replaced = sorted(hp for hp, kind in backup.entries.items() if kind == "replaced")
    backup.saved(replaced[-1]).unlink()
    before = snapshot(root)
    with pytest.raises(UsageError, match="a file the backup set lists is not in it; nothing was restored"):
        hostfiles.restore_backup(layout, backup, "/etc/systemd/system/kimi-test.service")
    assert snapshot(root) == before
