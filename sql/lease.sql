-- The lease service: acquire / renew / renew_all / release with durable,
-- failover-safe fencing tokens, judged on the database clock.
--
-- One convention in every function here that runs SQL:
-- - `#variable_conflict use_column`: a bare name in a statement is the
--   column (ON CONFLICT (name) needs it);
-- - a name or owner parameter is copied into a `p_<parameter>` local
--   declared COLLATE "default", and only that local is used, so names and
--   owners compare as the stored rows do whatever collation the caller's
--   argument carries (a nondeterministic one would alias them);
-- - every column is qualified by its table's alias, and any other parameter
--   whose name a column shares is written `function.parameter`.
-- Functions that only pass their arguments on (try_acquire, heartbeat) pass
-- them as they came.

-- One row per lease name, forever: release and expiry only mark the row, so a
-- name's token counter can never start over.
CREATE TABLE lease.lease_state (
    name        text        PRIMARY KEY,
    owner       text        NOT NULL,
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    released_at timestamptz,
    owner_table regclass,
    owner_key   text[]
) WITH (fillfactor = 70);  -- renewals update in place (HOT)
CREATE INDEX lease_state_owner ON lease.lease_state (owner) WHERE released_at IS NULL;
-- The live bindings of an owner table, for acquire's one-lease-per-owner-row
-- rule (src/lease_calls.rs, rival_on_row). By table only: a re-take changes
-- the token, not the binding, and stays a HOT update.
CREATE INDEX lease_state_bound ON lease.lease_state (owner_table) WHERE owner_table IS NOT NULL AND released_at IS NULL;
COMMENT ON TABLE lease.lease_state IS 'pg_lease leases; use the lease.* functions, read lease.leases.';
REVOKE ALL ON lease.lease_state FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.lease_state', '');

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

-- The token epoch's base (since 0.3.0). A token's epoch is the highest base
-- recorded (0 without any) + the WAL timeline. Timelines restart at 1 after dump/restore and pg_upgrade while
-- stored tokens keep their old epoch; when an acquire meets a stored token
-- from an epoch above the current one, base rises to that epoch, so the new
-- token's epoch is above every stored one *and* above anything an old primary
-- computed from the same data at a lower timeline (see lease.acquire).
CREATE TABLE lease.token_epoch (
    base      bigint      PRIMARY KEY CHECK (base > 0),
    raised_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE lease.token_epoch IS 'Raises of the fencing-token epoch base (epoch = max(base) + timeline); empty until a restore needs one.';
REVOKE ALL ON lease.token_epoch FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_epoch', '');

-- The highest token epoch issued so far (since 0.4.0), written when an acquire
-- first issues a token in a higher epoch. A timeline that restarts below it
-- (pg_upgrade, a restore into a new cluster) is detected by the next acquire,
-- which raises the base above it (since 0.9.2 also by the origin below, two
-- bands above it: see lease.token_origin and README, Upgrades).
-- origin (since 0.9.2): the incarnation (lease._origin()) whose acquire
-- wrote the row; another's, or NULL (written before 0.9.2, or restored from
-- a 0.9.1 dump), makes the next acquire raise the base two bands, as a
-- foreign row of lease.token_origin does (below).
CREATE TABLE lease.token_epoch_issued (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch     bigint  NOT NULL,
    origin    bigint
);
COMMENT ON TABLE lease.token_epoch_issued IS 'The highest fencing-token epoch issued so far (one row), and the database incarnation that issued it.';
REVOKE ALL ON lease.token_epoch_issued FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_epoch_issued', '');

-- The database incarnations whose lease state this database holds (since
-- 0.9.2), each as lease._origin() gives it: the cluster's system identifier
-- with the database's and pg_lease's OIDs. CREATE EXTENSION records its own.
-- pg_dump carries the rows, and pg_upgrade copies them into a cluster with
-- another identifier: a database restored from a dump or upgraded so holds
-- its source's row, a source that may have gone on issuing tokens after the
-- state was taken. Its next acquire raises the epoch base two bands above
-- every epoch it knows (lease::token_rule, README "Tokens only rise") and
-- keeps only its own row. A promoted standby and a point-in-time recovery
-- keep the identifier and OIDs: their new timeline is their new epoch.
CREATE TABLE lease.token_origin (
    origin      bigint      PRIMARY KEY,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE lease.token_origin IS 'The database incarnations whose lease state this database holds (a restore or pg_upgrade brings its source''s; the next acquire moves past it).';
REVOKE ALL ON lease.token_origin FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_origin', '');
COMMENT ON FUNCTION lease._origin() IS
    'This database incarnation (system identifier, database and extension OIDs) as one bigint (internal).';
REVOKE EXECUTE ON FUNCTION lease._origin() FROM PUBLIC;
INSERT INTO lease.token_origin (origin) VALUES (lease._origin());
COMMENT ON FUNCTION lease._epoch_band_above(bigint) IS
    'The smallest epoch base of a band above epoch: where lease.issue_tokens_above raises the base to (internal).';
REVOKE EXECUTE ON FUNCTION lease._epoch_band_above(bigint) FROM PUBLIC;

-- The counter every token is drawn from (since 0.9.0; the low 40 bits of a
-- token, the epoch above them): one for the database, so no two acquires are
-- given the same token, and not transactional, so a token an acquire returned
-- is never issued again, even if that acquire's transaction rolled back (its
-- caller may have used it). Dumped with its value.
CREATE SEQUENCE lease.token_counter AS bigint MINVALUE 1 MAXVALUE 1099511627775 NO CYCLE;   -- 2^40 - 1
COMMENT ON SEQUENCE lease.token_counter IS 'The counter of fencing tokens (their low 40 bits; lease.acquire draws from it).';
REVOKE ALL ON lease.token_counter FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_counter', '');

-- The highest epoch a token was issued in, with the WAL timeline it was
-- issued on (epoch << 32 | timeline; since 0.9.2). A sequence, so that no
-- rollback lowers it: an epoch raised by an acquire (above a hand-set owner
-- token, or after lease.issue_tokens_above) in a transaction that then rolls
-- back has still handed its token out, and every later token, of any lease,
-- must stay above it (lease::EpochFloor). Raised by lease.acquire only, under
-- a lock, with setval; ALTER SEQUENCE of it is refused (LF008). Dumped with
-- its value.
CREATE SEQUENCE lease.token_epoch_floor AS bigint MINVALUE 0 MAXVALUE 4611686018427387903 START 0 NO CYCLE;   -- 2^62 - 1
SELECT pg_catalog.setval('lease.token_epoch_floor', 0, true);
COMMENT ON SEQUENCE lease.token_epoch_floor IS 'The highest fencing-token epoch issued, with its timeline (epoch << 32 | timeline); never lowered by a rollback.';
REVOKE ALL ON lease.token_epoch_floor FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('lease.token_epoch_floor', '');

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

-- The one rule for when a lease expires: its own expiry, or its owner's
-- session's if the session carries it (see lease.session_state). NULL session
-- bounds (no session) leave the lease's own expiry. A SQL-standard body is
-- bound when created (no search_path at run time) and inlined by the planner.
CREATE FUNCTION lease._expiry(own timestamptz, session_since timestamptz, session_expires timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN own OPERATOR(pg_catalog.>) session_since THEN greatest(own, session_expires) ELSE own END;
COMMENT ON FUNCTION lease._expiry(timestamptz, timestamptz, timestamptz) IS
    'A lease''s effective expiry from its own and its owner session''s bounds (internal).';

CREATE VIEW lease.leases AS
SELECT l.name, l.owner, l.token, l.acquired_at,
       CASE WHEN l.expires_at OPERATOR(pg_catalog.>) s.live_since
            THEN greatest(l.renewed_at, s.renewed_at) ELSE l.renewed_at END AS renewed_at,
       lease._expiry(l.expires_at, s.live_since, s.expires_at) AS expires_at,
       (l.released_at IS NULL
        AND lease._expiry(l.expires_at, s.live_since, s.expires_at) OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS live,
       l.released_at, l.owner_table, l.owner_key
  FROM lease.lease_state l
  LEFT JOIN lease.session_state s ON s.owner OPERATOR(pg_catalog.=) l.owner AND l.released_at IS NULL;
COMMENT ON VIEW lease.leases IS 'Every lease ever taken: holder, current token, expiry, and whether it is live now.';

CREATE VIEW lease.sessions AS
SELECT s.owner, s.live_since, s.renewed_at, s.expires_at,
       s.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AS live
  FROM lease.session_state s;
COMMENT ON VIEW lease.sessions IS 'Heartbeat sessions: per owner, since when it has been alive without a break and until when.';

-- Lease names and owners (labels): the rule lives in src/lease.rs
-- (`check_label`); lease functions call this on every label they take.
CREATE FUNCTION lease._check_label(what text, value text) RETURNS void
    LANGUAGE C IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_lease_check_label';
COMMENT ON FUNCTION lease._check_label(text, text) IS
    'Raises 22004/22023 unless value is a valid lease name or owner: not NULL, not blank, no control characters, at most 256 characters (internal).';

-- `lease._label(what, value)`: value, once it passes the same rule. The lease
-- functions take their labels with it in an assignment, a plain expression
-- that runs no SQL statement.
CREATE FUNCTION lease._label(what text, value text) RETURNS text
    LANGUAGE C IMMUTABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_lease_label';
COMMENT ON FUNCTION lease._label(text, text) IS
    'Returns value if it is a valid lease name or owner, else raises as lease._check_label does (internal).';
REVOKE EXECUTE ON FUNCTION lease._label(text, text) FROM PUBLIC;

-- `lease._check_ttl(ttl_ms)`: the TTL if within pg_lease.min_ttl_ms ..
-- pg_lease.max_ttl_ms, else 22004/22023 (src/lease.rs).
CREATE FUNCTION lease._check_ttl(ttl_ms integer) RETURNS integer
    LANGUAGE C STABLE PARALLEL SAFE AS 'MODULE_PATHNAME', 'pg_lease_check_ttl';

-- The token rule, in one place (src/lease.rs, token_rule): lease.acquire
-- issues with it, and lease.token_ceiling / lease.issue_tokens_above
-- (blue/green cutover) judge with it through lease._next_token(stored,
-- timeline), a C function (since 0.9.0; SQL before): for a lease whose
-- highest stored token (its own, its owner row's) is `stored`, on WAL
-- timeline `timeline`, the next token (NULL when none is left), the epoch,
-- lease.token_epoch_issued's epoch and the base the epoch must rise to
-- (`raise_base`: the caller records it when it issues). It reads the epoch
-- tables as a statement run at that moment would (fresh at READ COMMITTED).
COMMENT ON FUNCTION lease._next_token(bigint, bigint) IS
    'The next fencing token after stored on timeline, by the epoch rule (NULL when none is left), with the epoch and the base raise it needs (internal).';
REVOKE EXECUTE ON FUNCTION lease._next_token(bigint, bigint) FROM PUBLIC;

-- acquire and try_acquire are Rust (src/lease_calls.rs, since 0.8.0), run as
-- the function's owner as SECURITY DEFINER ran them (renew's way): the lease
-- row locked FOR UPDATE (created on first use), the new holder's session row,
-- a live holder's session row FOR SHARE (a lease past its own expiry may be
-- carried by it), then the owner row (lease._lock_owner_row's FOR UPDATE, as
-- the owner table's owner); at REPEATABLE READ and above the issued-epoch row
-- FOR SHARE; the next token by lease._next_token; the lease row updated,
-- lost_leases told, a live previous holder notified on channel pg_lease; and
-- synchronous_commit = off raised to local for the transaction (a token is
-- durable before the client sees it). A name's first acquire without an
-- owner row ("fresh") inserts the lease row once, with its token, then its
-- session row, in one statement; if another acquire created the row since,
-- it judges again under that row's lock. With an owner row, the lease row is
-- created first, so the owner row is locked under its lock as always.
CREATE FUNCTION lease.acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                              owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_acquire';
COMMENT ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) IS
    'Takes (or re-takes) a lease with a new, higher fencing token; LF005 when another live owner holds it.';

-- acquire in a subtransaction: no row (and nothing done) when another live
-- owner holds the lease.
CREATE FUNCTION lease.try_acquire(name text, owner text, ttl_ms integer, owner_table regclass DEFAULT NULL,
                                  owner_key text[] DEFAULT NULL)
RETURNS TABLE (token bigint, expires_at timestamptz)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_try_acquire';
COMMENT ON FUNCTION lease.try_acquire(text, text, integer, regclass, text[]) IS
    'Like lease.acquire, but returns no row when another live owner holds the lease.';

-- Blue/green: tokens above the old cluster's. Leases and the token epoch
-- are per database and not replicated: on a new cluster fed by logical
-- replication, an owner-bound lease's first token is above its owner row's
-- replicated token, but an unbound lease starts over. At cutover, the old
-- side's ceiling (read once its writers have stopped) is handed to the new
-- side, whose every later token is then above it (README, "Blue/green major
-- upgrade").

-- Above every token this database has issued: max(the highest lease token,
-- the current epoch << 40) + 1 by lease._next_token's rule, i.e. what an
-- acquire of the lease holding the highest token would issue now. Waits for
-- acquires in flight (their row locks) first. In a REPEATABLE READ or
-- SERIALIZABLE transaction it sees the tokens of that transaction's snapshot.
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

-- From now on every token this database issues, for any lease, bound or not,
-- is above `token`: the epoch base rises to the first band above token's
-- epoch unless it is there already (lease._epoch_band_above: a promoted
-- standby that never received the raise, or a point-in-time recovery to
-- before it, then issues in epochs apart from the raise's), recorded in
-- lease.token_epoch as acquire's own raises are, so it holds across
-- failover, pg_upgrade and dumps.
-- Only ever raises; returns the lowest token it can now issue (a fresh
-- lease's next one). Waits for acquires in flight (each holds
-- lease.token_epoch from the moment it read the epoch) and holds later ones
-- until it commits.
CREATE FUNCTION lease.issue_tokens_above(token bigint) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p_token bigint := $1;
    timeline bigint;
    lowest bigint;
    new_base bigint;
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
    -- The base: the first band above token's epoch; the epoch is then
    -- base + timeline, above it. The same token always names the same band,
    -- so a second call with it changes nothing, and after a failover that
    -- lost the first call's raise it raises again (README, Failover).
    new_base := lease._epoch_band_above(p_token >> 40);
    LOCK TABLE lease.token_epoch IN ACCESS EXCLUSIVE MODE;
    IF (SELECT coalesce(max(e.base), 0) FROM lease.token_epoch e) < new_base THEN
        IF new_base + timeline >= 8388608 THEN   -- 2^23
            PERFORM lease._fail('22003', format('lease.issue_tokens_above: no fencing token is left above %s', p_token),
                                format('Tokens are epoch << 40 | counter, epochs below 2^23; this server is on timeline %s.', timeline));
        END IF;
        INSERT INTO lease.token_epoch (base) VALUES (new_base) ON CONFLICT DO NOTHING;
        -- The new epoch counts as issued (only ever higher: a later timeline
        -- restart still goes above it), and writing the row makes an acquire
        -- whose snapshot predates this raise fail to serialize (see acquire).
        -- (A row another incarnation wrote keeps saying so: lease::foreign_origin.)
        INSERT INTO lease.token_epoch_issued AS i (epoch, origin) VALUES (new_base + timeline, lease._origin())
        ON CONFLICT (singleton) DO UPDATE SET epoch = greatest(i.epoch, excluded.epoch);
    END IF;
    SELECT n.token INTO lowest FROM lease._next_token(0, timeline) n;
    IF lowest IS NULL OR lowest <= p_token THEN
        PERFORM lease._fail('22003', format('lease.issue_tokens_above: no fencing token is left above %s', p_token),
                            format('Tokens are epoch << 40 | counter, epochs below 2^23; this server is on timeline %s.', timeline));
    END IF;
    RETURN lowest;
END $$;
COMMENT ON FUNCTION lease.issue_tokens_above(bigint) IS
    'Makes every fencing token this database issues from now on, for any lease, higher than token (only ever raises); returns the lowest it can now issue.';

-- renew and release are Rust (src/lease_calls.rs, since 0.7.0): the same
-- statements as saved plans, run as the function's owner as SECURITY DEFINER
-- ran them, without the per-call cost of a SET clause. The common case of
-- renew is one UPDATE: held by owner with token, not released, alive on its
-- own, the clock read under the row lock. Otherwise the row is judged as a
-- whole under its lock (and its owner's session row's, for a lease carried
-- by its session): renewed, or LF006 with DETAIL saying why.
CREATE FUNCTION lease.renew(name text, owner text, token bigint, ttl_ms integer) RETURNS timestamptz
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_renew';
COMMENT ON FUNCTION lease.renew(text, text, bigint, integer) IS
    'Extends a live lease held by owner with token; LF006 (DETAIL says why) otherwise.';

-- The heartbeat's one step, shared by lease.heartbeat and lease.renew_all:
-- extend owner's session with one row update and return the leases it lost
-- since its last heartbeat, each once: taken over (taken = true, token = the
-- one it held), or expired with a session that lapsed (taken = false). Lock
-- order, as in every lease function: lease rows, then session rows, then
-- lost_leases. The session row is locked (created on first use) and judged
-- on the clock read after the lock; a first heartbeat, or one after the
-- session lapsed, reports the leases it carried past their own expiry (they
-- died with it; a lease an acquire, renew or release is changing right now
-- is skipped, not waited for: a takeover waiting for this session row would
-- deadlock) and starts a new life, which carries only leases alive on their
-- own. Takeovers are read after the session lock. Rust (src/lease_calls.rs,
-- since 0.8.0), as the caller; not executable by PUBLIC.
CREATE FUNCTION lease._beat(owner_id text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, taken boolean)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_beat';
COMMENT ON FUNCTION lease._beat(text, integer) IS
    'Extends owner''s heartbeat session; returns the leases lost since the last heartbeat (internal).';
REVOKE EXECUTE ON FUNCTION lease._beat(text, integer) FROM PUBLIC;

-- The heartbeat at any scale: one row update, whatever the owner holds. Every
-- live lease of owner lives on with the session; the rows are the leases lost
-- since the last heartbeat (each reported once), so the caller can freeze them.
-- Rust (src/lease_calls.rs, since 0.8.0): lease._beat's step as the
-- function's owner, as lease.renew.
CREATE FUNCTION lease.heartbeat(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, lost text)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_heartbeat';
COMMENT ON FUNCTION lease.heartbeat(text, integer) IS
    'Heartbeat in one row write: keeps every live lease of owner alive for ttl_ms; returns the ones lost (expired or taken).';

-- The heartbeat that also lists what it renewed: lease.heartbeat's one write,
-- plus a row per live lease of owner (renewed = true) beside the lost ones
-- (renewed = false). Reading the list grows with the leases held; lease.heartbeat
-- does not. Rust (src/lease_calls.rs, since 0.8.0), as lease.heartbeat.
CREATE FUNCTION lease.renew_all(owner text, ttl_ms integer)
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean)
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_renew_all';
COMMENT ON FUNCTION lease.renew_all(text, integer) IS
    'Heartbeat: renews every live lease of owner; lost ones come back with renewed = false.';

-- An expired lease of this holder is marked released too (it stops being
-- reported as lost), but only a live one counts as released by this call:
-- alive on its own (its expiry is cut to now), or carried by its owner's
-- session (its own expiry, kept, is after the session's start). Rust
-- (src/lease_calls.rs, since 0.7.0), as lease.renew.
CREATE FUNCTION lease.release(name text, owner text, token bigint) RETURNS boolean
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release';
COMMENT ON FUNCTION lease.release(text, text, bigint) IS
    'Releases a live lease held by owner with token; anyone may take it at once. False if not held.';

-- Every lease of owner, locked and released (counting the live ones), then
-- its session ends and its lost_leases reports go: the lock order of every
-- lease function (lease rows, then session rows, then lost_leases). Rust
-- (src/lease_calls.rs, since 0.7.0), as lease.renew.
CREATE FUNCTION lease.release_all(owner text) RETURNS integer
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release_all';
COMMENT ON FUNCTION lease.release_all(text) IS 'Releases every lease of owner (the SIGTERM path); returns how many were live.';

-- Lease operations write pg_lease's state and bound owner rows as the
-- extension owner; the DBA grants them to the game server's role.
-- The owner-row helpers lock and write owner rows as the owner table's owner:
-- only the lease functions above (run as the extension owner) may call them.
REVOKE EXECUTE ON FUNCTION lease._lock_owner_row(oid, text[]), lease._set_owner_token(oid, text[], bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]), lease.try_acquire(text, text, integer, regclass, text[]),
    lease.renew(text, text, bigint, integer), lease.renew_all(text, integer), lease.heartbeat(text, integer),
    lease.release(text, text, bigint), lease.release_all(text) FROM PUBLIC;
-- The cutover's two calls are the superuser's (or a role the DBA grants them to).
REVOKE EXECUTE ON FUNCTION lease.token_ceiling(), lease.issue_tokens_above(bigint) FROM PUBLIC;
