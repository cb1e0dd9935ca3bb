"""Container tier: ``kimi-deploy upgrade`` from SGLang 0.5.22 to 0.5.23 under a real systemd 252 (issue 25, item 4).

One boot laid out as a GPU host (tests/container_host.py) with three SGLang environments beside the shared 0.5.23
one, each built on the host and bound in writable (``sglang_envs``), each on the container's own ``/usr/bin/python3.X``:

- ``/opt/sglang-0.5.22``: SGLang 0.5.22 (``release_target``) with the one patch of the 0.5.23 series that applies to
  it exactly (kimi-k2-tool-call-ids, applied with GNU patch as in tests/test_upgrade.py's ``old_env``), compiled
  once so each start does not compile 0.5.22 again (the unit cannot write ``__pycache__``);
- ``/opt/sglang-0.5.23``: a copy of the 0.5.23 test environment (``make_target``); the upgrade applies the series;
- ``/opt/sglang-0.5.23-proxied``: another copy, for the upgrade whose tool calls break.

What systemd starts is the unit's ``ExecStart=``: ``<interpreter> -m sglang.launch_server ...``, which the test
profile's ``PYTHONPATH`` turns into the stand-in (tests/standin/): that interpreter's own SGLang argument handling in
front of the replay server (that SGLang's ``OpenAIServingChat`` and parsers). So the gate talks to the serving layer of
whichever environment the unit names, and ``/server_info`` reports that environment's SGLang version.

Tests in file order against the one boot (the broken upgrade runs before the good one, so it starts from 0.5.22
without another restart):

1. the service installed on 0.5.22 and started with ``restart --wait`` passes the contract gate;
2. an upgrade to 0.5.23 whose profile puts a proxy that sanitises tool-call ids in front of the server
   (``KIMI_REPLAY_SANITISE_IDS``, as tests/test_container_lifecycle.py) is caught at the contract tier and rolled
   back to 0.5.22 with no operator action: the failed checks are named in the JSON, the restored service passes
   the same gate, the installed files and 0.5.22's files are byte-identical to before;
3. the upgrade to 0.5.23 passes the contract gate, the unit runs 0.5.23 with the series applied, and 0.5.22's
   files are byte-identical to before.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from container_host import SGLANG_PYTHON, booted_host, profile
from patch_helpers import make_target, release_target, site_packages_of, tree_hashes
from kimi_deploy import patching

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
OLD = "/opt/sglang-0.5.22/.venv"
NEW = "/opt/sglang-0.5.23/.venv"
PROXIED = "/opt/sglang-0.5.23-proxied/.venv"
#: RestartSec= of the profiles: the default 30 s (tests/test_container_lifecycle.py's SERVING).
SERVING = "restart_sec = 30"
UPGRADE = "kimi-deploy upgrade --timeout 240 --json"
MANIFEST = f"/etc/kimi-deploy/{NAME}.manifest.json"
#: Seconds each step took (the module's figures, printed at the end).
TIMES: dict[str, float] = {}


def _profile(python: str, environment: str = "") -> str:
    text = profile(name=NAME).replace("restart_sec = 5", SERVING)
    text = text.replace(f'python = "{SGLANG_PYTHON}"', f'python = "{python}/bin/python"')
    return text.replace("[environment]\n", f"[environment]\n{environment}")


@pytest.fixture(scope="module")
def envs(sglang_python, tmp_path_factory) -> dict[str, object]:
    """Venv folder inside -> host site-packages of each environment (module docstring)."""
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("envs")
    old = release_target(sglang_python, tmp / "old", "0.5.22")
    site = site_packages_of(old)
    series = patching.find_series("0.5.23")
    diff = series.diff_path(series.get("kimi-k2-tool-call-ids"))
    subprocess.run(["patch", "-p1", "--fuzz=0", "--batch", "-d", str(site), "-i", str(diff)],
                   check=True, capture_output=True)
    subprocess.run([old, "-m", "compileall", "-q", "-j", "0", str(site / "sglang")], check=True, capture_output=True)
    out = {OLD: site}
    for venv, folder in ((NEW, "new"), (PROXIED, "proxied")):
        out[venv] = site_packages_of(make_target(sglang_python, tmp / folder, bytecode=True))
    TIMES["environments built on the host"] = time.monotonic() - started
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory, sglang_python, envs):
    """The booted host, the 0.5.22 profile at /root/v1.toml (not installed yet)."""
    started = time.monotonic()
    with booted_host(tmp_path_factory.mktemp("upgrade"), sglang_python, sglang_envs=envs) as h:
        TIMES["boot"] = time.monotonic() - started
        h.write("/root/v1.toml", _profile(OLD))
        yield h
    TIMES["module"] = time.monotonic() - started
    print("container upgrade figures: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items()))


def _old_files(envs) -> dict[str, str]:
    """0.5.22's package and its record (``__pycache__`` aside), hashed on the host."""
    site = envs[OLD]
    return {**tree_hashes(site / "sglang"), **tree_hashes(site / "sglang-0.5.22.dist-info")}


def _installed(host) -> dict[str, str]:
    """Path -> sha256 of the installed manifest, every file it lists and every file in /etc/systemd/system and
    /etc/kimi-deploy that names the service (``"absent"``: none)."""
    listed = [*json.loads(host.sh(f"cat {MANIFEST}").stdout)["files"], MANIFEST]
    found = host.sh(f"find /etc/systemd/system /etc/kimi-deploy -name '*{NAME}*' ! -name '.{NAME}.lock' "
                    "! -path '*/backup/*' -type f").stdout.split()
    digests = {}
    for path in sorted({*listed, *found}):
        r = host.sh(f"sha256sum {path}", check=False)
        digests[path] = r.stdout.split()[0] if r.returncode == 0 else "absent"
    return digests


def _running(host) -> tuple[str, str, str]:
    """(the unit's ExecStart= interpreter, the main process's argv[0], the SGLang version it serves)."""
    unit = host.sh(f"systemctl cat {NAME}.service").stdout
    exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    argv0 = host.sh(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()[0]
    key = host.sh(f"cat /etc/kimi-deploy/{NAME}.api-key").stdout.strip()
    info = host.sh(f"curl -sf -H 'Authorization: Bearer {key}' http://127.0.0.1:30000/server_info").stdout
    return exec_start.split("=", 1)[1].split()[0], argv0, json.loads(info)["version"]


def test_the_service_runs_sglang_0_5_22_and_passes_the_gate(host):
    # install renders for 0.5.23 unless told (it does not ask the interpreter): 0.5.22's spellings, no patch verify
    host.sh("kimi-deploy install --sglang-version 0.5.22 --profile /root/v1.toml")
    started = time.monotonic()
    r = host.sh("kimi-deploy restart --wait --timeout 240 --json", check=False, timeout=600)
    TIMES["restart --wait on 0.5.22"] = time.monotonic() - started
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["attempts"][0]["gate"]["gate"] == "contract" and data["attempts"][0]["gate"]["ok"]
    assert _running(host) == (f"{OLD}/bin/python", f"{OLD}/bin/python", "0.5.22")
    assert "patch verify" not in host.sh(f"systemctl cat {NAME}.service").stdout


def test_an_upgrade_whose_tool_calls_break_is_rolled_back_to_the_untouched_0_5_22(host, envs):
    before, old_files = _installed(host), _old_files(envs)
    old_pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    host.write("/root/proxied.toml", _profile(OLD, 'KIMI_REPLAY_SANITISE_IDS = "1"\n'))
    started = time.monotonic()
    r = host.sh(f"{UPGRADE} --python {PROXIED}/bin/python --profile /root/proxied.toml", check=False, timeout=900)
    TIMES["upgrade rolled back"] = time.monotonic() - started
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["plan"]["version_change"] == "0.5.22 -> 0.5.23" and data["patched"] is not None
    restart = data["restart"]
    assert data["rolled_back"] and restart["failed_tier"] == "contract", restart["attempts"][0]["summary"]
    assert {"contract.tool_auto.nonstream", "contract.tool_auto.stream"} <= set(restart["failed_checks"])
    new, back = restart["attempts"]
    assert [t["ok"] for t in new["gate"]["tiers"]] == [True, True, True, False]
    assert back["ok"] and back["gate"]["gate"] == "contract" and back["gate"]["ok"]
    assert _installed(host) == before  # the unit names 0.5.22 again, byte for byte
    assert _running(host) == (f"{OLD}/bin/python", f"{OLD}/bin/python", "0.5.22")
    pid = host.unit(f"{NAME}.service", "MainPID")["MainPID"]
    assert pid != old_pid and "KIMI_REPLAY_SANITISE_IDS" not in host.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    assert _old_files(envs) == old_files
    TIMES.update({f"gate tier {t['tier']} (proxied 0.5.23)": t["seconds"] for t in new["gate"]["tiers"]})


def test_the_upgrade_to_0_5_23_passes_the_gate_and_leaves_0_5_22_untouched(host, envs):
    old_files = _old_files(envs)
    started = time.monotonic()
    r = host.sh(f"{UPGRADE} --python {NEW}/bin/python", check=False, timeout=900)
    TIMES["upgrade to 0.5.23"] = time.monotonic() - started
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    attempt = data["restart"]["attempts"][0]
    assert not data["rolled_back"] and attempt["gate"]["gate"] == "contract" and attempt["gate"]["ok"]
    assert [t["tier"] for t in attempt["gate"]["tiers"]] == ["ready", "fast", "parser", "contract"]
    assert data["plan"]["patches"] and data["patched"] is not None
    assert _running(host) == (f"{NEW}/bin/python", f"{NEW}/bin/python", "0.5.23")
    # the series is in the new environment, and the unit verifies it before each start
    assert f"patch verify --python {NEW}/bin/python" in host.sh(f"systemctl cat {NAME}.service").stdout
    verify = host.sh(f"kimi-deploy patch verify --python {NEW}/bin/python", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert _old_files(envs) == old_files
    TIMES.update({f"gate tier {t['tier']} (0.5.23)": t["seconds"] for t in attempt["gate"]["tiers"]})
