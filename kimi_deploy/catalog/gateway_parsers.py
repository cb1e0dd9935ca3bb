"""SGLang's gateway (smg) has its own reasoning and tool-call parsers, under its own names: which ones match each model.

smg's names are not SGLang's: where SGLang takes ``--reasoning-parser kimi_k2`` for the whole K2 family, smg 1.13.0
(``smg launch --help``; lightseekorg/smg ``crates/reasoning_parser/src/factory.rs``) registers three Kimi reasoning
parsers with a fixed start state, and one Kimi tool parser per family:

- ``kimi_thinking``: ``<think>``/``</think>``, ``always_in_reasoning`` true: the output starts inside reasoning. The
  K2 templates since K2-Thinking pre-fill ``<think>`` at the generation prompt, so this is the one that splits their
  answers (smg PR 1868: K2.6 through smg with ``kimi_k25`` scored 0 on the nightly tau2-bench against 100 through
  plain vLLM; ``kimi_thinking`` fixed it; smg issue 1873: the K2.5 and K2.6 templates both pre-fill ``<think>``);
- ``kimi_k25``: the same tags, ``always_in_reasoning`` false: waits for an opening ``<think>`` the model never writes
  and hands the reasoning over as content (the regression of smg 1868/1873);
- ``kimi``: the unicode ``◁think▷`` tags of the first Kimi-K2-Instruct: no K2.x answer has them;
- ``kimi_k3``: K3's own (factory.rs pattern ``kimi-k3``); tool parsers ``kimik2`` (pattern ``moonshot*/Kimi-K2*``) and
  ``kimi_k3`` (``moonshot*/Kimi-K3*``).

With smg's fixed start state, a request that switches thinking off (``chat_template_kwargs.thinking`` false) gets
its answer as reasoning from ``kimi_thinking`` (smg issue 1873, open: the toggle is per request, the flag per
process). The kit's gateway has HTTP workers, and smg 1.13.0 relays their answers unchanged whatever its
``--reasoning-parser`` (measured: a worker's ``"...</think>Yes."`` came back byte for byte through smg launched with
``--reasoning-parser kimi_thinking``): SGLang's own ``kimi_k2`` parsers on the workers split the answer, and smg's
setting matters where smg parses (gRPC workers, its own tokenizer). Either way a name that does not match the
model is refused: it is a latent fault the day the path changes.
"""

from __future__ import annotations

import dataclasses

from kimi_deploy.catalog.models import ModelFacts

#: The source of every name below.
SOURCE = ("smg 1.13.0 `smg launch --help` (the parser names) and lightseekorg/smg crates/reasoning_parser/src/"
          "factory.rs (kimi_thinking: always_in_reasoning true); smg PR 1868 and issue 1873 (K2.5/K2.6 templates "
          "pre-fill <think>: kimi_thinking, not kimi_k25)")


@dataclasses.dataclass(frozen=True)
class SmgParsers:
    """The smg parser names that match one model: ``reasoning`` (``--reasoning-parser``) and ``tool_call``
    (``--tool-call-parser``); ``why``: one line on what a wrong one does."""

    reasoning: str
    tool_call: str
    why: str


_K2 = SmgParsers("kimi_thinking", "kimik2",
                 "the template pre-fills <think>, so the answer starts inside reasoning: kimi_k25 and kimi wait for "
                 "an opening tag that never comes and hand the reasoning over as content (smg PR 1868: K2.6 "
                 "tau2-bench 0 through smg with kimi_k25, 100 through plain vLLM)")
_K3 = SmgParsers("kimi_k3", "kimi_k3", "K3's markup is its own (smg factory.rs pattern kimi-k3)")

#: Model key (:data:`kimi_deploy.catalog.models.MODELS`) -> the smg parsers that match it. Every K2.x of the
#: table is a thinking model whose template pre-fills ``<think>`` (its ``thinking`` row); K3 has its own.
BY_MODEL: dict[str, SmgParsers] = {"k2-thinking": _K2, "k2.5": _K2, "k2.6": _K2, "k2.7-code": _K2, "k3": _K3}


def smg_parsers(model: ModelFacts) -> SmgParsers | None:
    """The smg parser names that match ``model`` (``None``: a model this table does not know)."""
    return BY_MODEL.get(model.key)


def mismatches(model: ModelFacts | None, reasoning_parser: str | None, tool_call_parser: str | None) -> list[str]:
    """One ``gateway.<key>: problem; fix`` line per ``[gateway]`` parser set to a name that does not match
    ``model`` (an unset one is smg's default, not a mismatch; an unknown model is not judged)."""
    want = smg_parsers(model) if model is not None else None
    if want is None:
        return []
    out = []
    for key, have, right in (("reasoning_parser", reasoning_parser, want.reasoning),
                             ("tool_call_parser", tool_call_parser, want.tool_call)):
        if have is not None and have != right:
            out.append(f"gateway.{key}: {have!r} does not match {model.name} (smg's name for it is {right!r}: "
                       f"{want.why}); fix: set {key} = \"{right}\" in [gateway], or leave it out")
    return out
