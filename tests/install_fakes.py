"""Test helpers for install/restart/status: fake systemctl/journalctl, a loopback SGLang stand-in, profiles.

Fakes stand in only for what cannot run here: a running systemd (``systemctl restart/show``,
``journalctl``) and a GPU-backed SGLang server. The fake ``systemctl`` logs its argv (one JSON
list a line) to ``argv.log`` and answers ``show`` with ``show.txt`` (systemd 252's
``Property=value`` format); the fake ``journalctl`` prints the next line of ``journal.txt`` per
call (the last one repeats), as ``journalctl -n 1 -o cat`` would while a server starts; without ``-n 1``
it prints the whole log (``journal-full.txt``, else ``journal.txt``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable

from loopback import Loopback, QuietHandler

FAKE_SYSTEMCTL = r'''#!{python}
import json, os, sys
state = os.environ["FAKE_SYSTEMD_DIR"]
args = sys.argv[1:]
with open(os.path.join(state, "argv.log"), "a") as fh:
    fh.write(json.dumps(["systemctl", *args]) + "\n")
verbs = [a for a in args if not a.startswith("-")]
verb = verbs[0] if verbs else ""
fail = os.path.join(state, "fail-" + verb)
if os.path.exists(fail):
    sys.stderr.write(open(fail).read() or "Failed to " + verb + ": fake failure\n")
    sys.exit(1)
hook = os.path.join(state, "on-" + verb)
if os.path.exists(hook):  # what the verb does to a real process the test runs (FakeSystemd.on)
    import subprocess
    code = subprocess.run([hook, *args]).returncode
    if code:  # what systemctl says when the start job failed: the hook printed it
        sys.exit(code)
if verb == "show":
    sys.stdout.write(open(os.path.join(state, "show.txt")).read())
elif verb == "is-enabled":
    print("enabled")
elif verb == "is-active":
    print("active")
'''

FAKE_JOURNALCTL = r'''#!{python}
import json, os, sys
state = os.environ["FAKE_SYSTEMD_DIR"]
with open(os.path.join(state, "argv.log"), "a") as fh:
    fh.write(json.dumps(["journalctl", *sys.argv[1:]]) + "\n")
path = os.path.join(state, "journal.txt")
lines = open(path).read().splitlines() if os.path.exists(path) else []
if "-n" not in sys.argv[1:] or sys.argv[sys.argv.index("-n") + 1] != "1":
    # the whole log of one start (kimi_deploy.host.allreduce.journal_command): journal-full.txt, else journal.txt
    full = os.path.join(state, "journal-full.txt")
    sys.stdout.write(open(full).read() if os.path.exists(full) else "".join(line + "\n" for line in lines))
    sys.exit(0)
counter = os.path.join(state, "journal.pos")
pos = int(open(counter).read()) if os.path.exists(counter) else 0
if lines:
    print(lines[min(pos, len(lines) - 1)])
open(counter, "w").write(str(pos + 1))
'''

#: The MainPID of a fake active unit: PID_MAX_LIMIT + 1 (4194304 + 1, linux/threads.h on 64-bit), a pid no
#: process can have. ``status`` falls back to ``/proc/<MainPID>/cmdline`` when ``/server_info`` does not answer,
#: and a made-up pid such as 48213 can be a real process on a busy machine (an SGLang test server of another
#: run: its command line then reads as launch drift).
FAKE_MAIN_PID = 4194305

#: ``systemctl show kimi-test.service --property=...`` of an active unit, in systemd 252's format
#: (``Property=value`` lines in systemd's own order, not the order asked for).
SHOW_ACTIVE = """\
Id=kimi-test.service
MainPID={pid}
ExecMainStartTimestamp=Sat 2025-06-14 10:02:11 UTC
ExecMainStatus=0
Result=success
NRestarts=2
FragmentPath=/etc/systemd/system/kimi-test.service
UnitFileState=enabled
LoadState=loaded
ActiveState=active
SubState=running
"""

SHOW_FAILED = """\
Id=kimi-test.service
MainPID=0
ExecMainStartTimestamp=Sat 2025-06-14 10:02:11 UTC
ExecMainStatus=1
Result=exit-code
NRestarts=0
UnitFileState=enabled
LoadState=loaded
ActiveState=failed
SubState=failed
"""

#: A start that failed under ``Restart=on-failure``, during ``RestartSec=`` (systemd 252: the unit is never
#: ``failed`` then; seen in the container tier as "Failed with result 'exit-code'" then "Scheduled restart job").
SHOW_AUTO_RESTART = SHOW_FAILED.replace("ActiveState=failed", "ActiveState=activating").replace(
    "SubState=failed", "SubState=auto-restart")

#: What systemd 252's ``systemctl show`` prints (stderr, exit 1) in a container without systemd as PID 1.
NO_SYSTEMD_STDERR = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
                     "Failed to connect to bus: Host is down\n")

#: Log lines of an SGLang 0.5.23 cold start, as ``journalctl -o cat`` shows them (TP0 only).
STARTUP_JOURNAL = [
    "[2025-06-14 10:02:15] server_args=ServerArgs(model_path='/models/x', tp_size=8, ...)",
    "[2025-06-14 10:02:40 TP0] Load weight begin. avail mem=93.51 GB",
    "Loading safetensors checkpoint shards:  41% Completed | 26/64 [02:01<02:57,  4.68s/it]",
    "[2025-06-14 10:07:02 TP0] Load weight end. elapsed=262.1 s, type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=24.87 GB, mem usage=68.64 GB.",
    "[2025-06-14 10:07:09 TP0] Memory pool end. avail mem=6.02 GB",
    "[2025-06-14 10:07:11 TP0] Capture target decode CUDA graph begin. backend=full, bs=[1, 2, 4, 8], "
    "avail mem=5.98 GB",
    "[2025-06-14 10:09:40 TP0] Capture draft decode CUDA graph begin. backend=full, bs=[1, 2, 4, 8], "
    "avail mem=4.10 GB",
    "[2025-06-14 10:11:02] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
    "[2025-06-14 10:11:30] The server is fired up and ready to roll!",
]


class FakeSystemd:
    """A folder with fake ``systemctl``/``journalctl`` on PATH and their state files."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "fake-systemd"
        self.bin = self.dir / "bin"
        self.bin.mkdir(parents=True)
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
            path = self.bin / name
            path.write_text(text.replace("{python}", sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.set_show(SHOW_ACTIVE.format(pid=0))

    def set_show(self, text: str) -> None:
        (self.dir / "show.txt").write_text(text)

    def serve_from_this_process(self) -> None:
        """An active unit whose control group is this test process's: the loopback server the test runs in this
        process is then the unit's own listener for ``status`` (kimi_deploy.host.answering), as on a host; its
        MainPID is :data:`FAKE_MAIN_PID` (no process: no command line read as launch drift)."""
        from kimi_deploy.host.answering import PROC, parse_cgroup

        own = parse_cgroup((PROC / "self" / "cgroup").read_text())
        self.set_show(SHOW_ACTIVE.format(pid=FAKE_MAIN_PID) + f"ControlGroup={own}\n")

    def set_journal(self, lines: list[str]) -> None:
        (self.dir / "journal.txt").write_text("\n".join(lines) + "\n")

    def set_full_journal(self, lines: list[str]) -> None:
        """What ``journalctl -u UNIT --since ...`` prints: every line of the current start."""
        (self.dir / "journal-full.txt").write_text("\n".join(lines) + "\n")

    def fail(self, verb: str, stderr: str = "") -> None:
        """Make ``systemctl VERB`` exit 1 printing ``stderr`` (default ``Failed to VERB: fake failure``)."""
        (self.dir / f"fail-{verb}").write_text(stderr)

    def on(self, verb: str, script: str) -> None:
        """Run ``script`` (an executable's text, given systemctl's arguments) for ``systemctl VERB``: e.g. a
        ``restart`` that really restarts the loopback server standing for the unit's process. A non-zero exit
        of ``script`` is systemctl's (a start job that failed: ``script`` prints systemctl's message)."""
        path = self.dir / f"on-{verb}"
        path.write_text(script)
        path.chmod(0o755)

    def calls(self, program: str = "systemctl") -> list[list[str]]:
        log = self.dir / "argv.log"
        if not log.exists():
            return []
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        return [row[1:] for row in rows if row[0] == program]

    def verbs(self) -> list[str]:
        """systemctl calls as ``verb unit...`` strings, queries (show/is-*) left out."""
        out = []
        for argv in self.calls():
            words = [a for a in argv if not a.startswith("--")]
            if words and words[0] not in ("show", "is-enabled", "is-active"):
                out.append(" ".join(words))
        return out


#: ``/server_info`` fields SGLang 0.5.23 adds to the resolved server arguments
#: (``srt/utils/common.py`` ``build_server_info``, http_server.py), as the replay server serves them.
SERVER_INFO_EXTRA = {"max_total_num_tokens": 1048576, "internal_states": [{"avg_spec_accept_length": 2.9,
                                                                           "last_gen_throughput": 0.0}],
                     "version": "0.5.23", "frontend": "python"}


def sglang_server_args(profile: Any = None, **overrides: Any) -> dict[str, Any]:
    """The resolved server arguments SGLang 0.5.23 reports for a server launched from ``profile``.

    A subset of ``ServerArgs`` under its own field names: what ``/model_info``, ``/server_info`` and
    ``/v1/models`` derive from (``served_model_name`` defaults to ``model_path``, as in
    ``ServerArgs.__post_init__``). ``profile`` None: :func:`write_profile`'s values.
    ``overrides`` replace fields, e.g. ``tool_call_parser=None`` for a server launched without it.
    """
    s = profile.sglang if profile is not None else None
    model_path = s.model_path if s else SMALL_MODEL
    args = {
        "model_path": model_path, "tokenizer_path": model_path,
        "served_model_name": (s.served_model_name if s else None) or model_path,
        "host": s.host if s else "127.0.0.1", "port": s.port if s else 30000,
        "tp_size": s.tp_size if s else 1, "context_length": s.context_length if s else 1000,
        "tool_call_parser": s.tool_call_parser if s else "kimi_k2",
        "reasoning_parser": s.reasoning_parser if s else "kimi_k2",
        "speculative_algorithm": s.speculative_algorithm if s else None,
        "speculative_num_steps": s.speculative_num_steps if s else None,
        "speculative_eagle_topk": s.speculative_eagle_topk if s else None,
        "speculative_num_draft_tokens": s.speculative_num_draft_tokens if s else None,
        "load_format": "auto", "weight_version": "default", "disaggregation_mode": "null",
        "preferred_sampling_params": None, "launch_command": None,
    }
    args.update(overrides)
    return args


class FakeServer:
    """A loopback HTTP server answering like SGLang 0.5.23's health, info and model-list endpoints.

    ``ready(n)`` decides whether the n-th ``/health`` or ``/health_generate`` call (1-based, both run
    a 1-token generation in 0.5.23) answers 200 (else 503). ``args()`` gives the running server's
    resolved arguments (:func:`sglang_server_args`), from which ``/model_info``, ``/server_info``
    and ``/v1/models`` are built in the shapes of http_server.py 0.5.23 (tests/replay/server.py
    serves the same ones from SGLang's own code); ``args()`` None: those routes answer 404.
    With ``api_key``, every route but ``/health*`` and ``/ready`` needs ``Authorization: Bearer
    <key>`` (401 otherwise), as SGLang's API-key middleware does. ``paths`` logs every GET,
    ``unauthorized`` every path answered 401.
    """

    def __init__(self, *, ready: Callable[[int], bool] = lambda n: True,
                 args: Callable[[], dict[str, Any] | None] = sglang_server_args,
                 api_key: str | None = None) -> None:
        self.ready = ready
        self.args = args
        self.api_key = api_key
        self.health_calls = 0
        self.paths: list[str] = []
        self.unauthorized: list[str] = []
        server = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                server.paths.append(self.path)
                if self.path in ("/health", "/health_generate"):
                    server.health_calls += 1
                    ok = server.ready(server.health_calls)
                    return self._send(200 if ok else 503, {} if ok else {"detail": "starting"})
                if self.path == "/ready":
                    return self._send(200, {})
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    server.unauthorized.append(self.path)
                    return self._send(401, {"error": "Unauthorized"})
                route = {"/model_info": _model_info, "/server_info": _server_info, "/v1/models": _models}
                args = server.args() if self.path in route else None
                if args is None:
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, route[self.path](args))

        self.http = Loopback(Handler, start=False)  # serves from __enter__
        self.port = self.http.port

    def __enter__(self) -> "FakeServer":
        self.http.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.http.close()


def _model_info(args: dict[str, Any]) -> dict[str, Any]:
    """``GET /model_info`` of SGLang 0.5.23 (http_server.py; fields in its order)."""
    return {"model_path": args["model_path"], "served_model_name": args["served_model_name"],
            "tokenizer_path": args["tokenizer_path"], "is_generation": True,
            "preferred_sampling_params": args["preferred_sampling_params"],
            "weight_version": args["weight_version"], "load_format": args["load_format"],
            "reasoning_parser": args["reasoning_parser"], "tool_call_parser": args["tool_call_parser"],
            "disaggregation_mode": args["disaggregation_mode"], "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "kimi_k25",
            "architectures": ["KimiK25ForConditionalGeneration"]}


def _server_info(args: dict[str, Any]) -> dict[str, Any]:
    """``GET /server_info``: the resolved server arguments, ``launch_command``, scheduler info, ``version``."""
    return {**args, **SERVER_INFO_EXTRA}


def _models(args: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/models``: an OpenAI model list with SGLang's ``ModelCard`` (one served name)."""
    name = args["served_model_name"]
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 1749895200, "owned_by": "sglang",
                                        "root": name, "parent": None,
                                        "max_model_len": args["context_length"] or 262144}]}


#: The model of a test profile on fewer than 8 GPUs: a path the model table does not know (its fit is the memory
#: plan's, not the table's), served with the Kimi parsers like the stand-in servers.
SMALL_MODEL = "/models/test/kimi-parsers-small"


def write_profile(path: Path, *, port: int = 30000, context_length: int = 1000, name: str = "kimi-test",
                  api_key: bool = True, cache_dir: str | None = None, python: str | None = None,
                  sglang_lines: tuple[str, ...] = (), gpu_count: int = 1, model_path: str | None = None) -> Path:
    """A small valid profile (loopback host) whose ``context_length`` tells two versions apart.

    ``python``: ``[service] python`` (the SGLang interpreter; the profile default otherwise);
    ``gpu_count``: ``[service] gpu_count`` and ``[sglang] tp_size``; ``model_path``: default Kimi-K2.5 on 8 GPUs
    and more, else :data:`SMALL_MODEL` (Kimi-K2.5 does not fit fewer of the model table's reference GPUs, and every
    verb refuses a model that cannot fit: kimi_deploy.deployment.require_fit);
    ``sglang_lines``: more ``key = value`` lines of ``[sglang]``.
    """
    lines = ["[service]", f'name = "{name}"', 'user = "sglang"', 'group = "sglang"', f"gpu_count = {gpu_count}",
             "timeout_start_sec = 600"]
    if python:
        lines.append(f'python = "{python}"')
    if cache_dir:
        lines.append(f'cache_dir = "{cache_dir}"')
    if model_path is None:
        model_path = "/models/moonshotai/Kimi-K2.5" if gpu_count >= 8 else SMALL_MODEL
    lines += ["", "[sglang]", f'model_path = "{model_path}"', 'host = "127.0.0.1"', f"port = {port}",
              f"context_length = {context_length}", 'tool_call_parser = "kimi_k2"', 'reasoning_parser = "kimi_k2"']
    if gpu_count != 1:
        lines.append(f"tp_size = {gpu_count}")
    if api_key:
        lines.append(f'api_key_file = "/etc/kimi-deploy/{name}.api-key"')
    lines += list(sglang_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes); symlinks as their target."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("-> " + os.readlink(path)).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out
