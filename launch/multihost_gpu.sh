#!/usr/bin/env bash
# Usage, on each of N hosts: launch/multihost_gpu.sh COORDINATOR_HOST:PORT N THIS_HOST_INDEX [flags]
set -euo pipefail
coord=${1:?coordinator host:port}; n=${2:?number of processes}; idx=${3:?process index}; shift 3
exec python3 -m rlrag_jax.train --config=configs/arena.py:paper \
  --config.distributed.initialize=True \
  --config.distributed.coordinator_address="$coord" \
  --config.distributed.num_processes="$n" --config.distributed.process_id="$idx" "$@"
