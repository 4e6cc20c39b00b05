"""Reads the dynamic tables of a safetensors file written by `elastrec export --format
safetensors`: each table's stored rows and their keys.

Usage: safetensors_keys.py MODEL.safetensors
Prints JSON: per table with keys, its key count, the rows of its table tensor, the
keys' dtype, whether the keys are distinct, and whether the last row is all zeros.
"""

import json
import sys

import numpy as np
from safetensors.numpy import load_file


def main():
    tensors = load_file(sys.argv[1])
    tables = {}
    for name, keys in tensors.items():
        if not name.endswith(".keys"):
            continue
        table = tensors[name[: -len(".keys")]]
        tables[name] = {
            "keys": int(keys.shape[0]),
            "rows": int(table.shape[0]),
            "dtype": str(keys.dtype),
            "distinct": bool(np.unique(keys).shape[0] == keys.shape[0]),
            "last_row_zero": bool(np.all(table[-1] == 0)),
        }
    print(json.dumps(tables))


if __name__ == "__main__":
    main()
