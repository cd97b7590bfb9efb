#!/usr/bin/env bash
# make gpu-check: kneepoint's GPU path on a machine with a GPU (docs/GPU.md).
#
# Runs kp-gpu-check from the bundle `make gpu-bundle` made (build/gpu/: the
# stripped binary and this script) and builds nothing, so it runs on a GPU
# server without cargo, DPDK or network. Finds the CUDA libraries of the
# nvidia-* pip wheels (nvidia-cuda-nvrtc, nvidia-cublas, nvidia-cudnn-cu13)
# under python3's site-packages, then the system's; libcuda comes from the
# driver. Exit status: kp-gpu-check's (0 passed, 1 a check failed, 2 no GPU
# path on this machine). GPU_CHECK_OUT: where the CSV goes
# (build/gpu-check).
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
exec "$bin" --out "$out" "$@"
