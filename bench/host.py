"""Facts about the machine a benchmark ran on, for the meta.json of
scripts/bench-if.sh and scripts/bench-orchestrator.sh: the CPU model, the
load average and the commit measured. Parsers take the text of the /proc
file, so that tests need no /proc.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import provenance  # beside this file, in bench/


def number(s: str):
    """An int where the script's setting is one, else a float (as the
    values were written into meta.json before)."""
    try:
        return int(s)
    except ValueError:
        return float(s)


def cpu_model(cpuinfo: str) -> str:
    """The first "model name" of /proc/cpuinfo; "" when there is none."""
    cpu = [l.split(":", 1)[1].strip() for l in cpuinfo.splitlines(True) if l.startswith("model name")]
    return cpu[0] if cpu else ""


def load_average(loadavg: str) -> list[str]:
    """The 1, 5 and 15 minute load averages of /proc/loadavg, as written."""
    return loadavg.split()[:3]


def git_head(repo: str) -> str:
    """The short hash of REPO's HEAD, with "+dirty" when its measured code
    (bench/provenance.py) differs from HEAD's in the work tree: what was
    measured is then not that commit. Documentation (the benchmarks' own
    output, generated sections and plots, included), tests and report
    rendering may change during a run. "" outside a git checkout."""
    head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if not head:
        return ""
    changed = provenance.measured_changes("HEAD", repo=Path(repo))
    return head + ("+dirty" if changed is None or changed else "")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def run_line(when: str, commit: str, cpu: str, cpus: int) -> str:
    """What a generated report's heading says about its run: when, the
    commit measured, the machine."""
    return f"{when}, commit {commit or 'not recorded'}, {cpu or 'CPU unknown'}, {cpus} CPUs"


def this_run_line(repo: str) -> str:
    """run_line for a run ending now on this machine, of REPO's commit."""
    return run_line(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), git_head(repo),
                    cpu_model(read("/proc/cpuinfo")), os.cpu_count() or 0)


def main(argv: list[str]) -> int:
    """host.py run-line REPO: this run's line (now, REPO's commit, this
    machine), for a shell harness's report."""
    if len(argv) != 2 or argv[0] != "run-line":
        print("usage: host.py run-line REPO", file=sys.stderr)
        return 2
    print(this_run_line(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
