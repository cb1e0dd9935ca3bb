"""`render --target kubernetes`: golden manifests, offline validation of every document, the SGLang command
parsed by SGLang 0.5.23 and equal to the systemd rank's, the key in no file, and every bad input exit 2.

Regenerate the golden files after an intended change with exactly:

    KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_kubernetes.py -k golden

and review the diff in git before committing.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from helpers import run_cli, write_profile
from kube_helpers import kubernetes_validate_cli, kustomize, load_tree, substitute_lws, validate_document
from kimi_deploy.targets import kubernetes
from kimi_deploy.profile import parse_profile
from kimi_deploy.targets.systemd import render_ranks
from kimi_deploy.targets.systemd import render as render_systemd

GOLDEN = Path(__file__).parent / "golden" / "kubernetes"
UPDATE = os.environ.get("KIMI_DEPLOY_UPDATE_GOLDEN") == "1"
KEY = "sk-kimi-k8s-test-9f1c2e7d5a"

#: A single-host-replica fleet: two copies of the model, one 8-GPU node each, key from a Secret.
SINGLE = """\
[service]
name = "kimi-k25"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
served_model_name = "moonshotai/Kimi-K2.5"
host = "0.0.0.0"
tp_size = 8
trust_remote_code = true
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
speculative_algorithm = "EAGLE3"
speculative_draft_model_path = "/models/lightseekorg/kimi-k2.5-eagle3-mla"
speculative_num_steps = 3
speculative_eagle_topk = 1
speculative_num_draft_tokens = 4
enable_metrics = true
api_key_file = "{key_file}"

[environment]
NCCL_IB_DISABLE = "1"

[monitoring]
runbook_url = "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md"

[fleet]
[[fleet.replicas]]
nodes = ["10.0.0.11"]
[[fleet.replicas]]
nodes = ["10.0.0.12"]

[kubernetes]
image = "lmsysorg/sglang:v0.5.23-cu130"
check_image = "registry.example.com/kimi-deploy:0.1.0"
model_volume = {{ persistentVolumeClaim = {{ claimName = "kimi-k25-weights" }} }}
node_selector = {{ "node.kubernetes.io/instance-type" = "rtx-pro-6000-x8" }}
"""

#: Two copies of two nodes each (TP8 x PP2 over 16 GPUs), the gateway in front, weights on a PVC.
GROUPS = """\
[service]
name = "kimi-k25"
gpu_count = 8

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
served_model_name = "moonshotai/Kimi-K2.5"
host = "0.0.0.0"
tp_size = 8
pp_size = 2
trust_remote_code = true
tool_call_parser = "kimi_k2"
reasoning_parser = "kimi_k2"
enable_metrics = true
api_key_file = "{key_file}"

[monitoring]
runbook_url = "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md"

[fleet]
dist_init_port = 20000
nic = "ens5f0"
dist_timeout = 1800
[[fleet.replicas]]
nodes = ["10.0.0.11", "10.0.0.12"]
[[fleet.replicas]]
nodes = ["10.0.0.13", "10.0.0.14"]

[gateway]
host = "10.0.0.10"
port = 30000
policy = "cache_aware"

[kubernetes]
image = "lmsysorg/sglang:v0.5.23-cu130"
gateway_image = "registry.example.com/smg:1.13.0"
check_image = "registry.example.com/kimi-deploy:0.1.0"
model_volume = {{ image = {{ reference = "registry.example.com/kimi-k25-weights:2026-01" }} }}
shm_size = "32Gi"
check_schedule = "30 2 * * *"
pushgateway = "http://prometheus-pushgateway.monitoring.svc:9091"
monitor_labels = {{ release = "kube-prometheus-stack" }}
tolerations = [{{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }}]
image_pull_secrets = ["registry-credentials"]
priority_class_name = "gpu-serving"
client_namespaces = {{ "kubernetes.io/metadata.name" = "apps" }}
affinity = {{ nodeAffinity = {{ requiredDuringSchedulingIgnoredDuringExecution = {{ nodeSelectorTerms = [{{ matchExpressions = [{{ key = "nvidia.com/gpu.product", operator = "In", values = ["NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"] }}] }}] }} }} }}
"""

CASES = {"single-host-replicas": SINGLE, "two-node-groups-gateway": GROUPS}


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "kimi-k25.api-key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)  # the key-file rule: nothing for other users
    return path


def profile_text(case: str, key_file: Path | str = "/etc/kimi-deploy/kimi-k25.api-key") -> str:
    return CASES[case].format(key_file=key_file)


def rendered(tmp_path: Path, text: str, *extra: str) -> Path:
    out = tmp_path / "manifests"
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, text)),
                      "--out", str(out), *extra])
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(tmp_path, case):
    out = rendered(tmp_path, profile_text(case))
    files = {p.name: p.read_text() for p in sorted(out.iterdir())
             if p.name != ".kimi-deploy-render.json"}  # render's record of the folder, not a manifest
    golden = GOLDEN / case
    if UPDATE:
        golden.mkdir(parents=True, exist_ok=True)
        for stale in golden.iterdir():
            stale.unlink()
        for name, text in files.items():
            (golden / name).write_text(text)
        pytest.skip(f"golden files rewritten in {golden}")
    assert golden.is_dir(), "no golden files: run KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_kubernetes.py -k golden"
    expected = {p.name: p.read_text() for p in sorted(golden.iterdir())}
    assert sorted(files) == sorted(expected)
    for name in expected:
        assert files[name] == expected[name], f"{name} differs from {golden / name}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_document_validates_offline_and_kustomize_builds(tmp_path, case):
    out = rendered(tmp_path, profile_text(case))
    tree = load_tree(out)
    kinds = []
    for name, documents in tree.items():
        for document in documents:
            assert validate_document(document) == [], f"{name}: {document['kind']}"
            kinds.append(document["kind"])
    assert "LeaderWorkerSet" in kinds and "CronJob" in kinds
    assert ("Deployment" in kinds and "Role" in kinds) == (case == "two-node-groups-gateway")
    cli = kubernetes_validate_cli(sorted(out.glob("*.yaml")))
    assert cli.returncode == 0 and "ERROR" not in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    built = kustomize(out)
    assert sorted(d["kind"] for d in built) == sorted(k for k in kinds if k != "Kustomization")
    listed = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(n for n in tree if n != "kustomization.yaml")


def test_the_yaml_reads_back_as_the_documents_rendered(tmp_path):
    """The emitter's text is the data: PyYAML gives back what render built (strings stay strings)."""
    profile = parse_profile(tomllib.loads(profile_text("two-node-groups-gateway")))
    manifests = kubernetes.render(profile)
    lws = yaml.safe_load(manifests.files["server-leaderworkerset.yaml"])
    args = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    assert all(isinstance(a, str) for a in args)
    assert args == kubernetes.container_args(profile, manifests.launch, manifests.shape, leader=False)


def _pods(lws: dict) -> dict[str, dict]:
    template = lws["spec"]["leaderWorkerTemplate"]
    return {role: template[f"{role}Template"]["spec"] for role in ("leader", "worker") if f"{role}Template" in template}


def test_shape_probes_and_serving_options_leader_only(tmp_path):
    out = rendered(tmp_path, profile_text("two-node-groups-gateway"))
    lws = load_tree(out)["server-leaderworkerset.yaml"][0]
    assert lws["spec"]["replicas"] == 2 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    pods = _pods(lws)
    leader, worker = (pods[r]["containers"][0] for r in ("leader", "worker"))
    assert {"startupProbe", "readinessProbe"} <= set(leader) and not {"startupProbe", "readinessProbe",
                                                                       "livenessProbe"} & set(worker)
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert leader["readinessProbe"]["timeoutSeconds"] > kubernetes.SGLANG_HEALTH_TIMEOUT_S
    # 1200 s TimeoutStartSec= of the unit: the startup probe waits as long before the kubelet kills the pod
    startup = leader["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    for flag in ("--host", "--port", "--served-model-name", "--tool-call-parser", "--reasoning-parser", "--config"):
        assert flag in leader["args"] and flag not in worker["args"]
    assert "initContainers" in pods["leader"] and "initContainers" not in pods["worker"]
    for pod in pods.values():
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert "hostNetwork" not in pod and pod["securityContext"]["runAsNonRoot"] is True
        shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]
        assert shm == {"medium": "Memory", "sizeLimit": "32Gi"}
        models = [v for v in pod["volumes"] if v["name"] == "models"][0]
        assert models["image"] == {"reference": "registry.example.com/kimi-k25-weights:2026-01",
                                   "pullPolicy": "IfNotPresent"}


def test_gateway_discovers_leaders_in_its_namespace_only(tmp_path):
    tree = load_tree(rendered(tmp_path, profile_text("two-node-groups-gateway")))
    role = [d for d in tree["gateway-rbac.yaml"] if d["kind"] == "Role"][0]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    deployment = tree["gateway-deployment.yaml"][0]
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--service-discovery-namespace") + 1] == "kimi-deploy"
    selector = args[args.index("--selector") + 1:args.index("--service-discovery-port")]
    lws = tree["server-leaderworkerset.yaml"][0]
    leader_labels = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    worker_labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    pairs = dict(s.split("=", 1) for s in selector)
    assert pairs.items() <= leader_labels.items() and not pairs.items() <= worker_labels.items()
    assert pod["serviceAccountName"] == role["metadata"]["name"]


def _exec_start_args(unit: str) -> list[str]:
    """The ``ExecStart=`` arguments after ``-m sglang.launch_server`` of a rendered systemd unit."""
    block = re.search(r"^ExecStart=(.*?)(?<!\\)\n", unit, re.M | re.S)
    assert block
    words = block.group(1).replace("\\\n", " ").split()
    return words[words.index("sglang.launch_server") + 1:]


def _systemd_rank_args(profile, rank: int) -> list[str]:
    """What the systemd unit of node ``rank`` of the first replica runs (independently of the Kubernetes code):
    the ExecStart= of that rank's rendered unit (kimi_deploy.targets.systemd.render_ranks), the single-host unit's for
    one node."""
    name = f"{profile.service.name}.service"
    if profile.nodes_per_copy == 1:
        return _exec_start_args(render_systemd(profile).files[name])
    return _exec_start_args(render_ranks(profile)[profile.replicas[0][rank]][name])


@pytest.mark.sglang
@pytest.mark.parametrize("case", sorted(CASES))
def test_container_command_parses_with_sglang_and_matches_the_systemd_rank(sglang_python, case):
    from kimi_deploy.validate import validate_server_args

    profile = parse_profile(tomllib.loads(profile_text(case)))
    manifests = kubernetes.render(profile)
    shape = manifests.shape
    lws = yaml.safe_load(manifests.files["server-leaderworkerset.yaml"])
    pods = _pods(lws)
    for index in range(shape.nodes):
        pod = pods["leader" if index == 0 and "leader" in pods else "worker"]
        container = pod["containers"][0]
        args = substitute_lws(container["args"], leader_address=profile.replicas[0][0],
                                         group_size=shape.nodes, worker_index=index)
        assert "$(" not in " ".join(args)
        assert args == _systemd_rank_args(profile, index)
        # ranks >= 1 have no --config (the key is a serving-rank option)
        secrets = manifests.launch.secrets_config if "--config" in args else None
        v = validate_server_args(sglang_python, args, secrets_config=secrets)
        assert v.ok and v.warnings == (), (index, v.errors, v.warnings)


def test_the_key_is_in_no_rendered_file(tmp_path, key_file):
    for case in CASES:
        out = rendered(tmp_path / case, profile_text(case, key_file))
        for path in out.iterdir():
            assert KEY not in path.read_text(), path.name
        printed = run_cli(["render", "--target", "kubernetes", "--profile", str(tmp_path / case / "profile.toml")])
        assert printed.exit_code == 0 and KEY not in printed.stdout + printed.stderr


def test_render_twice_is_identical(tmp_path):
    first = rendered(tmp_path / "a", profile_text("two-node-groups-gateway"))
    second = rendered(tmp_path / "b", profile_text("two-node-groups-gateway"))
    assert {p.name: p.read_text() for p in first.iterdir()} == {p.name: p.read_text() for p in second.iterdir()}


def _with(text: str, table: str, **values: str) -> str:
    """``text`` with ``key = value`` lines (TOML values as written) set in ``[table]``."""
    lines = text.splitlines()
    start = lines.index(f"[{table}]") + 1
    for key, value in values.items():
        hit = [i for i in range(start, len(lines)) if lines[i].startswith(f"{key} =")]
        if value is None:
            del lines[hit[0]]
        elif hit:
            lines[hit[0]] = f"{key} = {value}"
        else:
            lines.insert(start, f"{key} = {value}")
    return "\n".join(lines) + "\n"


BAD = {
    "image-without-tag": (("kubernetes", {"image": '"lmsysorg/sglang"'}), "kubernetes.image", "has no tag"),
    "image-latest": (("kubernetes", {"image": '"lmsysorg/sglang:latest"'}), "kubernetes.image", "latest"),
    "secret-not-dns-label": (("kubernetes", {"secret_name": '"Kimi_Key"'}), "kubernetes.secret_name",
                             "not a DNS label"),
    "gpus-the-node-cannot-give": (("kubernetes", {"node_gpus": "4"}), "service.gpu_count", "node_gpus = 4"),
    "loopback-host": (("sglang", {"host": '"127.0.0.1"'}), "sglang.host", "0.0.0.0"),
    "model-outside-mount": (("kubernetes", {"model_mount": '"/weights"'}), "sglang.model_path", "model_mount"),
    "old-pvc-form": (("kubernetes", {"model_volume": '"pvc"', "model_claim": '"w"'}), "kubernetes",
                     'model_volume = { persistentVolumeClaim = { claimName = "w" } }'),
    "no-model-volume": (("kubernetes", {"model_volume": None}), "kubernetes.model_volume",
                        'persistentVolumeClaim = { claimName = "kimi-k25-weights" }'),
    "two-model-volumes": (("kubernetes", {"model_volume": '{ persistentVolumeClaim = { claimName = "w" }, '
                                          'hostPath = { path = "/models" } }'}),
                          "kubernetes.model_volume", "exactly one of"),
    "claim-misspelt": (("kubernetes", {"model_volume": '{ persistentVolumeClaim = { claim = "w" } }'}),
                       "kubernetes.model_volume.persistentVolumeClaim.claim", "did you mean claimName"),
    "hostpath-under-restricted": (("kubernetes", {"model_volume": '{ hostPath = { path = "/models" } }'}),
                                  "kubernetes.pod_security", 'set pod_security = "privileged"'),
    "cache-hostpath-under-baseline": (("kubernetes", {"cache_host_path": '"/var/cache/k"',
                                                      "pod_security": '"baseline"'}),
                                      "kubernetes.pod_security", "cache_host_path = /var/cache/k is a hostPath"),
    "rdma-under-restricted": (("kubernetes", {"rdma": "true"}), "kubernetes.pod_security", "hostNetwork"),
    "no-check-image": (("kubernetes", {"check_image": None}), "kubernetes.check_image", "set check_image"),
    "bad-shm-size": (("kubernetes", {"shm_size": '"64G"'}), "kubernetes.shm_size", "quantity"),
    "bad-schedule": (("kubernetes", {"check_schedule": '"nightly"'}), "kubernetes.check_schedule", "cron"),
    "schedule-out-of-range": (("kubernetes", {"check_schedule": '"0 24 * * *"'}), "kubernetes.check_schedule",
                              "hour '24'"),
    "misspelt-key": (("kubernetes", {"shm_szie": '"1Gi"'}), "kubernetes.shm_szie", "did you mean shm_size"),
    "schedule-step-missing": (("kubernetes", {"check_schedule": '"0 3 * * */"'}), "kubernetes.check_schedule",
                              "day of week '*/'"),
    "schedule-step-missing-after-a-number": (("kubernetes", {"check_schedule": '"0/ 3 * * *"'}),
                                             "kubernetes.check_schedule", "minute '0/'"),
    "python-relative-path": (("kubernetes", {"python": '"venv/bin/python"'}), "kubernetes.python",
                             "command name on PATH"),
    "python-trailing-slash": (("kubernetes", {"python": '"python3/"'}), "kubernetes.python", "command name"),
    "python-leading-dash": (("kubernetes", {"python": '"-python3"'}), "kubernetes.python", "command name"),
    "bad-namespace": (("kubernetes", {"namespace": '"Kimi"'}), "kubernetes.namespace", "DNS label"),
    # LWS names pods <name>-<copy>-<rank> and the CronJob's Jobs <name>-check-<minutes>: 40 leaves them room
    "name-too-long": (("kubernetes", {"name": '"k' + "8" * 40 + '"'}), "kubernetes.name",
                      "name = \"k888888888888888888888888888888888888888\" (40"),
    "service-name-not-a-label": (("service", {"name": '"kimi_k25"'}), "kubernetes.name",
                                 "(from [service] name)"),
    "bad-node-selector": (("kubernetes", {"node_selector": '{ "a b" = "c" }'}), "kubernetes.node_selector",
                          "label"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_exit_2_with_key_and_fix_and_nothing_written(tmp_path, case):
    (table, values), key, words = BAD[case]
    text = _with(profile_text("single-host-replicas"), table, **values)
    out = tmp_path / "manifests"
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, text)),
                      "--out", str(out)])
    assert result.exit_code == 2, result.stdout + result.stderr
    assert key in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_gateway_without_its_image_is_exit_2(tmp_path):
    text = _with(profile_text("two-node-groups-gateway"), "kubernetes", gateway_image=None)
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, text)),
                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "kubernetes.gateway_image" in result.stderr
    assert not (tmp_path / "out").exists()


def test_no_kubernetes_table_is_exit_2(tmp_path):
    text = profile_text("single-host-replicas").split("[kubernetes]")[0]
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, text)),
                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no [kubernetes] table" in result.stderr
    assert all(f"      {line}\n" in result.stderr for line in kubernetes.MINIMAL_TABLE.splitlines())
    assert "init --kubernetes" in result.stderr
    # the minimal form, pasted as shown, is refused for its placeholder image; with the image put in, it renders
    pasted = text + "\n" + kubernetes.MINIMAL_TABLE + "\n"
    assert not (tmp_path / "out").exists()
    refused = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, pasted)),
                       "--out", str(tmp_path / "pasted")])
    assert refused.exit_code == 2 and "replace the example value" in refused.stderr
    pasted = pasted.replace('"registry.example/', '"registry.corp.test/')
    assert run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, pasted)),
                    "--out", str(tmp_path / "pasted")]).exit_code == 0


def test_rdma_uses_the_host_network_with_the_reason_said(tmp_path):
    text = _with(profile_text("two-node-groups-gateway"), "kubernetes", rdma="true", pod_security='"privileged"',
                 cache_host_path='"/var/cache/kimi-k25"')
    out = rendered(tmp_path, text)
    lws_text = (out / "server-leaderworkerset.yaml").read_text()
    assert "# hostNetwork: true because [kubernetes] rdma = true" in lws_text
    for pod in _pods(yaml.safe_load(lws_text)).values():
        assert pod["hostNetwork"] is True
        cache = [v for v in pod["volumes"] if v["name"] == "cache"][0]
        assert cache["hostPath"] == {"path": "/var/cache/kimi-k25", "type": "Directory"}
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["NCCL_SOCKET_IFNAME"] == "ens5f0"
    for document in (d for docs in load_tree(out).values() for d in docs):
        assert validate_document(document) == [], document["kind"]
    namespace = yaml.safe_load((out / "namespace.yaml").read_text())
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert "rdma = true puts the server pods on the host network" in (out / "namespace.yaml").read_text()


def test_json_names_the_files_and_the_shape(tmp_path):
    import json

    profile = write_profile(tmp_path, profile_text("two-node-groups-gateway"))
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(profile), "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["copies"], data["nodes_per_copy"]) == (2, 2)
    assert list(data["files"])[0] == "kustomization.yaml" and "gateway-deployment.yaml" in data["files"]


def test_systemd_only_options_are_refused_for_kubernetes(tmp_path):
    profile = write_profile(tmp_path, profile_text("single-host-replicas"))
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(profile), "--print-command"])
    assert result.exit_code == 2 and "systemd target" in result.stderr


def _strings(data) -> set[str]:
    """Every string (keys and values) anywhere in parsed YAML documents."""
    if isinstance(data, dict):
        return {s for k, v in data.items() for s in (_strings(k) | _strings(v))}
    if isinstance(data, list):
        return {s for item in data for s in _strings(item)}
    return {data} if isinstance(data, str) else set()


K8S_STRING_FIELDS = ["image", "python", "namespace", "name", "model_mount", "shm_size", "nic",
                     "secret_name", "gateway_image", "gateway_python", "check_image", "check_schedule", "check_report_claim"]


@pytest.mark.parametrize("key", K8S_STRING_FIELDS)
def test_any_string_in_kubernetes_is_refused_or_lands_verbatim(key):
    """Hostile text in a [kubernetes] string: exit-2 refusal, or manifests that read back with the exact value."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from kimi_deploy.errors import ProfileError

    base = tomllib.loads(profile_text("two-node-groups-gateway"))
    samples = st.text(max_size=60) | st.sampled_from(
        ["kimi", "a" * 64, "-x", "x:latest", "/models/../etc", "/models", "eth0\n", "0 3 * * * *", "1Gi", "Ki",
         "registry:5000/sglang", "r/s@sha256:" + "a" * 64, "python3 -c", "$(LWS_GROUP_SIZE)", "yes", "null"])

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(samples)
    def check(value: str) -> None:
        data = {**base, "kubernetes": {**base["kubernetes"], key: value}}
        if key == "model_mount":
            data["sglang"] = {**data["sglang"], "model_path": f"{value}/Kimi-K2.5"}
        try:
            manifests = kubernetes.render(parse_profile(data))
        except ProfileError:
            return
        documents = [d for text in manifests.files.values() for d in yaml.safe_load_all(text) if d]
        assert value in _strings(documents) or any(value in s for s in _strings(documents)), value

    check()


def test_the_check_job_reads_the_same_profile_and_its_command_parses(tmp_path):
    """The CronJob's ConfigMap holds the profile (same digest once loaded), and its command is one that
    kimi-deploy's own CLI accepts (``--list`` parses every option, then only lists the checks)."""
    profile = parse_profile(tomllib.loads(profile_text("two-node-groups-gateway")))
    manifests = kubernetes.render(profile)
    config = yaml.safe_load(manifests.files["check-configmap.yaml"])
    again = parse_profile(tomllib.loads(config["data"]["profile.toml"]))
    assert again.digest() == profile.digest()
    cronjob = yaml.safe_load(manifests.files["check-cronjob.yaml"])
    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["kimi-deploy", "check"]
    local = write_profile(tmp_path, config["data"]["profile.toml"])
    args = [str(local) if a == kubernetes.CHECK_PROFILE else a for a in command[2:]]
    result = run_cli(["check", *args, "--list"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip()
    # the in-cluster URL is plain http to another host: without --insecure check would refuse to send the key
    from kimi_deploy.wire.apikey import guard_transport
    from kimi_deploy.errors import UsageError

    base_url = args[args.index("--base-url") + 1]
    with pytest.raises(UsageError):
        guard_transport(base_url, KEY, insecure=False, warn=lambda line: None)
    guard_transport(base_url, KEY, insecure="--insecure" in args, warn=lambda line: None)
    assert "# check --insecure: the check sends the API key over plain http" in manifests.files["check-cronjob.yaml"]


def test_the_init_container_writes_sglangs_config_yaml_0600(tmp_path, key_file):
    """The leader's init container command, run as rendered (its interpreter and paths pointed at a temp
    folder), turns the mounted key into ``api-key: "<key>"`` readable only by its owner."""
    import stat
    import subprocess
    import sys

    profile = parse_profile(tomllib.loads(profile_text("single-host-replicas", key_file)))
    lws = yaml.safe_load(kubernetes.render(profile).files["server-leaderworkerset.yaml"])
    init = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["initContainers"][0]
    python, flag, script, mounted, target = init["command"]
    assert (python, flag, mounted, target) == ("python3", "-c", f"{kubernetes.SECRET_DIR}/api-key",
                                               "/run/kimi-k25/sglang-secrets.yaml")
    out = tmp_path / "sglang-secrets.yaml"
    done = subprocess.run([sys.executable, flag, script, str(key_file), str(out)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(out.read_text()) == {"api-key": KEY}
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


SMG_HELP = Path(__file__).parent / "data" / "smg-1.13.0-launch-help.txt"


def _gateway_container(profile_toml: str) -> dict:
    manifests = kubernetes.render(parse_profile(tomllib.loads(profile_toml)))
    deployment = yaml.safe_load(manifests.files["gateway-deployment.yaml"])
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_the_gateway_key_is_in_no_argv_and_its_options_are_smg_launch_options():
    """The gateway pod runs the unit's own launcher (the key read from the mounted Secret inside smg's process,
    never on a command line a shell builds) and every option is an exact name of smg 1.13.0's `launch --help`."""
    from kimi_deploy import launch, validate

    container = _gateway_container(profile_text("two-node-groups-gateway"))
    assert container["command"] == ["python3", "-c", launch.LAUNCHER, "launch"]
    assert {"name": "CREDENTIALS_DIRECTORY", "value": kubernetes.SECRET_DIR} in container["env"]
    assert "--api-key" not in container["command"] + container["args"]
    assert validate.flag_problems(container["args"], validate.parse_help_options(SMG_HELP.read_text())) == []


def test_the_gateway_refuses_an_empty_key_with_the_real_smg(tmp_path, smg_path):
    """An empty Secret value must not start an open gateway: the rendered command, run in smg 1.13.0's own
    interpreter, exits non-zero before smg listens; a key with a newline reaches smg stripped."""
    import subprocess

    container = _gateway_container(profile_text("two-node-groups-gateway"))
    python = str(Path(smg_path).parent / "python")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "api-key").write_text("\n")
    (secrets / "api-key").chmod(0o600)  # the key-file rule: nothing for other users
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(secrets)}
    done = subprocess.run([python, *container["command"][1:], *container["args"]], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode != 0 and "the API key credential is empty" in done.stderr, done.stderr


def test_render_says_the_image_must_carry_the_patch_series_the_pods_do_not_verify(tmp_path):
    """The unit refuses an unpatched SGLang (ExecStartPre= patch verify); a pod cannot: render names the
    default patches and the ones this profile's settings need (series ``needed_by``), and how to build the image."""
    text = _with(profile_text("single-host-replicas"), "sglang", flashinfer_allreduce_fusion_backend='"auto"')
    profile = write_profile(tmp_path, text)
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(profile), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "patch verify" in line]
    assert len(warning) == 1, result.stderr
    for words in ("kimi-k2-tool-call-ids", "redact-api-key", "--with sm120-flashinfer-allreduce-fusion",
                  "--flashinfer-allreduce-fusion-backend", '--python "$(command -v python3)"', "verify_patches = false"):
        assert words in warning[0], words
    quiet = _with(text, "service", verify_patches="false")
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, quiet)),
                      "--out", str(tmp_path / "b")])
    assert result.exit_code == 0 and "patch verify" not in result.stderr, result.stderr


RECOMMENDED = {f"app.kubernetes.io/{k}" for k in ("name", "instance", "version", "component", "part-of",
                                                    "managed-by")}


def _templates(document: dict) -> list[dict]:
    """The pod templates inside one document (LWS leader/worker, Deployment, CronJob)."""
    spec = document.get("spec", {})
    found = [spec["template"]] if "template" in spec else []
    found += [spec["leaderWorkerTemplate"][t] for t in ("leaderTemplate", "workerTemplate")
              if t in spec.get("leaderWorkerTemplate", {})]
    if "jobTemplate" in spec:
        found.append(spec["jobTemplate"]["spec"]["template"])
    return found


def test_labels_are_the_recommended_ones_and_no_selector_carries_a_version(tmp_path):
    """Kubernetes' recommended labels on every object and pod (name = the application, instance = this one,
    version = what runs); selectors use the stable ones, so a new SGLang version rolls instead of orphaning pods."""
    tree = load_tree(rendered(tmp_path, profile_text("two-node-groups-gateway")))
    documents = [d for docs in tree.values() for d in docs if d["kind"] not in ("Kustomization", "Namespace")]
    pods = {}
    for document in documents:
        assert RECOMMENDED <= set(document["metadata"]["labels"]), document["kind"]
        for template in _templates(document):
            assert RECOMMENDED <= set(template["metadata"]["labels"]), document["kind"]
            pods.setdefault(document["kind"], []).append(template["metadata"]["labels"])
    lws = tree["server-leaderworkerset.yaml"][0]["metadata"]["labels"]
    gateway = tree["gateway-deployment.yaml"][0]
    assert (lws["app.kubernetes.io/name"], lws["app.kubernetes.io/version"]) == ("sglang", "0.5.23")
    assert (gateway["metadata"]["labels"]["app.kubernetes.io/name"],
            gateway["metadata"]["labels"]["app.kubernetes.io/version"]) == ("smg", "1.13.0")
    selectors = [d["spec"]["selector"] for d in documents if d["kind"] == "Service"]
    selectors.append(gateway["spec"]["selector"]["matchLabels"])
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    selectors.append(dict(s.split("=", 1) for s in args[args.index("--selector") + 1:
                                                           args.index("--service-discovery-port")]))
    for selector in selectors:
        assert "app.kubernetes.io/version" not in selector and "app.kubernetes.io/instance" in selector
        assert any(selector.items() <= labels.items() for labels in pods["LeaderWorkerSet"] + pods["Deployment"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_behind_the_gateway_the_nightly_check_runs_on_each_leader(case):
    """Like the gateway host's nightly unit (`check --each-worker`): through smg a bad copy hides behind its
    retries, so with [gateway] the CronJob checks every leader smg lists, one report each, in check-workers.json."""
    manifests = kubernetes.render(parse_profile(tomllib.loads(profile_text(case))))
    cronjob = yaml.safe_load(manifests.files["check-cronjob.yaml"])
    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    report = command[command.index("--json") + 1]
    if case == "two-node-groups-gateway":
        assert "--each-worker" in command and "--junit" not in command
        assert report == f"{kubernetes.REPORT_DIR}/check-workers.json"
    else:
        assert "--each-worker" not in command and report == f"{kubernetes.REPORT_DIR}/check-report.json"


def test_out_that_is_a_file_is_exit_2_and_the_file_is_kept(tmp_path):
    profile = write_profile(tmp_path, profile_text("single-host-replicas"))
    out = tmp_path / "manifests"
    out.write_text("mine\n")
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(profile), "--out", str(out)])
    assert result.exit_code == 2 and "--out" in result.stderr and "is a file" in result.stderr, result.stderr
    assert out.read_text() == "mine\n" and "Traceback" not in result.stderr


def _pod_templates(files) -> dict[str, dict]:
    """``Kind/name[.template]`` -> PodTemplateSpec of every pod the rendered objects create."""
    import pod_security

    return {where: template for text in files.values() for doc in yaml.safe_load_all(text) if doc
            for where, template in pod_security.pod_templates(doc)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_is_guaranteed_and_every_container_has_a_memory_bound(case):
    """The 8-GPU pods are the last evicted under node memory pressure (Guaranteed), and no container of any
    rendered pod can grow without bound (the check's bound is its unit's MemoryMax=2G)."""
    from kube_helpers import qos_class

    manifests = kubernetes.render(parse_profile(tomllib.loads(profile_text(case))))
    templates = _pod_templates(manifests.files)
    for where, template in templates.items():
        spec = template["spec"]
        for container in [*spec.get("initContainers", ()), *spec["containers"]]:
            assert container["resources"]["limits"]["memory"], (where, container["name"])
        if where.startswith("LeaderWorkerSet"):
            assert qos_class(spec) == "Guaranteed", where
            sglang = spec["containers"][0]["resources"]
            assert sglang["requests"] == sglang["limits"] == {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": 8}
    (check,) = [t for w, t in templates.items() if w.startswith("CronJob")]
    assert check["spec"]["containers"][0]["resources"]["limits"]["memory"] == "2Gi"
    unit = (Path(kubernetes.__file__).parents[2] / "systemd" / "check.service.j2").read_text()
    assert "\nMemoryMax=2G\n" in unit  # the same bound: systemd reads G as 1024^3


def test_gateway_has_two_replicas_a_disruption_budget_and_an_http_readiness_probe():
    manifests = kubernetes.render(parse_profile(tomllib.loads(profile_text("two-node-groups-gateway"))))
    deployment = yaml.safe_load(manifests.files["gateway-deployment.yaml"])
    pdb = yaml.safe_load(manifests.files["gateway-pdb.yaml"])
    assert deployment["spec"]["replicas"] == 2
    assert pdb["kind"] == "PodDisruptionBudget" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert container["resources"]["limits"] == {"memory": "2Gi"}
    assert list(manifests.files).index("gateway-pdb.yaml") > list(manifests.files).index("gateway-deployment.yaml")
    assert validate_document(pdb) == []


def test_the_gateway_probe_paths_are_smgs_own(smg_path):
    """smg 1.13.0 itself: /readiness is 503 while no worker is healthy (so the Service sends nothing to a gateway
    with no replica to route to), /liveness 200 while the process serves."""
    import subprocess
    import time

    import httpx
    from loopback import free_port

    port, metrics, dead = free_port(), free_port(), free_port()
    process = subprocess.Popen([smg_path, "launch", "--host", "127.0.0.1", "--port", str(port),
                                "--worker-urls", f"http://127.0.0.1:{dead}", "--disable-tokenizer-autoload",
                                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        answers: dict[str, int] = {}
        for _ in range(600):  # bounded: smg listens within seconds
            try:
                answers = {path: httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
                           for path in (kubernetes.GATEWAY_READINESS_PATH, kubernetes.GATEWAY_LIVENESS_PATH)}
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.1)
        assert answers == {"/readiness": 503, "/liveness": 200}
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_shm_at_or_above_the_memory_limit_is_refused():
    from kimi_deploy.errors import ProfileError

    text = _with(profile_text("single-host-replicas"), "kubernetes", shm_size='"512Gi"')
    with pytest.raises(ProfileError) as raised:
        kubernetes.render(parse_profile(tomllib.loads(text)))
    assert any("kubernetes.shm_size" in p and "counts against the pod's memory limit" in p
               for p in raised.value.problems)



# --- issue 43 item 5: scheduling keys on every pod, and a NetworkPolicy by default ---------------------------------

def _pod_specs(out: Path) -> dict[str, dict]:
    """Every pod spec rendered: the LWS leader and worker, the gateway Deployment's, the check CronJob's."""
    specs = {}
    for path in sorted(out.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "LeaderWorkerSet":
                specs.update({f"server-{k}": v for k, v in _pods(doc).items()})
            elif doc["kind"] == "Deployment":
                specs["gateway"] = doc["spec"]["template"]["spec"]
            elif doc["kind"] == "CronJob":
                specs["check"] = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return specs


def test_tolerations_pull_secrets_and_priority_reach_every_pod_and_affinity_the_gpu_pods(tmp_path):
    specs = _pod_specs(rendered(tmp_path, profile_text("two-node-groups-gateway")))
    assert len(specs) == 4, sorted(specs)  # leader, worker, gateway, check
    for where, spec in specs.items():
        assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], where
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}], where
        assert spec["priorityClassName"] == "gpu-serving", where
    for where in ("server-leader", "server-worker"):
        terms = specs[where]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    # the CPU-only pods are not pinned to GPU nodes; the gateway keeps its own spreading
    assert "nodeSelector" not in specs["gateway"] and "nodeSelector" not in specs["check"]
    assert set(specs["gateway"]["affinity"]) == {"podAntiAffinity"} and "affinity" not in specs["check"]


def test_without_the_keys_no_pod_carries_them(tmp_path):
    for spec in _pod_specs(rendered(tmp_path, profile_text("single-host-replicas"))).values():
        assert not {"tolerations", "imagePullSecrets", "priorityClassName", "affinity"} & set(spec)


def _policies(out: Path) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all((out / "network-policy.yaml").read_text())}


def test_network_policy_admits_the_server_port_only_from_the_gateway_the_check_and_prometheus(tmp_path):
    out = rendered(tmp_path, profile_text("two-node-groups-gateway"))
    assert "network-policy.yaml" in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
    policies = _policies(out)
    server, gateway = policies["kimi-k25-server"], policies["kimi-k25-gateway"]
    assert server["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": "kimi-k25-server"}
    assert server["policyTypes"] == ["Ingress"]
    port_rule, ranks = server["ingress"]
    assert port_rule["ports"] == [{"protocol": "TCP", "port": 30000}]
    assert port_rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "kimi-k25-gateway"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "kimi-k25-check"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # the ranks of a copy reach each other on any port (NCCL, the rendezvous), nobody else does
    assert ranks == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "kimi-k25-server"}}}]}
    api, metrics = gateway["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 30000}]
    assert api["from"][0] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
    assert metrics == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                       "ports": [{"protocol": "TCP", "port": 29000}]}


def test_network_policy_without_a_gateway_admits_clients_of_this_namespace_and_can_be_turned_off(tmp_path):
    out = rendered(tmp_path, profile_text("single-host-replicas"))
    (only,) = _policies(out).values()
    assert {"podSelector": {}} in only["ingress"][0]["from"]  # default clients: this namespace's pods
    off = rendered(tmp_path / "off", _with(profile_text("single-host-replicas"), "kubernetes", network_policy="false"))
    assert not (off / "network-policy.yaml").exists()


@pytest.mark.parametrize("key, value, words", [
    ("tolerations", '[{ operator = "Equal" }]', "without a key must have operator"),
    ("tolerations", '[{ key = "a", operator = "Exists", value = "x" }]', "Exists takes no value"),
    ("tolerations", '[{ key = "a", effect = "NoSchedule", tolerationSeconds = 5 }]', "tolerationSeconds goes with"),
    ("image_pull_secrets", '["Bad_Name"]', "is not a Secret name"),
    ("priority_class_name", '"High Priority"', "is not a PriorityClass name"),
    ("affinity", '{ nodeSelector = { a = "b" } }', "is not one of nodeAffinity"),
])
def test_bad_scheduling_keys_are_exit_2_naming_the_key(tmp_path, key, value, words):
    text = _with(profile_text("single-host-replicas"), "kubernetes", **{key: value})
    result = run_cli(["render", "--target", "kubernetes", "--profile", str(write_profile(tmp_path, text)),
                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and key in result.stderr and words in result.stderr, result.stderr


def test_the_runbooks_kustomize_overlay_builds_on_a_rendered_base(tmp_path):
    """docs/runbook.md#kubernetes shows an overlay over the rendered (never edited) files: its two files, as
    printed there, build with kubectl kustomize and patch the leader Service, the rest as rendered."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    blocks = re.findall(r"```yaml\n# deploy/overlay/([\w.-]+)[^\n]*\n(.*?)```", text, re.S)
    assert [name for name, _ in blocks] == ["kustomization.yaml", "leader-annotations.yaml"]
    base = rendered(tmp_path, profile_text("single-host-replicas"))
    (tmp_path / "base").symlink_to(base)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for name, body in blocks:
        (overlay / name).write_text(body)
    documents = kustomize(overlay)
    (leader,) = [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "kimi-k25-leader"]
    assert leader["metadata"]["annotations"] == {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    assert {d["kind"] for d in documents} == {d["kind"] for d in kustomize(base)}
