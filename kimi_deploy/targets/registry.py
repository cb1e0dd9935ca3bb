"""The target registry: every target module imported and listed with its typed entry.

:data:`REGISTRY` maps each name of :data:`kimi_deploy.targets.TARGETS` to a :class:`Target` whose ``artefacts``
is the module's own function (no import by string: a reader and a static tool follow the render path from
here). Importing this module loads every target (the Grafana SDK and the YAML writers among them); the CLI's
``--help`` and ``render --print-command`` read only :data:`kimi_deploy.targets.TARGETS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from kimi_deploy.deployment import resolve
from kimi_deploy.errors import ProfileError
from kimi_deploy.profile import Profile
from kimi_deploy.profile.examples import example_values
from kimi_deploy.profile.monitoring import runbook_is_absolute, runbook_problem
from kimi_deploy.targets import TARGETS, Artefacts, ansible, kubernetes, litellm, monitoring, systemd


class ArtefactsEntry(Protocol):
    """A target module's entry: ``artefacts(profile, sglang_version, **its own keywords) -> Artefacts``."""

    def __call__(self, profile: Profile, sglang_version: str | None = None, **options: Any) -> Artefacts: ...


@dataclasses.dataclass(frozen=True)
class Target:
    """One row of the registry: the target's ``name``, its ``render --target`` help line, its entry."""

    name: str
    help: str
    artefacts: ArtefactsEntry


REGISTRY: dict[str, Target] = {t.name: t for t in (
    Target("systemd", TARGETS["systemd"], systemd.artefacts),
    Target("kubernetes", TARGETS["kubernetes"], kubernetes.artefacts),
    Target("monitoring", TARGETS["monitoring"], monitoring.artefacts),
    Target("litellm", TARGETS["litellm"], litellm.artefacts),
    Target("ansible", TARGETS["ansible"], ansible.artefacts),
)}


def render(name: str, profile: Profile, sglang_version: str | None = None, **options: Any) -> Artefacts:
    """Target ``name``'s artefacts of ``profile`` for SGLang ``sglang_version`` (default 0.5.23); ``options``
    are the target's own keywords (systemd: ``components``).

    Raises:
        KeyError: not a row of :data:`REGISTRY` (the CLI offers only the rows).
        ProfileError / UsageError / UnsupportedVersionError / RefusedError: the target's, before anything is
            written (a model that cannot fit: :meth:`kimi_deploy.deployment.Deployment.require_fit`);
            ProfileError too while the profile holds an example value ``init`` wrote
            (:func:`kimi_deploy.profile.examples.example_values`, with the relative runbook link of a cluster), or when alert rules for a fleet or a
            cluster would link to a relative ``runbook_url`` (a single host gets a warning).
    """
    entry = REGISTRY[name].artefacts
    relative = _links_runbook(name, profile) and not runbook_is_absolute(profile.monitoring.runbook_url)
    cluster = profile.fleet is not None or name == "kubernetes"
    line = runbook_problem(profile.monitoring.runbook_url, refuse=cluster) if relative else None
    found = example_values(profile)
    if found:  # with the runbook link a cluster also needs: one refusal lists every value to replace
        raise ProfileError("the profile still holds example values, which name no real host or image",
                           problems=[f"{where}: {value!r}" for where, value in found]
                           + ([line] if line and cluster else []),
                           hint="replace the example value with your own (your hosts' addresses, your registry's "
                                "images" + (", an absolute https:// runbook_url" if line and cluster else "")
                                + "), then render again")
    resolve(profile, sglang_version).require_fit()  # every target, a server's or not: the same refusal
    if line is None:
        return entry(profile, sglang_version, **options)
    if cluster:
        raise ProfileError("the alerts would link to a relative runbook", problems=[line],
                           hint="set [monitoring] runbook_url to an absolute https:// URL")
    rendered = entry(profile, sglang_version, **options)
    return dataclasses.replace(rendered, warnings=(*rendered.warnings, line))


def _links_runbook(name: str, profile: Profile) -> bool:
    """Whether target ``name`` renders alert rules for ``profile``, whose ``runbook_url`` annotations link into
    ``[monitoring] runbook_url``: the systemd and monitoring targets with metrics on, the kubernetes target with
    metrics on and a PrometheusRule (``scrape = "prometheus-operator"``)."""
    if not profile.sglang.enable_metrics or name not in ("systemd", "monitoring", "kubernetes"):
        return False
    return name != "kubernetes" or (profile.kubernetes is not None
                                    and profile.kubernetes.scrape == "prometheus-operator")
