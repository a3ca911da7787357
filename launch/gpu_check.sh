#!/usr/bin/env bash
# The GPU check in one command, for a lent GPU session (issue 54): under 8 minutes, everything
# under one output folder.
#
#   bash launch/gpu_check.sh [--out DIR] [--dry-run] [--reduced]
#   bash launch/gpu_check.sh --fetch-wheels     # here, beforehand: wheels the GPU image lacks
#
#   1. env.txt       device, driver and CUDA (nvidia-smi), jax / jaxlib / plugin versions
#                    (jax.print_environment_info), python, the commit
#   2. install       the Python modules the runs import and the machine lacks: from the wheels
#                    in .whl/ (--fetch-wheels puts them there; carry .whl with the tree) when it
#                    exists, else pip; into $OUT/site, added to PYTHONPATH (nothing system-wide)
#   3. accelerator/  python -m rlrag_jax.bench.accelerator --budget-s $ACCEL_BUDGET_S (250):
#                    device, update (xla and pallas), sampler (xla and pallas), a record per
#                    section as it ends (the main job and the memory plan are left out: step 4
#                    runs the main job's GPU preset, and bench.memory --gpu has the plan)
#   4. arena_seed0/  seed 0 of configs/arena.py:gpu, killed after $ARENA_LIMIT_S (180) seconds
#   5. summary.txt   each step's exit status and seconds
#
# A step that fails is recorded and the next one runs. --dry-run prints the commands and runs
# none; --reduced runs every step at CPU size (the accelerator's device and sampler sections
# --reduced, the CPU default shrunk by overrides): tests/bench/test_gpu_check.py runs both.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="" DRY=0 REDUCED=0 FETCH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --reduced) REDUCED=1; shift ;;
    --fetch-wheels) FETCH=1; shift ;;
    *) echo "gpu_check.sh: unknown argument '$1' (--out DIR, --dry-run, --reduced, --fetch-wheels)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-results/gpu_check_$(date -u +%Y%m%dT%H%M%SZ)}
ACCEL_BUDGET_S=${ACCEL_BUDGET_S:-250}
ARENA_LIMIT_S=${ARENA_LIMIT_S:-180}
PY=${PYTHON:-python3}
# import name=distribution of what `rlrag_jax.train` (configs/arena.py) and the bench import;
# the GPU image has jax with its CUDA plugin, flax, optax, orbax, torch and transformers.
# (Seen in a CPU run of the main job; of these the image lacks ml-collections and tensorboardX.)
NEEDED="ml_collections=ml-collections tensorboardX=tensorboardX absl=absl-py flax=flax optax=optax orbax.checkpoint=orbax-checkpoint einops=einops tokenizers=tokenizers safetensors=safetensors yaml=pyyaml tqdm=tqdm transformers=transformers"

if [ "$FETCH" = 1 ]; then
  # The GPU machine reaches no registry: wheels for its Python (3.12) travel with the tree.
  mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  for dist in ml-collections tensorboardX; do
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux2014_x86_64 -d .whl "$dist" || exit 1
  done
  ls -l .whl
  exit 0
fi

run() {  # run NAME LIMIT_S CMD...: one step, its output in $OUT/NAME.log, its status recorded
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit} s): $*"
  if [ "$DRY" = 1 ]; then echo "$name dry-run" >> "$OUT/summary.txt"; return 0; fi
  local t0=$SECONDS rc
  if declare -F "$1" > /dev/null; then "$@" > "$OUT/$name.log" 2>&1; rc=$?     # a step here
  else timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?; fi
  tail -n 25 "$OUT/$name.log"
  echo "$name exit $rc$([ $rc = 124 ] && echo ' (timeout)') in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

missing() {  # the distributions of NEEDED that do not import
  $PY - $NEEDED <<'EOF'
import importlib, sys
for pair in sys.argv[1:]:
  mod, dist = pair.split("=")
  try:
    importlib.import_module(mod)
  except Exception:
    print(dist)
EOF
}

install() {
  local dists
  dists=$(missing | tr '\n' ' ')
  echo "missing: ${dists:-none}"
  [ -z "$dists" ] && return 0
  if [ -d .whl ]; then
    $PY -m pip install -q --no-index --no-deps --find-links .whl --target "$OUT/site" $dists
  else
    $PY -m pip install -q --target "$OUT/site" $dists
  fi
}

env_info() {
  date -u; echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes')"
  nvidia-smi 2>&1 | head -15 || echo "no nvidia-smi"
  $PY -c "import sys; print('python', sys.version)"
  $PY -c "import jax; jax.print_environment_info(); print('devices', jax.devices())"
  $PY - <<'EOF'
try:                                   # the CUDA jaxlib runs on (absent on a CPU-only jaxlib)
  from jax._src.lib import cuda_versions as v
  print("cuda runtime", v.cuda_runtime_get_version(), "driver", v.cuda_driver_get_version(),
        "cudnn", v.cudnn_get_version())
except Exception as e:
  print("cuda versions: n/a", type(e).__name__, e)
EOF
  $PY -m pip list 2>/dev/null | grep -i -E \
    "^(jax|jaxlib|jax-cuda[0-9]+-(plugin|pjrt)|nvidia-cuda-[a-z]+|nvidia-cudnn-cu[0-9]+|torch|triton|flax) "
}

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: > "$OUT/summary.txt"
export PYTHONPATH="$OUT/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ACCEL=(--budget-s "$ACCEL_BUDGET_S" --sections update,sampler --out "$OUT/accelerator")
ARENA=(--config=configs/arena.py:gpu --config.seed=0 --workdir="$OUT/arena_seed0")
if [ "$REDUCED" = 1 ]; then
  ACCEL=(--budget-s "$ACCEL_BUDGET_S" --sections sampler --reduced --out "$OUT/accelerator")
  ARENA=(--config=configs/arena.py --config.seed=0 --workdir="$OUT/arena_seed0" --quiet
         $($PY -c "from rlrag_jax.bench import accelerator as a; print(' '.join(a.REDUCED_MAIN_ARGS))"))
fi
run env 60 env_info
run install 120 install
run accelerator $((ACCEL_BUDGET_S + 30)) $PY -m rlrag_jax.bench.accelerator "${ACCEL[@]}"
run arena_seed0 "$ARENA_LIMIT_S" $PY -m rlrag_jax.train "${ARENA[@]}"
echo "== done: $OUT"
cat "$OUT/summary.txt"
