-- Audit of refused writes. Rows are written by pg_lease's background writers
-- (in the database where the refusal happened, or in the one database named
-- by pg_lease.database), never by the refused writer, so they survive its
-- rollback.

CREATE TABLE lease.rejected_writes (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rejected_at      timestamptz NOT NULL,
    database         text        NOT NULL,
    role             text,
    application_name text,
    client_addr      text,
    backend_pid      integer,
    target_table     text        NOT NULL,
    target_relid     oid,
    operation        text        NOT NULL,
    resource_key     text,
    presented_token  bigint,
    current_token    bigint,
    sqlstate         text        NOT NULL,
    error_name       text,
    -- Only with pg_lease.audit_statement / pg_lease.audit_row (personal data).
    statement        text,
    row_data         jsonb,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejected_writes_rejected_at ON lease.rejected_writes (rejected_at);
CREATE INDEX rejected_writes_table_at ON lease.rejected_writes (target_table, rejected_at);
COMMENT ON TABLE lease.rejected_writes IS 'Every write pg_lease refused, recorded even though the writer rolled back.';
SELECT pg_catalog.pg_extension_config_dump('lease.rejected_writes', '');
-- Its identity sequence too (since 0.4.0): a restored audit table continues
-- after its highest id instead of colliding with its own rows.
SELECT pg_catalog.pg_extension_config_dump('lease.rejected_writes_id_seq', '');

-- Live counters from shared memory, per protected table (of every database).
CREATE VIEW lease.stats AS
SELECT coalesce(d.datname::text, '(dropped)') AS database,
       s.table_name,
       s.accepted,
       s.refused,
       s.last_refusal_at,
       a.queued AS queue_depth,
       a.dropped,
       a.last_flush_at,
       s.replicated
  FROM lease._table_stats() s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.database_oid
 CROSS JOIN lease.audit_status() a;
COMMENT ON VIEW lease.stats IS 'Accepted and refused fenced writes per protected table since start (or lease.stats_reset()), with the audit queue''s depth, drops and last flush, and rows applied by trusted logical replication (replicated).';

CREATE FUNCTION lease.purge_rejected_writes(older_than interval) RETURNS bigint
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    purged bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        PERFORM lease._fail('22023', 'lease.purge_rejected_writes: older_than must be a non-negative interval');
    END IF;
    DELETE FROM lease.rejected_writes WHERE rejected_at < now() - older_than;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END $$;
COMMENT ON FUNCTION lease.purge_rejected_writes(interval) IS 'Deletes audit rows older than the interval; returns how many.';

-- Audit data and stats are for the roles the DBA grants, not PUBLIC; nobody
-- but the worker (and superusers) writes audit rows.
REVOKE ALL ON lease.rejected_writes, lease.stats FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease._table_stats(), lease._stats(), lease.audit_status(), lease.audit_databases(), lease.stats_reset(),
    lease.purge_rejected_writes(interval) FROM PUBLIC;

DO $$
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM lease.audit_status();
    IF NOT s.preloaded THEN
        RAISE WARNING 'pg_lease: refused writes will not be recorded in lease.rejected_writes'
            USING DETAIL = 'pg_lease is not in shared_preload_libraries. Fencing works all the same, and each refusal is logged.',
                  HINT = 'Add pg_lease to shared_preload_libraries and restart the server; see lease.audit_status().';
    ELSIF s.audit_database <> current_database() THEN
        RAISE NOTICE 'pg_lease: refused writes of this database are recorded in database "%" (pg_lease.database)', s.audit_database
            USING HINT = 'Create the extension there too, or set pg_lease.database.';
    END IF;
END $$;
