"""Property tests over every string field of the profile (issue 11): whatever the value, the kit either
refuses it with exit 2, or the files it renders read back, through systemd's own rules, as exactly the
directives it meant, and the launch command reads back through SGLang 0.5.23's argparse as the profile's
values.

- "Meant": the rendered text split at LF only (the template's lines), ExecStart= continuations joined.
- "Read": the same text split as systemd reads a unit (src/shared/conf-parser.c, read_line: LF, CR and NUL
  end a line; surrounding whitespace is stripped; a comment line inside a continuation is skipped), checked
  by the real ``systemd-analyze verify`` too.
The string fields are found from the models themselves, so a new field is covered without editing this file.
Example counts are small (the suite runs on 2 cores); ``derandomize`` keeps CI runs repeatable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kimi_deploy import options
from kimi_deploy.errors import KimiDeployError
from kimi_deploy.launch import SECRETS_CONFIG_NAME
from kimi_deploy.profile import SGLang, Service, parse_profile
from kimi_deploy.targets.systemd import render
from kimi_deploy.values import SAFE_TOKEN

TRUE = shutil.which("true") or "/bin/true"

#: A profile close to the reference preset whose ExecStart= binaries exist here (verify checks them).
BASE = {
    "service": {"name": "kimi-k25", "description": "SGLang serving Kimi", "python": sys.executable,
                "kimi_deploy": TRUE, "cache_dir": "/var/cache/kimi-k25/jit", "check_on_calendar": "daily",
                "user": "sglang", "group": "sglang"},
    "sglang": {"model_path": "/models/kimi", "served_model_name": "moonshotai/Kimi-K2.5", "host": "0.0.0.0",
               "tp_size": 8, "attention_backend": "flashinfer", "tool_call_parser": "kimi_k2",
               "reasoning_parser": "kimi_k2", "speculative_algorithm": "EAGLE3",
               "speculative_draft_model_path": "/models/draft", "speculative_num_steps": 3,
               "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
               "api_key_file": "/etc/kimi-deploy/kimi-k25.api-key", "extra_args": ["--log-requests"]},
    "environment": {"NCCL_IB_DISABLE": "1"},
}


def _is_text(annotation: typing.Any) -> bool:
    """True when a field's type admits free strings (``str`` somewhere, not only a ``Literal``)."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(_is_text(arg) for arg in typing.get_args(annotation))


#: (table, key) of every string field, from the models; ``environment`` names and values; extra_args items.
STRING_FIELDS = [("service", k) for k, f in Service.model_fields.items() if _is_text(f.annotation)] + \
                [("sglang", k) for k, f in SGLang.model_fields.items() if _is_text(f.annotation)] + \
                [("environment", "<name>"), ("environment", "<value>")]
SGLANG_FIELDS = [f for f in STRING_FIELDS if f[0] == "sglang"]

#: Characters systemd, a shell or a reviewer's terminal treat specially, and a few plain ones.
HOSTILE = list("\n\r\x00\t\x0b\x0c\x1b\x7f\x85\u2028\u2029\u202e\u200b \"'\\%$;#[]=-/.:@+,~*") + list("aZ09")


def _baseline(table: str, key: str) -> str:
    if table == "environment":
        return "NCCL_IB_DISABLE" if key == "<name>" else "1"
    value = BASE[table].get(key)
    if key == "extra_args":
        return "--log-requests"
    return value if isinstance(value, str) else "kimi"


def _values(table: str, key: str) -> st.SearchStrategy[str]:
    """Values for one field: plausible ones (mostly accepted), hostile characters, and a valid value with
    one hostile character inserted or appended (the trailing-newline and CR injections)."""
    base = _baseline(table, key)
    plausible = st.from_regex(SAFE_TOKEN, fullmatch=True).map(lambda v: v[:40])
    if base.startswith("/"):
        plausible = st.lists(st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True), min_size=1, max_size=3).map(
            lambda parts: "/" + "/".join(parts))
    hostile = st.text(alphabet=st.sampled_from(HOSTILE), min_size=1, max_size=10)
    inserted = st.builds(lambda pos, ch: base[:pos] + ch + base[pos:],
                         st.integers(0, len(base)), st.sampled_from(HOSTILE))
    return st.one_of(plausible, hostile, inserted, st.text(min_size=1, max_size=16))


def _with_examples(table: str, key: str, test: typing.Callable[[str], None]) -> typing.Callable[[str], None]:
    """``test`` with the findings of the trial always tried: a trailing newline, a CR, a leading dash."""
    base = _baseline(table, key).lstrip("-")
    for value in (base + "\n", "x\r" + base, "-" + base, "--" + base, base + "\x00"):
        test = example(value)(test)
    return test


def _profile_data(table: str, key: str, value: str) -> dict[str, typing.Any]:
    data = json.loads(json.dumps(BASE))
    if table == "environment":
        data["environment"] = {value: "1"} if key == "<name>" else {"NCCL_IB_DISABLE": value}
    elif key == "extra_args":
        data["sglang"]["extra_args"] = ["--log-requests", value]
    else:
        data[table][key] = value
    return data


def _logical(text: str, *, systemd: bool) -> list[tuple[str, str, str]]:
    """(section, key, value) of every directive: as the kit meant it (``systemd=False``) or as systemd reads it."""
    lines = re.split(r"\r\n|\r|\n|\x00", text) if systemd else text.split("\n")
    out: list[tuple[str, str, str]] = []
    section, pending = "", None
    for raw in lines:
        line = raw.strip() if systemd else raw
        if pending is not None:
            if systemd and line.startswith(("#", ";")):
                continue
            piece = line if systemd else line.lstrip(" ")
            if piece.endswith("\\"):
                pending += " " + piece[:-1].rstrip(" ")
                continue
            line, pending = pending + " " + piece, None
        elif not line or line.startswith(("#", ";")):
            continue
        elif line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        elif line.endswith("\\"):
            pending = line[:-1].rstrip(" ")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip() if systemd else key, value.strip() if systemd else value))
    return out


def _render_or_refuse(data: dict[str, typing.Any]):
    """The rendered files, or None when the kit refused the profile with exit 2 (anything else fails)."""
    try:
        return render(parse_profile(data))
    except KimiDeployError as exc:
        assert exc.exit_code == 2, exc
        return None


SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("table,key", STRING_FIELDS, ids=[f"{t}.{k}" for t, k in STRING_FIELDS])
def test_every_string_field_is_refused_or_reads_back_as_meant(table, key):
    @SETTINGS
    @given(_values(table, key))
    def check(value: str) -> None:
        rendered = _render_or_refuse(_profile_data(table, key, value))
        if rendered is None:
            return
        for name, text in rendered.files.items():
            meant = _logical(text, systemd=False)
            assert _logical(text, systemd=True) == meant, (name, value)
        service = dict(((s, k), v) for s, k, v in _logical(rendered.files[rendered.service_unit], systemd=False))
        words = service[("Service", "ExecStart")].split()
        assert tuple(words) == rendered.launch.argv and all(SAFE_TOKEN.fullmatch(w) for w in words), value
        env = _logical(rendered.files[rendered.env_file], systemd=True)
        assert [(k, v) for _, k, v in env] == list(rendered.launch.env)
        if (table, key) == ("service", "description"):
            assert service[("Unit", "Description")] == value
        with tempfile.TemporaryDirectory(prefix="kimi-deploy-prop-") as tmp:
            units = []
            for name, text in rendered.files.items():
                if name.endswith((".service", ".timer")):
                    (Path(tmp) / name).write_text(text)
                    units.append(str(Path(tmp) / name))
            done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
            complaints = [line for line in done.stderr.splitlines()
                          if not (key in ("python", "kimi_deploy") and f"Command {value} is not executable" in line)]
            assert complaints == [] and (done.returncode == 0 or key in ("python", "kimi_deploy")), done.stderr

    _with_examples(table, key, check)()


#: Runs in the SGLang interpreter: one JSON argv per input line -> the parsed values of ``dests`` (or the error).
PARSE_SERVER = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
dests = json.loads(sys.argv[1])
for line in sys.stdin:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(json.loads(line))
        reply = {"values": {d: getattr(ns, d, None) for d in dests}}
    except SystemExit:
        reply = {"error": err.getvalue().strip().splitlines()[-1:]}
    print(json.dumps(reply), flush=True)
"""

#: argparse dest -> profile key, for the rows that put a value on the command line.
DESTS = {o.key: o.key for o in options.OPTIONS if o.emit == "value"} | {"config": "api_key_file"}


@pytest.fixture(scope="module")
def sglang_parser(sglang_python):
    """A long-lived SGLang 0.5.23 process that parses argv lines with SGLang's own argparse."""
    proc = subprocess.Popen([sglang_python, "-c", PARSE_SERVER, json.dumps(sorted(DESTS))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def parse(args: tuple[str, ...]) -> dict[str, typing.Any]:
        proc.stdin.write(json.dumps(list(args)) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    yield parse
    proc.stdin.close()
    proc.wait(timeout=60)


@pytest.mark.sglang
@pytest.mark.parametrize("table,key", SGLANG_FIELDS, ids=[f"{t}.{k}" for t, k in SGLANG_FIELDS])
def test_every_sglang_string_reads_back_through_sglang_argparse(sglang_parser, table, key):
    # what SGLang takes for a row the kit leaves off the command (--model-path is required and always set)
    defaults = sglang_parser(("--model-path", "/m"))["values"]

    @SETTINGS
    @given(_values(table, key))
    def check(value: str) -> None:
        rendered = _render_or_refuse(_profile_data(table, key, value))
        if rendered is None:
            return
        reply = sglang_parser(rendered.launch.server_args)
        if key == "extra_args":  # verbatim arguments may be ones SGLang rejects; `validate` reports them
            return
        if "error" in reply:  # only a value outside an option's choices (e.g. an unknown parser) may fail
            flag = options.BY_KEY[key].flags[0]
            assert reply["error"] and f"argument {flag}: invalid choice: {value!r}" in reply["error"][0], (value, reply)
            return
        s = rendered.profile.sglang
        for dest, field in DESTS.items():
            want = getattr(s, field)
            if field == "api_key_file":
                want = f"/run/{rendered.profile.service.name}/{SECRETS_CONFIG_NAME}" if want else None
            if dest == "speculative_draft_model_path" and not s.speculative_algorithm:
                want = None
            if want is None:  # not emitted (pp_size's None is SGLang's 1)
                want = defaults[dest]
            got = reply["values"][dest]
            assert got == want or (want is not None and str(got) == str(want)), (dest, value, got, want)

    _with_examples(table, key, check)()


#: A profile with every optional table: a two-replica fleet of two-node groups, the gateway, Kubernetes,
#: monitoring labels and targets. Its other tables' strings are mutated one at a time below.
FULL = {
    **json.loads(json.dumps(BASE)),
    "fleet": {"replicas": [{"nodes": ["10.0.0.1", "10.0.0.2"]}, {"nodes": ["10.0.0.3", "10.0.0.4"]}],
              "dist_init_port": 20000, "nic": "eth0"},
    "gateway": {"host": "10.0.0.9"},
    "kubernetes": {"image": "lmsysorg/sglang:v0.5.23-cu130", "gateway_image": "example/smg:1.13.0",
                   "check_image": "example/kimi-deploy:1", "node_selector": {"pool": "gpu"},
                   "cache_host_path": "/var/cache/kimi", "model_mount": "/models", "pod_security": "privileged",
                   "model_volume": {"persistentVolumeClaim": {"claimName": "weights"}}},
    "monitoring": {"labels": {"team": "ml"}, "targets": ["10.0.0.1:30000"], "gateway": "10.0.0.9:29000"},
}
FULL["sglang"] = {**FULL["sglang"], "tp_size": 8, "pp_size": 2}
FULL["service"] = {**FULL["service"], "gpu_count": 8}


def _paths(data: typing.Any, path: tuple = ()) -> typing.Iterator[tuple[tuple, str]]:
    """(path, value) of every string in the other tables, dict keys as ``("<key>", name)``."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, path + (k,))
            if path and path[0] in ("monitoring", "kubernetes"):  # label and selector names
                yield path + (("<key>", k),), k
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, path + (i,))
    elif isinstance(data, str):
        yield path, data


OTHER_FIELDS = [p for p, _ in _paths({t: FULL[t] for t in ("fleet", "gateway", "kubernetes", "monitoring")})]


def _set(data: dict, path: tuple, value: str) -> dict:
    data = json.loads(json.dumps(data))
    holder = data
    for part in path[:-1]:
        holder = holder[part]
    last = path[-1]
    if isinstance(last, tuple):
        holder[value] = holder.pop(last[1])
    else:
        holder[last] = value
    return data


def _no_hidden_text(name: str, text: str) -> None:
    from kimi_deploy.values import FORBIDDEN_CATEGORIES
    import unicodedata

    bad = [c for c in text if c != "\n" and unicodedata.category(c) in FORBIDDEN_CATEGORIES]
    assert not bad, (name, bad)


@pytest.mark.parametrize("path", OTHER_FIELDS, ids=[".".join(map(str, p)) for p in OTHER_FIELDS])
def test_every_string_of_fleet_gateway_kubernetes_and_monitoring_is_refused_or_reads_back_as_meant(path):
    """Whatever the value, the kit refuses it (exit 2) or every host's units read back through systemd's line
    rules as the kit meant them, and no rendered file (units, env files, manifests) holds a control, format
    or line-separator character."""
    import yaml

    from kimi_deploy.targets.systemd import host_files
    from kimi_deploy.targets import kubernetes

    base = dict(_paths(FULL))[path] if not isinstance(path[-1], tuple) else path[-1][1]

    @SETTINGS
    @given(st.one_of(st.text(alphabet=st.sampled_from(HOSTILE), min_size=1, max_size=10),
                     st.builds(lambda pos, ch: base[:pos] + ch + base[pos:], st.integers(0, len(base)),
                               st.sampled_from(HOSTILE)),
                     st.text(min_size=1, max_size=16)))
    @example(base + "\n")
    @example("x\r" + base)
    @example(base + "\u2028")
    def check(value: str) -> None:
        try:
            profile = parse_profile(_set(FULL, path, value))
            hosts = host_files(profile)
            manifests = kubernetes.render(profile)
        except KimiDeployError as exc:
            assert exc.exit_code == 2, exc
            return
        for host, files in hosts.items():
            for name, text in files.items():
                _no_hidden_text(f"{host}/{name}", text)
                if name.endswith((".service", ".timer", ".env")):
                    assert _logical(text, systemd=True) == _logical(text, systemd=False), (host, name, value)
        for name, text in manifests.files.items():
            _no_hidden_text(name, text)
            list(yaml.safe_load_all(text))  # parses

    check()
