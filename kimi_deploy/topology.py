"""Which host, and which rank, this is: the one home of the profile's topology questions.

Hosts (``[fleet]``/``[gateway]``): :func:`pick_host` says which host of the profile this machine is (``--host``,
else the one host this machine is: :func:`owns_address`, the rule :func:`local_rank` uses too), and
:func:`is_node` whether a host runs a replica's node.

Ranks: a multi-node replica's nodes are the ranks of one SGLang group.

A replica of ``[fleet]`` with N > 1 nodes is an N-rank SGLang group (SGLang 0.5.23: every node runs the same
command plus ``--nnodes N --node-rank R --dist-init-addr NODES[0]:PORT``). Rank 0 is the only rank that serves
HTTP: ranks >= 1 run schedulers and a dummy ``/health`` that always answers 200
(``srt/entrypoints/engine.py``, ``srt/utils/common.py launch_dummy_health_check_server``), so nothing the kit
proves over HTTP may be asked of them (:func:`serving_url`).

Each rank's launch is the resolved deployment's (:func:`kimi_deploy.deployment.resolve`); its files :func:`kimi_deploy.targets.systemd.render_ranks`.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable

from kimi_deploy.errors import UsageError
from kimi_deploy.names import node_url
from kimi_deploy.profile import Profile, host_key
from kimi_deploy.wire.net import binds_locally

#: Seconds the rank units' ``ExecStartPre=`` preflight waits for the other ranks of the group (every rank's
#: unit must be started within this window; a missing peer fails the start, and ``Restart=on-failure``
#: tries again after ``RestartSec=``).
PREFLIGHT_TIMEOUT_SEC = 300


@dataclasses.dataclass(frozen=True)
class Rank:
    """One node of a multi-node replica: ``replica`` (index in ``[fleet] replicas``), ``rank`` (its index in
    that replica's ``nodes``), and the replica's ``nodes`` in rank order."""

    replica: int
    rank: int
    nodes: tuple[str, ...]

    @property
    def node(self) -> str:
        """This rank's host (address or name as the profile lists it)."""
        return self.nodes[self.rank]

    @property
    def rank0(self) -> str:
        """The replica's rank-0 host: the ``--dist-init-addr`` host and the only one serving HTTP."""
        return self.nodes[0]

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def serves(self) -> bool:
        """True on rank 0, the rank that serves HTTP (and the only one whose readiness means anything)."""
        return self.rank == 0

    def to_dict(self) -> dict[str, object]:
        return {"replica": self.replica, "rank": self.rank, "node": self.node, "nnodes": self.nnodes,
                "rank0": self.rank0}


def group_ranks(profile: Profile) -> tuple[Rank, ...]:
    """Every rank of every multi-node replica, in replica then rank order; ``()`` when replicas have one node
    (or there is no ``[fleet]``)."""
    if profile.nodes_per_copy < 2:
        return ()
    return tuple(Rank(index, rank, nodes) for index, nodes in enumerate(profile.replicas)
                 for rank in range(len(nodes)))


def find_rank(profile: Profile, node: str) -> Rank:
    """The rank whose host is ``node`` (however spelt: :func:`kimi_deploy.profile.host_key`).

    Raises:
        UsageError: the profile has no multi-node replica, or ``node`` is none of its nodes (exit 2).
    """
    ranks = group_ranks(profile)
    if not ranks:
        raise UsageError("the profile has no multi-node replica: ranks exist only when [fleet] replicas have "
                         "more than one node", value=node,
                         hint="list two or more nodes per [[fleet.replicas]], or leave out --host")
    for rank in ranks:
        if host_key(rank.node) == host_key(node):
            return rank
    listed = ", ".join(r.node for r in ranks)
    raise UsageError("that host is not a node of the profile's [fleet] replicas", value=node,
                     hint=f"give one of {listed}")


def owns_address(host: str) -> bool:
    """The one "is this machine that host" rule, for hosts (:func:`pick_host`) and ranks (:func:`local_rank`):
    True when ``host`` is this machine's host name or FQDN (``socket.gethostname()``/``getfqdn()``, however
    spelt), or when it resolves to an address a socket on this host can bind to
    (:func:`kimi_deploy.wire.net.binds_locally`). A name that does not resolve, or an address of another
    machine, gives False. No packet is sent and no process is started."""
    own = {host_key(n) for n in (socket.gethostname(), socket.getfqdn()) if n}
    if host_key(host) in own:
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return any(binds_locally(str(sockaddr[0])) for _, _, _, _, sockaddr in infos)


def local_rank(profile: Profile, node: str | None = None, *,
               owns: Callable[[str], bool] | None = None) -> Rank | None:
    """The rank this host runs: ``node``'s (``--host``) when given, else the one node of the profile whose
    address this host owns (``owns``); ``None`` for a profile without multi-node replicas, or when no node
    is this host's (an image tree, the operator's workstation). ``owns`` defaults to :func:`owns_address`.

    Raises:
        UsageError: ``node`` is not a node of the profile; this host owns more than one node's address.
    """
    ranks = group_ranks(profile)
    if not ranks:
        return None
    if node is not None:
        return find_rank(profile, node)
    owns = owns or owns_address
    mine = [r for r in ranks if owns(r.node)]
    if len(mine) > 1:
        raise UsageError("this host owns the addresses of several nodes of the profile",
                         value=", ".join(r.node for r in mine), hint="pass --host with the one this host runs")
    return mine[0] if mine else None


def refuse_http_proof(profile: Profile, rank: Rank | None, what: str) -> None:
    """Refuse ``what`` (an HTTP readiness wait or check) on a rank >= 1: it would ask SGLang's dummy
    ``/health``, which answers 200 whatever the group does.

    Raises:
        UsageError: ``rank`` is a rank >= 1 (exit 2); the hint names rank 0's URL.
    """
    if rank is None or rank.serves:
        return
    raise UsageError(f"{what} needs HTTP, but this host runs rank {rank.rank} of replica {rank.replica}, which "
                     "serves none (its /health is SGLang's dummy 200, no proof of anything)", value=rank.node,
                     hint=f"the group answers at rank 0: run it on {rank.rank0}, or point it at "
                          f"{serving_url(profile, rank)}")


def serving_url(profile: Profile, rank: Rank) -> str:
    """``http://RANK0:PORT``: the group's one HTTP endpoint (what readiness and checks must ask)."""
    return node_url(rank.rank0, profile.sglang.port)


def is_node(profile: Profile, host: str) -> bool:
    """True when ``host`` runs a node of a replica (one host however spelt: :func:`kimi_deploy.profile.host_key`)."""
    return any(host_key(host) == host_key(node) for nodes in profile.replicas for node in nodes)


def pick_host(profile: Profile, host: str | None, owns: Callable[[str], bool] | None = None) -> str:
    """Which host of the profile this is: ``host`` (``--host``) when given, else the one host this machine
    is (``owns``, default :func:`owns_address`: the same rule as :func:`local_rank`'s).

    Raises:
        UsageError: ``host`` is not one of the profile's hosts; no host, or more than one, matches.
    """
    hosts = profile.hosts()
    if host is not None:
        match = [h for h in hosts if host_key(h) == host_key(host)]
        if not match:
            raise UsageError("--host is not a host of the profile", value=host,
                             hint=f"use one of {', '.join(hosts)}")
        return match[0]
    owns = owns or owns_address
    matches = [h for h in hosts if owns(h)]
    if len(matches) != 1:
        found = "none" if not matches else ", ".join(matches)
        raise UsageError(f"cannot tell which host of the profile this is (matching: {found})",
                         value=f"this machine: {socket.gethostname()}"[:300],
                         hint=f"pass --host with one of {', '.join(hosts)}")
    return matches[0]
