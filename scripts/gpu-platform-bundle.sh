#!/usr/bin/env bash
# make gpu-platform-bundle: the whole platform, packed to run on a GPU server
# that has no DPDK, no cargo and no network (docs/GPU.md, "The platform on a
# GPU server").
#
# Writes build/gpu-platform.tar.xz holding gpu-platform/:
#   bin/   the stripped orchestrator, kpctl, if-manager, kp-if, kp-engine-bench (the engine alone, for the e2e phase), kp-client,
#          jq (scripts/bench-orchestrator.sh reads JSON with it) and
#          iproute2's ip (scripts/netns.sh);
#   lib/   every shared library they need that is not the C and C++ runtime
#          (the server's glibc and libstdc++ are newer than Debian 12's, so
#          they are taken from there): DPDK's librte_*, libnuma, libjq ...;
#   pmds/  the DPDK driver plugins the platform loads: the mempool's ring
#          ops and net_af_packet (the if-manager's NIC on a veth pair),
#          named by `-d` in the if-manager's EAL arguments (the orchestrator
#          passes the same to its IFs).
# scripts/gpu-platform.sh unpacks and runs it there. Compressed, because the
# device tool carries at most 64 MiB per command.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
out="$repo/build/gpu-platform"
pmd_dir=$(find /usr/lib/x86_64-linux-gnu/dpdk -maxdepth 1 -type d -name 'pmds-*' | sort | tail -1)
[[ -n $pmd_dir ]] || { echo "gpu-platform-bundle: no DPDK driver folder (run 'make setup')" >&2; exit 1; }
for t in jq ip; do
  command -v $t >/dev/null || { echo "gpu-platform-bundle: $t is missing (run 'make setup')" >&2; exit 1; }
done

rm -rf "$out" "$out.tar.xz"
mkdir -p "$out/bin" "$out/lib" "$out/pmds"
for b in orchestrator kpctl if-manager kp-if kp-engine-bench kp-client; do
  [[ -x $bin/$b ]] || { echo "gpu-platform-bundle: no $bin/$b (run 'make build')" >&2; exit 1; }
  cp "$bin/$b" "$out/bin/"
done
cp "$(command -v jq)" "$out/bin/"
# iproute2's ip: scripts/netns.sh builds the namespaces and the veth pair
# with it, and a CUDA image need not have it (the GPU machine we test on
# has none).
cp "$(command -v ip)" "$out/bin/"
strip "$out"/bin/*
# As `name.so`: the EAL loads from a `-d` folder only files ending in
# `.so` or `.so.<ABI>` (23.0), not the soname's `.so.23`.
for d in librte_mempool_ring librte_net_af_packet; do
  [[ -e $pmd_dir/$d.so ]] || { echo "gpu-platform-bundle: no $d in $pmd_dir" >&2; exit 1; }
  cp -L "$pmd_dir/$d.so" "$out/pmds/$d.so"
done

# The libraries: the closure of what the binaries and plugins link, minus
# the C/C++ runtime the server has newer.
base='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+)\.'
for f in "$out"/bin/* "$out"/pmds/*; do
  ldd "$f" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $base ]] && continue
  cp -L "$path" "$out/lib/$name"
done

# What it was built from, for the record of a run.
{
  echo "commit $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  git -C "$repo" diff --quiet 2>/dev/null && echo "tree clean" || echo "tree dirty"
  echo "dpdk $(basename "$pmd_dir")"
  echo "built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
} >"$out/BUILD"
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
echo "gpu-platform-bundle: $out.tar.xz ($(du -h "$out.tar.xz" | cut -f1); $(ls "$out/lib" | wc -l) libraries, $(ls "$out/pmds" | wc -l) driver plugins)"
