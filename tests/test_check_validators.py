"""Leak scanner, response validators and stream-shape validator on the public failure reports.

The raw model outputs below are copied verbatim from ../shared/notes/tool-call-failures.md
(items 1-11); each must be flagged when it reaches a client, streamed or not.
"""

from __future__ import annotations

import json

import pytest

from kimi_deploy.check import leaks
from kimi_deploy.check.results import fix_for
from kimi_deploy.check.stream import assemble, check_shape, parse_sse
from kimi_deploy.check.completion_rules import (
    Expectation,
    Message,
    ToolCall,
    check_arguments,
    check_message,
    first,
    message_from_completion,
    tool_schemas,
)

RAW_OUTPUTS = {
    "1-no-parser": '... let me check if there are any existing files in the workspace. <|tool_calls_section_begin|> '
                   '<|tool_call_begin|> functions.glob:0 <|tool_call_argument_begin|> {"pattern": "*/"} '
                   '<|tool_call_end|> <|tool_calls_section_end|>',
    "2-sanitised-id": '<|tool_calls_section_begin|><|tool_call_begin|>functions_get_weather_1'
                      '<|tool_call_argument_begin|>{"city": "Melbourne, Australia"}<|tool_call_end|>'
                      '<|tool_calls_section_end|>',
    "3-no-separators": '<|tool_call_begin|>functionsexec5<|tool_call_argument_begin|>{"command": "ls -la"}'
                       '<|tool_call_end|>',
    "5-string-arguments": '<|tool_call_argument_begin|>"{\\"todos\\": [{\\"id\\": \\"a\\"}]}"<|tool_call_end|>',
    "6-eos-before-end": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_capital_info:0'
                        '<|tool_call_argument_begin|>{"name": "Paris", "population": 2161000}',
    "7-call-in-thinking": "I'll look at the directory first. <|tool_calls_section_begin|> <|tool_call_begin|> "
                          'functions.list_directory:0 <|tool_call_argument_begin|> {"path": "/srv"} '
                          "<|tool_call_end|> <|tool_calls_section_end|>",
    "8-back-to-back": '...{"latitude": 34.05, "longitude": -118.24}<|tool_call_end|><|tool_call_begin|>'
                      'functions.get_news:1<|tool_call_argument_begin|>{"content": "Los Angeles today"}'
                      "<|tool_call_end|>...",
    "9-newline-before-id": '<|tool_call_begin|>\nfunctions.edit:15<|tool_call_argument_begin|>{"path": "a.py"}',
    "10-harmony": '<|channel|>analysis<|message|>We need to search.<|end|><|start|>assistant<|channel|>analysis '
                  'to=functions.ffgrep code<|message|>{"path":"","pattern":"TextView"}<|call|>',
    "11-stripped-leftover": 'functions.glob:0 {"pattern": "*/"}',
}

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def sse(frames: list[dict], done: bool = True) -> str:
    text = "".join(f"data: {json.dumps(f)}\n\n" for f in frames)
    return text + ("data: [DONE]\n\n" if done else "")


def content_stream(text: str, finish: str = "stop", width: int = 7) -> str:
    """What a server without a parser streams: the raw text as content deltas."""
    frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    frames += [{"choices": [{"index": 0, "delta": {"content": text[i:i + width]}, "finish_reason": None}]}
               for i in range(0, len(text), width)]
    frames.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return sse(frames)


def call_frames(calls: list[tuple[str, str, list[str]]], finish: str = "tool_calls") -> list[dict]:
    """Well-formed tool-call deltas: (id, name, argument pieces) per call."""
    frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}]
    for idx, (cid, name, pieces) in enumerate(calls):
        for k, piece in enumerate(pieces):
            tc = {"index": idx, "function": {"arguments": piece}}
            if k == 0:
                tc.update(id=cid, type="function")
                tc["function"]["name"] = name
            frames.append({"choices": [{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": None}]})
    frames.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return frames


@pytest.mark.parametrize("name", sorted(RAW_OUTPUTS))
def test_leak_scanner_flags_every_raw_output(name):
    found = leaks.scan(RAW_OUTPUTS[name])
    assert found, f"{name}: no marker found"
    assert found[0].field == "content"


@pytest.mark.parametrize("name", sorted(RAW_OUTPUTS))
def test_raw_output_in_content_is_markup_leak_streamed_and_not(name):
    raw = RAW_OUTPUTS[name]
    exp = Expectation(tools=(WEATHER,), call="one", kimi_ids=True)
    direct = check_message(Message(content=raw, reasoning=None, tool_calls=[], finish_reason="stop"), exp)
    assert first(direct).kind == "markup_leak"
    parsed = parse_sse(content_stream(raw))
    assert check_shape(parsed) == []  # the framing is fine; the content is not
    streamed = assemble(parsed.frames)
    assert streamed.content == raw
    assert first(check_message(streamed, exp)).kind == "markup_leak"


def test_call_inside_reasoning_is_flagged():
    # item 7 with a reasoning parser: the section lands in reasoning_content, no call is made
    msg = Message(content=None, reasoning=RAW_OUTPUTS["7-call-in-thinking"], tool_calls=[], finish_reason="stop")
    findings = check_message(msg, Expectation(tools=(WEATHER,), call="one"))
    assert first(findings).kind == "markup_leak"
    assert "reasoning" in first(findings).detail
    assert {"markup_leak", "tool_call_dropped"} <= {f.kind for f in findings}


def test_clean_text_has_no_leaks():
    for text in ("Hello! The weather in Paris is 18 °C.", "Use a <div> and the | operator; a:b {x}",
                 "functions are values in Python: f(0) {}", ""):
        assert leaks.scan(text) == [], text
    assert leaks.scan(None) == []


def test_deepseek_chatml_and_think_markers():
    for text in ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get", "<tool_call>{}</tool_call>",
                 "done</think>Answer", "<|im_start|>assistant", "[TOOL_CALLS][{}]"):
        assert leaks.scan(text), text


def test_silent_drop_is_tool_call_dropped():
    # item 2/4 on SGLang 0.5.23: HTTP 200, content "", finish_reason stop, no tool_calls
    data = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": None},
                         "finish_reason": "stop"}], "usage": {"completion_tokens": 31}}
    kinds = [f.kind for f in check_message(message_from_completion(data), Expectation(tools=(WEATHER,), call="one"))]
    assert kinds == ["tool_call_dropped"]
    # ... or tool_calls [] with finish_reason tool_calls
    data["choices"][0]["finish_reason"] = "tool_calls"
    kinds = {f.kind for f in check_message(message_from_completion(data), Expectation(tools=(WEATHER,), call="one"))}
    assert kinds == {"tool_call_dropped", "finish_reason_mismatch"}


def test_clean_prose_instead_of_a_call_is_model_declined():
    msg = Message(content="I'd need to look that up; it is usually mild in Paris.", reasoning=None, tool_calls=[],
                  finish_reason="stop")
    assert [f.kind for f in check_message(msg, Expectation(tools=(WEATHER,), call="one"))] == ["model_declined"]


def test_arguments_rules():
    schemas = tool_schemas([WEATHER])
    ok = ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}')
    assert check_arguments(ok, schemas) == []
    cases = {
        "unknown_tool": ToolCall("x", "get_news", "{}"),
        "invalid_arguments": ToolCall("x", "get_weather", '"{\\"todos\\": []}"'),  # item 5: a JSON string
    }
    for kind, call in cases.items():
        assert [f.kind for f in check_arguments(call, schemas)] == [kind]
    assert check_arguments(ToolCall("x", "get_weather", '{"city": '), schemas)[0].kind == "invalid_arguments"
    assert check_arguments(ToolCall("x", "get_weather", {"city": "P"}), schemas)[0].kind == "invalid_arguments"
    violation = check_arguments(ToolCall("x", "get_weather", '{"city": 3}'), schemas)
    assert violation[0].kind == "schema_violation" and "city" in violation[0].detail


def test_ids_and_finish_reason_and_choice_rules():
    calls = [ToolCall("functions_get_weather_1", "get_weather", '{"city": "A"}')]
    msg = Message(content=None, reasoning=None, tool_calls=calls, finish_reason="stop")
    kinds = {f.kind for f in check_message(msg, Expectation(tools=(WEATHER,), call="one", kimi_ids=True,
                                                            history_ids=("functions_get_weather_1",)))}
    assert kinds == {"finish_reason_mismatch", "duplicate_id", "noncanonical_id"}
    msg.finish_reason = "tool_calls"
    assert first(check_message(msg, Expectation(tools=(WEATHER,), call="none", choice="none"))).kind \
        == "tool_choice_violation"
    named = Expectation(tools=(WEATHER, {"type": "function", "function": {"name": "get_time"}}), call="some",
                        named="get_time")
    assert first(check_message(Message(None, None, [ToolCall("functions.get_weather:0", "get_weather",
                                                             '{"city": "A"}')], "tool_calls"), named)).kind \
        == "tool_choice_violation"


def test_reasoning_rules():
    on, off = Expectation(thinking=True), Expectation(thinking=False)
    assert first(check_message(Message("Yes.", None, [], "stop"), on)).kind == "missing_reasoning"
    assert first(check_message(Message("Yes.", "17 is prime", [], "stop"), off)).kind == "reasoning_leak"
    assert check_message(Message("Yes.", "17 is prime", [], "stop"), on) == []
    # vLLM's field name
    data = {"choices": [{"message": {"content": "Yes.", "reasoning": "17 is prime"}, "finish_reason": "stop"}]}
    assert message_from_completion(data).reasoning == "17 is prime"


def test_stream_good_calls_pass_and_match_nonstream():
    frames = call_frames([("functions.get_weather:0", "get_weather", ['{"city', '": "Pa', 'ris"}']),
                          ("functions.get_weather:1", "get_weather", ['{"city": "Tokyo"}'])])
    parsed = parse_sse(sse(frames))
    nonstream = Message(None, None, [ToolCall("functions.get_weather:0", "get_weather", '{"city":"Paris"}'),
                                     ToolCall("functions.get_weather:1", "get_weather", '{"city": "Tokyo"}')],
                        "tool_calls")
    assert check_shape(parsed, nonstream) == []
    msg = assemble(parsed.frames)
    assert [c.arguments for c in msg.tool_calls] == ['{"city": "Paris"}', '{"city": "Tokyo"}']
    assert check_message(msg, Expectation(tools=(WEATHER,), call="two", kimi_ids=True)) == []


def test_stream_error_frame_mlx_style():
    # item 2 on an MLX-based server: an SSE {"error": {"message": "<raw markup>"}} frame
    raw = sse([{"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
               {"error": {"message": RAW_OUTPUTS["2-sanitised-id"]}}], done=False)
    kinds = [f.kind for f in check_shape(parse_sse(raw))]
    assert kinds[0] == "error_frame" and "stream_shape" in kinds  # and no [DONE]


@pytest.mark.parametrize("mutation, needle", [
    ("no_done", "[DONE]"),
    ("two_finish", "finish_reason"),
    ("index_gap", "dense"),
    ("id_twice", "id sent again"),
    ("name_twice", "name sent again"),
    ("args_differ", "differ"),
    ("index_string", "not an integer"),
])
def test_stream_shape_violations(mutation, needle):
    frames = call_frames([("functions.get_weather:0", "get_weather", ['{"city": ', '"Paris"}']),
                          ("functions.get_weather:1", "get_weather", ['{"city": "Tokyo"}'])])
    done = True
    nonstream = Message(None, None, [ToolCall("a", "get_weather", '{"city": "Paris"}'),
                                     ToolCall("b", "get_weather", '{"city": "Tokyo"}')], "tool_calls")
    tc = lambda n: frames[n]["choices"][0]["delta"]["tool_calls"][0]  # noqa: E731
    if mutation == "no_done":
        done = False
    elif mutation == "two_finish":
        frames.insert(-1, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    elif mutation == "index_gap":
        tc(3)["index"] = 2
    elif mutation == "id_twice":
        tc(2)["id"] = "functions.get_weather:0"
    elif mutation == "name_twice":
        tc(2)["function"]["name"] = "get_weather"
    elif mutation == "args_differ":
        nonstream.tool_calls[0].arguments = '{"city": "Lyon"}'
    elif mutation == "index_string":
        tc(3)["index"] = "1"
    findings = check_shape(parse_sse(sse(frames, done=done)), nonstream)
    assert findings and all(f.kind == "stream_shape" for f in findings)
    assert any(needle in f.detail for f in findings), findings


def test_merged_back_to_back_calls_stream_shape():
    # item 8 merged into one garbled call: both ids and names arrive on index 0
    frames = call_frames([("functions.get_weather:0", "get_weather", ['{"latitude": 34.05}'])])
    frames.insert(-1, {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "functions.get_news:1", "function": {"name": "get_news", "arguments": '{"content"'}}]},
        "finish_reason": None}]})
    kinds = {f.kind for f in check_shape(parse_sse(sse(frames)))}
    assert kinds == {"stream_shape"}
    msg = assemble(parse_sse(sse(frames)).frames)
    assert first(check_message(msg, Expectation(tools=(WEATHER,), call="one"))).kind in (
        "invalid_arguments", "schema_violation")


def test_parse_sse_non_json_data():
    parsed = parse_sse("data: {not json}\n\ndata: [DONE]\n\n")
    assert parsed.bad == ["{not json}"] and parsed.done
    assert [f.kind for f in check_shape(parsed)] == ["stream_shape"]


# --- issue #19: OpenAI's named tool_choice finish_reason, empty answers ------------------------------------------

NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("finish,named,kinds", [
    ("stop", "get_weather", set()),                            # OpenAI (and vLLM) end a forced named call with stop
    ("tool_calls", "get_weather", set()),                      # SGLang ends it with tool_calls
    ("stop", None, {"finish_reason_mismatch"}),                # auto/required: stop with calls stays a mismatch
    ("length", "get_weather", {"finish_reason_mismatch"}),     # a cut call is not a finished one
])
def test_a_named_choice_may_end_with_stop(finish, named, kinds):
    msg = Message(None, None, [ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}')], finish)
    exp = Expectation(tools=(WEATHER,), call="some", choice=NAMED if named else "required", named=named)
    assert {f.kind for f in check_message(msg, exp)} == kinds


@pytest.mark.parametrize("content,finish,call,kinds", [
    (None, "stop", "none", {"empty_answer"}),      # vLLM's tool_choice none without --exclude-tools-when-...
    ("  ", "stop", "none", {"empty_answer"}),
    (None, "stop", "any", {"empty_answer"}),
    ("", "stop", "none", {"empty_answer"}),        # "" is no text either
    (" \n\t\u3000", "stop", "none", {"empty_answer"}),  # whitespace only (ideographic space included)
    (None, "length", "none", {"model_declined"}),  # cut during reasoning: the budget, not the server, but no pass
    ("", "length", "any", {"model_declined"}),
    ("Hello.", "stop", "none", set()),
    (None, "stop", "one", {"tool_call_dropped"}),  # a due call keeps its own kind
])
def test_an_answer_with_neither_text_nor_call_is_empty_answer(content, finish, call, kinds):
    msg = Message(content, "some reasoning", [], finish, completion_tokens=40)
    exp = Expectation(tools=(WEATHER,), call=call, choice="none" if call == "none" else "auto")
    found = check_message(msg, exp)
    assert {f.kind for f in found} == kinds
    if kinds == {"empty_answer"} and call == "none":
        assert "tool_choice 'none'" in found[0].detail and "40 completion tokens" in found[0].detail
    if kinds == {"model_declined"}:  # a warn with the max_tokens fix, not a pass (every message here has reasoning)
        assert "until max_tokens" in found[0].detail and "no content" in found[0].detail
        assert "before any call or text" in fix_for(found[0].kind, detail=found[0].detail)


def test_reasoning_alone_is_an_empty_answer():
    """Reasoning is not the answer: a client shows content, so thinking on with no content is empty."""
    msg = Message(None, "17 has no divisor but 1 and itself", [], "stop", completion_tokens=12)
    assert {f.kind for f in check_message(msg, Expectation(call="none", thinking=True))} == {"empty_answer"}


@pytest.mark.parametrize("call_id", ["functions.get_weather:0\n", "functions.get_weather:0 ", " functions.a:0",
                                     "functions.get_weather:", "functions.:0", "functions.get weather:0"])
def test_an_id_is_canonical_only_as_a_whole(call_id):
    msg = Message(None, None, [ToolCall(call_id, "get_weather", '{"city": "A"}')], "tool_calls")
    kinds = {f.kind for f in check_message(msg, Expectation(tools=(WEATHER,), call="one", kimi_ids=True))}
    assert kinds == {"noncanonical_id"}


# --- each family's id form (issue 29): SGLang 0.5.23's kimi_k3 path mints NAME:N, kimi_k2 functions.NAME:N ---

@pytest.mark.parametrize(("parser", "call_id", "kinds"), [
    ("kimi_k3", "get_weather:0", set()),             # K3's own form is not flagged
    ("kimi_k3", "get_weather:12", set()),
    ("kimi_k3", "functions.get_weather:0", {"noncanonical_id"}),  # K2's form is not K3's
    ("kimi_k3", "call_0123456789abcdef01234567", {"noncanonical_id"}),
    ("kimi_k2", "functions.get_weather:0", set()),
    ("kimi_k2", "get_weather:0", {"noncanonical_id"}),  # and K3's is not K2's
    ("qwen25", "call_0123456789abcdef01234567", set()),  # parsers without a Kimi rule: no id rule
])
def test_ids_are_judged_by_the_servers_parser(parser, call_id, kinds):
    msg = Message(None, None, [ToolCall(call_id, "get_weather", '{"city": "A"}')], "tool_calls")
    findings = check_message(msg, Expectation(tools=(WEATHER,), call="one", id_parser=parser))
    assert {f.kind for f in findings} == kinds
    if kinds:
        form = "NAME:N" if parser == "kimi_k3" else "functions.NAME:N"
        assert findings[0].detail == f"{parser} server returned id {call_id!r}, not {form}"


def test_the_run_takes_the_id_rule_from_the_tool_call_parser():
    import copy

    from kimi_deploy.check.context import Context
    from kimi_deploy.catalog.presets import get_preset
    from kimi_deploy.profile import parse_profile

    def ctx(parser):
        data = copy.deepcopy(get_preset("kimi-k26-rtx-pro-6000-x8").data)
        data["sglang"]["tool_call_parser"] = parser
        return Context(clients=None, profile=parse_profile(data), model=None, expected_model=None, repeat=1)

    assert ctx("kimi_k3").id_parser == "kimi_k3" and ctx("kimi_k2").id_parser == "kimi_k2"
    assert ctx("qwen25").id_parser is None


@pytest.mark.sglang
def test_the_id_forms_are_the_ones_sglangs_serving_layer_mints(sglang_python):
    """SGLang 0.5.23's own OpenAIServingChat._process_tool_call_id, per parser: what it mints passes the rule
    of its family and fails the other family's."""
    import json
    import subprocess

    from kimi_deploy.tool_ids import ID_FORMATS

    code = ("import json, types\n"
            "from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat\n"
            "from sglang.srt.function_call.core_types import ToolCallItem\n"
            "item = ToolCallItem(tool_index=1, name='get_weather', parameters='{}')\n"
            "print(json.dumps({p: OpenAIServingChat._process_tool_call_id(types.SimpleNamespace(tool_call_parser=p),"
            " item, 2) for p in ('kimi_k2', 'kimi_k3')}))\n")
    done = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=600,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    minted = json.loads(done.stdout.strip().splitlines()[-1])
    assert minted == {"kimi_k2": "functions.get_weather:3", "kimi_k3": "get_weather:3"}
    assert ID_FORMATS["kimi_k2"].matches(minted["kimi_k2"]) and not ID_FORMATS["kimi_k2"].matches(minted["kimi_k3"])
    assert ID_FORMATS["kimi_k3"].matches(minted["kimi_k3"]) and not ID_FORMATS["kimi_k3"].matches(minted["kimi_k2"])
