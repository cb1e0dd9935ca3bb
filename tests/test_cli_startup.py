"""Each verb imports only what it uses: the modules a fresh process has loaded after one command.

Behaviour, not timing (benchmarks/startup.py measures the time): ``--help`` and ``--version`` load
no verb module and none of the heavy libraries; ``render --print-command`` loads no HTTP client,
no ``openai``, no ``rich``, no ``matplotlib``; every verb's ``--help`` stays clear of what only
other verbs need. The verb table the lazy ``--help`` reads (:data:`kimi_deploy.cli.VERBS`) is kept
equal to the verbs' own docstrings.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from kimi_deploy.cli import VERBS, cli

#: Libraries no verb needs at start-up unless it talks to a server or draws (check, bench, restart --wait).
HEAVY = {"openai", "matplotlib", "httpx", "rich", "jinja2", "pydantic", "jsonschema", "httptools", "orjson"}

#: Runs one kimi-deploy command in this fresh interpreter, then writes the top-level module names it loaded.
CHILD = """
import json, sys
from kimi_deploy.cli import cli
out, args = sys.argv[1], sys.argv[2:]
try:
    cli(args, prog_name="kimi-deploy", obj={})
except SystemExit as exc:
    code = exc.code
else:
    code = 0
with open(out, "w") as f:
    json.dump({"exit": code, "modules": sorted(sys.modules)}, f)
"""


def loaded_after(tmp_path, *args: str) -> tuple[set[str], set[str]]:
    """``(top-level packages, kimi_deploy modules)`` loaded by a fresh process that ran ``kimi-deploy ARGS``."""
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["exit"] in (0, None), (data["exit"], proc.stdout, proc.stderr)
    modules = data["modules"]
    return {m.split(".")[0] for m in modules}, {m for m in modules if m.startswith("kimi_deploy.")}


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"]])
def test_help_and_version_load_no_verb_and_no_heavy_library(tmp_path, args):
    packages, ours = loaded_after(tmp_path, *args)
    assert packages & HEAVY == set()
    assert ours <= {"kimi_deploy.cli", "kimi_deploy.cli.common", "kimi_deploy.errors"}, ours


def test_render_print_command_loads_no_client_library(tmp_path):
    packages, ours = loaded_after(tmp_path, "render", "--preset", "kimi-k25-rtx-pro-6000-x8", "--print-command")
    assert packages & {"openai", "httpx", "rich", "matplotlib", "jsonschema", "httptools", "orjson"} == set()
    assert not any(m.startswith(("kimi_deploy.check", "kimi_deploy.bench", "kimi_deploy.doctor")) for m in ours)
    assert "kimi_deploy.cli.render" in ours and "kimi_deploy.cli.check" not in ours


def write_init_profile(tmp_path):
    """A profile file as ``kimi-deploy init`` writes it (the reference preset), in ``tmp_path``."""
    path = tmp_path / "profile.toml"
    result = CliRunner().invoke(cli, ["init", str(path)], obj={})
    assert result.exit_code == 0, result.output
    return path


def test_render_print_command_of_a_profile_file_loads_only_the_profile_and_the_deployment(tmp_path):
    """Issue 24: the command alone loads no template engine, no target module, no preset catalogue (the
    profile is a file) and nothing of the host's; only the target registry's names, for ``--target``. Issue 36:
    it reads the resolved deployment, so the model table (the fit refusal) and the patch series' manifest (the
    required patch set) load with it, and nothing else."""
    profile = write_init_profile(tmp_path)
    packages, ours = loaded_after(tmp_path, "render", "--profile", str(profile), "--print-command")
    assert packages & (HEAVY - {"pydantic"}) == set()
    assert {m for m in ours if m.startswith(("kimi_deploy.targets.", "kimi_deploy.host", "kimi_deploy.check",
                                             "kimi_deploy.bench", "kimi_deploy.doctor", "kimi_deploy.sizing",
                                             "kimi_deploy.facts"))} == set()
    assert "kimi_deploy.catalog.presets" not in ours and "kimi_deploy.cli.presets" not in ours
    assert {"kimi_deploy.cli.render", "kimi_deploy.deployment", "kimi_deploy.launch", "kimi_deploy.profile"} <= ours


#: Runs one kimi-deploy command in this fresh interpreter with an audit hook on every way CPython starts a
#: process (sys.addaudithook; the event names are CPython's audit events table), then writes what it saw.
SPAWN_CHILD = """
import json, sys
out, args = sys.argv[1], sys.argv[2:]
seen = []
SPAWNS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn"}
sys.addaudithook(lambda event, detail: seen.append([event, repr(detail)[:200]]) if event in SPAWNS else None)
from kimi_deploy.cli import cli
try:
    cli(args, prog_name="kimi-deploy", obj={})
except SystemExit as exc:
    code = exc.code
else:
    code = 0
with open(out, "w") as f:
    json.dump({"exit": code, "spawned": seen}, f)
"""


def spawned_by(tmp_path, *args: str) -> tuple[list, list[str], str]:
    """``(process starts seen by the audit hook, the stub systemd-analyze's calls, stdout)`` of a fresh process
    running ``kimi-deploy ARGS`` with a ``systemd-analyze`` stub first on PATH."""
    stubs, marker, out = tmp_path / "stubs", tmp_path / "systemd-analyze.calls", tmp_path / "spawned.json"
    stubs.mkdir(exist_ok=True)
    stub = stubs / "systemd-analyze"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {marker}\nexit 0\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", SPAWN_CHILD, str(out), *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["exit"] in (0, None), (data["exit"], proc.stderr)
    calls = marker.read_text().splitlines() if marker.exists() else []
    return data["spawned"], calls, proc.stdout


def test_render_print_command_starts_no_process(tmp_path):
    """Issue 24: printing the command asks no tool (not even systemd-analyze for the timer's calendar)."""
    profile = write_init_profile(tmp_path)
    spawned, calls, stdout = spawned_by(tmp_path, "render", "--profile", str(profile), "--print-command")
    assert "sglang.launch_server" in stdout
    assert spawned == [] and calls == []


def test_the_spawn_probe_sees_the_timer_render_ask_systemd_analyze(tmp_path):
    """The probe above, shown to work: rendering the units checks the timer's calendar with systemd-analyze."""
    profile = write_init_profile(tmp_path)
    spawned, calls, _stdout = spawned_by(tmp_path, "render", "--profile", str(profile))
    assert "subprocess.Popen" in [event for event, _ in spawned]
    assert "calendar *-*-* 03:00:00" in calls


#: verb -> libraries its module must not pull in (what only other verbs use).
NOT_FOR = {
    "render": HEAVY - {"jinja2", "pydantic"},
    "presets": HEAVY - {"jinja2", "pydantic"},
    "init": HEAVY - {"jinja2", "pydantic"},
    "validate": HEAVY - {"jinja2", "pydantic"},
    "doctor": HEAVY - {"jinja2", "pydantic"},
    "facts": HEAVY - {"jinja2", "pydantic"},
    "patch": HEAVY - {"jinja2", "pydantic"},
    "install": HEAVY - {"jinja2", "pydantic"},
    "uninstall": HEAVY - {"jinja2", "pydantic"},
    "preflight": HEAVY - {"jinja2", "pydantic"},
    "prefetch": HEAVY - {"jinja2", "pydantic"},
    # the verbs that talk to a server load their client libraries when they run, not for --help
    "status": HEAVY,
    "restart": HEAVY,
    "upgrade": HEAVY,
    "check": HEAVY,
    "bench": HEAVY,
    "tune": HEAVY,
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_verbs_help_loads_only_its_own_module(tmp_path, verb):
    packages, ours = loaded_after(tmp_path, verb, "--help")
    assert packages & NOT_FOR[verb] == set()
    verb_modules = {m for m in ours if m.startswith("kimi_deploy.cli.")} - {"kimi_deploy.cli.common"}
    # check and bench read a dataset: their dataset caps' options come from their own small module
    shared = {"kimi_deploy.cli.dataset_options"} if verb in ("check", "bench") else set()
    assert verb_modules == {f"kimi_deploy.cli.{VERBS[verb][0]}"} | shared


def test_the_verb_table_matches_the_verbs():
    assert set(NOT_FOR) == set(VERBS)
    for name, (module, help_text) in VERBS.items():
        commands = {c.name: c for c in importlib.import_module(f"kimi_deploy.cli.{module}").COMMANDS}
        assert name in commands, (name, module)
        assert commands[name].help.split("\n\n")[0] == help_text, name
    every = {c.name for module in {m for m, _ in VERBS.values()}
             for c in importlib.import_module(f"kimi_deploy.cli.{module}").COMMANDS}
    assert every == set(VERBS)


@pytest.mark.parametrize("width", [60, 80, 120])
def test_lazy_help_is_clicks_own_help(width):
    """The command list printed from the table equals click's, formatted from the loaded commands."""
    lazy = cli.__class__(name=cli.name, callback=cli.callback, params=cli.params, help=cli.help,
                         context_settings=cli.context_settings)
    eager = click.Group(name=cli.name, callback=cli.callback, params=cli.params, help=cli.help,
                        context_settings=cli.context_settings)
    for name in VERBS:
        eager.add_command(cli.get_command(click.Context(cli), name))
    texts = []
    for group in (lazy, eager):
        with click.Context(group, info_name="kimi-deploy", terminal_width=width, max_content_width=width) as ctx:
            texts.append(group.get_help(ctx))
    assert "Commands:\n  bench " in texts[0]
    assert texts[0] == texts[1]


#: Usage errors of the verbs that talk to a server: each must come back before a client library loads (issue 24:
#: `check` with a malformed --base-url took 5.5 s under load to say so, importing openai first).
USAGE_ERRORS = [
    ("check", "--base-url", "ftp://127.0.0.1:30000"),
    ("check", "--base-url", "127.0.0.1:30000"),
    ("check",),
    ("bench", "--base-url", "http://user:pw@127.0.0.1:30000"),
    ("bench",),
    ("bench", "--base-url", "http://127.0.0.1:30000", "--api-key", "k"),
    ("check", "--timeout", "nan"),
    ("bench", "--concurrency", "0"),
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=[" ".join(a) for a in USAGE_ERRORS])
def test_check_and_bench_usage_errors_come_back_before_any_client_library(tmp_path, args):
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["exit"] == 2, (data["exit"], proc.stderr)
    assert "error" in proc.stderr.lower(), proc.stderr
    loaded = {m.split(".")[0] for m in data["modules"]}
    assert loaded & {"openai", "httpx", "httptools", "rich", "matplotlib"} == set(), proc.stderr
