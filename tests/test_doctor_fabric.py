"""doctor's fabric checks for peer-memory all-reduce: pure parsers on recordings (tests/data/fabric/README.md
says where each came from), the checks' verdicts, and the probes through a fake nvidia-smi and a fake /sys."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kimi_deploy.doctor import checks, fabric, probe_fabric
from kimi_deploy.doctor.checks import Facts
from kimi_deploy.facts.nvidia import ParseError
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import parse_profile

DATA = Path(__file__).resolve().parent / "data" / "fabric"
REF, IPC = "kimi-k25-rtx-pro-6000-x8", "kimi-k25-rtx-pro-6000-x8-pcie-ipc"


def read(name: str) -> str:
    return (DATA / name).read_text()


def profile(preset=IPC, *, env=None, **sglang):
    data = copy.deepcopy(get_preset(preset).data)
    data["environment"].update(env or {})
    data["sglang"].update(sglang)
    return parse_profile(data)


def nccl_only():
    data = copy.deepcopy(get_preset(IPC).data)
    del data["sglang"]["enable_pcie_ipc_allreduce"]
    return parse_profile(data)


# ---- parsers


def test_lspci_acs_redirect_and_off():
    on = fabric.parse_lspci_acs(read("lspci-8x-switches-acs-redirect.txt"))
    assert on.devices == 19 and len(on.ports) == 10 and on.denied == 0
    assert [p.bdf for p in on.redirecting][:3] == ["0000:15:01.0", "0000:16:00.0", "0000:16:01.0"]
    assert on.ports[0].redirects == ["ReqRedir", "CmpltRedir"] and on.ports[0].control["SrcValid"] is True
    assert "Intel" in on.ports[0].description
    off = fabric.parse_lspci_acs(read("lspci-8x-switches-acs-off.txt"))
    assert len(off.ports) == 10 and off.redirecting == []


def test_lspci_without_root_hides_the_capabilities():
    report = fabric.parse_lspci_acs(read("lspci-8x-not-root.txt"))
    assert report.ports == () and report.denied == report.devices == 9


def test_lspci_garbage_is_a_parse_error():
    with pytest.raises(ParseError, match="outside a device block"):
        fabric.parse_lspci_acs("\t\tACSCtl:\tSrcValid+\n")
    with pytest.raises(ParseError, match="without flags"):
        fabric.parse_lspci_acs("00:01.0 PCI bridge: X\n\t\tACSCtl:\tnothing\n")


def test_iommu_modes():
    assert fabric.parse_iommu(read("cmdline-firecracker-vm.txt"), []).mode == "off"
    pt = fabric.parse_iommu(read("cmdline-intel-iommu-pt.txt"), ["dmar0", "dmar1"])
    assert pt.mode == "passthrough" and "intel_iommu=on iommu=pt" in pt.evidence
    tr = fabric.parse_iommu(read("cmdline-amd-default.txt"), ["ivhd0"])
    assert tr.mode == "translated" and "no iommu parameter" in tr.evidence
    # the kernel's own group types win over the command line
    assert fabric.parse_iommu(read("cmdline-intel-iommu-pt.txt"), ["dmar0"], ["DMA-FQ", "identity"]).mode == "translated"
    assert fabric.parse_iommu(read("cmdline-amd-default.txt"), ["ivhd0"], ["identity"]).mode == "passthrough"
    assert fabric.parse_iommu("iommu.passthrough=1", ["smmu3.0"]).mode == "passthrough"


def test_module_bool():
    assert fabric.parse_module_bool("Y\n") is True and fabric.parse_module_bool("0") is False
    with pytest.raises(ParseError):
        fabric.parse_module_bool("maybe")


def test_p2p_matrix():
    ok = fabric.parse_p2p(read("p2p-w-8x-all-ok.txt"))
    assert ok.gpus == tuple(range(8)) and ok.failing(list(range(8))) == []
    cns = fabric.parse_p2p(read("p2p-w-8x-cross-socket-cns.txt"))
    assert cns.failing([0, 1, 2, 3]) == []
    assert len(cns.failing(list(range(8)))) == 16 and cns.failing([0, 4]) == [(0, 4, "CNS")]
    underlined = "\t\x1b[4mGPU0\tGPU1\x1b[0m\n GPU0\tX\tDR\n GPU1\tDR\tX\n\nLegend:\n\n  X    = Self\n"
    assert fabric.parse_p2p("P2P Connectivity Matrix\n" + underlined).failing([0, 1]) == [(0, 1, "DR")]
    with pytest.raises(ParseError, match="not in the legend"):
        fabric.parse_p2p("\tGPU0\tGPU1\n GPU0\tX\tYES\n")
    with pytest.raises(ParseError, match="no GPU0 header"):
        fabric.parse_p2p("No devices were found\n")


def test_command_builders():
    assert fabric.lspci_command() == ["lspci", "-vvv"]
    assert fabric.p2p_command("w") == ["nvidia-smi", "topo", "-p2p", "w"]


# ---- checks


def test_fusion_and_pcie_ipc_together_warn_that_fusion_pre_empts_ipc():
    both = checks.check_allreduce_paths(Facts(profile=profile(REF, enable_pcie_ipc_allreduce=True)))
    assert both.status == "warn" and "PCIe IPC would be silently unused" in both.evidence
    assert "up to 2048 tokens" in both.evidence and "kimi-k25-rtx-pro-6000-x8-pcie-ipc" in both.hint
    assert checks.check_allreduce_paths(Facts(profile=profile())).status == "pass"
    off = profile(REF, enable_pcie_ipc_allreduce=True, enforce_disable_flashinfer_allreduce_fusion=True,
                  flashinfer_allreduce_fusion_backend=None)
    assert checks.check_allreduce_paths(Facts(profile=off)).status == "pass"
    assert "NCCL" in checks.check_allreduce_paths(Facts(profile=nccl_only())).evidence


@pytest.mark.parametrize("env", [{"NCCL_P2P_DISABLE": "1"}, {"NCCL_P2P_LEVEL": "LOC"}])
def test_a_peer_memory_path_with_nccl_p2p_off_fails(env):
    c = checks.check_p2p_disable(Facts(profile=profile(env=env)))
    assert c.status == "fail" and "ignore NCCL_P2P_DISABLE" in c.evidence and "#33041" in c.evidence
    assert "PCIe IPC all-reduce" in c.evidence
    data = copy.deepcopy(get_preset(IPC).data)
    del data["sglang"]["enable_pcie_ipc_allreduce"]
    data["environment"].update(env)
    assert checks.check_p2p_disable(Facts(profile=parse_profile(data))).status == "pass"


def test_acs_redirect_fails_with_a_peer_memory_path_and_warns_without():
    acs = fabric.parse_lspci_acs(read("lspci-8x-switches-acs-redirect.txt"))
    c = checks.check_acs(Facts(profile=profile(), acs=acs))
    assert c.status == "fail" and "ACS P2P redirect on 10 of 10 ports" in c.evidence
    assert "0000:15:01.0 (ReqRedir+CmpltRedir)" in c.evidence and "and 4 more" in c.evidence
    assert "setpci" in c.hint and "BIOS" in c.hint
    assert checks.check_acs(Facts(profile=nccl_only(), acs=acs)).status == "warn"
    off = fabric.parse_lspci_acs(read("lspci-8x-switches-acs-off.txt"))
    assert checks.check_acs(Facts(profile=profile(), acs=off)).status == "pass"
    hidden = checks.check_acs(Facts(profile=profile(), acs=fabric.parse_lspci_acs(read("lspci-8x-not-root.txt"))))
    assert hidden.status == "warn" and "as root" in hidden.hint
    missing = checks.check_acs(Facts(profile=profile(), acs_error="lspci not found on PATH"))
    assert missing.status == "warn" and "pciutils" in missing.hint


def test_iommu_translation_fails_with_a_peer_memory_path():
    tr = fabric.parse_iommu(read("cmdline-amd-default.txt"), ["ivhd0"])
    c = checks.check_iommu(Facts(profile=profile(), iommu=tr))
    assert c.status == "fail" and "iommu=pt" in c.hint and "until reset" in c.evidence
    assert checks.check_iommu(Facts(profile=nccl_only(), iommu=tr)).status == "warn"
    pt = fabric.parse_iommu(read("cmdline-intel-iommu-pt.txt"), ["dmar0"])
    assert checks.check_iommu(Facts(profile=profile(), iommu=pt)).status == "pass"


def test_uvm_hmm():
    assert checks.check_uvm_hmm(Facts(profile=profile(), uvm_disable_hmm=True)).status == "pass"
    c = checks.check_uvm_hmm(Facts(profile=profile(), uvm_disable_hmm=False))
    assert c.status == "warn" and "options nvidia_uvm uvm_disable_hmm=1" in c.hint
    assert checks.check_uvm_hmm(Facts(profile=profile(), uvm_error="absent")).evidence.startswith("not checked")


def test_p2p_status_over_the_tp_group():
    ok = {cap: fabric.parse_p2p(read(f"p2p-{cap}-8x-all-ok.txt")) for cap in ("r", "w")}
    assert checks.check_p2p(Facts(profile=profile(), p2p=ok)).status == "pass"
    bad = dict(ok, w=fabric.parse_p2p(read("p2p-w-8x-cross-socket-cns.txt")))
    c = checks.check_p2p(Facts(profile=profile(), p2p=bad))
    assert c.status == "fail" and "GPU0-GPU4 w CNS" in c.evidence and "16 pair" in c.evidence
    assert checks.check_p2p(Facts(profile=nccl_only(), p2p=bad)).status == "warn"
    tp4 = profile(tp_size=4)
    assert checks.check_p2p(Facts(profile=tp4, p2p=bad)).status == "pass"  # GPU0-3 share a socket


# ---- probes


def test_probe_fabric_reads_proc_and_sys_under_a_root(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text(read("cmdline-amd-default.txt"))
    (tmp_path / "sys/class/iommu/ivhd0").mkdir(parents=True)
    (tmp_path / "sys/kernel/iommu_groups/7").mkdir(parents=True)
    (tmp_path / "sys/kernel/iommu_groups/7/type").write_text("DMA-FQ\n")
    params = tmp_path / "sys/module/nvidia_uvm/parameters"
    params.mkdir(parents=True)
    (params / "uvm_disable_hmm").write_text("N\n")
    found = probe_fabric(with_nvidia_smi=False, fs_root=tmp_path)
    assert found["acs_error"] == "lspci not found on PATH"
    assert found["iommu"].mode == "translated" and "DMA-FQ" in found["iommu"].evidence
    assert found["uvm_disable_hmm"] is False
    (params / "uvm_disable_hmm").unlink()
    assert "not loaded" in probe_fabric(with_nvidia_smi=False, fs_root=tmp_path)["uvm_error"]


def test_probe_fabric_asks_nvidia_smi_for_read_and_write(tmp_path, monkeypatch):
    from doctor_helpers import install_fake_nvidia_smi

    install_fake_nvidia_smi(tmp_path / "bin", "query-8x-server-580.csv", "topo-8x-dual-socket.txt",
                            p2p=("p2p-r-8x-all-ok.txt", "p2p-w-8x-cross-socket-cns.txt"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    found = probe_fabric(fs_root=tmp_path)
    assert sorted(found["p2p"]) == ["r", "w"] and found["p2p"]["w"].failing([0, 4]) == [(0, 4, "CNS")]
    install_fake_nvidia_smi(tmp_path / "bin", "query-8x-server-580.csv")  # no p2p recordings: exit 64
    assert "topo -p2p r" in probe_fabric(fs_root=tmp_path)["p2p_error"]
