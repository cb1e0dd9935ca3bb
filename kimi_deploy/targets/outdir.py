"""``render --out DIR`` for several services into one folder: each service's own stale files removed (by a
manifest), the shared Prometheus configuration merged, never overwritten.

``DIR/.kimi-deploy-render.json`` (:data:`MANIFEST`) lists, per service and target, the files its last render
wrote. A new render of that service removes the files of its last render it no longer renders (a host that left
the fleet, a gateway dropped), if they still start with the kit's generated header; other services' files are
never touched. ``prometheus.yml`` (``monitoring/prometheus.yml`` beside units, or at the top for
``--target monitoring``) is shared by every service rendered into the folder: its scrape jobs and rule files of
the other services are kept (:func:`merge_prometheus`), this service's replaced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import fsio
from kimi_deploy.targets import GENERATED_PREFIX
from kimi_deploy.targets.prometheus import to_yaml

#: The folder's record of what each service's last render wrote.
MANIFEST = ".kimi-deploy-render.json"
#: Format of :data:`MANIFEST`.
MANIFEST_FORMAT = 1
#: The shared file merged rather than owned.
PROMETHEUS = "prometheus.yml"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _service_of(job: Mapping[str, Any]) -> str | None:
    """The ``service`` label of a rendered scrape job (every job the kit renders carries it)."""
    for static in job.get("static_configs") or []:
        service = (static.get("labels") or {}).get("service")
        if service:
            return str(service)
    return None


def merge_prometheus(existing: str | None, rendered: str, service: str) -> str:
    """``rendered`` (this service's prometheus.yml) with the other services' scrape jobs and rule files of
    ``existing`` kept. ``existing`` not written by the kit (or unreadable YAML): ``rendered`` alone."""
    if not existing or not existing.startswith(GENERATED_PREFIX):
        return rendered
    import yaml  # start-up: only when a second service renders into a folder that has a prometheus.yml

    try:
        old, new = yaml.safe_load(existing), yaml.safe_load(rendered)
    except yaml.YAMLError:
        return rendered
    if not isinstance(old, dict) or not isinstance(new, dict):
        return rendered
    mine = {job.get("job_name") for job in new.get("scrape_configs") or []}
    others = [job for job in old.get("scrape_configs") or [] if isinstance(job, dict)
              and _service_of(job) not in (None, service) and job.get("job_name") not in mine]
    if not others:
        return rendered
    rule_files = [r for r in old.get("rule_files") or [] if r != f"{service}.rules.yml"
                  and r not in (new.get("rule_files") or [])] + list(new.get("rule_files") or [])
    services = sorted({s for s in (_service_of(job) for job in others) if s})
    comments = [line for line in rendered.splitlines() if line.startswith("#")]
    doc = {"global": new.get("global"), "rule_files": rule_files,
           "scrape_configs": others + list(new.get("scrape_configs") or [])}
    return ("\n".join(comments) + "\n"
            f"# Merged: the scrape jobs and rule files of {', '.join(services)} are kept from their own renders into "
            "this folder.\n" + to_yaml(doc))


def without_service(existing: str | None, service: str) -> str | None:
    """``existing`` (a merged prometheus.yml) without ``service``'s jobs and rule file, for a render that no longer
    renders monitoring; None when nothing of another service is left (the file is then stale)."""
    if not existing or not existing.startswith(GENERATED_PREFIX):
        return existing
    import yaml  # start-up: as merge_prometheus

    try:
        old = yaml.safe_load(existing)
    except yaml.YAMLError:
        return existing
    jobs = [job for job in (old.get("scrape_configs") or []) if isinstance(job, dict)]
    others = [job for job in jobs if _service_of(job) not in (None, service)]
    if not others:
        return None
    rules = [r for r in old.get("rule_files") or [] if r != f"{service}.rules.yml"]
    services = sorted({s for s in (_service_of(job) for job in others) if s})
    comments = [line for line in existing.splitlines() if line.startswith("#") and not line.startswith("# Merged")]
    return ("\n".join(comments) + "\n" f"# Merged: the scrape jobs and rule files of {', '.join(services)} are kept "
            "from their own renders into this folder.\n"
            + to_yaml({"global": old.get("global"), "rule_files": rules, "scrape_configs": others}))


@dataclasses.dataclass(frozen=True)
class OutPlan:
    """What ``render --out`` writes (``files``: name -> text, the manifest included) and removes (``stale``)."""

    files: dict[str, str]
    stale: tuple[str, ...]


def plan(out_dir: Path, service: str, target: str, files: Mapping[str, str]) -> OutPlan:
    """The files to write into ``out_dir`` for ``service``'s ``target`` render, and its own stale ones."""
    record = _read(out_dir / MANIFEST)
    try:
        data = json.loads(record) if record else {}
        renders = {k: list(v) for k, v in (data.get("renders") or {}).items()} if isinstance(data, dict) else {}
    except (ValueError, TypeError, AttributeError):
        renders = {}
    key = f"{service}/{target}"
    out = {name: (merge_prometheus(_read(out_dir / name), text, service) if Path(name).name == PROMETHEUS
                  else text) for name, text in files.items()}
    others = {name for k, names in renders.items() if k != key for name in names}
    stale = [name for name in renders.get(key, []) if name not in files and name not in others
             and Path(name).name != PROMETHEUS and (_read(out_dir / name) or "").startswith(GENERATED_PREFIX)]
    for name in renders.get(key, []):  # monitoring no longer rendered: this service's jobs leave the shared file
        if Path(name).name == PROMETHEUS and name not in files:
            kept = without_service(_read(out_dir / name), service)
            if kept is None:
                stale.append(name)
            elif kept != _read(out_dir / name):
                out[name] = kept
    renders[key] = sorted(files)
    out[MANIFEST] = json.dumps({"format": MANIFEST_FORMAT, "renders": dict(sorted(renders.items()))}, indent=2) + "\n"
    return OutPlan(out, tuple(stale))


def remove_stale(out_dir: Path, stale: tuple[str, ...]) -> list[Path]:
    """Remove ``stale`` files under ``out_dir`` and the folders they leave empty; the paths removed.

    Raises:
        UsageError: a file that exists and cannot be deleted (:func:`kimi_deploy.fsio.remove`).
    """
    removed = []
    for name in stale:
        path = out_dir / name
        if not fsio.remove(path):
            continue
        removed.append(path)
        parent = path.parent
        while parent != out_dir and parent.is_dir() and not any(parent.iterdir()):
            fsio.remove_tree(parent)
            parent = parent.parent
    return removed
