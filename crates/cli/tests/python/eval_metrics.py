"""Reference figures of `elastrec eval --predictions` output, computed by scikit-learn.

Usage: python3 eval_metrics.py PREDICTIONS.csv
Prints JSON: auc, logloss, ne, calibration over the rows, each weighted by the file's
`weight` column.
"""

import csv
import json
import math
import sys

from sklearn.metrics import log_loss, roc_auc_score


def main(path):
    y, w, p = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            y.append(float(row["label"]))
            w.append(float(row["weight"]))
            p.append(float(row["prediction"]))
    logloss = log_loss(y, p, sample_weight=w, labels=[0.0, 1.0])
    rate = sum(wi * yi for wi, yi in zip(w, y)) / sum(w)
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    print(
        json.dumps(
            {
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
