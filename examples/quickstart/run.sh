#!/usr/bin/env bash
# The quickstart in one command, from the repository root:
#   bash examples/quickstart/run.sh                      # seed 0
#   bash examples/quickstart/run.sh --seed 1             # another seed, its own run dir
#   bash examples/quickstart/run.sh [--seed N] [--config FILE] [--run-dir DIR] [--work-dir DIR]
#                                   [prepare.py flags] [-- KEY=VALUE ...]
#   --config: another algorithm's file over the same data and warm start (default grpo.toml;
#   e.g. examples/quickstart/dapo.toml); the run is named after the file: quickstart-<stem>-seed<N>
# 1. prepare.py builds a tiny Qwen2-style model (init from the seed), writes the arithmetic data
#    set (the same split for every seed) and warm-starts the model to a dev-accuracy target
#    (skipped when already done; --force redoes it);
# 2. rlcore train examples/quickstart/grpo.toml (or --config), with the seed in trainer.seed and data.seed and
#    the run in runs/quickstart-grpo-seed<N> (or --run-dir). KEY=VALUE after -- are more overrides.
# Metrics: <run dir>/metrics.jsonl; plots (summary.png first): <run dir>/plots/;
# wall times of both phases: <run dir>/quickstart_times.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one torch thread per process (2-core machines)

seed=0
config=examples/quickstart/grpo.toml
run_dir=""
work=examples/quickstart/work  # prepare.py's outputs: data/ and seed<N>/
prepare_args=()
overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --seed=*) seed="${1#--seed=}"; shift ;;
    --config) config="${2:?--config needs a value}"; shift 2 ;;
    --config=*) config="${1#--config=}"; shift ;;
    --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
    --run-dir=*) run_dir="${1#--run-dir=}"; shift ;;
    --work-dir) work="${2:?--work-dir needs a value}"; shift 2 ;;
    --work-dir=*) work="${1#--work-dir=}"; shift ;;
    --) shift; overrides=("$@"); break ;;
    *) prepare_args+=("$1"); shift ;;
  esac
done
if ! [[ "$seed" =~ ^[0-9]+$ ]]; then
  echo "error: --seed must be a non-negative integer, got '$seed'" >&2
  exit 2
fi
if [[ ! -f "$config" ]]; then
  echo "error: --config: no such file '$config'" >&2
  exit 2
fi
name="quickstart-$(basename "$config" .toml)"
run_dir="${run_dir:-runs/$name-seed$seed}"

start=$SECONDS
python examples/quickstart/prepare.py --seed "$seed" --work-dir "$work" "${prepare_args[@]+"${prepare_args[@]}"}"
prepare_s=$((SECONDS - start))

start=$SECONDS
rlcore train "$config" \
  "model.path=$work/seed$seed/model_sft" \
  "data.train_files=[\"$work/data/train.parquet\"]" \
  "data.val_files=[\"$work/data/test.parquet\"]" \
  "data.seed=$seed" \
  "trainer.seed=$seed" \
  "trainer.run_dir=$run_dir" \
  "trainer.experiment_name=$name-seed$seed" \
  "${overrides[@]+"${overrides[@]}"}"
train_s=$((SECONDS - start))

printf '{"seed": %d, "prepare_s": %d, "train_s": %d}\n' "$seed" "$prepare_s" "$train_s" \
  > "$run_dir/quickstart_times.json"
echo "quickstart seed $seed: prepare ${prepare_s} s, training ${train_s} s; run in $run_dir"
