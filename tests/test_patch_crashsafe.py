"""`kimi-deploy patch` killed, raced and fed shifted files, against throwaway copies of real SGLang 0.5.23.

The kill harness runs the kit as a subprocess with ``KIMI_DEPLOY_FAULT_KILL_AT=N`` (kimi_deploy/fsio.py:
SIGKILL just before the N-th mutating file operation), for EVERY N of an apply, a switch of sets and a
revert, then runs the next ``patch`` command and asserts the installation is in a recorded, verified
state: either exactly what it was before, or exactly the result of the interrupted command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
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
        full = dict(os.environ, KIMI_DEPLOY_STATE_DIR=str(self.state), **(env or {}))
        for name, value in ((fsio.FAULT_KILL_ENV, kill_at), (fsio.FAULT_TRACE_ENV, trace)):
            full.pop(name, None)
            if value is not None:
                full[name] = str(value)
        return subprocess.run([sys.executable, "-m", "kimi_deploy", "patch", *args, "--python", self.python],
                              env=full, capture_output=True, text=True, timeout=300)

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

    def snapshot(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        site = {rel: (self.site / rel).read_bytes() for rel in SERIES_FILES}
        state = {str(p.relative_to(self.state)): p.read_bytes() for p in self.state.rglob("*") if p.is_file()}
        return site, state

    def restore(self, snap: tuple[dict[str, bytes], dict[str, bytes]]) -> None:
        site, state = snap
        for rel, data in site.items():
            (self.site / rel).write_bytes(data)
        for leftover in self.litter():
            leftover.unlink()
        shutil.rmtree(self.state, ignore_errors=True)
        for rel, data in state.items():
            (self.state / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.state / rel).write_bytes(data)

    def litter(self) -> list[Path]:
        """Temporary and backup files of an interrupted atomic write, in site-packages or the state dir."""
        dirs = {(self.site / rel).parent for rel in SERIES_FILES}
        found = [p for d in dirs for p in d.glob(".*") if p.suffix in (".tmp", ".bak")]
        return found + [p for p in self.state.rglob(".*") if p.suffix in (".tmp", ".bak")]

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


@pytest.fixture
def installation(sglang_python, tmp_path, monkeypatch) -> Installation:
    monkeypatch.setenv("KIMI_DEPLOY_STATE_DIR", str(tmp_path / "state"))
    for name in (fsio.FAULT_KILL_ENV, fsio.FAULT_TRACE_ENV, fsio.LOCK_WAIT_ENV):
        monkeypatch.delenv(name, raising=False)
    return Installation(make_target(sglang_python, tmp_path / "venv"), tmp_path / "state")


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
def test_sigkill_at_every_file_operation_then_the_next_command_recovers(installation, cli_runner, scenario,
                                                                        tmp_path):
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
        killed = inst.kit(*command, kill_at=n)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr)
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
