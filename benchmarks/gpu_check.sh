#!/usr/bin/env bash
# GPU readiness check: runs the CUDA paths this project has written but never run, on one NVIDIA GPU.
#
#   bash benchmarks/gpu_check.sh [OUT]       # OUT: gpu_check.json and the logs (default: $OUT, else runs/gpu-check)
#
# Time budget: under 9 minutes after setup (each check has its own limit: train 240 s, ddp 150 s, onnx-cuda 60 s,
# serve-cuda 60 s).
#   train      stage F (--preset ladder-f, 10.8M parameters), 2000 steps (STEPS=N to change), bf16 autocast + TF32,
#              fused AdamW, torch.compile: the val loss must fall below 2.0; tokens/s
#   ddp        torchrun --standalone --nproc_per_node=1: DDP over NCCL, 30 steps
#   onnx-cuda  ONNX Runtime's CUDAExecutionProvider vs its CPU provider on the shipped model: max |Δlogits|
#   serve-cuda the scheduler on the GPU (PyTorch): 16 streams at once must reach 8x one stream's tokens/s
# One PASS/FAIL/SKIP line per check; exit 0 when nothing failed, 1 on a FAIL, 2 when there is no GPU to check on.
# benchmarks/gpu_check.py says what each check runs and what makes it pass.
#
# Setup, once, from a clone with network access (PyPI's Linux torch wheel is the CUDA build; ~3 GB):
#   python3 -m venv .venv-gpu && .venv-gpu/bin/pip install -e '.[train]' onnxruntime-gpu
#   PY=.venv-gpu/bin/python bash benchmarks/gpu_check.sh
# onnxruntime-gpu replaces onnxruntime (both install the module `onnxruntime`): don't install them side by side.
# Any Python with a CUDA torch>=2.4, transformers>=5.24,<6, safetensors, tqdm, matplotlib, platformdirs and
# huggingface_hub will do (PY=...). Offline, point DATA at a copy of Tiny Shakespeare (default:
# ../shared/data/tinyshakespeare.txt beside the clone, else it is downloaded once).
#
# Not yet run by this project: no GPU has been lent to it.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT_DIR=${1:-${OUT:-runs/gpu-check}}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nothing to check on: no GPU (nvidia-smi is not on PATH); this check needs one NVIDIA GPU"
    exit 2
fi
if ! GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1); then
    echo "gpu_check: nothing to check on: nvidia-smi failed: $GPU"
    exit 2
fi
echo "gpu_check: $GPU; $PY"

exec "$PY" benchmarks/gpu_check.py --out "$OUT_DIR" --work runs/gpu-check \
    ${DATA:+--data "$DATA"} ${STEPS:+--steps "$STEPS"}
