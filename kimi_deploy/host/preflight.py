"""``kimi-deploy preflight``: a bounded gloo rendezvous of one multi-node group, run before SGLang starts.

SGLang 0.5.23's ranks meet through torch's TCPStore on ``--dist-init-addr`` (rank 0 listens) and then connect
NCCL and Gloo over the NIC named by ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``. When one of those is wrong
SGLang fails late ("connectFullMesh failed", sglang issues 3226 and 868) or hangs at "Init torch distributed
begin" while systemd calls the unit active. The preflight does the same rendezvous with nothing else
attached and says which host, NIC or port is wrong, within ``timeout`` seconds.

It runs :data:`PREFLIGHT_SCRIPT` in SGLang's interpreter (``[service] python``: torch is there; the kit never
imports torch) through :func:`kimi_deploy.engine.run_script`, with the script's progress lines on stderr as
they happen (the rank units run it as ``ExecStartPre=``, so they reach the journal). Stages, in order:

1. ``address``: this host owns the node's address (binding a socket to it; a host name is resolved first), so
   what follows is about the right machine.
2. ``nic``: the NIC exists on this host (``socket.if_nameindex()``), at once.
3. ``store``: rank 0 listens on the dist-init port, the other ranks connect to it (torch ``TCPStore``; a
   client retries until the deadline, so a rank started before rank 0 still joins).
4. ``join``: every rank writes its key under :data:`KEY_PREFIX` and waits for all the others; a timeout
   names the ranks (and hosts) that did not join. Keys under a prefix of their own, so a rank that
   reaches a running SGLang's store instead of rank 0's preflight sees "rank 0 did not join", not a hang.
5. ``gloo``: ``init_process_group("gloo")`` over that store with ``GLOO_SOCKET_IFNAME=nic`` and one
   ``all_reduce`` (the full mesh of SGLang's CPU group), then every rank reports done and rank 0 waits
   for the others before closing its store.

Measured (torch 2.14.1, two network namespaces joined by a veth; tests/test_preflight_netns.py): a
missing NIC fails in stage 2 before torch is imported; a missing peer fails at the deadline.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kimi_deploy import engine as target
from kimi_deploy.errors import ExitCode
from kimi_deploy.profile import Profile
from kimi_deploy.topology import Rank

#: Store keys of the preflight (never SGLang's own keys).
KEY_PREFIX = "kimi-deploy-preflight"
#: Seconds the interpreter may take beyond the rendezvous deadline (importing torch, tearing down).
STARTUP_ALLOWANCE_SEC = 120.0
#: torch's C++ log level for the script: its own timeout messages carry C++ stack frames; the script's
#: messages say the same in one line.
QUIET_TORCH = {"TORCH_CPP_LOG_LEVEL": "FATAL"}
#: Stages in the order they run (see the module docstring).
STAGES = ("address", "nic", "store", "join", "gloo")

#: Runs inside SGLang's interpreter. argv[1]: JSON {rank, world, node, nodes, rank0, port, nic, timeout}.
#: Prints progress lines on stderr, then one JSON object on stdout:
#: {ok, stage, stages, error, fix, timed_out, missing, seconds}.
PREFLIGHT_SCRIPT = r"""
import json, os, socket, sys, time
cfg = json.loads(sys.argv[1])
rank, world, node, nodes = cfg["rank"], cfg["world"], cfg["node"], cfg["nodes"]
rank0, port, nic, timeout = cfg["rank0"], cfg["port"], cfg["nic"], float(cfg["timeout"])
prefix = cfg["prefix"]
out = {"ok": False, "stage": None, "stages": [], "error": None, "fix": None, "timed_out": False,
       "missing": [], "seconds": None}
me = "rank %d of %d (%s)" % (rank, world, node)
def say(msg):
    sys.stderr.write("preflight: " + me + ": " + msg + "\n"); sys.stderr.flush()
def fail(stage, error, fix, timed_out=False):
    out.update(stage=stage, error=error, fix=fix, timed_out=timed_out)
    print(json.dumps(out)); sys.stdout.flush(); os._exit(0)
def passed(stage):
    out["stages"].append(stage)
# 1. address (first: on another host every later finding would name the wrong machine)
try:
    infos = socket.getaddrinfo(node, None, proto=socket.IPPROTO_TCP)
except OSError as exc:
    fail("address", "host name %s does not resolve on this host: %s" % (node, exc),
         "list the node's address in [fleet] replicas, or make the name resolve on every node")
owned = False
for family, _, _, _, sockaddr in infos:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((sockaddr[0], 0)); owned = True
    except OSError:
        pass
    finally:
        s.close()
if not owned:
    fail("address", "this host does not own %s, the address [fleet] replicas gives rank %d" % (node, rank),
         "run the preflight (and install this folder) on %s, or fix that replica's nodes list" % node)
passed("address")
# 2. nic
names = [name for _, name in socket.if_nameindex()]
if nic not in names:
    fail("nic", "host %s has no network interface %s (it has: %s)" % (node, nic, ", ".join(names)),
         "set [fleet] nic to the data NIC every node has under the same name (`ip -br addr` on %s)" % node)
passed("nic")
# 3. store (the deadline starts once torch is imported: importing it takes seconds on a loaded host)
import datetime
os.environ["GLOO_SOCKET_IFNAME"] = nic
try:
    import torch, torch.distributed as dist
except Exception as exc:
    fail("store", "torch does not import in %s: %s" % (sys.executable, " ".join(str(exc).split())[:300]),
         "run the preflight with SGLang's interpreter (--python, or [service] python), where torch is")
if not dist.is_available() or not dist.is_gloo_available():
    fail("store", "torch in %s has no gloo backend (torch.distributed.is_gloo_available() is false)"
         % sys.executable, "use SGLang's own torch build (pip install sglang pulls one with gloo)")
started = time.monotonic()
deadline = started + timeout
def left():
    return max(0.001, deadline - time.monotonic())
where = "%s:%d" % (rank0, port)
if rank == 0:
    say("listening on port %d for %d other rank(s), up to %g s" % (port, world - 1, timeout))
else:
    say("waiting for rank 0 at %s, up to %g s" % (where, timeout))
try:
    store = dist.TCPStore(rank0, port, None, rank == 0, datetime.timedelta(seconds=left()), wait_for_workers=False)
except Exception as exc:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    if rank == 0:
        busy = "EADDRINUSE" in text or "already in use" in text
        fail("store", ("port %d is already in use on %s: %s" if busy else "rank 0 cannot listen on port %d of %s: %s")
             % (port, node, text),
             ("stop what holds it (`ss -ltnp 'sport = :%d'`): a running SGLang of this group means every rank "
              "must be restarted together; or choose another [fleet] dist_init_port" % port) if busy else
             "choose another [fleet] dist_init_port")
    fail("store", "rank 0 at %s did not answer within %g s: %s" % (where, timeout, text),
         "start rank 0's unit on %s; check that it listens (`ss -ltn 'sport = :%d'` there) and that its "
         "firewall lets TCP port %d in from %s (docs/runbook.md#firewall-between-the-nodes lists the ports)" % (rank0, port, port, node),
         timed_out=True)
passed("store")
# 4. join
key = lambda what, r: "%s/%s/%d" % (prefix, what, r)
store.set(key("join", rank), node)
try:
    store.wait([key("join", r) for r in range(world)], datetime.timedelta(seconds=left()))
except Exception as exc:
    missing = [r for r in range(world) if not store.check([key("join", r)])]
    out["missing"] = missing
    names = ", ".join("rank %d (%s)" % (r, nodes[r]) for r in missing)
    if 0 in missing and rank != 0:
        fail("join", "%s answers at %s, but rank 0's preflight did not join within %g s: a running SGLang "
             "(or another program) holds that port" % (rank0, where, timeout),
             "restart every rank of the group together (a rank cannot rejoin a running group)", timed_out=True)
    fail("join", "%s did not join within %g s" % (names, timeout),
         "start the unit on %s; if it is started, read its preflight message (`journalctl -u` there), and "
         "check that its firewall lets it reach %s" % (", ".join(nodes[r] for r in missing), where),
         timed_out=True)
passed("join")
say("every rank joined; connecting gloo over %s" % nic)
# 5. gloo
try:
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix + "/gloo", store), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=left()))
    total = torch.ones(1)
    dist.all_reduce(total)
    if int(total.item()) != world:
        raise RuntimeError("all_reduce gave %s, expected %d" % (total.item(), world))
    dist.destroy_process_group()
except Exception as exc:
    text = " ".join(str(exc).split())[:400]
    if "Unable to find address for" in text:
        fail("gloo", "gloo found no address on %s on host %s: %s" % (nic, node, text),
             "give %s an address on the data network (`ip -br addr` on %s) or set [fleet] nic to the NIC "
             "that has one" % (nic, node))
    fail("gloo", "gloo could not connect every rank over %s within %g s: %s" % (nic, timeout, text),
         "a peer failed (read its preflight message), its %s is on another network, or a firewall blocks "
         "TCP between the nodes' data addresses (gloo and NCCL use ephemeral ports; docs/runbook.md#firewall-between-the-nodes)" % nic,
         timed_out="imeout" in text)
passed("gloo")
store.set(key("done", rank), node)
if rank == 0:
    try:
        store.wait([key("done", r) for r in range(world)], datetime.timedelta(seconds=left()))
    except Exception:
        pass  # every rank finished gloo; a slow "done" is not a failed rendezvous
out.update(ok=True, seconds=round(time.monotonic() - started, 3))
say("ok in %.1f s" % out["seconds"])
print(json.dumps(out)); sys.stdout.flush(); os._exit(0)
"""


@dataclasses.dataclass(frozen=True)
class Preflight:
    """Outcome of :func:`preflight`: ``ok``; else ``stage`` (one of :data:`STAGES`), ``error`` (which host,
    NIC or port), ``fix``; ``timed_out`` when the deadline passed; ``missing``: ranks that did not join.
    ``seconds``: the rendezvous's duration (after torch was imported) when it succeeded."""

    rank: Rank
    nic: str
    port: int
    timeout: float
    ok: bool
    stage: str | None
    stages: tuple[str, ...]
    error: str | None
    fix: str | None
    timed_out: bool
    missing: tuple[int, ...]
    seconds: float | None

    @property
    def exit_code(self) -> ExitCode:
        """OK; TIMEOUT (6) when a peer did not come in time; FAILED (1) for a wrong host, NIC or port."""
        if self.ok:
            return ExitCode.OK
        return ExitCode.TIMEOUT if self.timed_out else ExitCode.FAILED

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rank"] = self.rank.to_dict()
        data["stages"], data["missing"] = list(self.stages), list(self.missing)
        data["exit_code"] = int(self.exit_code)
        return data


def preflight(profile: Profile, rank: Rank, *, timeout: float, python: str | Path | None = None) -> Preflight:
    """Run the rendezvous of ``rank`` (:data:`PREFLIGHT_SCRIPT`) in ``python`` (default ``[service] python``).

    Args:
        timeout: seconds for stages 3-5 together (from the first store connection attempt); the interpreter
            gets :data:`STARTUP_ALLOWANCE_SEC` more to import torch.

    Raises:
        UsageError: the interpreter does not exist.
        ExternalCommandError: the script crashed (no JSON), e.g. torch missing from that interpreter.
        DeadlineError: the interpreter ran past ``timeout`` + the allowance.
    """
    fleet = profile.fleet
    config = {"rank": rank.rank, "world": rank.nnodes, "node": rank.node, "nodes": list(rank.nodes),
              "rank0": rank.rank0, "port": fleet.dist_init_port, "nic": fleet.nic, "timeout": timeout,
              "prefix": KEY_PREFIX}
    data = target.run_script(python or profile.service.python, PREFLIGHT_SCRIPT, [json.dumps(config)],
                             timeout=timeout + STARTUP_ALLOWANCE_SEC, label="preflight script",
                             env=QUIET_TORCH, stream_stderr=True)
    return Preflight(rank=rank, nic=fleet.nic, port=fleet.dist_init_port, timeout=timeout,
                     ok=bool(data.get("ok")), stage=data.get("stage"), stages=tuple(data.get("stages", [])),
                     error=data.get("error"), fix=data.get("fix"), timed_out=bool(data.get("timed_out")),
                     missing=tuple(data.get("missing", [])), seconds=data.get("seconds"))
