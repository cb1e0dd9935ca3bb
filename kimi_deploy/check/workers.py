"""``check --each-worker``: the selected checks against every worker SGLang's gateway lists, one report each.

Through the gateway a bad replica hides behind retries (smg sends a failed request to another worker); run
against each worker URL directly, it cannot. The worker list is the gateway's own (``GET /workers``,
:class:`kimi_deploy.host.gateway.Gateway`, asked by the CLI), so a worker the profile no longer names but the gateway still routes to
is checked too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kimi_deploy.check.results import CheckOptions, CheckReport
from kimi_deploy.errors import ExitCode, UsageError
from kimi_deploy.wire.apikey import resolve_key
from kimi_deploy.check.runner import _resolve_profile, guard_key, run_checks

#: ``schema`` of the JSON document :meth:`FleetReport.to_json` returns.
SCHEMA = "kimi-deploy.check-workers/1"
#: Checks run on each worker when ``--only`` is not given: the health tier, then the API contract.
DEFAULT_ONLY = ("health.*", "contract.*")


@dataclasses.dataclass
class FleetReport:
    """One :class:`CheckReport` per worker URL the gateway at ``gateway`` listed, in its order."""

    gateway: str
    reports: list[tuple[str, CheckReport]]

    @property
    def exit_code(self) -> ExitCode:
        """The worst worker's: interrupted, else unreachable (3), else failed (1), else 0; no worker: failed."""
        codes = [report.exit_code for _, report in self.reports]
        if not codes:
            return ExitCode.FAILED
        for worst in (ExitCode.INTERRUPTED, ExitCode.UNREACHABLE, ExitCode.FAILED):
            if worst in codes:
                return worst
        return max(codes)

    def to_json(self) -> dict[str, Any]:
        """``{"schema", "gateway", "exit_code", "workers": [{"url", "exit_code", "checks", "failed", "report"}]}``;
        ``report`` is that worker's kimi-deploy.check/1 document, ``failed`` its failed check ids."""
        return {"schema": SCHEMA, "gateway": self.gateway, "exit_code": int(self.exit_code),
                "workers": [{"url": url, "exit_code": int(report.exit_code), "checks": len(report.results),
                             "failed": [r.id for r in report.results if r.status == "fail"],
                             "report": report.to_json()} for url, report in self.reports]}


def check_each_worker(options: CheckOptions, gateway_url: str, urls: Sequence[str], progress=None) -> FleetReport:
    """Run :func:`kimi_deploy.check.run_checks` with ``options`` against each worker URL the gateway at
    ``gateway_url`` listed (``urls``: the caller asks the gateway, :meth:`kimi_deploy.host.gateway.Gateway.workers`,
    so that check code needs no host-side client).

    ``options.base_url`` is replaced by each worker's URL; without ``options.only`` :data:`DEFAULT_ONLY` runs.

    Workers ``options.profile`` (a loaded profile) declares in ``[fleet]`` get the key over plain http as the
    gateway does; a listed worker it does not declare is refused before any worker is checked, unless
    ``options.insecure``.

    Raises:
        UsageError: a listed worker the profile does not name would get the key over plain http from another
            host (:func:`kimi_deploy.check.runner.guard_key`; exit 2, before any worker is asked).
    """
    profile = _resolve_profile(options.profile)[0]
    for url in urls:  # every worker before the first request: a refused one must not cut the run short
        try:
            guard_key(url, options.api_key, profile, insecure=options.insecure, note=False)
        except UsageError:
            raise UsageError(f"the gateway lists {url}, which is not in the profile's [fleet] replicas: refusing "
                             "to send it the API key in clear text over plain http", value=url,
                             hint="remove it from the gateway (DELETE /workers/ID) or list it in [fleet] replicas; "
                                  "--insecure sends the key anyway") from None
    only = tuple(options.only) or DEFAULT_ONLY
    reports = [(url, run_checks(dataclasses.replace(options, base_url=url, only=only), progress)) for url in urls]
    return FleetReport(gateway=gateway_url, reports=reports)


def gateway_options(options: CheckOptions) -> tuple[CheckOptions, str | None]:
    """``(options for each worker, the gateway's URL)`` of a ``check --each-worker`` run: ``options.profile``
    loaded (a path becomes its :class:`kimi_deploy.profile.Profile`), the gateway ``options.base_url`` or the
    profile's ``[gateway]`` (:attr:`~kimi_deploy.profile.Profile.gateway_url`), the key ``options.api_key`` or the
    profile's (:func:`kimi_deploy.wire.apikey.resolve_key`); the options' ``base_url`` is cleared (each worker's
    replaces it).

    Raises:
        ProfileError: an invalid profile. UsageError: no ``[gateway]`` and no URL; an unreadable key file (exit 2).
    """
    base_url, api_key, profile = options.base_url, options.api_key, None
    if options.profile:
        profile = _resolve_profile(options.profile)[0]
        if base_url is None:
            base_url = profile.gateway_url
        if api_key is None:
            api_key = resolve_key(profile_key_file=profile.sglang.api_key_file)
    return dataclasses.replace(options, base_url=None, api_key=api_key, profile=profile), base_url
