"""Accounts and device groups as ``install`` reads them (:mod:`kimi_deploy.facts.accounts`): NSS on the host, the
tree's own files under ``--root``, and the groups owning a restricted ``/dev/nvidia*`` node."""

from __future__ import annotations

import grp
import os
import stat

import pytest

from kimi_deploy.facts import accounts
from kimi_deploy.paths import HostLayout


def test_a_root_tree_is_read_from_its_own_passwd_and_group_files(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nsglang:x:999:999::/var/lib/sglang:/usr/sbin/nologin\n"
                                "\nbroken-line-without-colon\n")
    (etc / "group").write_text("root:x:0:\nvideo:x:44:sglang\n")
    layout = HostLayout(tmp_path)
    assert accounts.existing_accounts(layout, "user", {"sglang", "kimi", "broken-line-without-colon"}) == {"sglang"}
    assert accounts.existing_accounts(layout, "group", {"video", "render"}) == {"video"}
    (etc / "group").unlink()  # a tree without one: nothing exists there (install creates it)
    assert accounts.existing_accounts(layout, "group", {"root"}) == frozenset()


def test_the_host_is_asked_through_nss():
    host = HostLayout()
    assert host.is_host
    assert accounts.existing_accounts(host, "user", {"root", "kimi-no-such-user-36"}) == {"root"}
    assert accounts.existing_accounts(host, "group", {"root", "kimi-no-such-group-36"}) == {"root"}


def test_only_a_restricted_character_device_owned_by_a_group_names_that_group(tmp_path):
    group = next((g for g in grp.getgrall() if g.gr_gid != 0), None)
    if group is None:
        pytest.skip("no group but root on this machine")
    restricted, open_to_all, regular = tmp_path / "nvidia0", tmp_path / "nvidiactl", tmp_path / "nvidia-file"
    try:
        os.mknod(restricted, stat.S_IFCHR | 0o660, os.makedev(1, 3))
        os.mknod(open_to_all, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        for node, mode in ((restricted, 0o660), (open_to_all, 0o666)):  # mknod's mode passes through the umask
            os.chown(node, 0, group.gr_gid)
            os.chmod(node, mode)
    except OSError as exc:  # not root, or a user namespace without CAP_MKNOD
        pytest.skip(f"cannot create a device node here: {exc.strerror}")
    regular.write_text("")
    os.chmod(regular, 0o660)
    os.chown(regular, 0, group.gr_gid)
    assert accounts.gpu_device_groups(str(tmp_path / "nvidia*")) == {str(restricted): group.gr_name}
