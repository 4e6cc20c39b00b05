#!/usr/bin/env bash
# Runs the whole test suite RUNS times in a row (default 5) on a fresh clone of this
# repository's HEAD while a release build in another target directory keeps every core
# busy: the suite must pass on a loaded machine, not only on a quiet one.
# Usage: scripts/stress-tests.sh [RUNS]
set -uo pipefail
runs=${1:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/elastrec-target}"
git clone -q "$repo" "$work/clone" && cd "$work/clone" || exit 1
echo "stress: $(git log --oneline -1), $runs runs"
cargo test --workspace --no-run >"$work/build.log" 2>&1 || { echo "build failed: $work/build.log"; exit 1; }
( while [ ! -f "$work/done" ]; do
    rm -rf "$work/load"
    CARGO_TARGET_DIR="$work/load" cargo build --release -p elastrec-data -p elastrec-model >/dev/null 2>&1
  done ) &
load=$!
failed=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  cargo test --workspace >"$work/run-$i.log" 2>&1; rc=$?
  counts=$(grep -E "^test result" "$work/run-$i.log" | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}')
  echo "run $i: exit $rc, $counts, $(( $(date +%s) - start )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$rc" -eq 0 ] || failed=1
done
touch "$work/done"; kill "$load" 2>/dev/null; wait
echo "logs in $work"
exit "$failed"
