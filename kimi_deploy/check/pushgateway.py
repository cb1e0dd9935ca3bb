"""Push the check's Prometheus text to a Prometheus Pushgateway: how a check that runs as a Kubernetes Job (no
node_exporter textfile directory to write into) makes its result a metric an alert can read.

``PUT <url>/metrics/job/<job>/service/<service>`` (the Pushgateway's HTTP API, prometheus/pushgateway README
"API": PUT replaces every metric of the group) with the text exposition :func:`kimi_deploy.check.reports.
to_prometheus` writes. The group's ``job`` is the check's Prometheus job (``[monitoring] check_job``, default
``<service>-check``), the one the alert rules select, so a Prometheus that scrapes the Pushgateway with
``honor_labels: true`` (what the Pushgateway's README asks for) sees the series under that job.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx

#: Bound on one push (seconds): a Pushgateway answers in milliseconds; a hang must not keep the Job running.
PUSH_TIMEOUT_S = 30.0


class PushError(Exception):
    """The Pushgateway did not take the push; ``str(exc)`` says what it answered or why nothing did."""


def group_url(url: str, job: str, service: str | None) -> str:
    """``<url>/metrics/job/<job>[/service/<service>]``, each value percent-encoded (no ``/`` in either)."""
    path = f"/metrics/job/{quote(job, safe='')}" + (f"/service/{quote(service, safe='')}" if service else "")
    return url.rstrip("/") + path


def push(url: str, job: str, service: str | None, text: str, *, timeout: float = PUSH_TIMEOUT_S) -> str:
    """PUT ``text`` as the group ``job``/``service`` of the Pushgateway at ``url``; returns the group's URL.

    Raises:
        PushError: no answer, or a non-2xx answer (its status and first 200 bytes).
    """
    target = group_url(url, job, service)
    try:
        response = httpx.put(target, content=text.encode(), timeout=timeout, follow_redirects=False,
                             headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    except httpx.HTTPError as exc:
        raise PushError(f"{target}: {type(exc).__name__}: {exc}") from None
    if not 200 <= response.status_code < 300:
        raise PushError(f"{target}: HTTP {response.status_code}: {response.text[:200]!r}")
    return target
