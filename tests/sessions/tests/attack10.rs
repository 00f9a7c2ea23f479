//! Attack review 10 (0.7.0 after the attack-9 fixes, issue #17): logical
//! replication rules and the blue/green token functions, attacked again.
//! Each test states the behaviour pg_lease should have and **fails at
//! 672b040** (the commit it was written against); see each test's doc
//! comment for the severity and the reason.

use pg_lease_sessions::*;

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
