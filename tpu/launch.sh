#!/usr/bin/env bash
# Start `marljax train CONFIG [key=value ...]` on every worker at once, in the background:
#   tpu/launch.sh [--dry-run] configs/grpo_qwen2.5-0.5b.yaml train.steps=200
# CONFIG is a path inside the checkout. Every worker runs the same command; JAX joins them
# (MARLJAX_DISTRIBUTED=tpu) and only process 0 writes logs, metrics and manifests.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

if [[ ${#ARGS[@]} -lt 1 ]]; then
  echo "usage: tpu/launch.sh [--dry-run] CONFIG [key=value ...]" >&2
  exit 2
fi
# run_dir on the shared file system; a later run_dir=... in ARGS still wins
train=(python3 -m marljax.cli train "${ARGS[0]}" "run_dir=$RUN_ROOT/{name}" "${ARGS[@]:1}")
remote="cd ~/$REMOTE_DIR && MARLJAX_DISTRIBUTED=tpu setsid nohup $(quote "${train[@]}") > ~/$LOG_FILE 2>&1 < /dev/null &"
tpu_vm ssh "$TPU_NAME" --worker=all "${GCLOUD_FLAGS[@]}" --command="$remote"
