"""One check's verdict, as every tier returns it: :class:`Outcome`.

The ``health.*``/``config.*`` (:mod:`.health`), ``parser.*`` (:mod:`.parser`) and ``contract.*``
(:mod:`.contract`) checks all return an :class:`Outcome`; :mod:`.runner` adds the check id and the
duration to make a :class:`kimi_deploy.check.results.CheckResult` row of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from kimi_deploy.check.results import Status
from kimi_deploy.check.validate import Finding, first


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one check found: ``status`` (``pass``/``warn``/``fail``/``skip``), a one-sentence ``detail``,
    and for ``fail``/``warn`` the ``kind`` (:data:`kimi_deploy.check.results.FAILURE_KINDS`, or
    ``model_declined``) and the offending text as ``evidence``.

    Build it with :meth:`passed`, :meth:`skipped`, :meth:`failed` (one finding) or :meth:`judged`
    (every finding of an answer: the status follows from the most telling one).
    """

    status: Status
    detail: str = ""
    kind: str | None = None
    evidence: str = ""

    @classmethod
    def passed(cls, detail: str) -> Outcome:
        return cls("pass", detail)

    @classmethod
    def skipped(cls, detail: str) -> Outcome:
        return cls("skip", detail)

    @classmethod
    def failed(cls, finding: Finding) -> Outcome:
        """``fail`` with ``finding``'s kind, detail and evidence."""
        return cls.judged([finding])

    @classmethod
    def judged(cls, findings: Iterable[Finding], detail: str = "") -> Outcome:
        """The verdict on an answer's ``findings``: ``pass`` with ``detail`` when there are none; else the
        most telling one (:func:`kimi_deploy.check.validate.first`) decides: ``warn`` for
        ``model_declined``, ``fail`` otherwise, its detail followed by the other kinds seen
        (``" (also: markup_leak, stream_shape)"``)."""
        findings = list(findings)
        top = first(findings)
        if top is None:
            return cls("pass", detail)
        others = sorted({f.kind for f in findings} - {top.kind})
        text = top.detail + (f" (also: {', '.join(others)})" if others else "")
        return cls("warn" if top.kind == "model_declined" else "fail", text, top.kind, top.evidence)
