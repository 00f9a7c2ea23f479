-- pg_lease 0.1.0 -> 0.2.0
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.2.0'" to load this file. \quit

-- The token bound to the current transaction, or NULL.
CREATE FUNCTION lease.bound_token() RETURNS bigint
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
    RETURN nullif(current_setting('pg_lease.token', true), '')::bigint;
COMMENT ON FUNCTION lease.bound_token() IS 'The fencing token bound to this transaction by lease.bind_token, or NULL.';
