#!/usr/bin/env python3
"""Side by side: kneepoint, Triton Inference Server and Ray Serve on the same
machine, the same model, the same cores, the same intra-op threads and the
same SLO — and the engine limit they are all bounded by. kneepoint's
policy sizes each batch under the SLO; the peers' batch cap is tuned for
the SLO from the same run's engine limit (peer_max_batch), as an operator
would size Triton's max_batch_size.

    make bench                                 # (as root) everything, hours (levels of >= 2,000 requests)
    .venv/bin/python bench/bench.py            # just this benchmark
    BENCH_MODELS=squeezenet BENCH_SYSTEMS=kneepoint,triton .venv/bin/python bench/bench.py
    .venv/bin/python bench/bench.py --smoke --out /tmp/x   # what `make test` runs (< 60 s)
    .venv/bin/python bench/bench.py --report-only           # redraw from the CSVs
    .venv/bin/python bench/bench.py --combine docs/bench/runs/peers   # the runs rep-*/: medians, spreads

`make bench-peers` runs it BENCH_REPEATS (3) times for each model, one
model at a time, into target/bench/peers/rep-K/<model>/, keeps each run's
summary in docs/bench/runs/peers/rep-K/<model>/ (BENCH_ARCHIVE), then --combine:
each system's capacity as a median and a spread over the runs, each ratio
with its spread, and a comparison called a win (or a loss) only when the
two capacity spreads do not overlap; the conclusions are written by
report.repeats_markdown, not by hand. The runs may come from separate
sessions (BENCH_REPEAT_FROM picks the first K to run, BENCH_MODELS the
models), and --combine says so when they did not all measure the same
code (bench/provenance.py: commits that differ only in documentation,
tests or report code are one record).

Per model (the SLO: BENCH_SLO_X times the engine's batch-1 median measured
in the same run, 4 by default, or models/<name>/config.toml's with 0):
 1. engine limit: ONNX Runtime alone (bench/engine_limit.py) on the inference
    core, per batch size; the best images/s is the ceiling;
 2. per system, started fresh, warmed up, then driven open loop (Poisson
    arrivals) at offered rates chosen by bench/capacity_search.py: scouts
    (one short window each) sweep fractions of the engine limit until one
    misses the SLO and bisect to within 4%; full levels then start from
    the scouts' bracket and bisect until the last level that met the SLO and
    the first above it that did not are within 2%; then 50% of the system's
    capacity (highest OK rate of a full level meeting the SLO; the rules are
    in bench/report.py) and a saturated level. A full level runs in windows
    until the last three agree within 10% (Triton perf_analyzer's
    convention) or BENCH_MAX_WINDOWS, at least 2,000 requests and 20 s.
    - kneepoint: scripts/netns.sh veth pair, if-manager (DPDK af_packet PMD)
      in the platform namespace, kp-if (ONNX Runtime) as its secondary,
      kp-client from the client namespace (UDP, the u8 image in fragments);
    - Triton: the tritonserver binary of the nvidia-pytriton wheel, a model
      repository with a Python-backend model (bench/peers/triton/model.py:
      onnxruntime, same preprocessing) and Triton's dynamic batcher,
      driven by kp-http-load (KServe v2 HTTP, the u8 image as a binary
      tensor);
    - Ray Serve: bench/peers/ray_serve.py (@serve.batch), HTTP, kp-http-load
      (the u8 image as the body).
    The model function of both peers is bench/peers/kp_peer_model.py: the
    same session options as libml's engine and kp-if's normalisation.

Cores (2-core machine): the load generator and each system's network side
(the if-manager and kp-if's fragment loop, which reassembles requests into
the input slots — BENCH_KP_RX_CPU; tritonserver's HTTP threads and batcher;
Ray's proxy, raylet, GCS, controller) on BENCH_FRONT_CPU (0); what runs the
model (kp-if's engine and inference thread; Triton's Python-backend stub;
the Ray Serve replica) on BENCH_WORKER_CPU (1) with BENCH_THREADS (1)
intra-op thread. The engine limit runs on the worker core too.

The peers are installed by this script from PyPI into .venv-peers/<peer>/
(git-ignored) when missing; a peer that cannot be installed or started is
reported with its error and the rest still runs.

Outputs: BENCH_OUT (target/bench/peers): meta.json, engine.csv,
engine_checks.csv (the drift guard), windows.csv (every window),
levels.csv, hindsight.csv (kneepoint's levels in hindsight: hindsight.py,
from kp-if's --trace and kp-client's --record files in logs/),
summary.csv, summary.json, report.md, logs/; plots
BENCH_DOCS (docs/bench)/peers-<model>.svg; and the section between the
bench-peers markers of docs/PERFORMANCE.md is replaced by report.md
(BENCH_UPDATE_DOCS=0 to leave it). With BENCH_ARCHIVE=DIR a
finished run's summary.json (not its raw windows or logs) is copied to
DIR: `make bench-peers` keeps every run's in docs/bench/runs/peers/rep-K/
<model>/, in the repository, and combines them from there.

Environment (defaults for a full run; --smoke has tiny ones):
  BENCH_MODELS (squeezenet,resnet50)
  BENCH_SYSTEMS (kneepoint,kneepoint-ic,triton,ray: kneepoint-ic is kneepoint
    with every per-request step on the inference core, kp-if --convert-on
    inference)
  BENCH_THREADS (1) BENCH_FRONT_CPU (0) BENCH_WORKER_CPU (1)
  BENCH_MAX_BATCH (8: kp-if --max-batch; kneepoint's policy picks the size)
  BENCH_PEER_MAX_BATCH (auto: Triton's max_batch_size and @serve.batch's
    max_batch_size, per model from the engine limit measured in the run,
    see peer_max_batch; or a number, at most BENCH_MAX_BATCH)
  BENCH_BATCH_DELAY_US (500: Triton max_queue_delay_microseconds, Ray
    batch_wait_timeout_s; kneepoint's policy needs none, it uses the SLO)
  BENCH_SLO_X (4; --smoke: 0, its own rule): each model's SLO is this many
    times the engine's batch-1 median here (0: the configured SLO)
  BENCH_PEER_SHED (1: the peers may shed as kneepoint does: Ray Serve's
    HTTP request_timeout_s is the SLO, and with BENCH_TRITON_QUEUE_POLICY=
    reject Triton's default_queue_policy REJECTs a request queued longer
    than the SLO less the engine's batch-1 median; 0: neither)
  BENCH_TRITON_QUEUE_POLICY (none: Triton queues every request; reject:
    see TRITON_QUEUE_POLICIES for why it is not the default)
  BENCH_ENGINE_BATCHES (1,2,4,8) BENCH_ENGINE_SECONDS (3)
  BENCH_ENGINE_CHECK_S (3: the drift guard, batch 1 alone on the worker
    core for this many seconds after each system, every system stopped,
    so that each capacity can be read against the engine's speed around
    its own search (report.engine_around); 0: none)
  BENCH_WARMUP_S (5) BENCH_WINDOW_S (6.67) BENCH_WINDOW_MAX_S (300)
  BENCH_WINDOW_REQUESTS (667: a window lasts long enough for this many
    requests, between WINDOW_S and WINDOW_MAX_S; three windows make a
    level of at least 2,000 requests and 20 s)
  BENCH_MIN_WINDOWS (3) BENCH_MAX_WINDOWS (4) BENCH_STABILITY (0.10)
  BENCH_SWEEP (0.5,0.8,0.9,1.0,1.1: fractions of the engine limit)
  BENCH_RESOLUTION (0.02: bisect until the bracket is within 2% of its
    lower end) BENCH_REFINE (8: at most this many bisection steps)
  BENCH_SEARCH_BUDGET_S (1800: the full levels of one system's capacity
    search start within this many seconds of its first; when it runs out
    the bracket reached is reported, flagged as not resolved to the
    resolution; 0: no budget)
  BENCH_SCOUT_REQUESTS (300: a scout's window lasts long enough for this
    many requests, 3 s to BENCH_SCOUT_MAX_S (30); 0: no scouts, the sweep
    and bisection run on full levels) BENCH_SCOUT_RESOLUTION (0.04)
  BENCH_START (none: MODEL.SYSTEM=LO:HI,...: offered req/s where that
    system's full levels start, as from scouts (capacity_search.confirm:
    LO first, then HI, walking away from either if it disagrees, then
    bisection), e.g. the brackets of earlier runs; no scouts for it)
  BENCH_POINTS (0.5: fractions of the capacity, a full level each)
  BENCH_PEAK (1.2: a last level at this fraction of the engine limit, for
    each system's saturated goodput; 0 skips it)
  BENCH_CONNECTIONS (64: kp-http-load) BENCH_KP_BUSY_POLL (0)
  BENCH_KP_INFERENCE_SPIN_MS (0: kp-if --inference-spin-ms, the inference
    thread spins this long after each batch instead of dozing; it keeps
    the worker core busy while idle, the peers' does not)
  BENCH_KP_RX_CPU (BENCH_FRONT_CPU) BENCH_KP_FRAMECNT (8192: frames in the
    kernel's receive ring of the af_packet socket; DPDK's default is 512)
  BENCH_INSTALL_PEERS (1) BENCH_UPDATE_DOCS (1)
Needs root (namespaces, DPDK hugepages), `make build models`.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))
import capacity_search  # noqa: E402
import report  # noqa: E402
import hindsight  # noqa: E402
import host  # noqa: E402
import provenance  # noqa: E402

PEER_VENVS = REPO / ".venv-peers"
PEER_PACKAGES = {
    "triton": ["nvidia-pytriton==0.7.0", "onnxruntime==1.31.1", "numpy<3"],
    "ray": ["ray[serve]==2.60.0", "onnxruntime==1.31.1", "numpy<3"],
}


def dist_name(requirement: str) -> str:
    """The distribution a pip requirement names: `ray[serve]==2.60.0` -> `ray`."""
    return re.split(r"[\[=<>!~ ]", requirement, maxsplit=1)[0]


SYSTEMS = ("kneepoint", "kneepoint-ic", "triton", "ray", "stub")
# A scout's window lasts at least this long (s), and the scouts' bisection
# takes at most this many levels.
SCOUT_MIN_S = 3.0
SCOUT_REFINE = 10
# The phases of the levels that search for the capacity (capacity_search).
SEARCH_PHASES = ("sweep", "down", "refine", "confirm")
PERF_ANALYZER = "2.60.0"
HZ = os.sysconf("SC_CLK_TCK")

WINDOW_FIELDS = ["model", "system", "level", "phase", "label", "window", "offered_rps", "seconds", "seed",
                 "sent", "ok", "errors", "unanswered", "duplicates", "ok_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms",
                 "mean_batch", "lag_p99_ms", "statuses", "server_cpu_s", "worker_cpu_s", "client_cpu_s",
                 "loadavg1", "wall_s", "ok_rtt_us_counts"]
LEVEL_FIELDS = ["model", "system", "level", "phase", "label", "offered_rps", "windows", "stable", "sent", "ok",
                "failed", "error_frac", "ok_per_s", "p50_ms", "p90_ms", "p99_ms", "server_cpu_ms_per_req",
                "worker_cpu_ms_per_req", "client_cpu_ms_per_req", "meets_slo"]


def say(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def env(name, default, conv=str):
    v = os.environ.get(name)
    return conv(v) if v not in (None, "") else default


def floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def start_brackets(s: str) -> dict[str, list[float]]:
    """BENCH_START: "MODEL.SYSTEM=LO:HI,..." -> {"MODEL.SYSTEM": [LO, HI]},
    offered req/s with 0 < LO < HI; anything else is refused."""
    out: dict[str, list[float]] = {}
    for item in (x.strip() for x in s.split(",")):
        if not item:
            continue
        key, _, span = item.partition("=")
        model, _, system = key.strip().partition(".")
        try:
            lo, hi = (float(v) for v in span.split(":"))
        except ValueError:
            lo = hi = math.nan
        if not model or system not in SYSTEMS or not 0 < lo < hi:
            raise SystemExit(f"BENCH_START: {item!r}: expected MODEL.SYSTEM=LO:HI with SYSTEM one of "
                             f"{', '.join(SYSTEMS)} and 0 < LO < HI (offered req/s)")
        out[f"{model}.{system}"] = [lo, hi]
    return out


# How Triton may shed (BENCH_TRITON_QUEUE_POLICY, with BENCH_PEER_SHED=1):
# - "none": no queue policy, Triton queues every request (the default);
# - "reject": the dynamic batcher's default_queue_policy REJECTs a request
#   queued longer than the SLO less the engine's batch-1 median. Measured
#   with tritonserver 2.51 (nvidia-pytriton 0.7.0) on the 2-CPU VM, its
#   request trace shows a request that arrives while a batch runs staying
#   queued after that batch ends until the *next* request arrives, and then
#   rejected: 165 ms at 3 req/s, 500 ms under load, 25% of the requests
#   rejected at half the engine's rate against none without the policy
#   (docs/PERFORMANCE-JOURNAL.md, "Triton's queue policy"). Kept to measure it.
TRITON_QUEUE_POLICIES = ("none", "reject")


class Settings:
    def __init__(self, smoke: bool):
        self.smoke = smoke
        S = lambda full, small: small if smoke else full  # noqa: E731
        self.models = env("BENCH_MODELS", S("squeezenet,resnet50", "squeezenet")).split(",")
        self.systems = env("BENCH_SYSTEMS", S("kneepoint,kneepoint-ic,triton,ray", "kneepoint,stub")).split(",")
        self.threads = env("BENCH_THREADS", 1, int)
        self.front_cpu = env("BENCH_FRONT_CPU", 0, int)
        self.worker_cpu = env("BENCH_WORKER_CPU", 1, int)
        self.max_batch = env("BENCH_MAX_BATCH", 8, int)
        # The peers' batch cap: "auto" tunes it per model from the engine
        # limit of the same run, as an operator sizes max_batch_size for an
        # SLO (peer_max_batch); a number fixes it.
        self.peer_max_batch = env("BENCH_PEER_MAX_BATCH", "auto")
        if self.peer_max_batch != "auto" and not (self.peer_max_batch.isdigit()
                                                  and 1 <= int(self.peer_max_batch) <= self.max_batch):
            raise SystemExit(f"BENCH_PEER_MAX_BATCH={self.peer_max_batch!r}: auto or 1..{self.max_batch}")
        self.batch_delay_us = env("BENCH_BATCH_DELAY_US", 500, int)
        # The peers shed too (issue 13): Triton's queue policy rejects a
        # request that waited longer than the SLO less the engine's batch-1
        # time, Ray Serve's proxy times a request out at the SLO.
        self.peer_shed = env("BENCH_PEER_SHED", 1, int) == 1
        # Triton's way to shed: its default_queue_policy with REJECT holds a
        # request queued behind a running batch until the next request
        # arrives (tritonserver 2.51, see TRITON_QUEUE_POLICIES), so by
        # default Triton runs without it and queues every request.
        self.triton_queue_policy = env("BENCH_TRITON_QUEUE_POLICY", "none")
        if self.triton_queue_policy not in TRITON_QUEUE_POLICIES:
            raise SystemExit(f"BENCH_TRITON_QUEUE_POLICY={self.triton_queue_policy!r}: "
                             f"one of {', '.join(TRITON_QUEUE_POLICIES)}")
        # The SLO of each model: this many times the engine's batch-1
        # median measured in the same run, so that it means the same on a
        # machine 3x slower (0: the model's configured SLO).
        self.slo_x = env("BENCH_SLO_X", S(4.0, 0.0), float)
        self.engine_batches = env("BENCH_ENGINE_BATCHES", S("1,2,4,8", "1,2"))
        self.engine_seconds = env("BENCH_ENGINE_SECONDS", S(3.0, 0.3), float)
        # The drift guard: the systems run one after another on a machine
        # whose speed drifts, so the engine alone is timed again after each.
        self.engine_check_s = env("BENCH_ENGINE_CHECK_S", S(3.0, 0.3), float)
        self.warmup_s = env("BENCH_WARMUP_S", S(5.0, 0.5), float)
        # A level's three windows hold at least 2,000 requests and 20 s
        # (issue 13), so that a p99 rests on 20 requests beyond it.
        self.window_s = env("BENCH_WINDOW_S", S(20 / 3, 0.5), float)
        self.window_max_s = env("BENCH_WINDOW_MAX_S", S(300.0, 0.5), float)
        self.window_requests = env("BENCH_WINDOW_REQUESTS", S(667, 5), int)
        self.min_windows = env("BENCH_MIN_WINDOWS", S(3, 2), int)
        self.max_windows = max(self.min_windows, env("BENCH_MAX_WINDOWS", S(4, 2), int))
        self.stability = env("BENCH_STABILITY", 0.10, float)
        self.sweep = floats(env("BENCH_SWEEP", S("0.5,0.8,0.9,1.0,1.1", "0.1,0.2")))
        # Capacity by bisection until the bracket is within this fraction
        # of its lower end (at most BENCH_REFINE steps).
        self.resolution = env("BENCH_RESOLUTION", 0.02, float)
        self.refine = env("BENCH_REFINE", S(8, 0), int)
        # Seconds of full levels a system's capacity search may start
        # levels in (capacity_search.budgeted; 0: no budget). Where it runs
        # out the bracket reached is reported as not resolved.
        self.search_budget_s = env("BENCH_SEARCH_BUDGET_S", S(1800.0, 0.0), float)
        # Scouts (capacity_search): one short window per level, to a
        # coarse bracket, before the full levels that decide (0: none).
        self.scout_requests = env("BENCH_SCOUT_REQUESTS", S(300, 0), int)
        self.scout_max_s = env("BENCH_SCOUT_MAX_S", 30.0, float)
        self.scout_resolution = env("BENCH_SCOUT_RESOLUTION", 0.04, float)
        # Where a system's full levels start instead of from its scouts
        # (BENCH_START), keyed "MODEL.SYSTEM".
        self.start = start_brackets(env("BENCH_START", ""))
        self.points = floats(env("BENCH_POINTS", S("0.5", "0.25,0.5")))
        self.peak = env("BENCH_PEAK", S(1.2, 0.0), float)
        self.connections = env("BENCH_CONNECTIONS", S(64, 8), int)
        self.busy_poll = env("BENCH_KP_BUSY_POLL", 0, int) == 1
        self.kp_inference_spin_ms = env("BENCH_KP_INFERENCE_SPIN_MS", 0, int)
        if self.kp_inference_spin_ms < 0:
            raise SystemExit("bench: BENCH_KP_INFERENCE_SPIN_MS must be >= 0")
        # kp-if's fragment loop (its EAL lcore: reassembly into the input
        # slots) runs with the network side, like the peers' HTTP threads;
        # its engine and inference thread on the worker core (--cores).
        self.kp_rx_cpu = env("BENCH_KP_RX_CPU", self.front_cpu, int)
        self.kp_framecnt = env("BENCH_KP_FRAMECNT", 8192, int)
        self.install = env("BENCH_INSTALL_PEERS", S(1, 0), int) == 1
        self.update_docs = env("BENCH_UPDATE_DOCS", S(1, 0), int) == 1
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise SystemExit(f"bench: unknown systems {bad} (known: {', '.join(SYSTEMS)})")

    def as_dict(self):
        return dict(vars(self))

    @classmethod
    def recorded(cls, d: dict) -> "Settings":
        """The settings a run recorded (meta.json's "settings", as_dict),
        for redrawing its report later without the environment it ran in."""
        s = cls.__new__(cls)
        s.__dict__.update(d)
        return s


# --- processes --------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = open(f"/proc/{d}/stat").read()
                ppid = int(st[st.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(roots: list[int]) -> list[int]:
    kids = children_map()
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        if p in out or not os.path.exists(f"/proc/{p}"):
            continue
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_ticks(pid: int) -> int:
    try:
        st = open(f"/proc/{pid}/stat").read()
        f = st[st.rindex(")") + 2:].split()
        return int(f[11]) + int(f[12])  # utime + stime, all threads
    except (OSError, ValueError, IndexError):
        return 0


def comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def pin_process(pid: int, cpu: int) -> int:
    """Every thread of pid onto cpu (threads made later inherit it)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
            n += 1
        except OSError:
            pass
    return n


def wait_for_line(path: Path, text: str, proc: subprocess.Popen, what: str, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if text in line:
                    return line
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before '{text}': {tail(path)}")
        time.sleep(0.1)
    raise RuntimeError(f"{what}: no '{text}' within {timeout:.0f} s: {tail(path)}")


def tail(path: Path, n: int = 6) -> str:
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])


def stop_proc(proc: subprocess.Popen | None, timeout: float = 30.0, also: list[int] | None = None):
    """SIGTERM, wait, SIGKILL; then SIGKILL any of `also` (processes it
    started, found before stopping it) still alive."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for p in also or []:
        try:
            os.kill(p, 0)
        except OSError:
            continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and os.path.exists(f"/proc/{p}"):
            time.sleep(0.1)
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# --- systems ----------------------------------------------------------------

class System:
    """One server under test for one model: start, client command, CPU, stop."""

    name = "?"

    def __init__(self, s: Settings, model: dict, out: Path):
        self.s, self.model, self.out = s, model, out
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.roots: list[int] = []
        self.workers: set[int] = set()
        self.version: dict = {}

    def log(self, what: str) -> Path:
        return self.logs / f"{self.model['name']}-{self.name}-{what}.log"

    def cpu_sample(self) -> dict[int, tuple[int, bool]]:
        return {p: (cpu_ticks(p), p in self.workers) for p in descendants(self.roots)}

    def http_client(self, url: str, fmt: str, rate: float, seconds: float, seed: int, timeout_s: float):
        return ["taskset", "-c", str(self.s.front_cpu), str(bin_path("kp-http-load")), "--url", url,
                "--format", fmt, "--rate", f"{rate:.3f}", "--duration", f"{seconds:.3f}s",
                "--timeout", f"{timeout_s:.3f}s", "--connections", str(self.s.connections),
                "--seed", str(seed), "--json"]


def kp_spin_ms(s: "Settings") -> int:
    """BENCH_KP_INFERENCE_SPIN_MS of these settings (0 in runs recorded
    before it existed)."""
    return getattr(s, "kp_inference_spin_ms", 0)


def kp_spin_args(s: "Settings") -> list[str]:
    """kp-if's --inference-spin-ms, passed only when set (an older kp-if,
    PROFILE=..., does not know it)."""
    ms = kp_spin_ms(s)
    return ["--inference-spin-ms", str(ms)] if ms > 0 else []


def bin_path(name: str) -> Path:
    return REPO / "target" / os.environ.get("PROFILE", "release") / name


class Kneepoint(System):
    """kneepoint as designed: the fragment loop (on the network-side core)
    converts each image as it reassembles it; the inference core runs the
    engine alone."""
    name = "kneepoint"
    convert_on = "network"

    def start(self):
        s, m = self.s, self.model
        tag = f"{os.getpid() % 100000}"
        self.net = f"kpbp{tag}"
        self.prefix = f"kp-bp-{tag}"
        out = subprocess.run([str(REPO / "scripts/netns.sh"), "up", self.net], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"netns.sh up: {out.stderr.strip()}")
        self.netf = dict(l.split("=", 1) for l in out.stdout.split() if "=" in l)
        ctl = f"ipc://{self.out / f'ifm-{tag}.sock'}"
        busy = ["--busy-poll"] if s.busy_poll else []
        spin = kp_spin_args(s)
        eal = ["--file-prefix", self.prefix, "--no-pci", "--no-telemetry", "--log-level", "lib.eal:error"]
        self.ifm_log, self.if_log = self.log("if-manager"), self.log("kp-if")
        self.ifm = subprocess.Popen(
            ["ip", "netns", "exec", self.netf["PLATFORM_NS"], str(bin_path("if-manager")), *busy,
             "--control", ctl, "--ip", self.netf["PLATFORM_IP"], "--", "--lcores", f"0@{s.front_cpu}", *eal,
             "--vdev", f"net_af_packet0,iface={self.netf['PLATFORM_IF']},framecnt={s.kp_framecnt}"],
            stdout=open(self.log("if-manager-report"), "w"), stderr=open(self.ifm_log, "w"))
        wait_for_line(self.ifm_log, "if-manager: ready", self.ifm, "if-manager", 60)
        self.kpif = subprocess.Popen(
            ["ip", "netns", "exec", self.netf["PLATFORM_NS"], str(bin_path("kp-if")), *busy,
             "--model", str(m["config"]), "--control", ctl, "--slo-ms", f"{m['slo_ms']:g}",
             "--threads", str(s.threads), "--max-batch", str(s.max_batch), "--cores", str(s.worker_cpu),
             "--convert-on", self.convert_on, "--trace", str(self.trace_path()), *spin,
             "--", "--lcores", f"1@{s.kp_rx_cpu}", "--proc-type", "secondary", *eal],
            stdout=open(self.log("kp-if-report"), "w"), stderr=open(self.if_log, "w"))
        wait_for_line(self.if_log, "kp-if: ready", self.kpif, "kp-if", 120)
        self.roots = [self.ifm.pid, self.kpif.pid]
        self.workers = {self.kpif.pid}
        self.version = {"kneepoint": host.git_head(str(REPO)), "dpdk_pmd": f"net_af_packet (veth, framecnt={s.kp_framecnt})",
                        "busy_poll": s.busy_poll, "fragment_loop_cpu": s.kp_rx_cpu,
                        "inference_spin_ms": kp_spin_ms(s),
                        "convert_on": self.convert_on}

    def client(self, rate, seconds, seed, first_id, timeout_s):
        return ["ip", "netns", "exec", self.netf["CLIENT_NS"], "taskset", "-c", str(self.s.front_cpu),
                str(bin_path("kp-client")), "--dst", f"{self.netf['PLATFORM_IP']}:9000",
                "--if-id", str(self.model["if_id"]), "--rate", f"{rate:.3f}", "--duration", f"{seconds:.3f}s",
                "--timeout", f"{timeout_s:.3f}s", "--input", "synthetic", "--seed", str(seed),
                "--first-request-id", str(first_id), "--record", str(self.record_path(seed)), "--json"]

    def trace_path(self) -> Path:
        """kp-if --trace: every request it answered, when it was complete
        and when its batch ran (hindsight.py reads it)."""
        return self.logs / f"{self.model['name']}-{self.name}-trace.jsonl"

    def record_path(self, seed: int) -> Path:
        """kp-client --record of the window with this seed: when each
        request was sent and how it ended."""
        return self.logs / f"{self.model['name']}-{self.name}-window-{seed}.csv"

    def hindsight(self, out: Path) -> list[dict]:
        """hindsight.csv's rows for this system's full levels, from its
        trace, records and windows (call after stop: kp-if writes the trace
        as it exits)."""
        ws = [w for w in read_csv(out / "windows.csv") if w["model"] == self.model["name"]
              and w["system"] == self.name and w["phase"] not in ("warmup", "scout")]
        if not ws:
            return []
        return hindsight.run(ws, self.record_path, self.trace_path(), self.log("kp-if-report"),
                             self.model["slo_ms"])

    def stop(self):
        stop_proc(getattr(self, "kpif", None))
        stop_proc(getattr(self, "ifm", None))
        if getattr(self, "net", None):
            subprocess.run([str(REPO / "scripts/netns.sh"), "down", self.net], capture_output=True)
        for p in Path("/dev/hugepages").glob(f"{getattr(self, 'prefix', 'none')}*"):
            p.unlink(missing_ok=True)
        shutil.rmtree(f"/var/run/dpdk/{getattr(self, 'prefix', 'none')}", ignore_errors=True)


class Triton(System):
    name = "triton"

    def start(self):
        s, m = self.s, self.model
        py = peer_python("triton")
        site = Path(subprocess.run([str(py), "-c", "import pytriton,os;print(os.path.dirname(pytriton.__file__))"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        dist = site / "tritonserver"
        pyver = subprocess.run([str(py), "-c", "import sys;print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                               capture_output=True, text=True, check=True).stdout.strip()
        stub = dist / "python_backend_stubs" / pyver / "triton_python_backend_stub"
        if not stub.exists():
            raise RuntimeError(f"nvidia-pytriton has no Python-backend stub for Python {pyver} ({stub})")
        root = self.out / "triton"
        backends = root / "backends"
        shutil.rmtree(backends, ignore_errors=True)
        shutil.copytree(dist / "backends", backends)
        shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
        repo = root / "repo" / m["name"]
        shutil.rmtree(root / "repo", ignore_errors=True)
        write_triton_model(repo, m, s)
        self.port = free_port()
        envv = dict(os.environ)
        # As pytriton runs it: the wheel's bundled libraries, and the venv's
        # bin/ first in PATH so that the stub's embedded Python finds the
        # venv (numpy, onnxruntime).
        envv["LD_LIBRARY_PATH"] = f"{site.parent / 'nvidia_pytriton.libs'}:" + envv.get("LD_LIBRARY_PATH", "")
        envv["PATH"] = f"{py.parent}:{envv['PATH']}"
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(s.front_cpu), str(dist / "bin" / "tritonserver"),
             f"--model-repository={root / 'repo'}", f"--backend-directory={backends}",
             f"--http-port={self.port}", "--http-address=127.0.0.1", "--allow-grpc=false",
             "--allow-metrics=false", "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0",
             "--backend-config=python,shm-default-byte-size=16777216", "--log-verbose=0"],
            stdout=open(self.log("tritonserver"), "w"), stderr=subprocess.STDOUT, env=envv,
            start_new_session=True)
        base = f"http://127.0.0.1:{self.port}"
        end = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                errs = [l for l in self.log("tritonserver").read_text(errors="replace").splitlines()
                        if l.startswith("E") or "rror" in l]
                raise RuntimeError(f"tritonserver exited ({self.proc.returncode}): {' | '.join(errs[-4:])}")
            try:
                if urllib.request.urlopen(f"{base}/v2/models/{m['name']}/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"tritonserver not ready in 180 s: {tail(self.log('tritonserver'))}")
            time.sleep(0.3)
        info = json.loads(urllib.request.urlopen(f"{base}/v2", timeout=5).read())
        stubs = [p for p in descendants([self.proc.pid]) if comm(p).startswith("triton_python")]
        if len(stubs) != 1:
            raise RuntimeError(f"expected one Python-backend stub process, found {stubs}")
        pin_process(stubs[0], s.worker_cpu)
        self.roots, self.workers = [self.proc.pid], set(stubs)
        self.url = f"{base}/v2/models/{m['name']}/infer"
        self.version = {"tritonserver": info.get("version"), "nvidia-pytriton": dist_version(py, "nvidia-pytriton"),
                        "onnxruntime": dist_version(py, "onnxruntime"), "python_backend_python": pyver,
                        "dynamic_batching": {"max_batch_size": m["peer_max_batch"],
                                             "max_queue_delay_microseconds": s.batch_delay_us,
                                             "default_queue_policy": (
                                                 {"timeout_action": "REJECT",
                                                  "default_timeout_microseconds": m.get("queue_timeout_us")}
                                                 if triton_rejects(s) and m.get("queue_timeout_us") else None)}}

    def client(self, rate, seconds, seed, first_id, timeout_s):
        return self.http_client(self.url, "triton", rate, seconds, seed, timeout_s)

    def stop(self):
        stop_proc(getattr(self, "proc", None), also=descendants([self.proc.pid]) if hasattr(self, "proc") else [])


def triton_rejects(s: Settings) -> bool:
    """Whether Triton gets a queue policy that rejects late requests."""
    return s.peer_shed and s.triton_queue_policy == "reject"


def write_triton_model(repo: Path, m: dict, s: Settings):
    """A Triton model repository entry: config.pbtxt + version 1 (model.py)."""
    (repo / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "peers" / "triton" / "model.py", repo / "1" / "model.py")
    shutil.copy(BENCH / "peers" / "kp_peer_model.py", repo / "1" / "kp_peer_model.py")
    c, h, w = m["shape"]
    # Shedding at the SLO (BENCH_PEER_SHED): a request still queued when
    # too little of its SLO is left for a batch-1 run is rejected, as
    # kneepoint refuses what cannot end within its SLO.
    queue_policy = (f"  default_queue_policy {{ timeout_action: REJECT default_timeout_microseconds: "
                    f"{m['queue_timeout_us']} allow_timeout_override: false }}\n"
                    if triton_rejects(s) and m.get("queue_timeout_us") else "")
    # Dynamic batcher as Triton's docs advise: batches up to max_batch_size,
    # a short max_queue_delay_microseconds to let a batch form; no preferred
    # sizes (they only matter where some sizes are much faster; on this CPU
    # larger batches are not faster per image, see the engine limit).
    (repo / "config.pbtxt").write_text(f"""name: "{m['name']}"
backend: "python"
max_batch_size: {m['peer_max_batch']}
input [ {{ name: "INPUT" data_type: TYPE_UINT8 dims: [ {h}, {w}, {c} ] }} ]
output [
  {{ name: "CLASSES" data_type: TYPE_INT32 dims: [ {m['top_k']} ] }},
  {{ name: "SCORES" data_type: TYPE_FP32 dims: [ {m['top_k']} ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{
  max_queue_delay_microseconds: {s.batch_delay_us}
{queue_policy}}}
parameters: {{ key: "kp_config" value: {{ string_value: "{m['config']}" }} }}
parameters: {{ key: "threads" value: {{ string_value: "{s.threads}" }} }}
""")


class RayServe(System):
    name = "ray"

    def start(self):
        s, m = self.s, self.model
        py = peer_python("ray")
        self.port = free_port()
        envv = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(s.front_cpu), str(py), str(BENCH / "peers" / "ray_serve.py"),
             "--config", str(m["config"]), "--port", str(self.port), "--threads", str(s.threads),
             "--max-batch", str(m["peer_max_batch"]), "--batch-wait-us", str(s.batch_delay_us)]
            + (["--request-timeout-s", f"{m['slo_ms'] / 1000:g}"] if s.peer_shed else []),
            stdout=open(self.log("ray"), "w"), stderr=subprocess.STDOUT, env=envv, start_new_session=True)
        line = wait_for_line(self.log("ray"), "ray-serve: ready", self.proc, "ray serve", 240)
        replica = int(line.split("replica_pid=")[1].split()[0])
        pin_process(replica, s.worker_cpu)
        self.roots, self.workers = [self.proc.pid], {replica}
        if replica not in descendants(self.roots):
            self.roots.append(replica)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.version = {"ray": dist_version(py, "ray"), "onnxruntime": dist_version(py, "onnxruntime"),
                        "serve.batch": {"max_batch_size": m["peer_max_batch"], "batch_wait_timeout_s": s.batch_delay_us / 1e6},
                        "max_ongoing_requests": 64,
                        "http_request_timeout_s": m["slo_ms"] / 1000 if s.peer_shed else None}

    def client(self, rate, seconds, seed, first_id, timeout_s):
        return self.http_client(self.url, "raw", rate, seconds, seed, timeout_s)

    def stop(self):
        if hasattr(self, "proc"):
            stop_proc(self.proc, timeout=60, also=descendants(self.roots))


class Stub(System):
    name = "stub"

    def start(self):
        s, m = self.s, self.model
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(s.worker_cpu), sys.executable, str(BENCH / "peers" / "stub_server.py"),
             "--config", str(m["config"]), "--port", str(self.port), "--threads", str(s.threads)],
            stdout=open(self.log("stub"), "w"), stderr=subprocess.STDOUT)
        wait_for_line(self.log("stub"), "stub: ready", self.proc, "stub server", 60)
        self.roots, self.workers = [self.proc.pid], {self.proc.pid}
        self.url = f"http://127.0.0.1:{self.port}/"
        self.version = {"python": platform.python_version()}

    def client(self, rate, seconds, seed, first_id, timeout_s):
        return self.http_client(self.url, "raw", rate, seconds, seed, timeout_s)

    def stop(self):
        stop_proc(getattr(self, "proc", None))


class KneepointInferenceCore(Kneepoint):
    """kneepoint with all of its per-request work on the inference core,
    as the peers preprocess in the model's process: the fragment loop only
    copies the image's bytes, the inference thread converts them before the
    engine (kp-if --convert-on inference)."""
    name = "kneepoint-ic"
    convert_on = "inference"


SYSTEM_CLASSES = {"kneepoint": Kneepoint, "kneepoint-ic": KneepointInferenceCore, "triton": Triton,
                  "ray": RayServe, "stub": Stub}


# --- peers' venvs -----------------------------------------------------------

class PeerUnavailable(Exception):
    pass


def peer_python(peer: str) -> Path:
    return PEER_VENVS / peer / "bin" / "python"


def dist_version(py: Path, dist: str) -> str | None:
    out = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def peer_ready(peer: str) -> bool:
    py = peer_python(peer)
    if not py.exists():
        return False
    want = {dist_name(p): p.split("==")[1] for p in PEER_PACKAGES[peer] if "==" in p}
    return all(dist_version(py, d) == v for d, v in want.items())


def ensure_peer(peer: str, install: bool) -> None:
    """The peer's venv, installed from PyPI if missing (raises PeerUnavailable)."""
    if peer_ready(peer):
        return
    if not install:
        raise PeerUnavailable(f"not installed in {PEER_VENVS / peer} (BENCH_INSTALL_PEERS=0)")
    venv = PEER_VENVS / peer
    say(f"installing {peer} into {venv}: {' '.join(PEER_PACKAGES[peer])}")
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    steps = [[base, "-m", "venv", str(venv)],
             [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *PEER_PACKAGES[peer]]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            msg = [l for l in (r.stderr + r.stdout).splitlines() if l.strip()][-6:]
            raise PeerUnavailable(f"`{' '.join(cmd[-3:])}` failed ({r.returncode}): {' | '.join(msg)}")
    if not peer_ready(peer):
        raise PeerUnavailable(f"installed, but the versions in {venv} do not match {PEER_PACKAGES[peer]}")


def perf_analyzer_note(install: bool) -> str:
    """Why the peers are driven by kp-http-load and not Triton's
    perf_analyzer: what pip says when asked for it here."""
    why = "not tried (BENCH_INSTALL_PEERS=0)"
    if install:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                            "-d", str(PEER_VENVS / "wheels"), f"perf-analyzer=={PERF_ANALYZER}"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            why = f"pip found a perf-analyzer {PERF_ANALYZER} wheel for this machine; kp-http-load is used all the same"
        else:
            err = [l.strip() for l in r.stderr.splitlines() if l.strip().startswith("ERROR")][:1]
            why = f"pip: `{err[0] if err else r.stderr.strip()[-200:]}`"
    libc = "-".join(platform.libc_ver())
    return (f"perf_analyzer {PERF_ANALYZER} ships only a manylinux_2_38 wheel (it needs glibc 2.38 and "
            f"GLIBCXX_3.4.32; this machine has {libc}): {why}. Both peers are driven by kp-http-load "
            "(scripts/traffic), an open-loop HTTP generator like perf_analyzer --request-rate-range with "
            "Poisson arrivals.")


# --- measuring --------------------------------------------------------------

def load_model(name: str) -> dict:
    config = REPO / "models" / name / "config.toml"
    if not config.exists():
        raise SystemExit(f"bench: {config} is missing: run `make models`")
    c = tomllib.loads(config.read_text())
    return {"name": name, "config": config, "if_id": c["if_id"], "slo_ms": float(c["slo_ms"]),
            "top_k": int(c.get("top_k", 5)), "shape": c["input"]["shape"]}


def engine_limit(s: Settings, m: dict, batches: str | None = None, seconds: float | None = None) -> list[dict]:
    """The engine alone on the worker core (bench/engine_limit.py), one
    row per batch size: the run's BENCH_ENGINE_BATCHES for
    BENCH_ENGINE_SECONDS each unless given."""
    r = subprocess.run(["taskset", "-c", str(s.worker_cpu), sys.executable, str(BENCH / "engine_limit.py"),
                        "--config", str(m["config"]), "--threads", str(s.threads),
                        "--batches", batches or s.engine_batches,
                        "--seconds", str(s.engine_seconds if seconds is None else seconds)],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"engine_limit.py failed: {r.stderr.strip()[-500:]}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]


class Runner:
    """Drives one system through warm-up, sweep, bisection and points."""

    def __init__(self, s: Settings, sysm: System, m: dict, limit: float, out: Path):
        self.s, self.sys, self.m, self.limit, self.out = s, sysm, m, limit, out
        self.timeout_s = max(2.0, 10 * m["slo_ms"] / 1000)
        self.level = 0
        self.window_no = 0
        self.levels: list[dict] = []  # full levels only: scouts decide nothing
        self.search_cut: str | None = None  # why the capacity search ended early

    def window(self, rate: float, seconds: float, phase: str, label: str, w: int) -> dict:
        self.window_no += 1
        seed = self.window_no
        cmd = self.sys.client(rate, seconds, seed, self.window_no * 1_000_000 + 1, self.timeout_s)
        before = self.sys.cpu_sample()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 4 * self.timeout_s + 60)
        wall = time.monotonic() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = self.sys.cpu_sample()
        if r.returncode:
            raise RuntimeError(f"load generator failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        srv = sum(t - before.get(p, (0, False))[0] for p, (t, _) in after.items()) / HZ
        wrk = sum(t - before.get(p, (0, False))[0] for p, (t, isw) in after.items() if isw) / HZ
        ok = int(rep["status"].get("ok", 0))
        span = float(rep.get("answer_span_s") or 0) or seconds
        rtt = rep["rtt_us"]
        # Percentiles over every request sent, failures as later than any
        # OK answer (None: the percentile falls among them, so infinite).
        late = rep["rtt_failed_as_late_us"]
        q = lambda k: late[k] / 1000 if late[k] is not None else math.inf  # noqa: E731
        row = {
            "model": self.m["name"], "system": self.sys.name, "level": self.level, "phase": phase,
            "label": label, "window": w, "offered_rps": round(rate, 3), "seconds": round(seconds, 3),
            "seed": seed, "sent": rep["sent"], "ok": ok, "errors": int(rep["answered"]) - ok,
            "unanswered": rep["unanswered"], "duplicates": int(rep.get("duplicates", 0)),
            "ok_per_s": round(ok / span, 3),
            "p50_ms": q("p50"), "p90_ms": q("p90"), "p99_ms": q("p99"),
            "max_ms": rtt["max"] / 1000, "mean_batch": rep.get("mean_batch_size") or "",
            "ok_rtt_us_counts": json.dumps(rep["ok_rtt_us_counts"], separators=(",", ":"))
            if "ok_rtt_us_counts" in rep else "",
            "lag_p99_ms": rep["lag_us"]["p99"] / 1000 if "lag_us" in rep else "",
            "statuses": json.dumps({k: v for k, v in rep["status"].items() if v} | (
                {"unanswered": rep["unanswered"]} if rep["unanswered"] else {}), sort_keys=True),
            "server_cpu_s": round(srv, 3), "worker_cpu_s": round(wrk, 3),
            "client_cpu_s": round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 3),
            "loadavg1": os.getloadavg()[0], "wall_s": round(wall, 3),
        }
        append_csv(self.out / "windows.csv", WINDOW_FIELDS, row)
        return row

    def run_level(self, rate: float, phase: str, label: str = "") -> dict:
        """One level: windows until the last three agree; a scout, one
        short window (it guides the search and decides nothing)."""
        self.level += 1
        if phase == "scout":
            seconds = min(self.s.scout_max_s, max(SCOUT_MIN_S, self.s.scout_requests / rate))
            ws = [self.window(rate, seconds, phase, label, 1)]
        else:
            seconds = min(self.s.window_max_s, max(self.s.window_s, self.s.window_requests / rate))
            ws = []
            while len(ws) < self.s.max_windows:
                ws.append(self.window(rate, seconds, phase, label, len(ws) + 1))
                if len(ws) >= self.s.min_windows and (len(ws) < report.LAST_WINDOWS
                                                      or report.stable(ws, self.s.stability)):
                    break
                if len(ws) >= report.LAST_WINDOWS and report.aggregate(ws, self.m["slo_ms"])["error_frac"] > 0.5:
                    break  # far past capacity: more windows will not agree
        lv = report.aggregate(ws, self.m["slo_ms"], self.s.stability)
        lv.update(model=self.m["name"], system=self.sys.name, level=self.level, phase=phase, label=label)
        append_csv(self.out / "levels.csv", LEVEL_FIELDS, lv)
        say(f"  {self.sys.name:9s} {phase:6s} {rate:8.1f} req/s: OK {lv['ok_per_s']:7.1f}/s  p50/p90/p99 "
            f"{lv['p50_ms']:7.1f} {lv['p90_ms']:7.1f} {lv['p99_ms']:7.1f} ms  failed {100 * lv['error_frac']:4.1f}%  "
            f"{'meets SLO' if lv['meets_slo'] else 'misses SLO'}{'' if lv['stable'] else ' (unstable)'}")
        if phase != "scout":
            self.levels.append(lv)
        if lv["failed"]:
            time.sleep(min(self.timeout_s, 5.0))  # let a backlog the client gave up on drain
        return lv

    def run(self) -> dict:
        s, E = self.s, self.limit
        if s.warmup_s > 0:
            self.window(0.3 * E, s.warmup_s, "warmup", "", 1)
        sweep = [f * E for f in s.sweep]
        label = lambda rate: f"{rate / E:.3g}"  # noqa: E731: the fraction of the engine limit

        def level(rate: float, phase: str) -> bool:
            return self.run_level(rate, phase, label(rate))["meets_slo"]

        full = capacity_search.budgeted(level, s.search_budget_s, time.monotonic)
        start = s.start.get(f"{self.m['name']}.{self.sys.name}")
        try:
            if start:
                capacity_search.confirm(full, tuple(start), s.resolution, s.refine, max(sweep),
                                        floor=capacity_search.lowest(sweep))
            elif s.scout_requests > 0:
                def scout(rate: float, phase: str) -> bool:
                    return self.run_level(rate, "scout", f"{phase} {label(rate)}")["meets_slo"]

                bracket = capacity_search.search(scout, sweep, s.scout_resolution, SCOUT_REFINE)
                capacity_search.confirm(full, bracket, s.resolution, s.refine, max(sweep),
                                        floor=capacity_search.lowest(sweep))
            else:
                capacity_search.search(full, sweep, s.resolution, s.refine)
        except capacity_search.OutOfTime as e:
            # The levels run so far stand; build_report draws the bracket
            # from them and says it is not resolved.
            self.search_cut = str(e)
            say(f"  {self.sys.name}: capacity search stopped: {e}")
        cap = report.capacity(self.levels)
        if cap is not None:
            for p in s.points:
                self.run_level(p * cap["ok_per_s"], "point", f"{p:g}")
        if s.peak > 0:
            # Saturated: what the system completes when offered more than
            # the engine can do, whatever the latency (its peak goodput).
            self.run_level(s.peak * E, "peak", f"{s.peak:g}")
        return {"capacity": cap, "search_cut": self.search_cut}


ENGINE_CHECK_FIELDS = ["model", "after", "median_ms", "p90_ms", "images_per_s", "at"]


def engine_check(out: Path, model: str, after: str, row: dict):
    """Records one check of the drift guard in engine_checks.csv: the
    engine alone at batch 1 at the start ("start": the engine limit's own
    batch-1 row) or after a system ran."""
    append_csv(out / "engine_checks.csv", ENGINE_CHECK_FIELDS,
               {"model": model, "after": after, "median_ms": row["median_ms"], "p90_ms": row["p90_ms"],
                "images_per_s": row["images_per_s"], "at": time.strftime("%H:%M:%S")})


def append_csv(path: Path, fields: list[str], row: dict):
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- the report -------------------------------------------------------------

def build_report(out: Path, docs: Path, s: Settings, meta: dict) -> str:
    """report.md, summary.{csv,json} and the plots, from the CSVs in out."""
    engine = read_csv(out / "engine.csv")
    windows = read_csv(out / "windows.csv")
    checks = read_csv(out / "engine_checks.csv")
    hind = {(h["model"], h["system"], int(h["level"])): h for h in read_csv(out / "hindsight.csv")}
    models = []
    summary_rows = []
    for name in meta["models"]:
        m = meta["model_info"][name]
        eng = [{k: (float(v) if k not in ("model",) else v) for k, v in r.items()} for r in engine
               if r["model"] == name]
        for r in eng:
            r["batch"] = int(r["batch"])
        best = max((r["images_per_s"] for r in eng), default=None)
        systems = []
        for sysname in meta["systems"]:
            err = meta.get("errors", {}).get(f"{name}/{sysname}")
            # Scouts (one short window each) only guided the search: they
            # are in windows.csv and levels.csv, not in the results.
            ws = [w for w in windows if w["model"] == name and w["system"] == sysname
                  and w["phase"] not in ("warmup", "scout")]
            groups: dict[str, list[dict]] = {}
            for w in ws:
                groups.setdefault(w["level"], []).append(w)
            levels = []
            for lvl, g in groups.items():
                lv = report.aggregate(g, m["slo_ms"], s.stability)
                lv.update(phase=g[0]["phase"], label=g[0]["label"], level=int(lvl))
                h = hind.get((name, sysname, int(lvl)))
                if h:
                    lv["hindsight"] = {k: (float(h[k]) if h[k] not in ("", None) else None)
                                       for k in hindsight.FIELDS[3:]}
                levels.append(lv)
            if err and not levels:
                systems.append({"system": sysname, "error": err})
                continue
            cap = report.capacity(levels)
            peak = report.peak(levels)
            # The search's bracket: the highest offered rate that met the
            # SLO and the lowest above it that missed (the capacity is the
            # highest OK *rate* among the levels that met it, which Poisson
            # arrivals may give to a level just below).
            met = [lv["offered_rps"] for lv in levels if lv["phase"] in SEARCH_PHASES and lv["meets_slo"]]
            above = [lv["offered_rps"] for lv in levels if lv["phase"] in SEARCH_PHASES and not lv["meets_slo"]
                     and (not met or lv["offered_rps"] > max(met))]
            points = {lv["label"]: lv for lv in levels if lv["phase"] == "point"}
            # CPU per request: at the capacity level (busy, within the SLO).
            cpu_level = cap
            systems.append({"system": sysname, "capacity": cap, "peak": peak, "points": points, "levels": levels,
                            "bracket": [max(met) if met else None, min(above) if above else None],
                            "search_cut": meta.get("search_cut", {}).get(f"{name}/{sysname}"),
                            "resolution": s.resolution,
                            "cpu_level": cpu_level or cap, "error": None if levels else err})
            row = {"model": name, "system": sysname, "slo_ms": m["slo_ms"], "engine_limit_img_s": best,
                   "capacity_ok_per_s": cap["ok_per_s"] if cap else "", "capacity_offered_rps":
                   cap["offered_rps"] if cap else "", "capacity_p99_ms": cap["p99_ms"] if cap else "",
                   "capacity_vs_engine": cap["ok_per_s"] / best if cap and best else "",
                   "peak_ok_per_s": peak["ok_per_s"] if peak else "",
                   "peak_offered_rps": peak["offered_rps"] if peak else "",
                   "peak_vs_engine": peak["ok_per_s"] / best if peak and best else "",
                   "server_cpu_ms_per_req": (cpu_level or cap or {}).get("server_cpu_ms_per_req", ""),
                   "worker_cpu_ms_per_req": (cpu_level or cap or {}).get("worker_cpu_ms_per_req", ""),
                   "error": err or ""}
            for p in s.points:
                lv = points.get(f"{p:g}")
                for k in ("offered_rps", "ok_per_s", "p50_ms", "p90_ms", "p99_ms", "error_frac", "meets_slo"):
                    row[f"at{int(round(100 * p))}_{k}"] = lv[k] if lv else ""
            summary_rows.append(row)
        models.append({"model": name, "slo_ms": m["slo_ms"], "slo_rule": m.get("slo_rule"), "engine": eng,
                       "engine_checks": [{"after": c["after"], "median_ms": float(c["median_ms"]),
                                          "images_per_s": float(c["images_per_s"]), "at": c["at"]}
                                         for c in checks if c["model"] == name],
                       "systems": systems,
                       "points": s.points, "plot": None})
    if summary_rows:
        fields = list(dict.fromkeys(k for r in summary_rows for k in r))
        with open(out / "summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(summary_rows)
    md = render_report(meta, models, s, docs, out)
    json.dump({"meta": meta, "models": models}, open(out / "summary.json", "w"), indent=1, default=str)
    (out / "report.md").write_text(md)
    return md


def last_windows(s: Settings) -> str:
    """How many windows a level's OK rate is the mean of, in words: the
    last report.LAST_WINDOWS, or all of a level capped below that (a smoke
    run's two)."""
    return {1: "one", 2: "two", 3: "three"}[min(report.LAST_WINDOWS, s.max_windows)]


def scouted(meta: dict, s: Settings) -> bool:
    """Whether any system of the run found its start by scouts: scouts are
    on and some model's system had no BENCH_START bracket."""
    start = getattr(s, "start", {})
    return s.scout_requests > 0 and any(f"{m}.{x}" not in start for m in meta["models"] for x in meta["systems"])


def start_text(start: dict[str, list[float]]) -> str:
    """The method's sentence for BENCH_START ("" without it)."""
    if not start:
        return ""
    spans = "; ".join(f"{model} {report.NAMES.get(system, system)} {lo:g} / {hi:g}"
                      for (model, _, system), (lo, hi) in sorted((k.partition("."), v) for k, v in start.items()))
    return (f" Where a bracket was given (BENCH_START, offered req/s: {spans}), that system's full levels "
            "start there instead of from scouts: its lower end first, then its upper end, walking away from "
            "either where a level disagrees, then bisection; only this run's levels decide.")


def render_report(meta: dict, models: list[dict], s: Settings, docs: Path, out: Path | None = None) -> str:
    """A run's report.md from its summary (summary.json's "meta" and
    "models"), drawing each model's plot into DOCS (and OUT) and setting
    its "plot": build_report's last step, and all --combine needs of a
    run kept in the repository (summary.json alone)."""
    docs.mkdir(parents=True, exist_ok=True)
    for m in models:
        name = m["model"]
        series = {x["system"]: x["levels"] for x in m["systems"] if x.get("levels")}
        m["plot"] = None
        if not series:
            continue
        best = max((r["images_per_s"] for r in m["engine"]), default=None)
        svg = report.svg_plot(name, m["slo_ms"], best, series,
                              f"{s.threads} intra-op thread; the model on CPU {s.worker_cpu}, network sides and "
                              f"load generator on CPU {s.front_cpu}; {meta['machine']['cpu']}, "
                              f"{meta['machine']['nproc']} CPUs; {meta['started']}")
        for d in (docs, out) if out else (docs,):
            (d / f"peers-{name}.svg").write_text(svg)
        m["plot"] = os.path.relpath(docs / f"peers-{name}.svg", REPO / "docs")
    return header_markdown(meta, s) + "\n" + "\n".join(report.model_markdown(m) for m in models)


def header_markdown(meta: dict, s: Settings) -> str:
    mc, v = meta["machine"], meta["versions"]
    peers = []
    for p in ("triton", "ray"):
        if p in meta["systems"]:
            st = meta["peers"].get(p, {})
            peers.append(f"{p}: " + (", ".join(f"{k} {val}" for k, val in st.get("versions", {}).items()
                                               if not isinstance(val, dict)) or st.get("error", "?")))
    dur = meta.get("wall_s")
    L = [f"Measured {meta['started']} by `make bench` (bench/bench.py{' --smoke' if s.smoke else ''})"
         + (f", {dur / 60:.1f} min" if dur else "") + f"; git {meta['git']}.",
         "",
         f"- **Machine**: {mc['cpu']}, {mc['nproc']} CPUs, {mc['mem_gib']} GiB, Linux {mc['kernel']}, "
         f"Debian {mc['debian']}; load average {' / '.join(f'{x:.2f}' for x in meta['loadavg_start'])} at the "
         f"start, {' / '.join(f'{x:.2f}' for x in meta.get('loadavg_end', [0, 0, 0]))} at the end "
         "(the machine is shared: read ratios, not last digits).",
         f"- **Versions**: onnxruntime {v['onnxruntime']} everywhere (same session options as libml: "
         f"{s.threads} intra-op thread, 1 inter-op, sequential, ORT_ENABLE_ALL, no spinning); "
         + "; ".join(peers) + ".",
         f"- **Cores**: the model (kp-if's engine and inference thread / Triton's Python-backend stub, which "
         f"also converts the u8 image to f32 / the Ray Serve replica, likewise / the engine limit) on CPU "
         f"{s.worker_cpu}; the load generator and each system's network side (the if-manager and kp-if's "
         f"fragment loop on CPU {s.kp_rx_cpu}, which converts while it reassembles / tritonserver's HTTP threads "
         f"and batcher / Ray's proxy, raylet, GCS, controller) on CPU {s.front_cpu}."
         + (f" kp-if's inference thread spins {kp_spin_ms(s)} ms after each batch instead of dozing "
            f"(BENCH_KP_INFERENCE_SPIN_MS: kp-if --inference-spin-ms), so it keeps CPU {s.worker_cpu} busy while "
            "idle; the peers' model processes sleep there." if kp_spin_ms(s) else ""),
         batching_markdown(meta, s),
         "- **Shedding**: " + ("every system may refuse what cannot meet the SLO: kneepoint answers OVERLOADED; "
                               + ("Triton's dynamic batcher has a default_queue_policy that REJECTs a request queued "
                                  "longer than the SLO less the engine's batch-1 median; " if triton_rejects(s) else
                                  "Triton queues every request (its REJECT queue policy holds a request queued "
                                  "behind a running batch until the next arrival, so it is off: "
                                  "BENCH_TRITON_QUEUE_POLICY); ")
                               + "Ray Serve's HTTP proxy has "
                               "request_timeout_s = the SLO. A refused request counts as late in the percentiles."
                               if s.peer_shed else
                               "only kneepoint sheds (BENCH_PEER_SHED=0): the peers queue every request."),
         "- **Load**: open loop, Poisson arrivals, the same synthetic 224×224×3 RGB u8 images (same seeds): "
         "kp-client over UDP for kneepoint, kp-http-load over HTTP/1.1 keep-alive for both peers "
         f"({s.connections} connections; Triton: KServe v2 binary tensor; Ray: raw body). Latency is the "
         "client's round trip, from the request's scheduled time.",
         f"- **Levels**: windows of {s.window_s:.3g}–{s.window_max_s:g} s (≥ {s.window_requests} requests), "
         + (f"{s.min_windows}–{s.max_windows} per level until three agree within {100 * s.stability:.0f}%; "
            if s.max_windows > s.min_windows else f"{s.min_windows} per level; ")
         + f"the OK rate is the mean of the last {last_windows(s)}, the latency percentiles are over all their "
         f"requests together. Warm-up {s.warmup_s:g} s per system. A level meets the "
         "SLO when p99 ≤ SLO, ≤ 1% of requests failed (non-OK answer, e.g. kneepoint's OVERLOADED, or none "
         "in time). Latency percentiles count every request sent, a failed one as later than any OK answer "
         "(for every system alike; ∞: the percentile falls among the failures). ✗ marks a point that misses "
         "the SLO.",
         "- **Capacity**: the highest OK rate of a level that meets the SLO, found by bisection until the "
         f"lowest offered rate that missed is within {100 * s.resolution:g}% of the highest that met (the "
         "bracket under each table)"
         + (f", or until a system's full levels have run for {s.search_budget_s / 60:g} min (the level "
            "running then ends; a bracket left wider is flagged)."
            if getattr(s, "search_budget_s", 0) > 0 else ".")  # runs before the budget have none
         + (f" Scouts of one window (≥ {s.scout_requests} requests, {SCOUT_MIN_S:g}–{s.scout_max_s:g} s) "
            f"first bracket it within {100 * s.scout_resolution:g}%; they only say where the levels start "
            "(capacity_search.py) and are not in the results." if scouted(meta, s) else "")
         + start_text(getattr(s, "start", {}))
         + (f" Then a level at {', '.join(f'{100 * p:g}%' for p in s.points)} of the capacity" if s.points else "")
         + (f"{' and' if s.points else ' Then'} one at {s.peak:g}× the engine limit (peak)." if s.peak > 0
            else "."),
         "- **CPU per request**: CPU time (utime + stime) of all the system's processes over the windows of "
         "its capacity level, per OK answer; in brackets the inference process alone. The load generator is "
         "not counted.",
         "- Raw data: target/bench/peers/ where the run was taken (windows.csv, levels.csv, summary.csv, "
         "engine.csv, engine_checks.csv, logs/); `make bench-peers` keeps each run's summary.json in the "
         "repository, in docs/bench/runs/peers/rep-K/<model>/.",
         ""]
    errs = meta.get("errors", {})
    if errs:
        L += ["Not measured:", ""] + [f"- {k}: `{e}`" for k, e in errs.items()] + [""]
    notes = meta.get("notes", [])
    if notes:
        L += [f"- {n}" for n in notes] + [""]
    return "\n".join(L)


def batching_markdown(meta: dict, s: Settings) -> str:
    """The report's batching line: kneepoint's cap, the peers' (per model,
    BENCH_PEER_MAX_BATCH; runs before it had one cap for all) and their
    batchers' delay."""
    delay = (f"Triton's dynamic batcher max_queue_delay_microseconds {s.batch_delay_us}, Ray @serve.batch "
             f"batch_wait_timeout_s {s.batch_delay_us / 1e6:g}")
    caps = {n: mi["peer_max_batch"] for n, mi in meta.get("model_info", {}).items() if "peer_max_batch" in mi}
    if not caps:
        return (f"- **Batching**: at most {s.max_batch} per batch everywhere; {delay}; kneepoint's policy "
                "batches under the SLO (kp-if --slo-ms).")
    how = ("tuned for the SLO from this run's engine limit: the measured size with the most images/s among "
           "those whose batch takes at most half the SLO, 1 unless it beats batch 1's images/s by more than "
           f"{100 * PEER_BATCH_GAIN:g}% (peer_max_batch)" if s.peer_max_batch == "auto"
           else "BENCH_PEER_MAX_BATCH")
    return (f"- **Batching**: kneepoint at most {s.max_batch} per batch, its policy choosing each batch's size "
            f"under the SLO (kp-if --slo-ms); the peers at most "
            + ", ".join(f"{c} ({n})" for n, c in caps.items()) + f", {how}; {delay}.")


def machine_info() -> dict:
    cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
    mem = [int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")]
    try:
        debian = Path("/etc/debian_version").read_text().strip()
    except OSError:
        debian = "?"
    return {"cpu": cpu[0] if cpu else platform.processor(), "nproc": os.cpu_count(),
            "mem_gib": round(mem[0] / 2**20) if mem else None, "kernel": platform.release(), "debian": debian}


# --- main -------------------------------------------------------------------

def main() -> int:
    # SIGTERM (a runner's time-out, `kill`) stops the run as Ctrl-C does:
    # the system under test is stopped in its `finally`. Python's default
    # ends the process at once and left tritonserver and kp-http-load
    # running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny loads (what `make test` runs)")
    ap.add_argument("--out", type=Path, help="results folder (default BENCH_OUT or target/bench/peers)")
    ap.add_argument("--docs", type=Path, help="where the plots go (default BENCH_DOCS or docs/bench; "
                    "with --smoke, OUT/docs)")
    ap.add_argument("--report-only", action="store_true", help="only redraw the report from OUT's CSVs")
    ap.add_argument("--combine", type=Path, metavar="DIR",
                    help="summarise the runs in DIR/rep-*/ (each a run's results folder, as `make bench-peers` "
                         "makes them): medians, spreads and the conclusions they allow, then the last run in "
                         "detail, into DIR/report.md and docs/PERFORMANCE.md")
    a = ap.parse_args()
    s = Settings(a.smoke)
    out = (a.out or Path(env("BENCH_OUT", str(REPO / "target/bench/peers")))).resolve()
    docs = (a.docs or (out / "docs" if a.smoke else Path(env("BENCH_DOCS", str(REPO / "docs/bench"))))).resolve()
    if a.combine:
        return combine(a.combine.resolve(), s, docs)

    if a.report_only:
        meta = json.loads((out / "meta.json").read_text())
        md = build_report(out, docs, s, meta)
        if a.docs is None:  # redrawn into the repository: the doc follows
            finish_docs(s, md, a.smoke)
        print(md)
        return 0

    if os.geteuid() != 0 and "kneepoint" in s.systems:
        raise SystemExit("bench: must run as root (network namespaces, DPDK hugepages)")
    for b in ("if-manager", "kp-if", "kp-client", "kp-http-load"):
        if not bin_path(b).exists():
            raise SystemExit(f"bench: {bin_path(b)} is missing: run `make build`")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t_start = time.monotonic()
    commit = host.git_head(str(REPO))
    meta = {"started": time.strftime("%Y-%m-%d %H:%M %Z"), "git": commit,
            "measured": provenance.measured_digest(commit) if commit else None, "machine": machine_info(),
            "loadavg_start": list(os.getloadavg()), "settings": s.as_dict(), "models": s.models,
            "systems": s.systems, "versions": {"onnxruntime": importlib.metadata.version("onnxruntime")},
            "peers": {}, "errors": {}, "model_info": {},
            "notes": []}
    say(f"results in {out}; load average {os.getloadavg()[0]:.2f}; systems {', '.join(s.systems)}; "
        f"models {', '.join(s.models)}")

    if "triton" in s.systems or "ray" in s.systems:
        meta["notes"].append(perf_analyzer_note(s.install))
    for peer in ("triton", "ray"):
        if peer in s.systems:
            try:
                ensure_peer(peer, s.install)
                py = peer_python(peer)
                meta["peers"][peer] = {"versions": {d: dist_version(py, d) for d in map(dist_name, PEER_PACKAGES[peer])}}
            except PeerUnavailable as e:
                meta["peers"][peer] = {"error": str(e)}
                say(f"{peer}: unavailable: {e}")

    for name in s.models:
        m = load_model(name)
        meta["model_info"][name] = {k: (str(v) if isinstance(v, Path) else v) for k, v in m.items()}
        say(f"{name}: engine limit on CPU {s.worker_cpu} (batches {s.engine_batches}, {s.engine_seconds:g} s each)")
        eng = engine_limit(s, m)
        for r in eng:
            append_csv(out / "engine.csv", ["model", "batch", "threads", "iterations", "median_ms", "p90_ms",
                                            "p99_ms", "min_ms", "max_ms", "images_per_s"], r)
            say(f"  batch {r['batch']}: {r['median_ms']:.2f} ms, {r['images_per_s']:.1f} img/s")
        limit = max(r["images_per_s"] for r in eng)
        one = next((r for r in eng if int(r["batch"]) == 1), None)
        if s.engine_check_s > 0 and one:
            engine_check(out, name, "start", one)
        if s.slo_x > 0:
            m["slo_ms"] = slo_from_engine(s.slo_x, eng, m["slo_ms"])
            meta["model_info"][name]["slo_ms"] = m["slo_ms"]
            meta["model_info"][name]["slo_rule"] = f"{s.slo_x:g} x the engine's batch-1 median in this run"
            say(f"{name}: SLO {m['slo_ms']:.1f} ms ({s.slo_x:g} x the engine's batch-1 median here)")
        if s.smoke:
            m["slo_ms"] = smoke_slo_ms(m["slo_ms"], eng)
            meta["model_info"][name]["slo_ms"] = m["slo_ms"]
            say(f"{name}: smoke SLO {m['slo_ms']:.1f} ms (the configured one, or {SMOKE_SLO_X:g} x the "
                f"engine's batch-1 p99 here if that is longer)")
        m["queue_timeout_us"] = queue_timeout_us(m["slo_ms"], eng)
        m["peer_max_batch"] = (peer_max_batch(eng, m["slo_ms"], s.max_batch) if s.peer_max_batch == "auto"
                               else int(s.peer_max_batch))
        if any(p in s.systems for p in ("triton", "ray")):
            meta["model_info"][name]["peer_max_batch"] = m["peer_max_batch"]
            say(f"{name}: the peers' batch cap {m['peer_max_batch']} ({s.peer_max_batch})")
        meta["model_info"][name]["queue_timeout_us"] = m["queue_timeout_us"]
        for sysname in s.systems:
            key = f"{name}/{sysname}"
            if sysname in ("triton", "ray") and "error" in meta["peers"].get(sysname, {}):
                meta["errors"][key] = meta["peers"][sysname]["error"]
                continue
            sysm = SYSTEM_CLASSES[sysname](s, m, out)
            t0 = time.monotonic()
            try:
                say(f"{name}: {sysname}: starting")
                sysm.start()
                meta["peers"].setdefault(sysname, {}).setdefault("versions", {}).update(
                    {k: v for k, v in sysm.version.items()})
                say(f"{name}: {sysname}: up in {time.monotonic() - t0:.1f} s")
                result = Runner(s, sysm, m, limit, out).run()
                if result["search_cut"]:
                    meta.setdefault("search_cut", {})[key] = result["search_cut"]
            except Exception as e:  # noqa: BLE001 — recorded, the rest goes on
                meta["errors"][key] = f"{type(e).__name__}: {e}"
                say(f"{name}: {sysname}: FAILED: {e}")
            finally:
                sysm.stop()
            say(f"{name}: {sysname}: {time.monotonic() - t0:.0f} s")
            if isinstance(sysm, Kneepoint) and sysm.trace_path().exists():
                try:
                    for row in sysm.hindsight(out):
                        append_csv(out / "hindsight.csv", hindsight.FIELDS, row)
                except (OSError, ValueError, KeyError) as e:  # the run goes on without it
                    meta["errors"][f"{name}/hindsight of {sysname}"] = f"{type(e).__name__}: {e}"
                    say(f"{name}: {sysname}: hindsight FAILED: {e}")
            if s.engine_check_s > 0 and one:
                try:
                    r = engine_limit(s, m, "1", s.engine_check_s)[0]
                    engine_check(out, name, sysname, r)
                    say(f"{name}: drift guard after {sysname}: batch 1 {r['median_ms']:.2f} ms "
                        f"({r['median_ms'] / one['median_ms']:.3f} of the start's)")
                except (RuntimeError, IndexError) as e:  # the run goes on without this check
                    meta["errors"][f"{name}/engine check after {sysname}"] = str(e)
                    say(f"{name}: drift guard after {sysname}: FAILED: {e}")
            json.dump(meta, open(out / "meta.json", "w"), indent=1, default=str)

    meta["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = time.monotonic() - t_start
    json.dump(meta, open(out / "meta.json", "w"), indent=1, default=str)
    md = build_report(out, docs, s, meta)
    finish_docs(s, md, a.smoke)
    print(md)
    say(f"done in {meta['wall_s'] / 60:.1f} min; report {out / 'report.md'}")
    if s.smoke:
        return smoke_check(out, meta) or smoke_combine(out, s)
    archive_to = env("BENCH_ARCHIVE", "", str)
    if archive_to:
        dest = archive(out, Path(archive_to).resolve())
        say(f"the run's summary kept in {dest} (commit it: --combine reads it in any later session)")
    return 0


def archive(out: Path, dest: Path) -> Path:
    """Copies the run's summary.json from OUT to DEST, which is replaced.
    It is what of a run is kept in the repository (the settings, machine
    and commit; per system the levels as the tables show them, with
    capacity, bracket and peak; ~25 KiB) and all --combine reads; the raw
    results (windows.csv with each window's latency counts, levels.csv,
    engine.csv) and the logs stay in OUT, out of git. `make bench-peers`
    archives each run into docs/bench/runs/peers/rep-K/<model>/: the
    repeats of a comparison take most of a day, a session's machine does
    not outlive it, so a run is kept where the next session, on another
    machine, finds it to combine with its own."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy2(out / "summary.json", dest / "summary.json")
    return dest


def batch_1(engine: list[dict], key: str) -> float | None:
    """The engine limit's batch-1 row's `key` (ms or images/s), None without one."""
    return next((float(r[key]) for r in engine if int(r["batch"]) == 1), None)


def slo_from_engine(x: float, engine: list[dict], configured_ms: float) -> float:
    """x times the engine's batch-1 median measured in this run (the
    configured SLO when there is no batch-1 measurement), to 0.1 ms."""
    b1 = batch_1(engine, "median_ms")
    return round(x * b1, 1) if b1 is not None else configured_ms


# A peer's batch cap ("auto") above 1 must buy at least this much more
# images/s per batch than batch 1 does.
PEER_BATCH_GAIN = 0.05


def peer_max_batch(engine: list[dict], slo_ms: float, cap: int, gain: float = PEER_BATCH_GAIN) -> int:
    """The peers' batch cap tuned for the SLO from the engine limit
    measured in this run, as one sizes Triton's max_batch_size (its model
    analyzer) or @serve.batch's for a latency target: among the measured
    batch sizes up to `cap` whose median fits in half the SLO (a request
    arriving as such a batch starts still ends in time), the one with the
    most images/s, and 1 unless that beats batch 1's images/s by more than
    `gain`. A cap the peers' batchers merely reach under load, where
    batches are no faster per image, costs them their tail: on the 2-CPU
    VM Triton's squeezenet capacity was 31.7 req/s with a cap of 8 and 44.0
    with 1 (docs/PERFORMANCE-JOURNAL.md). kneepoint needs no such tuning, its
    policy picks each batch's size under the SLO."""
    rows = [r for r in engine if int(r["batch"]) <= cap and float(r["median_ms"]) <= slo_ms / 2]
    one = batch_1(engine, "images_per_s")
    if not rows or one is None:
        return 1
    best = max(rows, key=lambda r: float(r["images_per_s"]))
    return int(best["batch"]) if float(best["images_per_s"]) > (1 + gain) * one else 1


def queue_timeout_us(slo_ms: float, engine: list[dict]) -> int:
    """How long Triton may keep a request queued (BENCH_PEER_SHED): the SLO
    less the engine's batch-1 median measured in this run (what one more
    run of the model needs), at least 1 ms."""
    b1 = batch_1(engine, "median_ms") or 0.0
    return max(1000, int(round((slo_ms - b1) * 1000)))


# The smoke run's SLO is at least this many times the engine's batch-1 p99
# measured in the same run. The configured SLOs (e.g. squeezenet's 20 ms)
# were chosen on a machine where batch 1 takes ~3 ms; on one 3x slower they
# leave no room, and kneepoint rightly sheds a few requests OVERLOADED even
# at the smoke's tiny loads. 10x leaves room for a batch of 8 (~7-9x batch
# 1 on these CPUs) behind a late arrival, so at 10-20% of the engine limit
# every request can be answered OK on any machine: what the smoke asserts.
SMOKE_SLO_X = 10.0


def smoke_slo_ms(configured_ms: float, engine: list[dict]) -> float:
    """The SLO a smoke run uses: the configured one, or SMOKE_SLO_X times
    the engine's batch-1 p99 measured in this run if that is longer."""
    b1 = batch_1(engine, "p99_ms")
    return max(configured_ms, SMOKE_SLO_X * b1) if b1 is not None else configured_ms


def smoke_problems(windows: list[dict], systems: list[str], models: list[str], errors: dict) -> list[str]:
    """What `make test` asserts of a smoke run, whatever the machine's
    speed: every system started and was measured for every model; every
    request was answered exactly once (none unanswered, none twice); and
    kneepoint's answers were all OK (its SLO is derived from this machine's
    engine time: `smoke_slo_ms`). The stand-in HTTP server answers OK or
    not at all, so the same holds for it."""
    problems = [f"{k}: {e}" for k, e in errors.items()]
    windows = [w for w in windows if w["phase"] != "warmup"]
    for sysname in systems:
        for name in models:
            ws = [w for w in windows if w["system"] == sysname and w["model"] == name]
            if not ws:
                problems.append(f"{name}/{sysname}: no window measured")
                continue
            sent = sum(int(w["sent"]) for w in ws)
            ok = sum(int(w["ok"]) for w in ws)
            lost = sum(int(w["unanswered"]) for w in ws)
            twice = sum(int(w.get("duplicates") or 0) for w in ws)
            if sent == 0 or lost:
                problems.append(f"{name}/{sysname}: {sent} sent, {lost} never answered")
            if twice:
                problems.append(f"{name}/{sysname}: {twice} requests answered more than once")
            if ok != sent:
                statuses: dict[str, int] = {}
                for w in ws:
                    for k, v in json.loads(w.get("statuses") or "{}").items():
                        statuses[k] = statuses.get(k, 0) + v
                problems.append(f"{name}/{sysname}: {ok} of {sent} requests answered OK ({statuses})")
    return problems


def smoke_combine(out: Path, s: Settings) -> int:
    """The smoke run kept as `make bench-peers` keeps a run (archive) and
    combined from there alone, as a later session would: its report must
    come back, with the run in detail and its plot redrawn."""
    archive(out, out / "runs" / "rep-1" / "smoke")
    combine(out / "runs", s, out / "combined", echo=False)
    md = (out / "runs" / "report.md").read_text()
    problems = [f"combined report: no {want!r}" for want in
                ["1 run: ", "### The last run of " + ", ".join(s.models) + " (rep-1/smoke) in detail",
                 "Drift guard (the engine alone at batch 1"]
                if want not in md]
    problems += [f"combined report: no plot of {name}" for name in s.models
                 if not (out / "combined" / f"peers-{name}.svg").exists()]
    for p in problems:
        say(f"SMOKE FAILED: {p}")
    if not problems:
        say("smoke: the run, kept as bench-peers keeps it, combines")
    return 1 if problems else 0


def smoke_hindsight(out: Path, meta: dict) -> list[str]:
    """Every full level of a kneepoint system has its hindsight (hindsight.py)
    over every request its windows sent, all of them traced by kp-if (a
    smoke run's requests are all answered OK), and the report says it."""
    problems = []
    windows = [w for w in read_csv(out / "windows.csv") if w["phase"] not in ("warmup", "scout")]
    rows = {(h["model"], h["system"], int(h["level"])): h for h in read_csv(out / "hindsight.csv")}
    for name in meta["models"]:
        for sysname in (x for x in meta["systems"] if issubclass(SYSTEM_CLASSES[x], Kneepoint)):
            sent: dict[int, int] = {}
            for w in windows:
                if w["model"] == name and w["system"] == sysname:
                    sent[int(w["level"])] = sent.get(int(w["level"]), 0) + int(w["sent"])
            for lvl, n in sent.items():
                h = rows.get((name, sysname, lvl))
                if h is None:
                    problems.append(f"{name}/{sysname}: level {lvl} has no hindsight")
                elif int(h["requests"]) != n or float(h["traced_frac"]) != 1.0:
                    problems.append(f"{name}/{sysname}: level {lvl}'s hindsight covers {h['requests']} requests, "
                                    f"{float(h['traced_frac']):.3f} traced, of {n} sent")
            if sent and "In hindsight" not in (out / "report.md").read_text():
                problems.append("report.md has no hindsight paragraph")
    return problems


def smoke_check(out: Path, meta: dict) -> int:
    """`smoke_problems` of a finished smoke run, plus its report and plot."""
    problems = smoke_problems(read_csv(out / "windows.csv"), meta["systems"], meta["models"], meta["errors"])
    if not (out / "report.md").exists() or not list((out / "docs").glob("peers-*.svg")):
        problems.append("no report.md or plot")
    # The drift guard: the start and a check after each system, per model.
    checks = read_csv(out / "engine_checks.csv")
    for name in meta["models"]:
        got = [c["after"] for c in checks if c["model"] == name]
        if got != ["start"] + meta["systems"]:
            problems.append(f"{name}: drift guard checks {got}, expected start and one after each system")
    problems += smoke_hindsight(out, meta)
    for p in problems:
        say(f"SMOKE FAILED: {p}")
    if not problems:
        n = sum(1 for w in read_csv(out / "windows.csv") if w["phase"] != "warmup")
        say(f"smoke: OK ({n} windows)")
    return 1 if problems else 0


def combine(top: Path, s: Settings, docs: Path, echo: bool = True) -> int:
    """`--combine DIR`: the repeats' summary and each model's last run,
    whose report and plot are redrawn from its summary.json (plots into
    DOCS), so that the plot in PERFORMANCE.md is the run described beside
    it. A run is DIR/rep-K/summary.json, or DIR/rep-K/<model>/summary.json
    where `make bench-peers` ran the models of repeat K one at a time; a
    run's summary.json is all that is read, which is what `make
    bench-peers` keeps in the repository (BENCH_ARCHIVE)."""
    def key(d: Path) -> tuple[int, str]:
        rep = d if d.parent == top else d.parent
        tail = rep.name.rsplit("-", 1)[-1]
        return (int(tail) if tail.isdigit() else 0, d.name)

    dirs = sorted((f.parent for f in list(top.glob("rep-*/summary.json")) + list(top.glob("rep-*/*/summary.json"))),
                  key=key)
    if not dirs:
        raise SystemExit(f"bench: no run in {top}/rep-*/ (run `make bench-peers`)")
    runs = [json.loads((d / "summary.json").read_text()) for d in dirs]
    for r in runs:
        # Runs taken before summaries named their measured code: git
        # names it from the commit, where this checkout has that commit.
        if not r["meta"].get("measured") and r["meta"].get("git"):
            r["meta"]["measured"] = provenance.measured_digest(r["meta"]["git"])
    last: dict[str, Path] = {}
    for d, r in zip(dirs, runs):
        for m in r["models"]:
            last[m["model"]] = d
    md = report.repeats_markdown(runs)
    for d, r in zip(dirs, runs):
        mine = [m for m in r["models"] if last[m["model"]] == d]
        if not mine:
            continue
        # The run's own settings (the harness's defaults may have changed
        # since), its own models' plots redrawn from its levels.
        detail = render_report(r["meta"], mine, Settings.recorded(r["meta"]["settings"]), docs)
        md += (f"\n### The last run of {', '.join(m['model'] for m in mine)} ({d.relative_to(top)}) in detail\n\n"
               + detail)
    (top / "report.md").write_text(md)
    finish_docs(s, md, False)
    if echo:
        print(md)
    say(f"{len(runs)} run{'' if len(runs) == 1 else 's'} summarised: {top / 'report.md'}")
    return 0


def finish_docs(s: Settings, md: str, smoke: bool):
    if s.update_docs and not smoke:
        doc = REPO / "docs" / "PERFORMANCE.md"
        if report.update_doc(doc, md):
            say(f"updated the side-by-side section of {doc}")
        else:
            say(f"{doc}: no bench-peers markers: section not updated (paste report.md)")


if __name__ == "__main__":
    sys.exit(main())
