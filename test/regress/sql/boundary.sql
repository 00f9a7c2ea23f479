--
-- lease.fenced_boundary_write: the hand-boundary write, all or nothing,
-- its input validation (with the element and column a bad value came from,
-- rows[i].col) and the fence's refusals passing through.
--
\set VERBOSITY default

CREATE TABLE rooms (id int PRIMARY KEY, owner_fencing_token bigint);
CREATE TABLE hand_payouts (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    room_id       int    NOT NULL,
    hand          int    NOT NULL DEFAULT 0,
    player        text   NOT NULL DEFAULT 'house',
    amount        bigint CHECK (amount >= 0),
    fencing_token bigint NOT NULL
);
INSERT INTO rooms VALUES (1, 5), (2, 8);
SELECT lease.protect('hand_payouts', '{room_id}', 'fencing_token', 'rooms');

-- success: the call's token is stamped on every row; absent columns take their defaults
SELECT lease.fenced_boundary_write('hand_payouts', 5,
    '[{"room_id": 1, "hand": 1, "player": "ann", "amount": 50},
      {"room_id": 1, "hand": 1, "player": "bob", "amount": 0},
      {"room_id": 1}]');
-- a row may carry the token column, if it agrees with the call's token
SELECT lease.fenced_boundary_write('hand_payouts', 8,
    '[{"room_id": 2, "hand": 1, "player": "cy", "amount": 7, "fencing_token": 8}]');
-- an empty array writes nothing
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[]');
SELECT room_id, hand, player, amount, fencing_token FROM hand_payouts ORDER BY id;

--
-- The fence's refusals pass through unchanged (and the whole call rolls back)
--
SELECT lease.fenced_boundary_write('hand_payouts', 4, '[{"room_id": 1, "hand": 2}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 6, '[{"room_id": 1, "hand": 2}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', NULL, '[{"room_id": 1, "hand": 2}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 3, "hand": 2}]');
\echo :LAST_ERROR_SQLSTATE
-- one stale resource refuses every row of the call
SELECT lease.fenced_boundary_write('hand_payouts', 5,
    '[{"room_id": 1, "hand": 2}, {"room_id": 2, "hand": 2}]');
\echo :LAST_ERROR_SQLSTATE

--
-- Bad input is refused before anything is written
--
SELECT lease.fenced_boundary_write(NULL, 5, '[{"room_id": 1}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('rooms', 5, '[{"id": 1}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('no_such_table', 5, '[{"room_id": 1}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', -1, '[{"room_id": 1}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '{"room_id": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1}, 7]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1}, [1, 2]]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "tip": 5, "Hand": 2}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1}, {"room_id": 1, "fencing_token": 4}]');
\echo :LAST_ERROR_SQLSTATE
-- (a string equal to the call's token, as the column reads it, is no contradiction)
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "fencing_token": "5"}]');
\echo :LAST_ERROR_SQLSTATE
-- values of the wrong type name the element and the column
SELECT lease.fenced_boundary_write('hand_payouts', 5,
    '[{"room_id": 1, "amount": 10}, {"room_id": 1, "amount": 20}, {"room_id": 1, "amount": "ten"}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1}, {"room_id": "x"}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "amount": 1e30}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "hand": 2.5}]');
\echo :LAST_ERROR_SQLSTATE
-- a NOT NULL column: an explicit null, or a missing column without a default
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1}, {"room_id": 1, "player": null}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "hand": 2}, {"hand": 3}]');
\echo :LAST_ERROR_SQLSTATE
-- a CHECK constraint
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "amount": -1}]');
\echo :LAST_ERROR_SQLSTATE
-- a generated identity column
SELECT lease.fenced_boundary_write('hand_payouts', 5, '[{"room_id": 1, "id": 100}]');
\echo :LAST_ERROR_SQLSTATE
-- nothing of the refused calls was written
SELECT count(*) FROM hand_payouts;

--
-- A table protected without a token column: the call binds its token for the
-- inserts and restores the transaction's own binding afterwards
--
CREATE TABLE hand_log (room_id int NOT NULL, line text);
SELECT lease.protect('hand_log', '{room_id}', owner_table => 'rooms');
BEGIN;
SELECT lease.bind_token(8);
SELECT lease.fenced_boundary_write('hand_log', 5, '[{"room_id": 1, "line": "deal"}]');
SELECT lease.bound_token();
INSERT INTO hand_log VALUES (2, 'fold');
COMMIT;
SELECT lease.bound_token();
SELECT lease.fenced_boundary_write('hand_log', 4, '[{"room_id": 1, "line": "stale"}]');
\echo :LAST_ERROR_SQLSTATE
SELECT lease.fenced_boundary_write('hand_log', NULL, '[{"room_id": 1, "line": "none"}]');
\echo :LAST_ERROR_SQLSTATE
SELECT room_id, line FROM hand_log ORDER BY room_id;

DROP TABLE hand_payouts, hand_log, rooms;
