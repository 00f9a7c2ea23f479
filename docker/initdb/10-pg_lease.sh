#!/bin/sh
# Runs once, when the official image initialises a new data directory.
# POSIX sh (the image's /bin/sh is dash, without pipefail; there is no pipe here).
set -eu
db="${POSTGRES_DB:-$POSTGRES_USER}"
# Refusals are recorded in the database where they happen: this one's
# lease.rejected_writes (no pg_lease.database needed).
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$db" -c "CREATE EXTENSION IF NOT EXISTS pg_lease"
