//! Attack review 10 (0.7.0 after the attack-9 fixes, issue #17): logical
//! replication rules and the blue/green token functions, attacked again.
//! Each test states the behaviour pg_lease should have and **fails at
//! 672b040** (the commit it was written against); see each test's doc
//! comment for the severity and the reason.

use pg_lease_sessions::*;
use postgres::Client;
use std::time::{Duration, Instant};

/// **Fails at 672b040. Critical: tokens go backwards (a token at or below
/// the ceiling is issued after `lease.issue_tokens_above` committed).**
/// README (Blue/green, step 5): after `SELECT
/// lease.issue_tokens_above(:blue_ceiling)` "every token [green] issues from
/// now on" is above blue's, and the function "holds later [acquires] until
/// it commits". It raises the epoch by inserting into `lease.token_epoch`
/// under an ACCESS EXCLUSIVE lock, and `lease.acquire` reads the epoch
/// through its transaction's snapshot: in a REPEATABLE READ (or
/// SERIALIZABLE) transaction whose snapshot was taken before the raise
/// committed, `acquire` still sees the old epoch and issues a token from it
/// (here 2^40 + 1, the very first token blue issued for an unbound lease,
/// though green was told to issue only above 2^40 + 100) and commits it.
/// The same happens to an acquire that waits on the raise's lock (its
/// snapshot was taken when its statement began). Nothing refuses it: the
/// lease row is new, so there is no concurrent update to fail on. An
/// application whose driver or pool opens transactions at REPEATABLE READ
/// gets, right after the cutover, a token a blue holder also had.
/// Expected: an acquire that commits after `issue_tokens_above` committed
/// issues a token above its argument (or fails, e.g. with a serialization
/// error), whatever the isolation level.
#[test]
fn an_acquire_in_an_older_snapshot_issues_no_token_below_issue_tokens_above() {
    let db = TestDb::new("a10_rr");
    let mut green = db.connect();
    let mut app = db.connect();
    // Blue's ceiling: in this database's epoch (timeline 1), 100 tokens up.
    let base = one_i64(&mut green, "SELECT (lease._token_floor() >> 40) << 40");
    let blue_ceiling = base + 100;
    // The application's transaction has its snapshot (any statement takes it).
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    // The cutover step, committed.
    let lowest = one_i64(&mut green, &format!("SELECT lease.issue_tokens_above({blue_ceiling})"));
    assert!(lowest > blue_ceiling);
    // Every token green issues from now on is above blue's ceiling.
    let issued = app.query_one("SELECT token FROM lease.acquire('jackpot', 'server-1', 60000)", &[]);
    match issued {
        Ok(row) => {
            let token: i64 = row.get(0);
            let committed = app.batch_execute("COMMIT");
            if committed.is_ok() {
                assert!(
                    token > blue_ceiling,
                    "after issue_tokens_above({blue_ceiling}) committed (lowest {lowest}), an acquire committed token {token}"
                );
            }
        }
        Err(_) => app.batch_execute("ROLLBACK").unwrap(),
    }
    let stored = one_i64(&mut green, "SELECT coalesce(max(token), 0) FROM lease.lease_state");
    assert!(stored == 0 || stored > blue_ceiling, "lease.lease_state holds token {stored} <= {blue_ceiling}");
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status(c: &mut Client) -> String {
    c.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0)
}

/// **Fails at 672b040. Lower: accounting (a false alarm that stays).**
/// `lease.audit_status()` notes a subscription whose worker had a
/// transaction aborted by a refusal under the subscription's oid, but shows
/// it while a subscription of that *name* exists ("for existing
/// subscriptions only"). Drop the stuck subscription and create a new one
/// under the same name (re-subscribing after fixing the cause, or the next
/// blue/green round's `green`): the new subscription, which never had
/// anything refused (here it is not even connected), is reported as having
/// "1 replicated change(s) refused by the fence ...: its worker retries the
/// change until it goes through, holding back every later one", until
/// someone calls `lease.stats_reset()` (which also zeroes every table's
/// counters). Expected: the note belongs to the subscription it was taken
/// for (its oid), and goes away with it.
#[test]
fn a_new_subscription_under_a_dropped_ones_name_inherits_no_refusals() {
    let publisher = Cluster::start_with("a10_name_pub", 54540, &["wal_level = logical"]);
    let subscriber = Cluster::start("a10_name_sub", 54541);
    let mut p = publisher.connect();
    p.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER} CREATE PUBLICATION game FOR TABLE tables, payouts;"))
        .unwrap();
    schema_only_copy(publisher.port, "postgres", subscriber.port, "postgres");
    let mut s = subscriber.connect();
    s.batch_execute(
        "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         SELECT lease.judge_replicated('payouts', true);",
    )
    .unwrap();
    let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", publisher.port);
    s.batch_execute(&format!("CREATE SUBSCRIPTION game CONNECTION '{conninfo}' PUBLICATION game")).unwrap();
    wait_for("the initial sync", Duration::from_secs(90), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && one_i64(&mut s, "SELECT count(*) FROM tables") == 2
    });
    // The subscriber judges on its own and moved table 1 on: the
    // publisher's payout at 5 is refused here, and the worker is stuck.
    s.batch_execute("UPDATE tables SET owner_fencing_token = 9 WHERE id = 1").unwrap();
    p.batch_execute("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 5)").unwrap();
    wait_for("the refusal to be noted", Duration::from_secs(60), || {
        status(&mut s).contains("replicated change(s) refused")
    });
    // Gone with the subscription.
    s.batch_execute("DROP SUBSCRIPTION game").unwrap();
    assert!(!status(&mut s).contains("replicated change(s) refused"), "{}", status(&mut s));
    // A new subscription that never applied anything, under the same name.
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION game CONNECTION '{conninfo}' PUBLICATION game WITH (connect = false)"
    ))
    .unwrap();
    let now = status(&mut s);
    assert!(
        !now.contains("replicated change(s) refused"),
        "a subscription that never applied a change is reported as held back: {now}"
    );
}
