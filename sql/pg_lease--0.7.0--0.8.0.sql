-- pg_lease 0.7.0 -> 0.8.0: Citus (issue #16).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.8.0'" to load this file. \quit

-- ---- Lease calls in Rust, continued (#13 deliverable 3; helper "acq") ----
-- lease.acquire and lease.try_acquire are C functions (src/lease_calls.rs):
-- the same statements as saved plans, run as the function's owner as
-- SECURITY DEFINER ran them; try_acquire's subtransaction is the C code's.
-- CREATE OR REPLACE keeps their owner, grants and comments.
CREATE OR REPLACE FUNCTION lease.acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                                         owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_acquire';
CREATE OR REPLACE FUNCTION lease.try_acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                                             owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_try_acquire';
-- The heartbeat too: lease._beat (its step, as the caller), lease.heartbeat
-- and lease.renew_all (as the function's owner) over one Rust step.
CREATE OR REPLACE FUNCTION lease._beat(owner_id text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, taken boolean)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_beat';
CREATE OR REPLACE FUNCTION lease.heartbeat(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, lost text)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_heartbeat';
CREATE OR REPLACE FUNCTION lease.renew_all(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_renew_all';
-- ---- end of the acquire port ----
