#!/usr/bin/env python3
"""Calibrate ``kimi-deploy bench``'s client against the truth, the raw-socket control and SGLang's client.

Starts the synthetic server (``benchmarks/synthetic_server.py``) and, in the same run and
against the same server, runs one after another at each concurrency:

- ``control``: ``benchmarks/control_client.py`` (raw sockets, no HTTP library, no JSON parsing);
- ``kit``: ``kimi-deploy bench`` (this interpreter, ``python -m kimi_deploy bench --json -``);
- ``sglang``: ``python -m sglang.bench_serving --backend sglang-oai-chat`` in the SGLang test
  environment (``--sglang-python``, default ``$KIMI_DEPLOY_SGLANG_PYTHON`` or ``.sglang-env``),
  run offline: HF_HUB_OFFLINE=1, a local WordLevel tokenizer saved with
  ``PreTrainedTokenizerFast.save_pretrained``, a generated ShareGPT-format JSON of the kit's prompts.

Scenario "fidelity" (the issue's truth): TTFT 200 ms, a 4-token chunk every 20 ms, 64 tokens
→ TTFT 200 ms, TPOT 20*15/63 = 4.762 ms, E2E 500 ms, output tokens/s = concurrency x 128.
Scenario "overhead": TTFT 0, gap 0, 1 token per chunk, concurrency 64 → the client is the
bottleneck; chunks/s is what the client can parse (SGLang's client: output tokens/s, equal to
chunks/s at 1 token per chunk).

Prints one table per scenario (and ``--json PATH`` writes the figures). Every client runs in
its own process on the same cores as the server (this machine: 2 cores), as in the issue.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

FIDELITY = {"ttft_ms": 200.0, "gap_ms": 20.0, "tokens_per_chunk": 4, "max_tokens": 64}
OVERHEAD = {"ttft_ms": 0.0, "gap_ms": 0.0, "tokens_per_chunk": 1, "max_tokens": 2048}


class Server:
    """The synthetic server as a child process."""

    def __init__(self, ttft_ms: float, gap_ms: float, tokens_per_chunk: int, extra: list[str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "synthetic_server.py"), "--port", "0", "--ttft-ms", str(ttft_ms),
             "--gap-ms", str(gap_ms), "--tokens-per-chunk", str(tokens_per_chunk), *(extra or [])],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.stop()
            sys.exit(f"synthetic server did not start: {line!r}")
        self.url = line.removeprefix("listening on ")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _run(argv: list[str], env: dict | None = None, timeout: float = 900) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"command failed ({done.returncode}): {' '.join(argv)}\n{done.stderr[-3000:]}")
    return done.stdout


def run_control(url: str, c: int, n: int, max_tokens: int) -> dict:
    out = _run([sys.executable, str(HERE / "control_client.py"), "--base-url", url, "--concurrency", str(c),
                "--num-prompts", str(n), "--warmup", str(c), "--max-tokens", str(max_tokens)])
    r = json.loads(out.strip().splitlines()[-1])
    return {k: r[k] for k in ("ttft_ms_p50", "tpot_ms_p50", "output_tokens_per_s", "chunks_per_s")}


def run_kit(url: str, c: int, n: int, max_tokens: int) -> dict:
    out = _run([sys.executable, "-m", "kimi_deploy", "bench", "--base-url", url, "--model", "synthetic",
                "--concurrency", str(c), "--num-prompts", str(n), "--warmup", str(c), "--max-tokens",
                str(max_tokens), "--no-progress", "--no-flush-cache", "--json", "-"])
    r = json.loads(out[out.index("{"):])
    s = r["points"][0]["summary"]
    return {"ttft_ms_p50": s["ttft_ms"]["p50"], "tpot_ms_p50": (s["tpot_ms"] or {}).get("p50"),
            "output_tokens_per_s": s["output_tokens_per_s"], "chunks_per_s": s["chunks_per_s"],
            "requests_without_usage": s["requests_without_usage"]}


class SGLangClient:
    """``python -m sglang.bench_serving`` run offline in the SGLang test environment."""

    def __init__(self, python: str, workdir: Path, n_max: int):
        self.python = python
        self.workdir = workdir
        self.tokenizer = workdir / "tokenizer"
        self.dataset = workdir / "sharegpt.json"
        prompts = [json.loads(line)["messages"][-1]["content"]
                   for line in (REPO / "kimi_deploy/bench/data/prompts.jsonl").read_text().splitlines() if line.strip()]
        rows = [{"id": str(i), "conversations": [{"from": "human", "value": prompts[i % len(prompts)]},
                                                  {"from": "gpt", "value": "ok " * 8}]} for i in range(n_max + 16)]
        self.dataset.write_text(json.dumps(rows))
        words = sorted({w for p in prompts for w in p.split()} | {"ok"})
        script = (
            "import json, sys\n"
            "from tokenizers import Tokenizer, models, pre_tokenizers\n"
            "from transformers import PreTrainedTokenizerFast\n"
            "words = json.load(open(sys.argv[1]))\n"
            "vocab = {'[UNK]': 0, **{w: i + 1 for i, w in enumerate(words)}}\n"
            "tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token='[UNK]'))\n"
            "tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()\n"
            "PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='[UNK]').save_pretrained(sys.argv[2])\n")
        (workdir / "words.json").write_text(json.dumps(words))
        _run([python, "-c", script, str(workdir / "words.json"), str(self.tokenizer)], env=self.env())

    def env(self) -> dict:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}

    def run(self, url: str, c: int, n: int, max_tokens: int) -> dict:
        out_file = self.workdir / f"sglang-{c}-{n}-{time.monotonic_ns()}.jsonl"
        _run([self.python, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat", "--base-url", url,
              "--model", "synthetic", "--tokenizer", str(self.tokenizer), "--dataset-name", "sharegpt",
              "--dataset-path", str(self.dataset), "--num-prompts", str(n), "--sharegpt-output-len",
              str(max_tokens), "--max-concurrency", str(c), "--request-rate", "inf", "--warmup-requests",
              str(c), "--disable-tqdm", "--output-file", str(out_file)], env=self.env())
        r = json.loads(out_file.read_text().strip().splitlines()[-1])
        return {"ttft_ms_p50": r["median_ttft_ms"], "tpot_ms_p50": r["median_tpot_ms"],
                "output_tokens_per_s": r["output_throughput"],
                "chunks_per_s": None}


def _sglang_python(arg: str | None) -> str | None:
    for cand in (arg, os.environ.get("KIMI_DEPLOY_SGLANG_PYTHON"), str(REPO / ".sglang-env/bin/python"),
                 "/work/main/.sglang-env/bin/python"):
        if cand and Path(cand).exists():
            return cand
    return None


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{(a / b - 1) * 100:+.1f}%"


def fidelity(clients: dict, concurrencies: list[int], repeat: int) -> list[dict]:
    s = FIDELITY
    server = Server(s["ttft_ms"], s["gap_ms"], s["tokens_per_chunk"])
    n_chunks = math.ceil(s["max_tokens"] / s["tokens_per_chunk"])
    truth_tpot = s["gap_ms"] * (n_chunks - 1) / (s["max_tokens"] - 1)
    rows = []
    try:
        for c in concurrencies:
            n = {1: 16}.get(c, 8 * c)
            truth = {"ttft_ms_p50": s["ttft_ms"], "tpot_ms_p50": truth_tpot,
                     "output_tokens_per_s": c * s["max_tokens"] / ((s["ttft_ms"] + s["gap_ms"] * (n_chunks - 1)) / 1000)}
            for rep in range(repeat):
                for name, fn in clients.items():
                    r = fn(server.url, c, n, s["max_tokens"])
                    rows.append({"scenario": "fidelity", "concurrency": c, "repeat": rep, "client": name, **r,
                                 "truth": truth})
                    print(f"  fidelity c={c} {name}: {json.dumps({k: round(v, 3) if v else v for k, v in r.items()})}",
                          file=sys.stderr, flush=True)
    finally:
        server.stop()
    return rows


def overhead(clients: dict, repeat: int, c: int = 64, n: int = 128) -> list[dict]:
    s = OVERHEAD
    server = Server(s["ttft_ms"], s["gap_ms"], s["tokens_per_chunk"])
    rows = []
    try:
        for rep in range(repeat):
            for name, fn in clients.items():
                r = fn(server.url, c, n, s["max_tokens"])
                if r["chunks_per_s"] is None:  # SGLang: 1 token per chunk, so chunks/s = output tokens/s
                    r["chunks_per_s"] = r["output_tokens_per_s"]
                rows.append({"scenario": "overhead", "concurrency": c, "repeat": rep, "client": name, **r})
                print(f"  overhead c={c} {name}: {r['chunks_per_s']:.0f} chunks/s", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return rows


def no_usage(clients: dict) -> list[dict]:
    """A server that sends no usage block and stops at 64 tokens while 128 are asked for (as at EOS)."""
    server = Server(200.0, 20.0, 4, ["--no-usage", "--output-tokens", "64"])
    rows = []
    try:
        for name, fn in clients.items():
            if name == "control":
                continue
            r = fn(server.url, 8, 32, 128)
            rows.append({"scenario": "no-usage", "concurrency": 8, "repeat": 0, "client": name, **r})
            print(f"  no-usage {name}: {r}", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return rows


def print_tables(rows: list[dict]) -> None:
    fid = [r for r in rows if r["scenario"] == "fidelity"]
    if fid:
        print("\nFidelity: synthetic server TTFT 200 ms, 4-token chunk every 20 ms, 64 tokens "
              "(medians; vs truth / vs control of the same repeat)")
        print(f"{'conc':>5} {'client':<8} {'TTFT ms':>9} {'vs truth':>9} {'vs ctrl':>8} {'TPOT ms':>8} {'vs truth':>9} "
              f"{'vs ctrl':>8} {'out tok/s':>10} {'vs truth':>9} {'vs ctrl':>8}")
        for r in fid:
            ctrl = next(x for x in fid if x["concurrency"] == r["concurrency"] and x["repeat"] == r["repeat"]
                        and x["client"] == "control")
            t = r["truth"]
            print(f"{r['concurrency']:>5} {r['client']:<8} "
                  f"{r['ttft_ms_p50']:>9.1f} {_pct(r['ttft_ms_p50'], t['ttft_ms_p50']):>9} "
                  f"{_pct(r['ttft_ms_p50'], ctrl['ttft_ms_p50']):>8} "
                  f"{r['tpot_ms_p50']:>8.3f} {_pct(r['tpot_ms_p50'], t['tpot_ms_p50']):>9} "
                  f"{_pct(r['tpot_ms_p50'], ctrl['tpot_ms_p50']):>8} "
                  f"{r['output_tokens_per_s']:>10.0f} {_pct(r['output_tokens_per_s'], t['output_tokens_per_s']):>9} "
                  f"{_pct(r['output_tokens_per_s'], ctrl['output_tokens_per_s']):>8}")
    ov = [r for r in rows if r["scenario"] == "overhead"]
    if ov:
        print("\nOverhead: TTFT 0, gap 0, 1 token per chunk, concurrency 64, 2048 tokens x 128 requests")
        print(f"{'client':<8} {'chunks/s':>10} {'vs sglang':>10} {'vs ctrl':>8}")
        for r in ov:
            sg = next((x for x in ov if x["repeat"] == r["repeat"] and x["client"] == "sglang"), None)
            ctrl = next(x for x in ov if x["repeat"] == r["repeat"] and x["client"] == "control")
            ratio = f"{r['chunks_per_s'] / sg['chunks_per_s']:.2f}x" if sg else "-"
            print(f"{r['client']:<8} {r['chunks_per_s']:>10.0f} {ratio:>10} "
                  f"{r['chunks_per_s'] / ctrl['chunks_per_s']:>7.2f}x")
    nu = [r for r in rows if r["scenario"] == "no-usage"]
    if nu:
        print("\nNo usage block: server stops at 64 tokens (truth TPOT 4.762 ms), requests ask max_tokens 128")
        print(f"{'client':<8} {'TPOT ms':>9} {'out tok/s':>10} {'flagged':>8}")
        for r in nu:
            tpot = "unknown" if r["tpot_ms_p50"] is None else f"{r['tpot_ms_p50']:.3f}"
            tput = "unknown" if r["output_tokens_per_s"] is None else f"{r['output_tokens_per_s']:.0f}"
            flagged = r.get("requests_without_usage")
            print(f"{r['client']:<8} {tpot:>9} {tput:>10} {'no' if flagged is None else flagged:>8}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,32,256")
    p.add_argument("--repeat", type=int, default=1, help="repeat each measurement (clients interleaved)")
    p.add_argument("--sglang-python", default=None)
    p.add_argument("--no-sglang", action="store_true")
    p.add_argument("--scenario", choices=["all", "fidelity", "overhead", "no-usage"], default="all")
    p.add_argument("--json", dest="json_path", default=None)
    ns = p.parse_args(argv)
    clients = {"control": run_control, "kit": run_kit}
    tmp = Path(tempfile.mkdtemp(prefix="kimi-bench-calib-"))
    sg_python = None if ns.no_sglang else _sglang_python(ns.sglang_python)
    if sg_python:
        clients["sglang"] = SGLangClient(sg_python, tmp, 1024).run
    else:
        print("SGLang test environment not found: comparing kit and control only", file=sys.stderr)
    concurrencies = [int(c) for c in ns.concurrency.split(",")]
    rows = []
    try:
        if ns.scenario in ("all", "fidelity"):
            rows += fidelity(clients, concurrencies, ns.repeat)
        if ns.scenario in ("all", "overhead"):
            rows += overhead(clients, ns.repeat)
        if ns.scenario in ("all", "no-usage"):
            rows += no_usage(clients)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_tables(rows)
    if ns.json_path:
        Path(ns.json_path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
