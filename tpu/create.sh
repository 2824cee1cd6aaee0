#!/usr/bin/env bash
# Create the TPU VM slice: tpu/create.sh [--dry-run]
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

flags=(--accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
if [[ "$SPOT" == 1 ]]; then flags+=(--spot); fi
tpu_vm create "$TPU_NAME" "${GCLOUD_FLAGS[@]}" "${flags[@]}"
