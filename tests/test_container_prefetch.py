"""Container tier: the server unit's weights prefetch (``ExecStartPre=-kimi-deploy prefetch``, issue #42) under a
real systemd 252.

One boot laid out as a GPU host (tests/container_host.py). The model folder is a host folder on this machine's disk,
bound read-only at ``/models/Kimi-K2.5``: the test writes a sharded checkpoint (an index and three shards of random
bytes) and a one-shard draft into it from the host, drops their pages from the page cache (``fsync`` +
``POSIX_FADV_DONTNEED``; the container shares the host's kernel and page cache) and reads their residency back with
``mincore(2)``. Each scenario installs a profile, starts the unit with ``systemctl start`` (``Type=exec``: it returns
once every ``ExecStartPre=`` ran and SGLang's stand-in was exec'd) and reads that start's journal by its invocation id:

1. on: the step runs as the unit's user under its sandbox, before SGLang, and reads every shard of the model and
   the draft (they end resident);
2. a missing shard: the rest are read, the step exits 1, the start goes on;
3. no room (``prefetch_reserve_gib`` beyond the host's RAM): skipped with one line, nothing read, the start goes on;
4. a time-out (``prefetch_timeout_sec = 1`` with a 1 MiB/s cap: the first 8 MiB shard puts the next read 8 s
   out, past the deadline): it stops itself, exits 6, the start goes on;
5. off (``prefetch = false``): no step in the unit, no line in the journal, nothing read.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from container_host import MODEL, booted_host, profile
from kimi_deploy.host.prefetch import resident_bytes

pytestmark = [pytest.mark.container, pytest.mark.sglang]

NAME = "kimi-k25"
MIB = 1024**2
SHARDS = {f"model-0000{i}-of-00003.safetensors": 8 for i in (1, 2, 3)}
DRAFT = "draft"
#: This 23 GiB test machine has less MemAvailable than the default 32 GiB reserve: no reserve, so the MiB fit.
ROOM = "prefetch_reserve_gib = 0"  # a sub-folder of the model folder: /models/Kimi-K2.5/draft


def _write_cold(path: Path, mib: int) -> None:
    with path.open("wb") as fh:
        for _ in range(mib):
            fh.write(os.urandom(MIB))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _cold(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _resident(paths: list[Path]) -> dict[str, int]:
    return {p.name if p.parent.name != DRAFT else f"{DRAFT}/{p.name}": resident_bytes(str(p), p.stat().st_size)
            for p in paths if p.exists()}


def _profile(startup: str) -> str:
    text = profile(name=NAME, extra="verify_patches = false")
    text = text.replace(f'model_path = "{MODEL}"\n',
                        f'model_path = "{MODEL}"\nspeculative_algorithm = "EAGLE3"\n'
                        f'speculative_draft_model_path = "{MODEL}/{DRAFT}"\n')
    return text + (f"\n[startup]\n{startup}\n" if startup else "")


@pytest.fixture(scope="module")
def host(tmp_path_factory, sglang_python):
    work = tmp_path_factory.mktemp("prefetch")
    with booted_host(work, sglang_python) as h:
        model = work / "model"
        (model / DRAFT).mkdir()
        for name, mib in SHARDS.items():
            _write_cold(model / name, mib)
        _write_cold(model / DRAFT / "model.safetensors", 2)
        weight_map = {f"layer.{i}.weight": name for i, name in enumerate(SHARDS)}
        (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        h.files = [model / name for name in SHARDS] + [model / DRAFT / "model.safetensors"]
        yield h


def _start(host, startup: str) -> tuple[str, dict[str, str]]:
    """Install the profile with ``startup`` as its [startup] table, start the unit; returns (this start's journal,
    the unit's properties). The unit is stopped again."""
    host.write("/root/kimi.toml", _profile(startup))
    host.sh("kimi-deploy install --profile /root/kimi.toml")
    host.sh(f"systemctl start {NAME}.service", timeout=300)
    unit = host.unit(f"{NAME}.service", "ActiveState", "ExecMainPID", "InvocationID", "ExecStartPre", "User",
                     "ExecMainStartTimestampMonotonic")
    host.sh(f"systemctl stop {NAME}.service", timeout=300)
    entries = [json.loads(line) for line in host.sh(
        f"journalctl --no-pager -o json _SYSTEMD_INVOCATION_ID={unit['InvocationID']}").stdout.splitlines()]
    host.entries = entries
    return "\n".join(str(e.get("MESSAGE", "")) for e in entries), unit


def _prefetch_status(unit: dict[str, str]) -> str:
    """``status=N/...`` of the prefetch among the unit's ``ExecStartPre=`` commands (systemctl show)."""
    m = re.search(r"path=\S+ ; argv\[\]=\S+ prefetch [^}]*status=(\d+)", unit["ExecStartPre"])
    assert m, unit["ExecStartPre"]
    return m.group(1)


def test_the_step_reads_every_shard_before_sglang_under_the_units_sandbox(host):
    _cold(host.files)
    assert sum(_resident(host.files).values()) < 4 * MIB  # cold, or near it
    journal, unit = _start(host, ROOM)
    assert unit["ActiveState"] == "active" and unit["ExecMainPID"] != "0", unit
    done = [e for e in host.entries if str(e.get("MESSAGE", "")).startswith("prefetch: done: read 26.0 MiB of 26.0 MiB")]
    assert len(done) == 1, journal
    assert re.search(r"with 4 threads; [\d.]+ MiB was cached; 4 of 4 shards complete$", done[0]["MESSAGE"]), done[0]

    # the step ended before SGLang's process was started (both on CLOCK_MONOTONIC, microseconds)
    assert int(done[0]["__MONOTONIC_TIMESTAMP"]) <= int(unit["ExecMainStartTimestampMonotonic"]), unit
    assert _prefetch_status(unit) == "0"
    # every byte was read (the line above); nearly all still cached now (a busy host reclaims a few pages)
    resident = _resident(host.files)
    assert all(resident[k] >= 0.9 * p.stat().st_size for k, p in zip(resident, host.files)), resident
    # under the sandbox: the unit's line, the unit's user
    assert "ExecStartPre=-/opt/kimi-deploy/bin/kimi-deploy prefetch --profile /etc/kimi-deploy/kimi-k25.toml " \
           "--deadline 150" in host.sh(f"systemctl cat {NAME}.service").stdout
    assert unit["User"] == "sglang"


def test_a_missing_shard_never_fails_the_start(host):
    missing = host.files[1]
    kept = missing.with_suffix(".kept")
    missing.rename(kept)
    try:
        _cold(host.files[:1] + host.files[2:])
        journal, unit = _start(host, ROOM)
    finally:
        kept.rename(missing)
    assert unit["ActiveState"] == "active" and unit["ExecMainPID"] != "0", unit
    assert f"prefetch: {MODEL}/{missing.name}: No such file or directory; SGLang will fail to load it" in journal
    assert "3 of 3 shards complete" in journal
    assert _prefetch_status(unit) == "1"


def test_no_room_skips_with_a_line_and_reads_nothing(host):
    _cold(host.files)
    journal, unit = _start(host, "prefetch_reserve_gib = 1048576")
    assert unit["ActiveState"] == "active" and unit["ExecMainPID"] != "0", unit
    assert re.search(r"^prefetch: skipped: MemAvailable [\d.]+ GiB cannot hold the 26.0 MiB still to read of 4 "
                     r"shards, 26.0 MiB plus the 1048576.0 GiB reserve", journal, re.M), journal
    assert sum(_resident(host.files).values()) < 4 * MIB
    assert _prefetch_status(unit) == "0"


def test_a_time_out_stops_the_step_itself_and_the_start_goes_on(host):
    _cold(host.files)
    journal, unit = _start(host, f"{ROOM}\nprefetch_timeout_sec = 1\nprefetch_max_mib_s = 1\nprefetch_threads = 1")
    assert unit["ActiveState"] == "active" and unit["ExecMainPID"] != "0", unit
    assert "prefetch: stopped at its deadline (1 s): read 8.0 MiB of 26.0 MiB in " in journal, journal
    assert _prefetch_status(unit) == "6"
    resident = _resident(host.files)
    assert resident[host.files[0].name] == 8 * MIB and sum(resident.values()) < 12 * MIB, resident


def test_off_leaves_no_step_and_reads_nothing(host):
    _cold(host.files)
    journal, unit = _start(host, "prefetch = false")
    assert unit["ActiveState"] == "active" and unit["ExecMainPID"] != "0", unit
    assert " prefetch " not in host.sh(f"systemctl cat {NAME}.service").stdout
    assert "prefetch" not in unit["ExecStartPre"] and "prefetch:" not in journal
    assert sum(_resident(host.files).values()) < 4 * MIB


# -- start records (part 2): kept across restarts, shown by status -----------------------------------------------------

START_LOG = "/opt/kimi-deploy/src/tests/data/sglang-log/start-k25-eagle3.txt"


def test_each_start_is_recorded_across_restarts_and_status_shows_the_medians(host):
    """The stand-in prints a start's phases recorded from SGLang on GPUs (``KIMI_STANDIN_START_LOG``), moved to now."""
    # no draft here: SGLang's argument resolution reads the draft's config.json, which the test's draft lacks
    text = profile(name=NAME, extra="verify_patches = false") + f"\n[startup]\n{ROOM}\n"
    text = text.replace("[environment]\n", f'[environment]\nKIMI_STANDIN_START_LOG = "{START_LOG}"\n')
    host.write("/root/kimi.toml", text)
    host.sh("kimi-deploy install --profile /root/kimi.toml")
    host.sh(f"rm -f /var/lib/{NAME}/start-history.json")
    for _ in range(2):
        r = host.sh("kimi-deploy restart --wait --gate ready --timeout 240", check=False, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "weights        271.5 s" in r.stdout, r.stdout
    history = json.loads(host.sh(f"cat /var/lib/{NAME}/start-history.json").stdout)
    assert len(history["starts"]) == 2 and history["starts"][0]["started"] != history["starts"][1]["started"]
    assert [s["phases"]["weights"] for s in history["starts"]] == [271.52, 271.52]
    status = host.sh("kimi-deploy status", check=False)
    assert "starts    2 recorded; median per phase: weights 272 s, kv_cache 6 s, draft 11 s, cuda_graphs 186 s" \
        in status.stdout, status.stdout
    data = json.loads(host.sh("kimi-deploy status --json", check=False).stdout)
    assert data["start_history"]["starts"] == 2
    host.sh(f"systemctl stop {NAME}.service", timeout=300)
