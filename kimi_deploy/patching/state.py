"""The patch state record: what kimi-deploy did to one SGLang installation.

One record per installation, outside site-packages (a reinstall of SGLang wipes
site-packages; the record must survive to notice it)::

    <state_dir>/patches/<key>.json     the audit record (this module's StateRecord)
    <state_dir>/patches/<key>.orig/    the original bytes of every touched file, by path

``<key>`` is the first 16 hex digits of sha256(real path of the ``sglang`` package),
so two virtual environments on one host never share a record. ``<state_dir>`` is
:func:`kimi_deploy.paths.state_dir` (``/var/lib/kimi-deploy``, ``$KIMI_DEPLOY_STATE_DIR``
or ``--state-dir``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

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

    def load(self) -> StateRecord | None:
        """The record, or ``None`` when there is none.

        Raises:
            UsageError: the record exists but is not a valid record (exit 2).
        """
        try:
            text = self.record_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read the patch state record: {exc.strerror}", value=str(self.record_path),
                             hint="run as a user that can read the state directory") from exc
        try:
            return StateRecord.model_validate(json.loads(text))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise UsageError("the patch state record is damaged", value=str(self.record_path),
                             hint="restore it from a backup, or reinstall SGLang and delete the record "
                                  "before `kimi-deploy patch apply`") from exc

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

    def save_record(self, record: StateRecord) -> None:
        """Write the record atomically (0644: the service user's ``patch verify`` reads it)."""
        write_atomic(self.record_path, json.dumps(record.model_dump(), indent=2) + "\n", mode=0o644)

    def forget(self) -> None:
        """Delete the record and the original copies."""
        self.record_path.unlink(missing_ok=True)
        shutil.rmtree(self.originals_dir, ignore_errors=True)
