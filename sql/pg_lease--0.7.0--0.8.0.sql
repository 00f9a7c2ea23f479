-- pg_lease 0.7.0 -> 0.8.0: Citus (issue #16).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.8.0'" to load this file. \quit
