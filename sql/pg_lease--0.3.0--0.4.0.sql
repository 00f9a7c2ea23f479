-- pg_lease 0.3.0 -> 0.4.0: heartbeat sessions. An owner's leases hang off one
-- session row; lease.heartbeat (new) and lease.renew_all extend it with one row
-- update. Existing leases keep their own expiries and join their owner's session
-- at its first heartbeat, exactly as on a fresh install. Unreported takeovers
-- move from the lease rows to lease.lost_leases, which keeps every one.
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.4.0'" to load this file. \quit

-- Leases taken from a holder that did not release them, until the holder's
-- next heartbeat has told it so (since 0.4.0; 0.3.0 kept one per lease row,
-- so a second takeover before that heartbeat hid the first).
CREATE TABLE lease.lost_leases (
    owner   text        NOT NULL,
    name    text        NOT NULL,
    token   bigint      NOT NULL,
    lost_at timestamptz NOT NULL,
    PRIMARY KEY (owner, name)
);
COMMENT ON TABLE lease.lost_leases IS 'Takeovers not yet reported to the holder that lost them (by lease.heartbeat / lease.renew_all).';
REVOKE ALL ON lease.lost_leases FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.lost_leases', '');
-- 0.3.0 kept the one unreported takeover of a lease on its row.
INSERT INTO lease.lost_leases (owner, name, token, lost_at)
SELECT l.lost_by, l.name, l.lost_token, now() FROM lease.lease_state l WHERE l.lost_by IS NOT NULL;
DROP INDEX lease.lease_state_lost_by;
ALTER TABLE lease.lease_state DROP COLUMN lost_by, DROP COLUMN lost_token;

-- The highest token epoch issued so far (since 0.4.0), written when an acquire
-- first issues a token in a higher epoch. A timeline that restarts below it
-- (pg_upgrade, a restore into a new cluster) is detected by the next acquire,
-- which raises the base above it: a token lost in a failover before the upgrade
-- or dump cannot be issued again, as long as one token was issued on the
-- timeline the failover started (see lease.acquire and README, Upgrades).
CREATE TABLE lease.token_epoch_issued (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch     bigint  NOT NULL
);
COMMENT ON TABLE lease.token_epoch_issued IS 'The highest fencing-token epoch issued so far (one row).';
REVOKE ALL ON lease.token_epoch_issued FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_epoch_issued', '');
-- The epoch reached when this version is installed counts as issued.
INSERT INTO lease.token_epoch_issued (epoch)
SELECT coalesce(max(e.base), 0) + (lease._token_floor() >> 40) FROM lease.token_epoch e;

-- Heartbeat sessions (since 0.4.0): one row per owner that has called
-- lease.heartbeat or lease.renew_all. The session is alive from live_since
-- (when its current unbroken life began) to expires_at; each heartbeat moves
-- expires_at with one row update, whatever the owner holds. A lease is carried
-- by its owner's session when its own expiry is after the session's
-- live_since, i.e. it was alive when that life began or was acquired or
-- renewed during it: its expiry is then the later of its own and the
-- session's (lease._expiry). A session that lapses starts a new life at its
-- next heartbeat, which carries only the leases still alive on their own.
CREATE TABLE lease.session_state (
    owner      text        PRIMARY KEY,
    live_since timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
) WITH (fillfactor = 50);  -- heartbeats update in place (HOT)
COMMENT ON TABLE lease.session_state IS 'pg_lease heartbeat sessions; use lease.heartbeat / lease.renew_all, read lease.sessions.';
REVOKE ALL ON lease.session_state FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.session_state', '');

-- Every holder of a lease has a session row from its first lease on (lease.acquire
-- creates it), so takeovers can always lock it.
INSERT INTO lease.session_state (owner, live_since, renewed_at, expires_at)
SELECT DISTINCT l.owner, '-infinity'::timestamptz, '-infinity'::timestamptz, '-infinity'::timestamptz
  FROM lease.lease_state l;

-- The one rule for when a lease expires: its own expiry, or its owner's
-- session's if the session carries it (see lease.session_state). NULL session
-- bounds (no session) leave the lease's own expiry. A SQL-standard body is
-- bound when created (no search_path at run time) and inlined by the planner.
CREATE FUNCTION lease._expiry(own timestamptz, session_since timestamptz, session_expires timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN own OPERATOR(pg_catalog.>) session_since THEN greatest(own, session_expires) ELSE own END;
COMMENT ON FUNCTION lease._expiry(timestamptz, timestamptz, timestamptz) IS
    'A lease''s effective expiry from its own and its owner session''s bounds (internal).';

CREATE OR REPLACE VIEW lease.leases AS
SELECT l.name, l.owner, l.token, l.acquired_at,
       CASE WHEN l.expires_at OPERATOR(pg_catalog.>) s.live_since
            THEN greatest(l.renewed_at, s.renewed_at) ELSE l.renewed_at END AS renewed_at,
       lease._expiry(l.expires_at, s.live_since, s.expires_at) AS expires_at,
       (l.released_at IS NULL
        AND lease._expiry(l.expires_at, s.live_since, s.expires_at) OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS live,
       l.released_at, l.owner_table, l.owner_key
  FROM lease.lease_state l
  LEFT JOIN lease.session_state s ON s.owner OPERATOR(pg_catalog.=) l.owner AND l.released_at IS NULL;

CREATE VIEW lease.sessions AS
SELECT s.owner, s.live_since, s.renewed_at, s.expires_at,
       s.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AS live
  FROM lease.session_state s;
COMMENT ON VIEW lease.sessions IS 'Heartbeat sessions: per owner, since when it has been alive without a break and until when.';

CREATE OR REPLACE FUNCTION lease.acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                              owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    -- Names and owners compare as the stored rows do, whatever collation the
    -- caller's arguments carry (a nondeterministic one would alias them).
    p_name text COLLATE "default" := $1;
    p_owner text COLLATE "default" := $2;
    p_ttl_ms ALIAS FOR $3;
    p_owner_table ALIAS FOR $4;
    p_owner_key ALIAS FOR $5;
    timeline bigint := lease._token_floor() >> 40;   -- also refuses on a standby
    epoch bigint;
    issued bigint;
    high bigint;
    stored bigint;
    ttl integer := lease._check_ttl(p_ttl_ms);
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
    IF p_name IS NULL OR p_owner IS NULL OR length(p_name) > 256 OR length(p_owner) > 256
       OR btrim(p_name) = '' OR btrim(p_owner) = '' THEN
        PERFORM lease._check_label('name', p_name);
        PERFORM lease._check_label('owner', p_owner);
    END IF;
    IF (p_owner_table IS NULL) <> (p_owner_key IS NULL) THEN
        RAISE EXCEPTION 'pg_lease: owner_table and owner_key go together' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_owner_table IS NOT NULL THEN
        SELECT p.owner_key_columns, p.owner_token_column INTO binding
          FROM lease.protected p WHERE p.owner_table = p_owner_table LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pg_lease: % is not the owner table of any table protected with lease.protect', p_owner_table
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF cardinality(p_owner_key) IS DISTINCT FROM cardinality(binding.owner_key_columns)
           OR array_position(p_owner_key, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'pg_lease: owner_key % does not match the key columns % of %',
                    p_owner_key, binding.owner_key_columns, p_owner_table
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- The lease row, locked (created on first use): racing acquires queue here.
    SELECT * INTO cur FROM lease.lease_state l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO lease.lease_state AS l (name, owner, token, acquired_at, renewed_at, expires_at, released_at)
        VALUES (p_name, p_owner, 0, '-infinity', '-infinity', '-infinity', '-infinity')
        ON CONFLICT (name) DO NOTHING;
        SELECT * INTO cur FROM lease.lease_state l WHERE l.name = p_name FOR UPDATE;
    END IF;
    -- The new holder's session row exists from its first lease on, so the
    -- takeover check below can always lock it (an uncommitted first
    -- heartbeat's INSERT could not be waited for).
    INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
    VALUES (p_owner, '-infinity', '-infinity', '-infinity')
    ON CONFLICT (owner) DO NOTHING;
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
    SELECT coalesce(max(e.base), 0) + timeline INTO epoch FROM lease.token_epoch e;
    SELECT i.epoch INTO issued FROM lease.token_epoch_issued i;
    high := greatest(stored >> 40, issued);
    IF high > epoch THEN
        INSERT INTO lease.token_epoch (base) VALUES (high) ON CONFLICT DO NOTHING;
        epoch := high + timeline;
    END IF;
    IF epoch > coalesce(issued, 0) AND epoch < 8388608 THEN
        INSERT INTO lease.token_epoch_issued AS i (epoch) VALUES (epoch)
        ON CONFLICT (singleton) DO UPDATE SET epoch = greatest(i.epoch, excluded.epoch);
    END IF;
    IF stored = 9223372036854775807 OR epoch >= 8388608 THEN   -- 2^63 - 1, 2^23
        RAISE EXCEPTION 'pg_lease: lease "%" has no fencing token left (current %)', p_name, stored
            USING ERRCODE = 'numeric_value_out_of_range',
                  DETAIL = 'Fencing tokens are bigints; this resource''s token is at the top of their range.';
    END IF;
    new_token := greatest(stored, epoch << 40) + 1;
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
    UPDATE lease.lease_state l
       SET owner = p_owner, token = new_token, acquired_at = now_ts, renewed_at = now_ts,
           expires_at = now_ts + ttl * interval '1 millisecond', released_at = NULL,
           owner_table = p_owner_table, owner_key = p_owner_key
     WHERE l.name = p_name
    RETURNING l.token, l.expires_at INTO token, expires_at;
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
COMMENT ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) IS
    'Takes (or re-takes) a lease with a new, higher fencing token; LF005 when another live owner holds it.';

CREATE OR REPLACE FUNCTION lease.renew(name text, owner text, token bigint, ttl_ms integer) RETURNS timestamptz
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ttl integer := lease._check_ttl(ttl_ms);
    l_name text COLLATE "default" := name;     -- see lease.acquire
    l_owner text COLLATE "default" := owner;
    cur lease.lease_state;
    expiry timestamptz;
    holder lease.session_state;
    now_ts timestamptz;
    why text;
    new_expiry timestamptz;
BEGIN
    IF name IS NULL OR owner IS NULL OR length(name) > 256 OR length(owner) > 256
       OR btrim(name) = '' OR btrim(owner) = '' THEN
        PERFORM lease._check_label('name', name);
        PERFORM lease._check_label('owner', owner);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'pg_lease: token must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO cur FROM lease.lease_state l WHERE l.name = l_name FOR UPDATE;
    now_ts := clock_timestamp();
    expiry := cur.expires_at;
    IF cur.released_at IS NULL AND expiry <= now_ts AND cur.owner = l_owner THEN
        -- Maybe carried by the owner's session: judged under its lock, as in acquire.
        SELECT * INTO holder FROM lease.session_state s WHERE s.owner = cur.owner FOR SHARE;
        now_ts := clock_timestamp();
        expiry := lease._expiry(cur.expires_at, holder.live_since, holder.expires_at);
    END IF;
    why := CASE
        WHEN cur.name IS NULL THEN 'it never existed'
        WHEN cur.owner <> l_owner THEN format('it was taken by %s with token %s', cur.owner, cur.token)
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
     WHERE l.name = l_name
    RETURNING l.expires_at INTO new_expiry;
    RETURN new_expiry;
END $$;
COMMENT ON FUNCTION lease.renew(text, text, bigint, integer) IS
    'Extends a live lease held by owner with token; LF006 (DETAIL says why) otherwise.';

-- The heartbeat's one step, shared by lease.heartbeat and lease.renew_all:
-- extend owner's session with one row update and return the leases it lost
-- since its last heartbeat, each once: taken over (taken = true, token = the
-- one it held), or expired with a session that lapsed (taken = false). Runs
-- inside those SECURITY DEFINER functions; not executable by PUBLIC.
CREATE FUNCTION lease._beat(owner_id text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, taken boolean)
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    who text COLLATE "default" := owner_id;   -- see lease.acquire
    ttl integer := lease._check_ttl(ttl_ms);
    sess lease.session_state;
    now_ts timestamptz;
BEGIN
    PERFORM lease._check_label('owner', who);
    -- Lock order, as in every lease function: lease rows, then session rows,
    -- then lost_leases.
    SELECT * INTO sess FROM lease.session_state s WHERE s.owner = who FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
        VALUES (who, '-infinity', '-infinity', '-infinity')
        ON CONFLICT (owner) DO NOTHING;
        SELECT * INTO sess FROM lease.session_state s WHERE s.owner = who FOR UPDATE;
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
         WHERE l.owner = who AND l.released_at IS NULL
           AND l.expires_at <= now_ts AND l.expires_at > sess.live_since
           FOR SHARE SKIP LOCKED;
        sess.live_since := now_ts;
    END IF;
    UPDATE lease.session_state s
       SET live_since = sess.live_since, renewed_at = now_ts, expires_at = now_ts + ttl * interval '1 millisecond'
     WHERE s.owner = who;
    -- Takeovers, read after the session lock: one that committed while this
    -- heartbeat waited for it is reported now.
    RETURN QUERY
    DELETE FROM lease.lost_leases x WHERE x.owner = who
    RETURNING x.name, x.token, NULL::timestamptz, true;
END $$;
COMMENT ON FUNCTION lease._beat(text, integer) IS
    'Extends owner''s heartbeat session; returns the leases lost since the last heartbeat (internal).';
REVOKE EXECUTE ON FUNCTION lease._beat(text, integer) FROM PUBLIC;

-- The heartbeat at any scale: one row update, whatever the owner holds. Every
-- live lease of owner lives on with the session; the rows are the leases lost
-- since the last heartbeat (each reported once), so the caller can freeze them.
CREATE FUNCTION lease.heartbeat(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, lost text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    SELECT b.name, b.token, CASE WHEN b.taken THEN 'taken' ELSE 'expired' END
      FROM lease._beat(heartbeat.owner, heartbeat.ttl_ms) b;
END $$;
COMMENT ON FUNCTION lease.heartbeat(text, integer) IS
    'Heartbeat in one row write: keeps every live lease of owner alive for ttl_ms; returns the ones lost (expired or taken).';

-- The heartbeat that also lists what it renewed: lease.heartbeat's one write,
-- plus a row per live lease of owner (renewed = true) beside the lost ones
-- (renewed = false). Reading the list grows with the leases held; lease.heartbeat
-- does not.
CREATE OR REPLACE FUNCTION lease.renew_all(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    who text COLLATE "default" := owner;   -- see lease.acquire
BEGIN
    RETURN QUERY SELECT b.name, b.token, b.expires_at, false FROM lease._beat(who, ttl_ms) b;
    RETURN QUERY
    SELECT l.name, l.token, greatest(l.expires_at, s.expires_at), true
      FROM lease.session_state s JOIN lease.lease_state l ON l.owner = s.owner
     WHERE s.owner = who AND l.released_at IS NULL AND l.expires_at > s.live_since;
END $$;
COMMENT ON FUNCTION lease.renew_all(text, integer) IS
    'Heartbeat: renews every live lease of owner; lost ones come back with renewed = false.';

CREATE OR REPLACE FUNCTION lease.release(name text, owner text, token bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    l_name text COLLATE "default" := name;     -- see lease.acquire
    l_owner text COLLATE "default" := owner;
    was_live boolean;
BEGIN
    IF name IS NULL OR owner IS NULL OR length(name) > 256 OR length(owner) > 256
       OR btrim(name) = '' OR btrim(owner) = '' THEN
        PERFORM lease._check_label('name', name);
        PERFORM lease._check_label('owner', owner);
    END IF;
    -- An expired lease of this holder is marked released too (it stops being
    -- reported as lost), but only a live one counts as released by this call:
    -- alive on its own (its expiry is cut to now), or carried by its owner's
    -- session (its own expiry, kept, is after the session's start).
    UPDATE lease.lease_state l SET released_at = now_ts, expires_at = least(l.expires_at, now_ts)
     WHERE l.name = l_name AND l.owner = l_owner AND l.token = release.token AND l.released_at IS NULL
    RETURNING l.expires_at = now_ts
              OR EXISTS (SELECT FROM lease.session_state s
                          WHERE s.owner = l.owner AND lease._expiry(l.expires_at, s.live_since, s.expires_at) > now_ts)
    INTO was_live;
    RETURN coalesce(was_live, false);
END $$;
COMMENT ON FUNCTION lease.release(text, text, bigint) IS
    'Releases a live lease held by owner with token; anyone may take it at once. False if not held.';

CREATE OR REPLACE FUNCTION lease.release_all(owner text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
    who text COLLATE "default" := owner;   -- see lease.acquire
    released integer;
BEGIN
    PERFORM lease._check_label('owner', who);
    WITH held AS (
        SELECT l.name, lease._expiry(l.expires_at, s.live_since, s.expires_at) > now_ts AS was_live
          FROM lease.lease_state l LEFT JOIN lease.session_state s ON s.owner = l.owner
         WHERE l.owner = who AND l.released_at IS NULL FOR UPDATE OF l
    ), done AS (
        UPDATE lease.lease_state l SET released_at = now_ts, expires_at = least(l.expires_at, now_ts)
          FROM held WHERE l.name = held.name
        RETURNING held.was_live
    )
    SELECT count(*) FILTER (WHERE d.was_live) INTO released FROM done d;
    -- The process is going away: so does its session. Lock order, as in
    -- every lease function: lease rows, then session rows, then lost_leases.
    UPDATE lease.session_state s SET expires_at = now_ts WHERE s.owner = who AND s.expires_at > now_ts;
    DELETE FROM lease.lost_leases x WHERE x.owner = who;
    RETURN released;
END $$;
COMMENT ON FUNCTION lease.release_all(text) IS 'Releases every lease of owner (the SIGTERM path); returns how many were live.';

REVOKE EXECUTE ON FUNCTION lease.heartbeat(text, integer) FROM PUBLIC;
-- 0.3.0 left the owner-row helpers executable by PUBLIC: any role could write
-- or lock an owner row's token as the owner table's owner.
REVOKE EXECUTE ON FUNCTION lease._lock_owner_row(oid, text[]), lease._set_owner_token(oid, text[], bigint) FROM PUBLIC;

-- Which element and column of a fenced_boundary_write call a data error
-- (22xxx, or 23502 for a missing NOT NULL column) comes from: 'rows[3].amount',
-- with the error of that one value; NULL if no single value reproduces it.
-- Runs only after the insert failed (each probe is a subtransaction).
CREATE FUNCTION lease._boundary_problem(target regclass, rows jsonb, err_state text, column_name text,
                                        OUT place text, OUT message text)
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    e jsonb;
    n bigint;
    k text;
BEGIN
    IF err_state = '23502' THEN
        SELECT format('rows[%s].%s', r.n - 1, column_name) INTO place
          FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n)
         WHERE coalesce(r.e -> column_name, 'null'::jsonb) = 'null'::jsonb
         ORDER BY r.e ? column_name DESC, r.n LIMIT 1;   -- an explicit null first, then a missing key
        RETURN;
    END IF;
    FOR e, n IN SELECT r.e, r.n FROM jsonb_array_elements(rows) WITH ORDINALITY AS r(e, n) ORDER BY r.n LOOP
        FOR k IN SELECT jsonb_object_keys(e) LOOP
            BEGIN
                EXECUTE format('SELECT (jsonb_populate_record(NULL::%s, $1)).%I', target, k)
                    USING jsonb_build_object(k, e -> k);
            EXCEPTION WHEN OTHERS THEN
                place := format('rows[%s].%s', n - 1, k);
                GET STACKED DIAGNOSTICS message = MESSAGE_TEXT;
                RETURN;
            END;
        END LOOP;
    END LOOP;
END $$;
COMMENT ON FUNCTION lease._boundary_problem(regclass, jsonb, text, text) IS
    'The element and column a fenced_boundary_write data error comes from (internal; runs as its caller, writes nothing).';

CREATE OR REPLACE FUNCTION lease.fenced_boundary_write(target regclass, token bigint, rows jsonb) RETURNS bigint
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cfg lease.protected;
    bad text;
    problem record;
    err_state text;
    err_message text;
    err_detail text;
    err_column text;
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
    -- A NULL token needs no check here: the fence refuses every row it would
    -- stamp (LF003), and records the refusals.
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
        -- Only a token bound in this transaction is restored afterwards.
        previous_token := lease._bound_token()::text;
        PERFORM set_config('pg_lease.token', coalesce(token::text, ''), true);
    END IF;

    -- Rows are inserted in groups with the same keys, so that a column an
    -- object leaves out takes its default rather than NULL.
    BEGIN
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
    EXCEPTION WHEN data_exception OR not_null_violation THEN
        -- Say which element and column: 'rows[3].amount: invalid input syntax
        -- for type bigint: "ten"'. Fence refusals (LF...) are not caught here.
        GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_message = MESSAGE_TEXT,
                                err_detail = PG_EXCEPTION_DETAIL, err_column = COLUMN_NAME;
        problem := lease._boundary_problem(target, rows, err_state, err_column);
        IF problem.place IS NULL THEN
            RAISE;
        ELSIF err_detail IS NULL OR err_detail = '' THEN
            RAISE EXCEPTION 'lease.fenced_boundary_write: %: %', problem.place, coalesce(problem.message, err_message)
                USING ERRCODE = err_state;
        ELSE
            RAISE EXCEPTION 'lease.fenced_boundary_write: %: %', problem.place, coalesce(problem.message, err_message)
                USING ERRCODE = err_state, DETAIL = err_detail;
        END IF;
    END;

    IF cfg.token_column IS NULL THEN
        PERFORM set_config('pg_lease.token', coalesce(previous_token, ''), true);
    END IF;
    RETURN total;
END $$;
COMMENT ON FUNCTION lease.fenced_boundary_write(regclass, bigint, jsonb) IS
    'Inserts a JSON array of rows into a protected table under one fencing token; all or nothing; returns the row count.';

CREATE OR REPLACE VIEW lease.stats AS
SELECT coalesce(d.datname::text, '(dropped)') AS database,
       s.table_name,
       s.accepted,
       s.refused,
       s.last_refusal_at,
       a.queued AS queue_depth,
       a.dropped,
       a.last_flush_at
  FROM lease._stats() s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.database_oid
 CROSS JOIN lease.audit_status() a;

-- Audit: per database
-- Refusals are recorded in the database where they happened (pg_lease.database
-- now defaults to '', per database; set it to keep one central table).
-- lease.audit_status() keeps its columns; lease.audit_databases() is new.
CREATE FUNCTION lease.audit_databases() RETURNS TABLE (
	"database" TEXT,
	"database_oid" oid,
	"central" bool,
	"state" TEXT,
	"worker_pid" INT,
	"queued" bigint,
	"refused" bigint,
	"recorded" bigint,
	"dropped" bigint,
	"last_flush_at" timestamp with time zone,
	"last_error" TEXT,
	"last_error_at" timestamp with time zone,
	"status" TEXT
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'audit_databases_wrapper';
REVOKE EXECUTE ON FUNCTION lease.audit_databases() FROM PUBLIC;

-- The audit table's identity sequence is dumped with it, so a restored audit
-- continues after its highest id.
SELECT pg_catalog.pg_extension_config_dump('lease.rejected_writes_id_seq', '');
