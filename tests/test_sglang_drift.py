"""scripts/sglang-drift.py: the option table's newest spellings against a release's own argument definitions
(recorded releases for the classification; SGLang 0.5.23's real parser and source for the reading)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kimi_deploy.options import Option, Scope, Spelling

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sglang-drift.py"
_spec = importlib.util.spec_from_file_location("sglang_drift", SCRIPT)
drift_mod = importlib.util.module_from_spec(_spec)
sys.modules["sglang_drift"] = drift_mod  # dataclasses look their module up while the script's body runs
_spec.loader.exec_module(drift_mod)


def action(*flags, dest=None, help="", deprecated=False, new_flag=None):
    return {"flags": list(flags), "dest": dest or flags[0].lstrip("-").replace("-", "_"), "help": help,
            "kind": "DeprecatedStoreTrueAction" if deprecated else "_StoreAction", "new_flag": new_flag,
            "deprecated": deprecated}


def release(version, *actions, dated=(), env=()):
    return drift_mod.Release(python=f"/envs/{version}/bin/python", version=version, actions=tuple(actions),
                             dated=tuple(dated), env_present=frozenset(env))


ROWS = (
    Option("tp_size", int, 1, "", "value", Scope.EVERY_RANK, (Spelling("flag", "--tp-size"),),
           aliases=("--tensor-parallel-size",)),
    Option("dp_attention", bool, False, "", "switch", Scope.EVERY_RANK, (Spelling("flag", "--enable-dp-attention"),)),
    Option("graph_bs", int, 1, "", "value", Scope.EVERY_RANK, (Spelling("flag", "--cuda-graph-max-bs"),)),
    Option("gone", bool, False, "", "switch", Scope.EVERY_RANK, (Spelling("flag", "--enable-old-thing"),)),
    Option("fusion", str, "", "", "value", Scope.EVERY_RANK,
           (Spelling("flag", "--enable-fusion", until="0.5.14"), Spelling("flag", "--fusion-backend", since="0.5.14"))),
    Option("future", bool, False, "", "switch", Scope.EVERY_RANK, (Spelling("flag", "--future", since="0.6.0"),)),
    Option("pcie", bool, False, "", "env-switch", Scope.EVERY_RANK, (Spelling("env", "SGLANG_PCIE", since="0.5.21"),)),
)

NEW = release(
    "0.5.23",
    action("--tp-size"),
    action("--enable-dp-attention", deprecated=True, new_flag="--attn-dp-size <dp-size>", help="Deprecated. Use ..."),
    action("--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs"),  # the old dest under a new flag: renamed
    action("--fusion-backend"),
    action("--speculative-moe-runner", help="MoE runner of the EAGLE draft"),
    action("--log-level"),
    dated=[{"file": "srt/server_args.py", "line": 417, "date": "2026-12-31", "flags": ["--enable-dp-attention"],
            "text": "# TODO: remove the flag and the field after 2026-12-31."}],
)
OLD = release("0.5.22", action("--tp-size", "--tensor-parallel-size"), action("--enable-dp-attention"),
              action("--cuda-graph-max-bs"), action("--fusion-backend"), action("--log-level"),
              action("--enable-old-thing"), env=("SGLANG_PCIE",))


def test_each_kind_of_drift_is_named_with_sglangs_own_facts():
    report = drift_mod.drift(NEW, OLD, rows=ROWS)
    table = {(t["key"], t["flag"]): t for t in report["table"]}
    assert table[("tp_size", "--tensor-parallel-size")]["status"] == "alias-gone"
    dp = table[("dp_attention", "--enable-dp-attention")]
    assert (dp["status"], dp["now"], dp["removal"]) == ("deprecated", "--attn-dp-size <dp-size>", "2026-12-31")
    graph = table[("graph_bs", "--cuda-graph-max-bs")]
    assert graph["status"] == "renamed" and graph["now"] == ["--cuda-graph-max-bs-decode"]
    assert table[("gone", "--enable-old-thing")]["status"] == "removed"
    assert table[("future", "--future")]["status"] == "not-yet"
    assert table[("pcie", "SGLANG_PCIE")]["status"] == "removed"  # no file of the release names it
    assert ("fusion", "--fusion-backend") not in table and ("fusion", "--enable-fusion") not in table  # old spelling
    against = report["against"]
    assert against["removed"] == ["--cuda-graph-max-bs", "--enable-old-thing", "--tensor-parallel-size"]
    assert against["added"] == ["--cuda-graph-max-bs-decode", "--speculative-moe-runner"]
    assert against["newly_deprecated"] == ["--enable-dp-attention"]
    assert [a["flag"] for a in against["added_for_kimi"]] == ["--cuda-graph-max-bs-decode", "--speculative-moe-runner"]
    assert drift_mod.needs_update(report)
    text = drift_mod.markdown(report)
    assert "| `dp_attention` | deprecated | `--enable-dp-attention` | --attn-dp-size <dp-size> | 2026-12-31 |" in text
    assert "## SGLang 0.5.22 -> 0.5.23" in text


def test_a_release_that_matches_the_table_needs_no_update():
    rows = ROWS[:1]
    same = release("0.5.23", action("--tp-size", "--tensor-parallel-size"))
    report = drift_mod.drift(same, rows=rows)
    assert report["table"] == [] and not drift_mod.needs_update(report)
    assert "Every newest spelling of the table is in this release" in drift_mod.markdown(report)


@pytest.mark.sglang
def test_sglang_0_5_23_read_in_its_interpreter_matches_the_table(sglang_python):
    """The table is current for 0.5.23 (the release it was written from); SGLang's own source dates the
    removal of --enable-dp-attention (server_args.py TODO, 2026-12-31)."""
    new = drift_mod.read_release(sglang_python)
    report = drift_mod.drift(new)
    assert new.version == "0.5.23" and len(new.actions) > 400
    assert report["table"] == [], report["table"]
    deprecated = {d["flag"]: d for d in report["deprecated_in_release"]}
    assert deprecated["--enable-dp-attention"]["removal"] == "2026-12-31"
    assert deprecated["--enable-dp-attention"]["now"] == "--attn-dp-size <dp-size>"
    assert "--enable-flashinfer-allreduce-fusion" in deprecated
    assert {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"} <= new.env_present
