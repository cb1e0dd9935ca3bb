"""Time each tier of restart's gate (kimi_deploy/host/gate.py) against a running server.

    python benchmarks/gate_tiers.py --profile P.toml [--base-url URL] [--api-key-file F] [--runs 5]

Runs the fast, parser and contract tiers ``--runs`` times (the ready tier is the readiness wait of a real
restart, not measured here) and prints each tier's median, minimum and maximum wall-clock seconds (the check
run's ``duration_s``) with its check count. docs/design.md#restarts-gate has the figures against the replay server
(tests/replay/server.py on a patched SGLang 0.5.23 copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kimi_deploy.host import gate  # noqa: E402
from kimi_deploy.profile import load_profile  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, type=Path)
    p.add_argument("--base-url", default=None)
    p.add_argument("--api-key-file", type=Path, default=None)
    p.add_argument("--runs", type=int, default=5)
    opts = p.parse_args(argv)
    profile = load_profile(opts.profile)
    key = opts.api_key_file.read_text().strip() if opts.api_key_file else None
    times: dict[str, list[float]] = {t: [] for t in gate.TIERS[1:]}
    counts: dict[str, int] = {}
    for _ in range(opts.runs):
        for tier in gate.TIERS[1:]:
            result = gate.run_tier(tier, profile, key, base_url=opts.base_url)
            if not result.ok:
                print(f"{tier} failed: {', '.join(result.failed)}", file=sys.stderr)
                return 1
            times[tier].append(result.seconds)
            counts[tier] = len(result.results)
    print(f"{'tier':<9} {'checks':>6} {'median s':>9} {'min s':>7} {'max s':>7}   ({opts.runs} runs)")
    for tier, values in times.items():
        print(f"{tier:<9} {counts[tier]:>6} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
