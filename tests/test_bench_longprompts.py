"""The generated long-prompt dataset: 8k-32k tokens (estimated), reproducible, no shared prefix, the kit's own
text; `bench --long-prompts` sends it (synthetic server) and refuses --dataset beside it."""

from __future__ import annotations

import json

from test_bench_e2e import Synthetic, bench  # noqa: F401  (the synthetic server helpers)

from kimi_deploy.bench import longprompts
from kimi_deploy.bench.prompts import load_dataset


def test_lengths_cover_8k_to_32k_tokens_and_no_prompt_shares_a_prefix():
    data = longprompts.dataset()
    assert len(data.conversations) == longprompts.COUNT
    est = [len(c[0]["content"]) / longprompts.CHARS_PER_TOKEN for c in data.conversations]
    assert all(t - 100 <= e <= t for e, t in zip(est, longprompts.targets()))
    assert longprompts.targets()[0] == 8192 and longprompts.targets()[-1] == 32768
    heads = {c[0]["content"][:60] for c in data.conversations}
    assert len(heads) == len(data.conversations)  # the radix cache cannot reuse one prompt's prefill for another


def test_reproducible_and_made_of_the_kits_prompts():
    a, b = longprompts.dataset(), longprompts.dataset()
    assert a.sha256 == b.sha256 and a.conversations == b.conversations
    assert longprompts.dataset(seed=1).sha256 != a.sha256
    kit = {" ".join(m["content"].split()) for c in load_dataset().conversations for m in c if m["role"] == "user"}
    notes = [line.split(": ", 1)[1] for line in a.conversations[0][0]["content"].splitlines()
             if line.startswith("Note ")]
    assert notes and all(n in kit for n in notes)


def test_bench_long_prompts_against_the_synthetic_server(cli_runner, tmp_path):
    s = Synthetic("--ttft-ms", "5", "--gap-ms", "1", "--tokens-per-chunk", "4")
    try:
        out = tmp_path / "long.json"
        result = bench(cli_runner, s.url, "--long-prompts", "--concurrency", "2", "--num-prompts", "4",
                       "--warmup", "0", "--max-tokens", "8", "--json", str(out))
        refused = bench(cli_runner, s.url, "--long-prompts", "--dataset", str(tmp_path / "x.jsonl"))
    finally:
        s.stop()
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["dataset"]["name"].startswith("kimi-deploy long prompts")
    assert data["dataset"]["sha256"] == longprompts.dataset().sha256
    assert refused.exit_code == 2 and "mutually exclusive" in refused.output
