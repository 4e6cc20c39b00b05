#!/usr/bin/env bash
# Issue 52's "no false death" check: clean synchronous runs (2 PS, 3 workers, heartbeats
# every 500 ms, dead after 3 s, 4M generated rows, one epoch) with one `yes` CPU hog per
# core. Prints, per run, the nodes declared dead and suspected, the probes that saved a
# node, the PS that fenced themselves (their lease ran out), speed and ledger.
#   BIN=target/release/elastrec RUNS=10 DIR=/tmp/no-false-death bash scripts/bench-no-false-death.sh
set -euo pipefail
BIN=${BIN:-target/release/elastrec}
RUNS=${RUNS:-10}
DIR=${DIR:-/tmp/no-false-death}
BIN=$(realpath "$BIN")
mkdir -p "$DIR"
cd "$DIR"
cat > job.toml <<TOML
[data]
dir = "$DIR/data"
train = ["day_0.tsv", "day_1.tsv", "day_2.tsv", "day_3.tsv"]
eval = ["day_4.tsv"]
[data.generate]
rows = 5000000
days = 5
seed = 42
[model]
bottom_mlp = [64, 16]
top_mlp = [64, 1]
max_table_rows = 20000
[train]
epochs = 1
batch_size = 512
progress = false
[output]
dir = "$DIR/run"
[cluster]
ps = 2
workers = 3
mode = "sync"
heartbeat_ms = 500
dead_after_ms = 3000
TOML
[ -f data/day_4.tsv ] || "$BIN" gen-data --out data --rows 5000000 --days 5 --seed 42 >/dev/null
count() { grep -c "$1" "$2" || true; }
for i in $(seq 1 "$RUNS"); do
    hogs=()
    for _ in $(seq 1 "$(nproc)"); do
        yes >/dev/null &
        hogs+=($!)
    done
    rm -rf run
    start=$(date +%s)
    rc=0
    "$BIN" run job.toml >"run-$i.log" 2>&1 || rc=$?
    kill "${hogs[@]}"
    wait "${hogs[@]}" 2>/dev/null || true
    fenced=$(cat run/logs/ps-*.log | count 'fenced: the master' -)
    echo "run $i: exit $rc, $(($(date +%s) - start)) s," \
        "dead $(count '"kind":"node_dead"' run/events.jsonl)," \
        "suspected $(count '"kind":"node_suspected"' run/events.jsonl)," \
        "probe saves $(count '"kind":"probe_answered"' run/events.jsonl)," \
        "PS fenced $fenced," \
        "$(python3 -c "import json; r = json.load(open('run/result.json')); print(round(r['samples_per_s']), 'samples/s,', r['status'] + ',', r['ledger']['consumed'], 'consumed')")"
done
