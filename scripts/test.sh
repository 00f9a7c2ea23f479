#!/usr/bin/env bash
# `make test`: lint, in-process pgrx tests, then multi-session tests over real
# connections against a scratch cluster with pg_lease preloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=$(mktemp)
# Every test runner's output also goes to $LOG, summed up in the last line.
exec > >(tee "$LOG") 2>&1
summary() {
    local rc=${1:-$?}
    awk '/^test result:/ { p += $4; f += $6 } END { printf "total: %d passed, %d failed\n", p, f + 0 }' "$LOG"
    [ $rc -eq 0 ] || echo "make test FAILED (exit $rc)"
    rm -f "$LOG"
}
trap summary EXIT
SCRATCH=${PG_LEASE_SCRATCH:-/var/tmp/pg_lease}
PORT=${PG_LEASE_TEST_PORT:-54401}

scripts/setup.sh

echo "== lint"
cargo fmt --check
cargo clippy --quiet --all-targets --features pg_test -- -D warnings

echo "== pgrx tests (in-process)"
mkdir -p "$SCRATCH"; chown postgres: "$SCRATCH"
# The pgrx test cluster is rebuilt from scratch each run.
rm -rf "$SCRATCH/pgrx-data"
cargo pgrx test pg15 --runas postgres --pgdata "$SCRATCH/pgrx-data"

echo "== install"
cargo pgrx install --pg-config "$(command -v pg_config)" >/dev/null

echo "== multi-session tests (real connections, port $PORT)"
scripts/cluster.sh start sessions "$PORT" "pg_lease.database = 'pg_lease_audit'"
trap 'rc=$?; scripts/cluster.sh stop sessions; summary $rc' EXIT
scripts/cluster.sh psql sessions "$PORT" -X -q -c "CREATE DATABASE pg_lease_audit"
scripts/cluster.sh psql sessions "$PORT" -X -q -d pg_lease_audit -c "CREATE EXTENSION pg_lease"
PG_LEASE_TEST_PORT=$PORT cargo test --manifest-path tests/sessions/Cargo.toml -- --test-threads=4
