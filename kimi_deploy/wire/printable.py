"""Text from elsewhere (a server's answer, a results file) made safe to show: in a report, on a terminal,
and inside Rich markup.

A hostile server chooses its model name, its version and every byte of its answers. Shown raw, an
ESC sequence can clear the screen, move the cursor and overwrite a ``fail`` row with ``pass``, set the
window title or hide text; a bidi override reorders what a reviewer reads; and Rich reads ``[...]`` as
markup, so a model named ``m[/]`` stops ``check``/``bench`` with a ``MarkupError`` traceback. Every such
string passes :func:`printable` before a report carries it and :func:`markup` before Rich prints it.
"""

from __future__ import annotations

import re
from typing import Any

#: Characters nothing the kit writes carries raw: C0 controls, DEL, C1 controls, lone surrogates (UTF-8
#: cannot encode them), the Unicode line and paragraph separators, the non-characters U+FFFE/U+FFFF (XML 1.0,
#: section 2.2, allows none of them but tab, LF and CR), and the bidi formatting characters (U+061C,
#: U+200E/U+200F, U+202A-U+202E, U+2066-U+2069: Unicode UAX #9), which reorder a line on a terminal.
UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069"
                         "\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, keep: str = "") -> str:
    """``text`` with every :data:`UNPRINTABLE` character but those in ``keep`` written as an escape:
    ``\\n``, ``\\r``, ``\\t``, ``\\xNN`` below U+0100, else ``\\uNNNN`` (a lone surrogate ``\\ud800``).
    Safe in a terminal, in UTF-8 and, with ``keep="\\t\\n\\r"``, in XML 1.0."""
    return UNPRINTABLE.sub(lambda m: m.group() if m.group() in keep else _NAMED.get(m.group()) or (
        f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"), text)


def markup(value: Any) -> str:
    """``str(value)`` as literal text inside Rich markup: :func:`printable`, then ``[`` escaped
    (``rich.markup.escape``), so neither a control character nor a ``[tag]`` of the value takes effect."""
    from rich.markup import escape

    return escape(printable(str(value)))
