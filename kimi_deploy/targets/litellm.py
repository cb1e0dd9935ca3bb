"""The ``litellm`` target: a LiteLLM proxy ``config.yaml`` with the kit's tool-call-id hook
(:mod:`kimi_deploy.litellm_hook`) in front of the profile's server.

For clients that reach a Kimi K2.x server through LiteLLM: the proxy serves the profile's model under its served
name (``[sglang] served_model_name``, else ``model_path``), sending to the profile's server (:attr:`Profile.base_url`
from this host, or the gateway with ``[gateway]``) with the key in ``$KIMI_DEPLOY_API_KEY`` when the profile has one.
The hook module must be importable by the proxy's interpreter (:mod:`kimi_deploy.litellm_hook`).
"""

from __future__ import annotations

from pathlib import Path

from kimi_deploy import versions
from kimi_deploy.deployment import resolve
from kimi_deploy.litellm_hook import Upstream, proxy_config
from kimi_deploy.profile import Profile
from kimi_deploy.targets import Artefacts
from kimi_deploy.wire.apikey import ENV_VAR

#: The file the target renders.
CONFIG = "litellm-config.yaml"


def upstream(profile: Profile) -> tuple[str, Upstream]:
    """``(client-facing model name, Upstream)`` of the profile's server: its gateway with ``[gateway]`` (the
    gateway host, or its bind address when that is not a wildcard), else :attr:`Profile.base_url`."""
    deployment = resolve(profile, launches=False)  # the URLs, the key path and the served name
    base = deployment.gateway_url or deployment.base_url
    model = deployment.served_model
    return model, Upstream(base_url=f"{base}/v1", model=model,
                           api_key_env=ENV_VAR if deployment.api_key_file else None)


def artefacts(profile: Profile, sglang_version: str | None = None) -> Artefacts:
    """The ``litellm`` target (:mod:`kimi_deploy.targets`): ``litellm-config.yaml`` (:func:`proxy_config`)."""
    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version
    name, up = upstream(profile)
    files = {CONFIG: proxy_config({name: up})}

    def describe(out_dir: Path | None) -> dict[str, object]:
        return {"target": "litellm", "sglang_version": version, "profile_sha256": profile.digest(),
                "files": {n: str(out_dir / n) if out_dir else None for n in files}}

    return Artefacts("litellm", files, describe)
