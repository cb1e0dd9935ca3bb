"""The patch state record: what kimi-deploy did to one SGLang installation.

One record per installation, outside site-packages (a reinstall of SGLang wipes
site-packages; the record must survive to notice it)::

    <state_dir>/patches/<key>.json          the audit record (this module's StateRecord)
    <state_dir>/patches/<key>.orig/         the original bytes of every touched file, by path
    <state_dir>/patches/<key>.journal.json  the write-ahead journal of a change in progress (Journal)
    <state_dir>/patches/<key>.lock          the lock every ``patch`` verb on this installation holds
    <state_dir>/patches/.<key>.stage.XXXXXXXX/  where ``apply`` tries the patches (removed after; a killed
                                            run's is removed by the next command, under the lock)

``<key>`` is the first 16 hex digits of sha256(real path of the ``sglang`` package),
so two virtual environments on one host never share a record. ``<state_dir>`` is
:func:`kimi_deploy.paths.state_dir` (``/var/lib/kimi-deploy``, ``$KIMI_DEPLOY_STATE_DIR``
or ``--state-dir``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kimi_deploy import fsio
from kimi_deploy.errors import UsageError
from kimi_deploy.fsio import write_atomic

RECORD_FORMAT = 1


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    """sha256 of a file's bytes, ``None`` when it does not exist."""
    try:
        return sha256_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


class FileRecord(BaseModel):
    """One touched file: sha256 before (original) and after patching, its mode."""

    model_config = ConfigDict(extra="forbid")

    before: str
    after: str
    mode: int


class PatchRecord(BaseModel):
    """One applied patch: its id and the sha256 of the diff that was applied."""

    model_config = ConfigDict(extra="forbid")

    id: str
    diff_sha256: str


class StateRecord(BaseModel):
    """The audit record written by ``kimi-deploy patch apply``.

    ``files`` maps paths relative to ``site_packages`` (``sglang/srt/...``) to hashes;
    ``applied_at`` is ISO 8601 UTC.
    """

    model_config = ConfigDict(extra="forbid")

    format: int = RECORD_FORMAT
    sglang_version: str
    sglang_location: str
    site_packages: str
    python: str
    kit_version: str
    applied_at: str
    patches: list[PatchRecord]
    files: dict[str, FileRecord]

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.patches]


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


class JournalFile(BaseModel):
    """One site-packages file a journaled change writes.

    ``start``: sha256 of its bytes when the change began; ``original``: sha256 of the release's
    original bytes; ``target``: sha256 of ``data`` (base64), the bytes the change writes; ``mode``:
    its permission bits.
    """

    model_config = ConfigDict(extra="forbid")

    start: str | None
    original: str
    target: str
    mode: int
    data: str


class Journal(BaseModel):
    """The write-ahead journal of one ``apply`` or ``revert``: everything needed to finish it.

    Written (fsynced, atomically renamed) before the first file in site-packages or the state
    directory changes and deleted as the change's last step, so a run killed in between leaves
    it for the next ``patch`` command to finish (:func:`kimi_deploy.patching.installation`).

    ``record``: the record after the change (``None``: a revert, no record after);
    ``originals``: base64 original bytes to keep in ``<key>.orig/`` (the record's files);
    ``drop_originals``: saved originals no longer needed; ``reset_originals``: delete every saved
    original first (the previous record was of another installation); ``files``: what to write
    into site-packages; ``started_at``: ISO 8601 UTC.
    """

    model_config = ConfigDict(extra="forbid")

    format: int = RECORD_FORMAT
    action: Literal["apply", "revert"]
    started_at: str
    sglang_version: str
    sglang_location: str
    record: StateRecord | None
    originals: dict[str, str]
    drop_originals: list[str]
    reset_originals: bool = False
    files: dict[str, JournalFile]

    @property
    def ids(self) -> list[str]:
        """The patch ids applied once the change is finished (none after a revert)."""
        return self.record.ids if self.record else []


def record_key(sglang_location: str) -> str:
    """Key of an installation's record: sha256 of the real path of its ``sglang`` folder, 16 hex digits."""
    return sha256_bytes(str(Path(sglang_location).resolve()).encode())[:16]


class StateStore:
    """Reads and writes the record and original copies of one installation under ``directory``."""

    def __init__(self, directory: Path, sglang_location: str) -> None:
        self.directory = directory
        self.key = record_key(sglang_location)

    @property
    def record_path(self) -> Path:
        return self.directory / f"{self.key}.json"

    @property
    def originals_dir(self) -> Path:
        return self.directory / f"{self.key}.orig"

    @property
    def journal_path(self) -> Path:
        return self.directory / f"{self.key}.journal.json"

    @property
    def lock_path(self) -> Path:
        return self.directory / f"{self.key}.lock"

    def load(self) -> StateRecord | None:
        """The record, or ``None`` when there is none.

        Raises:
            UsageError: the record exists but is not a valid record (exit 2).
        """
        return self._load(self.record_path, StateRecord, "record")

    def load_journal(self) -> Journal | None:
        """The journal of an unfinished change, or ``None`` when there is none.

        Raises:
            UsageError: the journal exists but does not validate (exit 2).
        """
        return self._load(self.journal_path, Journal, "journal")

    def _load(self, path: Path, model, what: str):
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read the patch state {what}: {exc.strerror}", value=str(path),
                             hint="run as a user that can read the state directory") from exc
        try:
            return model.model_validate(json.loads(text))
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
            raise UsageError(f"the patch state {what} is damaged", value=str(path),
                             hint="restore it from a backup, or reinstall SGLang and delete the record, the "
                                  "journal and the .orig folder before `kimi-deploy patch apply`") from exc

    def original(self, relpath: str) -> bytes | None:
        """The saved original bytes of ``relpath``, ``None`` when not saved."""
        try:
            return (self.originals_dir / relpath).read_bytes()
        except FileNotFoundError:
            return None

    def save_originals(self, originals: dict[str, bytes]) -> None:
        """Write the original copies (each atomically, 0644) before site-packages is touched."""
        for relpath, data in originals.items():
            write_atomic(self.originals_dir / relpath, data, mode=0o644)

    def drop_original(self, relpath: str) -> None:
        fsio.remove(self.originals_dir / relpath)

    def save_record(self, record: StateRecord) -> None:
        """Write the record atomically (0644: the service user's ``patch verify`` reads it)."""
        write_atomic(self.record_path, json.dumps(record.model_dump(), indent=2) + "\n", mode=0o644)

    def save_journal(self, journal: Journal) -> None:
        """Write the journal atomically and durably (file and directory fsynced), 0600: it holds
        no secret, but nothing but kimi-deploy has a reason to read it."""
        write_atomic(self.journal_path, json.dumps(journal.model_dump()) + "\n", mode=0o600)

    def drop_journal(self) -> None:
        fsio.remove(self.journal_path)

    @contextlib.contextmanager
    def stage(self) -> Iterator[Path]:
        """A new empty staging folder ``<directory>/.<key>.stage.XXXXXXXX`` for the block, removed after it.

        It lives beside this installation's record, not in a folder every installation shares (``/tmp``), so
        nothing another installation's runs leave behind can meet this one's; a folder a killed run left is
        deleted by :meth:`remove_litter`. Call only under the installation's lock.

        Raises:
            UsageError / StorageError: the folder cannot be created or removed.
        """
        fsio.mkdir(self.directory)
        try:
            folder = Path(tempfile.mkdtemp(prefix=f".{self.key}.stage.", dir=self.directory))
        except OSError as exc:
            raise fsio.os_failure(exc, "cannot create the patch staging folder", value=str(self.directory),
                                  hint="run as a user that can write the state directory (usually root)") from exc
        try:
            yield folder
        finally:
            fsio.remove_tree(folder)

    def remove_litter(self) -> None:
        """Delete what a killed run of this installation left in the state directory: temporary files of an
        atomic write of the record, journal or originals (``.<key>.json.XXXX.tmp``, ``.<key>.json.PID.bak``, the
        same under ``.orig/``) and staging folders (``.<key>.stage.XXXXXXXX``, :meth:`stage`).
        Call only under the installation's lock."""
        leftovers = list(self.directory.glob(f".{self.key}.*")) if self.directory.is_dir() else []
        if self.originals_dir.is_dir():
            leftovers += list(self.originals_dir.rglob(".*"))
        for leftover in leftovers:
            if leftover.suffix in (".tmp", ".bak") and leftover.is_file():
                fsio.remove(leftover)
            elif leftover.name.startswith(f".{self.key}.stage.") and leftover.is_dir() \
                    and not leftover.is_symlink():
                fsio.remove_tree(leftover)

    def forget(self) -> None:
        """Delete the record and the original copies."""
        fsio.remove(self.record_path)
        fsio.remove_tree(self.originals_dir)
