"""The one table of SGLang options: profile key, SGLang spelling per release, where it applies, source.

Each :class:`Option` row of :data:`OPTIONS` drives every place an SGLang option shows up:

- the ``[sglang]`` profile model (:mod:`kimi_deploy.profile`: field type, default, bounds, help);
- the launch builder (:func:`kimi_deploy.launch.build_launch` emits the rows in table order);
- the version rules (:data:`kimi_deploy.versions.RULES` are the rows' :class:`Spelling` entries);
- ``init``'s commented profile (``templates/profile.toml.j2`` loops over the rows);
- the option table of docs/reference/profile.md (:func:`markdown_table`; a test keeps the page equal to it);
- the flags ``extra_args`` may not set (:func:`owned_flags`) and the variables ``[environment]`` may not
  set (:func:`owned_env` and :data:`CACHE_ENV`, which also drives the launch's cache variables);
- what ``status`` redacts and ignores in SGLang's merged command (:func:`secret_flags`, :func:`merged_flags`);
- the flags of the patch series' ``[[patch.needed_by]]`` gates, which name rows
  (:class:`kimi_deploy.patching.FeatureGate`);
- which rank of a multi-node group carries a row (:class:`Scope`, :meth:`Option.on_rank`).

Adding an option is one row here plus a value in ``tests/test_options_table.py``'s ``VALUES``; then
``KIMI_DEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/test_options_table.py`` (or ``scripts/gen-reference``) rewrites
docs/reference/profile.md's copy of the table. A row left at its default changes no rendered file (the profile digest leaves it out:
:data:`kimi_deploy.profile.DIGEST_SGLANG_KEYS`). Flag names, aliases and defaults are SGLang 0.5.23's
(``sglang/srt/server_args.py``, ``ServerArgs`` and ``add_cli_args``); release boundaries are from SGLang's
release notes (``sgl-project/sglang`` releases on GitHub).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal

from kimi_deploy.values import MAX_ITEMS, AbsPath, ArgValue, Host, Token


class Scope(enum.StrEnum):
    """Where a row takes effect once a deployment has more than one process or host (its value is the
    text docs/reference/profile.md's option table shows).

    - ``EVERY_RANK`` ("every rank"): every SGLang process of a replica; each node of a multi-node group
      renders it identically (model, parallelism, kernels, caches).
    - ``SERVING_RANK`` ("serving rank only"): only the rank that serves HTTP (node rank 0): host/port,
      the parsers, the served name, the API key and the kit's exposure rule about them. Ranks >= 1
      run no API server, so they leave these out.
    - ``ROUTER`` ("router"): the gateway in front of the replicas (SGLang's ``smg``), not an SGLang rank.
    - ``KUBERNETES`` ("kubernetes container"): the Kubernetes container spec (resources, volumes,
      probes), not SGLang's command line.

    Read with :meth:`Option.on_rank` for a rank's command; ``ROUTER``/``KUBERNETES`` rows are never
    part of an SGLang rank's command.
    """

    EVERY_RANK = "every rank"
    SERVING_RANK = "serving rank only"
    ROUTER = "router"
    KUBERNETES = "kubernetes container"


#: The handler in :data:`kimi_deploy.launch.EMITTERS` that turns a row's value into argv/env (the spelling
#: is always the target release's, :func:`kimi_deploy.versions.spelling`):
#: ``value``: ``FLAG VALUE`` when set (a value with its own first release, ``EAGLE3``, is checked);
#: ``switch``: ``FLAG`` when true; ``env-switch``: ``VAR=1`` when true;
#: ``env-bool-until-implicit``: ``VAR=1``/``VAR=0`` when set, while the release spells it an env var; from the
#: release where it is implicit, ``true`` emits nothing and ``false`` is refused;
#: ``value-or-legacy-switch``: ``FLAG VALUE`` where the release has the valued flag, before that the older
#: switch for the value ``auto`` only;
#: ``secrets-config``: ``--config /run/<name>/sglang-secrets.yaml`` (the key reaches SGLang in a YAML file);
#: ``none``: not an SGLang argument (a kit rule, or ``extra_args`` appended after the table).
Emit = Literal["value", "switch", "env-switch", "env-bool-until-implicit", "value-or-legacy-switch",
               "secrets-config", "none"]

#: Source of the flag names and aliases below.
SERVER_ARGS = "sglang 0.5.23 srt/server_args.py"


@dataclasses.dataclass(frozen=True)
class Spelling:
    """How releases ``since <= v < until`` spell an option: a ``flag``, an ``env`` variable, or ``implicit``.

    ``value``: the spelling applies to that value of the option only (e.g. ``EAGLE3`` of
    ``speculative_algorithm``, which older releases lack). ``source`` cites the fact.
    """

    kind: Literal["flag", "env", "implicit"]
    name: str
    since: str = "0.5.0"
    until: str | None = None
    source: str = SERVER_ARGS
    value: str | None = None


@dataclasses.dataclass(frozen=True)
class Option:
    """One row: an ``[sglang]`` profile key and everything the kit knows about it.

    ``annotation``/``default``/``bounds``: the profile field (pydantic type, default, ``ge``/``le``/``gt``/
    ``lt``); ``...`` as default means required, a type (``list``) a fresh empty one. ``aliases``: other
    flags SGLang's argparse accepts for the same setting (the kit owns them too). ``owns``: more flags
    the row owns (``api_key_file`` owns ``--api-key``). ``requires``: emitted only when that other key
    is set. ``scope``: where it takes effect (:class:`Scope`). ``secret``: the row carries a secret, so its
    owned flags' values are redacted wherever the kit shows a command, and its flags are the ones SGLang's
    merged ``launch_command`` differs in by design. ``owns_env``: environment variables the row owns that
    SGLang does not take from the kit (``[environment]`` may not set them). ``comment``/``example``: the lines
    ``init`` writes above the key and the value it shows when the preset leaves the key out.
    ``set_from``: rows of :data:`FLEET_OPTIONS` only, where the kit takes the value from (a ``[fleet]`` key,
    not an ``[sglang]`` one).
    """

    key: str
    annotation: Any
    default: Any
    help: str
    emit: Emit
    scope: Scope
    spellings: tuple[Spelling, ...] = ()
    aliases: tuple[str, ...] = ()
    owns: tuple[str, ...] = ()
    bounds: dict[str, Any] = dataclasses.field(default_factory=dict)
    requires: str | None = None
    secret: bool = False
    owns_env: tuple[str, ...] = ()
    comment: tuple[str, ...] = ()
    example: Any = None
    set_from: str | None = None

    def on_rank(self, rank: int) -> bool:
        """Whether the command of SGLang node rank ``rank`` (0-based; 0 serves HTTP) carries this row."""
        return self.scope is Scope.EVERY_RANK or (self.scope is Scope.SERVING_RANK and rank == 0)

    @property
    def flags(self) -> tuple[str, ...]:
        """Every flag of the row in any release, aliases and owned flags included, in table order."""
        names = [s.name for s in self.spellings if s.kind == "flag"]
        return tuple(dict.fromkeys([*names, *self.aliases, *self.owns]))

    @property
    def env_names(self) -> tuple[str, ...]:
        """Every environment variable the row sets in any release, and those it owns (:attr:`owns_env`)."""
        return tuple(dict.fromkeys([*(s.name for s in self.spellings if s.kind == "env"), *self.owns_env]))


def _flag(name: str, **kw: Any) -> tuple[Spelling, ...]:
    return (Spelling("flag", name, **kw),)


_SPEC = "sglang 0.5.23 srt/arg_groups/speculative_hook.py"
_MODEL_FIELDS = "sglang 0.5.23 srt/arg_groups/fields/model.py"

OPTIONS: tuple[Option, ...] = (
    Option("model_path", AbsPath, ..., "--model-path: local directory of the weights", "value", Scope.EVERY_RANK,
           _flag("--model-path"), aliases=("--model",)),
    Option("served_model_name", ArgValue | None, None, "--served-model-name", "value", Scope.SERVING_RANK,
           _flag("--served-model-name"), example="moonshotai/Kimi-K2.5"),
    Option("trust_remote_code", bool, False, "--trust-remote-code", "switch", Scope.EVERY_RANK,
           _flag("--trust-remote-code")),
    Option("host", Host, "127.0.0.1", "--host (SGLang's default is 127.0.0.1)", "value", Scope.SERVING_RANK,
           _flag("--host"),
           comment=("SGLang's default host is 127.0.0.1; a non-loopback host needs api_key_file "
                    "(or allow_unauthenticated = true).",)),
    Option("port", int, 30000, "--port", "value", Scope.SERVING_RANK, _flag("--port"), bounds={"ge": 1, "le": 65535}),
    Option("tp_size", int, 1, "--tp-size", "value", Scope.EVERY_RANK, _flag("--tp-size"),
           aliases=("--tensor-parallel-size",), bounds={"ge": 1}),
    Option("pp_size", int | None, None, "--pp-size: pipeline stages (SGLang's default is 1)", "value", Scope.EVERY_RANK,
           _flag("--pp-size"), aliases=("--pipeline-parallel-size",), bounds={"ge": 1}, example=1,
           comment=("Pipeline stages. Across nodes over PCIe/Ethernet, pipeline parallelism sends traffic only at",
                    "stage boundaries ([fleet]: tp_size * pp_size = gpu_count * nodes per replica).")),
    Option("context_length", int | None, None, "--context-length", "value", Scope.EVERY_RANK,
           _flag("--context-length"), bounds={"ge": 1}, example=262144,
           comment=("Memory settings (context_length to chunked_prefill_size): the presets' values hold the weights",
                    "and two max-length requests on 8 x RTX PRO 6000 as written (the arithmetic:",
                    "docs/runbook.md#size-the-memory); `kimi-deploy validate` prints the memory plan.")),
    Option("mem_fraction_static", float | None, None, "--mem-fraction-static", "value", Scope.EVERY_RANK,
           _flag("--mem-fraction-static"), bounds={"gt": 0, "lt": 1}, example=0.85,
           comment=("Share of GPU memory for weights + KV cache; the rest is for activations and CUDA graphs.",)),
    Option("max_running_requests", int | None, None, "--max-running-requests", "value", Scope.EVERY_RANK,
           _flag("--max-running-requests"), bounds={"ge": 1}, example=48,
           comment=("With an EAGLE-3 draft and no max_running_requests, SGLang picks 48.",)),
    Option("chunked_prefill_size", int | None, None, "--chunked-prefill-size", "value", Scope.EVERY_RANK,
           _flag("--chunked-prefill-size"), example=8192),
    Option("max_prefill_tokens", int | None, None,
           "--max-prefill-tokens: tokens in one prefill batch (SGLang's default is 16384)", "value", Scope.EVERY_RANK,
           _flag("--max-prefill-tokens", source="sglang 0.5.23 srt/arg_groups/fields/schedule.py (default 16384)"),
           bounds={"ge": 1}, example=16384),
    Option("attention_backend", ArgValue | None, None, "--attention-backend", "value", Scope.EVERY_RANK,
           _flag("--attention-backend"), example="flashinfer"),
    Option("tool_call_parser", ArgValue | None, None, "--tool-call-parser (kimi_k2 for Kimi)", "value",
           Scope.SERVING_RANK, _flag("--tool-call-parser", source="sglang <=0.5.0 (kimi_k2)"), example="kimi_k2",
           comment=("Without both parsers, tool calls come back as raw <|tool_call_begin|> text in content.",)),
    Option("reasoning_parser", ArgValue | None, None, "--reasoning-parser (kimi_k2 for Kimi)", "value",
           Scope.SERVING_RANK, _flag("--reasoning-parser", source="sglang <=0.5.0 (kimi_k2)"), example="kimi_k2"),
    Option("speculative_algorithm", Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None, None,
           "--speculative-algorithm", "value", Scope.EVERY_RANK,
           (Spelling("flag", "--speculative-algorithm"),
            Spelling("flag", "--speculative-algorithm", since="0.5.10", value="EAGLE3",
                     source="sglang 0.5.10 added EAGLE3 for Kimi K2.5 (draft models lightseekorg/kimi-k2.5-eagle3*)")),
           example="EAGLE3",
           comment=("EAGLE-3 speculative decoding: steps, topk and draft tokens are set together; "
                    "topk 1 means draft tokens = steps + 1.",)),
    Option("speculative_draft_model_path", AbsPath | None, None, "--speculative-draft-model-path", "value",
           Scope.EVERY_RANK, _flag("--speculative-draft-model-path"), aliases=("--speculative-draft-model",),
           requires="speculative_algorithm", example="/models/lightseekorg/kimi-k2.5-eagle3-mla"),
    Option("speculative_num_steps", int | None, None, "--speculative-num-steps", "value", Scope.EVERY_RANK,
           _flag("--speculative-num-steps", source=_SPEC), bounds={"ge": 1}, requires="speculative_algorithm",
           example=3),
    Option("speculative_eagle_topk", int | None, None, "--speculative-eagle-topk", "value", Scope.EVERY_RANK,
           _flag("--speculative-eagle-topk", source=_SPEC), bounds={"ge": 1}, requires="speculative_algorithm",
           example=1),
    Option("speculative_num_draft_tokens", int | None, None, "--speculative-num-draft-tokens", "value",
           Scope.EVERY_RANK, _flag("--speculative-num-draft-tokens", source=_SPEC), bounds={"ge": 1},
           requires="speculative_algorithm", example=4),
    Option("enable_spec_v2", bool | None, None,
           "spec v2 (overlap scheduling with EAGLE): env SGLANG_ENABLE_SPEC_V2 in 0.5.5-0.5.13, always on from 0.5.14",
           "env-bool-until-implicit", Scope.EVERY_RANK,
           (Spelling("env", "SGLANG_ENABLE_SPEC_V2", since="0.5.5", until="0.5.14",
                     source="sglang 0.5.5 added the env (off), 0.5.11 made it default on, 0.5.14 removed it: "
                            "EAGLE/EAGLE3 always use the v2 worker, overlap unless --disable-overlap-schedule"),
            Spelling("implicit", "", since="0.5.14",
                     source="sglang 0.5.14: no switch, v2 worker always; the env is ignored silently from 0.5.21")),
           example=True,
           comment=("Spec v2 (overlap scheduling): env SGLANG_ENABLE_SPEC_V2 for SGLang 0.5.5-0.5.13, "
                    "always on from 0.5.14.",)),
    Option("disable_overlap_schedule", bool, False, "--disable-overlap-schedule", "switch", Scope.EVERY_RANK,
           _flag("--disable-overlap-schedule")),
    Option("flashinfer_allreduce_fusion_backend", Literal["auto", "trtllm", "mnnvl", "cutedsl"] | None, None,
           "--flashinfer-allreduce-fusion-backend (0.5.14+; --enable-flashinfer-allreduce-fusion before)",
           "value-or-legacy-switch", Scope.EVERY_RANK,
           (Spelling("flag", "--enable-flashinfer-allreduce-fusion", until="0.5.14",
                     source="sglang <0.5.14; still parses in 0.5.23 as a deprecated alias of "
                            "--flashinfer-allreduce-fusion-backend auto"),
            Spelling("flag", "--flashinfer-allreduce-fusion-backend", since="0.5.14",
                     source="sglang 0.5.14 added the backend choice {auto,trtllm,mnnvl,cutedsl}")),
           example="auto",
           comment=('FlashInfer all-reduce fusion: "auto", "trtllm", "mnnvl", "cutedsl" (0.5.14+; before: auto only).',
                    "On SM120 it needs the sm120-flashinfer-allreduce-fusion patch; measure it at your TP.",
                    "It takes every all-reduce up to 2048 tokens before PCIe IPC: never set both.")),
    Option("enforce_disable_flashinfer_allreduce_fusion", bool, False,
           "--enforce-disable-flashinfer-allreduce-fusion (0.5.10+)", "switch", Scope.EVERY_RANK,
           _flag("--enforce-disable-flashinfer-allreduce-fusion", since="0.5.10", source="sglang 0.5.10")),
    Option("enable_symm_mem", bool, False, "--enable-symm-mem (NCCL symmetric memory)", "switch", Scope.EVERY_RANK,
           _flag("--enable-symm-mem", source="sglang <=0.5.1 (forces NCCL_CUMEM_ENABLE=1, NCCL_NVLS_ENABLE=1)")),
    Option("enable_torch_symm_mem", bool, False, "--enable-torch-symm-mem (0.5.3+)", "switch", Scope.EVERY_RANK,
           _flag("--enable-torch-symm-mem", since="0.5.3", source="sglang 0.5.3")),
    Option("enable_pcie_ipc_allreduce", bool, False,
           "env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (0.5.21+, world size 2/4/8)", "env-switch", Scope.EVERY_RANK,
           (Spelling("env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", since="0.5.21",
                     source="sglang 0.5.21: custom all-reduce over PCIe IPC for world sizes 2/4/8"),),
           comment=("Custom all-reduce over PCIe IPC for 8x SM120 without NVLink (SGLang 0.5.21+): decode sizes,",
                    "NCCL for the rest, no patch (preset kimi-k25-rtx-pro-6000-x8-pcie-ipc). Writes peer GPU",
                    "memory directly: run `kimi-deploy doctor` for the fabric checks first.")),
    # Weight loading (issue #42). SGLang 0.5.23 loads safetensors with 8 threads by default
    # (DefaultModelLoader.DEFAULT_NUM_THREADS; enable_multithread_load defaults on in _get_weights_iterator,
    # srt/model_loader/loader.py). None of these is a preset default: unmeasured on the reference host.
    Option("load_format", Literal["auto", "safetensors", "fastsafetensors", "instanttensor"] | None, None,
           "--load-format: how weights are read (SGLang's default is auto)", "value", Scope.EVERY_RANK,
           _flag("--load-format", source=_MODEL_FIELDS), example="auto",
           comment=("How SGLang reads the weights. fastsafetensors and instanttensor need their package in SGLang's",
                    "environment (not a dependency of SGLang 0.5.23) and are unmeasured for INT4 compressed-tensors",
                    "here: measure the weights phase (`kimi-deploy status`) before keeping one.")),
    Option("weight_loader_prefetch_checkpoints", bool, False,
           "--weight-loader-prefetch-checkpoints: each rank prefetches a share of the shards (network storage)",
           "switch", Scope.EVERY_RANK, _flag("--weight-loader-prefetch-checkpoints", source=_MODEL_FIELDS),
           comment=("SGLang's own page-cache prefetch, made for network file systems; it turns the multi-threaded",
                    "loader off unless the loader's extra config asks for it. [startup] prefetch is the kit's.")),
    Option("weight_loader_prefetch_num_threads", int | None, None,
           "--weight-loader-prefetch-num-threads: threads per rank of that prefetch (SGLang's default is 4)",
           "value", Scope.EVERY_RANK, _flag("--weight-loader-prefetch-num-threads", source=_MODEL_FIELDS),
           bounds={"ge": 1, "le": 256}, example=4),
    Option("startup_weight_load_mode", Literal["serial", "overlap"] | None, None,
           "--startup-weight-load-mode: overlap stages the weights while CUDA graphs are captured", "value",
           Scope.EVERY_RANK, _flag("--startup-weight-load-mode", source=_MODEL_FIELDS), example="serial"),
    Option("enable_metrics", bool, False, "--enable-metrics: Prometheus /metrics on the server port", "switch",
           Scope.EVERY_RANK, _flag("--enable-metrics"),
           comment=("Prometheus metrics (sglang:*) at /metrics on the server port; no API key is needed to read "
                    "them, so bind host/port to a trusted network ([monitoring] and docs/runbook.md#monitoring).",)),
    Option("api_key_file", AbsPath | None, None, "file holding the API key (--api-key, via a credential)",
           "secrets-config", Scope.SERVING_RANK,
           _flag("--config", source="sglang server_args.py: YAML file of options merged before the command line"),
           owns=("--api-key", "--admin-api-key"), secret=True, owns_env=("SGLANG_API_KEY",),
           example="/etc/kimi-deploy/{name}.api-key",
           comment=("The API key file (root-owned, 0600). It reaches SGLang through a systemd credential, "
                    "never argv or env.",)),
    Option("allow_unauthenticated", bool, False, "allow a non-loopback host without an API key", "none",
           Scope.SERVING_RANK),
    Option("extra_args", list[Token], list, "more SGLang arguments, verbatim", "none", Scope.EVERY_RANK,
           bounds={"max_length": MAX_ITEMS}, example=["--log-requests"],
           comment=("More SGLang arguments, verbatim (no shell quoting possible; validated by "
                    "`kimi-deploy validate`).",)),
)

#: SGLang options the kit sets from ``[fleet]`` (multi-node groups), never from ``[sglang]``: they are not
#: fields of the ``[sglang]`` model, the launch builder of the ranks emits them (``emit`` is ``none``: no [sglang] handler), and
#: ``extra_args`` may not set them. All four apply on every rank of a group (SGLang 0.5.23 server_args.py:
#: ``nnodes`` default 1, ``node_rank`` 0, ``dist_init_addr`` none, ``dist_timeout`` none = torch's default).
FLEET_OPTIONS: tuple[Option, ...] = (
    Option("nnodes", int, 1, "--nnodes: nodes of the replica's group", "none", Scope.EVERY_RANK,
           _flag("--nnodes"), bounds={"ge": 1}, set_from="[fleet] replicas: len(nodes)"),
    Option("node_rank", int, 0, "--node-rank: this node's rank in its group", "none", Scope.EVERY_RANK,
           _flag("--node-rank"), bounds={"ge": 0}, set_from="[fleet] replicas: the node's index in nodes"),
    Option("dist_init_addr", str | None, None, "--dist-init-addr: rank 0's rendezvous HOST:PORT", "none",
           Scope.EVERY_RANK, _flag("--dist-init-addr"), aliases=("--nccl-init-addr",),
           set_from="[fleet] replicas: nodes[0], and dist_init_port"),
    Option("dist_timeout", int | None, None, "--dist-timeout: seconds to wait for the group", "none",
           Scope.EVERY_RANK, _flag("--dist-timeout"), bounds={"ge": 1}, set_from="[fleet] dist_timeout"),
)

#: Every row: the ``[sglang]`` rows, then the rows the kit sets from ``[fleet]``.
ALL_OPTIONS: tuple[Option, ...] = OPTIONS + FLEET_OPTIONS

#: Rows by key (``[sglang]`` key, or the SGLang dest name of a :data:`FLEET_OPTIONS` row).
BY_KEY: dict[str, Option] = {o.key: o for o in ALL_OPTIONS}


@dataclasses.dataclass(frozen=True)
class Tunable:
    """A row ``kimi-deploy tune`` may vary (:mod:`kimi_deploy.tune.space`): the ``[sglang]`` ``key`` of an
    :data:`OPTIONS` row, the ``values`` it tries, and the SGLang releases ``since <= v < until`` they apply to.

    ``needs``: another ``[sglang]`` key that must be set for the row to be tuned (the EAGLE-3 steps need
    ``speculative_algorithm``). ``why``: what the values trade on 8 x RTX PRO 6000 over PCIe, one sentence with
    its source. The order of :data:`TUNABLES` is the order the search visits them: the largest expected effect per
    restart first (a switch costs one restart; the all-reduce path is the first thing to measure over PCIe).
    """

    key: str
    values: tuple[Any, ...]
    why: str
    since: str = "0.5.0"
    until: str | None = None
    needs: str | None = None


#: What ``tune`` varies, in visiting order. Values bracket the presets' (docs/runbook.md#tune-a-host); a value
#: the profile already has is the baseline, and the others are the candidates.
TUNABLES: tuple[Tunable, ...] = (
    Tunable("enable_pcie_ipc_allreduce", (False, True),
            "the all-reduce path for decode sizes on SM120 without NVLink: NCCL or PCIe IPC (sglang 0.5.21)",
            since="0.5.21"),
    Tunable("max_running_requests", (16, 32, 48, 64),
            "decode batch cap: more requests share each step (throughput) and each step is slower (ITL); "
            "SGLang 0.5.23 picks 48 with an EAGLE-3 draft (srt/arg_groups/memory_hook.py)"),
    Tunable("speculative_num_steps", (2, 3, 4),
            "EAGLE-3 draft depth (draft tokens = steps + 1 at topk 1): longer drafts win only while the acceptance "
            "holds (sglang 0.5.23 srt/arg_groups/speculative_hook.py)", needs="speculative_algorithm"),
    Tunable("chunked_prefill_size", (4096, 8192, 16384),
            "prefill chunk: larger chunks cut TTFT of long prompts and stall running decodes longer (ITL)"),
    Tunable("mem_fraction_static", (0.8, 0.85, 0.88, 0.9),
            "weights + KV cache share of GPU memory against what activations and CUDA graphs keep; the memory "
            "plan prunes what cannot fit (kimi_deploy/sizing/memory.py)"),
)

def owned_flags() -> dict[str, str]:
    """Every SGLang flag the kit sets itself -> the profile key to use instead (``extra_args`` refuses them).

    ``[sglang]`` rows map to their key; :data:`FLEET_OPTIONS` rows to their ``set_from`` text.
    """
    return {flag: o.set_from or o.key for o in ALL_OPTIONS for flag in o.flags}


def owned_env() -> dict[str, str]:
    """Every SGLang environment variable a row sets or owns -> its ``[sglang]`` key."""
    return {name: o.key for o in OPTIONS for name in o.env_names}


def secret_flags() -> tuple[str, ...]:
    """Flags whose value is a secret (the owned flags of ``secret`` rows: ``--api-key``, ``--admin-api-key``)."""
    return tuple(flag for o in OPTIONS if o.secret for flag in o.owns)


def merged_flags() -> tuple[str, ...]:
    """Flags in which SGLang's merged ``launch_command`` differs from the unit's argv by design: every flag of
    a ``secret`` row (``--config`` is merged away, the key flags appear). SGLang 0.5.23 ``prepare_server_args``."""
    return tuple(flag for o in OPTIONS if o.secret for flag in o.flags)


@dataclasses.dataclass(frozen=True)
class CacheVar:
    """An environment variable the kit points into the versioned compile cache (``[service] cache_dir``).

    ``name``: the variable; ``subdir``: its folder under ``<cache_dir>/<stack key>`` (``""``: that folder
    itself); ``reader``: who reads it (the source). Every rank compiles, so every rank gets all of them
    (:attr:`Scope.EVERY_RANK`).
    """

    name: str
    subdir: str
    reader: str
    scope: Scope = Scope.EVERY_RANK


#: The cache variables in EnvironmentFile order; ``[environment]`` may not set them (``profile.RESERVED_ENV``).
CACHE_ENV: tuple[CacheVar, ...] = (
    CacheVar("SGLANG_CACHE_DIR", "", "sglang 0.5.23 srt/environ.py"),
    CacheVar("SGLANG_JIT_CACHE_DIR", "sglang-jit", "sglang 0.5.23 jit_kernel (Marlin MoE kernels)"),
    CacheVar("SGLANG_DG_CACHE_DIR", "deep-gemm", "sglang 0.5.23 DeepGEMM wrapper"),
    CacheVar("TRITON_CACHE_DIR", "triton", "triton"),
    CacheVar("TORCHINDUCTOR_CACHE_DIR", "torchinductor", "torch inductor"),
    CacheVar("CUDA_CACHE_PATH", "cuda", "CUDA driver JIT cache"),
    CacheVar("TILELANG_CACHE_DIR", "tilelang", "tilelang"),
    CacheVar("FLASHINFER_WORKSPACE_BASE", "flashinfer", "flashinfer"),
)


def cache_env(cache_dir: str) -> list[tuple[str, str]]:
    """``(name, path)`` of every :data:`CACHE_ENV` variable under ``cache_dir`` (the stack-keyed folder)."""
    return [(v.name, f"{cache_dir}/{v.subdir}" if v.subdir else cache_dir) for v in CACHE_ENV]


def init_example(option: Option, name: str) -> Any:
    """The value ``init`` shows, commented, for a key the preset leaves out (``{name}``: the service name)."""
    if option.example is not None:
        return option.example.format(name=name) if isinstance(option.example, str) else option.example
    return option.default() if isinstance(option.default, type) else option.default


def _releases(s: Spelling) -> str:
    if s.until and s.since != "0.5.0":
        return f"{s.since} to <{s.until}"
    if s.until:
        return f"<{s.until}"
    return f"{s.since}+" if s.since != "0.5.0" else "all"


def _spelled(s: Spelling) -> str:
    if s.kind == "implicit":
        return "implicit"
    text = f"env `{s.name}`" if s.kind == "env" else f"`{s.name}`"
    return f"{text} (value {s.value})" if s.value else text


def markdown_table() -> str:
    """docs/reference/profile.md's option table (GitHub markdown, one line per row, ending in a newline)."""
    lines = ["| profile key (`[sglang]`) | SGLang spelling: releases | applies on | source |",
             "|---|---|---|---|"]
    for o in ALL_OPTIONS:
        spelled = "; ".join(f"{_spelled(s)}: {_releases(s)}" for s in o.spellings) or "none (kit rule)"
        if o.aliases:
            spelled += f" (alias {', '.join(f'`{a}`' for a in o.aliases)})"
        if o.owns:
            spelled += f"; owns {', '.join(f'`{a}`' for a in o.owns)}"
        sources = "; ".join(dict.fromkeys(s.source for s in o.spellings)) or "kimi-deploy"
        key = f"set from {o.set_from}" if o.set_from else f"`{o.key}`"
        lines.append(f"| {key} | {spelled} | {o.scope.value} | {sources} |")
    return "\n".join(lines) + "\n"
