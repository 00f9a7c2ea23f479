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
-- The columns an ALTER TABLE command retyped (src/fence/ddl.rs), for the DDL guard.
CREATE FUNCTION lease._retyped_columns(command pg_ddl_command) RETURNS text[]
    LANGUAGE C STRICT AS 'MODULE_PATHNAME', 'pg_lease_retyped_columns';
REVOKE EXECUTE ON FUNCTION lease._retyped_columns(pg_ddl_command) FROM PUBLIC;
-- True the first time the DDL guard asks about a pg_inherits row version in
-- a transaction (src/fence/ddl.rs): each join is judged once.
CREATE FUNCTION lease._first_judgment(xmin xid, ctid tid) RETURNS boolean
    LANGUAGE C STRICT AS 'MODULE_PATHNAME', 'pg_lease_first_judgment';
REVOKE EXECUTE ON FUNCTION lease._first_judgment(xid, tid) FROM PUBLIC;
-- Whether a catalog row's xmin is this transaction's, its subtransactions'
-- included (src/fence/ddl.rs), for the DDL guard.
CREATE FUNCTION lease._this_transaction(xmin xid) RETURNS boolean
    LANGUAGE C STRICT STABLE AS 'MODULE_PATHNAME', 'pg_lease_this_transaction';
REVOKE EXECUTE ON FUNCTION lease._this_transaction(xid) FROM PUBLIC;
CREATE FUNCTION lease._protected_here(ctid tid) RETURNS boolean
    LANGUAGE C STRICT STABLE AS 'MODULE_PATHNAME', 'pg_lease_protected_here';
REVOKE EXECUTE ON FUNCTION lease._protected_here(tid) FROM PUBLIC;
-- DDL guard for what must be refused before a command commits anything (src/fence/ddl.rs).
CREATE FUNCTION lease._guard_ddl_start() RETURNS event_trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_guard_ddl_start';
REVOKE EXECUTE ON FUNCTION lease._exists_as_owner(oid, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease._fresh_catalog(text, oid[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease._exists_latest(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease._internal_ddl(boolean), lease._in_internal_ddl() FROM PUBLIC;

-- Raises one of pg_lease's LF errors by name (src/errors.rs), for our PL/pgSQL.
-- Internal: only pg_lease's own SECURITY DEFINER functions call it.
CREATE FUNCTION lease._raise(name text, summary text, detail text) RETURNS void
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_raise';
REVOKE EXECUTE ON FUNCTION lease._raise(text, text, text) FROM PUBLIC;

-- Raises an error with a standard SQLSTATE, without CONTEXT lines: how
-- pg_lease's own PL/pgSQL reports bad input (a RAISE would show the caller
-- pg_lease's internal frames).
CREATE FUNCTION lease._fail(sqlstate text, message text, detail text DEFAULT NULL, hint text DEFAULT NULL)
RETURNS void LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_fail';
COMMENT ON FUNCTION lease._fail(text, text, text, text) IS
    'Raises an ERROR with this SQLSTATE, message, detail and hint and no CONTEXT (internal; anyone may raise errors).';

-- Binds the writer's fencing token to the current transaction, for tables
-- protected without a token column (and for DELETE).
CREATE FUNCTION lease.bind_token(token bigint) RETURNS bigint
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF token IS NULL THEN
        PERFORM lease._fail('22004', 'lease.bind_token: token must not be NULL');
    END IF;
    IF token < 0 THEN
        PERFORM lease._fail('22023', format('lease.bind_token: token must not be negative (got %s)', token));
    END IF;
    -- As a SET LOCAL statement, which Citus sends on to the nodes that hold
    -- the shards this transaction writes (with citus.propagate_set_commands
    -- = 'local', set here for this transaction when Citus is loaded; a
    -- binding must count wherever the fence judges the writes).
    IF pg_catalog.current_setting('citus.propagate_set_commands', true) IS NOT NULL
       AND pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NOT NULL THEN
        SET LOCAL citus.propagate_set_commands = 'local';
    END IF;
    EXECUTE format('SET LOCAL pg_lease.token = %L', token);
    RETURN token;
END $$;
COMMENT ON FUNCTION lease.bind_token(bigint) IS 'Binds the fencing token presented by this transaction''s writes (same as SET LOCAL pg_lease.token).';

-- The token bound to the current transaction, or NULL (since 0.2.0).
CREATE FUNCTION lease.bound_token() RETURNS bigint
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
    RETURN lease._bound_token();
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
        PERFORM lease._fail('22004', format('pg_lease: the %s must not be NULL', role));
    END IF;
    SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = rel;
    IF kind IS NULL THEN
        PERFORM lease._fail('42P01', format('pg_lease: there is no table with OID %s (the %s)', rel::oid, role));
    END IF;
    IF kind NOT IN ('r', 'p') THEN
        PERFORM lease._fail('42809', format('pg_lease: %s %s is not a table', role, rel), 'Only ordinary and partitioned tables can be fenced (not views, foreign tables or other relations).');
    END IF;
    SELECT t.relid INTO col FROM pg_partition_tree(rel) t JOIN pg_class c ON c.oid = t.relid WHERE c.relkind = 'f' LIMIT 1;
    IF FOUND THEN
        PERFORM lease._fail('42809', format('pg_lease: partition %s of %s %s is a foreign table', col::regclass, role, rel),
            'Rows of a foreign table are written on another server, where pg_lease cannot see them. Detach it first.');
    END IF;
    IF columns IS NULL OR cardinality(columns) = 0 OR array_position(columns, NULL) IS NOT NULL THEN
        PERFORM lease._fail('22023', format('pg_lease: %s must be a non-empty list of column names (the key columns of %s %s)',
                                            CASE role WHEN 'owner table' THEN 'owner_key_columns' ELSE 'key_columns' END, role, rel));
    END IF;
    IF (SELECT count(DISTINCT c) FROM unnest(columns) c) <> cardinality(columns) THEN
        PERFORM lease._fail('42701', format('pg_lease: key columns of %s are listed twice: %s', rel, columns));
    END IF;
    FOREACH col IN ARRAY columns || CASE WHEN token_column IS NULL THEN '{}'::text[] ELSE ARRAY[token_column] END LOOP
        IF lease._column_type(rel, col) IS NULL THEN
            PERFORM lease._fail('42703', format('pg_lease: %s column "%s" of %s does not exist', CASE WHEN col = token_column THEN 'token' ELSE 'key' END, col, rel));
        END IF;
        -- BEFORE triggers see a generated column's old value: it cannot be fenced.
        IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = col AND a.attgenerated <> '') THEN
            PERFORM lease._fail('42611', format('pg_lease: column "%s" of %s is a generated column', col, rel), 'Generated columns are computed after BEFORE triggers, so the fence would judge the old value.');
        END IF;
        -- Tokens are written by lease.acquire and presented by writers.
        IF col = token_column AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = col AND a.attidentity = 'a') THEN
            PERFORM lease._fail('42611', format('pg_lease: token column "%s" of %s is an identity column GENERATED ALWAYS', col, rel), 'Fencing tokens are written by lease.acquire and presented by writers; a column GENERATED ALWAYS AS IDENTITY takes neither. Use GENERATED BY DEFAULT, or a plain bigint column.');
        END IF;
    END LOOP;
    IF token_column IS NOT NULL THEN
        -- Lease tokens are >= 2^40: only bigint holds them.
        IF lease._column_type(rel, token_column) <> 'bigint'::regtype THEN
            PERFORM lease._fail('42804', format('pg_lease: token column "%s" of %s has type %s, not bigint', token_column, rel, lease._column_type(rel, token_column)));
        END IF;
        IF token_column = ANY (columns) THEN
            PERFORM lease._fail('22023', format('pg_lease: token column "%s" of %s cannot also be a key column', token_column, rel));
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
        PERFORM lease._fail('42710', format('pg_lease: %s is already protected%s', target, CASE WHEN existing = target THEN '' ELSE format(' (through %s)', existing) END), NULL, 'Call lease.unprotect first to change how a table is fenced.');
    END IF;
    -- Nor an owner table: its rows are the tokens, written by lease.acquire.
    SELECT p.relid INTO existing FROM lease.protected p WHERE p.owner_table = target LIMIT 1;
    IF existing IS NOT NULL THEN
        PERFORM lease._fail('0A000', format('pg_lease: %s is the owner table of fenced table %s and cannot be fenced itself', target, existing),
            'A table is either fenced or an owner table, not both.');
    END IF;
END $$;

-- Creates the row fence and the TRUNCATE guards on a target, firing ALWAYS
-- (also under session_replication_role = replica and logical replication).
-- Row triggers on a partitioned table are cloned to its partitions by
-- Postgres; statement-level TRUNCATE triggers are not, so each partition gets
-- its own (new partitions get theirs from the DDL guard below).
-- Creates one of pg_lease's triggers, ENABLE ALWAYS. A trigger of that name
-- that runs the same function is taken over (CREATE OR REPLACE): what a
-- schema-only dump and restore leaves, since the protection config is data.
-- One of that name running anything else is refused.
-- Citus (README, "Scale out with Citus"): how Citus distributes rel, when
-- Citus is installed and manages it. kind: 'distributed' (by hash of
-- dist_column), 'reference', or 'other' (a Citus local, single-shard,
-- append- or range-distributed table, or one whose shards Citus replicates
-- itself: citus.shard_replication_factor > 1); all NULL otherwise.
CREATE FUNCTION lease._citus_table(rel regclass, OUT kind text, OUT dist_column text, OUT colocation integer)
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF rel IS NULL OR pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN;
    END IF;
    -- Dynamic: pg_lease does not depend on Citus.
    EXECUTE $q$SELECT CASE WHEN d.partmethod = 'h' AND d.repmodel <> 'c' THEN 'distributed'
                           WHEN d.partmethod = 'n' AND d.repmodel = 't' THEN 'reference'
                           ELSE 'other' END,
                      CASE WHEN d.partmethod = 'h' THEN pg_catalog.column_to_column_name(d.logicalrelid, d.partkey) END,
                      d.colocationid
                 FROM pg_catalog.pg_dist_partition d WHERE d.logicalrelid = $1$q$
       INTO kind, dist_column, colocation USING rel;
END $$;

-- How a refusal names a kind of lease._citus_table.
CREATE FUNCTION lease._citus_kind(kind text) RETURNS text
    LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE kind WHEN 'distributed' THEN 'Citus distributed' WHEN 'reference' THEN 'Citus reference'
                     ELSE 'Citus local, single-shard, append- or range-distributed or statement-replicated' END
$$;

-- Refuses (0A000) a fence the shards of Citus tables could not enforce on
-- their own node: the row trigger runs on a shard and finds the owner row in
-- the owner table's shard on the same node, so the owner table must be
-- distributed by the owner key column paired with the fenced table's
-- distribution column and co-located with it, or be a reference table.
-- High-water marks are kept per node, and shards move: refused too.
CREATE FUNCTION lease._check_citus_layout(target regclass, key_columns text[], owner regclass, owner_key_columns text[])
RETURNS void LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
    o record;
    i integer;
    rule constant text := 'pg_lease finds a row''s owner row on the node that holds the row: the owner table must be distributed by the owner key column paired with the fenced table''s distribution column and co-located with it, or be a reference table.';
BEGIN
    t := lease._citus_table(target);
    o := lease._citus_table(owner);
    IF t.kind IS NULL AND (owner IS NULL OR o.kind IS NULL) THEN
        RETURN;
    END IF;
    IF owner IS NULL THEN
        PERFORM lease._fail('0A000', format('pg_lease: cannot fence Citus table %s by high-water marks', target),
            'High-water marks are kept by each node, and Citus moves shards between nodes: a mark would stay behind on the node a shard left.',
            'Fence it against an owner table distributed by the same key and co-located with it, or a reference table (lease.protect).');
    END IF;
    IF 'p' IN (SELECT c.relkind FROM pg_class c WHERE c.oid IN (target, owner)) THEN
        PERFORM lease._fail('0A000', format('pg_lease: cannot fence %s against %s: pg_lease does not fence partitioned Citus tables', target, owner));
    END IF;
    IF t.kind IS NULL THEN
        PERFORM lease._fail('0A000',
            format('pg_lease: cannot fence %s against %s: the owner rows are not co-located with the rows they fence', target, owner),
            format('%s is a %s table, and %s is not distributed: its rows stay on this node. %s', owner, lease._citus_kind(o.kind), target, rule),
            format('Distribute %s by its key column, co-located with %s (create_distributed_table(..., colocate_with => ''%s'')).', target, owner, owner));
    END IF;
    IF t.kind = 'other' OR (t.kind = 'reference' AND o.kind IS DISTINCT FROM 'reference') THEN
        PERFORM lease._fail('0A000',
            format('pg_lease: cannot fence %s against %s: the owner rows are not co-located with the rows they fence', target, owner),
            format('%s is a %s table and %s %s. %s', target, lease._citus_kind(t.kind), owner,
                   CASE WHEN o.kind IS NULL THEN 'is not distributed' ELSE 'is a ' || lease._citus_kind(o.kind) || ' table' END, rule),
            CASE WHEN t.kind = 'reference' THEN format('Make %s a reference table too.', owner)
                 ELSE 'Distribute it by hash on a key column (create_distributed_table).' END);
    END IF;
    IF t.kind = 'reference' OR o.kind = 'reference' THEN
        RETURN;
    END IF;
    i := pg_catalog.array_position(key_columns, t.dist_column);
    IF i IS NULL THEN
        PERFORM lease._fail('0A000',
            format('pg_lease: cannot fence %s against %s: the owner rows are not co-located with the rows they fence', target, owner),
            format('%s is distributed by %I, which is not one of its key columns %s. %s', target, t.dist_column, key_columns, rule),
            format('Distribute %s by one of its key columns, co-located with %s.', target, owner));
    END IF;
    IF o.kind IS DISTINCT FROM 'distributed' OR o.dist_column IS DISTINCT FROM owner_key_columns[i] OR o.colocation <> t.colocation THEN
        PERFORM lease._fail('0A000',
            format('pg_lease: cannot fence %s against %s: the owner rows are not co-located with the rows they fence', target, owner),
            format('%s is distributed by %I (co-location group %s); %s %s. %s', target, t.dist_column, t.colocation, owner,
                   CASE WHEN o.kind IS NULL THEN 'is not distributed'
                        WHEN o.kind <> 'distributed' THEN 'is a ' || lease._citus_kind(o.kind) || ' table'
                        ELSE format('is distributed by %I (co-location group %s)', o.dist_column, o.colocation) END, rule),
            format('Distribute %s by %I with colocate_with => ''%s'' (its key column %I pairs with owner key column %I), or make %s a reference table.',
                   owner, owner_key_columns[i], target, t.dist_column, owner_key_columns[i], owner));
    END IF;
END $$;

-- What the fence trigger of a Citus table carries as its one argument: the
-- protection config (JSON), which Citus copies with the trigger to every
-- node's shell and shard, present and future, and which the trigger reads on
-- a shard whose node's lease.protected does not have it (src/fence/citus.rs).
-- NULL for a table Citus does not manage (its trigger takes no argument).
CREATE FUNCTION lease._shard_config(target regclass, mode text, key_columns text[], token_column text,
                                    owner regclass, owner_key_columns text[], owner_token_column text)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
               'mode', mode, 'key_columns', to_jsonb(key_columns), 'token_column', token_column,
               'owner_table', (SELECT format('%I.%I', n.nspname, c.relname)
                                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = owner),
               'owner_key_columns', to_jsonb(owner_key_columns), 'owner_token_column', owner_token_column)::text
     WHERE (lease._citus_table(target)).kind IS NOT NULL
$$;

-- Citus: what is wrong with pg_lease's triggers on this node's shards of the
-- distributed table whose shell here is `shell` (every shard placed here, or
-- only `shards`). Citus copies each row trigger of a distributed table to
-- every shard, named with the shard id as suffix, and statement triggers to
-- the shards it moves. Always judged: each copy of pg_lease's triggers a
-- shard carries is enabled ALWAYS, unconditional and fires on what the
-- original fires on (`created_now`: except a copy this transaction's CREATE
-- TRIGGER just made, not yet enabled ALWAYS). `complete` also requires a
-- copy of each of the shell's row triggers (the fence, the owner guard) on
-- every shard. Run after each command and at commit for shards DDL reached
-- on this node (lease._guard_shards; not complete there: Citus changes a
-- table's shell and its shards over several connections, each its own
-- transaction on the node, so one cannot see the others' changes), and
-- complete across nodes by lease.cluster_fence_problems.
CREATE FUNCTION lease._shard_problems(shell regclass, shards regclass[] DEFAULT NULL, complete boolean DEFAULT false,
                                      created_now boolean DEFAULT false)
RETURNS TABLE (rel regclass, problem text)
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shard regclass;
    suffix text;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NULL THEN
        RETURN;
    END IF;
    IF shards IS NULL THEN
        -- Dynamic: pg_lease does not depend on Citus.
        EXECUTE $q$SELECT array_agg(pg_catalog.to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid, false)))
                     FROM pg_catalog.pg_dist_shard s
                     JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
                     JOIN pg_catalog.pg_dist_local_group g ON g.groupid = p.groupid
                    WHERE s.logicalrelid = $1$q$ INTO shards USING shell;
    END IF;
    FOREACH shard IN ARRAY coalesce(shards, '{}') LOOP
        CONTINUE WHEN shard IS NULL OR lease._shard_of(shard) IS DISTINCT FROM shell::oid;
        suffix := '_' || lease._shard_id(shard);
        RETURN QUERY
            SELECT shard, format('its copy %I of pg_lease''s trigger is %s', c.tgname,
                                 CASE WHEN c.tgenabled <> 'A' THEN 'not enabled ALWAYS'
                                      ELSE 'changed (it no longer fires on every row and event)' END)
              FROM pg_trigger c
             WHERE c.tgrelid = shard AND NOT c.tgisinternal
               AND c.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)
               AND ((c.tgenabled <> 'A'
                     AND NOT (created_now AND c.tgenabled = 'O' AND lease._this_transaction(c.xmin)))
                    OR c.tgqual IS NOT NULL OR cardinality(c.tgattr::int2[]) > 0
                    OR c.tgtype <> CASE WHEN c.tgfoid = 'lease.truncate_guard'::regproc THEN 34 ELSE 31 END);
        IF complete THEN
            RETURN QUERY
                SELECT shard, format('it has no copy %I of pg_lease''s trigger %I on %s', t.tgname || suffix, t.tgname, shell)
                  FROM pg_trigger t
                 WHERE t.tgrelid = shell AND NOT t.tgisinternal
                   AND t.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc)
                   AND NOT EXISTS (SELECT 1 FROM pg_trigger c
                                    WHERE c.tgrelid = shard AND c.tgname = t.tgname || suffix AND c.tgfoid = t.tgfoid);
        END IF;
    END LOOP;
END $$;

-- Citus: on one node, what is wrong with pg_lease's triggers on the Citus
-- tables the coordinator protects (`expected`, from
-- lease.cluster_fence_problems: each table's name and fence config, its owner
-- table's name and owner guard arguments), shells and shards alike. Catches
-- what no guard on a worker can tell from Citus's own changes: a table owner
-- connected to a worker with citus.enable_ddl_propagation = off changing a
-- shell's and its shards' triggers together.
CREATE FUNCTION lease._node_fence_problems(expected json) RETURNS TABLE (target text, problem text)
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e record;
    t regclass;
    o regclass;
BEGIN
    FOR e IN SELECT * FROM json_to_recordset(expected) AS x(target text, config text, owner text, guard text[]) LOOP
        target := e.target;
        t := to_regclass(e.target);
        o := to_regclass(e.owner);
        IF t IS NULL OR o IS NULL THEN
            problem := format('%s does not exist on this node', CASE WHEN t IS NULL THEN e.target ELSE e.owner END);
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger g
                        WHERE g.tgrelid = t AND g.tgname = 'pg_lease_fence' AND g.tgfoid = 'lease.fence_trigger'::regproc
                          AND g.tgenabled = 'A' AND lease._trigger_args(g.tgargs) = ARRAY[e.config]) THEN
            problem := format('its fence trigger here is missing, disabled or not the one the coordinator installed');
            RETURN NEXT;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger g
                        WHERE g.tgrelid = o AND g.tgname = 'pg_lease_owner_guard' AND g.tgfoid = 'lease.owner_guard'::regproc
                          AND g.tgenabled = 'A' AND (lease._trigger_args(g.tgargs))[1] = e.guard[1]
                          AND (lease._trigger_args(g.tgargs))[2:] @> e.guard[2:]) THEN
            problem := format('the owner guard of %s here is missing, disabled or not the one the coordinator installed', e.owner);
            RETURN NEXT;
        END IF;
        RETURN QUERY SELECT e.target, format('shard %s: %s', s.rel, s.problem) FROM lease._shard_problems(t, NULL, true) s
                     UNION ALL
                     SELECT e.target, format('shard %s: %s', s.rel, s.problem) FROM lease._shard_problems(o, NULL, true) s;
    END LOOP;
END $$;

-- Whether this session is one of Citus's own connections between nodes
-- (application_name 'citus_internal gpid=N' or 'citus_rebalancer gpid=N',
-- as Citus itself tells them apart), over which Citus carries the
-- coordinator's DDL to the shards and moves and splits them. Not proof of
-- anything: a client can choose that application_name (README, "Guards on
-- the workers").
CREATE FUNCTION lease._citus_internal() RETURNS boolean
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
    RETURN pg_catalog.current_setting('application_name') ~ '^citus_(internal|rebalancer) gpid=[0-9]+$';

-- Whether this node is the Citus coordinator (its group is 0).
CREATE FUNCTION lease._citus_coordinator() RETURNS boolean
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    coordinator boolean;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NULL THEN
        RETURN false;
    END IF;
    -- Dynamic: pg_lease does not depend on Citus.
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_local_group g WHERE g.groupid = 0)' INTO coordinator;
    RETURN coordinator;
END $$;

-- The one rule for Citus workers: a fenced or owner table's shards, and its
-- shell (where the shards read their config), change only over Citus's own
-- connections. DDL of such a table goes through the coordinator, whose guard
-- judges it, and Citus sends it on over its own connections (as it moves,
-- splits and creates shards). Anything else reaching it on a worker (a table
-- owner connected there, run_command_on_workers or run_command_on_placements
-- from the coordinator) is refused. The coordinator's own placements (of
-- reference tables) are changed by the very commands its guard judges: Citus
-- runs them there in the client's own session. NULL when rel may change
-- here; else the refusal's hint. Called by lease._guard_shards,
-- lease._guard_drop and the DROP TABLE guard (src/fence/ddl.rs).
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

-- Citus: the DDL guard on a node's shards. Citus runs each DDL command of a
-- distributed table on the coordinator, where pg_lease's guard judges it,
-- then on every shard; a command that reaches a shard of a fenced or owner
-- table otherwise came to this node straight (or through
-- run_command_on_workers). Refused at once (LF008), as on one node: leaving
-- a shard's copy of pg_lease's triggers disabled or narrowed, rewriting a
-- fenced column (ALTER COLUMN ... TYPE), or a BEFORE row trigger that runs
-- after the fence or owner guard; checked again at commit.
CREATE FUNCTION lease._guard_shards(tag text) RETURNS void
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

REVOKE EXECUTE ON FUNCTION lease._guard_shards(text) FROM PUBLIC;

-- ACCESS EXCLUSIVE on both tables (and their partitions), as the DROP
-- TRIGGERs of the last fence on an owner table take them, without waiting
-- for one while holding the other. A game server's transaction may hold
-- either while it waits for the other (it read its owner row, then writes
-- the fenced table; or it read or wrote the fenced table, whose fence then
-- reads the owner row), so neither order is safe alone: wait for one, take
-- the other only if it is free at once, else let go of the first (its lock
-- was taken in a subtransaction, and goes with it) and start again from the
-- busy one. Each round waits for a transaction that was in the way, so they
-- go on; after 50 rounds, both in order, waiting (a deadlock then aborts
-- one side, 40P01). LOCK TABLE, with the caller's rights: the caller owns
-- both tables (unprotect checked), and may lock them unless it revoked its
-- own UPDATE, DELETE and TRUNCATE on one (nothing locked here then).
CREATE FUNCTION lease._lock_pair_exclusive(first_rel regclass, second_rel regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a regclass := first_rel;
    b regclass := second_rel;
    trying boolean;
BEGIN
    FOR round IN 1..50 LOOP
        trying := false;
        BEGIN
            EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', a);
            trying := true;
            EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE NOWAIT', b);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            -- (A lock_timeout of the caller's while waiting is its error.)
            IF NOT trying THEN
                RAISE;
            END IF;
            SELECT b, a INTO a, b;
        WHEN insufficient_privilege THEN
            -- (An owner that revoked its own UPDATE, DELETE and TRUNCATE
            -- may not LOCK TABLE it, but may drop its triggers: in order,
            -- as the DROP TRIGGERs take them.)
            RETURN;
        END;
    END LOOP;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', first_rel);
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', second_rel);
END $$;

-- Runs command, DDL of pg_lease's own triggers on rel. Citus refuses trigger
-- DDL on its tables unless told it may (citus.enable_unsafe_triggers), and
-- sends DDL to the other nodes only with citus.enable_ddl_propagation on:
-- both on for this command only; pg_lease's fence is one Citus copies to
-- every shard (lease._shard_config).
CREATE FUNCTION lease._trigger_ddl(rel regclass, command text) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unsafe text;
    propagate text;
BEGIN
    IF (lease._citus_table(rel)).kind IS NULL THEN
        EXECUTE command;
        RETURN;
    END IF;
    -- And it must reach every node, whatever the session says.
    unsafe := pg_catalog.current_setting('citus.enable_unsafe_triggers', true);
    propagate := pg_catalog.current_setting('citus.enable_ddl_propagation', true);
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', 'on', true);
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'on', true);
    EXECUTE command;
    PERFORM pg_catalog.set_config('citus.enable_unsafe_triggers', coalesce(unsafe, 'off'), true);
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', coalesce(propagate, 'on'), true);
END $$;
CREATE FUNCTION lease._create_trigger(rel regclass, tgname name, func regproc, timing text, body text) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- The trigger of that name on rel (read once; its fields NULL if none).
    existing record;
BEGIN
    SELECT t.oid, t.tgfoid, t.tgparentid, t.tgenabled, t.tgtype, t.tgargs INTO existing
      FROM pg_trigger t WHERE t.tgrelid = rel AND t.tgname = _create_trigger.tgname;
    IF existing.tgfoid <> func THEN
        PERFORM lease._fail('42710',
            format('pg_lease: %s already has a trigger %I that is not pg_lease''s (it runs %s)', rel, tgname, existing.tgfoid::regproc),
            NULL, 'Rename or drop that trigger: the pg_lease_* trigger names are pg_lease''s.');
    END IF;
    -- A clone of a parent's trigger goes with the parent (DETACH drops it):
    -- never pg_lease's guard of this table.
    IF existing.tgparentid <> 0 THEN
        PERFORM lease._fail('42710',
            format('pg_lease: %s already has a trigger %I, cloned from its parent table''s', rel, tgname),
            NULL, 'Drop that trigger from the parent table (or protect the parent instead): the pg_lease_* trigger names are pg_lease''s.');
    END IF;
    -- Already there as this would leave it: defined exactly so (timing and
    -- body are written as pg_get_triggerdef writes them), ENABLE ALWAYS, and
    -- a row trigger's clone on every partition below as enabled. Nothing to
    -- do: one more table fenced against a shared owner table re-creates no
    -- owner guard (each such command fires the DDL guard over every fence it
    -- concerns). Not on Citus, where the copies on other nodes are not seen.
    IF existing.tgenabled = 'A' AND (lease._citus_table(rel)).kind IS NULL
       AND pg_get_triggerdef(existing.oid) = format('CREATE TRIGGER %I %s ON %s %s', _create_trigger.tgname, timing, rel, body)
       AND NOT EXISTS (
           SELECT 1 FROM pg_partition_tree(rel) p
             LEFT JOIN pg_trigger c ON c.tgrelid = p.relid AND c.tgname = _create_trigger.tgname
            WHERE existing.tgtype & 1 = 1 AND p.relid <> rel
              AND (c.oid IS NULL OR c.tgenabled <> 'A' OR c.tgfoid <> existing.tgfoid OR c.tgtype <> existing.tgtype
                   OR c.tgargs <> existing.tgargs OR c.tgqual IS NOT NULL OR cardinality(c.tgattr::int2[]) > 0)) THEN
        RETURN;
    END IF;
    PERFORM lease._trigger_ddl(rel, format('CREATE %sTRIGGER %I %s ON %s %s',
                   CASE WHEN existing.oid IS NULL THEN '' ELSE 'OR REPLACE ' END, tgname, timing, rel, body));
    PERFORM lease._trigger_ddl(rel, format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', rel, tgname));
END $$;
-- The last step of protect: the fence it set up is whole (a trigger of
-- pg_lease's name that was there before and is not what pg_lease installs,
-- for example with a WHEN clause, fails it: LF008, and protect rolls back).
CREATE FUNCTION lease._check_enforced(target regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
    gap record;
BEGIN
    SELECT f.relid, f.problem INTO gap FROM lease._fence_problems(ARRAY[target::oid]) f LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('protecting %s would leave its fence incomplete', target),
            format('Table %s: %s.', gap.relid, gap.problem));
    END IF;
END $$;
-- shard_config: the fence trigger's argument on a Citus table (lease._shard_config).
CREATE FUNCTION lease._install_target_triggers(target regclass, shard_config text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lease._create_trigger(target, 'pg_lease_fence', 'lease.fence_trigger'::regproc,
        'BEFORE INSERT OR DELETE OR UPDATE',
        format('FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger(%s)', coalesce(quote_literal(shard_config), '')));
    PERFORM lease._install_truncate_guard(t.relid) FROM pg_partition_tree(target) t WHERE t.relid <> target;
    PERFORM lease._install_truncate_guard(target);
END $$;
CREATE FUNCTION lease._install_truncate_guard(rel regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lease._create_trigger(rel, 'pg_lease_truncate', 'lease.truncate_guard'::regproc,
        'BEFORE TRUNCATE', 'FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard(''target'')');
END $$;
-- The owner key columns an owner table's guard watches: every key column
-- any table fenced against it uses (plus `extra`, for a protect in
-- progress), sorted. A token row may move under none of them.
CREATE FUNCTION lease._owner_guard_keys(owner regclass, extra text[] DEFAULT NULL) RETURNS text[]
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT array_agg(k ORDER BY k COLLATE "C")
      FROM (SELECT unnest(p.owner_key_columns) AS k FROM lease.protected p WHERE p.owner_table = owner
            UNION SELECT unnest(extra)) x
$$;

-- (Re)installs an owner table's guards for its token column and the key
-- columns _owner_guard_keys lists.
CREATE FUNCTION lease._guard_owner(owner regclass, token_column text, extra text[] DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lease._install_owner_guards(owner,
        (SELECT string_agg(quote_literal(a), ', ' ORDER BY n)
           FROM unnest(ARRAY[token_column] || lease._owner_guard_keys(owner, extra)) WITH ORDINALITY u(a, n)));
END $$;

CREATE FUNCTION lease._install_owner_guards(owner regclass, args text) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part regclass;
BEGIN
    PERFORM lease._create_trigger(owner, 'pg_lease_owner_guard', 'lease.owner_guard'::regproc,
        'BEFORE INSERT OR DELETE OR UPDATE', format('FOR EACH ROW EXECUTE FUNCTION lease.owner_guard(%s)', args));
    FOR part IN SELECT t.relid FROM pg_partition_tree(owner) t UNION SELECT owner LOOP
        PERFORM lease._install_owner_truncate_guard(part);
    END LOOP;
END $$;
CREATE FUNCTION lease._install_owner_truncate_guard(rel regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM lease._create_trigger(rel, 'pg_lease_owner_truncate', 'lease.truncate_guard'::regproc,
        'BEFORE TRUNCATE', 'FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard(''owner'')');
END $$;

-- A partition left "detach pending" by an interrupted DETACH PARTITION ...
-- CONCURRENTLY is outside the tree Postgres shows (protect would install no
-- guard on it) until DETACH ... FINALIZE takes it out: a fence cannot be
-- set up over such a tree (55000). (A catalog read protect runs with its
-- caller's rights: executable by PUBLIC.)
CREATE FUNCTION lease._refuse_detach_pending(roots oid[]) RETURNS void
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
    pending record;
BEGIN
    SELECT i.inhrelid::regclass AS part, i.inhparent::regclass AS parent INTO pending
      FROM pg_inherits i
     WHERE i.inhdetachpending AND lease._under(i.inhparent, roots)
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._fail('55000',
            format('pg_lease: partition %s of %s is being detached (an interrupted DETACH PARTITION ... CONCURRENTLY)', pending.part, pending.parent),
            format('Finish the detach first (ALTER TABLE %s DETACH PARTITION %s FINALIZE), or attach the table again after it.', pending.parent, pending.part));
    END IF;
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
    existing_guard text;
    key_problem record;
BEGIN
    PERFORM lease._check_columns(target, 'target table', key_columns, token_column);
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
    -- No other change to the fences on this table or on this owner table
    -- runs beside this one from here on (lease._lock_owner_table; neither
    -- table can be dropped meanwhile either): everything below, whether the
    -- table is already protected first, is decided after any such change
    -- committed (at READ COMMITTED; 40001 above it).
    PERFORM lease._lock_owner_table(target, owner, 'protect');
    PERFORM lease._check_not_protected(target);
    IF EXISTS (SELECT 1 FROM lease.protected p WHERE p.relid OPERATOR(pg_catalog.=) owner) THEN
        PERFORM lease._fail('0A000', format('pg_lease: owner table %s is fenced itself and cannot be an owner table', owner),
            NULL, 'A table is either fenced or an owner table, not both.');
    END IF;
    -- Keys are compared with the owner key type's own equality, which must
    -- be the one OPERATOR(pg_catalog.=) finds (lease._key_type_problem).
    SELECT u.c, u.why INTO key_problem
      FROM (SELECT k.c, lease._key_type_problem(lease._column_type(owner, k.c)::pg_catalog.oid) AS why
              FROM pg_catalog.unnest(owner_key_columns) WITH ORDINALITY k(c, n) ORDER BY k.n) u
     WHERE u.why IS NOT NULL
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._fail('0A000',
            pg_catalog.format('pg_lease: owner key column "%s" of %s has type %s, whose equality pg_lease cannot use',
                              key_problem.c, owner, lease._column_type(owner, key_problem.c)),
            key_problem.why || '.',
            'Use an owner key type whose = operator is in pg_catalog (for case-insensitive keys: text with a nondeterministic collation).');
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

    PERFORM lease._refuse_detach_pending(ARRAY[target::oid, owner::oid]);
    -- One owner guard per owner table, shared by every table fenced against it.
    SELECT (lease._trigger_args(t.tgargs))[1] INTO existing_guard FROM pg_catalog.pg_trigger t
     WHERE t.tgrelid OPERATOR(pg_catalog.=) owner AND t.tgname OPERATOR(pg_catalog.=) 'pg_lease_owner_guard' AND NOT t.tgisinternal;
    IF existing_guard IS NOT NULL AND existing_guard OPERATOR(pg_catalog.<>) owner_token_column THEN
        PERFORM lease._fail('0A000', format('pg_lease: owner table %s already guards token column "%s"', owner, existing_guard), 'All tables fenced against one owner table must use the same owner token column.');
    END IF;
    -- One guard per owner table, watching the key columns of every table
    -- fenced against it: installed, extended by this table's key columns, or
    -- (what a schema-only restore left) made whole.
    PERFORM lease._check_citus_layout(target, key_columns, owner, owner_key_columns);
    PERFORM lease._guard_owner(owner, owner_token_column, owner_key_columns);

    PERFORM lease._install_target_triggers(target,
        lease._shard_config(target, 'owner', key_columns, token_column, owner, owner_key_columns, owner_token_column));
    PERFORM lease._register(target, 'owner', key_columns, token_column, owner, owner_key_columns, owner_token_column);
    PERFORM lease._check_enforced(target);
END $$;
COMMENT ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) IS
    'Fences writes to target: each row''s token must equal its owner row''s current token.';

CREATE FUNCTION lease.protect_high_water(target regclass, key_columns text[], token_column name DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    col text;
    why text;
BEGIN
    PERFORM lease._check_columns(target, 'target table', key_columns, token_column);
    -- Marks are stored by each key value's canonical form: only key types
    -- whose equality that form captures exactly can be used.
    FOREACH col IN ARRAY key_columns LOOP
        SELECT lease._key_identity_problem(a.atttypid, a.attcollation) INTO why
          FROM pg_attribute a WHERE a.attrelid = target AND a.attname = col;
        IF why IS NOT NULL THEN
            PERFORM lease._fail('0A000', format('pg_lease: key column "%s" of %s cannot identify a high-water resource: %s', col, target, why));
        END IF;
    END LOOP;
    -- No other change to this table's fence runs beside this one from here
    -- on (lease._lock_owner_table, with no owner table): whether it is
    -- already protected is decided after any such change committed.
    PERFORM lease._lock_owner_table(target, 0, 'protect_high_water');
    PERFORM lease._check_not_protected(target);
    PERFORM lease._refuse_detach_pending(ARRAY[target::oid]);
    PERFORM lease._check_citus_layout(target, key_columns, NULL, NULL);
    PERFORM lease._install_target_triggers(target);
    PERFORM lease._register(target, 'high_water', key_columns, token_column, NULL, NULL, NULL);
    PERFORM lease._check_enforced(target);
END $$;
COMMENT ON FUNCTION lease.protect_high_water(regclass, text[], name) IS
    'Fences writes to target against the highest token ever accepted per resource.';

CREATE FUNCTION lease.unprotect(target regclass) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p lease.protected;
    part regclass;
    leftover record;
    dropped integer := 0;
BEGIN
    IF target IS NULL THEN
        PERFORM lease._fail('22004', 'lease.unprotect: target must not be NULL');
    END IF;
    -- No other change to this table's fence runs beside this one from here
    -- on (lease._lock_owner_table, which also checks the caller and that the
    -- table exists; nor can the table be dropped meanwhile):
    -- whether it is protected, and how, is read after any such change
    -- committed (at READ COMMITTED; 40001 above it).
    PERFORM lease._lock_owner_table(target, 0, 'unprotect');
    -- Forget the config first: the DDL guard then no longer expects the triggers.
    SELECT * INTO p FROM lease.protected x WHERE x.relid = target;
    IF NOT FOUND THEN
        -- pg_lease's triggers without their config (a schema-only dump and
        -- restore carries the triggers, not lease.protected): removing them
        -- is what unprotect means here. On an owner table still named by a
        -- protected table's config they stay.
        IF EXISTS (SELECT 1 FROM lease.protected o WHERE o.owner_table = target) THEN
            PERFORM lease._fail('42704', format('pg_lease: %s is not protected (it is the owner table of a protected table: unprotect that one)', target));
        END IF;
        FOR leftover IN
            SELECT g.tgrelid::regclass AS rel, g.tgname
              FROM pg_trigger g
             WHERE g.tgrelid IN (SELECT t.relid FROM pg_partition_tree(target) t UNION SELECT target)
               AND g.tgparentid = 0
               AND g.tgname IN ('pg_lease_fence', 'pg_lease_truncate', 'pg_lease_owner_guard', 'pg_lease_owner_truncate')
               AND g.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.truncate_guard'::regproc, 'lease.owner_guard'::regproc)
        LOOP
            PERFORM lease._trigger_ddl(leftover.rel, format('DROP TRIGGER %I ON %s', leftover.tgname, leftover.rel));
            dropped := dropped + 1;
        END LOOP;
        IF dropped > 0 THEN
            RAISE NOTICE 'pg_lease: % had % of pg_lease''s triggers but no protection config (a schema-only restore?): removed them', target, dropped;
            RETURN;
        END IF;
        PERFORM lease._fail('42704', format('pg_lease: %s is not protected', target));
    END IF;
    -- (Unprotected meanwhile by another session: nothing left to do.)
    IF NOT lease._unregister(target) THEN
        PERFORM lease._fail('42704', format('pg_lease: %s is not protected', target));
    END IF;
    -- Whether this was the last fence on its owner table is decided after
    -- any other change to that table's fences committed (lease._lock_owner_table).
    IF p.owner_table IS NOT NULL THEN
        PERFORM lease._lock_owner_table(target, p.owner_table, 'unprotect');
    END IF;
    -- The owner table's triggers first, then the fenced table's: a writer
    -- that read or changed owner rows before writing the fenced table (the
    -- order of a game server's transaction) then finishes before this waits
    -- for the fenced table, instead of deadlocking with it. (A fenced write
    -- locks the fenced table first and its owner rows in the same statement.)
    IF p.owner_table IS NOT NULL AND NOT EXISTS (SELECT 1 FROM lease.protected o WHERE o.owner_table = p.owner_table) THEN
        -- The last fence on it: both tables' triggers go, each DROP TRIGGER
        -- in ACCESS EXCLUSIVE mode; a writer that touched the fenced table
        -- first, as every fenced write does, would deadlock with taking
        -- them owner table first (lease._lock_pair_exclusive). (Citus takes
        -- a distributed table's locks on every node: as before there.)
        IF (lease._citus_table(p.owner_table)).kind IS NULL AND (lease._citus_table(target)).kind IS NULL THEN
            PERFORM lease._lock_pair_exclusive(p.owner_table, target);
        END IF;
        PERFORM lease._trigger_ddl(p.owner_table, format('DROP TRIGGER IF EXISTS pg_lease_owner_guard ON %s', p.owner_table));
        FOR part IN SELECT t.relid FROM pg_partition_tree(p.owner_table) t UNION SELECT p.owner_table LOOP
            PERFORM lease._trigger_ddl(part, format('DROP TRIGGER IF EXISTS pg_lease_owner_truncate ON %s', part));
        END LOOP;
    ELSIF p.owner_table IS NOT NULL THEN
        -- Still guarding other fenced tables: watch only their key columns.
        PERFORM lease._guard_owner(p.owner_table, p.owner_token_column);
    END IF;
    PERFORM lease._trigger_ddl(target, format('DROP TRIGGER pg_lease_fence ON %s', target));
    FOR part IN SELECT t.relid FROM pg_partition_tree(target) t UNION SELECT target LOOP
        PERFORM lease._trigger_ddl(part, format('DROP TRIGGER IF EXISTS pg_lease_truncate ON %s', part));
    END LOOP;
END $$;
COMMENT ON FUNCTION lease.unprotect(regclass) IS 'Removes pg_lease''s fence from target (high-water marks are kept).';

-- Whether target's fence judges changes applied by logical replication too
-- (true), trusts them as judged where they were written (false), or does what
-- its mode does by default (NULL: owner mode trusts a trusted subscription's
-- changes, high-water mode judges them). See README, "Logical replication".
CREATE FUNCTION lease.judge_replicated(target regclass, judge boolean) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF target IS NULL THEN
        PERFORM lease._fail('22004', 'lease.judge_replicated: target must not be NULL');
    END IF;
    IF NOT lease._judge_replicated(target, judge) THEN
        PERFORM lease._fail('42704', format('pg_lease: %s is not protected', target));
    END IF;
END $$;
COMMENT ON FUNCTION lease.judge_replicated(regclass, boolean) IS
    'Whether target''s fence judges changes applied by logical replication (true), trusts them (false), or follows its mode (NULL).';

-- Every way in which a protected table's fence is not fully in force, with
-- the tables it concerns (only those protected tables whose relid or owner
-- table is in `only`, when given). kind: 'missing' (a trigger is absent),
-- 'disabled' (present but not ENABLE ALWAYS), 'replaced' (our trigger's name
-- on another function), 'renamed' (one of our trigger
-- functions under another name), 'altered' (one of our triggers no longer
-- fires on every row and event, or has other arguments), 'order' (another
-- BEFORE row trigger runs after ours), 'replica' (another BEFORE row trigger
-- runs before ours in logical replication workers: it could rewrite or skip
-- a replicated row, a token bump, a high-water row, before pg_lease sees
-- it), 'column' (a fenced column is gone, retyped,
-- generated, or of a type or collation that cannot identify a resource),
-- 'constraint' (no unique constraint on the owner key), 'inherits' (an
-- inheritance child of a fenced or owner table, unguarded), 'relation' (a
-- fenced or owner table is no longer a table), 'name' (an owner table's name
-- has no exact UTF-8 form: lease._name_problem).
-- PL/pgSQL, not SQL: its query is planned once per session (a SQL function
-- would be planned at every call, which costs more than running it).
-- The triggers pg_lease keeps on the tables protected (or owning protected
-- tables) among `among` (all when NULL), on every partition: the one list
-- of them, for lease._fence_problems and the drop guard.
-- A trigger's arguments as pg_trigger.tgargs holds them (each NUL-terminated,
-- in the database encoding). Compared as text, never through encode(...,
-- 'escape'), which spells a backslash or a non-ASCII byte of a column name
-- differently from the name itself.
CREATE FUNCTION lease._trigger_args(args bytea) RETURNS text[]
    LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    result text[] := '{}';
    rest bytea := args;
    i integer;
BEGIN
    LOOP
        i := position('\x00'::bytea IN rest);
        EXIT WHEN i = 0;
        result := result || convert_from(substr(rest, 1, i - 1), getdatabaseencoding());
        rest := substr(rest, i + 1);
    END LOOP;
    RETURN result;
END $$;

-- Of the partitions, only those among `rels` (NULL: all): the DDL guard
-- judges what a command reached, not every partition of a large tree.
CREATE FUNCTION lease._expected_triggers_in(among oid[], rels oid[])
RETURNS TABLE (relid regclass, rel oid, tgname name, func regproc, tgtype integer, args text[])
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    WITH p AS (
        -- (The owner guard's key columns once per fence, not per partition.)
        SELECT p.*, CASE WHEN p.owner_table IS NOT NULL THEN lease._owner_guard_keys(p.owner_table) END AS guard_keys
          FROM lease.protected p
         WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p.relid OFFSET 0)
           AND (among IS NULL OR p.relid::oid = ANY (among) OR p.owner_table::oid = ANY (among))
    ),
    -- The owner side once per owner table when judging what a command
    -- reached (every fence against it expects the same guards there: the
    -- token column is one, the key columns the union of theirs); per fence
    -- for the whole report (lease.protected_tables).
    po AS (
        (SELECT DISTINCT ON (p.owner_table) * FROM p
          WHERE p.owner_table IS NOT NULL AND rels IS NOT NULL ORDER BY p.owner_table, p.relid)
        UNION ALL
        SELECT * FROM p WHERE p.owner_table IS NOT NULL AND rels IS NULL
    ),
    roots (r) AS (SELECT relid::oid FROM p UNION SELECT owner_table::oid FROM p WHERE owner_table IS NOT NULL),
    tree (root, rel) AS (
        SELECT r, r FROM roots
        UNION
        SELECT roots.r, t.relid FROM roots, pg_partition_tree(roots.r) t WHERE rels IS NULL
        UNION
        SELECT roots.r, x.rel FROM roots, unnest(rels) x(rel)
         WHERE EXISTS (SELECT 1 FROM pg_partition_ancestors(x.rel) a WHERE a.relid::oid = roots.r)
    )
    -- tgtype: 31 = BEFORE, FOR EACH ROW, INSERT, UPDATE and DELETE;
    -- 34 = BEFORE TRUNCATE, FOR EACH STATEMENT. args: the trigger's arguments.
    SELECT p.relid, t.rel, 'pg_lease_fence'::name, 'lease.fence_trigger'::regproc, 31,
           array_remove(ARRAY[lease._shard_config(p.relid, p.mode, p.key_columns, p.token_column, p.owner_table,
                                                  p.owner_key_columns, p.owner_token_column)], NULL)
      FROM p JOIN tree t ON t.root = p.relid::oid
    UNION ALL
    SELECT p.relid, t.rel, 'pg_lease_truncate'::name, 'lease.truncate_guard'::regproc, 34, ARRAY['target']
      FROM p JOIN tree t ON t.root = p.relid::oid
    UNION ALL
    SELECT p.relid, t.rel, 'pg_lease_owner_guard'::name, 'lease.owner_guard'::regproc, 31,
           ARRAY[p.owner_token_column::text] || p.guard_keys
      FROM po p JOIN tree t ON t.root = p.owner_table::oid
    UNION ALL
    SELECT p.relid, t.rel, 'pg_lease_owner_truncate'::name, 'lease.truncate_guard'::regproc, 34, ARRAY['owner']
      FROM po p JOIN tree t ON t.root = p.owner_table::oid
$$;
CREATE FUNCTION lease._expected_triggers(among oid[] DEFAULT NULL)
RETURNS TABLE (relid regclass, rel oid, tgname name, func regproc, tgtype integer, args text[])
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    SELECT * FROM lease._expected_triggers_in(among, NULL)
$$;

-- What is wrong with the fences of `among` (NULL: all); of the partitions,
-- only those among `rels` are looked at (NULL: all; lease._expected_triggers_in).
CREATE FUNCTION lease._fence_problems_in(among oid[], rels oid[])
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
        SELECT roots.r, t.relid FROM roots, pg_partition_tree(roots.r) t WHERE rels IS NULL
        UNION
        SELECT roots.r, x.rel FROM roots, unnest(rels) x(rel)
         WHERE EXISTS (SELECT 1 FROM pg_partition_ancestors(x.rel) a WHERE a.relid::oid = roots.r)
    ),
    -- The triggers pg_lease keeps on these tables (lease._expected_triggers).
    expected_triggers AS (SELECT * FROM lease._expected_triggers_in(among, rels)),
    -- Tables with an owner table's TRUNCATE guard outside every owner table
    -- (one scan of pg_trigger, whatever the number of fences; not for the DDL
    -- guard's look at what one command reached, `rels`: its own DETACH check
    -- refuses that command).
    detached (rel) AS MATERIALIZED (
        SELECT g.tgrelid FROM pg_trigger g
         WHERE rels IS NULL
           AND g.tgname = 'pg_lease_owner_truncate' AND g.tgfoid = 'lease.truncate_guard'::regproc
           AND EXISTS (SELECT 1 FROM p WHERE p.owner_table IS NOT NULL)
           AND g.tgrelid NOT IN (SELECT q.owner_table::oid FROM lease.protected q WHERE q.owner_table IS NOT NULL
                                 UNION ALL
                                 SELECT t.relid FROM lease.protected q CROSS JOIN LATERAL pg_partition_tree(q.owner_table) t
                                  WHERE q.owner_table IS NOT NULL)
    ),
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
        SELECT e.*, a.cur, a.attgenerated, a.attidentity, a.attcollation
          FROM expected_columns e
          LEFT JOIN LATERAL (SELECT x.atttypid::regtype AS cur, x.attgenerated, x.attidentity, x.attcollation FROM pg_attribute x
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
           CASE WHEN e.tgname = 'pg_lease_fence' AND cardinality(e.args) = 1 AND t.tgtype = e.tgtype
                     AND t.tgqual IS NULL AND cardinality(t.tgattr::int2[]) = 0
                THEN format('the config its Citus shards read from trigger %s names its owner table and key columns as they were when it was protected (%s), not as they are now (%s): unprotect it before you rename its owner table or a fenced column or move the owner table to another schema, and protect it again after',
                            e.tgname, (lease._trigger_args(t.tgargs))[1], e.args[1])
                ELSE format('trigger %s on %s no longer fires on every %s', e.tgname, e.rel::regclass,
                            CASE WHEN e.tgtype = 31 THEN 'INSERT, UPDATE and DELETE of every row' ELSE 'TRUNCATE' END) END
      FROM expected_triggers e
      CROSS JOIN LATERAL (SELECT x.* FROM pg_trigger x
                           WHERE x.tgrelid = e.rel AND x.tgname = e.tgname AND x.tgfoid = e.func OFFSET 0) t
     WHERE t.tgtype <> e.tgtype OR t.tgqual IS NOT NULL OR cardinality(t.tgattr::int2[]) > 0
        OR CASE WHEN e.tgname = 'pg_lease_owner_guard' THEN
                -- The token column, and at least every key column expected
                -- (more while a protect extends the guard).
                NOT coalesce((lease._trigger_args(t.tgargs))[1] = e.args[1]
                    AND (lease._trigger_args(t.tgargs))[2:] @> e.args[2:], false)
           ELSE lease._trigger_args(t.tgargs) IS DISTINCT FROM e.args END
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
    -- In a logical replication worker only ENABLE ALWAYS and ENABLE REPLICA
    -- triggers fire; one that runs before ours there could change or skip
    -- (RETURN NULL) a replicated row before pg_lease judges or trusts it.
    SELECT DISTINCT ON (e.rel, t.tgname) e.relid::regclass, e.rel::regclass, 'replica',
           format('trigger %s on %s fires in logical replication workers (ENABLE %s) before %s and could change or skip a replicated row there (let it fire on the origin only: ALTER TABLE %s ENABLE TRIGGER %s)',
                  quote_ident(t.tgname), e.rel::regclass, CASE t.tgenabled WHEN 'A' THEN 'ALWAYS' ELSE 'REPLICA' END,
                  e.tgname, e.rel::regclass, quote_ident(t.tgname))
      FROM expected_triggers e
      CROSS JOIN LATERAL (SELECT x.tgname, x.tgenabled FROM pg_trigger x
                           WHERE x.tgrelid = e.rel AND x.tgtype & 3 = 3 AND x.tgtype & 28 <> 0
                             AND x.tgenabled IN ('A', 'R') AND NOT x.tgisinternal
                             AND x.tgname COLLATE "C" < e.tgname COLLATE "C"
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
                       WHEN e.is_token AND e.attidentity = 'a' THEN 'an identity column GENERATED ALWAYS (lease.acquire could write no token to it, nor writers present one)'
                       WHEN e.typ IS NOT NULL AND e.cur <> e.typ THEN format('of type %s, was %s', e.cur, e.typ)
                       WHEN e.high_water THEN lease._key_identity_problem(e.cur, e.attcollation)
                       ELSE 'of type ' || e.cur::text END)
      FROM actual_columns e
     WHERE e.cur IS NULL
        OR e.attgenerated <> ''
        OR (e.is_token AND e.attidentity = 'a')
        OR (e.typ IS NOT NULL AND e.cur <> e.typ)
        OR (e.typ IS NULL AND e.is_token AND NOT lease._is_token_type(e.cur))
        OR (e.high_water AND lease._key_identity_problem(e.cur, e.attcollation) IS NOT NULL)
    UNION ALL
    -- (Not for what one command reached, `rels` non-empty: finding the index
    -- opens the owner table, so every command on a fenced table would wait
    -- for, and could deadlock with, a migration of its owner table. The
    -- DDL guard judges no owner key; the drop guard judges them all, with
    -- `rels` empty, when an index goes.)
    SELECT p.relid, p.owner_table, 'constraint',
           format('owner table %s has no unique constraint on %s under the equality the fence compares %s keys with', p.owner_table, p.owner_key_columns, p.relid)
      FROM (SELECT * FROM p WHERE p.owner_table IS NOT NULL AND (rels IS NULL OR cardinality(rels) = 0) OFFSET 0) p
     CROSS JOIN LATERAL (SELECT lease._owner_key_index(p.owner_table, p.owner_key_columns,
                                ARRAY(SELECT lease._column_type(p.relid, k.c)::oid
                                        FROM unnest(p.key_columns) WITH ORDINALITY k(c, n) ORDER BY k.n)) IS NOT NULL AS ok) u
     WHERE NOT u.ok
    UNION ALL
    SELECT DISTINCT ON (x.relid, i.inhrelid) x.relid, i.inhrelid::regclass, 'inherits',
           format('table %s inherits from %s, so writes through it bypass the fence', i.inhrelid::regclass, i.inhparent::regclass)
      FROM (SELECT p.relid, t.rel FROM p JOIN tree t ON t.root IN (p.relid::oid, p.owner_table::oid)) x
      CROSS JOIN LATERAL (SELECT y.inhparent, y.inhrelid FROM pg_inherits y
                           WHERE y.inhparent = x.rel
                             AND NOT (SELECT c.relispartition FROM pg_class c WHERE c.oid = y.inhrelid)
                          OFFSET 0) i
    UNION ALL
    -- The fence and lease.acquire name the owner table in SQL (protect
    -- refuses a name they could not write; this is a rename or move since).
    SELECT p.relid, p.owner_table, 'name', n.problem
      FROM p CROSS JOIN LATERAL (SELECT lease._name_problem(p.owner_table) AS problem) n
     WHERE p.owner_table IS NOT NULL AND n.problem IS NOT NULL
    UNION ALL
    -- A table carrying an owner table's TRUNCATE guard outside every owner
    -- table: a partition detached while the DDL guard was disabled (the
    -- guard refuses that), its owner rows and their tokens out of the fence.
    -- (Which owner table it left cannot be told: every fence against one
    -- reports it.)
    SELECT p.relid, d.rel::regclass, 'detached',
           format('table %s carries pg_lease''s owner TRUNCATE guard but is in no owner table: an owner partition detached unseen (its owner rows and their fencing tokens are outside the fence); attach it again, or drop the trigger if its rows hold no current tokens',
                  d.rel::regclass)
      FROM p CROSS JOIN detached d
     WHERE p.owner_table IS NOT NULL
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
CREATE FUNCTION lease._fence_problems(among oid[] DEFAULT NULL)
RETURNS TABLE (relid regclass, rel regclass, kind text, problem text)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    SELECT * FROM lease._fence_problems_in(among, NULL)
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
       f.problems IS NULL AS enforced,
       f.problems,
       p.protected_at,
       p.protected_by
  FROM lease.protected p
  LEFT JOIN (SELECT x.relid, pg_catalog.array_agg(x.problem ORDER BY x.problem) AS problems
               FROM lease._fence_problems() x GROUP BY x.relid) f ON f.relid OPERATOR(pg_catalog.=) p.relid;
COMMENT ON VIEW lease.protected_tables IS 'What pg_lease protects and how; enforced = every trigger, column and constraint in place, problems = what is not.';

-- What the DDL guard's verdict on a command that touched `touched` depends
-- on, as one text: the fences that command concerns (all of them when
-- `whole`: ALTER SCHEMA and ALTER EXTENSION find the tables they touch in
-- the catalog) and, for every table in a fenced or owner table's family
-- (its ancestors and descendants), its inheritance links, what pg_lease
-- judges of its pg_class row (name, schema, kind, persistence, type,
-- partition), its columns, its triggers (pg_lease's among them) and its
-- extension membership. The
-- guard reads the catalog through the transaction's snapshot; in a
-- REPEATABLE READ or SERIALIZABLE transaction it judges a command only if
-- that snapshot reads this as the latest does (lease._fresh_catalog,
-- src/fence/ddl.rs).
CREATE FUNCTION lease._catalog_version(touched oid[], whole boolean) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
-- (PL/pgSQL, not SQL: its query is planned once per session; PostgreSQL 15
-- plans a SQL function's query at every call, which cost 10-20 ms here.
-- STABLE: its query reads the snapshot lease._fresh_catalog runs it under.)
BEGIN
    RETURN (
        WITH RECURSIVE related (rels) AS MATERIALIZED (SELECT lease._related(touched)),
        fences AS (
            SELECT p.relid, p.owner_table, p.xmin::text || p.ctid::text AS version FROM lease.protected p, related r
             WHERE whole OR p.relid::oid = ANY (r.rels) OR p.owner_table::oid = ANY (r.rels)
        ),
        roots (r) AS (
            SELECT f.relid::oid FROM fences f
            UNION
            SELECT f.owner_table::oid FROM fences f WHERE f.owner_table IS NOT NULL
        ),
        up (r) AS (SELECT r FROM roots UNION SELECT i.inhparent FROM pg_inherits i JOIN up ON i.inhrelid = up.r),
        down (r) AS (SELECT r FROM roots UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.r),
        family (r) AS (SELECT r FROM up UNION SELECT r FROM down)
        -- (Each catalog read by its index, table by table: LATERAL ... OFFSET 0
        -- keeps the planner from scanning a whole catalog for a few tables.)
        SELECT concat_ws(';',
            (SELECT string_agg(f.version, ',' ORDER BY f.relid::oid) FROM fences f),
            (SELECT string_agg(i.inhparent::text || '>' || i.inhrelid::text || '/' || i.xmin::text, ',' ORDER BY i.inhparent, i.inhrelid)
               FROM family f
              CROSS JOIN LATERAL (SELECT y.inhparent, y.inhrelid, y.xmin FROM pg_inherits y WHERE y.inhparent = f.r
                                  UNION ALL
                                  SELECT y.inhparent, y.inhrelid, y.xmin FROM pg_inherits y WHERE y.inhrelid = f.r OFFSET 0) i),
            (SELECT string_agg(concat_ws('/', c.oid, c.relname, c.relnamespace, c.relkind, c.relpersistence, c.reloftype, c.relispartition), ','
                               ORDER BY c.oid)
               FROM family f
              CROSS JOIN LATERAL (SELECT x.* FROM pg_class x WHERE x.oid = f.r OFFSET 0) c),
            (SELECT string_agg(concat_ws('/', a.attrelid, a.attnum, a.attname, a.atttypid, a.attgenerated, a.attidentity, a.attisdropped), ','
                               ORDER BY a.attrelid, a.attnum)
               FROM family f
              CROSS JOIN LATERAL (SELECT x.* FROM pg_attribute x WHERE x.attrelid = f.r AND x.attnum > 0 OFFSET 0) a),
            (SELECT string_agg(g.oid::text || '/' || g.xmin::text, ',' ORDER BY g.oid)
               FROM family f
              CROSS JOIN LATERAL (SELECT x.oid, x.xmin FROM pg_trigger x WHERE x.tgrelid = f.r OFFSET 0) g),
            -- pg_lease's triggers anywhere (a guard left on a table that has
            -- left every family, or one created since on a table about to join),
            -- as one count and sum.
            (SELECT count(*)::text || '/' || coalesce(sum(g.oid::text::bigint * 4294967296 + g.xmin::text::bigint), 0)::text
               FROM pg_trigger g
              WHERE g.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)),
            (SELECT string_agg(d.objid::text || '/' || d.refobjid::text, ',' ORDER BY d.objid, d.refobjid)
               FROM family f
              CROSS JOIN LATERAL (SELECT x.objid, x.refobjid FROM pg_depend x
                                   WHERE x.classid = 'pg_class'::regclass AND x.objid = f.r
                                     AND x.refclassid = 'pg_extension'::regclass AND x.deptype = 'e' OFFSET 0) d))
    );
END $$;
REVOKE EXECUTE ON FUNCTION lease._catalog_version(oid[], boolean) FROM PUBLIC;

-- The tables a command on `rels` changes: each of them, the typed tables
-- of a composite type among them (ALTER TYPE ... CASCADE), and every
-- inheritance child and partition of those, all the way down (ALTER TABLE
-- on a parent recurses into its children: renames, retypes, triggers
-- cloned onto partitions).
CREATE FUNCTION lease._reached(rels oid[]) RETURNS oid[]
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    -- (UNION: each table once, however many paths lead to it through
    -- multiple inheritance.)
    WITH RECURSIVE down (r) AS (
        SELECT unnest(rels)
        UNION
        -- (pg_class has no index on reloftype: scanned only for a composite
        -- type among rels, never for a command on tables.)
        SELECT t.oid FROM pg_class c
         CROSS JOIN LATERAL (SELECT x.oid FROM pg_class x WHERE x.reloftype = c.reltype OFFSET 0) t
         WHERE c.oid = ANY (rels) AND c.relkind = 'c'
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.r
    )
    SELECT array_agg(DISTINCT r) FROM down
$$;

-- Whether `rel` is one of `roots` or a partition (at any depth) of one: a
-- protected table may itself be a partition of a table pg_lease does not
-- protect, so "under a root" is not "pg_partition_root is a root".
CREATE FUNCTION lease._under(rel oid, roots oid[]) RETURNS boolean
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    SELECT rel = ANY (roots) OR EXISTS (SELECT 1 FROM pg_partition_ancestors(rel) a WHERE a.relid::oid = ANY (roots))
$$;

-- `rels`, their ancestors (partition or inheritance parents) and what a
-- command on them reaches (lease._reached): the tables whose fence a DDL
-- command on `rels` could change.
CREATE FUNCTION lease._related(rels oid[]) RETURNS oid[]
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    WITH RECURSIVE up (r) AS (
        SELECT unnest(rels)
        UNION
        SELECT i.inhparent FROM pg_inherits i JOIN up ON i.inhrelid = up.r
    )
    SELECT array_agg(DISTINCT x.r) FROM (SELECT r FROM up UNION ALL SELECT unnest(lease._reached(rels))) x
$$;

-- The protected tables a DDL command concerns: those whose fenced table or
-- owner table is among `rels`, an ancestor (partition or inheritance
-- parent) of one of them, or reached by a command on them (lease._reached).
CREATE FUNCTION lease._concerned(rels oid[]) RETURNS oid[]
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    -- (lease._related once, not once per fence and column: OFFSET 0 keeps
    -- the planner from pulling the call into the WHERE clause.)
    -- (Empty, never NULL, when none: NULL means every fence to
    -- lease._fence_problems, which would then judge, and lock, every owner
    -- table in the database for a command on a table no fence uses.)
    SELECT coalesce(array_agg(p.relid::oid), '{}')
      FROM (SELECT lease._related(rels) AS r OFFSET 0) x, lease.protected p
     WHERE p.relid::oid = ANY (x.r) OR p.owner_table::oid = ANY (x.r)
$$;

-- Partitions that joined a fenced or owner table in a transaction that also
-- (re)created the root's pg_lease trigger get their guards from the commands
-- that follow (a single-transaction pg_restore creates them from the dump).
-- Whether they did is checked at commit by a deferred constraint trigger:
-- a transaction cannot end with such a partition unguarded.
CREATE TABLE lease.deferred_checks (
    rel  regclass NOT NULL,
    root regclass NOT NULL
);
COMMENT ON TABLE lease.deferred_checks IS 'Partitions whose pg_lease guards are checked when the transaction commits (empty between transactions).';
REVOKE ALL ON lease.deferred_checks FROM PUBLIC;

CREATE FUNCTION lease._check_at_commit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
    gap record;
BEGIN
    DELETE FROM lease.deferred_checks d WHERE d.rel = NEW.rel AND d.root = NEW.root;
    -- A Citus shard (see lease._guard_ddl; NULL when dropped since).
    IF lease._shard_of(NEW.rel) IS NOT DISTINCT FROM NEW.root::oid THEN
        SELECT s.rel, s.problem INTO gap FROM lease._shard_problems(NEW.root, ARRAY[NEW.rel]) s LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('the transaction would commit shard %s of %s without pg_lease''s fence', NEW.rel, NEW.root),
                format('Shard %s: %s. Change a distributed table''s fence on the Citus coordinator, with lease.protect and lease.unprotect.', gap.rel, gap.problem));
        END IF;
        RETURN NULL;
    END IF;
    -- A partition that joined after lease.protect in the same transaction
    -- (no dump brings its TRUNCATE guard): when everything else of the
    -- fence is in place, it gets the guard now.
    IF NEW.rel <> NEW.root AND NOT EXISTS (
           SELECT 1 FROM lease._fence_problems_in(ARRAY[NEW.root::oid], ARRAY[NEW.rel::oid]) f
            WHERE f.kind IN ('missing', 'disabled') AND f.rel <> NEW.rel) THEN
        PERFORM CASE e.tgname WHEN 'pg_lease_truncate' THEN lease._install_truncate_guard(NEW.rel)
                              ELSE lease._install_owner_truncate_guard(NEW.rel) END
           FROM lease._expected_triggers_in(ARRAY[NEW.root::oid], ARRAY[NEW.rel::oid]) e
          WHERE e.rel = NEW.rel::oid AND e.tgname IN ('pg_lease_truncate', 'pg_lease_owner_truncate')
            AND NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = NEW.rel AND g.tgname = e.tgname);
    END IF;
    SELECT f.relid, f.problem INTO gap
      FROM lease._fence_problems_in(ARRAY[NEW.root::oid], ARRAY[NEW.rel::oid]) f
     WHERE f.rel = NEW.rel AND f.kind IN ('missing', 'disabled')
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            CASE WHEN NEW.rel = NEW.root
                 THEN format('the transaction would commit %s without its pg_lease guards', NEW.rel)
                 ELSE format('the transaction would commit partition %s of %s without its pg_lease guards', NEW.rel, NEW.root) END,
            format('Table %s: %s.', gap.relid, gap.problem));
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER pg_lease_check_at_commit AFTER INSERT ON lease.deferred_checks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lease._check_at_commit();
ALTER TABLE lease.deferred_checks ENABLE ALWAYS TRIGGER pg_lease_check_at_commit;

-- DDL guard, after every DDL command (no tag filter: ALTER VIEW and others
-- reach tables too). For the protected tables the command concerns:
-- - partitions new in this transaction get their TRUNCATE guards; a table
--   attached (ATTACH PARTITION) to a fenced table may hold only rows the
--   fence accepts now;
-- - pg_lease's guards left on a detached table are removed, and detaching a
--   partition of an owner table that holds owner rows is refused (LF004);
-- - the command is refused (LF008) if it leaves a fence disabled, renamed,
--   retyped, generated, inherited from, or no longer on a table.
-- Dropped triggers, columns and constraints are the sql_drop guard's. Judging
-- only what exists, never what is still absent, keeps pg_restore working.
-- The join condition `o.<owner key> = t.<key> AND ...` that matches rows
-- of rel (alias t) to owner rows (alias o) as the fence does: by the
-- equality the fence uses (lease._key_equality: 1.0 = 1.00, 'a' = 'A' under
-- a case-insensitive collation), in the owner column's collation. NULL when
-- a pair's equality is not built in: the DDL guard runs with pg_lease's
-- rights and never runs a user's operator, so such rows cannot be checked
-- (and text would depend on the session's settings).
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

CREATE FUNCTION lease._guard_ddl() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    touched oid[];
    related oid[];
    concerned oid[];
    broken record;
    part record;
    stray record;
    jr record;
    joined oid[];
    bad boolean;
    match text;
    citus_pending oid[] := '{}';
    tied record;
BEGIN
    -- The guard's own DDL (below: a TRUNCATE guard, ENABLE ALWAYS, a stray
    -- guard dropped) has nothing to judge (lease._internal_ddl).
    IF lease._in_internal_ddl() THEN
        RETURN;
    END IF;
    -- Fencing tokens are drawn from lease.token_counter, which only ever
    -- rises on its own: ALTER SEQUENCE (RESTART, MAXVALUE, ...) could make
    -- it issue a token again.
    -- (lease.token_epoch_floor likewise only rises, by lease.acquire.) Nor
    -- may ALTER TABLE rename, move or give them away (a new owner could
    -- setval them).
    IF tg_tag IN ('ALTER SEQUENCE', 'ALTER TABLE') THEN
        -- (By extension membership, not by name: a RENAME or SET SCHEMA
        -- has already changed it here.)
        SELECT c.objid::regclass AS seq INTO tied FROM pg_event_trigger_ddl_commands() c
          JOIN pg_depend d ON d.classid = c.classid AND d.objid = c.objid AND d.deptype = 'e'
                          AND d.refclassid = 'pg_extension'::regclass
          JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_lease'
          JOIN pg_class k ON k.oid = c.objid AND k.relkind = 'S'
         WHERE c.classid = 'pg_class'::regclass
           -- (Not a column's own sequence, as the audit's identity has.)
           AND NOT EXISTS (SELECT 1 FROM pg_depend o WHERE o.classid = 'pg_class'::regclass AND o.objid = c.objid
                              AND o.deptype IN ('a', 'i'))
         LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering', format('%s of pg_lease''s sequence %s is refused', tg_tag, tied.seq),
                format('Fencing tokens are drawn from lease.token_counter in an epoch at or above lease.token_epoch_floor: changing %s could issue a token again. To make every later token higher than a given one, use lease.issue_tokens_above.', tied.seq));
        END IF;
    END IF;
    -- pg_lease's own state is WAL-logged: a crash empties an UNLOGGED table
    -- and resets an UNLOGGED sequence, and leases, tokens and the counter
    -- would start over (ALTER TABLE ... SET UNLOGGED reaches the sequence too).
    IF tg_tag IN ('ALTER TABLE', 'ALTER SEQUENCE') AND EXISTS (
           SELECT 1 FROM pg_event_trigger_ddl_commands() c JOIN pg_class r ON r.oid = c.objid
            WHERE c.classid = 'pg_class'::regclass AND r.relnamespace = 'lease'::regnamespace
              AND r.relpersistence <> 'p') THEN
        PERFORM lease._raise('FenceTampering',
            format('%s cannot make pg_lease''s own tables or sequences UNLOGGED', tg_tag),
            'A crash empties an UNLOGGED table: leases, fencing tokens and the token counter would start over, and a token could be issued twice.');
    END IF;
    -- Citus: DDL that reached a shard on this node (lease._guard_shards).
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL THEN
        PERFORM lease._guard_shards(tg_tag);
    END IF;
    -- The tables the command names (its objects, or theirs).
    SELECT array_agg(DISTINCT CASE c.classid
                                  WHEN 'pg_trigger'::regclass THEN (SELECT t.tgrelid FROM pg_trigger t WHERE t.oid = c.objid)
                                  WHEN 'pg_rewrite'::regclass THEN (SELECT w.ev_class FROM pg_rewrite w WHERE w.oid = c.objid)
                                  -- (a composite type: lease._reached finds its typed tables)
                                  WHEN 'pg_type'::regclass THEN (SELECT y.typrelid FROM pg_type y WHERE y.oid = c.objid AND y.typrelid <> 0)
                                  ELSE coalesce((SELECT x.indrelid FROM pg_index x WHERE x.indexrelid = c.objid), c.objid) END)
      INTO touched
      FROM pg_event_trigger_ddl_commands() c
     WHERE c.classid IN ('pg_class'::regclass, 'pg_trigger'::regclass, 'pg_rewrite'::regclass, 'pg_type'::regclass);
    -- (A type that is not a table's row type names none.)
    touched := array_remove(touched, NULL);
    -- At REPEATABLE READ and above, only with a snapshot that reads the
    -- catalog as the command found it (40001 otherwise).
    PERFORM lease._fresh_catalog(tg_tag, coalesce(touched, '{}'), tg_tag IN ('ALTER SCHEMA', 'ALTER EXTENSION'));
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
                PERFORM lease._internal_ddl(true);
                EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', broken.rel, broken.tgname);
                PERFORM lease._internal_ddl(false);
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
    -- ALTER TRIGGER / ALTER INDEX ... DEPENDS ON EXTENSION marks the object
    -- to be dropped with that extension, without CASCADE. On one of
    -- pg_lease's triggers, or on a unique index of an owner table (what keeps
    -- an owner key unique), it would tie the fence to an unrelated extension
    -- (which the drop guard would then never let anyone drop): refused.
    -- (NO DEPENDS ON EXTENSION, which undoes it, passes.)
    IF tg_tag IN ('ALTER TRIGGER', 'ALTER INDEX') THEN
        SELECT c.command_tag, c.object_identity, e.extname INTO tied
          FROM pg_event_trigger_ddl_commands() c
          JOIN pg_depend d ON d.classid = c.classid AND d.objid = c.objid AND d.deptype = 'x'
                          AND d.refclassid = 'pg_extension'::regclass
          JOIN pg_extension e ON e.oid = d.refobjid
         WHERE (c.classid = 'pg_trigger'::regclass
                AND EXISTS (SELECT 1 FROM pg_trigger t WHERE t.oid = c.objid
                               AND t.tgfoid IN ('lease.fence_trigger'::regproc, 'lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)))
            OR (c.classid = 'pg_class'::regclass
                AND EXISTS (SELECT 1 FROM pg_index x JOIN lease.protected p
                                 ON x.indrelid = p.owner_table
                                 OR x.indrelid IN (SELECT o.relid FROM pg_partition_tree(p.owner_table) o)
                             WHERE x.indexrelid = c.objid AND x.indisunique))
         LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s ... DEPENDS ON EXTENSION %I would make DROP EXTENSION %I drop %s', tied.command_tag, tied.extname, tied.extname,
                       CASE WHEN tied.command_tag = 'ALTER TRIGGER' THEN 'pg_lease''s trigger ' ELSE 'the owner table''s unique index ' END || tied.object_identity),
                'pg_lease''s triggers and the unique indexes that keep owner keys unique belong to their tables, not to another extension.');
        END IF;
    END IF;
    -- ALTER EXTENSION (SET SCHEMA moves every member without naming it)
    -- touches the tables that are members of the extension.
    IF tg_tag = 'ALTER EXTENSION' THEN
        touched := touched || ARRAY(SELECT d.objid FROM pg_event_trigger_ddl_commands() c
                                      JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = c.objid
                                                      AND d.classid = 'pg_class'::regclass AND d.deptype = 'e'
                                     WHERE c.classid = 'pg_extension'::regclass);
    END IF;
    -- ALTER SCHEMA ... RENAME renames every table in the schema without
    -- naming them: it touches the owner tables there, whose new names must
    -- still be ones pg_lease can write in SQL (lease._name_problem).
    IF tg_tag = 'ALTER SCHEMA' THEN
        touched := ARRAY(SELECT p.owner_table::oid FROM lease.protected p
                           JOIN pg_class k ON k.oid = p.owner_table::oid
                           JOIN pg_event_trigger_ddl_commands() d
                             ON d.classid = 'pg_namespace'::regclass AND d.objid = k.relnamespace);
    END IF;
    IF touched IS NULL THEN
        RETURN;
    END IF;
    related := lease._related(touched);
    concerned := ARRAY(SELECT p.relid::oid FROM lease.protected p
                        WHERE p.relid::oid = ANY (related) OR p.owner_table::oid = ANY (related));
    IF concerned = '{}' THEN
        RETURN;
    END IF;

    -- ALTER COLUMN ... TYPE of a fenced column, even to its own type: with
    -- USING it rewrites every row, and no row trigger sees it. The command
    -- changes the table it names, what it recurses into (children, typed
    -- tables: lease._reached) and, on a partition, a column its root has.
    SELECT c.objid::regclass AS rel, x.col, p.relid INTO broken
      FROM pg_event_trigger_ddl_commands() c
     CROSS JOIN LATERAL unnest(lease._retyped_columns(c.command)) x(col)
     CROSS JOIN LATERAL (SELECT lease._reached(ARRAY[c.objid])
                                || ARRAY(SELECT a.relid::oid FROM pg_partition_ancestors(c.objid) a) AS rels) r
      JOIN lease.protected p ON p.relid::oid = ANY (concerned)
     WHERE c.command_tag IN ('ALTER TABLE', 'ALTER TYPE')
       AND ((p.relid::oid = ANY (r.rels) AND (x.col = ANY (p.key_columns) OR x.col = p.token_column))
         OR (p.owner_table::oid = ANY (r.rels) AND (x.col = ANY (p.owner_key_columns) OR x.col = p.owner_token_column)))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('ALTER COLUMN %s TYPE on %s would rewrite a fenced column', quote_ident(broken.col), broken.rel),
            format('Table %s: column "%s" is fenced; ALTER COLUMN ... TYPE rewrites its values without passing the fence.',
                   broken.relid, broken.col));
    END IF;

    -- Partitions joined to a fenced or owner table in this transaction
    -- (created, or attached; in a subtransaction too), each judged once, by
    -- the first command after it joined (lease._first_judgment). A
    -- partitioned table attached brings its whole subtree: every member.
    -- Their TRUNCATE guards wait for commit while the root's fence is itself
    -- being created in this transaction, as in a single-transaction
    -- pg_restore that will create them from the dump.
    -- (pg_inherits read as a table, not through pg_partition_tree, which
    -- would lock every partition of both trees: a command on a fenced table
    -- would wait for, and deadlock with, one on its owner table. The rows
    -- that matter are this transaction's own, on tables it holds locked.)
    joined := '{}';
    FOR jr IN
        WITH RECURSIVE tree (root, relid) AS (
            SELECT r.root, r.root FROM lease.protected p
              CROSS JOIN LATERAL (SELECT p.relid::oid AS root UNION ALL SELECT p.owner_table::oid WHERE p.owner_table IS NOT NULL) r
             WHERE p.relid::oid = ANY (concerned)
            UNION
            SELECT t.root, i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid
             WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = i.inhrelid AND c.relispartition))
        SELECT DISTINCT i.inhrelid, i.xmin, i.ctid
          FROM tree t
          JOIN pg_inherits i ON i.inhrelid = t.relid AND lease._this_transaction(i.xmin)
         WHERE t.relid <> t.root
    LOOP
        IF lease._first_judgment(jr.xmin, jr.ctid) THEN
            joined := joined || jr.inhrelid;
        END IF;
    END LOOP;
    FOR part IN
        SELECT DISTINCT p.relid, p.mode, p.token_column, p.key_columns, p.owner_table, p.owner_key_columns,
               p.owner_token_column, m.relid AS child, (r.root = p.owner_table::oid) AS is_owner
          FROM lease.protected p
          CROSS JOIN LATERAL (SELECT p.relid::oid AS root UNION ALL SELECT p.owner_table::oid WHERE p.owner_table IS NOT NULL) r
          CROSS JOIN LATERAL unnest(joined) j(rel)
          CROSS JOIN LATERAL pg_partition_tree(j.rel) m
         WHERE p.relid::oid = ANY (concerned)
           AND j.rel <> r.root
           AND EXISTS (SELECT 1 FROM pg_partition_ancestors(j.rel) a WHERE a.relid::oid = r.root)
    LOOP
        -- A foreign table's rows are written on another server, past the
        -- fence and the owner guard, and it can have no TRUNCATE guard.
        IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = part.child AND c.relkind = 'f') THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would make foreign table %s a partition of %s %s', tg_tag, part.child::regclass,
                       CASE WHEN part.is_owner THEN 'owner table' ELSE 'fenced table' END,
                       CASE WHEN part.is_owner THEN part.owner_table ELSE part.relid END),
                format('Rows of a foreign table are written on another server, where pg_lease''s %s cannot see them. Keep foreign tables out of %s.',
                       CASE WHEN part.is_owner THEN 'owner guard' ELSE 'fence' END,
                       CASE WHEN part.is_owner THEN part.owner_table ELSE part.relid END));
        END IF;
        -- (Named here, before pg_lease's own DDL on it would be refused.)
        IF part.is_owner AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = part.child AND c.relpersistence <> 'p') THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would make %s table %s a partition of owner table %s', tg_tag,
                       (SELECT CASE c.relpersistence WHEN 'u' THEN 'UNLOGGED' ELSE 'temporary' END FROM pg_class c WHERE c.oid = part.child),
                       part.child::regclass, part.owner_table),
                format('Owner rows hold the current fencing tokens; a crash or a failover empties such a table, and tokens would start over. Make %s a logged table first.',
                       part.child::regclass));
        END IF;
        IF part.is_owner THEN
            IF NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.child AND g.tgname = 'pg_lease_owner_truncate') THEN
                IF EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = part.owner_table AND g.tgname = 'pg_lease_owner_guard'
                              AND NOT lease._this_transaction(g.xmin)) THEN
                    PERFORM lease._internal_ddl(true);
                    PERFORM lease._install_owner_truncate_guard(part.child);
                    PERFORM lease._internal_ddl(false);
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
                          AND NOT lease._this_transaction(g.xmin)) THEN
                PERFORM lease._internal_ddl(true);
                PERFORM lease._install_truncate_guard(part.child);
                PERFORM lease._internal_ddl(false);
            ELSE
                INSERT INTO lease.deferred_checks VALUES (part.child, part.relid);
            END IF;
        END IF;
        -- Rows brought in by ATTACH PARTITION passed no fence: each must carry
        -- its owner row's current token (without a token column, or in
        -- high-water mode, no row can be checked: the table must be empty).
        -- Not when the fence itself was protected in this transaction (its
        -- lease.protected row is new, not merely updated by it, as
        -- lease.judge_replicated does: lease._protected_here): a
        -- single-transaction pg_restore attaches partitions with their
        -- history before it loads the fence; and rows written before a fence
        -- exists are not its to judge (README: rows written while a table
        -- was not protected).
        IF EXISTS (SELECT 1 FROM lease.protected q WHERE q.relid = part.relid AND lease._protected_here(q.ctid)) THEN
            CONTINUE;
        END IF;
        -- Keys are compared as the fence compares them (lease._key_match),
        -- and the owner rows are locked FOR SHARE as the fence locks them: a
        -- token bump then waits for this transaction, or (at REPEATABLE READ
        -- and above) this one fails if a bump already committed.
        match := CASE WHEN part.mode = 'owner' AND part.token_column IS NOT NULL
                      THEN lease._key_match(part.owner_table, part.owner_key_columns, part.child, part.key_columns) END;
        IF match IS NOT NULL THEN
            -- (Under the latest snapshot: rows committed since a REPEATABLE
            -- READ transaction's snapshot come in too; with the guard's
            -- rights, as the keys compare through built-in operators only.)
            bad := lease._exists_latest(format(
                'SELECT (SELECT count(*) FROM ONLY %s) <> (SELECT count(*) FROM (SELECT 1 FROM ONLY %s t JOIN %s o ON %s AND o.%I = t.%I FOR SHARE OF o) s)',
                part.child::regclass, part.child::regclass, part.owner_table, match,
                part.owner_token_column, part.token_column));
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
    -- (One statement, so one snapshot: a fence another session protects
    -- meanwhile has its lease.protected row and its guards in the same one.
    -- pg_inherits read as a table, not through pg_partition_tree, which
    -- would lock every partition of every tree for a command on any table.)
    FOR stray IN
        WITH RECURSIVE members (relid) AS (
            -- Every table in a fenced or owner table's partition tree.
            SELECT r.root FROM lease.protected p
              CROSS JOIN LATERAL (SELECT p.relid::oid AS root UNION ALL SELECT p.owner_table::oid WHERE p.owner_table IS NOT NULL) r
            UNION
            SELECT i.inhrelid FROM pg_inherits i JOIN members m ON i.inhparent = m.relid
             WHERE EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = i.inhrelid AND c.relispartition))
        SELECT g.tgrelid, g.tgname FROM pg_trigger g
         WHERE tg_tag = 'ALTER TABLE'
           AND g.tgname IN ('pg_lease_truncate', 'pg_lease_owner_truncate')
           AND g.tgfoid = 'lease.truncate_guard'::regproc
           AND NOT EXISTS (SELECT 1 FROM members m WHERE m.relid = g.tgrelid)
    LOOP
        -- (Whatever rows it holds, by any snapshot: a partition of an owner
        -- table never leaves it while a fence uses it.)
        IF stray.tgname = 'pg_lease_owner_truncate' THEN
            PERFORM lease._raise('FencingTokenRegression',
                format('%s would take a partition out of an owner table (%s)', tg_tag, stray.tgrelid::regclass),
                format('Table %s holds owner rows whose fencing tokens would leave the fence; tokens could then start over. Unprotect the tables fenced against it first.',
                       stray.tgrelid::regclass));
        END IF;
        PERFORM lease._internal_ddl(true);
        PERFORM lease._trigger_ddl(stray.tgrelid::regclass, format('DROP TRIGGER %I ON %s', stray.tgname, stray.tgrelid::regclass));
        PERFORM lease._internal_ddl(false);
    END LOOP;

    -- (Of the partitions, those the command reached or joined: a command on
    -- one partition of a large tree is judged by what it can change.)
    SELECT f.* INTO broken
      FROM lease._fence_problems_in(concerned, related || ARRAY(SELECT m.relid::oid FROM unnest(joined) j(rel)
                                                                 CROSS JOIN LATERAL pg_partition_tree(j.rel) m)) f
     WHERE f.kind NOT IN ('missing', 'constraint')
       AND NOT (f.kind = 'disabled' AND f.rel::oid = ANY (citus_pending))
     LIMIT 1;
    IF FOUND THEN
        PERFORM lease._raise('FenceTampering',
            format('%s would leave the fence on %s incomplete', tg_tag, broken.relid),
            format('Table %s: %s.', broken.relid, broken.problem));
    END IF;
END $$;

-- sql_drop guard (every command that drops something: DROP TABLE, ALTER
-- TABLE, DROP TYPE/DOMAIN ... CASCADE, DROP INDEX ...). DROP TABLE of a fenced
-- table removes its fence with it. Dropping one of pg_lease's triggers, a
-- fenced column, the owner key's unique constraint, a partition of an owner
-- table, or an owner table that fenced tables still point at, is refused.
CREATE FUNCTION lease._guard_drop() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    dropped_tables oid[];
    owner_roots oid[];
    left_owners oid[];
    left_owner oid;
    orphan record;
    victim record;
BEGIN
    IF lease._in_internal_ddl() THEN
        RETURN;
    END IF;
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
    PERFORM lease._fresh_catalog(tg_tag, '{}', true);
    IF NOT EXISTS (SELECT 1 FROM lease.protected) THEN
        RETURN;
    END IF;
    owner_roots := ARRAY(SELECT p.owner_table::oid FROM lease.protected p WHERE p.owner_table IS NOT NULL);
    dropped_tables := ARRAY(SELECT d.objid FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'table');
    -- The owner tables (not dropped) of the fences dropped: whether any
    -- fence still uses them is decided below, after any other change to
    -- their fences committed (lease._lock_owner_table), in owner order.
    left_owners := ARRAY(SELECT DISTINCT p.owner_table::oid FROM lease.protected p
                          WHERE p.relid::oid = ANY (dropped_tables) AND p.owner_table IS NOT NULL
                            AND NOT (p.owner_table::oid = ANY (dropped_tables))
                          ORDER BY 1);
    DELETE FROM lease.protected p WHERE p.relid::oid = ANY (dropped_tables);
    FOREACH left_owner IN ARRAY left_owners LOOP
        PERFORM lease._lock_owner_table(0, left_owner, tg_tag);
    END LOOP;
    DELETE FROM lease.high_water h WHERE h.target::oid = ANY (dropped_tables);
    -- Owner tables that no fenced table uses any more lose their guards (as
    -- after lease.unprotect), so no guard outlives its fence.
    FOR orphan IN
        SELECT g.tgrelid::regclass AS rel, g.tgname FROM pg_trigger g
         WHERE g.tgname IN ('pg_lease_owner_guard', 'pg_lease_owner_truncate') AND g.tgparentid = 0
           AND g.tgfoid IN ('lease.owner_guard'::regproc, 'lease.truncate_guard'::regproc)
           AND lease._under(g.tgrelid, owner_roots)
           AND NOT lease._under(g.tgrelid, ARRAY(
                   SELECT p.owner_table::oid FROM lease.protected p WHERE p.owner_table IS NOT NULL))
           AND NOT (g.tgrelid = ANY (dropped_tables))
    LOOP
        PERFORM lease._internal_ddl(true);
        PERFORM lease._trigger_ddl(orphan.rel, format('DROP TRIGGER %I ON %s', orphan.tgname, orphan.rel));
        PERFORM lease._internal_ddl(false);
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
            format('pg_lease fences %s with it.', victim.relid)
            || CASE WHEN tg_tag = 'DROP EXTENSION' THEN format(' The extension takes it with it (it was made to depend on it: ALTER %s ... NO DEPENDS ON EXTENSION keeps it).', upper(victim.object_type)) ELSE '' END);
    END IF;
    -- A dropped index no longer names its table, but dropping an index
    -- locks its table (index_drop: ACCESS EXCLUSIVE, SHARE UPDATE EXCLUSIVE
    -- when concurrently): the owner tables this transaction holds so locked
    -- are the only ones whose key could have lost its unique index. (Not
    -- every owner table: opening one that a migration holds would wait for
    -- it, and deadlock when the migration then touches the dropped index's
    -- table.) However the index went: by
    -- name, by cascade, with its constraint or column, or with an extension
    -- it was made to depend on (ALTER INDEX ... DEPENDS ON EXTENSION, which
    -- only needs the table's ownership, then DROP EXTENSION).
    IF EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'index') THEN
        -- (Owner keys only: no partition needs looking at.)
        SELECT f.relid, f.problem INTO victim
          FROM lease._fence_problems_in(ARRAY(
                   SELECT DISTINCT l.relation FROM pg_locks l
                    WHERE l.locktype = 'relation' AND l.pid = pg_backend_pid() AND l.granted
                      AND l.mode IN ('AccessExclusiveLock', 'ShareUpdateExclusiveLock')
                      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                      AND l.relation IN (SELECT p.owner_table::oid FROM lease.protected p)), '{}') f
         WHERE f.kind = 'constraint' LIMIT 1;
        IF FOUND THEN
            PERFORM lease._raise('FenceTampering',
                format('%s would leave the fence on %s incomplete', tg_tag, victim.relid),
                format('Table %s: %s.', victim.relid, victim.problem)
                || CASE WHEN tg_tag = 'DROP EXTENSION' THEN ' The extension takes with it an index made to depend on it (ALTER INDEX ... DEPENDS ON EXTENSION): ALTER INDEX ... NO DEPENDS ON EXTENSION keeps it.' ELSE '' END);
        END IF;
    END IF;
END $$;

CREATE EVENT TRIGGER pg_lease_guard_ddl ON ddl_command_end
    EXECUTE FUNCTION lease._guard_ddl();
CREATE EVENT TRIGGER pg_lease_guard_ddl_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'DROP TABLE', 'DROP INDEX')
    EXECUTE FUNCTION lease._guard_ddl_start();
CREATE EVENT TRIGGER pg_lease_guard_drop ON sql_drop
    EXECUTE FUNCTION lease._guard_drop();
-- Fired whatever session_replication_role says: an event trigger is
-- ENABLE ORIGIN by default, so a role allowed to SET session_replication_role
-- = replica (GRANT SET ON PARAMETER) would otherwise silence the guard.
ALTER EVENT TRIGGER pg_lease_guard_ddl ENABLE ALWAYS;
ALTER EVENT TRIGGER pg_lease_guard_ddl_start ENABLE ALWAYS;
ALTER EVENT TRIGGER pg_lease_guard_drop ENABLE ALWAYS;

-- The hand-boundary write: inserts a JSON array of row objects into a
-- protected table under one fencing token, all or nothing.
-- Checks the rows, converts every value with its column's input function
-- (naming the element and column of a bad one: 'rows[3].amount'), and
-- inserts them with saved plans (src/fence/boundary_write.rs). Runs as its
-- caller: the caller needs INSERT on the table.
CREATE FUNCTION lease.fenced_boundary_write(target regclass, token bigint, rows jsonb) RETURNS bigint
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_fenced_boundary_write';
COMMENT ON FUNCTION lease.fenced_boundary_write(regclass, bigint, jsonb) IS
    'Inserts a JSON array of rows into a protected table under one fencing token; all or nothing; returns the row count.';

GRANT USAGE ON SCHEMA lease TO PUBLIC;

-- Fencing is a migration-time privilege: the DBA grants protect/unprotect to
-- the roles that run migrations (and _register/_unregister still require
-- them to own the tables). Application roles that own their tables therefore
-- cannot unprotect them.
REVOKE EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
    lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass),
    lease.judge_replicated(regclass, boolean) FROM PUBLIC;
