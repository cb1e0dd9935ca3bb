"""Profile + SGLang version -> the exact SGLang launch: argv, environment, secrets file.

The flag spellings come from :mod:`kimi_deploy.versions`; nothing else in the kit
decides how a feature is spelled. The API key never enters argv or the
environment: argv names SGLang's YAML ``--config`` file, which the unit writes at
start from a systemd credential (see ``systemd/server.service.j2``).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.version import Version

from kimi_deploy import options, paths, versions
from kimi_deploy.argv import expansions, flag_groups, split_equals
from kimi_deploy.errors import ProfileError, UnsupportedVersionError, UsageError
from kimi_deploy.names import url_host
from kimi_deploy.profile import NIC_ENV, Profile, is_loopback

#: Name of the systemd credential that carries the API key (``LoadCredential=``).
API_KEY_CREDENTIAL = "api-key"
#: File name of SGLang's YAML config written into ``RuntimeDirectory=`` at start.
SECRETS_CONFIG_NAME = "sglang-secrets.yaml"
#: What ``render --print-command`` runs on the host to write that YAML: the unit's ExecStartPre= script
#: (kimi_deploy.targets.systemd.SECRETS_SCRIPT) with the key file and the YAML path as arguments.
HOST_SECRETS_SCRIPT = (
    'import json, sys; '
    'key = open(sys.argv[1]).read().strip(); '
    'key or sys.exit("kimi-deploy: the API key file is empty: " + sys.argv[1]); '
    'open(sys.argv[2], "w").write("api-key: " + json.dumps(key) + chr(10))'
)


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What runs: ``argv`` (interpreter first), ``env`` (ordered), and where secrets come from.

    ``secrets_config`` is the host path of SGLang's ``--config`` YAML holding the API
    key (``None`` without a key). ``warnings`` are human-readable notes for the
    operator (e.g. a target newer than the version table).
    """

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    sglang_version: str
    cache_dir: str
    secrets_config: str | None
    warnings: tuple[str, ...] = ()

    @property
    def server_args(self) -> tuple[str, ...]:
        """The arguments after ``python -m sglang.launch_server`` (what SGLang's argparse sees)."""
        return self.argv[3:]

    def flag_groups(self) -> list[tuple[str, ...]]:
        """:attr:`server_args` grouped for display: each flag with its value, if it takes one
        (:func:`kimi_deploy.argv.flag_groups`)."""
        return flag_groups(self.server_args)

    def shell_command(self, api_key_file: str | None = None) -> str:
        """The command as POSIX shell a user can paste on the host, one flag a line.

        Without a secrets file: ``env K=V ... python -m sglang.launch_server ...``, exactly the
        unit's ``ExecStart=`` (with its EnvironmentFile as ``env``). With one (``api_key_file``
        given): two marked steps, because ``--config /run/<name>/sglang-secrets.yaml`` exists only
        inside the running unit. Step 1 writes the same YAML (``api-key: "<key>"``, 0600) from
        ``api_key_file`` into a ``mktemp --suffix=.yaml`` file (GNU coreutils; SGLang 0.5.23's
        ``ConfigArgumentMerger`` accepts only ``.yaml``/``.yml`` names) named by
        ``$KIMI_DEPLOY_SECRETS``; step 2 is the launch with ``--config "$KIMI_DEPLOY_SECRETS"``.
        The key is read by the interpreter, so it never enters argv, the environment or the
        shell history; the file is removed when that shell exits.
        """
        lines = []
        if self.env:
            lines.append("env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env))
        lines.append(" ".join(shlex.quote(a) for a in self.argv[:3]))
        groups = self.flag_groups()
        if not (self.secrets_config and api_key_file):
            lines += ["  " + " ".join(shlex.quote(a) for a in group) for group in groups]
            return " \\\n".join(lines) + "\n"
        lines += ["  " + (f'{group[0]} "$KIMI_DEPLOY_SECRETS"' if group == (group[0], self.secrets_config)
                          else " ".join(shlex.quote(a) for a in group)) for group in groups]
        python = shlex.quote(self.argv[0])
        return (
            f"# 1. SGLang's --config YAML with the API key, from {api_key_file} (the unit writes it to\n"
            f"#    {self.secrets_config} at start; the key never enters argv). Run as a user who can read the key file.\n"
            "KIMI_DEPLOY_SECRETS=$(umask 077 && mktemp --suffix=.yaml) && trap 'rm -f \"$KIMI_DEPLOY_SECRETS\"' EXIT &&\n"
            f"{python} -c {shlex.quote(HOST_SECRETS_SCRIPT)} {shlex.quote(api_key_file)} \"$KIMI_DEPLOY_SECRETS\" &&\n"
            "# 2. the launch command (the unit's ExecStart=, reading that YAML):\n"
            + " \\\n".join(lines) + "\n"
        )


def cache_key(sglang_version: str, components: Mapping[str, str] | None = None) -> str:
    """Version key of the compile caches: ``sglang-0.5.23`` or, with probed versions,
    ``sglang-0.5.23_flashinfer-0.7.2_torch-2.14.1_cuda-13.0``.

    Kernels compiled by one stack are not valid for another; a new key per stack
    means an upgrade starts from a clean cache instead of a poisoned one.
    """
    parts = [f"sglang-{sglang_version}"]
    for name in ("flashinfer", "torch", "cuda"):
        if components and components.get(name):
            parts.append(f"{name}-{components[name]}")
    return "_".join(parts).replace("+", "-")


def build_launch(profile: Profile, sglang_version: str | Version = versions.DEFAULT_SGLANG_VERSION,
                 *, components: Mapping[str, str] | None = None, node_rank: int | None = None,
                 rank0: str | None = None, placeholders: Mapping[str, str] | None = None) -> LaunchSpec:
    """Compute the launch of ``profile`` for SGLang ``sglang_version``.

    Args:
        profile: a validated profile.
        sglang_version: target release (string or parsed).
        components: probed versions (``flashinfer``, ``torch``, ``cuda``) for the cache key.
        node_rank: for a multi-node profile (``[fleet]`` replicas of N > 1 nodes), the rank whose command
            to build: the rows :meth:`options.Option.on_rank` puts on that rank, ``extra_args``, then
            ``--nnodes N --node-rank R --dist-init-addr NODES[0]:PORT [--dist-timeout T]``
            (:data:`options.FLEET_OPTIONS` order; the same on every rank but for ``--node-rank``, and last); the
            environment gains ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` = ``[fleet] nic``. ``None`` (and for
            one-node replicas): every row, no rank flags. The one builder of a rank's arguments: the systemd rank
            units (:func:`kimi_deploy.deployment.resolve`) and the Kubernetes pods (:func:`kimi_deploy.targets.kubernetes.rank_server_args`)
            both come here.
        rank0: the replica's rank-0 node for ``--dist-init-addr`` (default: the first replica's);
            :func:`kimi_deploy.deployment.resolve` passes each replica's, Kubernetes its leader's address variable.
        placeholders: text the runner fills in for ``node_rank`` and ``nnodes`` (Kubernetes:
            ``$(LWS_WORKER_INDEX)``, ``$(LWS_GROUP_SIZE)``) in place of the numbers; ``node_rank`` still decides
            which rows the rank gets (0: the serving rank, else one of the others).

    Raises:
        UsageError: not a known 0.5.x version.
        UnsupportedVersionError: the profile asks for a feature the version lacks.
    """
    version = sglang_version if isinstance(sglang_version, Version) else versions.parse_version(sglang_version)
    s, svc = profile.sglang, profile.service
    multi = profile.nodes_per_copy > 1 and node_rank is not None
    rank = node_rank if multi else 0
    warnings: list[str] = []
    if version > versions.NEWEST_KNOWN:
        warnings.append(
            f"SGLang {version} is newer than the newest release kimi-deploy's flag table knows "
            f"({versions.NEWEST_KNOWN}); rendering {versions.NEWEST_KNOWN} spellings — validate with "
            "`kimi-deploy validate --python ...`")
    args: list[str] = []
    env: list[tuple[str, str]] = []
    for option in options.OPTIONS:
        if option.requires and not getattr(s, option.requires):
            continue
        if multi and not option.on_rank(rank):
            continue
        EMITTERS[option.emit](_Emission(option, profile, version, args, env), getattr(s, option.key))
    removed = versions.removed_switches(version, s.extra_args, profile.environment)
    if removed:
        raise UnsupportedVersionError(
            f"the profile uses {len(removed)} switch(es) SGLang {version} no longer has: " + "; ".join(removed),
            value=str(version), hint="change them to the spelling named above and render again")
    args += list(s.extra_args)
    if multi:
        shown = placeholders or {}
        args += rank_args(profile, version, shown.get("node_rank", rank), rank0 or profile.replicas[0][0],
                          nnodes=shown.get("nnodes"))
        env += [(name, profile.fleet.nic) for name in NIC_ENV]

    key = cache_key(str(version), components)
    cache_dir = f"{profile.cache_root}/{key}"
    base_env = [("HF_HUB_OFFLINE", "1"), ("PYTHONUNBUFFERED", "1")]
    # one line per variable: an [environment] entry that overrides a default (HF_HUB_OFFLINE = "0") takes its
    # place instead of following it as a second assignment in the env file and the printed `env A=1 ... A=0`
    merged = dict(base_env + options.cache_env(cache_dir) + env)
    merged.update(profile.environment)
    full_env = list(merged.items())
    check_exposure(args, profile, merged)
    argv = (svc.python, "-m", "sglang.launch_server", *args)
    return LaunchSpec(argv=argv, env=tuple(full_env), sglang_version=str(version), cache_dir=cache_dir,
                      secrets_config=secrets_config(profile) if rank == 0 else None, warnings=tuple(warnings))


def rank_args(profile: Profile, version: Version, rank: int | str, rank0: str, *,
              nnodes: str | None = None) -> list[str]:
    """``--nnodes N --node-rank R --dist-init-addr RANK0:PORT [--dist-timeout T]`` in ``version``'s spelling of
    each :data:`options.FLEET_OPTIONS` row (SGLang 0.5.23 server_args.py; an IPv6 rank 0 in brackets, as
    SGLang's ``NetworkAddress.parse`` reads it). ``rank``/``rank0``/``nnodes`` may be text the runner fills in
    (Kubernetes: ``$(LWS_WORKER_INDEX)``, ``$(LWS_LEADER_ADDRESS)``, ``$(LWS_GROUP_SIZE)``); ``nnodes``
    defaults to :attr:`Profile.nodes_per_copy`. Needs ``[fleet]`` (a multi-node profile)."""
    fleet = profile.fleet
    values = {"nnodes": profile.nodes_per_copy if nnodes is None else nnodes, "node_rank": rank,
              "dist_init_addr": f"{url_host(rank0)}:{fleet.dist_init_port}", "dist_timeout": fleet.dist_timeout}
    args: list[str] = []
    for option in options.FLEET_OPTIONS:
        if values[option.key] is not None:
            args += [versions.spelling(option.key, version, what=option.key).spelling, str(values[option.key])]
    return args


def secrets_config(profile: Profile) -> str | None:
    """Host path of SGLang's ``--config`` YAML holding the API key (``None`` without ``api_key_file``)."""
    name = profile.service.name
    return f"{paths.service_runtime_dir(name)}/{SECRETS_CONFIG_NAME}" if profile.sglang.api_key_file else None


@dataclasses.dataclass(frozen=True)
class _Emission:
    """What an emitter appends to: the row, the profile, the target release, the argv and env being built."""

    option: options.Option
    profile: Profile
    version: Version
    args: list[str]
    env: list[tuple[str, str]]

    def rule(self, value: str | None = None) -> versions.Rule:
        """The target release's spelling of the row (for ``value``, when that value has its own rows)."""
        return versions.spelling(self.option.key, self.version, what=self.option.key, value=value)


def _value(e: _Emission, value: object) -> None:
    """``FLAG VALUE`` when set; a value newer than the release (EAGLE3 before 0.5.10) is refused."""
    if value is not None:
        e.args.extend([e.rule(str(value)).spelling, str(value)])


def _switch(e: _Emission, value: object) -> None:
    """``FLAG`` when true."""
    if value:
        e.args.append(e.rule().spelling)


def _env_switch(e: _Emission, value: object) -> None:
    """``VAR=1`` when true."""
    if value:
        e.env.append((e.rule().spelling, "1"))


def _env_bool_until_implicit(e: _Emission, value: bool | None) -> None:
    """``VAR=1``/``VAR=0`` while the release spells it an env var; once implicit, ``false`` cannot be honoured
    (``enable_spec_v2``: the env in 0.5.5-0.5.13, from 0.5.14 EAGLE/EAGLE3 always use the v2 worker)."""
    if value is None:
        return
    rule = e.rule()
    if rule.kind == "env":
        e.env.append((rule.spelling, "1" if value else "0"))
    elif not value:
        raise UnsupportedVersionError(
            f"{e.option.key} = false cannot be honoured by SGLang {e.version}: from {rule.since} EAGLE/EAGLE3 "
            "always use the v2 worker", value="false",
            hint=f"remove {e.option.key}, or set disable_overlap_schedule = true to turn overlap scheduling off")


def _value_or_legacy_switch(e: _Emission, value: str | None) -> None:
    """``FLAG VALUE`` where the release has the valued flag (``--flashinfer-allreduce-fusion-backend``, 0.5.14+),
    before that the older switch, which means ``auto`` only."""
    if not value:
        return
    rule = e.rule()
    valued = [r for r in versions.rules_for(e.option.key) if r.kind == "flag"][-1]
    if rule.spelling == valued.spelling:
        e.args.extend([rule.spelling, value])
    elif value == "auto":
        e.args.append(rule.spelling)
    else:
        raise UnsupportedVersionError(
            f"{e.option.key} = \"{value}\" needs "
            f"SGLang >= {valued.since} (backend choice); SGLang {e.version} only has {rule.spelling}",
            value=value, hint=f"use {e.option.key} = \"auto\" or upgrade SGLang to {valued.since}+")


def _secrets_config(e: _Emission, value: str | None) -> None:
    """``--config /run/<name>/sglang-secrets.yaml``: the key reaches SGLang in a YAML file, never argv."""
    path = secrets_config(e.profile)
    if path:
        e.args.extend([e.rule().spelling, path])


def _nothing(e: _Emission, value: object) -> None:
    """Not an SGLang argument (a kit rule, or ``extra_args``, appended after the table)."""


#: The handler each :data:`kimi_deploy.options.Emit` names: ``(emission, value) -> None``, appending to the
#: emission's ``args``/``env``. A row picks its handler by its ``emit``; ``build_launch`` has no per-row code.
EMITTERS = {
    "value": _value,
    "switch": _switch,
    "env-switch": _env_switch,
    "env-bool-until-implicit": _env_bool_until_implicit,
    "value-or-legacy-switch": _value_or_legacy_switch,
    "secrets-config": _secrets_config,
    "none": _nothing,
}


#: SGLang 0.5.23 flags that open a gRPC listener on ``--host`` beside (``--grpc-port``: the native gRPC server,
#: entrypoints/http_server.py ``_start_native_grpc_server_for_runtime``) or instead of the HTTP server
#: (``--smg-grpc-mode``, deprecated ``--grpc-mode``: the SMG servicer, launch_server.py). Neither checks the API
#: key (entrypoints/grpc_bridge.py has no key logic; the key is the HTTP middleware's), so on a host that is not
#: loopback they are a keyless public server. ``SGLANG_GRPC_PORT`` (srt/environ.py) is the env spelling.
GRPC_FLAGS = ("--grpc-port", "--smg-grpc-mode", "--grpc-mode")
GRPC_ENV = "SGLANG_GRPC_PORT"


def _is_grpc_flag(name: str) -> bool:
    """``name`` or an abbreviation argparse would expand to one of :data:`GRPC_FLAGS` (``allow_abbrev``)."""
    return name.startswith(("--grpc-", "--smg-g")) and bool(expansions(name, GRPC_FLAGS))


def check_exposure(server_args: list[str] | tuple[str, ...], profile: Profile,
                   env: Mapping[str, str] | None = None) -> None:
    """The public-host rule on the final command: a non-loopback ``--host`` needs ``--config`` with the key,
    and no gRPC listener (:data:`GRPC_FLAGS`, ``env`` :data:`GRPC_ENV`), which SGLang serves without one.

    Reads the last ``--host``/``--host=`` of ``server_args`` (argparse keeps the last), SGLang's default
    127.0.0.1 without one; which word is a flag's value is :func:`kimi_deploy.argv.flag_groups`'s rule,
    and a ``--host`` without one counts as a host that is not loopback. ``env``: the server's environment.

    Raises:
        ProfileError: the command would listen beyond loopback with no API key (or with a gRPC listener) and
            the profile does not say ``allow_unauthenticated = true`` (exit 2).
    """
    host = "127.0.0.1"
    keyed = False
    config_flags = [sp.name for sp in options.BY_KEY["api_key_file"].spellings]  # --config, not the key flags
    grpc: list[str] = [f"{GRPC_ENV}={(env or {})[GRPC_ENV]}"] if GRPC_ENV in (env or {}) else []
    for name, *value in map(split_equals, flag_groups(server_args)):
        if name in options.BY_KEY["host"].flags:
            host = value[0] if value else ""
        elif name in config_flags:
            keyed = bool(value) and value[0] == secrets_config(profile)
        elif _is_grpc_flag(name):
            grpc.append(" ".join([name, *value]))
    if profile.sglang.allow_unauthenticated or is_loopback(host):
        return
    if grpc:
        raise ProfileError(
            "the launch command would open SGLang's gRPC server to other machines, and it checks no API key",
            value=f"--host {host} {grpc[0]}",
            hint="remove the gRPC flag from [sglang] extra_args (or SGLANG_GRPC_PORT from [environment]), bind "
                 "host = \"127.0.0.1\", or set allow_unauthenticated = true")
    if keyed:
        return
    raise ProfileError(
        "the launch command would accept connections from other machines without an API key",
        value=f"--host {host}", hint="set [sglang] api_key_file, bind host = \"127.0.0.1\", "
                                     "or set allow_unauthenticated = true")


# --- the gateway (smg) -----------------------------------------------------------------------------------

#: Runs as ExecStart= in smg's own interpreter when the profile has an API key: reads the systemd credential
#: and runs ``smg.cli.main`` with the unit's arguments plus ``--api-key`` (in-process: not in argv, env or the
#: unit; smg 1.13.0 then renames the process ``smg::router``). No %, $ or double quote: systemd would expand
#: or split them.
LAUNCHER = (
    "import os, sys; from smg.cli import main; "
    f"key = open(os.path.join(os.environ['CREDENTIALS_DIRECTORY'], '{API_KEY_CREDENTIAL}')).read().strip(); "
    "key or sys.exit('kimi-deploy: the API key credential is empty'); "
    "main(sys.argv[1:] + ['--api-key', key])"
)


def smg_python(profile: Profile) -> str:
    """smg's interpreter: ``python`` beside ``[gateway] smg`` in the same virtual environment's ``bin``."""
    assert profile.gateway is not None
    return str(Path(profile.gateway.smg).parent / "python")


def gateway_args(profile: Profile) -> list[str]:
    """``smg`` arguments of the profile's gateway, ``launch`` first, without the API key.

    Shape: ``launch --host BIND --port P --policy POLICY --worker-urls URL... --prometheus-host H
    --prometheus-port P --disable-tokenizer-autoload [--reasoning-parser NAME] [--tool-call-parser NAME]``.
    Workers: :meth:`Profile.worker_urls`, rank 0 of every replica; the parsers only where ``[gateway]`` sets them
    (smg's names, :mod:`kimi_deploy.catalog.gateway_parsers`).

    Raises:
        UsageError: the profile has no ``[gateway]`` (exit 2).
    """
    gw = profile.gateway
    if gw is None:
        raise UsageError("the profile has no [gateway]", hint="add a [gateway] table (docs/runbook.md#replicas-behind-a-gateway)")
    return ["launch", "--host", gw.bind, "--port", str(gw.port), "--policy", gw.policy,
            "--worker-urls", *profile.worker_urls(),
            "--prometheus-host", gw.prometheus_host, "--prometheus-port", str(gw.prometheus_port),
            "--disable-tokenizer-autoload", *gateway_parser_args(profile)]


def gateway_parser_args(profile: Profile) -> list[str]:
    """``--reasoning-parser NAME`` and ``--tool-call-parser NAME`` of smg, each where ``[gateway]`` sets it (smg's
    own names: :mod:`kimi_deploy.catalog.gateway_parsers`); ``[]`` without ``[gateway]`` or with neither set."""
    gw = profile.gateway
    if gw is None:
        return []
    return [*(["--reasoning-parser", gw.reasoning_parser] if gw.reasoning_parser else []),
            *(["--tool-call-parser", gw.tool_call_parser] if gw.tool_call_parser else [])]


def gateway_argv(profile: Profile) -> list[str]:
    """The gateway's command as argv: :data:`LAUNCHER` in smg's interpreter (``python -c LAUNCHER launch ...``,
    reading ``$CREDENTIALS_DIRECTORY/api-key``) with a key, else the smg script (``smg launch ...``)."""
    assert profile.gateway is not None
    if profile.sglang.api_key_file:
        return [smg_python(profile), "-c", LAUNCHER, *gateway_args(profile)]
    return [profile.gateway.smg, *gateway_args(profile)]


def exec_start(argv: Sequence[str]) -> str:
    """ExecStart='s value for ``argv``: the program line, then one option and its values per continued line.

    The one argument with spaces (:data:`LAUNCHER`, which has no double quote) is double-quoted for systemd.
    """
    head: list[str] = []
    groups: list[list[str]] = []
    for arg in argv:
        arg = f'"{arg}"' if " " in arg else arg
        if arg.startswith("--"):
            groups.append([arg])
        elif groups:
            groups[-1].append(arg)
        else:
            head.append(arg)
    return " \\\n".join([" ".join(head)] + ["    " + " ".join(g) for g in groups])
