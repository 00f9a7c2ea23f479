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
