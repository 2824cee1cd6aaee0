# shellcheck shell=bash
# Settings and helpers shared by the tpu/ scripts (sourced, not run).
# Every setting can be overridden from the environment, e.g.
#   TPU_NAME=rl-1 ACCELERATOR_TYPE=v6e-16 RUNTIME_VERSION=v2-alpha-tpuv6e tpu/create.sh
# Each script takes --dry-run (or DRY_RUN=1): print the commands, run nothing.

set -euo pipefail

: "${TPU_NAME:=marljax}"                 # name of the TPU VM slice
: "${ZONE:=us-east5-a}"                  # a zone that offers the accelerator type
: "${PROJECT:=}"                         # empty: gcloud's configured project
: "${ACCELERATOR_TYPE:=v5p-16}"          # v5p-16: 8 chips on 2 hosts; v6e-16: 16 chips on 4 hosts
: "${RUNTIME_VERSION:=v2-alpha-tpuv5}"   # v5p: v2-alpha-tpuv5, v6e: v2-alpha-tpuv6e, v5e: v2-alpha-tpuv5-lite
: "${SPOT:=0}"                           # 1: a Spot slice (cheaper, can be preempted)
: "${REMOTE_DIR:=marljax}"               # checkout on every worker, relative to the home directory
: "${RUN_ROOT:=/mnt/marljax-runs}"       # run directories: must be one file system shared by all workers
: "${GCS_BUCKET:=}"                      # bucket name: install.sh mounts it at RUN_ROOT with gcsfuse
: "${LOG_FILE:=marljax-train.log}"       # training log on every worker, relative to the home directory
: "${DRY_RUN:=0}"

# --dry-run anywhere on the command line; the other arguments stay in ARGS
# shellcheck disable=SC2034  # used by the scripts that source this file
ARGS=()
for arg in "$@"; do
  if [[ "$arg" == --dry-run ]]; then DRY_RUN=1; else ARGS+=("$arg"); fi
done

# Flags every gcloud tpu-vm command gets.
GCLOUD_FLAGS=(--zone="$ZONE")
if [[ -n "$PROJECT" ]]; then GCLOUD_FLAGS+=(--project="$PROJECT"); fi

# One shell word per argument, quoted only where a shell needs it (--flag='value' keeps its flag bare).
quote_word() {
  local a="$1"
  if [[ "$a" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$a"
  elif [[ "$a" =~ ^(--[a-z0-9-]+=)(.*)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote_word "${BASH_REMATCH[2]}"
  elif [[ ! "$a" =~ [\"\$\`\\!] ]]; then
    printf '"%s"' "$a"
  else
    printf "'%s'" "${a//\'/\'\\\'\'}"
  fi
}
quote() {
  local out=() a
  for a in "$@"; do out+=("$(quote_word "$a")"); done
  echo "${out[*]}"
}

# Print the command on a dry run, else show it and run it.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    quote "$@"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

tpu_vm() { run gcloud compute tpus tpu-vm "$@"; }
