#!/usr/bin/env bash
# The pod-scale memory table of benchmarks/RESULTS.md: `marljax compile` of the flagship GRPO config's
# update step for full-depth model shapes (config.json only; no weights needed) on v5p slices.
# Usage: benchmarks/compile/cases.sh [extra key=value ...]   (e.g. policies.main.model.remat=dots)
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=configs/grpo_qwen2.5-0.5b.yaml
HERE=benchmarks/compile
PROGRAMS=${PROGRAMS:-update}
run() { echo "== $*"; python -m marljax.cli compile "$CONFIG" --programs "$PROGRAMS" "$@"; }
# Qwen2.5-0.5B, 16 rows x 1024 tokens per micro-batch, v5p-16 (8 chips), fsdp 8
run --topology v5p:2x2x2 --seq-len 1024 policies.main.model.path=$HERE/qwen2.5-0.5b \
  policies.main.mesh.fsdp=8 policies.main.micro_batch_size=16 "$@"
# Qwen2.5-0.5B, 64 x 1024, v5p-128 (64 chips), fsdp 64
run --topology v5p:4x4x4 --seq-len 1024 policies.main.model.path=$HERE/qwen2.5-0.5b \
  policies.main.mesh.fsdp=64 policies.main.micro_batch_size=64 "$@"
# Llama-3-8B shape, 64 x 2048, v5p-128 (64 chips), fsdp 64
run --topology v5p:4x4x4 --seq-len 2048 policies.main.model.path=$HERE/llama-3-8b \
  policies.main.mesh.fsdp=64 policies.main.micro_batch_size=64 "$@"
