"""`kimi-deploy patch` killed, raced and fed shifted files, against throwaway copies of real SGLang 0.5.23.

The kill harness runs the kit as a subprocess with ``KIMI_DEPLOY_FAULT_KILL_AT=N`` (kimi_deploy/fsio.py:
SIGKILL just before the N-th mutating file operation), for EVERY N of an apply, a switch of sets and a
revert, then runs the next ``patch`` command and asserts the installation is in a recorded, verified
state: either exactly what it was before, or exactly the result of the interrupted command.

Between two kills the harness puts back the bytes of every file in the folders a patch command writes into
and of the installation's state entries (:meth:`Installation.snapshot`), checks that every path the fault trace
of each run (the full one and every killed one) names lies inside that snapshot, and that no other file of the
``sglang`` tree changed (size, mtime, inode): the comparison cannot pass or fail by leaving out a file. The scenarios run while two other installations are patched and killed at random
instants (:class:`Neighbours`): one with a state directory of its own, one sharing this installation's (as every
installation on a host shares the default ``/var/lib/kimi-deploy``), with stale staging folders of killed runs
planted in ``$TMPDIR`` and in the shared state directory: none of it may change an outcome here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kimi_deploy import fsio, patching
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode, KimiDeployError
from kimi_deploy.patching.state import StateStore
from patch_helpers import make_target, site_packages_of, tree_hashes

pytestmark = pytest.mark.sglang

DEFAULTS = ["kimi-k2-tool-call-ids", "kimi-k2-canonical-history-ids", "redact-api-key"]
DETECTOR = "sglang/srt/function_call/kimik2_detector.py"
SERIES = patching.require_series("0.5.23")
#: every file any patch of the series touches (relative to site-packages)
SERIES_FILES = sorted({f for spec in SERIES.patch for f in SERIES.files_of(spec)})
NEIGHBOUR = Path(__file__).resolve().parent / "patch_neighbour.py"


def trace_paths(trace: Path) -> set[Path]:
    """Every path a fault trace names (``N OP PATH`` lines of kimi_deploy/fsio.py), empty when there is none."""
    if not trace.exists():
        return set()
    return {Path(line.split(" ", 2)[2]) for line in trace.read_text().splitlines() if line.count(" ") >= 2}


class Installation:
    """A throwaway SGLang copy, its state directory, and the kit run against it as a subprocess."""

    def __init__(self, python: str, state: Path) -> None:
        self.python = python
        self.site = site_packages_of(python)
        self.state = state
        self.store = StateStore(state / "patches", str(self.site / "sglang"))
        self.journal = self.store.directory / f"{self.store.key}.journal.json"

    def kit(self, *args: str, kill_at: int | None = None, trace: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full = {**os.environ, "KIMI_DEPLOY_STATE_DIR": str(self.state), **(env or {})}
        for name, value in ((fsio.FAULT_KILL_ENV, kill_at), (fsio.FAULT_TRACE_ENV, trace)):
            full.pop(name, None)
            if value is not None:
                full[name] = str(value)
        done = subprocess.run([sys.executable, "-m", "kimi_deploy", "patch", *args, "--python", self.python],
                              env=full, capture_output=True, text=True, timeout=300)
        if trace is not None:
            self.check_traced(trace)
        return done

    def files(self) -> dict[str, str | None]:
        """sha256 of every file the series can touch."""
        out = {}
        for rel in SERIES_FILES:
            path = self.site / rel
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
        return out

    def record_ids(self) -> list[str] | None:
        record = self.store.load()
        return None if record is None else record.ids

    def owned(self, path: Path) -> bool:
        """Whether ``path`` is this installation's: in its site-packages, or its entries of the state directory
        (``<key>.*``, ``.<key>.*``: the state directory may be shared with other installations)."""
        if path.is_relative_to(self.site):
            return True
        if path.is_relative_to(self.store.directory) and path != self.store.directory:
            top = path.relative_to(self.store.directory).parts[0]
            return top.startswith((f"{self.store.key}.", f".{self.store.key}."))
        return False

    def folders(self) -> list[Path]:
        """The site-packages folders a patch command may write into: each series file's folder and its
        ``__pycache__`` (stale bytecode is removed there)."""
        out = {(self.site / rel).parent for rel in SERIES_FILES}
        return sorted(out | {f / "__pycache__" for f in out})

    def in_scope(self, path: Path) -> bool:
        """Whether :meth:`snapshot` holds ``path``: a file of :meth:`folders` or one of this installation's state
        entries (the state directory itself, created once, is not a change)."""
        return path == self.store.directory or path.parent in self.folders() or (
            path.is_relative_to(self.store.directory) and self.owned(path))

    def check_traced(self, trace: Path) -> None:
        """Every path the traced command wrote is one :meth:`snapshot` covers: the comparison cannot pass or fail
        by leaving out a file the command touches."""
        for path in trace_paths(trace):
            assert self.in_scope(path), f"the patch command wrote {path}, outside what the snapshot covers"

    def snapshot(self) -> tuple[dict[str, bytes], dict[str, tuple[int, int, int]]]:
        """(the bytes of every file in :meth:`folders` and of this installation's state entries; the size, mtime
        and inode of every other file of the ``sglang`` tree, which no patch command may change)."""
        saved = {}
        for folder in self.folders():
            for entry in folder.iterdir() if folder.is_dir() else ():
                if entry.is_file() or entry.is_symlink():
                    saved[str(entry)] = entry.read_bytes() if entry.is_file() else b"link:" + os.fsencode(
                        os.readlink(entry))
        for entry in self.store.directory.iterdir() if self.store.directory.is_dir() else ():
            if self.owned(entry) and entry != self.store.lock_path:  # the lock's bytes: its last holder's pid
                for path in [entry, *sorted(entry.rglob("*"))]:
                    saved[str(path)] = path.read_bytes() if path.is_file() else b"dir"
        scope = set(self.folders())
        rest = {}
        for path in (self.site / "sglang").rglob("*"):
            if path.parent not in scope and path.is_file():
                st = path.stat()
                rest[str(path)] = (st.st_size, st.st_mtime_ns, st.st_ino)
        return saved, rest

    def restore(self, snap: tuple[dict[str, bytes], dict[str, tuple[int, int, int]]]) -> None:
        """Put back exactly the snapshot: a file that differs is removed and written anew (never in place: a
        killed run can leave a hard link to it), a file or folder that was not there is removed; then the
        snapshot taken again must equal it."""
        saved, _ = snap
        now, _ = self.snapshot()
        for name in sorted(set(now) - set(saved), reverse=True):  # children before their folders
            path = Path(name)
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for name, data in saved.items():
            path = Path(name)
            if data == b"dir":
                path.mkdir(parents=True, exist_ok=True)
            elif now.get(name) != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.exists() or path.is_symlink():
                    path.unlink()
                if data.startswith(b"link:"):
                    path.symlink_to(os.fsdecode(data[5:]))
                else:
                    path.write_bytes(data)
        assert self.snapshot() == snap

    def litter(self) -> list[Path]:
        """Temporary and backup files of an interrupted atomic write, and staging folders, of this installation."""
        dirs = {(self.site / rel).parent for rel in SERIES_FILES}
        found = [p for d in dirs for p in d.glob(".*") if p.suffix in (".tmp", ".bak")]
        # only this installation's top-level entries are walked: the shared state directory also holds the
        # neighbour's staging folders, which it creates and removes while this walk runs
        state: list[Path] = []
        for entry in self.store.directory.iterdir() if self.store.directory.is_dir() else ():
            if self.owned(entry):
                state += [entry] if entry.name.startswith(".") else []
                state += entry.rglob(".*") if entry.is_dir() and not entry.is_symlink() else []
        return found + [p for p in state if p.suffix in (".tmp", ".bak") or ".stage." in p.name]

    def assert_consistent(self) -> None:
        """No journal, no litter; the record (if any) matches the files and its saved originals."""
        assert not self.journal.exists()
        assert self.litter() == []
        record = self.store.load()
        saved = sorted(str(p.relative_to(self.store.originals_dir)) for p in self.store.originals_dir.rglob("*")
                       if p.is_file()) if self.store.originals_dir.exists() else []
        if record is None:
            assert saved == []
            return
        assert saved == sorted(record.files)
        for rel, rec in record.files.items():
            assert hashlib.sha256((self.site / rel).read_bytes()).hexdigest() == rec.after, rel
            assert hashlib.sha256(self.store.original(rel)).hexdigest() == rec.before, rel


class Neighbours:
    """Other installations patched and killed at random instants while a test runs (tests/patch_neighbour.py):
    one with a state directory of its own, one sharing ``shared_state``; stale staging folders of killed runs
    (the old ``$TMPDIR/kimi-deploy-patch-*`` and a staging folder of another installation's key) planted too."""

    def __init__(self, sglang_python: str, directory: Path, shared_state: Path) -> None:
        self.stop = directory / "stop"
        stale = Path(tempfile.mkdtemp(prefix="kimi-deploy-patch-"))
        (stale / "sglang/srt/entrypoints/openai").mkdir(parents=True)
        (stale / "sglang/srt/entrypoints/openai/serving_chat.py").write_text("# a killed run's staged file\n")
        self.stale = [stale, shared_state / "patches" / ".0000000000000000.stage.killed00"]
        (self.stale[1] / "tree").mkdir(parents=True)
        self.procs = [subprocess.Popen(
            [sys.executable, str(NEIGHBOUR), sglang_python, str(directory / name), str(state), str(seed),
             str(self.stop)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, state, seed in (("own", directory / "own-state", 1), ("shared", shared_state, 2))]

    def finish(self) -> list[str]:
        """Stop them; each one's report (the runs it made, and any that ended in a traceback)."""
        self.stop.touch()
        reports = [p.communicate(timeout=600)[0] for p in self.procs]
        shutil.rmtree(self.stale[0], ignore_errors=True)
        return reports


@pytest.fixture
def installation(sglang_python, tmp_path, monkeypatch) -> Installation:
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    for name in (fsio.FAULT_KILL_ENV, fsio.FAULT_TRACE_ENV, fsio.LOCK_WAIT_ENV):
        monkeypatch.delenv(name, raising=False)
    return Installation(make_target(sglang_python, tmp_path / "venv"), tmp_path / "state")


@pytest.fixture
def neighbours(sglang_python, installation, tmp_path):
    """:class:`Neighbours` around the test; it fails when a neighbour crashed or never ran."""
    around = Neighbours(sglang_python, tmp_path / "neighbours", installation.state)
    yield around
    for report in around.finish():
        assert "Traceback" not in report, report
        assert "runs " in report and "runs 0\n" not in report, report


def invoke(cli_runner, *args):
    return cli_runner.invoke(cli, ["patch", *args], catch_exceptions=False)


SWITCH_TO = DEFAULTS[:2] + ["sm120-flashinfer-allreduce-fusion", "redact-api-key"]
SCENARIOS = {
    # name: (set applied before, command, patch ids recorded after it)
    "apply": (None, ["apply"], DEFAULTS),
    "switch": (["sm120-torch-symm-mem"], ["apply", "--with", "sm120-flashinfer-allreduce-fusion"], SWITCH_TO),
    "revert": ([], ["revert"], None),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sigkill_at_every_file_operation_then_the_next_command_recovers(installation, neighbours, cli_runner,
                                                                        scenario, tmp_path):
    inst = installation
    before_with, command, after_ids = SCENARIOS[scenario]
    if before_with is not None:
        patching.apply(inst.python, with_=before_with)
    start = inst.snapshot()
    start_files, start_ids = inst.files(), inst.record_ids()

    trace = tmp_path / "trace"
    done = inst.kit(*command, trace=trace)
    assert done.returncode == 0, done.stderr
    ops = trace.read_text().splitlines()
    end_files = inst.files()
    assert inst.record_ids() == after_ids and end_files != start_files
    inst.assert_consistent()
    assert len(ops) >= 10
    # the journal is the first thing written; every operation after its rename finishes the command
    committed = next((int(line.split()[0]) for line in ops
                      if line.split()[1] == "replace" and line.endswith(".journal.json")), None)

    outcomes = []
    for n in range(1, len(ops) + 1):
        inst.restore(start)
        killed_trace = tmp_path / f"trace-{n}"
        killed = inst.kit(*command, kill_at=n, trace=killed_trace)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr)
        # the same operations in the same order up to the kill: the run is deterministic
        assert _normal(killed_trace.read_text().splitlines()) == _normal(ops[:n]), n
        # the next command: in turn status, verify, or the interrupted command run again
        rerun = n % 3 == 2
        nxt = invoke(cli_runner, *(command if rerun else [("status", "verify")[n % 3]]), "--python", inst.python)
        files, ids = inst.files(), inst.record_ids()
        # whatever the kill point: exactly the state before or exactly the command's result, recorded
        assert (files, ids) in ((start_files, start_ids), (end_files, after_ids)), (n, ops[n - 1], nxt.output)
        inst.assert_consistent()
        st = patching.status(inst.python)
        assert st.state == ("applied" if ids else "not_applied"), (n, st.problems)
        assert nxt.exit_code == (0 if ids or rerun else ExitCode.FAILED), (n, nxt.output)
        if committed is None:
            continue
        if n > committed or rerun:  # the journal was on disk (or the command ran again): it is finished
            assert (files, ids) == (end_files, after_ids), (n, ops[n - 1], nxt.output)
        else:                       # killed before the journal: nothing changed
            assert (files, ids) == (start_files, start_ids), (n, ops[n - 1], nxt.output)
        assert ("finished an interrupted patch" in nxt.stderr) == (n > committed), (n, nxt.output)
        outcomes.append("finished" if n > committed else "untouched")
    assert committed is not None, "no write-ahead journal"
    assert any(str(inst.site) in line for line in ops[committed:])  # site-packages changes after the journal
    assert "finished" in outcomes and "untouched" in outcomes


def _normal(ops: list[str]) -> list[str]:
    """Trace lines with what differs by design between two runs made alike: the pid in ``.NAME.PID.bak`` hard
    links (:func:`kimi_deploy.fsio._swap_in`) and the random part of a staging folder's name."""
    return [re.sub(r"\.stage\.[^/]+", ".stage.*", re.sub(r"\.[0-9]+\.bak$", ".PID.bak", line)) for line in ops]


def _killed_after_journal(inst: Installation, tmp_path: Path, *command: str) -> None:
    """Run ``command`` and kill it just after its journal is on disk, before site-packages changes."""
    trace = tmp_path / "trace-once"
    snap = inst.snapshot()
    assert inst.kit(*command, trace=trace).returncode == 0
    inst.restore(snap)
    ops = trace.read_text().splitlines()
    committed = next(int(line.split()[0]) for line in ops
                     if line.split()[1] == "replace" and line.endswith(".journal.json"))
    first_site = next(int(line.split()[0]) for line in ops if line.split()[1] == "replace"
                      and str(inst.site) in line)
    assert inst.kit(*command, kill_at=first_site + 1).returncode == -signal.SIGKILL
    assert committed < first_site and inst.store.journal_path.exists()


def test_an_unfinished_journal_is_never_verified(installation, cli_runner, tmp_path, monkeypatch, sglang_python):
    """A reader that cannot take the lock (the unit's unprivileged verify) reports `interrupted`,
    exit 1, with the fix, even though the old record still matches most files; a file changed since
    the interruption stops the recovery until the release is reinstalled."""
    inst = installation
    patching.apply(inst.python)
    _killed_after_journal(inst, tmp_path, "apply", "--with", "sm120-torch-symm-mem")

    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path) == str(inst.store.lock_path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(fsio.os, "open", denied)
        status = invoke(cli_runner, "status", "--python", inst.python)
        assert status.exit_code == ExitCode.FAILED
        assert f"{inst.site / 'sglang'}: interrupted" in status.stdout
        assert "problem: an interrupted patch apply is not finished" in status.stderr
        assert "it finishes the interrupted change first" in status.stderr
        verify = invoke(cli_runner, "verify", "--python", inst.python)
        assert verify.exit_code == ExitCode.FAILED and "patch series is interrupted" in verify.stderr
    assert inst.store.journal_path.exists()

    # a file the journal writes changed since (neither its start, its target nor the original)
    symm = SERIES.files_of(SERIES.get("sm120-torch-symm-mem"))[0]
    edited = inst.site / symm
    edited.write_text(edited.read_text() + "\n# edited by hand\n")
    st = patching.status(inst.python)
    assert st.state == "interrupted" and "cannot be finished" in st.problems[0]
    assert "reinstall the same SGLang release" in st.fix
    assert invoke(cli_runner, "apply", "--python", inst.python).exit_code == ExitCode.REFUSED
    assert invoke(cli_runner, "apply", "--python", inst.python, "--dry-run").exit_code == ExitCode.REFUSED
    shutil.copyfile(site_packages_of(sglang_python) / symm, edited)  # the reinstall: the same bytes
    result = invoke(cli_runner, "verify", "--python", inst.python)
    assert result.exit_code == 0, result.output
    assert "finished an interrupted patch apply" in result.stderr
    assert patching.verify(inst.python).selected == DEFAULTS[:2] + ["sm120-torch-symm-mem", "redact-api-key"]
    inst.assert_consistent()


def test_a_second_apply_waits_for_the_lock_or_fails_clearly(installation, cli_runner):
    inst = installation
    pristine = inst.files()
    with fsio.exclusive_lock(inst.store.lock_path, what="test"):
        busy = inst.kit("apply", env={fsio.LOCK_WAIT_ENV: "0"})
        assert busy.returncode == ExitCode.LOCKED, busy.stderr
        assert f"another kimi-deploy patch run on {inst.site / 'sglang'} is running" in busy.stderr
        assert f"held by pid {os.getpid()}" in busy.stderr
        status = inst.kit("status", env={fsio.LOCK_WAIT_ENV: "0"})
        assert status.returncode == ExitCode.LOCKED
    assert inst.files() == pristine and inst.record_ids() is None

    # two real runs at once, each asking for another set: the second waits, then applies its set
    # from the originals; whichever ran last is recorded and verified, nothing of the other is left
    env = dict(os.environ, KIMI_DEPLOY_STATE_DIR=str(inst.state))
    runs = [subprocess.Popen([sys.executable, "-m", "kimi_deploy", "patch", "apply", "--python", inst.python,
                              *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for extra in (["--with", "sm120-torch-symm-mem"], ["--only", "redact-api-key"])]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    for p in runs:
        p.stdout.close()
        p.stderr.close()
    assert [rc for rc, _ in results] == [0, 0], results
    final = patching.verify(inst.python)
    inst.assert_consistent()
    assert final.selected in (DEFAULTS[:2] + ["sm120-torch-symm-mem", "redact-api-key"], ["redact-api-key"])
    touched = {f for spec in SERIES.patch if spec.id in final.selected for f in SERIES.files_of(spec)}
    now = inst.files()
    assert {r for r in SERIES_FILES if now[r] != pristine[r]} == touched


def test_a_hunk_that_applies_only_at_an_offset_is_refused(installation, cli_runner):
    inst = installation
    detector = inst.site / DETECTOR
    # one line more before the class: the hunks below it match only one line further down (a hunk at the file's
    # first line, with no context above it, would fail outright instead)
    text = detector.read_text()
    at = text.index("\nclass ") + 1
    detector.write_text(text[:at] + "# a line the release does not have\n" + text[at:])
    before = tree_hashes(inst.site / "sglang")
    result = invoke(cli_runner, "apply", "--python", inst.python)
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "patch kimi-k2-tool-call-ids does not apply to this SGLang 0.5.23 exactly (only at an offset)" \
        in result.stderr
    assert "offset 1 line" in result.stderr
    assert tree_hashes(inst.site / "sglang") == before and inst.record_ids() is None
    st = patching.status(inst.python)
    assert {p.id: p.detail for p in st.patches}["kimi-k2-tool-call-ids"].startswith("applies only at an offset")
    with pytest.raises(KimiDeployError, match="only at an offset"):
        patching.apply(inst.python, dry_run=True)


def test_status_exit_code_follows_verify_and_revert_names_no_deleted_record(installation, cli_runner):
    inst = installation
    for args in (["status"], ["status", "--json"]):
        result = invoke(cli_runner, *args, "--python", inst.python)
        assert result.exit_code == ExitCode.FAILED, result.output   # not applied: a problem, not exit 0
    assert "problem: kimi-k2-tool-call-ids: not_applied" in result.stderr or args[-1] == "--json"
    assert json.loads(result.stdout)["state"] == "not_applied"
    assert invoke(cli_runner, "apply", "--python", inst.python).exit_code == 0
    ok = invoke(cli_runner, "status", "--python", inst.python)
    assert ok.exit_code == 0 and "problem:" not in ok.stderr
    reverted = invoke(cli_runner, "revert", "--python", inst.python)
    assert reverted.exit_code == 0, reverted.output
    assert "record deleted" in reverted.stdout
    assert str(inst.store.record_path) not in reverted.stdout and not inst.store.record_path.exists()


def test_nothing_in_a_shared_temporary_folder_changes_an_apply(installation, tmp_path):
    """The CI failure of issue 31: GNU patch writes its temporary files in ``$TMPDIR``, which every installation on
    the machine shares; when it could not (there: a disk another installation's killed runs were filling), the
    kit said ``patch ... does not apply`` with a reinstall fix (exit 4). The kit now stages, and lets GNU patch
    write, only under the installation's own state directory: an unusable ``$TMPDIR`` changes nothing."""
    inst = installation
    not_a_folder = tmp_path / "tmpdir-is-a-file"
    not_a_folder.write_text("a file where the temporary folder should be\n")
    done = inst.kit("apply", env={"TMPDIR": str(not_a_folder)})
    assert done.returncode == 0, done.stderr
    assert inst.record_ids() == DEFAULTS
    inst.assert_consistent()
    assert list(inst.store.directory.glob(f".{inst.store.key}.stage.*")) == []  # the staging folder is gone


def test_gnu_patch_in_trouble_is_not_a_patch_that_does_not_apply(tmp_path):
    """GNU patch's exit status 2 (serious trouble: its temporary file, the disk, an unreadable diff) is an
    external command failure (exit 5) with GNU patch's words, never the drift verdict (exit 4, "reinstall")."""
    from kimi_deploy.errors import ExternalCommandError
    from kimi_deploy.patching import installation

    (tmp_path / "tree").mkdir()
    diff = SERIES.diff_path(SERIES.get("kimi-k2-tool-call-ids"))
    (tmp_path / "a-file").write_text("not a folder\n")
    with pytest.raises(ExternalCommandError) as raised:
        installation._run_patch(tmp_path / "tree", diff, dry_run=True, tmpdir=tmp_path / "a-file")
    assert raised.value.exit_code == ExitCode.EXTERNAL
    assert "serious trouble" in raised.value.message
    assert "Can't create temporary file" in raised.value.stderr + raised.value.stdout
    # a diff that does not apply is still the verdict it was: exit 1 from GNU patch, no exception
    (tmp_path / "tree" / "sglang/srt/function_call").mkdir(parents=True)
    (tmp_path / "tree" / DETECTOR).write_text("not SGLang's detector\n")
    assert installation._run_patch(tmp_path / "tree", diff, dry_run=True, tmpdir=tmp_path).returncode == 1


def test_a_staging_folder_a_killed_run_left_is_removed_by_the_next_command(installation, tmp_path):
    """A run killed while it stages (from outside: no fault point there) leaves ``.<key>.stage.*``; the next
    command of that installation removes it under the lock; another installation's is left alone."""
    inst = installation
    patching.apply(inst.python)
    left = inst.store.directory / f".{inst.store.key}.stage.killed01"
    (left / "tree" / "sglang").mkdir(parents=True)
    (left / "tree" / "sglang" / "x.py").write_text("staged\n")
    other = inst.store.directory / ".0123456789abcdef.stage.killed02"
    other.mkdir()
    assert patching.status(inst.python).state == "applied"
    assert not left.exists() and other.is_dir()


def test_two_state_directories_on_one_sglang_are_serialised(installation, tmp_path):
    """Each state directory has its own lock file, but both write the same site-packages: a run with another
    ``--state-dir`` waits for the installation's own lock (its ``sglang`` folder) and fails clearly (exit 7)."""
    inst = installation
    with fsio.exclusive_lock(inst.site / "sglang", what="test"):
        busy = inst.kit("apply", env={fsio.LOCK_WAIT_ENV: "0", "KIMI_DEPLOY_STATE_DIR": str(tmp_path / "other")})
        assert busy.returncode == ExitCode.LOCKED, busy.stderr
        assert f"another kimi-deploy patch run on {inst.site / 'sglang'} is running" in busy.stderr
    assert inst.record_ids() is None and not (tmp_path / "other" / "patches" / f"{inst.store.key}.json").exists()
    assert sorted(os.listdir(inst.site / "sglang")) == sorted(os.listdir(site_packages_of(inst.python) / "sglang"))
