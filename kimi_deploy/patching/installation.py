"""Apply, revert and inspect a patch series on the SGLang installation of a target interpreter.

How a series is applied (all-or-nothing):

1. the installation is found by :func:`kimi_deploy.engine.probe` (version from its
   dist-info, real path of the ``sglang`` package); SGLang is never imported here;
2. the original bytes of every file the selected patches touch are copied into a
   temporary staging folder (originals come from the state record's copies when the
   installation is already patched, so a new selection always starts from pristine
   files);
3. each patch is checked with GNU ``patch --dry-run`` and applied, in series order,
   inside the staging folder only (``--fuzz=0``, and a hunk GNU patch places at an offset
   from the line its diff names is refused: a hunk applies exactly where written or not at all);
4. only when every patch applied there is the change written down as a write-ahead journal
   (:class:`~kimi_deploy.patching.state.Journal`: the record to be, the originals, the bytes
   to write; fsynced and atomically renamed into the state directory), then carried out by
   :func:`_finish`: originals saved, the results written into site-packages (all files
   staged first and renamed into place together, :mod:`kimi_deploy.fsio`), the audit record
   saved, SGLang's stale ``__pycache__/*.pyc`` for the changed files removed, the journal
   deleted last.

Every verb that reads or changes an installation (``status``, ``verify``, ``apply``,
``revert``) holds that installation's lock (:func:`kimi_deploy.fsio.exclusive_lock`) and
first finishes a journal a killed run left behind (:func:`_recover`, the same
:func:`_finish`), so after any interruption the next command leaves the installation
exactly as the journal's record says. A journal that cannot be finished (an unprivileged
``verify``, a file changed since) makes ``status``/``verify`` report ``interrupted``.

GNU patch (not ``git apply``): it works on any folder without a repository around it,
``--fuzz=0`` makes it strict, ``--dry-run`` and ``-R --dry-run`` tell "applies" from
"already applied", and the logged command can be pasted to reproduce a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import glob
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from kimi_deploy import __version__, fsio, paths, proc
from kimi_deploy import engine as target
from kimi_deploy.errors import ExternalCommandError, KimiDeployError, RefusedError
from kimi_deploy.fsio import write_many_atomic
from kimi_deploy.patching.series import PatchSpec, Series, available_versions, find_series, require_series
from kimi_deploy.patching.state import (
    FileRecord,
    Journal,
    JournalFile,
    PatchRecord,
    StateRecord,
    StateStore,
    b64decode,
    b64encode,
    sha256_bytes,
    sha256_file,
)

SeriesState = Literal["applied", "not_applied", "drifted", "partial", "interrupted", "no_series"]
PatchState = Literal["applied", "not_applied", "drifted"]

#: GNU patch options used for every run: strict, non-interactive, no side files.
PATCH_OPTIONS = ("-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-")
PATCH_HINT = "install GNU patch (Debian/Ubuntu: apt-get install patch; RHEL: dnf install patch)"


def reinstall_command(python: str, sglang_version: str) -> str:
    """pip's command that puts the original files of SGLang ``sglang_version`` back into ``python``'s
    environment (``--no-deps``: only SGLang's own files are replaced)."""
    return f"{shlex.quote(python)} -m pip install --force-reinstall --no-deps sglang=={sglang_version}"


def apply_command(python: str, ids: list[str], defaults: list[str], state_dir: str | None = None) -> str:
    """The ``kimi-deploy patch apply`` line whose result is exactly the set ``ids``.

    ``defaults``: the series' on-by-default ids. A set holding every default is written as
    ``--with`` the others (nothing when none); any other set as ``--only`` (``apply`` always
    applies exactly one set, so a fix that adds a patch must name the ones to keep too).
    ``state_dir``: the ``--state-dir`` the record was read from, repeated in the line (``None``: the default).
    """
    head = f"kimi-deploy patch apply --python {shlex.quote(python)}"
    tail = f" --state-dir {shlex.quote(state_dir)}" if state_dir else ""
    if set(defaults) <= set(ids):
        extra = [i for i in ids if i not in defaults]
        return head + (f" --with {','.join(extra)}" if extra else "") + tail
    return head + f" --only {','.join(ids)}" + tail


@dataclasses.dataclass(frozen=True)
class FileStatus:
    """One file a patch touches: ``path`` relative to site-packages, ``state`` of its bytes.

    ``state``: ``"patched"`` (sha256 equals the recorded after-hash), ``"original"``
    (equals the recorded before-hash), ``"changed"`` (neither: edited or reinstalled
    as another build), ``"missing"``, ``"unrecorded"`` (no record for this file).
    """

    path: str
    state: str
    sha256: str | None


@dataclasses.dataclass(frozen=True)
class PatchStatus:
    """One patch of the series as found on the installation.

    ``selected``: part of the set being checked (``--only``, the record's set, or the
    defaults). ``detail``: for a patch not applied, what ``patch --dry-run`` says.
    """

    id: str
    state: PatchState
    default: bool
    selected: bool
    purpose: str
    files: list[FileStatus]
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class SeriesStatus:
    """Result of :func:`status`: the series state of one SGLang installation.

    ``state``: ``"applied"`` (every selected patch applied, no file changed since),
    ``"not_applied"`` (none applied), ``"drifted"`` (a patched file changed after
    patching, e.g. ``pip install`` over it), ``"partial"`` (some selected patches
    applied, others not), ``"no_series"`` (the kit has no series for this version).
    ``fix``: the commands that make ``state`` ``"applied"`` (``None`` when it is): after drift
    that changed files, pip's reinstall of the same release then ``patch apply``; otherwise
    ``patch apply`` for the checked set. ``verify``, ``status`` and ``doctor`` all print it.
    ``reinstall_first``: a patched file has bytes that are neither original nor patched, so
    ``apply`` refuses until the same release is reinstalled. ``"interrupted"``: a killed
    ``apply``/``revert`` left its journal and this run could not finish it (``problems`` says
    why); never ``"applied"`` then. ``recovered``: what this call finished of such a journal
    (``""``: nothing was pending). ``state_dir``: the ``--state-dir`` the record was read from (``None``: the
    default), repeated in ``fix``'s ``patch apply`` line.
    """

    state: SeriesState
    python: str
    sglang_version: str
    sglang_location: str
    series_versions: list[str]
    selected: list[str]
    patches: list[PatchStatus]
    state_file: str
    recorded: dict[str, Any] | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    fix: str | None = None
    reinstall_first: bool = False
    recovered: str = ""
    state_dir: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == "applied"

    def apply_command(self, add: list[str] | None = None) -> str:
        """``kimi-deploy patch apply`` for the checked set plus ``add``, in series order."""
        wanted = set(self.selected) | set(add or [])
        ids = [p.id for p in self.patches if p.id in wanted]
        return apply_command(self.python, ids, [p.id for p in self.patches if p.default], self.state_dir)

    def remedy(self, add: list[str] | None = None) -> str:
        """The commands that leave the checked set plus ``add`` applied: the reinstall of the same
        release first when :attr:`reinstall_first`, then :meth:`apply_command`."""
        apply_line = f"`{self.apply_command(add)}`"
        if self.reinstall_first:
            return (f"reinstall the same SGLang release (`{reinstall_command(self.python, self.sglang_version)}`), "
                    f"then {apply_line}")
        return apply_line

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``--json``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ChangeResult:
    """Result of :func:`apply` / :func:`revert`.

    ``changed``: files in site-packages were (or, with ``dry_run``, would be) written.
    ``files``: paths relative to site-packages that were (would be) written.
    ``patches``: ids applied after the call (empty after a revert).
    ``recovered``: what the call first finished of a journal a killed run left (``""``: none).
    """

    action: Literal["apply", "revert"]
    changed: bool
    dry_run: bool
    message: str
    python: str
    sglang_version: str
    sglang_location: str
    patches: list[str]
    files: list[str]
    state_file: str
    removed_bytecode: list[str] = dataclasses.field(default_factory=list)
    recovered: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Install:
    python: str
    version: str
    location: Path
    site_packages: Path


def _install(python: str) -> _Install:
    info = target.probe(python)
    version, location = target.require_sglang(info)
    loc = Path(location)
    return _Install(python=info.python, version=version, location=loc, site_packages=loc.parent)


def _store(inst: _Install, state_dir: str | os.PathLike[str] | None) -> StateStore:
    return StateStore(paths.patch_state_dir(state_dir), str(inst.location))


def _usable_record(store: StateStore, inst: _Install) -> StateRecord | None:
    """The record when it belongs to this installation and version, else ``None`` (stale)."""
    record = store.load()
    if record is None:
        return None
    if record.sglang_version != inst.version or Path(record.sglang_location) != inst.location:
        return None
    return record


# ---------------------------------------------------------------- GNU patch


def _patch_program() -> str:
    program = proc.which("patch")
    if program is None:
        raise ExternalCommandError("GNU patch is not installed", command="patch", hint=PATCH_HINT)
    return program


#: GNU patch's exit status for "serious trouble" (patch(1), DIAGNOSTICS): it could not read the diff, create
#: its temporary files, or write; 1 means some hunks did not apply.
PATCH_TROUBLE = 2


def _run_patch(directory: Path, diff: Path, *, dry_run: bool, reverse: bool = False,
               tmpdir: Path | None = None) -> proc.Completed:
    """GNU patch on ``directory``; its temporary files go to ``tmpdir`` (default: ``$TMPDIR``).

    Raises:
        ExternalCommandError: GNU patch is missing, or it reported serious trouble (exit status 2): a failure of
            the host (disk, temporary files, the diff unreadable), never an answer about whether the diff applies.
    """
    argv = [_patch_program(), *PATCH_OPTIONS, "-d", str(directory), "-i", str(diff)]
    if reverse:
        argv.insert(2, "--reverse")
    if dry_run:
        argv.insert(2, "--dry-run")
    extra = {"LC_ALL": "C", **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {})}
    done = proc.run(argv, check=False, extra_env=extra, hint=PATCH_HINT)
    if done.returncode == PATCH_TROUBLE or done.returncode < 0:
        raise ExternalCommandError(
            "GNU patch failed (serious trouble, not a hunk that does not apply)" if done.returncode > 0 else
            f"GNU patch was killed by signal {-done.returncode}", command=done.shown, returncode=done.returncode,
            stdout=done.stdout, stderr=done.stderr,
            hint="its output above says why (a full disk, an unwritable temporary folder, an unreadable diff); fix "
                 "that and run the same command again: nothing was changed")
    return done


def _why(done: proc.Completed) -> str:
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return "; ".join(lines[-4:])[:600]


#: GNU patch's report of a hunk it placed away from the line its diff names (``LC_ALL=C``;
#: ``--fuzz=0`` still allows offsets): "Hunk #2 succeeded at 131 (offset 4 lines)."
_INEXACT = re.compile(r"Hunk #\d+ succeeded at \d+ (\(offset|with fuzz)")


def _inexact(done: proc.Completed) -> str:
    """GNU patch's lines about hunks applied at an offset (or with fuzz), ``""`` when every hunk was exact."""
    return "; ".join(ln.strip() for ln in done.stdout.splitlines() if _INEXACT.match(ln.strip()))[:600]


def _stage_and_apply(series: Series, selection: list[PatchSpec], bases: dict[str, bytes],
                     python: str, store: StateStore) -> dict[str, bytes]:
    """Apply ``selection`` to copies of ``bases`` in a staging folder; return the patched bytes.

    A patch must apply exactly: every hunk at the line its diff names (GNU patch would place a
    hunk at an offset when the same context occurs elsewhere, e.g. in a partly patched file:
    a table row inserted twice), so the result is the one the diff describes.

    The staging folder is the installation's own (:meth:`StateStore.stage`, GNU patch's temporary files
    inside it), never a shared one such as ``/tmp``: what another installation's runs leave there cannot change
    this one's outcome, and a folder a killed run left behind is removed by the next command
    (:meth:`StateStore.remove_litter`). Call only under the installation's lock.

    Raises:
        RefusedError: a patch does not apply to the files, or only at an offset (nothing outside
            the staging folder was touched).
        ExternalCommandError: GNU patch reported serious trouble (:func:`_run_patch`).
        UsageError / StorageError: the staging folder cannot be written.
    """
    with store.stage() as stage:
        for relpath, data in bases.items():
            dest = stage / "tree" / relpath
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
            except OSError as exc:
                raise fsio.os_failure(exc, "cannot stage the files to patch", value=str(dest),
                                      hint="run as a user that can write the state directory (usually root); "
                                           "nothing was changed") from exc
        for spec in selection:
            diff = series.diff_path(spec)
            for dry in (True, False):
                done = _run_patch(stage / "tree", diff, dry_run=dry, tmpdir=stage)
                why = _why(done) if not done.ok else _inexact(done)
                if why:
                    raise RefusedError(
                        f"patch {spec.id} does not apply to this SGLang {series.sglang_version}"
                        f"{'' if not done.ok else ' exactly (only at an offset)'}; nothing was changed",
                        value=why,
                        hint="the files differ from the release the series was written for: reinstall the same "
                             f"SGLang release (`{reinstall_command(python, series.sglang_version)}`) and apply "
                             "again, or leave this patch out with --only")
        return {relpath: (stage / "tree" / relpath).read_bytes() for relpath in bases}


def _remove_bytecode(site_packages: Path, relpaths: list[str]) -> list[str]:
    """Delete ``__pycache__/<name>.*.pyc`` of each changed ``.py``; returns the paths removed."""
    removed = []
    for relpath in relpaths:
        source = site_packages / relpath
        cache = source.parent / "__pycache__"
        if source.suffix != ".py" or not cache.is_dir():
            continue
        for pyc in cache.glob(f"{glob.escape(source.stem)}.*.pyc"):
            with contextlib.suppress(KimiDeployError):
                if fsio.remove(pyc):
                    removed.append(str(pyc.relative_to(site_packages)))
    return removed


def _remove_litter(site_packages: Path, relpaths: list[str]) -> None:
    """Delete what a killed :func:`kimi_deploy.fsio.write_many_atomic` left next to ``relpaths``:
    staged ``.NAME.XXXXXXXX.tmp`` files and ``.NAME.PID.bak`` hard links. Only called under the
    installation's lock, so no other kimi-deploy run is writing them."""
    for relpath in relpaths:
        path = site_packages / relpath
        for leftover in path.parent.glob(f".{glob.escape(path.name)}.*"):
            if leftover.suffix in (".tmp", ".bak") and leftover.is_file():
                with contextlib.suppress(KimiDeployError):
                    fsio.remove(leftover)


# ---------------------------------------------------------------- lock and journal


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _locked(inst: _Install, store: StateStore, *, read_only: bool = False) -> Iterator[bool]:
    """Hold the installation's ``patch`` locks for the block: a ``flock(2)`` on its ``sglang`` folder (every
    state directory's runs on it), then on ``<key>.lock`` in the state directory; yields whether both are held.

    ``read_only`` (``status``, ``verify``): a user who cannot create the lock file (the
    service user running ``verify``) goes on without it (yields ``False``); it can read but
    not finish a journal, so it reports ``interrupted`` instead of a stale answer. With no
    state folder yet there is no record or journal to guard: a read creates nothing (``False``).

    Raises:
        LockedError: another ``kimi-deploy patch`` on this installation held it for
            :data:`kimi_deploy.fsio.LOCK_WAIT_S` seconds (exit 7).
    """
    if read_only and not store.directory.is_dir():
        yield False
        return
    what = f"patch run on {inst.location}"
    # The installation's own folder first: runs with different state directories (--state-dir,
    # $KIMI_DEPLOY_STATE_DIR) on one SGLang each have their own lock file, but write the same site-packages.
    with fsio.exclusive_lock(inst.location, what=what, unavailable_ok=read_only) as tree, \
            fsio.exclusive_lock(store.lock_path, what=what, unavailable_ok=read_only) as held:
        yield tree is not None and held is not None


def _recover(inst: _Install, store: StateStore) -> str:
    """Finish the change a killed run left in the journal, under the lock; ``""`` when none was pending,
    else one line saying what was finished.

    A journal of another SGLang version (the installation was replaced since) is deleted unused.

    Raises:
        RefusedError: a file the journal writes has bytes that are neither those it started from,
            its target nor the release's original (changed since the interruption): nothing written.
        UsageError: a damaged journal; the files cannot be written.
    """
    store.remove_litter()
    journal = store.load_journal()
    if journal is None:
        return ""
    if journal.sglang_version != inst.version or Path(journal.sglang_location) != inst.location:
        store.drop_journal()
        return (f"deleted the journal of an interrupted patch {journal.action} on SGLang {journal.sglang_version}: "
                f"the installation is now {inst.version}")
    for relpath, entry in journal.files.items():
        digest = sha256_file(inst.site_packages / relpath)
        if digest not in (entry.start, entry.target, entry.original):
            raise RefusedError(
                f"an interrupted patch {journal.action} cannot be finished: a file it writes changed since",
                value=str(inst.site_packages / relpath),
                hint="reinstall the same SGLang release "
                     f"(`{reinstall_command(inst.python, inst.version)}`), then run any `kimi-deploy patch` "
                     "command again: it finishes the interrupted change")
    _finish(inst, store, journal)
    done = f"apply of {', '.join(journal.ids)}" if journal.action == "apply" else "revert"
    return f"finished an interrupted patch {done} (started {journal.started_at})"


def _finish(inst: _Install, store: StateStore, journal: Journal) -> list[str]:
    """Carry out ``journal`` (already durable in the state directory) and delete it; returns the
    ``.pyc`` files removed. Idempotent: after a kill at any step, running it again from the
    start ends in the same files, record and originals.

    Order: saved originals, site-packages (staged, then renamed together), the record (or its
    deletion), originals no longer needed, stale bytecode and leftover temporary files, the journal.
    """
    if journal.reset_originals:
        fsio.remove_tree(store.originals_dir)
    originals = {r: b64decode(d) for r, d in journal.originals.items()}
    store.save_originals({r: d for r, d in originals.items() if store.original(r) != d})
    writes = {r: b64decode(e.data) for r, e in journal.files.items()
              if sha256_file(inst.site_packages / r) != e.target}
    write_many_atomic({inst.site_packages / r: d for r, d in writes.items()},
                      modes={inst.site_packages / r: journal.files[r].mode for r in writes})
    if journal.record is not None:
        store.save_record(journal.record)
        for relpath in journal.drop_originals:
            store.drop_original(relpath)
    else:
        store.forget()
    removed = _remove_bytecode(inst.site_packages, sorted(journal.files))
    _remove_litter(inst.site_packages, sorted(journal.files))
    store.drop_journal()
    return removed


def _journal(inst: _Install, action: Literal["apply", "revert"], record: StateRecord | None, *,
             writes: dict[str, bytes], bases: dict[str, bytes], modes: dict[str, int],
             keep: dict[str, bytes] | None = None, drop_originals: list[str] | None = None,
             reset_originals: bool = False) -> Journal:
    """The journal of a change: ``writes`` (relpath -> bytes) into site-packages, ``bases`` the
    release's original bytes of each, ``keep`` the originals the new ``record`` needs saved."""
    return Journal(
        action=action, started_at=_now(), sglang_version=inst.version, sglang_location=str(inst.location),
        record=record, originals={r: b64encode(d) for r, d in (keep or {}).items()},
        drop_originals=drop_originals or [], reset_originals=reset_originals,
        files={r: JournalFile(start=sha256_file(inst.site_packages / r), original=sha256_bytes(bases[r]),
                              target=sha256_bytes(d), mode=modes[r], data=b64encode(d))
               for r, d in writes.items()})


# ---------------------------------------------------------------- status / verify


def _file_status(site_packages: Path, relpath: str, record: StateRecord | None) -> FileStatus:
    digest = sha256_file(site_packages / relpath)
    rec = record.files.get(relpath) if record else None
    if digest is None:
        state = "missing"
    elif rec is None:
        state = "unrecorded"
    elif digest == rec.after:
        state = "patched"
    elif digest == rec.before:
        state = "original"
    else:
        state = "changed"
    return FileStatus(path=relpath, state=state, sha256=digest)


def status(python: str, *, only: list[str] | None = None,
           state_dir: str | os.PathLike[str] | None = None) -> SeriesStatus:
    """State of the kit's patch series on the SGLang installation of ``python``.

    The patches checked are ``only`` if given, else those the state record says were
    applied, else the series' defaults.

    Raises:
        UsageError: the interpreter is missing or has no SGLang; an unknown id in ``only``;
            a damaged manifest or record.
        ExternalCommandError: the interpreter failed to run the probe.
    """
    inst = _install(python)
    store = _store(inst, state_dir)
    with _locked(inst, store, read_only=True) as held:
        pending: tuple[str, str | None] | None = None
        recovered = ""
        if not held:
            if store.journal_path.exists():
                pending = (f"this user cannot take the patch lock to finish it (it cannot write {store.directory})",
                           None)
        else:
            try:
                recovered = _recover(inst, store)
            except KimiDeployError as exc:
                pending = (exc.message + (f" ({exc.value})" if exc.value else ""), exc.hint)
        return _status(inst, store, only, pending=pending, recovered=recovered,
                       state_dir=os.fspath(state_dir) if state_dir is not None else None)


def _status(inst: _Install, store: StateStore, only: list[str] | None, *,
            pending: tuple[str, str | None] | None, recovered: str, state_dir: str | None = None) -> SeriesStatus:
    """:func:`status` under the lock. ``pending``: why an unfinished journal is still there and its fix
    (``None``: the default one), which makes the state ``interrupted``; ``recovered``: what
    :func:`_recover` just finished."""
    versions = available_versions()
    series = find_series(inst.version)
    if series is None:
        return SeriesStatus(
            state="no_series", python=inst.python, sglang_version=inst.version,
            sglang_location=str(inst.location), series_versions=versions, selected=[], patches=[],
            state_file=str(store.record_path),
            problems=[f"kimi-deploy has no patch series for SGLang {inst.version} "
                      f"(series exist for: {', '.join(versions) or 'none'})"],
            fix=f"install an SGLang release the kit has a series for ({', '.join(versions) or 'none'}), or set "
                "[service] verify_patches = false and re-render the unit")
    raw = store.load()
    record = _usable_record(store, inst)
    problems: list[str] = []
    if raw is not None and record is None:
        problems.append(f"the record is for SGLang {raw.sglang_version} at {raw.sglang_location}; "
                        f"the installation is now {inst.version}: its patches are gone")
    journal = None
    if pending:
        with contextlib.suppress(KimiDeployError):
            journal = store.load_journal()
    if only:
        selected = [p.id for p in series.select(only=only)]
    elif journal is not None and journal.record is not None:
        selected = [i for i in journal.ids if i in series.ids]
    elif raw is not None:
        selected = [i for i in raw.ids if i in series.ids]
    else:
        selected = [p.id for p in series.defaults]
    recorded_ids = set(record.ids) if record else set()
    patches: list[PatchStatus] = []
    for spec in series.patch:
        files = [_file_status(inst.site_packages, rel, record) for rel in series.files_of(spec)]
        detail = ""
        if spec.id in recorded_ids and all(f.state == "patched" for f in files):
            state: PatchState = "applied"
        elif spec.id in recorded_ids or (raw is not None and record is None and spec.id in raw.ids):
            state = "drifted"
            detail = ", ".join(f"{f.path} {f.state}" for f in files if f.state != "patched")
        else:
            state = "not_applied"
            if spec.id in selected:
                detail = _dry_run_detail(series, spec, inst.site_packages)
        patches.append(PatchStatus(id=spec.id, state=state, default=spec.default, selected=spec.id in selected,
                                   purpose=spec.purpose, files=files, detail=detail))
    chosen = [p for p in patches if p.selected]
    states = {p.state for p in chosen}
    if pending:
        overall: SeriesState = "interrupted"
        action = journal.action if journal else "change"
        problems.insert(0, f"an interrupted patch {action} is not finished (journal {store.journal_path}): "
                           f"{pending[0]}")
    elif "drifted" in states:
        overall = "drifted"
    elif states <= {"applied"}:
        overall = "applied"
    elif states == {"not_applied"}:
        overall = "not_applied"
    else:
        overall = "partial"
    for p in chosen:
        if p.state != "applied":
            problems.append(f"{p.id}: {p.state}" + (f" ({p.detail})" if p.detail else ""))
    recorded = None
    if raw is not None:
        recorded = {"sglang_version": raw.sglang_version, "applied_at": raw.applied_at,
                    "kit_version": raw.kit_version, "patches": raw.ids}
    result = SeriesStatus(state=overall, python=inst.python, sglang_version=inst.version,
                          sglang_location=str(inst.location), series_versions=versions, selected=selected,
                          patches=patches, state_file=str(store.record_path), recorded=recorded, problems=problems,
                          recovered=recovered, state_dir=state_dir)
    if overall == "applied":
        return result
    if pending:
        return dataclasses.replace(
            result, fix=pending[1] or f"as root (a user that can write {inst.site_packages} and {store.directory}) "
                                      f"run {result.remedy()}: it finishes the interrupted change first")
    # A file that is neither the original nor the patched bytes makes `apply` refuse (drift): only a
    # reinstall of the same release brings the originals back. A stale record (another version)
    # or files already back to their originals need `apply` alone.
    reinstall = record is not None and any(f.state in ("changed", "missing")
                                           for p in chosen if p.state == "drifted" for f in p.files)
    result = dataclasses.replace(result, reinstall_first=reinstall)
    return dataclasses.replace(result, fix=result.remedy())


def _dry_run_detail(series: Series, spec: PatchSpec, site_packages: Path) -> str:
    try:
        done = _run_patch(site_packages, series.diff_path(spec), dry_run=True)
        if done.ok:
            inexact = _inexact(done)
            return f"applies only at an offset, so apply refuses it: {inexact}" if inexact else "applies cleanly"
        if _run_patch(site_packages, series.diff_path(spec), dry_run=True, reverse=True).ok:
            return "the files already carry this change but kimi-deploy has no record of it"
        return "does not apply to the installed files"
    except ExternalCommandError as exc:
        return exc.message


def verify(python: str, *, only: list[str] | None = None,
           state_dir: str | os.PathLike[str] | None = None) -> SeriesStatus:
    """:func:`status`, raising unless the series is fully applied and no patched file changed.

    Used by the server unit's ``ExecStartPre=`` so that a reinstall or upgrade that
    wiped the patches cannot start an unpatched server unnoticed.

    Raises:
        KimiDeployError: state is not ``"applied"`` (exit 1), listing each problem.
        UsageError / ExternalCommandError: as :func:`status`.
    """
    return require_applied(status(python, only=only, state_dir=state_dir))


def require_applied(result: SeriesStatus) -> SeriesStatus:
    """``result`` when its state is ``"applied"``.

    Raises:
        KimiDeployError: any other state (exit 1), with each problem and the fix.
    """
    if result.state != "applied":
        raise KimiDeployError(
            f"SGLang {result.sglang_version} patch series is {result.state.replace('_', ' ')}",
            value="; ".join(result.problems) or None,
            hint=result.fix if result.state == "no_series" else f"{result.fix}, then restart the service")
    return result


# ---------------------------------------------------------------- apply / revert


def _bases(inst: _Install, store: StateStore, record: StateRecord | None,
           relpaths: list[str]) -> tuple[dict[str, bytes], dict[str, int]]:
    """Original bytes and modes of ``relpaths``.

    Raises:
        RefusedError: a recorded file changed after patching (drift); a saved original is damaged.
    """
    bases: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    for relpath in relpaths:
        path = inst.site_packages / relpath
        try:
            current = path.read_bytes()
            modes[relpath] = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            raise RefusedError(f"a file the series patches is missing from SGLang {inst.version}",
                               value=str(path),
                               hint="the installation is incomplete: reinstall the same SGLang release "
                                    f"(`{reinstall_command(inst.python, inst.version)}`)") from None
        rec = record.files.get(relpath) if record else None
        digest = sha256_bytes(current)
        if rec is None or digest == rec.before:
            bases[relpath] = current
        elif digest == rec.after:
            original = store.original(relpath)
            if original is None or sha256_bytes(original) != rec.before:
                raise RefusedError("the saved original of a patched file is missing or damaged",
                                   value=str(store.originals_dir / relpath),
                                   hint="reinstall the same SGLang release "
                                        f"(`{reinstall_command(inst.python, inst.version)}`), "
                                        "then run this `kimi-deploy patch apply` again")
            bases[relpath] = original
        else:
            raise RefusedError("a patched file changed after kimi-deploy patched it (drift)", value=str(path),
                               hint="reinstall the same SGLang release "
                                    f"(`{reinstall_command(inst.python, inst.version)}`) to get the original "
                                    "files back, then run this `kimi-deploy patch apply` again")
    return bases, modes


def apply(python: str, *, only: list[str] | None = None, with_: list[str] | None = None,
          state_dir: str | os.PathLike[str] | None = None, dry_run: bool = False) -> ChangeResult:
    """Apply the series (``only``, else the defaults plus ``with_``) to the SGLang of ``python``.

    All-or-nothing and idempotent: applying the set already applied writes nothing;
    another set is applied from the original files, so the result is exactly that set.

    Raises:
        UnsupportedVersionError: no series for the installed SGLang version (exit 2).
        RefusedError: a patch does not apply, or a patched file drifted (exit 4); nothing changed.
        UsageError: unknown id; the state directory or site-packages cannot be written.
        ExternalCommandError: GNU patch or the interpreter is missing or fails.
    """
    inst = _install(python)
    series = require_series(inst.version)
    selection = series.select(only=only, with_=with_)
    store = _store(inst, state_dir)
    with _changing(inst, store, dry_run=dry_run) as recovered:
        return _apply(inst, store, series, selection, dry_run=dry_run, recovered=recovered)


@contextlib.contextmanager
def _changing(inst: _Install, store: StateStore, *, dry_run: bool) -> Iterator[str]:
    """The lock of ``apply``/``revert``, with a journal a killed run left finished first; yields what
    was finished (``""``: nothing). ``dry_run`` writes nothing, so it refuses while a journal is pending.

    Raises:
        LockedError: another ``kimi-deploy patch`` holds the lock (exit 7).
        RefusedError: a pending journal cannot be finished (see :func:`_recover`), or ``dry_run``
            with a journal pending (exit 4).
    """
    with _locked(inst, store):
        if dry_run and store.journal_path.exists():
            raise RefusedError("an interrupted patch run is not finished yet; --dry-run writes nothing",
                               value=str(store.journal_path),
                               hint=f"run `kimi-deploy patch status --python {shlex.quote(inst.python)}` (it "
                                    "finishes the interrupted change), then this command again")
        yield "" if dry_run else _recover(inst, store)


def _apply(inst: _Install, store: StateStore, series: Series, selection: list[PatchSpec], *, dry_run: bool,
           recovered: str) -> ChangeResult:
    """:func:`apply` under the lock, once any pending journal is finished."""
    ids = [p.id for p in selection]
    record = _usable_record(store, inst)

    def result(changed: bool, message: str, files: list[str], removed: list[str] | None = None) -> ChangeResult:
        return ChangeResult(action="apply", changed=changed, dry_run=dry_run, message=message, python=inst.python,
                            sglang_version=inst.version, sglang_location=str(inst.location),
                            patches=ids, files=files, state_file=str(store.record_path),
                            removed_bytecode=removed or [], recovered=recovered)

    relpaths: list[str] = []
    for spec in selection:
        relpaths += [r for r in series.files_of(spec) if r not in relpaths]
    if record:
        relpaths += [r for r in record.files if r not in relpaths]
    bases, modes = _bases(inst, store, record, relpaths)
    if record and record.ids == ids and all(
            sha256_file(inst.site_packages / r) == f.after for r, f in record.files.items()):
        return result(False, f"already applied: {', '.join(ids)} (nothing to do)", [])
    patched = _stage_and_apply(series, selection, bases, inst.python, store)
    writes = {r: data for r, data in patched.items()
              if sha256_file(inst.site_packages / r) != sha256_bytes(data)}
    if dry_run:
        return result(bool(writes), f"would apply {', '.join(ids)}: every patch applies", sorted(writes))
    touched = {r for spec in selection for r in series.files_of(spec)}
    new_record = StateRecord(
        sglang_version=inst.version, sglang_location=str(inst.location), site_packages=str(inst.site_packages),
        python=inst.python, kit_version=__version__, applied_at=_now(),
        patches=[PatchRecord(id=s.id, diff_sha256=series.diff_sha256(s)) for s in selection],
        files={r: FileRecord(before=sha256_bytes(bases[r]), after=sha256_bytes(patched[r]), mode=modes[r])
               for r in relpaths if r in touched})
    # Write-ahead: the whole change is on disk before the first file in site-packages changes.
    journal = _journal(inst, "apply", new_record, writes=writes, bases=bases, modes=modes,
                       keep={r: bases[r] for r in new_record.files},
                       drop_originals=[r for r in relpaths if r not in touched],  # their originals are back
                       reset_originals=record is None)  # a stale record's originals are useless now
    store.save_journal(journal)
    removed = _finish(inst, store, journal)
    return result(bool(writes), f"applied {', '.join(ids)} to SGLang {inst.version}", sorted(writes), removed)


def revert(python: str, *, state_dir: str | os.PathLike[str] | None = None, force: bool = False,
           dry_run: bool = False) -> ChangeResult:
    """Restore the original bytes of every file kimi-deploy patched, then delete the record.

    Raises:
        RefusedError: a patched file changed after patching (exit 4) and ``force`` is not set
            (``force`` restores the saved original anyway); the record is for another
            SGLang version (``force`` deletes that stale record only).
        UsageError / ExternalCommandError: as :func:`apply`.
    """
    inst = _install(python)
    store = _store(inst, state_dir)
    with _changing(inst, store, dry_run=dry_run) as recovered:
        return _revert(inst, store, force=force, dry_run=dry_run, recovered=recovered)


def _revert(inst: _Install, store: StateStore, *, force: bool, dry_run: bool, recovered: str) -> ChangeResult:
    """:func:`revert` under the lock, once any pending journal is finished."""
    raw = store.load()

    def result(changed: bool, message: str, files: list[str], removed: list[str] | None = None) -> ChangeResult:
        return ChangeResult(action="revert", changed=changed, dry_run=dry_run, message=message, python=inst.python,
                            sglang_version=inst.version, sglang_location=str(inst.location), patches=[],
                            files=files, state_file=str(store.record_path), removed_bytecode=removed or [],
                            recovered=recovered)

    if raw is None:
        return result(False, "not patched by kimi-deploy (no record): nothing to revert", [])
    record = _usable_record(store, inst)
    if record is None:
        if not force:
            raise RefusedError(f"the patch record is for SGLang {raw.sglang_version}, the installation is now "
                               f"{inst.version}", value=str(store.record_path),
                               hint="an upgrade already replaced the patched files; pass --force to delete "
                                    "the stale record")
        if not dry_run:
            store.forget()
        return result(False, "deleted the stale record of another SGLang version; no file changed", [])
    restores: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    for relpath, rec in record.files.items():
        path = inst.site_packages / relpath
        digest = sha256_file(path)
        if digest == rec.before:
            continue
        if digest != rec.after and not force:
            raise RefusedError("a patched file changed after kimi-deploy patched it (drift); nothing was changed",
                               value=str(path),
                               hint="pass --force to restore the saved original anyway, or reinstall the same "
                                    f"SGLang release (`{reinstall_command(inst.python, inst.version)}`)")
        original = store.original(relpath)
        if original is None or sha256_bytes(original) != rec.before:
            raise RefusedError("the saved original of a patched file is missing or damaged; nothing was changed",
                               value=str(store.originals_dir / relpath),
                               hint="reinstall the same SGLang release "
                                    f"(`{reinstall_command(inst.python, inst.version)}`)")
        restores[relpath] = original
        modes[relpath] = rec.mode
    if dry_run:
        return result(bool(restores), f"would restore {len(restores)} file(s)", sorted(restores))
    journal = _journal(inst, "revert", None, writes=restores, bases=restores, modes=modes)
    store.save_journal(journal)
    removed = _finish(inst, store, journal)
    return result(bool(restores), f"reverted {', '.join(record.ids)}: original files restored, record deleted",
                  sorted(restores), removed)


__all__ = ["ChangeResult", "FileStatus", "PatchStatus", "SeriesStatus", "apply", "apply_command",
           "reinstall_command", "require_applied", "revert", "status", "verify"]
