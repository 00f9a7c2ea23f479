-- pg_lease 0.5.0 -> 0.6.0: hot paths (issue #13).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.6.0'" to load this file. \quit

-- The lease calls run fewer SQL statements (issue #13): labels are checked
-- and taken in one expression (lease._label), renew's common case is one
-- UPDATE, a name's first acquire inserts its row with its token, and the
-- epoch is read in one statement (see sql/lease.sql).
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
