"""Triton Python-backend model: the repository's ONNX model through
onnxruntime, the same work as a kneepoint IF (see kp_peer_model.py).

Triton's dynamic batcher hands execute() the requests it batched; they are
run as one ONNX Runtime batch and answered one response each. The model
repository entry (config.pbtxt, written by bench/bench.py) passes the
kneepoint model config and the intra-op threads as parameters. numpy and
onnxruntime come from the peers' venv: tritonserver runs with that venv's
bin/ first in PATH, which is how the stub's embedded Python finds it (as
pytriton does).

Input  INPUT   UINT8 [224, 224, 3] per request (RGB, HWC), batch dim added
Output CLASSES INT32 [top_k], SCORES FP32 [top_k]
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kp_peer_model import Model  # noqa: E402  (copied beside this file)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.model = Model(params["kp_config"]["string_value"], int(params["threads"]["string_value"]))

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        classes, scores = self.model(np.concatenate(arrays) if len(arrays) > 1 else arrays[0])
        responses, i = [], 0
        for a in arrays:
            n = a.shape[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("CLASSES", classes[i:i + n]),
                pb_utils.Tensor("SCORES", scores[i:i + n]),
            ]))
            i += n
        return responses
