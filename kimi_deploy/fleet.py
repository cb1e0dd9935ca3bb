"""One profile, several hosts: what each host of a ``[fleet]``/``[gateway]`` installs, and which host this is.

:func:`host_files` maps every host of the profile (:meth:`kimi_deploy.profile.Profile.hosts`) to the rendered
files it installs: a node of a single-node replica gets the server unit, its EnvironmentFile and the nightly
check units (exactly what one host gets without ``[fleet]``); the gateway host gets the gateway unit
(:mod:`kimi_deploy.host.gateway`) and its nightly ``check --each-worker`` units; a host that is both gets both. ``render --out DIR`` writes them to
``DIR/<host>/``; ``install --host NAME`` (or the host found by its own addresses, :func:`pick_host`)
installs that host's part. The kit never connects to another host: the operator copies the folders with
the tool they already use (production.md: a loop over ssh, Ansible with ``serial: 1``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from kimi_deploy.errors import UsageError
from kimi_deploy.profile import Profile, host_key


def gateway_files(profile: Profile, header: str) -> dict[str, str]:
    """File name -> text of the gateway host's part: ``<name>-gateway.service`` (empty without ``[gateway]``)."""
    if profile.gateway is None:
        return {}
    from kimi_deploy import launch, names, paths
    from kimi_deploy.host import gateway
    from kimi_deploy.targets.systemd import _environment

    svc = profile.service
    unit = names.check_unit(names.gateway_service(svc.name))
    check_command = " ".join(names.check_argv(
        svc.kimi_deploy, paths.service_profile_copy(svc.name), each_worker=True,
        api_key_file=f"%d/{launch.API_KEY_CREDENTIAL}" if profile.sglang.api_key_file else None,
        json=paths.gateway_check_report(svc.name)))
    context = {"header": header, "svc": svc, "s": profile.sglang, "gw": profile.gateway,
               "workers": profile.worker_urls(), "api_key_credential": launch.API_KEY_CREDENTIAL,
               "exec_start": gateway.exec_start(gateway.gateway_argv(profile)), "check_command": check_command,
               "check_unit": unit}
    env = _environment()
    return {names.gateway_unit(svc.name): env.get_template("gateway.service.j2").render(context),
            f"{unit}.service": env.get_template("check.service.j2").render(context),
            f"{unit}.timer": env.get_template("check.timer.j2").render(context)}


def is_node(profile: Profile, host: str) -> bool:
    """True when ``host`` runs a node of a replica (one host however spelt: :func:`kimi_deploy.profile.host_key`)."""
    return any(host_key(host) == host_key(node) for nodes in profile.replicas for node in nodes)


def host_files(profile: Profile, sglang_version: str | None = None) -> dict[str, dict[str, str]]:
    """Host -> (file name -> text) for every host of the profile, in :meth:`Profile.hosts` order.

    Server files are :func:`kimi_deploy.targets.systemd.render`'s (the monitoring files stay with the Prometheus
    host: ``render`` writes them once, beside the host folders); a node of a multi-node replica gets its
    rank's files (:func:`kimi_deploy.topology.render_ranks`: rank 0 as a single node, ranks >= 1 the server unit
    and env file only).

    Raises:
        UsageError: the profile has no ``[fleet]``/``[gateway]``.
    """
    from kimi_deploy.targets.systemd import file_header, render

    hosts = profile.hosts()
    if not hosts:
        raise UsageError("the profile has no [fleet] or [gateway]: it describes one host",
                         hint="render without per-host folders, or add [fleet] (production.md)")
    from kimi_deploy.topology import render_ranks

    rendered = render(profile, sglang_version)
    header = file_header(profile, rendered.launch.sglang_version)
    gateway = gateway_files(profile, header)
    ranks = render_ranks(profile, rendered.launch.sglang_version)
    parts: dict[str, dict[str, str]] = {}
    for host in hosts:
        files: dict[str, str] = {}
        if host in ranks:
            files.update(ranks[host])
        elif is_node(profile, host):
            files.update(rendered.files)
        if profile.gateway is not None and host_key(host) == host_key(profile.gateway.host):
            files.update(gateway)
        parts[host] = files
    return parts


def parse_ip_addr_json(text: str) -> frozenset[str]:
    """Every local address in ``ip -j addr show`` output (iproute2's JSON: ``[{"addr_info": [{"local": ...}]}]``).

    Raises:
        ValueError: not that JSON.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("ip -j addr: expected a JSON list")
    found = set()
    for link in data:
        for info in (link.get("addr_info") or []) if isinstance(link, dict) else []:
            if isinstance(info, dict) and isinstance(info.get("local"), str):
                found.add(info["local"])
    return frozenset(found)


def local_addresses() -> frozenset[str]:
    """This host's addresses (``ip -j addr show``) and names (``socket.gethostname()`` and its FQDN).

    Raises:
        ExternalCommandError: ``ip`` failed.
    """
    import socket

    from kimi_deploy import proc

    done = proc.run(["ip", "-j", "addr", "show"], check=True, timeout=30)
    names = {socket.gethostname(), socket.getfqdn()}
    return parse_ip_addr_json(done.stdout) | frozenset(n for n in names if n)


def _same(a: str, b: str) -> bool:
    return host_key(a) == host_key(b)


def pick_host(profile: Profile, host: str | None, addresses: Iterable[str] | None = None) -> str:
    """Which host of the profile this is: ``host`` (``--host``) when given, else the one host whose name or
    address is among ``addresses`` (:func:`local_addresses` when None).

    Raises:
        UsageError: ``host`` is not one of the profile's hosts; no host, or more than one, matches.
    """
    hosts = profile.hosts()
    if host is not None:
        match = [h for h in hosts if _same(h, host)]
        if not match:
            raise UsageError("--host is not a host of the profile", value=host,
                             hint=f"use one of {', '.join(hosts)}")
        return match[0]
    own = list(local_addresses() if addresses is None else addresses)
    matches = [h for h in hosts if any(_same(h, a) for a in own)]
    if len(matches) != 1:
        found = "none" if not matches else ", ".join(matches)
        raise UsageError(f"cannot tell which host of the profile this is (matching: {found})",
                         value=", ".join(sorted(own))[:300], hint=f"pass --host with one of {', '.join(hosts)}")
    return matches[0]


def files_of(parts: Mapping[str, Mapping[str, str]], host: str) -> Mapping[str, str]:
    """``parts[host]`` (:func:`host_files`), or an empty mapping for a host with nothing to install."""
    return parts.get(host, {})
