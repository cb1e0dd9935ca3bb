"""The one rule for every string a profile carries into a unit, an env file, a manifest or argv.

Every string field of the profile model passes :func:`check_text` before its own type check (the
profile's section base class applies it to all fields, so a new field cannot forget it); the
value kinds below add what each place needs:

- :data:`Token`: a value that survives systemd's ``ExecStart=``/``EnvironmentFile=`` parsing and a
  POSIX shell unquoted (:data:`SAFE_TOKEN`); :data:`ArgValue`: a token that is the value of a launch
  option, so it may not start with ``-`` (argparse would read it as an option);
- :data:`AbsPath`: a normalised absolute path (no ``..``, ``.``, ``//`` or trailing ``/``; not ``/``),
  as systemd requires of every path it reads (systemd.exec(5): "absolute and normalized");
- :func:`check_unit_stem`: a systemd unit name stem short enough for every file name the kit derives.

All checks are full matches (:func:`re.fullmatch`): ``re.match(r"^...$")`` lets ``$`` match before a
final newline, which systemd reads as the end of the directive.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator

#: Unicode categories no profile string may contain: control characters (``Cc``: C0 incl. NUL, CR and
#: LF, DEL, C1 incl. NEL), format characters (``Cf``: bidi overrides and zero-width characters that hide
#: text from a reviewer), line and paragraph separators (``Zl``/``Zp``: U+2028, U+2029) and surrogates.
#: systemd ends a directive at LF, CR and NUL (src/basic/fileio.c ``read_line``); the rest hides or
#: reorders what a reviewer reads on a terminal.
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})

#: Longest string any profile field may hold (characters): PATH_MAX (4096 with its NUL, linux/limits.h).
MAX_TEXT = 4095
#: Most items of a list or table that reaches the launch command (``[sglang] extra_args``, ``[environment]``).
#: systemd refuses a unit whose logical line (ExecStart= with its continuations) is over LONG_LINE_MAX, 1 MiB
#: (src/shared/conf-parser.c: "No buffer space available"), and execve(2) refuses argv + environment over
#: ARG_MAX (a quarter of the 8 MiB stack limit: 2 MiB, "Argument list too long"). 128 items of at most
#: :data:`MAX_TEXT` characters keep ExecStart= under 512 KiB and the environment under 1 MiB.
MAX_ITEMS = 128
#: Longest path component (NAME_MAX, linux/limits.h).
NAME_MAX = 255
#: Longest ``[service] name``. The longest file the kit derives from it is
#: ``.kimi-deploy-check@<name>.service.XXXXXXXX.tmp`` (40 characters more, fsio's temporary file);
#: 128 keeps that, and the unit names themselves (systemd's UNIT_NAME_MAX, 255), within NAME_MAX with room.
MAX_UNIT_STEM = 128

#: Characters a value may use so that it survives systemd's ExecStart= and EnvironmentFile= parsing and a
#: POSIX shell unquoted: anything else would need quoting, and kimi-deploy does not render quoted values (a
#: reviewer must be able to paste the command as shown). ``%`` (systemd specifiers), ``$`` (variable
#: expansion), ``;`` (ExecStart= command separator) and ``\\`` (escapes) are excluded on purpose.
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
#: A systemd unit name stem as the kit uses it: no ``@`` (instances are the kit's), no leading ``-`` or ``.``.
UNIT_STEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
#: A host name: dot-separated RFC 1123 labels (1-63 letters, digits and ``-``, no ``-`` at either end; no
#: empty label, so no ``..``), 253 characters at most.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")


def _show(value: str, limit: int = 80) -> str:
    """``repr`` of ``value``, cut to ``limit`` characters (control characters stay escaped)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def is_noncharacter(ch: str) -> bool:
    """Whether ``ch`` is one of Unicode's 66 noncharacters (U+FDD0..U+FDEF, and U+xFFFE/U+xFFFF of every plane;
    Unicode 15 §23.7): never valid in interchanged text, refused by systemd's unit parser and by kubectl."""
    cp = ord(ch)
    return 0xFDD0 <= cp <= 0xFDEF or cp & 0xFFFE == 0xFFFE


def check_text(value: Any, what: str = "value") -> Any:
    """``value`` unchanged when every string in it (a str, or the items/keys/values of a list/dict) is clean.

    Clean: no character of :data:`FORBIDDEN_CATEGORIES` and at most :data:`MAX_TEXT` characters. Other
    types pass through untouched (the field's own type check reports them).

    Raises:
        ValueError: the first offending string, naming the character as U+XXXX and its position.
    """
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"{what} is {len(value)} characters long; at most {MAX_TEXT} are accepted")
        for i, ch in enumerate(value):
            if is_noncharacter(ch):
                raise ValueError(
                    f"{what} {_show(value)} contains U+{ord(ch):04X}, a Unicode noncharacter, at position {i}; "
                    "systemd refuses a unit holding one and kubectl a ConfigMap; remove it")
            if unicodedata.category(ch) in FORBIDDEN_CATEGORIES:
                name = unicodedata.name(ch, "control character")
                raise ValueError(
                    f"{what} {_show(value)} contains U+{ord(ch):04X} ({name}) at position {i}; control, format "
                    "and line-separator characters would end, hide or reorder a line of the unit; remove it")
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_text(item, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{what} name")
            check_text(item, f"{what} {key!s:.40}")
    return value


def check_token(value: str, what: str = "value") -> str:
    """``value`` when it fully matches :data:`SAFE_TOKEN`, else ValueError naming the bad characters."""
    if not SAFE_TOKEN.fullmatch(value):
        bad = sorted({c for c in value if not SAFE_TOKEN.fullmatch(c)})
        raise ValueError(
            f"{what} {_show(value)} would need shell quoting (characters {''.join(bad)!r}); "
            "use only letters, digits and _@+=:,./-")
    return value


def check_arg_value(value: str, what: str = "value") -> str:
    """A :func:`check_token` that may follow an option in argv: it must not start with ``-``."""
    check_token(value, what)
    if value.startswith("-"):
        raise ValueError(f"{what} {_show(value)} starts with '-': SGLang's argparse would read it as an option")
    return value


def check_abs_path(value: str, what: str = "path") -> str:
    """``value`` when it is a normalised absolute path of a file or directory below ``/``.

    Raises:
        ValueError: relative, ``/`` itself, not normalised (``..``, ``.``, ``//``, trailing ``/``), a
            component longer than :data:`NAME_MAX`, or characters outside :data:`SAFE_TOKEN`.
    """
    check_token(value, what)
    if not value.startswith("/"):
        raise ValueError(f"{what} {_show(value)} is relative; systemd runs units from /, give an absolute path")
    if value == "/":
        raise ValueError(f"{what} '/' is the root directory; give the path of the file or directory itself")
    normal = posixpath.normpath(value)
    if normal != value or value.startswith("//"):
        raise ValueError(
            f"{what} {_show(value)} is not normalised (no '..', '.', '//' or trailing '/'; systemd ignores such "
            f"paths); write {_show(normal.replace('//', '/'))} if that is what you mean")
    long = [part for part in value.split("/") if len(part) > NAME_MAX]
    if long:
        raise ValueError(f"{what} has a component of {len(long[0])} characters; file names have at most {NAME_MAX}")
    return value


def check_unit_stem(value: str) -> str:
    """``value`` when it is a valid ``[service] name`` (a systemd unit name stem), else ValueError.

    The one rule for service names: the profile validator and every ``--name`` option use it (a name is
    also a file name under ``/etc/kimi-deploy``, so no ``/``; no leading ``-``, which a command would read
    as an option, or ``.``, which hides the file; at most :data:`MAX_UNIT_STEM` characters).
    """
    if not UNIT_STEM.fullmatch(value) or value.endswith((".service", ".timer")):
        raise ValueError(f"unit name {_show(value)} must be letters, digits and _.:- (not starting with - or .) "
                         "without a .service suffix")
    if len(value) > MAX_UNIT_STEM:
        raise ValueError(f"unit name is {len(value)} characters long; at most {MAX_UNIT_STEM} fit every file "
                         "name the kit derives from it (kimi-deploy-check@<name>.service and its temporary files)")
    if value == "kimi-deploy-check":
        raise ValueError("the name kimi-deploy-check is taken by the nightly check unit")
    return value


def check_host(value: str) -> str:
    """``value`` when it is an IP address without a zone (``%eth0`` would be a systemd specifier) or a host name.

    Raises:
        ValueError: anything else (the message names the value).
    """
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    if address is not None and "%" not in value:
        return value
    if address is None and HOST_NAME.fullmatch(value):
        return value
    raise ValueError(f"host {_show(value)} is neither an IP address (without a %zone) nor a host name")


#: A string usable unquoted in a unit and in argv (:func:`check_token`).
Token = Annotated[str, AfterValidator(check_token)]
#: A token that is an option's value in argv (:func:`check_arg_value`).
ArgValue = Annotated[str, AfterValidator(check_arg_value)]
#: A normalised absolute path (:func:`check_abs_path`).
AbsPath = Annotated[str, AfterValidator(check_abs_path)]
#: A listen address (:func:`check_host`).
Host = Annotated[str, AfterValidator(check_host)]
