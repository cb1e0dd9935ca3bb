"""Leak scanner: model-family markup that must never reach ``content`` or reasoning.

A marker in the text a client sees means a parser is missing, misconfigured or failed
(the Kimi K2 tool-call guide, MoonshotAI/Kimi-K2's tool_call_guidance.md, and public sgl-project/sglang and
vllm-project/vllm issue reports). Families and their markers:

- Kimi K2.x (moonshotai tokenizer): ``<|tool_calls_section_begin|>``, ``<|tool_call_begin|>``,
  ``<|tool_call_argument_begin|>``, ``<|tool_call_end|>``, ``<|tool_calls_section_end|>``,
  ``<|im_end|>``, ``<|im_middle|>`` ...
- harmony (GPT-OSS): ``<|channel|>``, ``<|message|>``, ``<|call|>``, ``<|start|>``, ``<|end|>``,
  a recipient ``to=functions.NAME``;
- ChatML / Hermes / Qwen: ``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``, ``</tool_call>``;
- thinking: ``<think>``, ``</think>``;
- DeepSeek V3/R1 (full-width bars and ``▁``): ``<｜tool▁calls▁begin｜>``, ``<｜tool▁sep｜>``,
  ``<｜end▁of▁sentence｜>`` ...;
- Llama 3 / Mistral: ``<|eot_id|>``, ``<|python_tag|>``, ``[TOOL_CALLS]``;
- leftovers of a stripped Kimi call: ``functions.NAME:N {`` (special tokens removed, id and
  arguments left behind) and separator-less ids such as ``functionsexec5<``.
"""

from __future__ import annotations

import dataclasses
import re

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("special token <|...|>", re.compile(r"<\|[A-Za-z_][A-Za-z0-9_./:-]{0,60}\|>")),
    ("DeepSeek marker <｜...｜>", re.compile(r"<｜[^｜\n]{1,60}｜>")),
    ("think tag", re.compile(r"</?think>")),
    ("tool_call tag", re.compile(r"</?tool_call>")),
    ("function tag", re.compile(r"<function=[^>\n]{1,80}>|</function>")),
    ("[TOOL_CALLS]", re.compile(r"\[TOOL_CALLS\]")),
    ("harmony recipient", re.compile(r"\bto=functions\.[\w.-]+")),
    ("Kimi call leftover", re.compile(r"\bfunctions[._][\w.-]+[:_]\d+\s*\{")),
)


@dataclasses.dataclass(frozen=True)
class Leak:
    """One marker found: ``family`` (human label), the ``marker`` text, ``field`` and ``offset``."""

    family: str
    marker: str
    field: str
    offset: int

    def excerpt(self, text: str, width: int = 120) -> str:
        """``width`` characters of ``text`` around the marker."""
        start = max(0, self.offset - width // 3)
        return text[start:start + width]


def scan(text: str | None, field: str = "content") -> list[Leak]:
    """Every marker in ``text`` (``None``/empty: none), sorted by offset; ``field`` labels where."""
    if not text:
        return []
    found: dict[int, Leak] = {}
    for family, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            found.setdefault(m.start(), Leak(family, m.group(0), field, m.start()))
    return [found[k] for k in sorted(found)]


def scan_message(content: str | None, reasoning: str | None) -> list[Leak]:
    """Markers in a message's ``content`` and its reasoning (``reasoning_content``/``reasoning``)."""
    return scan(content, "content") + scan(reasoning, "reasoning")
