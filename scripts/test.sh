#!/usr/bin/env bash
# The README's test command. Installs the real servers the tests start on loopback (what
# is already there is kept), then runs every test of the workspace:
#   - Debian packages: PostgreSQL (the brain's database), Slurm (the Slurm backend),
#     Chromium (the dashboard's page), stunnel4 (TLS in front of the Kafka broker),
#     Prometheus and promtool (scraping the jobs' nodes, checking their metrics),
#     iproute2 and nftables (test hosts in network namespaces, and faults between them);
#   - PyPI: moto (an S3-compatible server for checkpoints), scikit-learn (the reference of
#     the evaluation figures), tensorboard (the reader of the jobs' event files),
#     onnxruntime and safetensors (the readers of exported models), pandas (the Python
#     package's data frames);
#   - crates.io: Tansu (a Kafka-protocol broker), built once (~10-20 min on 2 cores) and
#     cached in ~/.cache/elastrec-tools.
# Every server that is installed is required (`ELASTREC_REQUIRE_*`): a test that needs it
# fails instead of skipping. A test that still cannot run (a package that could not be
# installed: no root, no network) says why, and the run ends with their count.
# Arguments go to `cargo test` (e.g. `bash scripts/test.sh -p elastrec-stream`).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "scripts/test.sh: $*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo "$@"
    else
        return 1
    fi
}

# Debian packages: name of the package, and the command that shows it is there.
need=()
want() { command -v "$2" >/dev/null 2>&1 || [ -x "$2" ] || need+=("$1"); }
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    need+=(postgresql)
fi
want slurm-wlm slurmctld
want chromium chromium
want stunnel4 stunnel4
want prometheus promtool
# The test hosts of the network tests: namespaces and veth pairs (iproute2), partitions
# (nftables).
want iproute2 ip
want nftables nft
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} (apt-get)"
    if ! { as_root apt-get update -qq &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }; then
        say "could not install ${need[*]}: the tests that need them will be skipped and counted"
    fi
fi

if ! command -v moto_server >/dev/null 2>&1; then
    say "installing moto[server] (pip)"
    python3 -m pip install -q 'moto[server]' || say "could not install moto: the S3 tests will fail"
fi
# scikit-learn: the reference the evaluation figures are checked against; tensorboard:
# the reader of the event files jobs write; onnxruntime and safetensors: the readers of
# the exported models; pandas: the Python package's data frames.
for pkg in sklearn:scikit-learn tensorboard:tensorboard onnxruntime:onnxruntime \
    safetensors:safetensors pandas:pandas; do
    if ! python3 -c "import ${pkg%%:*}" >/dev/null 2>&1; then
        say "installing ${pkg#*:} (pip)"
        python3 -m pip install -q "${pkg#*:}" ||
            say "could not install ${pkg#*:}: the tests that need it will be skipped and counted"
    fi
done

TOOLS="$HOME/.cache/elastrec-tools"
# Its memory engine for speed, its SQLite engine (libsql) for SCRAM users; the path must
# match elastrec_stream::tansu::INSTALL_DIR.
TANSU_ROOT="$TOOLS/tansu-0.6.0-sqlite"
export ELASTREC_TANSU="${ELASTREC_TANSU:-$TANSU_ROOT/bin/tansu}"
if [ ! -x "$ELASTREC_TANSU" ]; then
    say "building the Tansu Kafka broker once (cargo install, ~15-25 min; cached in $TOOLS)"
    if ! env -u CARGO_TARGET_DIR cargo install tansu --version 0.6.0 --locked \
        --features dynostore,libsql --root "$TANSU_ROOT" --target-dir "$TOOLS/tansu-build" --quiet; then
        say "could not build Tansu: the Kafka tests will be skipped and counted"
    fi
    rm -rf "$TOOLS/tansu-build"
fi

# What is installed must be used: its tests fail rather than skip.
command -v slurmctld >/dev/null 2>&1 && export ELASTREC_REQUIRE_SLURM=1
command -v chromium >/dev/null 2>&1 && export ELASTREC_REQUIRE_CHROMIUM=1
command -v stunnel4 >/dev/null 2>&1 && export ELASTREC_REQUIRE_STUNNEL=1
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 &&
    export ELASTREC_REQUIRE_PROMETHEUS=1
[ -x "$ELASTREC_TANSU" ] && export ELASTREC_REQUIRE_TANSU=1
python3 -c 'import sklearn' >/dev/null 2>&1 && export ELASTREC_REQUIRE_SKLEARN=1
python3 -c 'import tensorboard' >/dev/null 2>&1 && export ELASTREC_REQUIRE_TENSORBOARD=1
python3 -c 'import onnxruntime, safetensors, numpy' >/dev/null 2>&1 &&
    export ELASTREC_REQUIRE_ONNXRUNTIME=1
python3 -c 'import safetensors, numpy' >/dev/null 2>&1 && export ELASTREC_REQUIRE_SAFETENSORS=1
# The native module is built below only for a whole-workspace run.
[ $# -eq 0 ] && python3 -c 'import numpy' >/dev/null 2>&1 && export ELASTREC_REQUIRE_PYTHON_PACKAGE=1
# Control groups need root and a writable cgroup tree, network namespaces root and the
# two tools above; CI's machine gives them.
if [ "${CI:-}" = true ]; then
    export ELASTREC_REQUIRE_CGROUPS=1
    export ELASTREC_REQUIRE_NETNS=1
fi

skip_log="$(mktemp)"
trap 'rm -f "$skip_log"' EXIT
export ELASTREC_SKIP_LOG="$skip_log"
status=0
# The Python package's native module is a library no test binary links (`crates/python`):
# built here with the tests' features, so its test runs against this checkout and cargo
# compiles the workspace once.
if [ $# -eq 0 ]; then
    cargo build --workspace --lib --tests || status=$?
fi
[ "$status" -eq 0 ] && { cargo test --workspace "$@" || status=$?; }

skipped=$(wc -l <"$skip_log")
if [ "$skipped" -gt 0 ]; then
    say "tests that could not run on this machine:"
    sed 's/^/  skipped /' "$skip_log" >&2
fi
say "$skipped test(s) skipped for a missing server or host feature"
exit "$status"
