#!/usr/bin/env python3
"""CPU cost per streamed chunk of the bench client's SSE sink: the hot path, without the network.

``benchmarks/calibrate.py`` measures the whole client against a server on the same cores, so on a
shared machine its figures move with the neighbours' load. This feeds ``SSESink.on_body`` (whatever
``kimi_deploy`` is first on ``PYTHONPATH``: run it once per checkout) a synthetic SGLang stream held
in memory: 1-token chat chunks as SGLang 0.5.23 writes them, then usage and ``[DONE]``, cut into
reads of ``--bytes`` bytes (reads end mid-line, as TCP delivers them). It reports the best of
``--repeat`` runs of CPU time (``time.process_time``) per chunk: the minimum is what the code costs,
the rest is the machine.

    PYTHONPATH=. python benchmarks/sink_hotpath.py [--chunks 200000] [--bytes 4096] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from kimi_deploy.bench.client import SSESink


def stream(chunks: int) -> bytes:
    out = []
    for i in range(chunks):
        out.append(b"data: " + json.dumps({
            "id": "0b6c1f", "object": "chat.completion.chunk", "created": 1760000000, "model": "kimi-k2",
            "choices": [{"index": 0, "delta": {"role": None, "content": f" tok{i % 97}", "reasoning_content": None,
                                               "tool_calls": None}, "logprobs": None, "finish_reason": None,
                         "matched_stop": None}], "usage": None}, separators=(",", ":")).encode() + b"\n\n")
    out.append(b'data: {"id":"0b6c1f","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % chunks)
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def once(reads: list[bytes], chunks: int) -> float:
    loop = asyncio.new_event_loop()
    try:
        sink = SSESink(loop.create_future())
        sink.on_head(200, {"content-type": "text/event-stream"}, 0.0)
        t0 = time.process_time()
        for i, r in enumerate(reads):
            sink.on_body(r, float(i))
        sink.on_end(float(len(reads)))
        dt = time.process_time() - t0
        assert sink.rec.error is None and len(sink.rec.chunk_times) == min(chunks, len(sink.rec.chunk_times)), sink.rec.error
        return dt
    finally:
        loop.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=200_000)
    p.add_argument("--bytes", type=int, default=4096, help="bytes per read")
    p.add_argument("--repeat", type=int, default=7)
    ns = p.parse_args()
    body = stream(ns.chunks)
    reads = [body[i:i + ns.bytes] for i in range(0, len(body), ns.bytes)]
    times = sorted(once(reads, ns.chunks) for _ in range(ns.repeat))
    print(f"{ns.chunks} chunks in {len(reads)} reads of {ns.bytes} B: best {times[0] / ns.chunks * 1e9:.0f} ns/chunk, "
          f"median {times[len(times) // 2] / ns.chunks * 1e9:.0f} ns/chunk ({1 / (times[0] / ns.chunks) / 1e3:.0f} k chunks/s)")


if __name__ == "__main__":
    main()
