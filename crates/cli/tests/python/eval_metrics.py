"""Reference figures of `elastrec eval --predictions` output, computed by scikit-learn.

Usage: python3 eval_metrics.py PREDICTIONS.csv
Prints JSON: auc, logloss, ne, calibration over the rows, each weighted by the file's
`weight` column, and with a `user` column gauc: each user's weighted AUC (users whose rows
hold one class only left out), averaged over users weighted by their rows' total weight.
"""

import csv
import json
import math
import sys

from sklearn.metrics import log_loss, roc_auc_score


def main(path):
    y, w, p, users = [], [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            y.append(float(row["label"]))
            w.append(float(row["weight"]))
            p.append(float(row["prediction"]))
            users.append(row.get("user"))
    logloss = log_loss(y, p, sample_weight=w, labels=[0.0, 1.0])
    rate = sum(wi * yi for wi, yi in zip(w, y)) / sum(w)
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    out = {}
    if users and users[0] is not None:
        rows = {}
        for i, u in enumerate(users):
            rows.setdefault(u, []).append(i)
        total = weighted = 0.0
        for idx in rows.values():
            ys = [y[i] for i in idx]
            ws = [w[i] for i in idx]
            if len(set(ys)) < 2 or sum(wi for wi, yi in zip(ws, ys) if yi) == 0:
                continue
            if sum(wi for wi, yi in zip(ws, ys) if not yi) == 0:
                continue
            auc = roc_auc_score(ys, [p[i] for i in idx], sample_weight=ws)
            weighted += auc * sum(ws)
            total += sum(ws)
        out["gauc"] = weighted / total
    print(
        json.dumps(
            out | {
                "rows": len(y),
                "auc": roc_auc_score(y, p, sample_weight=w),
                "logloss": logloss,
                "ne": logloss / entropy,
                "calibration": sum(wi * pi for wi, pi in zip(w, p))
                / sum(wi * yi for wi, yi in zip(w, y)),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
