#!/usr/bin/env bash
# Installs everything pg_lease's build, tests and demo need on a fresh Debian 12
# machine (run as root). Idempotent and quick when all is present.
# With PG=18 it also builds PostgreSQL 18 from Debian's source package (once,
# scripts/build-postgres.sh) and registers it with cargo-pgrx beside 15.
set -euo pipefail
cd "$(dirname "$0")/.."
PGRX_VERSION=0.18.0
major=$(scripts/pg.sh major)

# `setup.sh bench` also installs what `make bench` compares against.
packages=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo faketime pgbouncer shellcheck python3)
command -v npm >/dev/null || packages+=(nodejs npm)
[ "${1:-}" = bench ] && packages+=(redis-server redis-tools)
if ! command -v dpkg >/dev/null || ! command -v apt-get >/dev/null; then
    echo "setup: needs Debian 12 (dpkg, apt-get) to install ${packages[*]}; elsewhere install their equivalents, cargo and cargo-pgrx $PGRX_VERSION yourself" >&2
    exit 1
fi
missing=()
for pkg in "${packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing Debian packages ${missing[*]}: run this as root, or apt-get install them as root" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || { echo "setup: apt-get could not install ${missing[*]} (the names are Debian 12 bookworm's; this is $(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null))" >&2; exit 1; }
fi
command -v cargo >/dev/null \
    || { echo "setup: cargo is missing: install a Rust toolchain (rustup, https://rustup.rs), then run this again" >&2; exit 1; }

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION"; then
    echo "setup: installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# cargo-pgrx knows 15 always, and 18 once it has been asked for. A registered
# pg_config that is gone (a removed build) would break every build, 15's too.
config_toml=${PGRX_HOME:-$HOME/.pgrx}/config.toml
if [ -f "$config_toml" ]; then
    while read -r label path; do
        if [ ! -x "$path" ]; then
            echo "setup: $path is gone; unregistering $label from cargo-pgrx"
            sed -i "/^$label = /d" "$config_toml"
        fi
    done < <(sed -n 's/^\(pg[0-9]*\) = "\(.*\)"$/\1 \2/p' "$config_toml")
fi
declare -A pg_configs=([15]="$(PG=15 scripts/pg.sh pg_config)")
[ "$major" = 15 ] || pg_configs[$major]=$(scripts/build-postgres.sh "$major")
init=()
for m in "${!pg_configs[@]}"; do
    if [ ! -x "${pg_configs[$m]}" ]; then
        echo "setup: ${pg_configs[$m]} (pg_config of PostgreSQL $m) does not exist" >&2
        exit 1
    fi
    grep -qs "^pg$m = \"${pg_configs[$m]}\"" "$config_toml" || init+=("--pg$m" "${pg_configs[$m]}")
done
if [ ${#init[@]} -gt 0 ]; then
    cargo pgrx init "${init[@]}" >/dev/null
fi
