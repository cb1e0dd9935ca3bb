"""The one home for redaction: what ``bench`` and ``check`` write never holds a key.

Everything the two verbs write (bench JSON/CSV and its table; check JSON, JUnit XML, Prometheus
textfile and its table) is built from data passed through :func:`redact` first, at the data level,
so every serializer (JSON escaping, XML entities, CSV quoting) sees only redacted strings.

Three rules, applied to every string of a JSON-like document (dicts, lists, tuples, strings,
numbers, ``None``; dict keys too):

1. **Key-like fields** (:func:`is_secret_name`): every string under a field whose name is key-like
   becomes :data:`MASK`. ``None``, booleans and numbers stay (so "no key set" stays visible and
   numeric fields such as SGLang's ``bucket_time_to_first_token`` list survive). A name is split
   into lower-case words (``apiKey``, ``api-key``, ``api_key`` → ``api``, ``key``); it is key-like
   when a word is one of :data:`SECRET_WORDS` (``key``, ``apikey``, ``secret``, ``secrets``,
   ``password``, ``passwd``, ``passphrase``, ``credential``, ``credentials``, ``authorization``,
   ``cookie``) or its last word is ``token`` (``hf_token``, ``access_token``). Not a substring rule:
   ``*token*`` would also hide ``max_tokens``, ``completion_tokens``, ``tokenizer_path`` and
   ``tokens_per_chunk``, the figures a benchmark exists for; ``ssl_keyfile`` (a path) is not a
   key. SGLang 0.5.23's ``/server_info`` fields this hides: ``api_key``, ``admin_api_key``,
   ``ssl_keyfile_password``, ``watermark_key``, ``watermark_key_b``.
2. **Secret options in command lines**: in a string under a field named like a command
   (a word ``command``, ``cmdline`` or ``argv``: SGLang's ``launch_command``) the value of every
   option whose name is key-like (``--api-key``, ``--admin-api-key``, ``--ssl-keyfile-password``,
   ``--watermark-key``; also as ``--opt=value``) is masked, up to the next ``--option`` word
   (SGLang joins argv with single spaces, so a key holding a space spans words). A list under
   such a field is argv: the element after a secret option is masked. This hides a key the
   caller does not know (another server's ``--admin-api-key``).
3. **Known secrets by value**: every occurrence of each given secret (the key the verb sent) is
   replaced in every string, in each of the forms it can take in text (:func:`forms`): as is,
   shell-quoted (``shlex.quote``), JSON-string-escaped, percent-encoded, base64 (standard and
   URL-safe, with and without padding; base64 of a longer text that merely contains the key, such
   as HTTP Basic ``user:key``, is not covered: the kit never sends one) and Python's ``repr``.
   Then what a cut left of a key, wherever the cut is and however it was quoted afterwards (issue #30: a
   clip rendered with ``!r`` ends in ``…'``, not ``…``): a run of :data:`PARTIAL_CHARS` or more characters
   that begins or ends a form is masked anywhere in the text, and a run of :data:`MIN_SECRET_CHARS` or
   more right before or after an ellipsis ``…`` (the clip marker) is masked too.
4. **URLs** (:func:`url`, applied by the verbs to the URLs they write: a worker URL a gateway lists, a
   ``--base-url``): the password of ``user:password@`` and the value of every query parameter whose name is
   key-like are masked.

Secrets shorter than :data:`MIN_SECRET_CHARS` are still redacted exactly, but not by prefix.
Pure functions; never raise for any JSON-like input.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import shlex
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

#: What a redacted value reads as.
MASK = "<redacted>"

#: Words (of a field or option name) that make it key-like (rule 1).
SECRET_WORDS = frozenset({"key", "apikey", "secret", "secrets", "password", "passwd", "passphrase",
                          "credential", "credentials", "authorization", "cookie"})

#: Words of a field name that hold a command line (rule 2).
COMMAND_WORDS = frozenset({"command", "cmdline", "argv"})

#: A clipped tail is cut only when it shows at least this many characters of a secret (rule 3).
MIN_SECRET_CHARS = 4

#: A run of this many characters that begins or ends a secret is masked wherever it stands (rule 3): 8
#: characters of a random key (43 base64 characters for an install-made one) do not occur by chance.
PARTIAL_CHARS = 8

#: The clip marker (:func:`kimi_deploy.check.results.clip`).
ELLIPSIS = "…"

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")


def words(name: str) -> list[str]:
    """``name`` as lower-case words: ``"adminApiKey"`` / ``"admin-api-key"`` → ``["admin", "api", "key"]``."""
    return [w for w in _SPLIT.split(_CAMEL.sub("_", name).lower()) if w]


def is_secret_name(name: Any) -> bool:
    """Whether a field or option name is key-like (rule 1 of the module docstring); ``--`` prefixes ignored."""
    if not isinstance(name, str):
        return False
    ws = words(name)
    return bool(ws) and (any(w in SECRET_WORDS for w in ws) or ws[-1] == "token")


def _is_command_name(name: Any) -> bool:
    return isinstance(name, str) and any(w in COMMAND_WORDS for w in words(name))


def _is_secret_option(word: str) -> bool:
    return word.startswith("--") and is_secret_name(word.split("=", 1)[0])


def forms(secret: str) -> list[str]:
    """The texts ``secret`` can appear as in a written file, longest first, no duplicates, none empty."""
    raw = secret.encode("utf-8", "surrogatepass")
    b64 = base64.b64encode(raw).decode()
    b64u = base64.urlsafe_b64encode(raw).decode()
    found = {secret, shlex.quote(secret), json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             quote(secret, safe=""), b64, b64.rstrip("="), b64u, b64u.rstrip("="), repr(secret)[1:-1]}
    return sorted((f for f in found if f), key=lambda f: (-len(f), f))


class Redactor:
    """Rules 1-3 of the module docstring for one set of ``secrets`` (empty strings are ignored)."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self.forms = sorted({f for s in secrets if s for f in forms(s)}, key=lambda f: (-len(f), f))
        self._prefixes = [f for f in self.forms if len(f) > MIN_SECRET_CHARS]

    def text(self, s: str) -> str:
        """``s`` with every form of every secret, and what a cut left of one, replaced by :data:`MASK`
        (rule 3)."""
        for f in self.forms:
            if f in s:
                s = s.replace(f, MASK)
        for f in self._prefixes:
            s = self._partial(s, f)
        return s

    @staticmethod
    def _partial(s: str, f: str) -> str:
        """``s`` with the runs that begin or end ``f`` masked: :data:`PARTIAL_CHARS` long anywhere, or
        :data:`MIN_SECRET_CHARS` long against an :data:`ELLIPSIS`."""
        if f[:MIN_SECRET_CHARS] not in s and f[-MIN_SECRET_CHARS:] not in s:
            return s  # no run of f to look at (the common case, found in C)
        out: list[str] = []
        i, n = 0, len(s)
        tail = f[-PARTIAL_CHARS:]
        while i < n:
            # the longest start of f at i (a cut at the end), or the longest end of f ending at a cut
            m = 0
            if s[i] == f[0]:
                while i + m < n and m < len(f) and s[i + m] == f[m]:
                    m += 1
                at_cut = i + m == n or s[i + m] == ELLIPSIS
                if not (m >= PARTIAL_CHARS and len(f) > PARTIAL_CHARS or m >= MIN_SECRET_CHARS and at_cut):
                    m = 0
            if not m and (i == 0 or s[i - 1] == ELLIPSIS):  # after a cut at the start: an end of f
                for k in range(min(len(f) - 1, n - i), MIN_SECRET_CHARS - 1, -1):
                    if f.endswith(s[i:i + k]):
                        m = k
                        break
            if not m and tail[0] == s[i] and s.startswith(tail, i):  # the end of f, anywhere
                m = PARTIAL_CHARS
            if m:
                out.append(MASK)
                i += m
            else:
                out.append(s[i])
                i += 1
        return "".join(out)

    def command(self, s: str) -> str:
        """A command line string with the value of every secret option masked (rule 2), then rule 3."""
        out, hiding = [], False
        for word in s.split(" "):
            if _is_secret_option(word):
                hiding = False
                flag, eq, value = word.partition("=")
                if eq:
                    out.append(f"{flag}={MASK}" if value else word)
                else:
                    out += [word, MASK]
                    hiding = True
            elif hiding and not word.startswith("--"):
                continue  # more words of the same value (a key with spaces), or empty ones
            else:
                hiding = False
                out.append(word)
        return self.text(" ".join(out))

    def value(self, data: Any, name: Any = None) -> Any:
        """A redacted copy of ``data`` found under the field ``name`` (None: at the top).

        Iterative (an explicit stack), so a document nested deeper than Python's recursion limit
        is redacted like any other.
        """
        root: list[Any] = [None]
        stack: list[tuple[Any, Any, Any, Any, bool]] = [(data, name, root, 0, False)]
        while stack:
            item, field, parent, slot, masked = stack.pop()
            masked = masked or is_secret_name(field)
            if isinstance(item, str):
                parent[slot] = (MASK if item else item) if masked else \
                    self.command(item) if _is_command_name(field) else self.text(item)
            elif isinstance(item, dict):
                out: dict[Any, Any] = {}
                parent[slot] = out
                for k, v in item.items():
                    key = self.text(k) if isinstance(k, str) else k
                    out[key] = None
                    stack.append((v, k, out, key, masked))
            elif isinstance(item, (list, tuple)):
                items = list(item)
                parent[slot] = items
                argv = _is_command_name(field) and not masked
                hide = False
                for i, v in enumerate(items):
                    if argv and isinstance(v, str):
                        if hide:
                            items[i], hide = MASK, False
                            continue
                        if _is_secret_option(v):
                            flag, eq, _ = v.partition("=")
                            items[i], hide = (flag + "=" + MASK, False) if eq else (self.text(v), True)
                            continue
                    stack.append((v, None, items, i, masked))
            else:
                parent[slot] = item
        return root[0]


def redact(data: Any, secrets: Iterable[str | None] = ()) -> Any:
    """A copy of the JSON-like ``data`` with key-like fields, secret options of command lines and every
    form of each of ``secrets`` replaced by :data:`MASK` (the three rules of the module docstring).

    ``secrets``: the keys the caller knows (``None`` and ``""`` ignored). Never raises; tuples come
    back as lists, other objects unchanged.
    """
    return Redactor(secrets).value(data)


def url(text: str, secrets: Iterable[str | None] = ()) -> str:
    """A URL to write (rule 4): the password of ``user:password@`` and the values of key-like query parameters
    masked, then rule 3 for ``secrets``. Text that is not a URL comes back with rule 3 only; never raises."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user, colon, _password = userinfo.partition(":")
            netloc = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(is_secret_name(k) for k, _ in pairs):
                query = urlencode([(k, MASK if is_secret_name(k) else v) for k, v in pairs], safe="<>")
        text = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        pass
    return Redactor(secrets).text(text)


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` (a line for the terminal, an error value) with every form of each secret masked (rule 3)."""
    return Redactor(secrets).text(text)


#: The keys this process has read (:func:`remember`): :class:`LogRedactor` masks them in every log line.
KNOWN: set[str] = set()


def remember(secret: str | None) -> None:
    """Add ``secret`` (a key the process read) to :data:`KNOWN`, for :class:`LogRedactor`."""
    if secret:
        KNOWN.add(secret)


class LogRedactor(logging.Formatter):
    """A log formatter whose every line (message, traceback included) has each :data:`KNOWN` key masked
    (rule 3): ``--debug`` shows httpcore's and openai's debug lines, which print the response headers a server
    sent, and a server can echo the bearer key in one."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return Redactor(KNOWN).text(text) if KNOWN else text
