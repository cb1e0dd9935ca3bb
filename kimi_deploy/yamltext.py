"""Plain YAML text from plain data (dict, list, str, int, bool, None), for files a reviewer reads.

The kit writes Kubernetes manifests without a YAML library: the documents are built as plain Python
data, and this emitter gives them one stable, readable form (block style, two-space indent, lists
unindented under their key as ``kubectl`` prints them, keys in the order given).

Scalars: a string is written plain only when no YAML 1.1 or 1.2 reader (PyYAML, Go's yaml.v2/v3
behind ``kubectl``) can take it for anything but that string (:data:`PLAIN`, minus the words of
:data:`NOT_PLAIN`); every other string is a JSON string, which is a YAML double-quoted scalar with
the same value. A multi-line text ending in exactly one newline, with no line starting with a space
or ending in whitespace, is a literal block (``|``). Source of the scalar rules: YAML 1.1 "Language-
Independent Types" (bool, null, int, float, timestamp) and YAML 1.2 core schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FileMode", "dump", "dump_all", "scalar"]

#: Strings that may stay plain: start with a letter, ``_`` or ``/`` (or ``-``/``--`` then a letter, as
#: command-line options do); then letters, digits and ``_./-``. No ``:`` (YAML 1.1 sexagesimal numbers,
#: mapping indicators), no leading digit or ``.`` and no ``-`` before a digit (numbers, ``.inf``), no
#: ``- `` (a sequence entry), no spaces, ``#`` or quotes.
PLAIN = re.compile(r"(?:--?[A-Za-z]|[A-Za-z_/])[A-Za-z0-9_./-]*")
#: Words YAML 1.1 reads as booleans or null (compared lower-cased).
NOT_PLAIN = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


class FileMode(int):
    """A file mode (``0o440``): an int like any other (Kubernetes reads ``defaultMode`` as a decimal JSON number,
    so it is written ``288``), followed by its octal spelling in a comment a reviewer reads: ``288  # 0440``."""


def scalar(value: Any) -> str:
    """One scalar as YAML text (single line).

    Raises:
        TypeError: ``value`` is not a str, bool, int or None (floats are not used in manifests).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if PLAIN.fullmatch(value) and value.lower() not in NOT_PLAIN:
            return value
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"cannot write {type(value).__name__} as a YAML scalar")


def _block_text(value: str) -> bool:
    """True when ``value`` can be a literal block (``|``) that reads back as exactly ``value``."""
    if "\n" not in value[:-1] or not value.endswith("\n") or value.endswith("\n\n"):
        return False
    lines = value[:-1].split("\n")
    return (not lines[0].startswith(" ") and all(line == line.rstrip() for line in lines)
            and all(ch == "\n" or ch >= " " for ch in value) and "\ufeff" not in value)


def _lines(value: Any, indent: int) -> list[str]:
    """The lines of a mapping or sequence at ``indent`` spaces."""
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            head = f"{pad}{scalar(str(key))}:"
            out += _entry(head, item, indent, indent + 2)
    else:
        for item in value:
            if isinstance(item, Mapping) and item:
                inner = _lines(item, indent + 2)
                out.append(f"{pad}- {inner[0][indent + 2:]}")
                out += inner[1:]
            elif isinstance(item, (list, tuple)) and item:
                inner = _lines(item, indent + 2)
                out.append(f"{pad}- {inner[0][indent + 2:]}")
                out += inner[1:]
            else:
                out += _entry(f"{pad}-", item, indent, indent + 2)
    return out


def _entry(head: str, item: Any, indent: int, child: int) -> list[str]:
    """``head`` (``key:`` or ``-``) followed by ``item``: inline for scalars and empty collections."""
    if isinstance(item, Mapping):
        return [f"{head} {{}}"] if not item else [head, *_lines(item, child)]
    if isinstance(item, (list, tuple)):
        if not item:
            return [f"{head} []"]
        # A sequence under a key is not indented further (kubectl's style); under "-" it must be.
        return [head, *_lines(item, indent if head.endswith(":") else child)]
    if isinstance(item, FileMode):
        return [f"{head} {int(item)}  # {item:04o}"]
    if isinstance(item, str) and _block_text(item):
        body = [(" " * child + line) if line else "" for line in item[:-1].split("\n")]
        return [f"{head} |", *body]
    return [f"{head} {scalar(item)}"]


def dump(document: Mapping[str, Any], comments: Sequence[str] = ()) -> str:
    """One YAML document: ``# comment`` lines, then the mapping, ending in a newline."""
    head = [f"# {line}" if line else "#" for c in comments for line in c.split("\n")]
    return "\n".join([*head, *_lines(document, 0)]) + "\n"


def dump_all(documents: Sequence[tuple[Mapping[str, Any], Sequence[str]]]) -> str:
    """Several documents (each with its comment lines) separated by ``---``."""
    return "---\n".join(dump(doc, comments) for doc, comments in documents)
