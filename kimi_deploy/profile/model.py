"""The deployment profile: one pydantic model, loaded from TOML, with fix-it errors.

Field names are SGLang's own option names (``tp_size`` is ``--tp-size``,
``speculative_eagle_topk`` is ``--speculative-eagle-topk``; SGLang 0.5.23
``sglang/srt/server_args.py``) and systemd's directive names in snake case
(``timeout_start_sec`` is ``TimeoutStartSec=``). Unknown keys are errors with a
did-you-mean; cross-field rules live in :func:`check_rules`.

Layout of a profile file::

    [service]      # the systemd unit and host facts
    [sglang]       # SGLang server arguments
    [environment]  # extra environment (NCCL_*, ...), written to the EnvironmentFile
    [monitoring]   # Prometheus jobs, labels, alert thresholds (kimi_deploy.targets.monitoring renders them)
    [monitoring.slo]  # latency SLOs in milliseconds, the keys of `bench --slo`
    [fleet]        # optional: replicas (each a full copy of the model on its nodes, in rank order)
    [[fleet.replicas]]
    [gateway]      # optional: SGLang's gateway (smg) in front of the replicas' rank 0
    [kubernetes]   # render --target kubernetes: image, volumes, names (kimi_deploy.targets.kubernetes renders it)
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import ipaddress
import json
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model,
                      field_validator)

from kimi_deploy.argv import expansions
from kimi_deploy.errors import ProfileError
from kimi_deploy.options import CACHE_ENV, OPTIONS, Option, owned_env, owned_flags, secret_flags
from kimi_deploy.names import gateway_service, node_url, url_host
from kimi_deploy.paths import service_api_key_file, service_cache_dir
from kimi_deploy.values import (MAX_ITEMS, SAFE_TOKEN, AbsPath, Host, check_abs_path, check_host, check_text,
                                check_token, check_unit_stem)

__all__ = ["SAFE_TOKEN", "Fleet", "Gateway", "Profile", "Replica", "check_service_name", "check_rules",
           "load_profile", "parse_profile"]

POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Characters of a systemd calendar spec (man systemd.time), no leading/trailing space.
CALENDAR = re.compile(r"[A-Za-z0-9*:,./~-](?:[A-Za-z0-9*:,./~ -]*[A-Za-z0-9*:,./~-])?")
#: Upper bound of ``StartLimitBurst=``: systemd parses it as an unsigned int and ignores larger values.
UINT_MAX = 2**32 - 1


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an IP literal, IPv6 without brackets) means this machine only:
    ``localhost`` in any case, 127.0.0.0/8, ``::1``, IPv4-mapped loopback (``::ffff:127.0.0.1``). Not a name
    under ``.localhost``: RFC 6761 asks resolvers to answer those with loopback, but glibc with ``hosts: files
    dns`` sends ``x.localhost`` to the DNS server, whose answer may be this host's public address. Pure:
    nothing is resolved."""
    name = host.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def host_key(host: str) -> str:
    """The identity of a profile host: an IP address in its compressed lower-case form (``fd00:0::11`` and
    ``FD00::11`` are one host), a name in lower case (DNS names are case-insensitive). Pure."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def not_one_host(host: str) -> str | None:
    """Why ``host`` cannot name one machine (``0.0.0.0``/``::`` mean every address, a multicast address a group,
    255.255.255.255 the broadcast), or None: a worker URL, a rendezvous address or a host folder needs one."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_unspecified:
        return "it means every address of whichever host binds it"
    if ip.is_multicast:
        return "a multicast address"
    if ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"):
        return "the broadcast address"
    return None


def check_service_name(v: str) -> str:
    """``v`` when it is a valid ``[service] name``, else ValueError (:func:`kimi_deploy.values.check_unit_stem`)."""
    return check_unit_stem(v)


#: Upper bound of every time span in ``[service]`` (seconds): one week. systemd stores spans in
#: microseconds and silently falls back to its default on a value it cannot parse (e.g. 10^14 s is
#: "Numerical result out of range"), and TimeoutStartSec= falling back to 90 s kills every cold start.
MAX_SPAN_SEC = 7 * 24 * 3600


class _Section(BaseModel):
    """Base of every profile table: unknown keys are errors, and every string passes :func:`check_text`."""

    # strict: TOML has real types, so `tp_size = "8"` is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _clean_text(cls, v: Any) -> Any:
        """The one rule for strings (no control/format characters, bounded length), for every field."""
        return check_text(v)


class Service(_Section):
    """``[service]``: the systemd unit, its user, the interpreter, host facts."""

    name: str = Field("sglang", description="unit name: <name>.service and <name>.env")
    description: str = Field("SGLang server", description="Description= of the unit")
    user: str = Field("sglang", description="User= the server runs as (a dedicated system user)")
    group: str = Field("sglang", description="Group= of the server")
    python: str = Field("/opt/sglang/.venv/bin/python", description="the interpreter SGLang is installed in")
    kimi_deploy: str = Field("/usr/local/bin/kimi-deploy", description="the kimi-deploy executable units call")
    gpu_count: int = Field(8, ge=1, le=64, description="GPUs on the host that the server may use")
    hardening: Literal["standard", "strict"] = Field("standard", description="sandboxing level of the unit")
    timeout_start_sec: int = Field(1200, ge=60, le=MAX_SPAN_SEC, description="TimeoutStartSec=, seconds; above the cold start")
    timeout_stop_sec: int = Field(120, ge=5, le=MAX_SPAN_SEC, description="TimeoutStopSec=, seconds")
    restart_sec: int = Field(30, ge=1, le=MAX_SPAN_SEC, description="RestartSec=, seconds between restarts")
    start_limit_burst: int = Field(3, ge=1, le=UINT_MAX, description="StartLimitBurst= within StartLimitIntervalSec=")
    start_limit_interval_sec: int = Field(7200, ge=60, le=MAX_SPAN_SEC, description="StartLimitIntervalSec=, seconds")
    limit_nofile: int = Field(1048576, ge=1024, le=1073741816, description="LimitNOFILE=")
    cache_dir: str | None = Field(None, description="persistent cache root (default /var/cache/<name>)")
    verify_patches: bool = Field(True, description="ExecStartPre= kimi-deploy patch verify")
    check_on_calendar: str = Field("*-*-* 03:00:00", description="OnCalendar= of the nightly check timer")

    @field_validator("name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        return check_service_name(v)

    @field_validator("user", "group")
    @classmethod
    def _posix(cls, v: str) -> str:
        if not POSIX_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid user/group name (lower case, digits, _ and -)")
        if v == "root":
            raise ValueError("the server must not run as root; use a dedicated system user such as sglang")
        return v

    @field_validator("python", "kimi_deploy", "cache_dir")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_abs_path(v)

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if any(c in v for c in "%$\\\"'"):
            raise ValueError(f"description {v!r} must not contain % $ \\ or quotes (systemd would expand them)")
        if not v.strip() or v != v.strip():
            raise ValueError(f"description {v!r} must be non-empty without leading or trailing spaces "
                             "(systemd strips them)")
        return v

    @field_validator("check_on_calendar")
    @classmethod
    def _calendar(cls, v: str) -> str:
        if not CALENDAR.fullmatch(v):
            raise ValueError(f"OnCalendar value {v!r} has characters systemd calendar specs do not use "
                             "(or leading/trailing spaces)")
        return v


def _option_field(option: Option) -> tuple[Any, Any]:
    """``(annotation, FieldInfo)`` of one row of :data:`kimi_deploy.options.OPTIONS` for ``create_model``."""
    if isinstance(option.default, type):
        return option.annotation, Field(default_factory=option.default, description=option.help, **option.bounds)
    return option.annotation, Field(option.default, description=option.help, **option.bounds)


#: A Prometheus label name (Prometheus data model: ``[a-zA-Z_][a-zA-Z0-9_]*``; ``__`` prefixes are reserved).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Labels the rendered scrape config and rules set themselves (a ``[monitoring] labels`` key may not be one).
RESERVED_LABELS = frozenset({"job", "instance", "severity", "service", "alertname", "le", "quantile"})
#: A job name: it is quoted inside PromQL and YAML, so a conservative character set.
JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")
#: A runbook base URL or path: no spaces, quotes, ``#`` (the kit appends ``#anchor``) or template braces.
RUNBOOK = re.compile(r"[A-Za-z0-9_@+=:,./~%?&;-]{1,2000}")


def check_scrape_target(value: str) -> str:
    """``value`` when it is ``host:port`` or ``[ipv6]:port`` with a port 1-65535, else ValueError."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ValueError(f"scrape target {value!r}: brackets are for IPv6 addresses only")
    elif ":" in host:
        raise ValueError(f"scrape target {value!r}: write an IPv6 address in brackets, e.g. [::1]:9100")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"scrape target {value!r} is not HOST:PORT with a port 1-65535 (e.g. 10.0.0.5:30000)")
    try:
        check_host(host)
    except ValueError as exc:
        raise ValueError(f"scrape target {value!r}: {exc}") from None
    return value


def _job(v: str | None) -> str | None:
    if v is not None and not JOB_NAME.fullmatch(v):
        raise ValueError(f"job name {v!r}: use letters, digits and _.:- (at most 128, not starting with . : -)")
    return v


class SLO(_Section):
    """``[monitoring.slo]``: p99 latency limits in milliseconds, the keys of ``bench --slo`` (ttft, tpot, e2e).

    ``ttft`` bounds SGLang's ``sglang:time_to_first_token_seconds``, ``tpot`` its
    ``sglang:inter_token_latency_seconds``, ``e2e`` its ``sglang:e2e_request_latency_seconds``;
    ``e2e`` has no default (output lengths vary too much for one); without it no E2E alert is rendered.
    """

    ttft: float = Field(2000.0, gt=0, le=3_600_000, allow_inf_nan=False,
                               description="p99 time to first token, ms")
    tpot: float = Field(100.0, gt=0, le=3_600_000, allow_inf_nan=False,
                               description="p99 inter-token latency, ms")
    e2e: float | None = Field(None, gt=0, le=86_400_000, allow_inf_nan=False,
                              description="p99 end-to-end request latency, ms")


class Monitoring(_Section):
    """``[monitoring]``: Prometheus job names, target addresses, labels and alert thresholds.

    Rendered by :mod:`kimi_deploy.targets.monitoring` into a scrape configuration, recording and alert rules
    and a Grafana dashboard; defaults that depend on other tables are resolved there.
    """

    job: str | None = Field(None, description="job of the SGLang server(s) (default: the service name)")
    targets: list[str] = Field(default_factory=list,
                               description="HOST:PORT of each server's /metrics (default: the profile's host:port)")
    check_job: str | None = Field(None, description="job of the check textfile (default <name>-check)")
    node_exporter: str = Field("127.0.0.1:9100", description="HOST:PORT of node_exporter reading check.prom")
    gateway: str | None = Field(None, description="HOST:PORT of SGLang's gateway (smg) metrics; none: no gateway")
    gateway_job: str | None = Field(None, description="job of the gateway (default <name>-gateway)")
    scrape_interval_s: int = Field(15, ge=1, le=3600, description="scrape_interval of the rendered jobs, seconds")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels on every target and alert")
    slo: SLO = Field(default_factory=SLO, description="p99 latency SLOs, ms")
    slo_for_minutes: int = Field(10, ge=1, le=1440, description="how long a p99 stays over its SLO before paging")
    check_max_age_hours: int = Field(26, ge=1, le=24 * 14, description="the nightly check is stale after this")
    running_limit: int | None = Field(None, ge=1, description="running requests that mean 'at the limit' "
                                      "(default: sglang.max_running_requests, 48 with EAGLE)")
    aborted_ratio: float = Field(0.05, gt=0, le=1, allow_inf_nan=False,
                                 description="aborted / all requests over 10 min that alerts")
    spec_accept_length_min: float | None = Field(None, ge=1, le=64, allow_inf_nan=False,
                                                 description="mean accepted tokens per step below which "
                                                             "speculative decoding has collapsed (default 1.5)")
    runbook_url: str = Field("production.md", description="where production.md is read; alerts link to anchors")

    @field_validator("job", "check_job", "gateway_job")
    @classmethod
    def _jobs(cls, v: str | None) -> str | None:
        return _job(v)

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        for target in v:
            check_scrape_target(target)
        if len(set(v)) != len(v):
            raise ValueError("a target is listed twice; list each server once")
        return v

    @field_validator("node_exporter", "gateway")
    @classmethod
    def _target(cls, v: str | None) -> str | None:
        return None if v is None else check_scrape_target(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"label name {name!r}: letters, digits and _, not starting with a digit or __")
            if name in RESERVED_LABELS:
                raise ValueError(f"label {name!r} is set by the kit itself; choose another name")
            if not value or len(value) > 255:
                raise ValueError(f"label {name}: the value must be 1-255 characters")
            if "{{" in value or "}}" in value:
                raise ValueError(f"label {name}: {value!r} has {{{{ or }}}}, which Prometheus expands as a template "
                                 "in alert labels; remove them")
        return v

    @field_validator("runbook_url")
    @classmethod
    def _runbook(cls, v: str) -> str:
        if not RUNBOOK.fullmatch(v):
            raise ValueError(f"runbook_url {v!r}: a URL or path without spaces, quotes, braces or '#' "
                             "(the kit appends #anchor)")
        return v


#: A network interface name as Linux accepts it (IFNAMSIZ 16 with the NUL; no '/', ':' or whitespace), not
#: starting with '-' or '.' (nor NCCL's '^'/'=' prefixes: the kit sets one exact NIC).
IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}")
#: A policy name of smg's ``--policy`` (the pinned smg's ``--help`` lists the valid ones; ``validate`` checks).
POLICY = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: A release number of smg (PEP 440 public versions as smg publishes them: 1.13.0, 1.13.0rc1, 1.13.0.post1).
SMG_VERSION = re.compile(r"\d+(?:\.\d+){1,3}(?:(?:a|b|rc)\d+)?(?:\.post\d+)?")
#: Most replicas and nodes per replica a fleet may list (a bound on hostile input, far above real fleets).
MAX_REPLICAS = 256
MAX_NODES = 64


class Replica(_Section):
    """One ``[[fleet.replicas]]`` entry: the nodes of one full copy of the model, in rank order.

    One node: a single-host replica. N nodes: an N-rank SGLang group (``--nnodes N``; ``nodes[0]`` is rank 0,
    the only rank that serves HTTP and the ``--dist-init-addr`` host). Worker URL:
    ``http://{nodes[0]}:{[sglang] port}`` (:meth:`Profile.worker_urls`).
    """

    nodes: list[Host] = Field(..., min_length=1, max_length=MAX_NODES,
                              description="the replica's hosts (IP address or host name), rank 0 first")


class Fleet(_Section):
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


class Gateway(_Section):
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


#: A Kubernetes object name that must be an RFC 1035 label (Service, Namespace): lower case, digits and ``-``,
#: starting with a letter, at most 63 characters (Kubernetes ``validation.IsDNS1035Label``).
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
#: A container image reference with a tag or a digest (``registry/repo:tag``, ``repo@sha256:...``).
IMAGE = re.compile(r"(?P<repo>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                   r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
#: A Kubernetes resource quantity as the kit writes them (``64Gi``, ``500Mi``; apimachinery ``resource.Quantity``).
QUANTITY = re.compile(r"[1-9][0-9]{0,6}(Ki|Mi|Gi|Ti)")
#: A command name found on PATH (no ``/``; not starting with ``-`` or ``.``).
COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
#: A five-field cron schedule (CronJob ``spec.schedule``): digits, ``*``, ``,``, ``-``, ``/`` per field.
CRON = re.compile(r"[0-9*,/-]+( [0-9*,/-]+){4}")
#: A label key (optional DNS prefix, then a name of 1-63 characters) and value (Kubernetes label syntax).
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def check_dns_label(v: str, what: str = "name") -> str:
    """``v`` when it is an RFC 1035 label (:data:`DNS_LABEL`), else ValueError with a suggestion."""
    if not DNS_LABEL.fullmatch(v):
        fixed = re.sub(r"[^a-z0-9-]+", "-", v.lower()).strip("-")[:63] or "kimi"
        raise ValueError(f"{what} {v!r} is not a DNS label (lower case letters, digits and '-', starting with a "
                         f"letter, at most 63 characters), which Kubernetes requires; e.g. {fixed!r}")
    return v


#: Bounds of the five numeric cron fields (robfig/cron, which Kubernetes' CronJob controller uses; 7 is Sunday too).
CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))


def check_cron(v: str) -> str:
    """``v`` when it is five numeric cron fields within their bounds (``*``, ``N``, ``N-M``, lists, ``/STEP``)."""
    fields = v.split(" ")
    if not CRON.fullmatch(v) or len(fields) != 5:
        raise ValueError(f"schedule {v!r} is not five cron fields (minute hour day month weekday), e.g. \"0 3 * * *\"")
    for text, (what, low, high) in zip(fields, CRON_FIELDS):
        for item in text.split(","):
            base, slash, step = item.partition("/")
            numbers = [] if base == "*" else base.split("-")
            ok = (base == "*" or 1 <= len(numbers) <= 2) and all(n.isdigit() for n in numbers) and \
                (not slash or step.isdigit() and int(step) >= 1)  # "*/" and "0/" have no step
            if not ok or any(not low <= int(n) <= high for n in numbers) or \
                    (len(numbers) == 2 and int(numbers[0]) > int(numbers[1])):
                raise ValueError(f"schedule {v!r}: {what} {item!r} is not * or numbers {low}-{high} "
                                 "(N, N-M, lists with ',', steps with '/')")
    return v


def check_image(v: str) -> str:
    """``v`` when it names an image by a pinned tag or digest; ``latest`` and a missing tag are refused."""
    match = IMAGE.fullmatch(v)
    if not match:
        raise ValueError(f"image {v!r} is not an image reference (registry/repository:tag or @sha256:digest)")
    if not match["tag"] and not match["digest"]:
        raise ValueError(f"image {v!r} has no tag: the node would pull whatever 'latest' is that day; pin a release "
                         "tag such as lmsysorg/sglang:v0.5.23-cu130 (or a @sha256: digest)")
    if match["tag"] == "latest":
        raise ValueError(f"image {v!r} uses the moving tag 'latest'; pin a release tag or a @sha256: digest")
    return v


class Kubernetes(_Section):
    """``[kubernetes]``: how ``render --target kubernetes`` turns the profile into LeaderWorkerSet manifests.

    Absent: no Kubernetes rendering (``render --target kubernetes`` says to add it). Names are Kubernetes
    object names (RFC 1035 labels); images are pinned by tag or digest; sizes are quantities (``64Gi``).
    Cross-field rules that need the other tables are :func:`kimi_deploy.targets.kubernetes.problems`.
    """

    image: str = Field(..., description="SGLang image with a pinned tag, e.g. lmsysorg/sglang:v0.5.23-cu130")
    python: str = Field("python3", description="SGLang's interpreter inside the image (a name on PATH or a path)")
    namespace: str = Field("kimi-deploy", description="namespace of every object")
    name: str | None = Field(None, description="object name prefix (default: [service] name, if a DNS label)")
    node_gpus: int = Field(8, ge=1, le=64, description="GPUs each node of the node type has (nvidia.com/gpu)")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of the SGLang pods")
    model_volume: Literal["hostPath", "pvc"] = Field("hostPath", description="where the weights come from")
    model_host_path: str | None = Field(None, description="hostPath: the node's model folder (default model_mount)")
    model_claim: str | None = Field(None, description="pvc: the PersistentVolumeClaim holding the weights")
    model_mount: str = Field("/models", description="where the weights are mounted (read-only) in the pod; "
                                                   "must hold [sglang] model_path")
    shm_size: str = Field("64Gi", description="size limit of /dev/shm (memory-backed emptyDir)")
    cache_host_path: str | None = Field(None, description="node folder for the compile caches (kept across pod "
                                                          "restarts; owned by run_as_user); default: an emptyDir")
    nic: str = Field("eth0", description="the pod's data NIC (NCCL/GLOO_SOCKET_IFNAME) for multi-node groups")
    secret_name: str | None = Field(None, description="Secret holding the API key as key 'api-key' "
                                                      "(default <name>-api-key)")
    run_as_user: int = Field(1000, ge=1, le=2**31 - 1, description="non-root UID of every container")
    rdma: bool = Field(False, description="hostNetwork for RDMA NICs (the only reason the pods leave the pod network)")
    gateway_image: str | None = Field(None, description="image with the pinned smg (needed with [gateway])")
    gateway_python: str = Field("python3", description="the interpreter smg is installed in inside gateway_image "
                                                       "(a name on PATH or a path)")
    check_image: str | None = Field(None, description="image with the pinned kimi-deploy for the nightly check CronJob")
    check_schedule: str = Field("0 3 * * *", description="cron schedule of the nightly check (cluster time zone)")
    check_report_claim: str | None = Field(None, description="PVC the check writes check-report.json to "
                                                             "(default: a 1Gi claim <name>-check-reports is rendered)")

    @field_validator("image", "gateway_image", "check_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else check_image(v)

    @field_validator("namespace", "name", "secret_name", "model_claim", "check_report_claim")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v)

    @field_validator("python", "gateway_python")
    @classmethod
    def _python(cls, v: str) -> str:
        """An absolute path, or a command name looked up on the image's PATH (no ``/``: a relative path
        would depend on the container's working directory; no leading ``-`` or ``.``)."""
        if v.startswith("/"):
            return check_abs_path(v, "python")
        if not COMMAND_NAME.fullmatch(v):
            raise ValueError(f"python {v!r} is neither an absolute path nor a command name on PATH (letters, "
                             "digits and _.+-, not starting with - or .), e.g. python3 or /opt/venv/bin/python")
        return v

    @field_validator("model_host_path", "model_mount", "cache_host_path")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_abs_path(v)

    @field_validator("shm_size")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not QUANTITY.fullmatch(v):
            raise ValueError(f"size {v!r} is not a quantity such as 64Gi or 512Mi (Ki, Mi, Gi, Ti)")
        return v

    @field_validator("nic")
    @classmethod
    def _nic(cls, v: str) -> str:
        if not IFNAME.fullmatch(v) or v in (".", ".."):
            raise ValueError(f"nic {v!r} is not a network interface name (at most 15 of letters, digits, _.-)")
        return v

    @field_validator("check_schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value) or len(value) > 63:
                raise ValueError(f"node_selector {key} = {value!r} is not a Kubernetes label key and value")
        return v


#: ``[sglang]``: SGLang server arguments under their own names (SGLang 0.5.23), one field per row of
#: :data:`kimi_deploy.options.OPTIONS` in table order (types, defaults, bounds and help come from there).
SGLang: type[_Section] = create_model(  # type: ignore[call-overload]
    "SGLang", __base__=_Section, __module__=__name__,
    **{option.key: _option_field(option) for option in OPTIONS},
)
SGLang.__doc__ = "``[sglang]``: SGLang server arguments under their own names (rows of ``options.OPTIONS``)."


class Profile(BaseModel):
    """A whole deployment profile: ``[service]``, ``[sglang]``, ``[environment]``, ``[monitoring]``, and the
    optional ``[fleet]`` and ``[gateway]``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("environment", mode="before")
    @classmethod
    def _clean_env(cls, v: Any) -> Any:
        """The one rule for strings (:func:`check_text`) on ``[environment]`` names and values."""
        return check_text(v, "environment variable")

    service: Service = Field(default_factory=Service)
    sglang: SGLang
    environment: dict[str, str] = Field(default_factory=dict, max_length=MAX_ITEMS)
    monitoring: Monitoring = Field(default_factory=Monitoring)
    fleet: Fleet | None = None
    gateway: Gateway | None = None
    kubernetes: Kubernetes | None = None

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
            host = "[::1]"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.sglang.port}"

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
        here).
        """
        data = self.model_dump(mode="json")
        for table in DIGEST_OMITS_UNSET:
            if data.get(table) is None:
                data.pop(table, None)
        for option in OPTIONS:
            default = option.default() if isinstance(option.default, type) else option.default
            if option.key not in DIGEST_SGLANG_KEYS and data["sglang"].get(option.key) == default:
                del data["sglang"][option.key]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


#: Top-level tables that :meth:`Profile.digest` leaves out while absent (added after the first installs).
DIGEST_OMITS_UNSET: tuple[str, ...] = ("fleet", "gateway", "kubernetes")

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

#: Environment variables kimi-deploy owns; setting them in ``[environment]`` is an
#: error that names the profile field to use instead. Both halves are read off the option table: the rows'
#: variables (``owned_env``) and the cache variables (``CACHE_ENV``).
RESERVED_ENV = {
    **{name: f"[sglang] {key}" for name, key in owned_env().items()},
    **{var.name: "[service] cache_dir" for var in CACHE_ENV},
}

_SECTIONS: dict[str, type[BaseModel]] = {"service": Service, "sglang": SGLang, "monitoring": Monitoring,
                                          "fleet": Fleet, "gateway": Gateway, "kubernetes": Kubernetes}

#: Where a rank >= 1 of a multi-node group listens: it gets no ``--host``/``--port`` (serving options), so SGLang
#: 0.5.23 serves its dummy ``/health`` on its own defaults (``ServerArgs``: host 127.0.0.1, port 30000).
RANK_DUMMY_HEALTH = ("127.0.0.1", 30000)

#: Environment variables the kit sets on every rank of a multi-node replica from ``[fleet] nic``.
NIC_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def check_rules(profile: Profile) -> list[str]:
    """Cross-field rules; returns one ``location: problem; fix`` line per violation (empty: valid).

    Rules (sources: SGLang 0.5.23 ``srt/arg_groups/speculative_hook.py`` and the
    deployment notes): TP divides the GPU count; steps/topk/draft tokens come as a
    set with an algorithm; EAGLE needs a draft model; topk 1 means draft tokens =
    steps + 1 (SGLang silently rewrites it otherwise); spec v2 needs topk 1; a
    non-loopback host needs an API key unless ``allow_unauthenticated``.
    """
    s, svc = profile.sglang, profile.service
    problems: list[str] = []
    pp = s.pp_size or 1
    if profile.nodes_per_copy > 1:
        pass  # a multi-node group: fleet_problems requires tp_size * pp_size == gpu_count * nodes
    elif pp == 1 and (s.tp_size > svc.gpu_count or svc.gpu_count % s.tp_size):
        problems.append(
            f"sglang.tp_size: {s.tp_size} does not divide service.gpu_count = {svc.gpu_count}; "
            f"use a tp_size that divides {svc.gpu_count} (e.g. {svc.gpu_count}) or fix gpu_count")
    elif pp > 1 and (s.tp_size * pp > svc.gpu_count or svc.gpu_count % (s.tp_size * pp)):
        problems.append(
            f"sglang.pp_size: tp_size * pp_size = {s.tp_size} * {pp} = {s.tp_size * pp} GPUs does not divide "
            f"service.gpu_count = {svc.gpu_count}; use tp_size * pp_size = {svc.gpu_count} or fix gpu_count")
    spec = {"speculative_num_steps": s.speculative_num_steps,
            "speculative_eagle_topk": s.speculative_eagle_topk,
            "speculative_num_draft_tokens": s.speculative_num_draft_tokens}
    given = [k for k, v in spec.items() if v is not None]
    if given and len(given) != 3:
        missing = sorted(set(spec) - set(given))
        problems.append(
            f"sglang.{given[0]}: speculative steps, topk and draft tokens must be set together "
            f"(SGLang picks all three or none); set {', '.join(missing)} too, or remove {', '.join(given)}")
    if given and s.speculative_algorithm is None:
        problems.append("sglang.speculative_algorithm: speculative settings are given but no algorithm; "
                        "set speculative_algorithm = \"EAGLE3\"")
    if s.speculative_algorithm in ("EAGLE", "EAGLE3") and not s.speculative_draft_model_path:
        problems.append(f"sglang.speculative_draft_model_path: {s.speculative_algorithm} needs a draft model; "
                        "set the path of e.g. lightseekorg/kimi-k2.5-eagle3-mla")
    if (len(given) == 3 and s.speculative_eagle_topk == 1
            and s.speculative_num_draft_tokens != s.speculative_num_steps + 1):
        problems.append(
            f"sglang.speculative_num_draft_tokens: {s.speculative_num_draft_tokens} with topk 1 and "
            f"{s.speculative_num_steps} steps; SGLang would silently use steps + 1 = "
            f"{s.speculative_num_steps + 1}; set speculative_num_draft_tokens = {s.speculative_num_steps + 1}")
    if s.enable_spec_v2 and s.speculative_eagle_topk not in (None, 1):
        problems.append(
            f"sglang.enable_spec_v2: spec v2 (overlap scheduling) supports only speculative_eagle_topk = 1, "
            f"got {s.speculative_eagle_topk}; set speculative_eagle_topk = 1 or enable_spec_v2 = false")
    if s.enable_spec_v2 and s.disable_overlap_schedule:
        problems.append("sglang.enable_spec_v2: spec v2 is overlap scheduling, but disable_overlap_schedule = true; "
                        "drop one of the two")
    if s.enable_spec_v2 and s.speculative_algorithm is None:
        problems.append("sglang.enable_spec_v2: spec v2 applies to speculative decoding, but no "
                        "speculative_algorithm is set; set one or remove enable_spec_v2")
    if s.flashinfer_allreduce_fusion_backend and s.enforce_disable_flashinfer_allreduce_fusion:
        problems.append("sglang.flashinfer_allreduce_fusion_backend: set together with "
                        "enforce_disable_flashinfer_allreduce_fusion = true; keep one")
    if not profile.is_loopback and not s.api_key_file and not s.allow_unauthenticated:
        problems.append(
            f"sglang.host: {s.host} accepts connections from other machines but no api_key_file is set; "
            "set api_key_file = \"/etc/kimi-deploy/<name>.api-key\", bind host = \"127.0.0.1\", "
            "or set allow_unauthenticated = true")
    for key in profile.environment:
        if key in RESERVED_ENV:
            problems.append(f"environment.{key}: kimi-deploy sets this variable itself; use {RESERVED_ENV[key]}")
    problems += extra_args_problems(s.extra_args)
    problems += monitoring_problems(profile)
    problems += fleet_problems(profile)
    problems += gateway_problems(profile)
    return problems


def _is_wildcard(host: str) -> bool:
    """True for the addresses that mean "every address of this host" (``0.0.0.0``, ``::``)."""
    return host in ("0.0.0.0", "::")


def fleet_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[fleet]`` (empty without it); one ``location: problem; fix`` line each.

    Every replica has the same number of nodes (one shape: Kubernetes and the gateway treat replicas alike);
    no node twice; a multi-node group (SGLang 0.5.23 ``--nnodes``) needs ``dist_init_port`` and ``nic``, a
    non-loopback rank 0 (the other ranks connect to it) and ``tp_size * pp_size == gpu_count * nodes``
    (SGLang divides the world evenly across nodes); the multi-node keys are refused on single-node replicas;
    each serving node must be reachable at its worker URL, so ``[sglang] host`` is a wildcard or that node.
    """
    fleet = profile.fleet
    if fleet is None:
        return []
    s, svc = profile.sglang, profile.service
    problems: list[str] = []
    sizes = [len(r.nodes) for r in fleet.replicas]
    if len(set(sizes)) > 1:
        problems.append(f"fleet.replicas: the replicas have {', '.join(map(str, sizes))} nodes; every replica is "
                        f"one full copy of the model and needs the same number of nodes (e.g. {sizes[0]})")
    seen: dict[str, tuple[int, str]] = {}
    for index, replica in enumerate(fleet.replicas):
        for node in replica.nodes:
            why = not_one_host(node)
            if why:
                problems.append(f"fleet.replicas.{index}.nodes: {node} is not the address of one host ({why}); "
                                "list the node's own address or name")
            key = host_key(node)
            if key in seen:
                first, spelled = seen[key]
                where = "twice in the same replica" if first == index else f"in replicas {first} and {index}"
                alias = f" (as {spelled})" if spelled != node else ""
                problems.append(f"fleet.replicas.{index}.nodes: {node} is listed {where}{alias}; a host serves "
                                "one node of one replica, list each host once")
            else:
                seen[key] = (index, node)
    nodes = sizes[0]
    if nodes > 1:
        for key in ("dist_init_port", "nic"):
            if getattr(fleet, key) is None:
                example = "dist_init_port = 20000" if key == "dist_init_port" else 'nic = "ens5f0"'
                problems.append(f"fleet.{key}: required when a replica has more than one node ({nodes}); "
                                f"set e.g. {example}" + (" (the data NIC, see `ip -br addr`)" if key == "nic" else ""))
        for index, replica in enumerate(fleet.replicas):
            if is_loopback(replica.nodes[0]):
                problems.append(f"fleet.replicas.{index}.nodes: rank 0 is {replica.nodes[0]}, a loopback address "
                                "the other ranks cannot reach; list the address of rank 0's data NIC first")
        world, pp = s.tp_size * (s.pp_size or 1), s.pp_size or 1
        if world != svc.gpu_count * nodes:
            problems.append(f"sglang.tp_size: tp_size * pp_size = {s.tp_size} * {pp} = {world}, but {nodes} nodes "
                            f"of service.gpu_count = {svc.gpu_count} are {svc.gpu_count * nodes} GPUs; set "
                            f"tp_size * pp_size = {svc.gpu_count * nodes} (e.g. tp_size = {svc.gpu_count}, "
                            f"pp_size = {nodes}) or fix gpu_count")
        if fleet.dist_init_port is not None and fleet.dist_init_port == s.port:
            problems.append(f"fleet.dist_init_port: {fleet.dist_init_port} is also [sglang] port on rank 0; "
                            "choose another port, e.g. 20000")
    else:
        for key in ("dist_init_port", "nic", "dist_timeout"):
            if getattr(fleet, key) is not None:
                problems.append(f"fleet.{key}: applies to multi-node replicas only, and every replica has one node; "
                                "remove it")
    for index, replica in enumerate(fleet.replicas):
        node = replica.nodes[0]
        if not _is_wildcard(s.host) and s.host != node:
            problems.append(f"sglang.host: {s.host} on replica {index}, whose worker URL is "
                            f"{node_url(node, s.port)}; in a fleet set host = \"0.0.0.0\" (each node's own "
                            f"addresses) or list {s.host} as that replica's node")
            break
    if nodes > 1:
        for key in NIC_ENV:
            if key in profile.environment:
                problems.append(f"environment.{key}: the kit sets it on every rank from [fleet] nic; "
                                "remove it and set nic")
    return problems


def gateway_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[gateway]`` (empty without it); one ``location: problem; fix`` line each.

    The gateway needs replicas to route to (``[fleet]``); its port, its metrics port and, on a host that
    is also a node, SGLang's port and the rendezvous port are distinct; it uses ``[sglang] api_key_file``
    (one key end to end), so a non-loopback ``bind`` without a key needs ``allow_unauthenticated`` as the
    server does; the workers must accept connections from the gateway's host.
    """
    gw = profile.gateway
    if gw is None:
        return []
    s, fleet = profile.sglang, profile.fleet
    problems: list[str] = []
    if fleet is None:
        problems.append("gateway: a gateway routes to replicas, but there is no [fleet]; add [fleet] with "
                        "[[fleet.replicas]] nodes = [\"HOST\"] for each server, or remove [gateway]")
    if gw.port == gw.prometheus_port and gw.bind == gw.prometheus_host:
        problems.append(f"gateway.prometheus_port: {gw.prometheus_port} is also gateway.port; "
                        "choose another port, e.g. 29000")
    elif gw.port == gw.prometheus_port:
        problems.append(f"gateway.prometheus_port: {gw.prometheus_port} is also gateway.port on the same host; "
                        "choose another port, e.g. 29000")
    why = not_one_host(gw.host)
    if why:
        problems.append(f"gateway.host: {gw.host} is not the address of one host ({why}); name the machine that "
                        "runs the gateway (its address or name) and set bind for the addresses it listens on")
    gw_key = host_key(gw.host)
    nodes = [host_key(node) for nodes in profile.replicas for node in nodes]
    if gw_key in nodes:
        serving = gw_key in [host_key(r[0]) for r in profile.replicas]
        for key in ("port", "prometheus_port"):
            port = getattr(gw, key)
            if serving and port == s.port:
                problems.append(f"gateway.{key}: {port} is also [sglang] port on {gw.host}, which serves a "
                                f"replica; choose another port (e.g. {s.port + 1})")
            if fleet and fleet.dist_init_port == port and profile.nodes_per_copy > 1 and serving:
                problems.append(f"gateway.{key}: {port} is also [fleet] dist_init_port on {gw.host}; "
                                "choose another port")
    dummy_host, dummy_port = RANK_DUMMY_HEALTH
    for index, replica in enumerate(profile.replicas):
        rank = next((r for r, node in enumerate(replica) if r and host_key(node) == gw_key), None)
        for key, host in (("port", gw.bind), ("prometheus_port", gw.prometheus_host)):
            if rank is not None and getattr(gw, key) == dummy_port and (_is_wildcard(host) or host == dummy_host):
                problems.append(f"gateway.{key}: {dummy_port} on {gw.host} is where rank {rank} of replica {index} "
                                f"serves SGLang's dummy /health ({dummy_host}:{dummy_port}); choose another port "
                                f"(e.g. {dummy_port + 1})")
    if not is_loopback(gw.bind) and not s.api_key_file and not s.allow_unauthenticated:
        problems.append(
            f"gateway.bind: {gw.bind} accepts connections from other machines but [sglang] api_key_file is not "
            "set (the gateway uses the workers' key: one key end to end); set [sglang] api_key_file, bind "
            "\"127.0.0.1\", or set [sglang] allow_unauthenticated = true")
    remote = [node for node in (r[0] for r in profile.replicas) if host_key(node) != gw_key]
    if not is_loopback(gw.host):
        for index, replica in enumerate(profile.replicas):
            if is_loopback(replica[0]):
                problems.append(f"fleet.replicas.{index}.nodes: {replica[0]} is a loopback address, which the "
                                f"gateway on {gw.host} cannot reach (it would reach itself); list the node by an "
                                "address the gateway host reaches")
    if remote and is_loopback(s.host):
        problems.append(f"sglang.host: {s.host} accepts only local connections, but the gateway on {gw.host} "
                        f"reaches {remote[0]} over the network; set host = \"0.0.0.0\" with api_key_file")
    return problems


def monitoring_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[monitoring]``: thresholds that could never fire or always fire, clashing jobs."""
    s, m = profile.sglang, profile.monitoring
    problems: list[str] = []
    jobs = [j for j in (m.job or profile.service.name, m.check_job or f"{profile.service.name}-check",
                        (m.gateway_job or gateway_service(profile.service.name)) if m.gateway else None) if j]
    if len(set(jobs)) != len(jobs):
        problems.append(f"monitoring.job: the server, check and gateway jobs must differ, got {', '.join(jobs)}; "
                        "set job, check_job and gateway_job to distinct names")
    if m.gateway_job and not m.gateway:
        problems.append("monitoring.gateway_job: set without monitoring.gateway; set gateway = \"HOST:PORT\" of "
                        "smg's --prometheus-port, or remove gateway_job")
    if m.spec_accept_length_min is not None and s.speculative_algorithm is None:
        problems.append("monitoring.spec_accept_length_min: no speculative_algorithm is set, so SGLang reports no "
                        "accept length; remove it or enable speculative decoding")
    if (m.spec_accept_length_min is not None and s.speculative_num_draft_tokens is not None
            and m.spec_accept_length_min > s.speculative_num_draft_tokens):
        problems.append(f"monitoring.spec_accept_length_min: {m.spec_accept_length_min} is above "
                        f"speculative_num_draft_tokens = {s.speculative_num_draft_tokens}, the most a step can "
                        "accept, so the alert would always fire; use a value such as 1.5")
    if (m.running_limit is not None and s.max_running_requests is not None
            and m.running_limit > s.max_running_requests):
        problems.append(f"monitoring.running_limit: {m.running_limit} is above sglang.max_running_requests = "
                        f"{s.max_running_requests}, which SGLang never exceeds, so the queue alert could never "
                        "fire; remove running_limit or lower it")
    return problems


#: argparse's test for a negative number (``argparse._negative_number_matcher``): such an argument is a value.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def extra_args_problems(extra_args: list[str] | tuple[str, ...]) -> list[str]:
    """One ``sglang.extra_args: ...`` line per argument that would set what the kit owns (empty: fine).

    Owned: every flag of :data:`kimi_deploy.options.OPTIONS` in any release, its aliases and ``--api-key``/
    ``--admin-api-key``/``--config`` (:func:`kimi_deploy.options.owned_flags`), also as ``--flag=value`` and
    as any prefix argparse would expand to it (SGLang's parser has ``allow_abbrev``: ``--hos`` is ``--host``;
    in 0.5.23 no other option is a prefix of an owned flag, so every such prefix is an abbreviation of it
    or ambiguous). Also refused: ``--`` (ends option parsing) and single-dash options (``-h`` prints help
    and exits 0, which ``Restart=on-failure`` does not restart); negative numbers stay values.
    """
    owned = owned_flags()
    problems: list[str] = []
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if arg == "--":
            problems.append("sglang.extra_args: '--' would end SGLang's option parsing; remove it")
        elif name.startswith("--"):
            hits = expansions(name, owned)
            if not hits:
                continue
            keys = sorted({owned[flag] for flag in hits})
            if set(hits) & set(secret_flags()):
                problems.append(f"sglang.extra_args: {name} would put an API key on the command line, visible in "
                                "ps and logs; use api_key_file")
                continue
            spelled = hits[0] if len(hits) == 1 else f"one of {', '.join(hits)}"
            use = " or ".join(k if k.startswith("[") else f"[sglang] {k}" for k in keys)
            problems.append(f"sglang.extra_args: {arg!r} sets {spelled}, which the kit sets from the profile; "
                            f"use {use} instead")
        elif name.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(arg):
            problems.append(f"sglang.extra_args: {arg!r} is a single-dash option (SGLang has only -h, which prints "
                            "help and exits); spell options with --")
    return problems


def default_api_key_file(service_name: str) -> str:
    """The API key file a profile for ``service_name`` starts from: ``/etc/kimi-deploy/<name>.api-key``
    (``kimi-deploy init --name``; the warning of :func:`naming_warnings`)."""
    return service_api_key_file(service_name)


def naming_warnings(profile: "Profile") -> list[str]:
    """Warnings (not errors) for paths named after another service: ``api_key_file`` of the form
    ``/etc/kimi-deploy/<other>.api-key`` where ``<other>`` is not ``[service] name`` (a profile from
    ``init`` whose service was renamed; install would create a key file named after another service).
    Sharing one key file between services on purpose is allowed, hence a warning."""
    key = profile.sglang.api_key_file
    name = profile.service.name
    prefix, suffix = service_api_key_file("\0").split("\0")
    if not key or not key.startswith(prefix) or not key.endswith(suffix):
        return []
    other = key.removeprefix(prefix).removesuffix(suffix)
    if other == name or "/" in other:
        return []
    return [f"[sglang] api_key_file {key} is named after service {other!r}, not this service ({name!r}); "
            f"if the service was renamed, set api_key_file = \"{default_api_key_file(name)}\" (keep it only to share "
            "one key between services on purpose)"]


@functools.lru_cache(maxsize=64)
def calendar_problem(spec: str) -> str | None:
    """Why systemd would reject ``spec`` as ``OnCalendar=``, or None when it accepts it.

    Asks ``systemd-analyze calendar`` (the parser systemd itself uses) when it is on PATH;
    without it the spec is accepted here and ``systemd-analyze verify``/``install`` catch it.
    """
    from kimi_deploy import proc

    if proc.which("systemd-analyze") is None:
        return None
    done = proc.run(["systemd-analyze", "calendar", spec], check=False, timeout=30)
    if done.ok:
        return None
    reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["rejected"]
    return (f"systemd rejects {spec!r} ({reason[0]}); use a calendar spec such as \"*-*-* 03:00:00\" or \"daily\" "
            "(man systemd.time)")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The table model inside a field's annotation (``SLO``, ``list[Replica]``, ``Fleet | None``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """A hint for an unknown key at ``loc``: close names in the same section or the section that has it."""
    key = str(loc[-1])
    if len(loc) == 1:
        sections = [*_SECTIONS, "environment"]
        close = difflib.get_close_matches(key, sections, n=1)
        if close:
            return f"did you mean [{close[0]}]?"
        for section, model in _SECTIONS.items():
            if key in model.model_fields:
                return f"{key} belongs in the [{section}] table"
        return f"tables are [{'], ['.join(sections)}]"
    section = str(loc[0])
    model = _SECTIONS.get(section)
    if model is None:
        return "remove it"
    for part in loc[1:-1]:  # a nested table such as [monitoring.slo] or [[fleet.replicas]]
        if isinstance(part, int):
            continue  # the index of an array of tables
        field = model.model_fields.get(str(part))
        nested = _model_of(field.annotation) if field is not None else None
        if nested is None:
            return "remove it"
        model, section = nested, f"{section}.{part}"
    close = difflib.get_close_matches(key, model.model_fields, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    for other, other_model in _SECTIONS.items():
        if other != section and key in other_model.model_fields:
            return f"{key} belongs in the [{other}] table"
    return f"valid keys of [{section}]: {', '.join(model.model_fields)}"


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "profile"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key ({_did_you_mean(loc)})"
    if err["type"] == "missing":
        return f"{where}: required, but missing"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] not in ("value_error",) and not isinstance(value, (dict, list)):
        return f"{where}: {msg} (got {value!r})"
    return f"{where}: {msg}"


def parse_profile(data: dict[str, Any], *, source: str = "profile") -> Profile:
    """Validate a profile given as a dict (the parsed TOML).

    Raises:
        ProfileError: one line per problem (pydantic's and :func:`check_rules`), exit 2.
    """
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e) for e in exc.errors(include_url=False)]
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the keys above; `kimi-deploy init` writes a commented example") from None
    problems = check_rules(profile)
    calendar = calendar_problem(profile.service.check_on_calendar)
    if calendar:
        problems.append(f"service.check_on_calendar: {calendar}")
    if problems:
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the settings above")
    return profile


#: Byte-order marks an editor may put first (Notepad's "UTF-8 with BOM" and "Unicode"): TOML is UTF-8 without one.
_BOMS = ((b"\xef\xbb\xbf", "a UTF-8 byte-order mark (BOM)"), (b"\xff\xfe", "a UTF-16 byte-order mark (UTF-16 text)"),
         (b"\xfe\xff", "a UTF-16 byte-order mark (UTF-16 text)"))


def _profile_text(data: bytes, path: Path) -> str:
    """``data`` as text: UTF-8 without a byte-order mark, as TOML 1.0 requires.

    Raises:
        ProfileError: a BOM first (tomllib's own words were "Invalid statement (at line 1, column 1)"), or bytes
            that are not UTF-8, with the line and column of the first (exit 2).
    """
    for bom, what in _BOMS:
        if data.startswith(bom):
            fix = (f"save it as UTF-8 without BOM (`sed -i '1s/^\\xEF\\xBB\\xBF//' {path}`)" if len(bom) == 3 else
                   f"save it as UTF-8 (`iconv -f UTF-16 -t UTF-8 {path} > {path}.utf8`, then move it over {path})")
            raise ProfileError(f"{path} starts with {what}; a TOML profile is UTF-8 without one", value=str(path),
                               hint=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ProfileError(f"{path} is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column}",
                           value=str(path),
                           hint=f"save it as UTF-8 (from Latin-1: `iconv -f LATIN1 -t UTF-8 {path} > {path}.utf8`, "
                                f"then move it over {path})") from None


def load_profile(path: Path) -> Profile:
    """Read and validate a TOML profile file.

    Raises:
        ProfileError: the file is missing, a directory, unreadable, not UTF-8 (or with a byte-order mark),
            not TOML, or not a valid profile (exit 2).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError("profile file not found", value=str(path),
                           hint="give the path of a TOML profile, or create one with `kimi-deploy init`") from None
    except IsADirectoryError:
        raise ProfileError("the profile is a directory", value=str(path),
                           hint="give the path of the TOML file inside it, e.g. /etc/kimi-deploy/kimi-k25.toml") from None
    except OSError as exc:
        raise ProfileError(f"cannot read the profile: {exc.strerror or exc}", value=str(path),
                           hint="run as a user that can read it (profiles under /etc/kimi-deploy are root's)") from None
    text = _profile_text(raw, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path} is not valid TOML: {exc}", value=str(path),
                           hint="fix the TOML syntax at the line and column shown") from None
    return parse_profile(data, source=str(path))


def toml_value(value: Any) -> str:
    """One value (str, bool, int, float, list of those) as one line of TOML text, encoded by ``tomli_w``."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def dump_profile(profile: Profile) -> str:
    """The profile as canonical TOML: every value after defaults, unset (``None``) ones left out.

    Loading the text with :func:`parse_profile` gives a profile with the same :meth:`Profile.digest`.
    """
    data = profile.model_dump(mode="json")
    tables = {table: {k: v for k, v in data[table].items() if v is not None} for table in ("service", "sglang")}
    tables["environment"] = data["environment"]
    monitoring = {k: v for k, v in data["monitoring"].items() if v is not None and k != "slo"}
    monitoring["slo"] = {k: v for k, v in data["monitoring"]["slo"].items() if v is not None}
    tables["monitoring"] = monitoring
    if data["fleet"] is not None:
        fleet = {k: v for k, v in data["fleet"].items() if v is not None and k != "replicas"}
        fleet["replicas"] = data["fleet"]["replicas"]
        tables["fleet"] = fleet
    if data["gateway"] is not None:
        tables["gateway"] = data["gateway"]
    if data.get("kubernetes") is not None:
        tables["kubernetes"] = {k: v for k, v in data["kubernetes"].items() if v is not None}
    return tomli_w.dumps(tables)
