#!/usr/bin/env python3
"""PyTorch CPU reference of the elastrec DLRM training step.

Same model as `elastrec-model` + the embedding store: bottom MLP (ReLU), T embedding
tables of dim d, DLRM dot interaction (strictly-lower-triangular pairwise dots, the
bottom output concatenated in front), top MLP (ReLU, last layer a logit), mean BCE with
logits. Dense parameters: torch.optim.Adagrad. Embeddings: row-wise Adagrad implemented
here (accumulator per row += mean over the row of grad^2; row -= lr * g / (sqrt(acc) + eps)),
applied sparsely to the rows touched by the batch.

Modes
  full   whole training step (embedding lookup, dense fwd/bwd, dense + sparse update)
  dense  dense part only: the embeddings are a fixed [n, T, d] tensor with requires_grad
         (its gradient is computed, as the trainer needs d_emb), no lookup / sparse update.

Embedding implementations (--emb-impl)
  bag     26 nn.EmbeddingBag(mode="sum", sparse=True), one id per bag; the sparse grads are
          coalesced and row-wise Adagrad is applied to the unique rows (the conventional
          DLRM reference path).
  gather  plain index_select per table into one [n, T, d] leaf tensor; its gradient is
          aggregated per unique row with index_add_ (what elastrec does).

Data: random in-memory batches (dense ~ log1p(exponential), Zipf ids, 25% positives) or the
first lines of a Criteo TSV (label, 13 ints, 26 hex categoricals), hashed modulo the row
counts. Prints one JSON line.
"""
import argparse
import json
import math
import os
import platform
import re
import time

import numpy as np
import torch
import torch.nn as nn

# Criteo Kaggle (Display Advertising Challenge) categorical cardinalities, as used by the
# DLRM reference implementation.
KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
               3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
               142572]


def parse_sizes(s):
    return [int(v) for v in s.replace(",", "-").split("-") if v]


def parse_rows(arg, num_tables, max_rows):
    if arg == "kaggle":
        rows = list(KAGGLE_ROWS)
    elif os.path.isfile(arg):
        with open(arg) as f:
            rows = json.load(f)
        if isinstance(rows, dict):
            rows = rows["rows"]
    else:
        rows = [int(v) for v in arg.split(",")]
    if len(rows) == 1:
        rows = rows * num_tables
    if len(rows) != num_tables:
        raise SystemExit(f"{len(rows)} row counts for {num_tables} tables")
    if max_rows:
        rows = [min(r, max_rows) for r in rows]
    return rows


def mlp(sizes, last_act):
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        # Same init family as elastrec-model: Xavier-uniform weights, U(+-1/sqrt(fan_in)) bias.
        nn.init.xavier_uniform_(lin.weight)
        bound = 1.0 / math.sqrt(sizes[i])
        nn.init.uniform_(lin.bias, -bound, bound)
        layers.append(lin)
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseDlrm(nn.Module):
    def __init__(self, bottom, top, num_tables, dim):
        super().__init__()
        assert bottom[-1] == dim, "dot interaction needs bottom output == embedding dim"
        f = num_tables + 1
        self.bot = mlp(bottom, last_act=True)
        self.top = mlp([dim + f * (f - 1) // 2] + top, last_act=False)
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def forward(self, dense_x, emb):  # emb: [n, T, d]
        x = self.bot(dense_x)
        t = torch.cat([x.unsqueeze(1), emb], dim=1)  # [n, F, d]
        z = torch.bmm(t, t.transpose(1, 2))
        r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
        return self.top(r).squeeze(1)


class RowwiseAdagradTables:
    """Embedding tables with a sparse row-wise Adagrad update."""

    def __init__(self, rows, dim, impl, lr, eps, init_acc, gen):
        self.impl, self.lr, self.eps = impl, lr, eps
        self.weights, self.bags = [], []
        for r in rows:
            bound = 1.0 / math.sqrt(r)
            w = torch.empty(r, dim).uniform_(-bound, bound, generator=gen)
            if impl == "bag":
                bag = nn.EmbeddingBag(r, dim, mode="sum", sparse=True, _weight=w)
                self.bags.append(bag)
                self.weights.append(bag.weight)
            else:
                self.weights.append(w)
        self.acc = [torch.full((r,), init_acc) for r in rows]
        self.offsets = None

    def lookup(self, ids):  # ids: [n, T] int64 -> [n, T, d]
        n, t = ids.shape
        if self.impl == "bag":
            if self.offsets is None or self.offsets.numel() != n:
                self.offsets = torch.arange(n, dtype=torch.int64)
            for b in self.bags:
                b.weight.grad = None
            outs = [self.bags[k](ids[:, k].contiguous(), self.offsets) for k in range(t)]
            return torch.stack(outs, dim=1)
        with torch.no_grad():
            e = torch.stack([self.weights[k].index_select(0, ids[:, k]) for k in range(t)], 1)
        return e.requires_grad_()

    @torch.no_grad()
    def update(self, ids, emb):
        for k in range(len(self.weights)):
            if self.impl == "bag":
                g = self.weights[k].grad.coalesce()
                rows, vals = g.indices()[0], g.values()
            else:
                rows, inv = torch.unique(ids[:, k], return_inverse=True)
                vals = torch.zeros(rows.numel(), emb.grad.shape[2])
                vals.index_add_(0, inv, emb.grad[:, k, :])
            acc = self.acc[k]
            a = acc.index_select(0, rows) + vals.pow(2).mean(dim=1)
            acc.index_copy_(0, rows, a)
            step = vals * (self.lr / (a.sqrt() + self.eps)).unsqueeze(1)
            self.weights[k].data.index_add_(0, rows, -step)


def random_batches(count, n, num_dense, rows, zipf_a, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dense = np.log1p(rng.exponential(10.0, size=(n, num_dense))).astype(np.float32)
        ids = np.stack([(rng.zipf(zipf_a, size=n) - 1) % r for r in rows], axis=1)
        labels = (rng.random(n) < 0.25).astype(np.float32)
        out.append((torch.from_numpy(dense), torch.from_numpy(ids.astype(np.int64)),
                    torch.from_numpy(labels)))
    return out


def tsv_batches(path, count, n, num_dense, rows):
    dense, ids, labels = [], [], []
    need = count * n
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            labels.append(float(parts[0]))
            dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in parts[1:1 + num_dense]])
            cats = parts[1 + num_dense:]
            ids.append([(int(c, 16) if c else 0) % rows[k] for k, c in enumerate(cats[:len(rows)])])
            if len(labels) == need:
                break
    if len(labels) < need:
        raise SystemExit(f"{path}: {len(labels)} lines, need {need}")
    d = torch.tensor(dense, dtype=torch.float32)
    i = torch.tensor(ids, dtype=torch.int64)
    y = torch.tensor(labels, dtype=torch.float32)
    return [(d[s:s + n], i[s:s + n], y[s:s + n]) for s in range(0, need, n)]


def cpu_list(cpus):
    """A CPU set as the kernel writes one: 0-3,6."""
    cpus, parts, i = sorted(cpus), [], 0
    while i < len(cpus):
        start = cpus[i]
        while i + 1 < len(cpus) and cpus[i + 1] == cpus[i] + 1:
            i += 1
        parts.append(str(start) if cpus[i] == start else f"{start}-{cpus[i]}")
        i += 1
    return ",".join(parts)


def backend():
    """What this torch build computes with: its vector path, its BLAS and its oneDNN
    (from `torch.__config__.show()`: "BLAS_INFO=mkl", "Intel(R) MKL-DNN v3.x ...")."""
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    onednn = re.search(r"(?:oneDNN|MKL-DNN) (v[\d.]+)", config)
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    return {
        "cpu_capability": capability,
        "blas": blas.group(1) if blas else None,
        "onednn": onednn.group(1) if onednn and torch.backends.mkldnn.is_available() else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["full", "dense"], default="full")
    ap.add_argument("--emb-impl", choices=["gather", "bag"], default="gather")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--bottom", default="13-512-256-64-16")
    ap.add_argument("--top", default="512-256-1")
    ap.add_argument("--num-tables", type=int, default=26)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--rows", default="kaggle",
                    help="'kaggle', one count for all tables, a comma list, or a JSON file "
                         "(list or {\"rows\": [...]})")
    ap.add_argument("--max-rows", type=int, default=0, help="cap (hash size) per table; 0 = none")
    ap.add_argument("--data", default="random", help="'random' or a Criteo TSV path")
    ap.add_argument("--zipf-a", type=float, default=1.2)
    ap.add_argument("--distinct-batches", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--emb-lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bottom, top = parse_sizes(args.bottom), parse_sizes(args.top)
    t, d, n = args.num_tables, args.dim, args.batch
    model = DenseDlrm(bottom, top, t, d)
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr, eps=1e-10)
    loss_fn = nn.BCEWithLogitsLoss()

    nb = args.distinct_batches
    rows = parse_rows(args.rows, t, args.max_rows)
    if args.mode == "full":
        gen = torch.Generator().manual_seed(args.seed)
        tables = RowwiseAdagradTables(rows, d, args.emb_impl, args.emb_lr, 1e-8, 0.0, gen)
        if args.data == "random":
            batches = random_batches(nb, n, bottom[0], rows, args.zipf_a, args.seed)
        else:
            batches = tsv_batches(args.data, nb, n, bottom[0], rows)
    else:
        g = torch.Generator().manual_seed(args.seed)
        batches = [(torch.rand(n, bottom[0], generator=g),
                    torch.randn(n, t, d, generator=g) * 0.1,
                    (torch.rand(n, generator=g) < 0.25).float()) for _ in range(nb)]

    def step(i):
        dense_x, second, labels = batches[i % nb]
        if args.mode == "full":
            emb = tables.lookup(second)
        else:
            emb = second.requires_grad_()
            emb.grad = None
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense_x, emb), labels)
        loss.backward()
        opt.step()
        if args.mode == "full":
            tables.update(second, emb)
        return loss.item()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    last = 0.0
    for i in range(args.steps):
        last = step(args.warmup + i)
    dt = time.perf_counter() - t0
    print(json.dumps({
        "impl": "pytorch",
        "mode": args.mode,
        "emb_impl": args.emb_impl if args.mode == "full" else None,
        "samples_per_s": round(args.steps * n / dt, 1),
        "ms_per_step": round(1e3 * dt / args.steps, 3),
        "threads": args.threads,
        "batch": n,
        "steps": args.steps,
        "bottom": bottom,
        "top": top,
        "num_tables": t,
        "dim": d,
        "rows_total": sum(rows) if args.mode == "full" else None,
        "data": args.data if args.mode == "full" else "fixed-tensor",
        "last_loss": round(last, 5),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads_used": torch.get_num_threads(),
        "cpus": cpu_list(os.sched_getaffinity(0)),
        **backend(),
    }))


if __name__ == "__main__":
    main()
