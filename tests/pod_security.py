"""Pod Security Standards (``baseline``, ``restricted``) of Kubernetes 1.37, checked on a pod spec.

No runnable Pod Security admission code could be had here (it is Go: ``k8s.io/pod-security-admission``,
compiled into kube-apiserver; no PyPI, npm or Debian package ships kube-apiserver, kyverno or that library,
and Debian's Go 1.19 is too old to build it). So this module is a line-by-line port of its checks, read from
kubernetes/pod-security-admission at commit 8f84a87c7f617f64a4ddc1aea24aeeb7a2e07cb8 (tag v0.37.0-alpha.2,
Kubernetes 1.37; ``policy/check_*.go``, Apache-2.0), newest version of each check (the ``latest`` policy
version a namespace label without ``-version`` gets). Each function names the Go file it ports.

Faithfulness is tested, not assumed: tests/test_kubernetes_pod_security.py runs :func:`violations` over the
upstream's own fixtures for v1.37 (``test/testdata/{baseline,restricted}/v1.37/{pass,fail}``, copied to
tests/data/pod-security/) and requires every ``pass`` pod to pass and every ``fail`` pod to fail its level.

Shapes: a pod spec is the ``spec`` mapping of a Pod (or a template's ``spec``), metadata its ``metadata``;
:func:`violations` returns ``["<check id>: <what>", ...]``, empty when the level admits the pod.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

Spec = Mapping[str, Any]
LEVELS = ("privileged", "baseline", "restricted")

# check_capabilities_baseline.go: capabilities_allowed_1_0
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# check_sysctls.go: sysctlsAllowedV1Dot37
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"})
# check_seLinuxOptions.go: selinuxAllowedTypes1_31
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
# check_restrictedVolumes.go: the volume sources restricted allows
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                "persistentVolumeClaim", "projected", "secret"})


def containers(spec: Spec) -> Iterator[Mapping[str, Any]]:
    """visitor.go visitContainers: init containers, containers, ephemeral containers."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("securityContext") or {}


def _windows(spec: Spec) -> bool:
    return (spec.get("os") or {}).get("name") == "windows"


def _user_namespace(spec: Spec) -> bool:
    """helpers.go relaxPolicyForUserNamespacePod: ``hostUsers: false``."""
    return spec.get("hostUsers") is False


# ---- baseline (each ports policy/check_<id>.go, newest version)

def host_namespaces(meta: Spec, spec: Spec) -> str | None:
    bad = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return ", ".join(bad) if bad else None


def privileged(meta: Spec, spec: Spec) -> str | None:
    bad = [c["name"] for c in containers(spec) if _sc(c).get("privileged")]
    return f"containers {bad} must not set securityContext.privileged=true" if bad else None


def capabilities_baseline(meta: Spec, spec: Spec) -> str | None:
    bad = [c["name"] for c in containers(spec)
           if any(cap not in BASELINE_CAPABILITIES for cap in (_sc(c).get("capabilities") or {}).get("add") or ())]
    return f"containers {bad} add capabilities beyond the baseline set" if bad else None


def windows_host_process(meta: Spec, spec: Spec) -> str | None:
    bad = (["pod"] if (_sc(spec).get("windowsOptions") or {}).get("hostProcess") else []) + [
        c["name"] for c in containers(spec) if (_sc(c).get("windowsOptions") or {}).get("hostProcess")]
    return f"{bad} must not set securityContext.windowsOptions.hostProcess=true" if bad else None


def host_path_volumes(meta: Spec, spec: Spec) -> str | None:
    bad = [v["name"] for v in spec.get("volumes") or () if "hostPath" in v]
    return f"hostPath volumes {bad}" if bad else None


def host_ports(meta: Spec, spec: Spec) -> str | None:
    bad = [c["name"] for c in containers(spec) if any(p.get("hostPort") for p in c.get("ports") or ())]
    return f"containers {bad} use hostPort" if bad else None


def host_probes_and_host_lifecycle(meta: Spec, spec: Spec) -> str | None:
    """check_hostProbesAndhostLifecycle.go (1.34): no ``host`` in httpGet/tcpSocket of probes and handlers."""
    def hosts(handler: Mapping[str, Any] | None) -> list[str]:
        handler = handler or {}
        return [h for kind in ("httpGet", "tcpSocket") if (h := (handler.get(kind) or {}).get("host"))]

    bad = [c["name"] for c in containers(spec)
           if any(hosts(c.get(p)) for p in ("livenessProbe", "readinessProbe", "startupProbe"))
           or any(hosts((c.get("lifecycle") or {}).get(h)) for h in ("postStart", "preStop"))]
    return f"containers {bad} use a probe or lifecycle host" if bad else None


def app_armor_profile(meta: Spec, spec: Spec) -> str | None:
    def ok(profile: Mapping[str, Any] | None) -> bool:
        return profile is None or profile.get("type") in ("RuntimeDefault", "Localhost")

    bad = ([] if ok(_sc(spec).get("appArmorProfile")) else ["pod"]) + [
        c["name"] for c in containers(spec) if not ok(_sc(c).get("appArmorProfile"))]
    bad += [k for k, v in (meta.get("annotations") or {}).items()
            if k.startswith("container.apparmor.security.beta.kubernetes.io/")
            and not (v == "" or v == "runtime/default" or v.startswith("localhost/"))]
    return f"{bad} set a forbidden AppArmor profile" if bad else None


def se_linux_options(meta: Spec, spec: Spec) -> str | None:
    def ok(opts: Mapping[str, Any] | None) -> bool:
        return opts is None or (opts.get("type", "") in SELINUX_TYPES and not opts.get("user")
                                and not opts.get("role"))

    bad = ([] if ok(_sc(spec).get("seLinuxOptions")) else ["pod"]) + [
        c["name"] for c in containers(spec) if not ok(_sc(c).get("seLinuxOptions"))]
    return f"{bad} set forbidden securityContext.seLinuxOptions" if bad else None


def _proc_mount(spec: Spec) -> str | None:
    """check_procMount_baseline.go procMount_1_0."""
    bad = [c["name"] for c in containers(spec) if _sc(c).get("procMount") not in (None, "Default")]
    return f"containers {bad} must not set securityContext.procMount" if bad else None


def proc_mount_baseline(meta: Spec, spec: Spec) -> str | None:
    """procMount1_35baseline: relaxed for user-namespace pods."""
    return None if _user_namespace(spec) else _proc_mount(spec)


def _seccomp_ok(profile: Mapping[str, Any]) -> bool:
    return profile.get("type") in ("Localhost", "RuntimeDefault")


def seccomp_profile_baseline(meta: Spec, spec: Spec) -> str | None:
    """seccompProfileBaseline_1_19: a set profile must not be Unconfined."""
    bad = ([] if _seccomp_ok(_sc(spec).get("seccompProfile") or {"type": "RuntimeDefault"}) else ["pod"]) + [
        c["name"] for c in containers(spec)
        if not _seccomp_ok(_sc(c).get("seccompProfile") or {"type": "RuntimeDefault"})]
    return f"{bad} must not set securityContext.seccompProfile.type to Unconfined" if bad else None


def sysctls(meta: Spec, spec: Spec) -> str | None:
    bad = [s.get("name") for s in _sc(spec).get("sysctls") or () if s.get("name") not in SAFE_SYSCTLS]
    return f"forbidden sysctls {bad}" if bad else None


# ---- restricted

def restricted_volumes(meta: Spec, spec: Spec) -> str | None:
    # a volume naming no source is an emptyDir (the API server's SetDefaults_Volume, before admission)
    bad = [v["name"] for v in spec.get("volumes") or ()
           if set(v) - {"name"} and not any(k in RESTRICTED_VOLUMES for k in v if k != "name")]
    return f"volumes {bad} use a restricted volume type" if bad else None


def allow_privilege_escalation(meta: Spec, spec: Spec) -> str | None:
    """allowPrivilegeEscalation_1_25: every container sets it to false (Windows pods exempt)."""
    if _windows(spec):
        return None
    bad = [c["name"] for c in containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    return f"containers {bad} must set securityContext.allowPrivilegeEscalation=false" if bad else None


def run_as_non_root(meta: Spec, spec: Spec) -> str | None:
    """runAsNonRoot1_35: pod-level true or every container true, none false (user-namespace pods exempt)."""
    if _user_namespace(spec):
        return None
    pod = _sc(spec).get("runAsNonRoot")
    bad = (["pod"] if pod is False else []) + [c["name"] for c in containers(spec)
                                               if _sc(c).get("runAsNonRoot") is False]
    implicit = [c["name"] for c in containers(spec) if _sc(c).get("runAsNonRoot") is None and pod is not True]
    if bad:
        return f"{bad} must not set securityContext.runAsNonRoot=false"
    return f"pod or containers {implicit} must set securityContext.runAsNonRoot=true" if implicit else None


def run_as_user(meta: Spec, spec: Spec) -> str | None:
    """runAsUser1_35: no runAsUser 0 (user-namespace pods exempt)."""
    if _user_namespace(spec):
        return None
    bad = (["pod"] if _sc(spec).get("runAsUser") == 0 else []) + [
        c["name"] for c in containers(spec) if _sc(c).get("runAsUser") == 0]
    return f"{bad} must not set runAsUser=0" if bad else None


def seccomp_profile_restricted(meta: Spec, spec: Spec) -> str | None:
    """seccompProfileRestricted_1_25: RuntimeDefault or Localhost on the pod or every container."""
    if _windows(spec):
        return None
    pod = _sc(spec).get("seccompProfile")
    bad = ([] if pod is None or _seccomp_ok(pod) else ["pod"]) + [
        c["name"] for c in containers(spec) if _sc(c).get("seccompProfile") is not None
        and not _seccomp_ok(_sc(c)["seccompProfile"])]
    if bad:
        return f"{bad} must not set securityContext.seccompProfile.type to Unconfined"
    pod_set = pod is not None and _seccomp_ok(pod)
    implicit = [c["name"] for c in containers(spec) if _sc(c).get("seccompProfile") is None and not pod_set]
    return (f'pod or containers {implicit} must set securityContext.seccompProfile.type to "RuntimeDefault" '
            'or "Localhost"' if implicit else None)


def capabilities_restricted(meta: Spec, spec: Spec) -> str | None:
    """capabilitiesRestricted_1_25: drop ALL, add nothing but NET_BIND_SERVICE (Windows pods exempt)."""
    if _windows(spec):
        return None
    bad = [c["name"] for c in containers(spec)
           if "ALL" not in ((_sc(c).get("capabilities") or {}).get("drop") or ())
           or any(cap != "NET_BIND_SERVICE" for cap in (_sc(c).get("capabilities") or {}).get("add") or ())]
    return f'containers {bad} must set capabilities.drop=["ALL"] and add only NET_BIND_SERVICE' if bad else None


def proc_mount_restricted(meta: Spec, spec: Spec) -> str | None:
    """check_procMount_restricted.go (1.35): procMount_1_0, not relaxed for user namespaces."""
    return _proc_mount(spec)


Check = Callable[[Spec, Spec], "str | None"]
#: Check id (as in the Go source) -> function; a restricted check that overrides a baseline one replaces it.
BASELINE: dict[str, Check] = {
    "hostNamespaces": host_namespaces, "privileged": privileged, "capabilities_baseline": capabilities_baseline,
    "windowsHostProcess": windows_host_process, "hostPathVolumes": host_path_volumes, "hostPorts": host_ports,
    "hostProbesAndHostLifecycle": host_probes_and_host_lifecycle, "appArmorProfile": app_armor_profile,
    "seLinuxOptions": se_linux_options, "procMount": proc_mount_baseline,
    "seccompProfile_baseline": seccomp_profile_baseline, "sysctls": sysctls}
RESTRICTED_ONLY: dict[str, tuple[Check, str | None]] = {
    "restrictedVolumes": (restricted_volumes, None),
    "allowPrivilegeEscalation": (allow_privilege_escalation, None),
    "runAsNonRoot": (run_as_non_root, None), "runAsUser": (run_as_user, None),
    "seccompProfile_restricted": (seccomp_profile_restricted, "seccompProfile_baseline"),
    "capabilities_restricted": (capabilities_restricted, "capabilities_baseline"),
    "procMount_restricted": (proc_mount_restricted, "procMount")}


def checks(level: str) -> dict[str, Check]:
    """The checks a namespace at ``level`` runs (``privileged``: none)."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}")
    if level == "privileged":
        return {}
    out = dict(BASELINE)
    if level == "restricted":
        for check_id, (check, overrides) in RESTRICTED_ONLY.items():
            if overrides:
                out.pop(overrides)
            out[check_id] = check
    return out


def violations(level: str, spec: Spec, metadata: Spec | None = None) -> list[str]:
    """``["<check>: <what>"]`` for every check of ``level`` the pod ``spec`` (with ``metadata``) fails."""
    meta = metadata or {}
    return [f"{check_id}: {found}" for check_id, check in checks(level).items()
            if (found := check(meta, spec))]


def pod_templates(document: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(where, PodTemplateSpec)`` of every pod a rendered object creates: Pod, Deployment, Job, CronJob,
    LeaderWorkerSet (leader and worker templates)."""
    kind, spec = document.get("kind"), document.get("spec") or {}
    name = f"{kind}/{(document.get('metadata') or {}).get('name')}"
    if kind == "Pod":
        yield name, document
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield name, spec["template"]
    elif kind == "CronJob":
        yield name, spec["jobTemplate"]["spec"]["template"]
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                yield f"{name}.{key}", lwt[key]
