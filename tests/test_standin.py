"""The container tier's SGLang stand-in (tests/standin/) outside a container: ``python -m
sglang.launch_server`` with the SGLang test environment's interpreter reads --host, --port and
--api-key from a --config YAML through SGLang's own merger, as the rendered unit relies on."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from container_host import build_model

pytestmark = pytest.mark.sglang

STANDIN = Path(__file__).resolve().parent / "standin"
KEY = 'k"ey: #%$ with spaces'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_server_takes_host_port_and_key_from_the_config_yaml(sglang_python, tmp_path):
    model = build_model(sglang_python, tmp_path / "model")
    port = _free_port()
    config = tmp_path / "secrets.yaml"
    # the kit writes api-key this way (JSON-quoted: docs/runbook.md#render-and-review); host and port too here
    config.write_text(f'host: "127.0.0.1"\nport: {port}\napi-key: "{KEY.replace(chr(34), chr(92) + chr(34))}"\n')
    env = {**os.environ, "PYTHONPATH": str(STANDIN), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sglang_python, "-m", "sglang.launch_server", "--model-path", str(model),
                               "--tool-call-parser", "kimi_k2", "--config", str(config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in server.stdout:
            lines.append(line)
            if "fired up and ready to roll" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(240) or server.poll() is not None, "".join(lines[-40:])
        assert ready.is_set(), "".join(lines[-40:])
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url).status_code == 401
        ok = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == str(model)
        info = httpx.get(f"http://127.0.0.1:{port}/model_info", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert info["tool_call_parser"] == "kimi_k2"
    finally:
        server.terminate()
        server.wait(30)


def test_a_model_folder_without_config_fails_the_start(sglang_python, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(STANDIN), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sglang_python, "-m", "sglang.launch_server", "--model-path", str(empty)],
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 1 and str(empty) in r.stderr.splitlines()[-1]  # SGLang's resolution names it
