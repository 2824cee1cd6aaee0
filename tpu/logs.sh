#!/usr/bin/env bash
# Follow the training log of one worker (default 0, the one that reports): tpu/logs.sh [--dry-run] [WORKER]
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

tpu_vm ssh "$TPU_NAME" --worker="${ARGS[0]:-0}" "${GCLOUD_FLAGS[@]}" --command="tail -n 200 -F ~/$LOG_FILE"
