"""The gate every restart passes: ready → fast → parser → contract, stopping at the first tier that fails.

Tiers, in order (``restart --gate NAME`` runs every tier up to and including NAME; default ``contract``):

- ``ready``: :func:`kimi_deploy.host.readiness.wait_ready` (the verdict of :func:`kimi_deploy.wire.readiness.probe`,
  ``check``'s ``health.ready`` and ``status`` give: a 1-token generation answers); the caller runs it, this module
  records its time (it proves no key: SGLang serves ``/health_generate`` without one; ``fast`` does);
- ``fast``: ``health.*`` and ``config.*`` of ``kimi-deploy check`` (the server is up, with the profile's
  parsers, speculative settings and TP size);
- ``parser``: ``parser.*``, the corpus of raw Kimi outputs posted to the server's own parsers
  (``/parse_function_call``, ``/separate_reasoning``);
- ``contract``: :data:`CONTRACT_SUBSET`, real chat completions: a tool call streamed and not, under
  ``tool_choice`` auto, required and named (a forced call is the evidence that the server calls tools at all: a
  prose answer to one fails, ``tool_choice_violation``, where under auto it is only ``model_declined``), the id
  round trip (canonical ids and the sanitised ``functions_NAME_N`` that clients send back, the failure behind this
  project's incidents), reasoning separation streamed and not, and the prefix cache (``contract.prefix_cache``: one
  ~2000-token prompt twice, the second must hit the cache). Twelve requests of a few hundred tokens and two short
  prefills: well
  under a minute on a Kimi K2.5 server, about a second against the replay server (figures in
  docs/design.md#restarts-gate).

The gate selects check ids and runs them with the check package's own runner (:func:`kimi_deploy.check.run_checks`);
it re-implements no check. Each tier is one run, so its time is its own (``TierResult.seconds``, the report's
``duration_s``).

It also owns the rule that a change may not drop the parsers (:func:`parser_removal`): ``install`` and
``restart`` refuse such a change before anything restarts (:func:`refuse_parser_removal`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kimi_deploy.errors import ExitCode, RefusedError
from kimi_deploy.deployment import Deployment
from kimi_deploy.profile import Profile

#: The tiers in the order they run; ``--gate`` names the last one to run.
TIERS = ("ready", "fast", "parser", "contract")
DEFAULT_GATE = "contract"

#: ``kimi-deploy check`` id globs of each tier after ``ready``.
FAST_TIER = ("health.*", "config.*")
PARSER_TIER = ("parser.*",)
#: Tool calls streamed and not, the id round trip (canonical and sanitised), reasoning separation, and the prefix
#: cache (an upgrade can change it: SGLang 0.5.21 made the Rust prefix cache the default).
CONTRACT_SUBSET = (
    "contract.tool_auto.nonstream", "contract.tool_auto.stream",
    # a forced call (tool_choice required, named): evidence that the server calls tools at all; under auto a
    # prose answer is only a warning (model_declined), so a server that never calls a tool would pass without them
    "contract.tool_required.nonstream", "contract.tool_required.stream",
    "contract.tool_named.nonstream", "contract.tool_named.stream",
    "contract.id_roundtrip.canonical.nonstream", "contract.id_roundtrip.canonical.stream",
    "contract.id_roundtrip.sanitised.nonstream", "contract.id_roundtrip.sanitised.stream",
    "contract.reasoning_on.nonstream", "contract.reasoning_on.stream",
    "contract.prefix_cache",
)

#: The profile fields a change may not drop: each is a launch flag every coding agent depends on.
PARSER_FIELDS = {"tool_call_parser": "--tool-call-parser", "reasoning_parser": "--reasoning-parser"}


def tiers_through(gate: str) -> list[str]:
    """The tiers ``--gate gate`` runs, ``ready`` first.

    Raises:
        ValueError: ``gate`` is not one of :data:`TIERS` (the CLI's choice list prevents it).
    """
    if gate not in TIERS:
        raise ValueError(f"unknown gate {gate!r}: one of {', '.join(TIERS)}")
    return list(TIERS[:TIERS.index(gate) + 1])


def tier_globs(tier: str, fast: Sequence[str] = FAST_TIER) -> tuple[str, ...]:
    """The check-id globs of ``tier`` (``fast``, ``parser``, ``contract``); ``fast`` overrides the fast tier's."""
    return {"fast": tuple(fast), "parser": PARSER_TIER, "contract": CONTRACT_SUBSET}[tier]


@dataclasses.dataclass(frozen=True)
class TierResult:
    """One tier's outcome: ``exit_code`` (the check report's, an :class:`ExitCode`; for ``ready``: OK, TIMEOUT
    or FAILED), ``seconds`` it took (``ready``: the readiness wait's elapsed time; the others: the check run's
    ``duration_s``, wall clock) and its check rows as dicts (``id``, ``status``, ``kind``, ``detail``)."""

    tier: str
    exit_code: int
    seconds: float
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    @property
    def failed(self) -> list[str]:
        """Ids of the checks whose status is ``fail``."""
        return [r["id"] for r in self.results if r["status"] == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "ok": self.ok, "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "checks": len(self.results), "failed": self.failed}


@dataclasses.dataclass(frozen=True)
class GateResult:
    """The tiers that ran for ``gate`` (the last one is the first that failed, or ``gate`` itself)."""

    gate: str
    tiers: list[TierResult]

    @property
    def ok(self) -> bool:
        return bool(self.tiers) and all(t.ok for t in self.tiers) and self.tiers[-1].tier == self.gate

    @property
    def failed_tier(self) -> str | None:
        """The tier that failed, or None."""
        return next((t.tier for t in self.tiers if not t.ok), None)

    @property
    def failed_checks(self) -> list[str]:
        """The failed tier's failed check ids (empty for ``ready`` or when nothing failed)."""
        return next((t.failed for t in self.tiers if not t.ok), [])

    @property
    def exit_code(self) -> int:
        return next((t.exit_code for t in self.tiers if not t.ok), int(ExitCode.OK))

    def results(self) -> list[dict[str, Any]]:
        """Every check row of every tier that ran, in run order."""
        return [r for t in self.tiers for r in t.results]

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "ok": self.ok, "failed_tier": self.failed_tier,
                "failed_checks": self.failed_checks, "tiers": [t.to_dict() for t in self.tiers]}


def run_tier(tier: str, deployment: Deployment, api_key: str | None, *, base_url: str | None = None,
             timeout: float = 60.0, fast: Sequence[str] = FAST_TIER) -> TierResult:
    """Run one tier's checks (:func:`tier_globs`) against ``base_url`` (default: the deployment's) with the check
    package's runner; the deployment's profile gives the expected values (served name, parsers, speculative
    settings).

    ``timeout``: seconds per HTTP request.

    Raises:
        UsageError / ProfileError: from :func:`kimi_deploy.check.run_checks` (a bad base URL).
    """
    from kimi_deploy.check import CheckOptions, run_checks  # imports openai (about 0.5 s): only when checking

    report = run_checks(CheckOptions(
        base_url=base_url or deployment.base_url, model=deployment.served_model,
        api_key=api_key, profile=deployment.profile, only=list(tier_globs(tier, fast)), timeout=timeout))
    rows = [{"id": r.id, "status": r.status, "kind": r.kind, "detail": r.detail} for r in report.results]
    return TierResult(tier, int(report.exit_code), float(report.duration_s or 0.0), rows)


def run_gate(gate: str, deployment: Deployment, api_key: str | None, *, ready_seconds: float,
             base_url: str | None = None, timeout: float = 60.0, fast: Sequence[str] = FAST_TIER) -> GateResult:
    """The tiers after ``ready`` up to ``gate``, stopping at the first that fails; ``ready_seconds`` is the
    readiness wait the caller already passed (recorded as the ``ready`` tier)."""
    tiers = [TierResult("ready", int(ExitCode.OK), ready_seconds)]
    for tier in tiers_through(gate)[1:]:
        tiers.append(run_tier(tier, deployment, api_key, base_url=base_url, timeout=timeout, fast=fast))
        if not tiers[-1].ok:
            break
    return GateResult(gate, tiers)


def parser_removal(old: Profile | None, new: Profile) -> list[str]:
    """The launch flags (``--tool-call-parser``, ``--reasoning-parser``) ``old`` set and ``new`` drops.

    A server started without them answers health and readiness and is useless to every coding agent (tool
    calls come back as text, reasoning inside the content): the first incident behind this project.
    """
    if old is None:
        return []
    return [flag for field, flag in PARSER_FIELDS.items()
            if getattr(old.sglang, field) and not getattr(new.sglang, field)]


def refuse_parser_removal(old: Profile | None, new: Profile, *, what: str, override: str) -> None:
    """Raise unless ``new`` keeps every parser ``old`` set (:func:`parser_removal`).

    Raises:
        RefusedError: (exit 4) naming the dropped flags; ``override`` is the option that allows it anyway.
    """
    dropped = parser_removal(old, new)
    if dropped:
        fields = ", ".join(f for f, flag in PARSER_FIELDS.items() if flag in dropped)
        raise RefusedError(f"refusing to {what}: the new profile drops {' and '.join(dropped)}, which the running "
                           "version has; the server would come back healthy and return tool calls as plain text",
                           value=fields, hint=f"keep [sglang] {fields} in the profile (kimi_k2 for Kimi K2.x), or "
                                              f"pass {override} if dropping them is meant")
