#!/usr/bin/env bash
# The knee sweep (issue 11, item 7; docs/GPU.md): GSLICE's knee curves, the
# cudnn engine's throughput and p99 against the CUDA MPS percentage, on a
# machine with a GPU and CUDA MPS. One kp-gpu-check process per percentage
# (MPS fixes a client's share when it connects), each timing every batch
# size of every model in KNEE_MODELS, appending to OUT/knee.csv; then
# scripts/knee.py finds each model's knee.
#
#   scripts/gpu-knee.sh KP_GPU_CHECK MODELS_DIR OUT
#
# Env: KNEE_MODELS (squeezenet,resnet50,vgg19: a small, a medium and a
# large one), KNEE_PCTS (10 20 ... 100), KNEE_REPS (20 runs per batch
# size), KNEE_MAX_BATCH (32). Uses the MPS control daemon if one runs,
# else starts one (`nvidia-cuda-mps-control -d`, root) and stops it at the
# end. Exit status: 0 done, 1 a point failed, 2 no MPS here (nothing run).
set -euo pipefail
bin=$1 models=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  echo "gpu-knee: no nvidia-cuda-mps-control here: no knee sweep (MPS percentages cannot be set)" >&2
  exit 2
fi
mkdir -p "$out"
started=
if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
  nvidia-cuda-mps-control -d
  started=1
  trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true' EXIT
  sleep 1
fi
echo "gpu-knee: MPS control daemon $([[ -n $started ]] && echo started || echo already running)" >&2
rm -f "$out/knee.csv"
t0=$SECONDS
for pct in ${KNEE_PCTS:-10 20 30 40 50 60 70 80 90 100}; do
  if ! CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct "$bin" --knee --models "$models" \
    --only "${KNEE_MODELS:-squeezenet,resnet50,vgg19}" --out "$out" \
    --reps "${KNEE_REPS:-20}" --max-batch "${KNEE_MAX_BATCH:-32}"; then
    echo "gpu-knee: the point at MPS $pct% failed" >&2
    exit 1
  fi
done
echo "gpu-knee: sweep done in $((SECONDS - t0)) s" >&2
python3 "$here/knee.py" "$out/knee.csv" --plot "$out/knee.svg"
