"""Size a profile on a host: SGLang's effective configuration (:mod:`.effective`), the memory plan
(:mod:`.memory`), and SGLang's own KV sizing for the same inputs side by side; what ``validate`` and ``doctor``
print and refuse on.

Where the inputs come from: the GPUs from this host's ``nvidia-smi`` or a recorded query (``--gpu-facts``); the
model and draft from their directories (``model_path``, ``speculative_draft_model_path``) or stand-in
directories holding their ``config.json`` and a recorded header index (``--model-facts``/``--draft-facts``,
``tests/data/models``). Without GPUs or a model, nothing is sized and :attr:`Sizing.skipped` says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy.sizing import memory
from kimi_deploy.sizing.effective import EffectiveConfig, resolve
from kimi_deploy.sizing.memory import GIB, KV_TOKENS_TOLERANCE, Facts, GpuFacts, MemoryPlan, ModelFacts

#: The flag that lets ``validate`` pass a profile whose plan says it will not fit, and what it risks.
ACCEPT_FLAG = "--accept-memory-risk"
ACCEPT_RISK = ("SGLang then fails at start-up (out of GPU memory, or 'Loaded weights leave no GPU memory for the "
               "KV cache') after a cold start of about 10 minutes, or starts with a KV cache smaller than one "
               "max-length request, so long requests are refused or cut")


@dataclasses.dataclass(frozen=True)
class Sizing:
    """``effective``/``plan``: ``None`` when skipped (``skipped`` says why); ``plan`` ``None`` too when SGLang's
    resolution did not finish (:attr:`unfinished`); ``agreement``: the plan's KV tokens
    against SGLang's own computation (``{"plan", "sglang", "relative", "tolerance", "ok"}``), ``None`` when SGLang's
    could not run (its error is in ``effective.kv_check``)."""

    effective: EffectiveConfig | None
    plan: MemoryPlan | None
    skipped: tuple[str, ...] = ()

    @property
    def agreement(self) -> dict[str, Any] | None:
        check = self.effective.kv_check if self.effective else None
        if not self.plan or not check or "max_total_num_tokens" not in check:
            return None
        theirs, ours = int(check["max_total_num_tokens"]), self.plan.kv_tokens
        relative = abs(ours - theirs) / max(theirs, 1)
        return {"plan": ours, "sglang": theirs, "relative": relative, "tolerance": KV_TOKENS_TOLERANCE,
                "ok": relative <= KV_TOKENS_TOLERANCE, "source": check.get("source")}

    @property
    def refused(self) -> bool:
        return bool(self.plan and not self.plan.fits)

    @property
    def unfinished(self) -> tuple[str, ...]:
        """Why SGLang's resolution did not finish here (its interpreter stopped: a missing module, a broken
        install): then there is no plan and no verdict, only these reasons. Empty when it finished."""
        return tuple(self.effective.errors) if self.effective is not None else ()

    def to_dict(self) -> dict[str, Any]:
        return {"effective": self.effective.to_dict() if self.effective else None,
                "memory": self.plan.to_dict() if self.plan else None, "agreement": self.agreement,
                "skipped": list(self.skipped)}

    def lines(self) -> list[str]:
        out = [f"note: not sized: {why}" for why in self.skipped]
        if self.effective:
            out += self.effective.lines()
        if self.plan:
            out += self.plan.lines()
        check = self.effective.kv_check if self.effective else None
        agree = self.agreement
        if agree:
            out.append(f"  SGLang's own KV sizing on these inputs: {agree['sglang']} tokens "
                       f"({agree['relative']:.3%} from the plan; tolerance {agree['tolerance']:.0%})")
        elif check and check.get("error"):
            out.append(f"  SGLang's own KV sizing on these inputs: {check['error']}")
        return out


def _model_dir(path: str | None, stand_in: str | Path | None, flag: str) -> tuple[Path | None, str | None]:
    if stand_in:
        return Path(stand_in), None
    if path and (Path(path) / "config.json").is_file():
        return Path(path), None
    return None, (f"{path} is not on this machine (no config.json): pass {flag} DIR (a directory with its "
                  "config.json and header-index.json: `kimi-deploy facts --profile P --out DIR` records them on the GPU "
                  "host)")


def size_profile(profile: Any, python: str | Path, server_args: Sequence[str], *, gpus: GpuFacts | None,
                 model_facts: str | Path | None = None, draft_facts: str | Path | None = None,
                 env: Mapping[str, str] | None = None, gpu_hint: str | None = None) -> Sizing:
    """Resolve ``server_args`` (``profile``'s rendered command) with SGLang in ``python`` on ``gpus`` and plan
    the memory of one rank (see the module docstring for the inputs).

    Raises:
        UsageError: a model directory or header index that cannot be read.
        ExternalCommandError: SGLang's interpreter is broken (as :func:`kimi_deploy.engine.run_script`).
    """
    s = profile.sglang
    skipped = []
    if gpus is None:
        skipped.append(gpu_hint or "no GPU facts: run on the GPU host or pass --gpu-facts FILE "
                                   "(nvidia-smi --query-gpu=index,name,pci.bus_id,compute_cap,memory.total,"
                                   "driver_version --format=csv)")
    model_dir, why = _model_dir(s.model_path, model_facts, "--model-facts")
    if why:
        skipped.append(why)
    draft_dir = None
    if s.speculative_draft_model_path and model_dir is not None:
        draft_dir, why = _model_dir(s.speculative_draft_model_path, draft_facts, "--draft-facts")
        if why:
            skipped.append(why)
    if skipped or gpus is None or model_dir is None:
        return Sizing(None, None, tuple(skipped))
    model = ModelFacts.load(model_dir)
    draft = ModelFacts.load(draft_dir) if draft_dir else None
    tp, pp = s.tp_size, s.pp_size or 1
    pre_load = gpus.memory_bytes - memory.CUDA_CONTEXT_BYTES
    weights = model.weights.per_rank(tp, pp) + (draft.weights.per_rank(tp, pp) if draft else 0)
    paths = {"--model-path": str(model_dir)}
    if draft_dir:
        paths["--speculative-draft-model-path"] = str(draft_dir)
    kv_check = {"pre_load_gib": pre_load / GIB, "after_weights_gib": (pre_load - weights) / GIB,
                "draft_layers": draft.num_layers if draft else None}
    effective = resolve(python, server_args, gpus, paths=paths, env=env, kv_check=kv_check)
    if not effective.ok:  # resolution stopped: a plan from half the values would be a verdict on a guess
        return Sizing(effective, None)
    facts = Facts(gpus=gpus, model=model, draft=draft, resolved=effective.resolved, sources=effective.sources)
    return Sizing(effective, memory.plan(profile, facts))
