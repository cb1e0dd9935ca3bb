"""Path defaults follow the service name unless set (issue #30 item 5): ``init`` writes the preset's key file as
``/etc/kimi-deploy/{name}.api-key``, so renaming the service in the written profile renames the key file the
units load; an explicit path stays what it says."""

from __future__ import annotations

import tomllib

from helpers import run_cli
from kimi_deploy.profile import load_profile, naming_warnings


def test_renaming_the_service_after_init_renames_the_key_file(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    text = path.read_text()
    assert tomllib.loads(text)["sglang"]["api_key_file"] == "/etc/kimi-deploy/{name}.api-key"
    path.write_text(text.replace('name = "kimi-k25"', 'name = "kimi-mine"', 1))
    profile = load_profile(path)
    assert profile.sglang.api_key_file == "/etc/kimi-deploy/kimi-mine.api-key"
    assert naming_warnings(profile) == []
    out = tmp_path / "out"
    assert run_cli(["render", "--profile", str(path), "--out", str(out)]).exit_code == 0
    unit = (out / "kimi-mine.service").read_text()
    assert "LoadCredential=api-key:/etc/kimi-deploy/kimi-mine.api-key" in unit and "kimi-k25.api-key" not in unit


def test_init_name_writes_no_other_services_key_file(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path), "--name", "kimi-b"]).exit_code == 0
    assert load_profile(path).sglang.api_key_file == "/etc/kimi-deploy/kimi-b.api-key"


def test_an_explicit_key_file_is_kept(tmp_path):
    path = tmp_path / "p.toml"
    assert run_cli(["init", str(path)]).exit_code == 0
    text = path.read_text().replace("/etc/kimi-deploy/{name}.api-key", "/etc/kimi-deploy/shared.api-key")
    path.write_text(text.replace('name = "kimi-k25"', 'name = "kimi-mine"', 1))
    assert load_profile(path).sglang.api_key_file == "/etc/kimi-deploy/shared.api-key"
