#!/usr/bin/env bash
# One lease of a GPU machine: every accelerator measurement, most important first, each under its
# own time limit and all under BUDGET seconds, so that a slow step costs the later ones and not the
# whole lease. Results go to $OUT (JSON per step, one log); the summary is printed last.
#
#   OUT=/tmp/out BUDGET=540 bash benchmarks/device_session.sh
#
# SMOKE=1 runs every step at tiny shapes (a dry run on a CPU).
#
# Wheels for the packages a bare GPU image lacks are installed from .whl/ (git-ignored) when it is
# there; made on a machine with an index, for that image's Python (3.12):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
#     grain array-record portpicker importlib_resources more-itertools pydantic pydantic-core \
#     annotated-types typing-inspection typing-extensions tensorboardX bm25s
set -u
OUT=${OUT:-/tmp/marljax_device}
mkdir -p "$OUT"
LOG=$OUT/log.txt
# MARLJAX_KEEP_HOST_MEMORY=0: the glibc settings of marljax.host_memory are for XLA:CPU's buffers
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MARLJAX_KEEP_HOST_MEMORY=0
# one compilation cache for every step and child process: the sharing-level children compile the
# same programs
export JAX_COMPILATION_CACHE_DIR=/tmp/marljax_jax_cache
PY=${PY:-python3}
if [ -n "${SMOKE:-}" ]; then
  accel=--smoke lora=--smoke gpu=--smoke teams=2 mfu=--smoke
else
  accel="" lora=--gpu gpu=--quick teams=4 mfu="--budget 280"
fi
start=$SECONDS
end=$((start + ${BUDGET:-540}))

if [ -d .whl ] && [ -z "${SMOKE:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

step() {  # step NAME LIMIT_S COMMAND...: run unless too little time is left
  local name=$1 limit=$2 left=$((end - SECONDS))
  shift 2
  if [ "$left" -lt 40 ]; then
    echo "== $name: skipped, ${left} s left" | tee -a "$LOG"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s, at $((SECONDS - start)) s)" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "== $name: exit $? at $((SECONDS - start)) s" | tee -a "$LOG"
}

{
  nvidia-smi -L
  $PY -c "import sys, jax; print(sys.version); print(jax.__version__, jax.devices())"
  $PY -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|flax|optax|orbax-checkpoint|chex|transformers|grain|pydantic) "
} >>"$LOG" 2>&1
tail -n 12 "$LOG"

# what has no GPU numbers yet comes first (benchmarks/RESULTS.md); the limits allow for compiling
# (a sharing-level child compiles for 20-40 s, the long tail at the 0.5B shape for minutes). The
# adapter sampling comparison is measured: `bench_lora.py --gpu --sampling-only` reruns it (~220 s)
# the train-step MFU of the issue's targets (0.5B / 1.5B, cuDNN attention, remat policies): its own
# --budget ends it before the step's limit; the JSON is rewritten after every case
step mfu 300 $PY benchmarks/bench_mfu.py $mfu --out "$OUT/mfu.json"
step gpu 240 $PY benchmarks/run.py --gpu $gpu --only gpu --out "$OUT/gpu"
rm -f "$OUT/gpu/results.md"  # the markdown is in results.json; the lease returns at most 8 files
for team in $teams; do
  step "lora_team$team" 300 $PY benchmarks/bench_lora.py $lora --teams "$team" --teams-only \
    --out "$OUT/lora_team$team.json"
done
step accel 300 $PY benchmarks/bench_accel.py $accel --out "$OUT/accel.json"

echo "== summary ($((SECONDS - start)) s)"
$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for f in sorted(out.rglob("*.json")):
    d = json.loads(f.read_text())
    md = d.get("markdown") or "\n\n".join(str(s.get("markdown", s)) for s in d.get("results", {}).values())
    print(f"--- {f.relative_to(out)}\n{md}\n")
EOF
