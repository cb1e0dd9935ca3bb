"""The ``monitoring`` target: the Prometheus scrape configuration and rules (:mod:`kimi_deploy.targets.prometheus`)
and the Grafana dashboard (:mod:`kimi_deploy.targets.dashboard`) of one deployment.

``render --target systemd`` writes the same files into ``monitoring/`` beside the units; ``render --target
monitoring`` writes them alone (for the Prometheus host).
"""

from __future__ import annotations

from pathlib import Path

from kimi_deploy import versions
from kimi_deploy.profile import Profile
from kimi_deploy.targets import METRICS_OFF, Artefacts, file_header
from kimi_deploy.targets.dashboard import dashboard_json
from kimi_deploy.targets.prometheus import prometheus_config, rules_file, rules_text, settings


def render_monitoring(profile: Profile, header: str) -> dict[str, str]:
    """File name -> text of every monitoring file: ``prometheus.yml``, ``<name>.rules.yml``,
    ``<name>.dashboard.json`` (:mod:`kimi_deploy.targets.dashboard`). Empty when ``enable_metrics`` is off (there would
    be nothing to scrape)."""
    if not profile.sglang.enable_metrics:
        return {}
    st = settings(profile)
    return {
        "prometheus.yml": prometheus_config(profile, header),
        rules_file(st): rules_text(profile, header),
        f"{st.service}.dashboard.json": dashboard_json(profile),
    }


def artefacts(profile: Profile, sglang_version: str | None = None) -> Artefacts:
    """The ``monitoring`` target (:mod:`kimi_deploy.targets`): :func:`render_monitoring`'s files; none, with a
    note, when ``enable_metrics`` is off."""
    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version
    files = render_monitoring(profile, file_header(profile, version))

    def describe(out_dir: Path | None) -> dict[str, object]:
        return {"target": "monitoring", "sglang_version": version, "profile_sha256": profile.digest(),
                "files": {name: str(out_dir / name) if out_dir else None for name in files}}

    notes = () if files else (METRICS_OFF,)
    return Artefacts("monitoring", files, describe, notes=notes)
