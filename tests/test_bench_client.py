"""The bench client against real loopback servers that answer with scripted bytes.

Each test runs a real ``asyncio`` server on 127.0.0.1:0 whose handler writes recorded-style
HTTP/SSE bytes in pieces (with pauses so the pieces arrive in separate reads), and the
real :class:`StreamClient` on the same event loop.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from kimi_deploy.bench.client import SSESink, StreamClient
from kimi_deploy.bench.http import Connection
from kimi_deploy.bench.loadgen import closed_loop
from kimi_deploy.errors import ExitCode, KimiDeployError, UnreachableError

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


def chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def data(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def delta(**fields) -> bytes:
    return data({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]})


USAGE = data({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}})
DONE = b"data: [DONE]\n\n"


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length) if length else b""


async def serve(handler):
    """Start a loopback server calling ``handler(reader, writer)`` per connection; returns (server, url)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def scripted(pieces: list[bytes], pause: float = 0.01, close: bool = False):
    """A handler answering every request with ``pieces``, written apart with ``pause`` seconds."""

    async def handler(reader, writer):
        while await read_request(reader) is not None:
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(pause)
            if close:
                break
        writer.close()

    return handler


def run(coro):
    return asyncio.run(coro)


async def one_request(pieces, **client_kw):
    server, url = await serve(scripted(pieces, close=client_kw.pop("close", False)))
    async with server:
        async with StreamClient(url, pool_size=4, **client_kw) as client:
            return await client.stream(b'{"stream": true}')


def test_stream_with_bursts_reasoning_and_role_chunk():
    body = (chunk(delta(role="assistant", content="")) + chunk(delta(reasoning_content="think ")) + chunk(
        delta(content="one two three")) + chunk(delta(content="four")) + chunk(
        data({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})) + chunk(USAGE)
            + chunk(DONE) + b"0\r\n\r\n")
    rec = run(one_request([HEAD, body[:5], body[5:90], body[90:200], body[200:]]))
    assert rec.error is None and rec.ok
    assert len(rec.chunk_times) == 3  # role-only chunk and finish chunk carry no text
    assert rec.output_tokens == 9 and rec.prompt_tokens == 7
    assert rec.text_chars == len("think one two threefour")
    assert rec.t_end >= rec.chunk_times[-1] >= rec.chunk_times[0] > rec.t_sent


def test_crlf_comments_multiline_data_and_a_1_mib_line():
    big = "x" * (1 << 20)
    events = (b": keep-alive comment\r\n\r\n"
              + b"event: message\r\ndata: " + json.dumps({"choices": [{"delta": {"content": big}}]}).encode()
              + b"\r\n\r\n"
              + b'data: {"choices": [{"delta":\ndata: {"content": "tail"}}]}\n\n'
              + USAGE + DONE)
    body = chunk(events) + b"0\r\n\r\n"
    rec = run(one_request([HEAD, body[: 300_000], body[300_000:700_001], body[700_001:]]))
    assert rec.error is None, rec.error
    assert len(rec.chunk_times) == 2 and rec.text_chars == len(big) + 4
    assert rec.output_tokens == 9


def test_no_usage_block_leaves_tokens_unknown():
    body = chunk(delta(content="a")) + chunk(delta(content="b")) + chunk(DONE) + b"0\r\n\r\n"
    rec = run(one_request([HEAD, body]))
    assert rec.ok and rec.usage_missing and rec.tpot is None


def test_error_frame_mid_stream():
    body = chunk(delta(content="a")) + chunk(data({"error": {"message": "KV cache exhausted", "code": 503}}))
    rec = run(one_request([HEAD, body, chunk(DONE) + b"0\r\n\r\n"]))
    assert rec.error == "error frame: KV cache exhausted" and not rec.ok
    assert len(rec.chunk_times) == 1


def test_http_error_status_is_recorded_with_its_body():
    resp = b'HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 28\r\n\r\n{"detail": "bad max_tokens"}'
    rec = run(one_request([resp]))
    assert rec.status == 400 and rec.error == 'http 400: {"detail": "bad max_tokens"}'


def test_server_closing_mid_stream_is_a_disconnect():
    rec = run(one_request([HEAD, chunk(delta(content="a"))], close=True))
    assert rec.error is not None and rec.error.startswith("disconnected: connection lost")
    assert len(rec.chunk_times) == 1 and not rec.ok


def test_timeout_closes_the_connection_and_the_pool_goes_on():
    async def main():
        calls = 0
        given_up = asyncio.Event()

        async def handler(reader, writer):
            nonlocal calls
            while await read_request(reader) is not None:
                calls += 1
                writer.write(HEAD + chunk(delta(content="a")))
                if calls == 1:
                    await given_up.wait()  # stalls until the client has timed out, however long that takes
                writer.write(chunk(USAGE) + chunk(DONE) + b"0\r\n\r\n")
            writer.close()

        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=1, request_timeout=0.3) as client:
                first = await client.stream(b"{}")
                given_up.set()
                client.request_timeout = 60.0  # the second must not race 0.3 s on a busy host: it answers at once
                second = await client.stream(b"{}")
        return first, second

    first, second = run(main())
    assert first.error == "timeout" and len(first.chunk_times) == 1 and first.t_end is None
    assert second.ok and second.output_tokens == 9


def test_stale_keep_alive_connection_is_retried_once():
    async def main():
        async def handler(reader, writer):  # answers one request, then closes the idle connection
            if await read_request(reader) is not None:
                writer.write(HEAD + chunk(delta(content="a")) + chunk(USAGE) + chunk(DONE) + b"0\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.close()

        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=2) as client:
                recs = [await client.stream(b"{}") for _ in range(3)]
        return recs

    assert all(r.ok for r in run(main()))


def test_pool_holds_one_connection_per_concurrent_stream_and_reuses_them():
    async def main():
        peers = set()
        body = chunk(delta(content="a")) + chunk(USAGE) + chunk(DONE) + b"0\r\n\r\n"

        async def handler(reader, writer):
            peers.add(writer.get_extra_info("peername"))
            while await read_request(reader) is not None:
                writer.write(HEAD)
                await asyncio.sleep(0.02)
                writer.write(body)
            writer.close()

        server, url = await serve(handler)
        async with server:
            async with StreamClient(url, pool_size=8) as client:
                recs = await closed_loop(client, [b"{}"] * 40, 8)
        return peers, recs

    peers, recs = run(main())
    assert len(recs) == 40 and all(r.ok for r in recs)
    assert len(peers) == 8


def test_unreachable_server_raises_a_kit_error():
    async def main():
        server, url = await serve(scripted([]))
        server.close()
        await server.wait_closed()
        async with StreamClient(url) as client:
            with pytest.raises(UnreachableError) as info:
                await client.get_json("/server_info")
            rec = await client.stream(b"{}")
        return info.value, rec

    err, rec = run(main())
    assert "did not answer GET /server_info" in err.message and err.hint
    assert rec.error.startswith("disconnected: cannot connect")


class _NullTransport:
    """A transport that accepts writes and never closes: drives ``Connection`` by hand, read by read."""

    def write(self, data): pass
    def is_closing(self): return False
    def abort(self): pass
    def get_extra_info(self, name): return None


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64])
def test_chunked_and_sse_framing_survive_every_split(step):
    """The same stream delivered in reads of ``step`` bytes: identical result (the protocol object, fed directly)."""

    body = (HEAD + chunk(delta(role="assistant", content="x")) + chunk(b"data: " + json.dumps(
        {"choices": [{"delta": {"content": "y\r\nz"}}]}).encode() + b"\r\n\r\n") + b"5;ext=1\r\n: hi\n\r\n"
            + chunk(USAGE) + chunk(DONE) + b"0\r\nx-trailer: 1\r\n\r\n")
    loop = asyncio.new_event_loop()
    try:
        conn = Connection()
        conn.transport = _NullTransport()
        sink = SSESink(loop.create_future())
        conn.send(b"", sink)
        for i in range(0, len(body), step):
            conn.data_received(body[i:i + step])
        assert sink.done.done(), "response end not detected"
        assert sink.rec.error is None and len(sink.rec.chunk_times) == 2
        assert sink.rec.text_chars == 5 and sink.rec.output_tokens == 9
        assert conn.sink is None and conn.keep_alive
    finally:
        loop.close()


def test_close_delimited_body_ends_at_connection_close():
    """No Content-Length, no chunked framing: the body ends when the server closes (RFC 9112 §6.3)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    rec = run(one_request([head, delta(content="a"), delta(content="b") + USAGE + DONE], close=True))
    assert rec.error is None and rec.ok and len(rec.chunk_times) == 2 and rec.output_tokens == 9


def test_malformed_status_line_is_a_disconnect():
    rec = run(one_request([b"HTTP/1.1 2x0 OK\r\n\r\n"], close=True))
    assert rec.error is not None and rec.error.startswith("disconnected: bad response") and not rec.ok


def test_every_event_of_one_read_carries_the_time_of_that_read():
    """Body bytes are stamped when ``data_received`` runs, once per read, not per parser callback."""

    loop = asyncio.new_event_loop()
    try:
        conn = Connection()
        conn.transport = _NullTransport()
        sink = SSESink(loop.create_future())
        conn.send(b"", sink)
        conn.data_received(HEAD + chunk(delta(content="a")) + chunk(delta(content="b")))
        conn.data_received(chunk(delta(content="c")) + chunk(USAGE) + chunk(DONE) + b"0\r\n\r\n")
        t = sink.rec.chunk_times
        assert len(t) == 3 and t[0] == t[1] < t[2] == sink.rec.t_end
    finally:
        loop.close()


def _hostile(answer, path="/server_info", request_timeout=1.0):
    """What ``get_json(path)`` raises against a :mod:`hostile_raw` server (``None``: it answered)."""
    from hostile_raw import RawServer

    async def main(url):
        async with StreamClient(url, request_timeout=request_timeout) as client:
            try:
                await client.get_json(path)
            except KimiDeployError as exc:
                return exc
        return None

    with RawServer(answer) as server:
        return run(main(server.url))


def test_a_server_that_answers_badly_is_no_unreachable_server():
    # a trial after issue 30: a header flood and a head one byte at a time were exit 3, "is the server up?"
    from hostile_raw import forever

    def flood(method, path, body, out):
        out.write(b"HTTP/1.1 200 OK\r\n")
        forever(out, b"X-Flood: " + b"a" * 4000 + b"\r\n", 0.0, for_s=5.0)

    def slow_head(method, path, body, out):
        out.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        forever(out, b"a", 0.1, for_s=30.0)  # a header value that never ends

    for answer, why in ((flood, "headers over"), (slow_head, "no whole answer within 1 s")):
        err = _hostile(answer)
        assert type(err) is KimiDeployError and err.exit_code == ExitCode.FAILED, err
        assert "answered GET /server_info, but not with a usable HTTP answer" in err.message
        assert why in err.value, err.value

    def silent(method, path, body, out):
        forever(out, b"", 0.1, for_s=30.0)  # accepts, reads the request, sends nothing

    err = _hostile(silent)
    assert isinstance(err, UnreachableError) and "no answer within 1 s" in err.value
