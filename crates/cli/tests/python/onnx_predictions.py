"""Runs an ONNX graph exported by `elastrec export --format onnx` in ONNX Runtime on the
inputs `elastrec eval --onnx-inputs` wrote, and compares its probabilities with the
predictions `elastrec eval --predictions` wrote for the same rows.

Usage: onnx_predictions.py MODEL.onnx INPUTS.safetensors PREDICTIONS.csv [RAW_DATA]
Prints JSON: rows, tasks, the largest absolute difference, and the graph's inputs.

With RAW_DATA (a graph exported with `--raw-dense`), the `dense` input is the data file's
own dense columns, as the side file names them, NaN for an empty field: a CSV file with a
header, or a Criteo TSV file (`I1`..`I13` are fields 1-13).
"""

import csv
import json
import sys

import math

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file


def number(text):
    return float(text) if text != "" else math.nan


def raw_dense(model, data, rows):
    """The dense columns of the first `rows` rows of `data`, as the side file names them."""
    with open(model + ".json") as f:
        columns = [c["column"] for c in json.load(f)["inputs"]["dense"]]
    with open(data, newline="") as f:
        if data.endswith(".csv"):
            records = [[number(r[c]) for c in columns] for r in csv.DictReader(f)]
        else:
            fields = [int(c[1:]) for c in columns]
            records = [[number(r[i]) for i in fields] for r in csv.reader(f, delimiter="\t")]
    return np.array(records[:rows], dtype=np.float32)


def main():
    model, inputs, predictions = sys.argv[1:4]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    tensors = load_file(inputs)
    feed = {i.name: tensors[i.name] for i in session.get_inputs()}
    if len(sys.argv) > 4:
        feed["dense"] = raw_dense(model, sys.argv[4], feed["dense"].shape[0])
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
    nulls = int(np.isnan(feed["dense"]).sum()) if len(sys.argv) > 4 else 0
    print(
        json.dumps(
            {
                "dense_nulls": nulls,
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
