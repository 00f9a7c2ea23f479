#!/bin/sh
# Runs once, when the official image initialises a new data directory.
set -e
db="${POSTGRES_DB:-$POSTGRES_USER}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$db" -c "CREATE EXTENSION IF NOT EXISTS pg_lease"
# The audit worker records refusals in this database (takes effect at the
# restart the entrypoint performs after these scripts).
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$db" -c "ALTER SYSTEM SET pg_lease.database = '$db'"
