#!/usr/bin/env bash
# make gpu-check: kneepoint's GPU path on a machine with a GPU (docs/GPU.md).
#
# Runs kp-gpu-check from the bundle `make gpu-bundle` made (build/gpu/: the
# stripped binary and this script) and builds nothing, so it runs on a GPU
# server without cargo, DPDK or network. Finds the CUDA libraries of the
# nvidia-* pip wheels (nvidia-cuda-nvrtc, nvidia-cublas, nvidia-cudnn-cu13)
# under python3's site-packages, then the system's; libcuda comes from the
# driver.
#
# The cudnn engine is checked on a model repository: GPU_CHECK_MODELS if
# set, else one prepared here into $out/models by scripts/prepare_models.py
# (when run from a checkout, with python3 having onnx, onnxruntime and
# numpy; the pinned wheels it needs for labels and the trained model must
# be in build/wheels/, since nothing is downloaded here: carry them).
# GPU_CHECK_ONLY limits the models (comma-separated names); GPU_CHECK_EAGER=1
# also times every model with its steps enqueued one by one (graphs off). After
# kp-gpu-check, scripts/gpu_check_ort.py holds the engine's outputs against
# this machine's own onnxruntime, and scripts/gpu_torch_eager.py times the
# same models in PyTorch eager (when python3 has torch) for the comparison;
# last, when the machine has CUDA MPS, scripts/gpu-knee.sh sweeps the MPS
# percentage for a small, a medium and a large model (the knee).
# GPU_CHECK_BASELINES=0 skips the two baselines (ONNX Runtime, PyTorch):
# for a short run that measures the gather and the knee only.
#
# Exit status: 0 passed, 1 a check failed, 2 no GPU path on this machine.
# GPU_CHECK_OUT: where the CSVs go (build/gpu-check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${GPU_CHECK_OUT:-build/gpu-check}
bin=
for b in "$here/kp-gpu-check" "$here/../build/gpu/kp-gpu-check" "$here/../target/release/kp-gpu-check"; do
  if [[ -x $b ]]; then bin=$b; break; fi
done
if [[ -z $bin ]]; then
  echo "gpu-check: no kp-gpu-check binary: run 'make gpu-bundle' on a build machine and bring build/gpu/ here" >&2
  exit 2
fi
if command -v python3 >/dev/null 2>&1; then
  site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
  if [[ -n $site && -d $site/nvidia ]]; then
    dirs=$(find "$site/nvidia" -maxdepth 3 -type d -name lib | sort | tr '\n' ':')
    export LD_LIBRARY_PATH="${dirs}${LD_LIBRARY_PATH:-}"
    echo "gpu-check: CUDA libraries from the pip wheels under $site/nvidia" >&2
  fi
fi

# Without a GPU path, say so at once (before any model is prepared).
set +e
"$bin" --out "$out" --reps 1 --max-batch 1 >/dev/null 2>"$out.probe.err" </dev/null
probe=$?
set -e
if [[ $probe == 2 ]]; then
  cat "$out.probe.err" >&2
  rm -f "$out.probe.err"
  exit 2
fi
rm -f "$out.probe.err"

# The repository to check the engine on.
repo=
for r in "$here/.." "$here/../.."; do
  if [[ -f $r/scripts/prepare_models.py && -f $r/configs/models.toml ]]; then repo=$(cd "$r" && pwd); break; fi
done
models=${GPU_CHECK_MODELS:-}
if [[ -z $models && -n $repo ]] && python3 -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
  models="$out/models"
  mkdir -p "$models"
  t0=$SECONDS
  echo "gpu-check: preparing the model repository in $models (scripts/prepare_models.py)" >&2
  python3 "$repo/scripts/prepare_models.py" --out "$models" --photos "$out/photos" \
    --cal-threads "$(nproc)" ${GPU_CHECK_ONLY:+--only "$GPU_CHECK_ONLY"} >&2
  echo "gpu-check: models ready in $((SECONDS - t0)) s" >&2
fi
if [[ -z $models ]]; then
  echo "gpu-check: no model repository (set GPU_CHECK_MODELS, or run from a checkout with python3 onnx + onnxruntime): the engine is not checked" >&2
  exec "$bin" --out "$out" "$@"
fi
# A failed check does not stop the steps after it (the machine's own
# ONNX Runtime, the eager baseline, the knee): a run on a GPU says all
# that fails and all it measures; the exit status says it failed.
set +e
eager=()
[[ ${GPU_CHECK_EAGER:-0} == 1 ]] && eager=(--compare-eager)
"$bin" --out "$out" --models "$models" "${eager[@]}" "$@"
status=$?
set -e
if ((status == 2)); then exit 2; fi
baselines=${GPU_CHECK_BASELINES:-1}
if [[ $baselines != 1 ]]; then
  echo "gpu-check: GPU_CHECK_BASELINES=$baselines: no ONNX Runtime or PyTorch baseline this run" >&2
elif python3 -c 'import onnxruntime' 2>/dev/null; then
  python3 "${repo:-$here/..}/scripts/gpu_check_ort.py" "$models" "$out" || status=1
else
  echo "gpu-check: no onnxruntime for python3 here: the engine was checked against the CPU reference only" >&2
fi
# The baseline: the same models in PyTorch eager on this GPU, timed the
# same way, and the cudnn engine's latency against it (cudnn_vs_torch.csv).
if [[ $baselines != 1 ]]; then
  :
elif python3 -c 'import torch, onnx, numpy' 2>/dev/null; then
  python3 "${repo:-$here/..}/scripts/gpu_torch_eager.py" "$models" "$out" --reps 50 --max-batch 32 \
    ${GPU_CHECK_ONLY:+--only "$GPU_CHECK_ONLY"} || status=1
else
  echo "gpu-check: no PyTorch (with onnx and numpy) for python3 here: no eager baseline" >&2
fi
# The knee sweep, when this machine has CUDA MPS (GPU_CHECK_KNEE=0 skips it).
if [[ ${GPU_CHECK_KNEE:-1} == 1 ]]; then
  set +e
  "${repo:-$here/..}/scripts/gpu-knee.sh" "$bin" "$models" "$out"
  rc=$?
  set -e
  if [[ $rc == 1 ]]; then status=1; fi
fi
if ((status != 0)); then
  echo "gpu-check: FAILED (see above)" >&2
fi
exit "$status"
