"""Does the batching policy ever lose to batch 1? The report of
scripts/bench-policy.sh (docs/PERFORMANCE.md, "Batching policy: does it
ever lose to batch 1?"): scripts/bench-if.sh's saturation phase for four
arms — the policy (batches up to 8) and batches of 1, each at 32 and at 4
requests outstanding — over several alternated rounds, each arm's figures
as median [smallest–largest] over its runs, and per concurrency the
verdict: over three runs of each arm, the policy loses only where its
spread lies wholly below batch 1's, wins where wholly above. The figure
judged is the share of the phase that batches of 1 would have needed for
the run's OK answers, batch 1's time per image taken inside the IF at
the same moments (bench_if.engine_vs_batch1_nearby: a machine's drift
within a run or between runs moves both sides alike); where a run lacks
it, OK answers per second over the run's engine alone at batch 1, timed
for 2 s before and after the run, which drift between those seconds and
the phase moves (batch 1 alone ranged 3.30-3.88 ms across one session's
runs). Standard library only; tested in bench/test_policy_report.py.

    policy_report.py OUT RUN_LINE COMMAND   # OUT/*/summary.json -> markdown
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from report import spread, spread_text


def figures(summary: dict) -> dict:
    """One bench-if run's saturation figures: the arm (its max batch and
    concurrency), OK answers/s, the mean batch, OK answers/s over the same
    run's engine alone at batch 1 (images/s), the engine's time for the
    batches over batch 1's at the same moments inside the IF (kp-if's
    trace) and the share of the phase batches of 1 would have needed for
    the OK answers, the share of the phase the engine sat idle with a
    request complete, and the policy's waits over the run."""
    meta, sat = summary["meta"], summary["phases"]["sat"]
    batch1_per_s = 1000.0 / float(summary["engine_ref_ms"]["1"])
    nearby_ms = sat.get("batch1_ms_per_image_nearby")
    return {
        "max_batch": int(meta["max_batch"]), "concurrency": int(meta["concurrency"]), "git": meta["git"],
        "ok_per_s": sat["ok_per_s"], "mean_batch": sat.get("mean_batch"),
        "ok_vs_engine_b1": sat["ok_per_s"] / batch1_per_s,
        "mix_vs_b1": sat.get("engine_own_per_image_mix_vs_batch1"),
        "vs_b1_nearby": sat.get("engine_own_vs_batch1_nearby"),
        "b1_share_needed": None if nearby_ms is None else sat["ok_per_s"] * nearby_ms / 1000,
        "idle_complete": sat.get("engine_idle_with_request_complete_fraction"),
        "waits": ((summary.get("kp_if_final") or {}).get("batching") or {}).get("waits"),
    }


def cell(xs: list, nd: int, scale: float = 1.0, unit: str = "") -> str:
    """Median [smallest–largest] of the values present, each times scale,
    nd decimals (report.spread_text); "-" if none."""
    return spread_text(spread([x * scale for x in xs if x is not None]), nd, unit)


RUNS_FOR_A_VERDICT = 3


def verdict(policy: list[float], batch1: list[float]) -> str:
    """The policy against batch 1 on the same figure: a loss or a win only
    over RUNS_FOR_A_VERDICT runs of each, where the spreads do not overlap."""
    if min(len(policy), len(batch1)) < RUNS_FOR_A_VERDICT:
        return f"is not judged: a verdict needs {RUNS_FOR_A_VERDICT} runs of each arm"
    if max(policy) < min(batch1):
        return "**loses**: its spread lies below batch 1's"
    if min(policy) > max(batch1):
        return "wins: its spread lies above batch 1's"
    return "does not lose: the spreads overlap"


def markdown(runs: list[dict], run_line: str, command: str) -> str:
    """The report: one row per arm, then per concurrency the policy against
    batch 1, and the target (never loses to batch 1) met or not."""
    arms: dict[tuple[int, int], list[dict]] = {}
    for r in runs:
        arms.setdefault((r["concurrency"], r["max_batch"]), []).append(r)
    rounds = max((len(v) for v in arms.values()), default=0)
    L = [f"#### The batching policy against batches of 1 ({run_line})", "",
         f"`{command}`: {rounds} round(s) of four arms alternated, saturation (closed loop) of each; "
         "median [smallest–largest] over the runs of an arm.", "",
         "| saturation | runs | OK answers/s | mean batch | OK/s ÷ the run's engine at batch 1 "
         "| engine time in the IF ÷ batch 1's at the same moments "
         "| share of the phase batches of 1 would need for the OK answers "
         "| engine idle with a request complete | policy's waits per run |",
         "|---|---|---|---|---|---|---|---|---|"]
    for (conc, mb), rs in sorted(arms.items(), key=lambda kv: (-kv[0][0], -kv[0][1])):
        name = f"{'policy (max batch ' + str(mb) + ')' if mb > 1 else 'batch 1'}, {conc} outstanding"
        L.append(f"| {name} | {len(rs)} | {cell([r['ok_per_s'] for r in rs], 1)} "
                 f"| {cell([r['mean_batch'] for r in rs], 2)} "
                 f"| {cell([r['ok_vs_engine_b1'] for r in rs], 3)} "
                 f"| {cell([r['vs_b1_nearby'] for r in rs], 4)} "
                 f"| {cell([r['b1_share_needed'] for r in rs], 4)} "
                 f"| {cell([r['idle_complete'] for r in rs], 2, 100, '%')} "
                 f"| {cell([r['waits'] for r in rs], 0)} |")
    L += ["", "Judged on the share of the phase batches of 1 would have needed for the OK answers, batch 1's "
          "time per image taken inside the IF within 1 s of each batch (batches of 1 right after one, as they "
          "run where batch 1 is the plan), so that the machine's drift within and between runs moves both "
          "sides alike; where a run lacks it, on OK/s ÷ the run's engine alone at batch 1 (timed 2 s before "
          "and after the run).", ""]
    losses, judged, unjudged = [], [], []
    for conc in sorted({c for c, _ in arms}, reverse=True):
        here = [(mb, r) for (c, mb), rs in arms.items() if c == conc for r in rs]
        key, what = ("b1_share_needed", "batch 1's share of the phase for the same answers")
        if any(r[key] is None for _, r in here):
            key, what = "ok_vs_engine_b1", "OK/s ÷ the engine at batch 1"
        pol = [r[key] for mb, r in here if mb > 1]
        one = [r[key] for mb, r in here if mb == 1]
        if not pol or not one:
            continue
        v = verdict(pol, one)
        (unjudged if v.startswith("is not judged") else judged).append(conc)
        if v.startswith("**loses"):
            losses.append(conc)
        L.append(f"- {conc} outstanding: the policy's {what} is "
                 f"{statistics.median(pol) / statistics.median(one):.4f} of batch 1's (medians); it {v}.")
    target = "Target (issue 13, item 1): the policy never loses to batch 1:"
    if losses:
        L += ["", f"{target} **not met** (loses at {', '.join(map(str, losses))} outstanding)."]
    elif unjudged or not judged:
        L += ["", f"{target} not judged (fewer than {RUNS_FOR_A_VERDICT} runs of an arm)."]
    else:
        L += ["", f"{target} **met**."]
    commits = sorted({r["git"] for r in runs})
    L += ["", f"Binaries of {', '.join(commits)}."]
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, run_line, command = argv
    runs = [figures(json.loads(p.read_text())) for p in sorted(Path(out).glob("*/summary.json"))]
    if not runs:
        print(f"policy_report: no */summary.json under {out}", file=sys.stderr)
        return 1
    sys.stdout.write(markdown(runs, run_line, command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
