#!/usr/bin/env python3
"""Independent reference for elastrec's preprocessing operators (docs/preprocess.md).

Written from the documented contracts only, in plain Python (big integers, `math`), so
that the Rust kernels are checked against a second implementation. Writes
`reference.json` next to this file: raw rows, graphs and the expected model inputs.

    python3 crates/preprocess/tests/data/reference.py
"""
import bisect
import json
import math
import os
import random

M64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
NULL_ID = M64
MISSING_CATEGORY = 1 << 32


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix64(z):
    return mix64((z + GOLDEN_GAMMA) & M64)


# Values: None is null. Types: ('int', v), ('float', v), ('id', v), ('ids', [v]), ('floats', [v]).
def num(text):
    return float(text)


def op_fill_null(t, v, arg):
    if t == "ids":
        return t, [int(arg) if x is None else x for x in v]
    if v is not None:
        return t, v
    return t, (float(arg) if t == "float" else int(float(arg)))


def op_clamp(t, v, lo, hi):
    def one(x):
        if x is None:
            return None
        if lo is not None and x < lo:
            x = lo
        if hi is not None and x > hi:
            x = hi
        return float(x) if t == "float" else int(x)
    if t == "ids":
        return t, [one(x) for x in v]
    return t, one(v)


def finite_or_null(y):
    return y if (y is not None and math.isfinite(y)) else None


def op_log1p(t, v):
    if v is None:
        return "float", None
    if t == "int":
        return "float", (math.log(v + 1) if v > -1 else None)
    return "float", (math.log1p(v) if v > -1 else None)


def op_logit(t, v, eps):
    if v is None:
        return "float", None
    p = min(max(float(v), eps), 1 - eps)
    return "float", math.log(p / (1 - p))


def op_box_cox(t, v, lam):
    if v is None or v <= 0:
        return "float", None
    x = float(v)
    y = math.log(x) if lam == 0 else (math.pow(x, lam) - 1) / lam
    return "float", finite_or_null(y)


def op_bucketize(t, v, borders):
    if v is None:
        return "id", None
    return "id", bisect.bisect_right(borders, float(v))


def sigrid(x, salt, mod):
    if x is None:
        return None
    return (mix64(x ^ splitmix64(salt)) * mod) >> 64


def op_sigrid(t, v, salt, mod):
    if t == "ids":
        return t, [sigrid(x, salt, mod) for x in v]
    return t, sigrid(v, salt, mod)


def op_ngram(t, v, n):
    out = []
    for i in range(len(v) - n + 1):
        w = v[i:i + n]
        if any(x is None for x in w):
            out.append(None)
            continue
        h = GOLDEN_GAMMA
        for x in w:
            h = mix64(h ^ x)
        out.append(NULL_ID - 1 if h == NULL_ID else h)
    return "ids", out


def op_first_x(t, v, x):
    return t, v[:x]


def op_map_id(t, v, mapping, default):
    def one(x):
        if x is None:
            return None
        return mapping.get(x, default)
    if t == "ids":
        return t, [one(x) for x in v]
    return t, one(v)


def op_onehot(t, v, n):
    return "floats", [1.0 if v == j else 0.0 for j in range(n)]


def op_multihot(t, v, n):
    vs = v if t == "ids" else [v]
    return "floats", [1.0 if j in vs else 0.0 for j in range(n)]


def op_cast(t, v, to):
    if v is None:
        return to, None
    if to == "float":
        return to, float(v)
    if to == "int":
        if t == "float":
            tr = math.trunc(v)
            return to, (tr if -(2 ** 63) < tr < 2 ** 63 else None)
        return to, (v if v < 2 ** 63 else None)
    # to id
    if t == "float":
        tr = math.trunc(v)
        return to, (tr if 0 <= tr < 2 ** 64 else None)
    return to, (v if v >= 0 else None)


def load(row, inputs):
    def col(name):
        if name[0] == "I":
            return row["ints"][int(name[1:]) - 1]
        return row["cats"][int(name[1:]) - 1]
    if isinstance(inputs, list):
        return "ids", [(None if (c[0] == "I" and col(c) is not None and col(c) < 0) else col(c)) for c in inputs]
    return ("int" if inputs[0] == "I" else "id"), col(inputs)


# Each graph entry: (input, [ops as text], [(python op, args)]).
GRAPH = [
    ("I1", ["fill_null(0)", "clamp(0, 1e6)", "log1p"],
     [(op_fill_null, ("0",)), (op_clamp, (0, 10 ** 6)), (op_log1p, ())]),
    ("I2", ["fill_null(-1)", "log1p"], [(op_fill_null, ("-1",)), (op_log1p, ())]),
    ("I3", ["fill_null(0)", "clamp(0, 1)", "cast(float)", "logit(eps=0.01)"],
     [(op_fill_null, ("0",)), (op_clamp, (0, 1)), (op_cast, ("float",)), (op_logit, (0.01,))]),
    ("I4", ["fill_null(1)", "clamp(min=1)", "box_cox(0.5)"],
     [(op_fill_null, ("1",)), (op_clamp, (1, None)), (op_box_cox, (0.5,))]),
    ("I5", ["box_cox(0)"], [(op_box_cox, (0.0,))]),
    ("I6", ["fill_null(0)", "bucketize([0, 1, 10, 100, 1000])", "onehot(6)"],
     [(op_fill_null, ("0",)), (op_bucketize, ([0, 1, 10, 100, 1000],)), (op_onehot, (6,))]),
    ("I7", ["bucketize([" + ", ".join(str(b * b - 50) for b in range(40)) + "])"],
     [(op_bucketize, ([b * b - 50 for b in range(40)],))]),
    ("I8", ["cast(float)", "clamp(-5.5, 20.25)", "log1p"],
     [(op_cast, ("float",)), (op_clamp, (-5.5, 20.25)), (op_log1p, ())]),
    ("I9", ["cast(id)", "sigrid_hash(3, 1000)"], [(op_cast, ("id",)), (op_sigrid, (3, 1000))]),
    ("C1", ["sigrid_hash(salt=7, mod=100000)"], [(op_sigrid, (7, 100000))]),
    (["C3", "C7"], ["ngram(2)", "sigrid_hash(salt=11, mod=50000)"],
     [(op_ngram, (2,)), (op_sigrid, (11, 50000))]),
    (["C1", "C2", "C4", "C5"], ["first_x(3)", "ngram(2)"], [(op_first_x, (3,)), (op_ngram, (2,))]),
    ("I10", ["fill_null(0)", "clamp(0, 5)", "cast(id)", "map_id({0: 10, 1: 11, 2: 12}, default=99)"],
     [(op_fill_null, ("0",)), (op_clamp, (0, 5)), (op_cast, ("id",)),
      (op_map_id, ({0: 10, 1: 11, 2: 12}, 99))]),
    (["I11", "I12"], ["clamp(max=7)", "multihot(8)"], [(op_clamp, (None, 7)), (op_multihot, (8,))]),
    ("C10", ["fill_null(123)", "sigrid_hash(0, 17)"], [(op_fill_null, ("123",)), (op_sigrid, (0, 17))]),
    ("I13", ["cast(float)", "cast(int)", "cast(id)", "cast(float)"],
     [(op_cast, ("float",)), (op_cast, ("int",)), (op_cast, ("id",)), (op_cast, ("float",))]),
    ("C11", ["cast(float)", "log1p"], [(op_cast, ("float",)), (op_log1p, ())]),
    ("C12", ["map_id({1: 2})"], [(op_map_id, ({1: 2}, None))]),
]


def rows(n, seed):
    rng = random.Random(seed)
    specials = [0, 1, -1, -2, 2, 5, 7, 8, 100, 4095, 4096, 10 ** 6, 10 ** 12, 2 ** 63 - 1]
    out = []
    for _ in range(n):
        ints = []
        for _ in range(13):
            r = rng.random()
            if r < 0.15:
                ints.append(None)
            elif r < 0.45:
                ints.append(rng.choice(specials))
            elif r < 0.8:
                ints.append(rng.randint(-3, 9))
            else:
                ints.append(rng.randint(-10 ** 4, 10 ** 9))
        cats = []
        for _ in range(26):
            r = rng.random()
            cats.append(None if r < 0.1 else (rng.randint(0, 3) if r < 0.3 else rng.getrandbits(32)))
        out.append({"label": rng.randint(0, 1), "ints": ints, "cats": cats})
    return out


def main():
    data = rows(300, 20261124)
    dense, sparse = [], []
    for row in data:
        d, s = [], []
        for inputs, _, ops in GRAPH:
            t, v = load(row, inputs)
            for f, args in ops:
                t, v = f(t, v, *args)
            if t == "float":
                d.append(0.0 if v is None else v)
            elif t == "floats":
                d.extend(v)
            elif t == "id":
                s.append(MISSING_CATEGORY if v is None else v)
            else:
                s.extend(MISSING_CATEGORY if x is None else x for x in v)
        dense.append(d)
        sparse.append(s)
    graph = [{"input": i, "ops": ops} for i, ops, _ in GRAPH]
    out = {"rows": data, "graph": graph, "dense": dense, "sparse": [[str(x) for x in s] for s in sparse]}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"{path}: {len(data)} rows, {len(dense[0])} dense and {len(sparse[0])} sparse columns")


if __name__ == "__main__":
    main()
