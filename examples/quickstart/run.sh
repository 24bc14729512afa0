#!/usr/bin/env bash
# The quickstart in one command, from the repository root:
#   bash examples/quickstart/run.sh
# 1. builds a tiny Qwen2-style model and tokenizer, writes the arithmetic data set and
#    warm-starts the model (skipped when already done; --force redoes it);
# 2. trains it with GRPO and the GSM8K reward. Metrics: runs/quickstart-grpo/metrics.jsonl,
#    curves: rlcore plot runs/quickstart-grpo
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one torch thread per process (2-core machines)
python examples/quickstart/prepare.py "$@"
rlcore train examples/quickstart/grpo.toml
