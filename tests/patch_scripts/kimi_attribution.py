"""Run in an SGLang 0.5.23 interpreter: SGLang's own FunctionCallParser(tools, "kimi_k2") on a corpus.

argv[1]: a JSON file {"toolsets": {name: [OpenAI-shaped tool, ...]}, "cases": {case: {"tools": toolset
name, "raw": raw model output}}, "seeds": [int, ...]}.
Prints one JSON object {case: {mode: {"text", "calls": [[name, arguments], ...]}, "mutated": bool,
"warnings": [...], "network": [...]}}. Modes: "non_stream" (parse_non_stream); "tokens" (each
Kimi marker one chunk, the text between markers one chunk); "random<seed>" (pseudo-tokens, each
marker whole and other text in 1-3 character pieces, fed 1-6 tokens a chunk, as EAGLE-3 delivers
them); "whole" (the whole output in one chunk, as speculative decoding can deliver it). Streaming
calls are merged per tool_index in index order; parse_stream_end is called as serving_chat does.
"mutated": a tool's parameters changed while parsing. "network": any attempt to open a URL or a
socket (schemas with remote $ref must not fetch).
"""
import copy, json, logging, random, re, socket, sys, urllib.request

from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser

import kimi_stream

network = []


def _refuse(*args, **kwargs):
    network.append(repr(args[:1]))
    raise OSError("network access refused by the test")


urllib.request.urlopen = _refuse
socket.create_connection = _refuse


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


handler = Collect()
logging.getLogger("sglang.srt.function_call").addHandler(handler)
logging.getLogger("sglang.srt.function_call").setLevel(logging.WARNING)

spec = json.load(open(sys.argv[1]))
marker = re.compile(r"(<\|[a-z_]+\|>)")


def pseudo_tokens(raw, rng):
    out = []
    for part in marker.split(raw):
        if not part:
            continue
        if marker.fullmatch(part):
            out.append(part)
            continue
        i = 0
        while i < len(part):
            n = rng.randint(1, 3)
            out.append(part[i:i + n])
            i += n
    return out


def stream(tools, chunks):
    return kimi_stream.stream(tools, chunks)[0]


out = {}
for case, item in spec["cases"].items():
    raw = item["raw"]
    dicts = spec["toolsets"][item["tools"]]
    before = copy.deepcopy(dicts)
    tools = [Tool(**t) for t in dicts]
    handler.lines = []
    del network[:]
    parser = FunctionCallParser(tools, "kimi_k2")
    text, calls = parser.parse_non_stream(raw)
    result = {"non_stream": {"text": text, "calls": [[c.name, c.parameters] for c in calls]}}
    result["tokens"] = stream(tools, [p for p in marker.split(raw) if p])
    for seed in spec["seeds"]:
        rng = random.Random(seed)
        toks = pseudo_tokens(raw, rng)
        chunks, i = [], 0
        while i < len(toks):
            n = rng.randint(1, 6)
            chunks.append("".join(toks[i:i + n]))
            i += n
        result[f"random{seed}"] = stream(tools, chunks)
    result["whole"] = stream(tools, [raw])
    result["mutated"] = [t.model_dump(exclude_none=True)["function"].get("parameters") for t in tools] != \
        [t["function"].get("parameters") for t in before]
    result["warnings"] = list(handler.lines)
    result["network"] = list(network)
    out[case] = result
print(json.dumps(out))
