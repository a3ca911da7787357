#!/usr/bin/env bash
# Usage: launch/tpu_pod.sh TPU_NAME ZONE [extra train flags...]
# Runs the same training command on every worker of a Cloud TPU pod slice.
set -euo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; shift 2
cmd="cd ~/rlrag_jax && python3 -m pip install -q -e '.[tpu]' && \
python3 -m rlrag_jax.train --config=configs/arena.py:paper --config.distributed.initialize=True $*"
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$cmd"
