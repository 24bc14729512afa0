#!/usr/bin/env bash
# GPU check: every GPU path of rlcore on one CUDA machine, one PASS / FAIL / SKIP line per check
# and a summary table; exits 1 on any FAIL. A check SKIPs where its device or framework is
# missing; --require turns every SKIP into a FAIL, so a run that tested nothing cannot pass.
#
#   bash scripts/gpu_check.sh [--require] [--steps N]
#
# Checks (each bounded by CHECK_TIMEOUT_S, 300 s by default; about 6 minutes in all on an H100-
# class GPU with a tiny model):
#   fsdp2_hf_grpo     FSDP2 + HF rollout GRPO steps, NCCL, bf16 mixed precision, offload,
#                     checkpoint, export                              (scripts/gpu_check.py)
#   device_pick       a rank-1 worker with one visible GPU trains on device 0 (same script)
#   megatron          megatron-core engine, NCCL, one rank: logits vs HF, steps, sync, checkpoint
#                     (plugins/engines/megatron/scripts/gpu_check.py; TP > 1 needs two GPUs:
#                     NCCL refuses two ranks on one device)
#   megatron_bf16     megatron-core's bf16 path: Float16Module, DDP grad buffers, distributed
#                     optimizer over float32 main params; steps against float32 within bf16
#                     tolerance, checkpoint (plugins/engines/megatron/scripts/gpu_check_bf16.py)
#   sglang_rollout    SGLang conformance (float32), sleep -> wake_up -> re-sync, generate_one
#                     from a foreign event loop            (plugins/rollout/sglang/gpu_check.py)
#   vllm_rollout      vLLM generate, log-probs vs HF, update_weights, sleep/wake
#                                                                     (scripts/gpu_check_vllm.py)
#   fsdp2_vllm_sync   FSDP2 -> vLLM weight sync, vLLM's log-probs against the trainer's, in the
#                     colocated memory order (peak device memory per phase printed), through
#                     safetensors files                               (scripts/gpu_check_sync.py)
#   fsdp2_vllm_ipc    the same through vLLM's CUDA IPC weight-transfer backend (weight_sync =
#                     "cuda_ipc": FAILs where it is not used)                        (same script)
#
# Offline, with a 64 MiB carry (the device tool): the GPU machine brings its own CUDA torch;
# the pure-Python rest is carried as wheels in ./.gpu_deps/wheels (made here with
# `pip download --no-deps -d .gpu_deps/wheels attrs cattrs pluggy safetensors transformers
# tokenizers huggingface-hub megatron-core==0.16.1`, checked under 64 MiB with `du -sh` before
# carrying; megatron-core's wheel is small) and installed on the GPU machine with
# `pip install --no-index --no-deps --target .gpu_deps .gpu_deps/wheels/*`, which this script
# puts on PYTHONPATH. vLLM (hundreds of MiB) and SGLang do not fit: their checks SKIP unless
# the machine has them; --require makes that a FAIL.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
REQUIRE=0
ARGS=()
for arg in "$@"; do
    if [ "$arg" = "--require" ]; then REQUIRE=1; else ARGS+=("$arg"); fi
done
TIMEOUT="${CHECK_TIMEOUT_S:-300}"
if [ -d .gpu_deps ]; then
    export PYTHONPATH="$PWD/.gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

NAMES=()
RESULTS=()
NOTES=()
record() {  # name, PASS|FAIL|SKIP, note
    local status=$2
    if [ "$status" = "SKIP" ] && [ "$REQUIRE" = 1 ]; then status=FAIL; fi
    NAMES+=("$1")
    RESULTS+=("$status")
    NOTES+=("$3")
    printf '%s %s: %s\n' "$status" "$1" "$3"
}

has_module() {
    "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" 2>/dev/null
}

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    CUDA=1
else
    CUDA=0
fi
MISSING=""
for mod in transformers numpy attrs safetensors; do
    has_module "$mod" || MISSING="$MISSING $mod"
done

# run_check NAME NEEDS_MODULE COMMAND...: SKIP without CUDA or the module, else PASS/FAIL by
# the exit status (124: it ran past CHECK_TIMEOUT_S).
run_check() {
    local name=$1 needs=$2
    shift 2
    if [ "$CUDA" = 0 ]; then
        record "$name" SKIP "no CUDA device"
        return
    fi
    if [ -n "$MISSING" ]; then
        record "$name" FAIL "missing:$MISSING (carry them in ./.gpu_deps)"
        return
    fi
    if [ -n "$needs" ] && ! has_module "$needs"; then
        record "$name" SKIP "$needs is not installed for $PY"
        return
    fi
    echo "=== $name: $*"
    local start=$SECONDS rc=0
    timeout "$TIMEOUT" "$@" || rc=$?
    local took=$((SECONDS - start))
    if [ "$rc" = 0 ]; then
        record "$name" PASS "${took} s"
    elif [ "$rc" = 124 ]; then
        record "$name" FAIL "ran past CHECK_TIMEOUT_S=${TIMEOUT} s"
    else
        record "$name" FAIL "exit $rc after ${took} s (output above)"
    fi
}

first_gpu="${CUDA_VISIBLE_DEVICES:-0}"
first_gpu="${first_gpu%%,*}"
run_check fsdp2_hf_grpo "" "$PY" scripts/gpu_check.py --device cuda "${ARGS[@]}"
run_check device_pick "" env CUDA_VISIBLE_DEVICES="$first_gpu" \
    "$PY" scripts/gpu_check.py --device cuda --steps 1 --local-rank 1
run_check megatron megatron.core "$PY" plugins/engines/megatron/scripts/gpu_check.py \
    --device cuda "${ARGS[@]}"
run_check megatron_bf16 megatron.core "$PY" plugins/engines/megatron/scripts/gpu_check_bf16.py \
    --device cuda
run_check sglang_rollout sglang "$PY" plugins/rollout/sglang/gpu_check.py
run_check vllm_rollout vllm "$PY" scripts/gpu_check_vllm.py --device cuda
run_check fsdp2_vllm_sync vllm "$PY" scripts/gpu_check_sync.py --device cuda --weight-sync files
run_check fsdp2_vllm_ipc vllm "$PY" scripts/gpu_check_sync.py --device cuda --weight-sync cuda_ipc

echo
printf '%-16s %-5s %s\n' check result note
printf '%-16s %-5s %s\n' ---------------- ----- ----
failed=0
for i in "${!NAMES[@]}"; do
    printf '%-16s %-5s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"
    [ "${RESULTS[$i]}" = FAIL ] && failed=$((failed + 1))
done
if [ "$failed" -gt 0 ]; then
    echo "GPU check: $failed FAIL$([ "$REQUIRE" = 1 ] && echo ' (--require: SKIP counts as FAIL)')"
    exit 1
fi
skipped=$(printf '%s\n' "${RESULTS[@]}" | grep -c '^SKIP$')
echo "GPU check: passed, $skipped of ${#NAMES[@]} skipped"
exit 0
