"""Kimi K2.x tool-call id canonicalisation: the one implementation of the rule the kit applies to a history.

The Kimi K2 chat template copies every history tool-call id into the prompt and the model imitates that
style in its next call (../shared/notes/tool-call-failures.md items 2 and 4): ids a client rewrote
(``functions_get_weather_0``, ``call_<hex>``, ...) make later calls unparseable (SGLang 0.5.23 and vLLM
0.33.0's ``kimi_k2`` parsers take only ``NAME:N`` shapes). :func:`kimi_k2_canonical_history_ids` gives
every history call the id SGLang itself mints, ``functions.NAME:<position among the history's calls>``,
and points each tool result's ``tool_call_id`` at its call.

Two users, one implementation:

- the SGLang patch ``kimi-k2-canonical-history-ids`` (patches/0.5.23/) carries this function's source
  verbatim inside SGLang's ``serving_chat.py`` (SGLang's interpreter cannot import the kit);
  tests/test_litellm_hook.py fails when the two differ by one byte;
- :mod:`kimi_deploy.litellm_hook` calls it in a LiteLLM proxy in front of servers the kit cannot patch
  (vLLM, Exo, hosted APIs).

Standard library only; never raises on well-formed OpenAI messages (``list[dict]``); messages it does not
change are returned as the same objects, changed ones as shallow copies (the input is not mutated).
"""

from __future__ import annotations

from typing import Any


def kimi_k2_canonical_history_ids(
    messages: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    counter = 0
    last_call: dict[Any, str] = {}  # id -> canonical id of its latest call
    turn: dict[Any, list[str]] = {}  # id -> canonical ids of this turn's calls
    result = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            message = dict(message, tool_calls=list(message["tool_calls"]))
            turn = {}
            for i, call in enumerate(message["tool_calls"]):
                name = (call.get("function") or {}).get("name")
                if name:
                    new_id = f"functions.{name}:{counter}"
                    key = call.get("id") or ""
                    turn.setdefault(key, []).append(new_id)
                    last_call[key] = new_id
                    message["tool_calls"][i] = dict(call, id=new_id)
                counter += 1
        elif role == "tool":
            key = message.get("tool_call_id") or ""
            if turn.get(key):
                message = dict(message, tool_call_id=turn[key].pop(0))
            elif key in last_call:
                message = dict(message, tool_call_id=last_call[key])
        elif role == "assistant":
            turn = {}
        result.append(message)
    return result
