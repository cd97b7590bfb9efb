#!/usr/bin/env bash
# `make demo`: the data plane on generated traffic, offline.
#
# kp-gen writes a pcap of image requests for two registered inference
# functions (if_id 1 and 2), for one that does not exist (9), with faults
# mixed in (malformed datagrams of every kind, duplicates, missing
# fragments). The if-manager replays it through DPDK's net_pcap device,
# routes every fragment to its IF's ring, answers the unknown IF's requests
# with UNKNOWN_IF errors (into out.pcap) and exits when idle. The demo then
# prints every outcome counter next to what the generator's manifest says
# it must be.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
out="$repo/build/demo"
mkdir -p "$out"
prefix="kp-demo-$$"

echo "== generating traffic (kp-gen)"
"$bin/kp-gen" --out "$out/in.pcap" --manifest "$out/manifest.json" \
  --requests 40 --if-mix 1:2,2:1,9:1 --deployed 1,2 --input synthetic \
  --interleave 4 --malformed-each 2 --dup-count 20 --missing-count 3 --seed 7

echo "== running the if-manager on net_pcap"
"$bin/if-manager" --if 1 --if 2 --ring-size 8192 --exit-when-idle 1 \
  --stats-json "$out/stats.json" -- \
  --lcores 0@0 --file-prefix "$prefix" --no-pci --no-telemetry --log-level lib.eal:error \
  --vdev "net_pcap0,rx_pcap=$out/in.pcap,tx_pcap=$out/out.pcap" >/dev/null

"$repo/.venv/bin/python" "$repo/scripts/show_stats.py" "$out/stats.json" "$out/manifest.json"
echo "files: $out/{in.pcap,out.pcap,manifest.json,stats.json}"
