//! Attack review 37 (helper-59): pooled token binding, the lease service's
//! tokens, high-water fencing, the audit and the roles, over real
//! connections and a real PgBouncer on PostgreSQL 15 (main at 9a1c284). The
//! binding held everywhere (1,200 forgetful clients through PgBouncer all got
//! LF003); what broke was the lease service's promise that tokens only rise.
//! Findings, most severe first:
//!
//! - **Hole (high): a token went backwards for one lease after a rolled-back
//!   epoch raise, and a stale process then captured a high-water sink.** An
//!   acquire above a hand-set owner token moves to the next epoch and records
//!   it in `lease.token_epoch_issued`, a table: a transaction that acquired
//!   `table:8` (the raise) and then `jackpot`, and rolled back, had handed
//!   out `jackpot`'s token in the raised epoch; the raise was undone, and
//!   `jackpot`'s next holder got a token from the lower epoch, below it. The
//!   old process's writes to the high-water table were accepted and the new
//!   holder's refused (LF001). The same through `lease.issue_tokens_above` +
//!   acquire + ROLLBACK. Now every acquire raises `lease.token_epoch_floor`,
//!   a sequence no rollback lowers, to the epoch it issued in, before it
//!   returns the token, and every token is issued at or above it
//!   (`a_rolled_back_epoch_raise_never_lowers_a_later_token`).
//! - **Guarantee (medium): "every lease follows it there" did not hold**
//!   while a raise was uncommitted (another lease's acquire issued in the old
//!   epoch meanwhile) nor after it rolled back. Same fix: the floor is not
//!   transactional, so a raise counts for every acquire from the moment it
//!   hands its token out (`an_epoch_raise_in_flight_is_followed_by_every_lease`).
//! - **Error output**: a server started with `RUST_BACKTRACE=1` in its
//!   environment (this machine's root shell has it) put about 60 frames of
//!   Rust backtrace, with build paths, into the DETAIL of a cancelled
//!   `acquire`. pg_lease now turns Rust's library backtraces off in its
//!   processes unless `RUST_LIB_BACKTRACE` says otherwise
//!   (`a_cancelled_acquire_shows_no_backtrace_whatever_the_environment`).
//! - **Hang (documented)**: a prepared transaction of the holder that wrote
//!   a fenced row holds its owner row, and every later `acquire` of the
//!   resource waits for it, across restarts, until `COMMIT`/`ROLLBACK
//!   PREPARED`: README, Limits (`a_prepared_writer_holds_up_the_takeover_until_it_is_resolved`).
//! - **Doc**: README said pg_lease's internal helpers are not executable by
//!   PUBLIC; the catalog reads and checks `protect` runs with its caller's
//!   rights are (each listed, with why, in `errors.rs`), and those that
//!   write or lock check their caller. README corrected.
//! - **Doc**: two databases restored from one dump, or two template copies of
//!   one database, are siblings that issue the same tokens for the same
//!   calls; README, Backups, says to let only one of them serve clients or
//!   raise the second above the first's ceiling.
//! - **Doc**: `protect_high_water` of a table that already holds rows starts
//!   with no marks (a rebuild-and-swap migration loses them): README says so.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const EPOCH: i64 = 1 << 40;

/// Owner rows 7, 8 and 9 of `tables`, and `payouts` fenced against them.
const OWNERS: &str = "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
     INSERT INTO tables VALUES (7, NULL), (8, NULL), (9, NULL);
     CREATE TABLE payouts (table_id int, amount int, fencing_token bigint);
     SELECT lease.protect('payouts', '{table_id}', 'fencing_token');";

fn acquire(c: &mut Client, name: &str, owner: &str, bound: Option<i32>) -> i64 {
    let sql = match bound {
        Some(id) => format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000, 'tables', '{{{id}}}')"),
        None => format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000)"),
    };
    one_i64(c, &sql)
}

fn sqlstate_of(c: &mut Client, sql: &str) -> String {
    try_sql(c, sql)
}

#[test]
fn a_rolled_back_epoch_raise_never_lowers_a_later_token() {
    let db = TestDb::new("a37_floor_rollback");
    let mut c = db.connect();
    c.batch_execute(OWNERS).unwrap();
    c.batch_execute(
        "CREATE TABLE jlog (pool text, amount bigint, fencing_token bigint);
         SELECT lease.protect_high_water('jlog', '{pool}', 'fencing_token');",
    )
    .unwrap();
    let warm = acquire(&mut c, "warm", "w", None);
    let epoch = warm >> 40;
    // A token set by hand in an owner row, in the current epoch, above the counter.
    c.batch_execute(&format!("UPDATE tables SET owner_fencing_token = {} WHERE id = 8", epoch * EPOCH + 1_000_000))
        .unwrap();
    let j0 = acquire(&mut c, "jackpot", "old-proc", None);
    c.batch_execute("BEGIN").unwrap();
    let raised = acquire(&mut c, "table:8", "old-proc", Some(8));
    assert!(raised >> 40 > epoch, "{raised}: the acquire moves to the next epoch");
    let stale = acquire(&mut c, "jackpot", "old-proc", None);
    assert!(stale > raised);
    c.batch_execute("ROLLBACK").unwrap();
    // Whatever the rollback undid, every later token is above those handed out.
    assert!(
        one_i64(&mut c, &format!("SELECT count(*) FROM lease.release('jackpot', 'old-proc', {j0}) r WHERE r")) == 1
    );
    let fresh = acquire(&mut c, "jackpot", "new-proc", None);
    assert!(fresh > stale, "the next holder's {fresh} must be above the stale {stale}");
    let other = acquire(&mut c, "misc", "h", None);
    assert!(other > stale, "another lease's {other} must be above {stale} too");
    assert!(one_i64(&mut c, "SELECT lease.token_ceiling()") > stale);
    // The sink: the new holder writes, the old process is refused.
    c.batch_execute(&format!("INSERT INTO jlog VALUES ('jp', 2, {fresh})")).unwrap();
    assert_eq!(sqlstate_of(&mut c, &format!("INSERT INTO jlog VALUES ('jp', 1, {stale})")), "LF001");
    // The same through a cutover raise rolled back with the acquire it let issue.
    c.batch_execute("BEGIN").unwrap();
    let above = one_i64(&mut c, "SELECT lease.token_ceiling()");
    one_i64(&mut c, &format!("SELECT lease.issue_tokens_above({above})"));
    let stale = acquire(&mut c, "jackpot", "new-proc", None);
    assert!(stale > above);
    c.batch_execute("ROLLBACK").unwrap();
    let fresh = acquire(&mut c, "jackpot", "new-proc", None);
    assert!(fresh > stale, "after a rolled-back cutover: {fresh} must be above {stale}");
    let ceiling = one_i64(&mut c, "SELECT lease.token_ceiling()");
    assert!(ceiling > fresh);
    // The floor cannot be changed by DDL.
    assert_eq!(sqlstate_of(&mut c, "ALTER SEQUENCE lease.token_epoch_floor RESTART"), "LF008");
    assert_eq!(sqlstate_of(&mut c, "ALTER SEQUENCE lease.token_counter RESTART"), "LF008");
    // Nobody but the extension's owner may read or write it.
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT count(*) FROM pg_class s, aclexplode(s.relacl) a
              WHERE s.oid = 'lease.token_epoch_floor'::regclass AND a.grantee <> s.relowner"
        ),
        0
    );
}

#[test]
fn an_epoch_raise_in_flight_is_followed_by_every_lease() {
    let db = TestDb::new("a37_floor_in_flight");
    let mut c = db.connect();
    c.batch_execute(OWNERS).unwrap();
    let epoch = acquire(&mut c, "warm", "w", None) >> 40;
    c.batch_execute(&format!("UPDATE tables SET owner_fencing_token = {} WHERE id = 8", epoch * EPOCH + 2_000_000))
        .unwrap();
    let mut s1 = db.connect();
    s1.batch_execute("BEGIN").unwrap();
    let raised = acquire(&mut s1, "table:8", "h8", Some(8));
    assert!(raised >> 40 > epoch);
    // Another lease, while the raise is uncommitted: not held up, and above it.
    let mut s2 = db.connect();
    let other = acquire(&mut s2, "conc-other", "h9", None);
    assert!(other > raised, "{other} must follow the raise to {raised}");
    s1.batch_execute("COMMIT").unwrap();
    let later = acquire(&mut s2, "conc-other2", "h9", None);
    assert!(later > other);
    // Issued in the raised epoch, not above it: no epoch used up per acquire.
    assert_eq!(later >> 40, raised >> 40);
}

#[test]
fn a_cancelled_acquire_shows_no_backtrace_whatever_the_environment() {
    let cluster = Cluster::start_with_env(
        "a37_backtrace",
        54660,
        &["max_prepared_transactions = 10"],
        &[("RUST_BACKTRACE", Some("1")), ("RUST_LIB_BACKTRACE", None)],
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    c.batch_execute(OWNERS).unwrap();
    let token = acquire(&mut c, "table:7", "p1", Some(7));
    c.batch_execute(&format!("SELECT lease.release('table:7', 'p1', {token})")).unwrap();
    let mut holder = cluster.connect();
    holder.batch_execute("BEGIN; SELECT * FROM tables WHERE id = 7 FOR UPDATE").unwrap();
    for setting in ["statement_timeout = '300ms'", "lock_timeout = '300ms'"] {
        let e = c
            .batch_execute(&format!(
                "SET {setting}; SELECT token FROM lease.acquire('table:7', 'p2', 60000, 'tables', '{{7}}')"
            ))
            .unwrap_err();
        let e = e.as_db_error().unwrap();
        assert!(["57014", "55P03"].contains(&e.code().code()), "{setting}: {e:?}");
        assert_eq!(e.detail(), None, "{setting}: no backtrace in the DETAIL");
        c.batch_execute("RESET statement_timeout; RESET lock_timeout").unwrap();
    }
    holder.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn a_prepared_writer_holds_up_the_takeover_until_it_is_resolved() {
    let cluster = Cluster::start_with("a37_prepared", 54662, &["max_prepared_transactions = 10"]);
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    c.batch_execute(OWNERS).unwrap();
    let token = acquire(&mut c, "table:7", "p1", Some(7));
    c.batch_execute(&format!("BEGIN; INSERT INTO payouts VALUES (7, 1, {token}); PREPARE TRANSACTION 'a37_writer'"))
        .unwrap();
    // The holder lets go (or its lease expires): the next acquire must raise
    // the owner row, which the prepared transaction holds.
    c.batch_execute(&format!("SELECT lease.release('table:7', 'p1', {token})")).unwrap();
    let take = "SET statement_timeout = '500ms'; SELECT lease.acquire('table:7', 'p2', 60000, 'tables', '{7}')";
    assert_eq!(sqlstate_of(&mut c, take), "57014");
    // Across a restart too.
    cluster.stop();
    cluster.restart();
    let mut c = cluster.connect();
    assert_eq!(sqlstate_of(&mut c, take), "57014");
    c.batch_execute("RESET statement_timeout").unwrap();
    c.batch_execute("COMMIT PREPARED 'a37_writer'").unwrap();
    let new = acquire(&mut c, "table:7", "p2", Some(7));
    assert!(new > token);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 1);
}

/// README, Backups: two copies of one state (here two template copies of one
/// database) are siblings that issue the same tokens for the same calls;
/// `lease.issue_tokens_above` of the first's ceiling, run on the second,
/// sets it apart.
#[test]
fn sibling_copies_issue_the_same_tokens_until_one_is_raised_above_the_other() {
    let source = TestDb::new("a37_sibling_src");
    let mut c = source.connect();
    c.batch_execute(OWNERS).unwrap();
    let t = acquire(&mut c, "table:7", "h1", Some(7));
    c.batch_execute(&format!("SELECT lease.release('table:7', 'h1', {t})")).unwrap();
    drop(c);
    let mut admin = connect_to("postgres", "postgres");
    let copies = [format!("{}_a", source.name), format!("{}_b", source.name)];
    for copy in &copies {
        admin.batch_execute(&format!("CREATE DATABASE {copy} TEMPLATE {}", source.name)).unwrap();
    }
    let issue = |db: &str| -> Vec<i64> {
        let mut c = connect_to(db, "postgres");
        vec![acquire(&mut c, "jack", "h9", None), acquire(&mut c, "table:7", "h9", Some(7))]
    };
    let (a, b) = (issue(&copies[0]), issue(&copies[1]));
    assert_eq!(a, b, "siblings issue the same tokens");
    // The second raised above everything the first issued: apart from then on.
    let ceiling = one_i64(&mut connect_to(&copies[0], "postgres"), "SELECT lease.token_ceiling()");
    let mut second = connect_to(&copies[1], "postgres");
    one_i64(&mut second, &format!("SELECT lease.issue_tokens_above({ceiling})"));
    let later = acquire(&mut second, "table:7", "h9", Some(7));
    assert!(later > ceiling && later > a[1]);
    drop(second);
    for copy in &copies {
        admin.batch_execute(&format!("DROP DATABASE {copy} WITH (FORCE)")).unwrap();
    }
}

/// README, Limits: `protect_high_water` of a table that already holds rows
/// starts with no marks; rows written before are not read back.
#[test]
fn protect_high_water_of_a_populated_table_starts_without_marks() {
    let db = TestDb::new("a37_hw_populated");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE jlog (pool text, amount bigint, fencing_token bigint);
         INSERT INTO jlog VALUES ('p', 1, 1030);
         SELECT lease.protect_high_water('jlog', '{pool}', 'fencing_token');
         INSERT INTO jlog VALUES ('p', 2, 7);",
    )
    .unwrap();
    assert_eq!(try_sql(&mut c, "INSERT INTO jlog VALUES ('p', 3, 6)"), "LF001");
}

/// README (Leases): owner ids are labels, not credentials: any session of
/// the application role may act for any owner id, and any role that can
/// connect may send `NOTIFY pg_lease`.
#[test]
fn owner_ids_are_labels_and_notifications_are_hints() {
    let db = TestDb::new("a37_owner_ids");
    let mut c = db.connect();
    let role = format!("a37_app_{}", std::process::id());
    c.batch_execute(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN;
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
             lease.release_all(text), lease.renew_all(text, integer) TO {role};"
    ))
    .unwrap();
    let mut a = db.connect_as(&role);
    let mut b = db.connect_as(&role);
    acquire(&mut a, "jack", "proc-a", None);
    let listed = one_i64(&mut b, "SELECT count(*) FROM lease.renew_all('proc-a', 60000)");
    assert_eq!(listed, 1, "another session lists and renews proc-a's leases");
    assert_eq!(one_i64(&mut b, "SELECT lease.release_all('proc-a')::bigint"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE name = 'jack' AND live"), 0);
    b.batch_execute(r#"NOTIFY pg_lease, '{"event": "taken", "name": "jack"}'"#).unwrap();
    drop((a, b));
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}
