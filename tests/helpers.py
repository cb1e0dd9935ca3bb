"""Small helpers shared by tests: writing profiles, running the CLI."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from click.testing import CliRunner, Result

from kimi_deploy.cli import cli


def run_cli(args: list[str], runner: CliRunner | None = None) -> Result:
    """Run ``kimi-deploy ARGS`` in-process; the result has exit_code, stdout, stderr."""
    runner = runner or _runner()
    return runner.invoke(cli, args, obj={}, catch_exceptions=False)


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


MINIMAL = """\
[service]
name = "kimi-k25"
python = "/opt/sglang/.venv/bin/python"

[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
tp_size = 8
"""


def write_profile(tmp_path: Path, text: str, name: str = "profile.toml") -> Path:
    """Write ``text`` as a profile file under ``tmp_path``; returns its path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(text)
    return path


class FakeTime:
    """A monotonic clock (seconds) that moves only when slept on or advanced by the test.

    Pass ``.monotonic`` and ``.sleep`` where the code under test waits (``wait_ready``, ``restart``,
    ``run_checks``, ``fsio.exclusive_lock``): how many polls fit in a timeout, or whether a deadline
    passed, then follows the test's steps and not how fast a loaded machine runs them. ``slept`` lists every sleep asked for.
    Thread-safe enough for a test server thread calling :meth:`advance` (a float add under the GIL).
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Silent:
    """A loopback port that completes TCP handshakes (listen backlog) and never reads or answers.

    :meth:`sent` reads back, after the run, the request line of every connection the client made:
    each one waits in the backlog with its bytes (and its close) until accepted. ``close_after``
    seconds after start the port is closed and every waiting connection reset: a client that does
    not honour its own timeout then fails with a reset instead of hanging the suite (no test
    measures time with it; it only turns a hang into a wrong error).
    """

    def __init__(self, close_after: float = 30.0) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._timer = threading.Timer(close_after, self.sock.close)
        self._timer.daemon = True
        self._timer.start()

    def sent(self) -> list[str]:
        """``METHOD PATH`` of each request sent so far, in connection order (a connection that sent
        nothing, e.g. a refused TLS handshake, is ``"?"``)."""
        lines = []
        self.sock.setblocking(False)
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return lines
            with conn:
                conn.settimeout(10)
                head = b""
                while b"\r\n" not in head and (chunk := conn.recv(4096)):
                    head += chunk
                method, path, *_ = head.decode("latin-1").split(" ", 2) + ["?", "?"]
                lines.append(f"{method} {path}" if b"\r\n" in head else "?")

    def close(self) -> None:
        self._timer.cancel()
        self.sock.close()


def replace_examples(text: str) -> str:
    """``text`` (an init profile) with the example addresses and images replaced, as an operator does
    (the profile refuses them at render and install: kimi_deploy/profile/examples.py)."""
    return text.replace('"192.0.2.', '"10.1.0.').replace('"registry.example/', '"registry.corp.test/').replace(
        'runbook_url = "docs/runbook.md"', f'runbook_url = "{RUNBOOK}"')


#: An absolute runbook URL, as an operator puts one in.
RUNBOOK = "https://git.corp.test/ops/kimi-deploy/blob/main/docs/runbook.md"
