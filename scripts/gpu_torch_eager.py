#!/usr/bin/env python3
"""PyTorch eager on the models of a repository: the baseline the cudnn
engine is held against (issue 11: "latency within 1.5x of PyTorch eager,
same model, same batch, fp32, same GPU, same run").

The same model: each model's own ONNX graph and weights (`<name>/model.onnx`
of the repository `make gpu-check` prepared), run node by node as PyTorch
eager ops (`torch.nn.functional`: convolution, batch norm, pooling, LRN,
linear, softmax ... on cuDNN and cuBLAS through PyTorch), the way a
torchvision model's `forward` runs its modules one after the other. Nothing
is fused or compiled: no TorchScript, no torch.compile, no CUDA graphs.
Batch norm stays a separate op, as in torchvision's eager models; only
nodes whose inputs are all weights (the zoo's Unsqueeze of a scale vector)
are computed once at load, as a torchvision model holds them as parameters.
Strict fp32: TF32 is off for convolutions and matrix products, as in the
cudnn engine (`CUDNN_FMA_MATH`).

Timed as `kp-gpu-check` times the engine (`GpuPlan::run`): from a host f32
input to the host output, synchronised, batch sizes 1, 2, 4, ... up to
`--max-batch`, `--reps` runs each after one warm-up, median and p90.
Before timing, each model's output at batch 2 is compared with ONNX Runtime
on CPU (when importable): same top-5, max difference at most 1e-3 of the
largest score, or the model is reported as disagreeing (and not timed).

Writes `torch.csv` (model,batch,median_ms,p90_ms,images_per_s: the columns
of kp-gpu-check's engine.csv) and, when `engine.csv` is there,
`cudnn_vs_torch.csv` and a table of cudnn median / torch median per model
and batch (the issue's target: at most 1.5).

Exit status: 0 done (the ratios are figures, not a pass/fail), 1 a model
failed to run or disagreed, 2 no torch or no GPU here (`--device cpu` runs
it anyway, for checking the runner itself).

    python3 scripts/gpu_torch_eager.py MODELS OUT [--device cuda] [--reps 30]
        [--max-batch 32] [--only squeezenet,resnet50]
"""

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

# The ONNX operators the runner has an eager op for: every one the
# repository's models use (bench/test_gpu_torch_eager.py checks that).
SUPPORTED = {
    "Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv",
    "Dropout", "Flatten", "Gemm", "GlobalAveragePool", "LRN", "MaxPool",
    "Mul", "Relu", "Reshape", "Softmax", "Sum", "Transpose", "Unsqueeze",
}


def attrs_of(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def unsupported(model):
    """The operators of `model` (an onnx ModelProto) the runner lacks."""
    return sorted({n.op_type for n in model.graph.node} - SUPPORTED)


def pads2d(a):
    """ONNX 2-D pads (top, left, bottom, right) -> (symmetric padding or
    None, F.pad tuple (left, right, top, bottom))."""
    p = list(a.get("pads", [0, 0, 0, 0]))
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"", ""):
        raise ValueError(f"auto_pad {a['auto_pad']!r} is not supported")
    if p[0] == p[2] and p[1] == p[3]:
        return (p[0], p[1]), None
    return None, (p[1], p[3], p[0], p[2])


class EagerGraph:
    """An ONNX graph as a list of PyTorch eager calls."""

    def __init__(self, model, device):
        import torch
        from onnx import numpy_helper

        missing = unsupported(model)
        if missing:
            raise ValueError("unsupported operators: " + ", ".join(missing))
        g = model.graph
        self.torch = torch
        self.device = device
        self.consts = {
            i.name: torch.from_numpy(numpy_helper.to_array(i).copy()).to(device)
            for i in g.initializer
        }
        inits = set(self.consts)
        inputs = [i for i in g.input if i.name not in inits]
        if len(inputs) != 1 or len(g.output) != 1:
            raise ValueError("one input and one output expected")
        self.input_name = inputs[0].name
        dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim]
        self.sample_shape = tuple(dims[1:])
        self.output_name = g.output[0].name
        self.steps = []
        for node in g.node:
            fn = self.op(node)
            if all(i in self.consts for i in node.input if i):
                # Weights only: computed once, as a parameter would be.
                with torch.inference_mode():
                    self.consts[node.output[0]] = fn(*[self.consts[i] for i in node.input if i])
                continue
            self.steps.append((fn, [i for i in node.input if i], node.output[0]))

    def op(self, node):
        import torch
        import torch.nn.functional as F

        a = attrs_of(node)
        t = node.op_type
        c = self.consts
        if t == "Conv":
            sym, asym = pads2d(a)
            stride = tuple(a.get("strides", [1, 1]))
            dil = tuple(a.get("dilations", [1, 1]))
            group = a.get("group", 1)

            def conv(x, w, b=None):
                if asym is not None:
                    return F.conv2d(F.pad(x, asym), w, b, stride, 0, dil, group)
                return F.conv2d(x, w, b, stride, sym, dil, group)

            return conv
        if t == "Relu":
            return F.relu
        if t == "Clip":
            lo, hi = a.get("min", float("-inf")), a.get("max", float("inf"))
            return lambda x: torch.clamp(x, lo, hi)
        if t == "LRN":
            size, alpha = a["size"], a.get("alpha", 1e-4)
            beta, bias = a.get("beta", 0.75), a.get("bias", 1.0)
            return lambda x: F.local_response_norm(x, size, alpha, beta, bias)
        if t in ("MaxPool", "AveragePool"):
            sym, asym = pads2d(a)
            k = tuple(a["kernel_shape"])
            s = tuple(a.get("strides", [1, 1]))
            ceil = bool(a.get("ceil_mode", 0))
            if t == "MaxPool":
                if asym is not None:
                    return lambda x: F.max_pool2d(
                        F.pad(x, asym, value=float("-inf")), k, s, 0, 1, ceil
                    )
                return lambda x: F.max_pool2d(x, k, s, sym, 1, ceil)
            include = bool(a.get("count_include_pad", 0))
            if asym is None:
                return lambda x: F.avg_pool2d(x, k, s, sym, ceil, include)

            def avg_asym(x):
                total = F.avg_pool2d(F.pad(x, asym), k, s, 0, ceil, True, 1)
                if include:
                    return total / (k[0] * k[1])
                ones = torch.ones((1, 1) + tuple(x.shape[2:]), device=x.device)
                count = F.avg_pool2d(F.pad(ones, asym), k, s, 0, ceil, True, 1)
                return total / count

            return avg_asym
        if t == "GlobalAveragePool":
            return lambda x: F.adaptive_avg_pool2d(x, 1)
        if t == "BatchNormalization":
            eps = a.get("epsilon", 1e-5)
            return lambda x, sc, b, m, v: F.batch_norm(x, m, v, sc, b, False, 0.0, eps)
        if t == "Gemm":
            al, be = a.get("alpha", 1.0), a.get("beta", 1.0)
            ta, tb = a.get("transA", 0), a.get("transB", 0)

            def gemm(x, w, b=None):
                x = x.t() if ta else x
                if tb and al == 1.0 and be == 1.0:
                    return F.linear(x, w, b)
                y = al * (x @ (w.t() if tb else w))
                return y if b is None else y + be * b

            return gemm
        if t == "Softmax":
            axis = a.get("axis", 1)

            def softmax(x):
                # Opset < 13: softmax of the input flattened to 2-D at `axis`.
                shape = x.shape
                return F.softmax(x.reshape(math.prod(shape[:axis]), -1), 1).reshape(shape)

            return softmax
        if t == "Reshape":
            target = [int(v) for v in c[node.input[1]].tolist()]

            def reshape(x, _shape=None):
                shape = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
                return x.reshape(shape)

            return reshape
        if t == "Flatten":
            axis = a.get("axis", 1)
            return lambda x: x.reshape(math.prod(x.shape[:axis]), -1)
        if t == "Transpose":
            perm = list(a["perm"])
            return lambda x: x.permute(perm)
        if t == "Concat":
            axis = a["axis"]
            return lambda *xs: torch.cat(xs, axis)
        if t == "Unsqueeze":
            axes = sorted(a["axes"])

            def unsqueeze(x):
                for ax in axes:
                    x = x.unsqueeze(ax)
                return x

            return unsqueeze
        if t == "Mul":
            return torch.mul
        if t in ("Add", "Sum"):
            return lambda *xs: xs[0] if len(xs) == 1 else sum(xs[1:], xs[0])
        if t == "Dropout":
            return lambda x: x
        raise ValueError(f"no eager op for {t}")

    def __call__(self, x):
        env = dict(self.consts)
        env[self.input_name] = x
        for fn, ins, out in self.steps:
            env[out] = fn(*[env[i] for i in ins])
        return env[self.output_name]


def top5(v):
    return sorted(range(len(v)), key=lambda i: -v[i])[:5]


def agree(got, want):
    """(max difference / largest score, same top-5) over the samples."""
    worst, same = 0.0, True
    for g, w in zip(got, want):
        scale = max(float(abs(w).max()), 1e-38)
        worst = max(worst, float(abs(g - w).max()) / scale)
        same &= top5(list(g)) == top5(list(w))
    return worst, same


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    try:
        import numpy as np
        import onnx
        import torch
    except ImportError as e:
        print(f"gpu_torch_eager: {e}: no PyTorch baseline here", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_torch_eager: torch sees no GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("gpu_torch_eager: no onnxruntime: outputs not checked", file=sys.stderr)
    only = {n for n in args.only.split(",") if n}
    names = sorted(
        p.parent.name
        for p in args.models.glob("*/model.onnx")
        if not only or p.parent.name in only
    )
    if not names:
        print(f"gpu_torch_eager: no <name>/model.onnx under {args.models}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows, failed = [], []
    print(f"PyTorch {torch.__version__} eager on {args.device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    for name in names:
        path = args.models / name / "model.onnx"
        try:
            model = onnx.load(str(path))
            g = EagerGraph(model, device)
        except Exception as e:  # one model's failure is reported, the rest run
            print(f"{name:20} cannot run: {e}")
            failed.append(name)
            continue
        rng = np.random.default_rng(len(name))
        x2 = rng.uniform(-2.0, 2.0, (2,) + g.sample_shape).astype(np.float32)
        with torch.inference_mode():
            got = g(torch.from_numpy(x2).to(device)).float().cpu().numpy().reshape(2, -1)
        if ort is not None:
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            want = sess.run(None, {sess.get_inputs()[0].name: x2})[0].reshape(2, -1)
            worst, same = agree(got, want)
            ok = worst <= 1e-3 and same and bool(np.isfinite(got).all())
            print(f"{name:20} {len(g.steps)} eager ops  agree with onnxruntime: {'yes' if ok else 'NO'}"
                  f" (max diff {worst:.2e} of the largest score, top-5 {'same' if same else 'DIFFERENT'})")
            if not ok:
                failed.append(name)
                continue
        line = ""
        b = 1
        while b <= args.max_batch:
            xb = torch.from_numpy(np.repeat(x2[:1], b, axis=0))
            with torch.inference_mode():
                g(xb.to(device)).cpu()
                ms = []
                for _ in range(max(args.reps, 1)):
                    sync()
                    t = time.perf_counter()
                    g(xb.to(device)).cpu()
                    sync()
                    ms.append((time.perf_counter() - t) * 1e3)
            ms.sort()
            p50, p90 = ms[len(ms) // 2], ms[min(len(ms) * 9 // 10, len(ms) - 1)]
            rows.append((name, b, p50, p90, b / p50 * 1e3))
            line += f" b{b}:{p50:.2f}ms"
            b *= 2
        print(f"{name:20} latency p50{line}")
    with open(args.out / "torch.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch", "median_ms", "p90_ms", "images_per_s"])
        for r in rows:
            w.writerow([r[0], r[1], f"{r[2]:.4f}", f"{r[3]:.4f}", f"{r[4]:.1f}"])
    compare(args.out)
    if failed:
        print(f"gpu_torch_eager: failed or disagreed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def read_csv(path):
    with open(path) as f:
        return {(r["model"], int(r["batch"])): float(r["median_ms"]) for r in csv.DictReader(f)}


def compare(out):
    """cudnn_vs_torch.csv and a table, when kp-gpu-check's engine.csv is in `out`."""
    if not (out / "engine.csv").exists() or not (out / "torch.csv").exists():
        return
    ours, theirs = read_csv(out / "engine.csv"), read_csv(out / "torch.csv")
    keys = sorted(set(ours) & set(theirs))
    if not keys:
        return
    with open(out / "cudnn_vs_torch.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch", "cudnn_median_ms", "torch_median_ms", "ratio"])
        for k in keys:
            w.writerow([k[0], k[1], f"{ours[k]:.4f}", f"{theirs[k]:.4f}", f"{ours[k] / theirs[k]:.3f}"])
    batches = sorted({b for _, b in keys})
    print("\ncudnn engine median / PyTorch eager median (target: at most 1.5)\n")
    print("| model | " + " | ".join(f"b{b}" for b in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    for m in sorted({m for m, _ in keys}):
        cells = [f"{ours[(m, b)] / theirs[(m, b)]:.2f}" if (m, b) in ours and (m, b) in theirs else "-" for b in batches]
        print(f"| {m} | " + " | ".join(cells) + " |")
    ratios = [ours[k] / theirs[k] for k in keys]
    print(f"\nmedian ratio {statistics.median(ratios):.2f}, worst {max(ratios):.2f} "
          f"({sum(r <= 1.5 for r in ratios)} of {len(ratios)} within 1.5)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
