"""Two services on one host naming the same things: API key file, port, cache folder, host paths.

Real ``systemctl --root`` on a tmp tree (as in test_install_uninstall.py). Sharing a key file or a
cache folder is legitimate (warned and recorded; ``--purge`` of one keeps it for the other); the
same port, or a path one service uses for something else, is refused without ``--force``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from install_fakes import snapshot, write_profile
from kimi_deploy.host import records as hostfiles
from kimi_deploy.cli import cli
from kimi_deploy.errors import ExitCode
from kimi_deploy.paths import HostLayout

pytestmark = pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl (systemctl --root)")

KEY = "/etc/kimi-deploy/shared.api-key"


def run(cli_runner, *args):
    return cli_runner.invoke(cli, list(args), catch_exceptions=False)


def profile(tmp_path: Path, name: str, port: int, *, key: str | None = KEY, cache_dir: str | None = None) -> Path:
    path = write_profile(tmp_path / f"{name}.toml", name=name, port=port, api_key=False, cache_dir=cache_dir)
    if key:
        path.write_text(path.read_text() + f'api_key_file = "{key}"\n')
    return path


def install(cli_runner, root, path, *extra):
    return run(cli_runner, "install", "--profile", str(path), "--root", str(root), *extra)


def test_a_shared_api_key_file_is_warned_recorded_and_kept_by_purge(cli_runner, root, tmp_path):
    assert install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000)).exit_code == 0
    key = root / KEY.lstrip("/")
    secret = key.read_bytes()

    second = install(cli_runner, root, profile(tmp_path, "kimi-two", 30001))
    assert second.exit_code == 0, second.output + second.stderr
    assert f"warning: the API key file {KEY} is also used by service kimi-k25" in second.output
    assert hostfiles.load_manifest(HostLayout(root), "kimi-two").api_key_file == KEY  # recorded

    dry = run(cli_runner, "uninstall", "--root", str(root), "--name", "kimi-k25", "--purge", "--dry-run")
    assert "remove the API key file" not in dry.output
    assert f"the API key file {KEY} stays: service kimi-two" in dry.output
    done = run(cli_runner, "uninstall", "--root", str(root), "--name", "kimi-k25", "--purge")
    assert done.exit_code == 0, done.output + done.stderr
    assert key.read_bytes() == secret  # kimi-two can still start
    assert not (root / "etc/kimi-deploy/kimi-k25.manifest.json").exists()


def test_purge_keeps_a_key_named_only_by_the_other_profile_copy(cli_runner, root, tmp_path):
    """A manifest from a kit before ``api_key_file`` was recorded: the other's profile copy still names the key."""
    install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000))
    install(cli_runner, root, profile(tmp_path, "kimi-two", 30001))
    layout = HostLayout(root)
    old = hostfiles.load_manifest(layout, "kimi-two").model_copy(update={"api_key_file": None})
    layout.manifest("kimi-two").write_bytes(old.to_bytes())
    assert run(cli_runner, "uninstall", "--root", str(root), "--name", "kimi-k25", "--purge").exit_code == 0
    assert (root / KEY.lstrip("/")).exists()


def test_purge_removes_the_key_when_no_other_service_names_it(cli_runner, root, tmp_path):
    install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000))
    install(cli_runner, root, profile(tmp_path, "kimi-two", 30001, key="/etc/kimi-deploy/two.api-key"))
    result = run(cli_runner, "uninstall", "--root", str(root), "--name", "kimi-k25", "--purge")
    assert f"remove the API key file {KEY} (kimi-deploy created it)" in result.output
    assert not (root / KEY.lstrip("/")).exists() and (root / "etc/kimi-deploy/two.api-key").exists()


def test_the_same_port_is_refused_without_force(cli_runner, root, tmp_path):
    assert install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000)).exit_code == 0
    before = snapshot(root)
    clash = profile(tmp_path, "kimi-two", 30000, key="/etc/kimi-deploy/two.api-key")
    result = install(cli_runner, root, clash)
    assert result.exit_code == ExitCode.REFUSED, result.output + result.stderr
    assert "collide with another installed service" in result.stderr
    assert "port 30000: service kimi-k25 listens on 127.0.0.1:30000" in result.stderr and "--force" in result.stderr
    assert snapshot(root) == before  # nothing written

    as_json = install(cli_runner, root, clash, "--dry-run", "--json")
    assert as_json.exit_code == ExitCode.REFUSED
    plan = json.loads(as_json.stdout)  # one document: the plan, whose refusals say why
    assert "collide with another installed service" in as_json.stderr
    assert {"host_path": "port 30000", "kind": "conflict"}.items() <= plan["refusals"][0].items()

    forced = install(cli_runner, root, clash, "--force")
    assert forced.exit_code == 0, forced.output + forced.stderr
    assert "warning: --force: port 30000: service kimi-k25 listens" in forced.output


def test_a_path_another_service_uses_for_something_else_is_refused(cli_runner, root, tmp_path):
    assert install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000)).exit_code == 0
    # the key file of the second is the first one's env file
    clash = profile(tmp_path, "kimi-two", 30001, key="/etc/kimi-deploy/kimi-k25.env")
    result = install(cli_runner, root, clash, "--dry-run")
    assert result.exit_code == ExitCode.REFUSED
    assert "this profile's API key file is used by service kimi-k25 (file)" in result.stderr


def test_a_shared_cache_folder_is_warned_and_its_caches_kept_by_purge(cli_runner, root, tmp_path):
    cache = "/srv/kimi-cache"
    (root / "srv/kimi-cache/sglang-deepgemm").mkdir(parents=True)
    assert install(cli_runner, root, profile(tmp_path, "kimi-k25", 30000, cache_dir=cache)).exit_code == 0
    second = install(cli_runner, root, profile(tmp_path, "kimi-two", 30001, cache_dir=cache))
    assert f"warning: the cache folder {cache} is also used by service kimi-k25" in second.output
    result = run(cli_runner, "uninstall", "--root", str(root), "--name", "kimi-k25", "--purge")
    assert result.exit_code == 0 and f"the cache folder {cache} stays: service kimi-two" in result.output
    assert (root / "srv/kimi-cache/sglang-deepgemm").is_dir()


def _fleet(tmp_path: Path, gateway_bind: str, gateway_port: int) -> Path:
    """kimi-k25's fleet profile: two replicas (127.0.0.2, 127.0.0.3) on [sglang] port 30000, the gateway host
    127.0.0.1 (not a node) listening on ``gateway_bind:gateway_port``."""
    path = profile(tmp_path, "kimi-k25", 30000)
    text = path.read_text().replace('host = "127.0.0.1"', 'host = "0.0.0.0"')
    path.write_text(text + '\n[fleet]\n[[fleet.replicas]]\nnodes = ["127.0.0.2"]\n[[fleet.replicas]]\n'
                    f'nodes = ["127.0.0.3"]\n[gateway]\nhost = "127.0.0.1"\nbind = "{gateway_bind}"\n'
                    f'port = {gateway_port}\n')
    return path


def test_a_gateway_only_host_does_not_claim_the_replicas_sglang_port(cli_runner, root, tmp_path):
    """The gateway host of a fleet runs no SGLang: its [sglang] port (the nodes') is no conflict with a server
    on that port there (the container tier puts replicas and the gateway in one systemd); its own ports are."""
    replica = profile(tmp_path, "kimi-r0", 30000)
    replica.write_text(replica.read_text().replace('host = "127.0.0.1"', 'host = "127.0.0.2"'))
    (root / KEY.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / KEY.lstrip("/")).write_text("sk-one-key-for-the-whole-fleet-0123456789\n")
    (root / KEY.lstrip("/")).chmod(0o600)
    assert install(cli_runner, root, replica).exit_code == 0
    ok = install(cli_runner, root, _fleet(tmp_path, "127.0.0.1", 31000), "--host", "127.0.0.1")
    assert ok.exit_code == 0, ok.output + ok.stderr
    assert (root / "etc/systemd/system/kimi-k25-gateway.service").exists()
    assert not (root / "etc/systemd/system/kimi-k25.service").exists()
    # its gateway port is its own: on every address, 30000 collides with the replica's listener
    clash = install(cli_runner, root, _fleet(tmp_path, "0.0.0.0", 30000), "--host", "127.0.0.1")
    assert clash.exit_code == ExitCode.REFUSED, clash.output + clash.stderr
    assert "port 30000: service kimi-r0 listens on 127.0.0.2:30000 too (its [sglang] port)" in clash.stderr
    # and a server installed after the gateway meets the gateway's listener, not the fleet's [sglang] port
    other = profile(tmp_path, "kimi-r1", 31000, key="/etc/kimi-deploy/two.api-key")
    refused = install(cli_runner, root, other)
    assert refused.exit_code == ExitCode.REFUSED, refused.output + refused.stderr
    assert "service kimi-k25 listens on 127.0.0.1:31000 too (its [gateway] port)" in refused.stderr
    r1 = profile(tmp_path, "kimi-r1", 30000)
    r1.write_text(r1.read_text().replace('host = "127.0.0.1"', 'host = "127.0.0.3"'))
    assert install(cli_runner, root, r1).exit_code == 0
