"""The one place that reads an API key file.

The key file holds the server's key on one line (surrounding whitespace is not part of it);
``install`` creates it (``secrets.token_urlsafe(32)``, mode 0600, root) when the profile's
``[sglang] api_key_file`` names a missing file. ``check``, ``restart --wait`` and ``status``
read it through :func:`read_key_file` / :func:`profile_key`; ``install`` inspects it without
reading the key into its plan (:func:`inspect`).
"""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from kimi_deploy.errors import UsageError
from kimi_deploy.paths import HostLayout


def read_key_file(path: str | Path) -> str:
    """The key in ``path`` (surrounding whitespace removed).

    Raises:
        UsageError: unreadable or empty (exit 2).
    """
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"cannot read the API key file: {why}", value=str(path),
                         hint="pass --api-key-file with a file this user can read (the nightly unit passes "
                              "its systemd credential)") from None
    if not key:
        raise UsageError("the API key file is empty", value=str(path), hint="write the key into the file")
    return key


def profile_key(api_key_file: str | None, layout: HostLayout) -> str | None:
    """The key of a profile whose ``[sglang] api_key_file`` is ``api_key_file`` (a host path, read under
    ``layout``); None when the profile has none.

    Raises:
        UsageError: the file is set but unreadable or empty, or its path leads out of the --root
            tree (exit 2); the value names the host path (and the ``--root`` tree once).
    """
    if not api_key_file:
        return None
    try:
        return read_key_file(layout.under(api_key_file))
    except UsageError as exc:
        raise UsageError(exc.message, value=layout.describe(api_key_file),
                         hint="the profile's [sglang] api_key_file must hold the server's key (one line, "
                              f"readable by this user); `{layout.command('install --profile FILE')}` creates it "
                              "when missing") from None


@dataclasses.dataclass(frozen=True)
class KeyFile:
    """What is at a key file's host path: ``exists``; for an existing one whether it is a ``regular``
    file, ``empty`` (only whitespace), its permission ``mode`` and owner ``uid``. Never the key."""

    host_path: str
    exists: bool
    regular: bool = True
    empty: bool = False
    mode: int = 0o600
    uid: int = 0


def inspect(layout: HostLayout, host_path: str) -> KeyFile:
    """Stat the key file at ``host_path`` under ``layout`` (``install``'s fact about it).

    Raises:
        UsageError: the path leads out of the --root tree.
    """
    path = layout.under(host_path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return KeyFile(host_path, exists=False)
    regular = stat.S_ISREG(st.st_mode)
    empty = regular and not path.read_bytes().strip()
    return KeyFile(host_path, True, regular, empty, stat.S_IMODE(st.st_mode), st.st_uid)
