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
SELECT coalesce(lease._shown(d.datname::text), '(dropped)') AS database,
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
    -- (Compared as the DELETE uses it: '-1 year 360 days' is not below
    -- interval '0', which counts a month as 30 days, yet reaches days ahead.)
    IF older_than IS NULL OR now() OPERATOR(pg_catalog.-) older_than OPERATOR(pg_catalog.>) now() THEN
        PERFORM lease._fail('22023', 'lease.purge_rejected_writes: older_than must be a non-negative interval');
    END IF;
    DELETE FROM lease.rejected_writes WHERE rejected_at < now() - older_than;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END $$;
COMMENT ON FUNCTION lease.purge_rejected_writes(interval) IS 'Deletes audit rows older than the interval; returns how many.';

-- Citus (README, "Scale out with Citus"): a refusal on a shard is recorded by
-- the node that holds the shard. These gather every node's rows into one
-- result on the coordinator, each row with the node it came from, through
-- Citus's run_command_on_all_nodes (one connection per node, as the calling
-- role: it needs the same grants on every node). A node that cannot answer
-- gives a WARNING naming it and the error, and the other nodes' rows.
CREATE FUNCTION lease._on_all_nodes(command text)
RETURNS TABLE (node text, result json) LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NULL THEN
        PERFORM lease._fail('0A000', 'pg_lease: Citus is not installed in this database',
            NULL, 'Query lease.rejected_writes and lease.stats directly: this database is its only node.');
    END IF;
    -- Dynamic: pg_lease does not depend on Citus.
    FOR r IN EXECUTE $q$SELECT x.success, x.result, n.nodename || ':' || n.nodeport AS node
                          FROM pg_catalog.run_command_on_all_nodes($1) x
                          JOIN pg_catalog.pg_dist_node n ON n.nodeid = x.nodeid
                         ORDER BY n.nodeid$q$ USING command LOOP
        IF r.success THEN
            node := r.node;
            result := r.result::json;
            RETURN NEXT;
        ELSE
            RAISE WARNING 'pg_lease: Citus node % did not answer: %', r.node, r.result;
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION lease.cluster_rejected_writes(since timestamptz DEFAULT NULL)
RETURNS TABLE (node text, id bigint, rejected_at timestamptz, database text, role text, application_name text,
               client_addr text, backend_pid integer, target_table text, target_relid oid, operation text,
               resource_key text, presented_token bigint, current_token bigint, sqlstate text, error_name text,
               statement text, row_data jsonb, recorded_at timestamptz)
    LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.node, w.*
      FROM lease._on_all_nodes(format(
               'SELECT coalesce(pg_catalog.json_agg(r ORDER BY r.id), ''[]'') FROM lease.rejected_writes r WHERE %L::timestamptz IS NULL OR r.rejected_at >= %L::timestamptz',
               since, since)) a
     CROSS JOIN LATERAL json_populate_recordset(NULL::lease.rejected_writes, a.result) w
     ORDER BY w.rejected_at, a.node, w.id
$$;
COMMENT ON FUNCTION lease.cluster_rejected_writes(timestamptz) IS
    'On a Citus coordinator: lease.rejected_writes of every node (since a time, if given), with the node each row was recorded on.';

CREATE FUNCTION lease.cluster_stats()
RETURNS TABLE (node text, database text, table_name text, accepted bigint, refused bigint, last_refusal_at timestamptz,
               queue_depth bigint, dropped bigint, last_flush_at timestamptz, replicated bigint)
    LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.node, s.*
      FROM lease._on_all_nodes('SELECT coalesce(pg_catalog.json_agg(s), ''[]'') FROM lease.stats s') a
     CROSS JOIN LATERAL json_populate_recordset(NULL::lease.stats, a.result) s
     ORDER BY a.node, s.database, s.table_name
$$;
COMMENT ON FUNCTION lease.cluster_stats() IS
    'On a Citus coordinator: lease.stats of every node, with the node each row comes from.';

-- Citus: pg_lease's triggers on every node's shells and shards of the Citus
-- tables protected here, checked against this coordinator's lease.protected
-- (lease._node_fence_problems on each node). No rows: every shard of every
-- protected Citus table carries its fence and owner guard.
CREATE FUNCTION lease.cluster_fence_problems() RETURNS TABLE (node text, target text, problem text)
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    expected json;
    p record;
    why text;
BEGIN
    SELECT json_agg(json_build_object(
               'target', format('%I.%I', tn.nspname, tc.relname),
               'config', lease._shard_config(p.relid, p.mode, p.key_columns, p.token_column, p.owner_table,
                                             p.owner_key_columns, p.owner_token_column),
               'owner', format('%I.%I', owner_ns.nspname, oc.relname),
               'guard', ARRAY[p.owner_token_column::text] || lease._owner_guard_keys(p.owner_table)))
      INTO expected
      FROM lease.protected p
      JOIN pg_class tc ON tc.oid = p.relid JOIN pg_namespace tn ON tn.oid = tc.relnamespace
      JOIN pg_class oc ON oc.oid = p.owner_table JOIN pg_namespace owner_ns ON owner_ns.oid = oc.relnamespace
     WHERE (lease._citus_table(p.relid)).kind IS NOT NULL;
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NOT NULL AND expected IS NULL THEN
        RETURN;
    END IF;
    -- The co-location rule, which Citus can be told to break later
    -- (update_distributed_table_colocation).
    FOR p IN SELECT x.* FROM lease.protected x WHERE (lease._citus_table(x.relid)).kind IS NOT NULL LOOP
        BEGIN
            PERFORM lease._check_citus_layout(p.relid, p.key_columns, p.owner_table, p.owner_key_columns);
        EXCEPTION WHEN feature_not_supported THEN
            GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
            node := '(coordinator)';
            target := p.relid::text;
            problem := SQLERRM || ': ' || why;
            RETURN NEXT;
        END;
    END LOOP;
    RETURN QUERY
        SELECT a.node, x.target, x.problem
          FROM lease._on_all_nodes(format(
                   'SELECT coalesce(pg_catalog.json_agg(x), ''[]'') FROM lease._node_fence_problems(%L::pg_catalog.json) x',
                   expected)) a
         CROSS JOIN LATERAL json_to_recordset(a.result) AS x(target text, problem text)
         ORDER BY a.node, x.target, x.problem;
END $$;
COMMENT ON FUNCTION lease.cluster_fence_problems() IS
    'On a Citus coordinator: what is wrong with pg_lease''s triggers on any node''s shells and shards of the Citus tables protected here (no rows: nothing).';

-- Audit data and stats are for the roles the DBA grants, not PUBLIC; nobody
-- but the worker (and superusers) writes audit rows.
REVOKE ALL ON lease.rejected_writes, lease.stats FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease._table_stats(), lease._stats(), lease.audit_status(), lease.audit_databases(), lease.stats_reset(),
    lease.purge_rejected_writes(interval), lease._on_all_nodes(text), lease.cluster_rejected_writes(timestamptz),
    lease.cluster_stats(), lease.cluster_fence_problems() FROM PUBLIC;

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
