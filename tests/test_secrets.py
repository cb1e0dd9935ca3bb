"""No key in anything bench and check write or build (issue #11 item 4).

- bench against the replay server (SGLang 0.5.23's serving layer, unpatched: ``/server_info`` holds
  ``api_key`` and ``--api-key KEY`` inside ``launch_command``): the key reaches neither the JSON (0600),
  the CSV, the table nor stdout; ``--api-key`` on argv is refused; the key comes from
  ``--api-key-file`` or ``KIMI_DEPLOY_API_KEY``.
- check against a hostile loopback server that echoes the Authorization header into its error bodies:
  no report holds the key.
- a key bound for plain http to a host that is not this one is refused (exit 2) without ``--insecure``,
  in both verbs; with it, a warning on stderr. Run in a network namespace of its own (``unshare -rn``,
  only ``lo``), so nothing can leave the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kimi_deploy.wire.apikey import guard_transport, is_local_host
from kimi_deploy.deployment import resolve
from kimi_deploy.errors import ExitCode, UsageError
from kimi_deploy.redact import MASK
from loopback import Loopback, QuietHandler

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-secrets-test-key-0123456789"


def kimi(*args: str, env: dict | None = None, timeout: float = 300, prefix: tuple[str, ...] = ()) \
        -> subprocess.CompletedProcess:
    """The CLI in a child process (real argv, real stdout/stderr, this worktree's code)."""
    full_env = {k: v for k, v in os.environ.items() if k != "KIMI_DEPLOY_API_KEY"}
    full_env.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([*prefix, sys.executable, "-m", "kimi_deploy", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


def _key_file(tmp_path: Path, key: str = KEY) -> Path:
    path = tmp_path / "api-key"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def _no_key_in(paths: list[Path], *texts: str, key: str = KEY) -> None:
    for p in paths:
        assert key.encode() not in p.read_bytes(), p
    for t in texts:
        assert key not in t


# --- the replay server: SGLang 0.5.23 unpatched, with --api-key ---

@pytest.fixture(scope="module")
def replay(sglang_python, tmp_path_factory):
    from test_check_replay import Replay

    server = Replay(sglang_python, ["--api-key", KEY], tmp_path_factory.mktemp("replay") / "server.log")
    yield server.url()
    server.stop()


@pytest.mark.sglang
def test_bench_writes_no_key_of_an_unpatched_sglang(replay, tmp_path):
    info = httpx.get(f"{replay}/server_info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["api_key"] == KEY and f"--api-key {KEY}" in info["launch_command"]  # the premise: SGLang tells
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    run = kimi("bench", "--base-url", replay, "--api-key-file", str(_key_file(tmp_path)), "--concurrency", "1",
               "--num-prompts", "2", "--warmup", "0", "--max-tokens", "8", "--no-progress", "--no-flush-cache",
               "--json", str(out_json), "--csv", str(out_csv))
    assert run.returncode == 0, run.stderr
    _no_key_in([out_json, out_csv], run.stdout, run.stderr)
    result = json.loads(out_json.read_text())
    server_info = result["server"]["server_info"]
    assert server_info["api_key"] == MASK
    assert f"--api-key {MASK}" in server_info["launch_command"]
    assert server_info["tp_size"] == 8 and result["points"][0]["summary"]["completed"] == 2  # the rest is kept
    assert stat.S_IMODE(out_json.stat().st_mode) == 0o600


@pytest.mark.sglang
def test_bench_key_from_the_environment_and_json_on_stdout(replay, tmp_path):
    run = kimi("bench", "--base-url", replay, "--concurrency", "1", "--num-prompts", "1", "--warmup", "0",
               "--max-tokens", "4", "--no-progress", "--no-flush-cache", "--json", "-",
               env={"KIMI_DEPLOY_API_KEY": KEY})
    assert run.returncode == 0, run.stderr
    _no_key_in([], run.stdout, run.stderr)
    assert json.loads(run.stdout)["server"]["server_info"]["api_key"] == MASK


def test_bench_refuses_a_key_on_argv(tmp_path):
    run = kimi("bench", "--base-url", "http://127.0.0.1:9", "--api-key", KEY, "--json", str(tmp_path / "r.json"))
    assert run.returncode == ExitCode.USAGE, run.stderr
    assert "--api-key-file" in run.stderr and "KIMI_DEPLOY_API_KEY" in run.stderr
    _no_key_in([], run.stdout, run.stderr)
    assert not (tmp_path / "r.json").exists()


# --- check against a server that echoes the key wherever it can ---

class Echo(QuietHandler):
    """Every answer carries the caller's Authorization header: /server_info as unpatched SGLang
    (``api_key``, ``launch_command``), everything else a 500 whose body quotes the header."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        auth = self.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ")
        if self.path in ("/server_info", "/get_server_info"):
            self._send(200, {"api_key": key, "launch_command": f"--model-path /m --api-key {key} --port 1",
                             "version": key, "tool_call_parser": key, "served_model_name": "m"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self._send(500, {"error": f"bad header {auth}", "key": key})

    do_POST = do_GET  # noqa: N815


@pytest.fixture
def echo():
    with Loopback(Echo) as server:
        yield server.url


def test_check_reports_hold_no_key_a_server_echoes(echo, tmp_path):
    files = [tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.prom"]
    run = kimi("check", "--base-url", echo, "--api-key-file", str(_key_file(tmp_path)), "--timeout", "5",
               "--deadline", "60", "--json", str(files[0]), "--junit", str(files[1]), "--prom", str(files[2]))
    assert run.returncode in (ExitCode.FAILED, ExitCode.UNREACHABLE), run.stderr
    _no_key_in(files, run.stdout, run.stderr)
    assert MASK in files[0].read_text()  # the server did echo it, and it was masked


# --- plain http to another host: refused, or a warning with --insecure ---

def test_local_hosts():
    for host in ("localhost", "LOCALHOST.", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "::ffff:127.0.0.1"):
        assert is_local_host(host), host
    # a name under .localhost is resolved by the system resolver, which may ask DNS: not known to be local
    for host in ("192.0.2.1", "example.com", "0.0.0.0", "::", "224.0.0.1", "", None, "not an address",
                 "evil.localhost", "localhost.example.com", "0x7f000001"):
        assert not is_local_host(host), host


def test_guard_transport():
    guard_transport("http://192.0.2.1:30000", None, insecure=False)  # no key: nothing to protect
    guard_transport("https://192.0.2.1:30000", KEY, insecure=False)
    guard_transport("http://[::1]:30000", KEY, insecure=False)
    with pytest.raises(UsageError) as err:
        guard_transport("http://192.0.2.1:30000", KEY, insecure=False)
    assert "--insecure" in err.value.hint and KEY not in err.value.render()
    said: list[str] = []
    guard_transport("http://192.0.2.1:30000", KEY, insecure=True, warn=said.append)
    assert len(said) == 1 and "plain http" in said[0] and KEY not in said[0]


def test_a_worker_the_profile_names_gets_the_key_a_url_only_a_gateway_lists_does_not():
    from kimi_deploy.check.runner import guard_key
    from kimi_deploy.profile import parse_profile

    profile = parse_profile({"service": {"name": "x"},
                             "sglang": {"model_path": "/m", "host": "0.0.0.0",
                                        "api_key_file": "/etc/kimi-deploy/x.api-key"},
                             "fleet": {"replicas": [{"nodes": ["192.0.2.1"]}, {"nodes": ["192.0.2.2"]}]},
                             "gateway": {"host": "192.0.2.9"}})
    workers = resolve(profile, launches=False).worker_urls
    guard_key("http://192.0.2.1:30000", KEY, workers, insecure=False)  # the fleet's own: smg sends it there too
    guard_key("http://192.0.2.2:30000/", KEY, workers, insecure=False)
    for url in ("http://192.0.2.3:30000", "http://192.0.2.1:30001"):
        with pytest.raises(UsageError):
            guard_key(url, KEY, workers, insecure=False)
    with pytest.raises(UsageError):
        guard_key("http://192.0.2.1:30000", KEY, (), insecure=False)


def test_each_worker_never_sends_the_key_in_clear_to_a_worker_only_the_gateway_lists(tmp_path):
    """A gateway (hostile, or listing a host the profile does not name) lists a local worker, then a remote
    plain-http one: the remote one is refused (exit 2, never contacted), the local one is still checked and the
    report says both (issue #30 item 8: a refused worker is that worker's failure, not the run's end)."""
    asked: list[str] = []

    class Worker(QuietHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            asked.append(self.path)
            self._send(200, {})

        do_POST = do_GET  # noqa: N815

    with Loopback(Worker) as worker:
        listing = {"workers": [{"id": "a", "url": worker.url, "status": "ready", "is_healthy": True, "load": 0},
                               {"id": "b", "url": "http://192.0.2.1:30000", "status": "ready", "is_healthy": True,
                                "load": 0}]}

        class Gw(QuietHandler):
            def do_GET(self):  # noqa: N802
                self._send(200, listing)

        with Loopback(Gw) as gateway:
            run = kimi("check", "--base-url", gateway.url, "--each-worker", "--api-key-file",
                       str(_key_file(tmp_path)), "--only", "health.live", "--timeout", "2", "--json", "-")
    assert run.returncode == ExitCode.USAGE, run.stderr
    doc = json.loads(run.stdout)
    refused = doc["workers"][1]
    assert refused["report"] is None and refused["exit_code"] == ExitCode.USAGE
    assert "lists http://192.0.2.1:30000, which is not in the profile's [fleet] replicas" in refused["error"]
    assert "in clear text over plain http" in refused["error"]
    assert asked and doc["workers"][0]["exit_code"] == ExitCode.OK, (run.stderr, asked)


def _netns() -> tuple[str, ...]:
    """A user + network namespace holding only ``lo`` (with 10.9.9.9 on it); skip where unshare cannot."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs unshare (util-linux) and ip (iproute2)")
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"unprivileged network namespaces are not available: {probe.stderr.decode().strip()}")
    return ("unshare", "-rn", "sh", "-c", 'ip link set lo up && ip addr add 10.9.9.9/32 dev lo && exec "$@"', "sh")


@pytest.mark.parametrize("verb", ["check", "bench"])
def test_plain_http_to_another_host_is_refused_then_warned(verb, tmp_path):
    prefix = _netns()
    key = str(_key_file(tmp_path))
    args = ("--base-url", "http://192.0.2.1:30000", "--api-key-file", key)
    extra = ("--timeout", "2", "--deadline", "5", "--only", "health.live") if verb == "check" else \
        ("--concurrency", "1", "--num-prompts", "1", "--request-timeout", "2", "--no-progress")
    refused = kimi(verb, *args, *extra, prefix=prefix)
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    assert "plain http" in refused.stderr and "--insecure" in refused.stderr
    sent = kimi(verb, *args, *extra, "--insecure", prefix=prefix)  # only lo: the connection fails at once
    assert sent.returncode == ExitCode.UNREACHABLE, sent.stderr
    assert "warning: --insecure" in sent.stderr
    _no_key_in([], refused.stdout, refused.stderr, sent.stdout, sent.stderr)


def test_an_address_of_this_host_is_local(tmp_path):
    """10.9.9.9 is on this namespace's lo: plain http to it never leaves the machine, so no --insecure."""
    prefix = _netns()
    code = ("from kimi_deploy.wire.apikey import is_local_host as f; import sys; "
            "sys.exit(0 if f('10.9.9.9') and not f('10.9.9.8') else 1)")
    run = subprocess.run([*prefix, sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


class EchoModels(Echo):
    """/server_info answers 200 and /v1/models a body without models that quotes the key: bench then fails
    with "no --model given" and that body as the error's value."""

    def do_GET(self):  # noqa: N802
        key = self.headers.get("Authorization", "").removeprefix("Bearer ")
        self._send(200 if self.path == "/server_info" else 500, {"seen": key, "api_key": key})


def test_bench_errors_quote_no_key():
    with Loopback(EchoModels) as server:
        run = kimi("bench", "--base-url", server.url, "--concurrency", "1",
                   "--num-prompts", "1", "--no-progress", env={"KIMI_DEPLOY_API_KEY": KEY})
    assert run.returncode == ExitCode.USAGE and "no --model given" in run.stderr, run.stderr
    assert MASK in run.stderr
    _no_key_in([], run.stdout, run.stderr)


# --- a key an HTTP header cannot carry (new-operator trial: a traceback in both verbs) ---

BAD_KEYS = {"a UTF-8 BOM (Notepad)": ("\ufeff" + KEY, "starts with a UTF-8 byte-order mark"),
            "an accented letter": (KEY + "é", "holds U+00E9 at character 31"),
            "a tab": ("sk-two\twords", "holds U+0009 at character 7")}


@pytest.mark.parametrize("verb", ["check", "bench"])
@pytest.mark.parametrize(("key", "message"), BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_key_no_http_header_can_carry_is_refused_with_a_fix(verb, key, message, tmp_path):
    """Was ``UnicodeEncodeError`` from httpx (check) or the bench client's header encoder, exit 1."""
    seen: list[str] = []

    class Any(QuietHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self._send(200, {"object": "list", "data": [{"id": "m"}]})

        do_POST = do_GET

    extra = ("--only", "health.live") if verb == "check" else ("--concurrency", "1", "--num-prompts", "1",
                                                               "--no-progress")
    with Loopback(Any) as server:
        run = kimi(verb, "--base-url", server.url, "--api-key-file", str(_key_file(tmp_path, key)), *extra)
        from_env = kimi("bench", "--base-url", server.url, "--concurrency", "1", "--num-prompts", "1",
                        "--no-progress", env={"KIMI_DEPLOY_API_KEY": key})
    assert run.returncode == ExitCode.USAGE and from_env.returncode == ExitCode.USAGE, (run.stderr, from_env.stderr)
    assert message in run.stderr and "fix:" in run.stderr and "Traceback" not in run.stderr + from_env.stderr
    assert "$KIMI_DEPLOY_API_KEY" in from_env.stderr
    assert seen == []
    _no_key_in([], run.stdout, run.stderr, from_env.stdout, from_env.stderr, key=key.lstrip("\ufeff"))
