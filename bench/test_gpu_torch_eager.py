"""Unit tests of scripts/gpu_torch_eager.py, the PyTorch eager baseline of
`make gpu-check` (run by `make test`, which has no PyTorch: what needs it
is skipped there and was run by hand with Debian's python3-torch on CPU,
docs/GPU.md).

    .venv/bin/python -m unittest bench/test_gpu_torch_eager.py
"""

from __future__ import annotations

import csv
import importlib.util
import io
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gpu_torch_eager", ROOT / "scripts" / "gpu_torch_eager.py")
gte = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gte)


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class Coverage(unittest.TestCase):
    @unittest.skipUnless(has("onnx"), "no onnx")
    def test_every_operator_of_every_repository_model_has_an_eager_op(self):
        import onnx

        models = sorted((ROOT / "models").glob("*/model.onnx"))
        self.assertGreaterEqual(len(models), 9, "make models first")
        for path in models:
            m = onnx.load(str(path), load_external_data=False)
            self.assertEqual(gte.unsupported(m), [], path.parent.name)

    @unittest.skipUnless(has("onnx"), "no onnx")
    def test_an_unknown_operator_is_named(self):
        from onnx import helper

        node = helper.make_node("Erf", ["x"], ["y"])
        graph = helper.make_graph([node], "g", [], [])
        self.assertEqual(gte.unsupported(helper.make_model(graph)), ["Erf"])


class Pads(unittest.TestCase):
    def test_symmetric_pads_stay_in_the_op(self):
        self.assertEqual(gte.pads2d({"pads": [1, 2, 1, 2]}), ((1, 2), None))
        self.assertEqual(gte.pads2d({}), ((0, 0), None))

    def test_asymmetric_pads_become_an_explicit_pad_left_right_top_bottom(self):
        # ONNX: top, left, bottom, right.
        self.assertEqual(gte.pads2d({"pads": [0, 0, 1, 1]}), (None, (0, 1, 0, 1)))
        self.assertEqual(gte.pads2d({"pads": [1, 0, 2, 3]}), (None, (0, 3, 1, 2)))

    def test_auto_pad_is_refused(self):
        with self.assertRaises(ValueError):
            gte.pads2d({"auto_pad": b"SAME_UPPER"})


class Compare(unittest.TestCase):
    def write(self, path: Path, rows):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "batch", "median_ms", "p90_ms", "images_per_s"])
            w.writerows(rows)

    def test_ratio_per_model_and_batch_of_the_medians(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d)
            self.write(out / "engine.csv", [["resnet50", 1, "3.0", "3.1", "333"], ["resnet50", 2, "4.0", "4.2", "500"],
                                            ["vgg19", 1, "2.0", "2.0", "500"]])
            self.write(out / "torch.csv", [["resnet50", 1, "2.0", "2.2", "500"], ["resnet50", 2, "5.0", "5.1", "400"]])
            text = io.StringIO()
            with redirect_stdout(text):
                gte.compare(out)
            with open(out / "cudnn_vs_torch.csv") as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([(r["model"], r["batch"], r["ratio"]) for r in rows],
                             [("resnet50", "1", "1.500"), ("resnet50", "2", "0.800")])
            self.assertIn("| resnet50 | 1.50 | 0.80 |", text.getvalue())
            self.assertIn("2 of 2 within 1.5", text.getvalue())


class WithoutTorch(unittest.TestCase):
    @unittest.skipIf(has("torch"), "torch is installed here")
    def test_no_torch_is_exit_2_with_a_reason(self):
        with tempfile.TemporaryDirectory() as d:
            err = io.StringIO()
            with redirect_stderr(err):
                rc = gte.main([str(ROOT / "models"), d])
            self.assertEqual(rc, 2)
            self.assertIn("no PyTorch baseline here", err.getvalue())


@unittest.skipUnless(has("torch") and has("onnx") and has("onnxruntime"), "needs torch, onnx and onnxruntime")
class OnCpu(unittest.TestCase):
    def test_squeezenet_and_inception_v1_agree_with_onnxruntime(self):
        with tempfile.TemporaryDirectory() as d:
            text = io.StringIO()
            with redirect_stdout(text):
                rc = gte.main([str(ROOT / "models"), d, "--device", "cpu", "--reps", "1", "--max-batch", "2",
                               "--only", "squeezenet,inception_v1"])
            self.assertEqual(rc, 0, text.getvalue())
            self.assertEqual(text.getvalue().count("agree with onnxruntime: yes"), 2, text.getvalue())


if __name__ == "__main__":
    sys.exit(unittest.main())
