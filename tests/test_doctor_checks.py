"""Pure doctor checks: recorded probe output -> pass / warn / fail with evidence and a fix."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from doctor_helpers import DATA, make_model_dir

from kimi_deploy.doctor import checks
from kimi_deploy.facts import nvidia
from kimi_deploy.doctor.checks import Facts, evaluate
from kimi_deploy.doctor.host import FileDrift
from kimi_deploy.facts.disk import DiskSpace
from kimi_deploy.facts.ports import PortProbe
from kimi_deploy.facts.modeldir import ModelDir, inspect_model_dir
from kimi_deploy.patching import PatchStatus, SeriesStatus, find_series
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile
from kimi_deploy.engine import TargetInfo

PRESET = "kimi-k25-rtx-pro-6000-x8"
TORCH_CU130 = {"version": "2.14.1+cu130", "cuda": "13.0", "cuda_available": True, "nccl": "2.30.7",
               "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]}


def profile(**env):
    data = copy.deepcopy(get_preset(PRESET).data)
    data["environment"].update(env)
    return parse_profile(data)


def gpus(name="query-8x-server-580.csv"):
    return tuple(nvidia.parse_query_gpu((DATA / name).read_text()))


def topo(name="topo-8x-dual-socket.txt"):
    return nvidia.parse_topology((DATA / name).read_text())


def target(torch=TORCH_CU130, version="0.5.23"):
    return TargetInfo(python="/opt/sglang/.venv/bin/python", python_version="3.11.7",
                      packages={"sglang": version, "torch": "2.14.1", "flashinfer-python": "0.7.2"},
                      sglang_location="/opt/sglang/.venv/lib/python3.11/site-packages/sglang", torch=torch)


def facts(**kw):
    base = dict(profile=profile(), gpus=gpus(), topology=topo(), target=target())
    base.update(kw)
    return Facts(**base)


def by_name(f: Facts) -> dict:
    return {c.name: c for c in evaluate(f)}


def test_reference_host_gpu_checks_pass():
    c = by_name(facts())
    assert c["gpu.devices"].status == "pass"
    assert c["gpu.devices"].evidence == "8 x NVIDIA RTX PRO 6000 Blackwell Server Edition (tp_size 8)"
    assert c["gpu.compute_capability"].evidence == "12.0 (sm_120) on 8 GPUs"
    # no model directory probed: the model table's published size of the profile's model (K2.5) stands in
    assert c["gpu.memory"].evidence == ("8 x 97887 MiB = 764.7 GiB; weights 554.1 GiB (72%); Kimi K2.5's "
                                        "published ~595 GB, no downloaded shards measured")
    assert c["driver"].status == "pass" and "580.95.05" in c["driver"].evidence
    assert c["torch.arch"].status == "pass" and "sm_120" in c["torch.arch"].evidence


def test_four_gpus_with_tp8_fail():
    c = checks.check_gpu_devices(facts(gpus=gpus("query-4x-workstation-580.csv")))
    assert c.status == "fail"
    assert c.evidence == "4 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition; tp_size 8 needs 8"
    assert "tp_size" in c.hint


def test_gpu_count_differs_from_profile_warns():
    data = copy.deepcopy(get_preset(PRESET).data)
    data["service"]["gpu_count"] = 4
    data["sglang"]["tp_size"] = 4
    c = checks.check_gpu_devices(facts(profile=parse_profile(data)))
    assert c.status == "warn" and "gpu_count = 4" in c.evidence


def test_no_gpu_is_a_failure_with_hint_and_dependents_not_checked():
    c = by_name(facts(gpus=(), gpu_error="nvidia-smi not found on PATH", topology=None))
    assert c["gpu.devices"].status == "fail"
    assert c["gpu.devices"].evidence == "no NVIDIA GPU: nvidia-smi not found on PATH"
    assert "nvidia-smi" in c["gpu.devices"].hint
    for name in ("gpu.compute_capability", "gpu.memory", "driver", "pcie.topology"):
        assert c[name].status == "warn" and c[name].evidence.startswith("not checked")
    assert "reference GPU" in c["torch.arch"].evidence


def test_mixed_models_fail():
    mixed = gpus()[:7] + (dataclasses.replace(gpus()[7], name="NVIDIA H100 80GB HBM3", compute_cap="9.0"),)
    assert checks.check_gpu_devices(facts(gpus=mixed)).status == "fail"
    assert checks.check_compute_capability(facts(gpus=mixed)).status == "fail"


def test_driver_too_old_for_cuda_13():
    c = checks.check_driver(facts(gpus=gpus("query-8x-workstation-570.csv")))
    assert c.status == "fail"
    assert "driver 570.133.20" in c.evidence and "CUDA 13.x needs driver >= 580.65.06" in c.evidence
    assert "580.65.06" in c.hint


def test_torch_arch_list():
    no120 = dict(TORCH_CU130, arch_list=["sm_80", "sm_90", "sm_100"])
    c = checks.check_torch_arch(facts(target=target(no120)))
    assert c.status == "fail" and "lacks sm_120" in c.evidence
    ptx = dict(TORCH_CU130, arch_list=["sm_90", "compute_90"])
    assert checks.check_torch_arch(facts(target=target(ptx))).status == "warn"
    sm121 = dataclasses.replace(gpus()[0], compute_cap="12.1")
    assert checks.check_torch_arch(facts(gpus=(sm121,) * 8)).status == "pass"  # sm_120 cubins run on 12.1
    blind = dict(TORCH_CU130, cuda_available=False)
    c = checks.check_torch_arch(facts(target=target(blind)))
    assert c.status == "fail" and "torch.cuda.is_available() is False" in c.evidence
    broken = checks.check_torch_arch(facts(target=target({"error": "ImportError('libcudnn.so.9')"})))
    assert broken.status == "fail" and "libcudnn" in broken.evidence


@pytest.mark.parametrize(("topology", "env", "status", "needle"), [
    ("topo-8x-dual-socket.txt", {}, "warn", "SYS (GPU0-GPU4), implies NCCL_P2P_LEVEL=SYS"),
    ("topo-8x-dual-socket.txt", {"NCCL_P2P_LEVEL": "SYS"}, "pass", "profile sets NCCL_P2P_LEVEL=SYS"),
    ("topo-8x-dual-socket.txt", {"NCCL_P2P_LEVEL": "PIX"}, "warn", "profile sets NCCL_P2P_LEVEL=PIX"),
    ("topo-8x-single-socket-switches.txt", {"NCCL_P2P_LEVEL": "PHB"}, "pass", "PHB"),
    ("topo-4x-workstation.txt", {}, "warn", "NODE (GPU0-GPU1), implies NCCL_P2P_LEVEL=PHB"),
    ("topo-8x-dual-socket.txt", {"NCCL_P2P_DISABLE": "1"}, "warn", "NCCL_P2P_DISABLE=1"),
])
def test_topology_and_p2p_level(topology, env, status, needle):
    c = checks.check_topology(facts(profile=profile(**env), topology=topo(topology)))
    assert c.status == status and needle in c.evidence


def test_topology_pix_only_group_passes():
    data = copy.deepcopy(get_preset(PRESET).data)
    data["sglang"]["tp_size"] = 2
    c = checks.check_topology(facts(profile=parse_profile(data)))
    assert c.status == "pass" and "PIX" in c.evidence


def test_models(tmp_path):
    good = inspect_model_dir(make_model_dir(tmp_path / "good", 3))
    c = checks.check_model("model", good, "model_path")
    assert c.status == "pass" and "config.json, 3 shards" in c.evidence
    bad = inspect_model_dir(make_model_dir(tmp_path / "bad", 3, missing=0))
    c = checks.check_model("model", bad, "model_path")
    assert c.status == "fail" and "1 of 3 shards missing (first: model-00001-of-00003.safetensors)" in c.evidence
    assert checks.check_model("draft_model", None, "x") is None


def test_memory_against_weights():
    big = ModelDir("/m", True, True, ("a",), (), (), 800 * 1024**3, ())
    assert checks.check_gpu_memory(facts(model=big)).status == "fail"
    tight = ModelDir("/m", True, True, ("a",), (), (), 700 * 1024**3, ())
    assert checks.check_gpu_memory(facts(model=tight)).status == "warn"
    kimi = ModelDir("/m", True, True, ("a",), (), (), 547 * 10**9, ())
    c = checks.check_gpu_memory(facts(model=kimi))
    assert c.status == "pass" and c.evidence.endswith("weights 509.4 GiB (67%)")


def test_disk_port_and_unit():
    low = DiskSpace("/var/cache/kimi-k25", "/var/cache", 20 * 1024**3, 100 * 1024**3)
    c = checks.check_disk(facts(disk=low))
    assert c.status == "warn" and "under 50.0 GiB" in c.evidence and "JIT" in c.hint
    busy = PortProbe("0.0.0.0", 30000, "in_use", "bind 0.0.0.0:30000: Address already in use")
    assert checks.check_port(facts(port=busy)).status == "fail"
    installed = (FileDrift("kimi-k25.service", "/etc/systemd/system/kimi-k25.service", "same"),
                 FileDrift("kimi-k25.env", "/etc/kimi-deploy/kimi-k25.env", "same"))
    assert checks.check_port(facts(port=busy, unit=installed)).status == "warn"
    assert checks.check_unit(facts(unit=installed)).status == "pass"
    absent = tuple(dataclasses.replace(d, state="absent") for d in installed)
    assert checks.check_unit(facts(unit=absent)).evidence.startswith("not installed")
    drift = (dataclasses.replace(installed[0], state="different", added=1, removed=1, first="+ --port 30001",
                                 diff="-x\n+y"), installed[1])
    c = checks.check_unit(facts(unit=drift))
    assert c.status == "fail" and "kimi-k25.service: +1 -1 lines, first `+ --port 30001`" in c.evidence and c.details == "-x\n+y"


def series_status(state="applied", *, applied=(), selected=None, record=True, reinstall_first=False):
    """A :class:`SeriesStatus` of the real 0.5.23 series: ``applied`` ids applied, the rest ``state``."""
    series = find_series("0.5.23")
    chosen = selected or [p.id for p in series.defaults]
    patches = [PatchStatus(id=p.id, state="applied" if p.id in applied else ("drifted" if state == "drifted" else
                                                                                "not_applied"),
                           default=p.default, selected=p.id in chosen, purpose=p.purpose, files=[])
               for p in series.patch]
    st = SeriesStatus(state=state, python=PY, sglang_version="0.5.23", sglang_location="/x/sglang",
                      series_versions=["0.5.23"], selected=chosen, patches=patches, state_file="/s.json",
                      recorded={"applied_at": "2026-11-29T00:00:00+00:00"} if record else None,
                      problems=[] if state == "applied" else ["kimi-k2-tool-call-ids: " + state],
                      reinstall_first=reinstall_first)
    return dataclasses.replace(st, fix=None if state == "applied" else st.remedy())


PY = "/opt/sglang/.venv/bin/python"
DEFAULT_IDS = ["kimi-k2-tool-call-ids", "kimi-k2-canonical-history-ids", "redact-api-key"]
FUSION, SYMM = "sm120-flashinfer-allreduce-fusion", "sm120-torch-symm-mem"


def test_sglang_check_and_flags():
    c = by_name(facts(patches=series_status(applied=DEFAULT_IDS)))
    assert c["sglang"].status == "pass" and "SGLang 0.5.23" in c["sglang"].evidence
    assert c["sglang.patches"].status == "pass"
    assert c["sglang.patches"].evidence.startswith("SGLang 0.5.23 carries kimi-k2-tool-call-ids, ")


def test_patches_not_applied_fail_like_the_units_patch_verify():
    """`patch verify` exits 1 on an unpatched SGLang, so with verify_patches on the doctor must fail."""
    c = checks.check_patches(facts(patches=series_status("not_applied")))
    assert c.status == "fail" and "not applied" in c.evidence and "ExecStartPre=kimi-deploy patch verify" in c.evidence
    assert c.hint.startswith(f"`kimi-deploy patch apply --python {PY}`")
    for state in ("partial", "drifted"):
        assert checks.check_patches(facts(patches=series_status(state))).status == "fail"
    drift = checks.check_patches(facts(patches=series_status("drifted", reinstall_first=True)))
    assert drift.hint.startswith(f"reinstall the same SGLang release (`{PY} -m pip install --force-reinstall "
                                 "--no-deps sglang==0.5.23`), then `kimi-deploy patch apply --python ")
    data = copy.deepcopy(get_preset(PRESET).data)
    data["service"]["verify_patches"] = False
    off = checks.check_patches(facts(profile=parse_profile(data), patches=series_status("not_applied")))
    assert off.status == "warn" and "verify_patches = false" in off.evidence
    unknown = checks.check_patches(facts(patches_error="GNU patch is not installed"))
    assert unknown.status == "warn" and "GNU patch" in unknown.evidence
    none = series_status("no_series")
    assert checks.check_patches(facts(patches=dataclasses.replace(none, fix="install X"))).status == "warn"


def gates(*extra):
    """The gated features the reference preset's rendered command asks for (fusion, torch symm mem)."""
    from kimi_deploy.launch import build_launch
    from kimi_deploy.versions import parse_version

    args = build_launch(profile(), parse_version("0.5.23")).server_args
    return tuple(find_series("0.5.23").gates_asked([*args, *extra]))


def test_the_mapping_lives_in_the_series_manifest():
    hits = gates()
    assert [(h.patch.id, h.gate.setting, h.flag, h.gate.without) for h in hits] == [
        (FUSION, "flashinfer_allreduce_fusion_backend", "--flashinfer-allreduce-fusion-backend", "fails"),
        (SYMM, "enable_torch_symm_mem", "--enable-torch-symm-mem", "disabled")]
    assert find_series("0.5.23").gates_asked(["--enable-flashinfer-allreduce-fusion"])[0].patch.id == FUSION
    assert find_series("0.5.23").gates_asked(["--enable-flashinfer-allreduce-fusion",
                                              "--enforce-disable-flashinfer-allreduce-fusion"]) == []


def test_gated_features_on_sm120_without_their_patches():
    c = by_name(facts(gates=gates(), patches=series_status(applied=DEFAULT_IDS)))
    fusion, symm = c["sglang.flashinfer_allreduce_fusion_backend"], c["sglang.enable_torch_symm_mem"]
    assert fusion.status == "fail" and symm.status == "warn"
    assert "compute capability 12.0 without patch sm120-flashinfer-allreduce-fusion" in fusion.evidence
    assert "raises ValueError 'FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.'" in fusion.evidence
    assert "Device capability 12 not supported" in symm.evidence
    # one command for both: `apply` applies exactly one set, so it names both opt-ins
    want = f"`kimi-deploy patch apply --python {PY} --with {FUSION},{SYMM}`"
    assert fusion.hint.startswith(want) and symm.hint.startswith(want)
    assert "docs/runbook.md#measuring-an-all-reduce-change" in fusion.hint
    assert fusion.hint.endswith("or remove [sglang] flashinfer_allreduce_fusion_backend")
    # only one missing: the command keeps the applied opt-in
    c = by_name(facts(gates=gates(), patches=series_status(applied=DEFAULT_IDS + [SYMM],
                                                           selected=DEFAULT_IDS + [SYMM])))
    assert c["sglang.enable_torch_symm_mem"].status == "pass"
    assert c["sglang.flashinfer_allreduce_fusion_backend"].hint.startswith(
        f"`kimi-deploy patch apply --python {PY} --with {FUSION},{SYMM}`")


def test_gated_features_pass_when_patched_or_not_sm12x():
    every = DEFAULT_IDS + [FUSION, SYMM]
    c = by_name(facts(gates=gates(), patches=series_status(applied=every, selected=every)))
    assert c["sglang.flashinfer_allreduce_fusion_backend"].status == "pass"
    assert c["sglang.enable_torch_symm_mem"].status == "pass"
    hopper = tuple(dataclasses.replace(g, name="NVIDIA H100 80GB HBM3", compute_cap="9.0") for g in gpus())
    c = by_name(facts(gpus=hopper, gates=gates(), patches=series_status("not_applied")))
    assert c["sglang.flashinfer_allreduce_fusion_backend"].status == "pass"
    assert "not gated" in c["sglang.flashinfer_allreduce_fusion_backend"].evidence
    # a profile that does not ask for them gets no such check
    assert "sglang.enable_torch_symm_mem" not in by_name(facts(patches=series_status("applied")))


def test_the_fusion_patch_opens_exact_sm120_only():
    """The fusion patch gates on SGLang's is_sm120() (12.0): on a 12.1 device (GB10) it cannot help, so doctor
    fails even with the patch applied and says to remove the setting instead of applying a patch."""
    every = DEFAULT_IDS + [FUSION, SYMM]
    gb10 = tuple(dataclasses.replace(g, name="NVIDIA GB10", compute_cap="12.1") for g in gpus())
    c = by_name(facts(gpus=gb10, gates=gates(), patches=series_status(applied=every, selected=every)))
    fusion = c["sglang.flashinfer_allreduce_fusion_backend"]
    assert fusion.status == "fail"
    assert f"patch {FUSION} opens the gate on 12.0 only" in fusion.evidence
    assert fusion.hint.startswith("remove [sglang] flashinfer_allreduce_fusion_backend")
    assert c["sglang.enable_torch_symm_mem"].status == "pass"  # that row is per major (12)


def test_gated_features_without_nvidia_smi_are_not_checked():
    c = by_name(facts(gpus=(), gpu_error="nvidia-smi not found on PATH", topology=None, gates=gates(),
                      patches=series_status(applied=DEFAULT_IDS)))
    fusion = c["sglang.flashinfer_allreduce_fusion_backend"]
    assert fusion.status == "warn"
    assert fusion.evidence.startswith("not checked: GPU compute capability unknown (nvidia-smi not found on PATH)")
    assert FUSION in fusion.evidence and "run doctor on the serving host" in fusion.hint


def test_a_gated_flag_cannot_come_through_extra_args():
    """Every gated flag is one the profile owns (issue 11): extra_args carrying it is refused at load, naming the
    key to use, so a gate is always found from its [sglang] key (before, doctor had to name extra_args)."""
    from kimi_deploy.errors import ProfileError

    data = copy.deepcopy(get_preset(PRESET).data)
    del data["sglang"]["enable_torch_symm_mem"]
    data["sglang"]["extra_args"] = ["--enable-torch-symm-mem"]
    with pytest.raises(ProfileError) as err:
        parse_profile(data)
    assert any("use [sglang] enable_torch_symm_mem" in p for p in err.value.problems)


def test_ipv6_addresses_are_bracketed():
    """An IPv6 bind address is shown as [addr]:port (RFC 3986), never ':::30000'."""
    import socket

    from kimi_deploy.facts.ports import hostport, probe_port

    assert hostport("::", 30000) == "[::]:30000" and hostport("fe80::1", 8) == "[fe80::1]:8"
    assert hostport("0.0.0.0", 30000) == "0.0.0.0:30000" and hostport("localhost", 1) == "localhost:1"
    free = PortProbe("::", 30000, "free", "bind [::]:30000 succeeded")
    assert checks.check_port(facts(port=free)).evidence == "[::]:30000 is free"
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            s.listen()
            port = s.getsockname()[1]
            probe = probe_port("::1", port)
    except OSError:
        pytest.skip("IPv6 loopback not configured")
    assert probe.state == "in_use" and probe.detail.startswith(f"bind [::1]:{port}: ")
    assert ":::" not in checks.check_port(facts(port=probe)).evidence


def _sized(**resolved):
    from pathlib import Path

    from kimi_deploy.sizing.memory import Facts as SizingFacts, GpuFacts, ModelFacts, plan
    from kimi_deploy.sizing.report import Sizing

    models = Path(__file__).parent / "data" / "models"
    facts_ = SizingFacts(GpuFacts.from_gpus(gpus(), "recorded"), ModelFacts.load(models / "kimi-k2.5-int4"),
                         ModelFacts.load(models / "kimi-k2.5-eagle3-mla"), resolved=resolved,
                         sources={"mem_fraction_static": "sglang/srt/arg_groups/memory_hook.py:339"})
    return Sizing(None, plan(profile(), facts_))


def test_memory_plan_check_fails_warns_and_passes():
    from kimi_deploy.sizing.report import Sizing

    refused = by_name(facts(sizing=_sized(mem_fraction_static=0.7578)))["sglang.memory"]
    assert refused.status == "fail" and refused.evidence.startswith("will not fit: weights 71.9 GiB/rank")
    assert "mem_fraction_static above 0.77" in refused.hint
    tight = by_name(facts(sizing=_sized(mem_fraction_static=0.95, context_length=131072)))["sglang.memory"]
    assert tight.status == "warn" and tight.evidence.startswith("tight: ")
    fits = by_name(facts(sizing=_sized(mem_fraction_static=0.93, context_length=65536)))["sglang.memory"]
    assert fits.status == "pass" and "3 x 65536 tokens" in fits.evidence
    skipped = by_name(facts(sizing=Sizing(None, None, ("no GPU facts (nvidia-smi not found on PATH)",))))
    assert skipped["sglang.memory"].status == "warn" and "nvidia-smi not found" in skipped["sglang.memory"].evidence
    assert by_name(facts())["sglang.memory"].evidence.startswith("not checked: SGLang's flags were not checked")
