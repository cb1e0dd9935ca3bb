"""What every check of one run shares: the clients, the model, the expectations, server facts."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from kimi_deploy.check.client import REFUSED_KIND, Clients, ResponseRefused
from kimi_deploy.check.completion_rules import Finding
from kimi_deploy.profile import Profile
from kimi_deploy.tool_ids import id_format


@dataclasses.dataclass
class Context:
    """State of one run.

    ``model_info``/``server_info`` are SGLang's ``/model_info`` and ``/server_info`` JSON (``None``
    when the server does not expose them: vLLM, Exo, LiteLLM). ``conversation_ids`` collects
    every tool-call id the run has seen, for ``duplicate_id``.
    """

    clients: Clients
    profile: Profile | None
    model: str | None
    expected_model: str | None
    repeat: int
    model_info: dict[str, Any] | None = None
    server_info: dict[str, Any] | None = None
    facts_loaded: bool = False
    #: ``(path, status)`` when ``/model_info`` or ``/server_info`` answered 401/403 (a key is needed).
    facts_denied: tuple[str, int] | None = None
    #: The finding when ``/model_info`` or ``/server_info`` answered but its answer was refused unread (over
    #: ``--max-body-bytes``, or compressed): the config and parser tiers fail with it instead of skipping.
    facts_refused: Finding | None = None
    #: ``(status, body)`` of ``GET /v1/models`` as :meth:`served_model` got it (``None``: not asked or no answer).
    models_answer: tuple[int, Any] | None = None
    #: Which server answers (:meth:`identify`): ``sglang``, ``vllm`` or ``other``; ``None`` until asked.
    server_kind: str | None = None
    #: Its version where it says (SGLang ``/server_info`` ``version``, vLLM ``/version``).
    server_version: str | None = None
    #: Sampling every contract request sends (:func:`kimi_deploy.check.runner.request_sampling`): temperature 0,
    #: or the model's required sampling (K2.7-Code: temperature 1.0, top_p 0.95).
    sampling: dict[str, float] = dataclasses.field(default_factory=lambda: {"temperature": 0})
    #: ``--sampling``: ``model`` or ``greedy``.
    sampling_mode: str = "model"
    #: Requests at once of the ``contract.concurrency.*`` checks (``None``: :func:`kimi_deploy.check.concurrency.level`).
    concurrency: int | None = None
    #: The quality tier's settings (:class:`kimi_deploy.check.quality.settings.QualitySettings`; ``None``: defaults).
    quality: Any = None
    #: What the quality tier measured, for the report's ``quality`` object (``{"accuracy": {...}}``).
    quality_results: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The quality sample's answers (:class:`kimi_deploy.check.quality.accuracy.Sample`), for the checks that judge
    #: the same sample again (``quality.reasoning``, ``quality.certify``); empty until it is measured.
    quality_samples: list[Any] = dataclasses.field(default_factory=list)
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def load_facts(self) -> None:
        """Fetch ``/model_info`` and ``/server_info`` once (errors: the facts stay ``None``; a 401/403
        is kept in :attr:`facts_denied`, an answer refused unread in :attr:`facts_refused`)."""
        if self.facts_loaded:
            return
        self.facts_loaded = True
        for path, attr in (("/model_info", "model_info"), ("/server_info", "server_info")):
            try:
                status, data = self.clients.get_json(path)
            except ResponseRefused as exc:  # it answered, too much or compressed: not a missing fact
                self.facts_refused = self.facts_refused or Finding(REFUSED_KIND, f"GET {path}: {exc.detail}",
                                                                   exc.evidence)
                continue
            except Exception:  # noqa: BLE001 - a missing fact only makes checks skip
                continue
            if status == 200 and isinstance(data, dict):
                setattr(self, attr, data)
            elif status in (401, 403) and self.facts_denied is None:
                self.facts_denied = (path, status)

    def identify(self) -> str:
        """``sglang``, ``vllm`` or ``other``, from what the server answers (asked once).

        SGLang: ``/model_info`` or ``/server_info`` answered (0.5.23 ``http_server.py``; a 401/403 there
        counts too). vLLM: ``/v1/models`` lists a model ``owned_by`` ``"vllm"`` (vLLM 0.33.0
        ``ModelCard``; a proxy such as LiteLLM in front answers its own ``owned_by``, so it is ``other``),
        and its ``GET /version`` gives the version. Anything else: ``other``.
        """
        if self.server_kind is not None:
            return self.server_kind
        self.load_facts()
        if self.model_info is not None or self.server_info is not None or self.facts_denied:
            self.server_kind = "sglang"
            self.server_version = (self.server_info or {}).get("version")
            return self.server_kind
        self.served_model()
        status, body = self.models_answer or (0, None)
        owners = {m.get("owned_by") for m in (body or {}).get("data") or [] if isinstance(m, dict)} \
            if status == 200 and isinstance(body, dict) else set()
        self.server_kind = "vllm" if "vllm" in owners else "other"
        if self.server_kind == "vllm":
            try:
                status, data = self.clients.get_json("/version")
            except httpx.HTTPError:  # no answer, a broken one, or one refused unread
                data = None
            if isinstance(data, dict) and isinstance(data.get("version"), str):
                self.server_version = data["version"]
        return self.server_kind

    def served_model(self) -> str | None:
        """The first model ``/v1/models`` lists (asked once; ``None`` when it lists none, does not answer, or
        answers something that is not a model list)."""
        if "served_model" not in self._cache:
            self._cache["served_model"] = None
            try:
                status, body = self.clients.get_json("/v1/models")
            except Exception:  # noqa: BLE001 - no answer, or one too deep to parse: health.models says which
                return None
            self.models_answer = (status, body)
            data = body.get("data") if isinstance(body, dict) else None
            if status == 200 and isinstance(data, list):
                ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]
                self._cache["served_model"] = ids[0] if ids else None
        return self._cache["served_model"]

    def server_value(self, name: str) -> Any:
        """A server argument as the server reports it (``/model_info`` first, then ``/server_info``)."""
        for source in (self.model_info, self.server_info):
            if source and name in source:
                return source[name]
        return None

    def _parser(self, name: str) -> str | None:
        """The ``name`` parser (``tool_call_parser``, ``reasoning_parser``) whose rules apply: the profile's,
        else the one the server reports (``None`` when it reports none)."""
        if self.profile is not None:
            return getattr(self.profile.sglang, name)
        self.load_facts()
        return self.server_value(name)

    @property
    def tool_call_parser(self) -> str | None:
        """The tool-call parser whose rules apply: the profile's, else the one the server reports."""
        return self._parser("tool_call_parser")

    @property
    def reasoning_parser(self) -> str | None:
        """The reasoning parser whose rules apply: the profile's, else the one the server reports."""
        return self._parser("reasoning_parser")

    @property
    def id_parser(self) -> str | None:
        """The tool-call parser whose id form the answers must have (``kimi_k2``: ``functions.NAME:N``,
        ``kimi_k3``: ``NAME:N``; :data:`kimi_deploy.tool_ids.ID_FORMATS`), ``None`` when it has none."""
        parser = self.tool_call_parser
        return parser if id_format(parser) else None
