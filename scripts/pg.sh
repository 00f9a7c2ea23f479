#!/usr/bin/env bash
# The PostgreSQL major a build, test or package targets: PG=15 (the default,
# Debian 12's own) or PG=18 (built from source by scripts/setup.sh).
#   scripts/pg.sh pg_config   path of that major's pg_config
#   scripts/pg.sh features    cargo's feature flags for it (empty for the default, 15)
#   scripts/pg.sh major       the major itself
# PG_LEASE_PG15_CONFIG overrides 15's pg_config (default: Debian's);
# PG_LEASE_PG18_DIR is where 18 is built (default /opt/pg_lease/pg18).
set -euo pipefail
major=${PG:-15}
case "$major" in
15)
    pg_config=${PG_LEASE_PG15_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
    features=""
    ;;
18)
    pg_config=${PG_LEASE_PG18_DIR:-/opt/pg_lease/pg18}/bin/pg_config
    features="--no-default-features --features pg18"
    ;;
*)
    echo "PG=$major: pg_lease is built and tested on PostgreSQL 15 and 18 only (README, Install)" >&2
    exit 2
    ;;
esac
case "${1:-}" in
pg_config) echo "$pg_config" ;;
features) echo "$features" ;;
major) echo "$major" ;;
*) echo "usage: [PG=15|18] $0 pg_config|features|major" >&2; exit 2 ;;
esac
