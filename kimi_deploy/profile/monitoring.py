"""``[monitoring]`` and ``[monitoring.slo]``: Prometheus jobs, targets, labels and alert thresholds.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from kimi_deploy.profile.base import Section
from kimi_deploy.values import check_host


#: A Prometheus label name (Prometheus data model: ``[a-zA-Z_][a-zA-Z0-9_]*``; ``__`` prefixes are reserved).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Labels the rendered scrape config and rules set themselves (a ``[monitoring] labels`` key may not be one).
RESERVED_LABELS = frozenset({"job", "instance", "severity", "service", "alertname", "le", "quantile"})
#: A job name: it is quoted inside PromQL and YAML, so a conservative character set.
JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")
#: A runbook base URL or path: no spaces, quotes, ``#`` (the kit appends ``#anchor``) or template braces.
RUNBOOK = re.compile(r"[A-Za-z0-9_@+=:,./~%?&;-]{1,2000}")
#: ``[monitoring] runbook_url``'s default: the runbook's path in the repository (alerts link to its anchors).
RUNBOOK_DEFAULT = "docs/runbook.md"
#: Schemes of an absolute ``runbook_url``: what Alertmanager, PagerDuty and Grafana open from a notification.
RUNBOOK_SCHEMES = ("https://", "http://")


def runbook_is_absolute(url: str) -> bool:
    """Whether ``url`` is an absolute http(s) URL with a host (a relative ``docs/runbook.md`` is dead in a
    notification: nothing there knows which repository it is relative to)."""
    scheme = next((s for s in RUNBOOK_SCHEMES if url.lower().startswith(s)), None)
    return scheme is not None and len(url) > len(scheme) and url[len(scheme)] not in "/?"


def runbook_problem(url: str, *, refuse: bool) -> str:
    """The ``monitoring.runbook_url: problem; fix`` line of a relative ``url`` (``refuse``: for a fleet or a
    cluster, where the alerts reach people who never saw this repository)."""
    return (f"monitoring.runbook_url: {url!r} is relative, so every alert's runbook link is dead in Alertmanager, "
            "PagerDuty or Grafana" + (" (refused for a fleet or a cluster)" if refuse else "")
            + "; set runbook_url to the absolute URL your team reads docs/runbook.md at (e.g. "
              "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md)")


#: The default the first installed profiles had, before the runbook moved to docs/: :meth:`Profile.digest` hashes
#: :data:`RUNBOOK_DEFAULT` as this, so the runbook's move changes no profile's digest and no rendered header.
RUNBOOK_DEFAULT_DIGESTED = "production.md"



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


class SLO(Section):
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


class Monitoring(Section):
    """``[monitoring]``: Prometheus job names, target addresses, labels and alert thresholds.

    Rendered by :mod:`kimi_deploy.targets.prometheus` into a scrape configuration, recording and alert rules
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
    runbook_url: str = Field(RUNBOOK_DEFAULT, description="the absolute URL docs/runbook.md is read at; alerts link to "
                             "its anchors (relative: render warns, refuses for a fleet or cluster)")

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
