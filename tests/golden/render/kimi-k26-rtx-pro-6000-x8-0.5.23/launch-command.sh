# 1. SGLang's --config YAML with the API key, from /etc/kimi-deploy/kimi-k26.api-key (the unit writes it to
#    /run/kimi-k26/sglang-secrets.yaml at start; the key never enters argv). Run as a user who can read the key file.
KIMI_DEPLOY_SECRETS=$(umask 077 && mktemp --suffix=.yaml) && trap 'rm -f "$KIMI_DEPLOY_SECRETS"' EXIT &&
/opt/sglang/.venv/bin/python -c 'import json, sys; key = open(sys.argv[1]).read().strip(); key or sys.exit("kimi-deploy: the API key file is empty: " + sys.argv[1]); open(sys.argv[2], "w").write("api-key: " + json.dumps(key) + chr(10))' /etc/kimi-deploy/kimi-k26.api-key "$KIMI_DEPLOY_SECRETS" &&
# 2. the launch command (the unit's ExecStart=, reading that YAML):
env HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SGLANG_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23 SGLANG_JIT_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23/sglang-jit SGLANG_DG_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23/deep-gemm TRITON_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23/triton TORCHINDUCTOR_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23/torchinductor CUDA_CACHE_PATH=/var/cache/kimi-k26/sglang-0.5.23/cuda TILELANG_CACHE_DIR=/var/cache/kimi-k26/sglang-0.5.23/tilelang FLASHINFER_WORKSPACE_BASE=/var/cache/kimi-k26/sglang-0.5.23/flashinfer SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 NCCL_IB_DISABLE=1 \
/opt/sglang/.venv/bin/python -m sglang.launch_server \
  --model-path /models/moonshotai/Kimi-K2.6 \
  --served-model-name moonshotai/Kimi-K2.6 \
  --trust-remote-code \
  --host 0.0.0.0 \
  --port 30000 \
  --tp-size 8 \
  --context-length 65536 \
  --mem-fraction-static 0.895 \
  --chunked-prefill-size 4096 \
  --tool-call-parser kimi_k2 \
  --reasoning-parser kimi_k2 \
  --enable-metrics \
  --config "$KIMI_DEPLOY_SECRETS"
