-- pg_lease 0.8.0 -> 0.9.0: issue #13. Tokens are drawn from one counter,
-- lease.token_counter (unique, never given back by a rollback). The token rule is Rust
-- (src/lease.rs, token_rule): lease.acquire applies it without a statement,
-- reading the epoch tables directly, and lease._next_token, which
-- lease.token_ceiling and lease.issue_tokens_above call, is now the same rule
-- as a C function (VOLATILE: it reads the tables as a statement run at that
-- moment would). Citus: the rule "on a worker, a fenced or owner table's
-- shards and shell change only over Citus's own connections" lives in one
-- function, lease._citus_change_refused, which lease._guard_shards,
-- lease._guard_drop and the DROP TABLE guard call.
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.9.0'" to load this file. \quit

-- The counter every token is drawn from (since 0.9.0; the low 40 bits of a
-- token, the epoch above them): one for the database, so no two acquires are
-- given the same token, and not transactional, so a token an acquire returned
-- is never issued again, even if that acquire's transaction rolled back (its
-- caller may have used it). Dumped with its value.
CREATE SEQUENCE lease.token_counter AS bigint MINVALUE 1 MAXVALUE 1099511627775 NO CYCLE;   -- 2^40 - 1
COMMENT ON SEQUENCE lease.token_counter IS 'The counter of fencing tokens (their low 40 bits; lease.acquire draws from it).';
REVOKE ALL ON lease.token_counter FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_counter', '');
-- Above every counter a lease's own count reached before: no token drawn
-- from it equals one issued before 0.9.0.
SELECT pg_catalog.setval('lease.token_counter',
                         greatest(1, (SELECT max(l.token & 1099511627775) FROM lease.lease_state l)));

-- One lease per owner row: acquire finds an owner table's live bindings.
CREATE INDEX lease_state_bound ON lease.lease_state (owner_table) WHERE owner_table IS NOT NULL AND released_at IS NULL;

DROP FUNCTION lease._next_token(bigint, bigint);
CREATE  FUNCTION lease."_next_token"(
	"stored" bigint, /* i64 */
	"timeline" bigint /* i64 */
) RETURNS TABLE (
	"token" bigint,  /* Option < i64 > */
	"epoch" bigint,  /* i64 */
	"issued" bigint,  /* Option < i64 > */
	"raise_base" bigint  /* Option < i64 > */
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'next_token_sql_wrapper';
COMMENT ON FUNCTION lease._next_token(bigint, bigint) IS
    'The next fencing token after stored on timeline, by the epoch rule (NULL when none is left), with the epoch and the base raise it needs (internal).';
REVOKE EXECUTE ON FUNCTION lease._next_token(bigint, bigint) FROM PUBLIC;

CREATE FUNCTION lease._citus_change_refused(rel regclass) RETURNS text
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shell regclass;
BEGIN
    IF rel IS NULL OR pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NULL
       OR lease._citus_internal() OR lease._citus_coordinator() THEN
        RETURN NULL;
    END IF;
    shell := lease._shard_of(rel);
    IF shell IS NULL THEN
        IF (lease._citus_table(rel)).kind IS NULL THEN
            RETURN NULL;
        END IF;
        shell := rel;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = shell
                      AND t.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc)) THEN
        RETURN NULL;
    END IF;
    RETURN format('%s is fenced by pg_lease (or holds owner rows): change it through the Citus coordinator, where pg_lease''s guard judges the change and Citus carries it to every node.', shell);
END $$;

-- (Executable by PUBLIC: the DROP TABLE guard calls it as the dropping role.)

CREATE OR REPLACE FUNCTION lease._guard_shards(tag text) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    x record;
    gap record;
    fenced text[];
    bad text;
    refused text;
BEGIN
    FOR x IN
        SELECT DISTINCT c.rel, lease._shard_of(c.rel)::regclass AS shell
          FROM (SELECT (CASE d.classid WHEN 'pg_trigger'::regclass THEN (SELECT t.tgrelid FROM pg_trigger t WHERE t.oid = d.objid)
                                       ELSE d.objid END)::regclass AS rel
                  FROM pg_event_trigger_ddl_commands() d
                 WHERE d.classid IN ('pg_class'::regclass, 'pg_trigger'::regclass)) c
         WHERE c.rel IS NOT NULL
    LOOP
        -- A fenced or owner table's shell or shard changes on a worker only
        -- over Citus's own connections (lease._citus_change_refused).
        refused := lease._citus_change_refused(x.rel);
        IF refused IS NOT NULL THEN
            PERFORM lease._raise('FenceTampering',
                CASE WHEN x.shell IS NULL THEN format('%s of %s is refused on this Citus worker', tag, x.rel)
                     ELSE format('%s of shard %s of %s is refused on this node', tag, x.rel, x.shell) END,
                refused);
        END IF;
        CONTINUE WHEN x.shell IS NULL
            OR NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = x.shell
                              AND t.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc));
        SELECT s.rel, s.problem INTO gap FROM lease._shard_problems(x.shell, ARRAY[x.rel], false, tag = 'CREATE TRIGGER') s LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would leave shard %s of %s without pg_lease''s fence', tag, x.rel, x.shell),
                format('Shard %s: %s.', gap.rel, gap.problem));
        END IF;
        -- The shard's fenced columns: its fence's key and token columns, its
        -- owner guard's token and key columns.
        fenced := ARRAY(
            SELECT k FROM pg_trigger t
             CROSS JOIN LATERAL (SELECT (lease._trigger_args(t.tgargs))[1]::jsonb AS cfg) a
             CROSS JOIN LATERAL (SELECT jsonb_array_elements_text(a.cfg -> 'key_columns') UNION ALL SELECT a.cfg ->> 'token_column') u(k)
             WHERE t.tgrelid = x.shell AND t.tgname = 'pg_lease_fence' AND t.tgfoid = 'lease.fence_trigger'::regproc AND t.tgnargs = 1
            UNION ALL
            SELECT unnest(lease._trigger_args(t.tgargs)) FROM pg_trigger t
             WHERE t.tgrelid = x.shell AND t.tgname = 'pg_lease_owner_guard' AND t.tgfoid = 'lease.owner_guard'::regproc);
        SELECT r.col INTO bad
          FROM pg_event_trigger_ddl_commands() d
         CROSS JOIN LATERAL unnest(lease._retyped_columns(d.command)) r(col)
         WHERE d.command_tag = 'ALTER TABLE' AND d.classid = 'pg_class'::regclass AND d.objid = x.rel AND r.col = ANY (fenced)
         LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would rewrite fenced column %I of shard %s of %s', tag, bad, x.rel, x.shell),
                format('Column %I of %s is fenced by pg_lease: a rewrite (ALTER COLUMN ... TYPE ... USING) passes no row trigger.', bad, x.shell));
        END IF;
        SELECT t.tgname INTO bad
          FROM pg_trigger t JOIN pg_trigger ours ON ours.tgrelid = t.tgrelid
         WHERE t.tgrelid = x.rel AND NOT t.tgisinternal
           AND ours.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc)
           AND t.tgfoid NOT IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)
           AND t.tgtype::integer & 3 = 3 AND t.tgtype::integer & 20 <> 0
           AND t.tgname COLLATE "C" > ours.tgname COLLATE "C"
         LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would leave shard %s of %s with trigger %I running after pg_lease''s', tag, x.rel, x.shell, bad),
                format('A BEFORE row trigger that runs after the fence or owner guard could change the row they judged: name it to sort before %I.',
                       (SELECT min(o.tgname COLLATE "C") FROM pg_trigger o WHERE o.tgrelid = x.rel
                           AND o.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc))));
        END IF;
        INSERT INTO lease.deferred_checks (rel, root) VALUES (x.rel, x.shell);
    END LOOP;
END $$;

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
    SELECT p.relid, p.owner_table INTO orphan FROM lease.protected p WHERE p.owner_table::oid = ANY (dropped_tables) LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would drop owner table %s of fenced table %s', tg_tag, orphan.owner_table, orphan.relid),
            format('Table %s is fenced against the owner rows of %s.', orphan.relid, orphan.owner_table));
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
