-- pg_lease 0.6.0 -> 0.7.0: logical replication and blue/green upgrades
-- (issue #17). Subscriptions owned by roles named in
-- pg_lease.trusted_subscription_owners are trusted like a superuser's (in the
-- library); lease.judge_replicated sets, per protected table, whether changes
-- applied by logical replication are judged (column
-- lease.protected.judge_replicated, NULL: the mode's default); pg_lease's own
-- tables keep their state local (a FOR ALL TABLES publication's changes to
-- them are skipped on the subscriber, TRUNCATE of them is refused);
-- lease.token_ceiling and lease.issue_tokens_above carry tokens across a
-- blue/green cutover (the token rule moves into lease._next_token).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.7.0'" to load this file. \quit


ALTER TABLE lease.protected ADD COLUMN judge_replicated boolean;

CREATE  FUNCTION "_judge_replicated"(
	"target" oid, /* pg_sys :: Oid */
	"judge" bool /* Option < bool > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'judge_replicated_wrapper';

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

CREATE FUNCTION lease._next_token(stored bigint, timeline bigint)
RETURNS TABLE (token bigint, epoch bigint, issued bigint, raise_base bigint)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT CASE WHEN stored = 9223372036854775807 OR r.epoch >= 8388608 THEN NULL   -- 2^63 - 1, 2^23
                ELSE greatest(stored, r.epoch << 40) + 1 END,
           r.epoch, r.issued, r.raise_base
      FROM (SELECT CASE WHEN h.high > c.epoch THEN h.high + timeline ELSE c.epoch END AS epoch,
                   c.issued,
                   CASE WHEN h.high > c.epoch THEN h.high END AS raise_base
              FROM (SELECT coalesce(max(e.base), 0) + timeline AS epoch,
                           (SELECT i.epoch FROM lease.token_epoch_issued i) AS issued
                      FROM lease.token_epoch e) c
             CROSS JOIN LATERAL (SELECT greatest(stored >> 40, c.issued) AS high) h) r;
END;
COMMENT ON FUNCTION lease._next_token(bigint, bigint) IS
    'The next fencing token after stored on timeline, by the epoch rule (NULL when none is left), with the epoch and the base raise it needs (internal).';
REVOKE EXECUTE ON FUNCTION lease._next_token(bigint, bigint) FROM PUBLIC;

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

    -- Epoch = base + timeline, raised above a stored token's or an issued
    -- epoch when needed: the rule is lease._next_token's.
    stored := greatest(cur.token, owner_token, 0);
    -- A REPEATABLE READ or SERIALIZABLE transaction reads the epoch in its
    -- snapshot, which may be older than a raise (lease.issue_tokens_above,
    -- another acquire's): every raise writes the issued-epoch row, so locking
    -- it is a serialization failure then (and when the row is newer than the
    -- snapshot altogether, the upsert below is).
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        PERFORM FROM lease.token_epoch_issued i FOR SHARE;
    END IF;
    SELECT n.token, n.epoch, n.issued, n.raise_base INTO new_token, epoch, issued, high
      FROM lease._next_token(stored, timeline) n;
    raise_base := high IS NOT NULL;
    -- (Refused before anything below is written; the transaction would
    -- undo it anyway.)
    IF new_token IS NULL THEN
        PERFORM lease._fail('22003', format('pg_lease: lease "%s" has no fencing token left (current %s)', p_name, stored), 'Fencing tokens are bigints; this resource''s token is at the top of their range.');
    END IF;
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

CREATE FUNCTION lease.token_ceiling() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    stored bigint;
    ceiling bigint;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM lease._fail('25006', 'lease.token_ceiling: tokens are issued on the primary only',
                            'This server is a standby in recovery.', 'Call it on the primary.');
    END IF;
    LOCK TABLE lease.lease_state IN EXCLUSIVE MODE;   -- acquires in flight commit or roll back first
    SELECT coalesce(max(l.token), 0) INTO stored FROM lease.lease_state l;
    SELECT n.token INTO ceiling FROM lease._next_token(stored, lease._token_floor() >> 40) n;
    IF ceiling IS NULL THEN
        PERFORM lease._fail('22003', format('lease.token_ceiling: no fencing token is left above %s', stored),
                            'Fencing tokens are bigints; this database''s tokens are at the top of their range.');
    END IF;
    RETURN ceiling;
END $$;
COMMENT ON FUNCTION lease.token_ceiling() IS
    'A fencing token above every token this database has issued (blue/green cutover: hand it to lease.issue_tokens_above on the new side).';

CREATE FUNCTION lease.issue_tokens_above(token bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_token bigint := $1;
    timeline bigint;
    lowest bigint;
BEGIN
    IF p_token IS NULL THEN
        PERFORM lease._fail('22004', 'lease.issue_tokens_above: token must not be NULL');
    END IF;
    IF p_token < 0 THEN
        PERFORM lease._fail('22023', format('lease.issue_tokens_above: token must not be negative (got %s)', p_token));
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM lease._fail('25006', 'lease.issue_tokens_above: tokens are issued on the primary only',
                            'This server is a standby in recovery.', 'Call it on the primary.');
    END IF;
    timeline := lease._token_floor() >> 40;
    LOCK TABLE lease.token_epoch IN ACCESS EXCLUSIVE MODE;
    SELECT n.token INTO lowest FROM lease._next_token(0, timeline) n;
    IF lowest IS NOT NULL AND lowest > p_token THEN
        RETURN lowest;   -- already above: nothing to raise
    END IF;
    -- Base = token's epoch: the epoch is then base + timeline (or more), above it.
    IF lowest IS NULL OR (p_token >> 40) + timeline >= 8388608 THEN   -- 2^23
        PERFORM lease._fail('22003', format('lease.issue_tokens_above: no fencing token is left above %s', p_token),
                            format('Tokens are epoch << 40 | counter, epochs below 2^23; this server is on timeline %s.', timeline));
    END IF;
    INSERT INTO lease.token_epoch (base) VALUES (p_token >> 40) ON CONFLICT DO NOTHING;
    -- The new epoch counts as issued (only ever higher: a later timeline
    -- restart still goes above it), and writing the row makes an acquire
    -- whose snapshot predates this raise fail to serialize (see acquire).
    INSERT INTO lease.token_epoch_issued AS i (epoch) VALUES ((p_token >> 40) + timeline)
    ON CONFLICT (singleton) DO UPDATE SET epoch = greatest(i.epoch, excluded.epoch);
    SELECT n.token INTO lowest FROM lease._next_token(0, timeline) n;
    RETURN lowest;
END $$;
COMMENT ON FUNCTION lease.issue_tokens_above(bigint) IS
    'Makes every fencing token this database issues from now on, for any lease, higher than token (only ever raises); returns the lowest it can now issue.';
REVOKE EXECUTE ON FUNCTION lease.token_ceiling(), lease.issue_tokens_above(bigint) FROM PUBLIC;

CREATE FUNCTION lease._local_state() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_local_state';
COMMENT ON FUNCTION lease._local_state() IS
    'Keeps pg_lease''s own tables local: skips replicated changes, refuses TRUNCATE (internal).';
REVOKE EXECUTE ON FUNCTION lease._local_state() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease.judge_replicated(regclass, boolean) FROM PUBLIC;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['protected', 'high_water', 'rejected_writes', 'lost_leases', 'token_epoch',
                             'token_epoch_issued', 'deferred_checks', 'lease_state', 'session_state'] LOOP
        IF t IN ('lease_state', 'session_state') THEN
            EXECUTE format('CREATE TRIGGER pg_lease_local BEFORE INSERT OR DELETE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
            EXECUTE format('CREATE TRIGGER pg_lease_local_update AFTER UPDATE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
            EXECUTE format('ALTER TABLE lease.%I ENABLE REPLICA TRIGGER pg_lease_local_update', t);
        ELSE
            EXECUTE format('CREATE TRIGGER pg_lease_local BEFORE INSERT OR UPDATE OR DELETE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
        END IF;
        EXECUTE format('ALTER TABLE lease.%I ENABLE REPLICA TRIGGER pg_lease_local', t);
        EXECUTE format('CREATE TRIGGER pg_lease_local_truncate BEFORE TRUNCATE ON lease.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION lease._local_state()', t);
        EXECUTE format('ALTER TABLE lease.%I ENABLE ALWAYS TRIGGER pg_lease_local_truncate', t);
    END LOOP;
END $$;

-- pg_lease deletes from this table (without a primary key): a publication
-- that publishes deletes needs a replica identity for it.
ALTER TABLE lease.deferred_checks REPLICA IDENTITY FULL;

-- A BEFORE row trigger that fires in logical replication workers ahead of
-- pg_lease's could change or skip a replicated row before the fence sees it;
-- 0.7.0's fence check refuses new ones (kind 'replica'). Existing ones are
-- reported now, not at the next DDL (rows they could rewrite are judged).
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT f.relid, f.problem FROM lease._fence_problems() f WHERE f.kind = 'replica' LOOP
        RAISE WARNING 'pg_lease: 0.7.0 finds a problem with the fence on %: %', p.relid, p.problem
            USING HINT = 'Let that trigger fire on the origin only (ALTER TABLE ... ENABLE TRIGGER), or rename it to sort after pg_lease''s triggers where it need not change the row.';
    END LOOP;
END $$;

-- Lease calls in Rust (#13).
-- lease.renew, lease.release and lease.release_all are C functions
-- (src/lease_calls.rs): the same statements as saved plans, run as the
-- function's owner as SECURITY DEFINER ran them. CREATE OR REPLACE keeps
-- their owner, grants and comments.
CREATE OR REPLACE FUNCTION lease.renew(name text, owner text, token bigint, ttl_ms integer) RETURNS timestamptz
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_renew';
CREATE OR REPLACE FUNCTION lease.release(name text, owner text, token bigint) RETURNS boolean
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release';
CREATE OR REPLACE FUNCTION lease.release_all(owner text) RETURNS integer
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release_all';
