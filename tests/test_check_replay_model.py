"""The replay server's scripted Kimi model (tests/replay/kimi_model.py): the habits the check relies on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "replay"))
import kimi_model  # noqa: E402

TOOLS = ('<|im_system|>tool_declare<|im_middle|>[{"type": "function", "function": {"name": "get_weather", '
         '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]<|im_end|>')


def prompt(user: str, history_id: str | None = None, thinking: bool = True) -> str:
    text = TOOLS + "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
    if history_id is not None:
        text += (f"<|im_assistant|>assistant<|im_middle|><think></think><|tool_calls_section_begin|>"
                 f'<|tool_call_begin|>{history_id}<|tool_call_argument_begin|>{{"city": "Paris"}}<|tool_call_end|>'
                 f"<|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>## Return of {history_id}\n"
                 "18 C<|im_end|>")
    text += f"<|im_user|>user<|im_middle|>{user}<|im_end|><|im_assistant|>assistant<|im_middle|>"
    return text + ("<think>" if thinking else "<think></think>")


@pytest.mark.parametrize("history_id, expected", [
    (None, "functions.get_weather:0"),
    ("functions.get_weather:0", "functions.get_weather:1"),
    ("functions_get_weather_0", "functions_get_weather_1"),
    ("0", "1"),
    ("call00000", "call00001"),
])
def test_imitates_history_id_style(history_id, expected):
    out = kimi_model.respond(prompt("And the weather in Rome?", history_id))
    assert f"<|tool_call_begin|>{expected}<|tool_call_argument_begin|>" in out


def test_foreign_styles_and_thinking():
    assert "<|tool_call_begin|>call_" in kimi_model.respond(prompt("And the weather in Rome?", "call_abc"))
    assert "<|tool_call_begin|>toolu_01" in kimi_model.respond(prompt("And the weather in Rome?", "toolu_01x"))
    with_thinking = kimi_model.respond(prompt("And the weather in Rome?"))
    assert "</think><|tool_calls_section_begin|>" in with_thinking and not with_thinking.startswith("<think>")
    assert "</think>" not in kimi_model.respond(prompt("And the weather in Rome?", thinking=False))


def test_parallel_calls_and_several_markers_in_one_chunk():
    out = kimi_model.respond(prompt("Get the weather in Paris and in Tokyo: one call per city."))
    assert out.count("<|tool_call_begin|>") == 2
    chunks = kimi_model.chunks(kimi_model.pieces(out))
    assert "".join(p for c in chunks for p in c) == out
    assert max(sum(p in kimi_model.MARKERS for p in c) for c in chunks) >= 2
