"""The service user and group: `install` records the ones it created, `uninstall --purge` removes only those.

On an image tree (``--root`` with an ``/etc/passwd``), where ``useradd``/``userdel --root`` edit the
tree's files; tests/test_container_serve.py checks the same on a booted host.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from install_fakes import write_profile
from kimi_deploy import hostfiles
from kimi_deploy.cli import cli
from kimi_deploy.paths import HostLayout

pytestmark = pytest.mark.skipif(
    shutil.which("useradd") is None or shutil.which("systemctl") is None or os.geteuid() != 0,
    reason="needs root, useradd/userdel and systemctl (--root)")


def run(cli_runner, *args):
    return cli_runner.invoke(cli, list(args), catch_exceptions=False)


def image_tree(root: Path) -> Path:
    etc = root / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "gshadow").write_text("root:*::\n")
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o640)
    return etc


def names(path: Path) -> set[str]:
    return {line.split(":", 1)[0] for line in path.read_text().splitlines() if line}


def test_purge_removes_the_user_and_group_install_created(cli_runner, root, tmp_path):
    etc = image_tree(root)
    profile = write_profile(tmp_path / "a.toml", name="kimi-a")
    assert run(cli_runner, "install", "--profile", str(profile), "--root", str(root), "--no-enable").exit_code == 0
    manifest = hostfiles.load_manifest(HostLayout(root), "kimi-a")
    assert (manifest.user_created, manifest.group_created) == ("sglang", "sglang")
    again = run(cli_runner, "install", "--profile", str(profile), "--root", str(root), "--no-enable")
    assert "nothing to do" in again.output  # the record survives a second install (user exists by then)
    result = run(cli_runner, "uninstall", "--root", str(root), "--purge")
    assert result.exit_code == 0, result.output + result.stderr
    assert "sglang" not in names(etc / "passwd") and "sglang" not in names(etc / "group")
    assert "remove the system user sglang" in result.output


def test_purge_keeps_a_user_install_did_not_create(cli_runner, root, tmp_path):
    etc = image_tree(root)
    with (etc / "passwd").open("a") as f:
        f.write("sglang:x:990:990::/var/lib/sglang:/usr/sbin/nologin\n")
    with (etc / "group").open("a") as f:
        f.write("sglang:x:990:\n")
    profile = write_profile(tmp_path / "a.toml", name="kimi-a")
    assert run(cli_runner, "install", "--profile", str(profile), "--root", str(root), "--no-enable").exit_code == 0
    manifest = hostfiles.load_manifest(HostLayout(root), "kimi-a")
    assert (manifest.user_created, manifest.group_created) == (None, None)
    assert run(cli_runner, "uninstall", "--root", str(root), "--purge").exit_code == 0
    assert "sglang" in names(etc / "passwd") and "sglang" in names(etc / "group")


def test_purge_keeps_the_user_while_another_service_runs_as_it(cli_runner, root, tmp_path):
    etc = image_tree(root)
    a = write_profile(tmp_path / "a.toml", name="kimi-a")
    b = write_profile(tmp_path / "b.toml", name="kimi-b", port=30001)
    for profile in (a, b):
        assert run(cli_runner, "install", "--profile", str(profile), "--root", str(root), "--no-enable").exit_code == 0
    result = run(cli_runner, "uninstall", "--root", str(root), "--purge", "--name", "kimi-a")
    assert result.exit_code == 0, result.output + result.stderr
    assert "sglang" in names(etc / "passwd")
    assert "the system user sglang stays: service kimi-b (service user) runs as it too" in result.output
