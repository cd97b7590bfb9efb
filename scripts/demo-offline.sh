#!/usr/bin/env bash
# `make demo-offline`: two real models answering generated image traffic,
# offline and exactly: no orchestrator, no network, counters checked.
# (`make demo`, scripts/demo.sh, is the whole platform live on a veth pair.)
#
# kp-gen writes a pcap of 224x224 RGB image requests for squeezenet
# (if_id 1) and resnet50 (if_id 2), plus some for an if_id nobody serves (9),
# with faults mixed in (malformed datagrams of every kind, duplicates, a
# missing fragment, a disagreeing one). scripts/run-pcap.sh replays it
# through the if-manager (DPDK net_pcap) into two inference functions
# (ONNX Runtime), collects every answer in out.pcap, and the demo prints a
# table per IF and the data plane's counters next to what the generator's
# manifest says they must be.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
out="$repo/build/demo-offline"
rm -rf "$out"; mkdir -p "$out"

echo "== generating traffic (kp-gen)"
"$bin/kp-gen" --out "$out/in.pcap" --manifest "$out/manifest.json" \
  --requests 60 --if-mix 1:4,2:1,9:1 --deployed 1,2 --input synthetic \
  --interleave 4 --src-ports 40000-40003 --malformed-each 1 --dup-count 20 \
  --missing-count 1 --disagree-count 1 --seed 7

echo "== replaying it through the if-manager into squeezenet and resnet50 (run-pcap.sh)"
KP_OUT_DIR="$out/run" "$repo/scripts/run-pcap.sh" "$out/in.pcap" "$out/out.pcap" squeezenet resnet50 \
  > "$out/report.json"
cp "$out/run/if-manager.json" "$out/stats.json"

"$repo/.venv/bin/python" "$repo/scripts/show_stats.py" "$out/stats.json" "$out/manifest.json" --ifs "$out/report.json"
echo "files: $out/{in.pcap,out.pcap,manifest.json,report.json}"
