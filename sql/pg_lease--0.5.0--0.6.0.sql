-- pg_lease 0.5.0 -> 0.6.0: hot paths (issue #13). The fence finds and locks
-- owner rows through the owner key's unique index without SPI (in the
-- library; no SQL change). ATTACH PARTITION's check matches the attached
-- rows to their owner rows by the key type's own equality (lease._key_match)
-- instead of their text.
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.6.0'" to load this file. \quit

CREATE FUNCTION lease._key_match(owner regclass, owner_columns text[], rel regclass, columns text[]) RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT string_agg(
        CASE WHEN EXISTS (SELECT 1 FROM pg_operator op JOIN pg_proc f ON f.oid = op.oprcode
                           WHERE op.oprname = '=' AND op.oprnamespace = 'pg_catalog'::regnamespace
                             AND op.oprleft = oa.atttypid AND op.oprright = ra.atttypid
                             AND f.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'internal'))
             THEN format('o.%I OPERATOR(pg_catalog.=) t.%I%s', owner_columns[n], columns[n],
                         (SELECT format(' COLLATE %I.%I', cn.nspname, c.collname)
                            FROM pg_collation c JOIN pg_namespace cn ON cn.oid = c.collnamespace
                           WHERE c.oid = oa.attcollation))
             ELSE format('o.%I::pg_catalog.text OPERATOR(pg_catalog.=) t.%I::pg_catalog.text', owner_columns[n], columns[n])
        END, ' AND ' ORDER BY n)
      FROM generate_series(1, cardinality(columns)) n
      JOIN pg_attribute oa ON oa.attrelid = owner AND oa.attname = owner_columns[n]
      JOIN pg_attribute ra ON ra.attrelid = rel AND ra.attname = columns[n]
$$;
REVOKE EXECUTE ON FUNCTION lease._key_match(regclass, text[], regclass, text[]) FROM PUBLIC;

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
BEGIN
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
            EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', broken.rel, broken.tgname);
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
        IF part.mode = 'owner' AND part.token_column IS NOT NULL THEN
            EXECUTE format(
                'SELECT (SELECT count(*) FROM ONLY %s) <> (SELECT count(*) FROM (SELECT 1 FROM ONLY %s t JOIN %s o ON %s AND o.%I = t.%I FOR SHARE OF o) s)',
                part.child::regclass, part.child::regclass, part.owner_table,
                lease._key_match(part.owner_table, part.owner_key_columns, part.child, part.key_columns),
                part.owner_token_column, part.token_column)
               INTO bad;
        ELSE
            bad := lease._exists_as_owner(part.child, format('SELECT EXISTS (SELECT 1 FROM ONLY %s)', part.child::regclass));
        END IF;
        IF bad THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would bring rows into fenced table %s that the fence would refuse', tg_tag, part.relid),
                format('Table %s holds rows %s. Attach it empty and insert its rows through the fence.', part.child::regclass,
                       CASE WHEN part.mode = 'owner' AND part.token_column IS NOT NULL
                            THEN format('whose token is not their owner row''s current token in %s', part.owner_table)
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
        EXECUTE format('DROP TRIGGER %I ON %s', stray.tgname, stray.tgrelid::regclass);
    END LOOP;

    SELECT f.* INTO broken
      FROM lease._fence_problems(concerned) f
     WHERE f.kind NOT IN ('missing', 'constraint')
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would leave the fence on %s incomplete', tg_tag, broken.relid),
            format('Table %s: %s.', broken.relid, broken.problem));
    END IF;
END $$;
