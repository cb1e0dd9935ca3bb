"""Replay server: SGLang 0.5.23's real OpenAI serving layer on a CPU, with a scripted Kimi "model".

Run with the SGLang test environment's interpreter (never the kit's)::

    HF_HUB_OFFLINE=1 <sglang-env>/bin/python tests/replay/server.py [--no-parsers] [--api-key K]
        [--reasoning-parser NAME] [--sanitise-ids]

It binds 127.0.0.1 on a free port and prints ``LISTENING <port>`` on stdout once it serves.

What is SGLang's own code here (sglang 0.5.23, imported from whatever ``sglang`` the interpreter
finds, so a patched copy is exercised when it comes first on sys.path):
``ServerArgs`` from SGLang's argparse, ``OpenAIServingChat`` (request conversion, the Jinja chat
template through the real ``TemplateManager``, the ``kimi_k2`` tool-call and reasoning parsers,
non-streaming and SSE streaming responses, error responses), the protocol models
(``ChatCompletionRequest``, ``ModelList``), ``build_server_info`` and the API-key middleware.

What stands in for what cannot run on a CPU: the ``TokenizerManager`` (its ``generate_request``
replays :mod:`kimi_model`'s text token by token, 1-4 tokens a chunk as with EAGLE-3) and the
model config. SGLang's ``http_server.py`` itself cannot be imported in the test environment (it
needs setproctitle, soundfile and the engine stack), so its route functions for ``/health``,
``/health_generate``, ``/ready``, ``/v1/models``, ``/model_info``, ``/server_info``,
``/v1/chat/completions``, ``/parse_function_call`` and ``/separate_reasoning`` (SGLang's own
``FunctionCallParser``/``ReasoningParser`` behind them) and its RequestValidationError→400 handler
are re-declared here with the same response shapes (http_server.py of 0.5.23).
"""

import argparse
import asyncio
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kimi_model  # noqa: E402
import kimi_tokenizer  # noqa: E402

SERVED_MODEL_NAME = "moonshotai/Kimi-K2.5"
CONTEXT_LEN = 262144


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-parsers", action="store_true", help="launch without --tool-call-parser/--reasoning-parser")
    p.add_argument("--api-key", default=None, help="SGLang --api-key")
    p.add_argument("--reasoning-parser", default="kimi_k2",
                   help="SGLang --reasoning-parser (another one than kimi_k2 breaks reasoning separation)")
    p.add_argument("--sanitise-ids", action="store_true",
                   help="stand for a proxy in front of the server that rewrites every tool-call id it returns to "
                        "[A-Za-z0-9_-] (functions.NAME:N -> functions_NAME_N): the incident that broke every "
                        "second call")
    p.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
    p.add_argument("--tp-size", default="8")
    p.add_argument("--no-speculative", action="store_true", help="launch without EAGLE-3 settings")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--invalid-args-rate", type=float, default=0.0,
                   help="break this fraction of answers with a call (kimi_model._maybe_break), seeded by --seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed-model", default=None, metavar="DIR",
                   help="time every answer by speed_model.py over the launch flags of DIR/unit and DIR/env (what "
                        "the fake systemd's restart copies there: the unit the server was 'started' from); its "
                        "planted setting sanitises tool-call ids")
    opts = p.parse_args(argv)
    # in the environment, so that an engine process started later (vLLM's engine core) breaks answers alike
    os.environ["KIMI_REPLAY_INVALID_RATE"] = str(opts.invalid_args_rate)
    os.environ["KIMI_REPLAY_SEED"] = str(opts.seed)
    return opts


def build_server_args(opts: argparse.Namespace, model_dir: Path):
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_tokenizer

    argv = ["--model-path", str(model_dir), "--skip-tokenizer-init", "--device", "cpu",
            "--served-model-name", opts.served_model_name, "--tp-size", opts.tp_size,
            "--host", opts.host, "--port", str(opts.port or 30000), "--enable-cache-report"]
    if not opts.no_parsers:
        argv += ["--tool-call-parser", "kimi_k2", "--reasoning-parser", getattr(opts, "reasoning_parser", "kimi_k2")]
    if not opts.no_speculative:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(model_dir),
                 "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "4"]
    if opts.api_key:
        argv += ["--api-key", opts.api_key]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(argv))
    # prepare_server_args sets this from sys.argv in a real launch (server_args.py 0.5.23)
    server_args._launch_command = " ".join(argv)  # as prepare_server_args records it: the arguments only
    set_global_server_args_for_tokenizer(server_args)
    return server_args


class ModelConfig:
    """The attributes of SGLang's ModelConfig that the serving layer and /model_info read."""

    def __init__(self, hf_config):
        self.hf_config = hf_config
        self.context_len = CONTEXT_LEN
        self.is_multimodal = False
        self.is_image_understandable_model = False
        self.is_audio_understandable_model = False
        self.is_generation = True

    def get_default_sampling_params(self) -> dict:
        return {}


class ScriptedTokenizerManager:
    """Stand-in for SGLang's TokenizerManager: real tokenizer, scripted generation.

    ``generate_request`` yields what the real one yields (SGLang 0.5.23 tokenizer_manager.py):
    dicts with the cumulative ``text`` and ``output_ids``, ``index`` and ``meta_info``; for a
    non-streaming request only the final one. Special tokens are dropped from ``text`` when the
    request's ``skip_special_tokens`` is true, as SGLang's detokenizer does.
    """

    def __init__(self, server_args, tokenizer, model_dir: Path):
        from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: F401 (import check)

        self.server_args = server_args
        self.tokenizer = tokenizer
        self.processor = None
        self.model_path = server_args.model_path
        self.served_model_name = server_args.served_model_name
        from transformers import PretrainedConfig

        hf_config = PretrainedConfig(architectures=["KimiK25ForConditionalGeneration"])
        hf_config.model_type = "kimi_k25"
        self.model_config = ModelConfig(hf_config)
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0,
                                              log_openai_received_request=lambda *a, **k: None)
        self.is_generation = True
        self.startup_time = time.time()
        self.last_receive_tstamp = 0.0
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._counter = 0
        self._seen: list[list[int]] = []  # prompts answered so far (the newest 256): a radix cache's contents
        self.pacer = None  # a SpeedPacer with --speed-model (build_app)

    def config_value(self, name: str):
        return getattr(self.server_args, name, None)

    def create_abort_task(self, obj):
        return None

    def _handle_abort_finish_reason(self, *args, **kwargs):
        return None

    def _prompt_text(self, obj) -> str:
        ids = obj.input_ids
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        if ids is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        text = obj.text
        return text[0] if isinstance(text, list) else (text or "")

    def _ids(self, piece: str) -> list[int]:
        if piece in kimi_model.MARKERS:
            return [self.tokenizer.convert_tokens_to_ids(piece)]
        return self.tokenizer.encode(piece, add_special_tokens=False)

    def _cached(self, ids: list[int]) -> int:
        """Tokens of ``ids`` a radix cache holds: the longest prefix shared with a prompt answered before (SGLang
        reports it as ``meta_info.cached_tokens``; ``--enable-cache-report`` puts it in the usage)."""
        best = 0
        for seen in self._seen:
            n = 0
            for a, b in zip(seen, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen = (self._seen + [ids])[-256:]
        return best

    async def generate_request(self, obj, raw_request=None):
        params = obj.sampling_params or {}
        if isinstance(params, list):
            params = params[0]
        prompt = self._prompt_text(obj)
        max_new = params.get("max_new_tokens")
        raw = kimi_model.respond(prompt, params)
        parts = kimi_model.pieces(raw)
        truncated = max_new is not None and len(parts) > max_new
        if truncated:
            parts = parts[:max_new]
        groups = kimi_model.chunks(parts) if obj.stream else [parts]
        if self.pacer is not None:
            async for item in self.pacer.paced(self._stream(obj, params, parts, groups, truncated, max_new),
                                               len(kimi_model.chunks(parts)), obj.stream):
                yield item
            return
        async for item in self._stream(obj, params, parts, groups, truncated, max_new):
            yield item

    async def _stream(self, obj, params, parts, groups, truncated, max_new):
        skip = params.get("skip_special_tokens", True)
        self._counter += 1
        rid = f"replay-{self._counter}"
        ids = obj.input_ids[0] if obj.input_ids and isinstance(obj.input_ids[0], list) else (obj.input_ids or [])
        prompt_tokens = len(ids)
        cached = self._cached(list(ids))
        text, out_ids = "", []
        for n, group in enumerate(groups):
            for piece in group:
                out_ids.extend(self._ids(piece))
                # SGLang's detokenizer drops special tokens unless skip_special_tokens is false
                if not (skip and piece in kimi_model.MARKERS and piece not in ("<think>", "</think>")):
                    text += piece
            finish = None
            if n == len(groups) - 1:
                finish = ({"type": "length", "length": max_new} if truncated
                          else {"type": "stop", "matched": self.eos_id})
            self.last_receive_tstamp = time.time()
            yield {
                "text": text,
                "output_ids": list(out_ids),
                "index": 0,
                "meta_info": {
                    "id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": len(out_ids),
                    "cached_tokens": cached, "finish_reason": finish, "output_token_logprobs": [],
                    "output_top_logprobs": [], "weight_version": "default",
                },
            }
            await asyncio.sleep(0)


class SpeedPacer:
    """The timing of :mod:`speed_model` for the configuration in ``folder`` (``unit``, ``env``: re-read when they
    change): at most ``--max-running-requests`` answers decode at once (the others wait, which is their TTFT), the
    first chunk after the prefill time, each next one after a decode step that slows with the batch."""

    def __init__(self, folder: str, seed: int) -> None:
        import random

        import speed_model

        self.model = speed_model
        self.folder = Path(folder)
        self.rng = random.Random(seed)
        self.running = 0
        self.waiters: list[asyncio.Future] = []
        self._key = None
        self._speed = speed_model.Speed({})

    def speed(self):
        unit, env = self.folder / "unit", self.folder / "env"
        key = tuple(p.stat().st_mtime_ns if p.exists() else 0 for p in (unit, env))
        if key != self._key:
            self._key = key
            text = unit.read_text() if unit.exists() else ""
            self._speed = self.model.Speed(self.model.flags_of(text, env.read_text() if env.exists() else ""))
        return self._speed

    async def _admit(self, limit: int) -> None:
        while self.running >= limit:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            await fut
        self.running += 1

    def _release(self) -> None:
        self.running -= 1
        while self.waiters:
            fut = self.waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                break

    async def paced(self, items, steps: int, stream: bool):
        speed = self.speed()
        await self._admit(speed.max_running)
        try:
            await asyncio.sleep(speed.ttft_ms * speed.jitter(self.rng) / 1000)
            first = True
            async for item in items:
                if not first:
                    await asyncio.sleep(speed.step(self.running) * speed.jitter(self.rng) / 1000)
                elif not stream:  # one answer at the end: every step's time before it
                    await asyncio.sleep(sum(speed.step(self.running) for _ in range(max(0, steps - 1))) / 1000)
                first = False
                yield item
        finally:
            self._release()


class SanitisingProxy:
    """ASGI middleware standing for a proxy that sanitises tool-call ids in what the server returns: every
    ``functions.NAME:N`` in a response body (JSON or SSE event) becomes ``functions_NAME_N``, as a client or
    gateway that allows only ``[A-Za-z0-9_-]`` in ids does. The rewrite keeps the length, so Content-Length
    stays right; an SSE event carries an id whole, so a chunk never splits one."""

    ID = re.compile(rb"functions\.([A-Za-z0-9_-]+):(\d+)")

    def __init__(self, app, when=None):
        self.app = app
        self.when = when or (lambda: True)  # whether it rewrites now (the speed model's planted setting)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.when():
            return await self.app(scope, receive, send)

        async def rewriting(message):
            if message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": self.ID.sub(rb"functions_\1_\2", message["body"])}
            await send(message)

        await self.app(scope, receive, rewriting)


def build_app(opts: argparse.Namespace, model_dir: Path, server_args=None):
    """The FastAPI app serving ``model_dir``'s scripted model.

    ``server_args``: a ready SGLang ``ServerArgs`` (the container tier's ``sglang.launch_server``
    stand-in passes what ``prepare_server_args`` made of the rendered command); None builds one
    from ``opts``. Its ``api_key`` (None: open) guards the routes, as SGLang's middleware does.
    """
    from fastapi import FastAPI, Request, Response
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse
    from transformers import AutoTokenizer

    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionRequest, ErrorResponse, ModelCard, ModelList,
    )
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.utils.auth import add_api_key_middleware
    from sglang.srt.utils.common import build_server_info
    from sglang.srt.utils.json_response import model_json_response
    from sglang.version import __version__

    if server_args is None:
        server_args = build_server_args(opts, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tm = ScriptedTokenizerManager(server_args, tokenizer, model_dir)
    template_manager = TemplateManager()
    template_manager.initialize_templates(tokenizer_manager=tm, model_path=str(model_dir),
                                          chat_template=None, completion_template=None)
    serving_chat = OpenAIServingChat(tm, template_manager)
    scheduler_info = {"max_total_num_tokens": 1048576, "max_req_input_len": CONTEXT_LEN - 1}

    app = FastAPI()
    if getattr(opts, "sanitise_ids", False):
        app.add_middleware(SanitisingProxy)
    if getattr(opts, "speed_model", None):
        tm.pacer = SpeedPacer(opts.speed_model, getattr(opts, "seed", 0))
        app.add_middleware(SanitisingProxy, when=lambda: tm.pacer.speed().planted)
    if server_args.api_key:
        add_api_key_middleware(app, api_key=server_args.api_key, admin_api_key=None)

    @app.exception_handler(RequestValidationError)
    async def validation_exception_handler(request: Request, exc: RequestValidationError):
        # http_server.py 0.5.23: FastAPI's 422 becomes 400 with SGLang's ErrorResponse.
        exc_str, errors_str = str(exc), str(exc.errors())
        message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
        err = ErrorResponse(message=message, type="Bad Request", code=400)
        return ORJSONResponse(status_code=400, content=err.model_dump())

    @app.get("/ready")
    async def ready():
        return Response(status_code=200)

    @app.get("/health")
    @app.get("/health_generate")
    async def health_generate(request: Request):
        from sglang.srt.managers.io_struct import GenerateReqInput

        gri = GenerateReqInput(rid=f"HEALTH_CHECK_{time.time_ns()}", input_ids=[0],
                               sampling_params={"max_new_tokens": 1, "temperature": 0.0})
        async for _ in tm.generate_request(gri, request):
            break
        return Response(status_code=200)

    @app.get("/v1/models", response_class=ORJSONResponse)
    async def available_models():
        return ModelList(data=[ModelCard(id=tm.served_model_name, root=tm.served_model_name,
                                         max_model_len=tm.model_config.context_len)])

    @app.get("/model_info")
    @app.get("/get_model_info")  # the deprecated alias 0.5.23 still serves; SGLang's gateway (smg) probes it
    async def model_info():
        return {
            "model_path": tm.model_path,
            "served_model_name": tm.served_model_name,
            "tokenizer_path": server_args.tokenizer_path,
            "is_generation": tm.is_generation,
            "preferred_sampling_params": server_args.preferred_sampling_params,
            "weight_version": tm.config_value("weight_version"),
            "load_format": tm.config_value("load_format"),
            "reasoning_parser": tm.config_value("reasoning_parser"),
            "tool_call_parser": tm.config_value("tool_call_parser"),
            "disaggregation_mode": tm.config_value("disaggregation_mode"),
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": tm.model_config.hf_config.model_type,
            "architectures": tm.model_config.hf_config.architectures,
        }

    @app.get("/server_info")
    @app.get("/get_server_info")  # the deprecated alias 0.5.23 still serves; SGLang's gateway (smg) probes it
    async def server_info():
        import json

        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        info = {**build_server_info(server_args, scheduler_info), "startup_time": tm.startup_time,
                "internal_states": [{"avg_spec_accept_length": 2.9, "last_gen_throughput": 0.0}],
                "version": __version__, "frontend": "python"}
        return Response(json.dumps(msgspec_to_builtins(info), default=str), media_type="application/json")

    async def _validate_json(raw_request: Request):
        media = raw_request.headers.get("content-type", "").lower().split(";", 1)[0]
        if media != "application/json":
            raise RequestValidationError(errors=[{"loc": ["header", "content-type"], "type": "value_error",
                                                  "msg": "Unsupported Media Type: Only 'application/json' is allowed"}])

    from fastapi import Depends

    @app.post("/v1/chat/completions", dependencies=[Depends(_validate_json)])
    async def openai_v1_chat_completions(request: ChatCompletionRequest, raw_request: Request):
        return model_json_response(await serving_chat.handle_request(request, raw_request))


    # http_server.py 0.5.23 parse_function_call_request / separate_reasoning_request, re-declared:
    # the same request structs (msgspec, validated through pydantic as FastAPI does there), the same
    # adapter lookup, SGLang's own FunctionCallParser / ReasoningParser, the same response shapes.
    from typing import Annotated

    from fastapi import Body, HTTPException

    try:
        from sglang.srt.entrypoints.openai.chat_encoding_adapters import native_text_parser
    except ImportError:  # SGLang 0.5.22 has no encoding adapters: its parsers are the only ones

        def native_text_parser(name, **_kw):
            return None
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.managers.io_struct import ParseFunctionCallReq, SeparateReasoningReqInput
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    @app.post("/parse_function_call")
    async def parse_function_call_request(obj: Annotated[ParseFunctionCallReq, Body()], request: Request):
        try:
            text_parser = native_text_parser(obj.tool_call_parser,
                                             chat_encoding_spec=getattr(serving_chat, "chat_encoding_spec", None),
                                             adapter=getattr(serving_chat, "encoding_adapter", None))
        except ValueError as error:
            raise HTTPException(status_code=400, detail=str(error))
        if text_parser is not None:
            normal_text, calls = text_parser.parse_function_call_text(obj.text, obj.tools)
        else:
            parser = FunctionCallParser(tools=obj.tools, tool_call_parser=obj.tool_call_parser,
                                        tokenizer=tm.tokenizer)
            normal_text, calls = parser.parse_non_stream(obj.text)
        return ORJSONResponse(content={"normal_text": normal_text, "calls": [c.model_dump() for c in calls]},
                              status_code=200)

    @app.post("/separate_reasoning")
    async def separate_reasoning_request(obj: Annotated[SeparateReasoningReqInput, Body()], request: Request):
        try:
            text_parser = native_text_parser(obj.reasoning_parser,
                                             chat_encoding_spec=getattr(serving_chat, "chat_encoding_spec", None),
                                             adapter=getattr(serving_chat, "encoding_adapter", None))
        except ValueError as error:
            raise HTTPException(status_code=400, detail=str(error))
        if text_parser is not None:
            reasoning_text, normal_text = text_parser.separate_reasoning_text(obj.text)
        else:
            parser = ReasoningParser(model_type=obj.reasoning_parser, request=request, tokenizer=tm.tokenizer)
            reasoning_text, normal_text = parser.parse_non_stream(obj.text)
        return ORJSONResponse(content={"reasoning_text": reasoning_text, "text": normal_text}, status_code=200)

    return app


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    opts = parse_args(argv)
    import uvicorn

    with tempfile.TemporaryDirectory(prefix="kimi-replay-") as tmp:
        model_dir = kimi_tokenizer.build(Path(tmp) / "Kimi-K2.5")
        app = build_app(opts, model_dir)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((opts.host, opts.port))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)

        async def serve():
            task = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started:
                if task.done():
                    await task
                    return
                await asyncio.sleep(0.02)
            print(f"LISTENING {sock.getsockname()[1]}", flush=True)
            await task

        asyncio.run(serve())


if __name__ == "__main__":
    main()
