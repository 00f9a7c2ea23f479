-- pg_lease 0.6.0 -> 0.7.0: logical replication and blue/green upgrades
-- (issue #17).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.7.0'" to load this file. \quit
