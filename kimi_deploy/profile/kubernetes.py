"""``[kubernetes]``: what ``render --target kubernetes`` needs: image, volumes, names.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kimi_deploy.profile.base import Section
from kimi_deploy.profile.fleet import IFNAME
from kimi_deploy.values import check_abs_path


#: A Kubernetes object name that must be an RFC 1035 label (Service, Namespace): lower case, digits and ``-``,
#: starting with a letter, at most 63 characters (Kubernetes ``validation.IsDNS1035Label``).
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
#: A container image reference with a tag or a digest (``registry/repo:tag``, ``repo@sha256:...``).
IMAGE = re.compile(r"(?P<repo>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                   r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
#: A Kubernetes resource quantity as the kit writes them (``64Gi``, ``500Mi``; apimachinery ``resource.Quantity``).
QUANTITY = re.compile(r"[1-9][0-9]{0,6}(Ki|Mi|Gi|Ti)")
#: A CPU quantity: whole cores (``64``) or millicores (``500m``).
CPU_QUANTITY = re.compile(r"[1-9][0-9]{0,3}|[1-9][0-9]{0,6}m")
#: A command name found on PATH (no ``/``; not starting with ``-`` or ``.``).
COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
#: A five-field cron schedule (CronJob ``spec.schedule``): digits, ``*``, ``,``, ``-``, ``/`` per field.
CRON = re.compile(r"[0-9*,/-]+( [0-9*,/-]+){4}")
#: A label key (optional DNS prefix, then a name of 1-63 characters) and value (Kubernetes label syntax).
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def check_dns_label(v: str, what: str = "name") -> str:
    """``v`` when it is an RFC 1035 label (:data:`DNS_LABEL`), else ValueError with a suggestion."""
    if not DNS_LABEL.fullmatch(v):
        fixed = re.sub(r"[^a-z0-9-]+", "-", v.lower()).strip("-")[:63] or "kimi"
        raise ValueError(f"{what} {v!r} is not a DNS label (lower case letters, digits and '-', starting with a "
                         f"letter, at most 63 characters), which Kubernetes requires; e.g. {fixed!r}")
    return v


#: Bounds of the five numeric cron fields (robfig/cron, which Kubernetes' CronJob controller uses; 7 is Sunday too).
CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))


def check_cron(v: str) -> str:
    """``v`` when it is five numeric cron fields within their bounds (``*``, ``N``, ``N-M``, lists, ``/STEP``)."""
    fields = v.split(" ")
    if not CRON.fullmatch(v) or len(fields) != 5:
        raise ValueError(f"schedule {v!r} is not five cron fields (minute hour day month weekday), e.g. \"0 3 * * *\"")
    for text, (what, low, high) in zip(fields, CRON_FIELDS):
        for item in text.split(","):
            base, slash, step = item.partition("/")
            numbers = [] if base == "*" else base.split("-")
            ok = (base == "*" or 1 <= len(numbers) <= 2) and all(n.isdigit() for n in numbers) and \
                (not slash or step.isdigit() and int(step) >= 1)  # "*/" and "0/" have no step
            if not ok or any(not low <= int(n) <= high for n in numbers) or \
                    (len(numbers) == 2 and int(numbers[0]) > int(numbers[1])):
                raise ValueError(f"schedule {v!r}: {what} {item!r} is not * or numbers {low}-{high} "
                                 "(N, N-M, lists with ',', steps with '/')")
    return v


def check_image(v: str) -> str:
    """``v`` when it names an image by a pinned tag or digest; ``latest`` and a missing tag are refused."""
    match = IMAGE.fullmatch(v)
    if not match:
        raise ValueError(f"image {v!r} is not an image reference (registry/repository:tag or @sha256:digest)")
    if not match["tag"] and not match["digest"]:
        raise ValueError(f"image {v!r} has no tag: the node would pull whatever 'latest' is that day; pin a release "
                         "tag such as lmsysorg/sglang:v0.5.23-cu130 (or a @sha256: digest)")
    if match["tag"] == "latest":
        raise ValueError(f"image {v!r} uses the moving tag 'latest'; pin a release tag or a @sha256: digest")
    return v


#: Pod Security Standards levels a namespace can enforce (``pod-security.kubernetes.io/enforce``).
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")


class ClaimSource(Section):
    """``model_volume.persistentVolumeClaim``: a PersistentVolumeClaim (Kubernetes ``PersistentVolumeClaimVolumeSource``;
    mounted read-only)."""

    claimName: str = Field(..., description="the claim holding the weights (created by the operator)")

    @field_validator("claimName")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, "claimName")


class ImageSource(Section):
    """``model_volume.image``: an OCI image (artifact) holding the weights (Kubernetes ``ImageVolumeSource``,
    beta since 1.33, read-only by design)."""

    reference: str = Field(..., description="the image with the weights, pinned by tag or digest")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="image pull policy")

    @field_validator("reference")
    @classmethod
    def _ref(cls, v: str) -> str:
        return check_image(v)


class HostPathSource(Section):
    """``model_volume.hostPath``: a folder of the node (Kubernetes ``HostPathVolumeSource``, type Directory).
    Forbidden by Pod Security ``baseline`` and ``restricted``: needs ``pod_security = "privileged"``."""

    path: str = Field(..., description="the node's model folder")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_abs_path(v)


#: The old ``[kubernetes]`` keys of the model volume and the form that replaced them (a refusal names it).
OLD_MODEL_VOLUME_KEYS = ("model_claim", "model_host_path")


class ModelVolume(Section):
    """``[kubernetes] model_volume``: where the weights come from, as exactly one Kubernetes volume source under
    its Kubernetes field name, e.g. ``model_volume = { persistentVolumeClaim = { claimName = "kimi-k25-weights" } }``.

    ``persistentVolumeClaim`` and ``image`` are volume types Pod Security ``restricted`` allows (kubernetes/
    pod-security-admission ``policy/check_restrictedVolumes.go``); ``hostPath`` is forbidden from ``baseline`` up.
    """

    persistentVolumeClaim: ClaimSource | None = None
    image: ImageSource | None = None
    hostPath: HostPathSource | None = None

    @model_validator(mode="after")
    def _one(self) -> "ModelVolume":
        set_ = [k for k in ("persistentVolumeClaim", "image", "hostPath") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"model_volume needs exactly one of persistentVolumeClaim, image, hostPath (got "
                             f"{', '.join(set_) or 'none'}); e.g. model_volume = {{ persistentVolumeClaim = "
                             "{ claimName = \"kimi-k25-weights\" } }")
        return self

    @property
    def kind(self) -> str:
        """The source's Kubernetes field name (``persistentVolumeClaim``, ``image`` or ``hostPath``)."""
        return next(k for k in ("persistentVolumeClaim", "image", "hostPath") if getattr(self, k) is not None)

    def volume(self) -> dict[str, Any]:
        """The pod ``volumes[]`` entry's source (without ``name``)."""
        if self.persistentVolumeClaim is not None:
            return {"persistentVolumeClaim": {"claimName": self.persistentVolumeClaim.claimName, "readOnly": True}}
        if self.image is not None:
            return {"image": {"reference": self.image.reference, "pullPolicy": self.image.pullPolicy}}
        assert self.hostPath is not None
        return {"hostPath": {"path": self.hostPath.path, "type": "Directory"}}


#: A DNS subdomain (RFC 1123): the names of a Secret or a PriorityClass.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Toleration(Section):
    """One ``tolerations[]`` entry of a pod (Kubernetes core/v1 Toleration: GPU nodes are commonly tainted, e.g.
    ``nvidia.com/gpu:NoSchedule``)."""

    key: str | None = Field(None, description="taint key (empty with operator Exists: every taint)")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal")
    value: str | None = Field(None, description="taint value (with Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="the effect tolerated (empty: every effect)")
    tolerationSeconds: int | None = Field(None, ge=0, description="with NoExecute: how long the pod stays")

    @model_validator(mode="after")
    def _valid(self) -> "Toleration":
        if self.key is not None and not LABEL_KEY.fullmatch(self.key):
            raise ValueError(f"toleration key {self.key!r} is not a Kubernetes label key")
        if self.value is not None and (not LABEL_VALUE.fullmatch(self.value) or len(self.value) > 63):
            raise ValueError(f"toleration value {self.value!r} is not a Kubernetes label value")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator = \"Exists\"")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds goes with effect = \"NoExecute\" only")
        return self

    def spec(self) -> dict[str, Any]:
        """The pod spec's entry (unset fields left out)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


#: The kinds of ``[kubernetes] affinity`` (core/v1 Affinity's fields).
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


class Kubernetes(Section):
    """``[kubernetes]``: how ``render --target kubernetes`` turns the profile into LeaderWorkerSet manifests.

    Absent: no Kubernetes rendering (``render --target kubernetes`` says to add it). Names are Kubernetes
    object names (RFC 1035 labels); images are pinned by tag or digest; sizes are quantities (``64Gi``).
    Cross-field rules that need the other tables are :func:`kimi_deploy.targets.kubernetes.problems`.
    """

    image: str = Field(..., description="SGLang image with a pinned tag, e.g. lmsysorg/sglang:v0.5.23-cu130")
    python: str = Field("python3", description="SGLang's interpreter inside the image (a name on PATH or a path)")
    namespace: str = Field("kimi-deploy", description="namespace of every object")
    name: str | None = Field(None, description="object name prefix (default: [service] name, if a DNS label)")
    node_gpus: int = Field(8, ge=1, le=64, description="GPUs each node of the node type has (nvidia.com/gpu)")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of the SGLang pods")
    affinity: dict[str, Any] = Field(default_factory=dict, description="affinity of the SGLang pods (nodeAffinity, "
                                     "podAffinity, podAntiAffinity as in the pod spec), e.g. required GPU products")
    tolerations: list[Toleration] = Field(default_factory=list, description="tolerations of the SGLang, gateway "
                                          "and check pods (GPU nodes are commonly tainted nvidia.com/gpu)")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets (kubernetes.io/dockerconfigjson) "
                                          "the SGLang, gateway and check pods pull their images with")
    priority_class_name: str | None = Field(None, description="PriorityClass of the SGLang, gateway and check pods")
    network_policy: bool = Field(True, description="render NetworkPolicies: the server port only from the gateway, "
                                 "the check and Prometheus; the gateway port from client_namespaces")
    client_namespaces: dict[str, str] = Field(
        default_factory=dict, description="namespaceSelector matchLabels of the namespaces whose pods may call the "
                                          "API (the gateway's port; the server's without [gateway]); default: "
                                          "this namespace only, e.g. { \"kubernetes.io/metadata.name\" = \"apps\" }")
    prometheus_namespaces: dict[str, str] = Field(
        default_factory=lambda: {"kubernetes.io/metadata.name": "monitoring"},
        description="namespaceSelector matchLabels of the namespace your Prometheus runs in (it scrapes /metrics)")
    model_volume: ModelVolume | None = Field(None, description="where the weights come from: one Kubernetes volume "
                                                               "source (persistentVolumeClaim, image or hostPath)")
    pod_security: Literal["restricted", "baseline", "privileged"] = Field(
        "restricted", description="Pod Security level the rendered namespace enforces; privileged only when "
                                  "hostPath volumes or rdma (hostNetwork) need it, set explicitly")
    model_mount: str = Field("/models", description="where the weights are mounted (read-only) in the pod; "
                                                   "must hold [sglang] model_path")
    shm_size: str = Field("64Gi", description="size limit of /dev/shm (memory-backed emptyDir, counted in memory)")
    cpu: str = Field("64", description="CPU request = limit of each SGLang pod (Guaranteed QoS)")
    memory: str = Field("512Gi", description="memory request = limit of each SGLang pod (Guaranteed QoS); "
                                             "holds /dev/shm, the ranks' host memory and the weights' page cache")
    cache_host_path: str | None = Field(None, description="node folder for the compile caches (kept across pod "
                                                          "restarts; owned by run_as_user); default: an emptyDir")
    nic: str = Field("eth0", description="the pod's data NIC (NCCL/GLOO_SOCKET_IFNAME) for multi-node groups")
    secret_name: str | None = Field(None, description="Secret holding the API key as key 'api-key' "
                                                      "(default <name>-api-key)")
    run_as_user: int = Field(1000, ge=1, le=2**31 - 1, description="non-root UID of every container")
    rdma: bool = Field(False, description="hostNetwork for RDMA NICs (the only reason the pods leave the pod network)")
    gateway_image: str | None = Field(None, description="image with the pinned smg (needed with [gateway])")
    gateway_replicas: int = Field(2, ge=1, le=16, description="gateway pods (a PodDisruptionBudget keeps all but "
                                                              "one through a drain)")
    gateway_cpu: str = Field("1", description="CPU request of each gateway pod")
    gateway_memory: str = Field("2Gi", description="memory request = limit of each gateway pod")
    gateway_python: str = Field("python3", description="the interpreter smg is installed in inside gateway_image "
                                                       "(a name on PATH or a path)")
    check_image: str | None = Field(None, description="image with the pinned kimi-deploy for the nightly check CronJob")
    check_schedule: str = Field("0 3 * * *", description="cron schedule of the nightly check (cluster time zone)")
    scrape: Literal["prometheus-operator", "annotations", "none"] = Field(
        "prometheus-operator", description="how a cluster Prometheus finds the metrics: PodMonitor, ServiceMonitor "
                                           "and PrometheusRule objects, prometheus.io/* pod annotations, or nothing")
    monitor_labels: dict[str, str] = Field(default_factory=dict, description="labels on the PodMonitor, "
                                           "ServiceMonitor and PrometheusRule (what your Prometheus selects, e.g. "
                                           "release = \"kube-prometheus-stack\")")
    pushgateway: str | None = Field(None, description="http(s)://HOST:PORT of a Prometheus Pushgateway the nightly "
                                                      "check pushes its result to (the metric its alerts read)")
    check_report_claim: str | None = Field(None, description="PVC the check writes check-report.json to "
                                                             "(default: a 1Gi claim <name>-check-reports is rendered)")

    @field_validator("image", "gateway_image", "check_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else check_image(v)

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        """The kit's first form (``model_volume = "pvc"`` + ``model_claim``, ``"hostPath"`` +
        ``model_host_path``) is refused with the table that replaced it."""
        if isinstance(data, dict) and (isinstance(data.get("model_volume"), str)
                                       or any(k in data for k in OLD_MODEL_VOLUME_KEYS)):
            claim, path = data.get("model_claim") or "CLAIM", data.get("model_host_path") or "/models"
            raise ValueError(
                "model_volume is now one Kubernetes volume source, and model_claim / model_host_path are gone; "
                f"write model_volume = {{ persistentVolumeClaim = {{ claimName = \"{claim}\" }} }} (admitted by "
                f"Pod Security restricted), or model_volume = {{ hostPath = {{ path = \"{path}\" }} }} with "
                "pod_security = \"privileged\"")
        return data

    @field_validator("namespace", "name", "secret_name", "check_report_claim")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v)

    @field_validator("python", "gateway_python")
    @classmethod
    def _python(cls, v: str) -> str:
        """An absolute path, or a command name looked up on the image's PATH (no ``/``: a relative path
        would depend on the container's working directory; no leading ``-`` or ``.``)."""
        if v.startswith("/"):
            return check_abs_path(v, "python")
        if not COMMAND_NAME.fullmatch(v):
            raise ValueError(f"python {v!r} is neither an absolute path nor a command name on PATH (letters, "
                             "digits and _.+-, not starting with - or .), e.g. python3 or /opt/venv/bin/python")
        return v

    @field_validator("model_mount", "cache_host_path")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_abs_path(v)

    @field_validator("cpu", "gateway_cpu")
    @classmethod
    def _cpu(cls, v: str) -> str:
        if not CPU_QUANTITY.fullmatch(v):
            raise ValueError(f"cpu {v!r} is not a CPU quantity such as \"64\" (cores) or \"500m\" (millicores)")
        return v

    @field_validator("shm_size", "memory", "gateway_memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not QUANTITY.fullmatch(v):
            raise ValueError(f"size {v!r} is not a quantity such as 64Gi or 512Mi (Ki, Mi, Gi, Ti)")
        return v

    @field_validator("nic")
    @classmethod
    def _nic(cls, v: str) -> str:
        if not IFNAME.fullmatch(v) or v in (".", ".."):
            raise ValueError(f"nic {v!r} is not a network interface name (at most 15 of letters, digits, _.-)")
        return v

    @field_validator("check_schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("pushgateway")
    @classmethod
    def _pushgateway(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[A-Za-z0-9._\[\]:-]+(:[0-9]{1,5})?/?", v):
            raise ValueError(f"pushgateway {v!r} is not http(s)://HOST:PORT, e.g. "
                             "\"http://prometheus-pushgateway.monitoring.svc:9091\"")
        return v

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set(AFFINITY_KINDS))
        if unknown:
            raise ValueError(f"affinity {unknown[0]!r} is not one of {', '.join(AFFINITY_KINDS)} (the pod spec's "
                             "affinity fields)")
        for kind, value in v.items():
            if not isinstance(value, dict) or not value:
                raise ValueError(f"affinity.{kind} must be a table, as in the pod spec")
        return v

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, v: list[str]) -> list[str]:
        for name in v:
            if not DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
                raise ValueError(f"image_pull_secrets {name!r} is not a Secret name (lower-case DNS subdomain)")
        if len(set(v)) != len(v):
            raise ValueError("image_pull_secrets names a Secret twice")
        return v

    @field_validator("priority_class_name")
    @classmethod
    def _priority(cls, v: str | None) -> str | None:
        if v is not None and (not DNS_SUBDOMAIN.fullmatch(v) or len(v) > 253):
            raise ValueError(f"priority_class_name {v!r} is not a PriorityClass name (lower-case DNS subdomain)")
        return v

    @field_validator("node_selector", "monitor_labels", "client_namespaces", "prometheus_namespaces")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value) or len(value) > 63:
                raise ValueError(f"node_selector {key} = {value!r} is not a Kubernetes label key and value")
        return v


#: ``[sglang]``: SGLang server arguments under their own names (SGLang 0.5.23), one field per row of
#: :data:`kimi_deploy.options.OPTIONS` in table order (types, defaults, bounds and help come from there).
