#!/usr/bin/env python3
"""Exactly-once, checked from a capture alone, independently of kneepoint's code.

Reads a classic pcap (Ethernet, as tcpdump -w writes; any snap length of at
least the headers: lengths come from each record's original length) taken on
the platform's side of the wire: the frames that reached the platform's port
and the platform's answers. Parses both with this file's own reading of
docs/PROTOCOL.md (nothing of kneepoint is imported) and checks what the
protocol promises:

- every request (source IPv4 address, source UDP port, if_id, request_id) of
  which at least one well-formed fragment reached the platform gets exactly
  one answer, after that fragment, sent from the platform's address and port
  to the request's, echoing its send_ts_ns;
- the answer's status is the one the fragments that arrived imply: OK when
  every index 0..frag_count-1 arrived (within the reassembly timeout of the
  first), INCOMPLETE when one never did, UNKNOWN_IF for an if_id not
  deployed, BAD_REQUEST for a total_len that is not the model's input size
  or fragments that disagree on total_len, frag_count or send_ts_ns;
- nothing is answered that never arrived, nothing twice.

A frame from the platform's MAC is an answer; every other frame is an input.
An input is *not for us* (not IPv4 after at most one 802.1Q tag; IPv4 but not
UDP; UDP to another address or port than the platform's), *malformed* (for
us, but the IPv4 header (version, IHL, total length, checksum), its
fragmentation, the UDP length or the 32-byte kneepoint header is broken, as
PROTOCOL.md and the if-manager define it), or a *well-formed fragment*. The
UDP checksum is not verified: kneepoint's parser does not verify it either
(docs/PROTOCOL.md has no integrity check), so a fragment whose payload bytes
were corrupted under a valid UDP checksum is well-formed here too.

Prints one JSON object (counts by class, requests by expected status,
answers by status, violations) and exits 1 if any violation was found, 2 on
bad input.

    exactly_once_check.py --capture FILE --platform-ip IP --platform-mac MAC
                          --deployed 1:150528[,ID:BYTES...]
                          [--port 9000] [--reassembly-timeout-ms 1000]
"""

import argparse
import json
import struct
import sys

MAGIC = 0x4B4E5054
STATUS = {0: "ok", 1: "unknown_if", 2: "bad_request", 3: "incomplete", 4: "overloaded", 5: "internal"}


def read_pcap(path):
    """Yields (ts_ns, orig_len, bytes) for each record of a classic pcap."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise ValueError(f"{path}: not a pcap (shorter than its header)")
        magic = struct.unpack("<I", head[:4])[0]
        if magic in (0xA1B2C3D4, 0xA1B23C4D):
            end = "<"
        elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
            end = ">"
            magic = struct.unpack(">I", head[:4])[0]
        else:
            raise ValueError(f"{path}: not a classic pcap (magic {magic:#x})")
        nano = magic == 0xA1B23C4D
        linktype = struct.unpack(end + "I", head[20:24])[0]
        if linktype != 1:
            raise ValueError(f"{path}: link type {linktype}, want 1 (Ethernet)")
        while True:
            rec = f.read(16)
            if not rec:
                return
            if len(rec) < 16:
                raise ValueError(f"{path}: truncated record header")
            sec, frac, incl, orig = struct.unpack(end + "IIII", rec)
            data = f.read(incl)
            if len(data) < incl:
                raise ValueError(f"{path}: truncated record")
            yield sec * 1_000_000_000 + (frac if nano else frac * 1000), orig, data


def ip_checksum_ok(hdr):
    s = 0
    for i in range(0, len(hdr) - 1, 2):
        s += (hdr[i] << 8) | hdr[i + 1]
    if len(hdr) % 2:
        s += hdr[-1] << 8
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


def parse_udp(frame, orig_len):
    """('udp', fields) | ('not_for_us', why) | ('malformed', why).

    fields: src_ip, dst_ip, src_port, dst_port, payload (the captured part)
    and payload_len (its true length, from the UDP length)."""
    if orig_len < 14 or len(frame) < 14:
        return "malformed", "frame_truncated"
    ethertype = struct.unpack("!H", frame[12:14])[0]
    l3 = 14
    if ethertype == 0x8100:
        l3 = 18
        if orig_len < l3:
            return "malformed", "frame_truncated"
        ethertype = struct.unpack("!H", frame[16:18])[0]
    if ethertype != 0x0800:
        return "not_for_us", "not_ipv4_udp"
    if orig_len - l3 < 20:
        return "malformed", "frame_truncated"
    ip = frame[l3:]
    if ip[0] >> 4 != 4:
        return "malformed", "frame_bad_ip_version"
    ihl = (ip[0] & 0x0F) * 4
    if ihl < 20:
        return "malformed", "frame_bad_ip_header_len"
    total = struct.unpack("!H", ip[2:4])[0]
    if total < ihl:
        return "malformed", "frame_bad_ip_total_len"
    if total > orig_len - l3:
        return "malformed", "frame_truncated"
    if len(ip) < ihl + 8:
        raise ValueError("snap length too short for the IPv4 and UDP headers")
    if not ip_checksum_ok(ip[:ihl]):
        return "malformed", "frame_bad_ip_checksum"
    if ip[9] != 17:
        return "not_for_us", "not_ipv4_udp"
    if struct.unpack("!H", ip[6:8])[0] & 0x3FFF:
        return "malformed", "frame_ip_fragment"
    if total - ihl < 8:
        return "malformed", "frame_bad_udp_length"
    udp = ip[ihl:]
    udp_len = struct.unpack("!H", udp[4:6])[0]
    if udp_len < 8 or udp_len > total - ihl:
        return "malformed", "frame_bad_udp_length"
    src_port, dst_port = struct.unpack("!HH", udp[0:4])
    return "udp", {
        "src_ip": bytes(ip[12:16]),
        "dst_ip": bytes(ip[16:20]),
        "src_port": src_port,
        "dst_port": dst_port,
        "payload": udp[8:udp_len],
        "payload_len": udp_len - 8,
    }


def parse_fragment(payload, payload_len):
    """(header dict, None) for a well-formed request fragment, else (None, why)."""
    if payload_len < 32:
        return None, "header_too_short"
    if len(payload) < 32:
        raise ValueError("snap length too short for the kneepoint header")
    magic, version, mtype, if_id, request_id, total_len, index, count, ts = struct.unpack(
        "!IBBHQIHHQ", payload[:32]
    )
    if magic != MAGIC:
        return None, "header_bad_magic"
    if version != 1:
        return None, "header_bad_version"
    if mtype != 1:
        return None, "header_bad_type"
    if total_len == 0:
        return None, "header_zero_total_len"
    if count == 0:
        return None, "header_zero_frag_count"
    if index >= count:
        return None, "header_index_out_of_range"
    stride = -(-total_len // count)
    if (count - 1) * stride >= total_len:
        return None, "header_empty_last_fragment"
    want = min((index + 1) * stride, total_len) - index * stride
    if payload_len - 32 != want:
        return None, "header_payload_length"
    return {
        "if_id": if_id,
        "request_id": request_id,
        "total_len": total_len,
        "index": index,
        "count": count,
        "send_ts": ts,
    }, None


def parse_answer(payload):
    if len(payload) < 36:
        return None
    magic, version, mtype, if_id, request_id, ts, status = struct.unpack("!IBBHQQI", payload[:28])
    if magic != MAGIC or version != 1 or mtype not in (2, 3):
        return None
    return {"if_id": if_id, "request_id": request_id, "send_ts": ts, "status": status, "type": mtype}


def ip_str(b):
    return ".".join(str(x) for x in b)


def new_incarnation(h, ts):
    return {"first": h, "first_ts": ts, "indices": set(), "complete_ts": None, "disagree": False}


def check(args):
    platform_ip = bytes(int(x) for x in args.platform_ip.split("."))
    platform_mac = bytes(int(x, 16) for x in args.platform_mac.split(":"))
    deployed = {}
    for item in args.deployed.split(","):
        if_id, size = item.split(":")
        deployed[int(if_id)] = int(size)
    timeout = args.reassembly_timeout_ms * 1_000_000
    ttl = (args.answered_ttl_ms or 4 * args.reassembly_timeout_ms) * 1_000_000
    margin = (args.timing_margin_ms if args.timing_margin_ms is not None else args.reassembly_timeout_ms // 2) * 1_000_000
    if not 0 <= margin < min(timeout, ttl - timeout):
        raise ValueError("--timing-margin-ms must be below the timeout and the ttl minus the timeout")

    counts = {"frames_in": 0, "frames_out": 0, "not_for_us": 0, "malformed": 0, "well_formed": 0}
    reasons = {}
    requests = {}  # key -> {"incarnations": [...], "ttl_ambiguous": bool}
    answers = {}  # key -> list of (ts, answer)
    violations = []
    for ts, orig, frame in read_pcap(args.capture):
        if frame[6:12] == platform_mac:
            counts["frames_out"] += 1
            kind, u = parse_udp(frame, orig)
            a = parse_answer(u["payload"]) if kind == "udp" else None
            if a is None or u["src_ip"] != platform_ip or u["src_port"] != args.port:
                violations.append(f"the platform sent a frame that is not an answer from {args.platform_ip}:{args.port}")
                continue
            key = (u["dst_ip"], u["dst_port"], a["if_id"], a["request_id"])
            answers.setdefault(key, []).append((ts, a))
            continue
        counts["frames_in"] += 1
        kind, u = parse_udp(frame, orig)
        if kind == "udp" and (u["dst_ip"] != platform_ip or u["dst_port"] != args.port):
            kind, u = "not_for_us", "wrong_address_or_port"
        if kind == "udp":
            h, why = parse_fragment(u["payload"], u["payload_len"])
            kind, u = ("fragment", (u, h)) if h else ("malformed", why)
        if kind != "fragment":
            counts[kind] += 1
            reasons[u] = reasons.get(u, 0) + 1
            continue
        counts["well_formed"] += 1
        u, h = u
        key = (u["src_ip"], u["src_port"], h["if_id"], h["request_id"])
        req = requests.setdefault(key, {"incarnations": [new_incarnation(h, ts)], "ttl_ambiguous": False})
        r = req["incarnations"][-1]
        # The platform remembers an answered request for its answered ttl
        # from the first fragment; later a fragment of it is a new request
        # (the protocol only asks request ids to be unique while in flight).
        # Near the boundary the platform's clock and the capture's may
        # disagree by the timing margin: either reading is accepted there.
        age = ts - r["first_ts"]
        if age >= ttl + margin:
            r = new_incarnation(h, ts)
            req["incarnations"].append(r)
        elif age >= ttl - margin:
            req["ttl_ambiguous"] = True
        f = r["first"]
        if (h["total_len"], h["count"], h["send_ts"]) != (f["total_len"], f["count"], f["send_ts"]):
            r["disagree"] = True
            continue
        r["indices"].add(h["index"])
        if r["complete_ts"] is None and len(r["indices"]) == f["count"]:
            r["complete_ts"] = ts

    expected_by = {}
    answered_by = {}
    timing = {"late_on_the_wire": 0, "ttl_ambiguous": 0, "reincarnated": 0}
    for key, req in requests.items():
        name = f"{ip_str(key[0])}:{key[1]} if {key[2]} request {key[3]}"
        incs = req["incarnations"]
        got = sorted(answers.get(key, []), key=lambda x: x[0])
        timing["reincarnated"] += len(incs) - 1
        timing["ttl_ambiguous"] += int(req["ttl_ambiguous"])
        want_n = (len(incs), len(incs) + int(req["ttl_ambiguous"]))
        if not want_n[0] <= len(got) <= want_n[1]:
            violations.append(
                f"{name}: {len(got)} answers {[STATUS.get(a['status'], a['status']) for _, a in got]}, "
                f"want {want_n[0] if want_n[0] == want_n[1] else f'{want_n[0]} or {want_n[1]}'}"
            )
        for i, (ts, a) in enumerate(got):
            r = incs[min(i, len(incs) - 1)]
            f = r["first"]
            if i >= len(incs):
                # The answer to a straggler at the ttl's boundary.
                allowed = {"incomplete"}
            elif key[2] not in deployed:
                allowed = {"unknown_if"}
            elif f["total_len"] != deployed[key[2]] or r["disagree"]:
                allowed = {"bad_request"}
            elif r["complete_ts"] is None:
                allowed = {"incomplete"}
            elif r["complete_ts"] - r["first_ts"] < timeout - margin:
                allowed = {"ok"}
            else:
                # Complete on the wire only near or past the timeout: the
                # platform may have seen either.
                allowed = {"ok", "incomplete"}
                timing["late_on_the_wire"] += 1
            want = "/".join(sorted(allowed))
            if i < len(incs):
                expected_by[want] = expected_by.get(want, 0) + 1
            if args.allow_overloaded:
                allowed = allowed | {"overloaded"}
            status = STATUS.get(a["status"], str(a["status"]))
            answered_by[status] = answered_by.get(status, 0) + 1
            if status not in allowed:
                violations.append(
                    f"{name}: answered {status}, want {want} "
                    f"({len(r['indices'])} of {f['count']} fragments arrived)"
                )
            if ts < r["first_ts"]:
                violations.append(f"{name}: answered before its first fragment arrived")
            if a["send_ts"] != f["send_ts"]:
                violations.append(f"{name}: send_ts_ns {a['send_ts']} echoed, want {f['send_ts']}")
            if (a["type"] == 2) != (status == "ok"):
                violations.append(f"{name}: message type {a['type']} with status {status}")
    for key, got in answers.items():
        if key not in requests:
            violations.append(
                f"{ip_str(key[0])}:{key[1]} if {key[2]} request {key[3]}: {len(got)} answer(s), "
                "but no well-formed fragment of it arrived"
            )
    report = {
        **counts,
        "input_reasons": dict(sorted(reasons.items())),
        "requests": len(requests),
        "expected": dict(sorted(expected_by.items())),
        "timing": timing,
        "answers": sum(len(v) for v in answers.values()),
        "answered": dict(sorted(answered_by.items())),
        "violations": len(violations),
        "first_violations": violations[:20],
    }
    print(json.dumps(report))
    return 1 if violations else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--capture", required=True)
    p.add_argument("--platform-ip", required=True)
    p.add_argument("--platform-mac", required=True)
    p.add_argument("--deployed", required=True, help="IF_ID:INPUT_BYTES,...")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--reassembly-timeout-ms", type=int, default=1000, help="the IFs' (kp-if's option)")
    p.add_argument(
        "--answered-ttl-ms", type=int, default=None,
        help="how long the IFs remember a request from its first fragment (default: 4 x the timeout, kp-if's)",
    )
    p.add_argument(
        "--timing-margin-ms", type=int, default=None,
        help="how far the platform's clock may disagree with the capture's (default: half the timeout)",
    )
    p.add_argument(
        "--allow-overloaded", action="store_true",
        help="accept OVERLOADED for any request the platform answers (shed under load)",
    )
    args = p.parse_args()
    try:
        return check(args)
    except (OSError, ValueError) as e:
        print(f"exactly_once_check: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
