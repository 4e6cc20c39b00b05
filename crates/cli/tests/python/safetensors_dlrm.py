"""Opens the tensors `elastrec export --format safetensors` wrote (with PyTorch when it is
installed, else numpy) and computes a plain DLRM's predictions from them by hand on the
inputs `elastrec eval --onnx-inputs` wrote: the names, shapes and layouts are what a
PyTorch user would rebuild the model from.

Usage: safetensors_dlrm.py MODEL.safetensors INPUTS.safetensors PREDICTIONS.csv
Prints JSON: rows, tensors, the loader used, the largest absolute difference.
"""

import csv
import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def load(path):
    try:
        from safetensors.torch import load_file as load_torch

        return {k: v.numpy() for k, v in load_torch(path).items()}, "torch"
    except ImportError:
        return load_file(path), "numpy"


def mlp(w, name, x, last_relu):
    i = 0
    while f"{name}.{i}.weight" in w:
        x = x @ w[f"{name}.{i}.weight"].T + w[f"{name}.{i}.bias"]
        if f"{name}.{i + 1}.weight" in w or last_relu:
            x = np.maximum(x, 0)
        i += 1
    return x


def main():
    model, inputs, predictions = sys.argv[1:4]
    w, loader = load(model)
    with safe_open(model, "np") as f:
        meta = f.metadata()
    signature = json.loads(meta["elastrec.signature"])
    x = load_file(inputs)
    dense = x["dense"].astype(np.float64)
    if "dense.shift" in w:
        dense = (dense - w["dense.shift"]) * w["dense.scale"]
    z = mlp(w, "bottom", dense, last_relu=True)
    rows = x["sparse_rows"]
    emb = np.stack(
        [
            w["embedding." + signature["tables"][slot["table"]]["name"]][rows[:, s]]
            for s, slot in enumerate(signature["singles"])
        ],
        axis=1,
    )
    features = np.concatenate([z[:, None, :], emb], axis=1)
    gram = features @ features.transpose(0, 2, 1)
    f = features.shape[1]
    pairs = [gram[:, i, j] for i in range(1, f) for j in range(i)]
    inter = np.concatenate([z, np.stack(pairs, axis=1)], axis=1)
    logit = mlp(w, "top", inter, last_relu=False)[:, 0]
    probability = 1 / (1 + np.exp(-logit))
    with open(predictions, newline="") as fh:
        want = np.array([float(r["prediction"]) for r in csv.DictReader(fh)])
    print(
        json.dumps(
            {
                "rows": int(len(probability)),
                "tensors": len(w),
                "loader": loader,
                "max_abs_diff": float(np.abs(probability - want).max()),
            }
        )
    )


if __name__ == "__main__":
    main()
