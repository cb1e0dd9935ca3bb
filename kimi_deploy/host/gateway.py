"""SGLang's gateway ``smg`` in front of the replicas: the client of its worker API (list, remove, add) for
``status`` and drain-and-restart. Its command line is :func:`kimi_deploy.launch.gateway_argv`; its flags are
checked against the pinned smg's own ``--help`` by :func:`kimi_deploy.validate.validate_smg`.

The gateway is PyPI ``smg`` (1.13.0 here; the successor of ``sglang-router`` 0.3.2): a Rust router inside a
Python wheel, started as ``smg launch ...``; ``smg.cli.main(argv)`` runs it in-process (smg 1.13.0
``smg/cli.py``). Facts measured against smg 1.13.0 on loopback (docs/design.md#the-gateway-unit and
docs/design.md#rolling-restarts-behind-the-gateway-measured):

- ``--api-key K``: requests without ``Authorization: Bearer K`` are answered 401 (``/v1/models`` and
  ``/health`` stay open), and the key is forwarded to the workers; smg has no file or environment variable
  for it, so the unit's launcher reads the systemd credential and hands the key to ``smg.cli.main`` inside
  the process: it never appears in argv (``/proc/PID/cmdline``), the environment or the unit.
- Worker API (the same key): ``GET /workers`` -> ``{"workers": [{"id", "url", "status", "is_healthy",
  ...}], "total", "stats"}``; ``DELETE /workers/{id}`` -> 202, the worker goes ``draining`` and then
  disappears; ``POST /workers {"url", "api_key"}`` -> 202, the worker goes ``pending`` and then ``ready``
  once smg has probed it (without ``api_key`` the probe of a keyed worker gets 401 and it never becomes
  ready); a URL that is still listed is 409.
- smg probes ``/get_server_info`` and ``/get_model_info`` on each worker and loads the tokenizer the worker
  reports unless ``--disable-tokenizer-autoload``; the gateway host holds no weights, so the unit passes it
  (HTTP workers tokenize themselves) and no model path is ever looked up on the Hugging Face hub.
"""

from __future__ import annotations


import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from kimi_deploy.errors import ExitCode, KimiDeployError, UnreachableError
from kimi_deploy.wire.http import control_client, request_capped
from kimi_deploy.deployment import Deployment
from kimi_deploy.wire.printable import printable
from kimi_deploy.wire.workers import Worker, parse_workers  # noqa: F401  (this module's API since before the move)
from kimi_deploy.redact import redact_text, url as redact_url

# --- the worker API -----------------------------------------------------------------------------------------


class GatewayError(KimiDeployError):
    """The gateway refused or failed a worker operation (exit 1: the tool worked, the operation did not)."""

    exit_code = ExitCode.FAILED


class DrainTimeout(GatewayError):
    """The gateway accepted the removal of a worker, but still lists it after the wait (in-flight requests keep it
    ``draining``): it is out of rotation (exit 9, :attr:`ExitCode.OUT_OF_ROTATION`)."""

    exit_code = ExitCode.OUT_OF_ROTATION


class Gateway:
    """A client of smg's worker API at ``base_url`` (``http://HOST:PORT``) with ``api_key`` (or None).

    ``sleep``/``monotonic`` are injected so tests drive the waits without the wall clock.
    """

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._client = control_client(base_url=self.base_url, api_key=api_key, timeout=timeout)
        self._sleep, self._monotonic = sleep, monotonic

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        """``(status, body)`` by :func:`kimi_deploy.wire.http.request_capped` (a capped, identity-only read)."""
        try:
            return request_capped(self._client, method, path, **kw)
        except httpx.HTTPError as exc:
            raise UnreachableError(f"the gateway at {self.base_url} did not answer: {exc}", value=self.base_url,
                                   hint="is the gateway unit (<service>-gateway.service) running on the gateway "
                                        "host, and [gateway] host/port right?") from None

    def workers(self) -> list[Worker]:
        """``GET /workers``.

        Raises:
            UnreachableError: no answer (exit 3). GatewayError: a non-200 answer (401: wrong key), or an answer
                that is not smg's ``{"workers": [{...}, ...]}`` (a worker, or another server, at that address).
        """
        status, body = self._call("GET", "/workers")
        not_smg = (f"is {self.base_url} SGLang's gateway (smg)? a worker or another server has no worker list: "
                   "give the gateway's address (the profile's [gateway] bind/port)")
        if status != 200:
            raise GatewayError(f"the gateway answered GET /workers with {status}", value=_shown(body),
                               hint="give the profile's API key (the gateway uses the workers' key)"
                                    if status in (401, 403) else not_smg)
        try:
            return parse_workers(body)
        except ValueError as exc:
            raise GatewayError(f"the gateway's GET /workers answer is not smg's worker list: {exc}",
                               value=_shown(body), hint=not_smg) from None

    def find(self, url: str) -> Worker | None:
        """The listed worker whose URL is ``url`` (trailing ``/`` ignored), or None."""
        url = url.rstrip("/")
        return next((w for w in self.workers() if w.url.rstrip("/") == url), None)

    def remove(self, url: str, *, timeout: float = 300.0, poll: float = 0.5) -> bool:
        """Take ``url`` out of rotation and wait until the gateway no longer lists it (drained).

        Returns False when it was not listed. Raises GatewayError when the gateway refuses or the worker is
        still listed after ``timeout`` seconds (in-flight requests keep it ``draining``).
        """
        worker = self.find(url)
        if worker is None:
            return False
        status, body = self._call("DELETE", f"/workers/{worker.id}")
        if status not in (200, 202, 204):
            raise GatewayError(f"the gateway refused to remove {url}: {status}", value=_shown(body))
        try:
            self._wait(lambda: self.find(url) is None, timeout, poll, f"{url} to drain out of the gateway")
        except GatewayError as exc:
            raise DrainTimeout(exc.message, value=exc.value) from None
        return True

    def add(self, url: str, *, timeout: float = 300.0, poll: float = 0.5) -> Worker:
        """Put ``url`` back into rotation and wait until the gateway lists it ``ready`` and healthy.

        Raises GatewayError when refused or not ready after ``timeout`` seconds.
        """
        body: dict[str, Any] = {"url": url}
        if self.api_key:
            body["api_key"] = self.api_key  # smg probes the worker with it; without it a keyed worker is 401
        status, answer = self._call("POST", "/workers", json=body)
        if status == 409:
            pass  # already listed (a removal still draining, or never removed): wait for it to be ready
        elif status not in (200, 201, 202):
            raise GatewayError(f"the gateway refused to add {url}: {status}", value=_shown(answer))
        found: list[Worker] = []

        def ready() -> bool:
            worker = self.find(url)
            if worker is not None and worker.status == "ready" and worker.healthy:
                found.append(worker)
                return True
            return False

        self._wait(ready, timeout, poll, f"{url} to be ready in the gateway")
        return found[-1]

    def _wait(self, done: Callable[[], bool], timeout: float, poll: float, what: str) -> None:
        deadline = self._monotonic() + timeout
        while not done():
            if self._monotonic() >= deadline:
                raise GatewayError(f"timed out after {timeout:g} s waiting for {what}", value=self.base_url)
            self._sleep(poll)


def _shown(body: Any) -> str:
    """An answer's body for an error value: its first 200 characters, printable (kimi_deploy.wire.printable)."""

    return printable(str(body))[:200]



def view_problems(expected: Sequence[str], workers: Sequence[Worker]) -> list[str]:
    """``status`` problems of the gateway's view (one ``what (evidence); fix: how`` line each; empty: fine).

    ``expected``: the deployment's worker URLs (:attr:`kimi_deploy.deployment.Deployment.worker_urls`); ``workers``: what the gateway lists.
    """
    listed = {w.url.rstrip("/"): w for w in workers}
    problems = []
    for url in expected:
        worker = listed.get(url.rstrip("/"))
        if worker is None:
            problems.append(f"{url} is not in the gateway's rotation (GET /workers does not list it); fix: "
                            "`kimi-deploy restart --wait` on that node adds it back once it is ready")
        elif worker.status != "ready" or not worker.healthy:
            problems.append(f"{url} is {worker.status}, {'healthy' if worker.healthy else 'unhealthy'} in the gateway "
                            f"(GET /workers); fix: `kimi-deploy status` and `journalctl` on that node")
    for url in sorted(set(listed) - {u.rstrip("/") for u in expected}):
        problems.append(f"the gateway routes to {url}, which the profile does not list (GET /workers); fix: "
                        "re-render and reinstall the gateway host, or remove it with the worker API")
    return problems


def gateway_view(deployment: Deployment, api_key: str | None, *, timeout: float = 10.0) -> dict[str, Any]:
    """The gateway's view of its workers for ``status``: ``{"url", "workers": [Worker dicts], "problems",
    "error"}``; never raises (an unreachable gateway or a refused listing is ``error`` and a problem). The
    gateway's URL, unit and the expected workers are ``deployment``'s (one with ``[gateway]``)."""
    url = deployment.gateway_url
    try:
        with Gateway(url, api_key, timeout=timeout) as gw:
            workers = gw.workers()
    except KimiDeployError as exc:
        return {"url": url, "workers": [], "error": exc.message,
                "problems": [f"the gateway at {url} cannot be read ({exc.message}); fix: systemctl status "
                             f"{deployment.units.gateway} on {deployment.profile.gateway.host}"]}
    # the gateway's own words, written by status: a listed URL may carry credentials or echo the key
    return {"url": url, "workers": [{**w.to_dict(), "url": redact_url(w.url, [api_key])} for w in workers],
            "error": None, "problems": [redact_text(p, [api_key]) for p in view_problems(deployment.worker_urls,
                                                                                          workers)]}
