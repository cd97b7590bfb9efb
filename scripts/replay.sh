#!/usr/bin/env bash
# Replays a pcap (e.g. one kp-gen wrote) onto an interface inside a network
# namespace with tcpreplay, and prints tcpreplay's summary.
#
#   scripts/replay.sh --ns NS --iface IF --pcap FILE
#                     [--pps N | --mbps N | --topspeed] [--loop N] [-- TCPREPLAY_ARGS...]
#
#   --ns NS        namespace to send from (the client end of scripts/netns.sh,
#                  e.g. "$CLIENT_NS")
#   --iface IF     interface in NS to send on (e.g. "$CLIENT_IF")
#   --pcap FILE    the capture to send
#   --pps N        packets per second
#   --mbps N       megabits per second
#   --topspeed     as fast as possible
#                  (none of the three: the pcap's own timestamps, i.e. kp-gen's
#                  --gap-us, set the pace)
#   --loop N       send the file N times (default 1)
#   -- ARGS        passed to tcpreplay unchanged
#
# The file is loaded into memory first (--preload-pcap), so disk reads do not
# disturb the pace. Frames go out as they are in the file: their destination
# MAC must be the receiver's (kp-gen --dst-mac "$PLATFORM_MAC") unless the
# receiver listens promiscuously. The exit status is tcpreplay's.
# Needs root and tcpreplay.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

die() { printf 'replay.sh: %s\n' "$*" >&2; exit 1; }

ns="" iface="" pcap="" rate=() loop=1 extra=()
rates_given=0
while (($#)); do
  case "$1" in
    --ns) (($# >= 2)) || usage; ns=$2; shift 2 ;;
    --iface) (($# >= 2)) || usage; iface=$2; shift 2 ;;
    --pcap) (($# >= 2)) || usage; pcap=$2; shift 2 ;;
    --pps) (($# >= 2)) || usage; rate=("--pps=$2"); rates_given=$((rates_given + 1)); shift 2 ;;
    --mbps) (($# >= 2)) || usage; rate=("--mbps=$2"); rates_given=$((rates_given + 1)); shift 2 ;;
    --topspeed) rate=("--topspeed"); rates_given=$((rates_given + 1)); shift ;;
    --loop) (($# >= 2)) || usage; loop=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage ;;
    *) printf 'replay.sh: unknown argument %s\n' "$1" >&2; usage ;;
  esac
done

[[ -n "$ns" && -n "$iface" && -n "$pcap" ]] || usage
((rates_given <= 1)) || die "give at most one of --pps, --mbps, --topspeed"
[[ "$loop" =~ ^[1-9][0-9]*$ ]] || die "--loop must be a positive integer (got '$loop')"
[[ -r "$pcap" ]] || die "cannot read $pcap"
((EUID == 0)) || die "must run as root"
command -v tcpreplay >/dev/null || die "tcpreplay is not installed (scripts/setup.sh installs it)"
[[ -e "/var/run/netns/$ns" ]] || die "no network namespace '$ns' (scripts/netns.sh up NAME makes one)"
ip -n "$ns" link show dev "$iface" >/dev/null 2>&1 || die "no interface '$iface' in namespace '$ns'"

# tcpreplay runs in NS: it can only see, and so only send on, NS's interfaces.
exec ip netns exec "$ns" tcpreplay --preload-pcap --intf1="$iface" --loop="$loop" \
  ${rate[@]+"${rate[@]}"} ${extra[@]+"${extra[@]}"} "$pcap"
