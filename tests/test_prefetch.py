"""``kimi-deploy prefetch`` (issue #42): the shards of the model and the draft read into the page cache, in
SGLang's order, bounded in time, skipped when RAM cannot hold them; and its place in the rendered unit.

Real files on this machine's disk: a shard is made cold with ``fsync`` + ``POSIX_FADV_DONTNEED`` (clean pages
are dropped) and its residency read back with ``mincore(2)``, the kit's own probe. The deadline is tested with an
injected clock (no test races the wall clock) and through the rate cap, whose arithmetic decides it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from helpers import MINIMAL, run_cli, write_profile
from kimi_deploy.facts.meminfo import parse_meminfo
from kimi_deploy.errors import ProfileError
from kimi_deploy.host import prefetch as pf
from kimi_deploy.profile import parse_profile as _parse
from kimi_deploy.targets.systemd import render

MIB = 1024**2


def parse_profile(text: str):
    return _parse(tomllib.loads(text))


def _cold(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (they are clean after fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _model(folder: Path, shards: dict[str, int], index: bool = True) -> Path:
    """A model folder with ``shards`` (name -> MiB of random bytes: nothing the kernel can share), cold."""
    folder.mkdir(parents=True)
    for name, mib in shards.items():
        path = folder / name
        with path.open("wb") as fh:
            for _ in range(mib):
                fh.write(os.urandom(MIB))
        _cold(path)
    if index:
        weight_map = {f"t{i}.{j}": name for i, name in enumerate(shards) for j in range(3)}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _profile(tmp_path: Path, model: Path, draft: Path | None = None, startup: str = "", timeout_start: int = 1200):
    text = MINIMAL.replace('model_path = "/models/moonshotai/Kimi-K2.5"', f'model_path = "{model}"')
    text = text.replace('python = "/opt/sglang/.venv/bin/python"',
                        f'python = "/opt/sglang/.venv/bin/python"\ntimeout_start_sec = {timeout_start}')
    if draft is not None:
        text += f'speculative_algorithm = "EAGLE3"\nspeculative_draft_model_path = "{draft}"\n'
    if startup:
        text += f"\n[startup]\n{startup}\n"
    return parse_profile(text)


def _meminfo(tmp_path: Path, available_mib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {available_mib * 4 * 1024} kB\nMemFree:        1024 kB\n"
                    f"MemAvailable:   {available_mib * 1024} kB\nHugePages_Total:       0\n")
    return path


def _resident(path: Path) -> int:
    got = pf.resident_bytes(str(path), path.stat().st_size)
    assert got is not None, "mincore(2) must work on this machine's files"
    return got


# -- order ---------------------------------------------------------------------------------------------------------


def test_sglang_order_is_sorted_names_as_sglangs_prepare_weights_sorts_them():
    names = ["model-00010-of-00064.safetensors", "model-00002-of-00064.safetensors",
             "model-00001-of-00064.safetensors", "model-00002-of-00064.safetensors"]
    assert pf.sglang_order(names) == ["model-00001-of-00064.safetensors", "model-00002-of-00064.safetensors",
                                      "model-00010-of-00064.safetensors"]
    # unpadded names sort as strings, as list.sort() in _prepare_weights does (not "naturally")
    assert pf.sglang_order(["m-2.safetensors", "m-10.safetensors"]) == ["m-10.safetensors", "m-2.safetensors"]


@pytest.mark.sglang
def test_sglang_sorts_the_weight_files_as_the_prefetch_does(sglang_python):
    """The order claim, read from the installed SGLang's own source (``_prepare_weights``)."""
    import subprocess

    code = ("import inspect, sglang.srt.model_loader.loader as l; "
            "print(inspect.getsource(l.DefaultModelLoader._prepare_weights))")
    out = subprocess.run([sglang_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "hf_weights_files.sort()" in out.stdout and "SGLANG_SORT_WEIGHT_FILES" in out.stdout


def test_plan_reads_the_index_shards_then_the_draft_and_leaves_out_what_it_does_not_name(tmp_path):
    model = _model(tmp_path / "m", {"model-2-of-2.safetensors": 1, "model-1-of-2.safetensors": 1})
    (model / "consolidated.safetensors").write_bytes(b"x")  # not in the index: SGLang's filter drops it too
    draft = _model(tmp_path / "d", {"model.safetensors": 1}, index=False)
    plan = pf.plan_shards([("model", str(model)), ("draft", str(draft))])
    assert [(s.model, Path(s.path).name) for s in plan.shards] == [
        ("model", "model-1-of-2.safetensors"), ("model", "model-2-of-2.safetensors"), ("draft", "model.safetensors")]
    assert plan.total_bytes == 3 * MIB and not plan.missing and not plan.notes


def test_plan_lists_missing_and_odd_shards_and_hub_ids_without_raising(tmp_path):
    model = _model(tmp_path / "m", {"a-1.safetensors": 1})
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["weight_map"].update({"x": "a-2.safetensors", "y": "a-3.safetensors"})
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / "a-3.safetensors").mkdir()
    plan = pf.plan_shards([("model", str(model)), ("draft", "lightseekorg/kimi-k2.5-eagle3")])
    assert [Path(s.path).name for s in plan.shards] == ["a-1.safetensors"]
    assert dict((Path(p).name, why) for p, why in plan.missing) == {
        "a-2.safetensors": "No such file or directory", "a-3.safetensors": "not a regular file"}
    assert plan.notes == ("draft lightseekorg/kimi-k2.5-eagle3 is not a local folder (a hub id is downloaded by "
                          "SGLang): not prefetched",)


@pytest.mark.parametrize("index, says", [
    ("{not json", "JSONDecodeError"),
    ('{"weight_map": []}', "AttributeError"),
    ('{"weight_map": {"a": "../../etc/shadow"}}', "outside its folder"),
    ('{"weight_map": {"a": ".."}}', "outside its folder"),
])
def test_a_hostile_index_is_a_note_and_nothing_is_read(tmp_path, index, says):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(index)
    plan = pf.plan_shards([("model", str(folder))])
    assert plan.shards == () and len(plan.notes) == 1 and says in plan.notes[0]


# -- the step on real files ------------------------------------------------------------------------------------------


def test_a_cold_model_and_draft_are_read_into_the_page_cache(tmp_path):
    model = _model(tmp_path / "m", {"model-1-of-3.safetensors": 24, "model-2-of-3.safetensors": 24,
                                    "model-3-of-3.safetensors": 8})
    draft = _model(tmp_path / "d", {"model.safetensors": 4}, index=False)
    files = [*sorted(model.glob("*.safetensors")), draft / "model.safetensors"]
    before = sum(_resident(f) for f in files)
    if before > 8 * MIB:
        pytest.skip(f"this file system keeps dropped pages ({before} bytes resident after DONTNEED)")
    lines: list[str] = []
    result = pf.prefetch(_profile(tmp_path, model, draft), threads=2, meminfo=_meminfo(tmp_path, 1 << 20),
                         say=lines.append)
    assert result.outcome == "done", result
    assert result.shards == result.shards_done == 4 and result.total_bytes == 60 * MIB
    assert result.read_bytes == result.need_bytes == 60 * MIB - result.cached_bytes
    assert all(_resident(f) == f.stat().st_size for f in files)
    assert result.exit_code == 0 and result.summary().startswith("done: read ")
    assert lines and lines[0].startswith("prefetch: reading ")
    again = pf.prefetch(_profile(tmp_path, model, draft), meminfo=_meminfo(tmp_path, 1 << 20), say=lines.append)
    assert (again.outcome, again.read_bytes, again.cached_bytes) == ("warm", 0, 60 * MIB)


def test_only_the_cold_part_is_read(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 32})
    shard = model / "s-1.safetensors"
    with shard.open("rb") as fh:
        fh.read()
        os.posix_fadvise(fh.fileno(), 16 * MIB, 0, os.POSIX_FADV_DONTNEED)  # the first chunk stays warm
    warm = _resident(shard)
    assert warm == 16 * MIB
    result = pf.prefetch(_profile(tmp_path, model), meminfo=_meminfo(tmp_path, 1 << 20), say=lambda _: None)
    assert result.outcome == "done" and result.cached_bytes == warm
    assert result.read_bytes == 16 * MIB  # the second chunk only
    assert _resident(shard) == 32 * MIB


def test_no_room_skips_with_the_figures_and_reads_nothing(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 16})
    before = _resident(model / "s-1.safetensors")
    meminfo = _meminfo(tmp_path, 1024 + 15)  # 1 GiB reserve + 15 MiB: one MiB short
    result = pf.prefetch(_profile(tmp_path, model, startup="prefetch_reserve_gib = 1"), meminfo=meminfo,
                         say=lambda _: None)
    assert result.outcome == "no_room" and result.read_bytes == 0 and result.exit_code == 0
    assert result.available_bytes == (1024 + 15) * MIB and result.reserve_bytes == 1024 * MIB
    assert "skipped: MemAvailable 1.0 GiB cannot hold the 16.0 MiB still to read of 1 shards, 16.0 MiB plus the 1.0 GiB reserve" in result.summary()
    assert _resident(model / "s-1.safetensors") == before
    fits = pf.prefetch(_profile(tmp_path, model, startup="prefetch_reserve_gib = 1"),
                       meminfo=_meminfo(tmp_path, 1024 + 16), say=lambda _: None)
    assert fits.outcome == "done"


def test_unreadable_meminfo_is_no_room(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 1})
    result = pf.prefetch(_profile(tmp_path, model), meminfo=tmp_path / "absent", say=lambda _: None)
    assert result.outcome == "no_room" and result.available_bytes is None
    assert "MemAvailable unknown" in result.summary()


def test_the_deadline_stops_every_reader_between_chunks(tmp_path):
    model = _model(tmp_path / "m", {f"s-{i}.safetensors": 32 for i in range(1, 4)})
    ticks = iter(range(10**6))
    clock = lambda: float(next(ticks))  # noqa: E731 - one second per look at the clock
    result = pf.prefetch(_profile(tmp_path, model), deadline_s=12, threads=1, meminfo=_meminfo(tmp_path, 1 << 20),
                         say=lambda _: None, clock=clock)
    assert result.outcome == "deadline" and result.exit_code == 6
    assert 0 < result.read_bytes < result.need_bytes and result.shards_done < 3
    assert "stopped at its deadline (12 s)" in result.summary()


def test_the_rate_cap_is_kept_and_ends_at_the_deadline(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 48})
    slept: list[float] = []
    result = pf.prefetch(_profile(tmp_path, model, startup="prefetch_max_mib_s = 1"), deadline_s=5,
                         meminfo=_meminfo(tmp_path, 1 << 20), say=lambda _: None, sleep=slept.append)
    # one chunk (16 MiB) is read at once; the next may start only after 16 s at 1 MiB/s, past the 5 s deadline
    assert result.outcome == "deadline" and result.read_bytes == 16 * MIB and slept == []


def test_missing_shard_reads_the_rest_and_exits_1(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 2, "s-2.safetensors": 2})
    (model / "s-2.safetensors").unlink()
    lines: list[str] = []
    result = pf.prefetch(_profile(tmp_path, model), meminfo=_meminfo(tmp_path, 1 << 20), say=lines.append)
    assert result.outcome == "done" and result.exit_code == 1 and result.shards == 1
    assert any("s-2.safetensors: No such file or directory; SGLang will fail to load it" in x for x in lines)


def test_off_reads_nothing(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 2})
    result = pf.prefetch(_profile(tmp_path, model, startup="prefetch = false"), say=lambda _: None)
    assert result.outcome == "off" and result.exit_code == 0 and result.read_bytes == 0


def test_meminfo_parser_on_a_recorded_file():
    text = ("MemTotal:       792143212 kB\nMemFree:        3521228 kB\nMemAvailable:   701236940 kB\n"
            "Buffers:         1204 kB\nActive(file):   1000 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n")
    info = parse_meminfo(text)
    assert info["MemAvailable"] == 701236940 * 1024 and info["HugePages_Total"] == 0
    assert info["Active(file)"] == 1000 * 1024


# -- the command and the unit ----------------------------------------------------------------------------------------


def test_cli_prints_the_summary_line_and_json(tmp_path):
    model = _model(tmp_path / "m", {"s-1.safetensors": 2})
    text = MINIMAL.replace('model_path = "/models/moonshotai/Kimi-K2.5"', f'model_path = "{model}"')
    path = write_profile(tmp_path, text + "\n[startup]\nprefetch_reserve_gib = 0\n")
    result = run_cli(["prefetch", "--profile", str(path), "--deadline", "60"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith(("prefetch: done: read ", "prefetch: warm: "))
    data = json.loads(run_cli(["prefetch", "--profile", str(path), "--json"]).stdout)
    assert data["outcome"] == "warm" and data["exit_code"] == 0 and data["deadline_s"] == 600


def test_cli_refuses_a_bad_deadline(tmp_path):
    path = write_profile(tmp_path, MINIMAL)
    for bad in ("nan", "0", "-1"):
        assert run_cli(["prefetch", "--profile", str(path), "--deadline", bad]).exit_code == 2


def test_unit_runs_prefetch_first_after_patch_verify_and_within_half_the_start_timeout(tmp_path):
    profile = _profile(tmp_path, Path("/models/m"), timeout_start=300)
    unit = render(profile).files["kimi-k25.service"]
    pre = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert pre[-1] == ("ExecStartPre=-/usr/local/bin/kimi-deploy prefetch --profile /etc/kimi-deploy/kimi-k25.toml "
                       "--deadline 150")
    longer = render(_profile(tmp_path, Path("/models/m"), startup="prefetch_timeout_sec = 90")).files
    assert "--deadline 90\n" in longer["kimi-k25.service"]
    off = render(_profile(tmp_path, Path("/models/m"), startup="prefetch = false")).files["kimi-k25.service"]
    assert " prefetch " not in off


def test_the_table_leaves_the_digest_of_a_profile_without_it():
    base = parse_profile(MINIMAL)
    assert base.start.prefetch and base.startup is None
    assert parse_profile(MINIMAL + "\n[startup]\nprefetch = true\n").digest() != base.digest()
    with pytest.raises(ProfileError) as raised:
        parse_profile(MINIMAL + "\n[startup]\nprefetch_thread = 4\n")
    assert any("startup.prefetch_thread" in p and "prefetch_threads" in p for p in raised.value.problems)


# -- doctor: the RAM a warm restart needs ----------------------------------------------------------------------------

RECORDED = Path(__file__).parent / "data" / "meminfo" / "dev-23g.txt"


def _doctor_facts(profile, model_bytes: int, draft_bytes: int, meminfo):
    from kimi_deploy.doctor.checks import Facts
    from kimi_deploy.facts.modeldir import ModelDir

    model = ModelDir("/m", True, True, ("a",), (), (), model_bytes, ())
    draft = ModelDir("/d", True, True, ("b",), (), (), draft_bytes, ())
    return Facts(profile=profile, model=model, draft_model=draft, meminfo=meminfo)


def test_doctor_says_what_a_warm_restart_needs(tmp_path):
    from kimi_deploy.doctor.checks import check_warm_restart

    info = parse_meminfo(RECORDED.read_text())
    assert info["MemTotal"] > 20 * 1024**3 and "MemAvailable" in info
    profile = _profile(tmp_path, Path("/m"))
    lean = _profile(tmp_path, Path("/m"), startup="prefetch_reserve_gib = 2")
    small = check_warm_restart(_doctor_facts(lean, 4 * 1024**3, 1024**3, info))
    assert small.status == "pass" and small.evidence.startswith(
        "a warm restart needs 7.0 GiB (shards 5.0 GiB + reserve 2.0 GiB); MemTotal 23.5 GiB, MemAvailable ")
    # the default reserve (32 GiB) alone is more than this 23.5 GiB machine has
    assert check_warm_restart(_doctor_facts(profile, 4 * 1024**3, 1024**3, info)).status == "warn"
    kimi = check_warm_restart(_doctor_facts(profile, 595 * 10**9, 6 * 10**9, info))
    assert kimi.status == "warn" and "every restart reads them from disk" in kimi.evidence
    assert "prefetch_reserve_gib" in kimi.hint
    off = check_warm_restart(_doctor_facts(_profile(tmp_path, Path("/m"), startup="prefetch = false"),
                                           595 * 10**9, 0, info))
    assert off.status == "pass" and off.evidence.endswith("the prefetch is off ([startup] prefetch = false)")
    unknown = check_warm_restart(_doctor_facts(profile, 1, 0, None))
    assert unknown.status == "warn" and "MemTotal" in unknown.evidence


# -- as the unit's user: mincore does not answer, RWF_NOWAIT does ----------------------------------------------------


def _system_python() -> tuple[str, str] | None:
    """``(/usr/bin/pythonX.Y, PYTHONPATH)`` that another user can run with the kit and its dependencies (this
    interpreter may live under /root), as tests/container_host.py rebuilds the venvs; None without one."""
    import sysconfig

    python = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    if not Path(python).exists():
        return None
    return python, f"{Path(__file__).resolve().parents[1]}:{sysconfig.get_paths()['purelib']}"


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess:
    python, path = _system_python()
    done = subprocess.run([python, *argv], capture_output=True, text=True, timeout=300, user="nobody",
                          group="nogroup", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path})
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done


@pytest.mark.skipif(os.geteuid() != 0 or _system_python() is None,
                    reason="needs root and the system's python of this X.Y to run a step as another user")
def test_as_a_user_who_does_not_own_the_shards_the_step_still_reads_them(tmp_path):
    """The kernel reports every page of a file mapping resident to a process that neither owns nor may write the
    file (mm/mincore.c can_do_mincore): the unit's user and root's shards. The step must not take that for warm."""
    folder = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="kimi-prefetch-"))
    try:
        folder.chmod(0o755)
        model = _model(folder / "m", {"s-1.safetensors": 16, "s-2.safetensors": 8})
        for path in (model, *model.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        shard = model / "s-1.safetensors"
        assert _resident(shard) == 0
        probe = _as_nobody(["-c", "import os, sys; from kimi_deploy.host import prefetch as pf; "
                            f"fd = os.open({str(shard)!r}, os.O_RDONLY); "
                            f"v = pf._MINCORE.vector(fd, {16 * MIB}); print(v.count(1), len(v))"])
        resident, pages = map(int, probe.stdout.split())
        assert resident == pages, "the kernel answered a stranger's mincore truthfully: the premise changed"
        text = MINIMAL.replace('model_path = "/models/moonshotai/Kimi-K2.5"', f'model_path = "{model}"')
        profile = folder / "p.toml"
        profile.write_text(text + "\n[startup]\nprefetch_reserve_gib = 0\n")
        profile.chmod(0o644)
        argv = ["-m", "kimi_deploy", "prefetch", "--profile", str(profile), "--json"]
        first = json.loads(_as_nobody(argv).stdout)
        assert (first["outcome"], first["read_bytes"], first["cached_bytes"]) == ("done", 24 * MIB, 0), first
        assert _resident(shard) == 16 * MIB
        again = json.loads(_as_nobody(argv).stdout)  # warm now: RWF_NOWAIT finds it all in the page cache
        assert (again["outcome"], again["read_bytes"], again["cached_bytes"]) == ("done", 0, 24 * MIB), again
    finally:
        shutil.rmtree(folder)


def test_the_installed_copy_keeps_the_table():
    """``install`` writes the profile with dump_profile; the unit's step reads that copy."""
    from kimi_deploy.profile import dump_profile

    profile = parse_profile(MINIMAL + "\n[startup]\nprefetch_reserve_gib = 0\nprefetch_threads = 4\n")
    again = parse_profile(dump_profile(profile))
    assert again.startup == profile.startup and again.digest() == profile.digest()
    assert "[startup]" not in dump_profile(parse_profile(MINIMAL))
