"""Run in an SGLang 0.5.23 interpreter: the redact-api-key and SM120 gates, observed through SGLang's code.

argv[1]: a model folder with a config.json. Prints one JSON object:
- "log" / "server_info": which sentinel secrets appear in engine._server_args_for_logging (the
  startup server_args= line) and in utils.common.build_server_info (/server_info);
- "fusion" / "fusion_sm121": _resolve_backend per backend with SGLang's platform context overridden to
  a major-12 device (override_platform) and SGLang's exact is_sm120() answering True (12.0) / False
  (12.1, GB10), "ok:<resolved>" or "error:<message>";
- "fused_norm_site": whether add_norm's fused add+RMSNorm gate includes SM120 (exact 12.0);
- "symm_mem_rows": capability rows of TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, "symm_mem_row_12" the
  capability-12 row (world size -> bytes).
"""
import json, sys, types

# setproctitle is imported by engine.py but not installed in the CPU test environment; it only
# sets the process title.
sys.modules.setdefault("setproctitle", types.SimpleNamespace(setproctitle=lambda *a, **k: None,
                                                             getproctitle=lambda: ""))
from sglang.srt.server_args import prepare_server_args

secrets = {"api_key": "SENTINEL-KEY-4d1f", "admin_api_key": "SENTINEL-ADMIN-9c2e"}
sa = prepare_server_args(["--model-path", sys.argv[1], "--skip-tokenizer-init", "--device", "cpu",
                          "--api-key", secrets["api_key"], "--admin-api-key", secrets["admin_api_key"]])
from sglang.srt.entrypoints.engine import _server_args_for_logging
from sglang.srt.utils.common import build_server_info

log_line = f"server_args={_server_args_for_logging(sa)}"
info = json.dumps(build_server_info(sa, {}), default=str)
out = {"log": sorted(k for k, v in secrets.items() if v in log_line),
       "server_info": sorted(k for k, v in secrets.items() if v in info),
       "server_info_api_key": json.loads(info).get("api_key")}

from sglang.srt.layers import flashinfer_comm_fusion as fcf
from sglang.srt.runtime_context import override_platform

from sglang.srt.utils import common as sglang_common


def resolve_all(exact_sm120: bool) -> dict:
    """_resolve_backend per backend on a compute-capability-12 platform; ``exact_sm120``: 12.0 (RTX PRO 6000)
    rather than 12.1 (GB10), as SGLang's own is_sm120() tells them apart."""
    fusion, real = {}, sglang_common.is_sm120
    sglang_common.is_sm120 = lambda: exact_sm120
    try:
        with override_platform(is_sm90=False, is_sm100=False, is_sm120=True):
            for backend, multi in (("auto", False), ("trtllm", False), ("mnnvl", False), ("cutedsl", False),
                                   ("auto", True)):
                key = backend + ("/multi-node" if multi else "")
                try:
                    fusion[key] = "ok:" + fcf._resolve_backend(backend, multi)
                except ValueError as exc:
                    fusion[key] = "error:" + str(exc)
    finally:
        sglang_common.is_sm120 = real
    return fusion


out["fusion"] = resolve_all(True)
out["fusion_sm121"] = resolve_all(False)

from sglang.srt.layers.layer_boundary.residual import add_norm
import inspect

out["fused_norm_site"] = "_is_sm120_exact" in inspect.getsource(add_norm.flashinfer_ar_fusion_applies)
out["fused_norm_site_exact"] = "is_sm120 as _kimi_is_sm120" in inspect.getsource(add_norm)
from sglang.srt.distributed.device_communicators.all_reduce_utils import TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES

out["symm_mem_rows"] = sorted(TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES)
out["symm_mem_row_12"] = {str(k): v for k, v in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(12, {}).items()}
print(json.dumps(out))
