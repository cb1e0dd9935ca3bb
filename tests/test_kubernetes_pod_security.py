"""Pod Security admission of the rendered pods: every pod a rendered object creates passes the level its own
namespace enforces, checked by tests/pod_security.py, a port of kubernetes/pod-security-admission's checks
(v0.37.0-alpha.2, Kubernetes 1.37) that is first held to that repository's own v1.37 pass/fail fixtures.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

import pod_security
from kimi_deploy.targets import kubernetes
from kimi_deploy.profile import parse_profile
from test_kubernetes import CASES, _with, profile_text

FIXTURES = Path(__file__).parent / "data" / "pod-security" / "v1.37"
FIXTURE_FILES = sorted(FIXTURES.glob("*/*/*.yaml"))


def test_the_fixtures_are_there():
    # 49 baseline + 99 restricted pods upstream at v1.37 (test/testdata)
    assert len(FIXTURE_FILES) == 148


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_the_port_agrees_with_upstream_fixtures(path):
    """Every upstream ``pass`` pod is admitted at its level and every ``fail`` pod refused."""
    level, outcome = path.parts[-3], path.parts[-2]
    pod = yaml.safe_load(path.read_text())
    found = pod_security.violations(level, pod["spec"], pod.get("metadata"))
    assert (found == []) == (outcome == "pass"), found


def _pods(files):
    for text in files.values():
        for document in yaml.safe_load_all(text):
            if document:
                yield from pod_security.pod_templates(document)


def _enforced(files) -> str:
    namespace = yaml.safe_load(files["namespace.yaml"])
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == labels["pod-security.kubernetes.io/warn"]
    return labels["pod-security.kubernetes.io/enforce"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_examples_pass_restricted_which_their_namespace_enforces(case):
    manifests = kubernetes.render(parse_profile(tomllib.loads(profile_text(case))))
    assert _enforced(manifests.files) == "restricted"
    pods = list(_pods(manifests.files))
    # the server (leader and, for groups, worker), the check's CronJob, and the gateway where rendered
    assert {where.split("/")[0] for where, _ in pods} >= {"LeaderWorkerSet", "CronJob"}
    for where, template in pods:
        assert pod_security.violations("restricted", template["spec"], template.get("metadata")) == [], where


def test_hostpath_needs_privileged_set_explicitly_and_only_then_renders():
    """A hostPath model volume fails baseline and restricted (so a namespace at either would refuse every server
    pod); the render refuses it until pod_security = "privileged" is set, then says why in namespace.yaml."""
    text = _with(profile_text("single-host-replicas"), "kubernetes",
                 model_volume='{ hostPath = { path = "/models" } }', pod_security='"privileged"')
    manifests = kubernetes.render(parse_profile(tomllib.loads(text)))
    assert _enforced(manifests.files) == "privileged"
    assert "model_volume is a hostPath (/models)" in manifests.files["namespace.yaml"]
    server = [t for where, t in _pods(manifests.files) if where.startswith("LeaderWorkerSet")]
    for template in server:
        for level in ("baseline", "restricted"):
            found = pod_security.violations(level, template["spec"])
            assert [v.split(":")[0] for v in found] in (["hostPathVolumes"], ["hostPathVolumes",
                                                                              "restrictedVolumes"]), found
        assert pod_security.violations("privileged", template["spec"]) == []


def test_privileged_without_a_need_is_a_warning():
    text = _with(profile_text("single-host-replicas"), "kubernetes", pod_security='"privileged"')
    manifests = kubernetes.render(parse_profile(tomllib.loads(text)))
    assert any("every rendered pod meets restricted" in w for w in manifests.warnings)
