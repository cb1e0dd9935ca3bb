"""Stand-in for SGLang 0.5.23's ``sglang.launch_server`` on a CPU: SGLang's own argument handling in
front of the replay server (tests/replay/server.py: SGLang's OpenAIServingChat, the scripted Kimi model).

Reached as ``python -m sglang.launch_server ARGS`` through ``sitecustomize.py`` in this folder. What is
SGLang's own code here: ``prepare_server_args(ARGS)`` (the argparse of every rendered flag, the
``--config`` YAML merged by ``ConfigArgumentMerger``, ``launch_command`` recorded from the merged
argv), then ``resolve_once()`` and ``resolving_view`` as ``run_server`` does, so ``--host``, ``--port``
and ``--api-key`` come from the YAML exactly as SGLang reads them.
The weights are not loaded: ``--model-path`` must be a folder holding ``config.json`` and the
tokenizer (tests/replay/kimi_tokenizer.py builds one). SGLang's own argument resolution reads that
config, so a path that does not exist (an ``OSError``: neither a folder nor a hub repo id) or a folder
without a usable ``config.json`` fails the start with a traceback and exit 1, as in a real launch.
Prints SGLang's "The server is fired up and ready to roll!" once it serves; with ``KIMI_STANDIN_START_LOG`` first a
start's recorded phase lines (:func:`replay_start_log`).

Not exercised (SGLang's engine stack cannot be imported on a CPU): the ``server_args=...`` start-up
log line of ``engine.py``, the scheduler and TP worker processes, CUDA.
"""

import asyncio
import os
import socket
import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "replay"))


def main(argv: list[str]) -> int:
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_tokenizer

    server_args = prepare_server_args(argv)
    # The two settings of the replay server that are not in the rendered command: no accelerator
    # here, and the scripted model's tokenizer is loaded by the replay, not by SGLang's engine.
    server_args.device = "cpu"
    server_args.skip_tokenizer_init = True
    if server_args.served_model_name is None:
        # SGLang's resolution serves the model path then, but as a declaration that never reaches the
        # record, and the replay's tokenizer manager reads the record
        server_args.served_model_name = server_args.model_path
    from sglang.srt.arg_groups.overrides import resolving_view

    # what launch_server.py 0.5.23's run_server does before it dispatches: resolve once, then read
    # the resolved values (a model path resolution cannot use fails the start here, exit 1)
    server_args.resolve_once()
    cfg = resolving_view(server_args)
    set_global_server_args_for_tokenizer(server_args)  # what the real TokenizerManager's process does
    model = Path(cfg.model_path)

    import uvicorn

    import server as replay

    # KIMI_REPLAY_SANITISE_IDS=1 (the profile's [environment]): a proxy in front of the server rewrites every
    # returned tool-call id to [A-Za-z0-9_-] (tests/replay/server.py SanitisingProxy): tool calls break for clients
    opts = Namespace(api_key=cfg.api_key, served_model_name=cfg.served_model_name,
                     sanitise_ids=os.environ.get("KIMI_REPLAY_SANITISE_IDS") == "1")
    app = replay.build_app(opts, model, server_args=server_args)
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.02)
        replay_start_log(os.environ.get("KIMI_STANDIN_START_LOG"))
        # http_server.py 0.5.23 logs these two once the warm-up request succeeded
        print(f"Uvicorn running on http://{cfg.host}:{cfg.port}", flush=True)
        print("The server is fired up and ready to roll!", flush=True)
        await task

    asyncio.run(serve())
    return 0


def replay_start_log(path: str | None) -> None:
    """With ``KIMI_STANDIN_START_LOG`` (the profile's ``[environment]``): print a start's log recorded from SGLang
    on GPUs (tests/data/sglang-log/, the phases a CPU cannot run), its timestamps moved so that it ends now and
    without its ready line (printed next, as always), so that each start of the unit has its own phases."""
    if not path:
        return
    import datetime as dt
    import re

    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
    lines = [line for line in Path(path).read_text().splitlines() if "fired up and ready" not in line]
    stamps = [dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") for line in lines if (m := stamp.match(line))]
    shift = dt.datetime.now().replace(microsecond=0) - max(stamps)
    for line in lines:
        print(stamp.sub(lambda m: "[" + (dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") + shift)
                        .strftime("%Y-%m-%d %H:%M:%S"), line), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1:]))
