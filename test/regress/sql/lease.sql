--
-- Leases: lease.acquire, try_acquire, renew, heartbeat, renew_all, release,
-- release_all, the views lease.leases and lease.sessions, LF005/LF006 and
-- the validation of names, owners and TTLs.
--
-- Tokens depend on the server's timeline (token = epoch << 40 | counter) and
-- expiries on the clock: tokens are kept in psql variables and shown as
-- differences, times as comparisons. LF005/LF006 carry expiries, intervals
-- and tokens in their text; pg_temp.lease_error shows such an error with
-- those masked: <time>, <interval>, and a token as <epoch>+counter.
\set VERBOSITY default
-- Times in these messages follow the session's settings: make them ISO, in UTC.
SET DateStyle = 'ISO, YMD';
SET IntervalStyle = 'postgres';
SET TimeZone = 'UTC';

CREATE FUNCTION pg_temp.lease_error(sql text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    message text;
    detail text;
    hint text;
    m text[];
BEGIN
    EXECUTE sql;
    RAISE NOTICE 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    message := SQLSTATE || ' ' || message;
    FOR m IN SELECT regexp_matches(message || ' ' || detail, '\m[0-9]{13,19}\M', 'g') LOOP
        message := replace(message, m[1], '<epoch>+' || (m[1]::bigint & ((1::bigint << 40) - 1)));
        detail := replace(detail, m[1], '<epoch>+' || (m[1]::bigint & ((1::bigint << 40) - 1)));
    END LOOP;
    detail := regexp_replace(detail, '[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+([+-][0-9]{2}(:[0-9]{2})?)?', '<time>', 'g');
    detail := regexp_replace(detail, '-?[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?', '<interval>', 'g');
    RAISE NOTICE '%', message USING DETAIL = coalesce(detail, ''), HINT = coalesce(hint, '');
END $$;

--
-- acquire: a free lease is taken with a new token
--
SELECT token AS t1, expires_at AS e1 FROM lease.acquire('room:1', 'host-a', 60000) \gset
SELECT :t1 > 0 AS issued,
       :'e1'::timestamptz > now() + interval '50 seconds'
       AND :'e1'::timestamptz <= clock_timestamp() + interval '60 seconds' AS expires_after_ttl;
SELECT name, owner, token = :t1 AS same_token, live, released_at IS NULL AS unreleased,
       expires_at = :'e1' AS same_expiry, owner_table, owner_key
  FROM lease.leases WHERE name = 'room:1';
-- the same owner re-takes it: the token is bumped, fencing its previous process
SELECT token - :t1 AS bump FROM lease.acquire('room:1', 'host-a', 60000);
SELECT token AS t2 FROM lease.leases WHERE name = 'room:1' \gset
-- another owner: LF005 while the lease is live (terse: its DETAIL has the expiry)
\set VERBOSITY terse
SELECT * FROM lease.acquire('room:1', 'host-b', 60000);
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.lease_error($$SELECT lease.acquire('room:1', 'host-b', 60000)$$);
-- try_acquire: no row instead of LF005, a row otherwise
SELECT count(*) AS rows FROM lease.try_acquire('room:1', 'host-b', 60000);
SELECT token - :t2 AS bump FROM lease.try_acquire('room:1', 'host-a', 60000);
SELECT token AS t3 FROM lease.leases WHERE name = 'room:1' \gset
-- every lease draws from one counter (since 0.9.0): room:9 comes after room:1's three
SELECT token - :t1 AS from_room_1 FROM lease.acquire('room:9', 'host-a', 60000);

--
-- renew: only the holder, with the current token, of a live lease
--
SELECT lease.renew('room:1', 'host-a', :t3, 30000) BETWEEN now() + interval '29 seconds'
       AND clock_timestamp() + interval '30 seconds' AS renewed;
SELECT pg_temp.lease_error($$SELECT lease.renew('room:1', 'host-a', $$ || :t2 || $$, 30000)$$);
SELECT pg_temp.lease_error($$SELECT lease.renew('room:1', 'host-a', $$ || :t3 + 5 || $$, 30000)$$);
SELECT pg_temp.lease_error($$SELECT lease.renew('room:1', 'host-b', $$ || :t3 || $$, 30000)$$);
SELECT pg_temp.lease_error($$SELECT lease.renew('no-such-lease', 'host-a', 1, 30000)$$);
SELECT lease.renew('room:1', 'host-a', NULL, 30000);
\echo :LAST_ERROR_SQLSTATE

--
-- Expiry: judged on the database clock; an expired lease can be taken
--
SELECT token AS s1 FROM lease.acquire('room:2', 'host-a', 100) \gset
SELECT pg_sleep(0.3);
SELECT live FROM lease.leases WHERE name = 'room:2';
SELECT pg_temp.lease_error($$SELECT lease.renew('room:2', 'host-a', $$ || :s1 || $$, 30000)$$);
SELECT token - :s1 AS bump FROM lease.acquire('room:2', 'host-b', 60000);
SELECT token AS s2 FROM lease.leases WHERE name = 'room:2' \gset
SELECT pg_temp.lease_error($$SELECT lease.renew('room:2', 'host-a', $$ || :s1 || $$, 30000)$$);

--
-- heartbeat: one write per owner; reports each lost lease once
--
SELECT name, token = :s1 AS its_old_token, lost FROM lease.heartbeat('host-a', 60000);
SELECT name, token, lost FROM lease.heartbeat('host-a', 60000);
SELECT owner, live FROM lease.sessions WHERE owner = 'host-a';
-- a lease carried by its owner's session outlives its own expiry
SELECT token AS c1 FROM lease.acquire('room:3', 'host-c', 1000) \gset
SELECT name, token, lost FROM lease.heartbeat('host-c', 60000);
SELECT pg_sleep(1.1);
SELECT name, live FROM lease.leases WHERE name = 'room:3';
SELECT count(*) AS rows FROM lease.try_acquire('room:3', 'host-d', 60000);
SELECT lease.renew('room:3', 'host-c', :c1, 60000) > now() AS renewed;
-- a session that lapses: its leases past their own expiry are reported expired
SELECT token AS x1 FROM lease.acquire('room:4', 'host-e', 1000) \gset
SELECT name, token, lost FROM lease.heartbeat('host-e', 100);
SELECT pg_sleep(1.1);
SELECT owner, live FROM lease.sessions WHERE owner = 'host-e';
SELECT name, token = :x1 AS its_token, lost FROM lease.heartbeat('host-e', 60000);
SELECT name, token, lost FROM lease.heartbeat('host-e', 60000);
SELECT name, live FROM lease.leases WHERE name = 'room:4';

--
-- renew_all: the heartbeat plus one row per live lease
--
SELECT name, token - :t1 AS counter_from_room_1, expires_at > now() + interval '59 seconds' AS extended, renewed
  FROM lease.renew_all('host-a', 60000) ORDER BY renewed, name;
-- a takeover is reported by renew_all too (renewed = false), once
SELECT token AS f1 FROM lease.acquire('room:8', 'host-f', 100) \gset
SELECT pg_sleep(0.3);
SELECT token - :f1 AS bump FROM lease.acquire('room:8', 'host-g', 60000);
SELECT name, token = :f1 AS its_old_token, renewed FROM lease.renew_all('host-f', 60000) ORDER BY renewed, name;
SELECT name, token, renewed FROM lease.renew_all('host-f', 60000);
SELECT name, token - :f1 AS bump, renewed FROM lease.renew_all('host-g', 60000);

--
-- release / release_all
--
SELECT lease.release('room:1', 'host-a', :t2) AS wrong_token;
SELECT lease.release('room:1', 'host-b', :t3) AS not_the_holder;
SELECT lease.release('room:1', 'host-a', :t3) AS released;
SELECT lease.release('room:1', 'host-a', :t3) AS again;
SELECT name, live, released_at IS NOT NULL AS released FROM lease.leases WHERE name = 'room:1';
SELECT pg_temp.lease_error($$SELECT lease.renew('room:1', 'host-a', $$ || :t3 || $$, 30000)$$);
-- a released lease is free at once, with a higher token
SELECT token - :t3 AS bump FROM lease.acquire('room:1', 'host-b', 60000);
SELECT pg_temp.lease_error($$SELECT lease.renew('room:1', 'host-a', $$ || :t3 || $$, 30000)$$);
SELECT lease.acquire('room:5', 'host-b', 60000) IS NOT NULL AS acquired;
SELECT lease.release_all('host-b') AS released;
SELECT lease.release_all('host-b') AS released;
SELECT name, owner, live FROM lease.leases WHERE owner = 'host-b' ORDER BY name;
SELECT owner, live FROM lease.sessions WHERE owner = 'host-b';
SELECT lease.release_all('nobody') AS released;

--
-- Leases bound to an owner row: the new token is written into it
--
CREATE TABLE lobby (id int PRIMARY KEY, owner_fencing_token bigint);
CREATE TABLE chips (lobby_id int, amount int, token bigint);
INSERT INTO lobby VALUES (7, NULL), (8, NULL);
SELECT lease.protect('chips', '{lobby_id}', 'token', 'lobby');
SELECT token AS o1 FROM lease.acquire('lobby:7', 'host-a', 60000, 'lobby', '{7}') \gset
SELECT owner_fencing_token = :o1 AS owner_row_has_token FROM lobby WHERE id = 7;
SELECT owner_table, owner_key FROM lease.leases WHERE name = 'lobby:7';
INSERT INTO chips VALUES (7, 100, :o1);
SELECT token - :o1 AS bump FROM lease.acquire('lobby:7', 'host-a', 60000, 'lobby', '{7}');
SELECT owner_fencing_token - :o1 AS owner_row_bump FROM lobby WHERE id = 7;
SELECT pg_temp.lease_error($$INSERT INTO chips VALUES (7, 100, $$ || :o1 || $$)$$);
-- the new token is above the owner row's token too (one set by hand above the
-- counter raises the base to the next band, 1024 epochs up, with the counter
-- drawn: since 0.9.2, an epoch no promoted standby's timeline reaches)
UPDATE lobby SET owner_fencing_token = :o1 + 100 WHERE id = 7;
SELECT token > :o1 + 100 AS above_owner_row, (token >> 40) - (:o1 >> 40) AS next_epoch
  FROM lease.acquire('lobby:7', 'host-a', 60000, 'lobby', '{7}');
-- refusals
SELECT lease.acquire('lobby:9', 'host-a', 60000, 'lobby', '{9}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, 'lobby', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, NULL, '{8}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, 'lobby', '{8,1}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, 'lobby', '{NULL}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, 'chips', '{8}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('lobby:8', 'host-a', 60000, 'lobby', '{eight}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release_all('host-a') AS released;

--
-- Input validation: TTLs, names and owners
--
SELECT lease.acquire('room:6', 'host-a', 99);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('room:6', 'host-a', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('room:6', 'host-a', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('room:6', 'host-a', 86400001);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('room:6', 'host-a', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire(NULL, 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('', 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('   ', 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire(repeat('x', 257), 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire('room:6', NULL, 1000);
\echo :LAST_ERROR_SQLSTATE
-- Blank is any Unicode whitespace; control characters are refused anywhere.
SELECT lease.acquire('room:6', E'\t', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire(E'\n', 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire(E'\u00a0', 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.acquire(E'room\t6', 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release_all(E'\t');
\echo :LAST_ERROR_SQLSTATE
-- 256 characters (not bytes) is the limit.
SELECT count(*) AS accepted FROM lease.acquire(repeat('é', 256), 'host-a', 1000);
SELECT lease.release_all('host-a') AS released;
SELECT lease.try_acquire('room:6', 'host-a', 50);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.try_acquire(NULL, 'host-a', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew('room:6', 'host-a', 1, 99);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew('', 'host-a', 1, 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.heartbeat('host-a', 99);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.heartbeat(NULL, 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.heartbeat(repeat('h', 300), 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew_all('', 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.renew_all('host-a', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release(NULL, 'host-a', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release('room:6', ' ', 1);
\echo :LAST_ERROR_SQLSTATE
-- renew refuses a NULL token (above); release answers false
SELECT lease.release('room:6', 'host-a', NULL) AS released;
SELECT lease.release_all(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.release_all('');
\echo :LAST_ERROR_SQLSTATE
-- the TTL bounds are settings (superuser only)
SET pg_lease.min_ttl_ms = 10;
SELECT lease.acquire('room:7', 'host-a', 50) IS NOT NULL AS acquired;
RESET pg_lease.min_ttl_ms;
SET pg_lease.max_ttl_ms = 1000;
SELECT lease.renew_all('host-a', 2000);
\echo :LAST_ERROR_SQLSTATE
RESET pg_lease.max_ttl_ms;
-- nothing was recorded for the refused names
SELECT count(*) FROM lease.leases WHERE name IS NULL OR btrim(name) = '' OR length(name) > 256;

SELECT lease.release_all(o) FROM unnest('{host-a,host-b,host-c,host-d,host-e,host-f,host-g}'::text[]) o;
DROP TABLE chips, lobby;
