#!/usr/bin/env python3
"""Checks a capture of the platform's answers against kp-gen's manifest:
every request that was sent gets exactly one answer.

    check_answers.py MANIFEST.json ANSWERS.pcap [--sent-requests N] [--json OUT.json]

ANSWERS.pcap is what `tcpdump -w` captured on the client's side (classic
pcap, Ethernet, µs or ns timestamps; other traffic in it is ignored). An
answer is a docs/PROTOCOL.md response (type 2) or error (type 3) from the
manifest's platform address and port to one of its client ports. A request
is (src port, if_id, request_id) as the manifest lists them (one client IP).

--sent-requests N: only the first N requests of the manifest were sent (a
replay cut short); the others must get no answer.

Prints, per IF, the answers by status, latency and batch size as the
platform reported them in each answer, then
    "N requests, N answered exactly once, 0 lost, 0 duplicated"
and exits 0 -- or says what is wrong (lost, duplicated, unexpected answers)
and exits 1.
"""
import argparse
import json
import struct
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from stats import percentile  # noqa: E402  (the one percentile: nearest rank)

MAGIC = 0x4B4E5054
STATUS = ["ok", "unknown_if", "bad_request", "incomplete", "overloaded", "internal"]


def read_pcap(path):
    """Yields (timestamp_s, frame bytes) of a classic pcap file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        # tcpdump killed before it wrote its header: nothing captured.
        return
    magic_le = struct.unpack_from("<I", data, 0)[0]
    if magic_le in (0xA1B2C3D4, 0xA1B23C4D):
        end = "<"
        magic = magic_le
    else:
        end = ">"
        magic = struct.unpack_from(">I", data, 0)[0]
        if magic not in (0xA1B2C3D4, 0xA1B23C4D):
            raise SystemExit(f"check_answers: {path} is not a classic pcap file (pcapng?)")
    frac = 1e-9 if magic == 0xA1B23C4D else 1e-6
    linktype = struct.unpack_from(end + "I", data, 20)[0]
    if linktype != 1:
        raise SystemExit(f"check_answers: {path}: link type {linktype}, not Ethernet")
    off = 24
    while off + 16 <= len(data):
        sec, sub, incl, _orig = struct.unpack_from(end + "IIII", data, off)
        off += 16
        if off + incl > len(data):
            break  # a record cut short by tcpdump's end
        yield sec + sub * frac, data[off:off + incl]
        off += incl


def parse_answer(frame):
    """(src ip, src port, dst port, header fields) of a kneepoint answer, or None."""
    off = 12
    ethertype = struct.unpack_from(">H", frame, off)[0] if len(frame) >= 14 else 0
    off = 14
    if ethertype == 0x8100 and len(frame) >= 18:
        ethertype = struct.unpack_from(">H", frame, 16)[0]
        off = 18
    if ethertype != 0x0800 or len(frame) < off + 20:
        return None
    ihl = (frame[off] & 0x0F) * 4
    if frame[off] >> 4 != 4 or frame[off + 9] != 17:
        return None
    src_ip = ".".join(str(b) for b in frame[off + 12:off + 16])
    udp = off + ihl
    if len(frame) < udp + 8 + 36:
        return None
    sport, dport = struct.unpack_from(">HH", frame, udp)
    p = udp + 8
    magic, version, typ, if_id, request_id, send_ts, status, k, batch, latency_us = \
        struct.unpack_from(">IBBHQQIHHI", frame, p)
    if magic != MAGIC or version != 1 or typ not in (2, 3):
        return None
    return src_ip, sport, dport, {
        "type": typ, "if_id": if_id, "request_id": request_id, "send_ts_ns": send_ts,
        "status": status, "k": k, "batch_size": batch, "latency_us": latency_us,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("answers")
    ap.add_argument("--sent-requests", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    m = json.load(open(args.manifest))
    cfg = m["config"]
    platform_ip, platform_port = cfg["dst_ip"], cfg["dst_port"]
    requests = m["requests"]
    sent = requests if args.sent_requests is None else requests[:args.sent_requests]
    not_sent = {} if args.sent_requests is None else {
        (r["src_port"], r["if_id"], r["request_id"]): r for r in requests[args.sent_requests:]}
    # Requests that must be answered: every one with a well-formed fragment.
    want = {(r["src_port"], r["if_id"], r["request_id"]): r
            for r in sent if r.get("expected") != "none"}
    silent = {(r["src_port"], r["if_id"], r["request_id"])
              for r in sent if r.get("expected") == "none"}

    answers = defaultdict(list)
    other = 0
    for _ts, frame in read_pcap(args.answers):
        a = parse_answer(frame)
        if a is None:
            other += 1
            continue
        src_ip, sport, dport, h = a
        if src_ip != platform_ip or sport != platform_port:
            other += 1
            continue
        answers[(dport, h["if_id"], h["request_id"])].append(h)

    lost = [k for k in want if k not in answers]
    dup = {k: v for k, v in answers.items() if k in want and len(v) > 1}
    once = sum(1 for k in want if len(answers.get(k, ())) == 1)
    unexpected = {k: v for k, v in answers.items() if k not in want}
    late_replay = {k for k in unexpected if k in not_sent}

    # Per IF: answers by status, latency and batch size (the first answer
    # of each request).
    per_if = defaultdict(lambda: {"requests": 0, "answered": 0, "status": Counter(),
                                  "latency_us": [], "batch": []})
    for k, r in want.items():
        s = per_if[r["if_id"]]
        s["requests"] += 1
        got = answers.get(k)
        if not got:
            continue
        s["answered"] += 1
        h = got[0]
        name = STATUS[h["status"]] if h["status"] < len(STATUS) else f"status_{h['status']}"
        s["status"][name] += 1
        if h["status"] == 0:
            s["latency_us"].append(h["latency_us"])
            s["batch"].append(h["batch_size"])

    print(f"{'IF':>3}  {'requests':>8}  {'answered':>8}  {'ok':>6}  {'overload':>8}  "
          f"{'incompl':>7}  {'other err':>9}  {'p50 ms':>7}  {'p99 ms':>7}  "
          f"{'batch avg':>9}  {'batch max':>9}")
    summary_ifs = {}
    for if_id in sorted(per_if):
        s = per_if[if_id]
        st = s["status"]
        other_err = sum(v for n, v in st.items() if n not in ("ok", "overloaded", "incomplete"))
        p50, p99 = percentile(s["latency_us"], 0.5), percentile(s["latency_us"], 0.99)
        bavg = sum(s["batch"]) / len(s["batch"]) if s["batch"] else None
        bmax = max(s["batch"]) if s["batch"] else None
        fmt = lambda v, f: "-" if v is None else format(v, f)
        print(f"{if_id:>3}  {s['requests']:>8}  {s['answered']:>8}  {st['ok']:>6}  "
              f"{st['overloaded']:>8}  {st['incomplete']:>7}  {other_err:>9}  "
              f"{fmt(p50 and p50 / 1e3, '.1f'):>7}  {fmt(p99 and p99 / 1e3, '.1f'):>7}  "
              f"{fmt(bavg, '.2f'):>9}  {fmt(bmax, 'd'):>9}")
        summary_ifs[if_id] = {"requests": s["requests"], "answered": s["answered"],
                              "status": dict(st), "p50_us": p50, "p99_us": p99,
                              "batch_mean": bavg, "batch_max": bmax}

    n = len(want)
    line = (f"{n} requests, {once} answered exactly once, {len(lost)} lost, "
            f"{len(dup)} duplicated")
    problems = []
    if lost:
        problems.append(f"{len(lost)} requests got no answer, e.g. (src port, if, id) "
                        + ", ".join(str(k) for k in sorted(lost)[:8]))
    if dup:
        problems.append(f"{len(dup)} requests got more than one answer, e.g. "
                        + ", ".join(f"{k}: {len(v)}x {[STATUS[h['status']] for h in v]}"
                                    for k, v in sorted(dup.items())[:5]))
    stray = {k: v for k, v in unexpected.items() if k not in late_replay}
    if stray:
        problems.append(f"{len(stray)} answers to requests that were never sent, e.g. "
                        + ", ".join(str(k) for k in sorted(stray)[:5]))
    if late_replay:
        problems.append(f"{len(late_replay)} answers to requests past --sent-requests")
    answered_silent = silent & set(answers)
    if answered_silent:
        problems.append(f"{len(answered_silent)} answers to requests with no well-formed fragment")
    if n == 0:
        problems.append("no request to check (empty manifest?)")

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"requests": n, "answered_once": once, "lost": len(lost),
                       "duplicated": len(dup), "unexpected": len(unexpected),
                       "other_packets": other,
                       "ifs": {str(k): v for k, v in summary_ifs.items()}}, f)
            f.write("\n")
    if problems:
        print(line)
        for p in problems:
            print(f"FAIL: {p}")
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
