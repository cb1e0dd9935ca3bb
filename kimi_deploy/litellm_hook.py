"""A LiteLLM proxy hook that keeps Kimi K2.x tool-call ids canonical for servers the kit cannot patch.

Clients that sanitise tool-call ids (``functions.get_weather:0`` → ``functions_get_weather_0``) or mint
their own (``call_<hex>``, ``toolu_...``) send them back in the history; Kimi copies that style into its
next call and the server's ``kimi_k2`` parser drops it (vLLM 0.33.0: ``content: null``, no
``tool_calls``; SGLang 0.5.23 as released: the same). On SGLang the kit patches the server
(``kimi-k2-canonical-history-ids``); on vLLM, Exo or a hosted API it cannot. This hook does the same
rewrite in a LiteLLM proxy in front of them, before the request leaves the proxy: every history
``tool_calls[].id`` becomes ``functions.NAME:N`` (N its position among the history's calls) and each
tool result's ``tool_call_id`` follows its call (repeated or empty ids matched by position), with
:func:`kimi_deploy.tool_ids.kimi_k2_canonical_history_ids`, the function the SGLang patch carries.
Everything else in the request is left as it came. Anthropic clients (``/v1/messages``) are covered too:
the hook also sees the chat completion LiteLLM makes of their request (:class:`KimiCanonicalToolIds`).

The rewrite is K2's: a model behind a ``kimi_k3`` server (Kimi K3) mints ``NAME:N`` without ``functions.``
(:data:`kimi_deploy.tool_ids.ID_FORMATS`), and its history passes unchanged. Which form a request's model
has is decided per request (:func:`tool_call_parser_of`), so one proxy serves K2.5 and K3 side by side:
:func:`proxy_config` writes ``model_info: {kimi_deploy_tool_call_parser: kimi_k3}`` for a K3 upstream
(:attr:`Upstream.tool_call_parser`); a model without it whose name is a known model of the kit's table
(``moonshotai/Kimi-K3``) takes that model's parser; anything else is K2 (what the hook was written for).

LiteLLM proxy config (``litellm --config config.yaml``; :func:`proxy_config` renders a whole one)::

    litellm_settings:
      callbacks: kimi_deploy.litellm_hook.proxy_handler_instance

The module path must be importable by the proxy's interpreter (``pip install kimi-deploy`` into the
proxy's environment, or ``PYTHONPATH`` naming the kit's source). Importing this module never needs
litellm: without it the hook class derives from ``object`` and only :func:`canonicalize_request` and
:func:`proxy_config` are of use (the kit's own environment has no litellm).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from kimi_deploy.catalog.models import identify
from kimi_deploy.tool_ids import id_format, kimi_k2_canonical_history_ids

try:  # the proxy's environment has litellm; the kit's does not
    from litellm.integrations.custom_logger import CustomLogger as _Base
except ImportError:  # pragma: no cover - exercised by the kit-only import test
    _Base = object  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

#: LiteLLM ``call_type`` values whose ``data["messages"]`` is an OpenAI chat history (the proxy's
#: ``/v1/chat/completions`` route, and the chat completion LiteLLM makes of a ``/v1/messages`` request, are
#: ``acompletion``).
CHAT_CALL_TYPES = frozenset({"completion", "acompletion"})

#: The ``model_info`` key (LiteLLM proxy config, per model) naming the tool-call parser of the server behind.
PARSER_KEY = "kimi_deploy_tool_call_parser"
#: The parser a request's model has when nothing says otherwise: the hook exists for Kimi K2.x servers.
DEFAULT_PARSER = "kimi_k2"


def _parser_in(model_info: Any) -> str | None:
    parser = model_info.get(PARSER_KEY) if isinstance(model_info, dict) else None
    return parser if isinstance(parser, str) and parser else None


def _router_model_info(model: str) -> Any:
    """The ``model_info`` the running proxy's router holds for client-facing model ``model`` (LiteLLM 1.108.7
    ``litellm.proxy.proxy_server.llm_router.model_list``); ``None`` outside a proxy or when not found."""
    try:
        from litellm.proxy import proxy_server  # only inside the proxy; imported per request, cached by Python
    except Exception:  # noqa: BLE001 - no litellm (the kit's own environment), or a proxy that fails to import
        return None
    for deployment in getattr(getattr(proxy_server, "llm_router", None), "model_list", None) or ():
        if isinstance(deployment, dict) and deployment.get("model_name") == model:
            return deployment.get("model_info")
    return None


def tool_call_parser_of(data: dict[str, Any]) -> str:
    """The tool-call parser of the server that answers ``data`` (a chat completion request as LiteLLM hands
    it to a hook), which decides its ids' form. In order: ``data["model_info"]`` (LiteLLM stamps the chosen
    deployment's into the deployment hook's kwargs), the proxy router's ``model_info`` for ``data["model"]``
    (the pre-call hook, before a deployment is chosen), the kit's model table by the model's name
    (``moonshotai/Kimi-K3``, ``openai/moonshotai/Kimi-K3``), else :data:`DEFAULT_PARSER`."""
    parser = _parser_in(data.get("model_info"))
    model = data.get("model")
    if parser is None and isinstance(model, str):
        parser = _parser_in(_router_model_info(model))
        if parser is None:
            known = identify(model)
            parser = known.tool_call_parser if known else None
    return parser or DEFAULT_PARSER


def canonicalize_request(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a chat completion request body, as LiteLLM's proxy hands it to a pre-call hook) with its
    history ids canonical; the same dict, with only ``messages`` replaced when an id changed.

    A body whose history is not in the shape the rule reads (:func:`well_formed`: the proxy hands the hook
    the client's JSON unvalidated) is returned untouched: the server answers it as it would have. So is the
    request of a model whose ids are not K2's (:func:`tool_call_parser_of`: a K3 model's ``NAME:N``).
    """
    messages = data.get("messages") if isinstance(data, dict) else None
    if not well_formed(messages):
        return data
    ids = id_format(tool_call_parser_of(data))
    if ids is not None and not ids.canonicalise:
        return data
    rewritten = kimi_k2_canonical_history_ids(messages)
    if rewritten != messages:
        data["messages"] = rewritten
    return data


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def well_formed(messages: Any) -> bool:
    """Whether ``messages`` has the shape :func:`kimi_k2_canonical_history_ids` reads, as SGLang's request
    model guarantees it there (a list of objects; an assistant's ``tool_calls`` null or a list of objects,
    each ``function`` null or an object, ``id`` and ``function.name`` null or strings; a tool result's
    ``tool_call_id`` null or a string). Anything else (``arguments``, ``content``, other roles) is not read."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        if not isinstance(message, dict):
            return False
        role = message.get("role")
        if role == "tool" and not _optional_str(message.get("tool_call_id")):
            return False
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is None:
            continue
        if not isinstance(calls, list):
            return False
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call, dict) or not (function is None or isinstance(function, dict)):
                return False
            if not _optional_str(call.get("id")) or not _optional_str((function or {}).get("name")):
                return False
    return True


class KimiCanonicalToolIds(_Base):  # type: ignore[misc,valid-type]
    """LiteLLM ``CustomLogger`` applying :func:`canonicalize_request` to every chat completion the proxy sends.

    Two LiteLLM hooks, the same rewrite (it is idempotent: canonical ids at their positions stay as they are):

    - ``async_pre_call_hook`` (LiteLLM proxy docs, "Modify / Reject Incoming Requests"): the proxy's
      ``/v1/chat/completions`` request as the client sent it;
    - ``async_pre_call_deployment_hook`` (LiteLLM 1.108.7 ``utils.py``: every ``litellm.acompletion``, just
      before it is sent): also the chat completion LiteLLM makes of an Anthropic ``/v1/messages`` request
      (Claude Code), after its translation, which replaces every id character outside ``[A-Za-z0-9_-]``
      with ``_`` (``normalize_anthropic_tool_use_id``): a sanitised id the rule must still see.

    Neither raises: an exception in a hook fails the request, so a fault in the rewrite is logged (warning)
    and the request goes on with its ids as they came. Other call types (embeddings, text completions, the
    Responses API's ``input`` items) pass untouched.
    """

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        return _guarded(data, call_type)

    async def async_pre_call_deployment_hook(self, kwargs: dict, call_type: Any) -> dict:
        return _guarded(kwargs, call_type)


def _guarded(data: Any, call_type: Any) -> Any:
    """:func:`canonicalize_request` of ``data`` when ``call_type`` (a string, or LiteLLM's ``CallTypes``
    member) is a chat completion; ``data`` itself otherwise, and when the rewrite fails (logged)."""
    try:
        if getattr(call_type, "value", call_type) not in CHAT_CALL_TYPES:
            return data
        return canonicalize_request(data)
    except Exception as exc:  # noqa: BLE001 - a broken hook would break every request through the proxy
        log.warning("kimi-deploy tool-id hook: history ids left as they came (%s: %s)", type(exc).__name__, exc)
        return data


#: What the proxy config's ``callbacks`` names: ``kimi_deploy.litellm_hook.proxy_handler_instance``.
proxy_handler_instance = KimiCanonicalToolIds()

#: The ``callbacks`` value of :func:`proxy_config`.
CALLBACK = "kimi_deploy.litellm_hook.proxy_handler_instance"


@dataclasses.dataclass(frozen=True)
class Upstream:
    """One server behind the proxy: its OpenAI base URL (``http://host:8000/v1``), the model name it
    serves (``moonshotai/Kimi-K2.5``), the environment variable holding its API key (``None``: none), and its
    ``--tool-call-parser`` (decides the ids' form: ``kimi_k3`` ids pass the hook unchanged)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    tool_call_parser: str = DEFAULT_PARSER


def proxy_config(models: dict[str, Upstream], *, master_key_env: str | None = "LITELLM_MASTER_KEY") -> str:
    """A LiteLLM proxy ``config.yaml`` (text) serving ``models`` with the hook in front.

    Args:
        models: client-facing model name → :class:`Upstream`. Each is reached as an OpenAI-compatible
            server (``openai/<model>``), which is what vLLM, SGLang and Exo are.
        master_key_env: the variable holding the key clients must send to the proxy (LiteLLM refuses to
            start without one unless told it is a development setup); ``None``: leave it out.

    Returns:
        YAML text (every string a JSON-quoted scalar, so no name or URL can break the document). It sets
        ``use_chat_completions_url_for_anthropic_messages`` (LiteLLM 1.108.7
        ``llms/anthropic/pass_through/messages/handler.py``): without it LiteLLM bridges an ``openai/``
        model's ``/v1/messages`` requests to the server's ``/v1/responses``, which Exo lacks.
    """
    q = json.dumps
    lines = ["# LiteLLM proxy in front of Kimi K2.x servers the kit cannot patch (docs/runbook.md,",
             "# \"Servers the kit cannot patch\"). Rendered by kimi_deploy.litellm_hook.proxy_config.",
             "model_list:"]
    for name, up in models.items():
        lines += [f"  - model_name: {q(name)}",
                  "    litellm_params:",
                  f"      model: {q('openai/' + up.model)}",
                  f"      api_base: {q(up.base_url)}",
                  f"      api_key: {q('os.environ/' + up.api_key_env) if up.api_key_env else q('none')}"]
        if up.tool_call_parser != DEFAULT_PARSER:  # the hook passes this model's ids as they come
            lines += ["    model_info:", f"      {PARSER_KEY}: {q(up.tool_call_parser)}"]
    lines += ["litellm_settings:",
              f"  callbacks: {q(CALLBACK)}",
              "  drop_params: false",
              "  # Anthropic clients (/v1/messages) reach the servers through chat completions, which vLLM, SGLang",
              "  # and Exo all serve (LiteLLM would otherwise send an openai/ model's requests to /v1/responses)",
              "  use_chat_completions_url_for_anthropic_messages: true"]
    if master_key_env:
        lines += ["general_settings:", f"  master_key: {q('os.environ/' + master_key_env)}"]
    return "\n".join(lines) + "\n"
