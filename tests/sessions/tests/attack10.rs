//! Attack review 10 (0.7.0 after the attack-9 fixes, issue #17): logical
//! replication rules and the blue/green token functions, attacked again.
//! Each test states the behaviour pg_lease should have and **failed at
//! 672b040** (the commit it was written against); all pass since the fixes
//! that followed (an acquire at REPEATABLE READ or above locks the
//! issued-epoch row every raise writes; a BEFORE row trigger firing in
//! replication workers ahead of pg_lease's is refused by the DDL guard,
//! LF008 'replica'; audit_status follows subscriptions by oid). See each
//! test's doc comment for the severity and the reason. In short:
//!
//! - critical: an acquire in a REPEATABLE READ (or SERIALIZABLE) snapshot
//!   taken before `lease.issue_tokens_above(c)` committed issues and commits
//!   a token at or below `c` (the blue/green cutover's promise broken);
//! - critical: a subscriber BEFORE trigger (sorting before pg_lease's,
//!   firing in the worker) that *skips* a replicated row (RETURN NULL) is
//!   never judged: an owner-token bump vanishes (the stale token stays
//!   current on the subscriber) and a high-water row's mark is left behind
//!   (tokens go backwards after a cutover). `lease.acquire` already treats
//!   a swallowed bump as tampering (LF008); replication does not;
//! - lower: `lease.audit_status()` shows a dropped subscription's refusals
//!   under a new subscription of the same name.

use pg_lease_sessions::*;
use postgres::Client;
use std::time::{Duration, Instant};

/// **Failed at 672b040 (fixed since). Critical: tokens go backwards (a token at or below
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

fn status(c: &mut Client) -> String {
    c.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0)
}

/// **Failed at 672b040 (fixed since). Lower: accounting (a false alarm that stays).**
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

/// Runs the attacker's `sql` as the subscriber's `migrator`: it either
/// succeeds or is refused by pg_lease's DDL guard (LF008: a trigger that
/// would fire before pg_lease's in replication workers), which is the fix
/// for the skip findings (since 7a9ab54).
fn as_migrator(subscriber: &Cluster, sql: &str) {
    let mut m = Client::connect(
        &format!("host=127.0.0.1 port={} user=migrator dbname=postgres", subscriber.port),
        postgres::NoTls,
    )
    .unwrap();
    if let Err(e) = m.batch_execute(sql) {
        let code = e.as_db_error().map(|d| d.code().code().to_owned()).unwrap_or_default();
        assert_eq!(code, "LF008", "the attacker's setup failed otherwise: {e:?}");
    }
}

/// A publisher (POKER plus an unfenced `events` table, all three published)
/// and a subscriber with the same schema, `payouts` protected there too,
/// whose non-superuser `migrator` owns `owned` and runs `attacker_sql` as
/// itself; then a subscription owned by the superuser `postgres` (trusted),
/// its initial sync done. (attack9.rs's layout.)
fn pair(name: &str, port: u16, owned: &[&str], attacker_sql: &str) -> (Cluster, Cluster, Client, Client) {
    let publisher = Cluster::start_with(&format!("{name}_pub"), port, &["wal_level = logical"]);
    let subscriber = Cluster::start(&format!("{name}_sub"), port + 1);
    let mut p = publisher.connect();
    p.batch_execute(&format!(
        "CREATE EXTENSION pg_lease; {POKER}
         CREATE TABLE events (id serial PRIMARY KEY, note text);
         CREATE PUBLICATION game FOR TABLE tables, payouts, events;"
    ))
    .unwrap();
    schema_only_copy(publisher.port, "postgres", subscriber.port, "postgres");
    let mut s = subscriber.connect();
    s.batch_execute(
        "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         CREATE ROLE migrator LOGIN;
         GRANT CREATE ON SCHEMA public TO migrator;",
    )
    .unwrap();
    for t in owned {
        s.batch_execute(&format!("ALTER TABLE {t} OWNER TO migrator")).unwrap();
    }
    as_migrator(&subscriber, attacker_sql);
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION game CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION game",
        publisher.port
    ))
    .unwrap();
    wait_for("the initial sync", Duration::from_secs(90), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && one_i64(&mut s, "SELECT count(*) FROM tables") == 2
    });
    (publisher, subscriber, p, s)
}

/// Waits (30 s at most) for the publisher's `events` row that follows the
/// change under test: true once it applied (the worker went past the
/// change); false if the worker stopped before it, which must then be
/// loud (an apply worker error in the subscriber's log).
fn applied_or_stopped_loudly(subscriber: &Cluster, s: &mut Client) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if one_i64(s, "SELECT count(*) FROM events") > 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = subscriber.server_log();
    assert!(
        log.contains("processing remote data for replication origin"),
        "the change neither applied nor stopped the worker with an error:\n{log}"
    );
    false
}

/// **Failed at 672b040 (fixed since). Critical: a stale write commits (the owner token
/// stays behind on the subscriber).** The attack-9 fix judges a replicated
/// owner row that a replica-firing BEFORE trigger sorting before the owner
/// guard could have rewritten: such a trigger that sets the token to 1 is
/// refused (LF004). The same trigger that instead *skips* the row (RETURN
/// NULL) is never judged: a BEFORE trigger returning NULL stops the row
/// there, so pg_lease's owner guard never fires, nothing is refused or
/// logged, and replication goes on. The publisher's bump 5 -> 7 (a new
/// lease holder) never lands on the subscriber, whose fence goes on
/// accepting payouts at token 5, stale since the bump: from the subscriber's
/// own writers now, and after a cutover from the old holder, which README
/// promises is refused ("the owner rows carry their tokens over, so a
/// writer's stale token is refused on the new side too"). The attacker is
/// the owner table's owner on the subscriber (no superuser; it cannot lower
/// a token by UPDATE, LF004). Expected: a replicated owner-token change
/// either lands or stops replication with a refusal (e.g. the guard judges
/// or refuses a table with such a trigger), never vanishes.
#[test]
fn a_trigger_that_skips_a_replicated_owner_bump_does_not_keep_a_stale_token_current() {
    let (_publisher, subscriber, mut p, mut s) = pair(
        "a10_skip",
        54542,
        &["tables"],
        "CREATE FUNCTION public.a_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER a_hook BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION public.a_skip();
         ALTER TABLE tables ENABLE ALWAYS TRIGGER a_hook;",
    );
    // The publisher's new holder bumps table 1, then a later change shows
    // that the worker applied everything before it.
    p.batch_execute(
        "UPDATE tables SET owner_fencing_token = 7 WHERE id = 1; INSERT INTO events (note) VALUES ('after')",
    )
    .unwrap();
    if !applied_or_stopped_loudly(&subscriber, &mut s) {
        return; // replication stopped on it, with an error: not silent
    }
    let token = one_i64(&mut s, "SELECT owner_fencing_token FROM tables WHERE id = 1");
    assert_eq!(token, 7, "the publisher bumped table 1 to 7, the subscriber applied past it and still holds {token}");
    // A payout at the stale token 5 is refused on the subscriber.
    expect_error(&mut s, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 666, 5)", "LF001");
}

/// **Failed at 672b040 (fixed since). Critical: tokens go backwards after a cutover (a
/// high-water mark left behind).** The high-water variant of
/// `a_trigger_that_skips_a_replicated_owner_bump_does_not_keep_a_stale_token_current`:
/// the subscriber's table owner adds a BEFORE INSERT trigger on the
/// high-water table that skips every row (RETURN NULL), `ENABLE REPLICA` so
/// that it fires only in the apply worker and the subscriber's own writers
/// see nothing. The publisher's row at token 12 for resource 2 never lands,
/// so the subscriber's mark for it never rises (the attack-9 fix raises
/// marks from rows the fence sees; this one it never sees), nothing is
/// refused or logged, and after the cutover the subscriber accepts token 2
/// for resource 2. Expected: a replicated row of a protected table lands
/// (raising its mark) or stops replication with a refusal.
#[test]
fn a_trigger_that_skips_replicated_high_water_rows_leaves_no_mark_behind() {
    let publisher = Cluster::start_with("a10_hwskip_pub", 54546, &["wal_level = logical"]);
    let subscriber = Cluster::start("a10_hwskip_sub", 54547);
    let ledger = "CREATE EXTENSION pg_lease;
         CREATE TABLE ledger (id int PRIMARY KEY, k int, token bigint);
         CREATE TABLE events (id int PRIMARY KEY);
         SELECT lease.protect_high_water('ledger', '{k}', 'token');";
    let mut p = publisher.connect();
    p.batch_execute(&format!("{ledger} CREATE PUBLICATION game FOR TABLE ledger, events;")).unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(&format!(
        "{ledger} CREATE ROLE migrator LOGIN; GRANT CREATE ON SCHEMA public TO migrator; ALTER TABLE ledger OWNER TO migrator;"
    ))
    .unwrap();
    as_migrator(
        &subscriber,
        "CREATE FUNCTION public.a_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER a_hook BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION public.a_skip();
         ALTER TABLE ledger ENABLE REPLICA TRIGGER a_hook;",
    );
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION game CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION game",
        publisher.port
    ))
    .unwrap();
    wait_for("the initial sync", Duration::from_secs(90), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
    });
    // The publisher accepts resource 2 at token 12; a later change shows the
    // worker applied everything before it.
    p.batch_execute("INSERT INTO ledger VALUES (1, 2, 12); INSERT INTO events VALUES (1)").unwrap();
    if !applied_or_stopped_loudly(&subscriber, &mut s) {
        return; // replication stopped on it, with an error: not silent
    }
    // Cut over.
    s.batch_execute("DROP SUBSCRIPTION game").unwrap();
    expect_error(&mut s, "INSERT INTO ledger VALUES (2, 2, 2)", "LF001");
}
