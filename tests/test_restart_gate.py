"""restart --wait's gate (ready → fast → parser → contract) against SGLang 0.5.23's real serving layer.

Each installed version of the profile points at its own replay server (tests/replay/server.py on the patched
SGLang copy of the ``patched_sglang`` fixture, so the parser tier passes), by port: what systemd would start for
that version is the server on its port. systemctl and journalctl are the recorded fakes (``fake_systemd``):
the restart, the rollback's daemon-reload and restart are seen, not run.

- ``good``: kimi_k2 parsers, the patched tree: every tier passes;
- ``sanitising``: the same behind a proxy that rewrites every returned tool-call id to ``functions_NAME_N``
  (``--sanitise-ids``): health, config and the parsers are fine, tool calls are broken for every client;
- ``mistral``: launched with ``--reasoning-parser mistral`` (and a profile that says so): it waits for
  ``[THINK]``/``[/THINK]``, so Kimi's reasoning leaks into the content.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from install_fakes import write_profile
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.host import gate as gates
from kimi_deploy.host.install.apply import apply
from kimi_deploy.host.install.install_plan import plan_install
from kimi_deploy.paths import HostLayout
from kimi_deploy.profile import load_profile

pytestmark = pytest.mark.sglang

UNIT = "etc/systemd/system/kimi-test.service"
REPLAY_ARGS = ["--tp-size", "8", "--no-speculative"]  # as the 8-GPU profile of _profile says (Kimi-K2.5 fits 8)


@pytest.fixture(scope="module")
def servers(patched_sglang, tmp_path_factory):
    """``{"good", "sanitising", "mistral"}`` replay servers on the patched SGLang copy, started concurrently."""
    from replay_process import Replay

    python, _state = patched_sglang
    logs = tmp_path_factory.mktemp("gate-replay-logs")
    started = {
        "good": Replay(python, REPLAY_ARGS, logs / "good.log"),
        "sanitising": Replay(python, [*REPLAY_ARGS, "--sanitise-ids"], logs / "sanitising.log"),
        "mistral": Replay(python, [*REPLAY_ARGS, "--reasoning-parser", "mistral"], logs / "mistral.log"),
    }
    yield {name: int(server.url().rsplit(":", 1)[1]) for name, server in started.items()}
    for server in started.values():
        server.stop()


def _profile(path: Path, port: int, context_length: int, *lines: str) -> Path:
    return write_profile(path, port=port, context_length=context_length, gpu_count=8,
                         sglang_lines=('served_model_name = "moonshotai/Kimi-K2.5"', *lines))


def _install(root: Path, profile: Path, **kw) -> None:
    apply(plan_install(load_profile(profile), HostLayout(root), enable=False, create_user=False, **kw))


def _restart(cli_runner, root: Path, *args: str):
    result = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--timeout", "30",
                                     "--poll-interval", "0.05", "--json", *args], catch_exceptions=False)
    return result, json.loads(result.output)


def test_the_default_gate_is_contract_and_every_tier_passes_with_its_time(cli_runner, tmp_path, fake_systemd,
                                                                          servers):
    root = tmp_path / "root"
    root.mkdir()
    _install(root, _profile(tmp_path / "v1.toml", servers["good"], 1000))
    result, data = _restart(cli_runner, root)
    assert result.exit_code == 0, result.output
    gate = data["attempts"][0]["gate"]
    assert gate["gate"] == "contract" and gate["ok"] and data["failed_tier"] is None
    assert [t["tier"] for t in gate["tiers"]] == list(gates.TIERS)
    assert all(t["ok"] and t["seconds"] >= 0 for t in gate["tiers"])
    ids = [r["id"] for r in data["attempts"][0]["checks"]["results"]]
    assert [i for i in ids if i.startswith("contract.")] == list(gates.CONTRACT_SUBSET)
    assert any(i.startswith("parser.reasoning.") for i in ids) and "config.tool_call_parser" in ids
    assert {r["status"] for r in data["attempts"][0]["checks"]["results"]} == {"pass"}
    assert fake_systemd.verbs() == ["restart kimi-test.service"]


def test_broken_tool_calls_are_rolled_back_with_the_failed_check_named(cli_runner, tmp_path, fake_systemd, servers):
    """The new version answers health, runs both parsers, passes the parser corpus, and returns every tool-call
    id sanitised: the contract tier catches it, the previous files come back and pass the same gate."""
    root = tmp_path / "root"
    root.mkdir()
    _install(root, _profile(tmp_path / "v1.toml", servers["good"], 1000))
    v1 = {p: (root / p).read_bytes() for p in (UNIT, "etc/kimi-deploy/kimi-test.toml", "etc/kimi-deploy/kimi-test.env")}
    _install(root, _profile(tmp_path / "v2.toml", servers["sanitising"], 2000))
    result, data = _restart(cli_runner, root, "--rollback-on-failure")
    assert result.exit_code == ExitCode.FAILED, result.output
    new, back = data["attempts"]
    assert data["failed_tier"] == "contract" and data["rolled_back"]
    assert [t["tier"] for t in new["gate"]["tiers"]] == list(gates.TIERS)
    assert [t["ok"] for t in new["gate"]["tiers"]] == [True, True, True, False]
    assert "contract.tool_auto.nonstream" in data["failed_checks"]
    assert "contract.tool_auto.stream" in data["failed_checks"]
    assert "contract.reasoning_on.nonstream" not in data["failed_checks"]  # no tool call there: unaffected
    failed = {r["id"]: r for r in new["checks"]["results"] if r["status"] == "fail"}
    assert "functions_get_weather_" in failed["contract.tool_auto.nonstream"]["detail"]
    assert back["ok"] and back["gate"]["ok"] and back["gate"]["gate"] == "contract"
    for rel, old in v1.items():
        assert (root / rel).read_bytes() == old, rel
    assert fake_systemd.verbs() == ["restart kimi-test.service", "daemon-reload", "restart kimi-test.service"]
    human = cli_runner.invoke(cli, ["restart", "--root", str(root), "--host-systemd", "--wait", "--poll-interval", "0.05"])
    assert human.exit_code == 0, human.output  # the restored version, gated again by hand


def test_a_profile_change_that_breaks_reasoning_separation_is_rolled_back(cli_runner, tmp_path, fake_systemd,
                                                                           servers):
    """reasoning_parser mistral ([THINK] markers) on Kimi output: the config tier agrees with the profile, the
    parser corpus skips its reasoning cases (not kimi_k2), and the contract tier finds the reasoning in the content."""
    root = tmp_path / "root"
    root.mkdir()
    _install(root, _profile(tmp_path / "v1.toml", servers["good"], 1000))
    v2 = _profile(tmp_path / "v2.toml", servers["mistral"], 2000)
    v2.write_text(v2.read_text().replace('reasoning_parser = "kimi_k2"', 'reasoning_parser = "mistral"'))
    _install(root, v2)
    result, data = _restart(cli_runner, root, "--rollback-on-failure")
    assert result.exit_code == ExitCode.FAILED, result.output
    assert data["failed_tier"] == "contract"
    assert {"contract.reasoning_on.nonstream", "contract.reasoning_on.stream"} <= set(data["failed_checks"])
    assert data["attempts"][1]["ok"] and 'reasoning_parser = "kimi_k2"' in (
        root / "etc/kimi-deploy/kimi-test.toml").read_text()


def test_a_restored_version_that_fails_the_gate_too_is_exit_10(cli_runner, tmp_path, fake_systemd, servers):
    root = tmp_path / "root"
    root.mkdir()
    _install(root, _profile(tmp_path / "v1.toml", servers["sanitising"], 1000))
    _install(root, _profile(tmp_path / "v2.toml", servers["sanitising"], 2000))
    result, data = _restart(cli_runner, root, "--rollback-on-failure")
    assert result.exit_code == ExitCode.ROLLBACK_FAILED == 10, result.output
    assert data["failed_tier"] == "contract" and not data["attempts"][1]["ok"]
    assert data["attempts"][1]["gate"]["failed_tier"] == "contract"
    assert any("failed the contract gate too" in n for n in data["notes"])


def test_gate_fast_stops_before_the_broken_contract(cli_runner, tmp_path, fake_systemd, servers):
    """--gate chooses how far: the sanitising server passes a fast gate (what restart checked before)."""
    root = tmp_path / "root"
    root.mkdir()
    _install(root, _profile(tmp_path / "v1.toml", servers["sanitising"], 1000))
    result, data = _restart(cli_runner, root, "--gate", "fast")
    assert result.exit_code == 0, result.output
    assert [t["tier"] for t in data["attempts"][0]["gate"]["tiers"]] == ["ready", "fast"]
    result, data = _restart(cli_runner, root, "--gate", "ready")
    assert result.exit_code == 0 and data["attempts"][0]["checks"] is None
