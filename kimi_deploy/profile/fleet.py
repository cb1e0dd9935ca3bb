"""``[fleet]`` (its replicas) and ``[gateway]``: one profile, several hosts behind SGLang's gateway.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from kimi_deploy.profile.base import MAX_SPAN_SEC, Section
from kimi_deploy.values import AbsPath, Host, check_text


#: A network interface name as Linux accepts it (IFNAMSIZ 16 with the NUL; no '/', ':' or whitespace), not
#: starting with '-' or '.' (nor NCCL's '^'/'=' prefixes: the kit sets one exact NIC).
IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
#: A policy name of smg's ``--policy`` (the pinned smg's ``--help`` lists the valid ones; ``validate`` checks).
POLICY = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: A parser name of smg's ``--reasoning-parser``/``--tool-call-parser`` (smg 1.13.0's names: ``kimi_thinking``,
#: ``kimik2``, ``deepseek_v4.1``; the pinned smg's ``--help`` lists the valid ones, ``validate --gateway`` checks).
SMG_PARSER = re.compile(r"[a-z][a-z0-9_.]{0,63}")
#: A release number of smg (PEP 440 public versions as smg publishes them: 1.13.0, 1.13.0rc1, 1.13.0.post1).
SMG_VERSION = re.compile(r"\d+(?:\.\d+){1,3}(?:(?:a|b|rc)\d+)?(?:\.post\d+)?")
#: Most replicas and nodes per replica a fleet may list (a bound on hostile input, far above real fleets).
MAX_REPLICAS = 256
MAX_NODES = 64


class Replica(Section):
    """One ``[[fleet.replicas]]`` entry: the nodes of one full copy of the model, in rank order.

    One node: a single-host replica. N nodes: an N-rank SGLang group (``--nnodes N``; ``nodes[0]`` is rank 0,
    the only rank that serves HTTP and the ``--dist-init-addr`` host). Worker URL:
    ``http://{nodes[0]}:{[sglang] port}`` (:meth:`Profile.worker_urls`).
    """

    nodes: list[Host] = Field(..., min_length=1, max_length=MAX_NODES,
                              description="the replica's hosts (IP address or host name), rank 0 first")


class Fleet(Section):
    """``[fleet]``: the hosts that run the model. Absent: one host, exactly as without it.

    ``dist_init_port``/``nic``/``dist_timeout`` concern multi-node replicas only (more than one node):
    rank 0's rendezvous port (``--dist-init-addr NODES[0]:PORT``), the data NIC (``NCCL_SOCKET_IFNAME`` and
    ``GLOO_SOCKET_IFNAME``) and ``--dist-timeout`` in seconds (SGLang 0.5.23 server_args.py).
    """

    dist_init_port: int | None = Field(None, ge=1, le=65535,
                                       description="multi-node: rank 0's rendezvous port (--dist-init-addr)")
    nic: str | None = Field(None, description="multi-node: the data NIC (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)")
    dist_timeout: int | None = Field(None, ge=1, le=MAX_SPAN_SEC, description="multi-node: --dist-timeout, seconds")
    replicas: list[Replica] = Field(..., min_length=1, max_length=MAX_REPLICAS,
                                    description="one entry per full copy of the model, its nodes in rank order")

    @field_validator("*", mode="before")
    @classmethod
    def _clean_text(cls, v: Any, info: ValidationInfo) -> Any:
        """:func:`check_text` on every field but ``replicas``, whose own model checks each string at its key."""
        return v if info.field_name == "replicas" else check_text(v)

    @field_validator("nic")
    @classmethod
    def _nic(cls, v: str | None) -> str | None:
        if v is not None and (not IFNAME.fullmatch(v) or v in (".", "..")):
            raise ValueError(f"nic {v!r} is not a network interface name (1-15 letters, digits and _.-; "
                             "see `ip -br link`)")
        return v


class Gateway(Section):
    """``[gateway]``: SGLang's gateway ``smg`` on ``host``, in front of every replica's rank 0.

    It runs the pinned ``smg`` from its own virtual environment; its flags are those of that release
    (``smg launch --help`` of ``version``). It uses ``[sglang] api_key_file`` (one key end to end: smg
    checks it and forwards it to the workers). Metrics bind to loopback unless ``prometheus_host`` says
    otherwise (smg's own default is 0.0.0.0).
    """

    host: Host = Field(..., description="the host that runs the gateway (its folder name under render --out)")
    bind: Host = Field("0.0.0.0", description="smg --host: the address the gateway listens on")
    port: int = Field(30000, ge=1, le=65535, description="smg --port")
    policy: str = Field("cache_aware", description="smg --policy (validated against the pinned smg's --help)")
    smg: AbsPath = Field("/opt/smg/.venv/bin/smg", description="the pinned smg executable in its own venv")
    version: str = Field("1.13.0", description="the pinned smg version the flags are validated against")
    prometheus_host: Host = Field("127.0.0.1", description="smg --prometheus-host")
    prometheus_port: int = Field(29000, ge=1, le=65535, description="smg --prometheus-port")
    reasoning_parser: str | None = Field(
        None, description="smg --reasoning-parser, in smg's own names (Kimi K2.x: kimi_thinking, K3: kimi_k3); "
                          "unset: not passed. validate refuses one that does not match the model")
    tool_call_parser: str | None = Field(
        None, description="smg --tool-call-parser, in smg's own names (Kimi K2.x: kimik2, K3: kimi_k3); unset: not "
                          "passed. validate refuses one that does not match the model")

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _parser(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not SMG_PARSER.fullmatch(v):
            raise ValueError(f"{info.field_name} {v!r} is not an smg parser name (lower case letters, digits, _ and ., "
                             "such as kimi_thinking or kimik2; `smg launch --help` lists them)")
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if not POLICY.fullmatch(v):
            raise ValueError(f"policy {v!r} is not a policy name (lower case letters, digits and _, such as "
                             "cache_aware or round_robin)")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not SMG_VERSION.fullmatch(v):
            raise ValueError(f"version {v!r} is not an smg release number such as 1.13.0")
        return v
