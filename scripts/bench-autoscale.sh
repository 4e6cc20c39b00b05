#!/usr/bin/env bash
# Autoscaling benchmark: the same job static under-provisioned (1 worker), static
# over-provisioned (OVER workers, default 16), autoscaled from 1 worker with an empty brain database
# (cold), and autoscaled again with the brain's history of the cold run (warm start).
# Prints job completion time, node-seconds and CPU seconds of each, and the fitted
# model's held-out MAPE on the job's own profile.
#
# The workload makes workers the bottleneck, as a job reading remote features would be:
# every batch of every worker waits BATCH_MS milliseconds (the `ELASTREC_FAIL_SLOW_WORKER`
# hook). Without it, on a 2-core machine every extra worker only competes for the same
# cores, and the brain rightly keeps one.
#
# usage: scripts/bench-autoscale.sh [OUT_DIR]   (env: ELASTREC_BIN, BATCH_MS, ROWS, EPOCHS, OVER)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/bench-autoscale}"
bin="${ELASTREC_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release -p elastrec-cli
    bin="${CARGO_TARGET_DIR:-target}/release/elastrec"
fi
batch_ms="${BATCH_MS:-20}"
over="${OVER:-16}"
rows="${ROWS:-180000}"
epochs="${EPOCHS:-2}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ ! -f "$out/data/day_2.tsv" ]; then
    "$bin" gen-data --out "$out/data" --rows "$rows" --days 3 --scale 0.001 --seed 5 >/dev/null
fi

job() { # name, [cluster]/[autoscale] text
    cat > "$out/$1.toml" <<TOML
[data]
dir = "data"
train = ["day_0.tsv", "day_1.tsv"]
eval = ["day_2.tsv"]
[model]
bottom_mlp = [32, 16]
top_mlp = [32, 1]
max_table_rows = 4000
[train]
batch_size = 256
epochs = $epochs
progress = false
[output]
dir = "$1"
[checkpoint]
enabled = false
$2
TOML
}
auto="[autoscale]
enabled = true
workers = [1, $over]
interval_s = 1.0
sample_s = 0.5
cluster_cpu = 16
brain_db = \"sqlite://$out/brain.db?mode=rwc\""
job static-1 "[cluster]
ps = 1
workers = 1
warmup_steps = 20"
job static-over "[cluster]
ps = 1
workers = $over
warmup_steps = 20"
job auto-cold "[cluster]
ps = 1
workers = 1
warmup_steps = 20
$auto"
job auto-warm "[cluster]
ps = 1
workers = 1
warmup_steps = 20
$auto
warm_start = true"

rm -rf "$out"/static-1 "$out"/static-over "$out"/auto-cold "$out"/auto-warm "$out/brain.db"
for name in static-1 static-over auto-cold auto-warm; do
    echo "running $name (load before: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    ELASTREC_FAIL_SLOW_WORKER="*:$batch_ms" "$bin" run "$out/$name.toml" > "$out/$name.log" 2>&1
done

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = []
for name in ["static-1", "static-over", "auto-cold", "auto-warm"]:
    r = json.load(open(f"{out}/{name}/result.json"))
    a = r.get("autoscale") or {}
    res = r["resources"]
    steps = [s["after"][0] for s in a.get("scaling", [])]
    plan = a.get("last_plan") or {}
    rows.append((name, r["wall_s"], res["worker_node_s"] + res["ps_node_s"], res["cpu_s"],
                 " -> ".join(map(str, steps)) or "-", plan.get("fit_mape_percent"),
                 r["eval"]["auc"], r["ledger"]["consumed"]))
best = min(r[1] for r in rows if r[0].startswith("static"))
print(f"| run | JCT s | vs best static | node-s | CPU s | workers | fit MAPE % | AUC | samples |")
print(f"|---|---|---|---|---|---|---|---|---|")
for n, jct, nodes, cpu, steps, mape, auc, samples in rows:
    m = "-" if mape is None else f"{mape:.1f}"
    print(f"| {n} | {jct:.1f} | {jct / best:.2f}x | {nodes:.1f} | {cpu:.1f} | {steps} | {m} | {auc:.4f} | {samples} |")
PY
