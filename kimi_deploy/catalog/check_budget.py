"""The fast check tiers' time budget: what a full ``kimi-deploy check`` sends, times what one request takes for Kimi
K2.5 on the reference host (8 x RTX PRO 6000 Blackwell), gives check's default ``--deadline`` and the nightly units'.

One derivation for every place that needs the number: ``check``'s ``--deadline`` default
(:data:`kimi_deploy.cli.check.DEFAULT_DEADLINE_S`), the nightly unit's (:data:`kimi_deploy.targets.systemd.
CHECK_DEADLINE_S`, and ``TimeoutStartSec=`` past it) and the gateway host's per worker. ``tests/test_check_budget.py``
counts what a run really sends against the scripted server and fails when a tier sends more than :data:`TIERS` says:
grow a tier, grow its row here, and the deadline follows.

The figures (seconds), each from a measurement the kit records:

- a chat completion sent on its own: :data:`PER_REQUEST_S` = 10. docs/design.md#the-quality-tier records ~5-10 s per
  forced call with reasoning on K2.5; a case's budget is 512 tokens (``contract.REPLY_TOKENS``), 7.0 s at the
  73 tok/s single-stream decode measured for K2.5 on 8 x RTX PRO 6000 with SGLang and a BF16 KV cache
  (local-inference-lab/rtx6kpro, inference-engines/sglang.md: 73-90 tok/s), plus prefill;
- a burst of ``contract.concurrency.*`` (up to 64 at once): :data:`PER_BURST_S` = 20: 512 tokens at the TPOT of
  21.1 ms measured at decode concurrency on 8 x SM120 (TP8, the PCIe IPC preset's upstream figure) is 10.8 s, twice
  that for the burst's prefill and its slower steps;
- a health or config read, or a raw output posted to the server's parser (no generation): :data:`PER_READ_S` = 1
  (the gate's tiers, docs/design.md#restarts-gate: 7 health/config checks in 0.69 s, 28 parser posts in 1.82 s,
  against the replay server on the shared 2-core machine; 1 s leaves room for a loaded host).

Arithmetic (:func:`derive`): 7 reads + 28 parser posts = 35 x 1 s = 35 s; 47 contract requests (the cases, each
streamed and not, ``multi_turn``'s 3 turns, ``malformed``, ``prefix_cache``'s 2) + 72 follow-up turns
(``contract.followup.*``) = 119 x 10 s = 1190 s; 6 bursts x 20 s = 120 s; total 1345 s, rounded up to a whole minute:
**1380 s** (23 min; 720 s before issue 41's ~120 requests). ``check --each-worker`` gives each worker that (all but
the parser posts run there) and the pass through the gateway :data:`GATEWAY_PASS` (4 completions, 6 bursts: 160 s,
**180 s**). A retry of a prose answer under ``tool_choice`` auto
(``--repeat``, 2) is not counted: it happens on a model that declines, and the run still ends at the deadline with
every report written. The nightly unit's ``TimeoutStartSec=`` is the deadline + :data:`SLACK_S`.
"""

from __future__ import annotations

import dataclasses
import math

#: Seconds of one chat completion sent on its own (module docstring: K2.5 on the reference host).
PER_REQUEST_S = 10.0
#: Seconds of one burst of ``contract.concurrency.*`` (module docstring).
PER_BURST_S = 20.0
#: Seconds of one request that generates nothing: a health or config read, a parser post (module docstring).
PER_READ_S = 1.0
#: Seconds ``TimeoutStartSec=`` leaves past ``--deadline``: start-up, the last request (cut by ``--timeout``, 30 s by
#: default, at the deadline's socket), the reports.
SLACK_S = 180


@dataclasses.dataclass(frozen=True)
class Tier:
    """What one part of a full run sends: ``reads`` (no generation), ``requests`` (chat completions one at a time),
    ``bursts`` (requests sent at once, each burst timed as one: :data:`PER_BURST_S`), and which check ids."""

    ids: str
    reads: int = 0
    requests: int = 0
    bursts: int = 0

    def seconds(self) -> float:
        return self.reads * PER_READ_S + self.requests * PER_REQUEST_S + self.bursts * PER_BURST_S


#: The fast tiers as a full run (no ``--only``, no quality tier) sends them; counted by tests/test_check_budget.py.
TIERS: tuple[Tier, ...] = (
    Tier("health.*, config.*", reads=7),
    Tier("parser.*", reads=28),
    Tier("contract.* but followup and concurrency", requests=47),
    Tier("contract.followup.*", requests=72),
    Tier("contract.concurrency.*", bursts=6),
)

#: What ``check --each-worker`` sends through the gateway after the workers (:data:`kimi_deploy.check.workers.
#: THROUGH_GATEWAY`): ``contract.reasoning_on``/``_off`` streamed and not, one burst per concurrency case.
GATEWAY_PASS = Tier("contract.concurrency.*, contract.reasoning_* through the gateway", requests=4, bursts=6)


def derive(tiers: tuple[Tier, ...] = TIERS) -> int:
    """The deadline, seconds, for ``tiers``: the sum of their :meth:`Tier.seconds`, rounded up to a whole minute."""
    return 60 * math.ceil(sum(t.seconds() for t in tiers) / 60)


#: check's default ``--deadline`` and the nightly unit's, seconds: :func:`derive` of :data:`TIERS` (1380).
DEADLINE_S = derive()
#: Seconds the gateway host's ``check --each-worker`` adds for its pass through the gateway (180).
GATEWAY_PASS_S = derive((GATEWAY_PASS,))
