"""The model function every peer server runs: the same work as a kneepoint IF.

One module, imported by the Triton Python-backend model (bench/peers/triton/
model.py), by the Ray Serve deployment (bench/peers/ray_serve.py) and by the
engine-limit measurement (bench/bench.py), so the three do exactly the same:

- read the model repository entry models/<name>/config.toml (the file kp-if
  reads: model file, input/output names, mean/std, top_k);
- one ONNX Runtime session with the options libml's engine uses
  (libml/src/engine/onnxruntime.rs): `intra_op_threads` threads, one inter-op
  thread, sequential execution, ORT_ENABLE_ALL, no spinning;
- per batch: RGB u8 HWC images (N x H x W x 3, what the client sends) ->
  normalised f32 NCHW, x = (u8 / 255 - mean) / std per channel, exactly the
  preprocessing kp-if applies to a request's bytes; run; top-k per image.

Only numpy, onnxruntime and the standard library: it runs inside Triton's
Python backend stub and inside a Ray worker alike.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import onnxruntime as ort


def session_options(threads: int) -> ort.SessionOptions:
    """The session options of libml's ONNX Runtime engine."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


class Model:
    """A model of the repository, ready to serve batches of u8 images."""

    def __init__(self, config_toml: str | Path, threads: int = 1):
        path = Path(config_toml)
        cfg = tomllib.loads(path.read_text())
        self.name = cfg["name"]
        self.top_k = int(cfg.get("top_k", 5))
        inp = cfg["input"]
        if inp["format"] != "rgb_u8_hwc":
            raise ValueError(f"{path}: input format {inp['format']!r}: the peers serve rgb_u8_hwc models")
        c, self.height, self.width = inp["shape"]
        if c != 3:
            raise ValueError(f"{path}: {c} channels, rgb_u8_hwc needs 3")
        mean = np.asarray(inp["mean"], np.float32)
        std = np.asarray(inp["std"], np.float32)
        # x = (u8 / 255 - mean) / std, in f32, as kp-if computes it (through a
        # per-channel lookup table there: the same values).
        self.lut = ((np.arange(256, dtype=np.float32)[None, :] / np.float32(255) - mean[:, None])
                    / std[:, None]).astype(np.float32)  # [3, 256]
        self.input_name = inp["name"]
        self.output_name = cfg["output"]["name"]
        self.num_classes = int(cfg["output"]["num_classes"])
        self.threads = threads
        self.session = ort.InferenceSession(str(path.parent / cfg["model_file"]), session_options(threads),
                                            providers=["CPUExecutionProvider"])

    @property
    def image_bytes(self) -> int:
        return self.height * self.width * 3

    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """u8 [N, H, W, 3] (HWC) -> normalised f32 [N, 3, H, W] (NCHW)."""
        n = images.shape[0]
        images = images.reshape(n, self.height, self.width, 3)
        x = np.empty((n, 3, self.height, self.width), np.float32)
        for c in range(3):
            np.take(self.lut[c], images[..., c], out=x[:, c])
        return x

    def infer(self, x: np.ndarray) -> np.ndarray:
        """f32 NCHW batch -> probabilities [N, num_classes]."""
        (y,) = self.session.run([self.output_name], {self.input_name: x})
        return y.reshape(x.shape[0], self.num_classes)

    def topk(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Classes (int32) and scores (f32), best first, [N, top_k] each."""
        k = self.top_k
        idx = np.argpartition(-probs, k - 1, axis=1)[:, :k]
        part = np.take_along_axis(probs, idx, axis=1)
        order = np.argsort(-part, axis=1, kind="stable")
        return (np.take_along_axis(idx, order, axis=1).astype(np.int32),
                np.take_along_axis(part, order, axis=1).astype(np.float32))

    def __call__(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The whole request path of one batch: preprocess, run, top-k."""
        return self.topk(self.infer(self.preprocess(images)))

    def images_from_bytes(self, blobs: list[bytes]) -> np.ndarray:
        """Request bodies (H*W*3 bytes each) as one u8 [N, H, W, 3] batch."""
        for b in blobs:
            if len(b) != self.image_bytes:
                raise ValueError(f"a request has {len(b)} bytes, {self.name} takes {self.image_bytes}")
        return np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), self.height, self.width, 3)
