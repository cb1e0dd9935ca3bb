"""smg's worker list on the wire (``GET /workers``): what the gateway client (:mod:`kimi_deploy.host.gateway`)
and ``check --each-worker`` (:mod:`kimi_deploy.check.workers`) read, in one parser."""

from __future__ import annotations

import dataclasses
from typing import Any

from kimi_deploy.wire.limits import Refused


def _worker(item: Any) -> Worker:
    """One entry of smg's ``GET /workers`` list as a :class:`Worker`.

    Raises:
        ValueError: not an object with string ``id`` and ``url``, string ``status``, boolean ``is_healthy`` and
            a whole-number ``load`` (when present).
    """
    if not isinstance(item, dict):
        raise ValueError(f"a worker entry is {type(item).__name__}, not an object")
    fields = {k: item.get(k) for k in ("id", "url", "status")}
    if not all(isinstance(v, str) and v for v in fields.values()):
        raise ValueError(f"a worker entry lacks a string id, url or status: {fields}")
    healthy, load = item.get("is_healthy"), item.get("load", 0)
    if not isinstance(healthy, bool):
        raise ValueError(f"is_healthy of {fields['url']} is {healthy!r}, not true or false")
    if load is None:
        load = 0
    if isinstance(load, bool) or not isinstance(load, int) or load < 0:
        raise ValueError(f"load of {fields['url']} is {load!r}, not a count of requests")
    return Worker(id=fields["id"], url=fields["url"], status=fields["status"], healthy=healthy, load=load)


def parse_workers(data: Any) -> list[Worker]:
    """smg's ``GET /workers`` answer ``{"workers": [{"id", "url", "status", "is_healthy", "load"}, ...], ...}``,
    as :func:`kimi_deploy.wire.http.request_capped` read it (parsed JSON; None when it was not JSON; a
    :class:`kimi_deploy.wire.limits.Refused` when it was refused unread).

    Raises:
        ValueError: not that answer (the message says what is wrong).
    """
    if isinstance(data, Refused):
        raise ValueError(str(data))
    if data is None:
        raise ValueError("not JSON")
    items = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("no \"workers\" list")
    return [_worker(item) for item in items]


@dataclasses.dataclass(frozen=True)
class Worker:
    """One worker as the gateway lists it: ``id``, ``url``, ``status`` (``ready``, ``pending``, ``draining``,
    ...), ``healthy`` and ``load`` (in-flight requests)."""

    id: str
    url: str
    status: str
    healthy: bool
    load: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
