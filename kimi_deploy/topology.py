"""Multi-node ranks: which node is which rank of which replica, each rank's launch, and each host's files.

A replica of ``[fleet]`` with N > 1 nodes is an N-rank SGLang group (SGLang 0.5.23: every node runs the same
command plus ``--nnodes N --node-rank R --dist-init-addr NODES[0]:PORT``). Rank 0 is the only rank that serves
HTTP: ranks >= 1 run schedulers and a dummy ``/health`` that always answers 200
(``srt/entrypoints/engine.py``, ``srt/utils/common.py launch_dummy_health_check_server``), so nothing the kit
proves over HTTP may be asked of them (:func:`serving_url`).

:func:`render_ranks` returns ``{host: {file name: text}}``: the folder each node installs, in the layout of
``render --out DIR`` for a fleet (``DIR/<host>/``, FLEET.md), which takes a multi-node replica's folders from it.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Mapping

from kimi_deploy.errors import UsageError
from kimi_deploy.launch import LaunchSpec, build_launch
from kimi_deploy.names import node_url
from kimi_deploy.profile import Profile, host_key

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
    """True when this host owns ``host``'s address: a socket binds to it (a name is resolved first; a name
    that does not resolve, or an address of another machine, gives False). No packet is sent."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


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


def rank_launch(profile: Profile, rank: Rank, sglang_version: str | None = None, *,
                components: Mapping[str, str] | None = None) -> LaunchSpec:
    """The launch of ``rank`` (:func:`kimi_deploy.launch.build_launch` with its node rank and rank 0).

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.launch.build_launch`.
    """
    from kimi_deploy import versions

    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version  # "" is refused
    return build_launch(profile, version, components=components, node_rank=rank.rank, rank0=rank.rank0)


def node_launch(profile: Profile, rank: Rank | None = None, sglang_version: str | None = None, *,
                components: Mapping[str, str] | None = None) -> LaunchSpec:
    """The launch a host of ``profile`` runs: ``rank``'s (:func:`rank_launch`; default for a multi-node profile:
    rank 0 of the first replica), else the one-node launch (:func:`kimi_deploy.launch.build_launch`). No I/O.

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.launch.build_launch`.
    """
    if rank is None and profile.nodes_per_copy > 1:
        rank = group_ranks(profile)[0]
    if rank is not None:
        return rank_launch(profile, rank, sglang_version, components=components)
    from kimi_deploy import versions

    version = versions.DEFAULT_SGLANG_VERSION if sglang_version is None else sglang_version  # "" is refused
    return build_launch(profile, version, components=components)


def preflight_command(profile: Profile, rank: Rank, profile_path: str) -> str:
    """The rank unit's ``ExecStartPre=``: ``kimi-deploy preflight --profile P --host NODE --timeout T``."""
    return (f"{profile.service.kimi_deploy} preflight --profile {profile_path} --host {rank.node} "
            f"--timeout {PREFLIGHT_TIMEOUT_SEC}")


def render_ranks(profile: Profile, sglang_version: str | None = None, *,
                 components: Mapping[str, str] | None = None,
                 profile_path: str | None = None) -> dict[str, dict[str, str]]:
    """``{node: {file name: text}}`` for every rank of every multi-node replica (empty without one).

    Rank 0's folder holds what a single host gets (server unit, env file, nightly check units); a rank >= 1
    folder holds its server unit and env file only (no check: it serves no HTTP). Every server unit runs the
    preflight first (:func:`preflight_command`). The monitoring files are not a host's part: as for
    single-node replicas (``kimi_deploy.fleet.host_files``), ``render`` writes them once beside the folders.

    Raises:
        UsageError / UnsupportedVersionError: from :func:`kimi_deploy.launch.build_launch`.
    """
    from kimi_deploy.targets import systemd as render_lib

    hosts: dict[str, dict[str, str]] = {}
    for rank in group_ranks(profile):
        rendered = render_lib.render(profile, sglang_version, components=components, profile_path=profile_path,
                                     rank=rank)
        hosts[rank.node] = dict(rendered.files)
    return hosts
