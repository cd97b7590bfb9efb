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
# models included: /tmp/kneepoint-gpu-all), PLATFORM_LIMIT (400 s),
# CHECK_LIMIT (150 s), GPU_ALL_PARTS ("platform check"); the two scripts'
# own settings pass through, with defaults here for what the runs so far
# left open (docs/PERFORMANCE.md, "The GPU path on an NVIDIA H200"):
# - the platform with if 1 resnet50 and if 5 vgg19 (MODEL1, MODEL5: models
#   the GPU bounds at a few hundred images/s, so the packet path is not the
#   limit), PHASES "e2e convergence switchover impact", in that order of
#   importance (the time limit cuts the last): end to end against the
#   engine alone at E2E_SHARE 20%; SCENARIOS "custom", if 1 from 10% with
#   SLO 10 ms under 600 req/s (beyond what 10-30% serve, docs' knee table;
#   its knee is 50-80% at batches 1-4) and if 5 from 90% with SLO 50 ms
#   under 100 req/s (needing far less than its knee), CONV_DURATION 90,
#   WORK_CONSERVING false (each IF's share is its demand: what the loop
#   decides, not a split of leftovers, which hid it in run 3);
#   SWITCHOVERS 10; IMPACT_LOADS 0.5 with IMPACT_SWITCHOVERS 20;
# - the check on squeezenet alone, no baselines and no knee sweep (a
#   short regression run of the gather and the engine at this commit:
#   GPU_CHECK_ONLY, GPU_CHECK_BASELINES, GPU_CHECK_KNEE; KNEE_PCTS when
#   the sweep is on).
# The whole fits the device tool's 10-minute command with ~40 s to spare.
# Exit status: 0 both passed, 2 no GPU here (at once), 1 otherwise.
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
        MODEL1=${MODEL1:-resnet50} MODEL5=${MODEL5:-vgg19} \
        PHASES=${PHASES:-e2e convergence switchover impact} E2E_SHARE=${E2E_SHARE:-20} \
        SCENARIOS=${SCENARIOS:-custom} CONV_DURATION=${CONV_DURATION:-90} \
        SHARE1=${SHARE1:-10} SLO1=${SLO1:-10} RATE1=${RATE1:-600} \
        SHARE5=${SHARE5:-90} SLO5=${SLO5:-50} RATE5=${RATE5:-100} \
        IMPACT_LOADS=${IMPACT_LOADS:-0.5} IMPACT_SWITCHOVERS=${IMPACT_SWITCHOVERS:-20} \
        WORK_CONSERVING=${WORK_CONSERVING:-false} \
        timeout -s INT "${PLATFORM_LIMIT:-400}" "$repo/scripts/gpu-platform.sh" >"$out/platform.log" 2>&1
      rc=$?
      # The next part's processes must not be MPS clients of this one's daemon.
      echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
      ;;
    check)
      GPU_CHECK_OUT="$work/check" GPU_CHECK_ONLY=${GPU_CHECK_ONLY-squeezenet} \
        GPU_CHECK_BASELINES=${GPU_CHECK_BASELINES:-0} GPU_CHECK_KNEE=${GPU_CHECK_KNEE:-0} \
        KNEE_PCTS=${KNEE_PCTS:-10 20 30 40 50 60 70 80 90 100} \
        timeout -s INT "${CHECK_LIMIT:-150}" "$repo/scripts/gpu-check.sh" >"$out/check.log" 2>&1
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
