"""Which all-reduce path engaged: SGLang 0.5.23's log lines (tests/data/sglang-log, README says how they were
written) -> per-path state; the strings exist in the installed SGLang; restart --wait and status report it."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest

from install_fakes import FAKE_MAIN_PID, FakeServer, SHOW_ACTIVE, sglang_server_args, write_profile
from kimi_deploy.host import allreduce
from kimi_deploy.cli import cli
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.profile import load_profile, parse_profile

LOGS = Path(__file__).resolve().parent / "data" / "sglang-log"
REF, IPC = "kimi-k25-rtx-pro-6000-x8", "kimi-k25-rtx-pro-6000-x8-pcie-ipc"


def log(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def preset(name=IPC, **sglang):
    data = copy.deepcopy(get_preset(name).data)
    data["sglang"].update(sglang)
    return parse_profile(data)


def states(report) -> dict[str, str]:
    return {p.path: p.state for p in report.paths}


def test_pcie_ipc_engaged_and_torch_symm_mem_not_asked():
    r = allreduce.judge(preset(), log("pcie-ipc-engaged.txt"))
    assert states(r) == {"fusion": "not_asked", "pcie_ipc": "engaged", "torch_symm_mem": "skipped"}
    assert r.failures == [] and r.complete
    assert r.in_use == ("PCIe IPC all-reduce (world=8, max_numel=1376256, hidden=7168) for decode-sized "
                        "all-reduces; NCCL for the rest")


def test_pcie_ipc_asked_but_flashinfer_lacks_it_is_a_failure_with_the_log_line():
    r = allreduce.judge(preset(), log("pcie-ipc-no-flashinfer.txt"))
    (failure,) = r.failures
    assert failure.path == "pcie_ipc" and "has no pcie_ipc_comm" in failure.evidence
    assert failure.evidence.startswith("[2026-11-30 21:19:10 TP0] SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set")
    assert r.in_use == "NCCL for every all-reduce"
    assert "the log says `[2026-11-30" in r.problems()[0] and "remove enable_pcie_ipc_allreduce" in r.problems()[0]


def test_reference_preset_fusion_engaged_torch_symm_mem_disabled_for_capability_12():
    r = allreduce.judge(preset(REF), log("fusion-engaged.txt"))
    assert states(r) == {"fusion": "engaged", "pcie_ipc": "not_asked", "torch_symm_mem": "not_seen"}
    assert r.in_use.startswith("FlashInfer all-reduce fusion (trtllm) for all-reduces up to 2048 tokens")
    assert "torch symmetric memory within its size row (no log line confirms it)" in r.in_use
    symm = allreduce.judge(preset(REF), log("pcie-ipc-engaged.txt"))  # a start that logged the capability-12 refusal
    assert [p.path for p in symm.failures] == ["torch_symm_mem"] and states(symm)["fusion"] == "not_seen"
    assert "Device capability 12 not supported" in symm.problems()[-1]


def test_fusion_skipped_by_the_preflight_is_a_failure_even_though_some_ranks_got_far():
    r = allreduce.judge(preset(REF), log("fusion-preflight-skipped.txt"))
    fusion = next(p for p in r.paths if p.path == "fusion")
    assert fusion.failed and "preflight probe failed" in fusion.evidence and "TP5" in fusion.evidence
    refused = allreduce.judge(preset(REF), log("fusion-refused-sm120.txt"))
    assert next(p for p in refused.paths if p.path == "fusion").failed and not refused.complete


def test_fusion_pre_empts_ipc_when_both_engage():
    r = allreduce.judge(preset(REF, enable_pcie_ipc_allreduce=True, enable_torch_symm_mem=False),
                        log("fusion-and-ipc.txt"))
    assert states(r)["fusion"] == states(r)["pcie_ipc"] == "engaged"
    assert "(PCIe IPC pre-empted)" in r.in_use


def test_nccl_only_start_and_lines_after_ready_are_ignored_by_the_reader():
    profile = preset()
    data = copy.deepcopy(get_preset(IPC).data)
    del data["sglang"]["enable_pcie_ipc_allreduce"]
    r = allreduce.judge(parse_profile(data), log("nccl-only.txt"))
    assert r.in_use == "NCCL for every all-reduce" and r.failures == []
    r = allreduce.judge(profile, log("nccl-only.txt"))
    assert states(r)["pcie_ipc"] == "not_seen" and r.failures == []  # no line either way: not a failure


def test_journal_command_reads_one_start():
    assert allreduce.journal_command("kimi-k25.service", "Sat 2026-11-30 21:14:01 UTC") == [
        "journalctl", "-u", "kimi-k25.service", "--since", "Sat 2026-11-30 21:14:01 UTC", "-o", "cat", "--no-pager"]
    assert "-n" in allreduce.journal_command("kimi-k25.service", None)


@pytest.mark.sglang
def test_every_matched_fragment_is_in_sglang_0_5_23s_source(sglang_python):
    """The parser's strings are SGLang's own: each fixed fragment occurs in the installed source."""
    from patch_helpers import site_packages_of

    srt = site_packages_of(sglang_python) / "sglang" / "srt"
    source = "\n".join(p.read_text() for p in (
        srt / "layers/flashinfer_comm_fusion.py", srt / "distributed/device_communicators/pcie_ipc_ar.py",
        srt / "distributed/device_communicators/torch_symm_mem.py", srt / "distributed/parallel_state.py",
        srt / "entrypoints/http_server.py"))
    fragments = ["FlashInfer AllReduce Fusion enabled and workspace initialized: ", "backend={self.backend}",
                 "FlashInfer workspace preflight probe failed", "Skipping allreduce fusion",
                 "FlashInfer workspace preflight: cuMemCreate probe failed on at ", "least one rank. Skipping",
                 "Failed to initialize FlashInfer workspace (backend={backend})",
                 "FlashInfer allreduce fusion disabled globally because ",
                 "workspace initialization failed on at least one rank",
                 "FlashInfer AllReduce fusion disabled: the %d ranks of this group",
                 "FlashInfer comm not available, skipping workspace initialization",
                 "allreduce_fusion API is not available", "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
                 "FlashInfer PCIe-IPC workspace built (world=%d, max_numel=%d, hidden=%d)",
                 "FlashInfer PCIe-IPC all-reduce enabled (world=%d",
                 "FlashInfer PCIe-IPC workspace (max_numel=%d) failed",
                 "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has ",
                 "no pcie_ipc_comm; falling back to NCCL all-reduce.",
                 "Deterministic inference is on; leaving PCIe-IPC all-reduce off",
                 "Setup FlashInfer PCIe-IPC allreduce failed with",
                 "TorchSymmMemCommunicator: Device capability %s not supported",
                 "TorchSymmMemCommunicator: World size %d not supported",
                 "TorchSymmMemCommunicator: torch symmetric memory ", "multicast operations are not supported.",
                 allreduce.READY_LINE]
    missing = [f for f in fragments if f not in source]
    assert missing == []
    # and each pattern matches its line in the recordings, so a pattern cannot drift from the fragments
    every = [line for name in sorted(LOGS.glob("*.txt")) for line in name.read_text().splitlines()]
    matched = {rx.pattern for _, _, rx in allreduce.PATTERNS if any(rx.search(line) for line in every)}
    assert len(matched) >= 8


@contextlib.contextmanager
def _running(tmp_path, fake_systemd, journal: str):
    """A profile asking for PCIe IPC all-reduce, installed under ``tmp_path/root`` (yielded), served by a
    :class:`FakeServer` with its API key, systemd showing the unit active and its journal the recorded
    start ``journal`` (a file of tests/data/sglang-log)."""
    fake_systemd.set_full_journal(log(journal))
    holder = {}
    with FakeServer(ready=lambda n: True, args=lambda: sglang_server_args(holder["profile"])) as server:
        root = tmp_path / "root"
        profile = load_profile(write_profile(tmp_path / "p.toml", port=server.port,
                                             sglang_lines=("enable_pcie_ipc_allreduce = true",)))
        apply(plan_install(profile, HostLayout(root), enable=False, create_user=False))
        holder["profile"] = profile
        server.api_key = (root / "etc/kimi-deploy/kimi-test.api-key").read_text().strip()
        fake_systemd.set_show(SHOW_ACTIVE.format(pid=FAKE_MAIN_PID))
        yield root


def test_restart_wait_fails_when_the_log_says_the_asked_path_was_skipped(cli_runner, tmp_path, fake_systemd):
    with _running(tmp_path, fake_systemd, "pcie-ipc-no-flashinfer.txt") as root:
        result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--poll-interval", "0.01",
                                         "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert result.exit_code == 1, result.output
    attempt = data["attempts"][0]
    assert "PCIe IPC all-reduce was asked for but SGLang skipped it" in attempt["summary"]
    assert "has no pcie_ipc_comm" in attempt["summary"]
    assert ["-u", "kimi-test.service", "--since", "Sat 2025-06-14 10:02:11 UTC", "-o", "cat", "--no-pager"] \
        in fake_systemd.calls("journalctl")


def test_restart_wait_and_status_say_which_path_runs(cli_runner, tmp_path, fake_systemd):
    with _running(tmp_path, fake_systemd, "pcie-ipc-engaged.txt") as root:
        restarted = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--gate", "parser", "--poll-interval", "0.01"],
                                      catch_exceptions=False)
        status = cli_runner.invoke(cli, ["status", "--root", str(root), "--json"], catch_exceptions=False)
    assert restarted.exit_code == 0, restarted.output
    assert "all-reduce: PCIe IPC all-reduce (world=8, max_numel=1376256, hidden=7168)" in restarted.output
    assert "engaged allreduce.pcie_ipc: [2026-11-30 21:19:17 TP7] FlashInfer PCIe-IPC workspace built" \
        in restarted.output
    data = json.loads(status.output)
    assert data["allreduce"]["in_use"].startswith("PCIe IPC all-reduce")
    assert not any("all-reduce" in p for p in data["problems"])
