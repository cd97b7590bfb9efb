#!/usr/bin/env bash
# `make demo`: the whole platform, live, on a veth pair, in about a minute.
#
#   1. scripts/netns.sh makes a client and a platform network namespace
#      joined by a veth pair;
#   2. the orchestrator (config: configs/demo.toml.in, filled in) starts the
#      if-manager (DPDK, net_af_packet on the platform end, inside the
#      platform namespace) and two inference functions, squeezenet (if 1)
#      and shufflenet (if 5), each with a parked shadow; the self-tuning
#      loop runs, with if 5's share pinned (KP_DEMO_PIN below);
#   3. kp-gen writes image requests for both, addressed to the platform
#      end's IP and MAC from the client end's, and tcpreplay sends them from
#      the client namespace for ~36 s while tcpdump captures the answers
#      there;
#   4. halfway, `kpctl slo 1 50` changes if 1's SLO live: the orchestrator
#      re-provisions it through a shadow;
#   5. at the end: the `kpctl status` table; then real photos:
#      `kpctl deploy` starts a third IF live, efficientnet_lite0 (if 10,
#      trained ImageNet weights), and kp-client --image sends each photo of
#      build/photos/ (from `make models`) from the client namespace and
#      prints its top-5 class names; `kpctl shutdown`, the switchover gaps
#      from the orchestrator's summary, and the captured answers (tcpdump
#      stops before the photos) checked against kp-gen's manifest
#      (scripts/check_answers.py): every request sent got exactly one
#      answer, or the demo fails.
#
# Everything it starts (namespaces, processes, DPDK files) is removed on
# exit, also on failure or Ctrl-C. Its files stay in build/demo/. Needs root,
# a build (make build), the three models and the photos (make models).
#
# Env: KP_DEMO_SECONDS (traffic, default 36), KP_DEMO_RPS (requests/s, both
# IFs together, default 30), KP_DEMO_SLO_MS (if 1's new SLO, default 50),
# KP_DEMO_TUNING (true|false, default true), KP_DEMO_HOLD_DOWN_S (tuning
# hold-down, default 10), KP_DEMO_PIN (true|false, default true: pin if 5;
# false: the tuning loop moves both shares, re-provisioning both IFs at
# once), KP_DEMO_KEEP (true|false, default false: true keeps the platform
# up after the photos, printing what to try against it from another
# terminal, until Enter is pressed), PROFILE (release).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
out="$repo/build/demo"
py="$repo/.venv/bin/python"
report="$repo/scripts/demo_report.py"

seconds=${KP_DEMO_SECONDS:-36}
rps=${KP_DEMO_RPS:-30}
new_slo=${KP_DEMO_SLO_MS:-50}
tuning=${KP_DEMO_TUNING:-true}
hold_down=${KP_DEMO_HOLD_DOWN_S:-10}
pin=${KP_DEMO_PIN:-true}
keep=${KP_DEMO_KEEP:-false}
frag_size=1400          # payload per fragment: 1460-byte datagrams, under the veth's MTU
net="kpd$$"             # namespaces kpdPID-c / kpdPID-p (netns.sh: at most 12 characters)
prefix="kpdemo-$$"      # the platform's DPDK --file-prefix

die() { printf 'demo: %s\n' "$*" >&2; exit 1; }
say() { printf '\n== %s\n' "$*"; }
indent() { sed -u 's/^/   /'; }

((EUID == 0)) || die "must run as root (network namespaces, DPDK, tcpdump); try: sudo make demo"
for b in orchestrator kpctl if-manager kp-if kp-gen kp-client; do
  [[ -x "$bin/$b" ]] || die "$bin/$b is missing: run 'make build'"
done
for m in squeezenet shufflenet efficientnet_lite0; do
  [[ -f "$repo/models/$m/config.toml" ]] || die "models/$m is missing: run 'make models'"
done
shopt -s nullglob
photos=("$repo"/build/photos/*.png "$repo"/build/photos/*.jpg)
shopt -u nullglob
((${#photos[@]})) || die "no photos in build/photos/: run 'make models' (it extracts them)"
for c in tcpreplay tcpdump ip flock; do
  command -v "$c" >/dev/null || die "$c is not installed: run scripts/setup.sh"
done
[[ -x "$py" ]] || die "no Python venv in .venv: run scripts/setup.sh"
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 4 ]] || die "KP_DEMO_SECONDS must be a whole number >= 4"
[[ "$rps" =~ ^[0-9]+$ && "$rps" -ge 1 ]] || die "KP_DEMO_RPS must be a whole number >= 1"
[[ "$new_slo" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "KP_DEMO_SLO_MS must be a number of milliseconds"
[[ "$tuning" =~ ^(true|false)$ && "$pin" =~ ^(true|false)$ && "$keep" =~ ^(true|false)$ ]] ||
  die "KP_DEMO_TUNING, KP_DEMO_PIN and KP_DEMO_KEEP are true or false"
[[ "$keep" == false || -t 0 ]] || die "KP_DEMO_KEEP=true waits for Enter: run it from a terminal"
[[ "$hold_down" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "KP_DEMO_HOLD_DOWN_S must be a number of seconds"

# The platform maps 384 MiB of 2 MiB hugepages at start (-m 384 in
# configs/demo.toml.in) and its IFs may take a little more.
free_pages=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
((${free_pages:-0} >= 200)) ||
  die "only ${free_pages:-0} free 2 MiB hugepages, the demo needs 200: other DPDK processes hold them (ls /dev/hugepages), or reserve more (KP_HUGEPAGES=1024 scripts/setup.sh)"

mkdir -p "$repo/build"
exec 9>"$repo/build/.demo.lock"
flock -n 9 || die "another 'make demo' is running in this checkout"
rm -rf "$out"
mkdir -p "$out"

kpctl() { "$bin/kpctl" --endpoint "$endpoint" "$@"; }
# kpctl_retry ARGS...: a change, tried again while the IF is `busy` (a
# switchover the tuning loop began is still under way), for up to 30 s.
kpctl_retry() {
  local i
  for ((i = 0; i < 150; i++)); do
    if kpctl "$@" 2> "$out/kpctl.err" | indent; then return 0; fi
    grep -q '(busy)' "$out/kpctl.err" || die "kpctl $*: $(cat "$out/kpctl.err")"
    sleep 0.2
  done
  die "kpctl $*: still busy after 30 s: $(cat "$out/kpctl.err")"
}

# --- clean-up -----------------------------------------------------------------
orch_pid="" replay_pid="" tcpdump_pid="" events_pid="" net_up=0
stop_pid() { # stop_pid PID SIGNAL SECONDS: signal it, wait, then SIGKILL
  local pid=$1 sig=$2 wait_s=$3 i
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_s * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  set +e
  stop_pid "$replay_pid" INT 3
  # SIGTERM: the orchestrator retires every IF and stops the if-manager.
  stop_pid "$orch_pid" TERM 30
  # What a killed orchestrator left behind (its state file lists its
  # processes; each of them has the platform's --file-prefix on its command line).
  if [[ -f "$out/run/state.json" ]]; then
    for p in $("$py" -c 'import json,sys; print(*json.load(open(sys.argv[1]))["pids"])' \
                 "$out/run/state.json" 2>/dev/null); do
      grep -qa -- "$prefix" "/proc/$p/cmdline" 2>/dev/null && stop_pid "$p" TERM 3
    done
  fi
  stop_pid "$tcpdump_pid" INT 3
  stop_pid "$events_pid" TERM 2
  rm -rf /dev/hugepages/"$prefix"* /var/run/dpdk/"$prefix"
  ((net_up)) && "$repo/scripts/netns.sh" down "$net"
  if ((rc != 0)); then
    printf '\ndemo: FAILED (exit %s). Logs: build/demo/orchestrator.log, build/demo/run/logs/\n' "$rc" >&2
    [[ -f "$out/orchestrator.log" ]] && grep -v '^orchestrator: tuning: {' "$out/orchestrator.log" | tail -n 12 >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$SECONDS

# --- 1. the network -------------------------------------------------------------
say "a client and a platform network namespace joined by a veth pair (scripts/netns.sh up $net)"
net_up=1
"$repo/scripts/netns.sh" up "$net" > "$out/net.env"
# shellcheck disable=SC1091
source "$out/net.env"
printf '   client   %s in %s: %s %s\n' "$CLIENT_IF" "$CLIENT_NS" "$CLIENT_IP" "$CLIENT_MAC"
printf '   platform %s in %s: %s %s (no kernel address: the if-manager owns it)\n' \
  "$PLATFORM_IF" "$PLATFORM_NS" "$PLATFORM_IP" "$PLATFORM_MAC"

# --- 2. the platform ------------------------------------------------------------
# Hugepage memory the if-manager maps at start (-m): enough for every IF
# process that can live at once (see configs/demo.toml.in), if free.
mem_mb=640
free_mb=$(( $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0) * 2 ))
if (( free_mb < mem_mb + 64 )); then
  mem_mb=$(( free_mb - 64 > 384 ? free_mb - 64 : 384 ))
  say "only $free_mb MiB of hugepages free: the if-manager maps $mem_mb MiB (-m); IF starts may grow it"
fi
sed -e "s|@MODELS@|$repo/models|" -e "s|@BIN_DIR@|$bin|" -e "s|@MEM_MB@|$mem_mb|" \
    -e "s|@PLATFORM_NS@|$PLATFORM_NS|" -e "s|@PLATFORM_IP@|$PLATFORM_IP|" \
    -e "s|@PLATFORM_IF@|$PLATFORM_IF|" -e "s|@FILE_PREFIX@|$prefix|" \
    -e "s|@TUNING@|$tuning|" -e "s|@HOLD_DOWN_S@|$hold_down|g" -e "s|@PIN@|$pin|" \
    "$repo/configs/demo.toml.in" > "$out/platform.toml"
endpoint="ipc://$out/run/orchestrator.sock"
say "starting the orchestrator: the if-manager, then squeezenet (if 1) and shufflenet (if 5), each with a shadow"
echo "   target/release/orchestrator --config build/demo/platform.toml --runtime-dir build/demo/run"
"$bin/orchestrator" --config "$out/platform.toml" --runtime-dir "$out/run" \
  --summary-json "$out/summary.json" > "$out/orchestrator.out" 2> "$out/orchestrator.log" &
orch_pid=$!
# What the orchestrator does, as it does it (the tuning loop's decisions in
# full: build/demo/run/decisions.jsonl).
{ tail -n +1 --pid="$orch_pid" -F "$out/orchestrator.log" 2>/dev/null | "$py" "$report" events; } &
events_pid=$!
for ((i = 0; i < 1200; i++)); do
  grep -q '^orchestrator: ready' "$out/orchestrator.log" && break
  kill -0 "$orch_pid" 2>/dev/null || die "the orchestrator exited during start-up"
  sleep 0.1
done
grep -q '^orchestrator: ready' "$out/orchestrator.log" || die "the orchestrator was not ready within 120 s"
sleep 0.3 # let the event printer catch up
echo "   ready after $((SECONDS - t0)) s; control endpoint $endpoint"
if [[ "$pin" == true ]]; then
  # configs/demo.toml.in pins if 5 ([[deploy]] pinned = true), but the
  # orchestrator drops that pin at start (it asks for it while the IF is
  # still starting, and the request is refused `busy`); pinning it again
  # here at the same share changes nothing else.
  echo "   pinning if 5 at 50% (kpctl share 5 50): the tuning loop estimates what if 1 needs; the"
  echo "   allocator gives it the other half as long as nobody else wants it"
  kpctl_retry share 5 50
fi

# --- 3. traffic -------------------------------------------------------------------
requests=$((rps * seconds))
say "kp-gen: $requests image requests (224x224 RGB, $frag_size-byte fragments), 2/3 for if 1, 1/3 for if 5"
"$bin/kp-gen" --out "$out/in.pcap" --manifest "$out/manifest.json" -q \
  --requests "$requests" --if-mix 1:2,5:1 --deployed 1,5 --input synthetic \
  --frag-size "$frag_size" --src-ports 40000-40003 --seed 11 \
  --src-mac "$CLIENT_MAC" --dst-mac "$PLATFORM_MAC" --src-ip "$CLIENT_IP" --dst-ip "$PLATFORM_IP"
frags=$("$py" "$report" frags "$out/manifest.json")
pps=$((rps * frags))

ip netns exec "$CLIENT_NS" tcpdump -i "$CLIENT_IF" -Q in -n -s 256 -U -Z root \
  -w "$out/answers.pcap" "udp and src host $PLATFORM_IP and src port 9000" \
  2> "$out/tcpdump.log" &
tcpdump_pid=$!
for ((i = 0; i < 100; i++)); do
  grep -q 'listening on' "$out/tcpdump.log" && break
  kill -0 "$tcpdump_pid" 2>/dev/null || die "tcpdump did not start: $(cat "$out/tcpdump.log")"
  sleep 0.1
done

say "replaying it with tcpreplay from $CLIENT_NS: $rps requests/s for $seconds s, each request's $frags fragments in one burst"
echo "   scripts/replay.sh --ns $CLIENT_NS --iface $CLIENT_IF --pcap build/demo/in.pcap --pps $pps -- --pps-multi=$frags --timer=nano"
echo "   answers: tcpdump in $CLIENT_NS -> build/demo/answers.pcap"
echo "   watch it live from another terminal: target/release/kpctl --endpoint $endpoint watch"
# --timer=nano: tcpreplay sleeps between bursts (its default, gtod, spins a core).
"$repo/scripts/replay.sh" --ns "$CLIENT_NS" --iface "$CLIENT_IF" --pcap "$out/in.pcap" \
  --pps "$pps" -- --pps-multi="$frags" --timer=nano > "$out/tcpreplay.log" 2>&1 &
replay_pid=$!
t_replay=$SECONDS

status_line() { # one line per IF, from `kpctl --json status`
  kill -0 "$orch_pid" 2>/dev/null || die "the orchestrator died (build/demo/orchestrator.log)"
  kpctl --json status 2>/dev/null | "$py" "$report" status "$((SECONDS - t_replay))" || true
}

# --- 4. a live SLO change, halfway ------------------------------------------------
while kill -0 "$replay_pid" 2>/dev/null && ((SECONDS - t_replay < seconds / 2)); do
  sleep 4
  status_line
done
old_slo=$(kpctl --json status | "$py" "$report" field 1 slo_ms)
say "changing if 1's SLO live: $old_slo ms -> $new_slo ms (watch it with: target/release/kpctl --endpoint $endpoint watch)"
echo "   target/release/kpctl --endpoint $endpoint slo 1 $new_slo"
kpctl_retry slo 1 "$new_slo"
t_slo=$SECONDS
switched=0
for ((i = 0; i < 240; i++)); do
  kill -0 "$orch_pid" 2>/dev/null || die "the orchestrator died (build/demo/orchestrator.log)"
  if kpctl --json status 2>/dev/null | "$py" "$report" serving 1 "$new_slo"; then
    switched=1
    break
  fi
  sleep 0.25
done
((switched)) || die "if 1's switchover to the new SLO did not complete within 60 s"
echo "   if 1 serves with the new SLO $((SECONDS - t_slo)) s later, re-provisioned through its shadow"
status_line

while kill -0 "$replay_pid" 2>/dev/null; do
  sleep 4
  status_line
done
wait "$replay_pid" || die "tcpreplay failed: $(cat "$out/tcpreplay.log")"
replay_pid=""
grep -E 'Actual:|Failed packets' "$out/tcpreplay.log" | sed 's/^[[:space:]]*/   tcpreplay: /'

# The last answers: until the capture stops growing (at most 10 s).
last=-1
for ((i = 0; i < 20; i++)); do
  size=$(stat -c %s "$out/answers.pcap" 2>/dev/null || echo 0)
  ((size == last)) && break
  last=$size
  sleep 0.5
done

# The capture ends here: the photos' answers below are not the manifest's.
stop_pid "$tcpdump_pid" INT 3
tcpdump_pid=""

# --- 5. the end ---------------------------------------------------------------------
say "kpctl status"
kpctl status

say "real photos: deploying efficientnet_lite0 (if 10) live, then kp-client --image from $CLIENT_NS"
echo "   target/release/kpctl --endpoint $endpoint deploy --if-id 10 --model efficientnet_lite0 --share-pct 20"
kpctl_retry deploy --if-id 10 --model efficientnet_lite0 --share-pct 20
t_deploy=$SECONDS
for ((i = 0; i < 240; i++)); do
  kill -0 "$orch_pid" 2>/dev/null || die "the orchestrator died (build/demo/orchestrator.log)"
  [[ "$(kpctl --json status 2>/dev/null | "$py" "$report" field 10 state 2>/dev/null)" == active ]] && break
  sleep 0.25
done
[[ "$(kpctl --json status 2>/dev/null | "$py" "$report" field 10 state 2>/dev/null)" == active ]] ||
  die "efficientnet_lite0 (if 10) was not serving within 60 s of its deploy"
echo "   serving $((SECONDS - t_deploy)) s later; top-5 per photo (class names from models/efficientnet_lite0/labels.txt):"
echo "   target/release/kp-client --dst $PLATFORM_IP:9000 --if-id 10 --image build/photos/*"
ip netns exec "$CLIENT_NS" "$bin/kp-client" --dst "$PLATFORM_IP:9000" --if-id 10 \
  --models "$repo/models" --timeout 5s --frag-size "$frag_size" --image "${photos[@]}" > "$out/photos.txt" ||
  die "kp-client --image failed"
indent < "$out/photos.txt"
grep -q '^coffee.png: 1\. espresso ' "$out/photos.txt" || die "coffee.png is not classified espresso"

if [[ "$keep" == true ]]; then
  say "the platform stays up (KP_DEMO_KEEP=true); from another terminal, as root, try:"
  cat <<EOF | indent
ip netns exec $CLIENT_NS $repo/.venv/bin/python -c '
import kneepoint
client = kneepoint.Client("$PLATFORM_IP:9000", models="$repo/models")
for p in client.infer(10, "$repo/build/photos/chelsea.png"):
    print(p.class_id, p.label, round(p.score, 3))'
ip netns exec $CLIENT_NS $bin/kp-client --dst $PLATFORM_IP:9000 --if-id 10 --models $repo/models --image $repo/build/photos/*.png
$bin/kpctl --endpoint $endpoint status
EOF
  read -r -p "   press Enter to shut the platform down and finish the checks " _ || true
fi

say "kpctl shutdown"
kpctl shutdown | indent
for ((i = 0; i < 600; i++)); do
  kill -0 "$orch_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$orch_pid" 2>/dev/null && die "the orchestrator did not exit within 60 s of the shutdown"
wait "$orch_pid" || die "the orchestrator exited with an error"
orch_pid=""
grep -E 'packets (captured|dropped by kernel)' "$out/tcpdump.log" | sed 's/^/   tcpdump: /'
dropped=$(sed -n 's/^\([0-9]*\) packets dropped by kernel.*/\1/p' "$out/tcpdump.log")
((${dropped:-0} == 0)) || echo "   WARNING: tcpdump dropped answers: the check below may count them lost"

say "switchover gaps (the orchestrator's summary, build/demo/summary.json)"
"$py" "$report" summary "$out/summary.json"

say "every request sent, against the answers captured (scripts/check_answers.py)"
if ! "$py" "$repo/scripts/check_answers.py" "$out/manifest.json" "$out/answers.pcap" \
       --json "$out/check.json" | indent; then
  die "requests were lost or answered more than once (see above)"
fi
echo
echo "demo: done in $((SECONDS - t0)) s. Files in build/demo/: platform.toml, orchestrator.log, run/ (logs,"
echo "      decisions.jsonl), in.pcap + manifest.json (the traffic), answers.pcap, summary.json, check.json,"
echo "      photos.txt (the photos' top-5)"
