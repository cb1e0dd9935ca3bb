"""The attribution rule of the kimi-k2-tool-call-ids patch, on a corpus run through SGLang's own parser.

The rule (docs/design.md#the-patch-series, the series manifest): 1. an id that names a tool of the
request resolves to that tool only (forms with a separator before separator-less ones; two tools
matching one form is no match); 2. an id that names no tool of the request is dropped; 3. an id
that carries no name is attributed only when the arguments are a JSON object valid against exactly
one tool's parameters schema (required keys, types, no undeclared key); 4. a call that cannot be
resolved is skipped, the rest of the output still parses.

Every case runs non-streaming and streaming in several chunkings (tests/patch_scripts/
kimi_attribution.py) in a throwaway patched copy of SGLang 0.5.23; for every case and mode: never
a wrong tool, never an extra call, no markup in the text, streaming equals non-streaming, and the
calls the rule attributes are kept. Tool sets share argument names as agent tool sets do
(file_path, path, pattern, command, city). The same corpus run on pristine 0.5.23 shows where the
unpatched parser drops or misattributes.
"""

from __future__ import annotations

import json

import pytest

from patch_helpers import run_json

pytestmark = pytest.mark.sglang

B, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def tool(name: str, properties: dict | None = None, required: tuple[str, ...] = (), **schema) -> dict:
    """An OpenAI tool; ``properties`` maps a key to its JSON type (or a schema), ``None``: no parameters."""
    if properties is None and not schema:
        return {"type": "function", "function": {"name": name}}
    params = dict(schema) or {"type": "object"}
    if properties is not None:
        params["properties"] = {k: v if isinstance(v, dict) else {"type": v} for k, v in properties.items()}
    if required:
        params["required"] = list(required)
    return {"type": "function", "function": {"name": name, "parameters": params}}


PATH = {"path": "string"}
TOOLSETS = {
    # a coding agent's file tools: Read and Delete take the same single required key
    "files": [tool("Read", {"file_path": "string", "offset": "integer", "limit": "integer"}, ("file_path",)),
              tool("Write", {"file_path": "string", "content": "string"}, ("file_path", "content")),
              tool("Edit", {"file_path": "string", "old_string": "string", "new_string": "string"},
                   ("file_path", "old_string", "new_string")),
              tool("Delete", {"file_path": "string"}, ("file_path",))],
    # the same tools, Delete listed first (list order must never decide)
    "files_rev": None,
    "search": [tool("Glob", {"pattern": "string", "path": "string"}, ("pattern",)),
               tool("Grep", {"pattern": "string", "path": "string", "output_mode": "string"}, ("pattern",)),
               tool("LS", {"path": "string"}, ("path",))],
    # a tool whose name is another tool's name plus _<digits>, a tool without parameters
    "weather": [tool("get_weather", {"city": "string"}, ("city",)),
                tool("get_weather_2", {"city": "string", "unit": "string"}, ("city",)),
                tool("get_time", {"timezone": "string"}, ("timezone",)),
                tool("ping")],
    "shell": [tool("exec", {"command": "string"}, ("command",)),
              tool("Bash", {"command": "string", "timeout": "integer"}, ("command",))],
    # MCP-style and dotted names (clients sanitise dots to _ in ids)
    "mcp": [tool("mcp__github__search_code", {"query": "string"}, ("query",)),
            tool("mcp__github__search_issues", {"query": "string", "state": "string"}, ("query", "state")),
            tool("github.search", {"q": "string"}, ("q",)),
            tool("list-files", PATH, ("path",))],
    "valid": [tool("valid", {"x": "string"}, ("x",))],
    # "functionsstep12" is step's call 12 or step1's call 2: no separator tells
    "steps": [tool("step", {"n": "integer"}, ("n",)), tool("step1", {"n": "integer"}, ("n",))],
    # upstream SGLang's strict-inference schema shapes (test_kimik2_inference.py), our own cases
    "ref": [tool("read", None, **{"$defs": {"a": {"type": "object", "properties": PATH and {"path": {"type": "string"}},
                                                   "required": ["path"]}}, "$ref": "#/$defs/a"}),
            tool("weather", {"city": "string"}, ("city",))],
    "pattern": [tool("read", None, type="object", patternProperties={"^path$": {"type": "string"}},
                     additionalProperties=False),
                tool("weather", {"city": "string"}, ("city",))],
    "allof": [tool("read", {"tag": "string"}, allOf=[{"type": "object", "properties": {"path": {"type": "string"}},
                                                      "required": ["path"]}]),
              tool("weather", {"city": "string"}, ("city",))],
    "extra_branch": [tool("read", None, allOf=[{"type": "object", "additionalProperties": {"type": "string"}}]),
                     tool("weather", {"city": "string"}, ("city",))],
    "unevaluated": [tool("read", None, type="object", unevaluatedProperties=True),
                    tool("weather", {"city": "string"}, ("city",))],
    "ref_twin": [tool("read", None, **{"$defs": {"a": {"type": "object", "properties": {"path": {"type": "string"}},
                                                       "required": ["path"]}}, "$ref": "#/$defs/a"}),
                 tool("delete", PATH, ("path",))],
    "broken_ref": [tool("read", PATH, ("path",), **{"$ref": "#/$defs/missing"}),
                   tool("delete", PATH, ("path",))],
    "remote_ref": [tool("read", None, **{"$ref": "https://example.invalid/tool.json"}),
                   tool("delete", PATH, ("path",))],
    "alias": [tool("read", {"path": "varchar"}, ("path",)), tool("weather", {"city": "string"}, ("city",))],
    "broken_then_weather": [tool("delete", PATH, ("path",), **{"$ref": "#/$defs/missing"}),
                            tool("weather", {"city": "string"}, ("city",))],
}
TOOLSETS["files_rev"] = list(reversed(TOOLSETS["files"]))
#: upstream's strict-inference tests try every schema shape in both list orders, beside a tool that
#: takes another key (unique) and beside one that takes the same key (a tie)
SHAPES = ("ref", "pattern", "allof", "extra_branch", "unevaluated")
for _shape in SHAPES:
    TOOLSETS[f"{_shape}_rev"] = list(reversed(TOOLSETS[_shape]))
    TOOLSETS[f"{_shape}_tie"] = [TOOLSETS[_shape][0], tool("delete", PATH, ("path",))]
    TOOLSETS[f"{_shape}_tie_rev"] = list(reversed(TOOLSETS[f"{_shape}_tie"]))
TOOLSETS["broken_ref_rev"] = list(reversed(TOOLSETS["broken_ref"]))


def call(cid: str, args: str) -> str:
    return CB + cid + AB + args + CE


def section(*calls: str) -> str:
    return B + "".join(calls) + E


def sanitised(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


#: Id forms that name a tool: (form, template); {n} the name, {s} its [A-Za-z0-9_-] spelling, {k} a counter.
NAMED_FORMS = (
    ("canonical", "functions.{n}:{k}"),
    ("colon", "{n}:{k}"),
    ("sanitised", "functions_{s}_{k}"),
    ("sanitised_bare", "{s}_{k}"),
    ("no_separator", "functions{s}{k}"),
    ("newline", "\nfunctions.{n}:{k}"),
)
#: (tool set, tool, arguments, counter): calls whose id names the tool.
NAMED = (
    ("files", "Read", {"file_path": "/etc/hosts"}, 3),
    ("files_rev", "Delete", {"file_path": "/tmp/x"}, 4),
    ("search", "Grep", {"pattern": "TODO"}, 7),
    ("weather", "get_weather", {"city": "Oslo"}, 20),  # get_weather's 21st call beside get_weather_2
    ("weather", "get_weather_2", {"city": "Oslo"}, 0),
    ("weather", "ping", {}, 5),
    ("mcp", "mcp__github__search_code", {"query": "kimi"}, 2),
    ("mcp", "github.search", {"q": "kimi"}, 1),
    ("mcp", "list-files", {"path": "/srv"}, 9),
)
#: Where a named form is ambiguous under the rule (none of NAMED: "functionsget_weather20" can only be
#: get_weather, get_weather_2 would be "functionsget_weather_20"); see "named.ambiguous_*" below.
NAMED_DROPPED: set[tuple[str, str]] = set()

#: Client-style ids that carry no name (tool-call-failures.md item 4, vLLM's and Anthropic's styles).
NAMELESS_IDS = (
    ("openai", "call_59adf5614cfe4f4b8a71be54"),
    ("call_digits", "call00003"),
    ("anthropic", "toolu_01A09q90qw90lq917835lq9"),
    ("uuid", "0b5e7a4e-8a7f-4c9b-9d35-2f1c3c8f2e61"),
    ("counter", "3"),
    ("vllm", "chatcmpl-tool-9f8e7d6c5b4a"),
    ("short", "call_x"),  # a one- or two-letter tail is minted, not a word
)
#: (label, tool set, raw arguments, the one tool they fit or None)
NAMELESS = (
    ("read_or_delete", "files", '{"file_path": "/etc/hosts"}', None),
    ("read_or_delete_rev", "files_rev", '{"file_path": "/etc/hosts"}', None),
    ("write", "files", '{"file_path": "/a.py", "content": "x"}', "Write"),
    ("read_offset", "files", '{"file_path": "/a.py", "offset": 10}', "Read"),
    ("edit", "files", '{"file_path": "a", "old_string": "x", "new_string": "y"}', "Edit"),
    ("files_empty", "files", "{}", None),
    ("glob_or_grep", "search", '{"pattern": "*.py"}', None),
    ("grep", "search", '{"pattern": "x", "output_mode": "content"}', "Grep"),
    ("ls", "search", '{"path": "/srv"}', "LS"),
    ("ping", "weather", "{}", "ping"),
    ("weather_tie", "weather", '{"city": "Oslo"}', None),
    ("weather_2", "weather", '{"city": "Oslo", "unit": "C"}', "get_weather_2"),
    ("time", "weather", '{"timezone": "UTC"}', "get_time"),
    ("wrong_type", "weather", '{"timezone": 5}', None),
    ("undeclared_key", "weather", '{"timezone": "UTC", "verbose": true}', None),
    ("list", "weather", '["Oslo"]', None),
    ("string", "weather", '"{\\"city\\": \\"Oslo\\"}"', None),
    ("shell_tie", "shell", '{"command": "ls"}', None),
    ("bash", "shell", '{"command": "ls", "timeout": 5}', "Bash"),
)
#: Ids that name no tool of the request: (label, tool set, id, arguments).
FOREIGN = (
    ("unknown_name", "files", "functions.Remove:0", '{"file_path": "/x"}'),
    ("weird", "valid", "weird@id", '{"x": "1"}'),
    ("dotted_counter", "valid", "functions.invalid.0", '{"x": "1"}'),
    ("typo", "weather", "functions_get_wether_1", '{"city": "Oslo"}'),
    ("wrong_case", "files", "functions.read:0", '{"file_path": "/x"}'),
    ("garbage", "files", "some_garbage", '{"file_path": "/x"}'),
    ("name_plus_word", "files", "Read_file_3", '{"file_path": "/x"}'),
    # a word after a client prefix may name a tool the request lacks: never inferred from the arguments
    ("word_call", "files", "call_read", '{"file_path": "/a", "content": "x"}'),
    ("word_toolu", "files", "toolu_delete", '{"file_path": "/a", "content": "x"}'),
    ("word_vllm", "weather", "chatcmpl-tool-time", '{"timezone": "UTC"}'),
)

#: case -> (tool set, raw model output, expected [(name, arguments as JSON or raw text)])
CASES: dict[str, tuple[str, str, list[tuple[str, object]]]] = {}
for form, template in NAMED_FORMS:
    for toolset, name, args, k in NAMED:
        cid = template.format(n=name, s=sanitised(name), k=k)
        expected = [] if (form, name) in NAMED_DROPPED else [(name, args)]
        CASES[f"named.{form}.{toolset}.{name}"] = (toolset, section(call(cid, json.dumps(args))), expected)
for style, cid in NAMELESS_IDS:
    for label, toolset, args, fit in NAMELESS:
        CASES[f"nameless.{style}.{label}"] = (toolset, section(call(cid, args)),
                                               [(fit, json.loads(args))] if fit else [])
for label, toolset, cid, args in FOREIGN:
    CASES[f"foreign.{label}"] = (toolset, section(call(cid, args)), [])

UTC = '{"timezone": "UTC"}'
WRITE, READ_B = '{"file_path": "/a", "content": "x"}', '{"file_path": "/b"}'
CASES.update({
    # rule 4: a malformed call is skipped, the next one still parses and no raw text reaches the user
    "skip.list_then_canonical": ("weather", "Checking." + section(call("call_1", '["a"]'),
                                                                call("functions.get_time:1", UTC)),
                                 [("get_time", {"timezone": "UTC"})]),
    "skip.string_then_canonical": ("weather", section(call("toolu_01x", '"UTC"'), call("functions.get_time:1", UTC)),
                                   [("get_time", {"timezone": "UTC"})]),
    "skip.foreign_then_sanitised": ("weather", section(call("weird@id", '{"city": "x"}'),
                                                       call("functions_get_time_1", UTC)),
                                    [("get_time", {"timezone": "UTC"})]),
    "skip.tie_then_named": ("files", section(call("call_9", '{"file_path": "/a"}'),
                                             call("functions.Write:2", '{"file_path": "/a", "content": "b"}')),
                            [("Write", {"file_path": "/a", "content": "b"})]),
    "skip.bad_json_then_named": ("weather", section(call("call_2", '{"city": '), call("functions.get_time:3", UTC)),
                                 [("get_time", {"timezone": "UTC"})]),
    # a missing <|tool_call_end|> ends the call at the next call or the section end, never swallows it
    "skip.missing_end_then_named": ("files", section(CB + "call_9" + AB + WRITE, call("functions.Read:1", READ_B)),
                                    [("Write", json.loads(WRITE)), ("Read", json.loads(READ_B))]),
    "skip.named_missing_end_then_named": ("files", section(CB + "functions.Write:0" + AB + '{"file_path": "/a"',
                                                           call("functions.Read:1", READ_B)),
                                          [("Write", '{"file_path": "/a"'), ("Read", json.loads(READ_B))]),
    "skip.section_end_without_call_end": ("files", B + CB + "call_9" + AB + WRITE + E, [("Write", json.loads(WRITE))]),
    "skip.deep_then_named": ("files", section(call("call_1", '{"file_path": ' + "[" * 3000 + "]" * 3000 + "}"),
                                              call("functions.Read:1", READ_B)), [("Read", json.loads(READ_B))]),
    "nameless.no_id": ("files", "Writing." + section(CB + AB + WRITE + CE), [("Write", json.loads(WRITE))]),
    "parallel.two_nameless": ("files", section(call("call_a", '{"file_path": "/a", "content": "x"}'),
                                               call("call_b", '{"file_path": "/a", "offset": 1}')),
                              [("Write", {"file_path": "/a", "content": "x"}), ("Read", {"file_path": "/a", "offset": 1})]),
    "parallel.mixed": ("search", section(call("functions.Glob:0", '{"pattern": "*.md"}'),
                                         call("toolu_01q", '{"path": "/srv"}'),
                                         call("3", '{"pattern": "x"}')),
                       [("Glob", {"pattern": "*.md"}), ("LS", {"path": "/srv"})]),
    # tool-call-failures.md items 3, 6, 7 (the tool-parser half), 8, 9 as they stand
    "notes.item3_no_section": ("shell", call("functionsexec5", '{"command": "ls -la"}'),
                               [("exec", {"command": "ls -la"})]),
    "notes.item6_eos_named": ("weather", B + CB + "functions.get_time:0" + AB + UTC, [("get_time", {"timezone": "UTC"})]),
    "notes.item6_eos_nameless": ("weather", B + CB + "call_7" + AB + UTC, [("get_time", {"timezone": "UTC"})]),
    "notes.item6_eos_nameless_tie": ("weather", B + CB + "call_7" + AB + '{"city": "x"}', []),
    "notes.item7_spaces": ("search", " " + B + " " + CB + " functions.LS:0 " + AB + ' {"path": "/srv"} ' + CE + " " + E,
                           [("LS", {"path": "/srv"})]),
    "notes.item8_two_calls": ("weather", section(call("functions.get_weather:0", '{"city": "LA"}'),
                                                 call("functions.get_time:1", UTC)),
                              [("get_weather", {"city": "LA"}), ("get_time", {"timezone": "UTC"})]),
    "notes.item9_newline": ("files", CB + "\nfunctions.Read:15" + AB + '{"file_path": "a.py"}',
                            [("Read", {"file_path": "a.py"})]),
    "named.ambiguous_no_separator": ("steps", section(call("functionsstep12", '{"n": 1}')), []),
    "named.step1_sanitised": ("steps", section(call("functions_step1_2", '{"n": 1}')), [("step1", {"n": 1})]),
    "named.step_sanitised": ("steps", section(call("functions_step_12", '{"n": 1}')), [("step", {"n": 1})]),
    # a named id keeps its tool whatever the arguments (the client validates them)
    "named.invalid_values": ("ref", section(call("functions.read:0", '{"path": 5}')), [("read", {"path": 5})]),
    "named.string_arguments": ("weather", section(call("functions.get_time:0", '"UTC"')), [("get_time", "UTC")]),
})
# upstream SGLang's strict inference (test_kimik2_inference.py): schema shapes, ties, broken schemas
for toolset in ("ref", "pattern", "allof", "extra_branch", "unevaluated", "alias"):
    for cid in ("call_3", "3"):
        CASES[f"upstream.{toolset}.{cid}"] = (toolset, section(call(cid, '{"path": "/x"}')), [("read", {"path": "/x"})])
for shape in SHAPES:
    for cid in ("call_3", "3"):
        CASES[f"upstream.{shape}_rev.{cid}"] = (f"{shape}_rev", section(call(cid, '{"path": "/x"}')),
                                                [("read", {"path": "/x"})])
    for order in ("tie", "tie_rev"):
        CASES[f"upstream.{shape}_{order}"] = (f"{shape}_{order}", section(call("call_3", '{"path": "/x"}')), [])
for toolset in ("ref_twin", "broken_ref", "broken_ref_rev", "remote_ref"):
    CASES[f"upstream.{toolset}"] = (toolset, section(call("call_3", '{"path": "/x"}')), [])
CASES["upstream.invalid_values"] = ("ref", section(call("call_3", '{"path": 5}')), [])
CASES["upstream.broken_then_named"] = ("broken_then_weather", section(call("call_3", '{"path": "/x"}'),
                                                                     call("functions.weather:4", '{"city": "Paris"}')),
                                       [("weather", {"city": "Paris"})])

SEEDS = (1, 2, 3)
MODES = ("non_stream", "tokens", *(f"random{s}" for s in SEEDS), "whole")


def run_corpus(python: str, scratch) -> dict:
    spec = scratch / "corpus.json"
    spec.write_text(json.dumps({"toolsets": TOOLSETS, "seeds": list(SEEDS),
                                "cases": {k: {"tools": v[0], "raw": v[1]} for k, v in CASES.items()}}))
    return run_json(python, "kimi_attribution.py", str(spec))


@pytest.fixture(scope="module")
def patched(patched_sglang, tmp_path_factory):
    return run_corpus(patched_sglang[0], tmp_path_factory.mktemp("attr-after"))


@pytest.fixture(scope="module")
def pristine(sglang_python, tmp_path_factory):
    return run_corpus(sglang_python, tmp_path_factory.mktemp("attr-before"))


def _args(value):
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def test_the_corpus_is_large_and_covers_every_rule():
    assert len(CASES) >= 60
    groups = {k.split(".", 1)[0] for k in CASES}
    assert {"named", "nameless", "foreign", "skip", "parallel", "notes", "upstream"} <= groups
    assert any(exp == [] for _, _, exp in CASES.values()) and any(len(exp) == 2 for _, _, exp in CASES.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_attribution(case, patched):
    toolset, raw, expected = CASES[case]
    names = {t["function"]["name"] for t in TOOLSETS[toolset]}
    got = patched[case]
    want = [(n, a) for n, a in expected]
    for mode in MODES:
        calls = [(n, _args(a)) for n, a in got[mode]["calls"]]
        assert all(n in names for n, _ in calls), (mode, calls)  # never a tool the request lacks
        assert calls == want, (mode, calls)  # never a wrong tool, never an extra call, none lost
        assert "<|" not in got[mode]["text"] and "functions." not in got[mode]["text"], (mode, got[mode]["text"])
        assert got[mode]["text"].strip() == got["non_stream"]["text"].strip(), mode  # streaming == non-streaming
    assert not got["mutated"], "parsing changed a tool's parameters"
    assert got["network"] == []


def test_a_dropped_call_logs_one_warning_line_with_its_id(patched):
    """Rule 2/3: the drop is visible to the operator once per call and mode (6 modes), with the id."""
    for case in ("foreign.weird", "foreign.dotted_counter", "nameless.openai.read_or_delete"):
        cid = {"foreign.weird": "weird@id", "foreign.dotted_counter": "functions.invalid.0"}.get(
            case, "call_59adf5614cfe4f4b8a71be54")
        warnings = patched[case]["warnings"]
        assert len(warnings) == len(MODES) and all(cid in w for w in warnings), warnings


def test_a_schema_that_cannot_be_checked_names_the_tool(patched):
    for case in ("upstream.broken_ref", "upstream.broken_ref_rev"):
        warnings = patched[case]["warnings"]
        assert warnings and all("'read'" in w for w in warnings[:1]), warnings


def test_pristine_0_5_23_misattributes_or_drops_where_the_rule_says(pristine):
    """The corpus catches the faults: 0.5.23's bare-counter inference picks a tool by key overlap and
    list order (a wrong tool), and it drops every sanitised or client-style id."""
    wrong, dropped = set(), set()
    for case, (toolset, raw, expected) in CASES.items():
        calls = [(n, _args(a)) for n, a in pristine[case]["non_stream"]["calls"]]
        if calls != list(expected):
            (wrong if any(c not in expected for c in calls) else dropped).add(case)
    assert "nameless.counter.read_or_delete" in wrong and "nameless.counter.read_or_delete_rev" in wrong
    assert "nameless.counter.weather_tie" in wrong and "nameless.counter.shell_tie" in wrong
    assert "named.sanitised.weather.get_weather" in dropped and "nameless.openai.write" in dropped
    assert not any(c.startswith("named.canonical.") for c in wrong | dropped)
