--
-- The audit of refused writes: lease.audit_status(), lease.audit_databases(),
-- lease.stats, lease.rejected_writes, lease.stats_reset(),
-- lease.purge_rejected_writes().
--
-- Counters in shared memory are updated by the writer itself (synchronous);
-- lease.rejected_writes is written by a background writer within
-- pg_lease.audit_flush_ms, so the test waits for it with a bounded poll that
-- prints only whether the records arrived.
\set VERBOSITY default

CREATE FUNCTION pg_temp.wait_for(condition text, seconds int DEFAULT 60) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    ok boolean;
BEGIN
    FOR i IN 1 .. seconds * 20 LOOP
        EXECUTE condition INTO ok;
        IF ok THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;

-- preloaded (test/regress/pg_lease.conf); this database's refusals go to its
-- own lease.rejected_writes
SELECT preloaded, audit, audit_database = current_database() AS own_database,
       worker_pid IS NOT NULL AS launcher_running, queue_size
  FROM lease.audit_status();
-- earlier tests' refusals are recorded first, then the counters start over
SELECT pg_temp.wait_for($$SELECT queued = 0 FROM lease.audit_status()$$) AS queue_drained;
SELECT lease.stats_reset();
SELECT queued, refused, recorded, dropped FROM lease.audit_status();

CREATE TABLE aud_tables (id int PRIMARY KEY, owner_fencing_token bigint);
CREATE TABLE aud_payouts (table_id int, player text, amount int, fencing_token bigint);
INSERT INTO aud_tables VALUES (1, 5), (2, 9);
SELECT lease.protect('aud_payouts', '{table_id}', 'fencing_token', 'aud_tables');

-- accepted rows are counted per table
INSERT INTO aud_payouts VALUES (1, 'ann', 10, 5), (1, 'bob', 20, 5), (2, 'cy', 30, 9);
-- refusals: each is counted and recorded, although the writer rolls back
INSERT INTO aud_payouts VALUES (1, 'ann', 10, 4);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO aud_payouts VALUES (2, 'cy', 10, 10);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO aud_payouts VALUES (1, 'ann', 10, NULL);
\echo :LAST_ERROR_SQLSTATE
BEGIN;
DELETE FROM aud_payouts WHERE player = 'bob';
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT lease.fenced_boundary_write('aud_payouts', 5, '[{"table_id": 3, "player": "dee"}]');
\echo :LAST_ERROR_SQLSTATE

-- lease.stats: synchronous counters
SELECT database = current_database() AS this_database, table_name, accepted, refused,
       last_refusal_at IS NOT NULL AS has_last_refusal
  FROM lease.stats WHERE table_name LIKE 'public.aud_%';
SELECT refused FROM lease.audit_status();

-- lease.rejected_writes: written by the background writer
SELECT pg_temp.wait_for($$SELECT count(*) = 5 FROM lease.rejected_writes WHERE target_table = 'public.aud_payouts'$$) AS recorded;
SELECT target_table, operation, resource_key, presented_token, current_token, sqlstate, error_name
  FROM lease.rejected_writes WHERE target_table = 'public.aud_payouts' ORDER BY id;
SELECT count(*) AS rows,
       bool_and(database = current_database()) AS database,
       bool_and(role = current_user) AS role,
       bool_and(application_name = current_setting('application_name')) AS application_name,
       bool_and(backend_pid = pg_backend_pid()) AS backend_pid,
       bool_and(target_relid = 'aud_payouts'::regclass::oid) AS target_relid,
       bool_and(rejected_at <= recorded_at AND rejected_at > now() - interval '10 minutes') AS times,
       bool_and(statement IS NULL AND row_data IS NULL) AS no_statement_or_row_by_default
  FROM lease.rejected_writes WHERE target_table = 'public.aud_payouts';
SELECT pg_temp.wait_for($$SELECT queued = 0 AND recorded = 5 FROM lease.audit_status()$$) AS all_recorded;
SELECT queued, refused, recorded, dropped, last_flush_at IS NOT NULL AS flushed
  FROM lease.audit_status();
SELECT database = current_database() AS this_database, central, state, queued, refused, recorded, dropped, last_error
  FROM lease.audit_databases() WHERE database = current_database();

-- the statement and the refused row, when a superuser asks for them
SET pg_lease.audit_statement = on;
SET pg_lease.audit_row = on;
INSERT INTO aud_payouts VALUES (2, 'eve', 70, 8);
\echo :LAST_ERROR_SQLSTATE
RESET pg_lease.audit_statement;
RESET pg_lease.audit_row;
SELECT pg_temp.wait_for($$SELECT count(*) = 6 FROM lease.rejected_writes WHERE target_table = 'public.aud_payouts'$$) AS recorded;
SELECT statement, row_data FROM lease.rejected_writes
 WHERE target_table = 'public.aud_payouts' ORDER BY id DESC LIMIT 1;
-- pg_lease.audit is a server setting (reload), not a session one
SET pg_lease.audit = off;
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.wait_for($$SELECT queued = 0 AND recorded = 6 FROM lease.audit_status()$$) AS all_recorded;

-- purge_rejected_writes
SELECT lease.purge_rejected_writes(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.purge_rejected_writes(interval '-1 day');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.purge_rejected_writes(interval '1 day') AS purged;
SELECT lease.purge_rejected_writes(interval '0') > 0 AS purged;
SELECT count(*) FROM lease.rejected_writes;

-- stats_reset zeroes the counters
SELECT lease.stats_reset();
SELECT table_name, accepted, refused FROM lease.stats WHERE table_name LIKE 'public.aud_%';
SELECT queued, refused, recorded, dropped FROM lease.audit_status();

DROP TABLE aud_payouts, aud_tables;
