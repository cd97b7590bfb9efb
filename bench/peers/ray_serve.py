"""Ray Serve peer: the repository's ONNX model through onnxruntime behind
Ray Serve's HTTP proxy, with @serve.batch — the same work as a kneepoint IF
(see kp_peer_model.py).

    .venv-peers/ray/bin/python bench/peers/ray_serve.py \
        --config models/squeezenet/config.toml --port 18100 \
        --threads 1 --max-batch 8 --batch-wait-us 500

Starts a local Ray instance (no dashboard, no usage stats) and one replica;
POST /  with the raw image (H*W*3 RGB u8 bytes, HWC) as the body answers
{"classes": [...], "scores": [...]} (top-k). When the replica is ready it
prints one line `ray-serve: ready replica_pid=PID` (the harness pins that
process to the inference core); SIGTERM/SIGINT shut Serve and Ray down.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


def build_app(config: str, threads: int, max_batch: int, batch_wait_s: float, max_ongoing: int):
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(num_replicas=1, max_ongoing_requests=max_ongoing,
                      ray_actor_options={"num_cpus": 0})
    class KpModel:
        def __init__(self):
            sys.path.insert(0, HERE)
            from kp_peer_model import Model

            self.model = Model(config, threads)

        def pid(self) -> int:
            return os.getpid()

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_s)
        async def infer(self, bodies: list[bytes]) -> list[dict]:
            classes, scores = self.model(self.model.images_from_bytes(bodies))
            return [{"classes": c.tolist(), "scores": s.tolist()} for c, s in zip(classes, scores)]

        async def __call__(self, request: Request) -> dict:
            return await self.infer(await request.body())

    return KpModel.bind()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="models/<name>/config.toml")
    ap.add_argument("--port", type=int, default=18100)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--batch-wait-us", type=float, default=500.0)
    ap.add_argument("--request-timeout-s", type=float, default=None,
                    help="the HTTP proxy's request_timeout_s: a request not answered by then fails (shedding "
                         "at the SLO, as kneepoint does)")
    ap.add_argument("--max-ongoing", type=int, default=64,
                    help="max_ongoing_requests of the replica (must exceed --max-batch to batch)")
    a = ap.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    http = {"host": "127.0.0.1", "port": a.port}
    if a.request_timeout_s:
        http["request_timeout_s"] = a.request_timeout_s
    serve.start(http_options=http, logging_config={"log_level": "WARNING"})
    handle = serve.run(build_app(a.config, a.threads, a.max_batch, a.batch_wait_us / 1e6, a.max_ongoing),
                       name="kp", route_prefix="/")
    pid = handle.pid.remote().result()
    print(f"ray-serve: ready replica_pid={pid}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
    print("ray-serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
