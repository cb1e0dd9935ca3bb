"""Server-sent events framing: the one framer ``check`` and ``bench`` both read streams with.

Rules (WHATWG HTML, "Interpreting an event stream"): a line ends at CRLF, LF or CR (a CRLF split
across two reads is one line end); a blank line dispatches the event; ``data:`` lines append their
value (one leading space removed) to the event's data, several joined with LF; a line
``data`` (no colon) appends an empty value; lines starting with ``:`` are comments; other fields
(``event``, ``id``, ``retry``, unknown names) are read and ignored (OpenAI-style chat streams do
not use them); a leading byte-order mark is dropped; an event without a ``data`` field is not
dispatched. OpenAI's end marker ``data: [DONE]`` is an ordinary event here whose data is
:data:`DONE`; the caller decides what it means.

Linear in the bytes read: a line that spans many reads is kept as a list of pieces and joined
once when it ends, never re-copied per read (a 200 MB line costs O(200 MB), and is refused at
``max_line`` long before). Memory per stream: at most one partial line and one event's data,
each at most ``max_line`` bytes (:class:`kimi_deploy.wire.limits.LimitExceeded` past it).

Hot path (``bench``, once per read): when a read holds whole events, they are found with one
``bytes.split`` and an event that is one ``data: `` line is taken with a slice; anything else goes
through the line-by-line rules above.
"""

from __future__ import annotations

from kimi_deploy.wire.limits import DEFAULT_MAX_LINE_BYTES, LimitExceeded

#: The data of OpenAI's end-of-stream event (``data: [DONE]``).
DONE = b"[DONE]"

_BOM = b"\xef\xbb\xbf"
_UNBOUNDED = 1 << 62


class Framer:
    """Incremental SSE framer over raw bytes.

    ``feed(chunk)`` returns the data (bytes) of every event ``chunk`` completes, in order;
    :meth:`end` returns the data of an event the stream left unterminated (``None`` if none).

    Args:
        max_line: bytes one line, and one event's joined data, may hold (``None``: no cap).
        flag: the option named when the cap is exceeded.

    Raises (from :meth:`feed`):
        LimitExceeded: a line or an event's data is longer than ``max_line``; the framer is
            then unusable (the caller stops reading the stream).
    """

    __slots__ = ("max_line", "flag", "_parts", "_plen", "_data", "_dlen", "_cr", "_start", "_edge")

    def __init__(self, max_line: int | None = DEFAULT_MAX_LINE_BYTES, flag: str = "--max-line-bytes") -> None:
        self.max_line = max_line if max_line is not None else _UNBOUNDED
        self.flag = flag
        self._parts: list[bytes] = []   # pieces of the line not yet ended
        self._plen = 0
        self._data: list[bytes] | None = None  # data lines of the event in progress (None: no data field yet)
        self._dlen = 0
        self._cr = False     # the last read ended with CR: a LF opening the next read ends no line
        self._start: bytes | None = b""  # the stream's first bytes while a byte-order mark may come
        self._edge = True    # _start or _cr needs a look at the next read

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of each event ``chunk`` completes (``[DONE]`` included, as :data:`DONE`)."""
        if self._edge:  # the stream's first bytes, or a read after one that ended with CR
            chunk = self._at_edge(chunk)
            if chunk is None:
                return []
        if b"\r" in chunk:
            self._cr = self._edge = chunk[-1:] == b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[bytes] = []
        if self._parts:  # a line that began in an earlier read
            i = chunk.find(b"\n")
            if i < 0:
                self._hold(chunk)
                return out
            if self._plen + i > self.max_line:
                raise LimitExceeded("an SSE line", self.max_line, self.flag, self._plen + i)
            # it ends here: its pieces are copied once, with this read (linear), and framed with it
            self._parts.append(chunk)
            chunk = b"".join(self._parts)
            self._parts = []
            self._plen = 0
        blocks = chunk.split(b"\n\n")
        rest = blocks.pop()
        limit = self.max_line
        for block in blocks:
            # hot path: one "data: ..." line and nothing pending (a few C calls)
            if block[:6] == b"data: " and self._data is None and b"\n" not in block and len(block) <= limit:
                out.append(block[6:])
            else:
                for line in block.split(b"\n"):
                    self._line(line, out)
                self._line(b"", out)
        if rest:
            lines = rest.split(b"\n")
            tail = lines.pop()
            for line in lines:
                self._line(line, out)
            if tail:
                self._hold(tail)
        return out

    def _at_edge(self, chunk: bytes) -> bytes | None:
        """Drop a byte-order mark opening the stream (even one cut across reads: ``None`` while held)
        and a LF completing a CRLF whose CR ended the last read."""
        if self._start is not None:
            chunk = self._start + chunk
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._start = chunk
                return None
            self._start = None
            if chunk[:3] == _BOM:
                chunk = chunk[3:]
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        self._edge = False
        return chunk

    def end(self) -> bytes | None:
        """The stream ended: the data of the event it left without its blank line (``None``: none).

        By the WHATWG rules such an event is discarded; ``check`` still reads it (a server that ends
        with ``data: [DONE]`` and no blank line is not blamed for a missing ``[DONE]``).
        """
        out: list[bytes] = []
        if self._parts:
            line = b"".join(self._parts)
            self._parts = []
            self._plen = 0
            self._line(line, out)
        self._line(b"", out)
        return out[0] if out else None

    @property
    def pending(self) -> int:
        """Bytes held: the partial line plus the data of the event in progress."""
        return self._plen + self._dlen

    def _hold(self, piece: bytes) -> None:
        self._plen += len(piece)
        if self._plen > self.max_line:
            raise LimitExceeded("an SSE line", self.max_line, self.flag, self._plen)
        self._parts.append(piece)

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:  # blank line: dispatch
            if self._data is not None:
                out.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                self._data = None
                self._dlen = 0
            return
        if len(line) > self.max_line:
            raise LimitExceeded("an SSE line", self.max_line, self.flag, len(line))
        if line[:5] == b"data:":
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
        elif line == b"data":
            value = b""
        else:  # a comment (":...") or another field: ignored
            return
        if self._data is None:
            self._data = [value]
            self._dlen = len(value)
        else:
            self._data.append(value)
            self._dlen += len(value) + 1
            if self._dlen > self.max_line:
                raise LimitExceeded("an SSE event's data", self.max_line, self.flag, self._dlen)


def frame_all(raw: bytes, max_line: int | None = None) -> tuple[list[bytes], bytes | None]:
    """Frame a whole body: ``(data of every complete event, data of an unterminated last event or None)``.

    Raises:
        LimitExceeded: as :meth:`Framer.feed`.
    """
    framer = Framer(max_line)
    return framer.feed(raw), framer.end()
