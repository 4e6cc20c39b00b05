"""Runs an ONNX graph exported by `elastrec export --format onnx` in ONNX Runtime on the
inputs `elastrec eval --onnx-inputs` wrote, and compares its probabilities with the
predictions `elastrec eval --predictions` wrote for the same rows.

Usage: onnx_predictions.py MODEL.onnx INPUTS.safetensors PREDICTIONS.csv
Prints JSON: rows, tasks, the largest absolute difference, and the graph's inputs.
"""

import csv
import json
import sys

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file


def main():
    model, inputs, predictions = sys.argv[1:4]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    tensors = load_file(inputs)
    feed = {i.name: tensors[i.name] for i in session.get_inputs()}
    probability = session.run(["probability"], feed)[0]
    with open(predictions, newline="") as f:
        rows = list(csv.DictReader(f))
    tasks = probability.shape[1]
    want = np.array(
        [
            [float(r["prediction" if t == 0 else f"prediction_{t}"]) for t in range(tasks)]
            for r in rows
        ],
        dtype=np.float64,
    )
    diff = np.abs(probability.astype(np.float64) - want)
    print(
        json.dumps(
            {
                "rows": int(probability.shape[0]),
                "tasks": int(tasks),
                "max_abs_diff": float(diff.max()),
                "inputs": sorted(feed),
                "mean_probability": float(probability[:, 0].mean()),
            }
        )
    )


if __name__ == "__main__":
    main()
