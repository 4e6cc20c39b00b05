#!/usr/bin/env bash
# What the distributed path costs over `train` (issue 49, item 3): the quickstart model on
# its first two days (400,000 rows, batch 2,048, one epoch, no evaluation, no checkpoints),
# trained by `train` in one process and by `run` with 1 PS + 1 worker, then 1 PS + 2
# workers, then 1 PS + 1 worker with `cluster.staleness = 1` (pipelined pulls), each timed
# whole-process (every process of the job: `/usr/bin/time` of the
# command, whose children are waited for). Prints samples/s, CPU-seconds per million
# samples, and the cores kept busy, per mode, as a Markdown table.
#
#   bash scripts/bench-distributed.sh [BINARY] [OUT_DIR]
#
# BINARY defaults to target/release/elastrec (build it with
# `cargo build --release -p elastrec-cli`); OUT_DIR (default /tmp/elastrec-bench-distributed)
# holds the jobs' files and logs. Run it on a quiet machine: the numbers are the CPU's.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(realpath "${1:-target/release/elastrec}")"
out="$(realpath -m "${2:-/tmp/elastrec-bench-distributed}")"
[ -x "$bin" ] || { echo "no binary at $bin: cargo build --release -p elastrec-cli" >&2; exit 2; }
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (Debian: apt-get install time)" >&2; exit 2; }
mkdir -p "$out"
data="$(realpath -m data/quickstart)"
if [ ! -f "$data/day_1.tsv" ]; then
    echo "generating the quickstart data in $data" >&2
    "$bin" gen-data --out "$data" --rows 1400000 --days 7 --seed 42 --scale 0.01 >&2
fi

job() { # name, extra TOML
    cat >"$out/$1.toml" <<EOF
[data]
dir = "$data"
train = ["day_0.tsv", "day_1.tsv"]
eval = []
[train]
epochs = 1
batch_size = 2048
progress = false
[checkpoint]
enabled = false
[output]
dir = "$out/$1"
save_model = false
$2
EOF
}

# mode, command...: prints "mode samples wall_s user_s sys_s"
measure() {
    local mode=$1
    shift
    rm -rf "${out:?}/$mode"
    /usr/bin/time -f '%e %U %S' -o "$out/$mode.time" "$@" >"$out/$mode.log" 2>&1 || {
        echo "$mode failed: see $out/$mode.log" >&2
        exit 1
    }
    read -r wall user sys <"$out/$mode.time"
    echo "$mode 400000 $wall $user $sys"
}

job train ""
job run-1w "[cluster]
ps = 1
workers = 1
mode = \"async\""
job run-2w "[cluster]
ps = 1
workers = 2
mode = \"async\""
# Staleness 1: each batch's pull starts before the previous batch's compute and push.
job run-1w-s1 "[cluster]
ps = 1
workers = 1
mode = \"async\"
staleness = 1"

results=$(
    measure train "$bin" train "$out/train.toml"
    measure run-1w "$bin" run "$out/run-1w.toml"
    measure run-2w "$bin" run "$out/run-2w.toml"
    measure run-1w-s1 "$bin" run "$out/run-1w-s1.toml"
)
echo "| mode | samples/s | CPU-s per million samples | cores busy | vs train, samples/s | vs train, CPU per sample |"
echo "|---|---:|---:|---:|---:|---:|"
echo "$results" | awk '
    { sps = $2 / $3; cpu = ($4 + $5) / $2 * 1e6; busy = ($4 + $5) / $3 }
    NR == 1 { base_sps = sps; base_cpu = cpu }
    { printf "| %s | %.0f | %.1f | %.2f | %.2fx | %.2fx |\n", $1, sps, cpu, busy, sps / base_sps, cpu / base_cpu }'
