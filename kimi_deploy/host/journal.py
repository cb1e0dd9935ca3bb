"""A change in flight as a journal: ``restart --rollback-on-failure`` and ``upgrade`` are safe to kill at any instant.

A change moves one service from one complete version (every managed file, by sha256) to another, restarts it and
gates it (:mod:`kimi_deploy.host.gate`). Before its first write or restart it records its intent in
``/etc/kimi-deploy/<service>.change/`` (:meth:`kimi_deploy.paths.HostLayout.change_dir`): ``change.json``
(:class:`Change`: both versions' hashes, the environments, whether the new version was started, the gate's verdict
once known) and ``old.json``, the old version's bytes (host path -> base64: one file, one atomic write). It updates the record at each step
(:func:`update`) and removes it as its last act (:func:`finish`).

Every later command reads it first (:func:`recover`): ``restart``, ``upgrade``, ``install`` and ``uninstall``
finish or undo the interrupted change, ``status`` reports it (exit 1, with the command that resolves it). The
rule, whatever instant the kill came at:

- the gate passed (``verdict`` ``pass``) and the files are the new version: the change is complete, only its
  record and litter go;
- otherwise the old version comes back, whole: every file written back from ``old/`` (or removed where the old
  version had none), the backup sets the change made marked used (``<stamp>.rolled-back``, as a rollback that ran
  to its end does), systemd reloaded, and the service restarted on the old files when the new version may have
  been started (``restarted``). A unit that existed before the change is never stopped or disabled; only a first
  install's unit is, as a finished rollback of one does.

Litter (``.NAME.XXXXXXXX.tmp``, ``.NAME.PID.bak``, backup sets without their index, the install's intent record,
a journal folder without its ``change.json``) of the files a change names is removed with it
(:func:`litter`); ``status`` reports what remains.

The record takes other kinds of change by its ``kind`` (``restart``, ``upgrade``; ``tune`` for the candidates of
``kimi-deploy tune``, each a version gated the same way: kimi_deploy/tune/run.py) and, for a replica behind a gateway
(``replica``), the worker URL taken out of rotation: an interrupted change never adds it back (``restart`` does, once
it passed).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as _dt
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kimi_deploy import __version__, fsio
from kimi_deploy.errors import KimiDeployError, UsageError
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.host.records import BackupSet, list_backups, read_bytes, service_lock, sha256, stale_files
from kimi_deploy.deployment import Units
from kimi_deploy.paths import HostLayout

CHANGE_FORMAT = 1
CHANGE_FILE = "change.json"
OLD_FILE = "old.json"


class Change(BaseModel):
    """``change.json``: one change of one service, from the ``old`` version to the ``new`` one.

    ``old``/``new``: host path -> sha256 of the file in that version (None: the version has no such file); both
    name the same paths. ``touches_files``: the change writes the new files itself (``upgrade``); a ``restart``
    gates files an earlier ``install`` wrote, so before it restarts anything it has changed nothing.
    ``backup``: the install backup set (host path) holding the old version, used up by a rollback;
    ``backups_before``: the names of the service's backup sets when the change began (a set made since is the
    change's own). ``unit_existed``: the server unit was installed before the change (a rollback restarts it and
    never stops or disables it). ``restarted``: the new version may have been started (set before
    ``systemctl restart``). ``verdict``: the gate's on the new version (None: not known). ``replica``: the
    worker URL out of the gateway's rotation for this change (a fleet roll). ``resume``: the command that
    finishes or undoes the change (``status`` prints it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = CHANGE_FORMAT
    kind: Literal["restart", "upgrade", "tune"]
    service: str
    started_at: str
    kimi_deploy_version: str = __version__
    old_label: str
    new_label: str
    old: dict[str, str | None]
    new: dict[str, str | None]
    touches_files: bool
    backup: str | None = None
    backups_before: list[str] = []
    unit_existed: bool
    gate: str
    restarted: bool = False
    verdict: Literal["pass", "fail"] | None = None
    failed_tier: str | None = None
    failed_checks: list[str] = []
    replica: str | None = None
    resume: str

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, 2-space indent, trailing newline)."""
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()

    @property
    def phase(self) -> str:
        """Where it stopped, in words: ``not started``, ``files written``, ``started, not gated``,
        ``passed its gate``, ``failed its gate``."""
        if self.verdict == "pass":
            return "passed its gate"
        if self.verdict == "fail":
            return f"failed its gate ({self.failed_tier or 'a tier'})" if self.failed_tier else "failed its gate"
        if self.restarted:
            return "started, not gated"
        return "files being written" if self.touches_files else "not started"


def _saved(layout: HostLayout, service: str) -> dict[str, bytes]:
    """The old version's bytes the journal keeps (``old.json``: host path -> base64); empty when unreadable."""
    raw = read_bytes(layout.change_dir(service) / OLD_FILE)
    try:
        files = json.loads(raw) if raw is not None else {}
        return {hp: base64.b64decode(data, validate=True) for hp, data in files.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def load(layout: HostLayout, service: str) -> Change | None:
    """The journal of ``service``'s change in flight; None when there is none (a folder without ``change.json``
    is litter of a change that had finished or not yet begun: :func:`litter`).

    Raises:
        UsageError: ``change.json`` is not the shape :class:`Change` gives (written atomically, so a hand edit or
            a disk fault); the hint says to move the folder aside.
    """
    raw = read_bytes(layout.change_dir(service) / CHANGE_FILE)
    if raw is None:
        return None
    try:
        return Change.model_validate_json(raw)
    except ValidationError as exc:
        where = layout.host_path(layout.change_dir(service))
        raise UsageError("the journal of an interrupted change is unreadable",
                         value=layout.describe(f"{where}/{CHANGE_FILE}"),
                         hint=f"it is written atomically, so this is a hand edit or a disk fault "
                              f"({exc.error_count()} problems): compare the files with `{layout.command('status')}`, "
                              f"move {where} aside and run again") from None


def begin(layout: HostLayout, change: Change, old: Mapping[str, bytes | None]) -> Change:
    """Record ``change`` before its first write: the old version's bytes (``old``: host path -> bytes, None:
    absent) in ``old.json``, then ``change.json`` (renamed last: a folder without it is no change).

    Raises:
        UsageError: a change is already on record (callers recover it first); the journal cannot be written.
        StorageError: the file system refused (nothing else was changed).
    """
    folder = layout.change_dir(change.service)
    if (folder / CHANGE_FILE).exists():  # callers recover first (under the service's lock): never two changes
        raise UsageError(f"another change of {change.service} is on record; nothing was changed",
                         value=layout.describe(layout.host_path(folder / CHANGE_FILE)),
                         hint=f"run `{change.resume}` to finish or undo it first")
    if folder.exists():  # litter of a change killed before its record was complete, or after it was removed
        fsio.remove_tree(folder)
    saved = {hp: base64.b64encode(data).decode() for hp, data in old.items() if data is not None}
    # renamed in this order: a change.json is never without the bytes it names
    fsio.write_many_atomic({folder / OLD_FILE: json.dumps(saved, sort_keys=True) + "\n",
                            folder / CHANGE_FILE: change.to_bytes()}, mode=0o600)
    return change


def update(layout: HostLayout, change: Change, **fields: Any) -> Change:
    """``change`` with ``fields`` replaced, written (atomically) before the step they announce."""
    new = change.model_copy(update=fields)
    fsio.write_atomic(layout.change_dir(change.service) / CHANGE_FILE, new.to_bytes(), mode=0o600)
    return new


def finish(layout: HostLayout, change: Change) -> None:
    """End ``change``: its record first (from here on it is complete), then its folder and the litter of its files."""
    folder = layout.change_dir(change.service)
    fsio.remove(folder / CHANGE_FILE)
    remove_litter(layout, change.service, set(change.old) | set(change.new), intent=change.touches_files)


def version_of(layout: HostLayout, change: Change) -> Literal["old", "new", "mixed"]:
    """Which complete version the files are now: ``old``, ``new`` or ``mixed`` (neither, or some of each)."""
    now = {hp: (sha256(data) if (data := read_bytes(layout.under(hp))) is not None else None) for hp in change.old}
    if now == change.new:
        return "new"
    if now == change.old:
        return "old"
    return "mixed"


def hashes(files: Mapping[str, bytes | None]) -> dict[str, str | None]:
    """Host path -> sha256 of ``files``' bytes (None: absent)."""
    return {hp: (sha256(data) if data is not None else None) for hp, data in files.items()}


def litter(layout: HostLayout, service: str, host_paths: set[str] | list[str]) -> list[str]:
    """Host paths of what interrupted runs left next to ``host_paths`` (:func:`kimi_deploy.host.records.stale_files`)
    and a journal folder without its ``change.json`` (sorted)."""
    found = stale_files(layout, host_paths, service)
    folder = layout.change_dir(service)
    if folder.is_dir() and not (folder / CHANGE_FILE).exists():
        found.append(layout.host_path(folder))
    return sorted(found)


def remove_litter(layout: HostLayout, service: str, host_paths: set[str] | list[str], *, intent: bool) -> list[str]:
    """Remove :func:`litter`, and with ``intent`` the install's intent record (a change that wrote the files, or
    put the old version back: they are one complete version, nothing for it to vouch for); the host paths
    removed."""
    gone = []
    for hp in litter(layout, service, host_paths):
        path = layout.under(hp)
        if path.is_dir():
            fsio.remove_tree(path)
        else:
            fsio.remove(path)
        gone.append(hp)
    if intent and fsio.remove(layout.intent(service)):
        gone.append(layout.host_path(layout.intent(service)))
    return gone


@dataclasses.dataclass(frozen=True)
class Restored:
    """The old version written back by :func:`restore_old`: files rewritten, files removed, backup sets used up."""

    restored: list[str]
    removed: list[str]
    backups: list[str]


def restore_old(layout: HostLayout, change: Change) -> Restored:
    """Put the old version of every file ``change`` names back (idempotent: a file already right is not
    written) and mark the backup sets the change made, and the one it rolls back to, used (``.rolled-back``).

    Raises:
        UsageError: a saved file is missing from the journal (a hand edit); nothing was written.
        StorageError: the file system refused.
    """
    write_back: dict[Path, bytes] = {}
    remove: list[str] = []
    kept = _saved(layout, change.service)
    for hp, digest in sorted(change.old.items()):
        current = read_bytes(layout.under(hp))
        if digest is None:
            if current is not None:
                remove.append(hp)
            continue
        if current is not None and sha256(current) == digest:
            continue
        saved = kept.get(hp)
        if saved is None or sha256(saved) != digest:
            where = f"{layout.host_path(layout.change_dir(change.service))}/{OLD_FILE}"
            raise UsageError("the journal of an interrupted change lacks a file of the old version; nothing was "
                             "restored", value=layout.describe(f"{where}: {hp}"),
                             hint=f"restore {hp} from {layout.host_path(layout.service_backup_dir(change.service))} "
                                  f"by hand, then move {layout.host_path(layout.change_dir(change.service))} aside")
        write_back[layout.under(hp)] = saved
    fsio.write_many_atomic(write_back)
    for hp in remove:
        fsio.remove(layout.under(hp))
    used = []
    for backup in _sets_to_use(layout, change):
        fsio.rename(backup, backup.with_name(backup.name + ".rolled-back"))
        used.append(layout.host_path(backup))
    return Restored(sorted(layout.host_path(p) for p in write_back), remove, used)


def _sets_to_use(layout: HostLayout, change: Change) -> list[Path]:
    """The service's backup sets a rollback of ``change`` uses up: the one holding the old version and every
    complete one made since the change began (its own install's)."""
    before = set(change.backups_before)
    out = []
    for backup in list_backups(layout, change.service):
        hp = layout.host_path(backup.path)
        if hp == change.backup or (backup.path.name not in before and backup.operation == "install"):
            out.append(backup.path)
    return out


def backup_names(layout: HostLayout, service: str) -> list[str]:
    """The names of ``service``'s backup sets now (complete or not, used or not)."""
    base = layout.service_backup_dir(service)
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


@dataclasses.dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did with an interrupted change: ``target`` the version it ended at (``new``: the
    change was complete; ``old``: undone), the files it wrote back, the backup sets it used up, the litter it
    removed, the systemctl commands it ran, and ``restart_needed``: the old version's files are back but the
    server may still run the new one and the caller restarts it (``restart_unit=False``)."""

    change: Change
    target: Literal["old", "new"]
    restored: Restored | None
    litter: list[str]
    ran: list[str]
    restart_needed: bool
    notes: list[str]

    @property
    def changed_anything(self) -> bool:
        """False when the change had not begun (a ``restart`` killed before it restarted anything)."""
        return self.target == "new" or bool(self.restored and (self.restored.restored or self.restored.removed)) \
            or self.change.restarted

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.change.kind, "service": self.change.service, "phase": self.change.phase,
                "from": self.change.old_label, "to": self.change.new_label, "target": self.target,
                "restored": self.restored.restored if self.restored else [],
                "removed": self.restored.removed if self.restored else [],
                "backups_used": self.restored.backups if self.restored else [], "litter": self.litter,
                "ran": self.ran, "restart_needed": self.restart_needed, "notes": self.notes}

    def lines(self) -> list[str]:
        """The recovery in words, one line each."""
        c = self.change
        head = (f"an interrupted {c.kind} of {c.service} ({c.old_label} -> {c.new_label}; it had {c.phase})")
        if self.target == "new":
            out = [f"{head}: finished; {c.new_label} stays (it passed its gate)"]
        elif not self.changed_anything:
            out = [f"{head}: it had changed nothing; its record is removed"]
        else:
            out = [f"{head}: undone; {c.old_label} is back"
                   + (f" ({len(self.restored.restored)} file(s) written back, {len(self.restored.removed)} removed)"
                      if self.restored else "")]
        if self.litter:
            out.append(f"removed what it left: {', '.join(self.litter)}")
        return out + self.notes


def recover(layout: HostLayout, service: str, *, live: bool, restart_unit: bool = True,
            on_event: Callable[[str], None] | None = None) -> Recovery | None:
    """Finish or undo ``service``'s interrupted change, if there is one (the module docstring says which);
    None when there is none (stray litter of the journal folder is removed).

    The caller holds :func:`kimi_deploy.host.records.service_lock`. ``live``: systemctl may act on this host's
    manager (``daemon-reload``, ``restart``; False under ``--root`` without ``--systemd``: files only, and the
    notes say what was not run). ``restart_unit``: False when the caller restarts (and gates) the old version
    itself (``restart``); :attr:`Recovery.restart_needed` then says whether it must.

    Raises:
        UsageError: an unreadable journal or a saved file missing from it (nothing written).
        StorageError: the file system refused; the journal stays and the next run tries again.
        ExternalCommandError: systemctl failed; the files are the old version, the journal stays.
    """
    change = load(layout, service)
    if change is None:
        folder = layout.change_dir(service)
        if folder.is_dir():
            fsio.remove_tree(folder)
        return None
    say = on_event or (lambda _m: None)
    notes: list[str] = []
    ran: list[str] = []
    paths = set(change.old) | set(change.new)
    if change.verdict == "pass" and version_of(layout, change) == "new":
        say(f"finishing the interrupted {change.kind} of {service} (the new version passed its gate)")
        fsio.remove(layout.change_dir(service) / CHANGE_FILE)
        gone = remove_litter(layout, service, paths, intent=change.touches_files)
        return Recovery(change, "new", None, gone, ran, False, notes)
    if not change.touches_files and not change.restarted:  # a restart that had not restarted anything yet
        fsio.remove(layout.change_dir(service) / CHANGE_FILE)
        gone = remove_litter(layout, service, paths, intent=False)
        return Recovery(change, "old", None, gone, ran, False, notes)
    say(f"undoing the interrupted {change.kind} of {service}: putting {change.old_label} back")
    restored = restore_old(layout, change)
    units = Units.of(service)
    unit = units.server
    restart_needed = change.restarted and change.unit_existed
    if live:
        if restored.restored or restored.removed:
            ran.append(unit_facts.systemctl("daemon-reload").command)
        if change.restarted and not change.unit_existed:
            # a first install's unit: there is no old version to run (what a finished rollback of one does)
            with contextlib.suppress(KimiDeployError):
                ran.append(unit_facts.systemctl("disable", "--now", unit, units.check_timer).command)
            notes.append("that was a first install: no previous version to start; the service is stopped")
        elif restart_needed and restart_unit:
            say(f"restarting {unit} with the old files")
            ran.append(unit_facts.systemctl("restart", unit).command)
            restart_needed = False
    elif change.restarted:
        notes.append(f"systemd was not touched (--root without --systemd): restart {unit} on the host that runs "
                     "these files")
        restart_needed = False
    fsio.remove(layout.change_dir(service) / CHANGE_FILE)
    gone = remove_litter(layout, service, paths, intent=True)
    return Recovery(change, "old", restored, gone, ran, restart_needed, notes)


def recover_locked(layout: HostLayout, service: str, *, live: bool,
                   on_event: Callable[[str], None] | None = None) -> Recovery | None:
    """:func:`recover` under ``service``'s lock, taken only when there is something to recover (``install`` and
    ``uninstall`` call it before they plan)."""
    if not layout.change_dir(service).exists():
        return None
    with service_lock(layout, service):
        return recover(layout, service, live=live, on_event=on_event)


def stamp() -> str:
    """The current UTC time, ISO 8601 to the second (``started_at``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def old_version_from_backup(layout: HostLayout, service: str) -> tuple[BackupSet, dict[str, bytes | None]] | None:
    """``(backup set, host path -> old bytes)`` of the newest install backup not yet used: the version a
    ``restart --rollback-on-failure`` goes back to; None when there is none.

    Raises:
        UsageError: a file the set lists is missing from it.
    """
    backup = next((b for b in list_backups(layout, service) if b.operation == "install"), None)
    if backup is None:
        return None
    old: dict[str, bytes | None] = {}
    for hp, kind in backup.entries.items():
        if kind == "absent":
            old[hp] = None
            continue
        try:
            old[hp] = backup.saved(hp).read_bytes()
        except OSError as exc:
            raise UsageError("a file the backup set lists is not in it; nothing was restarted",
                             value=layout.describe(layout.host_path(backup.saved(hp))),
                             hint=f"{exc.strerror}: restore {hp} by hand, or move {layout.host_path(backup.path)} "
                                  "aside to roll back to an older set") from None
    return backup, old


def current(layout: HostLayout, host_paths: set[str] | list[str]) -> dict[str, bytes | None]:
    """Host path -> the bytes there now (None: absent)."""
    return {hp: read_bytes(layout.under(hp)) for hp in sorted(host_paths)}

