--
-- Grants: what a role without any grant (PUBLIC) may execute and read in
-- schema lease, and what the GRANTs of README's "Roles and grants" allow.
--
\set VERBOSITY default

CREATE ROLE regress_nobody;
CREATE ROLE regress_migrator;
CREATE ROLE regress_app;

-- the functions PUBLIC may execute: harmless ones only (the same allowlist as
-- tests/sessions/tests/errors.rs, a_role_without_grants_executes_only_harmless_functions)
SELECT p.oid::regprocedure AS executable_by_public
  FROM pg_proc p
 WHERE p.pronamespace = 'lease'::regnamespace
   AND has_function_privilege('regress_nobody', p.oid, 'EXECUTE')
   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
 ORDER BY 1::text;
-- the relations PUBLIC may read
SELECT c.oid::regclass AS readable_by_public
  FROM pg_class c
 WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'v', 'p')
   AND has_table_privilege('regress_nobody', c.oid, 'SELECT')
 ORDER BY 1::text;
-- and write: none
SELECT c.oid::regclass AS writable_by_public
  FROM pg_class c
 WHERE c.relnamespace = 'lease'::regnamespace AND c.relkind IN ('r', 'v', 'p', 'S')
   AND (has_table_privilege('regress_nobody', c.oid, 'INSERT')
        OR has_table_privilege('regress_nobody', c.oid, 'UPDATE')
        OR has_table_privilege('regress_nobody', c.oid, 'DELETE')
        OR has_table_privilege('regress_nobody', c.oid, 'TRUNCATE'))
 ORDER BY 1::text;

CREATE TABLE g_tables (id int PRIMARY KEY, owner_fencing_token bigint);
CREATE TABLE g_payouts (table_id int, amount int, fencing_token bigint);
INSERT INTO g_tables VALUES (1, 5);
SELECT lease.protect('g_payouts', '{table_id}', 'fencing_token', 'g_tables');

--
-- A role without grants
--
SET ROLE regress_nobody;
SELECT lease.acquire('g:1', 'host', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.try_acquire('g:1', 'host', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew('g:1', 'host', 1, 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.heartbeat('host', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew_all('host', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release('g:1', 'host', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release_all('host');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.protect('g_payouts', '{table_id}', 'fencing_token', 'g_tables');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.protect_high_water('g_payouts', '{table_id}', 'fencing_token');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.unprotect('g_payouts');
\echo :LAST_ERROR_SQLSTATE
SELECT lease._set_owner_token('g_tables'::regclass, '{1}', 99);
\echo :LAST_ERROR_SQLSTATE
SELECT lease._lock_owner_row('g_tables'::regclass, '{1}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease._raise('StaleOwnerBoundaryWrite', 'forged', 'forged');
\echo :LAST_ERROR_SQLSTATE
SELECT lease._register('g_payouts'::regclass, 'high_water', '{table_id}', 'fencing_token', NULL, NULL, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease._unregister('g_payouts'::regclass);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.audit_status();
\echo :LAST_ERROR_SQLSTATE
SELECT lease.stats_reset();
\echo :LAST_ERROR_SQLSTATE
SELECT lease.purge_rejected_writes(interval '0');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.rejected_writes;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.stats;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.leases;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.sessions;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.high_water;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM lease.protected;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO lease.high_water (target, resource, token) VALUES ('g_payouts', '{1}', 1);
\echo :LAST_ERROR_SQLSTATE
-- the protection config is public
SELECT relid, mode, key_columns FROM lease.protected WHERE relid = 'g_payouts'::regclass;
-- harmless functions run; writing still needs the table's privileges
SELECT lease.bind_token(5);
SELECT lease.bound_token();
SELECT lease.fenced_boundary_write('g_payouts', 5, '[{"table_id": 1}]');
\echo :LAST_ERROR_SQLSTATE
-- the pg_lease settings reserved for superusers
SET pg_lease.min_ttl_ms = 10;
\echo :LAST_ERROR_SQLSTATE
SET pg_lease.audit_statement = on;
\echo :LAST_ERROR_SQLSTATE
SET pg_lease.log_rejections = off;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

--
-- The game server's grants: the lease functions and its tables
--
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
    lease.try_acquire(text, text, integer, regclass, text[]), lease.renew(text, text, bigint, integer),
    lease.heartbeat(text, integer), lease.renew_all(text, integer), lease.release(text, text, bigint),
    lease.release_all(text) TO regress_app;
GRANT SELECT, INSERT ON g_payouts TO regress_app;
GRANT SELECT ON g_tables TO regress_app;
SET ROLE regress_app;
-- acquire writes the owner row although the role may not update it
SELECT token AS t FROM lease.acquire('g:1', 'app-host', 60000, 'g_tables', '{1}') \gset
SELECT owner_fencing_token = :t AS owner_row_has_token FROM g_tables WHERE id = 1;
SELECT lease.fenced_boundary_write('g_payouts', :t, '[{"table_id": 1, "amount": 5}]');
UPDATE g_tables SET owner_fencing_token = owner_fencing_token + 1;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM lease.leases;
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release_all('app-host') AS released;
RESET ROLE;

--
-- Owner tokens above 2^62 - 1 are for superusers only, so acquire can always go higher
--
GRANT UPDATE ON g_tables TO regress_app;
SET ROLE regress_app;
UPDATE g_tables SET owner_fencing_token = 4611686018427387904 WHERE id = 1;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

--
-- The migrator: protect and unprotect with EXECUTE granted, on its own tables only
--
GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
    lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass) TO regress_migrator;
GRANT CREATE ON SCHEMA public TO regress_migrator;
SET ROLE regress_migrator;
SELECT lease.unprotect('g_payouts');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE g_ledger (k int, token bigint);
SELECT lease.protect_high_water('g_ledger', '{k}', 'token');
CREATE TABLE g_hands (table_id int, token bigint);
SELECT lease.protect('g_hands', '{table_id}', 'token', 'g_tables');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO g_ledger VALUES (1, 3);
SELECT lease.unprotect('g_ledger');
DROP TABLE g_ledger, g_hands;
RESET ROLE;

REVOKE CREATE ON SCHEMA public FROM regress_migrator;
DROP TABLE g_payouts, g_tables;
DROP OWNED BY regress_nobody, regress_migrator, regress_app;
DROP ROLE regress_nobody, regress_migrator, regress_app;
