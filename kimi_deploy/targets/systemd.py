"""Profile -> rendered artefacts: the server unit, its EnvironmentFile, the nightly check units, and the
monitoring files (Prometheus scrape configuration and rules, :mod:`kimi_deploy.targets.prometheus`).

:func:`render` is pure (it reads only the templates and whether a patch series exists) and deterministic: the
same profile, version and kit version give byte-identical files. :func:`write`
puts them in a directory atomically (:mod:`kimi_deploy.fsio`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import jinja2

from kimi_deploy import names, paths, versions
from kimi_deploy.catalog import check_budget as budget
from kimi_deploy.fsio import write_many_atomic
from kimi_deploy.errors import ProfileError, UsageError
from kimi_deploy.deployment import Deployment, Units, resolve
from kimi_deploy.launch import API_KEY_CREDENTIAL, SECRETS_CONFIG_NAME, LaunchSpec
from kimi_deploy.launch import exec_start as gateway_exec_start
from kimi_deploy.profile import Profile, calendar_problem, host_key
from kimi_deploy.targets import METRICS_OFF, Artefacts, file_header
from kimi_deploy.targets.prometheus import scrape_notes
from kimi_deploy.topology import PREFLIGHT_TIMEOUT_SEC, Rank, group_ranks, is_node

#: Runs in ExecStartPre= with the SGLang interpreter: turns the API-key credential into
#: SGLang's YAML --config file (0600 in the 0700 RuntimeDirectory=). JSON strings are
#: YAML double-quoted scalars, so any key survives. No %, $ or double quote: systemd
#: would expand or split them.
SECRETS_SCRIPT = (
    "import json, os, sys; "
    f"key = open(os.path.join(os.environ['CREDENTIALS_DIRECTORY'], '{API_KEY_CREDENTIAL}')).read().strip(); "
    "key or sys.exit('kimi-deploy: the API key credential is empty'); "
    "os.umask(0o077); "
    f"open(os.path.join(os.environ['RUNTIME_DIRECTORY'], '{SECRETS_CONFIG_NAME}'), 'w')"
    ".write('api-key: ' + json.dumps(key) + chr(10))"
)


@dataclasses.dataclass(frozen=True)
class Rendered:
    """The result of :func:`render`: ``files`` maps file name -> text, in a stable order.

    ``monitoring``: file name -> text of the Prometheus files (:func:`kimi_deploy.targets.monitoring.render_monitoring`),
    written into ``monitoring/`` beside the units; ``install`` does not install them (they belong on the
    Prometheus host). Empty when ``enable_metrics`` is off.
    """

    profile: Profile
    launch: LaunchSpec
    files: Mapping[str, str]
    monitoring: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The deployment's unit names (:attr:`kimi_deploy.deployment.Deployment.units`).
    units: Units | None = None

    @property
    def service_unit(self) -> str:
        return self._units.server

    @property
    def env_file(self) -> str:
        return self._units.env_file

    @property
    def check_timer(self) -> str:
        return self._units.check_timer

    @property
    def _units(self) -> Units:
        return self.units if self.units is not None else resolve(self.profile, launches=False).units


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.systemd_templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def has_patch_series(sglang_version: str) -> bool:
    """True when the kit ships a patch series for ``sglang_version`` (``patches/<v>/series``)."""
    return (paths.patches_dir() / sglang_version / "series").is_file()


def _exec_start(launch: LaunchSpec) -> str:
    """``ExecStart=``'s value: the interpreter line, then one flag (and its value) per continued line."""
    lines = [" ".join(launch.argv[:3])] + ["    " + " ".join(group) for group in launch.flag_groups()]
    return " \\\n".join(lines)


#: The nightly check's time budget, seconds. The fast tiers run under check's default ``--deadline``, the one
#: derivation :data:`kimi_deploy.catalog.check_budget.DEADLINE_S` (requests counted x K2.5's per-request time on
#: the reference host: 1380 s); with ``[quality] nightly`` the pre-flight and the schema corpus (5 + 60 requests,
#: one at a time) get :data:`QUALITY_FIXED_S` more and ``quality.accuracy`` its own ``[quality] deadline_s``;
#: ``TimeoutStartSec=`` leaves :data:`CHECK_SLACK_S` past the deadline for start-up, the last request and the
#: reports. Measured figures: docs/design.md#the-quality-tier.
CHECK_DEADLINE_S = budget.DEADLINE_S
QUALITY_FIXED_S = 600
CHECK_SLACK_S = budget.SLACK_S

#: Seconds of ``check --each-worker``'s one ``--deadline`` per listed worker: a plain check's default
#: (:data:`CHECK_DEADLINE_S`; each worker runs the health and contract tiers, all but the 28 s of parser posts).
CHECK_DEADLINE_PER_WORKER_S = CHECK_DEADLINE_S
#: The most the gateway host's nightly run may take, whatever the number of workers: 6 h, well inside its daily
#: timer (100 replicas once made ``TimeoutStartSec=`` 25 h, longer than the day between two runs).
CHECK_DEADLINE_MAX_S = 6 * 3600


def check_budget(profile: Profile) -> tuple[float | None, int]:
    """``(--deadline for the nightly command or None for check's default, TimeoutStartSec=)`` of the check unit:
    ``(None, CHECK_DEADLINE_S + 180)`` without the quality tier (1560 s); with it, ``CHECK_DEADLINE_S + 600 +
    [quality] deadline_s`` and that plus 180."""
    if profile.quality is None or not profile.quality.nightly:
        return None, CHECK_DEADLINE_S + CHECK_SLACK_S
    deadline = CHECK_DEADLINE_S + QUALITY_FIXED_S + profile.quality.deadline_s
    return deadline, int(-(-(deadline + CHECK_SLACK_S) // 1))


def fleet_check_deadline_s(workers: int) -> int:
    """The gateway host's ``check --each-worker --deadline``: :data:`CHECK_DEADLINE_PER_WORKER_S` per worker and the
    pass through the gateway (:data:`kimi_deploy.catalog.check_budget.GATEWAY_PASS_S`), at most 6 h (one deadline
    for the whole run since issue #30; workers past it get rows not attempted, the report is still written)."""
    return min(CHECK_DEADLINE_PER_WORKER_S * max(workers, 1) + budget.GATEWAY_PASS_S, CHECK_DEADLINE_MAX_S)


def render(profile: Profile, sglang_version: str | None = None, *,
           components: Mapping[str, str] | None = None, profile_path: str | None = None,
           rank: Rank | None = None, deployment: Deployment | None = None) -> Rendered:
    """Render every artefact of ``profile`` for SGLang ``sglang_version`` (default 0.5.23).

    Args:
        profile: a validated profile.
        sglang_version: target SGLang release; decides flag spellings.
        components: probed stack versions for the cache key (see :func:`kimi_deploy.launch.cache_key`).
        profile_path: host path the check unit reads the profile from
            (default ``/etc/kimi-deploy/<name>.toml``, where ``install`` puts it).
        rank: one rank of a multi-node replica (:mod:`kimi_deploy.topology`): its launch
            (:meth:`kimi_deploy.deployment.Deployment.launch_of`), the preflight as ``ExecStartPre=``, and for ranks >= 1
            the server unit and env file only (no check units, no monitoring: they serve no HTTP). Default for a
            multi-node profile: rank 0 of the first replica (each node's own files: :func:`kimi_deploy.topology.render_ranks`).
        deployment: ``profile`` already resolved for ``sglang_version`` and ``components``
            (:func:`kimi_deploy.deployment.resolve`; default: resolved here); the launch is read from it.

    Returns:
        :class:`Rendered` with ``<name>.service``, ``<name>.env``, ``kimi-deploy-check@<name>.service``,
        ``kimi-deploy-check@<name>.timer`` (the first two only for a rank >= 1).

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.deployment.resolve`.
    """
    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version
    if rank is None and profile.nodes_per_copy > 1:
        rank = group_ranks(profile)[0]
    deployment = deployment or resolve(profile, version, components=components)
    launch = deployment.launch_of(rank)
    svc, s = profile.service, profile.sglang
    header = file_header(profile, launch.sglang_version)
    env_file = paths.service_env_file(svc.name)
    # CacheDirectory= makes /var/cache/<name> writable; a cache_dir elsewhere needs ReadWritePaths=.
    inside = paths.is_within(profile.cache_root, paths.service_cache_dir(svc.name))
    read_write_paths = [] if inside else [profile.cache_root]
    profile_host_path = profile_path or paths.service_profile_copy(svc.name)
    state = paths.service_state_dir(svc.name)
    deadline, check_timeout = check_budget(profile)
    units = deployment.units
    check_command = " ".join(names.check_argv(
        svc.kimi_deploy, profile_host_path,
        api_key_file=f"%d/{API_KEY_CREDENTIAL}" if deployment.api_key_file else None,
        sample=str(profile.quality.sample) if deadline is not None else None,
        deadline=f"{deadline:g}" if deadline is not None else None,
        json=paths.service_check_report(svc.name), junit=f"{state}/check-report.xml", prom=f"{state}/check.prom"))
    context = {
        "header": header,
        "svc": svc,
        "s": s,
        "launch": launch,
        "workers": (),  # the check units of one server; the gateway host's check lists its workers (gateway_files)
        "env": launch.env,
        "env_file": env_file,
        "exec_start": _exec_start(launch),
        "api_key_credential": API_KEY_CREDENTIAL,
        "secrets_script": SECRETS_SCRIPT,
        "verify_patches": svc.verify_patches and has_patch_series(launch.sglang_version),
        "read_write_paths": read_write_paths,
        "cache_key": launch.cache_dir.rsplit("/", 1)[-1],
        "check_command": check_command,
        "check_timeout": check_timeout,
        "check_deadline": deadline,
        "fast_deadline_s": CHECK_DEADLINE_S,
        "check_unit": units.check_unit,
        "rank": rank,
        "preflight_command": preflight_command(profile, rank, profile_host_path) if rank is not None else None,
        "prefetch_command": prefetch_command(profile, profile_host_path) if profile.start.prefetch else None,
        "prefetch_deadline": prefetch_deadline(profile),
    }
    env = _environment()
    files = {
        units.server: env.get_template("server.service.j2").render(context),
        units.env_file: env.get_template("server.env.j2").render(context),
    }
    if rank is not None and not rank.serves:
        return Rendered(profile=profile, launch=launch, files=files, units=units)
    calendar = calendar_problem(svc.check_on_calendar)  # systemd's own parser, when the timer is rendered
    if calendar:
        raise ProfileError("the profile's nightly check timer cannot be rendered",
                           problems=[f"service.check_on_calendar: {calendar}"], hint="correct the settings above")
    files[units.check_service] = env.get_template("check.service.j2").render(context)
    files[units.check_timer] = env.get_template("check.timer.j2").render(context)
    # the monitoring files need the Grafana SDK (~0.2 s to import): loaded only when units are rendered
    from kimi_deploy.targets.monitoring import render_monitoring

    return Rendered(profile=profile, launch=launch, files=files, monitoring=render_monitoring(profile, header),
                    units=units)


#: Sub-folder of ``render --out DIR`` holding the monitoring files.
MONITORING_DIR = "monitoring"


def write(rendered: Rendered, out_dir: Path, hosts: Mapping[str, Mapping[str, str]] | None = None) -> list[Path]:
    """Write every rendered file into ``out_dir`` (monitoring files into ``out_dir/monitoring``) atomically;
    returns the paths written. ``hosts`` (:func:`host_files`): a profile with a fleet,
    whose files go to ``out_dir/<host>/`` instead, one folder per host.

    Raises:
        UsageError: ``out_dir`` cannot be created or written; no file was changed.
    """
    if hosts:
        targets = {out_dir / host / name: text for host, files in hosts.items() for name, text in files.items()}
    else:
        targets = {out_dir / name: text for name, text in rendered.files.items()}
    if rendered.monitoring:
        targets.update({out_dir / MONITORING_DIR / name: text for name, text in rendered.monitoring.items()})
    write_many_atomic(targets)
    return list(targets)


def preflight_command(profile: Profile, rank: Rank, profile_path: str) -> str:
    """The rank unit's ``ExecStartPre=``: ``kimi-deploy preflight --profile P --host NODE --timeout T``."""
    return (f"{profile.service.kimi_deploy} preflight --profile {profile_path} --host {rank.node} "
            f"--timeout {PREFLIGHT_TIMEOUT_SEC}")


def prefetch_command(profile: Profile, profile_path: str) -> str:
    """The server unit's ``ExecStartPre=-``: ``kimi-deploy prefetch --profile P --deadline D``
    (:mod:`kimi_deploy.host.prefetch`; D: :func:`prefetch_deadline`)."""
    return f"{profile.service.kimi_deploy} prefetch --profile {profile_path} --deadline {prefetch_deadline(profile)}"


def prefetch_deadline(profile: Profile) -> int:
    """Seconds the prefetch step may take (:meth:`kimi_deploy.profile.Startup.prefetch_deadline`)."""
    return profile.start.prefetch_deadline(profile.service.timeout_start_sec)


def render_ranks(profile: Profile, sglang_version: str | None = None, *,
                 components: Mapping[str, str] | None = None,
                 profile_path: str | None = None, deployment: Deployment | None = None) -> dict[str, dict[str, str]]:
    """``{node: {file name: text}}`` for every rank of every multi-node replica (empty without one).

    Rank 0's folder holds what a single host gets (server unit, env file, nightly check units); a rank >= 1
    folder holds its server unit and env file only (no check: it serves no HTTP). Every server unit runs the
    preflight first (:func:`preflight_command`). The monitoring files are not a host's part: as for
    single-node replicas (:func:`host_files`), ``render`` writes them once beside the folders.

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.deployment.resolve`.
    """
    hosts: dict[str, dict[str, str]] = {}
    deployment = deployment or resolve(profile, sglang_version, components=components)
    for rank in group_ranks(profile):
        rendered = render(profile, sglang_version, components=components, profile_path=profile_path,
                          rank=rank, deployment=deployment)
        hosts[rank.node] = dict(rendered.files)
    return hosts


def gateway_files(profile: Profile, header: str, deployment: Deployment | None = None) -> dict[str, str]:
    """File name -> text of the gateway host's part: ``<name>-gateway.service`` (empty without ``[gateway]``);
    the gateway's command from ``deployment`` (default: ``profile`` resolved here)."""
    if profile.gateway is None:
        return {}
    deployment = deployment or resolve(profile)
    command, units = deployment.gateway_command, deployment.units
    assert command is not None and units.gateway is not None  # a [gateway] resolves to its command and units
    svc = profile.service
    deadline_s = fleet_check_deadline_s(len(deployment.worker_urls))
    check_command = " ".join(names.check_argv(
        svc.kimi_deploy, paths.service_profile_copy(svc.name), each_worker=True, deadline=str(deadline_s),
        api_key_file=f"%d/{API_KEY_CREDENTIAL}" if deployment.api_key_file else None,
        json=paths.gateway_check_report(svc.name),
        # one series set per worker (label worker=URL): the check alerts fire per replica
        prom=paths.gateway_check_textfile(svc.name)))
    context = {"header": header, "svc": svc, "s": profile.sglang, "gw": profile.gateway,
               "workers": deployment.worker_urls, "api_key_credential": API_KEY_CREDENTIAL,
               "exec_start": gateway_exec_start(command), "check_command": check_command,
               "check_unit": units.gateway_check_unit, "check_deadline_s": deadline_s,
               "per_worker_s": CHECK_DEADLINE_PER_WORKER_S, "gateway_pass_s": budget.GATEWAY_PASS_S,
               "check_timeout_s": deadline_s + CHECK_SLACK_S}
    env = _environment()
    return {units.gateway: env.get_template("gateway.service.j2").render(context),
            units.gateway_check_service: env.get_template("check.service.j2").render(context),
            units.gateway_check_timer: env.get_template("check.timer.j2").render(context)}


def host_files(profile: Profile, sglang_version: str | None = None, *,
               deployment: Deployment | None = None) -> dict[str, dict[str, str]]:
    """Host -> (file name -> text) for every host of the profile, in :meth:`Profile.hosts` order.

    Server files are :func:`kimi_deploy.targets.systemd.render`'s (the monitoring files stay with the Prometheus
    host: ``render`` writes them once, beside the host folders); a node of a multi-node replica gets its
    rank's files (:func:`render_ranks`: rank 0 as a single node, ranks >= 1 the server unit
    and env file only).

    Raises:
        UsageError: the profile has no ``[fleet]``/``[gateway]``.
    """
    hosts = profile.hosts()
    if not hosts:
        raise UsageError("the profile has no [fleet] or [gateway]: it describes one host",
                         hint="render without per-host folders, or add [fleet] (docs/runbook.md#replicas-behind-a-gateway)")
    deployment = deployment or resolve(profile, sglang_version)
    rendered = render(profile, sglang_version, deployment=deployment)
    header = file_header(profile, rendered.launch.sglang_version)
    gateway_part = gateway_files(profile, header, deployment)
    ranks = render_ranks(profile, rendered.launch.sglang_version, deployment=deployment)
    parts: dict[str, dict[str, str]] = {}
    for host in hosts:
        files: dict[str, str] = {}
        if host in ranks:
            files.update(ranks[host])
        elif is_node(profile, host):
            files.update(rendered.files)
        if profile.gateway is not None and host_key(host) == host_key(profile.gateway.host):
            files.update(gateway_part)
        parts[host] = files
    return parts


def files_of(parts: Mapping[str, Mapping[str, str]], host: str) -> Mapping[str, str]:
    """``parts[host]`` (:func:`host_files`), or an empty mapping for a host with nothing to install."""
    return parts.get(host, {})


def artefacts(profile: Profile, sglang_version: str | None = None, *,
              components: Mapping[str, str] | None = None) -> Artefacts:
    """The ``systemd`` target (:mod:`kimi_deploy.targets`): :func:`render`'s units and env file, one folder per
    host for a profile with ``[fleet]``/``[gateway]`` (:func:`host_files`), then the monitoring files under
    ``monitoring/``; ``components``: the probed stack versions for the cache key.

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.deployment.resolve`.
    """
    deployment = resolve(profile, sglang_version, components=components)
    rendered = render(profile, sglang_version, components=components, deployment=deployment)
    # the per-host folders key the caches without the probed components, as before (issue 36 moved no value)
    hosts = host_files(profile, rendered.launch.sglang_version) if profile.hosts() else None
    units = ({f"{host}/{name}": text for host, part in hosts.items() for name, text in part.items()} if hosts
             else dict(rendered.files))
    monitoring = {f"{MONITORING_DIR}/{name}": text for name, text in rendered.monitoring.items()}
    launch = rendered.launch

    def describe(out_dir: Path | None) -> dict[str, object]:
        return {
            "sglang_version": launch.sglang_version,
            "components": dict(components or {}),
            "cache_dir": launch.cache_dir,
            "profile_sha256": profile.digest(),
            "argv": list(launch.argv),
            "env": dict(launch.env),
            "files": {name: str(out_dir / name) if out_dir else None for name in units},
            "monitoring": {name: str(out_dir / MONITORING_DIR / name) if out_dir else None
                           for name in rendered.monitoring},
            "warnings": [*launch.warnings, *scrape],
        }

    # what the scrape configuration could not know (kimi_deploy.targets.prometheus.scrape_notes), when rendered
    scrape = tuple(scrape_notes(profile)) if rendered.monitoring else ()
    notes = () if rendered.monitoring else (METRICS_OFF,)
    return Artefacts("systemd", {**units, **monitoring}, describe, launch=launch,
                     warnings=(*launch.warnings, *scrape), notes=notes)
