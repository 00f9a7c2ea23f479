#!/usr/bin/env bash
# `make demo`: builds and installs pg_lease, starts a scratch cluster and replays
# the deploy-overlap incident: two processes own one poker table, the stale one
# tries to pay out, Postgres refuses with LF001 and no chips are created.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] \
    || { echo "demo: run as root (it installs packages and pg_lease into PostgreSQL, and runs a cluster as the postgres user)" >&2; exit 1; }
PORT=${PG_LEASE_DEMO_PORT:-54402}

scripts/setup.sh
# PG=18 runs the demo on PostgreSQL 18 (scripts/pg.sh).
PG_CONFIG=$(scripts/pg.sh pg_config)
export PG_CONFIG
read -ra features <<< "$(scripts/pg.sh features)"
echo "Building and installing pg_lease..."
cargo pgrx install --release --pg-config "$PG_CONFIG" "${features[@]}" >/dev/null 2>&1 \
    || cargo pgrx install --release --pg-config "$PG_CONFIG" "${features[@]}"
scripts/cluster.sh start demo "$PORT"
trap 'scripts/cluster.sh stop demo' EXIT

# One psql per "process", so each step is a separate client connection.
as() { local who=$1; shift; PGAPPNAME=$who "$("$PG_CONFIG" --bindir)/psql" -X -q -v ON_ERROR_STOP=0 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres "$@"; }
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

say "== Setup: the game database with pg_lease"
as setup <<'SQL'
\set ECHO queries
CREATE EXTENSION pg_lease;
CREATE TABLE tables   (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL);
CREATE TABLE balances (player text PRIMARY KEY, chips bigint NOT NULL);
CREATE TABLE payouts  (id bigserial PRIMARY KEY, table_id int NOT NULL, hand int NOT NULL,
                       player text NOT NULL, amount bigint NOT NULL, fencing_token bigint NOT NULL);
SELECT lease.protect('payouts', key_columns => '{table_id}', token_column => 'fencing_token');
INSERT INTO balances VALUES ('ann', 1000), ('bob', 1000);
INSERT INTO tables VALUES (7, 41);   -- process A owns table 7 with fencing token 41
SQL

say "== Process A (token 41) settles hand 1: ann wins 500"
as process-A <<'SQL'
\set ECHO queries
BEGIN;
SELECT lease.fenced_boundary_write('payouts', 41, '[{"table_id": 7, "hand": 1, "player": "ann", "amount": 500}]');
UPDATE balances SET chips = chips + 500 WHERE player = 'ann';
UPDATE balances SET chips = chips - 500 WHERE player = 'bob';
COMMIT;
SQL

say "== Deploy overlap: process B revives table 7 and takes it over (token 42)"
as process-B <<'SQL'
\set ECHO queries
UPDATE tables SET owner_fencing_token = 42 WHERE id = 7;
BEGIN;
SELECT lease.fenced_boundary_write('payouts', 42, '[{"table_id": 7, "hand": 2, "player": "bob", "amount": 300}]');
UPDATE balances SET chips = chips + 300 WHERE player = 'bob';
UPDATE balances SET chips = chips - 300 WHERE player = 'ann';
COMMIT;
SQL

say "== Process A wakes up and settles hand 2 as well, still holding token 41"
as process-A <<'SQL'
\set ECHO queries
BEGIN;
UPDATE balances SET chips = chips + 300 WHERE player = 'ann';
SELECT lease.fenced_boundary_write('payouts', 41, '[{"table_id": 7, "hand": 2, "player": "ann", "amount": 300}]');
\echo SQLSTATE seen by process A: :LAST_ERROR_SQLSTATE  -> freeze the table, never retry
ROLLBACK;
\echo
\echo A client that forgets pg_lease entirely fares no better:
INSERT INTO payouts (table_id, hand, player, amount, fencing_token) VALUES (7, 2, 'ann', 300, 41);
\echo SQLSTATE: :LAST_ERROR_SQLSTATE
SQL

say "== Result: one payout per hand, and no chips were created"
as audit <<'SQL'
SELECT table_id, hand, player, amount, fencing_token FROM payouts ORDER BY id;
SELECT player, chips FROM balances ORDER BY player;
SELECT sum(chips) AS total_chips, CASE WHEN sum(chips) = 2000 THEN 'conserved' ELSE 'DUPLICATED' END AS verdict FROM balances;
SELECT table_name, mode, key_columns, token_column, owner_table, enforced FROM lease.protected_tables;
SQL
