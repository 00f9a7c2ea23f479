-- pg_lease 0.5.0 -> 0.6.0: hot paths (issue #13).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.6.0'" to load this file. \quit
