"""The Python client against a live platform (not run by unittest discovery:
it needs one; tests/python_client.rs brings one up and runs this).

    python/tests/platform_check.py --addr HOST:PORT --models DIR --photo PNG

Checks, in order, failing (exit 1, saying what) at the first that does not
hold:
  1. the photo (skimage's coffee.png) classified by efficientnet_lite0
     (if 10) is class 967 'espresso' top-1, from a path, a numpy array and a
     PIL image alike;
  2. --requests synthetic inputs to squeezenet (if 1) from --threads
     threads on one Client, then as many again with submit/poll: every
     request ends exactly once (the client's counters: no timeout, no
     duplicate, late or unexpected answer), with OK or a status a busy
     machine may give (OVERLOADED, INCOMPLETE), and some OK;
  3. an if_id the platform does not serve raises UnknownIfError (from the
     platform, and locally with a repository that lacks it); a wrong-size
     input raises BadRequestError from the platform.
Prints a JSON summary as its last line.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
from pathlib import Path

import numpy as np

import kneepoint

EFFNET, SQUEEZENET = 10, 1
ESPRESSO = 967


def fail(msg: str) -> None:
    print(f"platform_check: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def check_photo(client: kneepoint.Client, photo: Path) -> dict[str, object]:
    routes: dict[str, kneepoint.ImageLike | None] = {"path": photo, "array": None, "pil": None}
    try:
        from PIL import Image

        with Image.open(photo) as im:
            im.load()
            routes["pil"] = im.copy()
            routes["array"] = np.asarray(im.convert("RGB"))
    except ImportError:
        routes["array"] = kneepoint.preprocess(photo, 224, 224)
    top: dict[str, object] = {}
    for name, image in routes.items():
        if image is None:
            continue
        preds = client.infer(EFFNET, image, k=5)
        best = preds[0]
        if best.class_id != ESPRESSO or best.label != "espresso":
            fail(f"{photo} from a {name}: top-1 is {best}, want {ESPRESSO} 'espresso'; all: {preds}")
        top[name] = [best.class_id, best.label, round(best.score, 4)]
    return top


def check_concurrency(client: kneepoint.Client, threads: int, requests: int) -> dict[str, object]:
    before = client.stats()
    statuses: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    per_thread = [requests // threads + (i < requests % threads) for i in range(threads)]
    batches: collections.Counter[int] = collections.Counter()

    def run(n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(n):
            image = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
            try:
                answer = client.infer_full(SQUEEZENET, image)
                outcome = "ok"
                if len(answer.predictions) != 5 or answer.predictions[0].label is None:
                    outcome = f"bad answer {answer}"
                with lock:
                    batches[answer.batch_size] += 1
            except (kneepoint.OverloadedError, kneepoint.IncompleteError) as e:
                outcome = type(e).__name__
            except Exception as e:  # noqa: BLE001 - reported below
                outcome = f"{type(e).__name__}: {e}"
            with lock:
                statuses[outcome] += 1

    ts = [threading.Thread(target=run, args=(n, i)) for i, n in enumerate(per_thread)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

    # submit/poll: all outstanding at once from this thread.
    rng = np.random.default_rng(1234)
    ids = [client.submit(SQUEEZENET, rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)) for _ in range(threads)]
    seen: collections.Counter[int] = collections.Counter()
    for _ in range(200):
        for request_id, result in client.poll(0.1):
            seen[request_id] += 1
            statuses["ok" if isinstance(result, kneepoint.Answer) else type(result).__name__] += 1
        if sum(seen.values()) >= len(ids):
            break
    if sorted(seen) != sorted(ids) or any(n != 1 for n in seen.values()):
        fail(f"submit/poll: ids {sorted(ids)} ended {dict(seen)}")

    after = client.stats()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    total = requests + len(ids)
    allowed = {"ok", "OverloadedError", "IncompleteError"}
    if sum(statuses.values()) != total or set(statuses) - allowed:
        fail(f"{total} requests ended as {dict(statuses)}")
    if statuses["ok"] == 0:
        fail(f"nothing was served: {dict(statuses)}")
    if delta["submitted"] != total or delta["answered"] != total:
        fail(f"every request must be answered once: counters {delta}")
    for k in ("timed_out", "duplicates", "late", "unexpected", "malformed", "unreachable"):
        if delta[k]:
            fail(f"{k} = {delta[k]}: counters {delta}")
    return {"statuses": dict(statuses), "counters": delta, "batch_sizes": dict(batches)}


def check_errors(addr: str, client: kneepoint.Client, timeout: float) -> None:
    raw = kneepoint.Client(addr, models=False, timeout=timeout)
    try:
        raw.infer(999, b"\x00" * (224 * 224 * 3))
        fail("if_id 999 was answered")
    except kneepoint.UnknownIfError as e:
        if e.if_id != 999:
            fail(f"UnknownIfError for if_id {e.if_id}, want 999")
    try:
        client.infer(999, b"\x00" * (224 * 224 * 3))
        fail("if_id 999 was answered (with a repository)")
    except kneepoint.UnknownIfError:
        pass
    try:
        raw.infer(SQUEEZENET, b"\x00" * 1000)
        fail("a 1000-byte input to squeezenet was answered")
    except kneepoint.BadRequestError:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", required=True, help="the platform's HOST:PORT")
    p.add_argument("--models", required=True, type=Path, help="the model repository")
    p.add_argument("--photo", required=True, type=Path, help="coffee.png")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--requests", type=int, default=80, help="to squeezenet from the threads")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request")
    a = p.parse_args()
    client = kneepoint.Client(a.addr, models=a.models, timeout=a.timeout)
    summary: dict[str, object] = {
        "photo_top1": check_photo(client, a.photo),
        "concurrency": check_concurrency(client, a.threads, a.requests),
    }
    check_errors(a.addr, client, a.timeout)
    summary["errors"] = "UnknownIfError, BadRequestError as expected"
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
