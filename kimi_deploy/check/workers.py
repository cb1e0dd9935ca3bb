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
from kimi_deploy.errors import ExitCode

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
    from kimi_deploy.check import run_checks
    from kimi_deploy.check.runner import _resolve_profile, guard_key
    from kimi_deploy.errors import UsageError
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
