"""The ``quality.*`` check ids and their dispatch.

Ids: ``quality.schema.<shape>.<choice>.<mode>`` (:mod:`.conformance`). The tier is off unless asked for
(``--only 'quality.*'``, or ``--sample``/``--dataset``): :func:`kimi_deploy.check.registry.select` leaves it out
of a default run, which stays the fast health/config/parser/contract suite.
"""

from __future__ import annotations

from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.quality import conformance


def check_ids() -> list[str]:
    """Every quality check id, in run order."""
    return conformance.check_ids()


def run(ctx: Context, check_id: str, cache: dict) -> Outcome:
    """Run the quality check ``check_id`` (one of :func:`check_ids`)."""
    return conformance.run(ctx, check_id, cache)
