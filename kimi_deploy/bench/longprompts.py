"""A generated long-prompt dataset (about 8k to 32k tokens a prompt), so a benchmark exercises prefill.

Why: decode-sized all-reduces are what fusion and PCIe IPC speed up; prefill-sized ones (a long prompt's
chunks) are where upstream keeps NCCL and where a kernel-based all-reduce can cost TTFT (sglang
``pcie_ipc_ar.py``: a prefill-sized workspace cost 66% TTFT at TP8). A/B runs of an all-reduce change need
both, so ``kimi-deploy bench --long-prompts`` sends these.

How: nothing is downloaded. Every prompt is built, with a fixed seed, from the kit's own natural prompts
(``data/prompts.jsonl``, written for the kit): a unique header line first (so no two prompts share a
prefix the radix cache could reuse), then the kit's prompt texts as numbered notes in a seeded order until
the prompt reaches its token target, then one task about the notes. Targets are spread evenly over
:data:`MIN_TOKENS`..:data:`MAX_TOKENS`. Token counts are estimated at :data:`CHARS_PER_TOKEN` characters a
token (English prose under BPE tokenizers such as Kimi K2's averages about 4); the real count is what the
server reports as ``usage.prompt_tokens``, recorded per request in the result.
"""

from __future__ import annotations

import hashlib
import json
import random

from kimi_deploy.bench.prompts import Dataset, load_dataset

MIN_TOKENS = 8192
MAX_TOKENS = 32768
#: Characters per token assumed when sizing a prompt (an estimate for English prose, see above).
CHARS_PER_TOKEN = 4
#: A prompt is complete when fewer characters than this are left to its target (no note is cut).
FILL_SLACK_CHARS = 400
#: Prompts in the dataset (each a different target length).
COUNT = 25
SEED = 20261201

TASKS = (
    "Above are numbered notes. List the numbers of every note that asks for code, with the language it asks for.",
    "Above are numbered notes. Which three subjects come up most often? Quote one note number for each.",
    "Above are numbered notes. Summarise the collection in one paragraph, then name the longest note by number.",
    "Above are numbered notes. Find every note that mentions a river, a bird or the sea, and quote its first "
    "sentence.",
    "Above are numbered notes. Group them into at most six themes and give each theme a one-line title.",
)


def targets(count: int = COUNT) -> list[int]:
    """Token targets, evenly spaced from :data:`MIN_TOKENS` to :data:`MAX_TOKENS` inclusive."""
    if count == 1:
        return [MIN_TOKENS]
    step = (MAX_TOKENS - MIN_TOKENS) / (count - 1)
    return [round(MIN_TOKENS + i * step) for i in range(count)]


def _texts() -> list[str]:
    """The user texts of the kit's natural prompts (every turn, in file order)."""
    out = []
    for conv in load_dataset().conversations:
        for message in conv:
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                out.append(" ".join(message["content"].split()))
    return out


def generate(count: int = COUNT, seed: int = SEED) -> list[list[dict[str, str]]]:
    """The conversations: one user message each, ``count`` of them, target lengths :func:`targets`."""
    texts = _texts()
    rng = random.Random(seed)
    out = []
    for n, target in enumerate(targets(count)):
        budget = target * CHARS_PER_TOKEN
        task = TASKS[n % len(TASKS)]
        parts = [f"kimi-deploy long-context benchmark, document set {n + 1} of {count} "
                 f"(about {target} tokens)."]
        size = len(parts[0]) + len(task) + 2
        order: list[str] = []
        k = misses = 0
        while budget - size > FILL_SLACK_CHARS and misses < 50:
            if not order:
                order = texts[:]
                rng.shuffle(order)
            note = f"Note {k + 1}: {order.pop()}"
            if size + len(note) + 1 > budget:  # would overshoot the target: try another note
                misses += 1
                continue
            parts.append(note)
            size += len(note) + 1
            k += 1
        parts.append(task)
        out.append([{"role": "user", "content": "\n".join(parts)}])
    return out


def dataset(count: int = COUNT, seed: int = SEED) -> Dataset:
    """The generated prompts as a :class:`Dataset`; ``sha256`` is of their JSONL form, so results of the same
    kit version match."""
    convs = generate(count, seed)
    raw = "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in convs).encode()
    return Dataset(name=f"kimi-deploy long prompts ({MIN_TOKENS}-{MAX_TOKENS} tokens, generated)",
                   path=f"generated:long-prompts?count={count}&seed={seed}",
                   sha256=hashlib.sha256(raw).hexdigest(),
                   conversations=tuple(tuple(c) for c in convs))
