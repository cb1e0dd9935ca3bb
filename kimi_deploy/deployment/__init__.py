"""One resolved deployment: what a profile means for one SGLang release on one kind of host, computed once.

:func:`resolve` is pure (no subprocess, no network; the shipped patch series is read when the patch set is
first asked for): the profile, the target SGLang version (its option spellings come from the option table,
:mod:`kimi_deploy.options` and :mod:`kimi_deploy.versions`), the probed component versions (the compile-cache
key) and, where known, the host's GPUs give a frozen :class:`Deployment` holding

- each rank's launch (:mod:`kimi_deploy.launch`, the only builder of a rank's argv): one entry for a one-node
  replica, every rank of every replica for a multi-node ``[fleet]``;
- the unit names (:mod:`kimi_deploy.names`), the URLs (the local client's, each replica's rank 0, the
  gateway's), the API key's path;
- the model's facts (:mod:`kimi_deploy.catalog.models`);
- the **required patch set**: the series' defaults plus every opt-in patch whose gated feature the rendered
  command turns on (:meth:`kimi_deploy.patching.Series.gates_asked`), on a host of the gated compute capability
  (SM12x for the SM120 gates) or, with no host facts, on the reference host's;
- the **fit verdict** (:class:`Fit`): first the model table's rule (published weights against one replica's
  GPU memory, :func:`kimi_deploy.catalog.models.weights_fit`), needing no interpreter; refined by the memory
  plan (:meth:`Deployment.refine`) when SGLang's own resolution has run.

Every verb reads it instead of deriving these facts from the profile's fields (``tests/test_architecture.py``
holds that rule: nothing outside this package and :mod:`kimi_deploy.launch` builds a launch or asks the
series which gates a command opens). A model that cannot fit is refused by every verb with the same numbers
(:meth:`Deployment.require_fit`), before any interpreter or GPU is needed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kimi_deploy import names, patching, versions
from kimi_deploy.catalog.models import REFERENCE_GPU, REFERENCE_GPUS, Gpu, ModelFacts, identify, weights_fit
from kimi_deploy.errors import RefusedError
from kimi_deploy.launch import LaunchSpec, build_launch, gateway_argv
from kimi_deploy.profile import Profile, host_key, load_profile
from kimi_deploy.topology import Rank, find_rank, group_ranks

__all__ = ["Deployment", "Fit", "HostGpus", "RankLaunch", "Units", "resolve", "resolve_file", "require_fit", "static_fit",
           "REFERENCE_COMPUTE_CAP"]

#: The reference host's compute capability (RTX PRO 6000 Blackwell, SM120; NVIDIA's CUDA GPUs list): the one the
#: required patch set assumes when no GPU facts are known.
REFERENCE_COMPUTE_CAP = "12.0"


@dataclasses.dataclass(frozen=True)
class HostGpus:
    """The GPUs of one host as the fit rule and the patch gates read them: ``count`` GPUs of ``gpu`` (its memory
    as the host reports it: nvidia-smi ``memory.total`` MiB x 2**20), ``compute_cap`` (``"12.0"``), ``source``."""

    count: int
    gpu: Gpu
    compute_cap: str
    source: str

    @classmethod
    def reference(cls) -> HostGpus:
        """The reference host: 8 x RTX PRO 6000 Blackwell, 96 GB as NVIDIA lists it, SM120."""
        return cls(REFERENCE_GPUS, REFERENCE_GPU, REFERENCE_COMPUTE_CAP, "the reference host (no GPU facts)")

    @classmethod
    def of(cls, facts: Any) -> HostGpus:
        """From anything with ``count``, ``name``, ``memory_mib``, ``compute_cap`` and ``source``
        (:class:`kimi_deploy.sizing.memory.GpuFacts`: a recorded or live ``nvidia-smi --query-gpu``)."""
        return cls(int(facts.count), Gpu(str(facts.name), int(facts.memory_mib) << 20,
                                         f"nvidia-smi memory.total ({facts.source})"),
                   str(facts.compute_cap), str(facts.source))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "name": self.gpu.name, "memory_bytes": self.gpu.memory_bytes,
                "compute_cap": self.compute_cap, "source": self.source}


@dataclasses.dataclass(frozen=True)
class Fit:
    """The fit verdict. ``static``: the model table's rule (``True``/``False``; ``None``: a model the table does
    not know, or one without a published size); ``evidence``/``what_fits``: its numbers, one sentence each;
    ``verdict``: ``fits`` / ``tight`` / ``will not fit`` / ``unknown``, the memory plan's once it ran
    (:meth:`Deployment.refine`), else the static rule's (``fits`` only says the weights leave the headroom)."""

    static: bool | None
    evidence: str
    what_fits: str
    gpus: int
    verdict: str
    source: str = "model table"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RankLaunch:
    """One rank's launch: ``rank`` ``None`` for a one-node replica (the only launch)."""

    rank: Rank | None
    launch: LaunchSpec

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank.to_dict() if self.rank else None, "argv": list(self.launch.argv)}


@dataclasses.dataclass(frozen=True)
class Units:
    """The service's unit and file names (:mod:`kimi_deploy.names`): the server unit, its EnvironmentFile, the
    nightly check's service and timer and their stem (``check_unit``, ``kimi-deploy-check@NAME``); the gateway's
    name (``gateway_name``, ``NAME-gateway``: its state directory, its Prometheus job's default also when
    ``[monitoring] gateway`` names a gateway the profile does not run); with ``[gateway]`` its unit (``gateway``)
    and its check's units, else ``None``. The one place a verb
    gets them: from a resolved :class:`Deployment`, or, for a service known only by its recorded name (an
    uninstall, a journal's recovery), from :meth:`of`."""

    server: str
    env_file: str
    check_service: str
    check_timer: str
    gateway: str | None
    gateway_check_service: str | None = None
    gateway_check_timer: str | None = None
    check_unit: str = ""
    gateway_name: str = ""
    gateway_check_unit: str | None = None

    @classmethod
    def of(cls, service: str, gateway: bool = False) -> Units:
        """The names of ``[service] name`` = ``service`` (with the gateway's when ``gateway``)."""
        name = names.gateway_service(service)
        gw = name if gateway else None
        return cls(names.server_unit(service), names.env_file(service), names.check_service(service),
                   names.check_timer(service), names.server_unit(gw) if gw else None,
                   names.check_service(gw) if gw else None, names.check_timer(gw) if gw else None,
                   names.check_unit(service), name, names.check_unit(gw) if gw else None)

    @property
    def timers(self) -> tuple[str, ...]:
        """The nightly check timers: the server's, then the gateway's."""
        return (self.check_timer, *((self.gateway_check_timer,) if self.gateway_check_timer else ()))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Deployment:
    """:func:`resolve`'s result; frozen: a verb reads it, :meth:`refine` gives a new one.

    ``launch``: the serving launch (rank 0 of the first replica; the one launch of a one-node replica);
    ``ranks``: every launch; ``base_url``: where a client on this host reaches the server
    (:attr:`Profile.base_url`); ``worker_urls``: rank 0 of each ``[fleet]`` replica; ``gateway_url``/
    ``gateway_command``: ``None`` without ``[gateway]``; ``api_key_file``: the key's path (never the key);
    ``series``: the patch series' SGLang version (``None``: the kit has none for it); ``required_patches``: ids
    in series order; ``gated``: the opt-in patches among them, id -> the flag that asks for it; ``gates``: every
    gated feature the serving command asks for, whatever the GPUs (:meth:`kimi_deploy.patching.Series.gates_asked`:
    doctor judges each against the host's compute capability); ``memory``: the
    memory plan (:class:`kimi_deploy.sizing.memory.MemoryPlan`) once :meth:`refine` gave one.
    """

    profile: Profile
    sglang_version: str
    units: Units
    base_url: str
    worker_urls: tuple[str, ...]
    gateway_url: str | None
    gateway_command: tuple[str, ...] | None
    api_key_file: str | None
    model: ModelFacts | None
    host: HostGpus
    fit: Fit
    memory: Any = None

    @property
    def name(self) -> str:
        return self.profile.service.name

    @functools.cached_property
    def ranks(self) -> tuple[RankLaunch, ...]:
        """Every rank's launch (built on first use, so a client that reads only the URL, key and name, e.g.
        ``check --profile`` of a profile installed for another release, never builds one).

        Raises:
            UnsupportedVersionError: the profile asks for a feature the version lacks. ProfileError: the launch
                would be open without a key (:func:`kimi_deploy.launch.check_exposure`).
        """
        ranks = group_ranks(self.profile)
        if ranks:
            return tuple(RankLaunch(r, build_launch(self.profile, self.sglang_version, components=self.components,
                                                    node_rank=r.rank, rank0=r.rank0)) for r in ranks)
        return (RankLaunch(None, build_launch(self.profile, self.sglang_version, components=self.components)),)

    @functools.cached_property
    def _patch_facts(self) -> tuple[str | None, tuple[str, ...], dict[str, str], tuple[patching.GateHit, ...]]:
        # read on first use: the series manifest is the one file resolve reads, and status plans without it
        return _patches(self.sglang_version, tuple(self.launch.server_args), self.host.compute_cap)

    @property
    def series(self) -> str | None:
        return self._patch_facts[0]

    @property
    def required_patches(self) -> tuple[str, ...]:
        return self._patch_facts[1]

    @property
    def gated(self) -> Mapping[str, str]:
        return self._patch_facts[2]

    @property
    def gates(self) -> tuple[patching.GateHit, ...]:
        return self._patch_facts[3]

    @property
    def served_model(self) -> str:
        """The model name clients send and ``/v1/models`` lists: ``served_model_name``, else ``model_path``
        (SGLang's ``ServerArgs`` default)."""
        return self.profile.sglang.served_model_name or self.profile.sglang.model_path

    @property
    def gateway_parsers(self) -> dict[str, str | None] | None:
        """The gateway's own parsers as its command passes them (smg's names, ``None``: not passed, smg's
        default): ``{"reasoning_parser", "tool_call_parser"}``; ``None`` without ``[gateway]``. ``validate``
        refuses names that do not match :attr:`model` (:mod:`kimi_deploy.catalog.gateway_parsers`)."""
        gw = self.profile.gateway
        return None if gw is None else {"reasoning_parser": gw.reasoning_parser, "tool_call_parser": gw.tool_call_parser}

    @property
    def launch(self) -> LaunchSpec:
        return self.ranks[0].launch

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launch.argv

    @property
    def metrics_targets(self) -> tuple[str, ...]:
        """The Prometheus scrape targets (``HOST:PORT``, IPv6 in brackets) of the server's ``/metrics``: rank 0 of
        each ``[fleet]`` replica (the only rank that serves HTTP, and the group's metrics), else where a client
        on this host reaches the server (:attr:`base_url`)."""
        return tuple(url.removeprefix("http://") for url in (self.worker_urls or (self.base_url,)))

    def worker_url(self, node: str) -> str:
        """The worker URL of the ``[fleet]`` replica whose rank 0 is ``node`` (one of :attr:`worker_urls`; one
        host however spelt, :func:`kimi_deploy.profile.host_key`).

        Raises:
            KeyError: ``node`` is not rank 0 of a replica.
        """
        for nodes, url in zip(self.profile.replicas, self.worker_urls):
            if host_key(nodes[0]) == host_key(node):
                return url
        raise KeyError(node)

    def rank_of(self, node: str) -> Rank:
        """The rank ``node`` runs in its multi-node group (one host however spelt), from the same rank table as
        :attr:`ranks` (:func:`kimi_deploy.topology.find_rank`) without building a launch: what ``preflight`` reads.

        Raises:
            UsageError: no multi-node replica, or ``node`` is none of its nodes (exit 2).
        """
        return find_rank(self.profile, node)

    def launch_of(self, rank: Rank | None) -> LaunchSpec:
        """The launch ``rank`` runs (``None``: the serving launch).

        Raises:
            KeyError: ``rank`` is not one of this deployment's ranks.
        """
        if rank is None:
            return self.launch
        for entry in self.ranks:
            if entry.rank == rank:
                return entry.launch
        raise KeyError(rank)

    def pod_launch(self, rank: int | None = None, leader: str | None = None,
                   placeholders: Mapping[str, str] | None = None) -> LaunchSpec:
        """A Kubernetes pod's launch: rank ``rank``'s rows with the runner's text for the rank numbers and rank 0's
        address (LeaderWorkerSet's ``$(LWS_WORKER_INDEX)``, ``$(LWS_GROUP_SIZE)``, ``$(LWS_LEADER_ADDRESS)``);
        ``rank`` ``None``: every row and no rank flags (the image's command before a rank is known)."""
        if rank is None and not placeholders:
            return self._unranked
        return build_launch(self.profile, self.sglang_version, components=self.components, node_rank=rank,
                            rank0=leader, placeholders=placeholders)

    @property
    def _unranked(self) -> LaunchSpec:
        return self.ranks[0].launch if self.ranks[0].rank is None else \
            build_launch(self.profile, self.sglang_version, components=self.components)

    @property
    def components(self) -> Mapping[str, str] | None:
        return self._components

    _components: Mapping[str, str] | None = None

    def require_fit(self) -> None:
        """Refuse a deployment whose model cannot fit by the model table's rule (:func:`require_fit`).

        Raises:
            RefusedError: the numbers (exit 4), and what would hold the model.
        """
        _refuse(self.fit, self.model, self.profile)

    def refine(self, plan: Any) -> Deployment:
        """This deployment with the memory plan ``plan`` (:class:`kimi_deploy.sizing.memory.MemoryPlan`): its
        verdict replaces the static one, which it never loosens (a static ``will not fit`` stays)."""
        if plan is None:
            return self
        verdict = "will not fit" if self.fit.static is False else plan.verdict
        fit = dataclasses.replace(self.fit, verdict=verdict, source="memory plan")
        return dataclasses.replace(self, memory=plan, fit=fit)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: what ``--json`` of the verbs shows as ``deployment``."""
        return {"name": self.name, "sglang_version": self.sglang_version, "served_model": self.served_model,
                "ranks": [r.to_dict() for r in self.ranks], "units": self.units.to_dict(),
                "base_url": self.base_url, "worker_urls": list(self.worker_urls), "gateway_url": self.gateway_url,
                "gateway_parsers": self.gateway_parsers,
                "api_key_file": self.api_key_file, "model": self.model.key if self.model else None,
                "host": self.host.to_dict(), "series": self.series, "required_patches": list(self.required_patches),
                "gated": dict(self.gated), "fit": self.fit.to_dict(),
                "memory": self.memory.to_dict() if self.memory is not None else None}


def _refuse(fit: Fit, model: ModelFacts | None, profile: Profile) -> None:
    if fit.static is False:
        name = model.name if model else profile.sglang.model_path
        raise RefusedError(f"{name} does not fit one replica's GPUs", value=fit.evidence,
                           hint=f"what would fit: {fit.what_fits}; deploy it on GPUs that hold it (a multi-node "
                                "[fleet], or larger GPUs) or choose a model that fits (`kimi-deploy presets`)")


def static_fit(profile: Profile, gpus: Any = None) -> Fit:
    """The model table's fit verdict of ``profile`` on ``gpus`` (as :func:`resolve`; ``None``: the reference
    host), without a launch: no SGLang version, interpreter or GPU is needed."""
    s = profile.sglang
    return _fit(profile, identify(s.model_path, s.served_model_name), _host(gpus))


def require_fit(profile: Profile, gpus: Any = None) -> Fit:
    """:func:`static_fit`, refused when the model cannot fit: the first thing every verb does with a profile, so
    Kimi K3 on 8 x 96 GB is refused by ``render``, ``validate``, ``doctor``, ``install`` and ``upgrade`` alike, with
    the same numbers, before any interpreter or GPU is asked.

    Raises:
        RefusedError: the weights against one replica's GPU memory and what would hold them (exit 4).
    """
    fit = static_fit(profile, gpus)
    s = profile.sglang
    _refuse(fit, identify(s.model_path, s.served_model_name), profile)
    return fit


def _host(gpus: Any) -> HostGpus:
    return gpus if isinstance(gpus, HostGpus) else HostGpus.reference() if gpus is None else HostGpus.of(gpus)


def _fit(profile: Profile, model: ModelFacts | None, host: HostGpus) -> Fit:
    s = profile.sglang
    gpus = s.tp_size * (s.pp_size or 1)
    if model is None:
        return Fit(None, f"{s.model_path} is not a model of the kit's table: weights and parsers not checked "
                         "(doctor's gpu.memory measures the shards)", "unknown", gpus, "unknown")
    fit = weights_fit(model, gpus, host.gpu)
    if fit.fits is None:
        return Fit(None, fit.evidence(), fit.what_fits(), gpus, "unknown")
    return Fit(fit.fits, fit.evidence(), fit.what_fits(), gpus, "fits" if fit.fits else "will not fit")


def _patches(version: str, server_args: tuple[str, ...], compute_cap: str
             ) -> tuple[str | None, tuple[str, ...], dict[str, str], tuple[patching.GateHit, ...]]:
    series = patching.find_series(version)
    if series is None:
        return None, (), {}, ()
    gated: dict[str, str] = {}
    hits = tuple(series.gates_asked(server_args))
    for hit in hits:
        if hit.applies_to(compute_cap) and hit.patch_opens(compute_cap):
            gated.setdefault(hit.patch.id, hit.flag)
    wanted = {p.id for p in series.defaults} | set(gated)
    return series.sglang_version, tuple(p.id for p in series.patch if p.id in wanted), gated, hits


def resolve(profile: Profile, sglang_version: str | None = None, *, components: Mapping[str, str] | None = None,
            gpus: Any = None, launches: bool = True) -> Deployment:
    """The :class:`Deployment` of ``profile`` for SGLang ``sglang_version`` (default
    :data:`kimi_deploy.versions.DEFAULT_SGLANG_VERSION`) with the probed ``components`` (``flashinfer``, ``torch``,
    ``cuda``: the compile-cache key) on ``gpus`` (:class:`HostGpus`, or anything :meth:`HostGpus.of` reads;
    ``None``: the reference host). Pure; the same inputs give an equal result. ``launches`` False: the launches
    are built when first read (a client that needs only the URL, key and name: ``check``, ``bench``).

    Raises:
        UsageError: not a known 0.5.x version. UnsupportedVersionError: the profile asks for a feature the
            version lacks. ProfileError: the launch would be open without a key (:func:`kimi_deploy.launch.
            check_exposure`).
    """
    version = str(versions.parse_version(versions.DEFAULT_SGLANG_VERSION if sglang_version is None
                                         else sglang_version))
    host = _host(gpus)
    service = profile.service.name
    units = Units.of(service, gateway=profile.gateway is not None)
    s = profile.sglang
    model = identify(s.model_path, s.served_model_name)
    deployment = Deployment(
        profile=profile, sglang_version=version, units=units, base_url=profile.base_url,
        worker_urls=profile.worker_urls(), gateway_url=profile.gateway_url if profile.gateway else None,
        gateway_command=tuple(gateway_argv(profile)) if profile.gateway else None, api_key_file=s.api_key_file,
        model=model, host=host, fit=_fit(profile, model, host), _components=dict(components) if components else None)
    if launches:
        deployment.ranks  # noqa: B018 - built now: a profile the version cannot launch fails here, as before
    return deployment


def resolve_file(path: str | Path, sglang_version: str | None = None, *, launches: bool = True) -> Deployment:
    """:func:`resolve` of the profile file at ``path`` (:func:`kimi_deploy.profile.load_profile`).

    Raises:
        ProfileError: the file is missing or invalid. The rest as :func:`resolve`.
    """
    return resolve(load_profile(Path(path)), sglang_version, launches=launches)
