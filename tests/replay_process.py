"""One replay server subprocess: SGLang's (tests/replay/server.py) or vLLM's (tests/vllm_replay/server.py).

Both print ``LISTENING <port>`` on stdout once they serve; their logs go to a file.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

SGLANG_SERVER = Path(__file__).parent / "replay" / "server.py"
VLLM_SERVER = Path(__file__).parent / "vllm_replay" / "server.py"


class Replay:
    """One replay server subprocess (started at once, waited for by :meth:`url`).

    ``python``: the SGLang or vLLM test environment's interpreter; ``script``: which server.
    """

    def __init__(self, python: str, args: list[str], log: Path, script: Path = SGLANG_SERVER) -> None:
        self.log = log
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([python, "-W", "ignore", str(script), *args], stdout=subprocess.PIPE,
                                     stderr=log.open("w"), env=env, text=True)
        self._url: str | None = None

    def url(self, timeout: float = 180.0) -> str:
        """``http://127.0.0.1:PORT`` once the server serves (a test failure with its log otherwise)."""
        if self._url:
            return self._url
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("LISTENING "):
                self._url = f"http://127.0.0.1:{int(line.split()[1])}"
                return self._url
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        pytest.fail(f"replay server did not start; its log:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
