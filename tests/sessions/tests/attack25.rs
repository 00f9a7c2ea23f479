//! Attack review 25: pg_lease's fence attacked from the application's side
//! (PostgreSQL 15, the build installed from main at 66286b7), over real
//! connections, as the README's roles: a migrator that owns and protects the
//! tables, the application role (`a25_app`, the README's `game_server`
//! grants), a role granted UPDATE on owner rows (`a25_updater`), and pooled
//! clients behind a real PgBouncer in transaction mode.
//!
//! (Session 14 closed the three holes: the DELETE half of a row moved
//! between partitions by an UPDATE presents that UPDATE's token (the fence
//! remembers the row version the UPDATE passed, in the same command);
//! `fenced_boundary_write` takes a partition of a protected table; its
//! inserts run under the caller's search_path.)
//!
//! Findings, most severe first:
//!
//! - **Hole (medium)**: an UPDATE that moves a row of a partitioned fenced
//!   table to another partition, carrying the resource's *current* token in
//!   the token column, is refused as a DELETE without a token. `pp` is
//!   partitioned by `hand` (not by the resource key) and protected with
//!   token column `tok`; `UPDATE pp SET hand = 150 WHERE hand = 1` (same
//!   resource, same current token) fails with `LF003 MissingFencingToken:
//!   DELETE on public.pp1 for resource (table_id)=(7) presents no fencing
//!   token`, HINT "call lease.bind_token". PostgreSQL runs the move as a
//!   DELETE from the old partition (firing its BEFORE DELETE row triggers)
//!   and an INSERT into the new one, and the fence judges that DELETE with
//!   the transaction's bound token, which a token-column writer never binds.
//!   README ("How the fence works"): the writer's token is
//!   `NEW.<token_column>` for an UPDATE; "An UPDATE that moves a row to
//!   another resource must be valid for both" (this one does not even change
//!   resource). The refusal is also audited wrongly: `lease.rejected_writes`
//!   gets `operation = DELETE`, `presented_token = NULL`, `sqlstate = LF003`
//!   for a client that never ran a DELETE and presented the current token
//!   (`a_cross_partition_update_with_the_current_token_is_accepted`, fails).
//! - **Hole (low)**: `lease.fenced_boundary_write` on a partition of a fenced
//!   table answers `55000 public.pp1 is not protected by pg_lease` (HINT:
//!   protect it first), although the partition is fenced: a plain `INSERT
//!   INTO pp1` is judged by the fence (accepted with the current token,
//!   `LF001` with a stale one), and `lease.protect('pp1', ...)` would be
//!   refused as already protected through its tree. README: 55000 is for an
//!   unprotected target
//!   (`fenced_boundary_write_into_a_fenced_partition_is_judged`, fails).
//! - **Hole (low)**: `lease.fenced_boundary_write` runs the target's own
//!   BEFORE triggers (those the README tells users to name `a_…`) with
//!   `search_path` pinned to `pg_catalog, pg_temp`: a trigger that writes an
//!   unqualified `plog` works for every plain `INSERT INTO bw ...` and fails
//!   the whole call with `42P01 relation "plog" does not exist` through
//!   `fenced_boundary_write` (README: it "inserts every object of the JSON
//!   array into target"; nothing says the table's triggers run under another
//!   search_path)
//!   (`fenced_boundary_write_runs_the_tables_triggers_as_an_insert_does`, fails).
//! - **Defence holds**: a pooled client that forgot to bind, behind a real
//!   PgBouncer (transaction mode, one server connection), after another
//!   client left on that connection a session-level `SET pg_lease.token`, a
//!   `set_config('pg_lease.token', t, false)` made inside a bound
//!   transaction, and a session value set while a `fenced_boundary_write`
//!   was binding: its DELETE, its INSERT into a bound-token table, the same
//!   after a `fenced_boundary_write` on a token-column table in its
//!   transaction, all get `LF003`; `lease.bound_token()` says NULL
//!   (`a_pooled_client_that_forgot_to_bind_inherits_no_token`).
//! - **Defence holds**: the doors by which a binding could outlive its
//!   transaction: a `SET LOCAL`/`bind_token` in a savepoint rolled back, in a
//!   PL/pgSQL block whose error was caught, inside a function with a SET
//!   clause of its own; `ALTER ROLE ... SET`, `ALTER DATABASE ... SET`, a
//!   function `SET pg_lease.token = '5'` clause, and the connection's
//!   `options` are refused (`22023`) or bind nothing
//!   (`every_door_that_could_keep_a_binding_binds_one_transaction_only`).
//! - **Defence holds**: a verdict remembered in a savepoint or a PL/pgSQL
//!   block that rolled back is forgotten with its lock: the takeover
//!   (`lease.acquire`) does not wait for it, and the writer's next write in
//!   the same transaction, with the old token, is `LF001` at READ COMMITTED,
//!   `40001` at REPEATABLE READ
//!   (`a_verdict_rolled_back_with_its_savepoint_is_not_reused_after_a_takeover`).
//! - **Defence holds**: the ways a stale row can arrive from the application
//!   role: `INSERT ... ON CONFLICT DO UPDATE` (both arms), `MERGE` (insert,
//!   update, delete arms), `COPY FROM`, a writable CTE, an `INSTEAD OF`
//!   trigger and a `DO INSTEAD` rule on a view, an UPDATE of the key or the
//!   token, DELETE + INSERT: all `LF001` (or `LF003`), none commits
//!   (`every_door_for_a_stale_row_is_fenced`).
//! - **Defence holds**: float owner keys and a role granted UPDATE on owner
//!   rows: `-0` and `0` are one resource under float8's `=` (a stale token
//!   under `-0` is `LF001`), so is `NaN`; re-keying a row to its `-0` twin
//!   is allowed (the same key) and the fence still finds it under either
//!   spelling; moving, lowering or clearing a token, and swapping two keys
//!   in one statement, are `LF004`
//!   (`owner_rows_of_float_keys_keep_one_token_under_every_spelling`).
//!
//! Doors tried without a finding and not kept as tests: a function `SET`
//! clause or `ALTER ROLE ... SET` stored while pg_lease was not loaded (the
//! library's load re-applies it through the check hook, or PostgreSQL drops
//! the stack entry it makes), the PUBLIC-executable internals
//! (`_register`, `_unregister`, `_judge_replicated`, `_trigger_ddl`,
//! `_create_trigger`: permission checks or the DDL guard refuse), JSON edge
//! values in `fenced_boundary_write` (numbers keep their precision, bad
//! values are named by element and column), high-water `ATTACH` of a table
//! that held marks (refused, `LF008`).
use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const APP: &str = "a25_app";
const UPDATER: &str = "a25_updater";

/// The roles this file connects as (cluster-wide, created once).
fn roles(c: &mut Client) {
    must_run(
        c,
        &format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{APP}') THEN CREATE ROLE {APP} LOGIN; END IF;
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{UPDATER}') THEN CREATE ROLE {UPDATER} LOGIN; END IF;
             EXCEPTION WHEN unique_violation OR duplicate_object THEN NULL; END $$"
        ),
    );
}

/// A database with the README's poker owner table (`tables`, rows 7 and 8,
/// 7 holding a token from `lease.acquire`), returning it, a superuser
/// connection and table 7's current token.
fn poker(label: &str, extra: &str) -> (TestDb, Client, i64) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    roles(&mut c);
    must_run(
        &mut c,
        &format!(
            "CREATE TABLE tables (id int PRIMARY KEY, name text NOT NULL DEFAULT '', owner_fencing_token bigint);
             INSERT INTO tables (id) VALUES (7), (8);
             GRANT SELECT ON tables TO {APP};
             GRANT SELECT, UPDATE ON tables TO {UPDATER};
             GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) TO {APP};
             {extra}"
        ),
    );
    let token = one_i64(&mut c, "SELECT token FROM lease.acquire('table:7', 'host-1', 600000, 'tables', '{7}')");
    (db, c, token)
}

fn first_text(c: &mut Client, sql: &str) -> Option<String> {
    c.simple_query(sql).unwrap().into_iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
        _ => None,
    })?
}

/// Hole (medium): see the module doc.
#[test]
fn a_cross_partition_update_with_the_current_token_is_accepted() {
    let (db, mut c, t) = poker(
        "xpart",
        &format!(
            "CREATE TABLE pp (table_id int NOT NULL, hand int NOT NULL, tok bigint) PARTITION BY RANGE (hand);
             CREATE TABLE pp1 PARTITION OF pp FOR VALUES FROM (0) TO (100);
             CREATE TABLE pp2 PARTITION OF pp FOR VALUES FROM (100) TO (200);
             SELECT lease.protect('pp', '{{table_id}}', 'tok', 'tables');
             GRANT SELECT, INSERT, UPDATE, DELETE ON pp TO {APP};"
        ),
    );
    let mut app = db.connect_as(APP);
    must_run(&mut app, &format!("INSERT INTO pp VALUES (7, 1, {t}), (7, 2, {t})"));
    // Within one partition: an UPDATE, judged by NEW.tok.
    must_run(&mut app, "UPDATE pp SET hand = 3 WHERE hand = 2");
    // A stale token is still refused when the row moves.
    expect_error(&mut app, &format!("UPDATE pp SET hand = 151, tok = {} WHERE hand = 3", t - 1), "LF001");
    // The same resource, the current token in the row, another partition.
    let r = app.batch_execute("UPDATE pp SET hand = 150 WHERE hand = 1");
    let audit = if r.is_err() {
        std::thread::sleep(std::time::Duration::from_millis(800));
        first_text(
            &mut c,
            "SELECT concat_ws(' ', operation, target_table, coalesce(presented_token::text, 'NULL'), sqlstate)
               FROM lease.rejected_writes ORDER BY id DESC LIMIT 1",
        )
    } else {
        None
    };
    assert!(
        r.is_ok(),
        "an UPDATE moving a row to another partition with the current token {t} in its token column was refused: \
         {r:?}; audited as {audit:?}"
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pp2 WHERE hand = 150"), 1);
}

/// Hole (low): see the module doc.
#[test]
fn fenced_boundary_write_into_a_fenced_partition_is_judged() {
    let (db, _c, t) = poker(
        "bw_partition",
        &format!(
            "CREATE TABLE pp (table_id int NOT NULL, hand int NOT NULL, tok bigint) PARTITION BY RANGE (hand);
             CREATE TABLE pp1 PARTITION OF pp FOR VALUES FROM (0) TO (100);
             SELECT lease.protect('pp', '{{table_id}}', 'tok', 'tables');
             GRANT SELECT, INSERT ON pp, pp1 TO {APP};"
        ),
    );
    let mut app = db.connect_as(APP);
    // The partition is fenced: a plain INSERT into it is judged.
    must_run(&mut app, &format!("INSERT INTO pp1 VALUES (7, 1, {t})"));
    expect_error(&mut app, &format!("INSERT INTO pp1 VALUES (7, 1, {})", t - 1), "LF001");
    // Through fenced_boundary_write it is called unprotected.
    let r = failure(
        &mut app,
        &format!("SELECT lease.fenced_boundary_write('pp1', {t}, '[{{\"table_id\": 7, \"hand\": 2}}]')"),
    );
    assert_eq!(r, None, "fenced_boundary_write on fenced partition pp1 with the current token");
    expect_error(
        &mut app,
        &format!("SELECT lease.fenced_boundary_write('pp1', {}, '[{{\"table_id\": 7, \"hand\": 3}}]')", t - 1),
        "LF001",
    );
}

/// Hole (low): see the module doc.
#[test]
fn fenced_boundary_write_runs_the_tables_triggers_as_an_insert_does() {
    let (db, mut c, t) = poker(
        "bw_search_path",
        &format!(
            "CREATE TABLE plog (table_id int);
             CREATE TABLE bw (table_id int, amount int, fencing_token bigint);
             SELECT lease.protect('bw', '{{table_id}}', 'fencing_token', 'tables');
             CREATE FUNCTION a_log() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO plog VALUES (NEW.table_id); RETURN NEW; END $$;
             CREATE TRIGGER a_log BEFORE INSERT ON bw FOR EACH ROW EXECUTE FUNCTION a_log();
             GRANT SELECT, INSERT ON bw, plog TO {APP};"
        ),
    );
    let mut app = db.connect_as(APP);
    must_run(&mut app, &format!("INSERT INTO bw VALUES (7, 1, {t})"));
    let r = failure(
        &mut app,
        &format!("SELECT lease.fenced_boundary_write('bw', {t}, '[{{\"table_id\": 7, \"amount\": 2}}]')"),
    );
    assert_eq!(r, None, "the row a plain INSERT writes, written through fenced_boundary_write");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM plog"), 2);
}

/// Defence holds: see the module doc.
#[test]
fn a_pooled_client_that_forgot_to_bind_inherits_no_token() {
    let (db, mut c, t) = poker(
        "a25_pooler",
        "CREATE TABLE bound (table_id int, amount int); SELECT lease.protect('bound', '{table_id}', NULL, 'tables');
         CREATE TABLE pay (table_id int, amount int, fencing_token bigint);
         SELECT lease.protect('pay', '{table_id}', 'fencing_token', 'tables');",
    );
    must_run(&mut c, &format!("BEGIN; SELECT lease.bind_token({t}); INSERT INTO bound VALUES (7, 0), (7, 1); COMMIT"));
    let bouncer = Bouncer::start(54462 + port_offset(), 1);
    let mut stale = bouncer.connect(&db.name);
    let mut forgetful = bouncer.connect(&db.name);
    let leftovers = [
        format!("SET pg_lease.token = '{t}'"),
        format!("BEGIN; SELECT lease.bind_token({t}); SELECT set_config('pg_lease.token', '{t}', false); COMMIT"),
        format!(
            "BEGIN; SET pg_lease.token = '{t}'; SELECT lease.fenced_boundary_write('bound', {t}, '[{{\"table_id\": 7, \"amount\": 9}}]'); COMMIT"
        ),
    ];
    for (i, leftover) in leftovers.iter().enumerate() {
        must_run(&mut stale, leftover);
        // One server connection: the forgetful client gets the one the value stayed on.
        assert_eq!(
            first_text(&mut forgetful, "SELECT current_setting('pg_lease.token')").as_deref(),
            Some(&*t.to_string())
        );
        assert_eq!(first_text(&mut forgetful, "SELECT lease.bound_token()"), None, "leftover {i}");
        assert_eq!(try_sql(&mut forgetful, "DELETE FROM bound WHERE table_id = 7"), "LF003", "leftover {i}");
        assert_eq!(try_sql(&mut forgetful, "INSERT INTO bound VALUES (7, 5)"), "LF003", "leftover {i}");
        assert_eq!(
            try_sql(
                &mut forgetful,
                &format!(
                    "BEGIN; SELECT lease.fenced_boundary_write('pay', {t}, '[{{\"table_id\": 7, \"amount\": 1}}]');
                     DELETE FROM bound WHERE table_id = 7; COMMIT"
                )
            ),
            "LF003",
            "leftover {i}"
        );
        must_run(&mut forgetful, "ROLLBACK");
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bound WHERE amount <> 9"), 2);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pay"), 0);
}

/// Defence holds: see the module doc.
#[test]
fn every_door_that_could_keep_a_binding_binds_one_transaction_only() {
    let (db, mut c, t) = poker(
        "a25_doors",
        &format!(
            "CREATE TABLE bound (table_id int, amount int); SELECT lease.protect('bound', '{{table_id}}', NULL, 'tables');
             GRANT SELECT, INSERT, DELETE ON bound TO {APP};
             CREATE FUNCTION bind_inside(t bigint) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS
               $$ BEGIN PERFORM set_config('pg_lease.token', t::text, true); END $$;
             GRANT EXECUTE ON FUNCTION bind_inside(bigint) TO {APP};"
        ),
    );
    let mut app = db.connect_as(APP);
    // A binding made in a savepoint rolled back is gone.
    assert_eq!(
        try_sql(
            &mut app,
            &format!(
                "BEGIN; SAVEPOINT s; SELECT lease.bind_token({t}); ROLLBACK TO s; INSERT INTO bound VALUES (7, 1)"
            )
        ),
        "LF003"
    );
    must_run(&mut app, "ROLLBACK");
    // ... and one made in a PL/pgSQL block whose error was caught.
    assert_eq!(
        try_sql(
            &mut app,
            &format!(
                "BEGIN; DO $$ BEGIN PERFORM lease.bind_token({t}); RAISE EXCEPTION 'x'; EXCEPTION WHEN OTHERS THEN NULL; END $$;
                 INSERT INTO bound VALUES (7, 1)"
            )
        ),
        "LF003"
    );
    must_run(&mut app, "ROLLBACK");
    // A binding made inside a function with a SET clause of its own binds the transaction, and only it.
    must_run(&mut app, &format!("BEGIN; SELECT bind_inside({t}); INSERT INTO bound VALUES (7, 1); COMMIT"));
    assert_eq!(try_sql(&mut app, "INSERT INTO bound VALUES (7, 2)"), "LF003");
    // Settings that would outlive a transaction are refused.
    for sql in [
        format!("ALTER ROLE {APP} SET pg_lease.token = '{t}'"),
        format!("ALTER DATABASE {} SET pg_lease.token = '{t}'", db.name),
        format!("ALTER ROLE {APP} IN DATABASE {} SET pg_lease.token = '{t}'", db.name),
        format!("CREATE FUNCTION f_bound() RETURNS int LANGUAGE sql SET pg_lease.token = '{t}' AS 'SELECT 1'"),
    ] {
        assert_eq!(try_sql(&mut c, &sql), "22023", "{sql}");
    }
    let r = postgres::Config::new()
        .host("127.0.0.1")
        .port(port())
        .user(APP)
        .dbname(&db.name)
        .options(&format!("-c pg_lease.token={t}"))
        .connect(postgres::NoTls);
    if let Ok(mut conn) = r {
        // Accepted with a WARNING at most: then it must bind nothing.
        assert_eq!(try_sql(&mut conn, "INSERT INTO bound VALUES (7, 3)"), "LF003");
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bound"), 1);
}

/// Defence holds: see the module doc.
#[test]
fn a_verdict_rolled_back_with_its_savepoint_is_not_reused_after_a_takeover() {
    let (db, mut c, t) = poker(
        "a25_savepoint_race",
        &format!(
            "CREATE TABLE pay (table_id int, amount int, fencing_token bigint);
             SELECT lease.protect('pay', '{{table_id}}', 'fencing_token', 'tables');
             GRANT SELECT, INSERT ON pay TO {APP};"
        ),
    );
    let mut app = db.connect_as(APP);
    let mut taker = db.connect();
    for (level, expected) in [("READ COMMITTED", "LF001"), ("REPEATABLE READ", "40001")] {
        let t = one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 7").max(t);
        // Verified (and remembered) in a savepoint, then in a caught block: both roll back with their locks.
        must_run(
            &mut app,
            &format!(
                "BEGIN ISOLATION LEVEL {level};
                 SAVEPOINT s; INSERT INTO pay VALUES (7, 1, {t}); ROLLBACK TO s;
                 DO $$ BEGIN INSERT INTO pay VALUES (7, 2, {t}); RAISE EXCEPTION 'x'; EXCEPTION WHEN OTHERS THEN NULL; END $$;"
            ),
        );
        // The takeover does not wait for a lock that is gone.
        must_run(&mut taker, "SET lock_timeout = '5s'");
        let new = one_i64(&mut taker, "SELECT token FROM lease.acquire('table:7', 'host-1', 600000, 'tables', '{7}')");
        assert!(new > t);
        assert_eq!(try_sql(&mut app, &format!("INSERT INTO pay VALUES (7, 3, {t})")), expected, "{level}");
        must_run(&mut app, "ROLLBACK");
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pay"), 0);
}

/// Defence holds: see the module doc.
#[test]
fn every_door_for_a_stale_row_is_fenced() {
    let (db, mut c, stale) = poker(
        "a25_stale_doors",
        &format!(
            "CREATE TABLE pay (id int PRIMARY KEY, table_id int, amount int, fencing_token bigint);
             SELECT lease.protect('pay', '{{table_id}}', 'fencing_token', 'tables');
             CREATE VIEW pay_v AS SELECT * FROM pay;
             CREATE FUNCTION pay_v_ins() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO pay VALUES (NEW.*); RETURN NEW; END $$;
             CREATE TRIGGER pay_v_ins INSTEAD OF INSERT ON pay_v FOR EACH ROW EXECUTE FUNCTION pay_v_ins();
             CREATE VIEW pay_r AS SELECT * FROM pay;
             CREATE RULE pay_r_ins AS ON INSERT TO pay_r DO INSTEAD INSERT INTO pay VALUES (NEW.*);
             GRANT SELECT, INSERT, UPDATE, DELETE ON pay, pay_v, pay_r TO {APP};"
        ),
    );
    // The old process's rows, then a takeover.
    must_run(&mut c, &format!("INSERT INTO pay VALUES (1, 7, 10, {stale}), (2, 7, 20, {stale})"));
    let t = one_i64(&mut c, "SELECT token FROM lease.acquire('table:7', 'host-1', 600000, 'tables', '{7}')");
    assert!(t > stale);
    let mut app = db.connect_as(APP);
    let attempts = [
        format!("INSERT INTO pay VALUES (3, 7, 1, {stale})"),
        format!("INSERT INTO pay VALUES (1, 7, 1, {stale}) ON CONFLICT (id) DO UPDATE SET amount = 99"),
        // The current token in the proposed row, the conflict arm keeping the old row's stale token.
        format!("INSERT INTO pay VALUES (1, 7, 1, {t}) ON CONFLICT (id) DO UPDATE SET amount = 99"),
        format!("INSERT INTO pay VALUES (9, 7, 1, {stale}) ON CONFLICT DO NOTHING"),
        format!("MERGE INTO pay p USING (VALUES (4, 7)) v(id, k) ON p.id = v.id WHEN NOT MATCHED THEN INSERT VALUES (v.id, v.k, 1, {stale})"),
        "MERGE INTO pay p USING (VALUES (1)) v(id) ON p.id = v.id WHEN MATCHED THEN UPDATE SET amount = 99".to_owned(),
        "MERGE INTO pay p USING (VALUES (1)) v(id) ON p.id = v.id WHEN MATCHED THEN DELETE".to_owned(),
        format!("WITH w AS (INSERT INTO pay VALUES (5, 7, 1, {stale}) RETURNING 1) SELECT count(*) FROM w"),
        format!("WITH d AS (DELETE FROM pay WHERE id = 1 RETURNING *) INSERT INTO pay SELECT id, table_id, 1, {stale} FROM d"),
        format!("INSERT INTO pay_v VALUES (6, 7, 1, {stale})"),
        format!("INSERT INTO pay_r VALUES (7, 7, 1, {stale})"),
        "UPDATE pay SET amount = 99 WHERE id = 1".to_owned(),
        "UPDATE pay SET table_id = 8 WHERE id = 1".to_owned(),
        format!("UPDATE pay SET fencing_token = {stale} - 1 WHERE id = 1"),
        format!("BEGIN; SELECT lease.bind_token({stale}); DELETE FROM pay WHERE id = 1; INSERT INTO pay VALUES (1, 7, 99, {stale}); COMMIT"),
        format!("SELECT lease.fenced_boundary_write('pay', {stale}, '[{{\"id\": 8, \"table_id\": 7}}]')"),
    ];
    for sql in &attempts {
        let code = try_sql(&mut app, sql);
        assert!(["LF001", "LF002", "LF003"].contains(&code.as_str()), "{sql}\n gave {code:?}");
        let _ = app.batch_execute("ROLLBACK");
    }
    // COPY FROM, with the stale token.
    let r = (|| -> Result<u64, postgres::Error> {
        let mut w = app.copy_in("COPY pay FROM STDIN")?;
        use std::io::Write;
        w.write_all(format!("10\t7\t1\t{stale}\n").as_bytes()).unwrap();
        w.finish()
    })();
    assert_eq!(sqlstate(&r), "LF001");
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM pay WHERE fencing_token = {stale}")), 2);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pay"), 2);
    assert_eq!(one_i64(&mut c, "SELECT sum(amount) FROM pay"), 30);
    // The current token goes through the same doors.
    must_run(&mut app, &format!("INSERT INTO pay_v VALUES (6, 7, 1, {t}); INSERT INTO pay_r VALUES (7, 7, 1, {t})"));
}

/// Defence holds: see the module doc.
#[test]
fn owner_rows_of_float_keys_keep_one_token_under_every_spelling() {
    let db = TestDb::new("a25_float_keys");
    let mut c = db.connect();
    roles(&mut c);
    must_run(
        &mut c,
        &format!(
            "CREATE TABLE own (id float8 PRIMARY KEY, owner_fencing_token bigint);
             INSERT INTO own VALUES ('0', NULL), ('NaN', NULL), ('1', NULL);
             CREATE TABLE pay (k float8, fencing_token bigint);
             SELECT lease.protect('pay', '{{k}}', 'fencing_token', 'own');
             GRANT SELECT, UPDATE ON own TO {UPDATER};
             GRANT SELECT, INSERT ON pay TO {APP};"
        ),
    );
    let mut t = std::collections::HashMap::new();
    for key in ["0", "NaN"] {
        let token =
            one_i64(&mut c, &format!("SELECT token FROM lease.acquire('own:{key}', 'h', 600000, 'own', '{{{key}}}')"));
        t.insert(key, token);
    }
    let mut app = db.connect_as(APP);
    // -0 is 0 under float8's =: the same resource, the same token.
    must_run(&mut app, &format!("INSERT INTO pay VALUES ('-0', {})", t["0"]));
    expect_error(&mut app, &format!("INSERT INTO pay VALUES ('-0', {})", t["0"] - 1), "LF001");
    must_run(&mut app, &format!("INSERT INTO pay VALUES ('NaN', {})", t["NaN"]));
    expect_error(&mut app, &format!("INSERT INTO pay VALUES ('NaN', {})", t["NaN"] - 1), "LF001");
    // A role allowed to UPDATE owner rows cannot move, lower or clear a token.
    let mut upd = db.connect_as(UPDATER);
    expect_error(&mut upd, "UPDATE own SET id = 2 WHERE id = 0", "LF004");
    expect_error(&mut upd, "UPDATE own SET owner_fencing_token = owner_fencing_token - 1 WHERE id = 'NaN'", "LF004");
    expect_error(&mut upd, "UPDATE own SET owner_fencing_token = NULL WHERE id = 0", "LF004");
    // Swapping two keys in one statement would hand each token to the other resource.
    must_run(&mut c, &format!("UPDATE own SET owner_fencing_token = {} WHERE id = 1", t["0"] - 5));
    expect_error(&mut upd, "UPDATE own SET id = CASE WHEN id = 0 THEN 1 ELSE 0 END WHERE id IN (0, 1)", "LF004");
    // Re-keying to -0 is the same key: allowed, and the fence still finds the row under either spelling.
    must_run(&mut upd, "UPDATE own SET id = '-0' WHERE id = 0");
    must_run(&mut app, &format!("INSERT INTO pay VALUES ('0', {})", t["0"]));
    expect_error(&mut app, &format!("INSERT INTO pay VALUES ('0', {})", t["0"] - 1), "LF001");
}
