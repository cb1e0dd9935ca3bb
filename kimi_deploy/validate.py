"""Validate a rendered SGLang command with SGLang's own argument parser, in the target interpreter.

The check runs in the interpreter SGLang is installed in (through
:func:`kimi_deploy.engine.run_script`; kimi-deploy never imports sglang) and takes
the same path as SGLang 0.5.23's ``prepare_server_args`` (``sglang/srt/server_args.py``):

1. ``config``: the ``--config`` YAML is merged by SGLang's ``ConfigArgumentMerger``
   (``sglang/srt/utils/server_args_config_parser.py``). The rendered command names the
   API-key file the unit writes at start (``/run/<name>/sglang-secrets.yaml``); here a
   temporary YAML in the same format holding ``api-key: "validation-placeholder"``
   takes its place, so the real key is never read.
2. ``argparse``: ``argparse.ArgumentParser(prog="sglang serve")`` +
   ``ServerArgs.add_cli_args(parser)`` + ``parse_args``. A bad flag exits 2 with
   SGLang's message on stderr; that message is the error.
   ``exact-names``: every option given is spelled exactly as the parser defines it. SGLang's parser
   keeps argparse's ``allow_abbrev``, so ``--nnode 2`` parses as ``--nnodes 2``; an abbreviation is an
   error naming the full option(s).
3. ``record``: ``ServerArgs.from_cli_args`` (in 0.5.23 construction does not resolve:
   ``__post_init__`` is empty and resolution is ``resolve_once``). Skipped when the
   target's ``ServerArgs`` has no ``resolve_once`` (older releases resolved in
   ``__post_init__``, which needs the model and GPUs).
4. ``deprecated-args``: SGLang's ``handle_deprecated_args`` resolution hook alone
   (``sglang/srt/arg_groups/serving_hook.py``): model- and GPU-independent, it is
   where e.g. ``--enable-flashinfer-allreduce-fusion`` is reported as deprecated.

Before SGLang's parser, the model itself (:func:`check_model`): a model of the kit's table
(:mod:`kimi_deploy.catalog.models`) whose published weights do not fit the replica's GPUs (tp_size x
pp_size GPUs of the reference host's 96 GB: validate sees no GPU; ``doctor``'s gpu.memory checks the real
ones) is an error with the numbers and what would fit (Kimi K3 on 8 x 96 GB); parsers other than the
model's are warnings.

Full resolution (``ServerArgs.resolve_once``) is not run: it reads the model's
``config.json`` (or asks the Hugging Face hub), inspects GPUs and their memory, so it
only works on the serving host with the weights in place, and fails on a CI machine.

Warnings SGLang logs (``logging`` WARNING and above) during steps 1-4, and Python
``DeprecationWarning``/``FutureWarning`` raised there, are reported verbatim (ANSI
colour codes removed). A flag given whose SGLang help text says "Deprecated" and that
produced no message of its own is reported with that help text: SGLang 0.5.23 stays
silent about ``--enable-flashinfer-allreduce-fusion`` when
``--flashinfer-allreduce-fusion-backend`` is also given.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import proc
from kimi_deploy.catalog import gateway_parsers, spec_guard
from kimi_deploy import engine as target
from kimi_deploy.catalog.models import REFERENCE_GPU, identify, parser_mismatches
from kimi_deploy.deployment import Deployment, require_fit, resolve, static_fit
from kimi_deploy.errors import ExternalCommandError, UsageError
from kimi_deploy.launch import LaunchSpec, gateway_args
from kimi_deploy.profile import Profile
from kimi_deploy.topology import Rank

#: The API key written into the substitute ``--config`` file.
PLACEHOLDER_API_KEY = "validation-placeholder"

#: Runs inside the target interpreter. argv[1]: JSON list of server args;
#: argv[2]: the secrets-config path to substitute ("" for none).
VALIDATE_SCRIPT = r"""
import argparse, contextlib, io, json, logging, os, re, sys, tempfile, warnings
args = json.loads(sys.argv[1]); secrets = sys.argv[2] or None; placeholder = sys.argv[3]
out = {"stages": [], "errors": [], "warnings": [], "notes": [], "api_key_from_config": None}
ansi = re.compile(r"\x1b\[[0-9;]*m")
def clean(text):
    return ansi.sub("", str(text)).strip()
def finish():
    print(json.dumps(out)); sys.exit(0)
try:
    from sglang.srt.server_args import ServerArgs
except BaseException as exc:
    out["errors"].append("cannot import SGLang's server arguments (sglang.srt.server_args): " + clean(repr(exc)))
    finish()
class Collect(logging.Handler):
    def emit(self, record):
        msg = clean(record.getMessage())
        if msg and msg not in out["warnings"]:
            out["warnings"].append(msg)
collector = Collect(level=logging.WARNING)
logging.getLogger().addHandler(collector)
if logging.getLogger().level > logging.WARNING or logging.getLogger().level == logging.NOTSET:
    logging.getLogger().setLevel(logging.WARNING)
caught = warnings.catch_warnings(record=True); recorded = caught.__enter__(); warnings.simplefilter("always")
def flush_warnings():
    for w in recorded:
        if issubclass(w.category, (DeprecationWarning, FutureWarning)):
            msg = clean(w.message)
            if msg not in out["warnings"]:
                out["warnings"].append(msg)
    del recorded[:]
tmpdir = tempfile.mkdtemp(prefix="kimi-deploy-validate-")
try:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if secrets and "--config" in args:
        i = args.index("--config")
        if i + 1 < len(args) and args[i + 1] == secrets:
            path = os.path.join(tmpdir, os.path.basename(secrets))
            with open(path, "w") as fh:
                fh.write("api-key: " + json.dumps(placeholder) + "\n")
            args = args[:i + 1] + [path] + args[i + 2:]
            out["notes"].append("--config " + secrets + " replaced by a YAML file holding a placeholder api-key")
    if "--config" in args:
        try:
            from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
            args = ConfigArgumentMerger(parser).merge_config_with_args(args)
        except Exception as exc:
            out["errors"].append("--config: " + clean(exc))
            flush_warnings(); finish()
        out["stages"].append("config")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
    except SystemExit as exc:
        lines = [clean(l) for l in err.getvalue().splitlines() if ": error: " in l]
        out["errors"].append(lines[-1] if lines else clean(err.getvalue()) or "argparse exited with status %s" % exc.code)
        flush_warnings(); finish()
    out["stages"].append("argparse")
    exact = set(parser._option_string_actions)
    for arg in args:
        name = arg.split("=", 1)[0]
        if arg == "--":
            break
        if name.startswith("--") and name not in exact:
            full = sorted(o for o in exact if o.startswith(name))
            out["errors"].append(name + " is an abbreviation of " + " or ".join(full) + ": SGLang's argparse "
                                 "expands it, but a later release may add an option that makes it ambiguous or "
                                 "another option; spell it out")
    if out["errors"]:
        flush_warnings(); finish()
    out["stages"].append("exact-names")
    if secrets:
        out["api_key_from_config"] = getattr(ns, "api_key", None) == placeholder
    if not hasattr(ServerArgs, "resolve_once"):
        out["notes"].append("ServerArgs has no resolve_once: construction would resolve (needs model and GPUs); stopped after argparse")
        flush_warnings(); finish()
    try:
        record = ServerArgs.from_cli_args(ns)
    except Exception as exc:
        out["errors"].append("ServerArgs: " + clean(exc))
        flush_warnings(); finish()
    out["stages"].append("record")
    try:
        from sglang.srt.arg_groups.serving_hook import handle_deprecated_args
    except ImportError:
        out["notes"].append("no sglang.srt.arg_groups.serving_hook.handle_deprecated_args in this release; skipped")
    else:
        try:
            handle_deprecated_args(record)
        except Exception as exc:
            out["errors"].append(clean(exc))
            flush_warnings(); finish()
        out["stages"].append("deprecated-args")
    flush_warnings()
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    for action in parser._actions:
        text = clean(action.help or "")
        for opt in action.option_strings:
            if opt in given and "deprecated" in text.lower() and not any(opt in w for w in out["warnings"]):
                out["warnings"].append(opt + ": " + text)
finally:
    for name in os.listdir(tmpdir):
        os.unlink(os.path.join(tmpdir, name))
    os.rmdir(tmpdir)
finish()
"""

#: Steps in the order they run (see the module docstring).
STAGES = ("config", "argparse", "exact-names", "record", "deprecated-args")


@dataclasses.dataclass(frozen=True)
class Validation:
    """Outcome of :func:`validate_server_args`.

    ``server_args``: the arguments checked (as rendered, real ``--config`` path);
    ``stages``: the steps of :data:`STAGES` that passed; ``errors``/``warnings``:
    SGLang's own messages; ``notes``: what the check did besides (substitutions,
    skipped steps); ``api_key_from_config``: SGLang took ``--api-key`` from the
    substituted ``--config`` file (``None``: no secrets config in the command).
    """

    python: str
    sglang_version: str | None
    server_args: tuple[str, ...]
    stages: tuple[str, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    api_key_from_config: bool | None

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``--json``)."""
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def validate_server_args(python: str | Path, server_args: Sequence[str], *, secrets_config: str | None = None,
                         env: Mapping[str, str] | None = None, sglang_version: str | None = None,
                         timeout: float = 180.0) -> Validation:
    """Parse ``server_args`` with SGLang's parser in ``python`` (steps in the module docstring).

    Args:
        python: the SGLang interpreter.
        server_args: what follows ``python -m sglang.launch_server``.
        secrets_config: host path of the API-key YAML named after ``--config``; replaced by
            a placeholder file (never read).
        env: environment for the check (SGLang reads some ``SGLANG_*`` variables while parsing).
        sglang_version: recorded in the result (the caller probed it).

    Returns:
        :class:`Validation`; invalid flags are in ``errors``, not raised.

    Raises:
        UsageError: the interpreter does not exist.
        ExternalCommandError: the script crashed (no JSON), e.g. a broken interpreter.
    """
    data = target.run_script(python, VALIDATE_SCRIPT,
                             [json.dumps(list(server_args)), secrets_config or "", PLACEHOLDER_API_KEY],
                             timeout=timeout, env=dict(env or {}), label="validate script")
    errors = list(data.get("errors", []))
    if data.get("api_key_from_config") is False:
        errors.append(f"SGLang did not read api-key from the --config file {secrets_config}")
    return Validation(
        python=str(python), sglang_version=sglang_version, server_args=tuple(server_args),
        stages=tuple(data.get("stages", [])), errors=tuple(errors), warnings=tuple(data.get("warnings", [])),
        notes=tuple(data.get("notes", [])), api_key_from_config=data.get("api_key_from_config"),
    )


#: Runs :data:`VALIDATE_SCRIPT` once per job in one interpreter (SGLang imported once): argv[1] the script, argv[2] a
#: JSON list of ``[server_args, secrets_config, placeholder, env]``; prints ``{"results": [the script's objects]}``.
VALIDATE_MANY_SCRIPT = r"""
import contextlib, io, json, os, sys
script, jobs = sys.argv[1], json.loads(sys.argv[2])
code = compile(script, "<validate script>", "exec")
results = []
for args, secrets, placeholder, env in jobs:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.argv = ["validate", json.dumps(args), secrets, placeholder]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(code, {"__name__": "__main__"})
    except SystemExit:
        pass
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    try:
        results.append(json.loads(lines[-1]))
    except (IndexError, ValueError):
        results.append({"errors": ["the validate script printed no result"]})
print(json.dumps({"results": results}))
"""


def validate_many(python: str | Path, jobs: Sequence[tuple[Sequence[str], str | None, Mapping[str, str]]], *,
                  sglang_version: str | None = None, timeout: float = 600.0) -> list[Validation]:
    """:func:`validate_server_args` of each ``(server_args, secrets_config, env)`` job, in one interpreter start
    (SGLang's import, seconds, paid once; each parse is milliseconds): ``tune`` checks every candidate before any
    restart. Same stages and messages as one run of :data:`VALIDATE_SCRIPT` per job, which it executes as is.

    Raises:
        UsageError: the interpreter does not exist.
        ExternalCommandError: the driver crashed (no JSON).
    """
    if not jobs:
        return []
    payload = [[list(args), secrets or "", PLACEHOLDER_API_KEY, dict(env)] for args, secrets, env in jobs]
    data = target.run_script(python, VALIDATE_MANY_SCRIPT, [VALIDATE_SCRIPT, json.dumps(payload)], timeout=timeout,
                             label="validate script, one run per command")
    rows = data.get("results") if isinstance(data.get("results"), list) else []
    out = []
    for (args, secrets, _env), row in zip(jobs, rows + [{}] * (len(jobs) - len(rows))):
        errors = list(row.get("errors", [])) or ([] if row else ["no result for this command"])
        if row.get("api_key_from_config") is False:
            errors.append(f"SGLang did not read api-key from the --config file {secrets}")
        out.append(Validation(python=str(python), sglang_version=sglang_version, server_args=tuple(args),
                              stages=tuple(row.get("stages", [])), errors=tuple(errors),
                              warnings=tuple(row.get("warnings", [])), notes=tuple(row.get("notes", [])),
                              api_key_from_config=row.get("api_key_from_config")))
    return out


def check_env(launch: LaunchSpec) -> dict[str, str]:
    """The launch environment minus the cache paths (they need not exist where the check runs)."""
    return {k: v for k, v in launch.env if not v.startswith(launch.cache_dir)}


@dataclasses.dataclass(frozen=True)
class RankValidation:
    """One rank's command of a multi-node replica (:mod:`kimi_deploy.topology`) and its check."""

    rank: Rank
    launch: LaunchSpec
    validation: Validation

    def to_dict(self) -> dict[str, Any]:
        return {**self.rank.to_dict(), **self.validation.to_dict()}


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """The model table's verdict on the model a profile deploys (:func:`check_model`).

    ``model``: its key in the table (``None``: not a model the kit knows; nothing checked); ``errors``: its
    weights do not fit; ``warnings``: parsers other than the model's; ``notes``: what was assumed.
    """

    model: str | None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "errors": list(self.errors), "warnings": list(self.warnings),
                "notes": list(self.notes)}


def check_model(profile: Profile, gpus: Any = None) -> ModelCheck:
    """Check ``profile``'s model against the kit's model table: the fit verdict of the resolved deployment
    (:func:`kimi_deploy.deployment.static_fit`: weights vs one replica's GPU memory, ``tp_size`` x ``pp_size``
    GPUs of ``gpus``, default the reference host's), the parsers (SGLang's: warnings) and the ``[gateway]``'s
    parsers in smg's names (errors: :func:`gateway_model_problems`). The model is known by its
    ``model_path``/``served_model_name`` (:func:`kimi_deploy.catalog.models.identify`)."""
    s = profile.sglang
    fit = static_fit(profile, gpus)
    deployment_model = identify(s.model_path, s.served_model_name)
    if deployment_model is None:
        return ModelCheck(None, notes=(fit.evidence,))
    errors = (f"{fit.evidence}; what would fit: {fit.what_fits}",) if fit.static is False else ()
    errors += tuple(gateway_model_problems(profile))
    where = "the reference host's" if gpus is None else "the GPU facts'"
    notes = (f"{deployment_model.name}: {fit.evidence} ({where} GPUs; `kimi-deploy doctor` checks the real ones)",) \
        if fit.static else ()
    return ModelCheck(deployment_model.key, errors=errors,
                      warnings=tuple(parser_mismatches(deployment_model, s.tool_call_parser, s.reasoning_parser)),
                      notes=notes)


@dataclasses.dataclass(frozen=True)
class ProfileValidation:
    """:func:`validate_profile`'s result: the launch rendered for the detected version and its check.

    For a multi-node profile ``launch``/``validation`` are rank 0's and ``ranks`` holds every rank of the
    first replica (the other replicas' commands differ only in the ``--dist-init-addr`` host); ``ok`` needs
    every rank's command accepted.
    """

    info: target.TargetInfo
    launch: LaunchSpec
    validation: Validation
    ranks: tuple[RankValidation, ...] = ()
    model: ModelCheck = ModelCheck(None)
    deployment: Deployment | None = None
    #: The speculative and KV-cache guards (:mod:`kimi_deploy.catalog.spec_guard`): errors refuse like SGLang's.
    guard: spec_guard.Guard = spec_guard.Guard()

    @property
    def ok(self) -> bool:
        return (self.validation.ok and all(r.validation.ok for r in self.ranks) and not self.model.errors
                and not self.guard.errors)

    @property
    def problems(self) -> list[str]:
        """Every reason ``ok`` is false, one line each: SGLang's errors (each rank's, labelled, for a
        multi-node replica), then the model table's (``model: ...``). Empty when ``ok``; a caller that
        reports a failure shows these, never a bare "FAILED"."""
        out = []
        if self.ranks:
            for r in self.ranks:
                out += [f"rank {r.rank.rank} ({r.rank.node}): {e}" for e in r.validation.errors]
                if not r.validation.ok and not r.validation.errors:
                    out.append(f"rank {r.rank.rank} ({r.rank.node}): SGLang rejects the command")
        else:
            out += list(self.validation.errors)
            if not self.validation.ok and not self.validation.errors:
                out.append("SGLang rejects the rendered command")
        out += [f"{'gateway' if e.startswith('gateway.') else 'model'}: {e}" for e in self.model.errors]
        out += [f"speculative: {e}" for e in self.guard.errors]
        return out

    def to_dict(self) -> dict[str, Any]:
        data = self.validation.to_dict()
        data["ok"] = self.ok
        data["problems"] = self.problems
        data["model"] = self.model.to_dict()
        data["guards"] = {"errors": list(self.guard.errors), "warnings": list(self.guard.warnings),
                          "draft_kind": self.guard.draft_kind}
        data["sglang_location"] = self.info.sglang_location
        data["render_warnings"] = list(self.launch.warnings)
        if self.ranks:
            data["ranks"] = [r.to_dict() for r in self.ranks]
        return data


def validate_profile(profile: Profile, python: str | Path | None = None, *, gpus: Any = None,
                     phase: Callable[[str], None] | None = None) -> ProfileValidation:
    """Resolve ``profile`` for the SGLang version found in ``python`` (:func:`kimi_deploy.deployment.resolve`) and
    validate its commands there (each rank's of a multi-node replica's first copy separately).

    Args:
        profile: a validated profile.
        python: SGLang's interpreter (default ``[service] python``).
        gpus: the host's GPUs the fit rule reads (:class:`kimi_deploy.sizing.memory.GpuFacts`; default the
            reference host's).
        phase: called with the words of each step as it starts (``validate``'s and ``doctor``'s progress).

    A model that cannot fit is refused first, by the model table's rule, before the interpreter is asked
    (:func:`kimi_deploy.deployment.require_fit`); the parsers are checked with it (:func:`check_model`), and the
    speculative and KV-cache guards (:func:`kimi_deploy.catalog.spec_guard.problems`, on the draft's ``config.json``
    when it is a directory here, for the reference GPU): ``ok`` needs the algorithm to match the draft.

    Raises:
        RefusedError: the model cannot fit (exit 4), with the numbers.
        UsageError: interpreter missing, SGLang not installed there, or a version kimi-deploy
            does not know (0.5.x only).
        UnsupportedVersionError: the profile asks for a feature that version lacks.
        ExternalCommandError: the target interpreter failed.
    """
    say = phase or (lambda _text: None)
    python = str(python or profile.service.python)
    require_fit(profile, gpus)
    model = check_model(profile, gpus)
    guard = spec_guard.problems(profile, spec_guard.read_draft_config(profile.sglang.speculative_draft_model_path),
                                REFERENCE_GPU.name)
    say(f"reading SGLang's interpreter {python} (its SGLang version and components)")
    info = target.probe(python)
    version, _ = target.require_sglang(info)
    deployment = resolve(profile, version, components=info.components(), gpus=gpus)
    checked: list[RankValidation] = []
    for entry in deployment.ranks:
        if entry.rank is None or entry.rank.replica != 0:
            continue
        say(f"parsing rank {entry.rank.rank}'s command ({entry.rank.node}) with SGLang {version}'s own parser")
        checked.append(RankValidation(entry.rank, entry.launch, validate_server_args(
            python, entry.launch.server_args, secrets_config=entry.launch.secrets_config,
            env=check_env(entry.launch), sglang_version=version)))
    if checked:
        return ProfileValidation(info=info, launch=checked[0].launch, validation=checked[0].validation,
                                 ranks=tuple(checked), model=model, deployment=deployment, guard=guard)
    launch = deployment.launch
    say(f"parsing the launch command with SGLang {version}'s own parser")
    result = validate_server_args(python, launch.server_args, secrets_config=launch.secrets_config,
                                  env=check_env(launch), sglang_version=version)
    return ProfileValidation(info=info, launch=launch, validation=result, model=model, deployment=deployment,
                             guard=guard)


# --- the gateway (smg) -----------------------------------------------------------------------------------

#: An option string in an argparse ``--help`` listing: two spaces, then ``--name`` (``, --alias`` ...).
_HELP_OPTION = re.compile(r"^ {2}(-{1,2}[A-Za-z0-9][\w.-]*(?:[ =][^,\s]+)*(?:, -{1,2}[A-Za-z0-9][\w.-]*"
                          r"(?:[ =][^,\s]+)*)*)")


def parse_help_options(text: str) -> frozenset[str]:
    """Every option string (``--name`` and its aliases) in an argparse ``--help`` listing.

    Source: ``smg launch --help`` of smg 1.13.0 (argparse: options start two spaces in, aliases are
    separated by ``, ``; tests/data/smg-1.13.0-launch-help.txt).
    """
    found: set[str] = set()
    for line in text.splitlines():
        match = _HELP_OPTION.match(line)
        if not match:
            continue
        for part in match.group(1).split(", "):
            found.add(part.split(" ", 1)[0].split("=", 1)[0])
    return frozenset(found)


def smg_help(smg: str, *, timeout: float = 60.0) -> str:
    """The text of ``SMG launch --help`` (the pinned smg's own list of options).

    Raises:
        ExternalCommandError: smg is missing or failed (exit 5).
    """
    done = proc.run([smg, "launch", "--help"], check=True, timeout=timeout)
    return done.stdout


def flag_problems(args: Sequence[str], known: frozenset[str]) -> list[str]:
    """One line per option of ``args`` that the pinned smg does not have under exactly that name.

    argparse would accept an abbreviation (``--polic``) or read a misspelt option as an error only at
    start-up; the kit's own arguments must be exact names (``gateway.policy`` is also checked against the
    ``--policy`` choices by smg itself at start).
    """
    problems = []
    for arg in args:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            if name not in known:
                problems.append(f"{name}: not an option of this smg (its `launch --help` lists no such name)")
    return problems


def policy_choices(text: str) -> tuple[str, ...]:
    """The ``--policy`` choices in ``smg launch --help`` text (``()`` when the listing shows none)."""
    return option_choices(text, "--policy")


def option_choices(text: str, flag: str) -> tuple[str, ...]:
    """The ``{a,b,...}`` choices of ``flag`` where its own help entry (two spaces in) lists them in ``smg launch
    --help`` text (``()`` when it shows none). Names as smg 1.13.0 spells them: ``deepseek_v4.1`` has a dot."""
    match = re.search(rf"^ {{2}}{re.escape(flag)} \{{([a-z0-9_.,]+)\}}", text, flags=re.M)
    return tuple(match.group(1).split(",")) if match else ()


def validate_gateway(profile: Profile, help_text: str) -> list[str]:
    """Problems of the profile's gateway command against one smg's ``launch --help`` text (empty: valid): every
    option an exact name, the policy and the parsers among this smg's choices, and the parsers smg's names for
    the profile's model (:func:`kimi_deploy.catalog.gateway_parsers.mismatches`)."""
    gw = profile.gateway
    args = gateway_args(profile)
    problems = flag_problems(args, parse_help_options(help_text))
    for key, flag, value, what in (("policy", "--policy", gw.policy, "policies"),
                                   ("reasoning_parser", "--reasoning-parser", gw.reasoning_parser, "reasoning parsers"),
                                   ("tool_call_parser", "--tool-call-parser", gw.tool_call_parser, "tool-call parsers")):
        choices = option_choices(help_text, flag)
        if value is not None and choices and value not in choices:
            problems.append(f"gateway.{key}: {value!r} is not one of this smg's {what} ({', '.join(choices)})")
    problems += gateway_model_problems(profile)
    return problems


def gateway_model_problems(profile: Profile) -> list[str]:
    """``[gateway]`` parsers that do not match the profile's model (smg's names; empty without ``[gateway]``, or
    for a model the kit's table does not know)."""
    if profile.gateway is None:
        return []
    s = profile.sglang
    return gateway_parsers.mismatches(identify(s.model_path, s.served_model_name), profile.gateway.reasoning_parser,
                                      profile.gateway.tool_call_parser)


@dataclasses.dataclass(frozen=True)
class GatewayValidation:
    """``validate --gateway``: the smg checked, its ``--version`` line, and the problems (empty: valid)."""

    smg: str
    version: str
    errors: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"smg": self.smg, "version": self.version, "ok": self.ok, "errors": list(self.errors)}


def validate_smg(profile: Profile, smg: str | None = None) -> GatewayValidation:
    """Check the profile's gateway command against the smg at ``smg`` (default ``[gateway] smg``): its
    ``--version`` is the pinned ``[gateway] version``, and every option is an exact name of its
    ``launch --help`` and the policy one of its choices (:func:`validate_gateway`).

    Raises:
        UsageError: no ``[gateway]``. ExternalCommandError: smg missing or failing (exit 5).
    """
    if profile.gateway is None:
        raise UsageError("the profile has no [gateway]", hint="add a [gateway] table (docs/runbook.md#replicas-behind-a-gateway)")

    smg = smg or profile.gateway.smg
    try:
        version = proc.run([smg, "--version"], check=True, timeout=60).stdout.strip().splitlines()[:1]
        help_text = smg_help(smg)
    except ExternalCommandError as exc:
        exc.hint = exc.hint or (f"[gateway] smg must be the pinned smg: python3 -m venv {Path(smg).parent.parent} && "
                                f"{Path(smg).parent}/pip install smg=={profile.gateway.version}")
        raise
    line = version[0] if version else ""
    errors = []
    if not re.search(rf"(?<![\d.]){re.escape(profile.gateway.version)}(?![\d.])", line):
        errors.append(f"gateway.version: the profile pins smg {profile.gateway.version}, but {smg} is {line!r}; "
                      f"install smg=={profile.gateway.version} into its virtual environment or change the pin")
    errors += validate_gateway(profile, help_text)
    return GatewayValidation(smg=smg, version=line, errors=tuple(errors))
