#!/usr/bin/env bash
# Interleaved elastrec vs PyTorch comparison on the same threads, so both sides see the
# same (shared, noisy) machine load. Usage: bench/compare.sh [rounds] [threads] [max_rows]
# Needs .venv with torch (see bench/README.md). Prints one JSON line per measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
threads=${2:-2}
max_rows=${3:-0}
export RAYON_NUM_THREADS=$threads
cargo build --release -q -p elastrec-model --example full_step --example dense_report
for _ in $(seq "$rounds"); do
  target/release/examples/full_step "$max_rows" 20
  .venv/bin/python bench/pytorch_dlrm.py --mode full --threads "$threads" --max-rows "$max_rows" --steps 20
  target/release/examples/dense_report 2048 6
  .venv/bin/python bench/pytorch_dlrm.py --mode dense --threads "$threads" --steps 20
done
