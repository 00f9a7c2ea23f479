//! The lease calls' short paths (issue #13) over real connections: renew's
//! one-statement common case reads the clock after a row-lock wait, a name's
//! first acquires race correctly, and a session that used the lease calls
//! before `ALTER EXTENSION pg_lease UPDATE` goes on using them after it.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::thread;
use std::time::Duration;

fn acquire(c: &mut Client, name: &str, owner: &str, ttl_ms: i32) -> i64 {
    c.query_one("SELECT token FROM lease.acquire($1, $2, $3)", &[&name, &owner, &ttl_ms]).unwrap().get(0)
}

/// `(renewed_at - acquired_at, expires_at - renewed_at)` of a lease, in ms.
fn bounds_ms(c: &mut Client, name: &str) -> (f64, f64) {
    let r = c
        .query_one(
            "SELECT (extract(epoch FROM l.renewed_at - l.acquired_at) * 1000)::float8,
                    (extract(epoch FROM l.expires_at - l.renewed_at) * 1000)::float8
               FROM lease.lease_state l WHERE l.name = $1",
            &[&name],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

/// Runs `sql` in a new connection on another thread; returns its handle.
fn in_background(db: &TestDb, sql: &'static str) -> thread::JoinHandle<String> {
    let mut other = db.connect();
    thread::spawn(move || try_sql(&mut other, sql))
}

#[test]
fn a_renew_that_waits_for_the_row_judges_and_extends_from_the_clock_after_the_wait() {
    let db = TestDb::new("hot_renew_wait");
    let mut a = db.connect();
    let token = acquire(&mut a, "r", "host-a", 60_000);
    assert_eq!(token, (1 << 40) + 1, "a name's first token in epoch 1");

    // A renew in an open transaction holds the row; a second renew waits for it.
    a.batch_execute(&format!("BEGIN; SELECT lease.renew('r', 'host-a', {token}, 60000)")).unwrap();
    let waiting = in_background(&db, "SELECT lease.renew('r', 'host-a', 1099511627777, 30000)");
    thread::sleep(Duration::from_millis(400));
    assert!(!waiting.is_finished(), "the second renew waits for the row lock");
    // (Read before COMMIT: the waiting renew may commit right after it.)
    let (before, _) = bounds_ms(&mut a, "r");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(waiting.join().unwrap(), "");
    let (after, ttl) = bounds_ms(&mut a, "r");
    // Its bounds come from one clock read after the wait: renewed at least
    // 400 ms after the first renew's, and exactly its own TTL long.
    assert!(after - before >= 400.0, "renewed_at moved {} ms", after - before);
    assert_eq!(ttl, 30_000.0);

    // A lease that expires while a renew waits for it is lost, not renewed.
    let s_token = acquire(&mut a, "s", "host-a", 60_000);
    a.batch_execute(&format!("BEGIN; SELECT lease.renew('s', 'host-a', {s_token}, 100)")).unwrap();
    let renew_s: &'static str = format!("SELECT lease.renew('s', 'host-a', {s_token}, 60000)").leak();
    let late = in_background(&db, renew_s);
    thread::sleep(Duration::from_millis(400));
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(late.join().unwrap(), "LF006");
    let detail = expect_error(&mut a, renew_s, "LF006");
    assert!(detail.contains("it expired at"), "{detail}");
}

#[test]
fn a_renew_carried_by_the_session_or_refused_takes_the_long_way_with_the_same_answers() {
    let db = TestDb::new("hot_renew_slow");
    let mut c = db.connect();
    let token = acquire(&mut c, "r", "host-a", 150);
    c.batch_execute("SELECT * FROM lease.heartbeat('host-a', 60000)").unwrap();
    thread::sleep(Duration::from_millis(250));
    // Past its own expiry, alive with the session: renewed.
    let ttl_left = one_i64(
        &mut c,
        &format!("SELECT (extract(epoch FROM lease.renew('r', 'host-a', {token}, 20000) - clock_timestamp()) * 1000)::bigint"),
    );
    assert!((19_000..=20_000).contains(&ttl_left), "{ttl_left}");
    let detail = expect_error(&mut c, &format!("SELECT lease.renew('r', 'host-a', {}, 20000)", token + 1), "LF006");
    assert!(detail.contains("was never issued"), "{detail}");
    let detail = expect_error(&mut c, &format!("SELECT lease.renew('r', 'host-b', {token}, 20000)"), "LF006");
    assert!(detail.contains("it was taken by host-a"), "{detail}");
    let detail = expect_error(&mut c, &format!("SELECT lease.renew('nope', 'host-a', {token}, 20000)"), "LF006");
    assert!(detail.contains("it never existed"), "{detail}");
    expect_error(&mut c, "SELECT lease.renew('r', 'host-a', NULL, 20000)", "22004");
    expect_error(&mut c, "SELECT lease.renew('r', ' ', NULL, 20000)", "22023");
}

#[test]
fn a_names_first_acquires_race_and_the_loser_is_judged_under_the_winners_lock() {
    let db = TestDb::new("hot_first_acquire");
    let mut a = db.connect();

    // The winner commits: the loser waits for it, then finds it live.
    a.batch_execute("BEGIN; SELECT lease.acquire('fresh', 'host-a', 60000)").unwrap();
    let loser = in_background(&db, "SELECT lease.acquire('fresh', 'host-b', 60000)");
    let quiet = in_background(
        &db,
        "DO $$ BEGIN IF EXISTS (SELECT FROM lease.try_acquire('fresh', 'host-c', 60000)) THEN
             RAISE 'try_acquire took a held lease'; END IF; END $$",
    );
    thread::sleep(Duration::from_millis(300));
    assert!(!loser.is_finished() && !quiet.is_finished(), "racing first acquires wait for the first one");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(loser.join().unwrap(), "LF005");
    assert_eq!(quiet.join().unwrap(), "");
    assert_eq!(
        one_i64(&mut a, "SELECT token FROM lease.leases WHERE name = 'fresh' AND owner = 'host-a'"),
        (1 << 40) + 1
    );

    // The winner rolls back: the one that waited takes the name, with a token
    // of its own (the rolled-back one was seen, so it is never issued again).
    a.batch_execute("BEGIN").unwrap();
    let rolled_back = acquire(&mut a, "fresh2", "host-a", 60_000);
    let taker = in_background(&db, "SELECT lease.acquire('fresh2', 'host-b', 60000)");
    thread::sleep(Duration::from_millis(300));
    a.batch_execute("ROLLBACK").unwrap();
    assert_eq!(taker.join().unwrap(), "");
    let row = a
        .query_one("SELECT owner, token, released_at IS NULL FROM lease.lease_state WHERE name = 'fresh2'", &[])
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i64>(1), row.get::<_, bool>(2)),
        ("host-b".into(), rolled_back + 1, true)
    );
    // Its session row exists from its first lease on, and no loss is recorded.
    assert_eq!(one_i64(&mut a, "SELECT count(*) FROM lease.session_state WHERE owner = 'host-b'"), 1);
    assert_eq!(one_i64(&mut a, "SELECT count(*) FROM lease.lost_leases"), 0);
    // The epoch issued is recorded by a first acquire, as by any.
    assert_eq!(one_i64(&mut a, "SELECT epoch FROM lease.token_epoch_issued"), 1);
}

#[test]
fn a_session_that_used_the_lease_calls_goes_on_after_the_extension_is_updated() {
    let db = TestDb::new("hot_update");
    let mut admin = db.connect();
    admin.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.5.0'").unwrap();
    let mut s = db.connect();
    let token = acquire(&mut s, "r", "host-a", 60_000);
    s.batch_execute(&format!(
        "SELECT lease.renew('r', 'host-a', {token}, 60000); SELECT lease.renew('r', 'host-a', {token}, 60000);
         SELECT * FROM lease.heartbeat('host-a', 60000)"
    ))
    .unwrap();
    admin.batch_execute("ALTER EXTENSION pg_lease UPDATE TO '0.6.0'").unwrap();
    // The same session: its cached function bodies are replaced, not reused.
    s.batch_execute(&format!("SELECT lease.renew('r', 'host-a', {token}, 60000)")).unwrap();
    let next = acquire(&mut s, "r", "host-a", 60_000);
    assert!(next > token);
    expect_error(&mut s, &format!("SELECT lease.renew('r', 'host-a', {token}, 60000)"), "LF006");
    let first = acquire(&mut s, "new", "host-a", 60_000);
    assert_eq!(first, (1 << 40) + 1);
    assert!(s.query_one(&format!("SELECT lease.release('new', 'host-a', {first})"), &[]).unwrap().get::<_, bool>(0));
    assert_eq!(one_i64(&mut s, "SELECT lease.release_all('host-a')::bigint"), 1);
    s.batch_execute("SELECT * FROM lease.heartbeat('host-a', 60000)").unwrap();
}

#[test]
fn renew_and_release_find_the_lease_by_its_name_even_before_the_table_is_analyzed() {
    let db = TestDb::new("hot_plans");
    let mut c = db.connect();
    // One owner with many leases, in a table never analyzed: the owner index
    // would look as good as the primary key to the planner.
    c.batch_execute("SELECT lease.acquire('n:' || g, 'big', 600000) FROM generate_series(1, 2000) g").unwrap();
    let owner_scans = |c: &mut Client| {
        c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
        one_i64(c, "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'lease_state_owner'")
    };
    let (t5, t6) = (
        one_i64(&mut c, "SELECT token FROM lease.lease_state WHERE name = 'n:5'"),
        one_i64(&mut c, "SELECT token FROM lease.lease_state WHERE name = 'n:6'"),
    );
    let before = owner_scans(&mut c);
    for _ in 0..8 {
        c.batch_execute(&format!("SELECT lease.renew('n:5', 'big', {t5}, 600000)")).unwrap();
    }
    let released: bool = c.query_one(&format!("SELECT lease.release('n:6', 'big', {t6})"), &[]).unwrap().get(0);
    assert!(released);
    assert_eq!(owner_scans(&mut c), before, "renew and release scanned the owner's leases");
    // The index still serves what it is for (here: release_all).
    assert_eq!(one_i64(&mut c, "SELECT lease.release_all('big')::bigint"), 1999);
    assert!(owner_scans(&mut c) > before);
}
