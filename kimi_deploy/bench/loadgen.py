"""The load generator: a closed-loop concurrency sweep (or open-loop Poisson rates) over one client.

Per point (a concurrency, or a request rate): ``warmup`` requests at the point's
concurrency (excluded), then ``runs`` measured runs of ``num_prompts`` requests each. Before
every measured run the server's prefix cache is flushed (``POST /flush_cache``, SGLang) when the
server allows it, and after it ``/server_info`` is read again for the speculative accept length
(``internal_states[0].avg_spec_accept_length``, SGLang 0.5.23). Every run sends the same
seeded prompt sequence, so runs, points and configurations see the same prompts.

- closed loop: ``concurrency`` workers, each sends its next request when its previous one ends.
- open loop: arrivals at exponential intervals of mean ``1/rate`` (a Poisson process, seeded);
  ``max_in_flight`` (if given) caps requests in flight, later arrivals wait and their TTFT
  counts from when they are sent.
"""

from __future__ import annotations

import asyncio
import signal
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from kimi_deploy.bench import params
from kimi_deploy.bench.client import JSON_LIB, NotRead, StreamClient
from kimi_deploy.bench.prompts import Dataset
from kimi_deploy.bench.http import PARSER
from kimi_deploy.bench.metrics import RequestRecord, WindowSummary, summarize
from kimi_deploy.catalog.models import required_sampling
from kimi_deploy.errors import KimiDeployError, UnreachableError, UsageError
from kimi_deploy.profile import load_profile
from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LINE_BYTES, MIN_CAP_BYTES, Limits


class ProgressSink(Protocol):
    """What the load generator reports while running (the CLI draws it with rich)."""

    def start(self, description: str, total: int) -> None: ...
    def advance(self, ok: bool) -> None: ...


def model_sampling(model: str | None, profile_path: Any, extra_body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """``(temperature, extra_body)`` when ``--temperature`` was not given: the required sampling of the model
    ``model`` or the profile at ``profile_path`` names (:func:`kimi_deploy.catalog.models.required_sampling`:
    temperature 1.0, and ``top_p`` 0.95 added to ``extra_body`` unless it sets one), else temperature 0.

    A profile that cannot be read names no model here (``bench`` does not need it to run)."""
    names: list[str | None] = [model]
    if profile_path:
        try:
            profile = load_profile(profile_path)
            names += [profile.sglang.served_model_name, profile.sglang.model_path]
        except KimiDeployError:
            pass
    required = required_sampling(*names)
    if not required:
        return 0.0, extra_body
    return required["temperature"], {"top_p": required["top_p"], **extra_body}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a benchmark sweep (recorded verbatim in the result's ``config``).

    ``concurrency``: closed-loop points. ``request_rates``: requests/s of open-loop points
    (empty = closed loop); ``max_in_flight`` caps requests in flight in open loop (``None``: no cap).
    ``num_prompts``: measured requests per run; ``None`` = max(32, 4 x concurrency) closed loop, 200 open loop.
    ``warmup``: requests per point before measuring; ``None`` = the point's concurrency.
    ``slo``: milliseconds per key ``ttft``/``tpot``/``e2e`` for goodput.
    ``max_tokens``/``temperature``/``ignore_eos``: sent in every request (``ignore_eos`` is
    SGLang's extension, sent only when true). ``extra_body`` is merged into every request.
    ``max_body_bytes``/``max_line_bytes``: the byte caps of :mod:`kimi_deploy.wire.limits` (a kept body;
    one SSE line or event).
    """

    base_url: str
    model: str | None = None
    concurrency: tuple[int, ...] = (1,)  # empty in open loop
    request_rates: tuple[float, ...] = ()
    max_in_flight: int | None = None
    num_prompts: int | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    ignore_eos: bool = False
    warmup: int | None = None
    runs: int = 1
    seed: int = 0
    slo: dict[str, float] = dataclasses.field(default_factory=dict)
    label: str | None = None
    request_timeout: float = 600.0
    flush_cache: bool = True
    extra_body: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    api_key: dataclasses.InitVar[str | None] = None

    def __post_init__(self, api_key: str | None) -> None:
        """Check every number with :mod:`kimi_deploy.bench.params` (the CLI's own validators).

        Raises:
            UsageError: no point, a repeated point, a non-finite or out-of-range number, an unknown SLO key.
        """
        object.__setattr__(self, "_api_key", api_key)
        if not self.concurrency and not self.request_rates:
            raise UsageError("no point to measure", hint="give --concurrency 1,8,32 or --request-rate 2,4,8")
        if self.concurrency:
            params.number_list(self.concurrency, option="--concurrency", kind=int, minimum=1,
                               maximum=params.MAX_CONCURRENCY, example="1,8,32,64")
        if self.request_rates:
            object.__setattr__(self, "request_rates", params.number_list(
                self.request_rates, option="--request-rate", minimum=0, open_min=True, example="2,4,8"))
        if self.max_in_flight is not None:
            params.number(self.max_in_flight, option="--concurrency", kind=int, minimum=1,
                          maximum=params.MAX_CONCURRENCY, example="64")
        for option, value, maximum in (("--runs", self.runs, params.MAX_RUNS),
                                       ("--num-prompts", self.num_prompts, params.MAX_REQUESTS),
                                       ("--max-tokens", self.max_tokens, None)):
            if value is not None:
                params.number(value, option=option, kind=int, minimum=1, maximum=maximum, example="8")
        if self.warmup is not None:
            params.number(self.warmup, option="--warmup", kind=int, minimum=0, maximum=params.MAX_REQUESTS,
                          example="8")
        params.number(self.temperature, option="--temperature", minimum=0, example="0")
        params.number(self.request_timeout, option="--request-timeout", minimum=0, open_min=True, example="600")
        for option, value in (("--max-body-bytes", self.max_body_bytes), ("--max-line-bytes", self.max_line_bytes)):
            params.number(value, option=option, kind=int, minimum=MIN_CAP_BYTES, example=str(DEFAULT_MAX_BODY_BYTES))
        object.__setattr__(self, "slo", params.slo(self.slo))

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates)

    def prompts_for(self, concurrency: int) -> int:
        """Measured requests per run at a point."""
        if self.num_prompts is not None:
            return self.num_prompts
        return 200 if self.open_loop else max(32, 4 * concurrency)

    def body(self, model: str, messages: list[dict[str, Any]]) -> bytes:
        """The serialized request (Chat Completions API, streaming with usage)."""
        req: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": self.max_tokens,
                               "temperature": self.temperature, "stream": True,
                               "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            req["ignore_eos"] = True
        req.update(self.extra_body)
        return json.dumps(req, ensure_ascii=False).encode()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mode"] = "open-loop" if self.open_loop else "closed-loop"
        return d


@dataclasses.dataclass
class RunResult:
    """One measured run of a point."""

    index: int
    flush_cache: str
    spec_accept_length: float | None
    summary: WindowSummary
    records: list[RequestRecord] = dataclasses.field(repr=False)


@dataclasses.dataclass
class PointResult:
    """One point of the sweep: its runs and the summary pooled over them."""

    concurrency: int | None
    request_rate: float | None
    num_prompts: int
    warmup: int
    runs: list[RunResult]
    summary: WindowSummary


@dataclasses.dataclass
class BenchRun:
    """What :func:`run_bench` measured; :mod:`kimi_deploy.bench.report` turns it into JSON/CSV."""

    config: BenchConfig
    model: str
    server_info: dict[str, Any] | None
    server_info_status: str
    points: list[PointResult]
    client: dict[str, Any]
    started: float
    finished: float
    interrupted: dict[str, Any] | None = None


#: Signals that end a sweep early with the points already finished kept (:func:`run_bench`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def spec_accept_length(server_info: Any) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` from a ``/server_info`` answer (SGLang 0.5.23).

    Disaggregated (PD) servers nest the decode side under ``decode[0]``, as SGLang's own
    ``bench_serving`` reads it. ``None`` when absent or not a finite number.
    """
    if not isinstance(server_info, dict):
        return None
    if isinstance(server_info.get("decode"), list) and server_info["decode"]:
        server_info = server_info["decode"][0]
    states = server_info.get("internal_states") if isinstance(server_info, dict) else None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


async def closed_loop(client: StreamClient, bodies: list[bytes], concurrency: int,
                      on_done: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Send ``bodies`` with ``concurrency`` workers, each waiting for its previous answer; records in end order."""
    records: list[RequestRecord] = []
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:  # one shared iterator: asyncio is single-threaded
            rec = await client.stream(body)
            records.append(rec)
            if on_done:
                on_done(rec)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    return records


async def open_loop(client: StreamClient, bodies: list[bytes], rate: float, seed: int,
                    max_in_flight: int | None = None,
                    on_done: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Send ``bodies`` at Poisson arrivals of ``rate`` requests/s (seeded), at most ``max_in_flight`` at once."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    records: list[RequestRecord] = []

    async def one(body: bytes) -> None:
        if gate is None:
            rec = await client.stream(body)
        else:
            async with gate:
                rec = await client.stream(body)
        records.append(rec)
        if on_done:
            on_done(rec)

    tasks = []
    due = time.perf_counter()
    try:
        for body in bodies:
            tasks.append(asyncio.ensure_future(one(body)))
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:  # interrupted (SIGINT/SIGTERM): no request outlives the sweep
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return records


async def _flush(client: StreamClient, enabled: bool) -> str:
    if not enabled:
        return "disabled"
    status, body = await client.post("/flush_cache")
    if status == 200:
        return "flushed"
    if status in (404, 405):
        return f"unsupported (http {status})"
    return f"failed (http {status}: {str(body)[:120]})"


async def _server_info(client: StreamClient) -> tuple[dict[str, Any] | None, str | None, str]:
    """``(answer, path that answered, status line)``: ``/server_info``, else the deprecated ``/get_server_info``."""
    for path in ("/server_info", "/get_server_info"):
        status, body = await client.get_json(path)
        if status == 200 and isinstance(body, dict):
            return body, path, f"GET {path}: 200"
        if isinstance(body, NotRead):
            return None, None, f"GET {path}: http {status}, {body}"
        if status not in (404, 405):
            return None, None, f"GET {path}: http {status}"
    return None, None, "not offered (404)"


async def _resolve_model(client: StreamClient, model: str | None) -> str:
    if model:
        return model
    status, body = await client.get_json("/v1/models")
    try:
        return body["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        if 300 <= status < 400:
            hint = ("the server redirects and bench follows no redirect (it could lead to another server): give the "
                    "server's own address as --base-url")
        elif status == 200 and isinstance(body, dict) and body.get("data") == []:
            hint = "the server lists no model: check its launch, or pass --model NAME if it serves one unlisted"
        elif status == 200:
            hint = ("that is no OpenAI model list: is --base-url the server itself (not a web server or proxy page)? "
                    "else pass --model with the served model name")
        else:
            hint = "check --base-url, or pass --model with the served model name"
        raise UsageError("no --model given and /v1/models names none", value=f"http {status}: {str(body)[:200]}",
                         hint=hint) from None


async def run_bench_async(cfg: BenchConfig, dataset: Dataset, progress: ProgressSink | None = None,
                          stop: dict[str, Any] | None = None) -> BenchRun:
    """Run the whole sweep of ``cfg`` on ``dataset``; see the module docstring for the procedure.

    Cancelled during the sweep (``run_bench`` cancels on SIGINT/SIGTERM and names the signal in
    ``stop["signal"]``), it returns the points finished so far, with :attr:`BenchRun.interrupted`
    ``{"signal", "during", "complete_points"}``; the point in flight is left out (its runs did not
    all finish).

    Raises:
        UnreachableError: the server does not answer.
        UsageError: no model name could be resolved.
        asyncio.CancelledError: cancelled before the model was resolved (nothing measured yet).
    """
    pool = (cfg.max_in_flight or 0) if cfg.open_loop else max(cfg.concurrency)
    started = time.time()
    async with StreamClient(cfg.base_url, pool_size=pool, api_key=getattr(cfg, "_api_key"),
                            request_timeout=cfg.request_timeout,
                            limits=Limits(cfg.max_body_bytes, cfg.max_line_bytes)) as client:
        server_info, info_path, info_status = await _server_info(client)
        model = await _resolve_model(client, cfg.model)
        points: list[PointResult] = []
        grid: list[tuple[int | None, float | None]]
        if cfg.open_loop:
            grid = [(cfg.max_in_flight, rate) for rate in cfg.request_rates]
        else:
            grid = [(c, None) for c in cfg.concurrency]
        interrupted = None
        during = ""
        try:
            for concurrency, rate in grid:
                during = f"c={concurrency}" if rate is None else f"rate={rate:g}/s"
                points.append(await _point(cfg, dataset, client, model, info_path, concurrency, rate, progress))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            interrupted = {"signal": (stop or {}).get("signal", "cancelled"), "during": during,
                           "complete_points": [f"c={p.concurrency}" if p.request_rate is None
                                               else f"rate={p.request_rate:g}/s" for p in points]}
    loop = asyncio.get_running_loop()
    client_info = {"http": f"kimi_deploy.bench.http (asyncio.Protocol, HTTP/1.1 keep-alive, {PARSER})", "json": JSON_LIB,
                   "event_loop": f"{type(loop).__module__}.{type(loop).__name__}",
                   "pool_limit": pool or "unlimited"}
    return BenchRun(config=cfg, model=model, server_info=server_info, server_info_status=info_status,
                    points=points, client=client_info, started=started, finished=time.time(),
                    interrupted=interrupted)


async def _point(cfg: BenchConfig, dataset: Dataset, client: StreamClient, model: str, info_path: str | None,
                 concurrency: int | None, rate: float | None, progress: ProgressSink | None) -> PointResult:
    """Warm up, then measure one point of the sweep ``cfg.runs`` times."""
    n = cfg.prompts_for(concurrency or 1)
    convs = dataset.sample(n, cfg.seed)
    bodies = [cfg.body(model, m) for m in convs]
    warm_n = cfg.warmup if cfg.warmup is not None else (concurrency or 8)
    name = f"c={concurrency}" if rate is None else f"rate={rate:g}/s"
    if warm_n:
        warm = [cfg.body(model, m) for m in dataset.sample(warm_n, cfg.seed + 1)]
        if progress:
            progress.start(f"{name} warmup", warm_n)
        await closed_loop(client, warm, concurrency or warm_n,
                          (lambda r: progress.advance(r.ok)) if progress else None)
    runs: list[RunResult] = []
    for k in range(cfg.runs):
        flushed = await _flush(client, cfg.flush_cache)
        if progress:
            progress.start(f"{name} run {k + 1}/{cfg.runs}", n)
        done = (lambda r: progress.advance(r.ok)) if progress else None
        if rate is None:
            records = await closed_loop(client, bodies, concurrency, done)  # type: ignore[arg-type]
        else:
            records = await open_loop(client, bodies, rate, cfg.seed + k, concurrency, done)
        accept = None
        if info_path is not None:
            status, info = await client.get_json(info_path)
            accept = spec_accept_length(info) if status == 200 else None
        runs.append(RunResult(index=k, flush_cache=flushed, spec_accept_length=accept,
                              summary=summarize([records], cfg.slo), records=records))
    return PointResult(concurrency=concurrency, request_rate=rate, num_prompts=n, warmup=warm_n,
                       runs=runs, summary=summarize([r.records for r in runs], cfg.slo))


async def _until_signal(cfg: BenchConfig, dataset: Dataset, progress: ProgressSink | None) -> BenchRun:
    """:func:`run_bench_async`, cancelled by SIGINT or SIGTERM (handlers installed for the run only,
    where the platform allows: the main thread of a POSIX process)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stop: dict[str, Any] = {}

    def on_signal(sig: signal.Signals) -> None:
        if not stop:
            stop["signal"] = sig.name
            task.cancel()  # type: ignore[union-attr]

    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
            pass
    try:
        return await run_bench_async(cfg, dataset, progress, stop)
    except asyncio.CancelledError:
        if stop:  # a signal before anything was measured: nothing to keep
            raise KeyboardInterrupt(stop["signal"]) from None
        raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_bench(cfg: BenchConfig, dataset: Dataset, progress: ProgressSink | None = None) -> BenchRun:
    """Synchronous entry: :func:`run_bench_async` on uvloop when installed, else asyncio.

    SIGINT (Ctrl-C) and SIGTERM end the sweep early: the result holds the points finished so far
    and :attr:`BenchRun.interrupted` says so.

    Raises:
        KeyboardInterrupt: a signal came before the first point started (nothing to write).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_until_signal(cfg, dataset, progress))
    return uvloop.run(_until_signal(cfg, dataset, progress))


__all__ = ["BenchConfig", "BenchRun", "PointResult", "RunResult", "run_bench", "run_bench_async",
           "closed_loop", "open_loop", "spec_accept_length", "UnreachableError"]
