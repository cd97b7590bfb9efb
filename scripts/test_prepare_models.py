#!/usr/bin/env python3
"""Tests of scripts/prepare_models.py (`make models`).

Run with the venv's python, from the repository root:
    .venv/bin/python -m unittest scripts/test_prepare_models.py
Prepares squeezenet into a temporary folder (a few seconds) and checks what
the Rust side relies on: symbolic batch, batch-1 == batch-8 rows, outputs that
depend on the input, the reference files, config.toml, and idempotence.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import unittest
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "prepare_models.py"
CONFIG = HERE.parent / "configs" / "models.toml"
sys.path.insert(0, str(HERE))
import prepare_models as pm  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def session(path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def rel(a, b) -> float:
    a = a.reshape(a.shape[0], -1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64)
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


class PrepareSqueezenet(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kp-models-")
        cls.out = Path(cls.tmp.name) / "models"
        cls.first = run_script("--out", str(cls.out), "--only", "squeezenet")
        cls.mdir = cls.out / "squeezenet"
        cls.chk = cls.mdir / "check"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_json(self):
        return json.loads((self.chk / "check.json").read_text())

    def ref(self, name, shape):
        return np.fromfile(self.chk / name, dtype="<f4").reshape(shape)

    def test_01_first_run_succeeds(self):
        self.assertEqual(self.first.returncode, 0, self.first.stdout + self.first.stderr)
        self.assertRegex(self.first.stdout, r"squeezenet .*\bok\b")
        for f in ("model.onnx", "config.toml", "check/check.json", "check/input_b8.f32",
                  "check/output_b8.f32", "check/input_b8.u8", "check/output_b8_from_u8.f32"):
            self.assertTrue((self.mdir / f).is_file(), f)
        self.assertTrue(self.check_json()["checks"]["ok"])

    def test_model_structure(self):
        m = onnx.load(str(self.mdir / "model.onnx"))
        onnx.checker.check_model(m, full_check=True)
        g = m.graph
        self.assertGreaterEqual(m.ir_version, 4)
        self.assertEqual(len(g.input), 1, "initializers must not be graph inputs")
        self.assertEqual(g.input[0].type.tensor_type.shape.dim[0].dim_param, "N")
        self.assertEqual(g.output[0].type.tensor_type.shape.dim[0].dim_param, "N")
        self.assertEqual([d.dim_value for d in g.input[0].type.tensor_type.shape.dim[1:]], [3, 224, 224])
        self.assertNotIn("ConstantOfShape", {n.op_type for n in g.node})
        self.assertEqual(len(g.value_info), 0)
        # weights are random, not one constant, and He-scaled
        w = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        conv1 = next(n for n in g.node if n.op_type == "Conv")
        a = w[conv1.input[1]]
        self.assertGreater(len(np.unique(a)), a.size // 2)
        self.assertAlmostEqual(float(a.std()), (2.0 / np.prod(a.shape[1:])) ** 0.5, delta=0.1 * a.std())

    def test_reference_outputs_and_batch_equivalence(self):
        s = session(self.mdir / "model.onnx")
        name = s.get_inputs()[0].name
        x = self.ref("input_b8.f32", (8, 3, 224, 224))
        y = self.ref("output_b8.f32", (8, 1000, 1, 1))
        out8 = s.run(None, {name: x})[0]
        self.assertLessEqual(rel(out8, y), 1e-4)
        out1 = np.concatenate([s.run(None, {name: x[i:i + 1]})[0] for i in range(8)])
        self.assertLessEqual(rel(out8, out1), 1e-4)
        out3 = s.run(None, {name: x[2:5]})[0]  # any batch size
        self.assertLessEqual(rel(out3, y[2:5]), 1e-4)
        self.assertTrue(np.isfinite(out8).all())
        np.testing.assert_allclose(out8.reshape(8, -1).sum(axis=1), 1.0, rtol=1e-4)  # softmax

    def test_outputs_depend_on_input(self):
        y = self.ref("output_b8.f32", (8, 1000))
        top5 = np.argsort(-y, axis=1, kind="stable")[:, :5]
        self.assertEqual(top5.tolist(), self.check_json()["top5"])
        self.assertGreaterEqual(len({tuple(r) for r in top5.tolist()}), 6)
        self.assertGreater(len(set(top5[:, 0].tolist())), 2)

    def test_u8_reference(self):
        u8 = np.fromfile(self.chk / "input_b8.u8", dtype=np.uint8)
        self.assertEqual(u8.size, 8 * 224 * 224 * 3)
        u8 = u8.reshape(8, 224, 224, 3)
        self.assertGreater(len(np.unique(u8)), 200)
        x = ((u8.astype(np.float32) / np.float32(255) - MEAN) / STD).transpose(0, 3, 1, 2).copy()
        s = session(self.mdir / "model.onnx")
        out = s.run(None, {s.get_inputs()[0].name: x})[0]
        y = self.ref("output_b8_from_u8.f32", (8, 1000, 1, 1))
        self.assertLessEqual(rel(out, y), 1e-4)
        top5 = np.argsort(-out.reshape(8, -1), axis=1, kind="stable")[:, :5]
        self.assertEqual(top5.tolist(), self.check_json()["output_from_u8"]["top5"])
        self.assertGreaterEqual(len({tuple(r) for r in top5.tolist()}), 6)

    def test_check_json(self):
        j = self.check_json()
        self.assertEqual(j["input_f32"]["shape"], [8, 3, 224, 224])
        self.assertEqual(j["output_f32"]["shape"], [8, 1000, 1, 1])
        self.assertEqual(j["input_u8"]["shape"], [8, 224, 224, 3])
        self.assertEqual(len(j["top5"]), 8)
        self.assertEqual(j["seeds"]["weights"], j["learned"]["seed"])
        c = j["checks"]
        self.assertLessEqual(c["batch1_vs_batch8_max_rel_diff"], 1e-4)
        self.assertTrue(c["finite"])
        self.assertGreater(c["latency_b1_ms"], 0)

    def test_config_toml(self):
        with open(self.mdir / "config.toml", "rb") as f:
            cfg = tomllib.load(f)
        self.assertEqual(cfg["schema_version"], 1)
        self.assertEqual((cfg["name"], cfg["if_id"], cfg["engine"]), ("squeezenet", 1, "onnxruntime"))
        self.assertEqual((cfg["top_k"], cfg["intra_op_threads"], cfg["model_file"]), (5, 1, "model.onnx"))
        self.assertGreater(cfg["slo_ms"], 0)
        self.assertEqual(cfg["input"]["format"], "rgb_u8_hwc")
        self.assertEqual(cfg["input"]["shape"], [3, 224, 224])
        self.assertEqual(cfg["input"]["mean"], [0.485, 0.456, 0.406])
        self.assertEqual(cfg["input"]["name"], "data_0")
        self.assertEqual(cfg["output"]["shape"], [1000, 1, 1])
        self.assertEqual(cfg["output"]["num_classes"], 1000)
        self.assertEqual(cfg["output"]["kind"], "probabilities")
        self.assertNotIn("knee", cfg)
        p = cfg["prepared"]
        data = (self.mdir / "model.onnx").read_bytes()
        self.assertEqual(p["model_sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(p["model_bytes"], len(data))
        self.assertEqual(p["source"], "light_squeezenet.onnx")
        self.assertEqual(p["params"], 1235496)

    def test_idempotent(self):
        before = {f: (self.mdir / f).stat().st_mtime_ns for f in ("model.onnx", "config.toml", "check/check.json")}
        t = time.time()
        r = run_script("--out", str(self.out), "--only", "squeezenet")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("up to date", r.stdout)
        self.assertNotIn("rewritten", r.stdout)
        self.assertLess(time.time() - t, 15)
        after = {f: (self.mdir / f).stat().st_mtime_ns for f in before}
        self.assertEqual(before, after)

    def test_serving_field_change_rewrites_config_only(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d) / "models.toml"
            cfg.write_text(CONFIG.read_text().replace('name = "squeezenet"', 'name = "squeezenet"\ntop_k = 3', 1))
            out = Path(d) / "models"
            out.mkdir()
            # a copy of the prepared folder, so the shared one stays untouched
            shutil.copytree(self.mdir, out / "squeezenet")
            mtime = (out / "squeezenet" / "model.onnx").stat().st_mtime_ns
            r = run_script("--out", str(out), "--only", "squeezenet", "--config", str(cfg))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("config.toml rewritten", r.stdout)
            self.assertEqual((out / "squeezenet" / "model.onnx").stat().st_mtime_ns, mtime)
            with open(out / "squeezenet" / "config.toml", "rb") as f:
                self.assertEqual(tomllib.load(f)["top_k"], 3)

    def test_deterministic_rebuild(self):
        with tempfile.TemporaryDirectory() as d:
            r = run_script("--out", d, "--only", "squeezenet", "--force")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for f in ("model.onnx", "check/input_b8.f32", "check/input_b8.u8",
                      "check/output_b8.f32", "check/output_b8_from_u8.f32"):
                self.assertEqual((Path(d) / "squeezenet" / f).read_bytes(), (self.mdir / f).read_bytes(), f)

    def test_unknown_model_is_an_error(self):
        r = run_script("--out", str(self.out), "--only", "nosuchnet")
        self.assertNotEqual(r.returncode, 0)


class BatchSymbolic(unittest.TestCase):
    """(a) on every source model, without making weights (cheap)."""

    def test_all_sources(self):
        _, entries = pm.load_config(CONFIG)
        self.assertEqual(len(entries), 9)
        self.assertEqual(sorted(e["if_id"] for e in entries), list(range(1, 10)))
        for e in entries:
            with self.subTest(model=e["name"]):
                m = onnx.load(str(pm.LIGHT_DIR / e["source"]))
                pm.make_batch_symbolic(m)
                g = m.graph
                inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
                live = pm.batch_carrying(g)
                for n in g.node:
                    if n.op_type == "Reshape" and n.input[0] in live:
                        self.assertIn(int(inits[n.input[1]][0]), (0, -1), n.output[0])
                real = [i for i in g.input if i.name not in inits]
                self.assertEqual(len(real), 1)
                self.assertEqual(real[0].type.tensor_type.shape.dim[0].dim_param, "N")
                self.assertEqual(g.output[0].type.tensor_type.shape.dim[0].dim_param, "N")

    def _tiny(self, node, out_shape):
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)
        return helper.make_model(helper.make_graph([node], "t", [x], [y]))

    def test_rejects_ops_that_move_the_batch(self):
        m = self._tiny(helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2]), [2, 1, 3])
        with self.assertRaises(ValueError):
            pm.make_batch_symbolic(m)
        m = self._tiny(helper.make_node("Concat", ["x", "x"], ["y"], axis=0), [2, 2, 3])
        with self.assertRaises(ValueError):
            pm.make_batch_symbolic(m)

    def test_reshape_leading_one_becomes_zero(self):
        shape = numpy_helper.from_array(np.array([1, 6], np.int64), "s")
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 6])
        m = helper.make_model(helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "t", [x], [y], [shape]),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        pm.make_batch_symbolic(m)
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        out = s.run(None, {"x": np.arange(24, dtype=np.float32).reshape(4, 2, 3)})[0]
        self.assertEqual(out.shape, (4, 6))


class Preprocessing(unittest.TestCase):
    def test_normalise_u8_matches_formula(self):
        u8 = np.random.default_rng(0).integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
        x = pm.normalise_u8(u8, MEAN, STD)
        self.assertEqual(x.shape, (2, 3, 4, 5))
        self.assertEqual(x.dtype, np.float32)
        for c in range(3):
            expect = (u8[:, :, :, c].astype(np.float32) / np.float32(255) - MEAN[c]) / STD[c]
            np.testing.assert_array_equal(x[:, c], expect)

    def test_random_images_are_deterministic_and_differ(self):
        a = pm.random_images(5, 3, 32, 40)
        self.assertEqual(a.shape, (3, 32, 40, 3))
        np.testing.assert_array_equal(a, pm.random_images(5, 3, 32, 40))
        self.assertTrue((a >= 0).all() and (a <= 1).all())
        self.assertGreater(np.abs(a[0] - a[1]).mean(), 0.05)


if __name__ == "__main__":
    unittest.main()
