"""Cross-field rules of a profile: one ``location: problem; fix`` line per violation.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import functools
import re

from kimi_deploy.argv import expansions
from kimi_deploy.names import gateway_service, node_url
from kimi_deploy.options import CACHE_ENV, owned_env, owned_flags, secret_flags
from kimi_deploy.paths import service_api_key_file
from kimi_deploy.profile.model import NIC_ENV, Profile, RANK_DUMMY_HEALTH
from kimi_deploy.wire.net import host_key, is_loopback, not_one_host
from kimi_deploy import proc, versions


#: Environment variables kimi-deploy owns; setting them in ``[environment]`` is an
#: error that names the profile field to use instead. Both halves are read off the option table: the rows'
#: variables (``owned_env``) and the cache variables (``CACHE_ENV``).
RESERVED_ENV = {
    **{name: f"[sglang] {key}" for name, key in owned_env().items()},
    **{var.name: "[service] cache_dir" for var in CACHE_ENV},
}


def check_rules(profile: Profile) -> list[str]:
    """Cross-field rules; returns one ``location: problem; fix`` line per violation (empty: valid).

    Rules (sources: SGLang 0.5.23 ``srt/arg_groups/speculative_hook.py`` and the
    deployment notes): TP divides the GPU count; steps/topk/draft tokens come as a
    set with an algorithm; EAGLE needs a draft model; topk 1 means draft tokens =
    steps + 1 (SGLang silently rewrites it otherwise); spec v2 needs topk 1; a
    non-loopback host needs an API key unless ``allow_unauthenticated``.
    """
    s, svc = profile.sglang, profile.service
    problems: list[str] = []
    pp = s.pp_size or 1
    if profile.nodes_per_copy > 1:
        pass  # a multi-node group: fleet_problems requires tp_size * pp_size == gpu_count * nodes
    elif pp == 1 and (s.tp_size > svc.gpu_count or svc.gpu_count % s.tp_size):
        problems.append(
            f"sglang.tp_size: {s.tp_size} does not divide service.gpu_count = {svc.gpu_count}; "
            f"use a tp_size that divides {svc.gpu_count} (e.g. {svc.gpu_count}) or fix gpu_count")
    elif pp > 1 and (s.tp_size * pp > svc.gpu_count or svc.gpu_count % (s.tp_size * pp)):
        problems.append(
            f"sglang.pp_size: tp_size * pp_size = {s.tp_size} * {pp} = {s.tp_size * pp} GPUs does not divide "
            f"service.gpu_count = {svc.gpu_count}; use tp_size * pp_size = {svc.gpu_count} or fix gpu_count")
    spec = {"speculative_num_steps": s.speculative_num_steps,
            "speculative_eagle_topk": s.speculative_eagle_topk,
            "speculative_num_draft_tokens": s.speculative_num_draft_tokens}
    given = [k for k, v in spec.items() if v is not None]
    if given and len(given) != 3:
        missing = sorted(set(spec) - set(given))
        problems.append(
            f"sglang.{given[0]}: speculative steps, topk and draft tokens must be set together "
            f"(SGLang picks all three or none); set {', '.join(missing)} too, or remove {', '.join(given)}")
    if given and s.speculative_algorithm is None:
        problems.append("sglang.speculative_algorithm: speculative settings are given but no algorithm; "
                        "set speculative_algorithm = \"EAGLE3\"")
    if s.speculative_algorithm in ("EAGLE", "EAGLE3") and not s.speculative_draft_model_path:
        problems.append(f"sglang.speculative_draft_model_path: {s.speculative_algorithm} needs a draft model (without "
                        "one SGLang loads the target again as its draft and runs out of memory, sglang issue "
                        "36528); set the path of e.g. lightseekorg/kimi-k2.5-eagle3-mla")
    if (len(given) == 3 and s.speculative_eagle_topk == 1
            and s.speculative_num_draft_tokens != s.speculative_num_steps + 1):
        problems.append(
            f"sglang.speculative_num_draft_tokens: {s.speculative_num_draft_tokens} with topk 1 and "
            f"{s.speculative_num_steps} steps; SGLang would silently use steps + 1 = "
            f"{s.speculative_num_steps + 1}; set speculative_num_draft_tokens = {s.speculative_num_steps + 1}")
    if s.enable_spec_v2 and s.speculative_eagle_topk not in (None, 1):
        problems.append(
            f"sglang.enable_spec_v2: spec v2 (overlap scheduling) supports only speculative_eagle_topk = 1, "
            f"got {s.speculative_eagle_topk}; set speculative_eagle_topk = 1 or enable_spec_v2 = false")
    if s.enable_spec_v2 and s.disable_overlap_schedule:
        problems.append("sglang.enable_spec_v2: spec v2 is overlap scheduling, but disable_overlap_schedule = true; "
                        "drop one of the two")
    if s.enable_spec_v2 and s.speculative_algorithm is None:
        problems.append("sglang.enable_spec_v2: spec v2 applies to speculative decoding, but no "
                        "speculative_algorithm is set; set one or remove enable_spec_v2")
    if s.flashinfer_allreduce_fusion_backend and s.enforce_disable_flashinfer_allreduce_fusion:
        problems.append("sglang.flashinfer_allreduce_fusion_backend: set together with "
                        "enforce_disable_flashinfer_allreduce_fusion = true; keep one")
    if not profile.is_loopback and not s.api_key_file and not s.allow_unauthenticated:
        problems.append(
            f"sglang.host: {s.host} accepts connections from other machines but no api_key_file is set; "
            "set api_key_file = \"/etc/kimi-deploy/<name>.api-key\", bind host = \"127.0.0.1\", "
            "or set allow_unauthenticated = true")
    for key in profile.environment:
        if key in RESERVED_ENV:
            gone = [r for r in versions.REMOVED if r.kind == "env" and r.name == key]
            note = (f" (and SGLang {gone[0].since}+ {gone[0].how} it: set there, it changes nothing)"
                    if gone else "")
            problems.append(f"environment.{key}: kimi-deploy sets this variable itself{note}; use {RESERVED_ENV[key]}")
    problems += extra_args_problems(s.extra_args)
    problems += monitoring_problems(profile)
    problems += fleet_problems(profile)
    problems += gateway_problems(profile)
    return problems


def _is_wildcard(host: str) -> bool:
    """True for the addresses that mean "every address of this host" (``0.0.0.0``, ``::``)."""
    return host in ("0.0.0.0", "::")


def fleet_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[fleet]`` (empty without it); one ``location: problem; fix`` line each.

    Every replica has the same number of nodes (one shape: Kubernetes and the gateway treat replicas alike);
    no node twice; a multi-node group (SGLang 0.5.23 ``--nnodes``) needs ``dist_init_port`` and ``nic``, a
    non-loopback rank 0 (the other ranks connect to it) and ``tp_size * pp_size == gpu_count * nodes``
    (SGLang divides the world evenly across nodes); the multi-node keys are refused on single-node replicas;
    each serving node must be reachable at its worker URL, so ``[sglang] host`` is a wildcard or that node.
    """
    fleet = profile.fleet
    if fleet is None:
        return []
    s, svc = profile.sglang, profile.service
    problems: list[str] = []
    sizes = [len(r.nodes) for r in fleet.replicas]
    if len(set(sizes)) > 1:
        problems.append(f"fleet.replicas: the replicas have {', '.join(map(str, sizes))} nodes; every replica is "
                        f"one full copy of the model and needs the same number of nodes (e.g. {sizes[0]})")
    seen: dict[str, tuple[int, str]] = {}
    for index, replica in enumerate(fleet.replicas):
        for node in replica.nodes:
            why = not_one_host(node)
            if why:
                problems.append(f"fleet.replicas.{index}.nodes: {node} is not the address of one host ({why}); "
                                "list the node's own address or name")
            key = host_key(node)
            if key in seen:
                first, spelled = seen[key]
                where = "twice in the same replica" if first == index else f"in replicas {first} and {index}"
                alias = f" (as {spelled})" if spelled != node else ""
                problems.append(f"fleet.replicas.{index}.nodes: {node} is listed {where}{alias}; a host serves "
                                "one node of one replica, list each host once")
            else:
                seen[key] = (index, node)
    nodes = sizes[0]
    if nodes > 1:
        for key in ("dist_init_port", "nic"):
            if getattr(fleet, key) is None:
                example = "dist_init_port = 20000" if key == "dist_init_port" else 'nic = "ens5f0"'
                problems.append(f"fleet.{key}: required when a replica has more than one node ({nodes}); "
                                f"set e.g. {example}" + (" (the data NIC, see `ip -br addr`)" if key == "nic" else ""))
        for index, replica in enumerate(fleet.replicas):
            if is_loopback(replica.nodes[0]):
                problems.append(f"fleet.replicas.{index}.nodes: rank 0 is {replica.nodes[0]}, a loopback address "
                                "the other ranks cannot reach; list the address of rank 0's data NIC first")
        world, pp = s.tp_size * (s.pp_size or 1), s.pp_size or 1
        if world != svc.gpu_count * nodes:
            problems.append(f"sglang.tp_size: tp_size * pp_size = {s.tp_size} * {pp} = {world}, but {nodes} nodes "
                            f"of service.gpu_count = {svc.gpu_count} are {svc.gpu_count * nodes} GPUs; set "
                            f"tp_size * pp_size = {svc.gpu_count * nodes} (e.g. tp_size = {svc.gpu_count}, "
                            f"pp_size = {nodes}) or fix gpu_count")
        if fleet.dist_init_port is not None and fleet.dist_init_port == s.port:
            problems.append(f"fleet.dist_init_port: {fleet.dist_init_port} is also [sglang] port on rank 0; "
                            "choose another port, e.g. 20000")
    else:
        for key in ("dist_init_port", "nic", "dist_timeout"):
            if getattr(fleet, key) is not None:
                problems.append(f"fleet.{key}: applies to multi-node replicas only, and every replica has one node; "
                                "remove it")
    for index, replica in enumerate(fleet.replicas):
        node = replica.nodes[0]
        if not _is_wildcard(s.host) and s.host != node:
            problems.append(f"sglang.host: {s.host} on replica {index}, whose worker URL is "
                            f"{node_url(node, s.port)}; in a fleet set host = \"0.0.0.0\" (each node's own "
                            f"addresses) or list {s.host} as that replica's node")
            break
    if nodes > 1:
        for key in NIC_ENV:
            if key in profile.environment:
                problems.append(f"environment.{key}: the kit sets it on every rank from [fleet] nic; "
                                "remove it and set nic")
    return problems


def gateway_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[gateway]`` (empty without it); one ``location: problem; fix`` line each.

    The gateway needs replicas to route to (``[fleet]``); its port, its metrics port and, on a host that
    is also a node, SGLang's port and the rendezvous port are distinct; it uses ``[sglang] api_key_file``
    (one key end to end), so a non-loopback ``bind`` without a key needs ``allow_unauthenticated`` as the
    server does; the workers must accept connections from the gateway's host.
    """
    gw = profile.gateway
    if gw is None:
        return []
    s, fleet = profile.sglang, profile.fleet
    problems: list[str] = []
    if fleet is None:
        problems.append("gateway: a gateway routes to replicas, but there is no [fleet]; add [fleet] with "
                        "[[fleet.replicas]] nodes = [\"HOST\"] for each server, or remove [gateway]")
    if gw.port == gw.prometheus_port and gw.bind == gw.prometheus_host:
        problems.append(f"gateway.prometheus_port: {gw.prometheus_port} is also gateway.port; "
                        "choose another port, e.g. 29000")
    elif gw.port == gw.prometheus_port:
        problems.append(f"gateway.prometheus_port: {gw.prometheus_port} is also gateway.port on the same host; "
                        "choose another port, e.g. 29000")
    why = not_one_host(gw.host)
    if why:
        problems.append(f"gateway.host: {gw.host} is not the address of one host ({why}); name the machine that "
                        "runs the gateway (its address or name) and set bind for the addresses it listens on")
    gw_key = host_key(gw.host)
    nodes = [host_key(node) for nodes in profile.replicas for node in nodes]
    if gw_key in nodes:
        serving = gw_key in [host_key(r[0]) for r in profile.replicas]
        for key in ("port", "prometheus_port"):
            port = getattr(gw, key)
            if serving and port == s.port:
                problems.append(f"gateway.{key}: {port} is also [sglang] port on {gw.host}, which serves a "
                                f"replica; choose another port (e.g. {s.port + 1})")
            if fleet and fleet.dist_init_port == port and profile.nodes_per_copy > 1 and serving:
                problems.append(f"gateway.{key}: {port} is also [fleet] dist_init_port on {gw.host}; "
                                "choose another port")
    dummy_host, dummy_port = RANK_DUMMY_HEALTH
    for index, replica in enumerate(profile.replicas):
        rank = next((r for r, node in enumerate(replica) if r and host_key(node) == gw_key), None)
        for key, host in (("port", gw.bind), ("prometheus_port", gw.prometheus_host)):
            if rank is not None and getattr(gw, key) == dummy_port and (_is_wildcard(host) or host == dummy_host):
                problems.append(f"gateway.{key}: {dummy_port} on {gw.host} is where rank {rank} of replica {index} "
                                f"serves SGLang's dummy /health ({dummy_host}:{dummy_port}); choose another port "
                                f"(e.g. {dummy_port + 1})")
    if not is_loopback(gw.bind) and not s.api_key_file and not s.allow_unauthenticated:
        problems.append(
            f"gateway.bind: {gw.bind} accepts connections from other machines but [sglang] api_key_file is not "
            "set (the gateway uses the workers' key: one key end to end); set [sglang] api_key_file, bind "
            "\"127.0.0.1\", or set [sglang] allow_unauthenticated = true")
    remote = [node for node in (r[0] for r in profile.replicas) if host_key(node) != gw_key]
    if not is_loopback(gw.host):
        for index, replica in enumerate(profile.replicas):
            if is_loopback(replica[0]):
                problems.append(f"fleet.replicas.{index}.nodes: {replica[0]} is a loopback address, which the "
                                f"gateway on {gw.host} cannot reach (it would reach itself); list the node by an "
                                "address the gateway host reaches")
    if remote and is_loopback(s.host):
        problems.append(f"sglang.host: {s.host} accepts only local connections, but the gateway on {gw.host} "
                        f"reaches {remote[0]} over the network; set host = \"0.0.0.0\" with api_key_file")
    return problems


def monitoring_problems(profile: Profile) -> list[str]:
    """Cross-field rules of ``[monitoring]``: thresholds that could never fire or always fire, clashing jobs."""
    s, m = profile.sglang, profile.monitoring
    problems: list[str] = []
    jobs = [j for j in (m.job or profile.service.name, m.check_job or f"{profile.service.name}-check",
                        (m.gateway_job or gateway_service(profile.service.name)) if m.gateway else None) if j]
    if len(set(jobs)) != len(jobs):
        problems.append(f"monitoring.job: the server, check and gateway jobs must differ, got {', '.join(jobs)}; "
                        "set job, check_job and gateway_job to distinct names")
    if m.gateway_job and not m.gateway:
        problems.append("monitoring.gateway_job: set without monitoring.gateway; set gateway = \"HOST:PORT\" of "
                        "smg's --prometheus-port, or remove gateway_job")
    if m.spec_accept_length_min is not None and s.speculative_algorithm is None:
        problems.append("monitoring.spec_accept_length_min: no speculative_algorithm is set, so SGLang reports no "
                        "accept length; remove it or enable speculative decoding")
    if (m.spec_accept_length_min is not None and s.speculative_num_draft_tokens is not None
            and m.spec_accept_length_min > s.speculative_num_draft_tokens):
        problems.append(f"monitoring.spec_accept_length_min: {m.spec_accept_length_min} is above "
                        f"speculative_num_draft_tokens = {s.speculative_num_draft_tokens}, the most a step can "
                        "accept, so the alert would always fire; use a value such as 1.5")
    if (m.running_limit is not None and s.max_running_requests is not None
            and m.running_limit > s.max_running_requests):
        problems.append(f"monitoring.running_limit: {m.running_limit} is above sglang.max_running_requests = "
                        f"{s.max_running_requests}, which SGLang never exceeds, so the queue alert could never "
                        "fire; remove running_limit or lower it")
    return problems


#: argparse's test for a negative number (``argparse._negative_number_matcher``): such an argument is a value.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def extra_args_problems(extra_args: list[str] | tuple[str, ...]) -> list[str]:
    """One ``sglang.extra_args: ...`` line per argument that would set what the kit owns (empty: fine).

    Owned: every flag of :data:`kimi_deploy.options.OPTIONS` in any release, its aliases and ``--api-key``/
    ``--admin-api-key``/``--config`` (:func:`kimi_deploy.options.owned_flags`), also as ``--flag=value`` and
    as any prefix argparse would expand to it (SGLang's parser has ``allow_abbrev``: ``--hos`` is ``--host``;
    in 0.5.23 no other option is a prefix of an owned flag, so every such prefix is an abbreviation of it
    or ambiguous). Also refused: ``--`` (ends option parsing) and single-dash options (``-h`` prints help
    and exits 0, which ``Restart=on-failure`` does not restart); negative numbers stay values.
    """
    owned = owned_flags()
    problems: list[str] = []
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if arg == "--":
            problems.append("sglang.extra_args: '--' would end SGLang's option parsing; remove it")
        elif name.startswith("--"):
            hits = expansions(name, owned)
            if not hits:
                continue
            keys = sorted({owned[flag] for flag in hits})
            if set(hits) & set(secret_flags()):
                problems.append(f"sglang.extra_args: {name} would put an API key on the command line, visible in "
                                "ps and logs; use api_key_file")
                continue
            spelled = hits[0] if len(hits) == 1 else f"one of {', '.join(hits)}"
            use = " or ".join(k if k.startswith("[") else f"[sglang] {k}" for k in keys)
            problems.append(f"sglang.extra_args: {arg!r} sets {spelled}, which the kit sets from the profile; "
                            f"use {use} instead")
        elif name.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(arg):
            problems.append(f"sglang.extra_args: {arg!r} is a single-dash option (SGLang has only -h, which prints "
                            "help and exits); spell options with --")
    return problems


def default_api_key_file(service_name: str) -> str:
    """The API key file a profile for ``service_name`` starts from: ``/etc/kimi-deploy/<name>.api-key``
    (``kimi-deploy init --name``; the warning of :func:`naming_warnings`)."""
    return service_api_key_file(service_name)


def naming_warnings(profile: "Profile") -> list[str]:
    """Warnings (not errors) for paths named after another service: ``api_key_file`` of the form
    ``/etc/kimi-deploy/<other>.api-key`` where ``<other>`` is not ``[service] name`` (a profile from
    ``init`` whose service was renamed; install would create a key file named after another service).
    Sharing one key file between services on purpose is allowed, hence a warning."""
    key = profile.sglang.api_key_file
    name = profile.service.name
    prefix, suffix = service_api_key_file("\0").split("\0")
    if not key or not key.startswith(prefix) or not key.endswith(suffix):
        return []
    other = key.removeprefix(prefix).removesuffix(suffix)
    if other == name or "/" in other:
        return []
    return [f"[sglang] api_key_file {key} is named after service {other!r}, not this service ({name!r}); "
            f"if the service was renamed, set api_key_file = \"{default_api_key_file(name)}\" (keep it only to share "
            "one key between services on purpose)"]


@functools.lru_cache(maxsize=64)
def calendar_problem(spec: str) -> str | None:
    """Why systemd would reject ``spec`` as ``OnCalendar=``, or None when it accepts it.

    Asks ``systemd-analyze calendar`` (the parser systemd itself uses) when it is on PATH;
    without it the spec is accepted here and ``systemd-analyze verify``/``install`` catch it. Called when the
    timer is rendered (:func:`kimi_deploy.targets.systemd.render`), not when a profile loads: loading a profile
    spawns no process (``render --print-command`` needs no timer).
    """

    if proc.which("systemd-analyze") is None:
        return None
    done = proc.run(["systemd-analyze", "calendar", spec], check=False, timeout=30)
    if done.ok:
        return None
    reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["rejected"]
    return (f"systemd rejects {spec!r} ({reason[0]}); use a calendar spec such as \"*-*-* 03:00:00\" or \"daily\" "
            "(man systemd.time)")
