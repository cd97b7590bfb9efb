"""kp-gateway against standard clients: tritonclient[http] (PyPI) and curl.

Run by tests/kserve_gateway.rs in the client network namespace of a live
platform (if-manager + kp-if serving efficientnet_lite0, if 10), with
kp-gateway in front of it serving efficientnet_lite0 and squeezenet (which
no IF serves there, so the platform answers UNKNOWN_IF for it). Every check
asserts an exact value; the last line printed is a JSON summary the Rust
test checks again.

    python tests/kserve_check.py --url 127.0.0.1:8000 --input coffee.u8
"""

import argparse
import json
import subprocess
import sys
import tempfile

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODEL = "efficientnet_lite0"
ABSENT = "squeezenet"  # served by the gateway, deployed nowhere
ESPRESSO = 967


def curl(url, body=None, headers=(), method=None):
    """(status, body bytes) of one curl call."""
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile() as data:
        cmd = ["curl", "-sS", "-o", out.name, "-w", "%{http_code}", "--max-time", "30"]
        for h in headers:
            cmd += ["-H", h]
        if body is not None:
            data.write(body)
            data.flush()
            cmd += ["--data-binary", "@" + data.name]
        if method:
            cmd += ["-X", method]
        code = subprocess.run(cmd + [url], check=True, capture_output=True, text=True).stdout
        out.seek(0)
        return int(code), out.read()


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="the gateway, HOST:PORT")
    ap.add_argument("--input", required=True, help="a 224x224x3 RGB u8 file (the preprocessed photo)")
    args = ap.parse_args()
    photo = np.fromfile(args.input, dtype=np.uint8)
    expect(photo.size == 224 * 224 * 3, f"input is {photo.size} bytes")
    photo = photo.reshape(1, 224, 224, 3)
    summary = {}

    # --- tritonclient, unchanged -------------------------------------------
    c = httpclient.InferenceServerClient(url=args.url)
    expect(c.is_server_live() is True, "server not live")
    # Not ready: one of its models (squeezenet) has no IF behind it.
    expect(c.is_server_ready() is False, "server ready with an undeployed model")
    expect(c.is_model_ready(MODEL) is True, f"{MODEL} not ready")
    expect(c.is_model_ready(MODEL, "1") is True, f"{MODEL} v1 not ready")
    expect(c.is_model_ready(ABSENT) is False, f"{ABSENT} ready")
    server = c.get_server_metadata()
    expect(server["name"] == "kneepoint", server)
    expect(server["extensions"] == ["binary_tensor_data"], server)
    meta = c.get_model_metadata(MODEL)
    expect(
        meta["inputs"] == [{"name": "INPUT", "datatype": "UINT8", "shape": [-1, 224, 224, 3]}],
        meta,
    )
    expect(
        meta["outputs"]
        == [
            {"name": "CLASSES", "datatype": "INT32", "shape": [-1, 5]},
            {"name": "SCORES", "datatype": "FP32", "shape": [-1, 5]},
        ],
        meta,
    )
    expect(meta["versions"] == ["1"] and meta["parameters"]["if_id"] == 10, meta)

    def infer(batch, binary_in, binary_out, model=MODEL):
        inp = httpclient.InferInput("INPUT", list(batch.shape), "UINT8")
        inp.set_data_from_numpy(batch, binary_data=binary_in)
        outs = [
            httpclient.InferRequestedOutput("CLASSES", binary_data=binary_out),
            httpclient.InferRequestedOutput("SCORES", binary_data=binary_out),
        ]
        r = c.infer(model, [inp], outputs=outs, request_id="kserve-check")
        return r.as_numpy("CLASSES"), r.as_numpy("SCORES"), r.get_response()

    answers = {}
    for binary_in, binary_out in [(True, True), (False, False), (True, False)]:
        classes, scores, resp = infer(photo, binary_in, binary_out)
        expect(classes.dtype == np.int32 and classes.shape == (1, 5), (classes.dtype, classes.shape))
        expect(scores.dtype == np.float32 and scores.shape == (1, 5), (scores.dtype, scores.shape))
        expect(classes[0, 0] == ESPRESSO, f"top-1 is {classes[0, 0]}, not {ESPRESSO}")
        expect(scores[0, 0] > 0.5 and list(scores[0]) == sorted(scores[0], reverse=True), scores)
        expect(resp["model_name"] == MODEL and resp["id"] == "kserve-check", resp)
        answers[f"in_{'bin' if binary_in else 'json'}_out_{'bin' if binary_out else 'json'}"] = [
            classes[0].tolist(),
            scores[0].tolist(),
        ]
    # The same photo, the same answer, whatever the encoding.
    expect(len({json.dumps(a) for a in answers.values()}) == 1, answers)
    classes, scores, _ = infer(np.concatenate([photo, photo]), True, True)
    expect(classes.shape == (2, 5) and (classes[:, 0] == ESPRESSO).all(), classes)
    summary["top1"] = int(classes[0, 0])
    summary["top5"] = answers["in_bin_out_bin"][0]
    summary["score"] = answers["in_bin_out_bin"][1][0]

    def error_of(call):
        try:
            call()
        except InferenceServerException as e:
            return e.status(), e.message()
        raise AssertionError("no error")

    summary["tritonclient_errors"] = {
        "unknown_model": error_of(lambda: c.get_model_metadata("nope")),
        "unknown_if": error_of(lambda: infer(photo, True, True, model=ABSENT)),
        "wrong_shape": error_of(lambda: infer(photo[:, :200], True, True)),
    }

    # --- curl ----------------------------------------------------------------
    base = f"http://{args.url}"
    body = json.dumps(
        {"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 224, 224, 3],
                     "data": photo.flatten().tolist()}]}
    ).encode()
    code, out = curl(f"{base}/v2/models/{MODEL}/infer", body, ["Content-Type: application/json"])
    expect(code == 200, (code, out[:200]))
    out = json.loads(out)
    expect(out["outputs"][0]["name"] == "CLASSES" and out["outputs"][0]["data"][0] == ESPRESSO, out)
    summary["curl_json_top1"] = out["outputs"][0]["data"][0]

    def status_and_error(code, out):
        return code, json.loads(out)["error"] if out else None

    too_big = b"\0" * (64 * 1024 + 8 * 224 * 224 * 3 + 1)
    summary["curl"] = {
        "live": curl(f"{base}/v2/health/live")[0],
        "ready": status_and_error(*curl(f"{base}/v2/health/ready")),
        "unknown_model": status_and_error(*curl(f"{base}/v2/models/nope/infer", b"{}")),
        "malformed_json": status_and_error(*curl(f"{base}/v2/models/{MODEL}/infer", b"{\"inputs\": [")),
        "oversized": status_and_error(
            *curl(f"{base}/v2/models/{MODEL}/infer", too_big, ["Inference-Header-Content-Length: 100"])
        ),
        "wrong_datatype": status_and_error(
            *curl(
                f"{base}/v2/models/{MODEL}/infer",
                json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32",
                                        "shape": [1, 224, 224, 3], "data": [0]}]}).encode(),
            )
        ),
        "unknown_if": status_and_error(
            *curl(f"{base}/v2/models/{ABSENT}/infer",
                  json.dumps({"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 224, 224, 3],
                                          "data": photo.flatten().tolist()}]}).encode())
        ),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
