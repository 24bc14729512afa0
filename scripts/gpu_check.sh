#!/usr/bin/env bash
# GPU check for the FSDP2 engine (NCCL, bf16), the HF rollout, the Megatron engine (where
# megatron-core is installed) and, where SGLang is installed, the SGLang rollout
# (plugins/rollout/sglang/gpu_check.py), without Ray or an install; then the vLLM rollout
# (scripts/gpu_check_vllm.py) where vLLM is importable:
#   bash scripts/gpu_check.sh [--steps N]
# Exits 0 with a note where no CUDA device exists; skips the vLLM step, saying how to get vLLM
# (a lent GPU machine has none preinstalled), where it is missing. Needs torch (CUDA),
# transformers, numpy and
# attrs; where attrs is not installed, a folder ./.gpu_deps holding it (copied from a dev venv's
# site-packages) is put on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "no CUDA device: skipping GPU check"
    echo "skipped: SGLang rollout step (no CUDA device)"
    exit 0
fi
if [ -d .gpu_deps ]; then
    export PYTHONPATH="$PWD/.gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
fi
missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("transformers", "numpy", "attrs", "safetensors") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
    echo "GPU check needs: $missing (pip install $missing, or copy them into ./.gpu_deps)" >&2
    exit 1
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
"$PY" scripts/gpu_check.py --device cuda "$@"
# The multi-GPU device pick: a rank-1 worker that Ray shows one GPU (LOCAL_RANK=1, one visible
# device) must train on device 0 instead of failing with "invalid device ordinal".
first_gpu="${CUDA_VISIBLE_DEVICES:-0}"
first_gpu="${first_gpu%%,*}"
echo "device pick: LOCAL_RANK=1, CUDA_VISIBLE_DEVICES=$first_gpu"
CUDA_VISIBLE_DEVICES="$first_gpu" "$PY" scripts/gpu_check.py --device cuda --steps 1 --local-rank 1
# Megatron engine step (megatron-core 0.16.1: `pip install megatron-core==0.16.1 --no-deps`,
# or its wheel installed with --target into ./.gpu_deps); skipped with a note where absent.
if "$PY" -c "import megatron.core" 2>/dev/null; then
    "$PY" plugins/engines/megatron/scripts/gpu_check.py --device cuda "$@"
else
    echo "megatron-core not importable: skipping the Megatron engine step"
fi
# SGLang rollout: prints "skipped: ..." and exits 0 where SGLang is not installed.
"$PY" plugins/rollout/sglang/gpu_check.py

# --- vLLM rollout: generate, log-probs, weight sync, sleep/wake ------------------------------
if "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
    exec "$PY" scripts/gpu_check_vllm.py --device cuda
fi
echo "vLLM is not installed for $PY: skipping the vLLM step. To run it, install the CUDA build"
echo "in its own environment (it pins a CUDA torch), e.g.:"
echo "  python3 -m venv .venv-vllm-gpu && .venv-vllm-gpu/bin/pip install 'vllm>=0.33' attrs cattrs pluggy"
echo "  PYTHON=.venv-vllm-gpu/bin/python bash scripts/gpu_check.sh"
