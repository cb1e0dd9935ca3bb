"""Test helpers for install/restart/status: fake systemctl/journalctl, a loopback SGLang stand-in, profiles.

Fakes stand in only for what cannot run here: a running systemd (``systemctl restart/show``,
``journalctl``) and a GPU-backed SGLang server. The fake ``systemctl`` logs its argv (one JSON
list a line) to ``argv.log`` and answers ``show`` with ``show.txt`` (systemd 252's
``Property=value`` format); the fake ``journalctl`` prints the next line of ``journal.txt`` per
call (the last one repeats), as ``journalctl -o cat`` would while a server starts.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

FAKE_SYSTEMCTL = r'''#!{python}
import json, os, sys
state = os.environ["FAKE_SYSTEMD_DIR"]
args = sys.argv[1:]
with open(os.path.join(state, "argv.log"), "a") as fh:
    fh.write(json.dumps(["systemctl", *args]) + "\n")
verbs = [a for a in args if not a.startswith("-")]
verb = verbs[0] if verbs else ""
if os.path.exists(os.path.join(state, "fail-" + verb)):
    sys.stderr.write("Failed to " + verb + ": fake failure\n")
    sys.exit(1)
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
counter = os.path.join(state, "journal.pos")
pos = int(open(counter).read()) if os.path.exists(counter) else 0
if lines:
    print(lines[min(pos, len(lines) - 1)])
open(counter, "w").write(str(pos + 1))
'''

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

    def set_journal(self, lines: list[str]) -> None:
        (self.dir / "journal.txt").write_text("\n".join(lines) + "\n")

    def fail(self, verb: str) -> None:
        (self.dir / f"fail-{verb}").touch()

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


class FakeServer:
    """A loopback HTTP server answering like SGLang 0.5.23's readiness and info endpoints.

    ``ready(n)`` decides whether the n-th ``/health_generate`` call (1-based) answers 200;
    ``model_info()`` and ``server_info()`` give the JSON bodies (None: 404). With ``api_key``,
    ``/model_info`` and ``/server_info`` need ``Authorization: Bearer <key>`` (401 otherwise),
    while ``/health*`` stay open, as in SGLang.
    """

    def __init__(self, *, ready: Callable[[int], bool] = lambda n: True,
                 model_info: Callable[[], dict[str, Any] | None] = lambda: {"tool_call_parser": "kimi_k2"},
                 server_info: Callable[[], dict[str, Any] | None] = lambda: None,
                 api_key: str | None = None) -> None:
        self.ready = ready
        self.model_info = model_info
        self.server_info = server_info
        self.api_key = api_key
        self.health_calls = 0
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output quiet
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's naming
                server.paths.append(self.path)
                if self.path == "/health_generate":
                    server.health_calls += 1
                    ok = server.ready(server.health_calls)
                    return self._send(200 if ok else 503, {} if ok else {"detail": "starting"})
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                body = {"/model_info": server.model_info, "/server_info": server.server_info}.get(self.path)
                data = body() if body else None
                return self._send(200, data) if data is not None else self._send(404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_profile(path: Path, *, port: int = 30000, context_length: int = 1000, name: str = "kimi-test",
                  api_key: bool = True, cache_dir: str | None = None) -> Path:
    """A small valid profile (loopback host) whose ``context_length`` tells two versions apart."""
    lines = ["[service]", f'name = "{name}"', 'user = "sglang"', 'group = "sglang"', "gpu_count = 1",
             "timeout_start_sec = 600"]
    if cache_dir:
        lines.append(f'cache_dir = "{cache_dir}"')
    lines += ["", "[sglang]", 'model_path = "/models/moonshotai/Kimi-K2.5"', 'host = "127.0.0.1"', f"port = {port}",
              f"context_length = {context_length}", 'tool_call_parser = "kimi_k2"', 'reasoning_parser = "kimi_k2"']
    if api_key:
        lines.append(f'api_key_file = "/etc/kimi-deploy/{name}.api-key"')
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
