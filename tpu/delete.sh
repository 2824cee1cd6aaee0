#!/usr/bin/env bash
# Delete the slice (and stop its billing): tpu/delete.sh [--dry-run]
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

tpu_vm delete "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --quiet
