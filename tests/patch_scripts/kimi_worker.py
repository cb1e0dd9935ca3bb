"""Run in an SGLang 0.5.23 interpreter: SGLang's own FunctionCallParser(tools, "kimi_k2"), one case a line.

Reads JSON lines from stdin, each ``{"tools": [OpenAI-shaped tool, ...], "chunkings": [[chunk, ...],
...]}``; the raw output is the concatenation of any chunking. Writes one JSON line per case:
``{"non_stream": {"text", "calls": [[name, arguments], ...]}, "streams": [{"text", "calls"}, ...],
"indexes": [[tool_index, ...] per stream], "error": null or the traceback of an exception that
escaped the parser}``. Streaming calls are merged per tool_index in index order;
parse_stream_end is called as serving_chat does. Used by the property tests, which draw many
small cases and would spend most of their time starting interpreters otherwise.
"""
import json, logging, sys, traceback

from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser

from kimi_stream import stream

logging.disable(logging.CRITICAL)


for line in sys.stdin:
    case = json.loads(line)
    out = {"error": None}
    try:
        tools = [Tool(**t) for t in case["tools"]]
        raw = "".join(case["chunkings"][0])
        text, calls = FunctionCallParser(tools, "kimi_k2").parse_non_stream(raw)
        out["non_stream"] = {"text": text, "calls": [[c.name, c.parameters] for c in calls]}
        out["streams"], out["indexes"] = [], []
        for chunks in case["chunkings"]:
            result, indexes = stream(tools, chunks)
            out["streams"].append(result)
            out["indexes"].append(indexes)
    except Exception:
        out["error"] = traceback.format_exc()[-3000:]
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
