"""``kimi-deploy status``: one report of the installed service.

Sources: the manifest and files (:mod:`kimi_deploy.host.records`), ``systemctl show`` (unit state,
MainPID, NRestarts), the running launch command (SGLang 0.5.23 ``GET /server_info`` field
``launch_command``, else ``/proc/<MainPID>/cmdline``) compared with a fresh render, the patch
series state (:func:`patch_state`), readiness (:func:`kimi_deploy.wire.readiness.probe`, the verdict ``check``'s
``health.ready`` and ``restart --wait`` give), and the nightly check's
``/var/lib/<name>/check-report.json``. On a fleet's gateway host that serves no replica
(:func:`gateway_host`: ``install --host`` put the gateway unit there and no server unit) there is no SGLang:
the unit is ``<name>-gateway.service`` and the nightly report ``check --each-worker``'s
(:func:`kimi_deploy.paths.gateway_check_report`); health, launch and patches are not reported.

SGLang 0.5.23 builds ``launch_command`` after merging the ``--config`` YAML into argv
(``srt/server_args.py`` ``prepare_server_args``), so it contains ``--api-key <key>`` (unless the
redact-api-key patch is applied) and lacks ``--config``: :func:`launch_entries` drops both before
comparing, and :func:`redact` hides key values in every output. It joins argv with single spaces
(``redact_watermark_command_line``: ``" ".join(argv)``, no shell quoting), so
:func:`parse_launch_command` splits on whitespace, never with shell rules (a key holding a quote
is not a shell syntax error).

Every problem reads ``what (evidence); fix: how`` (:func:`problem`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import options
from kimi_deploy.facts import units as unit_facts
from kimi_deploy.wire import apikey
from kimi_deploy.argv import flag_groups, split_equals
from kimi_deploy.errors import ExitCode, ExternalCommandError, KimiDeployError
from kimi_deploy.host import journal, phases, start_history
from kimi_deploy.host.records import Manifest, read_bytes, sha256
from kimi_deploy.patching import status as series_status
from kimi_deploy.names import check_argv
from kimi_deploy.paths import SYSTEMD_DIR, HostLayout, gateway_check_report
from kimi_deploy.deployment import Deployment, Units
from kimi_deploy.topology import Rank, local_rank, serving_url
from kimi_deploy.host.readiness import get_json
from kimi_deploy.wire.readiness import Readiness, not_served, probe_url
from kimi_deploy.wire.limits import parse_json
from kimi_deploy.wire.printable import printable
from kimi_deploy.host import allreduce, gateway
from kimi_deploy.host import answering as answering_lib

#: Options whose value is a secret (SGLang 0.5.23 ``--api-key``, ``--admin-api-key``): the option table's
#: secret rows (:func:`kimi_deploy.options.secret_flags`).
SECRET_OPTIONS = options.secret_flags()
#: Options that differ between the unit's argv and SGLang's merged ``launch_command`` by design (``--config``
#: and the secret options: :func:`kimi_deploy.options.merged_flags`).
IGNORED_OPTIONS = options.merged_flags()


def redact(args: list[str]) -> list[str]:
    """``args`` with the value of every secret option replaced by ``<redacted>``."""
    out, hide = [], False
    for arg in args:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg in SECRET_OPTIONS:
            out.append(arg)
            hide = True
        elif arg.startswith(tuple(o + "=" for o in SECRET_OPTIONS)):
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def parse_launch_command(text: str) -> list[str]:
    """Split SGLang 0.5.23's ``launch_command`` (argv joined with spaces) back into arguments.

    Whitespace split, as SGLang joined them; a secret option's value runs up to the next
    ``--option`` (an API key may hold spaces), and is already ``<redacted>`` in the result.
    Never raises.
    """
    out: list[str] = []
    in_secret = False  # inside a secret option's value: drop words up to the next --option
    for word in text.split():
        if in_secret and not word.startswith("--"):
            continue
        in_secret = False
        flag = word.split("=", 1)[0]
        if flag in SECRET_OPTIONS:
            out += [word, "<redacted>"] if word == flag else [f"{flag}=<redacted>"]
            in_secret = True
        else:
            out.append(word)
    return out


def problem(what: str, evidence: str, fix: str) -> str:
    """One ``status`` problem line: ``what (evidence); fix: how``."""
    return f"{what} ({evidence}); fix: {fix}"


def launch_entries(args: list[str]) -> list[str]:
    """Server arguments in order as ``--flag value`` / ``--flag`` entries (:func:`kimi_deploy.argv.flag_groups`,
    ``--flag=value`` split), without ``--config`` and the secret options (:data:`IGNORED_OPTIONS`)."""
    groups = [split_equals(g) for g in flag_groups(args)]
    return [" ".join(g) for g in groups if g[0] not in IGNORED_OPTIONS]


def server_args_from_cmdline(argv: list[str]) -> list[str] | None:
    """The SGLang server arguments in a process's argv (after ``-m sglang.launch_server`` or
    ``.../launch_server.py``), or None when it is not an SGLang server."""
    for i, arg in enumerate(argv):
        if arg in ("sglang.launch_server", "sglang.srt.server") or arg.endswith("launch_server.py"):
            return argv[i + 1:]
    return None


@dataclasses.dataclass(frozen=True)
class Drift:
    """Running launch vs a fresh render: ``missing`` (rendered, not running), ``unexpected`` (running only)."""

    source: str
    running: list[str]
    missing: list[str]
    unexpected: list[str]

    @property
    def in_sync(self) -> bool:
        return not self.missing and not self.unexpected

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "in_sync": self.in_sync, "running": self.running,
                "missing": self.missing, "unexpected": self.unexpected}


def compare_launch(running_args: list[str], rendered_args: list[str], source: str) -> Drift:
    """Compare server arguments as multisets of ``--flag value`` entries (order-free: SGLang puts the
    ``--config`` values first)."""
    run, want = Counter(launch_entries(running_args)), Counter(launch_entries(rendered_args))
    return Drift(source, redact(running_args), sorted((want - run).elements()), sorted((run - want).elements()))


def running_launch(base_url: str | None, api_key: str | None,
                   main_pid: int | None) -> tuple[list[str], str] | None:
    """``(server args, source)`` of the running server: ``/server_info`` ``launch_command`` (not asked
    without ``base_url``), else ``/proc/<pid>/cmdline``; None when neither is available."""
    info = get_json(base_url, "/server_info", api_key) if base_url else None
    if info and isinstance(info.get("launch_command"), str) and info["launch_command"].strip():
        return parse_launch_command(info["launch_command"]), "/server_info launch_command"
    if main_pid:
        raw = read_bytes(Path(f"/proc/{main_pid}/cmdline"))
        if raw:
            args = server_args_from_cmdline([a.decode(errors="replace") for a in raw.split(b"\0") if a])
            if args is not None:
                return args, f"/proc/{main_pid}/cmdline"
    return None


def patch_state(python: str, state_dir: str | None = None) -> dict[str, Any]:
    """The patch series state of the SGLang in ``python`` (:func:`kimi_deploy.patching.status`, as a dict).

    ``state`` is one of applied, not_applied, drifted, partial, interrupted, no_series; ``error`` (with
    ``detail``: the reason and the offending value) when the state cannot be read (the interpreter
    is missing or has no SGLang, a damaged record). The record is looked up in ``state_dir`` (``patch apply
    --state-dir``), else :func:`kimi_deploy.paths.patch_state_dir` (``$KIMI_DEPLOY_STATE_DIR``, else
    ``/var/lib/kimi-deploy``), where ``patch apply`` writes it.
    """
    try:
        return series_status(python, state_dir=state_dir).to_dict()
    except KimiDeployError as exc:
        value = f": {exc.value}" if exc.value is not None else ""
        return {"state": "error", "detail": exc.message + value}


def last_check(path: Path, host_path: str | None = None) -> dict[str, Any] | None:
    """Summary of the nightly check report at ``path``: time, exit code, counts by status; None when absent.

    ``host_path``: the report's path on the target host, shown as ``path`` (default ``path``).
    """
    raw = read_bytes(path)
    if raw is None:
        return None
    shown = host_path or str(path)
    when = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
    try:
        data = parse_json(raw)
    except ValueError:
        return {"path": shown, "modified_at": when, "exit_code": None, "detail": "not valid JSON"}
    results = data.get("results") if isinstance(data, dict) else None
    counts = Counter(str(r.get("status")) for r in results if isinstance(r, dict)) if isinstance(results, list) else {}
    return {"path": shown, "modified_at": when,
            "exit_code": data.get("exit_code") if isinstance(data, dict) else None, "counts": dict(counts)}


@dataclasses.dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` found; ``problems`` lists what is wrong (empty: healthy, exit 0)."""

    service: str
    files: dict[str, str]
    unit: dict[str, Any] | None
    check_timer: str
    launch: Drift | None
    patches: dict[str, Any]
    health: dict[str, Any] | None
    last_check: dict[str, Any] | None
    problems: list[str]
    allreduce: dict[str, Any] | None = None
    unit_name: str = ""
    #: the phases of the current start from the server's log (:func:`kimi_deploy.host.phases.parse_start`), and the
    #: last measured complete start kept on the host (:func:`kimi_deploy.host.phases.load_last`)
    start_phases: dict[str, Any] | None = None
    last_start: dict[str, Any] | None = None
    #: the recorded starts: the last, the median per phase, the budgets (:func:`kimi_deploy.host.start_history.summary`)
    start_history: dict[str, Any] | None = None
    #: an interrupted change on record: ``kind``, ``phase``, ``from``, ``to``, ``version`` (``old``, ``new``,
    #: ``mixed``: which the files are), ``resume`` (the command that resolves it); None: none
    change: dict[str, Any] | None = None
    #: host paths of what interrupted runs left
    litter: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.unit_name:
            object.__setattr__(self, "unit_name", Units.of(self.service).server)

    @property
    def exit_code(self) -> int:
        return int(ExitCode.FAILED if self.problems else ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "ok": not self.problems, "problems": self.problems, "files": self.files,
                "unit_name": self.unit_name, "unit": self.unit, "check_timer": self.check_timer, "launch": self.launch.to_dict() if self.launch else None,
                "patches": self.patches, "health": self.health, "last_check": self.last_check,
                "allreduce": self.allreduce, "start_phases": self.start_phases, "last_start": self.last_start,
                "start_history": self.start_history,
                "change": self.change, "litter": self.litter}


def _file_states(manifest: Manifest, files: Mapping[str, bytes | None]) -> dict[str, str]:
    out = {}
    for hp, record in sorted(manifest.files.items()):
        data = files.get(hp)
        out[hp] = "missing" if data is None else ("ok" if sha256(data) == record.sha256 else "modified")
    return out


@dataclasses.dataclass(frozen=True)
class StatusFacts:
    """Everything ``status`` reports on, gathered once (:func:`gather_status_facts`); :func:`status_from`
    reads nothing else.

    ``files``: host path -> bytes (None: missing) of every file the manifest lists. ``unit``: ``systemctl
    show`` of the server unit (the gateway unit on a gateway host), or ``unit_error`` when it failed.
    ``api_key_error``: the key file could not be read (the probes then ran without a key). ``probe``: the readiness
    verdict (:func:`kimi_deploy.wire.readiness.probe`; None on a gateway host: no SGLang there). ``launch``:
    the running server's arguments and their source (:func:`running_launch`). ``patches``:
    :func:`patch_state`. ``last_check``: :func:`last_check` of the nightly report. ``start_log``: the
    server's log lines of the current start and the command that read them, or ``(None, why not)``
    (:func:`kimi_deploy.host.allreduce.read_start_log`; only while the unit is active). ``last_start``: the last
    measured start kept on the host. ``rank``: the rank of a
    multi-node group this host runs (:func:`kimi_deploy.topology.local_rank`); on a rank >= 1 nothing is asked
    over HTTP (its ``/health`` is SGLang's dummy 200) and the launch comes from ``/proc``.
    """

    layout: HostLayout
    files: Mapping[str, bytes | None]
    unit: unit_facts.UnitState | None
    unit_error: KimiDeployError | None
    api_key_error: KimiDeployError | None
    probe: Readiness | None
    launch: tuple[list[str], str] | None
    patches: dict[str, Any]
    last_check: dict[str, Any] | None
    start_log: tuple[list[str] | None, str] | None = None
    rank: Rank | None = None
    #: the last measured complete start kept for the service (:func:`kimi_deploy.host.phases.load_last`)
    last_start: Any = None
    #: who listens on the server's port (:func:`kimi_deploy.host.answering.gather`; None where nothing is probed)
    answering: answering_lib.Answering | None = None

    #: an interrupted change on record (:func:`kimi_deploy.host.journal.load`), or why its record is unreadable
    change: journal.Change | None = None
    change_error: KimiDeployError | None = None
    #: which complete version the files are while ``change`` is on record: ``old``, ``new`` or ``mixed``
    change_version: str | None = None
    #: what interrupted runs left (:func:`kimi_deploy.host.journal.litter`), and an interrupted install's record
    litter: tuple[str, ...] = ()


def _file_problems(files: dict[str, str], copy_hp: str, profile_copy: Path, cmd: Any, restart_wait: str) -> list[str]:
    """One problem per installed file that changed or went missing, each with a fix that does what it says: the
    installed profile copy (``copy_hp``) is what ``install --profile`` reads, so while it is intact it restores
    every other file; an edited copy is adopted with it (or undone with the profile installed from), never
    "restored" from itself (issue 43)."""
    copy_state = files.get(copy_hp, "ok")
    out = []
    for hp, state in files.items():
        if state == "ok":
            continue
        if hp == copy_hp and state == "modified":
            out.append(problem(f"{hp} (the installed profile) was changed after install",
                               "its sha256 differs from the install manifest",
                               f"to deploy the edit, adopt it with `{cmd(f'install --profile {profile_copy} --force')}` "
                               f"(then `{restart_wait}`); to undo it, install the profile you installed from: "
                               f"`{cmd('install --profile FILE --force')}`"))
        elif hp == copy_hp or copy_state != "ok":  # the copy itself cannot put anything back
            out.append(problem(f"{hp} {'is missing' if state == 'missing' else 'was changed after install'}",
                               "listed in the install manifest, not on disk" if state == "missing"
                               else "its sha256 differs from the install manifest",
                               f"install the profile you installed from: `{cmd('install --profile FILE --force')}`"))
        elif state == "modified":
            out.append(problem(f"{hp} was changed after install", "its sha256 differs from the install manifest",
                               f"move the change into the profile and run `{cmd('install --profile FILE')}`, or "
                               f"restore the installed file with `{cmd(f'install --profile {profile_copy} --force')}`"))
        else:
            out.append(problem(f"{hp} is missing", "listed in the install manifest, not on disk",
                               f"put it back with `{cmd(f'install --profile {profile_copy}')}`"))
    return out


def gateway_host(deployment: Deployment, manifest: Manifest) -> bool:
    """True on a fleet's gateway host that serves no replica: the manifest lists the gateway unit
    (``<name>-gateway.service``) and no server unit (what ``install --host GATEWAY_HOST`` installs)."""
    units = {hp.rsplit("/", 1)[-1] for hp in manifest.files if hp.startswith(SYSTEMD_DIR + "/")}
    return deployment.units.gateway is not None and deployment.units.gateway in units \
        and deployment.units.server not in units


def gather_status_facts(deployment: Deployment, layout: HostLayout, manifest: Manifest,
                        node: str | None = None, state_dir: str | None = None) -> StatusFacts:
    """Read the files, ask systemd, probe the server, read the patch state and the last check (never raises
    for a down server or a failed ``systemctl``: those become facts); the units, URL and key path are
    ``deployment``'s. On a gateway host (:func:`gateway_host`): the gateway unit and its nightly report only."""
    profile = deployment.profile
    files = {hp: read_bytes(layout.under(hp)) for hp in manifest.files}
    change = change_error = version = None
    try:
        change = journal.load(layout, profile.service.name)
    except KimiDeployError as exc:
        change_error = exc
    paths = set(manifest.files) | (set(change.old) if change else set())
    litter = journal.litter(layout, profile.service.name, paths)
    if change is not None:
        version = journal.version_of(layout, change)
    elif layout.intent(profile.service.name).exists():
        litter.append(layout.host_path(layout.intent(profile.service.name)))
    recorded = {"change": change, "change_error": change_error, "change_version": version, "litter": tuple(litter)}
    only_gateway = gateway_host(deployment, manifest)
    unit = unit_error = None
    try:
        unit = unit_facts.show(deployment.units.gateway if only_gateway else deployment.units.server)
    except KimiDeployError as exc:
        unit_error = exc
    api_key = key_error = None
    try:
        api_key = apikey.resolve_key(profile_key_file=deployment.api_key_file, layout=layout)
    except KimiDeployError as exc:
        key_error = exc
    if only_gateway:
        hp = gateway_check_report(profile.service.name)
        return StatusFacts(layout, files, unit, unit_error, key_error, None, None, {},
                           last_check(layout.under(hp), hp), **recorded)
    rank = local_rank(profile, node)
    if rank is None or rank.serves:
        probe = probe_url(deployment.base_url, api_key, deployment.served_model)
        launch = running_launch(deployment.base_url, api_key, unit.main_pid if unit else None)
    else:
        probe = not_served(f"rank {rank.rank} serves no HTTP: the group answers at rank 0, "
                           f"{serving_url(profile, rank)}")
        launch = running_launch(None, None, unit.main_pid if unit else None)
    report = layout.check_report(profile.service.name)
    start_log = None
    if unit is not None and unit.is_active:
        start_log = allreduce.read_start_log(deployment.units.server,
                                             unit.properties.get("ExecMainStartTimestamp") or None)
    patches = patch_state(profile.service.python, state_dir)
    who = None
    if rank is None or rank.serves:
        who = answering_lib.gather(profile.sglang.port, unit.properties.get("ControlGroup") if unit else None,
                                   unit.main_pid if unit else None)
    return StatusFacts(layout, files, unit, unit_error, key_error, probe, launch, patches,
                       last_check(report, layout.host_path(report)), start_log, rank,
                       phases.load_last(layout.state_dir(profile.service.name)), answering=who, **recorded)


def _systemctl_failure(unit: str, exc: KimiDeployError, layout: HostLayout) -> str:
    """The problem line for a failed ``systemctl show``: its stderr and a fix that fits how status was run.

    ``systemctl show`` always asks the running manager (``--root`` only moves kimi-deploy's files),
    so with ``--root`` the fix is to run ``status`` on the booted host, not to pass ``--root``.
    """

    evidence = exc.message
    if isinstance(exc, ExternalCommandError):
        said = " ".join(line.strip() for line in exc.stderr.splitlines() if line.strip())
        evidence = f"`{exc.command}`: " + (said[:400] if said else exc.message)
    if layout.is_host:
        hint = ("is systemd running on this host? `systemctl status` shows it (a container or an image build has "
                "none; there the unit state is unknown, the other lines still hold)")
    else:
        hint = (f"--root {layout.root} reads kimi-deploy's files from that tree, but the unit state comes from "
                "the running systemd, which did not answer: run `kimi-deploy status` on the host booted from "
                "the tree for the unit state (the file and profile lines hold for the tree)")
    return problem(f"cannot read the state of {unit}", evidence, hint)


def _patch_problem(patches: dict[str, Any], python: str, restart: str = "kimi-deploy restart --wait") -> str | None:
    """The problem line of a patch series that is not applied as recorded; ``restart``: the restart
    command as the user must type it (``--root`` kept)."""
    state = patches.get("state")
    if state == "error":
        return problem("cannot read the SGLang patch series state", patches.get("detail") or "no detail",
                       f"make [service] python name the server's SGLang interpreter (now {python}); "
                       f"`kimi-deploy patch status --python {python}` shows the same error")
    if state == "interrupted":
        return problem("SGLang patch series is interrupted: a killed `kimi-deploy patch` run left its change "
                       "unfinished", "; ".join(patches.get("problems") or []) or f"state {state}",
                       f"{patches.get('fix') or f'run `kimi-deploy patch status --python {python}` as root'}, "
                       f"then `{restart}`")
    if state in ("drifted", "partial"):
        what = ("a patched SGLang file changed after `kimi-deploy patch apply` (pip install over it?)"
                if state == "drifted" else "only some patches of the SGLang patch series are applied")
        evidence = "; ".join(patches.get("problems") or []) or f"state {state}"
        return problem(f"SGLang patch series is {state}: {what}", evidence,
                       f"run `kimi-deploy patch apply --python {python}`, then `{restart}`")
    return None


def change_problems(facts: StatusFacts, service: str) -> list[str]:
    """The problems of an interrupted change (:mod:`kimi_deploy.host.journal`) and of what interrupted runs left:
    each with the command that resolves it. No I/O."""
    layout, out = facts.layout, []
    if facts.change_error is not None:
        out.append(problem("the journal of an interrupted change is unreadable", str(facts.change_error.value),
                           facts.change_error.hint or ""))
    change = facts.change
    if change is not None:
        files = {"old": f"the files are {change.old_label} (the old version)",
                 "new": f"the files are {change.new_label} (the new version)",
                 "mixed": "the files match NEITHER version (a mix, or changed by hand)"}[facts.change_version or "mixed"]
        outcome = ("finishes it: the new version passed its gate" if change.verdict == "pass" else
                   f"puts {change.old_label} back, whole, and restarts it where the new one may run")
        out_of = f"; the replica {change.replica} is out of the gateway's rotation" if change.replica else ""
        out.append(problem(f"an interrupted {change.kind} of {service} is unfinished: it had {change.phase}{out_of}",
                           f"{layout.host_path(layout.change_dir(service))}/change.json: {change.old_label} -> "
                           f"{change.new_label}, started {change.started_at}; {files}",
                           f"run `{change.resume}` (it {outcome})"))
    if facts.litter:
        copy = layout.host_path(layout.profile_copy(service))
        fix = (f"`{change.resume}` removes them with the change" if change is not None else
               f"`{layout.command(f'install --profile {copy}')}` removes them (and changes nothing else when the "
               "files are as installed)")
        out.append(problem("an interrupted kimi-deploy run left files behind", ", ".join(facts.litter), fix))
    return out


def status(deployment: Deployment, layout: HostLayout, manifest: Manifest, node: str | None = None,
           state_dir: str | None = None) -> StatusReport:
    """Collect the status of ``deployment``'s installed service (resolved for the manifest's SGLang version:
    the launch it compares the running one with) (never raises for a down server): the facts
    (:func:`gather_status_facts`), then the report (:func:`status_from`). ``node``: this host in a multi-node
    group (default: found by its addresses, :func:`kimi_deploy.topology.local_rank`); ``state_dir``: where the
    patch record is (``patch apply --state-dir``; default :func:`kimi_deploy.paths.patch_state_dir`).

    Paths in the report are host paths. Each entry of ``problems`` is one :func:`problem` line.

    Raises:
        UsageError: ``node`` is not a node of the profile.
    """
    report = status_from(deployment, manifest, gather_status_facts(deployment, layout, manifest, node, state_dir))
    history = start_history.summary(deployment.profile.start, layout.state_dir(deployment.name))
    return dataclasses.replace(report, start_history=history) if history else report


def status_from(deployment: Deployment, manifest: Manifest, facts: StatusFacts) -> StatusReport:
    """The status report of ``deployment``'s service from ``facts``; no I/O but the launch the deployment builds
    on first read (:func:`kimi_deploy.deployment.resolve`)."""
    problems: list[str] = []
    layout = facts.layout
    profile = deployment.profile
    name = deployment.name
    only_gateway = facts.probe is None  # a gateway host (gather_status_facts): no SGLang to probe
    unit_name = deployment.units.gateway if only_gateway else deployment.units.server
    profile_copy = layout.profile_copy(name)  # a local path: what `install --profile` reads (under --root)
    cmd = layout.command
    # restart acts on this host's systemd: under --root only with --host-systemd (kimi_deploy.cli.common)
    restart_wait = cmd("restart --wait" + ("" if layout.is_host else " --host-systemd"))
    files = _file_states(manifest, facts.files)
    problems += change_problems(facts, name)
    if facts.change is None:  # else the files are the change's: its problem says which version they are
        problems += _file_problems(files, layout.host_path(profile_copy), profile_copy, cmd, restart_wait)
    unit = None
    state = facts.unit
    if state is not None:
        unit = state.to_dict()
        if not state.is_active:
            restart = f"systemctl restart {unit_name}" if only_gateway else restart_wait
            problems.append(problem(f"{unit_name} is {state.active_state}/{state.sub_state}",
                                    f"systemctl show: Result={state.result or '-'}, "
                                    f"ExecMainStatus={state.properties.get('ExecMainStatus') or '-'}",
                                    f"read `journalctl -u {unit_name} -n 50`, fix the cause, then `{restart}`"))
    elif facts.unit_error is not None:
        problems.append(_systemctl_failure(unit_name, facts.unit_error, layout))
    if (exc := facts.api_key_error) is not None:
        problems.append(problem(f"the API key is unreadable: {exc.message}", str(exc.value), exc.hint or ""))
    probe = facts.probe
    health = None if probe is None else {**probe.to_dict(), "endpoint": probe.path, "detail": probe.reason}
    silent = facts.rank is not None and not facts.rank.serves
    if silent:
        health = {"ready": None, "state": None, "endpoint": None, "url": None, "http_status": None,
                  "detail": probe.reason, "words": probe.reason}
    elif probe is not None and not probe.ready:
        problems.append(problem(f"the server at {deployment.base_url} is not ready", probe.words,
                                f"if it is starting, wait (`{restart_wait}` shows the phase); else read "
                                f"`journalctl -u {unit_name} -n 50`"))
    who = facts.answering
    if health is not None and who is not None and not silent:
        health = {**health, "answering": who.to_dict()}  # whose health it is, before calling it the service's
        if probe.ready and who.ours is False:
            why = "it has no main PID" if who.main_pid is None else f"its main PID is {who.main_pid}"
            problems.append(problem(f"the process answering on :{who.port} is not {unit_name} ({why})",
                                    who.line(), f"stop that process or move one of them to another port "
                                    f"(`ss -ltnp 'sport = :{who.port}'` names it), then `{restart_wait}`"))
    found = facts.launch
    drift = None
    if found:
        rendered = deployment.launch_of(facts.rank)
        drift = compare_launch(found[0], list(rendered.server_args), found[1])
        if not drift.in_sync:
            shown = [f"- {e}" for e in drift.missing] + [f"+ {e}" for e in drift.unexpected]
            problems.append(problem("the running launch command differs from the profile",
                                    f"{drift.source}: " + ", ".join(shown[:4]) + (" ..." if len(shown) > 4 else ""),
                                    f"`{restart_wait}` starts the installed unit; if the profile changed "
                                    f"since, `{cmd('install --profile FILE')}` first"))
    patches = facts.patches
    patch_problem = _patch_problem(patches, profile.service.python, restart_wait)
    if patch_problem:
        problems.append(patch_problem)
    paths = None
    if facts.start_log is not None:
        lines, source = facts.start_log
        report = allreduce.judge(profile, lines, source=source) if lines is not None else None
        paths = report.to_dict() if report else {"error": source}
        for skipped in report.failures if report else []:
            problems.append(problem(f"{allreduce.LABELS[skipped.path]} was asked for but SGLang skipped it",
                                    f"the server log of this start says `{skipped.evidence}`",
                                    allreduce.FIXES[skipped.path] + "; then `kimi-deploy restart --wait`"))
    start_phases = None
    if facts.start_log is not None and facts.start_log[0] is not None:
        start_phases = phases.parse_start(facts.start_log[0], source=facts.start_log[1]).to_dict()
    last = None if only_gateway else facts.last_start
    report_hp = gateway_check_report(name) if only_gateway else layout.host_path(layout.check_report(name))
    check = facts.last_check
    if check and check.get("exit_code") not in (None, 0):
        counts = ", ".join(f"{n} {k}" for k, n in sorted((check.get("counts") or {}).items()))
        interrupted = check.get("exit_code") == ExitCode.INTERRUPTED  # its own state: stopped, not failed
        problems.append(problem("the last nightly check was interrupted before it finished (a partial report)"
                                if interrupted else "the last nightly check failed",
                                f"exit {check['exit_code']} at {check['modified_at']}" + (f": {counts}" if counts else "")
                                + f"; report {report_hp}",
                                f"read the failed results in the report, or rerun now with "
                                f"`{' '.join(check_argv('kimi-deploy', str(profile_copy), each_worker=only_gateway))}`"))
    timer = deployment.units.gateway_check_timer if only_gateway else deployment.units.check_timer
    change = facts.change
    recorded = {"kind": change.kind, "phase": change.phase, "from": change.old_label, "to": change.new_label,
                "version": facts.change_version, "resume": change.resume} if change else None
    return StatusReport(name, files, unit, timer, drift, patches, health, check, problems, paths, unit_name,
                        start_phases, last.to_dict() if last else None, change=recorded, litter=list(facts.litter))


def gateway_view(deployment: Deployment, layout: HostLayout) -> dict[str, Any] | None:
    """SGLang's gateway's view of each worker (:func:`kimi_deploy.host.gateway.gateway_view`), None without
    ``[gateway]``. An unreadable key file is already one of :func:`status`'s problems: the gateway is then asked
    without a key (and answers 401, which the view reports)."""
    if deployment.gateway_url is None:
        return None
    try:
        key = apikey.resolve_key(profile_key_file=deployment.api_key_file, layout=layout)
    except KimiDeployError:
        key = None
    return gateway.gateway_view(deployment, key)


def exit_code(report: StatusReport, view: dict[str, Any] | None = None) -> int:
    """``status``'s exit status: 1 when the report or the gateway's view (:func:`gateway_view`) has a problem."""
    return max(report.exit_code, 1 if view and view["problems"] else 0)


def report_lines(report: StatusReport, view: dict[str, Any] | None = None) -> list[str]:
    """``status``'s text: one line per fact of ``report`` (and of the gateway's ``view``, :func:`gateway_view`),
    then one ``problem:`` line per problem. Text from the server or the gateway passes
    :func:`kimi_deploy.wire.printable.printable`."""
    out: list[str] = []
    unit = report.unit or {}
    out.append(f"service   {report.unit_name}: {unit.get('active_state', '?')}/{unit.get('sub_state', '?')}"
               f", enabled: {unit.get('unit_file_state', '?')}, main PID {unit.get('main_pid') or '-'}"
               f", restarts {unit.get('n_restarts') if unit.get('n_restarts') is not None else '?'}")
    if report.change:
        out.append(f"files     {len(report.files)} installed, an interrupted {report.change['kind']} is unfinished "
                   f"({report.change['phase']}; the files are "
                   + {"old": "the old version", "new": "the new version"}.get(report.change["version"],
                                                                              "NEITHER version") + ")")
    else:
        out.append(f"files     {len(report.files)} installed, " + _file_summary(report.files))
    h = report.health
    if h is None:  # the gateway host: no SGLang here (the gateway's view of the workers follows)
        out.append("role      gateway host: no SGLang server here")
    elif h["ready"] is None:
        out.append(f"health    not served here ({h['detail']})")
    else:
        who = h.get("answering") or {}
        foreign = who.get("ours") is False
        out.append(f"health    {'NOT the unit answering (see answer): ' if foreign else ''}{h['words']}")
        if who:
            out.append(f"answer    {printable(who['line'])}")
    if report.launch:
        d = report.launch
        out.append(f"launch    {'matches the profile' if d.in_sync else 'DRIFT'} (from {d.source})")
        for entry in d.missing:
            out.append(f"          - {printable(entry)}   (in the profile, not running)")
        for entry in d.unexpected:
            out.append(f"          + {printable(entry)}   (running, not in the profile)")
    elif h is not None:
        out.append("launch    unknown (no /server_info answer and no main PID)")
    state = report.patches.get("state")
    if h is not None:
        out.append(f"patches   {'unreadable' if state == 'error' else str(state).replace('_', ' ')}" +
                   (f" ({report.patches['detail']})" if report.patches.get("detail") else ""))
    ar = report.allreduce
    if ar and ar.get("error"):
        out.append(f"allreduce unknown (server log unreadable: {ar['error']})")
    elif ar:
        out.append(f"allreduce {ar['in_use']}")
        for p in ar["paths"]:
            if p["asked"] or p["state"] == "engaged":
                out.append(f"          {p['label']}: {'SKIPPED' if p['failed'] else p['state'].replace('_', ' ')}"
                           f" ({p['evidence']})")
    start = report.start_phases or report.last_start
    if start:
        took = f"{start['total_seconds']:.0f} s" if start.get("total_seconds") is not None else "not ready yet"
        which = "this start" if report.start_phases else "last measured start"
        out.append(f"start     {which} ({start.get('started') or '?'}): {took}")
        lines = phases.StartPhases.from_dict(start).lines()
        for line in lines[:-1] if start.get("total_seconds") is not None else lines:
            out.append(f"        {line}")
    out += start_history.summary_lines(report.start_history)
    c = report.last_check
    if not c:
        out.append(f"check     no nightly report yet ({report.check_timer})")
    else:
        counts = ", ".join(f"{n} {k}" for k, n in sorted((c.get("counts") or {}).items()))
        out.append(f"check     exit {c.get('exit_code')} at {c['modified_at']}" + (f" ({counts})" if counts else "")
                   + (f" ({printable(str(c['detail']))})" if c.get("detail") else "") + f", {report.check_timer}")
    if view:
        out += _gateway_lines(view)
    for problem in [*report.problems, *(view["problems"] if view else [])]:
        out.append(f"problem: {printable(problem)}")
    return out


def _gateway_lines(view: dict[str, Any]) -> list[str]:
    """The gateway's view as ``status`` prints it."""
    out = [f"gateway   {view['url']}: " + (f"UNREADABLE ({printable(view['error'])})" if view["error"] else
                                               f"{len(view['workers'])} worker(s)")]
    for w in view["workers"]:
        # the gateway's own words (its /workers answer): shown as literal text (kimi_deploy.wire.printable)
        out.append(printable(f"          {w['url']}: {w['status']}, {'healthy' if w['healthy'] else 'UNHEALTHY'}, "
                             f"{w['load']} in flight"))
    return out


def _file_summary(files: dict[str, str]) -> str:
    """``all unmodified`` or ``1 modified: /etc/...; 1 missing: /etc/...`` (host paths)."""
    by_state: dict[str, list[str]] = {}
    for hp, state in files.items():
        if state != "ok":
            by_state.setdefault(state, []).append(hp)
    if not by_state:
        return "all unmodified"
    return "; ".join(f"{len(paths)} {state}: {', '.join(paths)}" for state, paths in sorted(by_state.items()))
