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
-- Every token from now on is above every token issued before 0.9.0 (when
-- each lease counted for itself, so two leases could hold one token): the
-- epoch base rises above the highest, as lease.issue_tokens_above raises it
-- (a no-op when tokens are already issued above it; at the top of the token
-- range nothing can be raised, and the rule compares keys for such tokens).
DO $$
BEGIN
    PERFORM lease.issue_tokens_above(m) FROM (SELECT max(l.token) AS m FROM lease.lease_state l) t WHERE t.m IS NOT NULL;
EXCEPTION WHEN numeric_value_out_of_range THEN
    NULL;
END $$;

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

-- ALTER SEQUENCE of lease.token_counter refused.
CREATE OR REPLACE FUNCTION lease._guard_ddl() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    touched oid[];
    concerned oid[];
    broken record;
    part record;
    stray record;
    bad boolean;
    match text;
    citus_pending oid[] := '{}';
BEGIN
    -- Fencing tokens are drawn from lease.token_counter, which only ever
    -- rises on its own: ALTER SEQUENCE (RESTART, MAXVALUE, ...) could make
    -- it issue a token again.
    IF tg_tag = 'ALTER SEQUENCE' THEN
        IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() c
                    WHERE c.classid = 'pg_class'::regclass AND c.objid = pg_catalog.to_regclass('lease.token_counter')) THEN
            PERFORM lease._raise('FenceTampering', 'ALTER SEQUENCE of lease.token_counter is refused',
                'Fencing tokens are drawn from lease.token_counter: changing it could issue a token again. To make every later token higher than a given one, use lease.issue_tokens_above.');
        END IF;
    END IF;
    -- Citus: DDL that reached a shard on this node (lease._guard_shards).
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL THEN
        PERFORM lease._guard_shards(tg_tag);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM lease.protected) THEN
        RETURN;
    END IF;
    -- CREATE [OR REPLACE] TRIGGER of one of our triggers leaves it enabled
    -- for origin sessions only, as pg_restore creates it before it enables
    -- it ALWAYS: enable it ALWAYS at once (pg_restore's own ALTER is then a
    -- no-op, and OR REPLACE cannot quietly narrow where the fence fires).
    IF tg_tag = 'CREATE TRIGGER' THEN
        FOR broken IN
            SELECT t.tgrelid::regclass AS rel, t.tgname
              FROM pg_event_trigger_ddl_commands() c JOIN pg_trigger t ON t.oid = c.objid
             WHERE c.classid = 'pg_trigger'::regclass AND t.tgenabled <> 'A' AND t.tgparentid = 0
               AND t.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)
        LOOP
            IF (lease._citus_table(broken.rel)).kind IS NULL THEN
                EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', broken.rel, broken.tgname);
            ELSE
                -- Citus sends the CREATE to the other nodes after this
                -- command, so an ALTER from here would reach them first:
                -- the trigger must be ENABLE ALWAYS by commit instead
                -- (lease._create_trigger enables it next).
                citus_pending := citus_pending || broken.rel::oid;
                INSERT INTO lease.deferred_checks (rel, root) VALUES (broken.rel, broken.rel);
            END IF;
        END LOOP;
    END IF;
    SELECT array_agg(DISTINCT CASE c.classid
                                  WHEN 'pg_trigger'::regclass THEN (SELECT t.tgrelid FROM pg_trigger t WHERE t.oid = c.objid)
                                  WHEN 'pg_rewrite'::regclass THEN (SELECT w.ev_class FROM pg_rewrite w WHERE w.oid = c.objid)
                                  ELSE coalesce((SELECT x.indrelid FROM pg_index x WHERE x.indexrelid = c.objid), c.objid) END)
      INTO touched
      FROM pg_event_trigger_ddl_commands() c
     WHERE c.classid IN ('pg_class'::regclass, 'pg_trigger'::regclass, 'pg_rewrite'::regclass);
    IF touched IS NULL THEN
        RETURN;
    END IF;
    concerned := lease._concerned(touched);
    IF concerned IS NULL THEN
        RETURN;
    END IF;

    -- ALTER COLUMN ... TYPE of a fenced column, even to its own type: with
    -- USING it rewrites every row, and no row trigger sees it.
    SELECT c.objid::regclass AS rel, x.col, p.relid INTO broken
      FROM pg_event_trigger_ddl_commands() c
     CROSS JOIN LATERAL unnest(lease._retyped_columns(c.command)) x(col)
      JOIN lease.protected p ON p.relid::oid = ANY (concerned)
     WHERE c.command_tag = 'ALTER TABLE'
       AND ((coalesce(pg_partition_root(c.objid), c.objid) = p.relid::oid
             AND (x.col = ANY (p.key_columns) OR x.col = p.token_column))
         OR (coalesce(pg_partition_root(c.objid), c.objid) = p.owner_table::oid
             AND (x.col = ANY (p.owner_key_columns) OR x.col = p.owner_token_column)))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('ALTER COLUMN %s TYPE on %s would rewrite a fenced column', quote_ident(broken.col), broken.rel),
            format('Table %s: column "%s" is fenced; ALTER COLUMN ... TYPE rewrites its values without passing the fence.',
                   broken.relid, broken.col));
    END IF;

    -- Partitions joined in this transaction (created, or attached). Not while
    -- the root's fence is itself being created in this transaction, as in a
    -- single-transaction pg_restore that will create the guards from the dump.
    -- (A partitioned table attached brings its whole subtree: every member.)
    FOR part IN
        SELECT DISTINCT p.relid, p.mode, p.token_column, p.key_columns, p.owner_table, p.owner_key_columns,
               p.owner_token_column, m.relid AS child, (r.root = p.owner_table::oid) AS is_owner
          FROM lease.protected p
          CROSS JOIN LATERAL (SELECT p.relid::oid AS root UNION ALL SELECT p.owner_table::oid WHERE p.owner_table IS NOT NULL) r
          CROSS JOIN LATERAL pg_partition_tree(r.root) t
          JOIN pg_inherits i ON i.inhrelid = t.relid AND i.xmin = xid(pg_current_xact_id())
          CROSS JOIN LATERAL pg_partition_tree(t.relid) m
         WHERE p.relid::oid = ANY (concerned)
           AND t.relid <> r.root
    LOOP
        IF part.is_owner THEN
            IF NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.child AND g.tgname = 'pg_lease_owner_truncate') THEN
                IF EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.owner_table AND g.tgname = 'pg_lease_owner_guard'
                              AND g.xmin <> xid(pg_current_xact_id())) THEN
                    PERFORM lease._install_owner_truncate_guard(part.child);
                ELSE
                    INSERT INTO lease.deferred_checks VALUES (part.child, part.relid);
                END IF;
            END IF;
            -- Owner rows brought in passed no owner guard: no token above
            -- what a non-superuser may write (lease.acquire must stay able to
            -- go higher).
            IF lease._exists_as_owner(part.child, format('SELECT EXISTS (SELECT 1 FROM ONLY %s WHERE %I > 4611686018427387903)',
                                                          part.child::regclass, part.owner_token_column)) THEN
                PERFORM lease._fail('22003', format('pg_lease: %s would bring owner rows with fencing tokens above 4611686018427387903 into %s', tg_tag, part.owner_table), format('Table %s holds such tokens; lease.acquire could issue no higher one.', part.child::regclass));
            END IF;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.child AND g.tgname = 'pg_lease_truncate') THEN
            IF EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.relid AND g.tgname = 'pg_lease_fence'
                          AND g.xmin <> xid(pg_current_xact_id())) THEN
                PERFORM lease._install_truncate_guard(part.child);
            ELSE
                INSERT INTO lease.deferred_checks VALUES (part.child, part.relid);
            END IF;
        END IF;
        -- Rows brought in by ATTACH PARTITION passed no fence: each must carry
        -- its owner row's current token (without a token column, or in
        -- high-water mode, no row can be checked: the table must be empty).
        -- Keys are compared as the fence compares them (lease._key_match),
        -- and the owner rows are locked FOR SHARE as the fence locks them: a
        -- token bump then waits for this transaction, or (at REPEATABLE READ
        -- and above) this one fails if a bump already committed.
        match := CASE WHEN part.mode = 'owner' AND part.token_column IS NOT NULL
                      THEN lease._key_match(part.owner_table, part.owner_key_columns, part.child, part.key_columns) END;
        IF match IS NOT NULL THEN
            EXECUTE format(
                'SELECT (SELECT count(*) FROM ONLY %s) <> (SELECT count(*) FROM (SELECT 1 FROM ONLY %s t JOIN %s o ON %s AND o.%I = t.%I FOR SHARE OF o) s)',
                part.child::regclass, part.child::regclass, part.owner_table, match,
                part.owner_token_column, part.token_column)
               INTO bad;
        ELSE
            bad := lease._exists_as_owner(part.child, format('SELECT EXISTS (SELECT 1 FROM ONLY %s)', part.child::regclass));
        END IF;
        IF bad THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would bring rows into fenced table %s that the fence would refuse', tg_tag, part.relid),
                format('Table %s holds rows %s. Attach it empty and insert its rows through the fence.', part.child::regclass,
                       CASE WHEN match IS NOT NULL
                            THEN format('whose token is not their owner row''s current token in %s', part.owner_table)
                            WHEN part.mode = 'owner' AND part.token_column IS NOT NULL
                            THEN 'that cannot be checked (their keys compare through a type''s own operator, which pg_lease does not run with its rights)'
                            ELSE 'that cannot be checked (no token column, or high-water mode)' END));
        END IF;
    END LOOP;

    -- Guards left behind on tables that left a fenced or owner tree (DETACH
    -- PARTITION): owner rows may not leave; a detached fenced partition is no
    -- longer fenced, so its TRUNCATE guard goes.
    FOR stray IN
        SELECT g.tgrelid, g.tgname FROM pg_trigger g
         WHERE tg_tag = 'ALTER TABLE'
           AND g.tgname IN ('pg_lease_truncate', 'pg_lease_owner_truncate')
           AND g.tgfoid = 'lease.truncate_guard'::regproc
           AND NOT (coalesce(pg_partition_root(g.tgrelid), g.tgrelid) = ANY (ARRAY(
                   SELECT p.relid::oid FROM lease.protected p UNION ALL
                   SELECT p.owner_table::oid FROM lease.protected p WHERE p.owner_table IS NOT NULL)))
    LOOP
        -- (Whatever rows it holds, by any snapshot: a partition of an owner
        -- table never leaves it while a fence uses it.)
        IF stray.tgname = 'pg_lease_owner_truncate' THEN
            PERFORM lease._raise('FencingTokenRegression',
                format('%s would take a partition out of an owner table (%s)', tg_tag, stray.tgrelid::regclass),
                format('Table %s holds owner rows whose fencing tokens would leave the fence; tokens could then start over. Unprotect the tables fenced against it first.',
                       stray.tgrelid::regclass));
        END IF;
        PERFORM lease._trigger_ddl(stray.tgrelid::regclass, format('DROP TRIGGER %I ON %s', stray.tgname, stray.tgrelid::regclass));
    END LOOP;

    SELECT f.* INTO broken
      FROM lease._fence_problems(concerned) f
     WHERE f.kind NOT IN ('missing', 'constraint')
       AND NOT (f.kind = 'disabled' AND f.rel::oid = ANY (citus_pending))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would leave the fence on %s incomplete', tg_tag, broken.relid),
            format('Table %s: %s.', broken.relid, broken.problem));
    END IF;
END $$;
