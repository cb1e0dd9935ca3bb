"""Doctor parsers and pure helpers on recorded nvidia-smi output and tiny model directories."""

from __future__ import annotations

import pytest
from doctor_helpers import DATA, make_model_dir, write_safetensors

from kimi_deploy.doctor import cuda
from kimi_deploy.facts import nvidia
from kimi_deploy.facts.modeldir import inspect_model_dir


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_query_gpu_8x_rtx_pro_6000():
    gpus = nvidia.parse_query_gpu(read("query-8x-server-580.csv"))
    assert len(gpus) == 8
    assert {g.name for g in gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].compute_cap == "12.0" and gpus[0].sm == "sm_120"
    assert gpus[0].memory_mib == 97887
    assert gpus[7].pci_bus_id == "00000000:E3:00.0"
    assert {g.driver_version for g in gpus} == {"580.95.05"}


def test_query_gpu_4x_and_empty():
    assert len(nvidia.parse_query_gpu(read("query-4x-workstation-580.csv"))) == 4
    assert nvidia.parse_query_gpu("") == []


def test_query_gpu_rejects_missing_field_and_bad_numbers():
    with pytest.raises(nvidia.ParseError, match="compute_cap"):
        nvidia.parse_query_gpu("index, name, pci.bus_id, memory.total [MiB], driver_version\n0, X, 0:1, 1 MiB, 1\n")
    header = read("query-8x-server-580.csv").splitlines()[0]
    with pytest.raises(nvidia.ParseError, match="non-numeric"):
        nvidia.parse_query_gpu(header + "\n0, X, 0:1, 12.0, [N/A], 580.95.05\n")


def test_commands():
    assert nvidia.query_gpu_command() == [
        "nvidia-smi", "--query-gpu=index,name,pci.bus_id,compute_cap,memory.total,driver_version", "--format=csv"]
    assert nvidia.topology_command() == ["nvidia-smi", "topo", "-m"]


def test_topology_dual_socket_pix_node_sys():
    topo = nvidia.parse_topology(read("topo-8x-dual-socket.txt"))
    assert topo.gpus == tuple(range(8))
    assert topo.links[(0, 1)] == "PIX" and topo.links[(0, 2)] == "NODE" and topo.links[(0, 4)] == "SYS"
    assert topo.links[(4, 0)] == "SYS"
    assert topo.worst_link(range(8)) == ("SYS", (0, 4))
    assert topo.worst_link(range(4)) == ("NODE", (0, 2))
    assert topo.worst_link([0, 1]) == ("PIX", (0, 1))
    assert topo.worst_link([0]) is None
    assert topo.numa[0] == "0" and topo.numa[7] == "1"


def test_topology_single_socket_switches_pxb_phb():
    topo = nvidia.parse_topology(read("topo-8x-single-socket-switches.txt"))
    assert topo.worst_link(range(8))[0] == "PHB"
    assert topo.worst_link(range(4))[0] == "PXB"


def test_topology_nvlink_and_level_map():
    topo = nvidia.parse_topology(read("topo-2x-nvlink.txt"))
    assert topo.links[(0, 1)] == "NV4"
    assert topo.worst_link([0, 1])[0] == "NV"
    assert nvidia.P2P_LEVEL_FOR_LINK["NODE"] == "PHB"
    assert nvidia.P2P_LEVEL_FOR_LINK["SYS"] == "SYS"


def test_topology_errors():
    with pytest.raises(nvidia.ParseError, match="GPU0"):
        nvidia.parse_topology(read("driver-not-loaded.txt"))
    bad = read("topo-2x-nvlink.txt").replace("NV4", "QQQ")
    with pytest.raises(nvidia.ParseError, match="QQQ"):
        nvidia.parse_topology(bad)


@pytest.mark.parametrize(("driver", "cuda_version", "status", "needed"), [
    ("580.95.05", "13.0", "pass", "580.65.06"),
    ("580.65.06", "13.0", "pass", "580.65.06"),
    ("570.133.20", "13.0", "fail", "580.65.06"),
    ("575.57.08", "12.9", "pass", "575.51.03"),
    ("570.133.20", "12.9", "warn", "575.51.03"),
    ("520.61.05", "12.8", "fail", "525.60.13"),
    ("580.95.05", "13.5", "warn", "580.65.06"),
    ("580.95.05", "11.8", "warn", None),
])
def test_driver_table(driver, cuda_version, status, needed):
    verdict = cuda.judge_driver(driver, cuda_version)
    assert (verdict.status, verdict.needed) == (status, needed)


def test_model_dir_complete(tmp_path):
    m = inspect_model_dir(make_model_dir(tmp_path / "m", 3))
    assert m.ok and len(m.shards) == 3 and m.has_config
    assert m.weights_bytes == sum(p.stat().st_size for p in (tmp_path / "m").glob("*.safetensors"))


def test_model_dir_missing_shard_truncated_shard_no_config(tmp_path):
    m = inspect_model_dir(make_model_dir(tmp_path / "a", 4, missing=2))
    assert not m.ok and m.missing == ("model-00003-of-00004.safetensors",)
    assert "1 of 4 shards missing (first: model-00003-of-00004.safetensors)" in m.problems
    t = inspect_model_dir(make_model_dir(tmp_path / "b", 2, truncated=1))
    assert t.truncated == ("model-00002-of-00002.safetensors",)
    c = inspect_model_dir(make_model_dir(tmp_path / "c", 1, config=False))
    assert c.problems == ("no config.json",)
    assert not inspect_model_dir(tmp_path / "nope").exists


def test_model_dir_single_file_and_bad_index(tmp_path):
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text("{}")
    write_safetensors(d / "model.safetensors")
    assert inspect_model_dir(d).ok
    (d / "model.safetensors.index.json").write_text("{not json")
    assert "model.safetensors.index.json is not a valid index (JSONDecodeError)" in inspect_model_dir(d).problems
