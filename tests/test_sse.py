"""The one SSE framer (kimi_deploy.wire.sse) against a line-by-line reading of the WHATWG rules.

The reference below follows the spec's algorithm literally (split into lines at CRLF/LF/CR,
one field per line, dispatch on a blank line); the framer must give the same events for any
stream cut into reads anywhere, and refuse a line or an event longer than its cap after
reading at most the cap plus one read.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_deploy.wire.limits import LimitExceeded
from kimi_deploy.wire.sse import DONE, Framer, frame_all


def reference(raw: bytes) -> list[bytes]:
    """WHATWG "Interpreting an event stream", written out line by line (complete events only)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = re.split(rb"\r\n|\r|\n", raw)
    lines.pop()  # the text after the last line end is no line (yet)
    events, data = [], None
    for line in lines:
        if line == b"":
            if data is not None:
                events.append(b"\n".join(data))
            data = None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data = (data or []) + [value]
    return events


def feed_in(raw: bytes, cuts: list[int], max_line: int | None = None) -> list[bytes]:
    framer = Framer(max_line)
    out, last = [], 0
    for cut in sorted(set(cuts)) + [len(raw)]:
        out += framer.feed(raw[last:cut])
        last = cut
    return out


PIECES = [b"data: {\"a\": 1}", b"data:x", b"data", b"data: [DONE]", b": comment", b"event: message",
          b"id: 7", b"retry: 10", b"data:  two spaces", b"", b"bogus", b"data: \xc3\xa9"]
ENDS = [b"\n", b"\r\n", b"\r"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(ENDS)), max_size=30),
       st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.booleans())
def test_any_stream_cut_anywhere_gives_the_spec_events(lines, cuts, bom):
    raw = (b"\xef\xbb\xbf" if bom else b"") + b"".join(piece + end for piece, end in lines)
    assert feed_in(raw, cuts) == reference(raw)
    assert frame_all(raw)[0] == reference(raw)


def test_openai_stream_and_done():
    raw = b'data: {"x":1}\n\ndata: {"x":2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n'
    assert frame_all(raw) == ([b'{"x":1}', b'{"x":2}', DONE], None)


def test_multi_line_data_joined_with_lf_and_one_space_dropped():
    assert frame_all(b"data:a\ndata:  b\ndata\n\n")[0] == [b"a\n b\n"]


def test_unterminated_last_event_is_left_to_the_caller():
    framer = Framer()
    assert framer.feed(b"data: 1\n\ndata: [DONE]") == [b"1"]
    assert framer.end() == DONE
    assert frame_all(b"data: a\n")[1] == b"a"
    assert frame_all(b"data: a\n\n")[1] is None


def test_crlf_split_across_reads_is_one_line_end():
    framer = Framer()
    assert framer.feed(b"data: a\r") == []
    assert framer.feed(b"\n") == []      # the LF completes the CRLF: no blank line yet
    assert framer.feed(b"\r\n") == [b"a"]


def test_a_200_mb_line_is_refused_at_the_cap_after_one_read_more():
    """Read by read, as a socket delivers it: the framer stops at the cap, never near 200 MB."""
    cap, read = 1 << 20, 64 << 10
    framer = Framer(cap)
    piece = b"x" * read
    fed = framer.feed(b"data: ")
    total = 6
    with pytest.raises(LimitExceeded) as info:
        while total < 200 << 20:
            fed += framer.feed(piece)
            total += read
    assert fed == [] and total <= cap + read
    assert info.value.limit == cap and "--max-line-bytes" in str(info.value)


def test_a_line_within_one_read_is_capped_too():
    with pytest.raises(LimitExceeded):
        Framer(1024).feed(b"data: " + b"y" * 2000 + b"\n\n")
    with pytest.raises(LimitExceeded):  # many short data lines: the event's data is capped
        Framer(1024).feed(b"data: " + b"z" * 600 + b"\n" + b"data: " + b"z" * 600 + b"\n\n")
    assert Framer(1024).feed(b"data: " + b"y" * 1000 + b"\n\n") == [b"y" * 1000]


def test_a_long_line_spanning_many_reads_is_joined_once():
    """The pieces of a long line are held, not concatenated per read: 4 MiB in 4 KiB reads."""
    line = b"data: " + b"q" * (4 << 20)
    framer = Framer(8 << 20)
    out = []
    for i in range(0, len(line), 4096):
        out += framer.feed(line[i:i + 4096])
        assert framer.pending <= len(line)
    assert len(framer._parts) > 1000  # held as pieces
    out += framer.feed(b"\n\n")
    assert out == [b"q" * (4 << 20)]
