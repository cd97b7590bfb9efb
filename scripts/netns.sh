#!/usr/bin/env bash
# A private two-namespace test network for kneepoint: a client and a platform
# joined by one veth pair (or, with --bridge, by a third namespace that
# bridges them), so traffic never leaves the machine or touches the host's
# own interfaces.
#
#   scripts/netns.sh up   NAME [--subnet X] [--mtu N] [--bridge]
#                                             create (or repair) it, print facts
#   scripts/netns.sh show NAME                print the facts of an existing one
#   scripts/netns.sh down NAME                remove it (safe to call twice)
#
# What `up NAME` makes (idempotent: a second call changes nothing):
#   NAME-c  client namespace, holding NAME-c0 with 10.77.X.1/24
#   NAME-p  platform namespace, holding NAME-p0 with NO address, so the kernel
#           there never answers, forwards or ICMP-rejects what arrives; the
#           DPDK if-manager attaches to it from inside the namespace:
#             ip netns exec NAME-p if-manager ... --vdev net_af_packet0,iface=NAME-p0
#   a permanent neighbour entry in NAME-c: 10.77.X.2 -> NAME-p0's MAC, so the
#           client's kernel sends without ARP (nothing would answer it);
#   IPv6 disabled on both ends (no router solicitations or DAD noise);
#   TX checksum offload off on both ends when ethtool exists: a veth hands
#           AF_PACKET readers frames whose UDP checksum is not yet filled in
#           otherwise, and the if-manager would count them malformed.
#   with --bridge, NAME-c0 and NAME-p0 are not each other's peers: NAME-b,
#           a third namespace, holds their peers NAME-bc (client side) and
#           NAME-bp (platform side) as the two ports of a Linux bridge br0
#           (no STP, no multicast of its own, no addresses, IPv6 off,
#           bridge-netfilter off: it sends nothing and forwards every frame
#           as it is). A place to impair the wire
#           (e.g. nftables netdev ingress rules on NAME-bc and NAME-bp) and
#           to capture what really reaches either side;
#   with --mtu N, both ends' MTU set to N (e.g. 9000 for jumbo fragments;
#           the if-manager then needs framesz=10240,blocksz=20480 in its
#           net_af_packet vdev); without it, the kernel's default (1500) is
#           set back.
# X is 1 + (cksum of NAME) mod 254 unless --subnet gives it (1..254). Each
# network lives in its own namespaces, so two of them may share an X.
#
# Output of up/show: KEY=VALUE lines, for `eval "$(scripts/netns.sh up kp)"`:
#   CLIENT_NS PLATFORM_NS CLIENT_IF PLATFORM_IF CLIENT_IP PLATFORM_IP
#   CLIENT_MAC PLATFORM_MAC PREFIX_LEN MTU
#   and with --bridge: BRIDGE_NS BRIDGE_CLIENT_IF BRIDGE_PLATFORM_IF
# Needs root and iproute2.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

die() { printf 'netns.sh: %s\n' "$*" >&2; exit 1; }

ns_exists() { [[ -e "/var/run/netns/$1" ]]; }

# link_in NS IF: true if interface IF exists in namespace NS.
link_in() { ip -n "$1" link show dev "$2" >/dev/null 2>&1; }


check_name() {
  local name=$1
  [[ "$name" =~ ^[A-Za-z0-9_]+$ ]] || die "NAME must be letters, digits or _ (got '$name')"
  # Interface names are at most 15 characters: NAME-c0 must fit.
  ((${#name} <= 12)) || die "NAME must be at most 12 characters (got ${#name})"
}

subnet_of() {
  local sum
  sum=$(printf '%s' "$1" | cksum | cut -d' ' -f1)
  echo $((1 + sum % 254))
}

disable_ipv6() {
  local ns=$1 ifname=$2 f
  for f in all default "$ifname"; do
    ip netns exec "$ns" sh -c "[ ! -w /proc/sys/net/ipv6/conf/$f/disable_ipv6 ] || echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6"
  done
}

no_tx_csum_offload() {
  local ns=$1 ifname=$2
  if command -v ethtool >/dev/null; then
    ip netns exec "$ns" ethtool -K "$ifname" tx off >/dev/null 2>&1 ||
      printf 'netns.sh: warning: could not turn TX checksum offload off on %s\n' "$ifname" >&2
  else
    printf 'netns.sh: warning: ethtool missing; %s keeps TX checksum offload (UDP checksums may be unfilled on the wire)\n' "$ifname" >&2
  fi
}

facts() {
  local name=$1 x=$2
  local cns="$name-c" pns="$name-p" cif="$name-c0" pif="$name-p0" bns="$name-b"
  ns_exists "$cns" && link_in "$cns" "$cif" || die "$cns/$cif missing: run '$0 up $name'"
  ns_exists "$pns" && link_in "$pns" "$pif" || die "$pns/$pif missing: run '$0 up $name'"
  if ns_exists "$bns"; then
    link_in "$bns" "$name-bc" && link_in "$bns" "$name-bp" ||
      die "$bns's ports missing: run '$0 up $name --bridge'"
    printf 'BRIDGE_NS=%s\nBRIDGE_CLIENT_IF=%s\nBRIDGE_PLATFORM_IF=%s\n' "$bns" "$name-bc" "$name-bp"
  fi
  cat <<EOF
CLIENT_NS=$cns
PLATFORM_NS=$pns
CLIENT_IF=$cif
PLATFORM_IF=$pif
CLIENT_IP=10.77.$x.1
PLATFORM_IP=10.77.$x.2
CLIENT_MAC=$(ip netns exec "$cns" cat "/sys/class/net/$cif/address")
PLATFORM_MAC=$(ip netns exec "$pns" cat "/sys/class/net/$pif/address")
PREFIX_LEN=24
MTU=$(ip netns exec "$pns" cat "/sys/class/net/$pif/mtu")
EOF
}

# The X of an existing network, read back from the client's address.
subnet_in_use() {
  local name=$1
  ip -n "$name-c" -4 -o addr show dev "$name-c0" 2>/dev/null |
    sed -n 's/.* inet 10\.77\.\([0-9]*\)\.1\/24.*/\1/p' | head -n1 || true
}

# The name of the peer, in namespace PEER_NS, of veth IF in namespace NS
# (empty if there is none there).
peer_of() {
  local ns=$1 ifname=$2 peer_ns=$3 idx
  idx=$(ip -n "$ns" -o link show dev "$ifname" 2>/dev/null | sed -n 's/^[0-9]*: [^@]*@if\([0-9]*\):.*/\1/p')
  [[ -n "$idx" ]] || return 0
  ip -n "$peer_ns" -o link show 2>/dev/null | sed -n "s/^$idx: \([^@:]*\)[@:].*/\1/p"
}

cmd_up() {
  local name=$1 x=$2 mtu=$3 bridge=$4
  local cns="$name-c" pns="$name-p" cif="$name-c0" pif="$name-p0"
  local bns="$name-b" bc="$name-bc" bp="$name-bp"
  ns_exists "$cns" || ip netns add "$cns"
  ns_exists "$pns" || ip netns add "$pns"

  # A half-made network (an end missing, an end left in the host namespace
  # by an interrupted run, or the other shape: bridged where a direct pair
  # is asked for, or the reverse) is removed and made again.
  local whole=0
  if ((bridge)); then
    ns_exists "$bns" && link_in "$bns" br0 &&
      [[ "$(peer_of "$cns" "$cif" "$bns")" == "$bc" ]] &&
      [[ "$(peer_of "$pns" "$pif" "$bns")" == "$bp" ]] && whole=1
  else
    ! ns_exists "$bns" && [[ "$(peer_of "$cns" "$cif" "$pns")" == "$pif" ]] && whole=1
  fi
  if ((!whole)); then
    ! ns_exists "$bns" || ip netns del "$bns"
    ip -n "$cns" link del "$cif" 2>/dev/null || true
    ip -n "$pns" link del "$pif" 2>/dev/null || true
    local l
    for l in "$cif" "$pif" "$bc" "$bp"; do ip link del "$l" 2>/dev/null || true; done
    if ((bridge)); then
      ip netns add "$bns"
      ip link add "$cif" netns "$cns" type veth peer name "$bc" netns "$bns"
      ip link add "$pif" netns "$pns" type veth peer name "$bp" netns "$bns"
      # No STP (no BPDUs), no multicast snooping, no multicast at all on
      # br0: otherwise the bridge's own IGMP reports reach both ends.
      ip -n "$bns" link add br0 type bridge stp_state 0 mcast_snooping 0
      ip -n "$bns" link set br0 multicast off
      ip -n "$bns" link set "$bc" master br0
      ip -n "$bns" link set "$bp" master br0
    else
      ip link add "$cif" netns "$cns" type veth peer name "$pif" netns "$pns"
    fi
  fi
  if ((bridge)); then
    local port
    disable_ipv6 "$bns" br0
    # br_netfilter, where the host has it loaded, would pass bridged IPv4
    # through iptables and drop frames whose IPv4 header does not verify.
    ip netns exec "$bns" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ ! -w "$f" ] || echo 0 > "$f"; done'
    for port in "$bc" "$bp"; do
      disable_ipv6 "$bns" "$port"
      no_tx_csum_offload "$bns" "$port"
      ip -n "$bns" link set dev "$port" mtu "$mtu"
      ip -n "$bns" link set dev "$port" up
    done
    ip -n "$bns" link set dev br0 mtu "$mtu"
    ip -n "$bns" link set lo up
    ip -n "$bns" link set br0 up
  fi

  disable_ipv6 "$cns" "$cif"
  disable_ipv6 "$pns" "$pif"
  no_tx_csum_offload "$cns" "$cif"
  no_tx_csum_offload "$pns" "$pif"
  ip -n "$cns" link set dev "$cif" mtu "$mtu"
  ip -n "$pns" link set dev "$pif" mtu "$mtu"

  # Client end: one address, nothing else (a changed --subnet replaces it).
  local old
  old=$(subnet_in_use "$name")
  if [[ -n "$old" && "$old" != "$x" ]]; then
    ip -n "$cns" addr flush dev "$cif"
    ip -n "$cns" neigh flush dev "$cif"
  fi
  ip -n "$cns" addr replace "10.77.$x.1/24" dev "$cif"
  ip -n "$cns" link set lo up
  ip -n "$cns" link set "$cif" up

  # Platform end: up, no address, and no ARP answers from the kernel.
  ip -n "$pns" addr flush dev "$pif"
  ip -n "$pns" link set "$pif" arp off
  ip -n "$pns" link set "$pif" up

  local pmac
  pmac=$(ip netns exec "$pns" cat "/sys/class/net/$pif/address")
  ip -n "$cns" neigh replace "10.77.$x.2" lladdr "$pmac" dev "$cif" nud permanent

  facts "$name" "$x"
}

cmd_down() {
  local name=$1
  local ns
  for ns in "$name-c" "$name-p" "$name-b"; do
    # Deleting a namespace destroys the veth end inside it, and with it
    # the peer.
    if ns_exists "$ns"; then
      ip netns del "$ns"
    fi
  done
  # Ends left in the host namespace by an interrupted `up`.
  ip link del "$name-c0" 2>/dev/null || true
  ip link del "$name-p0" 2>/dev/null || true
  ip link del "$name-bc" 2>/dev/null || true
  ip link del "$name-bp" 2>/dev/null || true
}

main() {
  (($# >= 1)) || usage
  local cmd=$1
  shift
  case "$cmd" in
    -h|--help|help) usage ;;
  esac
  (($# >= 1)) || usage
  local name=$1
  shift
  check_name "$name"
  local x="" mtu="" bridge=0
  while (($#)); do
    case "$1" in
      --bridge) bridge=1; shift ;;
      --mtu) (($# >= 2)) || usage; mtu=$2; shift 2 ;;
      --mtu=*) mtu=${1#--mtu=}; shift ;;
      --subnet) (($# >= 2)) || usage; x=$2; shift 2 ;;
      --subnet=*) x=${1#--subnet=}; shift ;;
      *) usage ;;
    esac
  done
  if [[ -n "$x" ]]; then
    [[ "$x" =~ ^[0-9]+$ ]] && ((x >= 1 && x <= 254)) || die "--subnet must be 1..254 (got '$x')"
  fi
  if [[ -n "$mtu" ]]; then
    [[ "$mtu" =~ ^[0-9]+$ ]] && ((mtu >= 68 && mtu <= 65535)) || die "--mtu must be 68..65535 (got '$mtu')"
  fi
  ((EUID == 0)) || die "must run as root"
  case "$cmd" in
    up)
      [[ -n "$x" ]] || x=$(subnet_of "$name")
      cmd_up "$name" "$x" "${mtu:-1500}" "$bridge"
      ;;
    show)
      [[ -z "$x" && -z "$mtu" ]] && ((!bridge)) || usage
      x=$(subnet_in_use "$name")
      [[ -n "$x" ]] || die "network '$name' is not up"
      facts "$name" "$x"
      ;;
    down)
      [[ -z "$x" && -z "$mtu" ]] && ((!bridge)) || usage
      cmd_down "$name"
      ;;
    *) usage ;;
  esac
}

main "$@"
