"""The one place that reads an API key file.

The key file holds the server's key on one line (surrounding whitespace is not part of it);
``install`` creates it (:func:`new_key`, mode 0600, root) when the profile's
``[sglang] api_key_file`` names a missing file. ``check``, ``bench``, ``restart --wait`` and ``status``
find the key through the one resolver :func:`resolve_key`; ``install`` inspects it without
reading the key into its plan (:func:`inspect`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import stat
from pathlib import Path

from kimi_deploy.errors import UsageError
from kimi_deploy.paths import HostLayout
from kimi_deploy.redact import remember
from kimi_deploy.wire.inputs import open_regular
from kimi_deploy.wire.net import binds_locally, is_loopback

#: The most a key file may hold, in bytes: a key is 43 characters (``install``) to a few hundred (a vendor
#: token); 4 KiB leaves room for either and stops a device or a log file at once (issue #30 item 12).
MAX_KEY_FILE_BYTES = 4096


def new_key() -> str:
    """A random key for a new key file: 43 URL-safe characters (``secrets.token_urlsafe(32)``: 256 bits),
    drawn again while it starts with ``-`` (:func:`argv_safe`)."""
    while True:
        key = secrets.token_urlsafe(32)
        if argv_safe(key):
            return key


def argv_safe(key: str) -> bool:
    """Whether a server can be started with ``key``: it does not start with ``-``. SGLang 0.5.23 turns its
    ``--config`` YAML into arguments and smg takes ``--api-key KEY`` on its command line, and both parse them with
    argparse, which reads a value starting with ``-`` as an option: "argument --api-key: expected one
    argument", and the unit never starts (seen in the container tier with a generated key starting ``-Cr``;
    ``token_urlsafe`` starts one key in 64 that way)."""
    return not key.startswith("-")


#: The named override of the rule's permission part (owner and mode): ``KIMI_DEPLOY_KEY_FILE_ANY_MODE=1`` accepts a
#: key file whatever its owner and mode (a secret store that mounts keys 0644, say); the content part still holds.
ANY_MODE_ENV = "KIMI_DEPLOY_KEY_FILE_ANY_MODE"


def key_file_problem(st: os.stat_result, data: bytes, *, euid: int | None = None,
                     groups: frozenset[int] | None = None) -> tuple[str, str] | None:
    """The first way a key file breaks the one rule ``install``, ``check``, ``bench``, ``restart --wait`` and
    ``status`` apply (issue #38), as ``(problem, fix)``; ``None`` when it holds. Never names the key.

    ``st``: the file's ``fstat`` (a regular file: :func:`kimi_deploy.wire.inputs.open_regular` refused others);
    ``data``: its first :data:`MAX_KEY_FILE_BYTES` + 1 bytes; ``euid``/``groups``: the reader's (default: this
    process's). The rule:

    - content: at most :data:`MAX_KEY_FILE_BYTES` bytes; one line (surrounding whitespace and the final newline
      are not part of the key); printable ASCII (0x20-0x7E, what a Bearer token in an HTTP header carries: no BOM,
      no accent, no control character); not starting with ``-`` (:func:`argv_safe`);
    - permissions (unless ``$KIMI_DEPLOY_KEY_FILE_ANY_MODE=1``): owned by root or the reader; nothing for others
      (mode ``o=``); group access only through a group the reader is in (a Kubernetes Secret is mounted
      ``0440 root:fsGroup``, and the kit's CronJob runs in fsGroup).
    """
    if len(data) > MAX_KEY_FILE_BYTES:
        return (f"it is over {MAX_KEY_FILE_BYTES} bytes: not a key file",
                "point it at the file holding only the key (`install` writes one: 43 characters)")
    if data.startswith(b"\xef\xbb\xbf"):
        return ("it starts with a UTF-8 byte-order mark (BOM), which no HTTP header can carry",
                "save it without BOM: `sed -i '1s/^\\xEF\\xBB\\xBF//' FILE`")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return "it is not UTF-8 text", "write the key again (`install` creates one: 43 URL-safe characters)"
    if not text:
        return "it is empty", "write the key into it (one line)"
    if "\n" in text:
        return (f"it holds {text.count(chr(10)) + 1} lines: a key file holds the key on one line (every client "
                "would send the whole file as the key)", "keep only the key in it, on one line")
    bad = next(((i, ch) for i, ch in enumerate(text) if not " " <= ch <= "~"), None)
    if bad is not None:
        return (f"it holds U+{ord(bad[1]):04X} at character {bad[0] + 1}: an API key is printable ASCII (no "
                "accents, no control characters), what an HTTP Authorization header can carry",
                "write the key again (`install` creates one: 43 URL-safe characters)")
    if not argv_safe(text):
        return ("the key starts with '-': SGLang and smg read --api-key through argparse, which takes it for an "
                "option, and the server would never start",
                "write a key that does not start with '-', or remove the file and install again (the key "
                "kimi-deploy creates never does)")
    if os.environ.get(ANY_MODE_ENV) == "1":
        return None
    euid = os.geteuid() if euid is None else euid
    if st.st_uid not in (0, euid):
        return (f"it is owned by uid {st.st_uid}, neither root nor this user (uid {euid})",
                f"chown root:root FILE (or set {ANY_MODE_ENV}=1 to accept any owner and mode)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o007:
        return (f"it is open to every user of the host (mode {mode:04o})",
                f"chmod 600 FILE (or set {ANY_MODE_ENV}=1 to accept any owner and mode)")
    groups = frozenset({os.getegid(), *os.getgroups()}) if groups is None else groups
    if mode & 0o070 and st.st_gid not in groups:
        return (f"it is open to group {st.st_gid} (mode {mode:04o}), which this user is not in",
                f"chmod 600 FILE (or set {ANY_MODE_ENV}=1 to accept any owner and mode)")
    return None


_KEY_HINT = "pass --api-key-file FILE holding only the key (the nightly unit passes its systemd credential)"


def read_key_file(path: str | Path) -> str:
    """The key in ``path`` (surrounding whitespace removed), once the file holds the rule of
    :func:`key_file_problem` (a regular file: a FIFO or a device is refused unread).

    Raises:
        UsageError: unreadable, not a regular file, or the first rule it breaks (exit 2).
    """
    with open_regular(path, "the API key file", _KEY_HINT) as fh:
        try:
            st = os.fstat(fh.fileno())
            data = fh.read(MAX_KEY_FILE_BYTES + 1)  # bounded: a log file is no key
        except OSError as exc:
            raise UsageError(f"cannot read the API key file ({exc.strerror or exc})", value=str(path),
                             hint=_KEY_HINT) from None
    problem = key_file_problem(st, data)
    if problem is not None:
        raise UsageError(f"the API key file is refused: {problem[0]}", value=str(path),
                         hint=problem[1].replace("FILE", str(path)))
    key = data.decode("utf-8").strip()
    remember(key)  # masked in every --debug log line from now on (kimi_deploy.redact.LogRedactor)
    return key


def check_key(key: str, source: str, *, value: str) -> str:
    """``key`` when it is printable ASCII (0x20-0x7E), what an HTTP header (a Bearer token) can carry.

    A key file saved with a byte-order mark (an editor's "UTF-8 with BOM"), or holding an accented letter or
    a control character, made httpx (check) and the bench client raise ``UnicodeEncodeError``: a traceback. The
    message names ``source`` and the position, never the key (``value`` is where it came from).

    Raises:
        UsageError: the first character outside that range (exit 2).
    """
    bad = next(((i, ch) for i, ch in enumerate(key) if not " " <= ch <= "~"), None)
    if bad is None:
        return key
    i, ch = bad
    if ch == "\ufeff":
        raise UsageError(f"{source} starts with a UTF-8 byte-order mark (BOM), which no HTTP header can carry",
                         value=value, hint="save it without BOM: `sed -i '1s/^\\xEF\\xBB\\xBF//' FILE`")
    raise UsageError(f"{source} holds U+{ord(ch):04X} at character {i + 1}: an API key is printable ASCII "
                     "(no accents, no control characters), what an HTTP Authorization header can carry", value=value,
                     hint="write the key again (`install` creates one: 43 URL-safe characters)")


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


def resolve_key(key_file: str | Path | None = None, *, profile_key_file: str | None = None,
                layout: HostLayout | None = None, from_env: bool = False) -> str | None:
    """The API key a client sends: the one resolver behind ``check``, ``bench``, ``restart --wait`` and
    ``status``. First found wins:

    1. ``key_file`` (``--api-key-file FILE``, a path on this machine: :func:`read_key_file`);
    2. ``profile_key_file`` (a profile's ``[sglang] api_key_file``): a host path read under ``layout``'s root
       (:func:`profile_key`), or as given without a layout (``check --profile``: the profile of this machine);
    3. with ``from_env``, ``$KIMI_DEPLOY_API_KEY`` (stripped; empty means none: ``bench``);
    else None.

    Raises:
        UsageError: a named file is unreadable, empty or not printable ASCII, or the variable holds a
            character an Authorization header cannot carry (exit 2).
    """
    if key_file is not None:
        return read_key_file(key_file)
    if profile_key_file:
        return profile_key(profile_key_file, layout) if layout is not None else read_key_file(profile_key_file)
    if from_env:
        key = os.environ.get(ENV_VAR, "").strip() or None
        return check_key(key, f"${ENV_VAR}", value=f"${ENV_VAR}") if key else None
    return None


@dataclasses.dataclass(frozen=True)
class KeyFile:
    """What is at a key file's host path: ``exists``; for an existing one the first rule it breaks
    (:func:`key_file_problem`, or not a regular file) as ``problem`` and its ``fix`` (``None``: it holds), its
    permission ``mode`` and owner ``uid``. Never the key."""

    host_path: str
    exists: bool
    problem: str | None = None
    fix: str | None = None
    mode: int = 0o600
    uid: int = 0


def inspect(layout: HostLayout, host_path: str) -> KeyFile:
    """Check the key file at ``host_path`` under ``layout`` by the clients' own rule (``install``'s fact about
    it): what install accepts, ``check`` and ``bench`` accept.

    Raises:
        UsageError: the path leads out of the --root tree.
    """
    path = layout.under(host_path)
    try:
        path.stat()
    except FileNotFoundError:
        return KeyFile(host_path, exists=False)
    except OSError as exc:
        return KeyFile(host_path, True, f"it cannot be read ({exc.strerror or exc})", _KEY_HINT)
    try:
        with open_regular(path, "the API key file", _KEY_HINT) as fh:
            st = os.fstat(fh.fileno())
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except UsageError as exc:
        return KeyFile(host_path, True, exc.message.removeprefix("the API key file "), exc.hint)
    except OSError as exc:
        return KeyFile(host_path, True, f"it cannot be read ({exc.strerror or exc})", _KEY_HINT)
    problem = key_file_problem(st, data)
    return KeyFile(host_path, True, *(problem or (None, None)), stat.S_IMODE(st.st_mode), st.st_uid)


#: Environment variable ``bench`` reads the key from when no ``--api-key-file`` is given (the
#: environment of a process is readable only by its user and root, unlike argv: ``ps``, ``/proc/PID/cmdline``).
ENV_VAR = "KIMI_DEPLOY_API_KEY"

#: Why a key on the command line is refused (``bench --api-key``), one sentence.
ARGV_REFUSAL = ("a key on the command line is visible to every user of the host (ps, /proc/PID/cmdline) and "
                "stays in shell history")


def is_local_host(host: str | None) -> bool:
    """Whether traffic to ``host`` (a URL's host: name or IP literal, IPv6 without brackets) never leaves
    this machine: a loopback host (:func:`kimi_deploy.profile.is_loopback`: ``localhost`` itself, not a name
    under it; 127.0.0.0/8, ``::1``, IPv4-mapped loopback), or an IP literal assigned to one of this host's
    interfaces (:func:`kimi_deploy.wire.net.binds_locally`; Linux routes such traffic over ``lo``). Any other
    name is not local: it is not resolved here (a DNS answer may change between this test and the
    connection). Never raises.
    """
    if not host:
        return False
    name = host.strip("[]").lower().rstrip(".")
    return is_loopback(name) or binds_locally(name)


def guard_transport(base_url: str, key: str | None, *, insecure: bool, warn=None) -> None:
    """Refuse to send ``key`` in clear text: over ``http://`` to a host that is not local (:func:`is_local_host`).

    ``https://`` and local hosts pass; so does any URL when there is no key. With ``insecure`` the
    key is sent anyway and one warning line goes to ``warn`` (default: stderr), never into a report.

    Raises:
        UsageError: plain http to a non-local host with a key, without ``insecure`` (exit 2; nothing sent).
    """
    from urllib.parse import urlsplit

    if not key:
        return
    try:
        parts = urlsplit(base_url.strip())
        scheme, host = parts.scheme.lower(), parts.hostname
    except ValueError:
        return  # not a URL at all: the caller's own check of the base URL says so
    if scheme != "http" or is_local_host(host):
        return
    if not insecure:
        raise UsageError(f"refusing to send the API key in clear text over plain http to {host}, which is not "
                         "this host", value=base_url,
                         hint="use https:// (a TLS proxy in front of SGLang), or an SSH tunnel to "
                              "http://127.0.0.1:PORT; --insecure sends the key anyway (anyone on the path can read it)")
    line = (f"warning: --insecure: the API key goes to {host} over plain http; anyone on the network path "
            "can read it")
    if warn is None:
        import sys

        print(line, file=sys.stderr)
    else:
        warn(line)
