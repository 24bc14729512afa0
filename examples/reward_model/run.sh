#!/usr/bin/env bash
# The reward-model example in one command, from the repository root:
#   bash examples/reward_model/run.sh [--seed N] [-- KEY=VALUE ...]
# 1. examples/quickstart/prepare.py: the arithmetic data and the warm-started policy
#    (skipped when already done);
# 2. examples/reward_model/train_rm.py: a sequence-classification reward model on right vs
#    wrong answers (skipped when examples/reward_model/work/rm exists; delete it to retrain);
# 3. rlcore train examples/reward_model/grpo_rm.toml: GRPO with that model as the only reward.
# Curves: examples/reward_model/work/rm_train.jsonl (the reward model), <run dir>/metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

seed=0
overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --) shift; overrides=("$@"); break ;;
    *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work=examples/quickstart/work
python examples/quickstart/prepare.py --seed "$seed" --work-dir "$work"
if [[ ! -f examples/reward_model/work/rm/config.json ]]; then
  python examples/reward_model/train_rm.py --seed "$seed" --work-dir "$work"
fi
rlcore train examples/reward_model/grpo_rm.toml \
  "model.path=$work/seed$seed/model_sft" \
  "data.seed=$seed" \
  "trainer.seed=$seed" \
  "trainer.run_dir=runs/reward-model-grpo-seed$seed" \
  "trainer.experiment_name=reward-model-grpo-seed$seed" \
  "${overrides[@]+"${overrides[@]}"}"
