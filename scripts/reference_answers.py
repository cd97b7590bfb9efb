#!/usr/bin/env python3
"""What onnxruntime itself answers for every complete request of a pcap.

Independent of the platform's Rust code: it parses the pcap and the
kneepoint fragments here (docs/PROTOCOL.md), reassembles each request whose
fragments all arrived and agree, preprocesses it as the model's config.toml
says, runs the model with onnxruntime's Python API, and writes the top-k
(class, score) per request as JSON:

  {"<src_port>:<request_id>": {"if_id": 1, "classes": [...], "scores": [...]}, ...}

Usage: reference_answers.py --pcap in.pcap --models models/squeezenet [...] --out ref.json
"""
import argparse
import json
import struct
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnxruntime as ort

MAGIC = 0x4B4E5054


def frames(path):
    data = Path(path).read_bytes()
    magic = struct.unpack_from("<I", data, 0)[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from(endian + "IIII", data, off)
        off += 16
        yield data[off:off + incl]
        off += incl


def udp_payload(frame):
    """(src_port, dst_port, payload) of an Ethernet[/VLAN]/IPv4/UDP frame, else None."""
    if len(frame) < 14:
        return None
    eth_type, off = struct.unpack_from(">H", frame, 12)[0], 14
    if eth_type == 0x8100:
        if len(frame) < 18:
            return None
        eth_type, off = struct.unpack_from(">H", frame, 16)[0], 18
    if eth_type != 0x0800 or len(frame) < off + 20:
        return None
    ihl = (frame[off] & 0x0F) * 4
    total = struct.unpack_from(">H", frame, off + 2)[0]
    flags_frag = struct.unpack_from(">H", frame, off + 6)[0]
    if frame[off] >> 4 != 4 or frame[off + 9] != 17 or flags_frag & 0x3FFF or ihl < 20:
        return None
    words = struct.unpack_from(">%dH" % (ihl // 2), frame, off)
    csum = sum(words)
    while csum >> 16:
        csum = (csum & 0xFFFF) + (csum >> 16)
    if csum != 0xFFFF or len(frame) < off + total:
        return None
    udp = off + ihl
    sport, dport, ulen = struct.unpack_from(">HHH", frame, udp)
    if ulen < 8 or udp + ulen > off + total:
        return None
    return sport, dport, frame[udp + 8:udp + ulen]


def fragments(pcap, port):
    for frame in frames(pcap):
        p = udp_payload(frame)
        if p is None:
            continue
        sport, dport, pl = p
        if dport != port or len(pl) < 32:
            continue
        magic, ver, typ, if_id, rid, total, idx, count, ts = struct.unpack_from(">IBBHQIHHQ", pl, 0)
        if magic != MAGIC or ver != 1 or typ != 1 or total < 1 or count < 1 or idx >= count:
            continue
        stride = -(-total // count)
        if (count - 1) * stride >= total:
            continue
        start, end = idx * stride, min((idx + 1) * stride, total)
        if len(pl) - 32 != end - start:
            continue
        yield (sport, if_id, rid), (total, count, ts), idx, start, pl[32:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pcap", required=True)
    ap.add_argument("--models", nargs="+", required=True, help="model folders (config.toml + model.onnx)")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    models = {}
    for folder in args.models:
        cfg = tomllib.loads((Path(folder) / "config.toml").read_text())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(Path(folder) / cfg["model_file"]), opts,
                                    providers=["CPUExecutionProvider"])
        models[cfg["if_id"]] = (cfg, sess)

    requests = {}
    for key, meta, idx, start, payload in fragments(args.pcap, args.port):
        if key[1] not in models:
            continue
        r = requests.setdefault(key, {"meta": meta, "parts": {}, "bad": False})
        if r["meta"] != meta:
            r["bad"] = True
        r["parts"].setdefault(idx, (start, payload))

    out = {}
    for (sport, if_id, rid), r in sorted(requests.items()):
        cfg, sess = models[if_id]
        total, count, _ = r["meta"]
        c, h, w = cfg["input"]["shape"]
        fmt = cfg["input"]["format"]
        size = h * w * c if fmt == "rgb_u8_hwc" else c * h * w * 4
        if r["bad"] or total != size or len(r["parts"]) != count:
            continue  # not OK-able: BAD_REQUEST or INCOMPLETE
        buf = bytearray(total)
        for start, payload in r["parts"].values():
            buf[start:start + len(payload)] = payload
        if fmt == "rgb_u8_hwc":
            img = np.frombuffer(bytes(buf), dtype=np.uint8).reshape(h, w, c).astype(np.float32)
            mean = np.array(cfg["input"]["mean"], dtype=np.float32)
            std = np.array(cfg["input"]["std"], dtype=np.float32)
            x = ((img / np.float32(255.0) - mean) / std).transpose(2, 0, 1)[None].copy()
        else:
            x = np.frombuffer(bytes(buf), dtype="<f4").reshape(1, c, h, w).astype(np.float32)
        y = sess.run(None, {cfg["input"]["name"]: x})[0].reshape(-1)
        k = min(cfg.get("top_k", 5), y.size)
        order = sorted(range(y.size), key=lambda i: (-float(y[i]), i))[:k]
        out[f"{sport}:{rid}"] = {"if_id": if_id, "classes": order,
                                 "scores": [float(y[i]) for i in order]}
    Path(args.out).write_text(json.dumps(out))
    print(f"reference_answers: {len(out)} complete requests answered by onnxruntime {ort.__version__}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
