"""Hostile profile values (issue 11, items 1-3, 7, 12): refused with exit 2, never rendered.

Each case is one the trial found rendering (exit 0) on the kit before the one string rule
(kimi_deploy/values.py): a CR or NUL ends a unit directive for systemd, a trailing newline passed
``re.match(r"^...$")``, ``extra_args`` set flags the kit owns, non-normalised paths escaped ``--root``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest

from helpers import MINIMAL, run_cli, write_profile
from kimi_deploy import launch
from kimi_deploy.facts import units as systemd
from kimi_deploy.errors import ProfileError
from kimi_deploy.profile import parse_profile

KEYED = MINIMAL.replace('tp_size = 8\n', 'tp_size = 8\napi_key_file = "/etc/kimi-deploy/k.api-key"\n')


def _service(line: str) -> str:
    return MINIMAL.replace('name = "kimi-k25"', 'name = "kimi-k25"\n' + line)


CASES = [
    # (id, profile text, substrings the error must contain)
    ("description-cr-injection",
     _service('description = "x\\r[Service]\\rExecStartPre=/nonexistent/INJECTED\\r[Unit]\\rDescription=y"'),
     ["service.description", "U+000D"]),
    ("description-nul", _service('description = "x\\u0000ExecStartPre=/bin/false"'), ["U+0000"]),
    ("description-line-separator", _service('description = "x\\u2028y"'), ["U+2028"]),
    ("description-bidi-override", _service('description = "safe\\u202eexe.txt"'), ["U+202E"]),
    ("description-c1-nel", _service('description = "a\\u0085b"'), ["U+0085"]),
    ("description-del", _service('description = "a\\u007fb"'), ["U+007F"]),
    ("description-trailing-space", _service('description = "x "'), ["leading or trailing spaces"]),
    ("host-trailing-newline", MINIMAL + 'host = "0.0.0.0\\n"\n', ["sglang.host", "U+000A"]),
    ("name-trailing-newline", MINIMAL.replace('name = "kimi-k25"', 'name = "x\\n"'), ["service.name", "U+000A"]),
    ("user-trailing-newline", _service('user = "sglang\\n"'), ["service.user", "U+000A"]),
    ("calendar-trailing-newline", _service('check_on_calendar = "daily\\n"'), ["service.check_on_calendar"]),
    ("env-name-trailing-newline", MINIMAL + '\n[environment]\n"NCCL_X\\n" = "1"\n', ["environment", "U+000A"]),
    ("env-value-cr", MINIMAL + '\n[environment]\nNCCL_X = "1\\rLD_PRELOAD=/tmp/x.so"\n', ["U+000D"]),
    ("token-trailing-newline", MINIMAL + 'served_model_name = "kimi\\n"\n', ["sglang.served_model_name"]),
    ("extra-arg-newline", MINIMAL + 'extra_args = ["--log-requests\\n"]\n', ["sglang.extra_args"]),
    ("name-dash", MINIMAL.replace('name = "kimi-k25"', 'name = "-x"'), ["service.name", "not starting with -"]),
    ("name-dot", MINIMAL.replace('name = "kimi-k25"', 'name = ".hidden"'), ["service.name"]),
    ("name-300-chars", MINIMAL.replace('name = "kimi-k25"', f'name = "{"k" * 300}"'),
     ["service.name", "300 characters", "at most 128"]),
    ("python-root", MINIMAL.replace('"/opt/sglang/.venv/bin/python"', '"/"'), ["service.python", "root directory"]),
    ("python-trailing-slash", MINIMAL.replace('"/opt/sglang/.venv/bin/python"', '"/opt/sglang/"'),
     ["service.python", "not normalised"]),
    ("cache-dir-dotdot", _service('cache_dir = "/var/cache/../../tmp/x"'), ["service.cache_dir", "not normalised"]),
    ("api-key-file-escapes-root", KEYED.replace('"/etc/kimi-deploy/k.api-key"', '"/../../../tmp/x/stolen.api-key"'),
     ["sglang.api_key_file", "not normalised"]),
    ("double-slash", MINIMAL.replace('"/models/moonshotai/Kimi-K2.5"', '"//models/kimi"'),
     ["sglang.model_path", "not normalised"]),
    ("dot-component", MINIMAL.replace('"/models/moonshotai/Kimi-K2.5"', '"/models/./kimi"'), ["not normalised"]),
    ("long-component", MINIMAL.replace('"/models/moonshotai/Kimi-K2.5"', f'"/models/{"k" * 256}"'),
     ["at most 255"]),
    ("start-limit-burst-huge", _service("start_limit_burst = 1000000000000"),
     ["service.start_limit_burst", "less than or equal to 4294967295"]),
    ("host-with-zone", MINIMAL + 'host = "fe80::1%eth0"\n', ["sglang.host", "%zone"]),
    ("host-empty-label", KEYED + 'host = "0...0.0.0"\n', ["sglang.host", "nor a host name"]),
    ("host-label-dash", KEYED + 'host = "node.-x"\n', ["sglang.host", "nor a host name"]),
    ("host-trailing-dash", KEYED + 'host = "node-"\n', ["sglang.host", "nor a host name"]),
    ("host-label-64", KEYED + f'host = "{"n" * 64}.example"\n', ["sglang.host", "nor a host name"]),
    ("value-looks-like-option", MINIMAL + 'served_model_name = "--host"\n', ["starts with '-'"]),
    ("extra-host", MINIMAL + 'extra_args = ["--host", "0.0.0.0"]\n', ["'--host' sets --host", "[sglang] host"]),
    ("extra-host-equals", MINIMAL + 'extra_args = ["--host=0.0.0.0"]\n', ["sets --host", "[sglang] host"]),
    ("extra-host-abbreviated", MINIMAL + 'extra_args = ["--hos", "0.0.0.0"]\n', ["'--hos' sets --host"]),
    ("extra-port", MINIMAL + 'extra_args = ["--port", "1"]\n', ["[sglang] port"]),
    ("extra-config", KEYED + 'extra_args = ["--config", "/tmp/other.yaml"]\n', ["[sglang] api_key_file"]),
    ("extra-model-alias", MINIMAL + 'extra_args = ["--model", "/x"]\n', ["[sglang] model_path"]),
    ("extra-tp-alias", MINIMAL + 'extra_args = ["--tensor-parallel-size=4"]\n', ["[sglang] tp_size"]),
    ("extra-profile-key", MINIMAL + 'extra_args = ["--enable-torch-symm-mem"]\n',
     ["[sglang] enable_torch_symm_mem"]),
    ("extra-old-spelling", MINIMAL + 'extra_args = ["--enable-flashinfer-allreduce-fusion"]\n',
     ["[sglang] flashinfer_allreduce_fusion_backend"]),
    ("extra-admin-key-abbrev", KEYED + 'extra_args = ["--admin-api=sk-secret"]\n', ["use api_key_file"]),
    ("extra-help", MINIMAL + 'extra_args = ["-h"]\n', ["single-dash option"]),
    # SGLang 0.5.23's gRPC listeners check no API key: on a public host they are a keyless server
    ("extra-grpc-port-public", KEYED + 'host = "0.0.0.0"\nextra_args = ["--grpc-port", "31000"]\n',
     ["gRPC server", "checks no API key", "--grpc-port 31000"]),
    ("extra-grpc-port-abbreviated", KEYED + 'host = "0.0.0.0"\nextra_args = ["--grpc-p=31000"]\n', ["gRPC server"]),
    ("extra-smg-grpc-mode-public", KEYED + 'host = "0.0.0.0"\nextra_args = ["--smg-grpc-mode"]\n', ["gRPC server"]),
    ("env-grpc-port-public", KEYED + 'host = "0.0.0.0"\n\n[environment]\nSGLANG_GRPC_PORT = "31000"\n',
     ["gRPC server", "SGLANG_GRPC_PORT=31000"]),
    ("extra-double-dash", MINIMAL + 'extra_args = ["--"]\n', ["end SGLang's option parsing"]),
]


@pytest.mark.parametrize("text,expected", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_hostile_value_is_exit_2_and_nothing_is_written(tmp_path, text, expected):
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(write_profile(tmp_path, text)), "--out", str(out)])
    assert result.exit_code == 2, result.stdout
    for fragment in expected:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    assert "\r" not in result.stderr and "\x00" not in result.stderr, "the error must not echo raw control bytes"
    assert "sk-secret" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("args", [["--log-requests"], ["--model-loader-extra-config", "{}"],
                                  ["--speculative-draft-model-revision", "main"], ["--cuda-graph-max-bs-decode", "-1"],
                                  ["--log-level", "debug"]])
def test_extra_args_the_kit_does_not_own_stay_allowed(args):
    from kimi_deploy.profile import extra_args_problems

    assert extra_args_problems(args) == []


def test_every_flag_of_the_table_is_owned_in_every_spelling():
    """No row's flag, alias or owned flag can come back through extra_args, with or without a value."""
    from kimi_deploy import options
    from kimi_deploy.profile import extra_args_problems

    for flag, key in options.owned_flags().items():
        problems = extra_args_problems([flag]) + extra_args_problems([f"{flag}=x"])
        assert len(problems) == 2 and all("extra_args" in p for p in problems), flag
        assert any(key in p for p in problems) or "api_key_file" in " ".join(problems), (flag, problems)


def test_public_host_rule_holds_on_the_final_command():
    """check_exposure reads the command itself: a --host that reached argv without a key is refused."""
    profile = parse_profile({"service": {"name": "x"}, "sglang": {"model_path": "/m"}})
    with pytest.raises(ProfileError) as err:
        launch.check_exposure(["--model-path", "/m", "--host", "127.0.0.1", "--host=0.0.0.0"], profile)
    assert err.value.exit_code == 2 and "--host 0.0.0.0" in str(err.value.value)
    launch.check_exposure(["--host", "0.0.0.0", "--host", "127.0.0.1"], profile)  # the last one wins
    keyed = parse_profile({"service": {"name": "x"},
                           "sglang": {"model_path": "/m", "api_key_file": "/etc/kimi-deploy/x.api-key"}})
    launch.check_exposure(["--host", "0.0.0.0", "--config", "/run/x/sglang-secrets.yaml"], keyed)
    with pytest.raises(ProfileError):
        launch.check_exposure(["--host", "0.0.0.0", "--config", "/tmp/other.yaml"], keyed)


def test_a_grpc_listener_stays_allowed_on_loopback_or_when_unauthenticated_is_said():
    loopback = {"service": {"name": "x"}, "sglang": {"model_path": "/m", "extra_args": ["--grpc-port", "31000"]}}
    launch.build_launch(parse_profile(loopback))
    public = {"service": {"name": "x"}, "sglang": {"model_path": "/m", "host": "0.0.0.0",
                                                  "allow_unauthenticated": True, "extra_args": ["--grpc-port", "1"]}}
    launch.build_launch(parse_profile(public))


def test_the_most_extra_args_and_environment_the_profile_takes_still_make_a_unit_systemd_loads(tmp_path):
    """128 arguments and 128 variables of the longest text: systemd loads the unit (its logical line limit is
    1 MiB; 200,000 short arguments rendered a 4 MB ExecStart= that systemd refused, "No buffer space
    available"); one more item is refused with exit 2."""
    from kimi_deploy.targets.systemd import render
    from kimi_deploy.values import MAX_ITEMS, MAX_TEXT

    if not shutil.which("systemd-analyze"):
        pytest.skip("needs systemd-analyze")
    arg = "--x" + "a" * (MAX_TEXT - 3)
    data = {"service": {"name": "kimi-k25", "python": sys.executable, "kimi_deploy": shutil.which("true")},
            "sglang": {"model_path": "/m", "extra_args": [arg] * MAX_ITEMS},
            "environment": {f"NCCL_X{i}": "v" * MAX_TEXT for i in range(MAX_ITEMS)}}
    rendered = render(parse_profile(data))
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / rendered.service_unit)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "failed to load" not in done.stderr, done.stderr
    for more in ({"sglang": {**data["sglang"], "extra_args": [arg] * (MAX_ITEMS + 1)}},
                 {"environment": {**data["environment"], "NCCL_MORE": "1"}}):
        with pytest.raises(ProfileError) as err:
            parse_profile({**data, **more})
        assert err.value.exit_code == 2 and f"at most {MAX_ITEMS} items" in "\n".join(err.value.problems)


def test_systemctl_puts_unit_names_after_a_double_dash():
    assert systemd.systemctl_argv("disable", "--now", "-x.service", "kimi-deploy-check@-x.timer") == [
        "systemctl", "disable", "--now", "--", "-x.service", "kimi-deploy-check@-x.timer"]
    assert systemd.systemctl_argv("show", "a.service", "--property=Id") == [
        "systemctl", "show", "--property=Id", "--", "a.service"]
    assert systemd.systemctl_argv("daemon-reload") == ["systemctl", "daemon-reload"]


def test_install_plan_commands_name_units_after_a_double_dash(tmp_path):
    profile = write_profile(tmp_path, MINIMAL)
    (tmp_path / "root").mkdir()
    result = run_cli(["install", "--profile", str(profile), "--root", str(tmp_path / "root"), "--dry-run",
                      "--json"])
    assert result.exit_code == 0, result.stderr
    commands = [shlex.split(step["command"]) for step in json.loads(result.stdout)["steps"] if step.get("command")]
    assert any(argv[0] == "systemctl" for argv in commands), commands
    for argv in commands:
        units = [a for a in argv if a.endswith((".service", ".timer"))]
        if units:
            assert argv[argv.index("--") + 1:] == units, argv
