"""Imported by the patch scripts run in an SGLang 0.5.23 interpreter (kimi_attribution.py, kimi_worker.py):
SGLang's own streaming FunctionCallParser(tools, "kimi_k2") fed chunk by chunk, as serving_chat does."""
from sglang.srt.function_call.function_call_parser import FunctionCallParser


def merged(calls):
    """Streamed call items merged per tool_index: ``([[name, arguments], ...] in index order, [index, ...])``."""
    by_index = {}
    for c in calls:
        item = by_index.setdefault(c.tool_index, [None, ""])
        item[0] = item[0] or c.name
        item[1] += c.parameters or ""
    return [by_index[k] for k in sorted(by_index)], sorted(by_index)


def stream(tools, chunks):
    """Feed ``chunks`` then call parse_stream_end: ``({"text", "calls"}, [tool_index, ...])``."""
    parser = FunctionCallParser(tools, "kimi_k2")
    text, calls = "", []
    for chunk in chunks:
        t, c = parser.parse_stream_chunk(chunk)
        text += t
        calls += c
    t, c = parser.parse_stream_end()
    merged_calls, indexes = merged(calls + c)
    return {"text": text + t, "calls": merged_calls}, indexes
