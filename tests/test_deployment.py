"""One resolved deployment (issue 36): :func:`kimi_deploy.deployment.resolve` and the verbs that read it.

The property test walks every preset x every Kimi model of the table x SGLang 0.5.22 and 0.5.23 x {one host,
fleet, Kubernetes} and holds what ``render``, ``validate``, ``doctor``, ``install --dry-run`` and ``upgrade
--dry-run`` compute to the resolved deployment: the argv, the required patch set, the fit verdict and its
numbers (or the one refusal all of them give): the systemd units of every rank, a LeaderWorkerSet's pod templates
once LWS fills in its variables, the unit ``install --dry-run`` writes on a fleet's first and last node, the unit
and the gates ``doctor`` checks on the recorded reference host (its ``nvidia-smi`` replayed) and its refusal,
``validate --gpu-facts``'s verdict and numbers on the same recording, and the patches ``upgrade`` applies. It runs
at the library level, each verb's own entry, so it needs no interpreter; every distinct command it resolves is
then parsed by SGLang 0.5.22's and 0.5.23's own parser (validate's script, one interpreter per release), and
``tests/test_upgrade.py`` holds a real ``upgrade --dry-run``'s plan to the deployment. The tests below run the
verbs themselves on the contradictions issue 36 found (each failed on
the main branch before it): ``render`` accepted Kimi K3 silently, ``validate`` refused it only with a working
interpreter, ``doctor`` only with GPUs, each with other numbers; ``upgrade`` applied only the default patches;
``bench --profile`` ignored the profile's server; ``doctor``/``validate`` did not default to the installed
profile.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from kimi_deploy import doctor, patching, versions
from kimi_deploy.catalog import presets
from kimi_deploy.catalog.models import MODELS
from kimi_deploy.cli import cli
from kimi_deploy.deployment import HostGpus, require_fit, resolve, static_fit
from kimi_deploy.errors import ExitCode, KimiDeployError, RefusedError
from kimi_deploy.host.install.files import desired_files, units_to_enable
from kimi_deploy.host.upgrade import patches_to_apply
from kimi_deploy.profile import parse_profile
from kimi_deploy.sizing.memory import GpuFacts
from kimi_deploy.targets import prometheus
from kimi_deploy.targets.registry import render
from kimi_deploy.targets.systemd import _exec_start
from kimi_deploy.engine import run_script
from kimi_deploy.validate import PLACEHOLDER_API_KEY, VALIDATE_SCRIPT, check_env, check_model

from doctor_helpers import install_fake_nvidia_smi
from helpers import RUNBOOK, run_cli

DATA = Path(__file__).parent / "data"
#: The recorded reference host: 8 x RTX PRO 6000 Blackwell Workstation, driver 570 (tests/data/nvidia-smi/README.md).
REFERENCE_GPUS = DATA / "nvidia-smi" / "query-8x-workstation-570.csv"
VERSIONS = ("0.5.22", "0.5.23")
SHAPES = ("one-host", "fleet", "kubernetes")

FLEET = {"fleet": {"dist_init_port": 20000, "nic": "eth0",
                   "replicas": [{"nodes": ["10.0.0.11", "10.0.0.12"]}, {"nodes": ["10.0.0.13", "10.0.0.14"]}]},
         "gateway": {"host": "10.0.0.10"}}
KUBERNETES = {"fleet": {"dist_init_port": 20000, "nic": "eth0",
                        "replicas": [{"nodes": ["10.0.0.11", "10.0.0.12"]}, {"nodes": ["10.0.0.13", "10.0.0.14"]}]},
              "kubernetes": {"image": "lmsysorg/sglang:v0.5.23-cu130",
                             "check_image": "registry.example.com/kimi-deploy:0.1.0",
                             "model_volume": {"persistentVolumeClaim": {"claimName": "weights"}}}}


def profile_data(preset: str, model: str, shape: str) -> dict:
    """``preset``'s data serving catalog ``model`` (its ``[sglang]`` keys, :func:`kimi_deploy.catalog.presets.model_keys`)
    in ``shape``: as written, a fleet of two 2-node groups (TP8 x PP2) behind a gateway, or the same two groups as
    LeaderWorkerSets on Kubernetes (a leader's and a worker's pod template)."""
    data = copy.deepcopy(presets.get_preset(preset).data)
    s = data["sglang"]
    for key in (*presets.SPECULATIVE, *presets.MEMORY_WITH_DRAFT):
        s.pop(key, None)
    s.update(presets.memory_keys(MODELS[model]))
    s.update(presets.model_keys(MODELS[model]))
    data.setdefault("monitoring", {})["runbook_url"] = RUNBOOK  # a fleet's or cluster's alerts need an absolute one
    if shape != "one-host":
        s["pp_size"] = 2
        data.update(copy.deepcopy(FLEET if shape == "fleet" else KUBERNETES))
    return data


def outcome(fn):
    """``("ok", value)`` or ``("error", type name, message, value)``: what a verb's entry gave."""
    try:
        return ("ok", fn())
    except KimiDeployError as exc:
        return ("error", type(exc).__name__, exc.message, exc.value)


CASES = [(p, m, v, s) for p in presets.PRESETS for m in MODELS for v in VERSIONS for s in SHAPES]


@pytest.fixture(scope="module")
def recorded_nvidia_smi(tmp_path_factory) -> str:
    """A PATH whose ``nvidia-smi`` replays the recorded reference host's GPU query (doctor's probe runs it)."""
    bin_dir = tmp_path_factory.mktemp("recorded-host") / "bin"
    install_fake_nvidia_smi(bin_dir, REFERENCE_GPUS.name)
    return str(bin_dir)


def as_started(args: list[str], d, rank: int) -> tuple[str, ...]:
    """A LeaderWorkerSet pod's SGLang ``args`` for rank ``rank`` of ``d``'s first group as Kubernetes starts them:
    the ``$(LWS_*)`` variables replaced by what LWS puts there (the group's size, the worker index, the leader's
    address; here replica 0's nodes)."""
    group = [entry.rank for entry in d.ranks if entry.rank.replica == 0]
    values = {"$(LWS_LEADER_ADDRESS)": group[0].node, "$(LWS_GROUP_SIZE)": str(len(group)),
              "$(LWS_WORKER_INDEX)": str(rank)}
    out = []
    for arg in args:
        for name, value in values.items():
            arg = arg.replace(name, value)
        out.append(arg)
    return tuple(out)


@pytest.mark.parametrize("preset,model,version,shape", CASES, ids=["-".join(c) for c in CASES])
def test_every_verb_reads_the_same_argv_patch_set_and_fit(preset, model, version, shape, recorded_nvidia_smi,
                                                          monkeypatch, tmp_path):
    profile = parse_profile(profile_data(preset, model, shape))
    deployment = outcome(lambda: resolve(profile, version))
    recorded = GpuFacts.from_query(REFERENCE_GPUS.read_text(), str(REFERENCE_GPUS))
    fit = static_fit(profile)

    # doctor reads the GPUs itself (nvidia-smi, here the recorded reference host's answer): its verdict and
    # numbers are validate --gpu-facts's on the same recording, its refusal the same sentence
    monkeypatch.setenv("PATH", recorded_nvidia_smi)
    doctor_gpus, why = doctor.probe_gpus()
    assert why is None
    seen = GpuFacts.from_gpus(doctor_gpus, "this host's nvidia-smi")
    assert dataclasses.replace(static_fit(profile, seen), source="") == \
        dataclasses.replace(static_fit(profile, recorded), source="")
    by_doctor = outcome(lambda: doctor.refuse_unfit(profile))
    if static_fit(profile, recorded).static is False:
        assert by_doctor == ("error", "RefusedError", f"{MODELS[model].name} does not fit one replica's GPUs",
                             check_model(profile, recorded).errors[0].split("; what would fit: ")[0])
    else:
        assert by_doctor == ("ok", None)

    # the fit verdict and its numbers: validate's model check (reference GPUs, and the recorded ones as
    # validate --gpu-facts and doctor read them) and every refusal carry the same sentence
    for gpus in (None, recorded):
        numbers = static_fit(profile, gpus)
        checked = check_model(profile, gpus)
        if numbers.static is False:
            assert checked.errors == (f"{numbers.evidence}; what would fit: {numbers.what_fits}",)
            with pytest.raises(RefusedError) as refused:
                require_fit(profile, gpus)
            assert refused.value.value == numbers.evidence
        else:
            assert checked.errors == ()
    if fit.static is False:  # K3 on 8 x 96 GB: every verb refuses, before any launch is built, with one sentence
        target = "kubernetes" if shape == "kubernetes" else "systemd"
        for verb in (lambda: render(target, profile, version), lambda: render("monitoring", profile, version),
                     lambda: desired_files(profile, version, host=profile.hosts()[0] if profile.hosts() else None)):
            assert outcome(verb) == ("error", "RefusedError", f"{MODELS[model].name} does not fit one replica's "
                                                              "GPUs", fit.evidence)
        return
    if deployment[0] == "error":  # a feature the version lacks: every verb says the same
        target = "kubernetes" if shape == "kubernetes" else "systemd"
        assert outcome(lambda: render(target, profile, version)) == deployment
        return
    d = deployment[1]
    assert d.fit == fit and d.fit.verdict in ("fits", "unknown")

    # render
    if shape == "kubernetes":
        artefacts = render("kubernetes", profile, version)
        assert artefacts.launch.argv == d.pod_launch().argv
        # the LeaderWorkerSet's pod templates start SGLang with each rank's argv of the deployment (the leader's
        # is rank 0's, the worker's rank 1's), once LWS has filled in its variables
        lws = yaml.safe_load(artefacts.files["server-leaderworkerset.yaml"])["spec"]["leaderWorkerTemplate"]
        for rank, template in enumerate(("leaderTemplate", "workerTemplate")):
            container, = (c for c in lws[template]["spec"]["containers"] if c["name"] == "sglang")
            assert container["command"][1:] == ["-m", "sglang.launch_server"]
            launch = next(e.launch for e in d.ranks if e.rank.replica == 0 and e.rank.rank == rank)
            assert as_started(container["args"], d, rank) == tuple(launch.server_args), (rank, container["args"])
        if d.series:
            text = " ".join(artefacts.warnings)
            assert all(p in text for p in d.required_patches), (d.required_patches, text)
    else:
        artefacts = render("systemd", profile, version)
        assert artefacts.launch.argv == d.launch.argv
        for entry in d.ranks:
            folder = f"{entry.rank.node}/" if entry.rank else ""
            assert _exec_start(entry.launch) in artefacts.files[f"{folder}{d.units.server}"]

    # install --dry-run: the unit it would put on this host (a fleet's first node and its last: another rank of
    # another replica)
    if shape != "kubernetes":
        host = d.ranks[0].rank.node if d.ranks[0].rank else None
        files, installed_version = desired_files(profile, version, host=host)
        assert installed_version == version
        assert _exec_start(d.launch) in files[f"/etc/systemd/system/{d.units.server}"].decode()
        if shape == "fleet":
            last = d.ranks[-1]
            assert (last.rank.replica, last.rank.rank) == (1, 1)
            there, _ = desired_files(profile, version, host=last.rank.node)
            assert _exec_start(last.launch) in there[f"/etc/systemd/system/{d.units.server}"].decode()
            assert _exec_start(d.launch) not in there[f"/etc/systemd/system/{d.units.server}"].decode()
        # the units it enables and the URL its nightly check asks are the deployment's
        assert set(units_to_enable(d.units, files)) == {d.units.server, d.units.check_timer}
        assert f"/etc/systemd/system/{d.units.check_timer}" in files
    # monitoring: Prometheus scrapes the deployment's servers (rank 0 of each replica, else the local URL)
    assert prometheus.settings(profile).targets == d.metrics_targets
    assert len(d.metrics_targets) == max(1, len(d.worker_urls))

    # doctor on the recorded host (no SGLang here: it reads the release the kit renders for by default) with the
    # files install --dry-run would write in place: the unit it renders from the deployment is install's, byte for
    # byte, and the gates it checks the patch state against are the deployment's on these GPUs
    if shape == "one-host" and version == versions.DEFAULT_SGLANG_VERSION:
        root = tmp_path / "root"
        for path, data in files.items():
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).write_bytes(data)
        facts = doctor.gather(profile, python=str(tmp_path / "no-sglang" / "python"), root=root, check_flags=False)
        assert facts.units == d.units
        assert [(u.name, u.state) for u in facts.unit] == [(d.units.server, "same"), (d.units.env_file, "same")]
        on_host = resolve(profile, version, gpus=seen)
        assert facts.gates == on_host.gates == d.gates and facts.gates_version == version

    # doctor (no SGLang here: the gates of the series it renders for) and the required patch set
    series = patching.find_series(version)
    if series is None:
        assert d.series is None and d.required_patches == () and d.gates == ()
    else:
        assert d.gates == tuple(series.gates_asked(d.launch.server_args))
        # upgrade --dry-run applies exactly the required set
        assert patches_to_apply(d, series) == list(d.required_patches)
        assert set(d.required_patches) >= {p.id for p in series.defaults}
        asked = {h.patch.id for h in d.gates}
        assert set(d.required_patches) == {p.id for p in series.defaults} | asked


#: Runs validate's own script (:data:`kimi_deploy.validate.VALIDATE_SCRIPT`) on many commands in one interpreter:
#: argv[1] a JSON file of ``[server_args, secrets_config, environment]`` rows, argv[2] the script's text. SGLang is
#: imported once (seconds) instead of once per command; each row runs as ``validate`` runs it (its own argv and
#: environment, a fresh parser), and the root logger's handlers and the warning filters are put back after it.
BATCH_SCRIPT = r"""
import contextlib, io, json, logging, os, sys, warnings
rows = json.load(open(sys.argv[1])); code = compile(open(sys.argv[2]).read(), "<validate script>", "exec")
base, results = dict(os.environ), []
for args, secrets, env in rows:
    os.environ.clear(); os.environ.update(base); os.environ.update(env)
    handlers, filters, show = list(logging.getLogger().handlers), list(warnings.filters), warnings.showwarning
    sys.argv = ["-c", json.dumps(args), secrets or "", PLACEHOLDER]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(code, {"__name__": "__main__"})
        except SystemExit:
            pass
    logging.getLogger().handlers[:] = handlers; warnings.filters[:] = filters; warnings.showwarning = show
    results.append(json.loads(out.getvalue().strip().splitlines()[-1]))
os.environ.clear(); os.environ.update(base)
print(json.dumps({"results": results}))
"""


def every_command(version: str) -> dict[tuple, list[str]]:
    """Each distinct command every case of the property test would run for ``version`` (one host's launch, every
    rank of a fleet's or a cluster's first group, as ``validate`` parses them) -> the cases that run it."""
    commands: dict[tuple, list[str]] = {}
    for preset, model, v, shape in CASES:
        if v != version:
            continue
        try:
            d = resolve(parse_profile(profile_data(preset, model, shape)), version)
            d.require_fit()
        except KimiDeployError:
            continue  # refused before any interpreter (the property test holds every verb to that)
        launches = [e.launch for e in d.ranks if e.rank is None or e.rank.replica == 0]
        for launch in launches:
            key = (tuple(launch.server_args), launch.secrets_config, tuple(sorted(check_env(launch).items())))
            commands.setdefault(key, []).append("-".join((preset, model, v, shape)))
    return commands


@pytest.mark.parametrize("version", VERSIONS)
def test_sglangs_own_parser_takes_every_command_the_property_test_resolves(version, request, tmp_path):
    """The argv every verb agrees on is one SGLang accepts: each distinct command of the property test's cases
    (every preset x model x shape for ``version``) through validate's own check, in SGLang ``version``'s own
    interpreter, started once (0.5.22: tests/patch_helpers.py release_target)."""
    python = request.getfixturevalue("sglang_python" if version == "0.5.23" else "sglang_0522")
    commands = every_command(version)
    assert len(commands) >= len(presets.PRESETS)  # one host, and at least each preset's
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([[list(args), secrets, dict(env)] for args, secrets, env in commands]))
    script = tmp_path / "validate.py"
    script.write_text(VALIDATE_SCRIPT)
    batch = BATCH_SCRIPT.replace("PLACEHOLDER", json.dumps(PLACEHOLDER_API_KEY))
    results = run_script(python, batch, [str(rows), str(script)], timeout=300, label="batch validate")["results"]
    assert len(results) == len(commands)
    for (args, secrets, _), cases, result in zip(commands, commands.values(), results):
        assert result["errors"] == [], (cases[0], result["errors"])
        assert result["stages"][:3] == ["config", "argparse", "exact-names"] if secrets else \
            result["stages"][:2] == ["argparse", "exact-names"], (cases[0], result)
        if secrets:
            assert result["api_key_from_config"] is True, cases[0]


def test_the_reference_preset_requires_the_opt_in_sm120_patches_and_the_pcie_ipc_one_does_not():
    reference = resolve(presets.get_preset(presets.REFERENCE).profile())
    assert reference.gated == {"sm120-flashinfer-allreduce-fusion": "--flashinfer-allreduce-fusion-backend",
                               "sm120-torch-symm-mem": "--enable-torch-symm-mem"}
    ipc = resolve(presets.get_preset(presets.PCIE_IPC).profile())
    assert ipc.gated == {} and set(ipc.required_patches) < set(reference.required_patches)
    # not an SM12x host: the gates do not apply there, so nothing opt-in is required
    hopper = HostGpus(8, reference.host.gpu, "9.0", "an H100 host")
    assert resolve(presets.get_preset(presets.REFERENCE).profile(), gpus=hopper).gated == {}


def test_a_deployment_is_frozen_and_resolving_twice_gives_an_equal_one():
    profile = presets.get_preset(presets.REFERENCE).profile()
    first, second = resolve(profile), resolve(profile)
    assert first == second and first.to_dict() == second.to_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.base_url = "http://elsewhere:1"  # type: ignore[misc]


# --- the verbs themselves: one refusal of Kimi K3 ---------------------------------------------------------------


@pytest.fixture
def k3_profile(tmp_path) -> Path:
    """The reference preset serving Kimi K3 (its parsers, no draft), as `init` writes a profile."""
    data = profile_data(presets.REFERENCE, "k3", "one-host")
    data["service"]["python"] = str(tmp_path / "no-sglang" / "python")  # no interpreter anywhere
    data["sglang"]["api_key_file"] = "/etc/kimi-deploy/kimi-k25.api-key"
    path = tmp_path / "k3.toml"
    lines = []
    for table in ("service", "sglang", "environment"):
        lines.append(f"[{table}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in data[table].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_k3_is_refused_by_every_verb_with_one_set_of_numbers_before_any_interpreter_or_gpu(tmp_path, k3_profile,
                                                                                          monkeypatch):
    """Before: render wrote K3's units silently, validate refused only with a working interpreter (exit 1, 219 %),
    doctor only with GPUs (205 %, other units). Now every verb exits 4 with the same sentence, no interpreter and
    no nvidia-smi on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no nvidia-smi, no systemctl
    evidence = static_fit(parse_profile(__import__("tomllib").loads(k3_profile.read_text()))).evidence
    assert "219%" in evidence and "1.68 TB" in evidence
    root = tmp_path / "root"
    root.mkdir()
    runs = {
        "render": ["render", "--profile", str(k3_profile)],
        "render --print-command": ["render", "--profile", str(k3_profile), "--print-command"],
        "render --target monitoring": ["render", "--profile", str(k3_profile), "--target", "monitoring"],
        "validate": ["validate", "--profile", str(k3_profile)],
        "doctor": ["doctor", "--profile", str(k3_profile), "--root", str(root)],
        "install --dry-run": ["install", "--profile", str(k3_profile), "--root", str(root), "--dry-run"],
    }
    for verb, args in runs.items():
        result = run_cli(args)
        assert result.exit_code == ExitCode.REFUSED, (verb, result.stdout, result.stderr)
        assert "Kimi K3 does not fit one replica's GPUs" in result.stderr, (verb, result.stderr)
        assert evidence in result.stderr, (verb, result.stderr)
        assert "Traceback" not in result.stderr
    assert list(root.iterdir()) == []
    # upgrade: the installed reference service (it fits) to a K3 profile of the same name
    installed, _ = _installed(tmp_path / "upgrade")
    before = sorted(p.relative_to(installed) for p in installed.rglob("*"))
    result = run_cli(["upgrade", "--profile", str(k3_profile), "--root", str(installed), "--dry-run"])
    assert result.exit_code == ExitCode.REFUSED, (result.stdout, result.stderr)
    assert evidence in result.stderr
    assert sorted(p.relative_to(installed) for p in installed.rglob("*")) == before
    init = run_cli(["init", str(tmp_path / "k3-init.toml"), "--model", "k3"])  # no profile yet: the table's row
    assert evidence in init.stderr


def test_validate_with_recorded_gpu_facts_refuses_k3_with_doctors_numbers(k3_profile):
    """validate --gpu-facts reads the GPUs doctor reads on the same host: the same numbers (205 % of 8 x 97887 MiB)."""
    result = run_cli(["validate", "--profile", str(k3_profile), "--gpu-facts", str(REFERENCE_GPUS)])
    assert result.exit_code == ExitCode.REFUSED, result.stderr
    recorded = GpuFacts.from_query(REFERENCE_GPUS.read_text(), str(REFERENCE_GPUS))
    profile = parse_profile(__import__("tomllib").loads(k3_profile.read_text()))
    assert static_fit(profile, recorded).evidence in result.stderr and "205%" in result.stderr


# --- the same defaults everywhere ---------------------------------------------------------------------------------


def _installed(tmp_path) -> tuple[Path, Path]:
    """A reference profile installed under a throwaway root (install --root, no systemctl asked)."""
    root = tmp_path / "root"
    root.mkdir(parents=True)
    profile = tmp_path / "kimi-k25.toml"
    assert run_cli(["init", str(profile)]).exit_code == 0
    result = run_cli(["install", "--profile", str(profile), "--root", str(root), "--no-enable", "--no-create-user"])
    assert result.exit_code == 0, result.stderr
    return root, profile


def test_doctor_defaults_to_the_installed_profile_as_restart_and_status_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    empty = run_cli(["doctor", "--root", str(tmp_path / "nothing")])
    assert empty.exit_code == ExitCode.USAGE and "no service installed" in empty.stderr, empty.stderr
    root, _ = _installed(tmp_path)
    result = run_cli(["doctor", "--root", str(root), "--json"])
    assert result.exit_code == ExitCode.FAILED, result.stderr  # no GPU here: checks fail, the profile was found
    assert json.loads(result.stdout)["profile"] == "kimi-k25"


#: Every verb that takes --profile and a --root: run on a tree with the reference service installed and no
#: --profile/--preset, each reads the installed profile (its JSON names the service, or its plan the unit).
DEFAULTING = {
    "render": (["render", "--print-command"], None),
    "doctor": (["doctor", "--json"], ExitCode.FAILED),  # no GPU here: checks fail, the profile was found
    "install --dry-run": (["install", "--dry-run", "--no-enable", "--no-create-user"], None),
    "status": (["status", "--json"], ExitCode.FAILED),  # no systemd here: the unit cannot be asked
    "restart --dry-run": (["restart", "--dry-run", "--json"], None),
}


@pytest.mark.parametrize("verb", DEFAULTING, ids=list(DEFAULTING))
def test_every_verb_with_a_root_defaults_to_the_installed_profile(tmp_path, monkeypatch, verb):
    """Issue 36, "same defaults everywhere": before, render and install without --profile were exit 2 ("no profile
    given") while restart, status and doctor read the installed one. Now every verb reads it
    (:func:`kimi_deploy.cli.common.profile_or_installed`), and with nothing installed each says the same."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no systemctl, no nvidia-smi
    args, code = DEFAULTING[verb]
    empty = tmp_path / "nothing"
    empty.mkdir()
    none = run_cli([*args, "--root", str(empty)])
    assert none.exit_code == ExitCode.USAGE and "no service installed" in none.stderr, (verb, none.stderr)
    root, _ = _installed(tmp_path)
    result = run_cli([*args, "--root", str(root)])
    assert result.exit_code == (code or ExitCode.OK), (verb, result.stdout, result.stderr)
    assert "kimi-k25" in result.stdout, (verb, result.stdout)


@pytest.mark.skipif(Path("/etc/kimi-deploy").exists(), reason="this host has services installed in /etc/kimi-deploy")
@pytest.mark.parametrize("args", [["check"], ["bench", "--no-progress"], ["validate"], ["preflight", "--host", "h"],
                                  ["prefetch"], ["facts", "--out", "facts"]],
                         ids=["check", "bench", "validate", "preflight", "prefetch", "facts"])
def test_the_verbs_without_a_root_default_to_the_installed_profile_of_this_host(tmp_path, monkeypatch, args):
    """The verbs that read this host's /etc/kimi-deploy (no --root) take the same default: with nothing installed
    there, the same message says so and names --profile (check and bench: or --base-url)."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(args)
    assert result.exit_code == ExitCode.USAGE, (args, result.stdout, result.stderr)
    assert "no service installed by kimi-deploy in /etc/kimi-deploy" in result.stderr, (args, result.stderr)
    assert "--profile FILE" in result.stderr


def test_bench_profile_takes_the_server_url_from_the_deployment(tmp_path):
    """Before: `bench --profile P` without --base-url was exit 2 ("--base-url is required") although check
    --profile reads the URL from the profile. Now both read the Deployment: nothing listens there, so exit 3."""
    data = profile_data(presets.REFERENCE, "k2.5", "one-host")
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = ["[service]", 'name = "kimi-bench"', "[sglang]", f'model_path = "{data["sglang"]["model_path"]}"',
             'host = "127.0.0.1"', f"port = {port}", "tp_size = 8"]
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    result = run_cli(["bench", "--profile", str(path), "--concurrency", "1", "--num-prompts", "1", "--no-progress",
                      "--request-timeout", "5"])
    assert result.exit_code == ExitCode.UNREACHABLE, (result.stdout, result.stderr)
    assert f"127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_validate_in_sglangs_own_interpreter_checks_the_deployments_argv(version, request):
    """One interpreter per SGLang version: what validate runs through SGLang's parser is the resolved deployment's
    launch for the version it finds there (the reference preset; 0.5.22: a copy of the test environment that
    reports 0.5.22, tests/patch_helpers.py release_target)."""
    from kimi_deploy.validate import validate_profile

    python = request.getfixturevalue("sglang_python" if version == "0.5.23" else "sglang_0522")
    profile = presets.get_preset(presets.REFERENCE).profile()
    checked = validate_profile(profile, python)
    d = resolve(profile, version, components=checked.info.components())
    assert checked.deployment == d and checked.launch.argv == d.launch.argv
    assert checked.validation.server_args == tuple(d.launch.server_args) or \
        list(checked.validation.server_args) == list(d.launch.server_args)
    assert checked.model.errors == () and d.fit.verdict == "fits"


def test_check_and_bench_read_the_url_key_and_name_without_building_a_launch(tmp_path):
    """check --profile (the nightly check) and bench --profile read only the server's URL, key file and name: a profile
    installed for an older release whose switch the default one removed still gives them."""
    from kimi_deploy.errors import UnsupportedVersionError

    data = profile_data(presets.PCIE_IPC, "k2.5", "one-host")
    data["sglang"]["extra_args"] = ["--cuda-graph-max-bs", "64"]  # a 0.5.22 switch 0.5.23 removed
    profile = parse_profile(data)
    with pytest.raises(UnsupportedVersionError):
        resolve(profile)
    d = resolve(profile, launches=False)
    assert (d.base_url, d.api_key_file, d.served_model) == (profile.base_url, profile.sglang.api_key_file,
                                                            "moonshotai/Kimi-K2.5")
