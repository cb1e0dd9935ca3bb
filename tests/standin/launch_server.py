"""Stand-in for SGLang 0.5.23's ``sglang.launch_server`` on a CPU: SGLang's own argument handling in
front of the replay server (tests/replay/server.py: SGLang's OpenAIServingChat, the scripted Kimi model).

Reached as ``python -m sglang.launch_server ARGS`` through ``sitecustomize.py`` in this folder. What is
SGLang's own code here: ``prepare_server_args(ARGS)`` (the argparse of every rendered flag, the
``--config`` YAML merged by ``ConfigArgumentMerger``, ``launch_command`` recorded from the merged
argv), so ``--host``, ``--port`` and ``--api-key`` come from the YAML exactly as SGLang reads them.
The model is not loaded: ``--model-path`` must be a folder holding ``config.json`` and the
tokenizer (tests/replay/kimi_tokenizer.py builds one). A path that does not exist is refused by
SGLang's own argument handling (an ``OSError`` naming it: neither a folder nor a hub repo id); a
folder without ``config.json`` fails with exit 1 as SGLang's model loading does. Prints SGLang's "The server is fired up and ready to roll!" once it serves.

Not exercised (SGLang's engine stack cannot be imported on a CPU): the ``server_args=...`` start-up
log line of ``engine.py``, the scheduler and TP worker processes, CUDA.
"""

import asyncio
import logging
import os
import socket
import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "replay"))

logger = logging.getLogger("sglang.launch_server")


def main(argv: list[str]) -> int:
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_tokenizer

    server_args = prepare_server_args(argv)
    # The two settings of the replay server that are not in the rendered command: no accelerator
    # here, and the scripted model's tokenizer is loaded by the replay, not by SGLang's engine.
    server_args.device = "cpu"
    server_args.skip_tokenizer_init = True
    set_global_server_args_for_tokenizer(server_args)  # what the real TokenizerManager's process does
    model = Path(server_args.model_path)
    if not (model / "config.json").is_file():
        # what SGLang's model loading ends in for a missing or empty folder (transformers' OSError)
        print(f"OSError: {model} does not appear to have a file named config.json", file=sys.stderr, flush=True)
        return 1

    import uvicorn

    import server as replay

    opts = Namespace(api_key=server_args.api_key, served_model_name=server_args.served_model_name)
    app = replay.build_app(opts, model, server_args=server_args)
    family = socket.AF_INET6 if ":" in server_args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((server_args.host, server_args.port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.02)
        # http_server.py 0.5.23 logs these two once the warm-up request succeeded
        print(f"Uvicorn running on http://{server_args.host}:{server_args.port}", flush=True)
        print("The server is fired up and ready to roll!", flush=True)
        await task

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1:]))
