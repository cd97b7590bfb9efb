"""A stand-in peer for the harness's smoke test (`make test`): a plain
threaded HTTP/1.1 server from the standard library running the same model
function as the real peers (kp_peer_model.py), one request at a time, no
batching. It lets the smoke test drive the whole peer path (server start,
pinning, kp-http-load, CSV, report) without Triton or Ray installed. It is
not one of the systems compared.

    .venv/bin/python bench/peers/stub_server.py --config models/squeezenet/config.toml --port 18200

POST / with the raw image as the body answers {"classes": [...], "scores": [...]}.
Prints `stub: ready pid=PID` when listening.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kp_peer_model import Model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    model = Model(a.config, a.threads)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                with lock:
                    classes, scores = model(model.images_from_bytes([body]))
                out, code = json.dumps({"classes": classes[0].tolist(), "scores": scores[0].tolist()}).encode(), 200
            except ValueError as e:
                out, code = json.dumps({"error": str(e)}).encode(), 400
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    print(f"stub: ready pid={os.getpid()}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
