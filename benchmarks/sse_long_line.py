#!/usr/bin/env python3
"""CPU time of the bench client's SSE sink reading one long ``data:`` line in 64 KiB reads.

Feeds ``SSESink.on_body`` (whatever ``kimi_deploy`` is first on ``PYTHONPATH``) one line of
``--mib`` MiB, 64 KiB per call as a socket delivers it, then the line end; prints the CPU
seconds (``time.process_time``). A sink that re-copies the held line on every read is quadratic;
the shared framer is linear. It passes ``Limits(max_line_bytes=None)`` where the sink takes
limits (so the whole line is read, not refused at the cap).

    PYTHONPATH=. python benchmarks/sse_long_line.py --mib 20 --mib 50 --mib 200
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import time

from kimi_deploy.bench.client import SSESink


def one(mib: int) -> float:
    loop = asyncio.new_event_loop()
    try:
        kwargs = {}
        if "limits" in inspect.signature(SSESink).parameters:
            from kimi_deploy.wire.limits import Limits

            kwargs["limits"] = Limits(max_body_bytes=None, max_line_bytes=None)
        sink = SSESink(loop.create_future(), **kwargs)
        sink.on_head(200, {"content-type": "text/event-stream"}, 0.0)
        piece = b"x" * (64 << 10)
        t0 = time.process_time()
        sink.on_body(b'data: {"choices":[{"delta":{"content":"', 0.0)
        for _ in range((mib << 20) // len(piece)):
            sink.on_body(piece, 0.0)
        sink.on_body(b'"}}]}\n\n', 0.0)
        return time.process_time() - t0
    finally:
        loop.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, action="append")
    ns = p.parse_args()
    for mib in ns.mib or [20, 50]:
        print(f"{mib:>5} MiB line: {one(mib):8.2f} s CPU", flush=True)


if __name__ == "__main__":
    main()
