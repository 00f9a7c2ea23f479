//! The fence over real client connections: SQLSTATEs as libpq sees them, races
//! against token bumps at every isolation level, bypass attempts, tampering,
//! high-water mode and fenced_boundary_write.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::thread;
use std::time::Duration;

fn poker(label: &str) -> (TestDb, Client) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    (db, c)
}

fn pay(table: i32, token: i64) -> String {
    format!("INSERT INTO payouts (table_id, player, amount, fencing_token) VALUES ({table}, 'ann', 10, {token})")
}

#[test]
fn every_verdict_reaches_the_client_with_its_sqlstate() {
    let (_db, mut c) = poker("verdicts");
    assert_eq!(try_sql(&mut c, &pay(1, 5)), "");
    let stale = expect_error(&mut c, &pay(1, 4), "LF001");
    assert!(stale.starts_with("StaleOwnerBoundaryWrite"), "{stale}");
    assert!(stale.contains("public.payouts") && stale.contains("(table_id)=(1)"), "{stale}");
    assert!(stale.contains("presented token 4, current token 5"), "{stale}");
    assert!(expect_error(&mut c, &pay(1, 6), "LF002").starts_with("FencingTokenAhead"));
    expect_error(&mut c, "INSERT INTO payouts (table_id, amount) VALUES (1, 10)", "LF003");
    assert!(expect_error(&mut c, &pay(3, 5), "LF007").starts_with("FenceOwnerMissing"));
    let regression = expect_error(&mut c, "UPDATE tables SET owner_fencing_token = 4 WHERE id = 1", "LF004");
    assert!(regression.contains("from 5 to 4"), "{regression}");
    expect_error(&mut c, "UPDATE tables SET owner_fencing_token = NULL WHERE id = 1", "LF004");
    expect_error(&mut c, "TRUNCATE tables", "LF004");
    expect_error(&mut c, "TRUNCATE payouts", "LF008");
    // A client can branch on the code: PL/pgSQL catches it by SQLSTATE.
    c.batch_execute(&format!(
        "DO $$ BEGIN {}; RAISE EXCEPTION 'not refused'; EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL; END $$",
        pay(1, 4)
    ))
    .unwrap();
    // Error fields name the table for drivers that expose them.
    let err = c.batch_execute(&pay(1, 4)).unwrap_err();
    let db = err.as_db_error().unwrap();
    assert_eq!(db.table(), Some("payouts"));
    assert_eq!(db.schema(), Some("public"));
    assert!(db.hint().unwrap().contains("do not retry"));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 1);
}

#[test]
fn token_bump_waits_for_writers_that_verified_the_old_token() {
    for isolation in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let (db, mut c) = poker("bump_waits");
        let mut writer = db.connect();
        let mut bumper = db.connect();
        let bumper_pid = backend_pid(&mut bumper);

        writer.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}")).unwrap();
        writer.batch_execute(&pay(1, 5)).unwrap();
        let bump = thread::spawn(move || {
            bumper.batch_execute("UPDATE tables SET owner_fencing_token = 6 WHERE id = 1").unwrap();
            bumper
        });
        wait_until_blocked(&mut c, bumper_pid);
        // Still the owner until the bump commits: more rows are accepted.
        writer.batch_execute(&pay(1, 5)).unwrap();
        writer.batch_execute("COMMIT").unwrap();
        bump.join().unwrap();
        expect_error(&mut writer, &pay(1, 5), "LF001");
        writer.batch_execute(&pay(1, 6)).unwrap();
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts WHERE fencing_token = 5"), 2, "{isolation}");
    }
}

#[test]
fn writer_racing_an_uncommitted_bump_is_never_accepted() {
    for isolation in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let (db, mut c) = poker("racing_bump");
        let mut writer = db.connect();
        let writer_pid = backend_pid(&mut writer);
        let mut bumper = db.connect();
        // The writer's snapshot predates the bump at every level.
        writer.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}; SELECT 1")).unwrap();
        bumper.batch_execute("BEGIN; UPDATE tables SET owner_fencing_token = 6 WHERE id = 1").unwrap();
        let write = thread::spawn(move || {
            let r = try_sql(&mut writer, &pay(1, 5));
            (r, writer)
        });
        wait_until_blocked(&mut c, writer_pid);
        bumper.batch_execute("COMMIT").unwrap();
        let (code, mut writer) = write.join().unwrap();
        let allowed: &[&str] = if isolation == "READ COMMITTED" { &["LF001"] } else { &["LF001", "40001"] };
        assert!(allowed.contains(&code.as_str()), "{isolation}: got {code:?}");
        writer.batch_execute("ROLLBACK").unwrap();
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0, "{isolation}");
    }
}

#[test]
fn concurrent_writers_and_bumps_commit_in_token_order() {
    // Writers keep paying with the token they saw; a bumper raises the token
    // repeatedly. Because a bump waits for verified writers and later writers
    // wait for the bump, every committed row of token T was inserted before
    // every row of token T+1: ids (from a sequence) are ordered by token.
    let (db, mut c) = poker("token_order");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for _ in 0..4 {
        let mut w = db.connect();
        let stop = stop.clone();
        writers.push(thread::spawn(move || {
            let (mut accepted, mut refused) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let token = one_i64(&mut w, "SELECT owner_fencing_token FROM tables WHERE id = 1");
                for _ in 0..5 {
                    match try_sql(&mut w, &format!("BEGIN; {}; {}; COMMIT", pay(1, token), pay(1, token))).as_str() {
                        "" => accepted += 1,
                        "LF001" | "40001" => {
                            w.batch_execute("ROLLBACK").unwrap();
                            refused += 1;
                            break;
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
            }
            (accepted, refused)
        }));
    }
    let mut bumper = db.connect();
    for _ in 0..40 {
        thread::sleep(Duration::from_millis(15));
        bumper.batch_execute("UPDATE tables SET owner_fencing_token = owner_fencing_token + 1 WHERE id = 1").unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut accepted, mut refused) = (0, 0);
    for w in writers {
        let (a, r) = w.join().unwrap();
        accepted += a;
        refused += r;
    }
    assert!(accepted > 0 && refused > 0, "accepted {accepted}, refused {refused}");
    let disorder = one_i64(
        &mut c,
        "SELECT count(*) FROM payouts a JOIN payouts b ON a.fencing_token < b.fencing_token AND a.id > b.id",
    );
    assert_eq!(disorder, 0, "a row with an older token was inserted after a newer one");
    let stale = one_i64(
        &mut c,
        "SELECT count(*) FROM payouts p JOIN tables t ON t.id = p.table_id WHERE p.fencing_token > t.owner_fencing_token",
    );
    assert_eq!(stale, 0);
}

#[test]
fn replica_role_and_every_statement_kind_are_fenced() {
    let (_db, mut c) = poker("bypass");
    c.batch_execute(&pay(1, 5)).unwrap();
    c.batch_execute("UPDATE tables SET owner_fencing_token = 6 WHERE id = 1").unwrap();
    // session_replication_role = replica skips ordinary triggers, not ours.
    c.batch_execute("SET session_replication_role = replica").unwrap();
    expect_error(&mut c, &pay(1, 5), "LF001");
    c.batch_execute("RESET session_replication_role").unwrap();
    // COPY fires row triggers.
    expect_error(&mut c, "COPY payouts (table_id, fencing_token) FROM PROGRAM 'echo 1,5' WITH (FORMAT csv)", "LF001");
    // ON CONFLICT and writable CTEs go through the same trigger.
    expect_error(
        &mut c,
        "INSERT INTO payouts (id, table_id, fencing_token) VALUES (1, 1, 5) ON CONFLICT (id) DO UPDATE SET amount = 0",
        "LF001",
    );
    expect_error(
        &mut c,
        "WITH w AS (INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5) RETURNING id) SELECT * FROM w",
        "LF001",
    );
    // UPDATE carries the token in the row: an untouched old token is stale.
    expect_error(&mut c, "UPDATE payouts SET amount = 99", "LF001");
    c.batch_execute("UPDATE payouts SET amount = 99, fencing_token = 6").unwrap();
    // DELETE uses the transaction-bound token.
    expect_error(&mut c, "DELETE FROM payouts", "LF003");
    expect_error(&mut c, "BEGIN; SELECT lease.bind_token(5); DELETE FROM payouts", "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute("BEGIN; SET LOCAL pg_lease.token = '6'; DELETE FROM payouts; COMMIT").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0);
    expect_error(&mut c, "TRUNCATE payouts", "LF008");
    expect_error(&mut c, "SET pg_lease.token = 'abc'", "22023");
    expect_error(&mut c, "SET pg_lease.token = '-1'", "22023");
    expect_error(&mut c, "SELECT lease.bind_token(NULL)", "22004");
}

#[test]
fn moving_a_row_to_another_resource_needs_both() {
    let (_db, mut c) = poker("move");
    c.batch_execute(&pay(1, 5)).unwrap();
    c.batch_execute("UPDATE tables SET owner_fencing_token = 7 WHERE id = 2").unwrap();
    expect_error(&mut c, "UPDATE payouts SET table_id = 2, fencing_token = 7", "LF002");
    c.batch_execute("UPDATE tables SET owner_fencing_token = 7 WHERE id = 1").unwrap();
    c.batch_execute("UPDATE payouts SET table_id = 2, fencing_token = 7").unwrap();
}

#[test]
fn per_transaction_cache_follows_savepoints_and_own_bumps() {
    let (db, mut c) = poker("cache");
    // A savepoint that verified a resource and rolled back released its lock:
    // the cache must forget it, or a bump committed since would be missed.
    c.batch_execute("BEGIN; SAVEPOINT s; ").unwrap();
    c.batch_execute(&pay(1, 5)).unwrap();
    c.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let mut other = db.connect();
    other.batch_execute("SET lock_timeout = '5s'; UPDATE tables SET owner_fencing_token = 6 WHERE id = 1").unwrap();
    expect_error(&mut c, &pay(1, 5), "LF001");
    c.batch_execute("ROLLBACK").unwrap();

    // A released savepoint keeps its lock: the entry stays valid.
    c.batch_execute("BEGIN; SAVEPOINT s;").unwrap();
    c.batch_execute(&pay(1, 6)).unwrap();
    c.batch_execute("RELEASE SAVEPOINT s").unwrap();
    expect_error(
        &mut other,
        "SET lock_timeout = '200ms'; UPDATE tables SET owner_fencing_token = 7 WHERE id = 1",
        "55P03",
    );
    c.batch_execute(&pay(1, 6)).unwrap();
    // This transaction bumps the token itself: rows must now carry the new one.
    c.batch_execute("UPDATE tables SET owner_fencing_token = 7 WHERE id = 1").unwrap();
    expect_error(&mut c, &format!("SAVEPOINT t; {}", pay(1, 6)), "LF001");
    c.batch_execute("ROLLBACK TO SAVEPOINT t").unwrap();
    c.batch_execute(&pay(1, 7)).unwrap();
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 3);
}

#[test]
fn tampering_is_refused_and_unprotect_is_the_way_out() {
    let (_db, mut c) = poker("tamper");
    for ddl in [
        "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence",
        "ALTER TABLE payouts DISABLE TRIGGER ALL",
        "ALTER TABLE payouts ENABLE TRIGGER pg_lease_fence",
        "ALTER TABLE payouts DISABLE TRIGGER pg_lease_truncate",
        "DROP TRIGGER pg_lease_fence ON payouts",
        "ALTER TRIGGER pg_lease_fence ON payouts RENAME TO x",
        "ALTER TABLE payouts DROP COLUMN fencing_token",
        "ALTER TABLE payouts DROP COLUMN table_id",
        "ALTER TABLE payouts RENAME COLUMN table_id TO t",
        "ALTER TABLE payouts ALTER COLUMN fencing_token TYPE text",
        "ALTER TABLE tables DISABLE TRIGGER pg_lease_owner_guard",
        "DROP TRIGGER pg_lease_owner_truncate ON tables",
        "ALTER TABLE tables DROP COLUMN owner_fencing_token",
        "DROP TABLE tables",
    ] {
        let msg = expect_error(&mut c, ddl, "LF008");
        assert!(msg.starts_with("FenceTampering"), "{ddl}: {msg}");
    }
    let enforced: bool = c
        .query_one("SELECT enforced FROM lease.protected_tables WHERE table_name = 'payouts'::regclass", &[])
        .unwrap()
        .get(0);
    assert!(enforced);
    // Unrelated DDL is untouched.
    c.batch_execute("ALTER TABLE payouts ADD COLUMN note text; CREATE TABLE other (x int); DROP TABLE other").unwrap();

    c.batch_execute("SELECT lease.unprotect('payouts')").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables"), 0);
    c.batch_execute(&pay(1, 1)).unwrap();
    c.batch_execute("UPDATE tables SET owner_fencing_token = 1").unwrap();
    c.batch_execute("TRUNCATE payouts, tables").unwrap();

    // Dropping a fenced table takes its fence with it.
    c.batch_execute("SELECT lease.protect('payouts', '{table_id}', 'fencing_token'); DROP TABLE payouts").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);
}

#[test]
fn protect_rejects_bad_input_with_standard_sqlstates() {
    let (_db, mut c) = poker("protect_input");
    c.batch_execute(
        "CREATE VIEW v AS SELECT * FROM payouts;
         CREATE TABLE t2 (table_id int, tok text, n bigint);
         CREATE TABLE owners_nokey (id int, owner_fencing_token bigint);",
    )
    .unwrap();
    expect_error(&mut c, "SELECT lease.protect('v', '{table_id}', 'fencing_token')", "42809");
    expect_error(&mut c, "SELECT lease.protect('t2', '{nope}', 'n')", "42703");
    expect_error(&mut c, "SELECT lease.protect('t2', '{table_id}', 'tok')", "42804");
    expect_error(&mut c, "SELECT lease.protect('t2', '{}', 'n')", "22023");
    expect_error(&mut c, "SELECT lease.protect('t2', '{table_id,table_id}', 'n')", "42701");
    expect_error(&mut c, "SELECT lease.protect('payouts', '{table_id}', 'fencing_token')", "42710");
    expect_error(&mut c, "SELECT lease.protect('t2', '{table_id}', 'n', 'owners_nokey')", "42830");
    expect_error(&mut c, "SELECT lease.protect('t2', '{table_id}', 'n', 'tables', '{id}', 'nope')", "42703");
    expect_error(&mut c, "SELECT lease.protect('t2', '{tok}', 'n')", "42883");
    expect_error(
        &mut c,
        "SELECT lease.protect('t2', '{table_id}', 'n', 'tables', '{id,owner_fencing_token}')",
        "22023",
    );
    expect_error(&mut c, "SELECT lease.unprotect('t2')", "42704");
    expect_error(&mut c, "SELECT lease.protect(NULL, '{table_id}')", "22004");
    c.batch_execute("CREATE SCHEMA s; SET search_path = s").unwrap();
    expect_error(&mut c, "SELECT lease.protect('public.t2', '{table_id}', 'n')", "42P01");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 1);
}

#[test]
fn quoted_identifiers_work_everywhere() {
    let db = TestDb::new("quoting");
    let mut c = db.connect();
    c.batch_execute(
        r#"CREATE SCHEMA "Game Data";
           CREATE TABLE "Game Data"."Poker ""Tables""" ("Table Id" int, "Env" text, "Owner Token" bigint,
                                                         PRIMARY KEY ("Env", "Table Id"));
           CREATE TABLE "Game Data"."Pay Outs" (id serial, "Env" text, "Table Id" int, "Fencing Token" bigint, amount int);
           SELECT lease.protect('"Game Data"."Pay Outs"', '{Env,"Table Id"}', 'Fencing Token',
                                '"Game Data"."Poker ""Tables"""', '{Env,"Table Id"}', 'Owner Token');
           INSERT INTO "Game Data"."Poker ""Tables""" VALUES (1, 'prod', 3);"#,
    )
    .unwrap();
    c.batch_execute(r#"INSERT INTO "Game Data"."Pay Outs" ("Env", "Table Id", "Fencing Token") VALUES ('prod', 1, 3)"#)
        .unwrap();
    let msg = expect_error(
        &mut c,
        r#"INSERT INTO "Game Data"."Pay Outs" ("Env", "Table Id", "Fencing Token") VALUES ('prod', 1, 2)"#,
        "LF001",
    );
    assert!(msg.contains(r#"("Env", "Table Id")=(prod, 1)"#) || msg.contains("(Env, Table Id)=(prod, 1)"), "{msg}");
    assert_eq!(
        one_i64(
            &mut c,
            r#"SELECT lease.fenced_boundary_write('"Game Data"."Pay Outs"', 3, '[{"Env":"prod","Table Id":1,"amount":5}]')"#
        ),
        1
    );
    expect_error(&mut c, r#"ALTER TABLE "Game Data"."Pay Outs" DROP COLUMN "Fencing Token""#, "LF008");
    expect_error(&mut c, r#"UPDATE "Game Data"."Poker ""Tables""" SET "Owner Token" = 1"#, "LF004");
}

#[test]
fn high_water_marks_only_rise_per_resource() {
    let db = TestDb::new("high_water");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE ledger (id serial, partition int, offs bigint, token bigint);
         SELECT lease.protect_high_water('ledger', '{partition}', 'token');",
    )
    .unwrap();
    let ins = |p: i32, t: i64| format!("INSERT INTO ledger (partition, token) VALUES ({p}, {t})");
    c.batch_execute(&ins(1, 5)).unwrap();
    c.batch_execute(&ins(1, 5)).unwrap();
    let msg = expect_error(&mut c, &ins(1, 4), "LF001");
    assert!(msg.contains("presented token 4, current token 5"), "{msg}");
    c.batch_execute(&ins(1, 7)).unwrap();
    expect_error(&mut c, &ins(1, 5), "LF001");
    c.batch_execute(&ins(2, 1)).unwrap(); // resources are independent
    expect_error(&mut c, "INSERT INTO ledger (partition) VALUES (1)", "LF003");
    // A rolled-back raise does not stick.
    c.batch_execute(&format!("BEGIN; {}; ROLLBACK", ins(1, 9))).unwrap();
    c.batch_execute(&ins(1, 8)).unwrap();
    // Several rows at rising tokens in one transaction.
    c.batch_execute(&format!("BEGIN; {}; {}; {}; COMMIT", ins(3, 1), ins(3, 2), ins(3, 2))).unwrap();
    expect_error(&mut c, &format!("BEGIN; {}; {}", ins(3, 3), ins(3, 2)), "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT token FROM lease.high_water WHERE resource = '{1}'"), 8);
    assert_eq!(one_i64(&mut c, "SELECT token FROM lease.high_water WHERE resource = '{3}'"), 2);
    // An application role with no rights on lease.high_water is fenced all the same.
    c.batch_execute(&format!(
        "CREATE ROLE hw_app_{0} LOGIN; GRANT INSERT ON ledger TO hw_app_{0}; GRANT USAGE ON SEQUENCE ledger_id_seq TO hw_app_{0}",
        std::process::id()
    ))
    .unwrap();
    let mut app = db.connect_as(&format!("hw_app_{}", std::process::id()));
    expect_error(&mut app, &ins(1, 7), "LF001");
    app.batch_execute(&ins(1, 8)).unwrap();
    expect_error(&mut app, "UPDATE lease.high_water SET token = 0", "42501");
    drop(app);
    c.batch_execute(&format!("DROP OWNED BY hw_app_{0}; DROP ROLE hw_app_{0}", std::process::id())).unwrap();
}

#[test]
fn high_water_race_lets_only_rising_tokens_commit() {
    for isolation in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let db = TestDb::new("hw_race");
        let mut c = db.connect();
        c.batch_execute(
            "CREATE TABLE ledger (partition int, token bigint);
             SELECT lease.protect_high_water('ledger', '{partition}', 'token');
             INSERT INTO ledger VALUES (1, 5);",
        )
        .unwrap();
        let mut newer = db.connect();
        let mut older = db.connect();
        let older_pid = backend_pid(&mut older);
        newer.batch_execute("BEGIN; INSERT INTO ledger VALUES (1, 7)").unwrap();
        older.batch_execute(&format!("BEGIN ISOLATION LEVEL {isolation}; SELECT 1")).unwrap();
        let t = thread::spawn(move || (try_sql(&mut older, "INSERT INTO ledger VALUES (1, 6)"), older));
        wait_until_blocked(&mut c, older_pid);
        newer.batch_execute("COMMIT").unwrap();
        let (code, mut older) = t.join().unwrap();
        assert!(["LF001", "40001"].contains(&code.as_str()), "{isolation}: {code:?}");
        older.batch_execute("ROLLBACK").unwrap();
        assert_eq!(one_i64(&mut c, "SELECT max(token) FROM ledger"), 7);
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM ledger WHERE token = 6"), 0);
    }
}

#[test]
fn fenced_boundary_write_is_all_or_nothing() {
    let (_db, mut c) = poker("fbw");
    let n = one_i64(
        &mut c,
        r#"SELECT lease.fenced_boundary_write('payouts', 5,
             '[{"table_id":1,"hand":1,"player":"ann","amount":30},
               {"table_id":2,"hand":1,"player":"bob","amount":20},
               {"table_id":1,"hand":1}]')"#,
    );
    assert_eq!(n, 3);
    // Absent columns take their defaults; the token is stamped.
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts WHERE player = 'house' AND fencing_token = 5"), 1);
    c.batch_execute("UPDATE tables SET owner_fencing_token = 6 WHERE id = 2").unwrap();
    // One stale resource refuses the whole batch.
    expect_error(
        &mut c,
        r#"SELECT lease.fenced_boundary_write('payouts', 5, '[{"table_id":1,"hand":2},{"table_id":2,"hand":2}]')"#,
        "LF001",
    );
    for (rows, code) in [
        (r#"'{"table_id":1}'"#, "22023"),
        (r#"'[1, 2]'"#, "22023"),
        (r#"'[{"table_id":1,"nope":3}]'"#, "42703"),
        (r#"'[{"table_id":"x"}]'"#, "22P02"),
        (r#"'[{"table_id":1,"fencing_token":4}]'"#, "22023"),
        ("NULL", "22023"),
    ] {
        expect_error(&mut c, &format!("SELECT lease.fenced_boundary_write('payouts', 5, {rows})"), code);
    }
    expect_error(&mut c, "SELECT lease.fenced_boundary_write('payouts', 5, 'not json')", "22P02");
    expect_error(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', NULL, '[{"table_id":1}]')"#, "LF003");
    expect_error(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', -1, '[{"table_id":1}]')"#, "22023");
    expect_error(&mut c, r#"SELECT lease.fenced_boundary_write('tables', 5, '[{"id":9}]')"#, "55000");
    assert_eq!(one_i64(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', 5, '[]')"#), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 3);

    // Tables without a token column: the token is bound for the inserts only.
    c.batch_execute(
        "CREATE TABLE chips (table_id int, amount int);
         SELECT lease.protect('chips', '{table_id}');",
    )
    .unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(one_i64(&mut c, r#"SELECT lease.fenced_boundary_write('chips', 5, '[{"table_id":1,"amount":1}]')"#), 1);
    expect_error(&mut c, "INSERT INTO chips VALUES (1, 1)", "LF003");
    c.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn application_role_needs_no_rights_on_owner_rows() {
    let (db, mut c) = poker("roles");
    let role = format!("app_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN; GRANT INSERT, DELETE ON payouts TO {role};
         GRANT USAGE ON SEQUENCE payouts_id_seq TO {role};
         ALTER TABLE tables ENABLE ROW LEVEL SECURITY;"
    ))
    .unwrap();
    let mut app = db.connect_as(&role);
    app.batch_execute(&pay(1, 5)).unwrap();
    expect_error(&mut app, &pay(1, 4), "LF001");
    expect_error(&mut app, "UPDATE tables SET owner_fencing_token = 1", "42501");
    expect_error(&mut app, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence", "42501");
    expect_error(
        &mut app,
        "INSERT INTO lease.protected (relid, mode, key_columns) VALUES ('payouts', 'high_water', '{x}')",
        "42501",
    );
    drop(app);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn partitions_present_and_future_are_fenced() {
    let db = TestDb::new("partitions");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (1, 5), (150, 5);
         CREATE TABLE payouts (table_id int, fencing_token bigint) PARTITION BY RANGE (table_id);
         CREATE TABLE payouts_a PARTITION OF payouts FOR VALUES FROM (0) TO (100);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');",
    )
    .unwrap();
    c.batch_execute("CREATE TABLE payouts_b PARTITION OF payouts FOR VALUES FROM (100) TO (200)").unwrap();
    c.batch_execute("INSERT INTO payouts VALUES (1, 5), (150, 5)").unwrap();
    expect_error(&mut c, "INSERT INTO payouts VALUES (1, 4)", "LF001");
    expect_error(&mut c, "INSERT INTO payouts_b VALUES (150, 4)", "LF001");
    expect_error(&mut c, "ALTER TABLE payouts_a DISABLE TRIGGER pg_lease_fence", "LF008");
    expect_error(&mut c, "SELECT lease.protect('payouts_a', '{table_id}', 'fencing_token')", "42710");
}

#[test]
fn config_changes_reach_long_lived_sessions() {
    let (db, mut c) = poker("config_inval");
    let mut writer = db.connect();
    writer.batch_execute(&pay(1, 5)).unwrap();
    c.batch_execute("SELECT lease.unprotect('payouts')").unwrap();
    writer.batch_execute(&pay(1, 1)).unwrap();
    c.batch_execute("SELECT lease.protect_high_water('payouts', '{table_id}', 'fencing_token')").unwrap();
    writer.batch_execute(&pay(1, 3)).unwrap();
    expect_error(&mut writer, &pay(1, 2), "LF001");
    // Bound token set before the library is loaded in a fresh session.
    let mut fresh = db.connect();
    fresh.batch_execute("CREATE TABLE t3 (table_id int); SELECT lease.protect('t3', '{table_id}')").unwrap();
    let mut fresh2 = db.connect();
    fresh2.batch_execute("BEGIN; SET LOCAL pg_lease.token = '5'; INSERT INTO t3 VALUES (1); COMMIT").unwrap();
}

/// Dropping an owner table, by name, with its schema or by cascade, is
/// refused naming it (it is gone from the catalogs when the guard runs:
/// its OID alone would say nothing).
#[test]
fn dropping_an_owner_table_is_refused_naming_it() {
    let db = TestDb::new("fence_drop_owner_name");
    let mut c = db.connect();
    c.batch_execute(
        r#"CREATE SCHEMA "jeu été";
           CREATE TABLE "jeu été"."Tables" (id int PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE payouts (table_id int NOT NULL, fencing_token bigint);
           SELECT lease.protect('payouts', '{table_id}', 'fencing_token', '"jeu été"."Tables"', '{id}');"#,
    )
    .unwrap();
    for drop in [r#"DROP TABLE "jeu été"."Tables""#, r#"DROP SCHEMA "jeu été" CASCADE"#] {
        let refused = expect_error(&mut c, drop, "LF008");
        assert!(
            refused.contains(r#"would drop owner table "jeu été"."Tables" of fenced table public.payouts"#)
                && refused.contains(r#"fenced against the owner rows of "jeu été"."Tables"."#),
            "{drop}: {refused}"
        );
    }
}
