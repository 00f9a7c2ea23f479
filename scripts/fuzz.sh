#!/usr/bin/env bash
# `make fuzz`: the model-based tests (tests/sessions/tests/model.rs, the fence;
# tests/sessions/tests/lease_model.rs, leases and heartbeat sessions) with many
# cases, against a scratch cluster of its own with pg_lease preloaded.
#   PG_LEASE_MODEL_CASES (default here 2000), PG_LEASE_MODEL_STEPS, PG_LEASE_MODEL_SEED,
#   PG_LEASE_MODEL_SHRINK_SECS: see the top of tests/sessions/tests/model.rs;
#   PG_LEASE_LEASE_MODEL_CASES (default here 300): see lease_model.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PG_LEASE_FUZZ_PORT:-54403}
scripts/cluster.sh start fuzz "$PORT"
trap 'scripts/cluster.sh stop fuzz' EXIT
PG_LEASE_TEST_PORT=$PORT PG_LEASE_MODEL_CASES=${PG_LEASE_MODEL_CASES:-2000} \
    PG_LEASE_LEASE_MODEL_CASES=${PG_LEASE_LEASE_MODEL_CASES:-300} \
    cargo test --release --manifest-path tests/sessions/Cargo.toml --test model --test lease_model -- --nocapture
