"""Pure doctor checks: :class:`Facts` (what the probes found) -> :class:`~kimi_deploy.doctor.report.Check`.

No I/O here: every function is tested on recorded probe output. Check names are stable
(scripts read ``--json``): ``gpu.devices``, ``gpu.compute_capability``, ``gpu.memory``,
``driver``, ``torch.arch``, ``pcie.topology``, ``model``, ``draft_model``, ``sglang``,
``sglang.patches``, ``sglang.<option>`` (one per gated feature the profile asks for, e.g.
``sglang.flashinfer_allreduce_fusion_backend``; the mapping is the patch series' ``needed_by``),
``sglang.flags``, ``speculative.draft``, ``kv_cache.dtype``, ``disk.cache``, ``ram.warm_restart``, ``port``,
``unit.installed``; the fabric for peer-memory all-reduce:
``allreduce.paths``, ``fabric.p2p_disable``, ``fabric.acs``, ``fabric.iommu``, ``fabric.uvm_hmm``,
``fabric.p2p``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kimi_deploy.catalog import spec_guard
from kimi_deploy.catalog.models import (REFERENCE_GPU, WEIGHTS_SHARE, Gpu as CatalogGpu, ModelFacts, identify,
                                        what_fits)
from kimi_deploy.doctor.cuda import SOURCE as DRIVER_SOURCE, judge_driver
from kimi_deploy.doctor.fabric import AcsReport, IommuMode, P2pMatrix
from kimi_deploy.doctor.host import FileDrift
from kimi_deploy.facts.disk import DiskSpace
from kimi_deploy.facts.ports import PortProbe, hostport
from kimi_deploy.facts.modeldir import ModelDir
from kimi_deploy.facts.nvidia import P2P_LEVEL_FOR_LINK, P2P_LEVELS, Gpu, Topology
from kimi_deploy.doctor.report import Check, failed, passed, warned
from kimi_deploy.patching import GateHit, SeriesStatus
from kimi_deploy.deployment import Units
from kimi_deploy.profile import Profile
from kimi_deploy.sizing.report import Sizing
from kimi_deploy.engine import TargetInfo
from kimi_deploy.validate import Validation

GIB = 1024**3
#: Below this much free space on the cache file system, warn. Not a measured cache size: a
#: margin for several version-keyed cache sets (Triton, FlashInfer, DeepGEMM, SGLang JIT,
#: torch inductor, CUDA; a new set per SGLang/FlashInfer/torch/CUDA stack, old ones kept until
#: wiped). A JIT compile that hits a full disk fails the start after minutes of weight loading.
DISK_WARN_BYTES = 50 * GIB
#: Weights above this share of the GPU memory of the TP group leave little room for the KV
#: cache, CUDA graphs and the draft model (SGLang's --mem-fraction-static defaults near 0.8-0.9).
WEIGHTS_WARN_SHARE = WEIGHTS_SHARE
#: Compute capability the reference GPU reports (RTX PRO 6000 Blackwell, SM120), checked in
#: torch's arch list when nvidia-smi gave nothing.
REFERENCE_CAPABILITY = "12.0"
#: GPU model name fragment -> compute capability NVIDIA lists for it (developer.nvidia.com/cuda-gpus).
KNOWN_CAPABILITY = {"RTX PRO 6000 Blackwell": "12.0"}
#: The GPU kind assumed when nvidia-smi gave nothing (the reference host's).
REFERENCE_GPU_NAME = REFERENCE_GPU.name


@dataclasses.dataclass(frozen=True)
class Facts:
    """Everything the probes found; ``*_error`` is the one-line reason a probe gave nothing."""

    profile: Profile
    #: The deployment's unit names (:attr:`kimi_deploy.deployment.Deployment.units`; ``None``: not resolved).
    units: Units | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None
    topology: Topology | None = None
    topology_error: str | None = None
    target: TargetInfo | None = None
    target_error: str | None = None
    validation: Validation | None = None
    validation_error: str | None = None
    patches: SeriesStatus | None = None
    patches_error: str | None = None
    gates: tuple[GateHit, ...] = ()
    gates_error: str | None = None
    #: The series ``gates`` were read from when this host's SGLang version is unknown (the profile's default).
    gates_version: str | None = None
    model: ModelDir | None = None
    draft_model: ModelDir | None = None
    #: The draft's ``config.json`` as read here (:func:`kimi_deploy.catalog.spec_guard.read_draft_config`; ``None``: none).
    draft_config: dict[str, Any] | None = None
    disk: DiskSpace | None = None
    disk_error: str | None = None
    #: ``/proc/meminfo`` as :func:`kimi_deploy.facts.meminfo.parse_meminfo` reads it (``None``: unreadable)
    meminfo: dict[str, int] | None = None
    port: PortProbe | None = None
    unit: tuple[FileDrift, ...] = ()
    unit_error: str | None = None
    acs: AcsReport | None = None
    acs_error: str | None = None
    iommu: IommuMode | None = None
    iommu_error: str | None = None
    uvm_disable_hmm: bool | None = None
    uvm_error: str | None = None
    p2p: dict[str, P2pMatrix] = dataclasses.field(default_factory=dict)
    p2p_error: str | None = None
    #: the memory plan and SGLang's effective configuration (:class:`kimi_deploy.sizing.report.Sizing`)
    sizing: Sizing | None = None
    sizing_error: str | None = None

    @property
    def tp_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs the server uses: the first ``tp_size`` (CUDA_VISIBLE_DEVICES unset)."""
        return self.gpus[: self.profile.sglang.tp_size]

    @property
    def known_model(self) -> ModelFacts | None:
        """The profile's model in the kit's model table, by its model path or served name
        (:func:`kimi_deploy.catalog.models.identify`): whose weights the GPUs must hold."""
        return identify(self.profile.sglang.model_path, self.profile.sglang.served_model_name)

    @property
    def known_model_dir(self) -> ModelFacts | None:
        """The table's model whose repository the model directory is named after (``/models/moonshotai/
        Kimi-K2.6``): only then is the directory compared with the published shard layout (a local copy
        served under the model's name may be a re-sharded or re-quantised one)."""
        return identify(self.profile.sglang.model_path)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _not_checked(name: str, why: str, hint: str, where: str = "") -> Check:
    """A WARN row ``not checked[ where]: why`` (``where``: `` on this host (...)`` when only the host lacks it)."""
    return warned(name, f"not checked{where}: {why}", hint)


def check_gpu_devices(f: Facts) -> Check:
    tp, want = f.profile.sglang.tp_size, f.profile.service.gpu_count
    if not f.gpus:
        return failed("gpu.devices", f"no NVIDIA GPU: {f.gpu_error or 'nvidia-smi lists none'}",
                      "run doctor on the serving host; install the NVIDIA driver (>= 580 for CUDA 13) "
                      "and check that `nvidia-smi` lists the GPUs")
    names = sorted({g.name for g in f.tp_gpus})
    summary = f"{len(f.gpus)} x {f.gpus[0].name}" if len({g.name for g in f.gpus}) == 1 else \
        f"{len(f.gpus)} GPUs ({', '.join(sorted({g.name for g in f.gpus}))})"
    if len(f.gpus) < tp:
        return failed("gpu.devices", f"{summary}; tp_size {tp} needs {tp}",
                      f"run on a host with {tp} GPUs, or lower [sglang] tp_size and [service] gpu_count "
                      f"to {len(f.gpus)} (the model must still fit)")
    if len(names) > 1:
        return failed("gpu.devices", f"mixed GPU models in the TP group: {', '.join(names)}",
                      "tensor parallelism needs identical GPUs; set CUDA_VISIBLE_DEVICES in [environment] "
                      "to identical ones")
    if len(f.gpus) != want:
        return warned("gpu.devices", f"{summary}; profile says gpu_count = {want}",
                      f"set [service] gpu_count = {len(f.gpus)} (strict hardening allows /dev/nvidia0..N-1)")
    return passed("gpu.devices", f"{summary} (tp_size {tp})")


def check_compute_capability(f: Facts) -> Check:
    name = "gpu.compute_capability"
    if not f.gpus:
        return _not_checked(name, "no GPU data (see gpu.devices)", "fix gpu.devices first")
    caps = sorted({g.compute_cap for g in f.tp_gpus})
    if len(caps) > 1:
        return failed(name, f"mixed compute capabilities in the TP group: {', '.join(caps)}",
                      "use identical GPUs for one TP group")
    cap, gpu = caps[0], f.tp_gpus[0]
    try:
        major = int(cap.split(".")[0])
    except ValueError:
        return warned(name, f"nvidia-smi reports compute capability {cap!r}",
                      "update the NVIDIA driver (compute_cap needs R510+)")
    if major < 8:
        return failed(name, f"compute capability {cap} ({gpu.name})",
                      "Kimi INT4 runs on SGLang's Marlin W4A16 kernels, which need compute capability >= 8.0")
    for fragment, expected in KNOWN_CAPABILITY.items():
        if fragment in gpu.name and cap != expected:
            return warned(name, f"{gpu.name} reports {cap}, NVIDIA lists {expected}",
                          "update the NVIDIA driver; check that the GPU is what the host inventory says")
    return passed(name, f"{cap} ({gpu.sm}) on {len(f.tp_gpus)} GPUs")


def check_gpu_memory(f: Facts) -> Check:
    name = "gpu.memory"
    if not f.gpus:
        return _not_checked(name, "no GPU data (see gpu.devices)", "fix gpu.devices first")
    group = f.tp_gpus
    least = min(g.memory_mib for g in group)
    total = least * len(group) * 1024**2
    evidence = f"{len(group)} x {least} MiB = {_gib(total)}"
    weights = (f.model.weights_bytes if f.model and f.model.exists else 0) + \
        (f.draft_model.weights_bytes if f.draft_model and f.draft_model.exists else 0)
    known = f.known_model
    published = ""
    if not (f.model and f.model.exists and f.model.weights_bytes) and known and known.weights_bytes:
        # not downloaded (K3's 1.68 TB rarely is before someone asks whether it fits): the published size
        weights += known.weights_bytes
        published = f"; {known.name}'s published {known.weights_text()}, no downloaded shards measured"
    if not weights:
        return passed(name, evidence + " (model size unknown)")
    share = weights / total
    evidence += f"; weights {_gib(weights)} ({share:.0%}){published}"
    if share >= 1:
        fix = "the weights do not fit in the TP group's memory: raise tp_size or use a smaller quantisation"
        if known:
            fix = (f"{known.name} does not fit {len(group)} x {least} MiB: "
                   + what_fits(known, CatalogGpu(group[0].name, least * 1024**2, "nvidia-smi memory.total")))
        return failed(name, evidence, fix)
    if share > WEIGHTS_WARN_SHARE:
        return warned(name, evidence, "little memory is left for the KV cache and CUDA graphs; expect a short "
                                      "context or out-of-memory at start; lower --mem-fraction-static headroom "
                                      "or raise tp_size")
    return passed(name, evidence)


def check_driver(f: Facts) -> Check:
    name = "driver"
    if not f.gpus:
        return _not_checked(name, "no GPU data (see gpu.devices)", "fix gpu.devices first")
    drivers = sorted({g.driver_version for g in f.gpus})
    driver = drivers[0]
    cuda = (f.target.torch or {}).get("cuda") if f.target else None
    if not cuda:
        return _not_checked(name, f"driver {driver}; the CUDA version of SGLang's torch is unknown "
                                  f"({f.target_error or 'torch not probed'})", "fix the sglang check first")
    torch_version = (f.target.torch or {}).get("version", "?")
    verdict = judge_driver(driver, cuda)
    evidence = f"driver {driver}, torch {torch_version} built for CUDA {cuda}: {verdict.reason}"
    if verdict.status == "fail":
        return failed(name, evidence, f"install NVIDIA driver {verdict.needed} or newer (R580+ for CUDA 13), "
                                      f"or a torch built for an older CUDA ({DRIVER_SOURCE})")
    if verdict.status == "warn":
        return warned(name, evidence, f"install NVIDIA driver {verdict.needed or 'newer'} or newer ({DRIVER_SOURCE})")
    return passed(name, evidence)


def _arch_covers(arch_list: list[str], cap: str) -> str | None:
    """``"sm"`` when a cubin in ``arch_list`` runs on ``cap``, ``"ptx"`` when only PTX can be JIT-compiled."""
    major, _, minor = cap.partition(".")
    try:
        want = (int(major), int(minor or 0))
    except ValueError:
        return None
    kinds = set()
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = digits.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        have = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and have[0] == want[0] and have[1] <= want[1]:
            kinds.add("sm")
        elif kind == "compute" and have <= want:
            kinds.add("ptx")
    return "sm" if "sm" in kinds else ("ptx" if "ptx" in kinds else None)


def check_torch_arch(f: Facts) -> Check:
    name = "torch.arch"
    if f.target is None or f.target.torch is None:
        return _not_checked(name, f"torch not probed ({f.target_error or 'no torch in the interpreter'})",
                            "fix the sglang check first")
    torch = f.target.torch
    if "error" in torch:
        return failed(name, f"import torch failed: {torch['error']}",
                      "repair the SGLang environment (reinstall the torch wheel SGLang pins)")
    arch = list(torch.get("arch_list") or [])
    caps = sorted({g.compute_cap for g in f.tp_gpus}) or [REFERENCE_CAPABILITY]
    source = "detected" if f.tp_gpus else "reference GPU"
    for cap in caps:
        sm = "sm_" + cap.replace(".", "")
        covered = _arch_covers(arch, cap)
        if covered is None:
            return failed(name, f"torch {torch.get('version')} arch list {' '.join(arch) or '(empty)'} lacks {sm} "
                                f"({source} capability {cap})",
                          f"install a torch build with {sm} kernels (CUDA 12.8+ builds include sm_120)")
        if covered == "ptx":
            return warned(name, f"torch {torch.get('version')} has only PTX for {sm} ({' '.join(arch)})",
                          "kernels are JIT-compiled at every cold start; install a torch build with "
                          f"{sm} cubins")
    if f.gpus and torch.get("cuda_available") is False:
        return failed(name, f"nvidia-smi lists {len(f.gpus)} GPUs but torch.cuda.is_available() is False",
                      "check the driver/CUDA pairing (see driver) and that the user can open /dev/nvidia*")
    return passed(name, f"torch {torch.get('version')} arch list has {', '.join('sm_' + c.replace('.', '') for c in caps)} "
                        f"({source})")


def check_topology(f: Facts) -> Check:
    name = "pcie.topology"
    if f.topology is None:
        return _not_checked(name, f"no topology ({f.topology_error or f.gpu_error or 'nvidia-smi topo -m failed'})",
                            "fix gpu.devices first")
    tp = f.profile.sglang.tp_size
    group = [g for g in f.topology.gpus if g < tp]
    worst = f.topology.worst_link(group)
    if worst is None:
        return passed(name, "single GPU in the TP group: no GPU-to-GPU traffic")
    kind, (a, b) = worst
    level = P2P_LEVEL_FOR_LINK[kind]
    evidence = f"farthest link in GPU0-{max(group)}: {kind} (GPU{a}-GPU{b}), implies NCCL_P2P_LEVEL={level}"
    env = f.profile.environment
    if env.get("NCCL_P2P_DISABLE") == "1":
        return warned(name, evidence + "; NCCL_P2P_DISABLE=1 is set",
                      "all GPU traffic goes through host memory; remove NCCL_P2P_DISABLE unless P2P hangs here")
    if level in ("NVL", "PIX", "PXB"):
        return passed(name, evidence)
    set_level = env.get("NCCL_P2P_LEVEL")
    if set_level is None:
        return warned(name, evidence + "; [environment] has no NCCL_P2P_LEVEL",
                      f"NCCL's platform default may route {kind} links through host memory; set "
                      f"NCCL_P2P_LEVEL = \"{level}\" in [environment] and confirm with nccl-tests "
                      "(a level the platform cannot do hangs)")
    if set_level in P2P_LEVELS and P2P_LEVELS.index(set_level) < P2P_LEVELS.index(level):
        return warned(name, evidence + f"; profile sets NCCL_P2P_LEVEL={set_level}",
                      f"P2P is off for {kind} links (traffic through host memory); set NCCL_P2P_LEVEL = "
                      f"\"{level}\" if nccl-tests passes with it")
    return passed(name, evidence + f"; profile sets NCCL_P2P_LEVEL={set_level}")


def check_model(name: str, m: ModelDir | None, field: str, known: ModelFacts | None = None) -> Check | None:
    """The model directory is complete (fail otherwise); with ``known`` (the table's model the directory is
    named after) its shards are the ones the model publishes (:class:`kimi_deploy.catalog.models.ShardLayout`;
    warn otherwise: another revision, a re-sharded copy, or an index copied from elsewhere; SGLang loads what
    the index names)."""
    if m is None:
        return None
    fix = (f"point [sglang] {field} at the downloaded model directory, or finish the download "
           "(`hf download REPO --local-dir DIR` resumes)")
    if not m.exists:
        return failed(name, f"{m.path} does not exist", fix)
    if m.problems:
        return failed(name, f"{m.path}: {'; '.join(m.problems)}", fix)
    evidence = f"{m.path}: config.json, {len(m.shards)} shards, {_gib(m.weights_bytes)}"
    if known is None:
        return passed(name, evidence)
    if known.shards is None:
        return passed(name, evidence + f" ({known.name}'s published shard layout is unknown to the kit: checked "
                                       "against its own index)")
    expected = known.shards.names()
    if tuple(m.shards) != expected:
        extra = sorted(set(m.shards) - set(expected))
        absent = sorted(set(expected) - set(m.shards))
        detail = "; ".join(part for part in (
            f"not in the published layout: {', '.join(extra[:2])}{' ...' if len(extra) > 2 else ''}" if extra else "",
            f"published but not in the index: {', '.join(absent[:2])}{' ...' if len(absent) > 2 else ''}"
            if absent else "") if part)
        return warned(name, f"{evidence}; {known.name} publishes {known.shards.count} shards "
                            f"({expected[0]} .. {expected[-1]}): {detail}",
                      f"download {known.repo} again into {m.path} (`hf download {known.repo} --local-dir {m.path}`), "
                      f"or point [sglang] {field} at a complete copy")
    return passed(name, evidence + f", {known.name}'s published layout")


def check_sglang(f: Facts) -> Check:
    python = f.target.python if f.target else f.profile.service.python
    hint = "pass --python with SGLang's interpreter, or fix [service] python"
    if f.target is None:
        return failed("sglang", f"{f.target_error}", hint)
    if not f.target.sglang_version:
        return failed("sglang", f"SGLang is not installed in {python}", hint)
    pk = f.target.packages
    stack = ", ".join(f"{k} {pk[k]}" for k in ("flashinfer-python", "torch", "transformers") if k in pk)
    return passed("sglang", f"SGLang {f.target.sglang_version} at {f.target.sglang_location}"
                            + (f" ({stack})" if stack else ""))


def check_patches(f: Facts) -> Check:
    """The series state as the unit's ``ExecStartPre=kimi-deploy patch verify`` will find it."""
    name = "sglang.patches"
    if f.target is None or not f.target.sglang_version:
        return _not_checked(name, "SGLang version unknown", "fix the sglang check first")
    v, st = f.target.sglang_version, f.patches
    if st is None:
        return _not_checked(name, f"patch state unknown ({f.patches_error or 'not probed'})",
                            "run `kimi-deploy patch status --python P` to see why")
    if st.state == "no_series":
        return warned(name, f"no patch series for SGLang {v} (patches/{v}/series)",
                      "the kit's patches (tool-call ids, API-key redaction, SM120 gates) cannot be applied to this "
                      f"SGLang: {st.fix}")
    if st.state == "applied":
        when = f" (applied {st.recorded['applied_at']})" if st.recorded else ""
        return passed(name, f"SGLang {v} carries {', '.join(st.selected)}{when}")
    evidence = f"patch series is {st.state.replace('_', ' ')}: " + "; ".join(st.problems)
    if f.profile.service.verify_patches:
        return failed(name, evidence + "; the unit's ExecStartPre=kimi-deploy patch verify refuses to start SGLang",
                      f"{st.fix}; or set [service] verify_patches = false to run unpatched")
    return warned(name, evidence + " ([service] verify_patches = false: SGLang starts without them)", st.fix)


def _gate_fix(f: Facts, hit: GateHit, missing: list[str]) -> str:
    where = f"[sglang] {hit.gate.setting}" if getattr(f.profile.sglang, hit.gate.setting, None) \
        else f"{hit.flag} from [sglang] extra_args"
    apply_fix = f.patches.remedy(missing) if f.patches else \
        f"`kimi-deploy patch apply --python {f.profile.service.python} --with {','.join(missing)}`"
    return (f"{apply_fix} (opt-in: then measure it with `kimi-deploy bench`, docs/runbook.md#measuring-an-all-reduce-change), "
            f"or remove {where}")


def check_gates(f: Facts) -> list[Check]:
    """One check per gated feature the rendered command asks for (:meth:`Series.gates_asked`):
    FAIL (``without = "fails"``) / WARN (``"disabled"``) when the TP GPUs are gated and the patch
    that lifts the gate is not applied."""
    if not f.gates:
        return []
    caps = sorted({g.compute_cap for g in f.tp_gpus})
    v = (f.target.sglang_version if f.target else None) or f.gates_version or "?"
    # without SGLang here the rows are what the profile asks of the series it renders for: not checked on this host
    assumed = (f" on this host (no SGLang version known here; from the profile and the SGLang {v} patch series)"
               if f.gates_version and not (f.target and f.target.sglang_version) else "")
    state = {p.id: p.state for p in f.patches.patches} if f.patches else {}
    gated = [h for h in f.gates if any(h.applies_to(c) for c in caps)]
    # One apply command for every missing patch: `apply` applies exactly one set.
    missing = list(dict.fromkeys(h.patch.id for h in (gated if caps else f.gates)
                                 if state.get(h.patch.id) != "applied"))
    out = []
    for hit in f.gates:
        name, gate, pid = f"sglang.{hit.gate.setting}", hit.gate, hit.patch.id
        majors = ", ".join(f"{m}.x" for m in gate.compute_capability_major)
        outcome = "fails to start" if gate.without == "fails" else "starts with it off"
        if not caps:
            out.append(_not_checked(name, f"GPU compute capability unknown ({f.gpu_error or 'no GPU data'}); "
                                          f"{hit.flag} on compute capability {majors} needs patch {pid} "
                                          f"(SGLang {v} {outcome} without it)",
                                    f"run doctor on the serving host; on such GPUs: {_gate_fix(f, hit, missing)}",
                                    assumed))
            continue
        if hit not in gated:
            out.append(passed(name, f"{hit.flag} on compute capability {', '.join(caps)}: not gated "
                                    f"(patch {pid} matters on {majors} only)"))
            continue
        if f.patches is None:
            out.append(_not_checked(name, f"{hit.flag} on compute capability {', '.join(caps)} needs patch "
                                          f"{pid}; "
                                          f"patch state unknown ({f.patches_error or 'not probed'})",
                                    "fix the sglang.patches check first", assumed))
            continue
        unopened = [c for c in caps if hit.applies_to(c) and not hit.patch_opens(c)]
        if unopened:
            # The patch cannot help here (it opens the gate on exact capabilities only, e.g. 12.0 not 12.1).
            check = failed if gate.without == "fails" else warned
            where = f"[sglang] {gate.setting}" if getattr(f.profile.sglang, gate.setting, None) \
                else f"{hit.flag} from [sglang] extra_args"
            out.append(check(name, f"{hit.flag} on compute capability {', '.join(unopened)}: patch {pid} opens the "
                                   f"gate on {', '.join(gate.patched_compute_capability)} only, so SGLang {v} "
                                   f"{outcome} ({gate.symptom})",
                             f"remove {where}; on this GPU use NCCL or SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 "
                             "([sglang] enable_pcie_ipc_allreduce = true) and measure it (docs/runbook.md#measuring-an-all-reduce-change)"))
            continue
        if state.get(pid) == "applied":
            out.append(passed(name, f"{hit.flag} on compute capability {', '.join(caps)}: patch {pid} applied"))
            continue
        evidence = (f"{hit.flag} on compute capability {', '.join(caps)} without patch {pid} "
                    f"({state.get(pid, 'not in the series').replace('_', ' ')}): SGLang {v} {gate.symptom}")
        check = failed if gate.without == "fails" else warned
        out.append(check(name, evidence, _gate_fix(f, hit, missing)))
    return out


def check_flags(f: Facts) -> Check:
    name = "sglang.flags"
    v = f.validation
    if v is None:
        return _not_checked(name, f.validation_error or "SGLang not found", "fix the sglang check first")
    if v.errors:
        return failed(name, f"SGLang {v.sglang_version} rejects the command: {v.errors[0]}",
                      "correct the flag in the profile; `kimi-deploy validate` shows every message")
    if v.warnings:
        return warned(name, f"SGLang {v.sglang_version} accepts the command with a warning: {v.warnings[0]}",
                      "switch to the flag SGLang names; `kimi-deploy validate` shows every message")
    return passed(name, f"SGLang {v.sglang_version} accepts the command ({', '.join(v.stages)})")


def check_memory_plan(f: Facts) -> Check:
    """SGLang's resolution on these GPUs and the memory plan (:mod:`kimi_deploy.sizing`): fail when the plan says
    the profile will not fit (the setting to change is the hint), warn when tight or not sized."""
    name = "sglang.memory"
    sized = f.sizing
    if sized is None:
        return _not_checked(name, f.sizing_error or "SGLang's flags were not checked", "fix sglang.flags first")
    if sized.unfinished:  # no verdict on a resolution that stopped half-way (issue 36)
        return failed(name, "no memory verdict: " + "; ".join(sized.unfinished),
                      "repair SGLang's environment (the error names what is missing) or pass --python with a "
                      "complete one, then run doctor again")
    if sized.plan is None:
        return _not_checked(name, "; ".join(sized.skipped) or "not sized", "`kimi-deploy validate --gpu-facts FILE "
                            "--model-facts DIR` sizes it with recorded facts")
    p = sized.plan
    figures = (f"weights {_gib(p.weights_bytes + p.draft_weights_bytes)}/rank, KV {p.kv_tokens} tokens, "
               f"mem_fraction_static {p.mem_fraction_static.value} ({p.mem_fraction_static.source})")
    if p.problems:
        return failed(name, f"will not fit: {figures}", p.problems[0])
    if p.warnings:
        return warned(name, f"{p.verdict}: {figures}", p.warnings[0])
    return passed(name, f"fits: {figures}; "
                        + ", ".join(f"{r} x {c} tokens" for c, r in p.concurrency))


def check_disk(f: Facts) -> Check:
    name = "disk.cache"
    if f.disk is None:
        return warned(name, f"not checked: {f.disk_error}", "check the cache_dir path")
    d = f.disk
    evidence = f"{_gib(d.free_bytes)} free on {d.measured} (cache root {d.path})"
    if d.free_bytes < DISK_WARN_BYTES:
        return warned(name, evidence + f", under {_gib(DISK_WARN_BYTES)}",
                      "JIT caches (Triton, FlashInfer, DeepGEMM, SGLang JIT) grow per software stack and a full "
                      "disk fails a start after minutes; free space, wipe old cache keys, or move [service] cache_dir")
    return passed(name, evidence)


def check_warm_restart(f: Facts) -> Check:
    """``ram.warm_restart``: RAM a warm restart needs (every shard of the model and the draft in the page cache, plus
    ``[startup] prefetch_reserve_gib``) against ``MemTotal``; warns when it cannot hold them (every restart then
    reads the weights from disk) or the shards were not measured."""
    name = "ram.warm_restart"
    st = f.profile.start
    shards = sum(m.weights_bytes for m in (f.model, f.draft_model) if m is not None)
    reserve = st.prefetch_reserve_gib * GIB
    info = f.meminfo or {}
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if not shards:
        return _not_checked(name, "no local shards of the model or the draft to measure",
                            "run doctor on the serving host, where model_path is a local folder")
    if total is None:
        return _not_checked(name, "/proc/meminfo has no MemTotal", "run doctor on the serving host (Linux)")
    need = shards + reserve
    evidence = (f"a warm restart needs {_gib(need)} (shards {_gib(shards)} + reserve {_gib(reserve)}); "
                f"MemTotal {_gib(total)}" + (f", MemAvailable {_gib(available)} now" if available is not None else ""))
    if not st.prefetch:
        return passed(name, evidence + "; the prefetch is off ([startup] prefetch = false)")
    if need > total:
        return warned(name, evidence + ": the shards cannot stay in the page cache, so the prefetch is skipped and "
                      "every restart reads them from disk",
                      "add RAM, or lower [startup] prefetch_reserve_gib if SGLang needs less host memory "
                      "(docs/runbook.md#warm-and-cold-restarts)")
    return passed(name, evidence)


def check_port(f: Facts) -> Check | None:
    p = f.port
    if p is None:
        return None
    if p.state == "free":
        return passed("port", f"{hostport(p.host, p.port)} is free")
    svc = f.profile.service.name
    installed = any(d.state != "absent" for d in f.unit)
    who = f"`ss -ltnp 'sport = :{p.port}'` shows the owner"
    if p.state == "in_use" and installed:
        unit = f.units.server if f.units else f"service {svc}"
        return warned("port", f"{p.detail} ({unit} is installed: probably the running server)",
                      f"expected while {svc} runs; otherwise {who}")
    if p.state == "in_use":
        return failed("port", p.detail, f"stop the program holding it ({who}) or change [sglang] port")
    return failed("port", p.detail, "use an address of this host in [sglang] host (0.0.0.0 for all) and a port "
                                    ">= 1024 (the unit has no CAP_NET_BIND_SERVICE)")


def check_unit(f: Facts) -> Check:
    name = "unit.installed"
    if f.unit_error:
        return warned(name, f"not checked: {f.unit_error}", "fix the profile or the sglang check first")
    if not f.unit or all(d.state == "absent" for d in f.unit):
        paths = ", ".join(d.path for d in f.unit)
        return warned(name, f"not installed ({paths})",
                      "install the unit (`kimi-deploy install --profile P --dry-run`, then without --dry-run)")
    absent = [d for d in f.unit if d.state == "absent"]
    different = [d for d in f.unit if d.state == "different"]
    if absent:
        return failed(name, f"{', '.join(d.name for d in absent)} missing beside the installed "
                            f"{', '.join(d.name for d in f.unit if d.state != 'absent')}",
                      "reinstall the rendered files together")
    if different:
        summary = "; ".join(f"{d.name}: +{d.added} -{d.removed} lines, first `{d.first}`" for d in different)
        return failed(name, f"installed files differ from a fresh render: {summary}",
                      "review the diff (`kimi-deploy doctor --json`), then reinstall and "
                      "`systemctl daemon-reload`; or fix the profile if the installed unit is what you want",
                      details="\n".join(d.diff for d in different))
    return passed(name, f"{', '.join(d.name for d in f.unit)} match a fresh render")


#: Public reports behind the fabric checks (issue 18): peer-memory writes hang hosts that need NCCL P2P off.
HANG_REPORTS = "vLLM #33041, NVIDIA/nccl #1999 and #2079"


def peer_memory_paths(profile: Profile) -> list[str]:
    """The all-reduce paths ``profile`` asks for that write into peer GPU memory directly (not through NCCL)."""
    s = profile.sglang
    out = []
    if s.flashinfer_allreduce_fusion_backend and not s.enforce_disable_flashinfer_allreduce_fusion:
        out.append(f"FlashInfer all-reduce fusion ({s.flashinfer_allreduce_fusion_backend})")
    if s.enable_torch_symm_mem:
        out.append("torch symmetric memory")
    if s.enable_pcie_ipc_allreduce:
        out.append("PCIe IPC all-reduce")
    return out


def _p2p_disabled(env: dict[str, str]) -> str | None:
    """The NCCL setting that turns NCCL's own P2P off, if any (``NCCL_P2P_DISABLE=1``, ``NCCL_P2P_LEVEL=LOC``/0)."""
    if env.get("NCCL_P2P_DISABLE") == "1":
        return "NCCL_P2P_DISABLE=1"
    if env.get("NCCL_P2P_LEVEL") in ("LOC", "0"):
        return f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']}"
    return None


def check_allreduce_paths(f: Facts) -> Check:
    """Which all-reduce paths the profile asks for; warns when fusion would pre-empt PCIe IPC."""
    name, s = "allreduce.paths", f.profile.sglang
    paths = peer_memory_paths(f.profile)
    if not paths:
        return passed(name, "no peer-memory all-reduce asked for: NCCL (and SGLang's defaults) only")
    evidence = "asked for: " + ", ".join(paths)
    fusion = s.flashinfer_allreduce_fusion_backend and not s.enforce_disable_flashinfer_allreduce_fusion
    if fusion and s.enable_pcie_ipc_allreduce:
        return warned(name, evidence + "; FlashInfer's all-reduce takes every all-reduce up to 2048 tokens before "
                                       "PCIe IPC is considered (SGLang 0.5.23 GroupCoordinator.all_reduce, "
                                       "srt/distributed/parallel_state.py): PCIe IPC would be silently unused",
                      "ask for one of them: remove [sglang] flashinfer_allreduce_fusion_backend (preset "
                      "kimi-k25-rtx-pro-6000-x8-pcie-ipc) or enable_pcie_ipc_allreduce, and measure each against "
                      "an NCCL-only baseline (docs/runbook.md#measuring-an-all-reduce-change)")
    return passed(name, evidence)


def check_p2p_disable(f: Facts) -> Check:
    """A peer-memory path with NCCL's P2P off: the paths ignore that switch, so the reason it was set bites."""
    name = "fabric.p2p_disable"
    off, paths = _p2p_disabled(f.profile.environment), peer_memory_paths(f.profile)
    if off is None:
        return passed(name, "NCCL P2P is not disabled in [environment]")
    if not paths:
        return passed(name, f"{off} set; no peer-memory all-reduce asked for, so all GPU traffic goes through NCCL")
    return failed(name, f"{off} is set but the profile asks for {', '.join(paths)}: these write into peer GPU "
                        "memory directly and ignore NCCL_P2P_DISABLE/NCCL_P2P_LEVEL; a host that needs NCCL P2P off "
                        f"(ACS redirect, IOMMU translation) can hang with GPUs stuck at 100% until reset ({HANG_REPORTS})",
                  "remove the peer-memory settings and run NCCL only; or fix the fabric (fabric.acs, fabric.iommu), "
                  "confirm with nccl-tests that NCCL works with P2P on, then drop " + off.split("=")[0])


def _fabric_verdict(f: Facts):
    """``failed`` when a peer-memory path is asked for (it cannot fall back), else ``warned`` (NCCL copes)."""
    return failed if peer_memory_paths(f.profile) else warned


def _consequence(f: Facts) -> str:
    paths = peer_memory_paths(f.profile)
    if paths:
        return (f"the profile's {', '.join(paths)} write peer memory directly and can hang with GPUs stuck at 100% "
                f"until reset ({HANG_REPORTS})")
    return "NCCL routes peer traffic through host memory or needs NCCL_P2P_DISABLE=1; peer-memory all-reduce is unsafe"


def check_acs(f: Facts) -> Check:
    """ACS P2P redirect on PCIe bridge ports (``lspci -vvv``): peer writes detour via the root complex."""
    name = "fabric.acs"
    if f.acs is None:
        return _not_checked(name, f.acs_error or "lspci not run", "install pciutils (`apt-get install pciutils`) "
                                                                   "and run doctor as root to read ACS control bits")
    a = f.acs
    if not a.ports:
        if a.denied:
            return _not_checked(name, f"lspci hid the capabilities of {a.denied} of {a.devices} devices "
                                      "(<access denied>)", "run `kimi-deploy doctor` as root to read ACS control bits")
        return passed(name, f"no PCI function with an ACS capability among {a.devices} devices")
    redirecting = a.redirecting
    if not redirecting:
        return passed(name, f"ACS P2P redirect off on all {len(a.ports)} ports with ACS")
    listed = ", ".join(f"{p.bdf} ({'+'.join(p.redirects)})" for p in redirecting[:6])
    more = f" and {len(redirecting) - 6} more" if len(redirecting) > 6 else ""
    return _fabric_verdict(f)(
        name, f"ACS P2P redirect on {len(redirecting)} of {len(a.ports)} ports: {listed}{more}: peer-to-peer "
              f"traffic is sent up to the root complex; {_consequence(f)}",
        "turn ACS off in the BIOS (often 'ACS Control' / 'PCIe ACS'), or clear ACSCtl at every boot "
        "(`setpci -s <BDF> ECAP_ACS+0x6.w=0000` per port listed); then `nvidia-smi topo -p2p w` must say OK and "
        "nccl-tests must pass without NCCL_P2P_DISABLE")


def check_iommu(f: Facts) -> Check:
    """IOMMU DMA translation (``/proc/cmdline``, ``/sys/class/iommu``): peer writes are translated or refused."""
    name = "fabric.iommu"
    if f.iommu is None:
        return _not_checked(name, f.iommu_error or "not probed", "read /proc/cmdline and /sys/class/iommu by hand")
    m = f.iommu
    if m.mode in ("off", "passthrough"):
        return passed(name, f"IOMMU {m.mode}: {m.evidence}")
    return _fabric_verdict(f)(
        name, f"IOMMU translates device DMA: {m.evidence}; {_consequence(f)}",
        "boot with `iommu=pt` (Intel: `intel_iommu=on iommu=pt`; AMD: `iommu=pt`) in GRUB_CMDLINE_LINUX, "
        "`update-grub`, reboot; or turn the IOMMU (VT-d / AMD-Vi) off in the BIOS when no VM passthrough needs it")


def check_uvm_hmm(f: Facts) -> Check:
    """``nvidia_uvm uvm_disable_hmm``: public 8x RTX PRO 6000 reports needed it to stop NCCL lockups."""
    name = "fabric.uvm_hmm"
    fix = ("`echo 'options nvidia_uvm uvm_disable_hmm=1' | sudo tee /etc/modprobe.d/nvidia-uvm-hmm.conf`, then "
           "reload nvidia_uvm (stop every CUDA process, `modprobe -r nvidia_uvm && modprobe nvidia_uvm`) or reboot")
    if f.uvm_disable_hmm is None:
        return _not_checked(name, f.uvm_error or "not probed", fix)
    if f.uvm_disable_hmm:
        return passed(name, "nvidia_uvm uvm_disable_hmm=Y")
    return warned(name, "nvidia_uvm uvm_disable_hmm=N: heterogeneous memory management is on; public 8x RTX PRO "
                        "6000 reports needed uvm_disable_hmm=1 to stop NCCL lockups", fix)


def check_p2p(f: Facts) -> Check:
    """``nvidia-smi topo -p2p r`` and ``w`` over the TP GPUs: every pair must read and write peer memory."""
    name = "fabric.p2p"
    if not f.p2p:
        return _not_checked(name, f.p2p_error or f.gpu_error or "nvidia-smi topo -p2p not run", "fix gpu.devices first")
    group = list(range(f.profile.sglang.tp_size))
    bad = []
    for cap, matrix in sorted(f.p2p.items()):
        members = [g for g in group if g in matrix.gpus]
        for a, b, status in matrix.failing(members):
            bad.append(f"GPU{a}-GPU{b} {cap} {status}")
    if not bad:
        return passed(name, f"peer read and write OK between every pair of GPU0-{max(group)} "
                            f"({', '.join(sorted(f.p2p))})")
    listed = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
    return _fabric_verdict(f)(
        name, f"nvidia-smi reports no peer access for {len(bad)} pair/capability: {listed}; {_consequence(f)}",
        "CNS/TNS: fix the platform (ACS off, IOMMU passthrough, BIOS 'Above 4G decoding' and resizable BAR on); "
        "GNS/NS: these GPUs cannot do it here, so run NCCL only (remove the peer-memory settings)")


def check_speculative_draft(f: Facts) -> Check | None:
    """``speculative.draft``: the algorithm matches what the draft's ``config.json`` declares
    (:func:`kimi_deploy.catalog.spec_guard.problems`); ``None`` without EAGLE/EAGLE3."""
    s = f.profile.sglang
    if s.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return None
    name = "speculative.draft"
    guard = spec_guard.problems(f.profile, f.draft_config, "")
    if guard.errors:
        return failed(name, guard.errors[0], f"set speculative_algorithm = \"{guard.draft_kind}\", then "
                                             "`kimi-deploy install` and `kimi-deploy restart --wait`")
    if guard.draft_kind is None:
        return warned(name, f"{s.speculative_draft_model_path}: no config.json here declaring EAGLE or EAGLE-3; "
                            f"{s.speculative_algorithm} not checked against the draft",
                      "download the draft to that path (its config.json) and run doctor again")
    return passed(name, f"{s.speculative_algorithm} matches the draft's config.json ({guard.draft_kind})")


def check_kv_cache(f: Facts) -> Check | None:
    """``kv_cache.dtype``: warns on an FP8 KV cache where it is measured slow on these GPUs
    (:data:`kimi_deploy.catalog.spec_guard.SLOW_FP8_KV`); ``None`` when no --kv-cache-dtype is set."""
    dtype = spec_guard.kv_cache_dtype(f.profile.sglang.extra_args)
    if dtype is None:
        return None
    card = f.gpus[0].name if f.gpus else REFERENCE_GPU_NAME
    warning = spec_guard.slow_fp8_kv(f.profile, card)
    if warning:
        return warned("kv_cache.dtype", warning, "remove --kv-cache-dtype from [sglang] extra_args, `kimi-deploy "
                                                 "install`, `kimi-deploy restart --wait`, and compare with "
                                                 "`kimi-deploy bench`")
    return passed("kv_cache.dtype", f"kv_cache_dtype {dtype}: no slow measurement known for this model on {card}")


def evaluate(f: Facts) -> list[Check]:
    """Every check over ``f``, in the order they are reported."""
    checks = [
        check_gpu_devices(f), check_compute_capability(f), check_gpu_memory(f), check_driver(f),
        check_torch_arch(f), check_topology(f),
        check_model("model", f.model, "model_path", f.known_model_dir),
        check_model("draft_model", f.draft_model, "speculative_draft_model_path"),
        check_speculative_draft(f), check_kv_cache(f),
        check_sglang(f), check_patches(f), *check_gates(f), check_flags(f), check_memory_plan(f),
        check_allreduce_paths(f), check_p2p_disable(f), check_acs(f), check_iommu(f), check_uvm_hmm(f), check_p2p(f),
        check_disk(f), check_warm_restart(f), check_port(f), check_unit(f),
    ]
    return [c for c in checks if c is not None]
