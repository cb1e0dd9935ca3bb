"""Run the selected checks against one server and collect a :class:`CheckReport`."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

import httpx

from kimi_deploy.check import contract, health, registry
from kimi_deploy.check.client import Clients, transport_finding
from kimi_deploy.check.context import Context
from kimi_deploy.check.results import CheckOptions, CheckReport, CheckResult
from kimi_deploy.check.validate import Finding, first
from kimi_deploy.errors import UsageError
from kimi_deploy.profile import Profile, load_profile


def _resolve_profile(value: object) -> tuple[Profile | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, Profile):
        return value, None
    path = Path(value)  # type: ignore[arg-type]
    return load_profile(path), str(path)


def read_api_key(path: str | Path) -> str:
    """The key in ``path`` (surrounding whitespace removed).

    Raises:
        UsageError: unreadable or empty (exit 2).
    """
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"cannot read the API key file: {exc.strerror}", value=str(path),
                         hint="pass --api-key-file with a file this user can read (the nightly unit passes "
                              "its systemd credential)") from None
    if not key:
        raise UsageError("the API key file is empty", value=str(path), hint="write the key into the file")
    return key


def _result(check_id: str, status: str, findings: list[Finding], detail: str, started: float) -> CheckResult:
    top = first(findings)
    duration = time.monotonic() - started
    if top is None:
        return CheckResult(check_id, status, None, detail, "", duration)  # type: ignore[arg-type]
    others = sorted({f.kind for f in findings} - {top.kind})
    text = top.detail + (f" (also: {', '.join(others)})" if others else "")
    return CheckResult(check_id, status, top.kind, text, top.evidence, duration)  # type: ignore[arg-type]


def run_checks(options: CheckOptions) -> CheckReport:
    """Run the checks ``options`` select against one OpenAI-compatible server.

    Order: ``health.*``, ``config.*``, ``contract.*`` (see :mod:`kimi_deploy.check.registry`).
    When the server does not answer at all, every selected check is ``fail``/``unreachable``
    and :attr:`CheckReport.exit_code` is UNREACHABLE (3).

    Raises:
        UsageError / ProfileError: no base URL, a bad profile, an unreadable key file,
            an ``only``/``skip`` glob that matches nothing (exit 2).
    """
    profile, profile_path = _resolve_profile(options.profile)
    base_url = options.base_url or (profile.base_url if profile else None)
    if not base_url:
        raise UsageError("no server to check", hint="pass --base-url http://HOST:PORT or --profile FILE")
    if not base_url.startswith(("http://", "https://")):
        raise UsageError("the base URL must start with http:// or https://", value=base_url,
                         hint="e.g. --base-url http://127.0.0.1:30000")
    api_key = options.api_key
    if api_key is None and profile is not None and profile.sglang.api_key_file:
        api_key = read_api_key(profile.sglang.api_key_file)
    ids = registry.select(options.only, options.skip)
    expected = options.model or (profile.sglang.served_model_name or profile.sglang.model_path if profile else None)
    report = CheckReport(base_url=base_url, model=expected, started_at=_dt.datetime.now(_dt.timezone.utc),
                         profile=profile_path)
    t0 = time.monotonic()
    clients = Clients.open(base_url, api_key, options.timeout)
    try:
        ctx = Context(clients=clients, profile=profile, model=expected, expected_model=expected,
                      repeat=options.repeat)
        try:
            clients.http.get("/v1/models")
        except httpx.TransportError as exc:
            finding = transport_finding(exc, f"connect to {clients.root}")
            if finding.kind == "unreachable":
                now = time.monotonic()
                report.results = [_result(i, "fail", [finding], "", now) for i in ids]
                report.duration_s = time.monotonic() - t0
                return report
        ctx.load_facts()
        report.server = {k: v for k, v in {
            "version": (ctx.server_info or {}).get("version"),
            "tool_call_parser": ctx.server_value("tool_call_parser"),
            "reasoning_parser": ctx.server_value("reasoning_parser"),
            "served_model_name": ctx.server_value("served_model_name"),
        }.items() if v is not None}
        if ctx.model is None and any(registry.tier(i) == "contract" for i in ids):
            ctx.model = _first_served_model(clients)
            report.model = ctx.model
        cache: dict = {}
        for check_id in ids:
            started = time.monotonic()
            if check_id in health.CHECKS:
                status, detail, findings = health.CHECKS[check_id](ctx)
            elif ctx.model is None:
                status, detail, findings = "skip", "no model name: give --model, or the server lists none", []
            else:
                status, findings, detail = contract.run(ctx, check_id, cache)
            report.results.append(_result(check_id, status, findings, detail, started))
    finally:
        clients.close()
    report.duration_s = time.monotonic() - t0
    return report


def _first_served_model(clients: Clients) -> str | None:
    try:
        status, body = clients.get_json("/v1/models")
    except httpx.TransportError:
        return None
    if status == 200 and isinstance(body, dict):
        for item in body.get("data") or []:
            if isinstance(item, dict) and item.get("id"):
                return str(item["id"])
    return None
