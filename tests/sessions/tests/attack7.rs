//! Attack review 7 (0.6.0, the owner lookup without SPI). Each test states the
//! behaviour pg_lease should have; at commit time (3247f7c) all four fail:
//! they reproduce the findings. A fix may refuse the setup instead (protect,
//! or the owner row that makes the key ambiguous): the tests accept that.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

/// Protects `target` against `owner`; false when protect refuses the setup
/// with one of `refusals` (any other outcome fails the test).
fn protect(c: &mut Client, sql: &str, refusals: &[&str]) -> bool {
    let state = try_sql(c, sql);
    assert!(state.is_empty() || refusals.contains(&state.as_str()), "protect failed with {state}");
    state.is_empty()
}

/// Two owner rows equal under the fence's `=` but distinct for the owner
/// key's only unique index: the first (token 1) inserted, then the second
/// (token 9), a stale write with token 1 must not commit. Accepted fixes:
/// protect refuses the index (42830), or the second owner row is refused.
fn ambiguous_owner_key(label: &str, setup: &str, protect_sql: &str, owner_rows: [&str; 2], stale_write: &str) {
    let db = TestDb::new(label);
    let mut admin = db.connect();
    admin.batch_execute(setup).unwrap();
    if !protect(&mut admin, protect_sql, &["42830"]) {
        return;
    }
    admin.batch_execute(owner_rows[0]).unwrap();
    if !try_sql(&mut admin, owner_rows[1]).is_empty() {
        return; // the ambiguity is refused: fine
    }
    // The stale writer, in its own session.
    let mut stale = db.connect();
    let state = try_sql(&mut stale, stale_write);
    assert_ne!(state, "", "a write with token 1 committed while an owner row of its key holds token 9");
}

/// `lease.protect` requires *a* unique index on the owner key, but not one
/// whose equality is the one the fence compares keys with
/// (`OPERATOR(pg_catalog.=)`). With `record_image_ops` (binary equality) the
/// owner table holds two rows for one key under `=`, (1.0) and (1.00); the
/// lookup (SPI, since that index is not usable by the index path) takes
/// whichever comes first, and a stale writer's token 1 is accepted for a
/// resource whose other owner row says 9 (while the current token 9 is
/// refused as LF002).
#[test]
fn an_owner_key_unique_only_by_binary_image_is_not_a_fence() {
    ambiguous_owner_key(
        "a7_image",
        "CREATE TYPE room_key AS (n numeric);
         CREATE TABLE rooms (k room_key, owner_fencing_token bigint);
         CREATE UNIQUE INDEX rooms_k ON rooms (k record_image_ops);
         CREATE TABLE msgs (id serial PRIMARY KEY, room room_key, fencing_token bigint);",
        "SELECT lease.protect('msgs', '{room}', 'fencing_token', owner_table => 'rooms', owner_key_columns => '{k}')",
        ["INSERT INTO rooms VALUES (ROW(1.0), 1)", "INSERT INTO rooms VALUES (ROW(1.00), 9)"],
        "INSERT INTO msgs (room, fencing_token) VALUES (ROW(1.00), 1)",
    );
}

/// The same with a nondeterministic (case-insensitive) collation: the owner
/// key column is `COLLATE ci` (so the fence compares case-insensitively) but
/// its only unique index is `COLLATE "C"`: 'ALICE' (token 1) and 'alice'
/// (token 9) coexist, and the stale token 1 is accepted for 'alice'.
#[test]
fn an_owner_key_unique_only_in_another_collation_is_not_a_fence() {
    ambiguous_owner_key(
        "a7_coll",
        "CREATE COLLATION a7ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE players (name text COLLATE a7ci, owner_fencing_token bigint);
         CREATE UNIQUE INDEX players_name ON players (name COLLATE \"C\");
         CREATE TABLE bets (id serial PRIMARY KEY, player text, fencing_token bigint);",
        "SELECT lease.protect('bets', '{player}', 'fencing_token', owner_table => 'players', owner_key_columns => '{name}')",
        ["INSERT INTO players VALUES ('ALICE', 1)", "INSERT INTO players VALUES ('alice', 9)"],
        "INSERT INTO bets (player, fencing_token) VALUES ('alice', 1)",
    );
}

/// Owner key `date`, fenced key `timestamptz`: protect accepts the pair (there
/// is a `date = timestamptz` operator, and it is in the index's family, so the
/// index path uses it), but that operator depends on the session's TimeZone.
/// The same fenced row is judged against owner row 2020-01-01 (token 9) in one
/// session and 2020-01-02 (token 1) in another: the writer picks its owner row
/// with `SET TimeZone`, and the stale token 1 commits.
#[test]
fn the_owner_row_does_not_depend_on_the_writers_time_zone() {
    let db = TestDb::new("a7_tz");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "CREATE TABLE days (day date PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE entries (id serial PRIMARY KEY, at timestamptz, fencing_token bigint);
             INSERT INTO days VALUES ('2020-01-01', 9), ('2020-01-02', 1);
             DROP ROLE IF EXISTS a7_writer; CREATE ROLE a7_writer LOGIN;
             GRANT INSERT ON entries TO a7_writer; GRANT USAGE ON SEQUENCE entries_id_seq TO a7_writer;",
        )
        .unwrap();
    if !protect(
        &mut admin,
        "SELECT lease.protect('entries', '{at}', 'fencing_token', owner_table => 'days', owner_key_columns => '{day}')",
        &["42883", "0A000", "42804"],
    ) {
        return;
    }
    let row = "INSERT INTO entries (at, fencing_token) VALUES ('2020-01-01 12:00+00', 1)";
    // Two sessions of an ordinary writer role.
    let mut west = db.connect_as("a7_writer");
    west.batch_execute("SET TimeZone = 'Etc/GMT+12'").unwrap();
    let mut east = db.connect_as("a7_writer");
    east.batch_execute("SET TimeZone = 'Etc/GMT-12'").unwrap();
    let in_west = try_sql(&mut west, row);
    let in_east = try_sql(&mut east, row);
    assert_eq!(in_west, in_east, "the same row gets a different verdict under another TimeZone");
}

/// `ATTACH PARTITION`'s check of incoming rows (lease._key_match) falls back
/// to comparing keys as text when no exact internal `=` takes (owner key
/// type, fenced key type), e.g. a fenced key of a domain over float8. Its
/// comment says text "can only refuse rows the fence would accept, never the
/// reverse", but text depends on the session: with `extra_float_digits = -15`
/// float8 1 and 1.4 both print as `1`, the incoming row (1.4, token 5) matches
/// owner row 1 (token 5), and the table owner attaches a row the fence
/// refuses with LF001 (its owner row 1.4 holds token 9).
#[test]
fn attach_cannot_bring_in_a_stale_row_through_text_comparison() {
    let db = TestDb::new("a7_attach");
    let mut admin = db.connect();
    admin
        .batch_execute(
            "DROP ROLE IF EXISTS a7_migrator; CREATE ROLE a7_migrator LOGIN;
             GRANT CREATE ON SCHEMA public TO a7_migrator;
             GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO a7_migrator;",
        )
        .unwrap();
    // A non-superuser migration role owns both tables and protects them.
    let mut migrator = db.connect_as("a7_migrator");
    migrator
        .batch_execute(
            "CREATE DOMAIN fkey AS float8;
             CREATE TABLE fo (k float8 PRIMARY KEY, owner_fencing_token bigint);
             INSERT INTO fo VALUES (1, 5), (1.4, 9);
             CREATE TABLE fp (id int, k fkey, fencing_token bigint) PARTITION BY LIST (id);
             CREATE TABLE fp1 PARTITION OF fp FOR VALUES IN (1);
             SELECT lease.protect('fp', '{k}', 'fencing_token', owner_table => 'fo', owner_key_columns => '{k}');",
        )
        .unwrap();
    // Through the fence, in another session, the row is stale.
    expect_error(&mut admin, "INSERT INTO fp VALUES (1, 1.4, 5)", "LF001");
    // The same row attached.
    migrator
        .batch_execute("CREATE TABLE fp2 (id int, k fkey, fencing_token bigint); INSERT INTO fp2 VALUES (2, 1.4, 5);")
        .unwrap();
    expect_error(&mut migrator, "ALTER TABLE fp ATTACH PARTITION fp2 FOR VALUES IN (2)", "LF008");
    migrator.batch_execute("SET extra_float_digits = -15").unwrap();
    let state = try_sql(&mut migrator, "ALTER TABLE fp ATTACH PARTITION fp2 FOR VALUES IN (2)");
    assert_eq!(one_i64(&mut admin, "SELECT count(*) FROM fp"), 0, "a row with token 5 against owner token 9 is in fp");
    assert_eq!(state, "LF008", "ATTACH brought in a row whose token 5 is below its owner row's token 9");
}
