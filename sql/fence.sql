-- Fencing: protect/unprotect, the trigger functions, fenced_boundary_write,
-- the protected_tables view and the DDL guard.

-- Trigger functions, written in Rust (src/fence). They are plain version-1 C
-- functions so that their refusals reach clients with pg_lease's own SQLSTATEs.
CREATE FUNCTION lease.fence_trigger() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_fence_trigger';
CREATE FUNCTION lease.owner_guard() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_owner_guard';
CREATE FUNCTION lease.truncate_guard() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_truncate_guard';

-- Raises one of pg_lease's LF errors by name (src/errors.rs), for our PL/pgSQL.
CREATE FUNCTION lease._raise(name text, summary text, detail text) RETURNS void
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_raise';

-- Binds the writer's fencing token to the current transaction, for tables
-- protected without a token column (and for DELETE).
CREATE FUNCTION lease.bind_token(token bigint) RETURNS bigint
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION 'lease.bind_token: token must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF token < 0 THEN
        RAISE EXCEPTION 'lease.bind_token: token must not be negative (got %)', token
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('pg_lease.token', token::text, true);
    RETURN token;
END $$;
COMMENT ON FUNCTION lease.bind_token(bigint) IS 'Binds the fencing token presented by this transaction''s writes (same as SET LOCAL pg_lease.token).';

-- The token bound to the current transaction, or NULL (since 0.2.0).
CREATE FUNCTION lease.bound_token() RETURNS bigint
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
    RETURN nullif(current_setting('pg_lease.token', true), '')::bigint;
COMMENT ON FUNCTION lease.bound_token() IS 'The fencing token bound to this transaction by lease.bind_token, or NULL.';

-- The type of a live column, or NULL.
CREATE FUNCTION lease._column_type(rel regclass, col text) RETURNS regtype
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.atttypid::regtype FROM pg_attribute a
     WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- Checks a table and its columns before protect*(), with standard SQLSTATEs.
CREATE FUNCTION lease._check_columns(rel regclass, role text, columns text[], token_column text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    kind "char";
    col text;
BEGIN
    IF rel IS NULL THEN
        RAISE EXCEPTION 'pg_lease: the % must not be NULL', role USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = rel;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'pg_lease: % % is not a table', role, rel
            USING ERRCODE = 'wrong_object_type',
                  DETAIL = 'Only ordinary and partitioned tables can be fenced (not views, foreign tables or other relations).';
    END IF;
    IF columns IS NULL OR cardinality(columns) = 0 OR array_position(columns, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: the key columns of % must be a non-empty list of column names', rel
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT c) FROM unnest(columns) c) <> cardinality(columns) THEN
        RAISE EXCEPTION 'pg_lease: key columns of % are listed twice: %', rel, columns
            USING ERRCODE = 'duplicate_column';
    END IF;
    FOREACH col IN ARRAY columns LOOP
        IF lease._column_type(rel, col) IS NULL THEN
            RAISE EXCEPTION 'pg_lease: column "%" of % does not exist', col, rel USING ERRCODE = 'undefined_column';
        END IF;
    END LOOP;
    IF token_column IS NOT NULL THEN
        IF lease._column_type(rel, token_column) IS NULL THEN
            RAISE EXCEPTION 'pg_lease: token column "%" of % does not exist', token_column, rel
                USING ERRCODE = 'undefined_column';
        END IF;
        IF lease._column_type(rel, token_column) NOT IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype) THEN
            RAISE EXCEPTION 'pg_lease: token column "%" of % has type %, not bigint',
                    token_column, rel, lease._column_type(rel, token_column)
                USING ERRCODE = 'datatype_mismatch';
        END IF;
        IF token_column = ANY (columns) THEN
            RAISE EXCEPTION 'pg_lease: token column "%" of % cannot also be a key column', token_column, rel
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END $$;

-- Refuses to fence a table already fenced directly or through a partition tree.
CREATE FUNCTION lease._check_not_protected(target regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    existing regclass;
BEGIN
    SELECT p.relid INTO existing FROM lease.protected p
     WHERE p.relid = target
        OR p.relid::oid IN (SELECT a.relid FROM pg_partition_ancestors(target) a)
        OR p.relid::oid IN (SELECT t.relid FROM pg_partition_tree(target) t);
    IF existing IS NOT NULL THEN
        RAISE EXCEPTION 'pg_lease: % is already protected%', target,
                CASE WHEN existing = target THEN '' ELSE format(' (through %s)', existing) END
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Call lease.unprotect first to change how a table is fenced.';
    END IF;
END $$;

-- Creates the row fence and the TRUNCATE guards on a target, firing ALWAYS
-- (also under session_replication_role = replica and logical replication).
-- Row triggers on a partitioned table are cloned to its partitions by
-- Postgres; statement-level TRUNCATE triggers are not, so each partition gets
-- its own (new partitions get theirs from the DDL guard below).
CREATE FUNCTION lease._install_target_triggers(target regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON %s
                    FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger()', target);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER pg_lease_fence', target);
    PERFORM lease._install_truncate_guard(t.relid) FROM pg_partition_tree(target) t WHERE t.relid <> target;
    PERFORM lease._install_truncate_guard(target);
END $$;

CREATE FUNCTION lease._install_truncate_guard(rel regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('CREATE TRIGGER pg_lease_truncate BEFORE TRUNCATE ON %s
                    FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard(''target'')', rel);
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER pg_lease_truncate', rel);
END $$;

CREATE FUNCTION lease.protect(
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
    guard_args text;
    existing_guard text;
BEGIN
    PERFORM lease._check_columns(target, 'target table', key_columns, token_column);
    PERFORM lease._check_not_protected(target);
    IF owner IS NULL THEN
        owner := pg_catalog.to_regclass('tables');
        IF owner IS NULL THEN
            RAISE EXCEPTION 'pg_lease: owner table "tables" does not exist'
                USING ERRCODE = 'undefined_table',
                      HINT = 'Pass owner_table => ''your_schema.your_owner_table''.';
        END IF;
    END IF;
    IF owner OPERATOR(pg_catalog.=) target THEN
        RAISE EXCEPTION 'pg_lease: % cannot be its own owner table', target USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF owner_token_column IS NULL THEN
        RAISE EXCEPTION 'pg_lease: owner_token_column must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM lease._check_columns(owner, 'owner table', owner_key_columns, owner_token_column);
    IF pg_catalog.cardinality(owner_key_columns) OPERATOR(pg_catalog.<>) pg_catalog.cardinality(key_columns) THEN
        RAISE EXCEPTION 'pg_lease: % key columns % do not pair with owner key columns %', target, key_columns, owner_key_columns
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index x
         WHERE x.indrelid OPERATOR(pg_catalog.=) owner AND x.indisunique AND x.indpred IS NULL AND x.indexprs IS NULL
           AND (SELECT pg_catalog.array_agg(k ORDER BY k) FROM pg_catalog.unnest((x.indkey::pg_catalog.int2[])[0:x.indnkeyatts - 1]) k)
               OPERATOR(pg_catalog.=)
               (SELECT pg_catalog.array_agg(a.attnum ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid OPERATOR(pg_catalog.=) owner AND a.attname OPERATOR(pg_catalog.=) ANY (owner_key_columns)))
    THEN
        RAISE EXCEPTION 'pg_lease: there is no unique constraint matching key columns % of owner table %', owner_key_columns, owner
            USING ERRCODE = 'invalid_foreign_key',
                  DETAIL = 'Each fenced row must match exactly one owner row.';
    END IF;
    -- Each key pair must be comparable (raises undefined_function otherwise).
    EXECUTE pg_catalog.format('SELECT 1 FROM %s o WHERE %s LIMIT 0', owner,
        (SELECT pg_catalog.string_agg(pg_catalog.format('o.%I OPERATOR(pg_catalog.=) NULL::%s', owner_key_columns[n],
                                         lease._column_type(target, key_columns[n])), ' AND ')
           FROM pg_catalog.generate_series(1, pg_catalog.cardinality(key_columns)) n));

    -- One owner guard per owner table, shared by every table fenced against it.
    SELECT pg_catalog.encode(t.tgargs, 'escape') INTO existing_guard FROM pg_catalog.pg_trigger t
     WHERE t.tgrelid OPERATOR(pg_catalog.=) owner AND t.tgname OPERATOR(pg_catalog.=) 'pg_lease_owner_guard' AND NOT t.tgisinternal;
    IF existing_guard IS NULL THEN
        guard_args := pg_catalog.quote_literal(owner_token_column);
        FOR i IN 1 .. pg_catalog.cardinality(owner_key_columns) LOOP
            guard_args := guard_args OPERATOR(pg_catalog.||) ', ' OPERATOR(pg_catalog.||) pg_catalog.quote_literal(owner_key_columns[i]);
        END LOOP;
        EXECUTE pg_catalog.format('CREATE TRIGGER pg_lease_owner_guard BEFORE UPDATE ON %s
                                   FOR EACH ROW EXECUTE FUNCTION lease.owner_guard(%s)', owner, guard_args);
        EXECUTE pg_catalog.format('CREATE TRIGGER pg_lease_owner_truncate BEFORE TRUNCATE ON %s
                                   FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard(''owner'')', owner);
        EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER pg_lease_owner_guard, ENABLE ALWAYS TRIGGER pg_lease_owner_truncate', owner);
    ELSIF pg_catalog.split_part(existing_guard, E'\\000', 1) OPERATOR(pg_catalog.<>) owner_token_column THEN
        RAISE EXCEPTION 'pg_lease: owner table % already guards token column "%"', owner, pg_catalog.split_part(existing_guard, E'\\000', 1)
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'All tables fenced against one owner table must use the same owner token column.';
    END IF;

    PERFORM lease._install_target_triggers(target);
    INSERT INTO lease.protected (relid, mode, key_columns, token_column, owner_table, owner_key_columns, owner_token_column)
    VALUES (target, 'owner', key_columns, token_column, owner, owner_key_columns, owner_token_column);
END $$;
COMMENT ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) IS
    'Fences writes to target: each row''s token must equal its owner row''s current token.';

CREATE FUNCTION lease.protect_high_water(target regclass, key_columns text[], token_column name DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lease._check_columns(target, 'target table', key_columns, token_column);
    PERFORM lease._check_not_protected(target);
    PERFORM lease._install_target_triggers(target);
    INSERT INTO lease.protected (relid, mode, key_columns, token_column)
    VALUES (target, 'high_water', key_columns, token_column);
END $$;
COMMENT ON FUNCTION lease.protect_high_water(regclass, text[], name) IS
    'Fences writes to target against the highest token ever accepted per resource.';

CREATE FUNCTION lease.unprotect(target regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p lease.protected;
    part regclass;
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'lease.unprotect: target must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Forget the config first: the DDL guard then no longer expects the triggers.
    DELETE FROM lease.protected WHERE relid = target RETURNING * INTO p;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pg_lease: % is not protected', target USING ERRCODE = 'undefined_object';
    END IF;
    EXECUTE format('DROP TRIGGER pg_lease_fence ON %s', target);
    FOR part IN SELECT t.relid FROM pg_partition_tree(target) t UNION SELECT target LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_truncate ON %s', part);
    END LOOP;
    IF p.owner_table IS NOT NULL AND NOT EXISTS (SELECT 1 FROM lease.protected o WHERE o.owner_table = p.owner_table) THEN
        EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_owner_guard ON %s', p.owner_table);
        EXECUTE format('DROP TRIGGER IF EXISTS pg_lease_owner_truncate ON %s', p.owner_table);
    END IF;
END $$;
COMMENT ON FUNCTION lease.unprotect(regclass) IS 'Removes pg_lease''s fence from target (high-water marks are kept).';

-- Every way in which a protected table's fence is not fully in force, with
-- the tables it concerns. kind: 'missing' (a trigger is absent), 'disabled'
-- (present but not ENABLE ALWAYS), 'renamed' (one of our trigger functions
-- under another name), 'column' (a fenced column is gone or retyped).
CREATE FUNCTION lease._fence_problems()
RETURNS TABLE (relid regclass, rel regclass, kind text, problem text)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH p AS (
        SELECT * FROM lease.protected p WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p.relid)
    ),
    -- A table and, when partitioned, every partition (pg_partition_tree
    -- returns nothing for a table that is not in a partition tree).
    roots (r) AS (SELECT relid::oid FROM p UNION SELECT owner_table::oid FROM p WHERE owner_table IS NOT NULL),
    tree (root, rel) AS (
        SELECT r, r FROM roots
        UNION
        SELECT roots.r, t.relid FROM roots, pg_partition_tree(roots.r) t
    ),
    expected_triggers (relid, rel, tgname, func) AS (
        SELECT p.relid, t.rel, 'pg_lease_fence', 'lease.fence_trigger'::regproc
          FROM p JOIN tree t ON t.root = p.relid::oid
        UNION ALL
        SELECT p.relid, t.rel, 'pg_lease_truncate', 'lease.truncate_guard'::regproc
          FROM p JOIN tree t ON t.root = p.relid::oid
        UNION ALL
        SELECT p.relid, t.rel, 'pg_lease_owner_guard', 'lease.owner_guard'::regproc
          FROM p JOIN tree t ON t.root = p.owner_table::oid
        UNION ALL
        SELECT p.relid, p.owner_table::oid, 'pg_lease_owner_truncate', 'lease.truncate_guard'::regproc
          FROM p WHERE p.owner_table IS NOT NULL
    ),
    expected_columns (relid, rel, col, is_token) AS (
        SELECT p.relid, p.relid, k, false FROM p, unnest(p.key_columns) k
        UNION ALL
        SELECT p.relid, p.relid, p.token_column, true FROM p WHERE p.token_column IS NOT NULL
        UNION ALL
        SELECT p.relid, p.owner_table, k, false FROM p, unnest(p.owner_key_columns) k WHERE p.owner_table IS NOT NULL
        UNION ALL
        SELECT p.relid, p.owner_table, p.owner_token_column, true FROM p WHERE p.owner_table IS NOT NULL
    )
    SELECT e.relid::regclass, e.rel::regclass,
           CASE WHEN t.oid IS NULL THEN 'missing' ELSE 'disabled' END,
           format('trigger %s on %s is %s', e.tgname, e.rel::regclass,
                  CASE WHEN t.oid IS NULL THEN 'missing' ELSE 'not ENABLE ALWAYS' END)
      FROM expected_triggers e
      LEFT JOIN pg_trigger t ON t.tgrelid = e.rel AND t.tgname = e.tgname AND t.tgfoid = e.func
     WHERE t.oid IS NULL OR t.tgenabled <> 'A'
    UNION ALL
    SELECT DISTINCT e.relid::regclass, t.tgrelid::regclass, 'renamed',
           format('trigger %s on %s runs %s under another name', t.tgname, t.tgrelid::regclass, t.tgfoid::regproc)
      FROM expected_triggers e
      JOIN pg_trigger t ON t.tgrelid = e.rel AND t.tgfoid = e.func
     WHERE NOT EXISTS (SELECT 1 FROM expected_triggers x WHERE x.rel = t.tgrelid AND x.tgname = t.tgname)
    UNION ALL
    SELECT e.relid, e.rel, 'column',
           format('%s column "%s" of %s is %s', CASE WHEN e.is_token THEN 'token' ELSE 'key' END, e.col, e.rel,
                  CASE WHEN lease._column_type(e.rel, e.col) IS NULL THEN 'missing'
                       ELSE 'of type ' || lease._column_type(e.rel, e.col)::text END)
      FROM expected_columns e
     WHERE lease._column_type(e.rel, e.col) IS NULL
        OR (e.is_token AND lease._column_type(e.rel, e.col) NOT IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype))
$$;

CREATE VIEW lease.protected_tables AS
SELECT p.relid              AS table_name,
       p.mode,
       p.key_columns,
       CASE WHEN p.token_column IS NULL THEN 'bound' ELSE 'column' END AS token_source,
       p.token_column,
       p.owner_table,
       p.owner_key_columns,
       p.owner_token_column,
       (SELECT count(*) FROM pg_catalog.pg_partition_tree(p.relid) t WHERE t.relid OPERATOR(pg_catalog.<>) p.relid::oid)::int AS partitions,
       NOT EXISTS (SELECT 1 FROM lease._fence_problems() f WHERE f.relid OPERATOR(pg_catalog.=) p.relid) AS enforced,
       (SELECT pg_catalog.array_agg(f.problem ORDER BY f.problem) FROM lease._fence_problems() f
         WHERE f.relid OPERATOR(pg_catalog.=) p.relid) AS problems,
       p.protected_at,
       p.protected_by
  FROM lease.protected p;
COMMENT ON VIEW lease.protected_tables IS 'What pg_lease protects and how; enforced = every trigger and column in place, problems = what is not.';

-- DDL guard, after ALTER TABLE / ALTER TRIGGER / CREATE TABLE: refuses a
-- command that leaves a pg_lease trigger disabled or renamed, or a fenced
-- column gone or retyped, on a table the command touched. (Dropped triggers and
-- columns are caught by the sql_drop guard below. Judging only what exists,
-- never what is still absent, keeps pg_restore working: it creates each
-- trigger and enables it ALWAYS before the next one exists.)
CREATE FUNCTION lease._guard_ddl() RETURNS event_trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    touched oid[];
    broken record;
BEGIN
    SELECT array_agg(DISTINCT CASE WHEN c.classid = 'pg_trigger'::regclass
                                   THEN (SELECT t.tgrelid FROM pg_trigger t WHERE t.oid = c.objid)
                                   ELSE c.objid END)
      INTO touched
      FROM pg_event_trigger_ddl_commands() c
     WHERE c.classid IN ('pg_class'::regclass, 'pg_trigger'::regclass);
    IF touched IS NULL THEN
        RETURN;
    END IF;
    -- Partitions created, or attached by this transaction, under a protected
    -- table get the row fence cloned by Postgres, but not the statement-level
    -- TRUNCATE guard: add it. (Not while the root's fence is itself being
    -- created in this transaction, as in a single-transaction pg_restore that
    -- will create the guards from the dump.)
    PERFORM lease._install_truncate_guard(t.relid)
       FROM lease.protected p
       JOIN pg_partition_tree(p.relid) t ON t.relid <> p.relid::oid
       JOIN pg_inherits i ON i.inhrelid = t.relid
      WHERE (t.relid = ANY (touched) OR i.inhparent = ANY (touched))
        AND i.xmin = xid(pg_current_xact_id())
        AND NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = t.relid AND g.tgname = 'pg_lease_truncate')
        AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = p.relid AND g.tgname = 'pg_lease_fence'
                       AND g.xmin <> xid(pg_current_xact_id()));
    SELECT f.* INTO broken
      FROM lease._fence_problems() f
     WHERE f.kind <> 'missing'
       AND (f.rel::oid = ANY (touched)
            OR EXISTS (SELECT 1 FROM pg_partition_ancestors(f.rel) a WHERE a.relid = ANY (touched)))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would leave the fence on %s incomplete', tg_tag, broken.relid),
            format('Table %s: %s.', broken.relid, broken.problem));
    END IF;
END $$;

-- sql_drop guard. DROP TABLE of a fenced table removes its fence with it.
-- Dropping one of pg_lease's triggers or a fenced column of a table that stays,
-- or an owner table that fenced tables still point at, is refused.
CREATE FUNCTION lease._guard_drop() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped_tables oid[] := ARRAY(SELECT d.objid FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'table');
    orphan record;
    victim record;
BEGIN
    DELETE FROM lease.protected p WHERE p.relid::oid = ANY (dropped_tables);
    DELETE FROM lease.high_water h WHERE h.target::oid = ANY (dropped_tables);
    SELECT p.relid, p.owner_table INTO orphan FROM lease.protected p WHERE p.owner_table::oid = ANY (dropped_tables) LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would drop owner table %s of fenced table %s', tg_tag, orphan.owner_table, orphan.relid),
            format('Table %s is fenced against the owner rows of %s.', orphan.relid, orphan.owner_table));
    END IF;
    -- Triggers and columns: address_names is {schema, table, trigger or column}.
    SELECT d.object_type, d.object_identity, f.relid INTO victim
      FROM pg_event_trigger_dropped_objects() d
      CROSS JOIN LATERAL (SELECT to_regclass(format('%I.%I', d.address_names[1], d.address_names[2])) AS rel) r
      JOIN lease._fence_problems() f ON f.rel = r.rel
     WHERE d.object_type IN ('trigger', 'table column')
       AND NOT (r.rel::oid = ANY (dropped_tables))
       AND ((d.object_type = 'trigger' AND f.kind = 'missing'
             AND f.problem LIKE format('trigger %s on %%', quote_ident(d.address_names[3])))
         OR (d.object_type = 'table column' AND f.kind = 'column'))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('dropping %s %s would leave the fence on %s incomplete', victim.object_type, victim.object_identity, victim.relid),
            format('pg_lease fences %s with it.', victim.relid));
    END IF;
END $$;

CREATE EVENT TRIGGER pg_lease_guard_ddl ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER TRIGGER', 'CREATE TABLE')
    EXECUTE FUNCTION lease._guard_ddl();
CREATE EVENT TRIGGER pg_lease_guard_drop ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP TRIGGER', 'ALTER TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION lease._guard_drop();

-- The hand-boundary write: inserts a JSON array of row objects into a
-- protected table under one fencing token, all or nothing.
CREATE FUNCTION lease.fenced_boundary_write(target regclass, token bigint, rows jsonb) RETURNS bigint
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cfg lease.protected;
    bad text;
    batch record;
    columns text;
    inserted bigint;
    total bigint := 0;
    previous_token text;
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: target must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO cfg FROM lease.protected p WHERE p.relid = target;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: % is not protected by pg_lease', target
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Protect it first with lease.protect() or lease.protect_high_water().';
    END IF;
    IF token IS NULL THEN
        PERFORM lease._raise('MissingFencingToken',
            format('fenced_boundary_write on %s presents no fencing token', target),
            format('Table %s, presented token none.', target));
    END IF;
    IF token < 0 THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: token must not be negative (got %)', token
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF rows IS NULL OR jsonb_typeof(rows) <> 'array' THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: rows must be a JSON array of objects, got %',
                coalesce(jsonb_typeof(rows), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT format('element %s is %s', n - 1, jsonb_typeof(e)) INTO bad
      FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n) WHERE jsonb_typeof(e) <> 'object' LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: rows must be a JSON array of objects: %', bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT string_agg(DISTINCT format('%I', k), ', ') INTO bad
      FROM jsonb_array_elements(rows) e, jsonb_object_keys(e) k
     WHERE lease._column_type(target, k) IS NULL;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'lease.fenced_boundary_write: % has no column(s) %', target, bad USING ERRCODE = 'undefined_column';
    END IF;

    IF cfg.token_column IS NOT NULL THEN
        SELECT format('element %s carries %s = %s', n - 1, cfg.token_column, e -> cfg.token_column) INTO bad
          FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n)
         WHERE e ? cfg.token_column AND e -> cfg.token_column IS DISTINCT FROM to_jsonb(token) LIMIT 1;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'lease.fenced_boundary_write: a row contradicts the call''s token %: %', token, bad
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        rows := (SELECT jsonb_agg(e || jsonb_build_object(cfg.token_column, token) ORDER BY n)
                   FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n));
    ELSE
        previous_token := current_setting('pg_lease.token', true);
        PERFORM set_config('pg_lease.token', token::text, true);
    END IF;

    -- Rows are inserted in groups with the same keys, so that a column an
    -- object leaves out takes its default rather than NULL.
    FOR batch IN
        SELECT keys, jsonb_agg(e ORDER BY n) AS objects
          FROM (SELECT e, n, ARRAY(SELECT jsonb_object_keys(e) ORDER BY 1) AS keys
                  FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n)) s
         GROUP BY keys ORDER BY min(n)
    LOOP
        IF cardinality(batch.keys) = 0 THEN
            EXECUTE format('INSERT INTO %s SELECT FROM jsonb_array_elements($1)', target) USING batch.objects;
        ELSE
            SELECT string_agg(format('%I', k), ', ') INTO columns FROM unnest(batch.keys) k;
            EXECUTE format('INSERT INTO %s (%s) SELECT %s FROM jsonb_populate_recordset(NULL::%s, $1)',
                           target, columns, columns, target)
                USING batch.objects;
        END IF;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        total := total + inserted;
    END LOOP;

    IF cfg.token_column IS NULL THEN
        PERFORM set_config('pg_lease.token', coalesce(previous_token, ''), true);
    END IF;
    RETURN total;
END $$;
COMMENT ON FUNCTION lease.fenced_boundary_write(regclass, bigint, jsonb) IS
    'Inserts a JSON array of rows into a protected table under one fencing token; all or nothing; returns the row count.';

GRANT USAGE ON SCHEMA lease TO PUBLIC;
