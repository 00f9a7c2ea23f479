-- pg_lease 0.5.0 -> 0.6.0: hot paths (issue #13) and the owner key's identity.
-- The fence finds and locks owner rows (and high-water marks) through their
-- unique index without SPI (in the library). lease.fenced_boundary_write is
-- C (src/fence/boundary_write.rs): saved insert plans per table and column
-- set, values converted with each column's input function; same checks,
-- messages, SQLSTATEs and privileges (runs as its caller); its PL/pgSQL
-- helper lease._boundary_problem is gone. The lease calls run fewer
-- statements. lease.protect and the fence check require the owner key to be
-- unique under the equality the fence compares keys with, and that equality
-- to be immutable (lease._owner_key_index, lease._key_equality); ATTACH
-- PARTITION's row check compares keys by that equality, never by text
-- (lease._key_match). Fences that 0.5.0 accepted but this rule refuses are
-- reported at the end of this script (lease.protected_tables shows them).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.6.0'" to load this file. \quit

CREATE  FUNCTION "_key_equality"(
	"left" oid, /* pg_sys :: Oid */
	"right" oid /* pg_sys :: Oid */
) RETURNS oid /* Option < pg_sys :: Oid > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'key_equality_wrapper';

CREATE  FUNCTION "_owner_key_index"(
	"owner" oid, /* pg_sys :: Oid */
	"owner_key_columns" TEXT[], /* Vec < String > */
	"key_types" oid[] /* Vec < Option < pg_sys :: Oid > > */
) RETURNS oid /* Option < pg_sys :: Oid > */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'owner_key_index_wrapper';


CREATE OR REPLACE FUNCTION lease.protect(
    target regclass,
    key_columns text[],
    token_column name DEFAULT NULL,
    owner_table regclass DEFAULT NULL,
    owner_key_columns text[] DEFAULT '{id}',
    owner_token_column name DEFAULT 'owner_fencing_token'
) RETURNS void
-- No SET search_path: a NULL owner_table means "tables" as the caller's
-- search_path resolves it. Every other name below is schema-qualified.
LANGUAGE plpgsql AS $$
DECLARE
    owner regclass := owner_table;
    i int;
    existing_guard text;
BEGIN
    PERFORM lease._check_columns(target, 'target table', key_columns, token_column);
    PERFORM lease._check_not_protected(target);
    IF owner IS NULL THEN
        owner := pg_catalog.to_regclass('tables');
        IF owner IS NULL THEN
            PERFORM lease._fail('42P01', 'pg_lease: owner table "tables" does not exist', NULL, 'Pass owner_table => ''your_schema.your_owner_table''.');
        END IF;
    END IF;
    IF owner OPERATOR(pg_catalog.=) target THEN
        PERFORM lease._fail('22023', format('pg_lease: %s cannot be its own owner table', target));
    END IF;
    IF owner_token_column IS NULL THEN
        PERFORM lease._fail('22004', 'pg_lease: owner_token_column must not be NULL');
    END IF;
    PERFORM lease._check_columns(owner, 'owner table', owner_key_columns, owner_token_column);
    IF pg_catalog.cardinality(owner_key_columns) OPERATOR(pg_catalog.<>) pg_catalog.cardinality(key_columns) THEN
        PERFORM lease._fail('22023', format('pg_lease: %s key columns %s do not pair with owner key columns %s', target, key_columns, owner_key_columns));
    END IF;
    -- The owner key is unique under its own type's equality and collation.
    IF lease._owner_key_index(owner, owner_key_columns,
                              ARRAY(SELECT lease._column_type(owner, u.c)::pg_catalog.oid
                                      FROM pg_catalog.unnest(owner_key_columns) WITH ORDINALITY u(c, n) ORDER BY u.n)) IS NULL THEN
        PERFORM lease._fail('42830', format('pg_lease: there is no unique constraint matching key columns %s of owner table %s', owner_key_columns, owner),
            'Each fenced row must match exactly one owner row.');
    END IF;
    -- Each key pair must be comparable (raises undefined_function otherwise).
    BEGIN
        EXECUTE pg_catalog.format('SELECT 1 FROM %s o WHERE %s LIMIT 0', owner,
            (SELECT pg_catalog.string_agg(pg_catalog.format('o.%I OPERATOR(pg_catalog.=) NULL::%s', owner_key_columns[n],
                                             lease._column_type(target, key_columns[n])), ' AND ')
               FROM pg_catalog.generate_series(1, pg_catalog.cardinality(key_columns)) n));
    EXCEPTION
        WHEN undefined_function THEN
            PERFORM lease._fail('42883',
                format('pg_lease: key columns %s of %s cannot be compared with owner key columns %s of %s',
                       key_columns, target, owner_key_columns, owner),
                format('%s (the types of the key columns, in order: %s against %s)', SQLERRM,
                       (SELECT pg_catalog.string_agg(lease._column_type(target, c)::text, ', ') FROM pg_catalog.unnest(key_columns) c),
                       (SELECT pg_catalog.string_agg(lease._column_type(owner, c)::text, ', ') FROM pg_catalog.unnest(owner_key_columns) c)),
                'Give each key column the type of its owner key column, or a type its = operator accepts.');
        WHEN insufficient_privilege THEN
            PERFORM lease._fail('42501', format('pg_lease: must be owner of table %s', owner),
                'lease.protect needs ownership of the protected table and of its owner table.');
    END;
    -- A key's identity must not depend on the session (date = timestamptz
    -- reads TimeZone) nor on a conversion function.
    IF EXISTS (SELECT 1 FROM pg_catalog.generate_series(1, pg_catalog.cardinality(key_columns)) n
                WHERE lease._key_equality(lease._column_type(owner, owner_key_columns[n]),
                                          lease._column_type(target, key_columns[n])) IS NULL) THEN
        PERFORM lease._fail('42804',
            format('pg_lease: key columns %s of %s compare with owner key columns %s of %s through an equality that is not immutable or needs a conversion',
                   key_columns, target, owner_key_columns, owner),
            format('The types of the key columns, in order: %s against %s.',
                   (SELECT pg_catalog.string_agg(lease._column_type(target, c)::text, ', ') FROM pg_catalog.unnest(key_columns) c),
                   (SELECT pg_catalog.string_agg(lease._column_type(owner, c)::text, ', ') FROM pg_catalog.unnest(owner_key_columns) c)),
            'A resource must be the same whatever a writer''s settings: give each key column the type of its owner key column.');
    END IF;
    -- Each fenced row matches at most one owner row: the owner key is unique
    -- under the very equality the fence compares a fenced key with.
    IF lease._owner_key_index(owner, owner_key_columns,
                              ARRAY(SELECT lease._column_type(target, u.c)::pg_catalog.oid
                                      FROM pg_catalog.unnest(key_columns) WITH ORDINALITY u(c, n) ORDER BY u.n)) IS NULL THEN
        PERFORM lease._fail('42830', format('pg_lease: the owner key %s of %s is not unique under the equality that compares it with key columns %s of %s', owner_key_columns, owner, key_columns, target),
            'Each fenced row must match exactly one owner row.',
            'The owner table needs a PRIMARY KEY or UNIQUE constraint on exactly these columns in the operator family of that equality.');
    END IF;

    -- One owner guard per owner table, shared by every table fenced against it.
    SELECT pg_catalog.encode(t.tgargs, 'escape') INTO existing_guard FROM pg_catalog.pg_trigger t
     WHERE t.tgrelid OPERATOR(pg_catalog.=) owner AND t.tgname OPERATOR(pg_catalog.=) 'pg_lease_owner_guard' AND NOT t.tgisinternal;
    IF existing_guard IS NOT NULL
       AND pg_catalog.split_part(existing_guard, E'\\000', 1) OPERATOR(pg_catalog.<>) owner_token_column THEN
        PERFORM lease._fail('0A000', format('pg_lease: owner table %s already guards token column "%s"', owner, pg_catalog.split_part(existing_guard, E'\\000', 1)), 'All tables fenced against one owner table must use the same owner token column.');
    END IF;
    -- One guard per owner table, watching the key columns of every table
    -- fenced against it: installed, extended by this table's key columns, or
    -- (what a schema-only restore left) made whole.
    PERFORM lease._guard_owner(owner, owner_token_column, owner_key_columns);

    PERFORM lease._install_target_triggers(target);
    PERFORM lease._register(target, 'owner', key_columns, token_column, owner, owner_key_columns, owner_token_column);
    PERFORM lease._check_enforced(target);
END $$;

CREATE OR REPLACE FUNCTION lease._fence_problems(among oid[] DEFAULT NULL)
RETURNS TABLE (relid regclass, rel regclass, kind text, problem text)
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH p AS (
        SELECT * FROM lease.protected p
         WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p.relid OFFSET 0)
           AND (among IS NULL OR p.relid::oid = ANY (among) OR p.owner_table::oid = ANY (among))
    ),
    -- A table and, when partitioned, every partition (pg_partition_tree
    -- returns nothing for a table that is not in a partition tree).
    roots (r) AS (SELECT relid::oid FROM p UNION SELECT owner_table::oid FROM p WHERE owner_table IS NOT NULL),
    tree (root, rel) AS (
        SELECT r, r FROM roots
        UNION
        SELECT roots.r, t.relid FROM roots, pg_partition_tree(roots.r) t
    ),
    -- The triggers pg_lease keeps on these tables (lease._expected_triggers).
    expected_triggers AS (SELECT * FROM lease._expected_triggers(among)),
    expected_columns (relid, rel, col, is_token, typ, high_water) AS (
        SELECT p.relid, p.relid, k.col, false, p.key_types[k.n], p.mode = 'high_water'
          FROM p, unnest(p.key_columns) WITH ORDINALITY k(col, n)
        UNION ALL
        SELECT p.relid, p.relid, p.token_column, true, p.token_type, false FROM p WHERE p.token_column IS NOT NULL
        UNION ALL
        SELECT p.relid, p.owner_table, k.col, false, p.owner_key_types[k.n], false
          FROM p, unnest(p.owner_key_columns) WITH ORDINALITY k(col, n) WHERE p.owner_table IS NOT NULL
        UNION ALL
        SELECT p.relid, p.owner_table, p.owner_token_column, true, p.owner_token_type, false FROM p WHERE p.owner_table IS NOT NULL
    ),
    -- (LATERAL lookups by key: the plan is generic, and must stay cheap
    -- however few tables `among` names.)
    actual_columns AS (
        SELECT e.*, a.cur, a.attgenerated, a.attcollation
          FROM expected_columns e
          LEFT JOIN LATERAL (SELECT x.atttypid::regtype AS cur, x.attgenerated, x.attcollation FROM pg_attribute x
                              WHERE x.attrelid = e.rel AND x.attname = e.col AND x.attnum > 0 AND NOT x.attisdropped
                             OFFSET 0) a ON true
    )
    SELECT e.relid::regclass, e.rel::regclass,
           CASE WHEN t.oid IS NULL THEN 'missing' WHEN t.tgfoid <> e.func THEN 'replaced' ELSE 'disabled' END,
           format('trigger %s on %s %s', e.tgname, e.rel::regclass,
                  CASE WHEN t.oid IS NULL THEN 'is missing'
                       WHEN t.tgfoid <> e.func THEN format('runs %s instead of %s', t.tgfoid::regproc, e.func)
                       ELSE 'is not ENABLE ALWAYS' END)
      FROM expected_triggers e
      LEFT JOIN LATERAL (SELECT x.oid, x.tgenabled, x.tgfoid FROM pg_trigger x
                          WHERE x.tgrelid = e.rel AND x.tgname = e.tgname OFFSET 0) t ON true
     WHERE t.oid IS NULL OR t.tgenabled <> 'A' OR t.tgfoid <> e.func
    UNION ALL
    SELECT e.relid::regclass, e.rel::regclass, 'altered',
           format('trigger %s on %s no longer fires on every %s', e.tgname, e.rel::regclass,
                  CASE WHEN e.tgtype = 31 THEN 'INSERT, UPDATE and DELETE of every row' ELSE 'TRUNCATE' END)
      FROM expected_triggers e
      CROSS JOIN LATERAL (SELECT x.* FROM pg_trigger x
                           WHERE x.tgrelid = e.rel AND x.tgname = e.tgname AND x.tgfoid = e.func OFFSET 0) t
     WHERE t.tgtype <> e.tgtype OR t.tgqual IS NOT NULL OR cardinality(t.tgattr::int2[]) > 0
        OR CASE WHEN e.tgname = 'pg_lease_owner_guard' THEN
                -- The token column, and at least every key column expected
                -- (more while a protect extends the guard).
                NOT coalesce((string_to_array(left(encode(t.tgargs, 'escape'), -4), E'\\000'))[1] = (string_to_array(e.args, E'\\000'))[1]
                    AND (string_to_array(left(encode(t.tgargs, 'escape'), -4), E'\\000'))[2:]
                        @> (string_to_array(e.args, E'\\000'))[2:], false)
           ELSE left(encode(t.tgargs, 'escape'), -4) IS DISTINCT FROM e.args AND NOT (e.args = '' AND t.tgnargs = 0) END
    UNION ALL
    -- Row triggers fire in name order: a BEFORE INSERT/UPDATE row trigger
    -- named after ours runs after the fence or owner guard has judged the
    -- row, and could change the row it judged.
    SELECT DISTINCT ON (e.rel, t.tgname) e.relid::regclass, e.rel::regclass, 'order',
           format('trigger %s on %s runs after %s and could change the row it checked (name it to sort before %s)',
                  quote_ident(t.tgname), e.rel::regclass, e.tgname, e.tgname)
      FROM expected_triggers e
      CROSS JOIN LATERAL (SELECT x.tgname FROM pg_trigger x
                           WHERE x.tgrelid = e.rel AND x.tgtype & 3 = 3 AND x.tgtype & 20 <> 0
                             AND x.tgenabled <> 'D' AND NOT x.tgisinternal
                             AND x.tgname COLLATE "C" > e.tgname COLLATE "C"
                             AND x.tgfoid NOT IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc)
                          OFFSET 0) t
     WHERE e.tgtype = 31
    UNION ALL
    SELECT DISTINCT e.relid::regclass, t.tgrelid::regclass, 'renamed',
           format('trigger %s on %s runs %s under another name', t.tgname, t.tgrelid::regclass, t.tgfoid::regproc)
      FROM expected_triggers e
      CROSS JOIN LATERAL (SELECT x.* FROM pg_trigger x WHERE x.tgrelid = e.rel AND x.tgfoid = e.func OFFSET 0) t
     WHERE NOT EXISTS (SELECT 1 FROM expected_triggers x WHERE x.rel = t.tgrelid AND x.tgname = t.tgname)
    UNION ALL
    SELECT e.relid, e.rel, 'column',
           format('%s column "%s" of %s is %s', CASE WHEN e.is_token THEN 'token' ELSE 'key' END, e.col, e.rel,
                  CASE WHEN e.cur IS NULL THEN 'missing'
                       WHEN e.attgenerated <> '' THEN 'a generated column'
                       WHEN e.typ IS NOT NULL AND e.cur <> e.typ THEN format('of type %s, was %s', e.cur, e.typ)
                       WHEN e.high_water THEN lease._key_identity_problem(e.cur, e.attcollation)
                       ELSE 'of type ' || e.cur::text END)
      FROM actual_columns e
     WHERE e.cur IS NULL
        OR e.attgenerated <> ''
        OR (e.typ IS NOT NULL AND e.cur <> e.typ)
        OR (e.typ IS NULL AND e.is_token AND NOT lease._is_token_type(e.cur))
        OR (e.high_water AND lease._key_identity_problem(e.cur, e.attcollation) IS NOT NULL)
    UNION ALL
    SELECT p.relid, p.owner_table, 'constraint',
           format('owner table %s has no unique constraint on %s under the equality the fence compares %s keys with', p.owner_table, p.owner_key_columns, p.relid)
      FROM p
     CROSS JOIN LATERAL (SELECT lease._owner_key_index(p.owner_table, p.owner_key_columns,
                                ARRAY(SELECT lease._column_type(p.relid, k.c)::oid
                                        FROM unnest(p.key_columns) WITH ORDINALITY k(c, n) ORDER BY k.n)) IS NOT NULL AS ok) u
     WHERE p.owner_table IS NOT NULL AND NOT u.ok
    UNION ALL
    SELECT DISTINCT ON (x.relid, i.inhrelid) x.relid, i.inhrelid::regclass, 'inherits',
           format('table %s inherits from %s, so writes through it bypass the fence', i.inhrelid::regclass, i.inhparent::regclass)
      FROM (SELECT p.relid, t.rel FROM p JOIN tree t ON t.root IN (p.relid::oid, p.owner_table::oid)) x
      JOIN pg_inherits i ON i.inhparent = x.rel
      JOIN pg_class c ON c.oid = i.inhrelid
     WHERE NOT c.relispartition
    UNION ALL
    SELECT p.relid, c.oid::regclass, 'relation', format('%s is no longer a table', c.oid::regclass)
      FROM p JOIN pg_class c ON c.oid IN (p.relid::oid, p.owner_table::oid)
     WHERE c.relkind NOT IN ('r', 'p')
    UNION ALL
    -- Owner rows hold the current tokens: a crash (or a promoted standby)
    -- empties an UNLOGGED table, and tokens would start over.
    SELECT DISTINCT x.relid, c.oid::regclass, 'relation',
           format('owner table %s is %s: a crash or failover empties it, and its fencing tokens with it',
                  c.oid::regclass, CASE c.relpersistence WHEN 'u' THEN 'UNLOGGED' ELSE 'TEMPORARY' END)
      FROM (SELECT p.relid, t.rel FROM p JOIN tree t ON t.root = p.owner_table::oid) x
      JOIN pg_class c ON c.oid = x.rel
     WHERE c.relpersistence <> 'p';
END $$;

CREATE FUNCTION lease._key_match(owner regclass, owner_columns text[], rel regclass, columns text[]) RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN bool_and(f.prolang IS NOT DISTINCT FROM (SELECT l.oid FROM pg_language l WHERE l.lanname = 'internal'))
                THEN string_agg(format('o.%I OPERATOR(pg_catalog.=) t.%I%s', owner_columns[n], columns[n],
                                       (SELECT format(' COLLATE %I.%I', cn.nspname, c.collname)
                                          FROM pg_collation c JOIN pg_namespace cn ON cn.oid = c.collnamespace
                                         WHERE c.oid = oa.attcollation)), ' AND ' ORDER BY n)
           END
      FROM generate_series(1, cardinality(columns)) n
      JOIN pg_attribute oa ON oa.attrelid = owner AND oa.attname = owner_columns[n]
      JOIN pg_attribute ra ON ra.attrelid = rel AND ra.attname = columns[n]
      LEFT JOIN pg_operator op ON op.oid = lease._key_equality(oa.atttypid, ra.atttypid)
      LEFT JOIN pg_proc f ON f.oid = op.oprcode
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
    match text;
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

CREATE OR REPLACE FUNCTION lease.fenced_boundary_write(target regclass, token bigint, rows jsonb) RETURNS bigint
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_fenced_boundary_write';

CREATE FUNCTION lease._label(what text, value text) RETURNS text
    LANGUAGE C IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_lease_label';
COMMENT ON FUNCTION lease._label(text, text) IS
    'Returns value if it is a valid lease name or owner, else raises as lease._check_label does (internal).';
REVOKE EXECUTE ON FUNCTION lease._label(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION lease.acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                              owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    p_ttl_ms ALIAS FOR $3;
    p_owner_table ALIAS FOR $4;
    p_owner_key ALIAS FOR $5;
    timeline bigint := lease._token_floor() >> 40;   -- also refuses on a standby
    ttl integer := lease._check_ttl(p_ttl_ms);
    p_name text COLLATE "default" := lease._label('name', $1);   -- see the convention at the top
    p_owner text COLLATE "default" := lease._label('owner', $2);
    epoch bigint; issued bigint; high bigint; stored bigint;
    raise_base boolean; fresh boolean;
    cur lease.lease_state;
    cur_expiry timestamptz;
    holder lease.session_state;
    now_ts timestamptz;
    live boolean;
    binding record;
    owner_row bigint[];
    owner_token bigint;
    landed bigint;
    detail text;
    new_token bigint;
BEGIN
    IF (p_owner_table IS NULL) <> (p_owner_key IS NULL) THEN
        PERFORM lease._fail('22023', 'pg_lease: owner_table and owner_key go together');
    END IF;
    IF p_owner_table IS NOT NULL THEN
        SELECT p.owner_key_columns, p.owner_token_column INTO binding
          FROM lease.protected p WHERE p.owner_table = p_owner_table LIMIT 1;
        IF NOT FOUND THEN
            PERFORM lease._fail('55000', format('pg_lease: %s is not the owner table of any table protected with lease.protect', p_owner_table));
        END IF;
        IF cardinality(p_owner_key) IS DISTINCT FROM cardinality(binding.owner_key_columns)
           OR array_position(p_owner_key, NULL) IS NOT NULL THEN
            PERFORM lease._fail('22023', format('pg_lease: owner_key %s does not match the key columns %s of %s', p_owner_key, binding.owner_key_columns, p_owner_table));
        END IF;
    END IF;

    -- The lease row, locked (created on first use): racing acquires queue here.
    SELECT * INTO cur FROM lease.lease_state l WHERE l.name = p_name FOR UPDATE;
    fresh := NOT FOUND AND p_owner_table IS NULL;   -- see above
    IF fresh THEN
        cur.owner := p_owner; cur.token := 0; cur.released_at := '-infinity';
    ELSIF NOT FOUND THEN
        INSERT INTO lease.lease_state AS l (name, owner, token, acquired_at, renewed_at, expires_at, released_at)
        VALUES (p_name, p_owner, 0, '-infinity', '-infinity', '-infinity', '-infinity')
        ON CONFLICT (name) DO NOTHING;
        SELECT * INTO cur FROM lease.lease_state l WHERE l.name = p_name FOR UPDATE;
    END IF;
    -- The new holder's session row exists from its first lease on, so the
    -- takeover check below can always lock it (an uncommitted first
    -- heartbeat's INSERT could not be waited for). Fresh: after its row.
    IF NOT fresh THEN
        INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
        VALUES (p_owner, '-infinity', '-infinity', '-infinity') ON CONFLICT (owner) DO NOTHING;
    END IF;
    now_ts := clock_timestamp();   -- read after the lock wait
    cur_expiry := cur.expires_at;
    live := cur.released_at IS NULL AND cur_expiry > now_ts;
    IF cur.released_at IS NULL AND NOT live AND cur.owner <> p_owner THEN
        -- Past its own expiry, another owner's lease may still be carried by
        -- that owner's heartbeat session. Lock the session row (a heartbeat
        -- waits for this acquire, or this acquire for it) and judge on the
        -- clock read after the lock.
        SELECT * INTO holder FROM lease.session_state s WHERE s.owner = cur.owner FOR SHARE;
        now_ts := clock_timestamp();
        cur_expiry := lease._expiry(cur.expires_at, holder.live_since, holder.expires_at);
        live := cur_expiry > now_ts;
    END IF;
    IF live AND cur.owner <> p_owner THEN
        PERFORM lease._raise('LeaseOwnedElsewhere',
            format('lease "%s" is held by %s', p_name, cur.owner),
            format('Lease %s, holder %s, token %s, expires at %s (in %s).', p_name, cur.owner, cur.token,
                   cur_expiry, date_trunc('millisecond', cur_expiry - now_ts)));
    END IF;

    IF p_owner_table IS NOT NULL THEN
        -- FOR UPDATE waits for writers still fenced under the old token. The
        -- owner row is read and written as the owner table's owner, never as
        -- this function's superuser owner (src/lease_owner.rs).
        owner_row := lease._lock_owner_row(p_owner_table, p_owner_key);
        owner_token := owner_row[1];
        IF cardinality(owner_row) = 0 THEN
            PERFORM lease._raise('FenceOwnerMissing',
                format('lease "%s" is bound to owner row %s of %s, which does not exist', p_name, p_owner_key, p_owner_table),
                format('Lease %s, owner table %s, key %s = %s.', p_name, p_owner_table, binding.owner_key_columns, p_owner_key));
        END IF;
    END IF;

    -- Epoch = base + timeline. A stored token from a higher epoch, or an
    -- epoch issued before (restored from a dump, or carried through
    -- pg_upgrade, where timelines restart) raises base to that epoch: the new
    -- epoch is then above it, and above what any earlier, lower timeline
    -- computed from the same stored token.
    stored := greatest(cur.token, owner_token, 0);
    SELECT coalesce(max(e.base), 0) + timeline, (SELECT i.epoch FROM lease.token_epoch_issued i)
      INTO epoch, issued FROM lease.token_epoch e;
    high := greatest(stored >> 40, issued);
    raise_base := high > epoch;
    IF raise_base THEN
        epoch := high + timeline;
    END IF;
    -- (Refused before anything below is written; the transaction would
    -- undo it anyway.)
    IF stored = 9223372036854775807 OR epoch >= 8388608 THEN   -- 2^63 - 1, 2^23
        PERFORM lease._fail('22003', format('pg_lease: lease "%s" has no fencing token left (current %s)', p_name, stored), 'Fencing tokens are bigints; this resource''s token is at the top of their range.');
    END IF;
    new_token := greatest(stored, epoch << 40) + 1;
    IF fresh THEN
        -- The lease row, then (only if it was inserted) the session row.
        WITH ins AS (
            INSERT INTO lease.lease_state AS l (name, owner, token, acquired_at, renewed_at, expires_at)
            VALUES (p_name, p_owner, new_token, now_ts, now_ts, now_ts + ttl * interval '1 millisecond')
            ON CONFLICT (name) DO NOTHING
            RETURNING l.token, l.expires_at
        ), sess AS (
            INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
            SELECT p_owner, '-infinity', '-infinity', '-infinity' FROM ins
            ON CONFLICT (owner) DO NOTHING
        )
        SELECT i.token, i.expires_at INTO token, expires_at FROM ins i;
        IF NOT FOUND THEN
            -- Another acquire created the row since (nothing is written
            -- yet): judge again, under its lock.
            RETURN QUERY SELECT * FROM lease.acquire($1, $2, $3, $4, $5);
            RETURN;
        END IF;
    END IF;
    IF raise_base THEN
        INSERT INTO lease.token_epoch (base) VALUES (high) ON CONFLICT DO NOTHING;
    END IF;
    IF epoch > coalesce(issued, 0) THEN
        INSERT INTO lease.token_epoch_issued AS i (epoch) VALUES (epoch)
        ON CONFLICT (singleton) DO UPDATE SET epoch = greatest(i.epoch, excluded.epoch);
    END IF;
    IF p_owner_table IS NOT NULL THEN
        BEGIN
            landed := lease._set_owner_token(p_owner_table, p_owner_key, new_token);
        EXCEPTION WHEN internal_error THEN
            -- The owner guard's LF004 (a trigger on the owner table lowered
            -- the bump) comes back from the Rust call as XX000: raise it again
            -- with its own code.
            IF SQLERRM LIKE 'FencingTokenRegression: %' THEN
                GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
                PERFORM lease._raise('FencingTokenRegression', substr(SQLERRM, 25), detail);
            END IF;
            RAISE;
        END;
    END IF;
    IF p_owner_table IS NOT NULL AND landed IS DISTINCT FROM new_token THEN
        -- A trigger or rule on the owner table swallowed or changed the bump:
        -- the old holder's token would still be current.
        PERFORM lease._raise('FenceTampering',
            format('lease "%s": the token bump to %s did not reach owner row %s of %s', p_name, new_token, p_owner_key, p_owner_table),
            format('Lease %s, owner table %s: a trigger or rule on it skipped or changed the UPDATE of its token column.',
                   p_name, p_owner_table));
    END IF;
    IF NOT fresh THEN
        UPDATE lease.lease_state l
           SET owner = p_owner, token = new_token, acquired_at = now_ts, renewed_at = now_ts,
               expires_at = now_ts + ttl * interval '1 millisecond', released_at = NULL,
               owner_table = p_owner_table, owner_key = p_owner_key
         WHERE l.name = p_name
        RETURNING l.token, l.expires_at INTO token, expires_at;
    END IF;
    IF cur.owner <> p_owner THEN
        -- Taken from a holder that did not release it: its next heartbeat
        -- hears so. This owner's own report of an earlier loss of the lease
        -- is moot now that it holds the lease again.
        IF cur.released_at IS NULL THEN
            INSERT INTO lease.lost_leases AS x (owner, name, token, lost_at)
            VALUES (cur.owner, p_name, cur.token, now_ts)
            ON CONFLICT (owner, name) DO UPDATE SET token = excluded.token, lost_at = excluded.lost_at;
        END IF;
        DELETE FROM lease.lost_leases x WHERE x.owner = p_owner AND x.name = p_name;
    END IF;

    -- The lease changed hands from a holder that did not release it (it expired,
    -- or its owner re-took it from another process): tell a live previous
    -- holder, so it can freeze before its next write is refused.
    IF cur.released_at IS NULL AND cur.token > 0 THEN
        PERFORM pg_notify('pg_lease', json_build_object(
            'event', 'taken', 'name', p_name, 'owner', p_owner, 'token', new_token,
            'previous_owner', cur.owner, 'previous_token', cur.token, 'expires_at', expires_at)::text);
    END IF;
    -- A token must be durable before the client sees it.
    IF current_setting('synchronous_commit') = 'off' THEN
        PERFORM set_config('synchronous_commit', 'local', true);
    END IF;
    RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION lease.renew(name text, owner text, token bigint, ttl_ms integer) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ttl integer := lease._check_ttl(ttl_ms);
    p_name text COLLATE "default" := lease._label('name', name);     -- see the convention at the top
    p_owner text COLLATE "default" := lease._label('owner', owner);
    cur lease.lease_state;
    expiry timestamptz;
    holder lease.session_state;
    now_ts timestamptz;
    why text;
    new_expiry timestamptz;
BEGIN
    IF token IS NULL THEN
        PERFORM lease._fail('22004', 'pg_lease: token must not be NULL');
    END IF;
    -- The common case in one statement: held by owner with token, not
    -- released, alive on its own. The clock is read under the row lock (a
    -- lock wait re-evaluates the row, and both reads, after it), once for
    -- the check and once for the new bounds: the subquery refers to the row
    -- so that it runs per row, after the wait. `(… = p_owner) IS TRUE` (the
    -- same test: neither side is NULL) keeps the owner index out of the
    -- plan, which a table not yet analyzed would pick over the primary key.
    UPDATE lease.lease_state l
       SET (renewed_at, expires_at) = (SELECT c.t, c.t + ttl * interval '1 millisecond'
                                         FROM (SELECT clock_timestamp() AS t WHERE l.name IS NOT NULL) c)
     WHERE l.name = p_name AND (l.owner = p_owner) IS TRUE AND l.token = renew.token AND l.released_at IS NULL
       AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO new_expiry;
    IF FOUND THEN
        RETURN new_expiry;
    END IF;
    -- Otherwise judged as a whole: carried by the owner's session, or lost.
    SELECT * INTO cur FROM lease.lease_state l WHERE l.name = p_name FOR UPDATE;
    now_ts := clock_timestamp();
    expiry := cur.expires_at;
    IF cur.released_at IS NULL AND expiry <= now_ts AND cur.owner = p_owner THEN
        -- Maybe carried by the owner's session: judged under its lock, as in acquire.
        SELECT * INTO holder FROM lease.session_state s WHERE s.owner = cur.owner FOR SHARE;
        now_ts := clock_timestamp();
        expiry := lease._expiry(cur.expires_at, holder.live_since, holder.expires_at);
    END IF;
    why := CASE
        WHEN cur.name IS NULL THEN 'it never existed'
        WHEN cur.owner <> p_owner THEN format('it was taken by %s with token %s', cur.owner, cur.token)
        WHEN cur.token > renew.token THEN format('%s re-acquired it since, with token %s', cur.owner, cur.token)
        WHEN cur.token < renew.token THEN format('token %s was never issued for it (current token %s)', renew.token, cur.token)
        WHEN cur.released_at IS NOT NULL THEN format('it was released at %s', cur.released_at)
        WHEN expiry <= now_ts THEN format('it expired at %s, %s ago', expiry, date_trunc('millisecond', now_ts - expiry))
    END;
    IF why IS NOT NULL THEN
        PERFORM lease._raise('LeaseLost',
            format('%s no longer holds lease "%s" with token %s', renew.owner, renew.name, renew.token),
            format('Lease %s: %s.', renew.name, why));
    END IF;
    UPDATE lease.lease_state l SET renewed_at = now_ts, expires_at = now_ts + ttl * interval '1 millisecond'
     WHERE l.name = p_name
    RETURNING l.expires_at INTO new_expiry;
    RETURN new_expiry;
END $$;

CREATE OR REPLACE FUNCTION lease._beat(owner_id text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, taken boolean)
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ttl integer := lease._check_ttl(ttl_ms);
    p_owner text COLLATE "default" := lease._label('owner', owner_id);   -- see the convention at the top
    sess lease.session_state;
    now_ts timestamptz;
BEGIN
    -- Lock order, as in every lease function: lease rows, then session rows,
    -- then lost_leases.
    SELECT * INTO sess FROM lease.session_state s WHERE s.owner = p_owner FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
        VALUES (p_owner, '-infinity', '-infinity', '-infinity')
        ON CONFLICT (owner) DO NOTHING;
        SELECT * INTO sess FROM lease.session_state s WHERE s.owner = p_owner FOR UPDATE;
    END IF;
    now_ts := clock_timestamp();   -- read after the lock wait
    IF sess.expires_at <= now_ts THEN
        -- A first heartbeat, or the session lapsed: the leases it carried
        -- that are past their own expiry died with it. A new life begins now
        -- and carries only leases alive on their own, so these are reported
        -- this once. A lease an acquire, renew or release is changing right
        -- now is skipped, not waited for (a takeover waiting for this session
        -- row would deadlock): its change decides, a renew keeps it, a
        -- takeover reports it as taken at the next heartbeat.
        RETURN QUERY
        SELECT l.name, l.token, lease._expiry(l.expires_at, sess.live_since, sess.expires_at), false
          FROM lease.lease_state l
         WHERE l.owner = p_owner AND l.released_at IS NULL
           AND l.expires_at <= now_ts AND l.expires_at > sess.live_since
           FOR SHARE SKIP LOCKED;
        sess.live_since := now_ts;
    END IF;
    UPDATE lease.session_state s
       SET live_since = sess.live_since, renewed_at = now_ts, expires_at = now_ts + ttl * interval '1 millisecond'
     WHERE s.owner = p_owner;
    -- Takeovers, read after the session lock: one that committed while this
    -- heartbeat waited for it is reported now.
    RETURN QUERY
    DELETE FROM lease.lost_leases x WHERE x.owner = p_owner
    RETURNING x.name, x.token, NULL::timestamptz, true;
END $$;

CREATE OR REPLACE FUNCTION lease.release(name text, owner text, token bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now_ts timestamptz := clock_timestamp();
    p_name text COLLATE "default" := lease._label('name', name);     -- see the convention at the top
    p_owner text COLLATE "default" := lease._label('owner', owner);
    was_live boolean;
BEGIN
    -- An expired lease of this holder is marked released too (it stops being
    -- reported as lost), but only a live one counts as released by this call:
    -- alive on its own (its expiry is cut to now), or carried by its owner's
    -- session (its own expiry, kept, is after the session's start).
    -- (`IS TRUE`: by the primary key, as in lease.renew.)
    UPDATE lease.lease_state l SET released_at = now_ts, expires_at = least(l.expires_at, now_ts)
     WHERE l.name = p_name AND (l.owner = p_owner) IS TRUE AND l.token = release.token AND l.released_at IS NULL
    RETURNING l.expires_at = now_ts
              OR EXISTS (SELECT FROM lease.session_state s
                          WHERE s.owner = l.owner AND lease._expiry(l.expires_at, s.live_since, s.expires_at) > now_ts)
    INTO was_live;
    RETURN coalesce(was_live, false);
END $$;

CREATE OR REPLACE FUNCTION lease.release_all(owner text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    now_ts timestamptz := clock_timestamp();
    p_owner text COLLATE "default" := lease._label('owner', owner);   -- see the convention at the top
    released integer;
BEGIN
    WITH held AS (
        SELECT l.name, lease._expiry(l.expires_at, s.live_since, s.expires_at) > now_ts AS was_live
          FROM lease.lease_state l LEFT JOIN lease.session_state s ON s.owner = l.owner
         WHERE l.owner = p_owner AND l.released_at IS NULL FOR UPDATE OF l
    ), done AS (
        UPDATE lease.lease_state l SET released_at = now_ts, expires_at = least(l.expires_at, now_ts)
          FROM held WHERE l.name = held.name
        RETURNING held.was_live
    )
    SELECT count(*) FILTER (WHERE d.was_live) INTO released FROM done d;
    -- The process is going away: so does its session. Lock order, as in
    -- every lease function: lease rows, then session rows, then lost_leases.
    UPDATE lease.session_state s SET expires_at = now_ts WHERE s.owner = p_owner AND s.expires_at > now_ts;
    DELETE FROM lease.lost_leases x WHERE x.owner = p_owner;
    RETURN released;
END $$;

DROP FUNCTION lease._boundary_problem(regclass, jsonb, text, text);

-- Fences 0.5.0 let through that 0.6.0's owner-key rule refuses (an owner key
-- unique only in another collation or opclass, a key pair compared through a
-- session-dependent or converting `=`): say so now, not at the next DDL.
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT f.relid, f.problem FROM lease._fence_problems() f WHERE f.kind = 'constraint' LOOP
        RAISE WARNING 'pg_lease: 0.6.0 finds a problem with the fence on %: %', p.relid, p.problem
            USING HINT = 'Give the owner key a PRIMARY KEY or UNIQUE constraint in its own equality and collation (see lease.protected_tables).';
    END LOOP;
END $$;
