"""The deployment profile: one pydantic model, loaded from TOML, with fix-it errors.

Field names are SGLang's own option names (``tp_size`` is ``--tp-size``,
``speculative_eagle_topk`` is ``--speculative-eagle-topk``; SGLang 0.5.23
``sglang/srt/server_args.py``) and systemd's directive names in snake case
(``timeout_start_sec`` is ``TimeoutStartSec=``). Unknown keys are errors with a
did-you-mean; cross-field rules live in :func:`check_rules`.

Layout of a profile file::

    [service]      # the systemd unit and host facts
    [sglang]       # SGLang server arguments
    [environment]  # extra environment (NCCL_*, ...), written to the EnvironmentFile
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import ipaddress
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kimi_deploy.errors import ProfileError

#: Characters a value may use so that it survives systemd's ExecStart= and
#: EnvironmentFile= parsing and a POSIX shell unquoted: anything else would need
#: quoting, and kimi-deploy does not render quoted values (a reviewer must be able
#: to paste the command as shown). ``%`` (systemd specifiers) and ``$`` (variable
#: expansion) are excluded on purpose.
SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


def check_service_name(v: str) -> str:
    """``v`` when it is a valid ``[service] name`` (a systemd unit name stem, :data:`UNIT_NAME`), else ValueError.

    The one rule for service names: the profile validator and every ``--name`` option use it
    (a name is also a file name under ``/etc/kimi-deploy``, so no ``/`` and no ``..`` alone).
    """
    if not UNIT_NAME.match(v) or v.endswith((".service", ".timer")) or v in (".", ".."):
        raise ValueError(f"unit name {v!r} must be letters, digits and _.:- without a .service suffix")
    if v == "kimi-deploy-check":
        raise ValueError("the name kimi-deploy-check is taken by the nightly check unit")
    return v
POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _safe(value: str, what: str = "value") -> str:
    if not SAFE_TOKEN.match(value):
        bad = sorted({c for c in value if not SAFE_TOKEN.match(c)})
        raise ValueError(
            f"{what} {value!r} would need shell quoting (characters {''.join(bad)!r}); "
            "use only letters, digits and _@+=:,./-"
        )
    return value


def _absolute(value: str) -> str:
    _safe(value, "path")
    if not value.startswith("/"):
        raise ValueError(f"path {value!r} is relative; systemd runs units from /, give an absolute path")
    return value


#: Upper bound of every time span in ``[service]`` (seconds): one week. systemd stores spans in
#: microseconds and silently falls back to its default on a value it cannot parse (e.g. 10^14 s is
#: "Numerical result out of range"), and TimeoutStartSec= falling back to 90 s kills every cold start.
MAX_SPAN_SEC = 7 * 24 * 3600


class _Section(BaseModel):
    # strict: TOML has real types, so `tp_size = "8"` is a mistake to report, not to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)


class Service(_Section):
    """``[service]``: the systemd unit, its user, the interpreter, host facts."""

    name: str = Field("sglang", description="unit name: <name>.service and <name>.env")
    description: str = Field("SGLang server", description="Description= of the unit")
    user: str = Field("sglang", description="User= the server runs as (a dedicated system user)")
    group: str = Field("sglang", description="Group= of the server")
    python: str = Field("/opt/sglang/.venv/bin/python", description="the interpreter SGLang is installed in")
    kimi_deploy: str = Field("/usr/local/bin/kimi-deploy", description="the kimi-deploy executable units call")
    gpu_count: int = Field(8, ge=1, le=64, description="GPUs on the host that the server may use")
    hardening: Literal["standard", "strict"] = Field("standard", description="sandboxing level of the unit")
    timeout_start_sec: int = Field(1200, ge=60, le=MAX_SPAN_SEC, description="TimeoutStartSec=, seconds; above the cold start")
    timeout_stop_sec: int = Field(120, ge=5, le=MAX_SPAN_SEC, description="TimeoutStopSec=, seconds")
    restart_sec: int = Field(30, ge=1, le=MAX_SPAN_SEC, description="RestartSec=, seconds between restarts")
    start_limit_burst: int = Field(3, ge=1, description="StartLimitBurst= within StartLimitIntervalSec=")
    start_limit_interval_sec: int = Field(7200, ge=60, le=MAX_SPAN_SEC, description="StartLimitIntervalSec=, seconds")
    limit_nofile: int = Field(1048576, ge=1024, le=1073741816, description="LimitNOFILE=")
    cache_dir: str | None = Field(None, description="persistent cache root (default /var/cache/<name>)")
    verify_patches: bool = Field(True, description="ExecStartPre= kimi-deploy patch verify")
    check_on_calendar: str = Field("*-*-* 03:00:00", description="OnCalendar= of the nightly check timer")

    @field_validator("name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        return check_service_name(v)

    @field_validator("user", "group")
    @classmethod
    def _posix(cls, v: str) -> str:
        if not POSIX_NAME.match(v):
            raise ValueError(f"{v!r} is not a valid user/group name (lower case, digits, _ and -)")
        if v == "root":
            raise ValueError("the server must not run as root; use a dedicated system user such as sglang")
        return v

    @field_validator("python", "kimi_deploy", "cache_dir")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else _absolute(v)

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if any(c in v for c in "%$\\\n\"'"):
            raise ValueError(f"description {v!r} must not contain % $ \\ quotes or newlines")
        return v

    @field_validator("check_on_calendar")
    @classmethod
    def _calendar(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9*:,./~ -]+$", v):
            raise ValueError(f"OnCalendar value {v!r} has characters systemd calendar specs do not use")
        return v


class SGLang(_Section):
    """``[sglang]``: SGLang server arguments under their own names (SGLang 0.5.23)."""

    model_path: str = Field(description="--model-path: local directory of the weights")
    served_model_name: str | None = Field(None, description="--served-model-name")
    host: str = Field("127.0.0.1", description="--host (SGLang's default is 127.0.0.1)")
    port: int = Field(30000, ge=1, le=65535, description="--port")
    tp_size: int = Field(1, ge=1, description="--tp-size")
    context_length: int | None = Field(None, ge=1, description="--context-length")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="--mem-fraction-static")
    max_running_requests: int | None = Field(None, ge=1, description="--max-running-requests")
    chunked_prefill_size: int | None = Field(None, description="--chunked-prefill-size")
    attention_backend: str | None = Field(None, description="--attention-backend")
    trust_remote_code: bool = Field(False, description="--trust-remote-code")
    tool_call_parser: str | None = Field(None, description="--tool-call-parser (kimi_k2 for Kimi)")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser (kimi_k2 for Kimi)")
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None = Field(
        None, description="--speculative-algorithm")
    speculative_draft_model_path: str | None = Field(None, description="--speculative-draft-model-path")
    speculative_num_steps: int | None = Field(None, ge=1, description="--speculative-num-steps")
    speculative_eagle_topk: int | None = Field(None, ge=1, description="--speculative-eagle-topk")
    speculative_num_draft_tokens: int | None = Field(None, ge=1, description="--speculative-num-draft-tokens")
    enable_spec_v2: bool | None = Field(
        None, description="spec v2 (overlap scheduling with EAGLE): env SGLANG_ENABLE_SPEC_V2 in 0.5.5-0.5.13, "
        "always on from 0.5.14")
    disable_overlap_schedule: bool = Field(False, description="--disable-overlap-schedule")
    flashinfer_allreduce_fusion_backend: Literal["auto", "trtllm", "mnnvl", "cutedsl"] | None = Field(
        None, description="--flashinfer-allreduce-fusion-backend (0.5.14+; --enable-flashinfer-allreduce-fusion before)")
    enforce_disable_flashinfer_allreduce_fusion: bool = Field(
        False, description="--enforce-disable-flashinfer-allreduce-fusion (0.5.10+)")
    enable_symm_mem: bool = Field(False, description="--enable-symm-mem (NCCL symmetric memory)")
    enable_torch_symm_mem: bool = Field(False, description="--enable-torch-symm-mem (0.5.3+)")
    enable_pcie_ipc_allreduce: bool = Field(
        False, description="env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (0.5.21+, world size 2/4/8)")
    api_key_file: str | None = Field(None, description="file holding the API key (--api-key, via a credential)")
    allow_unauthenticated: bool = Field(False, description="allow a non-loopback host without an API key")
    extra_args: list[str] = Field(default_factory=list, description="more SGLang arguments, verbatim")

    @field_validator("model_path", "speculative_draft_model_path", "api_key_file")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else _absolute(v)

    @field_validator("served_model_name", "attention_backend", "tool_call_parser", "reasoning_parser")
    @classmethod
    def _tokens(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$", v):
                raise ValueError(f"host {v!r} is neither an IP address nor a host name") from None
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for item in v:
            _safe(item, "extra argument")
        return v


class Profile(BaseModel):
    """A whole deployment profile: ``[service]``, ``[sglang]``, ``[environment]``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    service: Service = Field(default_factory=Service)
    sglang: SGLang
    environment: dict[str, str] = Field(default_factory=dict)

    @field_validator("environment", mode="before")
    @classmethod
    def _env_numbers(cls, v: Any) -> Any:
        """``NCCL_IB_DISABLE = 1`` means the string "1": integers become strings, nothing else is coerced."""
        if isinstance(v, dict):
            return {k: str(x) if isinstance(x, int) and not isinstance(x, bool) else x for k, x in v.items()}
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_NAME.match(key):
                raise ValueError(f"environment variable name {key!r} is not valid (letters, digits, _)")
            _safe(str(value), f"value of {key}")
        return v

    @property
    def is_loopback(self) -> bool:
        """True when ``host`` only accepts local connections."""
        host = self.sglang.host
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def cache_root(self) -> str:
        """Persistent cache root on the host (``[service] cache_dir`` or ``/var/cache/<name>``)."""
        return self.service.cache_dir or f"/var/cache/{self.service.name}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` a local client uses (0.0.0.0/:: become loopback)."""
        host = self.sglang.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "[::1]"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.sglang.port}"

    def digest(self) -> str:
        """sha256 of the canonical JSON of the profile (values after defaults), hex, 64 chars."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


#: Environment variables kimi-deploy owns; setting them in ``[environment]`` is an
#: error that names the profile field to use instead.
RESERVED_ENV = {
    "SGLANG_ENABLE_SPEC_V2": "[sglang] enable_spec_v2",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "[sglang] enable_pcie_ipc_allreduce",
    "SGLANG_CACHE_DIR": "[service] cache_dir",
    "SGLANG_JIT_CACHE_DIR": "[service] cache_dir",
    "SGLANG_DG_CACHE_DIR": "[service] cache_dir",
    "TRITON_CACHE_DIR": "[service] cache_dir",
    "TORCHINDUCTOR_CACHE_DIR": "[service] cache_dir",
    "CUDA_CACHE_PATH": "[service] cache_dir",
    "TILELANG_CACHE_DIR": "[service] cache_dir",
    "FLASHINFER_WORKSPACE_BASE": "[service] cache_dir",
    "SGLANG_API_KEY": "[sglang] api_key_file",
}

_SECTIONS: dict[str, type[BaseModel]] = {"service": Service, "sglang": SGLang}


def check_rules(profile: Profile) -> list[str]:
    """Cross-field rules; returns one ``location: problem; fix`` line per violation (empty: valid).

    Rules (sources: SGLang 0.5.23 ``srt/arg_groups/speculative_hook.py`` and the
    deployment notes): TP divides the GPU count; steps/topk/draft tokens come as a
    set with an algorithm; EAGLE needs a draft model; topk 1 means draft tokens =
    steps + 1 (SGLang silently rewrites it otherwise); spec v2 needs topk 1; a
    non-loopback host needs an API key unless ``allow_unauthenticated``.
    """
    s, svc = profile.sglang, profile.service
    problems: list[str] = []
    if s.tp_size > svc.gpu_count or svc.gpu_count % s.tp_size:
        problems.append(
            f"sglang.tp_size: {s.tp_size} does not divide service.gpu_count = {svc.gpu_count}; "
            f"use a tp_size that divides {svc.gpu_count} (e.g. {svc.gpu_count}) or fix gpu_count")
    spec = {"speculative_num_steps": s.speculative_num_steps,
            "speculative_eagle_topk": s.speculative_eagle_topk,
            "speculative_num_draft_tokens": s.speculative_num_draft_tokens}
    given = [k for k, v in spec.items() if v is not None]
    if given and len(given) != 3:
        missing = sorted(set(spec) - set(given))
        problems.append(
            f"sglang.{given[0]}: speculative steps, topk and draft tokens must be set together "
            f"(SGLang picks all three or none); set {', '.join(missing)} too, or remove {', '.join(given)}")
    if given and s.speculative_algorithm is None:
        problems.append("sglang.speculative_algorithm: speculative settings are given but no algorithm; "
                        "set speculative_algorithm = \"EAGLE3\"")
    if s.speculative_algorithm in ("EAGLE", "EAGLE3") and not s.speculative_draft_model_path:
        problems.append(f"sglang.speculative_draft_model_path: {s.speculative_algorithm} needs a draft model; "
                        "set the path of e.g. lightseekorg/kimi-k2.5-eagle3-mla")
    if (len(given) == 3 and s.speculative_eagle_topk == 1
            and s.speculative_num_draft_tokens != s.speculative_num_steps + 1):
        problems.append(
            f"sglang.speculative_num_draft_tokens: {s.speculative_num_draft_tokens} with topk 1 and "
            f"{s.speculative_num_steps} steps; SGLang would silently use steps + 1 = "
            f"{s.speculative_num_steps + 1}; set speculative_num_draft_tokens = {s.speculative_num_steps + 1}")
    if s.enable_spec_v2 and s.speculative_eagle_topk not in (None, 1):
        problems.append(
            f"sglang.enable_spec_v2: spec v2 (overlap scheduling) supports only speculative_eagle_topk = 1, "
            f"got {s.speculative_eagle_topk}; set speculative_eagle_topk = 1 or enable_spec_v2 = false")
    if s.enable_spec_v2 and s.disable_overlap_schedule:
        problems.append("sglang.enable_spec_v2: spec v2 is overlap scheduling, but disable_overlap_schedule = true; "
                        "drop one of the two")
    if s.enable_spec_v2 and s.speculative_algorithm is None:
        problems.append("sglang.enable_spec_v2: spec v2 applies to speculative decoding, but no "
                        "speculative_algorithm is set; set one or remove enable_spec_v2")
    if s.flashinfer_allreduce_fusion_backend and s.enforce_disable_flashinfer_allreduce_fusion:
        problems.append("sglang.flashinfer_allreduce_fusion_backend: set together with "
                        "enforce_disable_flashinfer_allreduce_fusion = true; keep one")
    if not profile.is_loopback and not s.api_key_file and not s.allow_unauthenticated:
        problems.append(
            f"sglang.host: {s.host} accepts connections from other machines but no api_key_file is set; "
            "set api_key_file = \"/etc/kimi-deploy/<name>.api-key\", bind host = \"127.0.0.1\", "
            "or set allow_unauthenticated = true")
    for key in profile.environment:
        if key in RESERVED_ENV:
            problems.append(f"environment.{key}: kimi-deploy sets this variable itself; use {RESERVED_ENV[key]}")
    for arg in s.extra_args:
        if arg in ("--api-key", "--admin-api-key") or arg.startswith(("--api-key=", "--admin-api-key=")):
            problems.append("sglang.extra_args: an API key on the command line is visible in ps and logs; "
                            "use api_key_file")
    return problems


def default_api_key_file(service_name: str) -> str:
    """The API key file a profile for ``service_name`` starts from: ``/etc/kimi-deploy/<name>.api-key``
    (``kimi-deploy init --name``; the warning of :func:`naming_warnings`)."""
    return f"/etc/kimi-deploy/{service_name}.api-key"


def naming_warnings(profile: "Profile") -> list[str]:
    """Warnings (not errors) for paths named after another service: ``api_key_file`` of the form
    ``/etc/kimi-deploy/<other>.api-key`` where ``<other>`` is not ``[service] name`` (a profile from
    ``init`` whose service was renamed; install would create a key file named after another service).
    Sharing one key file between services on purpose is allowed, hence a warning."""
    key = profile.sglang.api_key_file
    name = profile.service.name
    if not key or not key.startswith("/etc/kimi-deploy/") or not key.endswith(".api-key"):
        return []
    other = key.removeprefix("/etc/kimi-deploy/").removesuffix(".api-key")
    if other == name or "/" in other:
        return []
    return [f"[sglang] api_key_file {key} is named after service {other!r}, not this service ({name!r}); "
            f"if the service was renamed, set api_key_file = \"{default_api_key_file(name)}\" (keep it only to share "
            "one key between services on purpose)"]


@functools.lru_cache(maxsize=64)
def calendar_problem(spec: str) -> str | None:
    """Why systemd would reject ``spec`` as ``OnCalendar=``, or None when it accepts it.

    Asks ``systemd-analyze calendar`` (the parser systemd itself uses) when it is on PATH;
    without it the spec is accepted here and ``systemd-analyze verify``/``install`` catch it.
    """
    from kimi_deploy import proc

    if proc.which("systemd-analyze") is None:
        return None
    done = proc.run(["systemd-analyze", "calendar", spec], check=False, timeout=30)
    if done.ok:
        return None
    reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["rejected"]
    return (f"systemd rejects {spec!r} ({reason[0]}); use a calendar spec such as \"*-*-* 03:00:00\" or \"daily\" "
            "(man systemd.time)")


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """A hint for an unknown key at ``loc``: close names in the same section or the section that has it."""
    key = str(loc[-1])
    if len(loc) == 1:
        sections = [*_SECTIONS, "environment"]
        close = difflib.get_close_matches(key, sections, n=1)
        if close:
            return f"did you mean [{close[0]}]?"
        for section, model in _SECTIONS.items():
            if key in model.model_fields:
                return f"{key} belongs in the [{section}] table"
        return f"tables are [{'], ['.join(sections)}]"
    section = str(loc[0])
    model = _SECTIONS.get(section)
    if model is None:
        return "remove it"
    close = difflib.get_close_matches(key, model.model_fields, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    for other, other_model in _SECTIONS.items():
        if other != section and key in other_model.model_fields:
            return f"{key} belongs in the [{other}] table"
    return f"valid keys of [{section}]: {', '.join(model.model_fields)}"


def _format_error(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "profile"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key ({_did_you_mean(loc)})"
    if err["type"] == "missing":
        return f"{where}: required, but missing"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] not in ("value_error",) and not isinstance(value, (dict, list)):
        return f"{where}: {msg} (got {value!r})"
    return f"{where}: {msg}"


def parse_profile(data: dict[str, Any], *, source: str = "profile") -> Profile:
    """Validate a profile given as a dict (the parsed TOML).

    Raises:
        ProfileError: one line per problem (pydantic's and :func:`check_rules`), exit 2.
    """
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e) for e in exc.errors(include_url=False)]
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the keys above; `kimi-deploy init` writes a commented example") from None
    problems = check_rules(profile)
    calendar = calendar_problem(profile.service.check_on_calendar)
    if calendar:
        problems.append(f"service.check_on_calendar: {calendar}")
    if problems:
        raise ProfileError(f"{source} is not a valid deployment profile", problems=problems,
                           hint="correct the settings above")
    return profile


def load_profile(path: Path) -> Profile:
    """Read and validate a TOML profile file.

    Raises:
        ProfileError: the file is missing, unreadable, not TOML, or not a valid profile (exit 2).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError("profile file not found", value=str(path),
                           hint="give the path of a TOML profile, or create one with `kimi-deploy init`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read the profile: {exc}", value=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path} is not valid TOML: {exc}", value=str(path),
                           hint="fix the TOML syntax at the line and column shown") from None
    return parse_profile(data, source=str(path))


def toml_value(value: Any) -> str:
    """One value (str, bool, int, float, list) as TOML text, encoded by ``tomli_w``."""
    return tomli_w.dumps({"v": value}).removeprefix("v = ").rstrip("\n")


def dump_profile(profile: Profile) -> str:
    """The profile as canonical TOML: every value after defaults, unset (``None``) ones left out.

    Loading the text with :func:`parse_profile` gives a profile with the same :meth:`Profile.digest`.
    """
    data = profile.model_dump(mode="json")
    tables = {table: {k: v for k, v in data[table].items() if v is not None} for table in ("service", "sglang")}
    tables["environment"] = data["environment"]
    return tomli_w.dumps(tables)
