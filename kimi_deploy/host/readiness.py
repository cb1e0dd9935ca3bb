"""Is the SGLang server up? HTTP readiness probes and the startup phase read from its log lines.

Readiness is :func:`kimi_deploy.wire.readiness.probe`'s verdict, the one ``check``'s ``health.ready`` and ``status``
give too: ``GET /health_generate`` (SGLang 0.5.23 runs a real 1-token generation), else a 1-token chat completion.

Phases come from SGLang 0.5.23's own log messages (``srt/model_executor/model_runner.py``
"Load weight begin/end", ``srt/mem_cache/kv_cache_configurator.py`` "Memory pool end",
``.../cuda_graph_setup.py`` and the speculative workers "Capture ... CUDA graph begin",
``http_server.py`` "Uvicorn running on" and "The server is fired up and ready to roll!").
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from kimi_deploy.facts import units as unit_facts
from kimi_deploy.host import systemd
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.wire.http import control_client, request_capped
from kimi_deploy.wire.readiness import Readiness, probe_url

#: (pattern, phase) in startup order; the first match wins.
PHASE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"fired up and ready to roll"), "ready"),
    (re.compile(r"Uvicorn running on|Starting server|Application startup complete"), "warming up"),
    (re.compile(r"Capture .*(cuda graph|CUDA graph|single-CG).*(begin|end)|Capturing batches", re.I),
     "capturing CUDA graphs"),
    (re.compile(r"Memory pool end|KV Cache is allocated"), "allocating the KV cache"),
    (re.compile(r"Load weight end"), "weights loaded"),
    (re.compile(r"Load weight begin|Loading safetensors checkpoint shards|Multi-thread loading shards"),
     "loading weights"),
    (re.compile(r"kimi-deploy patch verify|patch series"), "verifying patches"),
)


def phase_of(line: str | None) -> str | None:
    """The startup phase a log line of SGLang 0.5.23 shows, or ``None`` when it tells nothing.

    Phases: ``verifying patches``, ``loading weights``, ``weights loaded``, ``allocating the KV cache``,
    ``capturing CUDA graphs``, ``warming up``, ``ready``.
    """
    if not line:
        return None
    for pattern, phase in PHASE_PATTERNS:
        if pattern.search(line):
            return phase
    return None


def get_json(base_url: str, path: str, api_key: str | None = None, *, timeout: float = 10.0) -> dict[str, Any] | None:
    """``GET path`` as a JSON object, or ``None`` when the server does not answer 200 with an object
    (also: an answer :func:`request_capped` refuses, or JSON nested too deep to parse)."""
    try:
        with control_client(timeout=timeout, api_key=api_key) as client:
            status, data = request_capped(client, "GET", base_url + path)
    except httpx.HTTPError:
        return None
    return data if status == 200 and isinstance(data, dict) else None


@dataclasses.dataclass(frozen=True)
class WaitState:
    """What one poll of :func:`wait_ready` saw (handed to the progress callback)."""

    elapsed: float
    polls: int
    phase: str | None
    last_line: str | None
    probe: Readiness
    unit_state: str | None


@dataclasses.dataclass(frozen=True)
class WaitResult:
    """Outcome of :func:`wait_ready`: ``ready``, or why not (``timed_out``, ``unit_failed``)."""

    ready: bool
    timed_out: bool
    unit_failed: bool
    elapsed: float
    polls: int
    phase: str | None
    last_line: str | None
    last_probe: Readiness | None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["elapsed"] = round(self.elapsed, 1)
        data["last_probe"] = self.last_probe.to_dict() if self.last_probe else None
        return data


def _unit_state(unit: str) -> str | None:
    try:
        state = unit_facts.show(unit, ("ActiveState", "SubState"))
    except KimiDeployError:
        return None
    return f"{state.active_state}/{state.sub_state}" if state.active_state else None


def wait_ready(base_url: str, unit: str, *, api_key: str | None = None, model: str | None = None,
               timeout: float = 1200.0,
               poll_interval: float = 5.0, on_poll: Callable[[WaitState], None] | None = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> WaitResult:
    """Poll until the server is ready, the unit failed, or ``timeout`` seconds passed.

    Each poll: :func:`kimi_deploy.wire.readiness.probe_url` (``model``: the served name its 1-token completion
    asks for where ``/health_generate`` does not answer), the unit's last journal line (:func:`kimi_deploy.host.systemd.journal_last_line`)
    and its ``ActiveState/SubState`` (``systemctl show``); ``failed``, or ``auto-restart`` (systemd 252 shows a
    start that failed with ``Restart=on-failure`` as ``activating/auto-restart`` for ``RestartSec=``, never
    ``failed``), ends the wait early. The phase
    is the latest one a journal line showed (it stays when a line tells nothing).

    ``clock`` (seconds, monotonic) and ``sleep`` are where the wait reads the time and waits between
    polls: tests pass a clock that moves only when slept on, so how many polls fit in ``timeout``
    does not depend on how loaded the machine is.
    """
    start = clock()
    polls = 0
    phase: str | None = None
    last_line: str | None = None
    probe: Readiness | None = None
    while True:
        polls += 1
        remaining = timeout - (clock() - start)
        probe = probe_url(base_url, api_key, model, timeout=max(0.5, min(10.0, remaining)))
        last_line = systemd.journal_last_line(unit) or last_line
        phase = "ready" if probe.ready else (phase_of(last_line) or phase)
        state = None if probe.ready else _unit_state(unit)
        elapsed = clock() - start
        if on_poll:
            on_poll(WaitState(elapsed, polls, phase, last_line, probe, state))
        if probe.ready:
            return WaitResult(True, False, False, elapsed, polls, phase, last_line, probe)
        if state and (state.startswith("failed") or state.endswith("/auto-restart")):
            return WaitResult(False, False, True, elapsed, polls, phase, last_line, probe)
        if elapsed + poll_interval > timeout:
            return WaitResult(False, True, False, elapsed, polls, phase, last_line, probe)
        sleep(poll_interval)
