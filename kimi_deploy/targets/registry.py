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
from kimi_deploy.profile import Profile
from kimi_deploy.targets import TARGETS, Artefacts, kubernetes, litellm, monitoring, systemd


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
)}


def render(name: str, profile: Profile, sglang_version: str | None = None, **options: Any) -> Artefacts:
    """Target ``name``'s artefacts of ``profile`` for SGLang ``sglang_version`` (default 0.5.23); ``options``
    are the target's own keywords (systemd: ``components``).

    Raises:
        KeyError: not a row of :data:`REGISTRY` (the CLI offers only the rows).
        ProfileError / UsageError / UnsupportedVersionError / RefusedError: the target's, before anything is
            written (a model that cannot fit: :meth:`kimi_deploy.deployment.Deployment.require_fit`).
    """
    entry = REGISTRY[name].artefacts
    resolve(profile, sglang_version).require_fit()  # every target, a server's or not: the same refusal
    return entry(profile, sglang_version, **options)
