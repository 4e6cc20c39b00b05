#!/usr/bin/env python3
"""The `elastrec bench preprocess` graph in polars, the peer of elastrec's fused plan.

`elastrec bench preprocess --polars PYTHON` runs this script with the same Parquet file
and graph (JSON), after its own rounds, and prints both side by side. Alone:

    POLARS_MAX_THREADS=2 python bench/preprocess_polars.py --parquet FILE --spec JSON

Each op is written the fastest way polars offers (measured, polars 2.1): `fill_null`,
`clip`, `log1p`, bucketize as `search_sorted` on the borders (faster than `cut`), the hash
as polars' native `hash(seed)` reduced modulo, an n-gram cross as the hash of a struct of
its columns. The data is read and materialized before the clock starts; each round is one
`select` of every feature, evaluated by polars' thread pool. Prints one JSON line.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parquet", required=True)
    ap.add_argument("--spec", required=True, help="the graph, as JSON (see elastrec bench preprocess)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ["POLARS_MAX_THREADS"] = str(a.threads)
    import polars as pl  # after the thread count is set

    spec = json.loads(a.spec)
    df = pl.read_parquet(a.parquet).rechunk()
    lo, hi = spec["clamp"]
    borders = pl.Series("borders", spec["borders"], dtype=pl.Float64)
    exprs = []
    for c in spec["ints"]:
        x = pl.col(c).fill_null(0).clip(lo, hi).log1p()
        exprs.append(pl.lit(borders).search_sorted(x, side="right").alias(c))
    for i, c in enumerate(spec["cats"]):
        exprs.append((pl.col(c).hash(seed=i) % spec["mod"]).alias(c))
    for i, cross in enumerate(spec["crosses"]):
        name = "_".join(cross)
        h = pl.struct([pl.col(c) for c in cross]).hash(seed=1000 + i) % spec["cross_mod"]
        exprs.append(h.alias(name))
    df.select(exprs)  # warm up
    times = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        out = df.select(exprs)
        times.append(time.perf_counter() - t0)
    assert out.height == df.height and out.width == len(exprs)
    print(json.dumps({
        "rows": df.height,
        "features": out.width,
        "threads": a.threads,
        "best_s": min(times),
        "median_s": statistics.median(times),
        "polars": pl.__version__,
    }))


if __name__ == "__main__":
    sys.exit(main())
