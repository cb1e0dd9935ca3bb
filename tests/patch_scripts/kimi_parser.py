"""Run in an SGLang 0.5.23 interpreter: SGLang's own FunctionCallParser(tools, "kimi_k2") on raw outputs.

argv[1]: JSON {"tools": [[name, [property, ...] or {property: JSON type}], ...], "cases": {name: raw
model output}} (properties given as a list are strings).
Prints one JSON object {case: {"non_stream": {...}, "stream": {...}, "stream_merged": {...}}}:
each with the normal text and the calls (name + concatenated arguments per tool_index).
"stream" feeds token-aligned chunks (each Kimi marker one chunk, the text between markers one
chunk); "stream_merged" feeds everything from the second marker on as one chunk, as when speculative
decoding delivers several markers at once (tool-call-failures.md item 8).
"""
import json, re, sys

from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser

spec = json.loads(sys.argv[1])
tools = [Tool(type="function", function=Function(name=name, parameters={
    "type": "object", "properties": {p: {"type": props[p] if isinstance(props, dict) else "string"} for p in props}}))
    for name, props in spec["tools"]]
marker = re.compile(r"(<\|[a-z_]+\|>)")


def collect(text, calls):
    merged = {}
    for c in calls:
        item = merged.setdefault(c.tool_index, {"name": None, "arguments": ""})
        item["name"] = item["name"] or c.name
        item["arguments"] += c.parameters or ""
    return {"text": text, "calls": [merged[k] for k in sorted(merged)]}


out = {}
for case, raw in spec["cases"].items():
    parser = FunctionCallParser(tools, "kimi_k2")
    text, calls = parser.parse_non_stream(raw)
    result = {"non_stream": collect(text, calls)}
    pieces = [p for p in marker.split(raw) if p]
    for mode, chunks in (("stream", pieces), ("stream_merged", pieces[:1] + ["".join(pieces[1:])])):
        parser = FunctionCallParser(tools, "kimi_k2")
        text, calls = "", []
        for chunk in chunks:
            t, c = parser.parse_stream_chunk(chunk)
            text += t
            calls += c
        t, c = parser.parse_stream_end()
        result[mode] = collect(text + t, calls + c)
    out[case] = result
print(json.dumps(out))
