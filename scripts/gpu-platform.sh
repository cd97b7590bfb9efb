#!/usr/bin/env bash
# make gpu-platform: the whole platform on a GPU server, with GPU IFs —
# scripts/bench-orchestrator.sh (its PHASES, by default switchover gaps
# under load, the tuning loop's convergence from wrong shares, then
# switchovers as clients see them) with both IFs on the
# `cudnn` engine, each under its CUDA MPS percentage (docs/GPU.md, "The
# platform on a GPU server").
#
# Runs from a checkout that carries build/gpu-platform.tar.xz (`make
# gpu-platform-bundle` on the build machine: the stripped binaries, DPDK's
# libraries and the two driver plugins the platform loads, jq, iproute2's
# ip), and builds nothing, so the server needs no cargo, DPDK, apt or
# network: root, a kernel with network namespaces and veth, python3 with onnx,
# onnxruntime and numpy (to prepare the two models, from build/wheels/'s
# labels wheel), an NVIDIA driver and the CUDA 13 libraries (the nvidia-*
# pip wheels under python3's site-packages, as scripts/gpu-check.sh finds
# them); nvidia-cuda-mps-control for shares that bite.
#
# Steps: without a GPU say so and exit 2 at once; unpack the bundle; copy
# its driver plugins to a folder the EAL accepts (it refuses plugin folders
# under a world-writable path such as /tmp); reserve HUGEPAGES 2 MiB pages;
# prepare the two models (MODEL1, MODEL5: squeezenet and shufflenet) into
# $OUT/models with engine "cudnn";
# start the MPS control daemon (the orchestrator would too); run
# bench-orchestrator.sh with BIN, MODELS, OUT and EAL_EXTRA pointing at all
# that. Its own settings pass through (PHASES, SWITCHOVERS, SCENARIOS,
# CONV_DURATION, SHARE1 ... see there); shorter defaults here, for the
# device tool's 10-minute commands: SWITCHOVERS 20, CONV_DURATION 90 s,
# CPUS 0-7.
#
# Env: GPU_PLATFORM_OUT (build/gpu-platform-run), GPU_PLATFORM_MODELS (a
# prepared repository instead), GPU_PLATFORM_ENGINE (cudnn; onnxruntime
# runs the same bundle on a machine without a GPU, which is how it is
# tested on the build machine), HUGEPAGES (2048), PMDS_DIR
# (/run/kneepoint-pmds). Exit status: bench-orchestrator.sh's; 2 when this
# machine has no GPU (for a GPU engine) or no bundle.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "${GPU_PLATFORM_OUT:-$repo/build/gpu-platform-run}" && cd "${GPU_PLATFORM_OUT:-$repo/build/gpu-platform-run}" && pwd)
say() { printf 'gpu-platform: %s\n' "$*" >&2; }

engine=${GPU_PLATFORM_ENGINE:-cudnn}
model1=${MODEL1:-squeezenet}
model5=${MODEL5:-shufflenet}
export MODEL1=$model1 MODEL5=$model5
if [[ $engine != onnxruntime && ( ! -e /dev/nvidiactl || ! -e /dev/nvidia0 ) ]]; then
  say "no GPU here (no /dev/nvidiactl, /dev/nvidia0): nothing was run"
  exit 2
fi
((EUID == 0)) || { say "must run as root (namespaces, hugepages, DPDK)"; exit 2; }
bundle="$repo/build/gpu-platform"
if [[ ! -x $bundle/bin/orchestrator ]]; then
  [[ -f $bundle.tar.xz ]] || { say "no $bundle.tar.xz: run 'make gpu-platform-bundle' on a build machine and carry it"; exit 2; }
  tar -C "$repo/build" -xJf "$bundle.tar.xz"
fi
say "bundle: $(tr '\n' ' ' <"$bundle/BUILD")"

pmds=${PMDS_DIR:-/run/kneepoint-pmds}
install -d -m 0755 "$pmds"
install -m 0644 "$bundle"/pmds/*.so "$pmds/"

libs="$bundle/lib"
site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
if [[ -n $site && -d $site/nvidia ]]; then
  libs="$libs:$(find "$site/nvidia" -maxdepth 3 -type d -name lib | sort | paste -sd:)"
  say "CUDA libraries from the pip wheels under $site/nvidia"
fi
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$bundle/bin:$PATH"

want=${HUGEPAGES:-2048}
nr=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
if (($(cat "$nr") < want)); then echo "$want" >"$nr"; fi
say "hugepages: $(cat "$nr") of 2 MiB"
if ! grep -q ' hugetlbfs ' /proc/mounts; then
  mkdir -p /dev/hugepages
  mount -t hugetlbfs nodev /dev/hugepages
fi

models=${GPU_PLATFORM_MODELS:-}
if [[ -z $models ]]; then
  models="$out/models"
  if [[ ! -f $models/$model1/config.toml || ! -f $models/$model5/config.toml ]]; then
    say "preparing $model1 and $model5 in $models (scripts/prepare_models.py)"
    python3 "$repo/scripts/prepare_models.py" --out "$models" --photos "$out/photos" \
      --cal-threads "$(nproc)" --only "$model1,$model5" >&2
  fi
  # Both IFs on the GPU.
  sed -i "s/^engine = .*/engine = \"$engine\"/" "$models/$model1/config.toml" "$models/$model5/config.toml"
fi

if [[ $engine == onnxruntime ]]; then
  say "engine onnxruntime: the IFs run on CPU cores"
elif command -v nvidia-cuda-mps-control >/dev/null; then
  echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 || nvidia-cuda-mps-control -d
  say "CUDA MPS control daemon running: shares are MPS percentages that bite"
else
  say "no nvidia-cuda-mps-control: shares are not enforced on the GPU"
fi

export BIN="$bundle/bin" MODELS="$models" OUT="$out/bench" EAL_EXTRA="-d $pmds"
export SWITCHOVERS=${SWITCHOVERS:-20} CONV_DURATION=${CONV_DURATION:-90} CPUS=${CPUS:-0-7}
exec "$repo/scripts/bench-orchestrator.sh"
