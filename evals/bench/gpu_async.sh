#!/usr/bin/env bash
# The async trainer on a GPU machine, end to end in under 10 minutes, printing its rows (docs/async-grpo.md, "On a GPU").
#
#   bash evals/bench/gpu_async.sh [more grpo_gpu.py flags]
#
# One script: the plan first (grpo_gpu.py --dry-run), then the runs, killed at 570 s so that a machine lent for ten
# minutes always prints what it has and gives the machine back. It runs evals/bench/grpo_gpu.py --async without the
# batch_wait 0 row: a 353 M-parameter model fine-tuned to the protocol, TRL's single-turn GRPO, the sync two-turn
# trainer at 0.2 s and 1 s environment latency under accelerate with DeepSpeed ZeRO-2, and the async trainer at the
# same latencies with a `vllm serve` of the model on the last GPU. With 2 or more GPUs the weights go to the server
# over TRL's NCCL transfer (the rows say `weight sync (nccl)`; the `ratio` column near 1 says the server samples
# what the trainer computes); with one GPU, server and trainer share it and the weights go through a file.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
flags=(--async --skip-eager --steps 8 --batch 16 "$@")
"$python" evals/bench/grpo_gpu.py "${flags[@]}" --dry-run
exec timeout --signal=INT --kill-after=20 570 "$python" evals/bench/grpo_gpu.py "${flags[@]}"
