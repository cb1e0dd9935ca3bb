"""The stable check ids, their order, and selection by ``--only``/``--skip`` globs.

Ids are dotted, tier first: ``health.*``, ``config.*``, ``contract.<case>[.<variant>].<mode>``
(mode ``nonstream`` or ``stream``), ``contract.malformed`` and ``parser.<group>.<case>`` (raw
outputs posted to the server's own parsers, :mod:`kimi_deploy.check.parser`) and ``quality.*`` (the quality tier,
:mod:`kimi_deploy.check.quality`: off unless asked for). They are part of the report
format (``kimi-deploy.check/1``): scripts and alerts select on them, so they never change
meaning; new checks get new ids.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from kimi_deploy.check import concurrency, contract, followup, health, parser, prefix_cache
from kimi_deploy.check.quality import tier as quality
from kimi_deploy.errors import UsageError


def all_ids() -> list[str]:
    """Every check id in run order: health, config, parser, contract (``contract.prefix_cache``, ``contract.followup.*``, then
    ``contract.concurrency.*`` last), quality."""
    return (list(health.CHECKS) + parser.check_ids() + contract.check_ids() + [prefix_cache.CHECK_ID]
            + followup.check_ids()
            + concurrency.check_ids() + quality.check_ids())


def tier(check_id: str) -> str:
    """``health``, ``config``, ``parser``, ``contract`` or ``quality``."""
    return check_id.split(".", 1)[0]


def select(only: Iterable[str] = (), skip: Iterable[str] = (), *, quality: bool = False) -> list[str]:
    """The ids matching any ``only`` glob (all when empty) and no ``skip`` glob, in run order.

    A glob may also name a whole prefix without ``*`` (``contract.tool_auto`` selects both modes).
    Without ``only``, the ``quality.*`` tier is left out unless ``quality`` is true (``--sample``/``--dataset``
    ask for it): it sends hundreds of requests, the fast tiers a few dozen.

    Raises:
        UsageError: a glob matches no check id (a typo would silently check nothing).
    """
    ids = all_ids()

    def matches(pattern: str, check_id: str) -> bool:
        return fnmatch.fnmatchcase(check_id, pattern) or check_id.startswith(pattern.rstrip(".") + ".")

    only, skip = [p for p in only if p], [p for p in skip if p]
    for pattern in [*only, *skip]:
        if not any(matches(pattern, i) for i in ids):
            raise UsageError(f"no check id matches {pattern!r}", value=pattern,
                             hint="use globs over the ids `kimi-deploy check --list` prints, e.g. 'health.*', "
                                  "'contract.id_roundtrip.*'")
    chosen = [i for i in ids if any(matches(p, i) for p in only)] if only else \
        [i for i in ids if quality or tier(i) != "quality"]
    return [i for i in chosen if not any(matches(p, i) for p in skip)]
