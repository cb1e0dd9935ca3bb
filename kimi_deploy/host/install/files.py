"""The files ``install`` puts on a host for a profile, by host path, and what their bytes say.

:func:`desired_files` renders the profile's ``systemd`` target (:func:`kimi_deploy.targets.registry.render`) for one host
and adds the profile copy; :func:`target_host_path` places a rendered file on the host; :func:`is_unit` tells a
unit's host path; :func:`units_to_enable` and :func:`uses_api_key` read the rendered files.

Pure: nothing here reads or writes the host (:mod:`kimi_deploy.host.install.facts` reads it,
:mod:`kimi_deploy.host.install.apply` writes it).
"""

from __future__ import annotations

from collections.abc import Mapping

from kimi_deploy import paths
from kimi_deploy.errors import UsageError
from kimi_deploy.host.records import profile_toml
from kimi_deploy.profile import Profile
from kimi_deploy.deployment import Units
from kimi_deploy.targets import file_header
from kimi_deploy.targets.registry import render
from kimi_deploy.targets.systemd import MONITORING_DIR
from kimi_deploy.launch import API_KEY_CREDENTIAL


def target_host_path(file_name: str) -> str:
    """Host path of a rendered file: ``*.env`` in ``/etc/kimi-deploy``, units in ``/etc/systemd/system``."""
    return f"{paths.ETC_DIR}/{file_name}" if file_name.endswith(".env") else f"{paths.SYSTEMD_DIR}/{file_name}"


def desired_files(profile: Profile, sglang_version: str | None = None,
                  host: str | None = None) -> tuple[dict[str, bytes], str]:
    """Host path -> bytes of every file ``install`` puts in place (manifest excluded), and the SGLang version.

    ``host``: for a profile with ``[fleet]``/``[gateway]``, the host whose part to install
    (:func:`kimi_deploy.targets.systemd.host_files`: server units on a node, the gateway unit on the gateway host);
    None for a one-host profile.

    The files are the ``systemd`` target's (:func:`kimi_deploy.targets.registry.render`), less its ``monitoring/`` files.

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.targets.systemd.render`; a fleet without ``host``.
    """
    rendered = render("systemd", profile, sglang_version)
    if profile.hosts():
        if host is None:
            raise UsageError("the profile describes several hosts; say which one this is",
                             hint="pass --host NAME (a node or the gateway host of the profile)")
        folder = f"{host}/"  # the systemd target's folder of this host (kimi_deploy.targets.systemd.host_files)
        part = {name.removeprefix(folder): text for name, text in rendered.files.items() if name.startswith(folder)}
    else:  # the monitoring files belong on the Prometheus host
        part = {name: text for name, text in rendered.files.items() if not name.startswith(f"{MONITORING_DIR}/")}
    files = {target_host_path(name): text.encode() for name, text in part.items()}
    header = file_header(profile, rendered.launch.sglang_version)
    files[paths.service_profile_copy(profile.service.name)] = profile_toml(profile, header).encode()
    return files, rendered.launch.sglang_version


def units_to_enable(units: Units, files: Mapping[str, bytes]) -> list[str]:
    """The units ``install`` enables among ``files``: the server and/or gateway unit and their check timers
    (``units``: the resolved deployment's, :attr:`kimi_deploy.deployment.Deployment.units`)."""
    names = [units.server, units.check_timer, *((units.gateway, units.gateway_check_timer) if units.gateway else ())]
    return [u for u in names if u and f"{paths.SYSTEMD_DIR}/{u}" in files]


def uses_api_key(files: Mapping[str, bytes]) -> bool:
    """True when one of the unit files among ``files`` loads the API key (``LoadCredential=api-key:...``): a
    server that serves HTTP, the gateway, a check. A rank >= 1 of a multi-node group does not, so its host
    neither needs nor gets the key file."""

    needle = f"\nLoadCredential={API_KEY_CREDENTIAL}:".encode()
    return any(needle in data for hp, data in files.items() if is_unit(hp))


def is_unit(host_path: str) -> bool:
    """True for the host path of a unit file (``/etc/systemd/system/*.service`` or ``*.timer``)."""
    return host_path.startswith(paths.SYSTEMD_DIR + "/") and host_path.endswith((".service", ".timer"))
