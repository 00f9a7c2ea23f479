#!/usr/bin/env bash
# Installs everything pg_lease's build, tests and demo need on a fresh Debian 12
# machine (run as root). Idempotent and quick when all is present.
set -euo pipefail
PGRX_VERSION=0.18.0

# `setup.sh bench` also installs what `make bench` compares against.
packages=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo faketime pgbouncer)
command -v npm >/dev/null || packages+=(nodejs npm)
[ "${1:-}" = bench ] && packages+=(redis-server redis-tools)
missing=()
for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION"; then
    echo "setup: installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

PG_CONFIG=$(command -v pg_config)
if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init --pg15 "$PG_CONFIG" >/dev/null
fi
