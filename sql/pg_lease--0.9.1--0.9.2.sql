-- pg_lease 0.9.1 -> 0.9.2. The library reads
-- text from, and hands text back to, PostgreSQL in the database's encoding
-- (src/pg.rs: from_server, to_server, ServerText): in a database whose
-- encoding is not UTF-8, messages, the audit and lease.stats show names and
-- keys as they are stored, and non-ASCII table and column names can be fenced.
-- The generated SQL's comments name other Rust types. The DROP guard names a
-- dropped owner table by its name (from the dropped objects), not its OID:
CREATE OR REPLACE FUNCTION lease._guard_drop() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    dropped_tables oid[];
    owner_roots oid[];
    orphan record;
    victim record;
BEGIN
    -- Citus: a trigger, column or constraint dropped from a shard of a
    -- fenced or owner table straight on its node (see lease._guard_shards).
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL THEN
        SELECT d.object_type, d.object_identity, x.refused INTO victim
          FROM pg_event_trigger_dropped_objects() d
          -- (by name: Citus hides shards from pg_class queries)
         CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(pg_catalog.quote_ident(d.address_names[1]) || '.'
                                                         || pg_catalog.quote_ident(d.address_names[2])) AS rel) r
         CROSS JOIN LATERAL (SELECT lease._citus_change_refused(r.rel) AS refused) x
         WHERE d.object_type IN ('trigger', 'table column', 'table constraint', 'rule') AND x.refused IS NOT NULL
         LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s of %s %s is refused on this Citus worker', tg_tag, victim.object_type, victim.object_identity),
                victim.refused);
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM lease.protected) THEN
        RETURN;
    END IF;
    owner_roots := ARRAY(SELECT p.owner_table::oid FROM lease.protected p WHERE p.owner_table IS NOT NULL);
    dropped_tables := ARRAY(SELECT d.objid FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'table');
    DELETE FROM lease.protected p WHERE p.relid::oid = ANY (dropped_tables);
    DELETE FROM lease.high_water h WHERE h.target::oid = ANY (dropped_tables);
    -- Owner tables that no fenced table uses any more lose their guards (as
    -- after lease.unprotect), so no guard outlives its fence.
    FOR orphan IN
        SELECT g.tgrelid::regclass AS rel, g.tgname FROM pg_trigger g
         WHERE g.tgname IN ('pg_lease_owner_guard', 'pg_lease_owner_truncate') AND g.tgparentid = 0
           AND g.tgfoid IN ('lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)
           AND coalesce(pg_partition_root(g.tgrelid), g.tgrelid) = ANY (owner_roots)
           AND NOT (coalesce(pg_partition_root(g.tgrelid), g.tgrelid) = ANY (ARRAY(
                   SELECT p.owner_table::oid FROM lease.protected p WHERE p.owner_table IS NOT NULL)))
           AND NOT (g.tgrelid = ANY (dropped_tables))
    LOOP
        PERFORM lease._trigger_ddl(orphan.rel, format('DROP TRIGGER %I ON %s', orphan.tgname, orphan.rel));
    END LOOP;
    -- (The owner table is gone from the catalogs by now: its name comes
    -- from the dropped objects.)
    SELECT p.relid, d.object_identity AS owner_name INTO orphan
      FROM lease.protected p
      JOIN pg_event_trigger_dropped_objects() d ON d.objid = p.owner_table::oid AND d.object_type = 'table'
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would drop owner table %s of fenced table %s', tg_tag, orphan.owner_name, orphan.relid),
            format('Table %s is fenced against the owner rows of %s.', orphan.relid, orphan.owner_name));
    END IF;
    -- A partition of an owner table dropped without its owner table takes
    -- owner rows and their tokens, whether the command names it or reaches
    -- it by cascade (DROP SCHEMA, DROP OWNED, DROP TYPE ... CASCADE). Its
    -- owner table cannot be told any more (the catalog no longer links
    -- them), so such a drop is refused while any owner table stays in use
    -- and is not dropped by this same command: drop or unprotect the fenced
    -- tables first (their owner guards then go), then the owner tables.
    SELECT tb.object_identity INTO victim
      FROM pg_event_trigger_dropped_objects() tg
      JOIN pg_event_trigger_dropped_objects() tb
        ON tb.object_type = 'table'
       AND tb.address_names[1] = tg.address_names[1] AND tb.address_names[2] = tg.address_names[2]
     WHERE tg.object_type = 'trigger' AND tg.address_names[3] = 'pg_lease_owner_truncate'
       AND NOT (tb.objid = ANY (owner_roots))
       AND EXISTS (SELECT 1 FROM lease.protected p
                    WHERE p.owner_table IS NOT NULL AND NOT (p.owner_table::oid = ANY (dropped_tables)))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FencingTokenRegression',
            format('%s would drop a partition of an owner table (%s)', tg_tag, victim.object_identity),
            'Owner rows hold the current fencing tokens; dropping them would let tokens start over. To retire an owner table, drop or lease.unprotect the tables fenced against it first, in a separate command.');
    END IF;
    -- Triggers, columns, constraints: address_names is {schema, table, name}.
    SELECT d.object_type, d.object_identity, f.relid INTO victim
      FROM pg_event_trigger_dropped_objects() d
      CROSS JOIN LATERAL (SELECT to_regclass(format('%I.%I', d.address_names[1], d.address_names[2])) AS rel) r
      JOIN lease._fence_problems(lease._concerned(ARRAY[r.rel::oid])) f ON f.rel = r.rel
     WHERE d.object_type IN ('trigger', 'table column', 'table constraint', 'index')
       AND r.rel IS NOT NULL
       AND NOT (r.rel::oid = ANY (dropped_tables))
       AND ((d.object_type = 'trigger' AND f.kind = 'missing'
             AND EXISTS (SELECT 1 FROM lease._expected_triggers(lease._concerned(ARRAY[r.rel::oid])) e
                          WHERE e.rel = r.rel::oid AND e.tgname = d.address_names[3]))
         OR (d.object_type = 'table column' AND f.kind = 'column')
         OR (d.object_type IN ('table constraint', 'index') AND f.kind = 'constraint'))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('dropping %s %s would leave the fence on %s incomplete', victim.object_type, victim.object_identity, victim.relid),
            format('pg_lease fences %s with it.', victim.relid));
    END IF;
    -- A dropped index no longer names its table: look at every owner table.
    IF EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'index') THEN
        SELECT f.relid, f.problem INTO victim FROM lease._fence_problems() f WHERE f.kind = 'constraint' LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would leave the fence on %s incomplete', tg_tag, victim.relid),
                format('Table %s: %s.', victim.relid, victim.problem));
        END IF;
    END IF;
END $$;
