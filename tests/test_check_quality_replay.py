"""Issue 27 against real serving stacks: SGLang 0.5.23's serving layer (tests/replay/server.py) and vLLM 0.33.0's
(tests/vllm_replay/server.py), each with the scripted Kimi model breaking arguments at a known, seeded rate
(``--invalid-args-rate``/``--seed``: kimi_model._maybe_break). The tier's interval contains the true rate, the
counts match the broken answers one for one, and the schema corpus raises no false alarm on SGLang's own parsers
and grammar path when the model answers validly."""

from __future__ import annotations

import json
import random

import pytest

from conftest import SGLANG_API_KEY, VLLM_API_KEY
from kimi_deploy.check import CheckOptions, run_checks
from kimi_deploy.check.quality import corpus
from replay_process import VLLM_SERVER, Replay

RATE, SEED, N = 0.15, 7, 120
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": SCHEMA}}
TICKET = {"type": "function", "function": {"name": "create_ticket", "description": "Open a ticket.", "parameters": {
    "type": "object", "properties": {"title": {"type": "string"}, "severity": {"enum": ["low", "high"]}},
    "required": ["title", "severity"]}}}


def _dataset(tmp_path):
    bodies = [
        {"messages": [{"role": "user", "content": "What is the weather in Paris, France?"}], "tools": [WEATHER]},
        {"messages": [{"role": "user", "content": "What is the weather in Lima, Peru?"}], "tools": [WEATHER, TICKET],
         "stream": True},
        {"messages": [{"role": "user", "content": "Open a ticket for the outage."}], "tools": [TICKET],
         "tool_choice": "required"},
        {"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Oslo?"}],
         "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "stream": True},
    ]
    path = tmp_path / "replay.jsonl"
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    return path


def _broken(n: int) -> int:
    """How many of n answers with a call the scripted model breaks (kimi_model._maybe_break's rule)."""
    return sum(random.Random(f"{SEED}:{i}").random() < RATE for i in range(n))


def _check(url: str, key: str | None, tmp_path):
    report = run_checks(CheckOptions(base_url=url, api_key=key, only=["quality.accuracy"], sample=N,
                                     dataset=_dataset(tmp_path), quality_concurrency=4, deadline=600, timeout=60))
    return report.results[0], report.quality["accuracy"]


def _assert_known_rate(row, acc):
    assert acc["sent"] == acc["answered"] == N, acc
    assert acc["tool_call_answers"] == N, acc["finish_reasons"]
    assert acc["valid"] == N - _broken(N), acc
    assert acc["error_classes"] == {"schema_violation": _broken(N)}
    sa = acc["schema_accuracy"]
    assert sa["lower"] <= 1 - RATE <= sa["upper"], sa
    assert row.status == "fail" and row.kind == "schema_accuracy_low"  # 85 % against 95.52 %: beyond noise


@pytest.mark.sglang
def test_sglang_replay_with_a_known_invalid_rate(sglang_python, tmp_path):
    server = Replay(sglang_python, ["--api-key", SGLANG_API_KEY, "--invalid-args-rate", str(RATE), "--seed",
                                    str(SEED)], tmp_path / "replay.log")
    try:
        row, acc = _check(server.url(), SGLANG_API_KEY, tmp_path)
    finally:
        server.stop()
    _assert_known_rate(row, acc)


@pytest.mark.vllm
def test_vllm_replay_with_a_known_invalid_rate(vllm_python, tmp_path):
    server = Replay(vllm_python, ["--api-key", VLLM_API_KEY, "--invalid-args-rate", str(RATE), "--seed", str(SEED)],
                    tmp_path / "vllm.log", VLLM_SERVER)
    try:
        row, acc = _check(server.url(), VLLM_API_KEY, tmp_path)
    finally:
        server.stop()
    _assert_known_rate(row, acc)


@pytest.mark.sglang
def test_schema_corpus_and_thinking_switch_have_no_false_alarm_on_sglangs_serving_layer(replay):
    """SGLang's kimi_k2 parsers, its json_schema constraint for forced calls, its reasoning parser honouring
    chat_template_kwargs.thinking; the sampling checks skip (no model files here) and say why."""
    report = run_checks(CheckOptions(base_url=replay["unpatched"].url(), api_key=SGLANG_API_KEY,
                                     only=["quality.schema.*", "quality.preflight.*"], deadline=600, timeout=60))
    rows = {r.id: r for r in report.results}
    bad = {i: (r.kind, r.detail) for i, r in rows.items() if r.status not in ("pass", "skip")}
    assert not bad
    assert sum(i.startswith("quality.schema.") for i in rows) == 4 * len(corpus.SHAPES)
    assert rows["quality.preflight.thinking_on"].status == rows["quality.preflight.thinking_off"].status == "pass"
    assert "--model-dir" in rows["quality.preflight.sampling.thinking"].detail


@pytest.mark.vllm
def test_schema_corpus_and_thinking_switch_have_no_false_alarm_on_vllms_serving_layer(vllm_replay):
    """vLLM 0.33.0's kimi_k2 parsers and structural tags for forced calls (a named choice ends with stop): every
    shape passes but one, which is vLLM's and not a false alarm: non-streamed, it turns the model's ``"version": 2``
    (schema ``{"const": 2}``, no ``type``) into the string ``"2"``, while the stream keeps the number, so the
    non-streamed answers break the schema and the streamed ones differ from them (found by this tier)."""
    report = run_checks(CheckOptions(base_url=vllm_replay["parsers"].url(), api_key=VLLM_API_KEY,
                                     only=["quality.schema.*", "quality.preflight.*"], deadline=900, timeout=60))
    rows = {r.id: r for r in report.results}
    bad = {i: r.kind for i, r in rows.items() if r.status not in ("pass", "skip")}
    assert bad == {f"quality.schema.enum_const.{c}.{m}": kind for c in ("required", "named")
                   for m, kind in (("nonstream", "schema_violation"), ("stream", "stream_shape"))}
    assert rows["quality.schema.enum_const.named.nonstream"].detail.startswith("schema feature const (2)")
    assert '"version": "2"' in rows["quality.schema.enum_const.named.nonstream"].evidence
    assert sum(i.startswith("quality.schema.") for i in rows) == 4 * len(corpus.SHAPES)
    assert "does not report" in rows["quality.preflight.sampling.thinking"].detail  # vLLM says no defaults
