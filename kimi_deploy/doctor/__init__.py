"""``kimi-deploy doctor``: probe the host and the SGLang environment, then judge each finding.

:func:`gather` runs the probes (nvidia-smi, the target interpreter, model directories,
disk, a port bind, the installed unit) and never raises for a missing piece: a probe that
cannot run leaves its reason in :class:`~kimi_deploy.doctor.checks.Facts`. :func:`run_doctor`
turns the facts into checks (pure, :mod:`kimi_deploy.doctor.checks`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kimi_deploy import patching, proc, versions
from kimi_deploy.catalog import spec_guard
from kimi_deploy import engine as target
from kimi_deploy.deployment import require_fit, resolve
from kimi_deploy.doctor import fabric
from kimi_deploy.facts import nvidia
from kimi_deploy.doctor.checks import Facts, evaluate
from kimi_deploy.doctor.host import compare_installed
from kimi_deploy.facts.disk import disk_space
from kimi_deploy.facts.ports import probe_port
from kimi_deploy.facts.meminfo import read_meminfo
from kimi_deploy.facts.modeldir import inspect_model_dir
from kimi_deploy.doctor.report import Check, DoctorReport
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import Profile
from kimi_deploy.sizing import memory, report
from kimi_deploy.targets import systemd as render_lib
from kimi_deploy import validate as validate_lib

__all__ = ["Check", "DoctorReport", "Facts", "gather", "run_doctor", "probe_fabric", "probe_gpus", "probe_topology",
           "refuse_unfit", "record_gpu_query"]


def _nvidia_smi(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) on success, (None, one-line reason) otherwise."""
    try:
        done = proc.run(argv, check=False, timeout=60)
    except KimiDeployError as exc:
        if "not found" in exc.message:
            return None, "nvidia-smi not found on PATH"
        return None, exc.message
    if not done.ok:
        text = (done.stdout.strip() or done.stderr.strip() or f"exit status {done.returncode}").splitlines()[0]
        return None, f"`{done.command}` failed: {text}"
    return done.stdout, None


def probe_gpus() -> tuple[tuple[nvidia.Gpu, ...], str | None]:
    """Run :func:`nvidia.query_gpu_command` and parse it: (GPUs, None) or ((), reason)."""
    out, err = _nvidia_smi(nvidia.query_gpu_command())
    if out is None:
        return (), err
    try:
        gpus = tuple(nvidia.parse_query_gpu(out))
    except nvidia.ParseError as exc:
        return (), str(exc)
    return gpus, None if gpus else "nvidia-smi lists no GPU"


def record_gpu_query() -> tuple[str | None, str | None]:
    """The text of :func:`nvidia.query_gpu_command` as this host prints it, checked to parse to at least one GPU
    (what ``validate --gpu-facts FILE`` reads elsewhere): (text, None) or (None, reason)."""
    out, err = _nvidia_smi(nvidia.query_gpu_command())
    if out is None:
        return None, err
    try:
        gpus = nvidia.parse_query_gpu(out)
    except nvidia.ParseError as exc:
        return None, str(exc)
    return (out, None) if gpus else (None, "nvidia-smi lists no GPU")


def probe_topology() -> tuple[nvidia.Topology | None, str | None]:
    """Run :func:`nvidia.topology_command` and parse it: (topology, None) or (None, reason)."""
    out, err = _nvidia_smi(nvidia.topology_command())
    if out is None:
        return None, err
    try:
        return nvidia.parse_topology(out), None
    except nvidia.ParseError as exc:
        return None, str(exc)


def _read(root: Path, path: str) -> str:
    return (root / path.lstrip("/")).read_text(encoding="utf-8", errors="replace")


def probe_fabric(*, with_nvidia_smi: bool = True, fs_root: Path = Path("/")) -> dict:
    """The fabric probes (:mod:`kimi_deploy.doctor.fabric`) as :class:`Facts` fields: ACS bits from
    ``lspci -vvv``, the IOMMU mode, ``uvm_disable_hmm``, ``nvidia-smi topo -p2p r``/``w``. ``fs_root``:
    where ``/proc`` and ``/sys`` are read (tests)."""
    out: dict = {}
    try:
        done = proc.run(fabric.lspci_command(), check=False, timeout=60)
        if done.ok:
            out["acs"] = fabric.parse_lspci_acs(done.stdout)
        else:
            out["acs_error"] = f"`{done.command}` failed: " + (done.stderr.strip() or f"exit {done.returncode}"
                                                                 ).splitlines()[0]
    except KimiDeployError as exc:
        out["acs_error"] = "lspci not found on PATH" if "not found" in exc.message else exc.message
    except nvidia.ParseError as exc:
        out["acs_error"] = str(exc)
    try:
        cmdline = _read(fs_root, fabric.CMDLINE)
        iommu_dir = fs_root / fabric.IOMMU_CLASS.lstrip("/")
        devices = sorted(p.name for p in iommu_dir.iterdir()) if iommu_dir.is_dir() else []
        groups = fs_root / fabric.IOMMU_GROUPS.lstrip("/")
        types = [t.read_text().strip() for t in sorted(groups.glob("*/type"))] if groups.is_dir() else []
        out["iommu"] = fabric.parse_iommu(cmdline, devices, types)
    except OSError as exc:
        out["iommu_error"] = f"{exc.filename}: {exc.strerror}"
    try:
        out["uvm_disable_hmm"] = fabric.parse_module_bool(_read(fs_root, fabric.UVM_DISABLE_HMM))
    except FileNotFoundError:
        out["uvm_error"] = f"{fabric.UVM_DISABLE_HMM} absent: nvidia_uvm is not loaded (or too old to have it)"
    except (OSError, nvidia.ParseError) as exc:
        out["uvm_error"] = str(exc)
    if with_nvidia_smi:
        matrices = {}
        for cap in ("r", "w"):
            text, err = _nvidia_smi(fabric.p2p_command(cap))
            if text is None:
                out["p2p_error"] = err
                break
            try:
                matrices[cap] = fabric.parse_p2p(text)
            except nvidia.ParseError as exc:
                out["p2p_error"] = str(exc)
                break
        else:
            out["p2p"] = matrices
    return out


def refuse_unfit(profile: Profile) -> None:
    """Refuse ``profile`` when its model cannot fit this host's GPUs (``nvidia-smi``; the reference host's
    without one) by the model table's rule (:func:`kimi_deploy.deployment.require_fit`): one query of
    ``nvidia-smi``, no interpreter.

    Raises:
        RefusedError: the numbers and what would hold the model (exit 4).
    """
    gpus, _ = probe_gpus()
    require_fit(profile, memory.GpuFacts.from_gpus(gpus, "this host's nvidia-smi") if gpus else None)


def gather(profile: Profile, *, python: str | None = None, root: Path = Path("/"),
           check_flags: bool = True, state_dir: str | Path | None = None,
           phase: Callable[[str], None] | None = None) -> Facts:
    """Run every probe for ``profile``; ``python`` overrides ``[service] python``; ``root`` is where
    the installed unit is looked for (``<root>/etc/systemd/system``); ``state_dir`` is where the patch
    record is read (default: the one the unit's ``patch verify`` reads, :func:`kimi_deploy.paths.state_dir`);
    ``phase`` is called with the words of each probe as it starts (``doctor``'s progress)."""

    say = phase or (lambda _text: None)
    facts: dict = {"profile": profile}
    say("reading the GPUs (nvidia-smi)")
    gpus, facts["gpu_error"] = probe_gpus()
    facts["gpus"] = gpus
    if gpus:
        say("reading the PCIe topology (nvidia-smi topo -m)")
        facts["topology"], facts["topology_error"] = probe_topology()
    else:
        facts["topology_error"] = facts["gpu_error"]
    say("reading the fabric (ACS, IOMMU, uvm_disable_hmm, P2P)")
    facts.update(probe_fabric(with_nvidia_smi=bool(gpus)))
    if not gpus:
        facts["p2p_error"] = facts["gpu_error"]

    host_gpus = memory.GpuFacts.from_gpus(gpus, "this host's nvidia-smi") if gpus else None
    python = python or profile.service.python
    info = None
    say(f"reading SGLang's interpreter {python} (imports torch: seconds)")
    try:
        info = target.probe(python, with_torch=True)
        facts["target"] = info
    except KimiDeployError as exc:
        facts["target_error"] = f"{exc.message}: {python}" if exc.value is None or str(exc.value) == python \
            else f"{exc.message}: {exc.value}"
    version = info.sglang_version if info and info.sglang_version else None
    if version:
        say("reading the patch state of SGLang's files")
        try:
            facts["patches"] = patching.status(python, state_dir=state_dir)
        except KimiDeployError as exc:
            facts["patches_error"] = exc.message
        if check_flags:
            try:
                checked = validate_lib.validate_profile(profile, python, gpus=host_gpus, phase=phase)
                facts["validation"] = checked.validation
            except KimiDeployError as exc:
                facts["validation_error"] = exc.message
            else:
                say("resolving what SGLang picks on these GPUs, and the memory plan")
                try:
                    facts["sizing"] = report.size_profile(
                        profile, checked.info.python, checked.launch.server_args,
                        gpus=host_gpus,
                        env=validate_lib.check_env(checked.launch),
                        gpu_hint=f"no GPU facts ({facts['gpu_error']})" if not gpus else None)
                except KimiDeployError as exc:
                    facts["sizing_error"] = exc.message

    # the deployment of the SGLang found here, else of the series the profile renders for (no SGLang here: the
    # patch and gate rows then come from the profile alone); the unit below is compared as it renders
    deployment = None
    try:
        deployment = resolve(profile, version or versions.DEFAULT_SGLANG_VERSION,
                             components=info.components() if info else None, gpus=host_gpus)
        if deployment.series is not None:
            facts["gates"] = deployment.gates
            if not version:
                facts["gates_version"] = versions.DEFAULT_SGLANG_VERSION
    except KimiDeployError as exc:
        facts["gates_error"] = exc.message
    facts["units"] = (deployment or resolve(profile, launches=False)).units  # the names, whatever the release

    s = profile.sglang
    say(f"reading the model files in {s.model_path}")
    facts["model"] = inspect_model_dir(s.model_path)
    if s.speculative_draft_model_path:
        facts["draft_model"] = inspect_model_dir(s.speculative_draft_model_path)
        facts["draft_config"] = spec_guard.read_draft_config(s.speculative_draft_model_path)
    try:
        facts["disk"] = disk_space(profile.cache_root)
    except OSError as exc:
        facts["disk_error"] = f"{profile.cache_root}: {exc.strerror}"
    facts["meminfo"] = read_meminfo()
    say("reading the disk, the port and the installed unit")
    facts["port"] = probe_port(s.host, s.port)
    try:
        rendered = render_lib.render(profile, version or versions.DEFAULT_SGLANG_VERSION,
                                     components=info.components() if info else None, deployment=deployment)
        facts["unit"] = tuple(compare_installed(rendered, HostLayout(root)))
    except KimiDeployError as exc:
        facts["unit_error"] = exc.message
    return Facts(**facts)


def run_doctor(profile: Profile, *, python: str | None = None, root: Path = Path("/"),
               check_flags: bool = True, state_dir: str | Path | None = None,
               phase: Callable[[str], None] | None = None) -> DoctorReport:
    """Probe and judge: the :class:`DoctorReport` of ``profile`` on this host (never raises for a
    failed probe; each becomes a failing or warning check). ``phase``: as :func:`gather`."""
    facts = gather(profile, python=python, root=root, check_flags=check_flags, state_dir=state_dir, phase=phase)
    return DoctorReport(profile_name=profile.service.name, checks=tuple(evaluate(facts)))
