"""What the 0.5.23 series changes, observed through SGLang's own code in its own interpreter.

Each test runs one script (tests/patch_scripts/) twice: in the pristine SGLang test environment
and in a throwaway copy patched by `kimi-deploy patch apply --with <the SM120 patches>`. The raw
model outputs are those of shared/notes/tool-call-failures.md (items 2, 3, 4, 8, 9).
"""

from __future__ import annotations

import json

import pytest

from patch_helpers import run_json

pytestmark = pytest.mark.sglang

B, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
TOOLS = [["get_weather", ["city"]], ["get", ["url"]], ["exec", ["command"]], ["get_news", ["content"]],
         ["get_location", {"latitude": "number", "longitude": "number"}], ["edit", ["path"]], ["read_file_v2", ["file_path"]]]
LA = '{"latitude": 34.05, "longitude": -118.24}'


def call(cid: str, args: str) -> str:
    return CB + cid + AB + args + CE


def section(*calls: str) -> str:
    return B + "".join(calls) + E


ALL = frozenset({"non_stream", "stream", "stream_merged"})
NONE = frozenset()
MEL = '{"city": "Melbourne, Australia"}'
LS = '{"command": "ls -la"}'
NEWS = '{"content": "Los Angeles today"}'
EDIT = '{"path": "a.py"}'
RF = '{"file_path": "b"}'

#: case -> (raw model output, expected [(name, arguments)], modes in which pristine 0.5.23 drops the
#: call or returns it as text: ALL, NONE or a set of "non_stream", "stream", "stream_merged")
CASES = {
    # item 2: sanitised id imitated from the history
    "item2": (section(call("functions_get_weather_1", MEL)), [("get_weather", MEL)], ALL),
    # item 3: separators missing, as reported (no section marker) and inside a section
    "item3": (call("functionsexec5", LS), [("exec", LS)], ALL),
    "item3_section": (section(call("functionsexec5", LS)), [("exec", LS)], ALL),
    # item 4: client-style ids copied by the model; the name comes from the argument keys
    "item4_call": (section(call("call00003", LS)), [("exec", LS)], ALL),
    "item4_call_": (section(call("call_59adf5614cfe4f4b8a71be54", '{"city": "Oslo"}')),
                    [("get_weather", '{"city": "Oslo"}')], ALL),
    "item4_toolu": (section(call("toolu_01A09q90qw90lq917835lq9", RF)), [("read_file_v2", RF)], ALL),
    "item4_uuid": (section(call("0b5e7a4e-8a7f-4c9b-9d35-2f1c3c8f2e61", LA)), [("get_location", LA)], ALL),
    "item4_counter": (section(call("3", '{"url": "https://x"}')), [("get", '{"url": "https://x"}')], NONE),
    # item 8: two calls back to back, canonical ids (0.5.23 already parses these) and sanitised ids
    "item8": (section(call("functions.get_location:0", LA), call("functions.get_news:1", NEWS)),
              [("get_location", LA), ("get_news", NEWS)], NONE),
    "item8_sanitised": (section(call("functions_get_location_0", LA), call("functions_get_news_1", NEWS)),
                        [("get_location", LA), ("get_news", NEWS)], ALL),
    # item 9: newline before the id, as reported (no section marker, no end marker) and in a full section
    "item9": (CB + "\nfunctions.edit:15" + AB + EDIT, [("edit", EDIT)], frozenset({"non_stream"})),
    "item9_section": (section(call("\nfunctions_edit_15", EDIT)), [("edit", EDIT)], ALL),
    # names with underscores and a shared prefix: longest tool name wins, never split inside one
    "prefix_get": (section(call("functions_get_2", '{"url": "u"}')), [("get", '{"url": "u"}')], ALL),
    "prefix_get_weather": (section(call("get_weather_2", '{"city": "c"}')), [("get_weather", '{"city": "c"}')], ALL),
    "underscore_v2": (section(call("functions_read_file_v2_7", RF)), [("read_file_v2", RF)], ALL),
    "colon_no_prefix": (section(call("read_file_v2:7", RF)), [("read_file_v2", RF)], NONE),
}


@pytest.fixture(scope="module")
def patched_python(patched_sglang):
    """The session's patched copy (tests/conftest.py: defaults + both sm120 opt-ins)."""
    return patched_sglang[0]


MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
                "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 2048}


def observe(python: str, scratch) -> dict:
    """Every observation script in one run of ``python`` (SGLang's imports cost seconds)."""
    (scratch / "model").mkdir(parents=True)
    (scratch / "model" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    spec = {"tools": TOOLS, "cases": {k: v[0] for k, v in CASES.items()}}
    return run_json(python, "observe.py", json.dumps({
        "kimi_parser.py": [json.dumps(spec)],
        "serving_history.py": [str(scratch / "serving")],
        "gates.py": [str(scratch / "model")],
    }))


@pytest.fixture(scope="module")
def before(sglang_python, tmp_path_factory):
    return observe(sglang_python, tmp_path_factory.mktemp("before"))


@pytest.fixture(scope="module")
def after(patched_python, tmp_path_factory):
    return observe(patched_python, tmp_path_factory.mktemp("after"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_tool_call_ids(case, before, after):
    before, after = before["kimi_parser.py"], after["kimi_parser.py"]
    raw, expected, broken_before = CASES[case]
    for mode in ("non_stream", "stream", "stream_merged"):
        got = after[case][mode]
        assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == \
            [(n, json.loads(a)) for n, a in expected], (mode, got)
        assert "<|" not in got["text"], (mode, got)
        old = before[case][mode]
        old_ok = [(c["name"], c["arguments"] and json.loads(c["arguments"])) for c in old["calls"]] == \
            [(n, json.loads(a)) for n, a in expected]
        # 0.5.23 drops the call or returns the markup as text exactly where the notes say
        assert old_ok == (mode not in broken_before), (mode, old)


def test_history_ids_through_openai_serving_chat(before, after):
    """The rewritten history reaches the chat template: asserted on the prompt the tokenizer manager gets."""
    old, new = before["serving_history.py"], after["serving_history.py"]
    assert "<|tool_call_begin|>functions_get_weather_0<|tool_call_argument_begin|>" in old["prompt"]
    assert "## Return of functions_get_weather_0" in old["prompt"]
    assert old["tool_calls"] == [] and old["finish_reason"] == "stop"  # SGLang's silent drop

    assert "functions_get_weather_0" not in new["prompt"]
    assert "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" in new["prompt"]
    assert "## Return of functions.get_weather:0\n18C" in new["prompt"]
    assert new["finish_reason"] == "tool_calls"
    [tc] = new["tool_calls"]
    assert tc["id"] == "functions.get_weather:1"  # canonical, numbered after the history's one call
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"city": "Melbourne, Australia"}


def test_history_ids_of_one_parallel_turn_are_matched_by_position(before, after):
    """Rule 5: a client that sends the same id (or none) for both calls of one turn gets each tool
    result labelled with its own call, in order (0.5.23 and the first patch labelled both the last)."""
    for label in ("same_id", "empty_id"):
        new = after["serving_history.py"][label]
        assert "## Return of functions.get_weather:0\n18C" in new, new
        assert "## Return of functions.get_weather:1\n25C" in new, new
        first, second = (new.index(f"<|tool_call_begin|>functions.get_weather:{k}<|tool_call_argument_begin|>")
                         for k in (0, 1))
        assert first < new.index("Sydney", first) < second < new.index("Perth", second)
        old = before["serving_history.py"][label]
        assert "functions.get_weather:" not in old  # pristine 0.5.23 copies whatever the client sent


def test_redaction_and_sm120_gates(before, after):
    old, new = before["gates.py"], after["gates.py"]
    # redact-api-key: 0.5.23 leaks both keys in the startup line and /server_info
    assert old["log"] == old["server_info"] == ["admin_api_key", "api_key"]
    assert new["log"] == new["server_info"] == [] and new["server_info_api_key"] == "<redacted>"
    # sm120-flashinfer-allreduce-fusion
    assert all(v.startswith("error:") for v in old["fusion"].values())
    assert new["fusion"]["auto"] == new["fusion"]["trtllm"] == "ok:trtllm"
    assert new["fusion"]["mnnvl"].startswith("error:") and new["fusion"]["cutedsl"].startswith("error:")
    assert new["fusion"]["auto/multi-node"].startswith("error:")
    # the gate is exact compute capability 12.0 (SGLang's is_sm120()): a 12.1 device (GB10) stays refused
    assert all(v.startswith("error:") for v in new["fusion_sm121"].values())
    assert new["fusion_sm121"]["auto"] == old["fusion"]["auto"]
    assert (old["fused_norm_site"], new["fused_norm_site"], new["fused_norm_site_exact"]) == (False, True, True)
    # sm120-torch-symm-mem (experimental): a capability-12 row capped at decode sizes, not SM100's copy
    assert (old["symm_mem_rows"], new["symm_mem_rows"]) == ([9, 10], [9, 10, 12])
    assert new["symm_mem_row_12"] == {w: 4 * 1024 * 1024 for w in ("2", "4", "6", "8")}


def test_the_series_needed_by_symptoms_are_what_0_5_23_does(before, after):
    """The manifest's feature -> patch mapping (read by `doctor`) quotes SGLang 0.5.23's own behaviour."""
    from kimi_deploy.patching import find_series

    gates = {g.setting: (p.id, g) for p in find_series("0.5.23").patch for g in p.needed_by}
    _, fusion = gates["flashinfer_allreduce_fusion_backend"]
    raised = before["gates.py"]["fusion"]["auto"].removeprefix("error:")
    assert f"raises ValueError '{raised}'" in fusion.symptom and fusion.without == "fails"
    assert after["gates.py"]["fusion"]["auto"] == "ok:trtllm"
    _, symm = gates["enable_torch_symm_mem"]
    assert 12 not in before["gates.py"]["symm_mem_rows"] and symm.without == "disabled"
    assert 12 in after["gates.py"]["symm_mem_rows"] and symm.compute_capability_major == [12]
