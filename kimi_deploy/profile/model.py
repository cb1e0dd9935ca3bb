"""The deployment profile as one pydantic model: :class:`Profile` and its ``[sglang]`` table (the other tables
have a module each in this package; :mod:`kimi_deploy.profile.load` reads TOML into it, with fix-it errors).

Field names are SGLang's own option names (``tp_size`` is ``--tp-size``,
``speculative_eagle_topk`` is ``--speculative-eagle-topk``; SGLang 0.5.23
``sglang/srt/server_args.py``) and systemd's directive names in snake case
(``timeout_start_sec`` is ``TimeoutStartSec=``). Unknown keys are errors with a
did-you-mean; cross-field rules live in :func:`kimi_deploy.profile.rules.check_rules`.

Layout of a profile file::

    [service]      # the systemd unit and host facts
    [sglang]       # SGLang server arguments
    [environment]  # extra environment (NCCL_*, ...), written to the EnvironmentFile
    [monitoring]   # Prometheus jobs, labels, alert thresholds (kimi_deploy.targets.prometheus renders them)
    [monitoring.slo]  # latency SLOs in milliseconds, the keys of `bench --slo`
    [fleet]        # optional: replicas (each a full copy of the model on its nodes, in rank order)
    [[fleet.replicas]]
    [gateway]      # optional: SGLang's gateway (smg) in front of the replicas' rank 0
    [kubernetes]   # render --target kubernetes: image, volumes, names (kimi_deploy.targets.kubernetes renders it)
    [startup]      # optional: the weights prefetch before SGLang starts (kimi_deploy.host.prefetch)
    [rollout]      # optional: the batches and capacity guard of render --target ansible's roll
    [tune]         # optional: what `kimi-deploy tune` varies ([tune.space]; kimi_deploy.tune)
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from kimi_deploy.errors import UsageError
from kimi_deploy.names import node_url
from kimi_deploy.options import OPTIONS, Option
from kimi_deploy.paths import service_cache_dir
from kimi_deploy.profile.base import Section
from kimi_deploy.profile.fleet import Fleet, Gateway
from kimi_deploy.profile.kubernetes import Kubernetes
from kimi_deploy.profile.monitoring import RUNBOOK_DEFAULT, RUNBOOK_DEFAULT_DIGESTED, Monitoring
from kimi_deploy.wire.net import host_key, is_loopback
from kimi_deploy.profile.service import Service
from kimi_deploy.profile.rollout import Rollout
from kimi_deploy.profile.startup import Startup
from kimi_deploy.profile.tune import Tune
from kimi_deploy.values import MAX_ITEMS, check_abs_path, check_text, check_token


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _option_field(option: Option) -> tuple[Any, Any]:
    """``(annotation, FieldInfo)`` of one row of :data:`kimi_deploy.options.OPTIONS` for ``create_model``."""
    if isinstance(option.default, type):
        return option.annotation, Field(default_factory=option.default, description=option.help, **option.bounds)
    return option.annotation, Field(option.default, description=option.help, **option.bounds)


#: ``[sglang]``: SGLang server arguments under their own names (SGLang 0.5.23), one field per row of
#: :data:`kimi_deploy.options.OPTIONS` in table order (types, defaults, bounds and help come from there).
SGLang: type[Section] = create_model(  # type: ignore[call-overload]
    "SGLang", __base__=Section, __module__=__name__,
    **{option.key: _option_field(option) for option in OPTIONS},
)
SGLang.__doc__ = "``[sglang]``: SGLang server arguments under their own names (rows of ``options.OPTIONS``)."


class Quality(Section):
    """``[quality]``: the ``quality`` tier of ``kimi-deploy check`` (:mod:`kimi_deploy.check.quality`).

    ``min_schema_accuracy`` defaults to K2VV's published schema accuracy of SGLang serving K2-Thinking (95.52 %,
    2025-11-15, temperature 1.0; MoonshotAI/K2-Vendor-Verifier, README): a deployment of the kit is held to at least
    the reference SGLang figure. ``nightly``: the nightly check unit runs the tier with ``sample`` requests (on as soon
    as the table exists; a profile without ``[quality]`` keeps the nightly unit as it was, and its digest).
    """

    nightly: bool = Field(True, description="the nightly check unit runs the quality tier (on with the table)")
    sample: int = Field(200, ge=1, le=100_000, description="requests of quality.accuracy")
    concurrency: int = Field(4, ge=1, le=256, description="quality.accuracy requests in flight at once")
    deadline_s: float = Field(600.0, gt=0, le=86_400, allow_inf_nan=False,
                              description="seconds quality.accuracy may take")
    min_schema_accuracy: float = Field(0.9552, ge=0, le=1, allow_inf_nan=False,
                                       description="verdict threshold (fraction); K2VV's SGLang figure")
    dataset: str | None = Field(None, description="JSONL of request bodies (K2VV's format), an absolute path; none: "
                                "the kit's samples")
    max_think_leak_rate: float = Field(0.0, ge=0, le=1, allow_inf_nan=False,
                                       description="quality.reasoning: highest share of answers with a think tag or "
                                                   "the reasoning in content (smg-project/providers-verifier: 0)")
    max_empty_stop_rate: float = Field(0.0, ge=0, le=1, allow_inf_nan=False,
                                       description="quality.reasoning: highest share of answers ending stop with "
                                                   "neither content nor a call")
    repeats: int = Field(1, ge=1, le=15, description="quality.accuracy sends every request this many times; "
                                                      "quality.certify judges each by the majority of its repeats")
    min_tool_trigger_f1: float = Field(0.98, ge=0, le=1, allow_inf_nan=False,
                                       description="quality.certify bar: tool-trigger F1 (smg-project/"
                                                   "providers-verifier: 0.98)")
    certify_min_schema_accuracy: float = Field(0.98, ge=0, le=1, allow_inf_nan=False,
                                               description="quality.certify bar: tool-schema accuracy "
                                                           "(smg-project/providers-verifier: 0.98)")
    max_missing_reasoning_rate: float = Field(0.0, ge=0, le=1, allow_inf_nan=False,
                                              description="quality.reasoning: highest share of thinking-on answers "
                                                          "without reasoning")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = check_abs_path(v)  # the nightly unit runs from no particular directory
        top = "/" + v.strip("/").split("/", 1)[0]
        if top in PSEUDO_FS:  # /dev/zero, /proc/kmsg ...: never a dataset, and a read that never ends
            raise ValueError(f"{v} is under {top}, a kernel pseudo-file system: a dataset is a regular file "
                             "(JSONL), e.g. /var/lib/kimi-deploy/k2vv.jsonl")
        return v


#: Top directories of kernel pseudo-file systems: devices and endless files, never a dataset (issue #38).
PSEUDO_FS = frozenset({"/dev", "/proc", "/sys"})


#: The placeholder a path default may hold for ``[service] name`` (:meth:`Profile._derive_paths`).
NAME_FIELD = "{name}"


class Profile(BaseModel):
    """A whole deployment profile: ``[service]``, ``[sglang]``, ``[environment]``, ``[monitoring]``, and the
    optional ``[fleet]``, ``[gateway]``, ``[kubernetes]``, ``[quality]``, ``[startup]``, ``[rollout]`` and ``[tune]``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _derive_paths(cls, data: Any) -> Any:
        """``[sglang] api_key_file`` may name its file after the service: :data:`NAME_FIELD` (``{name}``) is
        ``[service] name``. ``init`` writes ``/etc/kimi-deploy/{name}.api-key``, so renaming the service renames
        the key file (issue #30 item 5); an explicit path stays what it says."""
        if not isinstance(data, dict) or not isinstance(data.get("sglang"), dict):
            return data
        key_file = data["sglang"].get("api_key_file")
        if not isinstance(key_file, str) or NAME_FIELD not in key_file:
            return data
        service = data.get("service") if isinstance(data.get("service"), dict) else {}
        name = service.get("name", Service.model_fields["name"].default)
        if not isinstance(name, str):
            return data  # the name's own error says what is wrong
        return {**data, "sglang": {**data["sglang"], "api_key_file": key_file.replace(NAME_FIELD, name)}}


    @field_validator("environment", mode="before")
    @classmethod
    def _clean_env(cls, v: Any) -> Any:
        """The one rule for strings (:func:`check_text`) on ``[environment]`` names and values."""
        return check_text(v, "environment variable")

    service: Service = Field(default_factory=Service)
    sglang: SGLang
    environment: dict[str, str] = Field(default_factory=dict, max_length=MAX_ITEMS)
    monitoring: Monitoring = Field(default_factory=Monitoring)
    quality: Quality | None = None
    fleet: Fleet | None = None
    gateway: Gateway | None = None
    kubernetes: Kubernetes | None = None
    startup: Startup | None = None
    rollout: Rollout | None = None
    tune: Tune | None = None

    @field_validator("environment", mode="before")
    @classmethod
    def _env_numbers(cls, v: Any) -> Any:
        """``NCCL_IB_DISABLE = 1`` means the string "1": integers become strings, nothing else is coerced."""
        if isinstance(v, dict):
            return {k: str(x) if isinstance(x, int) and not isinstance(x, bool) else x for k, x in v.items()}
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"environment variable name {key!r} is not valid (letters, digits, _)")
            check_token(str(value), f"value of {key}")
        return v

    @property
    def start(self) -> Startup:
        """``[startup]``, or its defaults when the profile has no such table."""
        return self.startup or Startup()

    @property
    def is_loopback(self) -> bool:
        """True when ``host`` only accepts local connections."""
        return is_loopback(self.sglang.host)

    @property
    def cache_root(self) -> str:
        """Persistent cache root on the host (``[service] cache_dir`` or ``/var/cache/<name>``)."""
        return self.service.cache_dir or service_cache_dir(self.service.name)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` a local client uses (0.0.0.0/:: become loopback)."""
        host = self.sglang.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return node_url(host, self.sglang.port)

    @property
    def replicas(self) -> tuple[tuple[str, ...], ...]:
        """The nodes of each replica in rank order (``[fleet] replicas``); ``()`` without ``[fleet]``."""
        return tuple(tuple(r.nodes) for r in self.fleet.replicas) if self.fleet else ()

    @property
    def copies(self) -> int:
        """How many full copies of the model run: ``len([fleet] replicas)``, 1 without ``[fleet]``."""
        return len(self.fleet.replicas) if self.fleet else 1

    @property
    def nodes_per_copy(self) -> int:
        """Nodes (hosts, pods) of each copy: ``len(nodes)`` of a replica, 1 without ``[fleet]``."""
        return len(self.fleet.replicas[0].nodes) if self.fleet else 1

    @property
    def gateway_url(self) -> str:
        """``http://HOST:PORT`` at which the kit reaches the profile's gateway: ``[gateway] bind`` (a wildcard
        means the gateway host itself, reached by its name from elsewhere).

        Raises:
            UsageError: the profile has no ``[gateway]`` (exit 2).
        """
        gw = self.gateway
        if gw is None:
            raise UsageError("the profile has no [gateway]", hint="add a [gateway] table (docs/runbook.md#replicas-behind-a-gateway)")
        return node_url(gw.host if gw.bind in ("0.0.0.0", "::") else gw.bind, gw.port)

    def worker_urls(self) -> tuple[str, ...]:
        """``http://{nodes[0]}:{[sglang] port}`` of each replica (IPv6 in brackets); ``()`` without ``[fleet]``."""
        return tuple(node_url(nodes[0], self.sglang.port) for nodes in self.replicas)

    def hosts(self) -> tuple[str, ...]:
        """Every host with a part of the deployment: the nodes in replica and rank order, then the gateway's
        host when it is not a node; ``()`` without ``[fleet]`` and ``[gateway]`` (the one local host). One host
        spelt two ways (:func:`host_key`: ``FD00::A``, ``fd00::a``) is one entry, spelt as first listed."""
        names = [node for nodes in self.replicas for node in nodes]
        if self.gateway:
            names.append(self.gateway.host)
        first: dict[str, str] = {}
        for name in names:
            first.setdefault(host_key(name), name)
        return tuple(first.values())

    def digest(self) -> str:
        """sha256 of the canonical JSON of the profile (values after defaults), hex, 64 chars.

        Keys added after profiles were first installed are left out while unset, so a profile that does not
        use them keeps the digest recorded by earlier installs (no false drift) and the golden files theirs:
        the tables of :data:`DIGEST_OMITS_UNSET` while absent, and every ``[sglang]`` row outside
        :data:`DIGEST_SGLANG_KEYS` while it equals its default (a row added to the option table needs no edit
        here). A default that moved is hashed as its first value (:data:`RUNBOOK_DEFAULT_DIGESTED`).
        """
        data = self.model_dump(mode="json")
        for table in DIGEST_OMITS_UNSET:
            if data.get(table) is None:
                data.pop(table, None)
        if data.get("kubernetes") is not None:  # [kubernetes] keys added later, left out at their defaults
            for key, default in KUBERNETES_KEYS_ADDED.items():
                if data["kubernetes"].get(key) == default:
                    data["kubernetes"].pop(key, None)
        if data.get("gateway") is not None:  # [gateway] keys added later, left out while unset
            for key in GATEWAY_KEYS_ADDED:
                if data["gateway"].get(key) is None:
                    data["gateway"].pop(key, None)
        if data["monitoring"]["runbook_url"] == RUNBOOK_DEFAULT:
            data["monitoring"]["runbook_url"] = RUNBOOK_DEFAULT_DIGESTED
        for option in OPTIONS:
            default = option.default() if isinstance(option.default, type) else option.default
            if option.key not in DIGEST_SGLANG_KEYS and data["sglang"].get(option.key) == default:
                del data["sglang"][option.key]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


#: ``[kubernetes]`` keys added after the first renders, with their defaults: :meth:`Profile.digest` leaves each out
#: while it has its default, so the manifests of a profile that does not use them keep their headers (issue 43).
KUBERNETES_KEYS_ADDED: dict[str, Any] = {
    "affinity": {}, "tolerations": [], "image_pull_secrets": [], "priority_class_name": None,
    "network_policy": True, "client_namespaces": {},
    "prometheus_namespaces": {"kubernetes.io/metadata.name": "monitoring"},
}

#: ``[gateway]`` keys added after the first fleet installs (issue 41: smg's parsers), left out of
#: :meth:`Profile.digest` while unset, so an installed fleet profile keeps its digest.
GATEWAY_KEYS_ADDED: tuple[str, ...] = ("reasoning_parser", "tool_call_parser")

#: Top-level tables that :meth:`Profile.digest` leaves out while absent (added after the first installs).
DIGEST_OMITS_UNSET: tuple[str, ...] = ("fleet", "gateway", "kubernetes", "quality", "startup", "rollout", "tune")

#: The ``[sglang]`` keys of the first installed profiles: always part of :meth:`Profile.digest`. Frozen: a row
#: added to :data:`kimi_deploy.options.OPTIONS` later (``pp_size``, ``max_prefill_tokens``, ...) is not listed
#: here and so is left out of the digest while it equals its default.
DIGEST_SGLANG_KEYS: frozenset[str] = frozenset({
    "model_path", "served_model_name", "trust_remote_code", "host", "port", "tp_size", "context_length",
    "mem_fraction_static", "max_running_requests", "chunked_prefill_size", "attention_backend", "tool_call_parser",
    "reasoning_parser", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "enable_spec_v2", "disable_overlap_schedule",
    "flashinfer_allreduce_fusion_backend", "enforce_disable_flashinfer_allreduce_fusion", "enable_symm_mem",
    "enable_torch_symm_mem", "enable_pcie_ipc_allreduce", "enable_metrics", "api_key_file",
    "allow_unauthenticated", "extra_args"})


#: Where a rank >= 1 of a multi-node group listens: it gets no ``--host``/``--port`` (serving options), so SGLang
#: 0.5.23 serves its dummy ``/health`` on its own defaults (``ServerArgs``: host 127.0.0.1, port 30000).
RANK_DUMMY_HEALTH = ("127.0.0.1", 30000)

#: Environment variables the kit sets on every rank of a multi-node replica from ``[fleet] nic``.
NIC_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
