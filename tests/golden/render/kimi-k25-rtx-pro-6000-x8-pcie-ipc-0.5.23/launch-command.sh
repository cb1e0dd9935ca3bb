env HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SGLANG_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23 SGLANG_JIT_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23/sglang-jit SGLANG_DG_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23/deep-gemm TRITON_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23/triton TORCHINDUCTOR_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23/torchinductor CUDA_CACHE_PATH=/var/cache/kimi-k25/sglang-0.5.23/cuda TILELANG_CACHE_DIR=/var/cache/kimi-k25/sglang-0.5.23/tilelang FLASHINFER_WORKSPACE_BASE=/var/cache/kimi-k25/sglang-0.5.23/flashinfer SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 NCCL_IB_DISABLE=1 \
/opt/sglang/.venv/bin/python -m sglang.launch_server \
  --model-path /models/moonshotai/Kimi-K2.5 \
  --served-model-name moonshotai/Kimi-K2.5 \
  --trust-remote-code \
  --host 0.0.0.0 \
  --port 30000 \
  --tp-size 8 \
  --tool-call-parser kimi_k2 \
  --reasoning-parser kimi_k2 \
  --speculative-algorithm EAGLE3 \
  --speculative-draft-model-path /models/lightseekorg/kimi-k2.5-eagle3-mla \
  --speculative-num-steps 3 \
  --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 4 \
  --config /run/kimi-k25/sglang-secrets.yaml
