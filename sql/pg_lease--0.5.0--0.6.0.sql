-- pg_lease 0.5.0 -> 0.6.0: hot paths (issue #13).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.6.0'" to load this file. \quit

-- lease.fenced_boundary_write in C (src/fence/boundary_write.rs): saved
-- insert plans per table and column set, values converted with each column's
-- input function; same checks, messages, SQLSTATEs and privileges (runs as
-- its caller). Its PL/pgSQL helper is gone.
CREATE OR REPLACE FUNCTION lease.fenced_boundary_write(target regclass, token bigint, rows jsonb) RETURNS bigint
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_fenced_boundary_write';
DROP FUNCTION lease._boundary_problem(regclass, jsonb, text, text);
