#!/usr/bin/env bash
# Copy a run directory (checkpoints, metrics, config) to this machine:
#   tpu/fetch.sh [--dry-run] RUN_NAME [DEST]      (DEST defaults to runs/)
# From the bucket when GCS_BUCKET is set, else from worker 0's RUN_ROOT. Then, locally:
#   marljax export DEST/RUN_NAME --policy NAME OUT_DIR;  marljax plot DEST/RUN_NAME
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

if [[ ${#ARGS[@]} -lt 1 ]]; then
  echo "usage: tpu/fetch.sh [--dry-run] RUN_NAME [DEST]" >&2
  exit 2
fi
name="${ARGS[0]}"
dest="${ARGS[1]:-runs}"
run mkdir -p "$dest"
if [[ -n "$GCS_BUCKET" ]]; then
  run gcloud storage cp --recursive "gs://$GCS_BUCKET/$name" "$dest/"
else
  tpu_vm scp --recurse "$TPU_NAME:$RUN_ROOT/$name" "$dest/" --worker=0 "${GCLOUD_FLAGS[@]}"
fi
