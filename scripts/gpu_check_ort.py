#!/usr/bin/env python3
"""The cudnn engine's outputs against this machine's own ONNX Runtime (CPU).

`kp-gpu-check --models DIR --out OUT` writes, for every model it ran,
OUT/engine/<name>/input_b2.f32 (the batch of 2 it fed the engine) and
cudnn_b2.f32 (what the GPU answered), little-endian f32. This script runs
DIR/<name>/model.onnx on the same input with onnxruntime's CPU provider and
checks what issue 11 asks of the engine: the same top-5 per sample and a max
difference of at most 1e-3 of the largest score. Exit status 0 when every
model agrees, 1 otherwise (2: nothing to check).

Usage: gpu_check_ort.py MODELS_DIR OUT_DIR
"""
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    models, out = Path(sys.argv[1]), Path(sys.argv[2]) / "engine"
    names = sorted(p.name for p in out.iterdir() if (p / "cudnn_b2.f32").exists()) if out.is_dir() else []
    if not names:
        print(f"gpu_check_ort: no engine outputs under {out}", file=sys.stderr)
        return 2
    bad = []
    for name in names:
        sess = ort.InferenceSession(str(models / name / "model.onnx"), providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0]
        x = np.fromfile(out / name / "input_b2.f32", dtype="<f4")
        x = x.reshape([2] + [int(d) for d in inp.shape[1:]])
        want = sess.run(None, {inp.name: x})[0].reshape(2, -1)
        got = np.fromfile(out / name / "cudnn_b2.f32", dtype="<f4").reshape(2, -1)
        ok = True
        worst = 0.0
        for n in range(2):
            scale = max(float(np.abs(want[n]).max()), np.finfo(np.float32).tiny)
            worst = max(worst, float(np.abs(got[n] - want[n]).max()) / scale)
            same = list(np.argsort(-want[n], kind="stable")[:5]) == list(np.argsort(-got[n], kind="stable")[:5])
            ok &= same
        ok &= worst <= 1e-3 and bool(np.isfinite(got).all())
        print(f"{name:20} vs onnxruntime {ort.__version__} CPU: {'agree' if ok else 'DISAGREE'} "
              f"(max diff {worst:.2e} of the largest score)")
        if not ok:
            bad.append(name)
    if bad:
        print(f"gpu_check_ort: the cudnn engine disagrees with ONNX Runtime on {', '.join(bad)}", file=sys.stderr)
        return 1
    print(f"gpu_check_ort: all {len(names)} models agree with ONNX Runtime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
