"""Shared by the monitoring tests: promtool, rendering a profile's monitoring files, Go-template expansion."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import Profile, parse_profile
from kimi_deploy.targets.prometheus import rules_doc
from kimi_deploy.targets.systemd import render

PRESET = "kimi-k25-rtx-pro-6000-x8"
#: A [monitoring] table with every optional part: a gateway, extra labels, several targets, an E2E SLO.
GATEWAY_MONITORING = {"gateway": "127.0.0.1:29000", "labels": {"cluster": "gpu-a", "team": "inference"},
                      "targets": ["10.0.0.5:30000", "[::1]:30001"],
                      "slo": {"ttft": 2000.0, "tpot": 100.0, "e2e": 60000.0}}


def tool(name: str) -> str:
    """Path of ``promtool``/``prometheus`` (Debian's ``prometheus`` package); skipped outside CI when missing."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing in CI; .ci/run installs Debian's prometheus package")
    pytest.skip(f"{name} missing: apt-get install --no-install-recommends prometheus")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run promtool in ``cwd`` (bounded: 120 s); the result carries stdout and stderr."""
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def rule_test_doc(profile: Profile, rule_file: str, tests: list[dict], evaluation_interval: str = "1m") -> dict:
    """A ``promtool test rules`` document for ``tests`` against ``profile``'s rendered rule file ``rule_file``
    (a name relative to promtool's working folder).

    ``group_eval_order`` lists every group of the file in the file's order, recording rules first: promtool
    evaluates the groups it is not told about in no set order (Prometheus' unit-testing docs: "The order is
    guaranteed only for the groups mentioned"), and an alert reading a recording rule evaluated at the same
    instant then sees the previous evaluation's value, ``evaluation_interval`` old. At ``1h`` that is outside the
    5m lookback: ``KimiSchemaAccuracyDropped``'s test failed 49 times in 300 promtool runs of one document without
    this order, 0 in 300 with it.
    """
    return {"rule_files": [rule_file], "evaluation_interval": evaluation_interval,
            "group_eval_order": [group["name"] for group in rules_doc(profile)["groups"]], "tests": tests}


def preset_profile(**monitoring) -> Profile:
    """The reference preset, its ``[monitoring]`` table updated with ``monitoring``."""
    data = get_preset(PRESET).data
    data = {**data, "monitoring": {**data.get("monitoring", {}), **monitoring}}
    return parse_profile(data)


def write_monitoring(profile: Profile, directory: Path) -> dict[str, Path]:
    """Render ``profile`` and write its monitoring files into ``directory``; name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, text in render(profile).monitoring.items():
        (directory / name).write_text(text)
        out[name] = directory / name
    return out


def go_value(v: float) -> str:
    """Go's ``%v`` of a float64, as ``{{ $value }}`` prints it (integers without a point)."""
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    return repr(v)


def humanize_duration(v: float) -> str:
    """Prometheus' ``humanizeDuration`` for positive values under a day (template/template.go)."""
    if v == 0 or math.isnan(v):
        return f"{v:.4g}s"
    if abs(v) >= 1:
        assert 0 < v < 86400, "only positive values under a day are needed here"
        seconds, minutes, hours = int(v) % 60, int(v) // 60 % 60, int(v) // 3600
        if hours:
            return f"{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{minutes}m {seconds}s"
        return f"{v:.4g}s"
    prefix = ""
    for p in ("m", "u", "n"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{v:.4g}{prefix}s"


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """Expand the few Go-template forms the rendered annotations use: labels, $value, humanizeDuration."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    if "{{ $value | humanizeDuration }}" in text:
        text = text.replace("{{ $value | humanizeDuration }}", humanize_duration(value))
    text = text.replace("{{ $value }}", go_value(value))
    assert "{{" not in text, f"unexpanded template in {template!r}"
    return text


def all_queries(profile: Profile) -> list[str]:
    """Every PromQL expression of the dashboard (:func:`kimi_deploy.targets.dashboard.panel_queries`)."""
    from kimi_deploy.targets.dashboard import panel_queries
    from kimi_deploy.targets.prometheus import settings

    return [expr for _, _, queries in panel_queries(settings(profile), profile.sglang.speculative_algorithm is not None)
            for expr, _ in queries]


def all_exprs(profile: Profile) -> list[str]:
    """Every PromQL expression of the rules (:func:`kimi_deploy.targets.prometheus.rules_doc`)."""
    from kimi_deploy.targets.prometheus import rules_doc

    return [r["expr"] for g in rules_doc(profile)["groups"] for r in g["rules"]]
