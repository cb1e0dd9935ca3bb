"""The effective configuration: what SGLang itself resolves from the rendered command on this host's GPUs.

SGLang 0.5.23 resolves a server's settings in ``ServerArgs.resolve_once`` (``sglang/srt/server_args.py``;
``__post_init__`` is empty in this release): ``run_resolution_pipeline`` (``srt/arg_groups/pipeline.py``) runs
about a hundred handlers that read the model's ``config.json`` and the GPUs (memory through ``nvidia-smi``,
capability through ``torch.cuda``) and record each decision as a *declaration* on the record
(``declare_resolution(server_args, source, **fields)`` in ``srt/arg_groups/overrides.py``, appended to
``server_args._resolved_overrides``; model overrides are appended by ``srt/arg_groups/model_hook.py``). The
resolved value of a field is the last declaration, else the input (``resolution_result``).

:data:`RESOLVE_SCRIPT` runs that pipeline, unchanged, in SGLang's interpreter (kimi-deploy never imports
SGLang) with the host's GPU facts injected and records where each declaration was made:

- GPU facts (a :class:`kimi_deploy.sizing.memory.GpuFacts`: live ``nvidia-smi`` on the GPU host, a recorded
  query elsewhere) are injected, not re-computed: a stand-in ``nvidia-smi`` on ``PATH`` answers SGLang's own
  ``get_nvgpu_memory_capacity`` query (``srt/utils/common.py``) with the recorded memory, and ``torch.cuda``'s
  ``is_available``/``device_count``/``get_device_capability``/``get_device_name``/``get_device_properties``/
  ``mem_get_info`` (plus ``torch.version.cuda``) answer with the recorded GPU before SGLang is imported, so
  SGLang's own probes (``is_sm120_supported``, ``get_device_sm``, ...) derive the platform from them;
- the model and draft paths are replaced by local directories holding their ``config.json`` (the real ones on
  the serving host; the recorded ones in ``tests/data/models`` elsewhere);
- every step of the pipeline is wrapped through SGLang's own plugin point (``register_resolution_hook`` in
  ``srt/arg_groups/resolution_hooks.py``): the first wrapper swaps the declaration list for one that records
  the ``file:line`` that appended each declaration (the first frame outside the declaration plumbing; for a
  post-process pass, the ``return`` line of the pass, seen through ``sys.setprofile``); a step that raises
  even with the injected facts (it needs a real GPU, a kernel package or the weights) is recorded with its
  error and the pipeline goes on, so the values it would have set are reported as *not resolvable here*.

Only fields whose resolved value differs from the input are reported (a flag the profile sets that SGLang
changes, or a field the profile leaves unset that SGLang decides).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kimi_deploy import engine as target
from kimi_deploy.sizing.memory import GpuFacts

#: Runs in SGLang's interpreter. argv[1]: JSON {"args": [...], "gpus": GpuFacts.to_dict(), "paths": {flag: dir}}.
RESOLVE_SCRIPT = r"""
import argparse, contextlib, io, json, logging, os, re, stat, sys, tempfile, types
req = json.loads(sys.argv[1])
out = {"values": [], "failed_steps": [], "errors": [], "notes": [], "resolved": {}, "sources": {}}
ansi = re.compile(r"\x1b\[[0-9;]*m")
def clean(text):
    return ansi.sub("", str(text)).strip()
def finish():
    print(json.dumps(out, default=repr)); sys.exit(0)
gpus = req["gpus"]
tmp = tempfile.mkdtemp(prefix="kimi-deploy-effective-")
smi = os.path.join(tmp, "nvidia-smi")
with open(smi, "w") as fh:
    fh.write("#!/bin/sh\ncase \"$*\" in *memory.total*) ;; *) exit 9 ;; esac\n")
    fh.write("".join("echo %d\n" % gpus["memory_mib"] for _ in range(gpus["count"])))
os.chmod(smi, stat.S_IRWXU)
os.environ["PATH"] = tmp + os.pathsep + os.environ.get("PATH", "")
major, minor = (int(x) for x in gpus["compute_cap"].split("."))
try:
    import torch
except BaseException as exc:
    out["errors"].append("cannot import torch in SGLang's interpreter: " + clean(repr(exc))); finish()
total = gpus["memory_mib"] << 20
props = types.SimpleNamespace(name=gpus["name"], total_memory=total, major=major, minor=minor,
                              multi_processor_count=0, is_integrated=False, uuid="injected")
import importlib.abc, importlib.machinery, importlib.util
stubbed = []
class StubError(RuntimeError):
    pass
class StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StubMeta(name, (Stub,), {"_where": cls._where + "." + name})
    def __call__(cls, *a, **k):
        raise StubError(cls._where + " is GPU code (its package is not installed here)")
class Stub(metaclass=StubMeta):
    _where = "?"
class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StubMeta(name, (Stub,), {"_where": self.__name__ + "." + name})
class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = set(req.get("stub_packages", []))
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            except Exception:
                spec = None
            if spec is not None:
                return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        if spec.name.split(".")[0] not in stubbed:
            stubbed.append(spec.name.split(".")[0])
        return module
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, StubFinder())
cuda = torch.cuda
cuda.is_available = lambda: True
cuda.device_count = lambda: gpus["count"]
cuda.current_device = lambda: 0
cuda.get_device_capability = lambda device=None: (major, minor)
cuda.get_device_name = lambda device=None: gpus["name"]
cuda.get_device_properties = lambda device=None: props
cuda.mem_get_info = lambda device=None: (total, total)
if not torch.version.cuda:
    torch.version.cuda = "12.9"
try:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.arg_groups import overrides as ov, model_override_base as mob
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.resolution_hooks import _OVERRIDABLE_HOOKS, register_resolution_hook
except BaseException as exc:
    out["errors"].append("cannot import SGLang's resolution code: " + clean(repr(exc))); finish()
root = os.path.dirname(os.path.dirname(os.path.abspath(ov.__file__)))  # .../sglang/srt
pkg_parent = os.path.dirname(os.path.dirname(root))
def where(filename, line):
    return os.path.relpath(filename, pkg_parent) + ":" + str(line)
plumbing = {os.path.abspath(ov.__file__), os.path.abspath(mob.__file__)}
last_return = {}
arg_dir = os.path.dirname(os.path.abspath(ov.__file__))
def profiler(frame, event, arg):
    if event == "return" and isinstance(arg, dict) and arg and frame.f_code.co_filename.startswith(arg_dir):
        last_return[frame.f_code] = frame.f_lineno
records = []
def locate(frame):
    while frame is not None:
        code = frame.f_code
        if code.co_name == "run_post_process_pass" and os.path.abspath(code.co_filename) in plumbing:
            fn = frame.f_locals.get("fn")
            c = getattr(fn, "__code__", None)
            if c is not None:
                return where(c.co_filename, last_return.get(c, c.co_firstlineno))
        if os.path.abspath(code.co_filename) not in plumbing:
            return where(code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return "?"
providers = {}
for fns in list(mob._MODEL_OVERRIDE_FNS.values()):
    for fn in fns:
        providers[fn.__qualname__] = fn
for _pred, fn in mob._PREDICATE_OVERRIDE_FNS:
    providers[fn.__qualname__] = fn
class Recording(list):
    def append(self, item):
        records.append((item, locate(sys._getframe(1))))
        list.append(self, item)
    def extend(self, items):
        items = list(items)
        at = locate(sys._getframe(1))
        for item in items:
            fn = providers.get(item[0]) if isinstance(item, tuple) else None
            c = getattr(fn, "__code__", None)
            records.append((item, where(c.co_filename, last_return.get(c, c.co_firstlineno)) if c else at))
        list.extend(self, items)
failed = out["failed_steps"]
def wrap(name):
    def hook(server_args, previous):
        if not isinstance(getattr(server_args, "_resolved_overrides", None), Recording):
            server_args._resolved_overrides = Recording(server_args._resolved_overrides or [])
        before = len(records)
        try:
            previous(server_args)
        except Exception as exc:
            failed.append({"step": name, "error": clean("%s: %s" % (type(exc).__name__, exc))})
    return hook
for name in sorted(_OVERRIDABLE_HOOKS):
    register_resolution_hook(name)(wrap(name))
args = list(req["args"])
if "--config" in args:
    i = args.index("--config")
    del args[i:i + 2]
    out["notes"].append("--config (the API key file) left out: it sets no resolved value")
for flag, local in req["paths"].items():
    if flag in args:
        i = args.index(flag)
        out["notes"].append("%s %s read from %s" % (flag, args[i + 1], local))
        args[i + 1] = local
if "--trust-remote-code" in args and "--model-path" in req["paths"]:
    try:
        with open(os.path.join(req["paths"]["--model-path"], "config.json")) as fh:
            auto = (json.load(fh).get("auto_map") or {}).get("AutoConfig", "")
    except Exception:
        auto = ""
    code = auto.split(".")[0] + ".py" if auto else ""
    if code and not os.path.exists(os.path.join(req["paths"]["--model-path"], code)):
        args.remove("--trust-remote-code")
        out["notes"].append("--trust-remote-code left out: the model directory read has no " + code
                            + " (a recorded config.json); SGLang's own config class for its model_type is used")
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        ns = parser.parse_args(args)
except SystemExit:
    out["errors"].append(clean(err.getvalue()) or "SGLang's parser refused the command"); finish()
given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
flag_of = {}
for action in parser._actions:
    for opt in action.option_strings:
        flag_of.setdefault(action.dest, opt)
logging.disable(logging.WARNING)
record = ServerArgs.from_cli_args(ns)
stopped = None
sys.setprofile(profiler)
try:
    record.resolve_once()
except BaseException as exc:
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/" in f.filename]
    at = (" (at " + where(frames[-1].filename, frames[-1].lineno) + ")") if frames else ""
    stopped = clean("%s: %s" % (type(exc).__name__, exc)) + at
    out["traceback"] = [where(f.filename, f.lineno) + " " + f.name for f in frames[-12:]]
finally:
    sys.setprofile(None)
if stopped:
    out["errors"].append("SGLang's resolution stopped: " + stopped)
raw = getattr(record, "_raw_input", None) or {}
last = {}
for (item, loc) in records:
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], dict):
        for field in item[1]:
            last[field] = (item[0], loc)
from sglang.srt.server_args import _plain
def plain(value):
    try:
        value = _plain(value)
        json.dumps(value)
        return value
    except Exception:
        return repr(value)
for field in record_fields(type(record)):
    name = field.name
    try:
        value = ov.resolution_result(record, name)
    except Exception as exc:
        value = "<unreadable: %s>" % clean(exc)
    value = plain(value)
    out["resolved"][name] = value
    if name in last:
        out["sources"][name] = last[name][1]
        before = plain(raw.get(name))
        if value != before:
            flag = flag_of.get(name)
            out["values"].append({"field": name, "flag": flag, "given": flag in given if flag else False,
                                  "input": before, "resolved": value, "declared_by": last[name][0],
                                  "source": last[name][1]})
check = req.get("kv_check")
if check and not stopped:
    # SGLang's own KV sizing (srt/mem_cache/kv_cache_configurator.py KVCacheConfigurator._profile_available_bytes,
    # srt/model_executor/pool_configurator.py DefaultPoolConfigurator) on the resolved record, with the memory
    # free before and after the weights load injected (the only GPU readings it takes).
    try:
        from sglang.srt.runtime_context import publish
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_cache import kv_cache_configurator as kvm
        from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.runtime_context import get_parallel
        publish(record, role="test")
        get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None))
        mc = ModelConfig.from_server_args(record)
        kvm.get_available_gpu_memory = lambda *a, **k: check["after_weights_gib"]
        dtype = mc.dtype if ov.resolution_result(record, "kv_cache_dtype") in (None, "auto") else \
            getattr(torch, {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(
                ov.resolution_result(record, "kv_cache_dtype"), "bfloat16"))
        algo = SpeculativeAlgorithm.from_string(ov.resolution_result(record, "speculative_algorithm"))
        n = mc.num_hidden_layers
        kvc = types.SimpleNamespace(
            kv_cache_dtype_str=str(ov.resolution_result(record, "kv_cache_dtype") or "auto"), model_config=mc,
            layer_info=types.SimpleNamespace(num_effective_layers=n, start_layer=0, end_layer=n),
            kv_cache_dtype=dtype, server_args=record, use_mla_backend=mc.attention_arch.name == "MLA",
            pp_size=1, spec_algorithm=algo, is_draft_worker=False, fused_entry_bytes=lambda kind: None,
            spec_aux_config=types.SimpleNamespace(eagle_draft_num_layers=check.get("draft_layers"),
                                                  dflash_draft_num_layers=None),
            device="cuda", gpu_id=0, mambaish_config=None, post_capture_kv_active=False, page_size=1)
        available = kvm.KVCacheConfigurator._profile_available_bytes(kvc, check["pre_load_gib"])
        pool = DefaultPoolConfigurator(kvc)
        page = int(ov.resolution_result(record, "page_size") or 1)
        tokens = pool.calculate_pool_sizes(available, page).max_total_num_tokens
        out["kv_check"] = {"available_bytes": available, "cell_size": pool._cell_size, "max_total_num_tokens": tokens,
                           "context_len": mc.context_len, "source": "sglang/srt/mem_cache/kv_cache_configurator.py "
                           "_profile_available_bytes + sglang/srt/model_executor/pool_configurator.py "
                           "DefaultPoolConfigurator.calculate_pool_sizes"}
    except BaseException as exc:
        import traceback
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/" in f.filename]
        at = (" (at " + where(frames[-1].filename, frames[-1].lineno) + ")") if frames else ""
        out["kv_check"] = {"error": clean("%s: %s" % (type(exc).__name__, exc)) + at}
if stubbed:
    out["notes"].append("GPU packages not installed here, stood in for at import: " + ", ".join(sorted(stubbed))
                        + " (a step that calls into them is reported as not resolvable here)")
for name in os.listdir(tmp):
    os.unlink(os.path.join(tmp, name))
os.rmdir(tmp)
finish()
"""


#: GPU-only packages SGLang 0.5.23 imports at module level once ``torch.cuda`` says a GPU is there (e.g.
#: ``from sgl_kernel import int8_scaled_mm`` in ``srt/layers/quantization/compressed_tensors/schemes/
#: compressed_tensors_w8a8_int8.py``). Where one is not installed (a CI machine), an import of it gets a stand-in
#: whose functions raise when called; where it is installed (the GPU host), the real package is used.
STUB_PACKAGES = ("sgl_kernel", "flashinfer", "deep_gemm", "triton", "tilelang", "flash_attn", "flash_mla",
                 "cutlass", "cuda", "cupy", "nvshmem", "mooncake", "deep_ep", "aiter", "vllm", "xformers",
                 "torch_memory_saver", "sgl_fa4", "flash_attn_interface")


@dataclasses.dataclass(frozen=True)
class ResolvedValue:
    """One field SGLang resolved to something else than its input.

    ``flag``: the CLI spelling (``None`` for fields without one); ``given``: the rendered command sets it (the
    profile said so and SGLang changed it) or not (the profile leaves it to SGLang); ``input``/``resolved``:
    JSON forms; ``declared_by``: SGLang's own name for the decision; ``source``: ``sglang/srt/...py:LINE``.
    """

    field: str
    flag: str | None
    given: bool
    input: Any
    resolved: Any
    declared_by: str
    source: str

    def line(self, width: int = 100) -> str:
        """``--flag = value (profile X | unset; source, SGLang's name)``; values longer than ``width`` are cut
        (``--json`` has them whole)."""
        what = self.flag or self.field
        was = f"profile {json.dumps(self.input)}" if self.given else "unset"
        value = json.dumps(self.resolved)
        if len(value) > width:
            value = value[:width] + "... (see --json)"
        return f"{what} = {value} ({was}; {self.source}, {self.declared_by})"


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    """:func:`resolve`'s result.

    ``values``: :class:`ResolvedValue` s (changed or decided by SGLang); ``resolved``: every field's resolved
    value; ``sources``: field -> ``file:line`` of its last declaration; ``failed_steps``: pipeline steps that raised
    even with the injected facts, ``{"step", "error"}`` (their values are not known here); ``errors``: resolution
    could not run or stopped; ``notes``: substitutions made; ``kv_check``: SGLang's own KV sizing
    (``max_total_num_tokens``, ``cell_size``, ``available_bytes``, ``context_len``) or ``{"error"}``, when asked.
    """

    gpus: GpuFacts
    values: tuple[ResolvedValue, ...]
    resolved: Mapping[str, Any]
    sources: Mapping[str, str]
    failed_steps: tuple[Mapping[str, str], ...]
    errors: tuple[str, ...]
    notes: tuple[str, ...]
    kv_check: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus.to_dict(), "values": [dataclasses.asdict(v) for v in self.values],
                "failed_steps": [dict(s) for s in self.failed_steps], "errors": list(self.errors),
                "notes": list(self.notes), "kv_check": dict(self.kv_check) if self.kv_check else None}

    def lines(self) -> list[str]:
        g = self.gpus
        out = [f"SGLang resolves on {g.count} x {g.name} ({g.memory_mib} MiB, capability {g.compute_cap}; "
               f"{g.source}):"]
        out += [f"  {v.line()}" for v in self.values if not v.field.startswith("_")]
        out += [f"  not resolvable here: step {s['step']} raised {s['error']}; the values it sets are unknown"
                for s in self.failed_steps]
        out += [f"  error: {e}" for e in self.errors]
        out += [f"  note: {n}" for n in self.notes]
        return out


def resolve(python: str | Path, server_args: Sequence[str], gpus: GpuFacts, *,
            paths: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
            kv_check: Mapping[str, Any] | None = None, timeout: float = 300.0) -> EffectiveConfig:
    """Run SGLang's resolution of ``server_args`` in ``python`` on ``gpus`` (see the module docstring).

    Args:
        python: SGLang's interpreter.
        server_args: the rendered command after ``-m sglang.launch_server``.
        gpus: the GPU facts to inject.
        paths: flag -> local directory replacing its value (``--model-path``, ``--speculative-draft-model-path``).
        env: environment for the script (SGLang reads ``SGLANG_*`` variables while resolving).
        kv_check: also run SGLang's own KV sizing on the resolved record (``{"pre_load_gib", "after_weights_gib",
            "draft_layers"}``: the memory free before and after the weights load, GiB); its result is
            :attr:`EffectiveConfig.kv_check`.

    Raises:
        UsageError / ExternalCommandError: as :func:`kimi_deploy.engine.run_script` (a broken interpreter).
    """
    request = {"args": list(server_args), "gpus": gpus.to_dict(), "paths": dict(paths or {}),
               "stub_packages": list(STUB_PACKAGES), "kv_check": dict(kv_check) if kv_check else None}
    data = target.run_script(python, RESOLVE_SCRIPT, [json.dumps(request)], timeout=timeout,
                             env=dict(env or {}), label="effective-config script")
    values = tuple(ResolvedValue(**v) for v in data.get("values", []))
    return EffectiveConfig(gpus=gpus, values=values, resolved=data.get("resolved", {}),
                           sources=data.get("sources", {}), failed_steps=tuple(data.get("failed_steps", [])),
                           errors=tuple(data.get("errors", [])), notes=tuple(data.get("notes", [])),
                           kv_check=data.get("kv_check"))
