"""PyTorch reference of `elastrec bench sequence`: a behaviour sequence pooled against its
candidate, forward and backward, on random histories.

Layers (the sizes elastrec's bench passes):
- din: an MLP over [h, q, h - q, h * q] (ReLU hidden layers, one linear score), the raw
  scores as weights (DIN's choice), padding masked;
- transformer: torch.nn.TransformerEncoderLayer (pre-norm as elastrec's, ReLU, no
  dropout, batch first) over [history..., candidate] plus learned positions, the
  candidate's output pooled. This is what a PyTorch user writes; it computes every token's output.
  `candidate_only_samples_per_s` times the same function computed as elastrec computes
  it: in the last layer only the candidate's query, attention and feed-forward.

A step: pooled = layer(hist, q); (pooled * c).sum().backward(), gradients into the
layer's parameters, the histories and the candidates. Prints one JSON line.
"""

import argparse
import json
import time

import torch
from torch import nn


class Din(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        sizes = [4 * dim] + hidden
        layers = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, hist, q, mask):
        qe = q.unsqueeze(1).expand_as(hist)
        x = torch.cat([hist, qe, hist - qe, hist * qe], dim=-1)
        w = self.mlp(x).squeeze(-1) * mask
        return (w.unsqueeze(-1) * hist).sum(1)


class Bst(nn.Module):
    def __init__(self, dim, heads, layers, length):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(length + 1, dim) * 0.05)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim,
                heads,
                dim_feedforward=4 * dim,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )

    def tokens(self, hist, q):
        x = torch.cat([hist, q.unsqueeze(1)], dim=1)
        # Recency: the candidate is position 0, the newest item 1.
        return x + self.pos.flip(0)

    def forward(self, hist, q, mask):
        x = self.tokens(hist, q)
        pad = torch.cat([mask == 0, torch.zeros_like(mask[:, :1], dtype=torch.bool)], 1)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return x[:, -1]


class BstCandidateOnly(Bst):
    """The same function; the last layer computes the candidate's output alone."""

    def forward(self, hist, q, mask):
        x = self.tokens(hist, q)
        pad = torch.cat([mask == 0, torch.zeros_like(mask[:, :1], dtype=torch.bool)], 1)
        for layer in self.layers[:-1]:
            x = layer(x, src_key_padding_mask=pad)
        last = self.layers[-1]
        xn = last.norm1(x)
        a, _ = last.self_attn(
            xn[:, -1:], xn, xn, key_padding_mask=pad, need_weights=False
        )
        y = x[:, -1:] + a
        y = y + last.linear2(torch.relu(last.linear1(last.norm2(y))))
        return y[:, 0]


def time_layer(module, args):
    n, t, d = args.batch, args.len, args.dim
    g = torch.Generator().manual_seed(11)
    hist = (torch.rand(n, t, d, generator=g) - 0.5).requires_grad_()
    q = (torch.rand(n, d, generator=g) - 0.5).requires_grad_()
    mask = torch.ones(n, t)
    c = torch.rand(n, d, generator=g) - 0.5

    def step():
        module.zero_grad(set_to_none=True)
        hist.grad = None
        q.grad = None
        (module(hist, q, mask) * c).sum().backward()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    return args.steps * n / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layer", choices=["din", "transformer"], required=True)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--len", type=int, default=50)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--din-mlp", default="32")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = {"layer": args.layer, "torch": torch.__version__, "threads": args.threads}
    if args.layer == "din":
        hidden = [int(h) for h in args.din_mlp.split(",") if h]
        out["samples_per_s"] = time_layer(Din(args.dim, hidden), args)
    else:
        full = Bst(args.dim, args.heads, args.layers, args.len)
        out["samples_per_s"] = time_layer(full, args)
        cand = BstCandidateOnly(args.dim, args.heads, args.layers, args.len)
        out["candidate_only_samples_per_s"] = time_layer(cand, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
