#!/usr/bin/env bash
# make gpu-all: everything a GPU server can tell us, in one command sized for
# a 10-minute window (the device tool's): first the whole platform with GPU
# IFs (scripts/gpu-platform.sh: switchovers under load, then the tuning
# loop from wrong shares), then the GPU path's checks and measurements
# (scripts/gpu-check.sh: gather, every model on the cudnn engine against the
# CPU reference and ONNX Runtime, PyTorch eager, the knee sweep). Each part
# runs under its own time limit (SIGINT at the end of it: what it wrote so
# far stays), the MPS control daemon is stopped between them, and the
# results without the models are packed into OUT/results.tgz, beside the
# two logs and machine.txt: four files in OUT (the device tool brings back
# at most 8), everything else in the work folder.
#
# Needs what the two scripts need: build/gpu/ (`make gpu-bundle`),
# build/gpu-platform.tar.xz (`make gpu-platform-bundle`) and build/wheels/.
#
# Env: GPU_ALL_OUT (build/gpu-all), GPU_ALL_WORK (the parts' folders,
# models included: /tmp/kneepoint-gpu-all), PLATFORM_LIMIT (240 s),
# CHECK_LIMIT (320 s), GPU_ALL_PARTS ("platform check"); the two scripts'
# own settings pass through (SWITCHOVERS, SCENARIOS, CONV_DURATION,
# KNEE_PCTS, ...), with shorter defaults here: SWITCHOVERS 10, CONV_DURATION
# 60, KNEE_PCTS "10 20 30 50 70 100", and SCENARIOS "too-large custom" where
# custom is if 1 (squeezenet) at 10% with SLO 10 ms under 1,500 req/s: more
# than the 10% share serves at batch 1 on an H200 (1,243/s measured), less
# than 30% does (2,062/s), so the loop must raise it towards its knee; if 5
# (shufflenet) at 50%, SLO 50 ms, 100 req/s. The whole fits the device
# tool's 10-minute command with ~40 s to spare. Exit status: 0 both passed,
# 2 no GPU here (at once), 1 otherwise.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${GPU_ALL_OUT:-$repo/build/gpu-all}
say() { printf 'gpu-all: %s\n' "$*" >&2; }
if [[ ! -e /dev/nvidiactl || ! -e /dev/nvidia0 ]]; then
  say "no GPU here (no /dev/nvidiactl, /dev/nvidia0): nothing was run"
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_ALL_WORK:-/tmp/kneepoint-gpu-all}
mkdir -p "$work"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; uname -r; nproc
  git -C "$repo" rev-parse HEAD 2>/dev/null; } >"$out/machine.txt" 2>&1
status=0
for part in ${GPU_ALL_PARTS:-platform check}; do
  t0=$SECONDS
  case $part in
    platform)
      GPU_PLATFORM_OUT="$work/platform" SWITCHOVERS=${SWITCHOVERS:-10} \
        SCENARIOS=${SCENARIOS:-too-large custom} CONV_DURATION=${CONV_DURATION:-60} \
        SHARE1=${SHARE1:-10} SLO1=${SLO1:-10} RATE1=${RATE1:-1500} \
        SHARE5=${SHARE5:-50} SLO5=${SLO5:-50} RATE5=${RATE5:-100} \
        timeout -s INT "${PLATFORM_LIMIT:-240}" "$repo/scripts/gpu-platform.sh" >"$out/platform.log" 2>&1
      rc=$?
      # The next part's processes must not be MPS clients of this one's daemon.
      echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
      ;;
    check)
      GPU_CHECK_OUT="$work/check" KNEE_PCTS=${KNEE_PCTS:-10 20 30 50 70 100} \
        timeout -s INT "${CHECK_LIMIT:-320}" "$repo/scripts/gpu-check.sh" >"$out/check.log" 2>&1
      rc=$?
      ;;
    *) say "unknown part $part (platform, check)"; exit 2 ;;
  esac
  say "$part: exit $rc after $((SECONDS - t0)) s ($out/$part.log)"
  ((rc == 0)) || status=1
done
tar -C "$work" -czf "$out/results.tgz" --exclude='*.onnx' --exclude='*.f32' --exclude='*.u8' \
  --exclude='*.png' --exclude='*.pcap' . 2>/dev/null
say "results: $out/results.tgz ($(du -h "$out/results.tgz" | cut -f1)); everything in $work"
exit "$status"
