//! Attack review 32: pg_lease's newest changes (lease.stats slot reuse, a
//! trusted subscription keeping owner tokens, a high-water table's initial
//! copy), over real connections and real clusters on PostgreSQL 18 (pg_lease
//! built from main at 2bc4518, installed in /opt/pg_lease/pg18). Tests of
//! 15/16 features return early (saying why) on an older server.
//!
//! (Session 17: holes 1, 2, 3 and 5 closed. A trusted update that would
//! move the key of a row with a token applies with the key and token kept;
//! a trusted insert of a key whose row carries a token is skipped, the
//! token raised if the insert's is higher; a replicated TRUNCATE of an owner
//! table is refused (LF004, HINT naming the subscription, counted in
//! `lease.audit_status()`; a statement trigger cannot skip it), and the test
//! expects that; a backend without a stats slot tries again once any slot
//! was claimed, else at most once a second. Hole 4 is a documented limit
//! (README, Logical replication: owner tables need their key as replica
//! identity); its test is ignored.)
//!
//! Findings, most severe first:
//!
//! - **Hole (high): a replicated key change moves a subscriber's token off
//!   its owner row; the resource then starts over below it.** Publisher
//!   (pg_lease, same fence) and trusted subscriber, `tables (id int PRIMARY
//!   KEY, owner_fencing_token bigint)` row 1 with no token on the publisher;
//!   the subscriber's own `lease.acquire('table:1', ..., 'tables', '{1}')`
//!   gives 1099511627777. Publisher: `UPDATE tables SET id = 3 WHERE id = 1;
//!   INSERT INTO tables VALUES (1, NULL); UPDATE tables SET
//!   owner_fencing_token = 5 WHERE id = 1` (its guard allows each: row 1
//!   carries no token there). On the subscriber the first UPDATE would set
//!   the token NULL, so `owner_guard`'s `trusted_change` keeps the token
//!   (logged "applied with token ... kept") but lets the key change through:
//!   row 3 now holds 1099511627777, row 1 is inserted anew and raised to 5,
//!   and `INSERT INTO payouts VALUES ('stale', 1, 5)` commits on the
//!   subscriber. README: "a trusted subscription never ... take[s] a token
//!   away from a subscriber's owner row"; Limits: owner rows that carry a
//!   token can never be re-keyed
//!   (`a_replicated_key_change_never_moves_a_token_off_the_subscribers_owner_row`,
//!   fails). Fix: in `trusted_change`, treat an UPDATE that changes an owner
//!   key column of a row with a token as the DELETE it is (skip it, logged),
//!   or keep the old key columns too.
//! - **Hole (high): a replicated TRUNCATE erases every owner token on the
//!   subscriber.** `truncate_guard` passes a trusted apply unconditionally.
//!   Publisher without pg_lease (README: such a publisher replicates
//!   whatever its writers commit, and still "one thing a trusted
//!   subscription never does is take a token away"): `TRUNCATE tables;
//!   INSERT INTO tables VALUES (1, 3)`; the subscriber's row 1 (token
//!   1099511627777 from its own acquire) is gone, row 1 comes back at 3, and
//!   a payout at 3 commits there
//!   (`a_replicated_truncate_never_erases_the_subscribers_owner_tokens`,
//!   fails). Fix: refuse (with the replication HINT) or skip a replicated
//!   TRUNCATE of an owner table that holds a token.
//! - **Hole (medium): a skipped owner-row DELETE stops the subscription for
//!   good when the row comes back.** Publisher (pg_lease; row 1 carries no
//!   token there), subscriber acquired table 1: `BEGIN; DELETE FROM tables
//!   WHERE id = 1; INSERT INTO tables VALUES (1, NULL); COMMIT`. The delete
//!   is skipped as README says, so the INSERT fails on the subscriber with
//!   `23505` / `conflict=insert_exists`, retried forever, holding back every
//!   later change; no pg_lease HINT, nothing in `lease.audit_status()`.
//!   README: "Nothing gets stuck silently" (a refused replicated change
//!   names the subscription and the ways out), two-way replication is
//!   "safe". By the same code path (not verified here, no test) a
//!   publication row filter that turns an update leaving the filter into a
//!   skipped DELETE should stop the subscription when the row re-enters the
//!   filter (sent as an INSERT)
//!   (`a_skipped_owner_row_delete_does_not_stop_the_subscription_when_the_row_comes_back`,
//!   fails). Fix: apply an INSERT that meets a row kept by a skipped delete
//!   as an UPDATE keeping the higher token, or document the stop and its way
//!   out (`ALTER SUBSCRIPTION ... SKIP`).
//! - **Hole (medium): two-way replication does not converge on the higher
//!   token when the owner table has no primary key (REPLICA IDENTITY
//!   FULL).** Two pg_lease nodes, `tables (id int NOT NULL UNIQUE,
//!   owner_fencing_token bigint)` (an owner key by UNIQUE constraint; a
//!   published table without a primary key needs REPLICA IDENTITY FULL),
//!   `ALTER TABLE tables REPLICA IDENTITY FULL`, subscriptions `WITH (origin
//!   = none, copy_data = false)` both ways, disabled; A raises table 1 to 10,
//!   B to 20; links enabled. Each node looks the other's old row (1, NULL)
//!   up by every column, finds none (`conflict=update_missing`, skipped): A
//!   stays at 10, B at 20, and a payout at 10 commits on A. The same follows
//!   a kept token in one-way replication: the subscriber's row no longer
//!   matches the publisher's old row, so every later publisher raise of it is
//!   missed. README: two-way replication "converge[s] on the higher token ...
//!   a write at a lower one is refused on both" (with a primary key,
//!   PostgreSQL 16+ finds the row by it even under FULL and the nodes
//!   converge)
//!   (`two_way_replication_converges_on_the_higher_token_with_replica_identity_full`,
//!   fails). Fix: require (or document) a replica identity index on owner
//!   tables, or have `protect` refuse an owner table published with FULL.
//! - **Hole (low): a session that found every stats slot taken never counts
//!   that table, even after it gets a slot.** `pg_lease.stats_tables = 16`,
//!   t1..t16 counted; session A writes t17 (not counted, as README says);
//!   `DROP TABLE t1`; session B's first write of t17 frees t1's slot and
//!   claims it (t17 accepted 1); session A's three further writes of t17
//!   are not counted (accepted stays 1): `FenceConfig::stats` cached `None`
//!   in A until a relcache invalidation of t17, for a pooled connection
//!   possibly forever. README (Limits): tables beyond the slots are not
//!   counted; t17 is not beyond them any more
//!   (`once_a_table_has_a_stats_slot_every_sessions_writes_are_counted`,
//!   fails). Fix: when `stats` is `None`, look the slot up again (lock-free,
//!   cheap) on a later write, or keep a generation of freed slots.
//! - **Defence holds: slots of tables dropped by transactions still in
//!   progress are kept.** Every slot taken; t1 dropped by a prepared
//!   transaction, t2 by `DROP TABLE t2 CASCADE` in an open subtransaction,
//!   t3 by the writer's own transaction, then first writes of t17 and t18
//!   (new sessions): no slot freed; after the rollbacks t1..t3 keep their
//!   counts (`the_stats_slots_of_tables_dropped_by_transactions_in_progress_are_kept`).
//! - **Defence holds: a high-water table's initial sync, partitioned and
//!   filtered.** Publisher without pg_lease, `ledger` partitioned by list
//!   (`publish_via_partition_root = true`) and `ledger2 WHERE (token < 50)`
//!   in one publication, rows out of token order: both subscriber tables
//!   (protected high-water, `ledger` partitioned) reach `r` with every row
//!   copied; a later row under the copied mark is refused (LF001) by the
//!   apply worker
//!   (`high_water_initial_syncs_of_partitioned_and_filtered_tables_finish_and_catch_up_is_judged`).
//!
//! Looked at, no hole kept as a test: a full shared lock table (advisory
//! locks to `out of shared memory`, the writer's fast-path slots used up)
//! fails a session's first write of a fenced table with 53200 whether or
//! not the stats reclaim's probes run (the config build's catalog reads need
//! locks too), so the reclaim adds no failure of its own there; the probe
//! never waits (conditional lock) so lock timeouts do not apply; a renamed
//! table is shown by its current name in its own database. Not tried for
//! lack of time: `two_phase = true`, `streaming = parallel` and `ALTER
//! SUBSCRIPTION ... SKIP` with the kept-token path, standbys, a sync worker
//! killed mid-copy.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

/// The fenced application: `tables` owns the tokens, `payouts` is fenced,
/// `marks` is an unfenced table whose rows tell a test that everything the
/// publisher committed before them has been applied.
const APP: &str = "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
     CREATE TABLE payouts (id text PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
     CREATE TABLE marks (n int PRIMARY KEY);";
const FENCE: &str = "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');";

/// A publisher (pg_lease on it or not) and a trusted subscriber (pg_lease,
/// superuser-owned subscription `game` to `tables, payouts, marks`), the
/// initial sync done.
fn pair(
    name: &str,
    port: u16,
    publisher_has_pg_lease: bool,
    publisher_rows: &str,
) -> (Cluster, Cluster, Client, Client) {
    let publisher = Cluster::start_with(&format!("{name}_pub"), port, &["wal_level = logical"]);
    let subscriber = Cluster::start(&format!("{name}_sub"), port + 1);
    let mut p = publisher.connect();
    if publisher_has_pg_lease {
        p.batch_execute(&format!("CREATE EXTENSION pg_lease; {APP} {FENCE}")).unwrap();
    } else {
        p.batch_execute(APP).unwrap();
    }
    p.batch_execute(&format!("{publisher_rows}; CREATE PUBLICATION game FOR TABLE tables, payouts, marks;")).unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(&format!("CREATE EXTENSION pg_lease; {APP} {FENCE}")).unwrap();
    s.batch_execute(&format!("CREATE SUBSCRIPTION game CONNECTION '{}' PUBLICATION game", publisher.conninfo()))
        .unwrap();
    wait_for("the initial sync", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
    });
    (publisher, subscriber, p, s)
}

// ---------------------------------------------------------------------------
// Owner rows on a trusted subscriber
// ---------------------------------------------------------------------------

#[test]
fn a_replicated_key_change_never_moves_a_token_off_the_subscribers_owner_row() {
    if !at_least(15, "the same steps (run on 18 here)") {
        return;
    }
    let (_publisher, subscriber, mut p, mut s) = pair("a32_rk", 54570, true, "INSERT INTO tables VALUES (1, NULL)");
    // The subscriber's own lease service bound table 1 (say it is the other
    // node of a two-way pair, or it serves writers of its own).
    let mine = acquire_table(&mut s, 1, "sub-host");
    s.batch_execute(&format!("INSERT INTO payouts VALUES ('s1', 1, {mine})")).unwrap();
    // The publisher, whose row 1 carries no token, re-keys it (its owner
    // guard allows that: no token), then a new row 1 gets a token by hand.
    p.batch_execute(
        "UPDATE tables SET id = 3 WHERE id = 1;
         INSERT INTO tables VALUES (1, NULL);
         UPDATE tables SET owner_fencing_token = 5 WHERE id = 1;",
    )
    .unwrap();
    assert!(mark_applied(&mut p, &mut s, &subscriber, 1, "conflict detected"), "the changes were applied");
    let row1 =
        s.query_one("SELECT owner_fencing_token FROM tables WHERE id = 1", &[]).unwrap().get::<_, Option<i64>>(0);
    let row3 = s
        .query_opt("SELECT owner_fencing_token FROM tables WHERE id = 3", &[])
        .unwrap()
        .map(|r| r.get::<_, Option<i64>>(0));
    let stale = try_sql(&mut s, "INSERT INTO payouts VALUES ('stale', 1, 5)");
    println!("subscriber: row 1 token {row1:?} (was {mine}), row 3 token {row3:?}; a payout at 5 for table 1: {stale}");
    drop_subscription(&mut s, "game");
    // README (Logical replication): a trusted subscription never takes a
    // token away from a subscriber's owner row; (Limits) owner rows that
    // carry a token can never be deleted or re-keyed.
    assert!(
        row1.is_some_and(|t| t >= mine),
        "table 1's owner row on the subscriber lost its token {mine}: it now holds {row1:?} (the token moved to row 3: {row3:?})"
    );
    assert_eq!(stale, "LF001", "a payout at 5 for table 1 after the subscriber's bump to {mine}");
}

/// (Session 17) A replicated update that moves the key of a row carrying a
/// token keeps the row's key, and takes the update's token where it is the
/// higher one (keeping the lower token would let a writer between the two
/// through here).
#[test]
fn a_replicated_key_change_that_raises_the_token_keeps_the_key_and_the_higher_token() {
    let (_publisher, subscriber, mut p, mut s) = pair("a32_rkr", 54584, true, "INSERT INTO tables VALUES (1, NULL)");
    let mine = acquire_table(&mut s, 1, "sub-host");
    let higher = mine + 1000;
    p.batch_execute(&format!("UPDATE tables SET id = 3, owner_fencing_token = {higher} WHERE id = 1")).unwrap();
    assert!(mark_applied(&mut p, &mut s, &subscriber, 1, "conflict detected"), "the change was applied");
    let rows: Vec<(i32, Option<i64>)> = s
        .query("SELECT id, owner_fencing_token FROM tables ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let between = try_sql(&mut s, &format!("INSERT INTO payouts VALUES ('between', 1, {})", mine + 1));
    drop_subscription(&mut s, "game");
    assert_eq!(rows, vec![(1, Some(higher))], "row 1 keeps its key and takes the higher token");
    assert_eq!(between, "LF001", "a payout below the replicated token");
    assert!(subscriber.server_log().contains("its update is applied with the row's key kept"));
}

#[test]
fn a_replicated_truncate_never_erases_the_subscribers_owner_tokens() {
    if !at_least(15, "the same steps (run on 18 here)") {
        return;
    }
    // A publisher without pg_lease: README, "A publisher without pg_lease
    // ... replicates whatever its writers commit ... One thing a trusted
    // subscription never does is take a token away from a subscriber's
    // owner row".
    let (_publisher, subscriber, mut p, mut s) =
        pair("a32_tr", 54572, false, "INSERT INTO tables VALUES (1, NULL), (2, NULL)");
    let mine = acquire_table(&mut s, 1, "sub-host");
    p.batch_execute("TRUNCATE tables; INSERT INTO tables VALUES (1, 3)").unwrap();
    // (Session 17) The TRUNCATE is refused, loudly: a statement trigger
    // cannot skip it, and applying it would erase the tokens.
    let refusal = "TRUNCATE of owner table public.tables would erase its fencing tokens";
    assert!(!mark_applied(&mut p, &mut s, &subscriber, 1, refusal), "the TRUNCATE was refused");
    let log = subscriber.server_log();
    assert!(
        log.contains("Applied by logical replication subscription \"game\": this node's owner tokens are never taken away by replication"),
        "the refusal names the subscription and the way out: {log}"
    );
    let status: String = s.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(
        status.contains("subscription game had 1 replicated change(s) refused"),
        "lease.audit_status() names the subscription: {status}"
    );
    let row1 = s
        .query_opt("SELECT owner_fencing_token FROM tables WHERE id = 1", &[])
        .unwrap()
        .and_then(|r| r.get::<_, Option<i64>>(0));
    let stale = try_sql(&mut s, "INSERT INTO payouts VALUES ('stale', 1, 3)");
    println!("subscriber: row 1 token {row1:?} (was {mine}); a payout at 3: {stale}");
    drop_subscription(&mut s, "game");
    assert!(
        row1.is_some_and(|t| t >= mine),
        "a replicated TRUNCATE erased the subscriber's owner token {mine} (row 1 now {row1:?})"
    );
    assert_eq!(stale, "LF001", "a payout at 3 for table 1 after the subscriber's bump to {mine}");
}

#[test]
fn a_skipped_owner_row_delete_does_not_stop_the_subscription_when_the_row_comes_back() {
    if !at_least(15, "the same steps (run on 18 here)") {
        return;
    }
    let (_publisher, subscriber, mut p, mut s) = pair("a32_di", 54574, true, "INSERT INTO tables VALUES (1, NULL)");
    let mine = acquire_table(&mut s, 1, "sub-host");
    // Legitimate on the publisher (row 1 carries no token there).
    p.batch_execute("BEGIN; DELETE FROM tables WHERE id = 1; INSERT INTO tables VALUES (1, NULL); COMMIT;").unwrap();
    let flowing = mark_applied(&mut p, &mut s, &subscriber, 1, "conflict=insert_exists");
    let row1 = one_i64(&mut s, "SELECT coalesce(max(owner_fencing_token), -1) FROM tables WHERE id = 1");
    let status: String = s.query_one("SELECT lease.audit_status()::text", &[]).unwrap().get(0);
    println!("subscriber: row 1 token {row1} (was {mine}); mark applied: {flowing}; audit_status: {status}");
    drop_subscription(&mut s, "game");
    // README: the delete is skipped and logged; two-way replication is safe
    // and converges; "Nothing gets stuck silently ... its HINT names the
    // subscription ... and the ways out". Here the skipped delete leaves
    // the row in place, so the INSERT that follows it fails (23505,
    // insert_exists) forever, holding back every later change, with no
    // pg_lease HINT and nothing in lease.audit_status().
    assert_eq!(row1, mine, "the subscriber's token stays");
    assert!(
        flowing,
        "the subscription stopped at the re-inserted owner row (insert_exists) after pg_lease skipped its delete"
    );
}

#[test]
#[ignore = "open (documented, README Logical replication): without a primary key, REPLICA IDENTITY FULL finds no row once a token was kept"]
fn two_way_replication_converges_on_the_higher_token_with_replica_identity_full() {
    if !at_least(16, "origin = none") {
        return;
    }
    let a = Cluster::start_with("a32_bi_a", 54576, &["wal_level = logical"]);
    let b = Cluster::start_with("a32_bi_b", 54577, &["wal_level = logical"]);
    // An owner table keyed by a UNIQUE constraint, no primary key: a
    // published table without one needs REPLICA IDENTITY FULL (or USING
    // INDEX) for its UPDATEs. (With a primary key, PostgreSQL 16+ finds the
    // row by it even under FULL, and the nodes converge.)
    let app = APP.replace("id int PRIMARY KEY, owner_fencing_token", "id int NOT NULL UNIQUE, owner_fencing_token");
    let setup = format!(
        "CREATE EXTENSION pg_lease; {app} {FENCE}
         ALTER TABLE tables REPLICA IDENTITY FULL;
         INSERT INTO tables VALUES (1, NULL);
         CREATE PUBLICATION game FOR TABLE tables, payouts, marks;"
    );
    let mut ca = a.connect();
    let mut cb = b.connect();
    ca.batch_execute(&setup).unwrap();
    cb.batch_execute(&setup).unwrap();
    for (node, other, name) in [(&mut ca, &b, "from_b"), (&mut cb, &a, "from_a")] {
        node.batch_execute(&format!(
            "CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION game
                 WITH (origin = none, copy_data = false, enabled = false)",
            other.conninfo()
        ))
        .unwrap();
    }
    // Each node bumps table 1 while the link is down (by hand: README,
    // "A token raised by hand in an owner row"; acquires do the same).
    ca.batch_execute("UPDATE tables SET owner_fencing_token = 10 WHERE id = 1").unwrap();
    cb.batch_execute("UPDATE tables SET owner_fencing_token = 20 WHERE id = 1").unwrap();
    ca.batch_execute("ALTER SUBSCRIPTION from_b ENABLE").unwrap();
    cb.batch_execute("ALTER SUBSCRIPTION from_a ENABLE").unwrap();
    ca.batch_execute("INSERT INTO marks VALUES (1)").unwrap();
    cb.batch_execute("INSERT INTO marks VALUES (2)").unwrap();
    wait_for("both marks on both nodes", Duration::from_secs(60), || {
        one_i64(&mut ca, "SELECT count(*) FROM marks") == 2 && one_i64(&mut cb, "SELECT count(*) FROM marks") == 2
    });
    let on_a = one_i64(&mut ca, "SELECT owner_fencing_token FROM tables WHERE id = 1");
    let on_b = one_i64(&mut cb, "SELECT owner_fencing_token FROM tables WHERE id = 1");
    let stale = try_sql(&mut ca, "INSERT INTO payouts VALUES ('stale', 1, 10)");
    println!("A {on_a}, B {on_b}; a payout at 10 on A: {stale}");
    drop_subscription(&mut ca, "from_b");
    drop_subscription(&mut cb, "from_a");
    // README: "each node keeps the higher of the two tokens it sees for a
    // resource, so both end at the highest token either issued, and a write
    // at a lower one is refused on both".
    assert_eq!((on_a, on_b), (20, 20), "two-way replication did not converge on the higher token");
    assert_eq!(stale, "LF001", "a payout at 10 on A while B issued 20");
}

// ---------------------------------------------------------------------------
// lease.stats slots (pg_lease.stats_tables = 16, the minimum)
// ---------------------------------------------------------------------------

/// A cluster counting 16 tables; its `postgres` database holds protected
/// high-water tables t1..t20, t1..t16 counted (one write each: every slot
/// taken).
fn stats_cluster(name: &str, port: u16, conf: &[&str]) -> (Cluster, Client) {
    let mut all = vec!["pg_lease.stats_tables = 16", "max_prepared_transactions = 5"];
    all.extend_from_slice(conf);
    let cluster = Cluster::start_with(name, port, &all);
    let mut c = cluster.connect();
    let mut setup = String::from("CREATE EXTENSION pg_lease;");
    for i in 1..=20 {
        setup.push_str(&format!(
            "CREATE TABLE t{i} (k int, token bigint); SELECT lease.protect_high_water('t{i}', '{{k}}', 'token');"
        ));
    }
    c.batch_execute(&setup).unwrap();
    for i in 1..=16 {
        c.batch_execute(&format!("INSERT INTO t{i} VALUES (1, 1)")).unwrap();
    }
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM lease.stats WHERE table_name IS NOT NULL"),
        16,
        "every slot taken"
    );
    (cluster, c)
}

fn accepted(c: &mut Client, table: &str) -> i64 {
    one_i64(
        c,
        &format!("SELECT coalesce(sum(accepted), 0)::bigint FROM lease.stats WHERE table_name = 'public.{table}'"),
    )
}

#[test]
fn once_a_table_has_a_stats_slot_every_sessions_writes_are_counted() {
    let (cluster, mut c) = stats_cluster("a32_st_cache", 54578, &[]);
    // Session A writes t17 while every slot is taken: not counted (README).
    let mut a = cluster.connect();
    a.batch_execute("INSERT INTO t17 VALUES (1, 1)").unwrap();
    assert_eq!(accepted(&mut c, "t17"), 0, "no slot for t17 yet");
    // t1 is dropped for good; a new session's first write of t17 frees its
    // slot and claims it for t17.
    c.batch_execute("DROP TABLE t1").unwrap();
    let mut b = cluster.connect();
    b.batch_execute("INSERT INTO t17 VALUES (1, 1)").unwrap();
    assert_eq!(accepted(&mut c, "t17"), 1, "t17 took t1's slot");
    // Session A goes on writing t17.
    for _ in 0..3 {
        a.batch_execute("INSERT INTO t17 VALUES (1, 1)").unwrap();
    }
    let counted = accepted(&mut c, "t17");
    println!("t17 accepted after 1 write in B and 3 in A: {counted}");
    // README (Limits): lease.stats counts the protected tables that hold a
    // slot; tables beyond that are not counted. t17 holds one: A's writes
    // count as B's do.
    assert_eq!(counted, 4, "session A's writes of t17 are not counted although t17 holds a slot (A cached 'no slot')");
}

#[test]
fn the_stats_slots_of_tables_dropped_by_transactions_in_progress_are_kept() {
    let (cluster, mut c) = stats_cluster("a32_st_drop", 54579, &[]);
    for i in 1..=3 {
        c.batch_execute(&format!("INSERT INTO t{i} VALUES (1, 1)")).unwrap();
    }
    // t1: dropped by a prepared transaction; t2: dropped in a subtransaction
    // of an open transaction; t3: dropped by the writer's own transaction.
    let mut prepared = cluster.connect();
    prepared.batch_execute("BEGIN; DROP TABLE t1; PREPARE TRANSACTION 'a32_drop_t1'").unwrap();
    let mut open = cluster.connect();
    open.batch_execute("BEGIN; SAVEPOINT s; DROP TABLE t2 CASCADE").unwrap();
    let mut w = cluster.connect();
    w.batch_execute("BEGIN; DROP TABLE t3; INSERT INTO t17 VALUES (1, 1)").unwrap();
    // A fresh session's first write of t18 too (every slot taken).
    let mut x = cluster.connect();
    x.batch_execute("INSERT INTO t18 VALUES (1, 1)").unwrap();
    w.batch_execute("ROLLBACK").unwrap();
    open.batch_execute("ROLLBACK").unwrap();
    prepared.batch_execute("ROLLBACK PREPARED 'a32_drop_t1'").unwrap();
    let kept: Vec<i64> = (1..=3).map(|i| accepted(&mut c, &format!("t{i}"))).collect();
    let (t17, t18) = (accepted(&mut c, "t17"), accepted(&mut c, "t18"));
    println!("t1..t3 accepted {kept:?}; t17 {t17}, t18 {t18}");
    assert_eq!(kept, vec![2, 2, 2], "the counts of tables whose drop did not commit were lost");
    assert_eq!((t17, t18), (0, 0), "no slot was free");
}

// ---------------------------------------------------------------------------
// A high-water table's initial copy
// ---------------------------------------------------------------------------

#[test]
fn high_water_initial_syncs_of_partitioned_and_filtered_tables_finish_and_catch_up_is_judged() {
    if !at_least(15, "row filters") {
        return;
    }
    let publisher = Cluster::start_with("a32_hw_pub", 54582, &["wal_level = logical"]);
    let subscriber = Cluster::start("a32_hw_sub", 54583);
    let tables = "CREATE TABLE ledger (id int, k int, token bigint, PRIMARY KEY (id, k)) PARTITION BY LIST (k);
         CREATE TABLE ledger_a PARTITION OF ledger FOR VALUES IN (1, 2);
         CREATE TABLE ledger_b PARTITION OF ledger FOR VALUES IN (3, 4);
         CREATE TABLE ledger2 (id int PRIMARY KEY, k int, token bigint);";
    // The publisher: no pg_lease (the untrusted log a high-water fence is
    // for); rows out of token order in each table.
    let mut p = publisher.connect();
    p.batch_execute(&format!(
        "{tables}
         INSERT INTO ledger VALUES (1, 1, 9), (2, 1, 5), (3, 3, 7), (4, 3, 2);
         INSERT INTO ledger2 VALUES (1, 1, 9), (2, 1, 3), (3, 2, 100);
         CREATE PUBLICATION hw FOR TABLE ledger, ledger2 WHERE (token < 50) WITH (publish_via_partition_root = true);"
    ))
    .unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(&format!(
        "CREATE EXTENSION pg_lease; {tables}
         SELECT lease.protect_high_water('ledger', '{{k}}', 'token');
         SELECT lease.protect_high_water('ledger2', '{{k}}', 'token');"
    ))
    .unwrap();
    s.batch_execute(&format!("CREATE SUBSCRIPTION hw CONNECTION '{}' PUBLICATION hw", publisher.conninfo())).unwrap();
    wait_for("both tables' initial sync", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate = 'r'") == 2
    });
    let copied = (one_i64(&mut s, "SELECT count(*) FROM ledger"), one_i64(&mut s, "SELECT count(*) FROM ledger2"));
    // After the copy: a stale row for k = 1 (mark 9) is judged and refused.
    p.batch_execute("INSERT INTO ledger VALUES (5, 1, 4)").unwrap();
    wait_for("the refusal", Duration::from_secs(60), || subscriber.log_has("\"presented_token\": 4"));
    let stale = one_i64(&mut s, "SELECT count(*) FROM ledger WHERE id = 5");
    drop_subscription(&mut s, "hw");
    assert_eq!(copied, (4, 2), "every copied row (out of token order) was taken");
    assert_eq!(stale, 0, "the row after the copy was judged");
}
