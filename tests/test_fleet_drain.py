"""restart --wait of a replica when the gateway is down, refuses the drain, answers what is not smg's worker list,
keeps the replica draining, or when the restart itself fails after the drain: each is a named exit code, one
message that says where the replica is (in rotation, out of it) and whether anything was restarted, and never a
traceback. The gateway here is a loopback stand-in answering smg 1.13.0's worker API shapes (the real smg's
answers are tests/test_fleet_gateway.py's); systemd is the fake systemctl (tests/install_fakes.py).
"""

from __future__ import annotations

import json

import pytest

from helpers import run_cli, write_profile
from kimi_deploy.host import gateway
from kimi_deploy.errors import ExitCode
from kimi_deploy.deployment import resolve
from loopback import Loopback, QuietHandler

PROFILE = """\
[service]
name = "kimi-k25"
gpu_count = 8
[sglang]
model_path = "/models/moonshotai/Kimi-K2.5"
host = "0.0.0.0"
port = 30990
tp_size = 8
api_key_file = "/etc/kimi-deploy/kimi-k25.api-key"
[fleet]
[[fleet.replicas]]
nodes = ["127.0.0.2"]
[[fleet.replicas]]
nodes = ["127.0.0.3"]
[gateway]
host = "127.0.0.1"
bind = "127.0.0.1"
port = {port}
"""
URL = "http://127.0.0.2:30990"
LISTED = {"workers": [{"id": "w-1", "url": URL, "status": "ready", "is_healthy": True, "load": 0}], "total": 1}


def _gateway(get, delete=(202, b"{}")):
    """A stand-in gateway answering GET /workers with ``get`` and DELETE /workers/ID with ``delete``."""

    class Handler(QuietHandler):
        calls: list[str] = []

        def do_GET(self):
            Handler.calls.append(f"GET {self.path}")
            self._send(*get) if isinstance(get, tuple) else self._send(200, get)

        def do_DELETE(self):
            Handler.calls.append(f"DELETE {self.path}")
            self._send(*delete)

    return Loopback(Handler), Handler.calls


def _restart(tmp_path, port: int):
    root = tmp_path / "root"
    key = root / "etc/kimi-deploy/kimi-k25.api-key"
    key.parent.mkdir(parents=True)
    key.write_text("sk-drain\n")
    key.chmod(0o600)
    profile = write_profile(tmp_path, PROFILE.replace("{port}", str(port)))
    installed = run_cli(["install", "--profile", str(profile), "--root", str(root), "--host", "127.0.0.2",
                         "--no-create-user", "--no-enable"])
    assert installed.exit_code == 0, installed.stderr
    return run_cli(["restart", "--wait", "--profile", str(profile), "--root", str(root), "--host-systemd", "--host", "127.0.0.2",
                    "--timeout", "5"])


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_gateway_that_is_down_restarts_nothing_and_says_the_replica_was_not_taken_out(tmp_path, fake_systemd):
    result = _restart(tmp_path, _closed_port())
    assert result.exit_code == ExitCode.UNREACHABLE, result.stderr
    assert "Traceback" not in result.stderr
    assert f"nothing was restarted and {URL} was not taken out of the gateway's rotation" in result.stderr
    assert "fix:" in result.stderr and "<name>" not in result.stderr
    assert fake_systemd.verbs() == []


def test_a_gateway_that_refuses_the_drain_restarts_nothing(tmp_path, fake_systemd):
    server, calls = _gateway(LISTED, delete=(403, b'{"error": "forbidden"}'))
    with server:
        result = _restart(tmp_path, server.port)
    assert result.exit_code == ExitCode.FAILED, result.stderr
    assert f"the gateway refused to remove {URL}: 403; nothing was restarted" in result.stderr
    assert "kimi-k25-gateway.service" in result.stderr and "Traceback" not in result.stderr
    assert calls == ["GET /workers", "DELETE /workers/w-1"] and fake_systemd.verbs() == []


BAD_LISTS = [
    ("html", (200, b"<html>a proxy</html>", "text/html"), "not JSON"),
    ("a-list", [1, 2], 'no "workers" list'),
    ("workers-not-a-list", {"workers": {"id": "w"}}, 'no "workers" list'),
    ("entry-not-an-object", {"workers": ["w-1"]}, "a worker entry is str, not an object"),
    ("no-url", {"workers": [{"id": "w-1", "status": "ready", "is_healthy": True}]}, "lacks a string id, url"),
    ("url-a-number", {"workers": [{"id": "w-1", "url": 7, "status": "ready", "is_healthy": True}]}, "lacks a string"),
    ("healthy-a-string", {"workers": [dict(LISTED["workers"][0], is_healthy="yes")]}, "is_healthy of"),
    ("load-a-string", {"workers": [dict(LISTED["workers"][0], load="lots")]}, "load of"),
    ("load-negative", {"workers": [dict(LISTED["workers"][0], load=-1)]}, "not a count of requests"),
    ("load-a-bool", {"workers": [dict(LISTED["workers"][0], load=True)]}, "not a count of requests"),
    ("not-utf8", (200, b'{"workers": ["\xff"]}'), "not JSON"),
]


@pytest.mark.parametrize("answer,said", [pytest.param(a, s, id=i) for i, a, s in BAD_LISTS])
def test_a_worker_list_that_is_not_smgs_is_one_line_and_nothing_restarts(tmp_path, fake_systemd, answer, said):
    server, _ = _gateway(answer)
    with server:
        result = _restart(tmp_path, server.port)
    assert result.exit_code == ExitCode.FAILED, result.stderr
    assert "Traceback" not in result.stderr
    assert "the gateway's GET /workers answer is not smg's worker list" in result.stderr and said in result.stderr
    assert "nothing was restarted" in result.stderr and fake_systemd.verbs() == []


def test_a_worker_list_past_the_cap_is_refused_unread():
    from kimi_deploy.wire.limits import DEFAULT_MAX_BODY_BYTES

    big = json.dumps({"workers": [], "pad": "x" * (DEFAULT_MAX_BODY_BYTES + 10)}).encode()
    server, _ = _gateway((200, big))
    with server, gateway.Gateway(server.url, None) as client:
        with pytest.raises(gateway.GatewayError, match="not smg's worker list: the body exceeded"):
            client.workers()


def test_a_replica_still_draining_after_the_wait_is_out_of_rotation_exit_9(tmp_path, fake_systemd):
    """The gateway takes the DELETE but keeps listing the worker (in-flight requests): the wait ends on an
    injected clock, nothing is restarted, and the exit code says the replica is out of rotation."""
    from kimi_deploy.host import restart as restart_lib
    from kimi_deploy.paths import HostLayout
    from kimi_deploy.profile import load_profile

    server, calls = _gateway({"workers": [dict(LISTED["workers"][0], status="draining")]})
    now = [0.0]
    with server:
        profile = load_profile(write_profile(tmp_path, PROFILE.replace("{port}", str(server.port))))
        client = gateway.Gateway(server.url, None, monotonic=lambda: now[0],
                                 sleep=lambda s: now.__setitem__(0, now[0] + s))
        root = tmp_path / "root"
        (root / "etc/kimi-deploy").mkdir(parents=True)
        (root / "etc/kimi-deploy/kimi-k25.api-key").write_text("sk-drain\n")
        (root / "etc/kimi-deploy/kimi-k25.api-key").chmod(0o600)  # the key-file rule: nothing for other users
        with pytest.raises(gateway.DrainTimeout) as err:
            restart_lib.restart(resolve(profile, launches=False), HostLayout(root), wait=True, drain=restart_lib.Drain(client, URL),
                                node="127.0.0.2")
    assert err.value.exit_code == ExitCode.OUT_OF_ROTATION == 9
    assert f"nothing was restarted, and {URL} is out of the gateway's rotation" in err.value.message
    assert "restart --wait" in err.value.hint and fake_systemd.verbs() == []
    assert calls.count("DELETE /workers/w-1") == 1


def test_a_restart_that_fails_after_the_drain_says_the_replica_stays_out(tmp_path, fake_systemd):
    class Handler(QuietHandler):
        removed = False

        def do_GET(self):
            self._send(200, {"workers": []} if Handler.removed else LISTED)

        def do_DELETE(self):
            Handler.removed = True
            self._send(202, {})

    fake_systemd.fail("restart", "Failed to restart kimi-k25.service: Unit kimi-k25.service not found.\n")
    with Loopback(Handler) as server:
        result = _restart(tmp_path, server.port)
    assert result.exit_code == ExitCode.EXTERNAL, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{URL} was taken out of the gateway's rotation for the restart and stays out" in result.stderr
    assert "restart --wait" in result.stderr


@pytest.fixture
def remote(monkeypatch):
    """``http://127.0.0.9:PORT`` (nothing listens there) counted as another host by the transport guard: the
    tests stay on loopback while the kit treats the worker as remote, as production workers are."""
    from kimi_deploy.wire import apikey

    local = apikey.is_local_host
    monkeypatch.setattr(apikey, "is_local_host", lambda host: host != "127.0.0.9" and local(host))
    return "http://127.0.0.9:30990"  # [sglang] port of PROFILE


def _each_worker(tmp_path, listed: list[str], nodes: list[str]):
    """`check --profile P --each-worker` on the gateway host, as its nightly unit runs it, against a stand-in
    gateway listing ``listed``; the profile's replicas are ``nodes``. Returns (result, what the gateway saw)."""
    server, calls = _gateway({"workers": [{"id": f"w-{i}", "url": url, "status": "ready", "is_healthy": True}
                                          for i, url in enumerate(listed)]})
    replicas = "".join(f'[[fleet.replicas]]\nnodes = ["{n}"]\n' for n in nodes)
    text = PROFILE.replace("{port}", str(server.port))
    text = text[:text.index("[fleet]")] + "[fleet]\n" + replicas + text[text.index("[gateway]"):]
    key = tmp_path / "key"
    key.write_text("sk-drain\n")
    key.chmod(0o600)  # the key-file rule: nothing for other users
    with server:
        result = run_cli(["check", "--profile", str(write_profile(tmp_path, text)), "--each-worker",
                          "--api-key-file", str(key), "--only", "health.*", "--timeout", "5", "--deadline", "10"])
    return result, calls


def test_the_nightly_each_worker_check_reaches_the_workers_the_profile_declares(tmp_path, remote):
    """In production the workers are other hosts over plain http (the gateway forwards the key to them the same
    way): the check of a worker the profile lists is not refused (exit 2, nothing sent). Nothing listens there,
    so its health tier is unreachable (exit 3): that shows it ran."""
    result, _ = _each_worker(tmp_path, [remote], ["127.0.0.9"])
    out = result.stdout + result.stderr
    assert "refusing to send the API key" not in out and result.exit_code == ExitCode.UNREACHABLE, out
    assert f"{remote}: exit 3, 3 checks, 3 failed" in out
    assert f"note: the API key goes to {remote} over plain http, as the gateway sends it there" in out
    assert "warning: --insecure" not in out


def test_each_worker_refuses_a_worker_the_profile_does_not_declare_before_sending_anything(tmp_path, remote):
    """A worker someone added to the gateway (its worker API) is not the profile's: the key is not sent to it in
    clear text, and no worker is checked."""
    result, calls = _each_worker(tmp_path, ["http://127.0.0.2:30990", remote], ["127.0.0.2"])
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert f"the gateway lists {remote}, which is not in the profile's [fleet] replicas" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr and calls == ["GET /workers"]


class _Loads(QuietHandler):
    """A replica answering SGLang 0.5.23's ``GET /v1/loads`` with the next of ``counts`` (running, waiting) per
    poll (the last one repeated); ``None`` answers 404, as a server without the endpoint does."""

    counts: list = []
    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        step = type(self).counts[min(len(type(self).seen), len(type(self).counts)) - 1]
        if step is None:
            self._send(404, {"detail": "Not Found"})
        else:
            running, waiting = step
            self._send(200, {"timestamp": "2026-12-01T00:00:00+00:00", "version": "0.5.23", "num_accelerators": 8,
                             "loads": [{"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
                                        "num_used_tokens": 0}]})


def _loads(counts):
    handler = type("Loads", (_Loads,), {"counts": counts, "seen": []})
    return Loopback(handler), handler.seen


def _clock():
    now = [0.0]
    return now, (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))


def test_the_restart_waits_for_the_requests_still_running_on_the_replica():
    """smg drops a removed worker after a fixed 5 s whatever still runs there: the kit polls the replica's own
    /v1/loads (with the key) until no request runs or waits, on an injected clock."""
    from kimi_deploy.host.restart import wait_idle

    server, seen = _loads([(2, 1), (1, 0), (0, 0)])
    now, clock, sleep = _clock()
    with server:
        assert wait_idle(server.url, "sk-drain", timeout=60, poll=2, clock=clock, sleep=sleep) is None
    assert [path for path, _ in seen] == ["/v1/loads?include=core"] * 3 and now[0] == 4.0
    assert {auth for _, auth in seen} == {"Bearer sk-drain"}


def test_a_replica_that_cannot_say_its_load_is_restarted_after_the_gateways_drain_with_a_note():
    from kimi_deploy.host.restart import wait_idle

    server, seen = _loads([None])
    _, clock, sleep = _clock()
    with server:
        note = wait_idle(server.url, None, timeout=60, poll=2, clock=clock, sleep=sleep)
    assert "reports no request counts (GET /v1/loads: HTTP 404)" in note and len(seen) == 1
    _, clock, sleep = _clock()
    note = wait_idle("http://127.0.0.1:9", None, timeout=60, poll=2, clock=clock, sleep=sleep)  # nothing listens
    assert "did not answer /v1/loads" in note


@pytest.mark.parametrize("loads", [{"loads": []}, {"loads": [{"num_running_reqs": "1", "num_waiting_reqs": 0}]},
                                   {"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]}, [1, 2]])
def test_a_load_answer_of_another_shape_counts_as_unknown_not_idle(loads):
    from kimi_deploy.host.restart import _busy

    assert _busy(loads) is None


def test_a_replica_still_busy_after_the_drain_timeout_is_not_restarted_exit_9(tmp_path, fake_systemd):
    """The gateway dropped the replica but a long generation still runs there: past --drain-timeout nothing is
    restarted, the replica stays out of rotation, and the exit code says so."""
    from kimi_deploy.host import restart as restart_lib
    from kimi_deploy.paths import HostLayout
    from kimi_deploy.profile import load_profile

    replica, seen = _loads([(1, 0)])

    class Gw(QuietHandler):
        removed = False

        def do_GET(self):  # the replica listed until the DELETE
            self._send(200, {"workers": [] if Gw.removed else [dict(LISTED["workers"][0], url=replica.url)]})

        def do_DELETE(self):
            Gw.removed = True
            self._send(202, {})

    _, clock, sleep = _clock()
    with Loopback(Gw) as gw, replica:
        profile = load_profile(write_profile(tmp_path, PROFILE.replace("{port}", str(gw.port))))
        root = tmp_path / "root"
        (root / "etc/kimi-deploy").mkdir(parents=True)
        (root / "etc/kimi-deploy/kimi-k25.api-key").write_text("sk-drain\n")
        (root / "etc/kimi-deploy/kimi-k25.api-key").chmod(0o600)  # the key-file rule: nothing for other users
        client = gateway.Gateway(gw.url, None)
        with pytest.raises(gateway.DrainTimeout) as err:
            restart_lib.restart(resolve(profile, launches=False), HostLayout(root), wait=True, clock=clock, sleep=sleep, node="127.0.0.2",
                                drain=restart_lib.Drain(client, replica.url, idle_timeout=30))
    assert err.value.exit_code == ExitCode.OUT_OF_ROTATION == 9
    assert f"1 request(s) still running or queued on {replica.url} after 30 s" in err.value.message
    assert f"nothing was restarted, and {replica.url} is out of the gateway's rotation" in err.value.message
    assert "--drain-timeout" in err.value.hint and fake_systemd.verbs() == []
    assert len(seen) == 16  # polled at 0, 2, ..., 30 s of the injected clock, then gave up
