"""One rule groups SGLang arguments into ``--flag value``: the printed command, ``status``'s comparison and the
public-host check agree."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kimi_deploy.argv import flag_groups, split_equals
from kimi_deploy.errors import ProfileError
from kimi_deploy.launch import LaunchSpec, check_exposure
from kimi_deploy.profile import parse_profile
from kimi_deploy.catalog.presets import get_preset
from kimi_deploy.targets.systemd import render
from kimi_deploy.host.status import IGNORED_OPTIONS, launch_entries

WORDS = st.one_of(st.sampled_from(["--port", "--tp-size", "--trust-remote-code", "--config", "--api-key", "8",
                                   "-1", "x", "--port=1", "--a=b=c", "--", "="]),
                  st.text(alphabet="-=ab1", min_size=1, max_size=6))


def test_examples():
    assert flag_groups(["--model-path", "/m", "--trust-remote-code", "--tp-size", "8"]) == [
        ("--model-path", "/m"), ("--trust-remote-code",), ("--tp-size", "8")]
    assert flag_groups(["--port=1", "x", "--eagle-topk", "-1"]) == [("--port=1",), ("x",), ("--eagle-topk", "-1")]
    assert split_equals(("--port=1",)) == ("--port", "1") and split_equals(("--port", "1")) == ("--port", "1")


@given(st.lists(WORDS, max_size=12))
def test_groups_give_the_arguments_back_and_pair_only_flags_with_values(args):
    groups = flag_groups(args)
    assert [w for g in groups for w in g] == args
    for group in groups:
        if len(group) == 2:
            assert group[0].startswith("--") and "=" not in group[0] and not group[1].startswith("--")


@given(st.lists(WORDS, max_size=12))
def test_status_compares_the_groups_the_command_is_printed_in(args):
    """``status`` sees the same ``--flag value`` pairs the printed command shows, ``--flag=value`` split."""
    launch = LaunchSpec(argv=("/py", "-m", "sglang.launch_server", *args), env=(), sglang_version="0.5.23",
                        cache_dir="/var/cache/k", secrets_config=None)
    shown = [" ".join(split_equals(g)) for g in launch.flag_groups()]
    assert sorted(launch_entries(args)) == sorted(e for e in shown if e.split(" ")[0] not in IGNORED_OPTIONS)


def test_the_rendered_unit_prints_one_group_a_line():
    launch = render(get_preset("kimi-k25-rtx-pro-6000-x8").profile()).launch
    lines = launch.shell_command().splitlines()
    assert len(lines) == 2 + len(launch.flag_groups()) and lines[2].strip() == "--model-path /models/moonshotai/Kimi-K2.5 \\"


@pytest.mark.parametrize("args", [["--host"], ["--host", "--port", "1"], ["--host", "127.0.0.1", "--host"],
                                  ["--host="]])
def test_exposure_check_reads_a_host_without_a_value_as_public(args):
    """Where the rule gives ``--host`` no value, the public-host check does not take the next flag for one
    nor fall back to loopback: without a key it refuses (SGLang's argparse would reject the command too)."""
    profile = parse_profile({"service": {"name": "x"}, "sglang": {"model_path": "/m"}})
    with pytest.raises(ProfileError):
        check_exposure(args, profile)
    check_exposure(["--host", "::1", "--config"], profile)  # a --config without a path changes nothing
