"""PyTorch reference of `elastrec bench bags`: one embedding bag per row, pooled by sum or
mean through nn.EmbeddingBag(sparse=True), the backward of (pooled * c).sum() and
torch.optim.Adagrad's update of the rows touched.

Bag lengths are uniform in 1..2L-1 (mean L), ids uniform over the table; four batches
are drawn before the clock starts and cycled. Prints one JSON line.
"""

import argparse
import warnings
import json
import time

import torch
from torch import nn


def batches(args, count):
    g = torch.Generator().manual_seed(17)
    out = []
    for _ in range(count):
        lens = torch.randint(1, 2 * args.mean_len, (args.batch,), generator=g)
        ids = torch.randint(0, args.rows, (int(lens.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
        out.append((ids, offsets))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["sum", "mean"], required=True)
    p.add_argument("--mean-len", type=int, default=8)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    # Adagrad on a sparse gradient warns once that invariant checks are off.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(args.rows, args.dim, mode=args.mode, sparse=True)
    opt = torch.optim.Adagrad(bag.parameters(), lr=0.01, eps=1e-10)
    data = batches(args, 4)
    c = torch.rand(args.batch, args.dim) - 0.5

    def step(i):
        ids, offsets = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        (bag(ids, offsets) * c).sum().backward()
        opt.step()

    for i in range(2):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    sps = args.steps * args.batch / (time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "mode": args.mode,
                "mean_len": args.mean_len,
                "torch": torch.__version__,
                "threads": args.threads,
                "samples_per_s": sps,
            }
        )
    )


if __name__ == "__main__":
    main()
