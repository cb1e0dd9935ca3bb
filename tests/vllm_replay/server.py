"""vLLM replay server: vLLM 0.33.0's real serving stack on a CPU, with a scripted Kimi engine core.

Run with the vLLM test environment's interpreter (``scripts/vllm-testenv``; never the kit's)::

    <vllm-env>/bin/python tests/vllm_replay/server.py [--no-parsers] [--api-key K] [--exclude-tools-when-none]

It binds 127.0.0.1 on a free port and prints ``LISTENING <port>`` on stdout once ``/health`` answers 200
(about 12 s on a 2-core machine); vLLM's own log goes to stderr. ``KIMI_VLLM_REPLAY_LOG=FILE`` appends, per
request, the prompt's tail and the ``StructuredOutputsParams`` the engine core received (for debugging the
script). Nothing is downloaded: the model folder is a tokenizer and a config built in a temporary folder.

What is vLLM's own code here (vllm 0.33.0): ``vllm serve``'s argument parser (``make_arg_parser``,
``validate_parsed_serve_args``), ``setup_server``/``run_server_worker`` (``EngineArgs`` →
``VllmConfig`` on vLLM's CPU platform, ``AsyncLLM`` with its input processor, renderer, output
processor and incremental detokenizer), ``build_app``/``init_app_state`` (every route, the API-key
middleware, ``OpenAIServingChat`` with the Jinja chat template, the ``kimi_k2`` tool and reasoning
parsers, the structural tag for ``tool_choice`` required/named, error responses).

What stands in for the GPU: the engine core. ``EngineCoreClient.make_async_mp_client`` is replaced
by :class:`ScriptedEngineCore`, which receives vLLM's real ``EngineCoreRequest`` (prompt token ids,
``SamplingParams``) and returns ``EngineCoreOutputs`` of 1-4 token ids a step (as with EAGLE-3),
written by :mod:`kimi_model` (tests/replay) from the decoded prompt. Under a structural tag that
forces a call (``tool_choice`` required or named) it obeys the tag as vLLM's grammar would: a call,
to the named function when one is named, with a ``functions.NAME:N`` id.
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "replay"))

import kimi_model  # noqa: E402
import kimi_tokenizer  # noqa: E402

SERVED_MODEL_NAME = "moonshotai/Kimi-K2.5"
MAX_MODEL_LEN = 262144


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-parsers", action="store_true",
                   help="launch without --tool-call-parser/--enable-auto-tool-choice/--reasoning-parser")
    p.add_argument("--exclude-tools-when-none", action="store_true",
                   help="vLLM --exclude-tools-when-tool-choice-none")
    p.add_argument("--api-key", default=None, help="vLLM --api-key")
    p.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--invalid-args-rate", type=float, default=0.0,
                   help="break this fraction of answers with a call (kimi_model._maybe_break), seeded by --seed")
    p.add_argument("--seed", type=int, default=0)
    opts = p.parse_args(argv)
    # in the environment, so that an engine process started later (vLLM's engine core) breaks answers alike
    os.environ["KIMI_REPLAY_INVALID_RATE"] = str(opts.invalid_args_rate)
    os.environ["KIMI_REPLAY_SEED"] = str(opts.seed)
    return opts


def serve_argv(opts: argparse.Namespace, model_dir: Path) -> list[str]:
    """The ``vllm serve`` arguments the replay launches with."""
    argv = ["--model", str(model_dir), "--served-model-name", opts.served_model_name,
            "--host", opts.host, "--port", str(opts.port), "--max-model-len", str(MAX_MODEL_LEN),
            "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if not opts.no_parsers:
        argv += ["--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice", "--reasoning-parser", "kimi_k2"]
    if opts.exclude_tools_when_none:
        argv += ["--exclude-tools-when-tool-choice-none"]
    if opts.api_key:
        argv += ["--api-key", opts.api_key]
    return argv


def forced_call(tag_json: str | None) -> tuple[bool, str | None]:
    """``(forced, name)`` from a structural tag: does the grammar force a call, and to which function.

    vLLM 0.33.0 (``parser/abstract_parser.py`` ``_apply_structural_tag``, xgrammar's builtin ``kimi``
    tag) sends one only for ``tool_choice`` required or named (auto gets none unless
    ``VLLM_ENFORCE_STRICT_TOOL_CALLING``): a sequence that opens with the constant
    ``<|tool_calls_section_begin|>`` and whose tags begin ``<|tool_call_begin|>functions.NAME:``; a
    named choice leaves one such tag. A tag with ``"at_least_one": true`` also forces a call.
    """
    if not tag_json:
        return False, None
    try:
        tag = json.loads(tag_json)
    except ValueError:
        return False, None
    text = json.dumps(tag)
    forced = '"at_least_one": true' in text or any(
        v == "<|tool_calls_section_begin|>" for v in _find(tag.get("format", {}), "value")[:1])
    begins = [b for b in _find(tag, "begin") if b.startswith("<|tool_call_begin|>functions.")]
    names = {b.split("<|tool_call_begin|>functions.", 1)[1].rsplit(":", 1)[0] for b in begins}
    return forced, (names.pop() if forced and len(names) == 1 else None)


def _find(obj, key: str) -> list:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key and isinstance(v, str):
                out.append(v)
            out.extend(_find(v, key))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(_find(v, key))
    return out


def scripted_text(prompt: str, tag_json: str | None) -> str:
    """The raw text the scripted model writes for ``prompt`` under the request's structural tag."""
    forced, name = forced_call(tag_json)
    if not forced:
        return kimi_model.respond(prompt, {})
    if name:  # a named choice: the grammar admits only that function; narrow the declared tools to it
        prompt = _only_tool(prompt, name)
    # the grammar admits only functions.NAME:N ids, whatever style the history used
    return kimi_model.respond(prompt, {"structural_tag": tag_json, "canonical_ids": True})


def _only_tool(prompt: str, name: str) -> str:
    start = "<|im_system|>tool_declare<|im_middle|>"
    if start not in prompt:
        return prompt
    head, rest = prompt.split(start, 1)
    body, tail = rest.split("<|im_end|>", 1)
    try:
        tools = [t for t in json.loads(body) if t.get("function", t).get("name") == name]
    except (ValueError, AttributeError):
        return prompt
    return head + start + json.dumps(tools) + "<|im_end|>" + tail


class ScriptedEngineCore:
    """Stand-in for vLLM's ``AsyncMPClient``: the methods ``AsyncLLM`` calls on a text-only model.

    ``add_request_async`` takes a real ``EngineCoreRequest``; ``get_output_async`` returns one
    ``EngineCoreOutputs`` step for every live request (1-4 new token ids each, cycled as
    :data:`kimi_model.CHUNK_SIZES`); the last step of a request carries ``<|im_end|>`` and
    ``FinishReason.STOP``, or ``LENGTH`` when ``max_tokens`` cut it.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.engine_ranks_managed = [0]
        self.resources = SimpleNamespace(engine_dead=False)  # AsyncLLM.errored reads it
        self._live: dict[str, list[list[int]]] = {}
        self._finish: dict[str, object] = {}
        self._ready = asyncio.Event()
        self.log = os.environ.get("KIMI_VLLM_REPLAY_LOG")

    def _ids(self, piece: str) -> list[int]:
        if piece in kimi_model.MARKERS:
            return [self.tokenizer.convert_tokens_to_ids(piece)]
        return self.tokenizer.encode(piece, add_special_tokens=False)

    async def add_request_async(self, request) -> None:
        from vllm.v1.engine import FinishReason

        params = request.sampling_params
        prompt = self.tokenizer.decode(request.prompt_token_ids or [], skip_special_tokens=False)
        structured = getattr(params, "structured_outputs", None)
        tag = getattr(structured, "structural_tag", None) if structured else None
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(json.dumps({"prompt_tail": prompt[-200:], "structured": repr(structured)}) + "\n")
        parts = kimi_model.pieces(scripted_text(prompt, tag))
        max_tokens = params.max_tokens if params is not None else None
        finish = FinishReason.STOP
        if max_tokens is not None and len(parts) + 1 > max_tokens:
            parts, finish = parts[:max_tokens], FinishReason.LENGTH
        steps = [[i for p in group for i in self._ids(p)] for group in kimi_model.chunks(parts)] or [[]]
        if finish == FinishReason.STOP:
            steps[-1].append(self.eos_id)
        self._live[request.request_id] = steps
        self._finish[request.request_id] = finish
        self._ready.set()

    async def get_output_async(self):
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

        while not self._live:
            self._ready.clear()
            await self._ready.wait()
        await asyncio.sleep(0)
        outs, done = [], set()
        for rid, steps in list(self._live.items()):
            ids = steps.pop(0)
            last = not steps
            outs.append(EngineCoreOutput(request_id=rid, new_token_ids=ids,
                                         finish_reason=self._finish[rid] if last else None))
            if last:
                done.add(rid)
                del self._live[rid]
                del self._finish[rid]
        return EngineCoreOutputs(outputs=outs, finished_requests=done or None)

    async def abort_requests_async(self, request_ids) -> None:
        for rid in request_ids:
            self._live.pop(rid, None)
            self._finish.pop(rid, None)

    async def get_supported_tasks_async(self):
        return ("generate",)

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(self, *args, **kwargs) -> bool:
        return True

    async def is_sleeping_async(self) -> bool:
        return False

    def dp_engines_running(self) -> bool:
        return False

    def shutdown(self, timeout=None) -> None:
        self._live.clear()


def _announce_when_healthy(host: str, port: int, stop: threading.Event) -> None:
    url = f"http://{host}:{port}/health"
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    print(f"LISTENING {port}", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # vLLM logs to stdout by default; stdout carries only LISTENING (a test reads it, then stops reading)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    opts = parse_args(argv)

    import uvloop
    from transformers import AutoTokenizer
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.api_server.entry import run_server_worker
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine import core_client

    with tempfile.TemporaryDirectory(prefix="kimi-vllm-replay-") as tmp:
        model_dir = kimi_tokenizer.build(Path(tmp) / "Kimi-K2.5")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

        def make_async_mp_client(*args, **kwargs):
            return ScriptedEngineCore(tokenizer)

        core_client.EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)

        parser = make_arg_parser(FlexibleArgumentParser(description="vllm serve"))
        args = parser.parse_args(serve_argv(opts, model_dir))
        validate_parsed_serve_args(args)
        listen_address, sock = setup_server(args, reuse_port=False)
        port = sock.getsockname()[1]
        stop = threading.Event()
        threading.Thread(target=_announce_when_healthy, args=(opts.host, port, stop), daemon=True).start()
        try:
            uvloop.run(run_server_worker(listen_address, sock, args))
        finally:
            stop.set()


if __name__ == "__main__":
    main()
