"""[fleet] and [gateway] in the profile (issue 14, /work/coord/FLEET.md): the shape others read, and every bad
fleet is exit 2 with the key and a fix, through the real CLI."""

from __future__ import annotations

import tomllib

import pytest

from helpers import MINIMAL, run_cli, write_profile
from kimi_deploy.profile import dump_profile, parse_profile

#: A keyed server on every address: what a replica behind a gateway on another host needs.
SERVED = MINIMAL.replace("tp_size = 8\n", 'tp_size = 8\nhost = "0.0.0.0"\napi_key_file = "/etc/kimi-deploy/kimi-k25.api-key"\n')
TWO_REPLICAS = """
[fleet]
[[fleet.replicas]]
nodes = ["10.0.0.11"]
[[fleet.replicas]]
nodes = ["10.0.0.12"]
"""
GATEWAY = """
[gateway]
host = "10.0.0.10"
"""
TWO_RANKS = """
[fleet]
dist_init_port = 20000
nic = "ens5f0"
dist_timeout = 1800
[[fleet.replicas]]
nodes = ["10.0.0.21", "10.0.0.22"]
"""
MULTI = SERVED.replace("tp_size = 8\n", "tp_size = 8\npp_size = 2\n")


def _data(text: str) -> dict:
    return tomllib.loads(text)


def test_no_fleet_is_one_host_as_before():
    profile = parse_profile(_data(MINIMAL))
    assert profile.fleet is None and profile.gateway is None
    assert (profile.copies, profile.nodes_per_copy, profile.replicas, profile.worker_urls(), profile.hosts()) == \
        (1, 1, (), (), ())


def test_two_replicas_and_a_gateway():
    profile = parse_profile(_data(SERVED + TWO_REPLICAS + GATEWAY))
    assert profile.copies == 2 and profile.nodes_per_copy == 1
    assert profile.worker_urls() == ("http://10.0.0.11:30000", "http://10.0.0.12:30000")
    assert profile.hosts() == ("10.0.0.11", "10.0.0.12", "10.0.0.10")
    gw = profile.gateway
    assert (gw.bind, gw.port, gw.policy, gw.smg, gw.version, gw.prometheus_host, gw.prometheus_port) == \
        ("0.0.0.0", 30000, "cache_aware", "/opt/smg/.venv/bin/smg", "1.13.0", "127.0.0.1", 29000)


def test_a_two_rank_group():
    profile = parse_profile(_data(MULTI + TWO_RANKS))
    assert profile.copies == 1 and profile.nodes_per_copy == 2
    assert profile.worker_urls() == ("http://10.0.0.21:30000",)
    assert (profile.fleet.dist_init_port, profile.fleet.nic, profile.fleet.dist_timeout) == (20000, "ens5f0", 1800)


def test_ipv6_worker_urls_are_bracketed():
    text = SERVED.replace('host = "0.0.0.0"', 'host = "::"') + '[fleet]\n[[fleet.replicas]]\nnodes = ["fd00::11"]\n'
    assert parse_profile(_data(text)).worker_urls() == ("http://[fd00::11]:30000",)


def test_a_fleet_round_trips_through_canonical_toml_with_the_same_digest():
    profile = parse_profile(_data(MULTI + TWO_RANKS.replace('nodes = ["10.0.0.21", "10.0.0.22"]',
                                                             'nodes = ["10.0.0.21", "10.0.0.22"]\n'
                                                             '[[fleet.replicas]]\nnodes = ["10.0.0.23", "10.0.0.24"]')
                                  + GATEWAY))
    again = parse_profile(tomllib.loads(dump_profile(profile)))
    assert again == profile and again.digest() == profile.digest()


def test_the_digest_of_a_profile_without_a_fleet_does_not_change():
    """Installed manifests record the digest: the new optional keys, unset, leave it as before (value from the
    kit before [fleet] existed, for this exact profile)."""
    profile = parse_profile({"service": {"name": "k", "gpu_count": 8},
                             "sglang": {"model_path": "/m", "tp_size": 8, "host": "0.0.0.0",
                                        "api_key_file": "/etc/kimi-deploy/k.api-key"}})
    assert profile.digest() == "d46719d30a290ed60d190cadd1ccacee3c954b320896c25a6eb41fcaf4e42a92"


CASES = [
    # (id, profile text, substrings the error must contain)
    ("unequal-replicas", SERVED + TWO_REPLICAS.replace('nodes = ["10.0.0.12"]', 'nodes = ["10.0.0.12", "10.0.0.13"]'),
     ["fleet.replicas: the replicas have 1, 2 nodes", "same number of nodes"]),
    ("node-twice-across-replicas", SERVED + TWO_REPLICAS.replace("10.0.0.12", "10.0.0.11"),
     ["fleet.replicas.1.nodes: 10.0.0.11 is listed in replicas 0 and 1", "list each host once"]),
    ("node-twice-in-a-group", MULTI + TWO_RANKS.replace("10.0.0.22", "10.0.0.21"),
     ["fleet.replicas.0.nodes: 10.0.0.21 is listed twice in the same replica"]),
    ("gateway-on-a-worker-port", SERVED + TWO_REPLICAS + GATEWAY.replace("10.0.0.10", "10.0.0.11"),
     ["gateway.port: 30000 is also [sglang] port on 10.0.0.11", "choose another port (e.g. 30001)"]),
    ("gateway-metrics-on-a-worker-port", SERVED + TWO_REPLICAS + GATEWAY.replace("10.0.0.10", "10.0.0.11")
     + "port = 8000\nprometheus_port = 30000\n",
     ["gateway.prometheus_port: 30000 is also [sglang] port on 10.0.0.11"]),
    ("gateway-metrics-on-its-port", SERVED + TWO_REPLICAS + GATEWAY + "prometheus_port = 30000\n",
     ["gateway.prometheus_port: 30000 is also gateway.port", "e.g. 29000"]),
    ("rank-0-loopback", MULTI + TWO_RANKS.replace("10.0.0.21", "127.0.0.1"),
     ["fleet.replicas.0.nodes: rank 0 is 127.0.0.1, a loopback address", "list the address of rank 0's data NIC"]),
    ("tp-pp-not-the-gpus", SERVED + TWO_RANKS,
     ["sglang.tp_size: tp_size * pp_size = 8 * 1 = 8, but 2 nodes of service.gpu_count = 8 are 16 GPUs",
      "tp_size = 8, pp_size = 2"]),
    ("pp-on-one-host", SERVED.replace("tp_size = 8", "tp_size = 8\npp_size = 2"),
     ["sglang.pp_size: tp_size * pp_size = 8 * 2 = 16 GPUs does not divide service.gpu_count = 8"]),
    ("multi-node-without-nic", MULTI + TWO_RANKS.replace('nic = "ens5f0"\n', ""),
     ["fleet.nic: required when a replica has more than one node (2)", 'nic = "ens5f0"']),
    ("multi-node-without-port", MULTI + TWO_RANKS.replace("dist_init_port = 20000\n", ""),
     ["fleet.dist_init_port: required when a replica has more than one node", "dist_init_port = 20000"]),
    ("rendezvous-on-the-server-port", MULTI + TWO_RANKS.replace("dist_init_port = 20000", "dist_init_port = 30000"),
     ["fleet.dist_init_port: 30000 is also [sglang] port on rank 0"]),
    ("nic-on-single-node-replicas", SERVED + TWO_REPLICAS.replace("[fleet]\n", '[fleet]\nnic = "eth0"\n'),
     ["fleet.nic: applies to multi-node replicas only", "remove it"]),
    ("bad-nic", MULTI + TWO_RANKS.replace('"ens5f0"', '"eth0/../x"'), ["fleet.nic", "not a network interface name"]),
    ("nic-env-by-hand", MULTI + TWO_RANKS + '\n[environment]\nGLOO_SOCKET_IFNAME = "eth0"\n',
     ["environment.GLOO_SOCKET_IFNAME: the kit sets it on every rank from [fleet] nic"]),
    ("gateway-without-the-workers-key", MINIMAL.replace("tp_size = 8\n", 'tp_size = 8\nhost = "0.0.0.0"\n'
                                                        "allow_unauthenticated = false\n") + TWO_REPLICAS + GATEWAY,
     ["gateway.bind: 0.0.0.0 accepts connections from other machines but [sglang] api_key_file is not set",
      "one key end to end"]),
    ("workers-loopback-behind-a-remote-gateway", MINIMAL + '[fleet]\n[[fleet.replicas]]\nnodes = ["127.0.0.1"]\n'
     + GATEWAY.replace("10.0.0.10", "127.0.0.2") + 'bind = "127.0.0.2"\n',
     ["sglang.host: 127.0.0.1 accepts only local connections, but the gateway on 127.0.0.2 reaches 127.0.0.1"]),
    ("server-bound-to-one-node", SERVED.replace('host = "0.0.0.0"', 'host = "10.0.0.11"') + TWO_REPLICAS,
     ["sglang.host: 10.0.0.11 on replica 1, whose worker URL is http://10.0.0.12:30000", 'host = "0.0.0.0"']),
    # a host spelled twice is still one host: IPv6 forms, upper case names (fleet.host_key)
    ("node-twice-as-ipv6-spellings", SERVED + TWO_REPLICAS.replace("10.0.0.11", "fd00::11").replace("10.0.0.12",
                                                                                                 "fd00:0::11"),
     ["fleet.replicas.1.nodes: fd00:0::11 is listed in replicas 0 and 1 (as fd00::11)", "list each host once"]),
    ("node-twice-in-upper-case", SERVED + TWO_REPLICAS.replace("10.0.0.11", "gpu1.example.com")
     .replace("10.0.0.12", "GPU1.Example.com"),
     ["fleet.replicas.1.nodes: GPU1.Example.com is listed in replicas 0 and 1 (as gpu1.example.com)"]),
    ("gateway-on-a-worker-port-spelt-otherwise", SERVED + TWO_REPLICAS.replace("10.0.0.11", "fd00::11")
     + GATEWAY.replace("10.0.0.10", "FD00:0::11"),
     ["gateway.port: 30000 is also [sglang] port on FD00:0::11, which serves a replica"]),
    # addresses that are not one host: a worker URL or a folder for them means nothing
    ("wildcard-node", SERVED + TWO_REPLICAS.replace("10.0.0.11", "0.0.0.0"),
     ["fleet.replicas.0.nodes: 0.0.0.0 is not the address of one host", "the node's own address or name"]),
    ("wildcard-ipv6-rank0", MULTI + TWO_RANKS.replace("10.0.0.21", "::"),
     ["fleet.replicas.0.nodes: :: is not the address of one host"]),
    ("multicast-node", SERVED + TWO_REPLICAS.replace("10.0.0.12", "224.0.0.1"),
     ["fleet.replicas.1.nodes: 224.0.0.1 is not the address of one host (a multicast address)"]),
    ("broadcast-node", SERVED + TWO_REPLICAS.replace("10.0.0.12", "255.255.255.255"),
     ["fleet.replicas.1.nodes: 255.255.255.255 is not the address of one host (the broadcast address)"]),
    ("wildcard-gateway-host", SERVED + TWO_REPLICAS + GATEWAY.replace("10.0.0.10", "0.0.0.0"),
     ["gateway.host: 0.0.0.0 is not the address of one host", "set bind"]),
    ("rank-0-ipv4-mapped-loopback", MULTI + TWO_RANKS.replace("10.0.0.21", "::ffff:127.0.0.1"),
     ["fleet.replicas.0.nodes: rank 0 is ::ffff:127.0.0.1, a loopback address"]),
    ("rank-0-localhost-upper-case", MULTI + TWO_RANKS.replace("10.0.0.21", "LocalHost"),
     ["fleet.replicas.0.nodes: rank 0 is LocalHost, a loopback address"]),
    ("loopback-worker-behind-a-remote-gateway", SERVED + TWO_REPLICAS.replace("10.0.0.12", "127.0.0.1") + GATEWAY,
     ["fleet.replicas.1.nodes: 127.0.0.1 is a loopback address, which the gateway on 10.0.0.10 cannot reach"]),
    # a rank >= 1 gets no --host/--port: SGLang 0.5.23 serves its dummy /health on its defaults 127.0.0.1:30000
    ("gateway-on-a-rank-1-host-on-sglangs-default-port", MULTI + TWO_RANKS + GATEWAY.replace("10.0.0.10", "10.0.0.22"),
     ["gateway.port: 30000 on 10.0.0.22 is where rank 1 of replica 0 serves SGLang's dummy /health "
      "(127.0.0.1:30000)", "choose another port (e.g. 30001)"]),
    ("gateway-metrics-on-a-rank-1-host-on-sglangs-default-port", MULTI + TWO_RANKS
     + GATEWAY.replace("10.0.0.10", "10.0.0.22") + "port = 8000\nprometheus_port = 30000\n",
     ["gateway.prometheus_port: 30000 on 10.0.0.22 is where rank 1 of replica 0 serves"]),
    ("gateway-without-fleet", SERVED + GATEWAY, ["gateway: a gateway routes to replicas, but there is no [fleet]"]),
    ("no-replicas", SERVED + "[fleet]\nreplicas = []\n", ["fleet.replicas", "at least 1 item"]),
    ("no-nodes", SERVED + "[fleet]\n[[fleet.replicas]]\nnodes = []\n", ["fleet.replicas.0.nodes", "at least 1 item"]),
    ("unknown-replica-key", SERVED + '[fleet]\n[[fleet.replicas]]\nnode = ["10.0.0.11"]\n',
     ["fleet.replicas.0.node: unknown key (did you mean nodes?)"]),
    ("unknown-gateway-key", SERVED + TWO_REPLICAS + GATEWAY + 'polcy = "round_robin"\n',
     ["gateway.polcy: unknown key (did you mean policy?)"]),
    ("misspelt-table", SERVED + '[fleets]\n', ["fleets: unknown key (did you mean [fleet]?)"]),
    ("bad-node", SERVED + '[fleet]\n[[fleet.replicas]]\nnodes = ["10.0.0.11;rm"]\n',
     ["fleet.replicas.0.nodes.0", "neither an IP address"]),
    ("control-character-in-node", SERVED + '[fleet]\n[[fleet.replicas]]\nnodes = ["10.0.0.11\\n"]\n',
     ["fleet.replicas.0.nodes", "U+000A"]),
    ("bad-policy", SERVED + TWO_REPLICAS + GATEWAY + 'policy = "--round-robin"\n',
     ["gateway.policy", "not a policy name"]),
    ("bad-smg-version", SERVED + TWO_REPLICAS + GATEWAY + 'version = "latest"\n',
     ["gateway.version", "not an smg release number"]),
    ("relative-smg", SERVED + TWO_REPLICAS + GATEWAY + 'smg = "smg"\n', ["gateway.smg", "relative"]),
    ("gateway-port-out-of-range", SERVED + TWO_REPLICAS + GATEWAY + "port = 0\n", ["gateway.port", "greater than"]),
    ("string-for-port", SERVED + TWO_REPLICAS.replace("[fleet]\n", '[fleet]\ndist_init_port = "20000"\n'),
     ["fleet.dist_init_port", "valid integer"]),
    ("fleet-flag-in-extra-args", SERVED + 'extra_args = ["--nnode", "2"]\n',
     ["sglang.extra_args: '--nnode' sets --nnodes", "use [fleet] replicas: len(nodes) instead"]),
]


@pytest.mark.parametrize("text,expected", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_fleet_is_exit_2_with_key_and_fix(tmp_path, text, expected):
    profile = write_profile(tmp_path, text)
    out = tmp_path / "out"
    result = run_cli(["render", "--profile", str(profile), "--out", str(out)])
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")
    for fragment in expected:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    assert "fix:" in result.stderr
    assert not out.exists()


#: Values no string of [fleet]/[gateway] may carry into a unit or argv: an option-like start, a space, systemd
#: specifiers and variables, quotes, a line break, a bidi override.
HOSTILE = ["-x", "a b", "a%i", "a$b", 'a"b', "a\nb", "a\u202eb", ""]
STRING_KEYS = [("gateway", k) for k in ("host", "bind", "policy", "smg", "version", "prometheus_host",
                                        "reasoning_parser", "tool_call_parser")] + \
              [("fleet", "nic"), ("fleet", "node")]


@pytest.mark.parametrize(("table", "key"), STRING_KEYS, ids=[f"{t}.{k}" for t, k in STRING_KEYS])
def test_every_fleet_and_gateway_string_refuses_hostile_values(table, key):
    for value in HOSTILE:
        data = _data(MULTI + TWO_RANKS + GATEWAY)
        if (table, key) == ("fleet", "node"):
            data["fleet"]["replicas"][0]["nodes"][1] = value
        else:
            data[table][key] = value
        with pytest.raises(Exception) as err:
            parse_profile(data)
        assert getattr(err.value, "exit_code", None) == 2, (key, value)
        assert f"{table}." in " ".join(err.value.problems), (key, value, err.value.problems)
