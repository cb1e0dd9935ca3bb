"""The ``quality.*`` check ids and their dispatch.

Ids: ``quality.schema.<shape>.<choice>.<mode>`` (:mod:`.conformance`), ``quality.preflight.*`` (:mod:`.vendor_preflight`),
``quality.accuracy`` (:mod:`.accuracy`), ``quality.reasoning`` (:mod:`.reasoning`) and ``quality.certify`` (:mod:`.certify`) on the same sample: the cheap
pre-flight first, the sample last. The tier is off unless asked for
(``--only 'quality.*'``, or ``--sample``/``--dataset``): :func:`kimi_deploy.check.check_ids.select` leaves it out
of a default run, which stays the fast health/config/parser/contract suite.
"""

from __future__ import annotations

from kimi_deploy.check.context import Context
from kimi_deploy.check.outcome import Outcome
from kimi_deploy.check.quality import accuracy, certify, conformance, reasoning, vendor_preflight
from kimi_deploy.check.quality import dataset as ds
from kimi_deploy.check.quality.settings import QualitySettings


def check_ids() -> list[str]:
    """Every quality check id, in run order."""
    return vendor_preflight.check_ids() + conformance.check_ids() + [accuracy.CHECK_ID, reasoning.CHECK_ID, certify.CHECK_ID]


def prepare(ids: list[str], settings: QualitySettings) -> None:
    """Read the dataset now when ``quality.accuracy`` is among ``ids``.

    Raises:
        UsageError: the dataset cannot be read (exit 2, before any request).
    """
    if {accuracy.CHECK_ID, reasoning.CHECK_ID, certify.CHECK_ID} & set(ids):
        ds.load(settings.dataset, sample=settings.sample, max_line_bytes=settings.max_line_bytes,
                max_file_bytes=settings.max_file_bytes)


def run(ctx: Context, check_id: str, cache: dict) -> Outcome:
    """Run the quality check ``check_id`` (one of :func:`check_ids`)."""
    if check_id == accuracy.CHECK_ID:
        return accuracy.run(ctx)
    if check_id == reasoning.CHECK_ID:
        return reasoning.run(ctx)
    if check_id == certify.CHECK_ID:
        return certify.run(ctx)
    if check_id.startswith("quality.preflight."):
        return vendor_preflight.run(ctx, check_id)
    return conformance.run(ctx, check_id, cache)
