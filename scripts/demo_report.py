#!/usr/bin/env python3
"""What scripts/demo.sh prints from the orchestrator's JSON.

    kpctl --json status | demo_report.py status T     one line per IF, T s into the replay
    kpctl --json status | demo_report.py field IF KEY  one field of one IF's status row
    kpctl --json status | demo_report.py serving IF MS exit 0 if IF is active with SLO MS
    demo_report.py summary SUMMARY.json               switchover gaps and if-manager counters
    demo_report.py frags MANIFEST.json                fragments per request (kp-gen's manifest)
    tail -F orchestrator.log | demo_report.py events  the orchestrator's log, tuning lines made short
"""
import json
import signal
import sys


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def read_status():
    """`kpctl --json status` from stdin, or None if kpctl printed none."""
    try:
        return json.loads(sys.stdin.read())
    except ValueError:
        return None


def status(t):
    s = read_status()
    if s is None:
        print(f"   t={t:>3}s  (no status: the orchestrator did not answer)")
        return
    for r in s["ifs"]:
        att = r.get("slo_attainment")
        print(f"   t={t:>3}s  if {r['if_id']} {r['model']:<10} {r['state']:<9}"
              f" share {r['share_pct']:5.1f}%  SLO {r['slo_ms']:>4g} ms"
              f"  batch {fmt(r.get('mean_batch_size'), '.1f'):>3}/{fmt(r.get('batch_size'), 'd'):<2}"
              f"  {fmt(r.get('throughput_rps'), '5.1f'):>5} req/s"
              f"  p99 {fmt(r.get('p99_ms'), '5.1f'):>5} ms"
              f"  in SLO {fmt(None if att is None else 100 * att, '3.0f'):>3}%"
              f"  switchovers {r['switchovers']}")


def field(if_id, key):
    s = read_status()
    if s is None:
        raise SystemExit("demo_report: no status: the orchestrator did not answer")
    row = next((r for r in s["ifs"] if r["if_id"] == int(if_id)), None)
    if row is None:
        raise SystemExit(f"demo_report: if {if_id} is not in the status")
    print(row.get(key))


def serving(if_id, slo_ms):
    """Exit 0 if IF if_id is active with that SLO."""
    s = read_status() or {"ifs": []}
    row = next((r for r in s["ifs"] if r["if_id"] == int(if_id)), None)
    ok = row is not None and row["state"] == "active" and row["slo_ms"] == float(slo_ms)
    raise SystemExit(0 if ok else 1)


def summary(path):
    s = json.load(open(path))
    for i in s["ifs"]:
        gaps = i["switchover_gaps_us"]
        g = ", ".join(f"{x:.0f}" for x in gaps) or "-"
        worst = f" (worst {max(gaps):.0f} µs)" if gaps else ""
        print(f"   if {i['if_id']}: {i['switchovers']} switchovers, service gaps µs: {g}{worst};"
              f" failovers {i['failovers']}")
    ifm = s.get("if_manager") or {}
    o = ifm.get("outcomes") or {}
    if o:
        print(f"   if-manager: {ifm.get('rx_packets')} packets received, {o.get('delivered')} delivered"
              f" to IFs, {o.get('ring_full')} ring full, {o.get('malformed')} malformed,"
              f" {(ifm.get('tx') or {}).get('sent')} answers sent,"
              f" {(ifm.get('mempool') or {}).get('in_use_at_exit')} mbufs in use at exit")


def events():
    """The orchestrator's log lines as they come, the tuning loop's JSON
    decisions made short. Ctrl-C is the demo's to handle: this goes on until
    its input ends (tail exits with the orchestrator)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line.startswith("orchestrator: ready"):
            continue
        if line.startswith("orchestrator: "):
            line = line[len("orchestrator: "):]
        if line.startswith("tuning: {"):
            try:
                d = json.loads(line[len("tuning: "):])
                o = d["inputs"]["observation"]
                line = (f"tuning: if {d['if_id']} needs {d['to_pct']:.0f}% of the device, was"
                        f" {d['from_pct']:.0f}% ({d['reason']}: latency {o['latency_ms']:.1f} ms"
                        f" of {o['slo_ms']:g}, {o['throughput_rps']:.1f} of {o['arrival_rps']:.1f}"
                        f" req/s served)")
            except (ValueError, KeyError, TypeError):
                pass
        print(f"   [orchestrator] {line}", flush=True)


def frags(path):
    m = json.load(open(path))
    print(m["requests"][0]["frag_count"])


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"status": status, "field": field, "serving": serving, "summary": summary,
     "events": events, "frags": frags}[cmd](*args)


if __name__ == "__main__":
    main()
