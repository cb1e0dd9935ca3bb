"""Profile -> Kubernetes manifests: one LeaderWorkerSet for the model copies, Services, the gateway, the check.

``render --target kubernetes --out DIR`` writes plain YAML (no Helm) and a ``kustomization.yaml``, so
``kubectl apply -k DIR`` applies it. :func:`render` is pure and deterministic, like the systemd render.

What is rendered (``<n>`` is ``[kubernetes] name``, default ``[service] name``):

- ``server-leaderworkerset.yaml``: a LeaderWorkerSet (kubernetes-sigs/lws, ``leaderworkerset.x-k8s.io/v1``)
  with ``replicas`` = the fleet's copies and ``size`` = nodes per copy (:func:`fleet_shape`). Every pod
  runs SGLang's command from the same option table as the systemd unit (:func:`kimi_deploy.launch.
  build_launch`); the multi-node flags take LWS's injected ``$(LWS_LEADER_ADDRESS)``, ``$(LWS_GROUP_SIZE)``
  and ``$(LWS_WORKER_INDEX)`` (Kubernetes expands ``$(VAR)`` in ``args`` from the container's environment).
  Options whose table scope is "serving rank only" (host, port, parsers, the key) are on the leader only, and so
  are the probes: ranks >= 1 answer ``/health`` with a dummy 200 (SGLang 0.5.23), which proves nothing.
  ``startupPolicy: LeaderCreated``: with ``LeaderReady`` the workers would wait for a leader that cannot
  be ready before they join. ``restartPolicy: RecreateGroupOnPodRestart``: a rank that restarts alone
  would hang joining stale peers (notes/scale-out.md).
- ``server-service.yaml``: a ClusterIP Service ``<n>-leader`` in front of the leaders (LWS itself
  creates the headless Service ``<n>`` the ranks find each other by).
- with ``[gateway]``: ``gateway-rbac.yaml`` (ServiceAccount, Role allowing pods get/list/watch in the
  namespace, RoleBinding), ``gateway-deployment.yaml`` (``gateway_replicas`` smg pods, default 2, spread over
  nodes, with label-selector discovery of the leader pods in this namespace only; readiness on smg's
  ``/readiness``, 503 until a worker is healthy and while smg drains), ``gateway-pdb.yaml`` (at most one gateway
  pod evicted at a time) and ``gateway-service.yaml``.
- Resources: the SGLang pods are Guaranteed QoS (CPU and memory requests = limits: ``[kubernetes] cpu`` and
  ``memory``, default 64 and 512Gi, plus the GPUs; the secrets init container too); the gateway requests
  ``gateway_cpu``/``gateway_memory`` with the memory as its limit; the check is bounded at 2Gi like its unit's
  ``MemoryMax=2G``.
- ``check-configmap.yaml`` (the profile, for the check), ``check-pvc.yaml`` (unless ``check_report_claim``
  names one), ``check-cronjob.yaml``: ``kimi-deploy check`` on ``check_schedule`` writing
  ``check-report.json`` (and ``.xml``) to that claim; with ``[gateway]`` ``check --each-worker`` through the
  gateway's Service, every leader smg lists checked directly, into ``check-workers.json``.
- with ``scrape = "prometheus-operator"`` (the default): ``monitoring-podmonitor.yaml`` (the leaders' ``/metrics``),
  ``monitoring-servicemonitor.yaml`` (smg's metrics port, with ``[gateway]``) and ``monitoring-rules.yaml`` (a
  PrometheusRule with the systemd target's recording and alert rules), labelled with ``monitor_labels``;
  ``scrape = "annotations"``: ``prometheus.io/*`` annotations on the leader and gateway pods instead. The check
  writes ``--prom`` and, with ``pushgateway``, pushes it (``check --pushgateway``) under its Prometheus job.
- ``network-policy.yaml`` (unless ``network_policy = false``): :func:`_network_policies`. Scheduling keys
  (``tolerations``, ``image_pull_secrets``, ``priority_class_name``) go on every pod, ``node_selector`` and
  ``affinity`` on the SGLang pods (:func:`_place`).
- ``namespace.yaml`` with Pod Security admission labels at ``[kubernetes] pod_security`` (default ``restricted``,
  which every rendered pod meets: the weights come from ``model_volume``, a PVC or an image volume).
  ``privileged`` must be set explicitly and is refused unless needed: for a ``hostPath`` model volume or
  ``cache_host_path``, or ``rdma = true`` (hostNetwork); the reason is a comment in the file.

The API key is never in a rendered file, an env variable or argv of SGLang: the operator creates the
Secret (``kubectl create secret generic <secret> --from-file=api-key=FILE``), it is mounted as a file,
and an init container turns it into SGLang's ``--config`` YAML at the same path as the systemd unit
(``/run/<service>/sglang-secrets.yaml``, a memory-backed emptyDir), with the same script
(:data:`kimi_deploy.launch.HOST_SECRETS_SCRIPT`). smg 1.13.0 takes its key only as ``--api-key``: the
gateway pod runs the unit's launcher (:data:`kimi_deploy.launch.LAUNCHER` in ``gateway_python``, with
``CREDENTIALS_DIRECTORY`` naming the mounted Secret), which reads the key and hands it to ``smg.cli.main``
inside the process, so it is in no argv, env or manifest, and an empty key stops the start.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import __version__, names, versions
from kimi_deploy.targets import prometheus as monitoring
from kimi_deploy.errors import ProfileError
from kimi_deploy.deployment import Deployment, resolve
from kimi_deploy.launch import API_KEY_CREDENTIAL, HOST_SECRETS_SCRIPT, LAUNCHER, LaunchSpec, gateway_parser_args
from kimi_deploy.profile import DNS_LABEL, Kubernetes, Profile, dump_profile
from kimi_deploy.targets import FILE_HEADER, GENERATED_PREFIX, Artefacts, ending_in_newline
from kimi_deploy.targets.systemd import CHECK_DEADLINE_S, CHECK_SLACK_S, fleet_check_deadline_s
from kimi_deploy.yamltext import FileMode, dump, dump_all
from kimi_deploy.patching.series import find_series

#: apiVersion of LeaderWorkerSet (kubernetes-sigs/lws v0.10, config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml).
LWS_API = "leaderworkerset.x-k8s.io/v1"
#: Environment LWS injects into every container of a group (kubernetes-sigs/lws, SGLang's LWS example).
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_GROUP_SIZE = "$(LWS_GROUP_SIZE)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
#: GPU resource of NVIDIA's device plugin.
GPU_RESOURCE = "nvidia.com/gpu"
#: Where the API-key Secret is mounted (file ``api-key`` in it) in every pod that needs the key.
SECRET_DIR = "/var/run/secrets/kimi-deploy"
#: Where the check pod finds the profile (ConfigMap) and writes its reports (PVC).
CHECK_PROFILE = "/etc/kimi-deploy/profile.toml"
REPORT_DIR = "/reports"
#: Label keys: Kubernetes' recommended labels (``app.kubernetes.io/*``: ``name`` the application, ``sglang``,
#: ``smg`` or ``kimi-deploy``; ``instance`` ``<n>-<component>``; ``version`` what runs; ``component``;
#: ``part-of`` ``<n>``; ``managed-by``) and the rank role; LWS sets its own (``leaderworkerset.sigs.k8s.io/*``).
#: Selectors use ``instance`` (and the role), never ``version``: a new version rolls the same objects.
INSTANCE_LABEL = "app.kubernetes.io/instance"
ROLE_LABEL = "kimi-deploy.io/role"
#: SGLang's own limit on one health generation (``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s in 0.5.23); the
#: readiness probe's timeout must be above it or a slow but healthy server flaps.
SGLANG_HEALTH_TIMEOUT_S = 20
READINESS_TIMEOUT_S = 30
STARTUP_PERIOD_S = 10
#: Resources of the check's pod. The memory limit is the check unit's ``MemoryMax=2G`` (systemd reads ``G`` as
#: 1024^3, so 2Gi is the same bound; systemd/check.service.j2: a run against SGLang peaks at 71 MB RSS, a hostile
#: 16 MiB JSON body at 1.46 GiB). The request is what a normal run needs, with room.
CHECK_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
#: Resources of the init container that writes SGLang's secrets YAML (one small Python process); equal requests
#: and limits so it does not lower the server pod's Guaranteed QoS (an init container counts).
INIT_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}}
#: smg's probe endpoints (lightseekorg/smg model_gateway/src/server.rs public routes, health.rs): ``/readiness``
#: is 503 until a worker is healthy and while smg drains; ``/liveness`` is 200 while the process serves.
GATEWAY_READINESS_PATH = "/readiness"
GATEWAY_LIVENESS_PATH = "/liveness"
#: Longest ``[kubernetes] name``: CronJob names are at most 52 characters and the kit appends ``-check``;
#: LWS pod names append ``-<group>-<index>``.
MAX_NAME = 40
#: The file ``kubectl apply -k DIR`` reads (kustomize's, not a Kubernetes object).
KUSTOMIZATION = "kustomization.yaml"
#: Order ``kustomization.yaml`` lists the files in (the order ``kubectl apply -k`` creates them).
FILE_ORDER = ("namespace.yaml", "network-policy.yaml", "gateway-rbac.yaml", "check-configmap.yaml", "check-pvc.yaml",
              "server-leaderworkerset.yaml", "server-service.yaml", "gateway-deployment.yaml", "gateway-pdb.yaml",
              "gateway-service.yaml", "check-cronjob.yaml", "monitoring-podmonitor.yaml",
              "monitoring-servicemonitor.yaml", "monitoring-rules.yaml")
#: apiVersion of the Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule (tests/data/crds, 0.93.0).
MONITORING_API = "monitoring.coreos.com/v1"
#: Where the check writes its Prometheus text in its pod (pushed from there with ``[kubernetes] pushgateway``).
CHECK_PROM = "/reports/check.prom"


def quantity_bytes(quantity: str) -> int:
    """Bytes of a memory quantity as the profile allows them (``512Gi``: binary suffixes Ki..Ti)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(quantity[:-2]) * units[quantity[-2:]]


@dataclasses.dataclass(frozen=True)
class FleetShape:
    """What Kubernetes reads of ``[fleet]`` (FLEET.md): ``copies`` of the model, ``nodes`` per copy, ``nic``
    (``[fleet] nic``, the data NIC). The rank flags' values come from the profile itself
    (:func:`kimi_deploy.launch.rank_args`)."""

    copies: int = 1
    nodes: int = 1
    nic: str | None = None


def fleet_shape(profile: Profile) -> FleetShape:
    """The fleet's shape (FLEET.md): :attr:`Profile.copies` x :attr:`Profile.nodes_per_copy`, one by one
    without ``[fleet]``, and ``[fleet] nic``."""
    fleet = profile.fleet
    if fleet is None:
        return FleetShape()
    return FleetShape(copies=profile.copies, nodes=profile.nodes_per_copy, nic=fleet.nic)


def rank_server_args(profile: Profile, launch: LaunchSpec, shape: FleetShape, rank: int,
                     leader: str, *, lws: bool = False, deployment: Deployment | None = None) -> tuple[str, ...]:
    """SGLang's arguments on node rank ``rank`` of a copy whose rank 0 is reachable at ``leader``.

    One node: the launch's arguments unchanged. N nodes: the deployment's for that rank
    (:meth:`kimi_deploy.deployment.Deployment.pod_launch`, default: ``profile`` resolved for the launch's version),
    (the one builder of a rank's arguments: on ranks >= 1 without the rows the table keeps off them, then the
    rank flags); with ``lws``, ``--nnodes`` and ``--node-rank`` take the LWS variables instead of the numbers.
    """
    if shape.nodes == 1:
        return tuple(launch.server_args)
    placeholders = {"node_rank": LWS_WORKER_INDEX, "nnodes": LWS_GROUP_SIZE} if lws else None
    deployment = deployment or resolve(profile, launch.sglang_version)
    return tuple(deployment.pod_launch(rank, leader, placeholders).server_args)


def container_args(profile: Profile, launch: LaunchSpec, shape: FleetShape, *, leader: bool) -> list[str]:
    """The container's ``args``: :func:`rank_server_args` with the LWS variables for the per-rank values."""
    return list(rank_server_args(profile, launch, shape, 0 if leader else 1, LWS_LEADER_ADDRESS, lws=True))


@dataclasses.dataclass(frozen=True)
class Manifests:
    """The result of :func:`render`: ``files`` maps file name -> YAML text in apply order, plus notes."""

    profile: Profile
    launch: LaunchSpec
    shape: FleetShape
    files: Mapping[str, str]
    warnings: tuple[str, ...] = ()


def object_name(profile: Profile) -> str:
    """``[kubernetes] name``, else ``[service] name`` (the rules require it to be a DNS label)."""
    k8s = profile.kubernetes
    return (k8s.name if k8s and k8s.name else None) or profile.service.name


def problems(profile: Profile) -> list[str]:
    """Cross-table rules of ``render --target kubernetes``: one ``key: problem; fix`` line each (empty: fine)."""
    k8s = profile.kubernetes
    if k8s is None:
        table = "".join(f"\n      {line}" for line in MINIMAL_TABLE.splitlines())
        return [f"kubernetes: the profile has no [kubernetes] table, which says what the cluster runs; add at "
                f"least:{table}\n    (`kimi-deploy init --kubernetes` writes it with the optional keys commented; docs/runbook.md#kubernetes)"]
    s, svc = profile.sglang, profile.service
    out: list[str] = []
    name = object_name(profile)

    if not DNS_LABEL.fullmatch(name) or len(name) > MAX_NAME:
        source = "" if k8s.name else " (from [service] name)"
        suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).lstrip("-0123456789")[:MAX_NAME].rstrip("-") \
            or "kimi-k25"
        out.append(f"kubernetes.name: {name!r}{source} is not a DNS label of at most {MAX_NAME} characters, which "
                   "every object name derives from (LWS pods append -<copy>-<rank>, the check's Jobs "
                   f"-<minutes>); set [kubernetes] name = \"{suggestion}\" ({len(suggestion)} characters)")
    if s.host not in ("0.0.0.0", "::"):
        out.append(f"sglang.host: {s.host} cannot be bound in a pod (its address is assigned at start) and "
                   "nothing outside the pod could reach a loopback server; set host = \"0.0.0.0\"")
    if svc.gpu_count > k8s.node_gpus:
        out.append(f"service.gpu_count: {svc.gpu_count} GPUs per pod, but the node type has node_gpus = "
                   f"{k8s.node_gpus}; no node could schedule the pod; lower gpu_count (and tp_size) or set "
                   "node_gpus to what the nodes have")
    for key in ("model_path", "speculative_draft_model_path"):
        path = getattr(s, key)
        if path and not (path + "/").startswith(k8s.model_mount + "/"):
            out.append(f"sglang.{key}: {path} is not under kubernetes.model_mount = {k8s.model_mount}, the only "
                       "model folder mounted in the pod; set model_mount to a folder holding it")
    if quantity_bytes(k8s.shm_size) >= quantity_bytes(k8s.memory):
        out.append(f"kubernetes.shm_size: {k8s.shm_size} of /dev/shm is not below memory = {k8s.memory}: a "
                   "memory-backed emptyDir counts against the pod's memory limit, so SGLang would be OOM-killed "
                   "before it loaded; raise memory (to what the node's Allocatable holds) or lower shm_size")
    if k8s.scrape != "none" and not s.enable_metrics:
        out.append(f"kubernetes.scrape: {k8s.scrape!r}, but [sglang] enable_metrics is off, so SGLang serves no "
                   "/metrics and every server target would be down; set [sglang] enable_metrics = true, or "
                   "scrape = \"none\"")
    if k8s.model_volume is None:
        out.append("kubernetes.model_volume: not set: where do the pods find the weights? set model_volume = "
                   f"{{ persistentVolumeClaim = {{ claimName = \"{name}-weights\" }} }} (a claim you create "
                   "holding the model folder; Pod Security restricted admits it), or an image volume, or a "
                   "hostPath with pod_security = \"privileged\"")
    for need in privileged_needs(k8s):
        if k8s.pod_security != "privileged":
            out.append(f"kubernetes.pod_security: {k8s.pod_security!r}, but {need}, which Pod Security "
                       f"baseline and restricted both refuse: every server pod would be rejected at admission; "
                       "set pod_security = \"privileged\" to accept that (the namespace then admits any pod), "
                       "or drop the setting")
    if not k8s.check_image:
        out.append(f"kubernetes.check_image: the nightly check CronJob needs an image with kimi-deploy "
                   f"{__version__} installed; set check_image = \"REGISTRY/kimi-deploy:{__version__}\"")
    if profile.gateway is not None and not k8s.gateway_image:
        out.append("kubernetes.gateway_image: [gateway] is set but no image with the pinned smg; set "
                   "gateway_image = \"REGISTRY/smg:1.13.0\"")
    return out


def privileged_needs(k8s: Kubernetes) -> list[str]:
    """What in ``[kubernetes]`` only Pod Security ``privileged`` admits, one phrase each (empty: the pods meet
    ``restricted``). Sources: kubernetes/pod-security-admission ``policy/check_hostPathVolumes.go`` and
    ``check_hostNamespaces.go`` (baseline: no hostPath volume, no hostNetwork)."""
    out = []
    if k8s.model_volume is not None and k8s.model_volume.hostPath is not None:
        out.append(f"model_volume is a hostPath ({k8s.model_volume.hostPath.path})")
    if k8s.cache_host_path:
        out.append(f"cache_host_path = {k8s.cache_host_path} is a hostPath volume")
    if k8s.rdma:
        out.append("rdma = true puts the server pods on the host network (hostNetwork)")
    return out


#: The smallest ``[kubernetes]`` table that renders (the missing-table refusal shows it).
MINIMAL_TABLE = ('[kubernetes]\nimage = "lmsysorg/sglang:v0.5.23-cu130"\n'
                 f'check_image = "registry.example/kimi-deploy:{__version__}"  # your registry\n'
                 'model_volume = { persistentVolumeClaim = { claimName = "kimi-k25-weights" } }')


#: ``app.kubernetes.io/name`` of each component: the application that runs in it.
APPLICATION = {"server": "sglang", "gateway": "smg", "check": "kimi-deploy"}


def _selector(name: str, component: str, role: str | None = None) -> dict[str, str]:
    """The stable labels that select a component's pods (and the rank role): ``instance`` ``<name>-<component>``."""
    return {INSTANCE_LABEL: f"{name}-{component}", **({ROLE_LABEL: role} if role else {})}


def _labels(name: str, component: str, version: str, role: str | None = None) -> dict[str, str]:
    """Kubernetes' recommended labels of a component's objects and pods, then the role (:func:`_selector`)."""
    return {"app.kubernetes.io/name": APPLICATION[component], INSTANCE_LABEL: f"{name}-{component}",
            "app.kubernetes.io/version": version, "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": name, "app.kubernetes.io/managed-by": "kimi-deploy",
            **({ROLE_LABEL: role} if role else {})}


def _security(k8s: Kubernetes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod securityContext, container securityContext) of Pod Security's ``restricted`` level."""
    pod = {"runAsNonRoot": True, "runAsUser": k8s.run_as_user, "runAsGroup": k8s.run_as_user,
           "fsGroup": k8s.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                 "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _secret_volume(k8s: Kubernetes, name: str) -> dict[str, Any]:
    # 0440: the file belongs to root:fsGroup, so the non-root user reads it through its group. Written
    # `defaultMode: 288  # 0440` (FileMode): YAML 1.1 and 1.2 read a leading 0 differently, decimal is read alike.
    return {"name": "api-key", "secret": {"secretName": k8s.secret_name or f"{name}-api-key",
                                          "defaultMode": FileMode(0o440),
                                          "items": [{"key": API_KEY_CREDENTIAL, "path": API_KEY_CREDENTIAL}]}}


def _server_pod(profile: Profile, launch: LaunchSpec, shape: FleetShape, name: str, *, leader: bool,
                group: bool) -> dict[str, Any]:
    """The PodTemplateSpec of the leader (``leader``) or a worker; ``group``: the copy has several nodes."""
    k8s, s, svc = profile.kubernetes, profile.sglang, profile.service
    assert k8s is not None
    pod_sec, ctr_sec = _security(k8s)
    env = [{"name": k, "value": v} for k, v in launch.env]
    env.append({"name": "HOME", "value": "/tmp"})
    if group:
        nic = shape.nic if k8s.rdma else k8s.nic
        env += [{"name": "NCCL_SOCKET_IFNAME", "value": nic}, {"name": "GLOO_SOCKET_IFNAME", "value": nic}]
    assert k8s.model_volume is not None
    models: dict[str, Any] = {"name": "models", **k8s.model_volume.volume()}
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
        models,
        {"name": "cache", "hostPath": {"path": k8s.cache_host_path, "type": "Directory"}}
        if k8s.cache_host_path else {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "models", "mountPath": k8s.model_mount, "readOnly": True},
        {"name": "cache", "mountPath": profile.cache_root},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    container: dict[str, Any] = {
        "name": "sglang",
        "image": k8s.image,
        "command": [k8s.python, "-m", "sglang.launch_server"],
        "args": container_args(profile, launch, shape, leader=leader),
        "env": env,
        # Guaranteed QoS: requests = limits for CPU and memory (and the GPUs), so the kubelet evicts these pods
        # last under node memory pressure (Kubernetes "Pod Quality of Service Classes")
        "resources": {kind: {"cpu": k8s.cpu, "memory": k8s.memory, GPU_RESOURCE: svc.gpu_count}
                      for kind in ("requests", "limits")},
        "volumeMounts": mounts,
        "securityContext": ctr_sec,
    }
    spec: dict[str, Any] = {}
    if leader:
        container["ports"] = [{"name": "http", "containerPort": s.port, "protocol": "TCP"}]
        container["startupProbe"] = {
            "httpGet": {"path": "/health", "port": "http"}, "periodSeconds": STARTUP_PERIOD_S,
            "timeoutSeconds": 5, "failureThreshold": math.ceil(svc.timeout_start_sec / STARTUP_PERIOD_S)}
        container["readinessProbe"] = {
            "httpGet": {"path": "/health_generate", "port": "http"}, "periodSeconds": 30,
            "timeoutSeconds": READINESS_TIMEOUT_S, "failureThreshold": 3}
        if launch.secrets_config:
            run_dir = launch.secrets_config.rsplit("/", 1)[0]
            volumes += [_secret_volume(k8s, name),
                        {"name": "run-secrets", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
            mounts.append({"name": "run-secrets", "mountPath": run_dir, "readOnly": True})
            spec["initContainers"] = [{
                "name": "sglang-secrets-config",
                "image": k8s.image,
                "command": [k8s.python, "-c", "import os; os.umask(0o077); " + HOST_SECRETS_SCRIPT,
                            f"{SECRET_DIR}/{API_KEY_CREDENTIAL}", launch.secrets_config],
                "volumeMounts": [{"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True},
                                 {"name": "run-secrets", "mountPath": run_dir}],
                "resources": INIT_RESOURCES,
                "securityContext": ctr_sec,
            }]
    spec.update({
        "automountServiceAccountToken": False,
        "securityContext": pod_sec,
        "terminationGracePeriodSeconds": svc.timeout_stop_sec,
        "containers": [container],
        "volumes": volumes,
    })
    _place(k8s, spec, server=True)
    if k8s.rdma:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    role = "leader" if leader else "worker"
    metadata: dict[str, Any] = {"labels": _labels(name, "server", launch.sglang_version, role)}
    if leader:
        metadata.update(_scrape_annotations(k8s, s.port))
    return {"metadata": metadata, "spec": spec}


def _place(k8s: Kubernetes, spec: dict[str, Any], *, server: bool) -> dict[str, Any]:
    """Put ``[kubernetes]``'s scheduling keys into a pod ``spec``: ``tolerations``, ``imagePullSecrets`` and
    ``priorityClassName`` on every pod (server, gateway, check); ``nodeSelector`` and ``affinity`` on the
    SGLang pods only (``server``): they choose GPU nodes, which the CPU-only gateway and check do not need."""
    if server and k8s.node_selector:
        spec["nodeSelector"] = dict(sorted(k8s.node_selector.items()))
    if server and k8s.affinity:
        spec["affinity"] = k8s.affinity
    if k8s.tolerations:
        spec["tolerations"] = [t.spec() for t in k8s.tolerations]
    if k8s.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in k8s.image_pull_secrets]
    if k8s.priority_class_name:
        spec["priorityClassName"] = k8s.priority_class_name
    return spec


def _network_policies(profile: Profile, name: str) -> list[dict[str, Any]]:
    """network-policy.yaml: who may reach each listening pod (Kubernetes networking.k8s.io/v1 NetworkPolicy;
    a pod selected by one takes only the ingress it allows).

    - SGLang pods: the server port from the gateway pods (with ``[gateway]``), the check pods and the Prometheus
      namespaces (``prometheus_namespaces``), and without ``[gateway]`` from ``client_namespaces``; any port from
      the other ranks of the same copies (NCCL and the rendezvous pick their own ports).
    - gateway pods: the gateway port from ``client_namespaces`` and the check pods; smg's metrics port from the
      Prometheus namespaces.
    ``client_namespaces`` empty: this namespace only (a pod selector matching every pod in it).
    """
    k8s, s, gw = profile.kubernetes, profile.sglang, profile.gateway
    assert k8s is not None
    check = {"podSelector": {"matchLabels": _selector(name, "check")}}
    prometheus = {"namespaceSelector": {"matchLabels": dict(sorted(k8s.prometheus_namespaces.items()))}}
    clients = ({"namespaceSelector": {"matchLabels": dict(sorted(k8s.client_namespaces.items()))}}
               if k8s.client_namespaces else {"podSelector": {}})
    server_from = [check, prometheus]
    if gw is not None:
        server_from.insert(0, {"podSelector": {"matchLabels": _selector(name, "gateway")}})
    else:
        server_from.append(clients)

    def policy(component: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": f"{name}-{component}", "namespace": k8s.namespace,
                             "labels": _labels(name, component, __version__)},
                "spec": {"podSelector": {"matchLabels": _selector(name, component)}, "policyTypes": ["Ingress"],
                         "ingress": rules}}

    out = [policy("server", [
        {"from": server_from, "ports": [{"protocol": "TCP", "port": s.port}]},
        {"from": [{"podSelector": {"matchLabels": _selector(name, "server")}}]},
    ])]
    if gw is not None:
        out.append(policy("gateway", [
            {"from": [clients, check], "ports": [{"protocol": "TCP", "port": gw.port}]},
            {"from": [prometheus], "ports": [{"protocol": "TCP", "port": gw.prometheus_port}]},
        ]))
    return out


def _scrape_annotations(k8s: Kubernetes, port: int) -> dict[str, Any]:
    """``{"annotations": {prometheus.io/scrape, port, path}}`` with ``scrape = "annotations"`` (the convention of
    Prometheus' own kubernetes example configuration and many charts), else ``{}``."""
    if k8s.scrape != "annotations":
        return {}
    return {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                            "prometheus.io/path": "/metrics"}}


def _monitoring(profile: Profile, name: str, version: str) -> dict[str, list[dict[str, Any]]]:
    """monitoring-podmonitor.yaml (the leaders' /metrics), monitoring-servicemonitor.yaml (smg's, with
    ``[gateway]``), monitoring-rules.yaml (the systemd target's recording and alert rules as a PrometheusRule).

    The scrape objects set ``job`` to the jobs the rules select ([monitoring] job / gateway_job, default
    ``<service>`` / ``<service>-gateway``) and the ``service`` and [monitoring] labels, as the systemd target's
    static_configs do. The check's series reach Prometheus through ``[kubernetes] pushgateway`` under its job.
    """
    k8s = profile.kubernetes
    assert k8s is not None
    st = monitoring.settings(profile)
    if profile.gateway is not None:
        st = dataclasses.replace(st, gateway=f"{name}-gateway", gateway_job=profile.monitoring.gateway_job
                                 or f"{profile.service.name}-gateway")
    extra = {"service": st.service, **st.labels}

    def relabel(job: str) -> list[dict[str, Any]]:
        return [{"action": "replace", "targetLabel": key, "replacement": value}
                for key, value in {"job": job, **extra}.items()]

    def meta(component: str, version: str, suffix: str) -> dict[str, Any]:
        return {"name": f"{name}-{suffix}", "namespace": k8s.namespace,
                "labels": {**_labels(name, component, version), **k8s.monitor_labels}}

    interval = f"{st.scrape_interval_s}s"
    out: dict[str, list[dict[str, Any]]] = {
        "monitoring-podmonitor.yaml": [{
            "apiVersion": MONITORING_API, "kind": "PodMonitor", "metadata": meta("server", version, "server"),
            "spec": {"selector": {"matchLabels": _selector(name, "server", "leader")},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": interval,
                                              "relabelings": relabel(st.job)}]}}],
        "monitoring-rules.yaml": [{
            "apiVersion": MONITORING_API, "kind": "PrometheusRule", "metadata": meta("check", __version__, "rules"),
            "spec": monitoring.rules_doc(profile, st)}],
    }
    if profile.gateway is not None and st.gateway_job:
        out["monitoring-servicemonitor.yaml"] = [{
            "apiVersion": MONITORING_API, "kind": "ServiceMonitor",
            "metadata": meta("gateway", profile.gateway.version, "gateway"),
            "spec": {"selector": {"matchLabels": _selector(name, "gateway")},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": interval,
                                    "relabelings": relabel(st.gateway_job)}]}}]
    return out


def _leaderworkerset(profile: Profile, launch: LaunchSpec, shape: FleetShape, name: str) -> dict[str, Any]:
    k8s = profile.kubernetes
    assert k8s is not None
    template: dict[str, Any] = {"size": shape.nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    if shape.nodes > 1:
        template["leaderTemplate"] = _server_pod(profile, launch, shape, name, leader=True, group=True)
        template["workerTemplate"] = _server_pod(profile, launch, shape, name, leader=False, group=True)
    else:  # size 1: LWS runs the workerTemplate as the leader when there is no leaderTemplate
        template["workerTemplate"] = _server_pod(profile, launch, shape, name, leader=True, group=False)
    return {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": k8s.namespace,
                     "labels": _labels(name, "server", launch.sglang_version)},
        "spec": {"replicas": shape.copies, "startupPolicy": "LeaderCreated",
                 "rolloutStrategy": {"type": "RollingUpdate",
                                     "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
                 "leaderWorkerTemplate": template},
    }


def _service(name: str, namespace: str, component: str, port: int, selector: Mapping[str, str],
             labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{name}-{component}", "namespace": namespace, "labels": dict(labels)},
            "spec": {"type": "ClusterIP", "selector": dict(selector),
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}


def gateway_args(profile: Profile, name: str) -> list[str]:
    """``smg launch``'s arguments for discovery of the leader pods in the namespace (smg 1.13.0 flags)."""
    gw, k8s, s = profile.gateway, profile.kubernetes, profile.sglang
    assert k8s is not None and gw is not None
    return ["--host", gw.bind, "--port", str(gw.port), "--policy", gw.policy,
            "--service-discovery", "--selector",
            *(f"{key}={value}" for key, value in _selector(name, "server", "leader").items()),
            "--service-discovery-port", str(s.port), "--service-discovery-namespace", k8s.namespace,
            # scraped in the cluster: smg's metrics on the pod's address (the pod network; a NetworkPolicy limits
            # who reaches it), else as the profile says
            "--prometheus-host", "0.0.0.0" if k8s.scrape != "none" else gw.prometheus_host,
            "--prometheus-port", str(gw.prometheus_port),
            # the workers' model path is not in this pod: never fetch a tokenizer from a hub
            "--disable-tokenizer-autoload", *gateway_parser_args(profile)]


def _gateway(profile: Profile, name: str) -> dict[str, list[dict[str, Any]]]:
    """gateway-rbac.yaml, gateway-deployment.yaml, gateway-service.yaml documents."""
    gw, k8s, s = profile.gateway, profile.kubernetes, profile.sglang
    assert k8s is not None and gw is not None
    ns, account = k8s.namespace, names.gateway_service(name)
    labels = _labels(name, "gateway", gw.version)
    pod_sec, ctr_sec = _security(k8s)
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": ns, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": account, "namespace": ns, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account, "namespace": ns, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]},
    ]
    args = gateway_args(profile, name)
    ports = [{"name": "http", "containerPort": gw.port, "protocol": "TCP"}]
    if k8s.scrape != "none":
        ports.append({"name": "metrics", "containerPort": gw.prometheus_port, "protocol": "TCP"})
    container: dict[str, Any] = {"name": "smg", "image": k8s.gateway_image, "ports": ports,
                                 "readinessProbe": {"httpGet": {"path": GATEWAY_READINESS_PATH, "port": "http"},
                                                    "periodSeconds": 10, "timeoutSeconds": 5,
                                                    "failureThreshold": 3},
                                 "livenessProbe": {"httpGet": {"path": GATEWAY_LIVENESS_PATH, "port": "http"},
                                                   "periodSeconds": 20, "timeoutSeconds": 5,
                                                   "failureThreshold": 6},
                                 "resources": {"requests": {"cpu": k8s.gateway_cpu, "memory": k8s.gateway_memory},
                                               "limits": {"memory": k8s.gateway_memory}},
                                 "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
                                 "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                                 "securityContext": ctr_sec}
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if s.api_key_file:
        # smg takes its key only as --api-key: the unit's launcher reads the mounted Secret and hands the key to
        # smg.cli.main inside the process (not in argv, env or the manifest; an empty key stops the start).
        container["command"] = [k8s.gateway_python, "-c", LAUNCHER, "launch"]
        container["args"] = args
        container["env"].append({"name": "CREDENTIALS_DIRECTORY", "value": SECRET_DIR})
        container["volumeMounts"].append({"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True})
        volumes.append(_secret_volume(k8s, name))
    else:
        container["command"] = ["smg", "launch"]
        container["args"] = args
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": account, "namespace": ns, "labels": labels},
        "spec": {"replicas": k8s.gateway_replicas, "selector": {"matchLabels": _selector(name, "gateway")},
                 "template": {"metadata": {"labels": labels, **_scrape_annotations(k8s, gw.prometheus_port)},
                              "spec": {"serviceAccountName": account, "securityContext": pod_sec,
                                       # replicas on different nodes where the cluster has them
                                       "affinity": {"podAntiAffinity": {
                                           "preferredDuringSchedulingIgnoredDuringExecution": [{
                                               "weight": 100, "podAffinityTerm": {
                                                   "topologyKey": "kubernetes.io/hostname",
                                                   "labelSelector": {"matchLabels": _selector(name, "gateway")}}}]}},
                                       "containers": [container], "volumes": volumes}}},
    }
    _place(k8s, deployment["spec"]["template"]["spec"], server=False)
    # a node drain evicts at most one gateway pod at a time; with one replica it still lets the drain finish
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": account, "namespace": ns, "labels": labels},
           "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(name, "gateway")}}}
    service = _service(name, ns, "gateway", gw.port, _selector(name, "gateway"), labels)
    if k8s.scrape == "prometheus-operator":
        service["spec"]["ports"].append({"name": "metrics", "port": gw.prometheus_port, "targetPort": "metrics",
                                         "protocol": "TCP"})
    return {"gateway-rbac.yaml": rbac, "gateway-deployment.yaml": [deployment], "gateway-pdb.yaml": [pdb],
            "gateway-service.yaml": [service]}


def _check(profile: Profile, name: str) -> dict[str, list[dict[str, Any]]]:
    """check-configmap.yaml, check-pvc.yaml (unless the profile names a claim), check-cronjob.yaml."""
    k8s, s = profile.kubernetes, profile.sglang
    assert k8s is not None
    ns = k8s.namespace
    labels = _labels(name, "check", __version__)
    gw = profile.gateway
    base_url = (names.node_url(f"{names.gateway_service(name)}.{ns}.svc", gw.port) if gw is not None
                else names.node_url(f"{name}-leader.{ns}.svc", s.port))
    claim = k8s.check_report_claim or f"{name}-check-reports"
    mounts: list[dict[str, Any]] = [{"name": "profile", "mountPath": CHECK_PROFILE.rsplit("/", 1)[0],
                                     "readOnly": True},
                                    {"name": "reports", "mountPath": REPORT_DIR},
                                    {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [{"name": "profile", "configMap": {"name": f"{name}-profile"}},
                                     {"name": "reports", "persistentVolumeClaim": {"claimName": claim}},
                                     {"name": "tmp", "emptyDir": {}}]
    if s.api_key_file:
        mounts.append({"name": "api-key", "mountPath": SECRET_DIR, "readOnly": True})
        volumes.append(_secret_volume(k8s, name))
    # in-cluster plain http: check refuses a key to another host over http without --insecure.
    # With [gateway], as on the gateway host: through smg a bad copy hides behind its retries; check each
    # leader it lists.
    key_file = f"{SECRET_DIR}/{API_KEY_CREDENTIAL}" if s.api_key_file else None
    # with [gateway]: one --deadline for every leader and the pass through the gateway, as on the gateway host
    deadline = fleet_check_deadline_s(fleet_shape(profile).copies) if gw is not None else None
    command = names.check_argv(
        "kimi-deploy", CHECK_PROFILE, base_url=base_url, api_key_file=key_file, insecure=bool(key_file),
        each_worker=gw is not None, deadline=str(deadline) if deadline else None,
        json=f"{REPORT_DIR}/check-workers.json" if gw is not None else f"{REPORT_DIR}/check-report.json",
        junit=None if gw is not None else f"{REPORT_DIR}/check-report.xml", prom=CHECK_PROM,
        # a Job has no node_exporter textfile directory: the result becomes a metric through the Pushgateway
        pushgateway=k8s.pushgateway)
    pod_sec, ctr_sec = _security(k8s)
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": f"{name}-profile", "namespace": ns, "labels": labels},
              "data": {"profile.toml": dump_profile(profile)}}
    cronjob = {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": f"{name}-check", "namespace": ns, "labels": labels},
        "spec": {"schedule": k8s.check_schedule, "concurrencyPolicy": "Forbid",
                 "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                 "jobTemplate": {"spec": {"backoffLimit": 0, "activeDeadlineSeconds": max(
                     3600, (deadline or CHECK_DEADLINE_S) + CHECK_SLACK_S), "template": {
                     "metadata": {"labels": labels},
                     "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                              "securityContext": pod_sec,
                              "containers": [{"name": "check", "image": k8s.check_image, "command": command,
                                              "env": [{"name": "HOME", "value": "/tmp"}],
                                              "resources": CHECK_RESOURCES,
                                              "volumeMounts": mounts, "securityContext": ctr_sec}],
                              "volumes": volumes}}}}},
    }
    _place(k8s, cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"], server=False)
    out = {"check-configmap.yaml": [config], "check-cronjob.yaml": [cronjob]}
    if not k8s.check_report_claim:
        out["check-pvc.yaml"] = [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "metadata": {"name": claim, "namespace": ns, "labels": labels},
                                  "spec": {"accessModes": ["ReadWriteOnce"],
                                           "resources": {"requests": {"storage": "1Gi"}}}}]
    return out


def patch_warnings(profile: Profile, launch: LaunchSpec, deployment: Deployment | None = None) -> list[str]:
    """What the pods cannot check: the unit's ``ExecStartPre=`` ``kimi-deploy patch verify`` refuses an SGLang
    without the kit's patch series; a pod runs whatever the image holds. One line naming the defaults and the
    patches this profile's settings need (the series' ``needed_by``), empty with ``verify_patches = false`` or
    when the kit has no series for the version."""

    k8s = profile.kubernetes
    assert k8s is not None
    series = find_series(launch.sglang_version) if profile.service.verify_patches else None
    if series is None:
        return []
    hits = (deployment or resolve(profile, launch.sglang_version)).gates
    defaults = [p.id for p in series.defaults]
    extra = list(dict.fromkeys(h.patch.id for h in hits if h.patch.id not in defaults))
    needs = "".join(f"; {h.flag} needs {h.patch.id} on compute capability "
                    f"{'/'.join(f'{m}.x' for m in h.gate.compute_capability_major)} (without it the start "
                    f"{'fails' if h.gate.without == 'fails' else 'runs with it off'})" for h in hits)
    # patch apply wants a path: inside the image's build, a bare name is resolved by the shell
    python = k8s.python if k8s.python.startswith("/") else f'"$(command -v {k8s.python})"'
    apply = f"kimi-deploy patch apply --python {python}" + (f" --with {','.join(extra)}" if extra else "")
    return [f"kubernetes.image {k8s.image}: the pods do not run `kimi-deploy patch verify` (the unit's "
            f"ExecStartPre=), so the image must already carry the kit's SGLang {launch.sglang_version} patches "
            f"({', '.join(defaults + extra)}; a stock image has none){needs}; build the image from it with "
            f"`{apply}`, or set [service] verify_patches = false to accept an unpatched SGLang"]


def header(profile: Profile, sglang_version: str) -> list[str]:
    """The comment lines every rendered manifest starts with (kit version, profile sha256, SGLang)."""
    return [f"{GENERATED_PREFIX.removeprefix('# ')}{__version__} from profile sha256:{profile.digest()[:16]} "
            f"for SGLang {sglang_version}.",
            "Do not edit: change the profile, then `kimi-deploy render --target kubernetes`."]


def render(profile: Profile, sglang_version: str | None = None) -> Manifests:
    """Every manifest of ``profile`` for SGLang ``sglang_version`` (default 0.5.23).

    Raises:
        ProfileError: :func:`problems` found any (exit 2); nothing is rendered.
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.deployment.resolve`.
    """
    found = problems(profile)
    if found:
        raise ProfileError("the profile cannot be rendered for Kubernetes", problems=found,
                           hint="correct the settings above")
    k8s = profile.kubernetes
    assert k8s is not None
    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version
    deployment = resolve(profile, version)
    launch = deployment.pod_launch()
    shape = fleet_shape(profile)
    name = object_name(profile)
    top = header(profile, launch.sglang_version)
    warnings = list(launch.warnings)
    tag = k8s.image.rsplit("@", 1)[0].rsplit(":", 1)[-1] if ":" in k8s.image.rsplit("/", 1)[-1] else ""
    if launch.sglang_version not in tag:
        warnings.append(f"kubernetes.image {k8s.image}: its tag does not name SGLang {launch.sglang_version}, the "
                        "version the flags are rendered for; check the image's SGLang version")
    warnings += patch_warnings(profile, launch, deployment)
    pod_security = k8s.pod_security
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": k8s.namespace, "labels": {
                     f"pod-security.kubernetes.io/{mode}": pod_security for mode in ("enforce", "audit", "warn")}}}
    documents: dict[str, list[dict[str, Any]]] = {
        "namespace.yaml": [namespace],
        "server-leaderworkerset.yaml": [_leaderworkerset(profile, launch, shape, name)],
        "server-service.yaml": [_service(name, k8s.namespace, "leader", profile.sglang.port,
                                         _selector(name, "server", "leader"),
                                         _labels(name, "server", launch.sglang_version))],
    }
    if profile.gateway is not None:
        documents.update(_gateway(profile, name))
    documents.update(_check(profile, name))
    if k8s.network_policy:
        documents["network-policy.yaml"] = _network_policies(profile, name)
    if k8s.scrape == "prometheus-operator":
        documents.update(_monitoring(profile, name, launch.sglang_version))
    if k8s.scrape != "none" and not k8s.pushgateway:
        warnings.append("kubernetes.pushgateway: not set, so the nightly check's result is a file on its claim and "
                        "a Job's status, which no alert reads; set pushgateway = \"http://HOST:9091\" (a "
                        "Prometheus Pushgateway your Prometheus scrapes with honor_labels: true)")
    notes: dict[str, list[str]] = {}
    if profile.sglang.api_key_file:
        notes["check-cronjob.yaml"] = [
            "check --insecure: the check sends the API key over plain http to a Service inside the cluster (SGLang "
            "and smg serve plain http); network-policy.yaml admits only the kit's pods, Prometheus and "
            "client_namespaces to the ports; for encryption on the wire, mTLS in a mesh."]
    if k8s.rdma:
        notes["server-leaderworkerset.yaml"] = [
            "hostNetwork: true because [kubernetes] rdma = true: RDMA NICs are not in the pod network; the pods "
            "then share the node's network namespace and ports"]
    needs = privileged_needs(k8s)
    if pod_security == "privileged":
        notes["namespace.yaml"] = [
            "Pod Security level privileged, set by [kubernetes] pod_security: "
            + ("; ".join(needs) if needs else "nothing rendered needs it (every pod meets restricted)")
            + "; baseline and restricted refuse that, so this namespace admits any pod: keep other workloads out"]
        if not needs:
            warnings.append("kubernetes.pod_security: privileged, but every rendered pod meets restricted; "
                            "pod_security = \"restricted\" (the default) admits them and refuses less careful pods")
    else:
        notes["namespace.yaml"] = [
            f"Pod Security level {pod_security}: every pod rendered here meets restricted (non-root, seccomp "
            "RuntimeDefault, no privilege escalation, capabilities dropped, no host namespaces or hostPath)"]
    files: dict[str, str] = {}
    for file in FILE_ORDER:
        if file in documents:
            comments = [*top, *notes.get(file, [])]
            files[file] = dump_all([(doc, comments if i == 0 else ()) for i, doc in enumerate(documents[file])])
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": list(files)}
    files = {KUSTOMIZATION: dump(kustomization, top), **files}
    return Manifests(profile=profile, launch=launch, shape=shape, files=files, warnings=tuple(warnings))


def artefacts(profile: Profile, sglang_version: str | None = None) -> Artefacts:
    """The ``kubernetes`` target (:mod:`kimi_deploy.targets`): :func:`render`'s manifests.

    Raises:
        ProfileError: :func:`problems` found any (exit 2). UsageError / UnsupportedVersionError: from
            :func:`kimi_deploy.deployment.resolve`.
    """
    manifests = render(profile, sglang_version)

    def describe(out_dir: Path | None) -> dict[str, object]:
        return {"target": "kubernetes", "sglang_version": manifests.launch.sglang_version,
                "profile_sha256": profile.digest(), "copies": manifests.shape.copies,
                "nodes_per_copy": manifests.shape.nodes,
                "files": {name: str(out_dir / name) if out_dir else None for name in manifests.files},
                "warnings": list(manifests.warnings)}

    return Artefacts("kubernetes", manifests.files, describe, launch=manifests.launch, warnings=manifests.warnings,
                     stream=document_stream(manifests.files))


def document_stream(files: Mapping[str, str]) -> str:
    """``files`` as one multi-document YAML stream for ``kubectl apply -f -`` (what ``render --target kubernetes``
    prints without ``--out``): every manifest in :data:`FILE_ORDER` (the order ``kubectl apply -k`` creates
    them), each starting with ``---`` and a ``# file: NAME`` comment; ``kustomization.yaml`` left out (a
    ``kustomize.config.k8s.io`` file, not an object the API server takes: ``kubectl apply -k DIR`` reads it).
    The objects are the ones ``kubectl kustomize DIR`` builds: every manifest names its namespace itself."""
    return "".join(f"---\n{FILE_HEADER}{name}\n{ending_in_newline(text)}"
                   for name, text in files.items() if name != KUSTOMIZATION)
