#!/usr/bin/env bash
# Install marljax (this checkout's HEAD) on every worker of the slice and, with GCS_BUCKET,
# mount that bucket at RUN_ROOT on every worker: tpu/install.sh [--dry-run]
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/env.sh"

repo="$(cd "$(dirname "$0")/.." && pwd)"
tarball="${TMPDIR:-/tmp}/marljax-src.tar.gz"
run git -C "$repo" archive --format=tar.gz -o "$tarball" HEAD  # committed files only
tpu_vm scp "$tarball" "$TPU_NAME:marljax-src.tar.gz" --worker=all "${GCLOUD_FLAGS[@]}"

setup="set -e; mkdir -p ~/$REMOTE_DIR && tar -xzf ~/marljax-src.tar.gz -C ~/$REMOTE_DIR && cd ~/$REMOTE_DIR"
setup+=" && python3 -m pip install -q -U pip && python3 -m pip install -q -e \".[tpu]\""
if [[ -n "$GCS_BUCKET" ]]; then  # a shared run directory for the multi-host checkpoints
  setup+="; if ! command -v gcsfuse >/dev/null; then"
  setup+=" curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null"
  setup+=" && echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -c -s) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list"
  setup+=" && sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; fi"
  setup+="; sudo mkdir -p $RUN_ROOT && sudo chown \$USER $RUN_ROOT"
  setup+="; mountpoint -q $RUN_ROOT || gcsfuse --implicit-dirs --rename-dir-limit=200000 $GCS_BUCKET $RUN_ROOT"
fi
tpu_vm ssh "$TPU_NAME" --worker=all "${GCLOUD_FLAGS[@]}" --command="$setup"
