//! Migrations beside other sessions' migrations: the DDL guards judge a
//! command by one consistent view of pg_lease's state, so a fence another
//! session protects or unprotects meanwhile never gets a command refused
//! that changes nothing of it.
//!
//! The race these tests would have caught (seen in CI, on Citus): at READ
//! COMMITTED, `lease._guard_ddl` listed the members of every fenced and
//! owner tree in one statement and looked for TRUNCATE guards outside them
//! in the next; a `lease.protect` committed in between put a guard outside
//! the list, and an `ALTER TABLE ... RENAME` of an unrelated owner table was
//! refused with "ALTER TABLE would take a partition out of an owner table".
//! The window is one statement wide, so the tests churn for a few seconds:
//! against the old guard they failed within a second or two.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An owner table and a fenced table for each name, protected for `a` only.
fn setup(c: &mut Client, names: &[&str]) {
    for n in names {
        must_run(
            c,
            &format!(
                "CREATE TABLE {n}_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0);
                 CREATE TABLE {n}_pay (table_id int, fencing_token bigint, amount int);
                 INSERT INTO {n}_tables VALUES (1, 5);"
            ),
        );
    }
    must_run(c, "SELECT lease.protect('a_pay', '{table_id}', 'fencing_token', 'a_tables')");
}

/// Protects and unprotects `<name>_pay` against `<name>_tables` until told
/// to stop: cycles done, or the first error.
fn churn(db: &str, name: &str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Result<usize, String>> {
    let db = db.to_owned();
    let name = name.to_owned();
    std::thread::spawn(move || {
        let mut c = connect_to(&db, "postgres");
        let mut cycles = 0;
        while !stop.load(Ordering::Relaxed) {
            for sql in [
                format!("SELECT lease.protect('{name}_pay', '{{table_id}}', 'fencing_token', '{name}_tables')"),
                format!("SELECT lease.unprotect('{name}_pay')"),
            ] {
                if let Some(e) = failure(&mut c, &sql) {
                    return Err(format!("{sql}: {e:?}"));
                }
            }
            cycles += 1;
        }
        Ok(cycles)
    })
}

/// Runs `commands(round)` for round 0, 1, ... for `how_long` (or until one
/// fails) while two other sessions protect and unprotect fences of their own.
fn beside_churn(c: &mut Client, db: &str, commands: impl Fn(usize) -> Vec<String>, how_long: Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let churners = [churn(db, "b", stop.clone()), churn(db, "c", stop.clone())];
    let start = Instant::now();
    let mut rounds = 0;
    let mut refused = None;
    'outer: while start.elapsed() < how_long {
        for sql in commands(rounds) {
            if let Some(e) = failure(c, &sql) {
                refused = Some(format!("{sql} (round {rounds}): {e:?}"));
                break 'outer;
            }
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let cycles: Vec<_> = churners.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(refused.is_none(), "refused beside another session's protect/unprotect: {}", refused.unwrap());
    for (name, r) in ["b", "c"].iter().zip(&cycles) {
        assert!(matches!(r, Ok(n) if *n > 0), "{name}'s protect/unprotect cycles: {r:?}");
    }
    assert!(rounds > 0, "no round ran");
}

/// The fence on `a_pay` still refuses a stale token and accepts the current one.
fn still_fenced(c: &mut Client, owner: &str) {
    expect_error(c, "INSERT INTO a_pay VALUES (1, 4, 1)", "LF001");
    must_run(c, "INSERT INTO a_pay VALUES (1, 5, 1)");
    assert_eq!(
        one_i64(
            c,
            &format!(
                "SELECT count(*) FROM lease.protected_tables WHERE owner_table = '{owner}'::regclass AND enforced"
            )
        ),
        1
    );
}

#[test]
fn owner_table_renames_beside_other_sessions_protects_are_not_refused() {
    let db = TestDb::new("ddl_race_rename");
    let mut c = db.connect();
    setup(&mut c, &["a", "b", "c"]);
    beside_churn(
        &mut c,
        &db.name,
        |_| vec!["ALTER TABLE a_tables RENAME TO a_tables2".into(), "ALTER TABLE a_tables2 RENAME TO a_tables".into()],
        Duration::from_secs(6),
    );
    still_fenced(&mut c, "a_tables");
}

#[test]
fn fenced_table_changes_and_drops_beside_other_sessions_protects_are_not_refused() {
    let db = TestDb::new("ddl_race_alter");
    let mut c = db.connect();
    setup(&mut c, &["a", "b", "c"]);
    // A partitioned owner table too: its partition tree is listed with the others.
    must_run(
        &mut c,
        "CREATE TABLE d_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
         CREATE TABLE d_tables_first PARTITION OF d_tables FOR VALUES FROM (0) TO (100);
         CREATE TABLE d_pay (table_id int, fencing_token bigint);
         SELECT lease.protect('d_pay', '{table_id}', 'fencing_token', 'd_tables');",
    );
    beside_churn(
        &mut c,
        &db.name,
        |round| {
            let from = 100 * (round + 1);
            vec![
                "ALTER TABLE a_pay ADD COLUMN note text".into(),
                "ALTER TABLE a_pay DROP COLUMN note".into(),
                format!(
                    "CREATE TABLE d_tables_{round} PARTITION OF d_tables FOR VALUES FROM ({from}) TO ({})",
                    from + 100
                ),
                "CREATE TABLE scratch (i int)".into(),
                "DROP TABLE scratch".into(),
                "ALTER TABLE a_tables ADD COLUMN seat int".into(),
                "ALTER TABLE a_tables DROP COLUMN seat".into(),
            ]
        },
        Duration::from_secs(6),
    );
    still_fenced(&mut c, "a_tables");
    // The partitions added meanwhile are guarded like the first.
    must_run(&mut c, "INSERT INTO d_tables VALUES (150, 3)");
    expect_error(&mut c, "UPDATE d_tables SET owner_fencing_token = 2 WHERE id = 150", "LF004");
    expect_error(&mut c, "TRUNCATE d_tables_0", "LF004");
}

/// A migration on tables no fence uses waits for no owner table: a DBA's
/// long `LOCK TABLE` of an owner table (or a `VACUUM FULL`) holds it up
/// nowhere else, and two sessions unprotecting unrelated fences cannot
/// deadlock over each other's owner tables (each drop used to judge, and
/// lock, every fence in the database). A `DROP INDEX` itself still looks at
/// every owner table's key: the index no longer names its table.
#[test]
fn migrations_on_tables_no_fence_uses_wait_for_no_owner_table() {
    let db = TestDb::new("ddl_race_locks");
    let mut c = db.connect();
    setup(&mut c, &["a", "b"]);
    must_run(
        &mut c,
        "CREATE TABLE other (i int PRIMARY KEY, j int, k int);
         CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
         CREATE TRIGGER t BEFORE INSERT ON other FOR EACH ROW EXECUTE FUNCTION noop();
         CREATE INDEX other_j ON other (j);
         CREATE UNIQUE INDEX other_jk ON other (j, k);
         CREATE TABLE gone (i int PRIMARY KEY);",
    );
    let mut dba = db.connect();
    must_run(&mut dba, "BEGIN; LOCK TABLE a_tables IN ACCESS EXCLUSIVE MODE");
    must_run(&mut c, "SET lock_timeout = '3s'");
    for sql in [
        "ALTER TABLE other ADD COLUMN l int",
        // (The drop guard opened every owner table to find whether its key
        // lost its unique index: it waited for the DBA here, and deadlocked
        // with a migration of the owner table that went on to touch `other`.)
        "DROP INDEX other_j",
        "DROP INDEX other_jk",
        "ALTER TABLE other DROP COLUMN k",
        "DROP TRIGGER t ON other",
        "ALTER TABLE other DROP CONSTRAINT other_pkey",
        "DROP TABLE gone",
        "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'b_tables')",
        "SELECT lease.unprotect('b_pay')",
    ] {
        if let Some(e) = failure(&mut c, sql) {
            panic!("{sql} beside a DBA's lock on another fence's owner table: {e:?}");
        }
    }
    must_run(&mut dba, "ROLLBACK");
    still_fenced(&mut c, "a_tables");
}

/// Runs `sql` on a new connection in another thread: its outcome.
fn in_other_session(db: &str, sql: &str) -> (i32, std::thread::JoinHandle<Option<[String; 2]>>) {
    let mut c = connect_to(db, "postgres");
    let pid = backend_pid(&mut c);
    let sql = sql.to_owned();
    (pid, std::thread::spawn(move || failure(&mut c, &sql)))
}

/// Waits (up to 5 s) until backend `pid` (from [`in_other_session`]) is
/// blocked on a lock, done with its command or gone: false when not blocked.
/// (Idle before its command arrives is not done: it still shows the query
/// `backend_pid` ran. Read as done, a test then went on before the other
/// session had even taken its snapshot.)
fn blocked_or_done(observer: &mut Client, pid: i32) -> bool {
    let start = Instant::now();
    loop {
        // (No row: the session is over.)
        let Some(row) = observer
            .query_opt("SELECT state, wait_event_type, query FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
        else {
            return false;
        };
        let (state, wait, query): (Option<String>, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        if wait.as_deref() == Some("Lock") {
            return true;
        }
        let done = state.as_deref() == Some("idle") && query.as_deref() != Some("SELECT pg_backend_pid()");
        if done || start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// pg_lease's triggers on `rel`.
fn lease_triggers(c: &mut Client, rel: &str) -> i64 {
    one_i64(
        c,
        &format!("SELECT count(*) FROM pg_trigger WHERE tgrelid = '{rel}'::regclass AND tgname LIKE 'pg\\_lease\\_%'"),
    )
}

/// **Hole (fixed).** The last fence on an owner table is dropped while
/// another session protects a new table against it. The drop guard decided
/// that no fence used the owner table any more from a snapshot without the
/// new fence, waited for the protecting session's lock, and then dropped
/// the owner guard that the new fence, committed meanwhile, relied on:
/// tokens could be lowered and the owner table truncated without a word.
#[test]
fn the_last_fence_dropped_beside_a_new_protect_leaves_the_owner_guard_in_place() {
    let db = TestDb::new("ddl_race_drop_protect");
    let mut c = db.connect();
    setup(&mut c, &["a", "f"]);
    must_run(&mut c, "BEGIN; SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'a_tables')");
    let (pid, dropper) = in_other_session(&db.name, "DROP TABLE a_pay");
    let mut observer = db.connect();
    let blocked = blocked_or_done(&mut observer, pid);
    must_run(&mut c, "COMMIT");
    assert_eq!(dropper.join().unwrap(), None, "DROP TABLE of the old fenced table (blocked: {blocked})");
    // The new fence is whole: its owner guard refuses a lower token and TRUNCATE.
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM lease.protected_tables WHERE table_name = 'f_pay'::regclass AND enforced"
        ),
        1
    );
    expect_error(&mut c, "UPDATE a_tables SET owner_fencing_token = 4 WHERE id = 1", "LF004");
    expect_error(&mut c, "TRUNCATE a_tables", "LF004");
    expect_error(&mut c, "INSERT INTO f_pay VALUES (1, 4, 1)", "LF001");
    must_run(&mut c, "INSERT INTO f_pay VALUES (1, 5, 1)");
}

/// **Broken state (fixed).** The last two fences on an owner table are
/// unprotected side by side. Each saw the other's fence and kept the owner
/// guard, which then guarded a table no fence used: every write to it
/// (`lease.acquire` too) failed with 55000, and every later DDL guard
/// refused unrelated commands. Now the second waits for the first and
/// removes the guards (at REPEATABLE READ it fails with 40001, and a retry
/// removes them).
#[test]
fn the_last_two_fences_unprotected_side_by_side_leave_no_guard_behind() {
    for isolation in ["READ COMMITTED", "REPEATABLE READ"] {
        let db = TestDb::new("ddl_race_unprotect_two");
        let mut c = db.connect();
        setup(&mut c, &["a", "f"]);
        must_run(&mut c, "SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'a_tables')");
        must_run(&mut c, "BEGIN; SELECT lease.unprotect('a_pay')");
        let (pid, other) = in_other_session(
            &db.name,
            &format!("BEGIN ISOLATION LEVEL {isolation}; SELECT 1; SELECT lease.unprotect('f_pay'); COMMIT"),
        );
        let mut observer = db.connect();
        let blocked = blocked_or_done(&mut observer, pid);
        must_run(&mut c, "COMMIT");
        let outcome = other.join().unwrap();
        if isolation == "READ COMMITTED" {
            assert_eq!(outcome, None, "the second unprotect (blocked: {blocked})");
        } else {
            assert!(
                outcome.as_ref().is_some_and(|[code, _]| code == "40001"),
                "the second unprotect at {isolation}, behind the first: {outcome:?} (blocked: {blocked})"
            );
            must_run(&mut c, "SELECT lease.unprotect('f_pay')");
        }
        assert_eq!(lease_triggers(&mut c, "a_tables"), 0, "guards left on a_tables ({isolation})");
        must_run(&mut c, "UPDATE a_tables SET owner_fencing_token = 1 WHERE id = 1");
        must_run(&mut c, "ALTER TABLE f_pay ADD COLUMN note text");
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);
    }
}

/// The same fence unprotected by two sessions at once: the second is told
/// it is not protected (42704), not that a trigger does not exist.
#[test]
fn one_fence_unprotected_twice_side_by_side_is_not_protected_the_second_time() {
    let db = TestDb::new("ddl_race_unprotect_same");
    let mut c = db.connect();
    setup(&mut c, &["a"]);
    must_run(&mut c, "BEGIN; SELECT lease.unprotect('a_pay')");
    let (pid, other) = in_other_session(&db.name, "SELECT lease.unprotect('a_pay')");
    let mut observer = db.connect();
    wait_until_blocked(&mut observer, pid);
    must_run(&mut c, "COMMIT");
    let outcome = other.join().unwrap();
    assert!(
        outcome.as_ref().is_some_and(|[code, message]| code == "42704" && message.contains("is not protected")),
        "second unprotect: {outcome:?}"
    );
    assert_eq!(lease_triggers(&mut c, "a_tables") + lease_triggers(&mut c, "a_pay"), 0);
}

/// **Deadlock (fixed).** A migration of a fenced table and one of its owner
/// table, side by side, with both tables partitioned. The DDL guard listed
/// the partitions that joined either tree in this transaction through
/// `pg_partition_tree`, which takes a lock on every partition of both
/// trees: a command on the fenced table waited for the owner table's
/// migration (and the other way round; for a plain owner table too, which
/// the guard opened to find its key's index), and two whose guards ran at once,
/// each holding its own table, deadlocked (40P01). Now neither waits for the
/// other (`lock_timeout` would fail it); each is judged on its own, and the
/// fence holds after both.
#[test]
fn migrations_of_a_fenced_table_and_its_owner_table_side_by_side_wait_for_neither() {
    let db = TestDb::new("ddl_race_two_trees");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE po_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
         CREATE TABLE po_tables_1 PARTITION OF po_tables FOR VALUES FROM (0) TO (100);
         CREATE TABLE po_tables_2 PARTITION OF po_tables FOR VALUES FROM (100) TO (200);
         CREATE TABLE po_pay (table_id int, fencing_token bigint, amount int) PARTITION BY RANGE (table_id);
         CREATE TABLE po_pay_1 PARTITION OF po_pay FOR VALUES FROM (0) TO (100);
         CREATE TABLE po_pay_2 PARTITION OF po_pay FOR VALUES FROM (100) TO (200);
         INSERT INTO po_tables VALUES (1, 5), (150, 7);
         SELECT lease.protect('po_pay', '{table_id}', 'fencing_token', 'po_tables');",
    );
    // (And a plain owner table: judging a command on its fenced table
    // opened it to find its key's unique index.)
    setup(&mut c, &["a"]);
    for (first, second) in [
        ("ALTER TABLE po_tables ADD COLUMN note text", "ALTER TABLE po_pay ADD COLUMN note text"),
        ("ALTER TABLE po_pay ADD COLUMN memo text", "ALTER TABLE po_tables ADD COLUMN memo text"),
        (
            "LOCK TABLE po_tables_1 IN ACCESS EXCLUSIVE MODE",
            "ALTER TABLE po_pay_2 ADD CONSTRAINT positive CHECK (amount > 0)",
        ),
        ("LOCK TABLE a_tables IN ACCESS EXCLUSIVE MODE", "ALTER TABLE a_pay ADD COLUMN note text"),
        ("ALTER TABLE a_pay ADD COLUMN memo text", "ALTER TABLE a_tables ADD COLUMN memo text"),
    ] {
        let mut a = db.connect();
        must_run(&mut a, &format!("BEGIN; {first}"));
        let mut b = db.connect();
        must_run(&mut b, "SET lock_timeout = '3s'");
        let outcome = failure(&mut b, second);
        must_run(&mut a, "COMMIT");
        assert_eq!(outcome, None, "{second} beside an open {first}");
    }
    expect_error(&mut c, "UPDATE po_tables SET owner_fencing_token = 4 WHERE id = 1", "LF004");
    expect_error(&mut c, "INSERT INTO po_pay (table_id, fencing_token, amount) VALUES (150, 6, 1)", "LF001");
    must_run(&mut c, "INSERT INTO po_pay (table_id, fencing_token, amount) VALUES (150, 7, 1)");
    expect_error(&mut c, "TRUNCATE po_tables_2", "LF004");
}

/// **Broken (fixed).** README's migrator could not `protect` or
/// `unprotect` in a REPEATABLE READ or SERIALIZABLE transaction: the check
/// that the catalog had not changed after its snapshot ran pg_lease's
/// internal catalog reader as the caller, who may not execute it (42501).
#[test]
fn the_migrator_protects_and_unprotects_at_every_isolation_level() {
    let role = MigratorRole::new("ddl_race_rr_migrator");
    let db = TestDb::new("ddl_race_rr_migrator");
    role.grant(&mut db.connect());
    let mut m = db.connect_as(&role.0);
    setup(&mut m, &["a"]);
    for isolation in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        for sql in [
            format!("BEGIN ISOLATION LEVEL {isolation}; SELECT lease.unprotect('a_pay'); COMMIT"),
            format!(
                "BEGIN ISOLATION LEVEL {isolation}; SELECT lease.protect('a_pay', '{{table_id}}', 'fencing_token', 'a_tables'); COMMIT"
            ),
        ] {
            if let Some(e) = failure(&mut m, &sql) {
                panic!("as the migrator: {sql}: {e:?}");
            }
        }
    }
    expect_error(&mut m, "INSERT INTO a_pay VALUES (1, 4, 1)", "LF001");
    // protected_by names who set the fence up (it named pg_lease's own
    // role, as whom the row is written).
    let by: String = db
        .connect()
        .query_one("SELECT protected_by::text FROM lease.protected_tables WHERE table_name = 'a_pay'::regclass", &[])
        .unwrap()
        .get(0);
    assert_eq!(by, role.0);
}

/// **Broken state (fixed).** The last fence on a partitioned owner table
/// is dropped (or unprotected) while another session creates, or attaches,
/// a partition under one of its partitions. That session locks the
/// sub-partitioned partition, not the owner table, so the drop listed the
/// owner guards to remove without the new partition's, waited, and left its
/// TRUNCATE guard behind: `TRUNCATE` of it failed, every later `protect`
/// in the database was refused, and other fences' DDL was refused too. The
/// same for the TRUNCATE guards of a fenced table's new sub-partition.
#[test]
fn the_last_fence_removed_beside_a_new_sub_partition_leaves_no_guard_behind() {
    // (q_pay plain, so that the drop waits for nothing before its guard runs.)
    let plain_pay = "CREATE TABLE q_pay (table_id int, fencing_token bigint, amount int);";
    let partitioned_pay =
        "CREATE TABLE q_pay (table_id int, fencing_token bigint, amount int) PARTITION BY RANGE (table_id);
         CREATE TABLE q_pay_1 PARTITION OF q_pay FOR VALUES FROM (0) TO (100) PARTITION BY RANGE (table_id);
         CREATE TABLE q_pay_1a PARTITION OF q_pay_1 FOR VALUES FROM (0) TO (50);";
    let new_owner_partition = "CREATE TABLE q_tables_1b PARTITION OF q_tables_1 FOR VALUES FROM (50) TO (100)";
    for (pay, removal, add) in [
        (plain_pay, "DROP TABLE q_pay", new_owner_partition),
        (plain_pay, "SELECT lease.unprotect('q_pay')", new_owner_partition),
        (
            plain_pay,
            "DROP TABLE q_pay",
            "CREATE TABLE q_x (id int NOT NULL, owner_fencing_token bigint NOT NULL DEFAULT 0);
             ALTER TABLE q_tables_1 ATTACH PARTITION q_x FOR VALUES FROM (50) TO (100)",
        ),
        (
            partitioned_pay,
            "SELECT lease.unprotect('q_pay')",
            "CREATE TABLE q_pay_1b PARTITION OF q_pay_1 FOR VALUES FROM (50) TO (100)",
        ),
    ] {
        let db = TestDb::new("ddl_race_sub_partition");
        let mut c = db.connect();
        must_run(
            &mut c,
            &format!(
                "CREATE TABLE q_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
                 CREATE TABLE q_tables_1 PARTITION OF q_tables FOR VALUES FROM (0) TO (100) PARTITION BY RANGE (id);
                 CREATE TABLE q_tables_1a PARTITION OF q_tables_1 FOR VALUES FROM (0) TO (50);
                 {pay}
                 INSERT INTO q_tables VALUES (1, 5);
                 SELECT lease.protect('q_pay', '{{table_id}}', 'fencing_token', 'q_tables');
                 CREATE TABLE r_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0);
                 CREATE TABLE r_pay (table_id int, fencing_token bigint, amount int);"
            ),
        );
        must_run(&mut c, &format!("BEGIN; {add}"));
        let (pid, remover) = in_other_session(&db.name, removal);
        let mut observer = db.connect();
        let blocked = blocked_or_done(&mut observer, pid);
        must_run(&mut c, "COMMIT");
        assert_eq!(remover.join().unwrap(), None, "{removal} beside {add} (blocked: {blocked})");
        let left = one_i64(
            &mut c,
            "SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
             WHERE g.tgname LIKE 'pg\\_lease\\_%' AND c.relname LIKE 'q\\_%'",
        );
        assert_eq!(left, 0, "pg_lease triggers left after {removal} beside {add}");
        for sql in [
            "TRUNCATE q_tables",
            "SELECT lease.protect('r_pay', '{table_id}', 'fencing_token', 'r_tables')",
            "ALTER TABLE r_pay ADD COLUMN note text",
        ] {
            if let Some(e) = failure(&mut c, sql) {
                panic!("{sql} after {removal} beside {add}: {e:?}");
            }
        }
    }
}

/// **Broken state (fixed).** `DETACH PARTITION ... CONCURRENTLY` of a
/// partition of a table that another session is making an owner table
/// (its first `lease.protect`, not yet committed): the detach's start
/// check found no owner table, the detach waited for the protect, committed
/// its first phase, and was refused only after it: the partition stayed
/// "detach pending", its owner rows unreachable (`lease.acquire` and fenced
/// writes failed), and every later `protect` was refused. Now the check
/// waits for the protect and refuses the detach before it starts.
#[test]
fn a_concurrent_detach_beside_the_first_protect_is_refused_before_it_starts() {
    let db = TestDb::new("ddl_race_detach_concurrently");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE d_tables (id int PRIMARY KEY, owner_fencing_token bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id);
         CREATE TABLE d_tables_1 PARTITION OF d_tables FOR VALUES FROM (0) TO (100);
         CREATE TABLE d_tables_2 PARTITION OF d_tables FOR VALUES FROM (100) TO (200);
         INSERT INTO d_tables VALUES (7, 5);
         CREATE TABLE d_pay (table_id int, fencing_token bigint, amount int);",
    );
    must_run(&mut c, "BEGIN; SELECT lease.protect('d_pay', '{table_id}', 'fencing_token', 'd_tables')");
    let (pid, detacher) = in_other_session(&db.name, "ALTER TABLE d_tables DETACH PARTITION d_tables_1 CONCURRENTLY");
    let mut observer = db.connect();
    let blocked = blocked_or_done(&mut observer, pid);
    must_run(&mut c, "COMMIT");
    let outcome = detacher.join().unwrap();
    assert!(
        outcome.as_ref().is_some_and(|[code, _]| code == "LF004"),
        "DETACH ... CONCURRENTLY beside the first protect: {outcome:?} (blocked: {blocked})"
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending"), 0);
    expect_error(&mut c, "INSERT INTO d_pay VALUES (7, 4, 1)", "LF001");
    must_run(&mut c, "INSERT INTO d_pay VALUES (7, 5, 1)");
    must_run(&mut c, "CREATE TABLE e_pay (table_id int, fencing_token bigint, amount int)");
    must_run(&mut c, "SELECT lease.protect('e_pay', '{table_id}', 'fencing_token', 'd_tables')");
}

/// **Hole (fixed, a stale write accepted).** `DROP INDEX CONCURRENTLY` of
/// the unique index that keeps an owner key unique was refused only at its
/// end, after its first steps had committed: the index no longer kept the
/// key unique, a look-alike owner row could be inserted, and a stale
/// writer's row matched it. Now it is refused before it starts (also beside
/// the first protect of that owner table); other indexes drop concurrently.
#[test]
fn a_concurrent_drop_of_an_owner_key_index_is_refused_before_it_starts() {
    let db = TestDb::new("ddl_race_drop_index_concurrently");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE i_tables (id int NOT NULL, name text, owner_fencing_token bigint);
         CREATE UNIQUE INDEX i_tables_id ON i_tables (id);
         CREATE INDEX i_tables_name ON i_tables (name);
         CREATE UNIQUE INDEX i_tables_name_u ON i_tables (name, id);
         CREATE TABLE i_pay (table_id int, amount int, fencing_token bigint);
         INSERT INTO i_tables VALUES (7, 'a', 6);
         CREATE TABLE other (i int);
         CREATE UNIQUE INDEX other_i ON other (i);",
    );
    // Beside the first protect of the owner table: waits for it, then refused.
    must_run(&mut c, "BEGIN; SELECT lease.protect('i_pay', '{table_id}', 'fencing_token', 'i_tables')");
    let (pid, dropper) = in_other_session(&db.name, "DROP INDEX CONCURRENTLY i_tables_id");
    let mut observer = db.connect();
    let blocked = blocked_or_done(&mut observer, pid);
    must_run(&mut c, "COMMIT");
    let outcome = dropper.join().unwrap();
    assert!(
        outcome.as_ref().is_some_and(|[code, message]| code == "LF008" && message.contains("CONCURRENTLY")),
        "DROP INDEX CONCURRENTLY of the owner key's index beside the first protect: {outcome:?} (blocked: {blocked})"
    );
    let err = expect_error(&mut c, "DROP INDEX CONCURRENTLY i_tables_id", "LF008");
    assert!(err.contains("i_tables_id"), "{err}");
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM pg_index WHERE indexrelid = 'i_tables_id'::regclass AND indisvalid AND indisready AND indislive"
        ),
        1,
        "the owner key's index is whole"
    );
    expect_error(&mut c, "INSERT INTO i_tables VALUES (7, 'dup', 5)", "23505");
    expect_error(&mut c, "INSERT INTO i_pay VALUES (7, 1, 5)", "LF001");
    // Other indexes: on the owner table (not unique), elsewhere (unique).
    must_run(&mut c, "DROP INDEX CONCURRENTLY i_tables_name");
    must_run(&mut c, "DROP INDEX CONCURRENTLY other_i");
    must_run(&mut c, "DROP INDEX CONCURRENTLY IF EXISTS no_such_index");
    // A unique index that is not the owner key's: refused concurrently (the
    // guard does not tell them apart before the drop), dropped plainly.
    expect_error(&mut c, "DROP INDEX CONCURRENTLY i_tables_name_u", "LF008");
    must_run(&mut c, "DROP INDEX i_tables_name_u");
    // Plainly, the owner key's last unique index is refused before commit.
    expect_error(&mut c, "DROP INDEX i_tables_id", "LF008");
}

/// **Hole (fixed, stale rows let in).** Rows an `ATTACH PARTITION` brings
/// into a fenced table are checked against their owner rows, except when
/// the fence itself was protected in the same transaction (rows from before
/// a fence are not its to judge). That was told by the `lease.protected`
/// row's xmin, which `lease.judge_replicated` also gives it (an UPDATE): a
/// role allowed to call it attached a partition of stale rows unchecked.
/// Now only a row inserted in this transaction counts; a protect in the same
/// transaction still lets a table's history in.
#[test]
fn an_attach_after_judge_replicated_in_one_transaction_is_still_judged() {
    let db = TestDb::new("ddl_race_judge_attach");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE j_tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE j_pay (table_id int NOT NULL, amount int, fencing_token bigint) PARTITION BY RANGE (amount);
         CREATE TABLE j_pay_1 PARTITION OF j_pay FOR VALUES FROM (0) TO (100);
         INSERT INTO j_tables VALUES (7, 6);
         SELECT lease.protect('j_pay', '{table_id}', 'fencing_token', 'j_tables');
         CREATE TABLE stale (LIKE j_pay); INSERT INTO stale VALUES (7, 150, 5);",
    );
    expect_error(&mut c, "ALTER TABLE j_pay ATTACH PARTITION stale FOR VALUES FROM (100) TO (200)", "LF008");
    for judge in ["NULL", "true", "false"] {
        let err = expect_error(
            &mut c,
            &format!(
                "BEGIN; SELECT lease.judge_replicated('j_pay', {judge});
                 ALTER TABLE j_pay ATTACH PARTITION stale FOR VALUES FROM (100) TO (200); COMMIT"
            ),
            "LF008",
        );
        assert!(err.contains("would refuse"), "{err}");
        must_run(&mut c, "ROLLBACK");
    }
    // In a savepoint, and after a write through the fence: the same.
    expect_error(
        &mut c,
        "BEGIN; INSERT INTO j_pay VALUES (7, 1, 6); SAVEPOINT s; SELECT lease.judge_replicated('j_pay', true);
         RELEASE s; ALTER TABLE j_pay ATTACH PARTITION stale FOR VALUES FROM (100) TO (200)",
        "LF008",
    );
    must_run(&mut c, "ROLLBACK");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM j_pay WHERE fencing_token = 5"), 0);
    // A fence protected in the transaction takes the table's history in.
    must_run(
        &mut c,
        "BEGIN; SELECT lease.unprotect('j_pay'); COMMIT;
         BEGIN; SELECT lease.protect('j_pay', '{table_id}', 'fencing_token', 'j_tables');
         ALTER TABLE j_pay ATTACH PARTITION stale FOR VALUES FROM (100) TO (200); COMMIT;",
    );
    expect_error(&mut c, "INSERT INTO j_pay VALUES (7, 2, 5)", "LF001");
}

/// **Hole (fixed, a stale write accepted).** An interrupted `DETACH
/// PARTITION ... CONCURRENTLY` (cancelled while it waited) leaves its
/// partition "detach pending", outside the tree Postgres shows. `protect`
/// then installed no guard on it, and `DETACH ... FINALIZE` took it and its
/// owner rows out of the owner table afterwards: the resource's token could
/// start over, and a stale write committed. Now `protect` refuses such a
/// tree (55000, naming the FINALIZE to run), and FINALIZE on an owner table
/// is refused (LF004) like the concurrent detach itself.
#[test]
fn a_partition_left_detach_pending_cannot_be_fenced_over_nor_finalized_out() {
    let db = TestDb::new("ddl_race_detach_pending");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE f_tables (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE f_tables_1 PARTITION OF f_tables FOR VALUES FROM (0) TO (100);
         CREATE TABLE f_tables_2 PARTITION OF f_tables FOR VALUES FROM (100) TO (200);
         INSERT INTO f_tables VALUES (5, 3), (150, 20);
         CREATE TABLE f_pay (table_id int NOT NULL, amount int, fencing_token bigint NOT NULL);",
    );
    // A reader holds the table; the detach waits for it and is cancelled.
    let mut reader = db.connect();
    must_run(&mut reader, "BEGIN; SELECT count(*) FROM f_tables");
    must_run(&mut c, "SET statement_timeout = '500ms'");
    expect_error(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 CONCURRENTLY", "57014");
    must_run(&mut c, "RESET statement_timeout");
    must_run(&mut reader, "COMMIT");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending"), 1);
    let err = expect_error(&mut c, "SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'f_tables')", "55000");
    assert!(err.contains("f_tables_2") && err.contains("being detached"), "{err}");
    // Finished, the fence can be set up over what is left.
    must_run(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 FINALIZE");
    must_run(&mut c, "SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'f_tables')");
    // Interrupted again after protect (refused at once now), and a FINALIZE
    // of a detach left pending before the fence: both refused.
    must_run(
        &mut c,
        "SELECT lease.unprotect('f_pay');
         ALTER TABLE f_tables ATTACH PARTITION f_tables_2 FOR VALUES FROM (100) TO (200);",
    );
    must_run(&mut reader, "BEGIN; SELECT count(*) FROM f_tables");
    must_run(&mut c, "SET statement_timeout = '500ms'");
    expect_error(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 CONCURRENTLY", "57014");
    must_run(&mut c, "RESET statement_timeout");
    must_run(&mut reader, "COMMIT");
    expect_error(&mut c, "SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'f_tables')", "55000");
    expect_error(&mut c, "SELECT lease.protect_high_water('f_tables', '{id}', 'owner_fencing_token')", "55000");
    must_run(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 FINALIZE");
    must_run(
        &mut c,
        "ALTER TABLE f_tables ATTACH PARTITION f_tables_2 FOR VALUES FROM (100) TO (200);
         SELECT lease.protect('f_pay', '{table_id}', 'fencing_token', 'f_tables');",
    );
    let err = expect_error(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 FINALIZE", "LF004");
    assert!(err.contains("FINALIZE"), "{err}");
    expect_error(&mut c, "ALTER TABLE f_tables DETACH PARTITION f_tables_2 CONCURRENTLY", "LF004");
    expect_error(&mut c, "INSERT INTO f_pay VALUES (150, 1, 10)", "LF001");
    must_run(&mut c, "INSERT INTO f_pay VALUES (150, 1, 20)");
}

/// An owner table whose key is unique through a plain unique index, and a
/// table fenced against it.
fn setup_index_key(c: &mut Client) {
    must_run(
        c,
        "CREATE TABLE u_tables (id int NOT NULL, owner_fencing_token bigint NOT NULL DEFAULT 0);
         CREATE UNIQUE INDEX u_key ON u_tables (id);
         CREATE INDEX u_tok ON u_tables (owner_fencing_token);
         CREATE TABLE u_pay (table_id int, fencing_token bigint, amount int);
         INSERT INTO u_tables VALUES (1, 5);
         SELECT lease.protect('u_pay', '{table_id}', 'fencing_token', 'u_tables');
         CREATE TABLE u_other (i int);
         CREATE UNIQUE INDEX u_other_i ON u_other (i);",
    );
}

/// `DROP INDEX` of the index that keeps an owner key unique is refused
/// however it is named (alone, beside others, schema-qualified, through
/// `DROP OWNED`'s or `DROP SCHEMA`'s reach), and only the owner tables the
/// command locked are judged: any other index goes, even while a migration
/// holds every owner table.
#[test]
fn dropping_an_owner_key_index_is_refused_and_only_it() {
    let db = TestDb::new("ddl_race_drop_index");
    let mut c = db.connect();
    setup(&mut c, &["a"]);
    setup_index_key(&mut c);
    for sql in [
        "DROP INDEX u_key",
        "DROP INDEX public.u_key",
        "DROP INDEX u_other_i, u_key",
        "DROP INDEX u_key CASCADE",
        "BEGIN; DROP INDEX u_tok; DROP INDEX u_key",
    ] {
        let err = expect_error(&mut c, sql, "LF008");
        assert!(err.contains("u_tables"), "{sql}: {err}");
        must_run(&mut c, "ROLLBACK");
    }
    // With both owner tables held by a migration, an index of neither goes.
    let mut dba = db.connect();
    must_run(&mut dba, "BEGIN; LOCK TABLE a_tables, u_tables IN ACCESS EXCLUSIVE MODE");
    must_run(&mut c, "SET lock_timeout = '3s'");
    if let Some(e) = failure(&mut c, "DROP INDEX u_other_i") {
        panic!("DROP INDEX of another table's index beside a migration of the owner tables: {e:?}");
    }
    must_run(&mut dba, "ROLLBACK");
    // A non-key index of the owner table goes too; the key stays enforced.
    must_run(&mut c, "DROP INDEX u_tok");
    expect_error(&mut c, "INSERT INTO u_pay VALUES (1, 4, 1)", "LF001");
    must_run(&mut c, "INSERT INTO u_pay VALUES (1, 5, 1)");
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM lease.protected_tables WHERE table_name = 'u_pay'::regclass AND enforced"
        ),
        1
    );
}

/// **Hole (fixed, a stale write accepted).** The owner table's owner made the
/// unique index that keeps the owner key unique depend on an extension
/// (`ALTER INDEX ... DEPENDS ON EXTENSION`, which only needs the table's
/// ownership) and dropped the extension: the index went with it unjudged
/// (the drop guard looked only at indexes dropped by name or by a normal
/// dependency), a look-alike owner row with an older token could be
/// inserted, and a stale writer's row matched it. Now refused (LF008);
/// another index that depends on the extension goes with it.
#[test]
fn an_owner_key_index_dropped_with_an_extension_is_refused() {
    let db = TestDb::new("ddl_race_index_extension");
    let mut c = db.connect();
    setup_index_key(&mut c);
    must_run(&mut c, "CREATE EXTENSION dblink; ALTER INDEX u_tok DEPENDS ON EXTENSION dblink; DROP EXTENSION dblink");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pg_class WHERE relname = 'u_tok'"), 0);
    must_run(&mut c, "CREATE EXTENSION dblink");
    // Tying the owner key's index to an extension is refused at once now
    // (attack36.rs); one tied before the table became an owner table (or
    // before 0.9.2) is judged when the extension goes.
    expect_error(&mut c, "ALTER INDEX u_key DEPENDS ON EXTENSION dblink", "LF008");
    must_run(
        &mut c,
        "SELECT lease.unprotect('u_pay'); ALTER INDEX u_key DEPENDS ON EXTENSION dblink;
         SELECT lease.protect('u_pay', '{table_id}', 'fencing_token', 'u_tables');",
    );
    // README's (Upgrades) listing of such ties finds it.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let at =
        readme.find("SELECT pg_catalog.pg_describe_object(d.classid, d.objid, 0) AS tied").expect("README's query");
    let listing = &readme[at..at + readme[at..].find(";\n").unwrap()];
    let tied: Vec<(String, String)> = c.query(listing, &[]).unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(tied, [("index u_key".to_owned(), "dblink".to_owned())]);
    let err = expect_error(&mut c, "DROP EXTENSION dblink", "LF008");
    assert!(err.contains("u_tables") && err.contains("ALTER INDEX ... NO DEPENDS ON EXTENSION keeps it"), "{err}");
    expect_error(&mut c, "INSERT INTO u_tables VALUES (1, 4)", "23505");
    expect_error(&mut c, "INSERT INTO u_pay VALUES (1, 4, 1)", "LF001");
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM lease.protected_tables WHERE table_name = 'u_pay'::regclass AND enforced"
        ),
        1
    );
}

/// Resets the fences of `setup_twice`'s tables.
const UNPROTECT_ALL: &str = "SELECT lease.unprotect(relid) FROM lease.protected";

/// **Messages (fixed).** One table protected by two sessions at once (against
/// two owner tables, as owner and as high-water fence, a partition and its
/// parent): the second waited for the first and then failed with 23505 on
/// `protected_pkey` or 42710 "trigger ... already exists". Now it is told
/// the table is already protected (42710), as it would be one after the
/// other, and the first fence is whole.
#[test]
fn one_table_protected_twice_side_by_side_is_already_protected_the_second_time() {
    let db = TestDb::new("ddl_race_protect_twice");
    let mut c = db.connect();
    setup(&mut c, &["a", "b"]);
    must_run(
        &mut c,
        &format!(
            "{UNPROTECT_ALL};
             CREATE TABLE p_pay (table_id int, fencing_token bigint, amount int) PARTITION BY RANGE (table_id);
             CREATE TABLE p_pay_1 PARTITION OF p_pay FOR VALUES FROM (0) TO (100);"
        ),
    );
    let owner_a = "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'a_tables')";
    let owner_b = "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'b_tables')";
    let high_water = "SELECT lease.protect_high_water('b_pay', '{table_id}', 'fencing_token')";
    let parent = "SELECT lease.protect_high_water('p_pay', '{table_id}', 'fencing_token')";
    let partition = "SELECT lease.protect('p_pay_1', '{table_id}', 'fencing_token', 'a_tables')";
    for (first, second) in [
        (owner_a, owner_b),
        (owner_a, high_water),
        (high_water, owner_a),
        (high_water, high_water),
        (parent, partition),
        (partition, parent),
    ] {
        must_run(&mut c, &format!("BEGIN; {first}"));
        let (pid, other) = in_other_session(&db.name, second);
        let mut observer = db.connect();
        wait_until_blocked(&mut observer, pid);
        must_run(&mut c, "COMMIT");
        let outcome = other.join().unwrap();
        assert!(
            outcome.as_ref().is_some_and(|[code, message]| code == "42710" && message.contains("is already protected")),
            "{second} beside {first}: {outcome:?}"
        );
        let problems = one_i64(&mut c, "SELECT count(*) FROM lease._fence_problems()");
        assert_eq!(problems, 0, "the fence of {first} after {second}");
        must_run(&mut c, UNPROTECT_ALL);
    }
}

/// **Messages (fixed).** A table dropped while another session protects
/// against it (as the owner table), protects it or unprotects it: the
/// change waited for the drop and then failed with XX000 "could not open
/// relation with OID", 42601 (a query built from the dropped table's
/// column types), or 42704 naming an OID. Now it names the table (42P01).
#[test]
fn fence_changes_beside_a_drop_of_their_tables_name_the_dropped_one() {
    for (drop, change, gone, left) in [
        (
            "DROP TABLE b_tables",
            "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'b_tables')",
            "b_tables",
            1,
        ),
        ("DROP TABLE b_pay", "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'b_tables')", "b_pay", 1),
        ("DROP TABLE b_pay", "SELECT lease.protect_high_water('b_pay', '{table_id}', 'fencing_token')", "b_pay", 1),
        // (The drop also removes a_tables' guards, holding a_tables.)
        ("DROP TABLE a_pay", "SELECT lease.protect('a_pay', '{table_id}', 'fencing_token', 'a_tables')", "a_pay", 0),
        ("DROP TABLE a_pay", "SELECT lease.unprotect('a_pay')", "a_pay", 0),
    ] {
        let db = TestDb::new("ddl_race_protect_dropped");
        let mut c = db.connect();
        setup(&mut c, &["a", "b"]);
        must_run(&mut c, &format!("BEGIN; {drop}"));
        let (pid, other) = in_other_session(&db.name, change);
        let mut observer = db.connect();
        wait_until_blocked(&mut observer, pid);
        must_run(&mut c, "COMMIT");
        let outcome = other.join().unwrap();
        assert!(
            outcome.as_ref().is_some_and(|[code, message]| code == "42P01"
                && message.contains(gone)
                && message.contains("dropped by a concurrent transaction")),
            "{change} beside {drop}: {outcome:?}"
        );
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), left);
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease._fence_problems()"), 0);
    }
}

/// **Broken (fixed).** A fence change behind the opposite one on the same
/// table (protect behind unprotect, unprotect behind protect, of the table
/// or of its partitioned parent): it checked whether the table was
/// protected under the snapshot it took before it waited, so at READ
/// COMMITTED `protect` said "already protected" (42710) of a table the
/// other session had just unprotected, and `unprotect` "not protected" of
/// one it had just protected; above READ COMMITTED it did not fail with
/// 40001 as a change committed after the snapshot should. A migration that
/// reads 42710 as "already done" then left the table unfenced. Now the
/// change waits first and decides after: it takes effect (READ COMMITTED),
/// or fails with 40001 (REPEATABLE READ, SERIALIZABLE).
#[test]
fn a_fence_change_behind_the_opposite_change_sees_it() {
    let protect_a = "SELECT lease.protect('a_pay', '{table_id}', 'fencing_token', 'a_tables')";
    let high_water_a = "SELECT lease.protect_high_water('a_pay', '{table_id}', 'fencing_token')";
    let unprotect_a = "SELECT lease.unprotect('a_pay')";
    let protect_part = "SELECT lease.protect('p_pay_1', '{table_id}', 'fencing_token', 'a_tables')";
    let protect_parent = "SELECT lease.protect_high_water('p_pay', '{table_id}', 'fencing_token')";
    let unprotect_parent = "SELECT lease.unprotect('p_pay')";
    // (first, second, whether a_pay starts protected, the fences left when the second takes effect)
    for (first, second, start_protected, after) in [
        (unprotect_a, protect_a, true, vec!["a_pay"]),
        (unprotect_a, high_water_a, true, vec!["a_pay"]),
        (protect_a, unprotect_a, false, vec![]),
        (unprotect_parent, protect_part, false, vec!["p_pay_1"]),
    ] {
        for isolation in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
            let db = TestDb::new("ddl_race_opposite");
            let mut c = db.connect();
            setup(&mut c, &["a"]);
            must_run(
                &mut c,
                "CREATE TABLE p_pay (table_id int, fencing_token bigint, amount int) PARTITION BY RANGE (table_id);
                 CREATE TABLE p_pay_1 PARTITION OF p_pay FOR VALUES FROM (0) TO (100);",
            );
            if !start_protected {
                must_run(&mut c, unprotect_a);
            }
            if first == unprotect_parent {
                must_run(&mut c, protect_parent);
            }
            must_run(&mut c, &format!("BEGIN; {first}"));
            let (pid, other) =
                in_other_session(&db.name, &format!("BEGIN ISOLATION LEVEL {isolation}; SELECT 1; {second}; COMMIT"));
            let mut observer = db.connect();
            wait_until_blocked(&mut observer, pid);
            must_run(&mut c, "COMMIT");
            let outcome = other.join().unwrap();
            let fences = |c: &mut Client| -> Vec<String> {
                c.query("SELECT relid::text FROM lease.protected ORDER BY 1", &[])
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect()
            };
            if isolation == "READ COMMITTED" {
                assert_eq!(outcome, None, "{second} behind {first}");
                assert_eq!(fences(&mut c), after, "{second} behind {first}");
            } else {
                assert!(
                    outcome.as_ref().is_some_and(|[code, _]| code == "40001"),
                    "{second} behind {first} at {isolation}: {outcome:?}"
                );
                // A retry takes effect.
                must_run(&mut c, second);
                assert_eq!(fences(&mut c), after, "{second} retried behind {first} at {isolation}");
            }
            assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease._fence_problems()"), 0);
        }
    }
}

/// **Broken (fixed).** A high-water fence's changes took no lock: `unprotect`
/// beside an `ALTER TABLE ... SET SCHEMA` of the table failed with 42P01
/// (its DROP TRIGGER named the table as it was), and `protect_high_water` or
/// `unprotect` beside a partition being created under a sub-partition were
/// not serialized with it. Now they lock the table's tree as owner-mode
/// fence changes do.
#[test]
fn high_water_fence_changes_beside_migrations_of_the_table() {
    let db = TestDb::new("ddl_race_high_water");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE SCHEMA s2;
         CREATE TABLE h_pay (table_id int, fencing_token bigint, amount int);
         SELECT lease.protect_high_water('h_pay', '{table_id}', 'fencing_token');",
    );
    must_run(&mut c, "BEGIN; ALTER TABLE h_pay SET SCHEMA s2");
    let (pid, other) = in_other_session(&db.name, "SELECT lease.unprotect('h_pay')");
    let mut observer = db.connect();
    wait_until_blocked(&mut observer, pid);
    must_run(&mut c, "COMMIT");
    assert_eq!(other.join().unwrap(), None, "unprotect beside SET SCHEMA");
    assert_eq!(lease_triggers(&mut c, "s2.h_pay"), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);

    must_run(
        &mut c,
        "CREATE TABLE q_pay (table_id int, fencing_token bigint, amount int) PARTITION BY RANGE (table_id);
         CREATE TABLE q_pay_1 PARTITION OF q_pay FOR VALUES FROM (0) TO (100) PARTITION BY RANGE (table_id);
         CREATE TABLE q_pay_1a PARTITION OF q_pay_1 FOR VALUES FROM (0) TO (50);",
    );
    let protect = "SELECT lease.protect_high_water('q_pay', '{table_id}', 'fencing_token')";
    for (change, partition) in [(protect, "q_pay_1b"), ("SELECT lease.unprotect('q_pay')", "q_pay_1c")] {
        must_run(
            &mut c,
            &format!(
                "BEGIN; CREATE TABLE {partition} PARTITION OF q_pay_1 FOR VALUES FROM ({0}) TO ({1})",
                if partition == "q_pay_1b" { 50 } else { 100 },
                if partition == "q_pay_1b" { 100 } else { 150 }
            ),
        );
        let (pid, other) = in_other_session(&db.name, change);
        wait_until_blocked(&mut observer, pid);
        must_run(&mut c, "COMMIT");
        assert_eq!(other.join().unwrap(), None, "{change} beside a new sub-partition");
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease._fence_problems()"), 0, "after {change}");
        if change == protect {
            expect_error(&mut c, "TRUNCATE q_pay_1b", "LF008");
        } else {
            assert_eq!(
                one_i64(
                    &mut c,
                    "SELECT count(*) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
                      WHERE g.tgname LIKE 'pg\\_lease\\_%' AND c.relname LIKE 'q\\_%'"
                ),
                0,
                "pg_lease triggers left after unprotect"
            );
        }
    }
}

/// **Deadlock (fixed).** `unprotect` of the last fence on an owner table
/// beside a game server's transaction that reads or updates its owner row
/// and then writes the fenced table: unprotect dropped the fenced table's
/// trigger (ACCESS EXCLUSIVE on it) and then waited for the owner table,
/// which the writer held, while the writer waited for the fenced table
/// (40P01 for one of them). Now unprotect changes the owner table's
/// triggers first: the writer finishes, fenced, then unprotect does.
#[test]
fn unprotect_beside_a_writer_that_touched_its_owner_row_first_does_not_deadlock() {
    for (owner_step, token) in [
        ("SELECT owner_fencing_token FROM a_tables WHERE id = 1", 5),
        ("UPDATE a_tables SET owner_fencing_token = 6 WHERE id = 1", 6),
    ] {
        let db = TestDb::new("ddl_race_unprotect_writer");
        let mut c = db.connect();
        setup(&mut c, &["a"]);
        let mut app = db.connect();
        must_run(&mut app, &format!("SET lock_timeout = '5s'; BEGIN; {owner_step}"));
        let (pid, other) = in_other_session(&db.name, "SELECT lease.unprotect('a_pay')");
        let mut observer = db.connect();
        wait_until_blocked(&mut observer, pid);
        // Still fenced while unprotect waits: a stale write is refused, the
        // current one goes in.
        must_run(&mut app, "SAVEPOINT s");
        expect_error(&mut app, &format!("INSERT INTO a_pay VALUES (1, {}, 1)", token - 1), "LF001");
        must_run(&mut app, "ROLLBACK TO SAVEPOINT s");
        if let Some(e) = failure(&mut app, &format!("INSERT INTO a_pay VALUES (1, {token}, 1); COMMIT")) {
            panic!("the writer after {owner_step}, beside unprotect: {e:?}");
        }
        assert_eq!(other.join().unwrap(), None, "unprotect beside a writer that did {owner_step}");
        assert_eq!(lease_triggers(&mut c, "a_tables") + lease_triggers(&mut c, "a_pay"), 0);
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM a_pay"), 1);
    }
}

/// **Deadlock (fixed).** `unprotect` of the last fence on an owner table
/// beside a game server's transaction that read or wrote the fenced table
/// first (every fenced write locks the fenced table, then reads its owner
/// row): unprotect took the owner table (to drop its guard) and waited for
/// the fenced table, which the writer held, while the writer's fence waited
/// for the owner table (40P01; helper-57 F2, left open in session 23).
/// Either order of the two locks deadlocks with one of the two natural
/// transactions; now unprotect takes the second only if it is free at once,
/// else lets go of the first and waits for the second
/// (`lease._lock_pair_exclusive`): the writer finishes, fenced, then
/// unprotect does.
#[test]
fn unprotect_beside_a_writer_that_touched_the_fenced_table_first_does_not_deadlock() {
    for first in ["SELECT count(*) FROM a_pay", "INSERT INTO a_pay VALUES (1, 5, 1)"] {
        let db = TestDb::new("ddl_race_unprotect_reader");
        let mut c = db.connect();
        setup(&mut c, &["a"]);
        let mut app = db.connect();
        must_run(&mut app, &format!("SET lock_timeout = '5s'; BEGIN; {first}"));
        let (pid, other) = in_other_session(&db.name, "SET lock_timeout = '5s'; SELECT lease.unprotect('a_pay')");
        let mut observer = db.connect();
        wait_until_blocked(&mut observer, pid);
        // A fenced write reads its owner row: still fenced, and not stuck.
        must_run(&mut app, "SAVEPOINT s");
        expect_error(&mut app, "INSERT INTO a_pay VALUES (1, 4, 1)", "LF001");
        must_run(&mut app, "ROLLBACK TO SAVEPOINT s");
        if let Some(e) = failure(&mut app, "INSERT INTO a_pay VALUES (1, 5, 2); COMMIT") {
            panic!("the writer after {first}, beside unprotect: {e:?}");
        }
        assert_eq!(other.join().unwrap(), None, "unprotect beside a writer that did {first}");
        assert_eq!(lease_triggers(&mut c, "a_tables") + lease_triggers(&mut c, "a_pay"), 0);
    }
}

/// **Deadlock (fixed).** `DROP TABLE` of the last table fenced against an
/// owner table beside a game server's transaction that read its owner row
/// and then writes the fenced table: PostgreSQL locked the dropped table,
/// then the drop guard waited for the owner table (to remove its guards),
/// which the writer held, while the writer waited for the dropped table
/// (40P01). Now the drop locks the owner table first: the writer finishes,
/// fenced, then the drop goes on. (With another fence left on the owner
/// table the drop removes no guard and locks it no further.)
#[test]
fn dropping_the_last_fenced_table_beside_a_writer_that_read_its_owner_row_does_not_deadlock() {
    let db = TestDb::new("ddl_race_drop_writer");
    let mut c = db.connect();
    setup(&mut c, &["a"]);
    let mut app = db.connect();
    must_run(&mut app, "SET lock_timeout = '5s'; BEGIN; SELECT owner_fencing_token FROM a_tables WHERE id = 1");
    let (pid, other) = in_other_session(&db.name, "DROP TABLE a_pay");
    let mut observer = db.connect();
    wait_until_blocked(&mut observer, pid);
    must_run(&mut app, "SAVEPOINT s");
    expect_error(&mut app, "INSERT INTO a_pay VALUES (1, 4, 1)", "LF001");
    must_run(&mut app, "ROLLBACK TO SAVEPOINT s");
    if let Some(e) = failure(&mut app, "INSERT INTO a_pay VALUES (1, 5, 1); COMMIT") {
        panic!("the writer beside DROP TABLE of its fenced table: {e:?}");
    }
    assert_eq!(other.join().unwrap(), None, "DROP TABLE beside the writer");
    assert_eq!(lease_triggers(&mut c, "a_tables"), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);
    must_run(&mut c, "UPDATE a_tables SET owner_fencing_token = 1 WHERE id = 1");
}

/// Bad input to the fence changes gets a clear error naming what is wrong:
/// a table OID that names nothing (it said "target table 99999 is not a
/// table", or "- is not protected"), an owner table that is fenced itself
/// or a fenced table's owner table protected in turn (both failed with
/// LF008 or LF004 about triggers the caller never made).
#[test]
fn fence_changes_of_tables_that_cannot_be_fenced_say_why() {
    let db = TestDb::new("ddl_race_bad_fence");
    let mut c = db.connect();
    setup(&mut c, &["a", "b"]);
    for (sql, code, words) in [
        ("SELECT lease.protect(99999, '{table_id}', 'fencing_token', 'a_tables')", "42P01", "no table with OID 99999"),
        ("SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 99999)", "42P01", "no table with OID 99999"),
        ("SELECT lease.protect_high_water(99999, '{k}')", "42P01", "no table with OID 99999"),
        ("SELECT lease.unprotect(0)", "42P01", "no table with OID 0"),
        (
            "SELECT lease.protect('b_pay', '{table_id}', 'fencing_token', 'a_pay', '{table_id}', 'fencing_token')",
            "0A000",
            "is fenced itself",
        ),
        (
            "SELECT lease.protect('a_tables', '{id}', 'owner_fencing_token', 'b_tables')",
            "0A000",
            "owner table of fenced table",
        ),
        (
            "SELECT lease.protect_high_water('a_tables', '{id}', 'owner_fencing_token')",
            "0A000",
            "owner table of fenced table",
        ),
    ] {
        let err = expect_error(&mut c, sql, code);
        assert!(err.contains(words), "{sql}: {err}");
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease._fence_problems()"), 0);
}

/// The owner of the tables may have revoked its own UPDATE, DELETE and
/// TRUNCATE on them (and MAINTAIN, on 17 and later: each lets a role LOCK a
/// table in ACCESS EXCLUSIVE mode; it may still drop its triggers):
/// `unprotect` of the last fence still works, taking the tables in the
/// order its DROP TRIGGERs do.
#[test]
fn unprotect_by_an_owner_without_lock_rights_on_its_tables() {
    let migrator = MigratorRole::new("ddl_race_nolock");
    let db = TestDb::new("ddl_race_unprotect_nolock");
    let mut c = db.connect();
    migrator.grant(&mut c);
    let mut m = db.connect_as(&migrator.0);
    setup(&mut m, &["a"]);
    let maintain = if server_version_num() >= 170000 { ", MAINTAIN" } else { "" };
    must_run(&mut m, &format!("REVOKE UPDATE, DELETE, TRUNCATE{maintain} ON a_tables, a_pay FROM CURRENT_USER"));
    expect_error(&mut m, "BEGIN; LOCK TABLE a_pay IN ACCESS EXCLUSIVE MODE", "42501");
    must_run(&mut m, "ROLLBACK");
    must_run(&mut m, "SELECT lease.unprotect('a_pay')");
    assert_eq!(lease_triggers(&mut c, "a_tables") + lease_triggers(&mut c, "a_pay"), 0);
}
