"""``[service]``: the systemd unit, its user, the interpreter, host facts.

Part of :mod:`kimi_deploy.profile` (its ``__init__`` exports the public names).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from kimi_deploy.profile.base import MAX_SPAN_SEC, Section, UINT_MAX
from kimi_deploy.errors import UsageError
from kimi_deploy.values import check_abs_path, check_unit_stem


POSIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


#: Characters of a systemd calendar spec (man systemd.time), no leading/trailing space.
CALENDAR = re.compile(r"[A-Za-z0-9*:,./~-](?:[A-Za-z0-9*:,./~ -]*[A-Za-z0-9*:,./~-])?")


def check_service_name(v: str) -> str:
    """``v`` when it is a valid ``[service] name``, else ValueError (:func:`kimi_deploy.values.check_unit_stem`)."""
    return check_unit_stem(v)


class Service(Section):
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
    start_limit_burst: int = Field(3, ge=1, le=UINT_MAX, description="StartLimitBurst= within StartLimitIntervalSec=")
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
        if not POSIX_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid user/group name (lower case, digits, _ and -)")
        if v == "root":
            raise ValueError("the server must not run as root; use a dedicated system user such as sglang")
        return v

    @field_validator("python", "kimi_deploy", "cache_dir")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_abs_path(v)

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if any(c in v for c in "%$\\\"'"):
            raise ValueError(f"description {v!r} must not contain % $ \\ or quotes (systemd would expand them)")
        if not v.strip() or v != v.strip():
            raise ValueError(f"description {v!r} must be non-empty without leading or trailing spaces "
                             "(systemd strips them)")
        return v

    @field_validator("check_on_calendar")
    @classmethod
    def _calendar(cls, v: str) -> str:
        if not CALENDAR.fullmatch(v):
            raise ValueError(f"OnCalendar value {v!r} has characters systemd calendar specs do not use "
                             "(or leading/trailing spaces)")
        return v


def valid_service_name(name: str, option: str = "--name", *, installed: bool = True) -> str:
    """``name`` when it is a valid service name (the profile's ``[service] name`` rule,
    :func:`kimi_deploy.profile.check_service_name`), so it can name files under ``/etc/kimi-deploy``.
    ``installed``: the name picks an installed service (the fix lists them), else it names a new one (``init``).

    Raises:
        UsageError: not a valid name (``../x``, ``a/b``, ``x.service``); exit 2.
    """
    try:
        return check_service_name(name)
    except ValueError as exc:
        hint = (f"give {option} the [service] name of an installed profile (letters, digits and _.:-, no '/'); "
                "`ls /etc/kimi-deploy/*.manifest.json` lists them") if installed else \
            f"give {option} a new service name of letters, digits and _.:- (e.g. kimi-two)"
        raise UsageError(f"{option}: not a service name: {exc}", value=name, hint=hint) from None
