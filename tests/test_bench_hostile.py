"""The bench client against hostile loopback servers (issue #11): bounded memory, no false success.

Real ``asyncio`` servers on 127.0.0.1:0 (the helpers of tests/test_bench_client.py) answer with
streams cut before ``data: [DONE]``, lines and bodies past the caps, gzip the client did not ask
for, endless heads; the real :class:`StreamClient` reads them. Nothing here reads the wall clock.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from helpers import run_cli
from test_bench_client import DONE, HEAD, USAGE, chunk, delta, one_request, read_request, run, serve
from kimi_deploy.bench import metrics
from kimi_deploy.bench.client import NotRead, StreamClient
from kimi_deploy.bench.metrics import RequestRecord, summarize
from kimi_deploy.errors import ExitCode
from kimi_deploy.wire.limits import Limits

END = b"0\r\n\r\n"


def test_a_stream_cut_without_done_is_an_error_not_a_success():
    body = chunk(delta(content="a")) + chunk(delta(content="b")) + chunk(USAGE) + END
    rec = run(one_request([HEAD, body]))
    assert not rec.ok and rec.error.startswith("no [DONE]"), rec
    assert len(rec.chunk_times) == 2 and rec.t_end is not None  # still counted in the window
    s = summarize([[rec]])
    assert s.completed == 0 and s.error_kinds == {"no [DONE]": 1}


def test_done_without_its_blank_line_still_ends_the_stream():
    body = chunk(delta(content="a")) + chunk(USAGE) + chunk(b"data: [DONE]\n") + END
    rec = run(one_request([HEAD, body]))
    assert rec.ok and rec.error is None, rec.error


def test_a_line_over_the_cap_ends_the_request_and_its_connection():
    """A 6 MiB line (as a hostile server would send 200 MB) against a 1 MiB cap: refused at the cap."""
    sent = {"bytes": 0}
    piece = b"x" * (256 << 10)

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(HEAD + chunk(b"data: "))
        try:
            for _ in range(24):
                writer.write(chunk(piece))
                await writer.drain()
                sent["bytes"] += len(piece)
                await asyncio.sleep(0.005)
        except ConnectionError:
            pass
        writer.close()

    async def main():
        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=1, limits=Limits(max_line_bytes=1 << 20)) as client:
                return await client.stream(b"{}")

    rec = run(main())
    assert rec.error.startswith("too large: an SSE line exceeded --max-line-bytes 1048576"), rec.error
    assert not rec.ok


def test_a_body_in_an_encoding_not_asked_for_is_refused_not_decoded():
    bomb = gzip.compress(b"data: " + b"A" * (8 << 20) + b"\n\n")
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            b"content-length: %d\r\n\r\n" % len(bomb))
    rec = run(one_request([head, bomb]))
    assert rec.error == "content-encoding 'gzip' not decoded (Accept-Encoding: identity was sent)", rec.error
    assert not rec.ok


def test_requests_ask_for_identity_encoding():
    heads = []

    async def handler(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head.lower())
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(HEAD + chunk(delta(content="a")) + chunk(USAGE) + chunk(DONE) + END)
        await writer.drain()
        writer.close()

    async def main():
        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=1) as client:
                return await client.stream(b"{}")

    assert run(main()).ok
    assert b"accept-encoding: identity\r\n" in heads[0]


def _control_server(head: bytes, body_pieces: int, piece: bytes = b"{" * 65536):
    async def handler(reader, writer):
        while await read_request(reader) is not None:
            writer.write(head)
            try:
                for _ in range(body_pieces):
                    writer.write(piece)
                    await writer.drain()
            except ConnectionError:
                break
        writer.close()

    return handler


def test_a_control_plane_body_over_the_cap_is_not_read():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (64 * 65536)

    async def main():
        server, url = await serve(_control_server(head, 64))
        async with server:
            async with StreamClient(url, pool_size=1, limits=Limits(max_body_bytes=1 << 20)) as client:
                return await client.get_json("/server_info")

    status, body = run(main())
    assert status == 200 and isinstance(body, NotRead)
    assert "the body exceeded --max-body-bytes 1048576" in body


def test_an_endless_error_body_is_read_up_to_the_cap():
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(head)
        try:
            while True:  # never ends: only the client's cap stops it
                writer.write(chunk(b"E" * 65536))
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async def main():
        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=1, limits=Limits(max_body_bytes=1 << 20)) as client:
                return await client.stream(b"{}")

    rec = run(main())
    assert rec.status == 500 and rec.error.startswith("too large: http 500: the body exceeded"), rec.error


def test_an_endless_head_is_a_bad_response():
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(200))
    rec = run(one_request([head], close=True))
    assert rec.error.startswith("disconnected: bad response: headers over 65536 bytes"), rec.error


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * (1 << 20),
                                  b"HTTP/1.1 200 " + b"O" * (1 << 20)], ids=["a header value", "the status line"])
def test_a_head_line_that_never_ends_is_refused_at_the_head_bound(head):
    """One header value (or reason phrase) without its line end: httptools holds it and never calls on_header,
    so the 64 KiB bound never fired and bench read until --request-timeout (359 MiB at 60 s; issue #30
    item 11). The server closes after 1 MiB: before, that was "connection lost", never the bound."""
    rec = run(one_request([head], close=True))
    assert rec.error.startswith("disconnected: bad response: headers over 65536 bytes"), rec.error


def test_chunk_times_are_bounded_and_the_metrics_stay_exact(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_CHUNK_TIMES", 8)
    body = b"".join(chunk(delta(content="t")) for _ in range(30)) + chunk(USAGE) + chunk(DONE) + END
    rec = run(one_request([HEAD] + [body[i:i + 200] for i in range(0, len(body), 200)]))
    assert rec.ok, rec.error
    assert len(rec.chunk_times) == 8 and rec.chunks == 30 and rec.chunks_dropped == 22
    assert rec.row()["chunks"] == 30 and rec.row()["chunk_times_dropped"] == 22
    assert len(rec.itls) == 6  # gaps of the first 7 kept times only


def test_add_chunks_keeps_the_first_and_the_latest():
    r = RequestRecord(t_sent=0.0)
    for i in range(1, metrics.MAX_CHUNK_TIMES + 11):
        r.add_chunks(float(i))
    assert len(r.chunk_times) == metrics.MAX_CHUNK_TIMES and r.chunks_dropped == 10
    assert r.chunk_times[0] == 1.0 and r.chunk_times[-1] == float(metrics.MAX_CHUNK_TIMES + 10)
    r.add_chunks(1e6, 5)
    assert r.chunks == metrics.MAX_CHUNK_TIMES + 15 and r.chunk_times[-1] == 1e6


@pytest.mark.parametrize("flag,value", [("--max-body-bytes", "100"), ("--max-line-bytes", "lots"),
                                        ("--max-line-bytes", "0")])
def test_cap_flags_refuse_nonsense_before_sending(flag, value):
    result = run_cli(["bench", "--base-url", "http://127.0.0.1:9", flag, value])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert flag in result.output


def test_cap_flags_take_suffixes_and_reach_the_config(tmp_path):
    from kimi_deploy.cli.common import ByteSize

    assert ByteSize().convert("64K", None, None) == 65536
    assert ByteSize().convert("16MiB", None, None) == 16 << 20
    assert ByteSize().convert("1g", None, None) == 1 << 30
    from kimi_deploy.bench.loadgen import BenchConfig

    cfg = BenchConfig(base_url="http://x", max_body_bytes=1 << 20, max_line_bytes=4096)
    assert cfg.to_dict()["max_body_bytes"] == 1 << 20 and cfg.to_dict()["max_line_bytes"] == 4096
    with pytest.raises(Exception, match="--max-line-bytes"):
        BenchConfig(base_url="http://x", max_line_bytes=10)
    assert json.dumps(cfg.to_dict())
