"""Kimi tool-call ids: each family's id form (:data:`ID_FORMATS`), and K2.x's canonicalisation of a history.

The form depends on the server's tool-call parser (SGLang 0.5.23 ``serving_chat._process_tool_call_id``):
``kimi_k2`` mints ``functions.NAME:N``, ``kimi_k3`` (Kimi K3) mints ``NAME:N`` without the ``functions.``
prefix, every other parser ``call_<24 hex>``. N counts the conversation's calls. The check
(``noncanonical_id``) and the LiteLLM hook read :func:`id_format` by parser name: K3's ids are neither
flagged nor rewritten to K2's form.

The canonicalisation below is K2's only (:attr:`IdFormat.canonicalise`).

The Kimi K2 chat template copies every history tool-call id into the prompt and the model imitates that
style in its next call (MoonshotAI/Kimi-K2's tool_call_guidance.md; the model's chat_template.jinja): ids a client rewrote
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

import dataclasses
import re
from typing import Any

_SERVING_CHAT = "sglang 0.5.23 srt/entrypoints/openai/serving_chat.py _process_tool_call_id"


@dataclasses.dataclass(frozen=True)
class IdFormat:
    """The ids a tool-call parser's server mints: ``pattern`` (fullmatch), ``form`` as people write it,
    ``canonicalise``: :func:`kimi_k2_canonical_history_ids` applies to its histories (K2 only), ``source``."""

    parser: str
    pattern: re.Pattern[str]
    form: str
    canonicalise: bool
    source: str

    def matches(self, call_id: str) -> bool:
        """Whether ``call_id`` is in this form, as a whole (no surrounding space or newline)."""
        return self.pattern.fullmatch(call_id) is not None


#: Tool-call parser name -> the id form its server mints. NAME: OpenAI function names are
#: ``[A-Za-z0-9_-]{1,64}`` (K2's pattern also takes dots, as SGLang's kimi_k2 detector does), so a K2 id
#: (``functions.NAME:N``) is never taken for a K3 one.
ID_FORMATS: dict[str, IdFormat] = {
    "kimi_k2": IdFormat("kimi_k2", re.compile(r"functions\.[A-Za-z0-9_.-]+:[0-9]+"), "functions.NAME:N", True,
                        _SERVING_CHAT + ": f'functions.{name}:{history count + index}'"),
    "kimi_k3": IdFormat("kimi_k3", re.compile(r"[A-Za-z0-9_-]+:[0-9]+"), "NAME:N", False,
                        _SERVING_CHAT + ": f'{name}:{history count + index}' when tool_call_parser == 'kimi_k3'"),
}


def id_format(parser: str | None) -> IdFormat | None:
    """The id form of tool-call parser ``parser`` (``None``: no Kimi rule, ids are the server's own)."""
    return ID_FORMATS.get(parser or "")


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
