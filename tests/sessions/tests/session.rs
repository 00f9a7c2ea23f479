//! Heartbeat sessions (0.4.0) over real connections: one row write keeps every
//! lease of an owner alive, a lapsed session never revives a dead lease, losses
//! are reported once, and a heartbeat racing a takeover has one winner.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

fn acquire(c: &mut Client, name: &str, owner: &str, ttl_ms: i32) -> i64 {
    c.query_one("SELECT token FROM lease.acquire($1, $2, $3)", &[&name, &owner, &ttl_ms])
        .unwrap_or_else(|e| panic!("acquire {name} by {owner}: {e}"))
        .get(0)
}

/// `lease.heartbeat` rows as (name, lost), sorted.
fn heartbeat(c: &mut Client, owner: &str, ttl_ms: i32) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = c
        .query("SELECT name, lost FROM lease.heartbeat($1, $2)", &[&owner, &ttl_ms])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    rows.sort();
    rows
}

fn lost(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(n, k)| (n.to_string(), k.to_string())).collect()
}

fn live(c: &mut Client, name: &str) -> bool {
    c.query_one("SELECT live FROM lease.leases WHERE name = $1", &[&name]).unwrap().get(0)
}

/// WAL bytes this backend wrote running `sql` (its commit record aside), as
/// EXPLAIN ANALYZE counts them: the server's WAL position would also count
/// what the tests running beside this one write meanwhile.
fn wal_bytes_of(c: &mut Client, sql: &str) -> i64 {
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The top node's line comes first; no line: no WAL.
    plan.iter().find_map(|l| l.split("WAL:").nth(1)).map_or(0, |w| {
        let bytes = w.split("bytes=").nth(1).unwrap_or_else(|| panic!("no WAL bytes in {plan:?}"));
        bytes.split_whitespace().next().unwrap().parse().unwrap()
    })
}

#[test]
fn one_heartbeat_row_keeps_every_lease_alive() {
    let db = TestDb::new("session_carry");
    let mut c = db.connect();
    c.batch_execute("SELECT lease.acquire('t:' || g, 'h1', 1500) FROM generate_series(1, 2000) g").unwrap();
    let token = acquire(&mut c, "t:1", "h1", 1500);
    // (1.5 s: acquiring 2,000 leases on a loaded machine must not outlast them.)
    assert!(heartbeat(&mut c, "h1", 60_000).is_empty(), "nothing lost yet");
    // Far past every lease's own 1.5 s: the session carries them all.
    thread::sleep(Duration::from_millis(2000));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE owner = 'h1' AND live"), 2000);
    let detail = expect_error(&mut c, "SELECT lease.acquire('t:7', 'h2', 1000)", "LF005");
    assert!(detail.contains("held by h1"), "{detail}");
    assert!(
        c.query("SELECT 1 FROM lease.try_acquire('t:8', 'h2', 1000)", &[]).unwrap().is_empty(),
        "try_acquire sees the carried lease as held"
    );
    // lease.leases shows the session's expiry, not the lease's own.
    let beyond: bool = c
        .query_one("SELECT expires_at > now() + interval '50 s' FROM lease.leases WHERE name = 't:2'", &[])
        .unwrap()
        .get(0);
    assert!(beyond);
    // Per-lease renew of a carried lease works; release counts it as live.
    c.execute("SELECT lease.renew('t:1', 'h1', $1, 1000)", &[&token]).unwrap();
    let t3: i64 = one_i64(&mut c, "SELECT token FROM lease.leases WHERE name = 't:3'");
    let released: bool = c.query_one("SELECT lease.release('t:3', 'h1', $1)", &[&t3]).unwrap().get(0);
    assert!(released, "a lease carried by the session was live when released");
    acquire(&mut c, "t:3", "h2", 1000);
    // One heartbeat is one row write: the same WAL for 2,000 leases as for none.
    // (The smaller of two: the first change of a page after a checkpoint,
    // which another test may cause at any moment, also logs the whole page.)
    let many = (0..2).map(|_| wal_bytes_of(&mut c, "SELECT * FROM lease.heartbeat('h1', 60000)")).min().unwrap();
    let none = wal_bytes_of(&mut c, "SELECT * FROM lease.heartbeat('nobody-holds-anything', 60000)");
    let none_again = wal_bytes_of(&mut c, "SELECT * FROM lease.heartbeat('nobody-holds-anything', 60000)");
    assert!(many < 1024, "a heartbeat of 2,000 leases wrote {many} bytes of WAL");
    assert!(many <= none_again + 64, "{many} bytes for 2,000 leases vs {none_again} for none (first: {none})");
    // renew_all keeps listing what it renewed (and writes no more).
    let listed = one_i64(&mut c, "SELECT count(*) FROM lease.renew_all('h1', 60000) WHERE renewed");
    assert_eq!(listed, 1999);
    let all = (0..2).map(|_| wal_bytes_of(&mut c, "SELECT * FROM lease.renew_all('h1', 60000)")).min().unwrap();
    assert!(all < 1024, "renew_all of 1,999 leases wrote {all} bytes of WAL");
    let sessions = one_i64(&mut c, "SELECT count(*) FROM lease.sessions WHERE owner = 'h1' AND live");
    assert_eq!(sessions, 1);
}

#[test]
fn a_lapsed_session_never_revives_a_dead_lease_and_reports_each_loss_once() {
    let db = TestDb::new("session_lapse");
    let mut c = db.connect();
    acquire(&mut c, "short", "h1", 200);
    acquire(&mut c, "long", "h1", 30_000);
    assert!(heartbeat(&mut c, "h1", 200).is_empty());
    // The session and `short`'s own expiry both pass; `long` lives on its own.
    thread::sleep(Duration::from_millis(500));
    assert!(!live(&mut c, "short") && live(&mut c, "long"));
    // The next heartbeat starts a new life: `short` stays dead, reported once.
    assert_eq!(heartbeat(&mut c, "h1", 30_000), lost(&[("short", "expired")]));
    assert!(!live(&mut c, "short"), "a heartbeat after the lapse must not revive it");
    assert!(live(&mut c, "long"));
    assert!(heartbeat(&mut c, "h1", 30_000).is_empty(), "reported once");
    let t = one_i64(&mut c, "SELECT token FROM lease.leases WHERE name = 'short'");
    let renew = expect_error(&mut c, &format!("SELECT lease.renew('short', 'h1', {t}, 1000)"), "LF006");
    assert!(renew.contains("expired"), "{renew}");
    // Taken over now: the takeover is a loss of its own, reported once too.
    acquire(&mut c, "short", "h2", 30_000);
    assert_eq!(heartbeat(&mut c, "h1", 30_000), lost(&[("short", "taken")]));
    assert!(heartbeat(&mut c, "h1", 30_000).is_empty());
    // `long` is carried by the new life: past its own expiry it stays h1's.
    c.batch_execute("SELECT lease.renew('long', 'h1', token, 200) FROM lease.leases WHERE name = 'long'").unwrap();
    thread::sleep(Duration::from_millis(400));
    assert!(live(&mut c, "long"));
    expect_error(&mut c, "SELECT lease.acquire('long', 'h2', 1000)", "LF005");
    // renew_all's lost rows follow the same rule (expired reported once).
    acquire(&mut c, "brief", "h3", 200);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.renew_all('h3', 200)"), 1);
    thread::sleep(Duration::from_millis(500));
    let rows: Vec<(String, bool)> = c
        .query("SELECT name, renewed FROM lease.renew_all('h3', 1000)", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows, vec![("brief".to_owned(), false)]);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.renew_all('h3', 1000)"), 0);
}

#[test]
fn release_all_ends_the_session() {
    let db = TestDb::new("session_release_all");
    let mut c = db.connect();
    assert!(heartbeat(&mut c, "h1", 60_000).is_empty());
    let t = acquire(&mut c, "x", "h1", 200);
    acquire(&mut c, "y", "h1", 200);
    thread::sleep(Duration::from_millis(300));
    assert!(live(&mut c, "x"), "carried by the session");
    assert_eq!(one_i64(&mut c, "SELECT lease.release_all('h1')::bigint"), 2);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.sessions WHERE live"), 0);
    acquire(&mut c, "x", "h2", 1000);
    let released: bool = c.query_one("SELECT lease.release('x', 'h1', $1)", &[&t]).unwrap().get(0);
    assert!(!released);
    // The same owner id starts again: its new lease lives on its own TTL until
    // the next heartbeat, which finds nothing lost (everything was released).
    acquire(&mut c, "z", "h1", 200);
    thread::sleep(Duration::from_millis(300));
    assert!(!live(&mut c, "z"), "an ended session carries nothing");
    assert_eq!(heartbeat(&mut c, "h1", 1000), lost(&[("z", "expired")]));
}

#[test]
fn heartbeat_needs_its_own_grant_and_bad_input_is_refused() {
    let db = TestDb::new("session_grants");
    let mut c = db.connect();
    let role = format!("beat_{}", std::process::id());
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN")).unwrap();
    let mut app = db.connect_as(&role);
    expect_error(&mut app, "SELECT * FROM lease.heartbeat('o', 1000)", "42501");
    expect_error(&mut app, "SELECT * FROM lease._beat('o', 1000)", "42501");
    expect_error(&mut app, "SELECT * FROM lease.session_state", "42501");
    c.batch_execute(&format!("GRANT EXECUTE ON FUNCTION lease.heartbeat(text, integer) TO {role}")).unwrap();
    assert!(heartbeat(&mut app, "o", 1000).is_empty());
    expect_error(&mut app, "SELECT * FROM lease.heartbeat(NULL, 1000)", "22004");
    expect_error(&mut app, "SELECT * FROM lease.heartbeat(' ', 1000)", "22023");
    expect_error(&mut app, &format!("SELECT * FROM lease.heartbeat('{}', 1000)", "o".repeat(257)), "22023");
    expect_error(&mut app, "SELECT * FROM lease.heartbeat('o', 1)", "22023");
    expect_error(&mut app, "SELECT * FROM lease.heartbeat('o', NULL)", "22004");
    drop(app);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

/// A heartbeat landing at the session's expiry instant against another owner's
/// takeover: either the heartbeat keeps the lease (the takeover gets LF005) or
/// the takeover wins and the heartbeat does not claim the lease (it reports it
/// lost then or at the next heartbeat, exactly once).
#[test]
fn heartbeat_racing_a_takeover_at_expiry_has_one_winner() {
    let db = TestDb::new("session_race");
    let mut holder = db.connect();
    let mut taker = db.connect();
    let (mut kept, mut taken) = (0, 0);
    for i in 0..24 {
        let owner = format!("holder-{i}");
        let name = format!("edge:{i}");
        acquire(&mut holder, &name, &owner, 100);
        assert!(heartbeat(&mut holder, &owner, 100).is_empty());
        thread::sleep(Duration::from_millis(85 + (i % 6) * 5));
        let barrier = Arc::new(Barrier::new(2));
        let (b1, b2) = (barrier.clone(), barrier);
        let (beat, take) = thread::scope(|s| {
            let h = s.spawn(|| {
                b1.wait();
                holder
                    .query("SELECT name, renewed FROM lease.renew_all($1, 10000)", &[&owner])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1)))
                    .collect::<Vec<_>>()
            });
            let t = s.spawn(|| {
                b2.wait();
                try_sql(&mut taker, &format!("SELECT lease.acquire('{name}', 'taker', 10000)"))
            });
            (h.join().unwrap(), t.join().unwrap())
        });
        let claimed = beat.contains(&(name.clone(), true));
        match (claimed, take.as_str()) {
            (true, "LF005") => kept += 1,
            (false, "") => {
                taken += 1;
                // The loss reaches the holder exactly once, now or next beat.
                let mut reports: Vec<String> =
                    beat.iter().filter(|(n, renewed)| *n == name && !renewed).map(|(n, _)| n.clone()).collect();
                for _ in 0..2 {
                    reports.extend(heartbeat(&mut holder, &owner, 10_000).into_iter().map(|(n, _)| n));
                }
                let kinds: BTreeSet<_> = reports.iter().collect();
                assert!(!reports.is_empty() && kinds.len() == 1, "round {i}: loss reports {reports:?}");
                assert!(reports.len() <= 2, "round {i}: reported {reports:?} (expired, then taken, at most)");
            }
            // Expired before the heartbeat and the takeover refused: the
            // acquire locked just before the instant, the heartbeat just after.
            (false, "LF005") => {}
            other => panic!("round {i}: heartbeat claimed={} and takeover gave {:?}", other.0, other.1),
        }
    }
    println!("kept {kept}, taken {taken}");
    assert!(kept + taken > 0, "the race never produced a winner");
}

/// Each takeover reaches the holder that lost the lease, even when the lease
/// changes hands again before that holder's next heartbeat (0.3.0 kept one
/// report per lease row and the second takeover hid the first); a holder that
/// takes the lease back is not told of its earlier loss.
#[test]
fn every_takeover_reaches_the_holder_that_lost_it() {
    let db = TestDb::new("session_chain");
    let mut c = db.connect();
    acquire(&mut c, "n", "h0", 150);
    thread::sleep(Duration::from_millis(250));
    acquire(&mut c, "n", "h1", 150);
    thread::sleep(Duration::from_millis(250));
    let t2 = acquire(&mut c, "n", "h2", 150);
    assert_eq!(heartbeat(&mut c, "h0", 1000), lost(&[("n", "taken")]));
    assert_eq!(heartbeat(&mut c, "h1", 1000), lost(&[("n", "taken")]));
    assert!(heartbeat(&mut c, "h0", 1000).is_empty() && heartbeat(&mut c, "h1", 1000).is_empty());
    // h2 loses it to h3, then takes it back before its next heartbeat.
    thread::sleep(Duration::from_millis(250));
    acquire(&mut c, "n", "h3", 150);
    thread::sleep(Duration::from_millis(250));
    let t4 = acquire(&mut c, "n", "h2", 60_000);
    assert!(t4 > t2);
    assert!(heartbeat(&mut c, "h2", 60_000).is_empty(), "h2 holds it again");
    assert_eq!(heartbeat(&mut c, "h3", 1000), lost(&[("n", "taken")]));
    // The token reported is the one that was lost.
    acquire(&mut c, "m", "h5", 150);
    let lost_token = one_i64(&mut c, "SELECT token FROM lease.leases WHERE name = 'm'");
    thread::sleep(Duration::from_millis(250));
    acquire(&mut c, "m", "h6", 1000);
    let reported = one_i64(&mut c, "SELECT token FROM lease.heartbeat('h5', 1000)");
    assert_eq!(reported, lost_token);
}

/// An owner's first heartbeat and a takeover of its lease at the lease's own
/// expiry: the takeover waits for the heartbeat and then sees the lease held
/// (the session row exists from the owner's first acquire, so it can be locked).
#[test]
fn a_first_heartbeat_in_flight_holds_off_a_takeover() {
    let db = TestDb::new("session_first_beat");
    let mut a = db.connect();
    let mut b = db.connect();
    acquire(&mut a, "x", "proc-a", 400);
    a.batch_execute("BEGIN").unwrap();
    assert!(heartbeat(&mut a, "proc-a", 60_000).is_empty());
    let taker = thread::spawn(move || {
        thread::sleep(Duration::from_millis(600)); // past x's own expiry
        try_sql(&mut b, "SELECT lease.acquire('x', 'proc-b', 60000)")
    });
    thread::sleep(Duration::from_millis(900));
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(taker.join().unwrap(), "LF005", "the lease was carried by the committed heartbeat");
    assert!(live(&mut a, "x"));
}

/// A takeover that commits while the holder's heartbeat waits for it is
/// reported by that heartbeat, not the next one.
#[test]
fn a_takeover_the_heartbeat_waited_for_is_reported_at_once() {
    let db = TestDb::new("session_waited");
    let mut a = db.connect();
    let mut b = db.connect();
    acquire(&mut a, "l2", "proc-a", 200);
    assert!(heartbeat(&mut a, "proc-a", 200).is_empty());
    thread::sleep(Duration::from_millis(400));
    b.batch_execute("BEGIN; SELECT lease.acquire('l2', 'proc-b', 60000)").unwrap();
    let beat = thread::spawn(move || heartbeat(&mut a, "proc-a", 60_000));
    thread::sleep(Duration::from_millis(300));
    b.batch_execute("COMMIT").unwrap();
    assert_eq!(beat.join().unwrap(), lost(&[("l2", "taken")]));
}

/// A lease its holder is renewing right now is not reported expired by a
/// heartbeat that finds the session lapsed: the renew decides.
#[test]
fn a_renew_in_flight_is_not_reported_expired() {
    let db = TestDb::new("session_renew_in_flight");
    let mut a = db.connect();
    let mut beat = db.connect();
    let token = acquire(&mut a, "f", "proc-a", 700);
    assert!(heartbeat(&mut a, "proc-a", 200).is_empty());
    thread::sleep(Duration::from_millis(300)); // session lapsed, f alive on its own
    a.batch_execute(&format!("BEGIN; SELECT lease.renew('f', 'proc-a', {token}, 60000)")).unwrap();
    thread::sleep(Duration::from_millis(600)); // f's old expiry has passed
    assert!(heartbeat(&mut beat, "proc-a", 60_000).is_empty(), "f is being renewed, not lost");
    a.batch_execute("COMMIT").unwrap();
    assert!(live(&mut a, "f"));
    assert!(heartbeat(&mut beat, "proc-a", 60_000).is_empty());
}

/// Owner ids and lease names are compared as stored, whatever collation the
/// caller's arguments carry: a nondeterministic (case-insensitive) collation
/// neither aliases another owner's leases nor another lease.
#[test]
fn a_callers_collation_does_not_alias_owners_or_names() {
    let db = TestDb::new("session_collation");
    let mut c = db.connect();
    c.batch_execute("CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)").unwrap();
    let t = acquire(&mut c, "table:7", "host-12", 60_000);
    expect_error(&mut c, "SELECT lease.acquire('table:7', 'HOST-12' COLLATE ci, 1000)", "LF005");
    expect_error(&mut c, &format!("SELECT lease.renew('table:7', 'HOST-12' COLLATE ci, {t}, 1000)"), "LF006");
    let released: bool =
        c.query_one("SELECT lease.release('table:7', 'HOST-12' COLLATE ci, $1)", &[&t]).unwrap().get(0);
    assert!(!released);
    assert_eq!(one_i64(&mut c, "SELECT lease.release_all('HOST-12' COLLATE ci)::bigint"), 0);
    assert!(live(&mut c, "table:7"));
    // A different name, not an alias of table:7.
    let other = one_i64(&mut c, "SELECT token FROM lease.acquire('TABLE:7' COLLATE ci, 'host-13', 1000)");
    assert!(other > 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases"), 2);
    // A heartbeat of another owner id does not carry host-12's leases.
    acquire(&mut c, "short", "host-a", 200);
    assert!(heartbeat(&mut c, "host-a", 200).is_empty());
    thread::sleep(Duration::from_millis(400));
    c.batch_execute("SELECT * FROM lease.heartbeat('HOST-A' COLLATE ci, 60000)").unwrap();
    c.batch_execute("SELECT * FROM lease.renew_all('HOST-A' COLLATE ci, 60000)").unwrap();
    assert!(!live(&mut c, "short"), "host-a's session was not extended");
    acquire(&mut c, "short", "host-b", 1000);
}
