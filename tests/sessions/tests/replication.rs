//! Logical replication and schema-only dumps with fenced tables (README,
//! "Logical replication"): a subscriber copies the history and applies every
//! later change, although they carry tokens older than its own state (they
//! were judged where they were written); nothing gets stuck; the subscriber
//! still refuses its own stale writes; a schema-only restore fails closed
//! until `lease.protect` takes pg_lease's triggers over.

use pg_lease_sessions::*;
use postgres::Client;
use std::time::Duration;

/// Every row of `table`, in one ordered text: what both sides must agree on.
fn content(c: &mut Client, table: &str) -> String {
    c.query_one(&format!("SELECT coalesce(string_agg(t::text, ';' ORDER BY t::text), '') FROM {table} t"), &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_subscriber_copies_the_history_and_applies_every_change_without_getting_stuck() {
    let publisher = Cluster::start_with("repl_pub", 54470, &["wal_level = logical"]);
    let subscriber = Cluster::start("repl_sub", 54471);
    let mut p = publisher.connect();
    p.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    // History: payouts at token 5, then table 1 moves on to token 7.
    p.batch_execute(
        "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 10, 5), (1, 20, 5), (2, 30, 5);
         UPDATE tables SET owner_fencing_token = 7 WHERE id = 1;
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 40, 7);
         CREATE TABLE ledger (k int, token bigint);
         ALTER TABLE ledger REPLICA IDENTITY FULL;
         SELECT lease.protect_high_water('ledger', '{k}', 'token');
         CREATE PUBLICATION game FOR TABLE tables, payouts, ledger;
         INSERT INTO ledger VALUES (2, 5), (2, 5);
         BEGIN; SELECT lease.bind_token(5); DELETE FROM ledger WHERE ctid = '(0,1)'; COMMIT;",
    )
    .unwrap();
    // High-water history whose physical order is not its token order: the
    // row at token 9 takes the slot a deleted row at 5 freed, ahead of the
    // other row at 5. The initial copy reads it in that order.
    p.batch_execute("VACUUM ledger").unwrap();
    p.batch_execute("INSERT INTO ledger VALUES (2, 9)").unwrap();
    assert_eq!(
        p.query_one("SELECT string_agg(token::text, ',' ORDER BY ctid) FROM ledger", &[]).unwrap().get::<_, String>(0),
        "9,5"
    );

    // The subscriber's schema from a schema-only dump, the fence taken over.
    schema_only_copy(publisher.port, "postgres", subscriber.port, "postgres");
    let mut s = subscriber.connect();
    s.batch_execute(
        "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         SELECT lease.protect_high_water('ledger', '{k}', 'token');",
    )
    .unwrap();
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION game CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION game",
        publisher.port
    ))
    .unwrap();
    wait_for("the initial sync", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && one_i64(&mut s, "SELECT count(*) FROM payouts") == 4
    });
    assert_eq!(content(&mut s, "payouts"), content(&mut p, "payouts"));
    assert_eq!(content(&mut s, "tables"), content(&mut p, "tables"));
    wait_for("the ledger's copy", Duration::from_secs(30), || content(&mut s, "ledger") == content(&mut p, "ledger"));

    // Ongoing changes: a payout, a bump and payouts at the new token, a
    // DELETE done right on the publisher (token bound there).
    p.batch_execute(
        "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 50, 7);
         UPDATE tables SET owner_fencing_token = 9 WHERE id = 2;
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (2, 60, 9);
         BEGIN; SELECT lease.bind_token(7); DELETE FROM payouts WHERE table_id = 1 AND amount = 10; COMMIT;",
    )
    .unwrap();
    // A stale write on the publisher is refused there (and never replicated).
    expect_error(&mut p, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 99, 5)", "LF001");
    wait_for("the changes to apply", Duration::from_secs(60), || {
        content(&mut s, "payouts") == content(&mut p, "payouts")
            && content(&mut s, "tables") == content(&mut p, "tables")
    });

    // Counted as replicated, nothing refused, the workers alive.
    let (replicated, refused): (i64, i64) = {
        let r = s.query_one("SELECT sum(replicated)::bigint, sum(refused)::bigint FROM lease.stats", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert!(replicated >= 6, "replicated {replicated}");
    assert_eq!(refused, 0);
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL"), 1);
    assert!(!subscriber.server_log().contains("LF00"), "a replicated change was refused:\n{}", subscriber.server_log());

    // The subscriber still fences its own writers against the replicated
    // tokens, and the ledger's copy left its mark at the highest token copied.
    expect_error(&mut s, "INSERT INTO ledger VALUES (2, 8)", "LF001");
    expect_error(&mut s, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 5)", "LF001");
    expect_error(&mut s, "UPDATE tables SET owner_fencing_token = 1 WHERE id = 1", "LF004");
    // And only real replication workers are trusted: replica mode is not one.
    expect_error(
        &mut s,
        "BEGIN; SET LOCAL session_replication_role = replica;
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 5); COMMIT",
        "LF001",
    );
    s.batch_execute("ROLLBACK").unwrap();

    // Only the worker's own changes are trusted: a write that user code
    // makes while the worker applies (here an ENABLE ALWAYS trigger on a
    // replicated table of the subscriber) is judged, and refused when stale;
    // the worker then retries (the change is held back, the error names the
    // subscription) until the trigger is gone.
    s.batch_execute(
        "CREATE FUNCTION sneak() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.payouts (table_id, amount, fencing_token) VALUES (1, 666, 5);
             RETURN NEW;
         END $$;
         CREATE TRIGGER a_sneak AFTER UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION sneak();
         ALTER TABLE tables ENABLE ALWAYS TRIGGER a_sneak;",
    )
    .unwrap();
    p.batch_execute("UPDATE tables SET owner_fencing_token = 8 WHERE id = 1").unwrap();
    wait_for("the apply worker to refuse the sneaked write", Duration::from_secs(30), || {
        subscriber.server_log().contains("Applied by logical replication subscription \"game\"")
    });
    assert!(subscriber.server_log().contains("LF001"), "{}", subscriber.server_log());
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts WHERE amount = 666"), 0);
    assert_eq!(one_i64(&mut s, "SELECT owner_fencing_token FROM tables WHERE id = 1"), 7);
    s.batch_execute("DROP TRIGGER a_sneak ON tables").unwrap();
    wait_for("the apply worker to catch up", Duration::from_secs(60), || {
        content(&mut s, "tables") == content(&mut p, "tables")
    });
    assert_eq!(content(&mut s, "payouts"), content(&mut p, "payouts"));

    // High-water tables judge replicated rows too: a mark the subscriber's
    // own writer raised to 9 refuses the publisher's token 5 (the worker
    // retries, its HINT naming the subscription) until the table is
    // unprotected on the subscriber.
    s.batch_execute("INSERT INTO ledger VALUES (1, 9)").unwrap();
    p.batch_execute("INSERT INTO ledger VALUES (1, 5)").unwrap();
    wait_for("the apply worker to refuse the replicated ledger row", Duration::from_secs(30), || {
        subscriber.server_log().contains("is a high-water table, which judges replicated changes too")
    });
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM ledger WHERE k = 1 AND token = 5"), 0);
    s.batch_execute("SELECT lease.unprotect('ledger')").unwrap();
    wait_for("the ledger row to apply", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM ledger WHERE k = 1 AND token = 5") == 1
    });

    // Cut over: the first acquire on the new side beats every token the old
    // side issued for the resource (the owner row carried 8 over).
    s.batch_execute("DROP SUBSCRIPTION game").unwrap();
    // Sequences are not replicated: move the subscriber's past the publisher's.
    s.batch_execute("SELECT setval('payouts_id_seq', (SELECT max(id) FROM payouts))").unwrap();
    let token: i64 = s
        .query_one("SELECT token FROM lease.acquire('table:1', 'host-new', 60000, 'tables', '{1}')", &[])
        .unwrap()
        .get(0);
    assert!(token > 8, "token {token}");
    assert_eq!(one_i64(&mut s, "SELECT owner_fencing_token FROM tables WHERE id = 1"), token);
    expect_error(&mut s, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 8)", "LF001");
    s.batch_execute(&format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, {token})")).unwrap();
}

#[test]
fn a_schema_only_restore_fails_closed_until_protect_takes_the_triggers_over() {
    let original = TestDb::new("repl_schema_src");
    original.connect().batch_execute(POKER).unwrap();
    for (label, how) in [("repl_schema_protect", "protect"), ("repl_schema_unprotect", "unprotect")] {
        let restored = TestDb::new(label);
        // TestDb creates the extension; the dump carries CREATE EXTENSION too.
        restored.connect().batch_execute("DROP EXTENSION pg_lease CASCADE; DROP SCHEMA lease").unwrap();
        schema_only_copy(port(), &original.name, port(), &restored.name);
        let mut c = restored.connect();
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);
        c.batch_execute("INSERT INTO tables VALUES (1, 5)").expect_err("owner guard without its config");
        let e = c.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)").unwrap_err();
        let e = e.as_db_error().unwrap();
        assert_eq!(e.code().code(), "LF008");
        assert!(e.hint().unwrap_or("").contains("run lease.protect"), "{:?}", e.hint());
        if how == "protect" {
            c.batch_execute("SELECT lease.protect('payouts', '{table_id}', 'fencing_token')").unwrap();
            c.batch_execute(
                "INSERT INTO tables VALUES (1, 5); INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)",
            )
            .unwrap();
            expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
            expect_error(&mut c, "DROP TRIGGER pg_lease_fence ON payouts", "LF008");
            assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
        } else {
            c.batch_execute("SELECT lease.unprotect('payouts'); SELECT lease.unprotect('tables')").unwrap();
            assert_eq!(
                one_i64(
                    &mut c,
                    "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pg_lease%' AND tgrelid IN ('payouts'::regclass, 'tables'::regclass)"
                ),
                0
            );
            c.batch_execute(
                "INSERT INTO tables VALUES (1, 5); INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)",
            )
            .unwrap();
            expect_error(&mut c, "SELECT lease.unprotect('payouts')", "42704");
        }
    }
}

/// The subscriber's server log lines that mention `needle`.
fn log_lines(cluster: &Cluster, needle: &str) -> Vec<String> {
    cluster.server_log().lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
}

/// pg_stat_subscription_stats' error counts of every subscription: a worker
/// that failed even once shows here.
fn worker_errors(s: &mut postgres::Client) -> i64 {
    one_i64(s, "SELECT coalesce(sum(apply_error_count + sync_error_count), 0)::bigint FROM pg_stat_subscription_stats")
}

/// pg_lease's own tables of one node, as text: what a subscription must never change.
fn local_state(c: &mut postgres::Client) -> String {
    [
        "lease.protected",
        "lease.high_water",
        "lease.lease_state",
        "lease.session_state",
        "lease.lost_leases",
        "lease.token_epoch",
        "lease.token_epoch_issued",
        "lease.deferred_checks",
        "lease.rejected_writes",
    ]
    .iter()
    .map(|t| format!("{t}: {}", content(c, t)))
    .collect::<Vec<_>>()
    .join("\n")
}

/// `CREATE PUBLICATION ... FOR ALL TABLES` publishes pg_lease's own tables
/// too. The publisher keeps working (pg_lease's own deletes have a replica
/// identity), and the subscriber skips every change to them: its
/// protections, leases, tokens, marks and audit stay its own (audit ids
/// never collide), no worker ever fails. A TRUNCATE of pg_lease's tables is
/// refused (a publication would carry it as is). Where the publisher's lease
/// row update would overwrite a lease this node took under the same name, it
/// is undone (the old row written back) and the rest of the publisher's
/// transaction applies.
#[test]
fn a_for_all_tables_publication_leaves_each_nodes_pg_lease_state_alone() {
    let publisher =
        Cluster::start_with("repl_all_pub", 54486, &["wal_level = logical", "pg_lease.audit_flush_ms = 20"]);
    let subscriber = Cluster::start_with("repl_all_sub", 54487, &["pg_lease.audit_flush_ms = 20"]);
    let mut p = publisher.connect();
    // The publication first: every pg_lease write on the publisher below
    // happens under it.
    p.batch_execute(&format!(
        "CREATE EXTENSION pg_lease; CREATE PUBLICATION everything FOR ALL TABLES; {POKER}
         CREATE TABLE ledger (k int, token bigint);
         SELECT lease.protect_high_water('ledger', '{{k}}', 'token');
         -- a partitioned fenced table: protect goes through lease.deferred_checks
         CREATE TABLE bets (table_id int NOT NULL, amount int, fencing_token bigint) PARTITION BY RANGE (table_id);
         CREATE TABLE bets_lo PARTITION OF bets FOR VALUES FROM (0) TO (100);
         -- (a partition joining in protect's transaction gets its guards
         -- from the commands that follow, as in a restore; checked at commit)
         BEGIN;
         SELECT lease.protect('bets', '{{table_id}}', 'fencing_token');
         CREATE TABLE bets_hi PARTITION OF bets FOR VALUES FROM (100) TO (200);
         CREATE TRIGGER pg_lease_truncate BEFORE TRUNCATE ON bets_hi
             FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard('target');
         ALTER TABLE bets_hi ENABLE ALWAYS TRIGGER pg_lease_truncate;
         COMMIT;"
    ))
    .unwrap();
    let t1: i64 = p
        .query_one("SELECT token FROM lease.acquire('table:1', 'pub-host', 60000, 'tables', '{1}')", &[])
        .unwrap()
        .get(0);
    p.batch_execute(&format!(
        "SELECT lease.acquire('job', 'pub-host', 60000); SELECT lease.heartbeat('pub-host', 60000);
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 10, {t1});
         INSERT INTO ledger VALUES (1, 5);"
    ))
    .unwrap();
    expect_error(&mut p, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 11, 1)", "LF001");
    wait_for("the publisher's audit row", Duration::from_secs(30), || {
        one_i64(&mut p, "SELECT count(*) FROM lease.rejected_writes") == 1
    });

    // The subscriber: schema, its own fences, its own lease and refusal.
    schema_only_copy(publisher.port, "postgres", subscriber.port, "postgres");
    let mut s = subscriber.connect();
    s.batch_execute(
        "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         SELECT lease.protect_high_water('ledger', '{k}', 'token');
         SELECT lease.protect('bets', '{table_id}', 'fencing_token');
         SELECT lease.acquire('sub-job', 'sub-host', 60000);",
    )
    .unwrap();
    expect_error(&mut s, "INSERT INTO ledger VALUES (7, NULL)", "LF003");
    wait_for("the subscriber's audit row", Duration::from_secs(30), || {
        one_i64(&mut s, "SELECT count(*) FROM lease.rejected_writes") == 1
    });
    let before = local_state(&mut s);
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION everything CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION everything",
        publisher.port
    ))
    .unwrap();
    wait_for("the initial sync of every table, pg_lease's included", Duration::from_secs(90), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && content(&mut s, "payouts") == content(&mut p, "payouts")
    });
    assert!(
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srrelid = 'lease.lease_state'::regclass") == 1,
        "pg_lease's tables are part of the subscription"
    );
    for t in ["tables", "payouts", "ledger"] {
        assert_eq!(content(&mut s, t), content(&mut p, t), "{t}");
    }

    // Ongoing: leases renewed, taken, released, heartbeats, refusals, marks raised.
    p.batch_execute(&format!(
        "SELECT lease.renew('job', 'pub-host', (SELECT token FROM lease.leases WHERE name = 'job'), 60000);
         SELECT lease.heartbeat('pub-host', 60000);
         SELECT lease.acquire('job2', 'pub-host', 60000);
         SELECT lease.release('job2', 'pub-host', (SELECT token FROM lease.leases WHERE name = 'job2'));
         INSERT INTO ledger VALUES (1, 6);
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 20, {t1});"
    ))
    .unwrap_or_else(|e| panic!("{e:?}"));
    expect_error(&mut p, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 21, 2)", "LF001");
    wait_for("the publisher's second audit row", Duration::from_secs(30), || {
        one_i64(&mut p, "SELECT count(*) FROM lease.rejected_writes") == 2
    });
    // Audit retention and protection changes on the publisher replicate as
    // deletes and updates, skipped too.
    p.batch_execute("DELETE FROM lease.rejected_writes WHERE id = 1; SELECT lease.unprotect('ledger')").unwrap();
    p.batch_execute("INSERT INTO ledger VALUES (2, 1)").unwrap();
    wait_for("the changes to apply", Duration::from_secs(60), || {
        content(&mut s, "payouts") == content(&mut p, "payouts")
            && content(&mut s, "ledger") == content(&mut p, "ledger")
    });
    // Only the subscriber's own high-water marks changed: it judged the
    // replicated ledger rows (high-water tables do) until the publisher's
    // unprotect... which did not unprotect it here.
    let after = local_state(&mut s);
    let strip_marks = |t: &str| t.lines().filter(|l| !l.starts_with("lease.high_water")).collect::<Vec<_>>().join("\n");
    assert_eq!(strip_marks(&after), strip_marks(&before));
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM lease.protected WHERE relid = 'ledger'::regclass"), 1);
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM lease.leases WHERE owner = 'pub-host'"), 0);
    assert_eq!(worker_errors(&mut s), 0, "{}", subscriber.server_log());
    assert!(!log_lines(&subscriber, "publishes pg_lease's own tables").is_empty());
    // The subscriber's audit keeps working next to the replicated table.
    expect_error(&mut s, "INSERT INTO ledger VALUES (8, NULL)", "LF003");
    wait_for("the subscriber's second audit row", Duration::from_secs(30), || {
        one_i64(&mut s, "SELECT count(*) FROM lease.rejected_writes") == 2
    });
    assert!(!subscriber.server_log().contains("duplicate key"), "{}", subscriber.server_log());

    // TRUNCATE of pg_lease's tables is refused, on either side.
    for t in ["lease.rejected_writes", "lease.lease_state", "lease.high_water", "lease.token_epoch", "lease.protected"]
    {
        let e = expect_error(&mut p, &format!("TRUNCATE {t}"), "0A000");
        assert!(e.contains("is not allowed"), "{e}");
    }

    // A lease this node took under a name the publisher also uses: the
    // publisher's renewal of its own is written and undone here, and the
    // rest of its transaction applies.
    s.batch_execute("SELECT lease.acquire('job', 'sub-host', 60000)").unwrap();
    let held = |s: &mut postgres::Client| {
        let r = s
            .query_one(
                "SELECT owner, token, expires_at::text, renewed_at::text FROM lease.lease_state WHERE name = 'job'",
                &[],
            )
            .unwrap();
        (r.get::<_, String>(0), r.get::<_, i64>(1), r.get::<_, String>(2), r.get::<_, String>(3))
    };
    let mine = held(&mut s);
    p.batch_execute(
        "BEGIN;
         SELECT lease.renew('job', 'pub-host', (SELECT token FROM lease.leases WHERE name = 'job'), 60000);
         SELECT lease.heartbeat('pub-host', 60000);
         INSERT INTO ledger VALUES (3, 1);
         COMMIT;",
    )
    .unwrap();
    wait_for("the rest of the publisher's transaction", Duration::from_secs(60), || {
        content(&mut s, "ledger") == content(&mut p, "ledger")
    });
    assert_eq!(held(&mut s), mine, "the subscriber's own lease is untouched");
    assert_eq!(worker_errors(&mut s), 0, "{}", subscriber.server_log());
    let status: String = s.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(!status.contains("subscription everything"), "{status}");
    // Its own renewal and release still work on the row.
    let token = mine.1;
    s.batch_execute(&format!(
        "SELECT lease.renew('job', 'sub-host', {token}, 60000); SELECT lease.release('job', 'sub-host', {token})"
    ))
    .unwrap();
    s.batch_execute("DROP SUBSCRIPTION everything").unwrap();
}

/// Subscriptions owned by a role that is not a superuser are judged, unless
/// the DBA names the role in pg_lease.trusted_subscription_owners (a reload
/// is enough: the stuck initial sync then goes through); lease.audit_status()
/// names the subscription meanwhile. lease.judge_replicated makes an owner
/// table's fence judge even a trusted subscription's changes (the owner guard
/// too), and NULL gives the mode's default back.
#[test]
fn trusted_subscription_owners_and_judge_replicated() {
    let publisher = Cluster::start_with("repl_own_pub", 54482, &["wal_level = logical"]);
    let subscriber = Cluster::start("repl_own_sub", 54483);
    let mut p = publisher.connect();
    p.batch_execute(&format!(
        "CREATE EXTENSION pg_lease; {POKER}
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 10, 5);
         UPDATE tables SET owner_fencing_token = 7 WHERE id = 1;
         CREATE PUBLICATION game FOR TABLE tables, payouts;"
    ))
    .unwrap();
    schema_only_copy(publisher.port, "postgres", subscriber.port, "postgres");
    let mut s = subscriber.connect();
    let v16 = one_i64(&mut s, "SELECT current_setting('server_version_num')::bigint") >= 160000;
    // A subscription whose owner is no superuser (PostgreSQL 16 on: a member
    // of pg_create_subscription can own one; before, a demoted superuser).
    // From 16 on its worker needs password_required = false to connect
    // without a password, and run_as_owner to apply as its owner (who is
    // granted the tables) rather than SET ROLE to each table's owner.
    s.batch_execute(
        "SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         CREATE ROLE repl LOGIN SUPERUSER;
         GRANT ALL ON ALL TABLES IN SCHEMA public TO repl;",
    )
    .unwrap();
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION game CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION game
             WITH (enabled = false{})",
        publisher.port,
        if v16 { ", password_required = false, run_as_owner = true" } else { "" }
    ))
    .unwrap();
    s.batch_execute("ALTER SUBSCRIPTION game OWNER TO repl").unwrap();
    s.batch_execute("ALTER ROLE repl NOSUPERUSER").unwrap();
    s.batch_execute("ALTER SUBSCRIPTION game ENABLE").unwrap();
    // The history (token 5 under a current 7) is judged: the sync retries.
    wait_for("the sync worker to refuse the history", Duration::from_secs(60), || {
        !log_lines(&subscriber, "neither a superuser nor a role named in pg_lease.trusted_subscription_owners")
            .is_empty()
    });
    let status: String = s.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(status.contains("subscription game had"), "{status}");
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts"), 0);
    // Named by the DBA: trusted from the next retry on.
    s.batch_execute("ALTER SYSTEM SET pg_lease.trusted_subscription_owners = 'nobody, repl'").unwrap();
    s.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("the initial sync", Duration::from_secs(90), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && content(&mut s, "payouts") == content(&mut p, "payouts")
    });
    assert_eq!(content(&mut s, "tables"), content(&mut p, "tables"));
    assert!(one_i64(&mut s, "SELECT sum(replicated)::bigint FROM lease.stats") >= 1);

    // judge_replicated: the subscriber fences on its own. Its owner row is
    // bumped locally; the publisher's payout at 7 is then stale here.
    expect_error(&mut s, "SELECT lease.judge_replicated(NULL, true)", "22004");
    expect_error(&mut s, "SELECT lease.judge_replicated('tables', true)", "42704");
    s.batch_execute(
        "CREATE ROLE outsider LOGIN; GRANT USAGE ON SCHEMA lease TO outsider;
         SELECT lease.judge_replicated('payouts', true);
         UPDATE tables SET owner_fencing_token = 20 WHERE id = 1;",
    )
    .unwrap();
    {
        let mut o = postgres::Client::connect(
            &format!("host=127.0.0.1 port={} user=outsider dbname=postgres", subscriber.port),
            postgres::NoTls,
        )
        .unwrap();
        expect_error(&mut o, "SELECT lease.judge_replicated('payouts', false)", "42501");
        expect_error(&mut o, "SELECT lease._judge_replicated('payouts'::regclass::oid, false)", "42501");
    }
    assert_eq!(
        s.query_one("SELECT judge_replicated FROM lease.protected WHERE relid = 'payouts'::regclass", &[])
            .unwrap()
            .get::<_, Option<bool>>(0),
        Some(true)
    );
    p.batch_execute("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 30, 7)").unwrap();
    wait_for("the apply worker to judge the payout", Duration::from_secs(30), || {
        !log_lines(&subscriber, "is set to judge replicated changes (lease.judge_replicated)").is_empty()
    });
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts WHERE amount = 30"), 0);
    // The owner guard judges too: the publisher's owner row update (7 -> 8)
    // would lower this node's 20.
    // Back to the default (trusted): the payout and the owner update apply.
    s.batch_execute("SELECT lease.judge_replicated('payouts', NULL)").unwrap();
    wait_for("the payout to apply", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM payouts WHERE amount = 30") == 1
    });
    s.batch_execute("SELECT lease.judge_replicated('payouts', true)").unwrap();
    p.batch_execute("UPDATE tables SET owner_fencing_token = 8 WHERE id = 1").unwrap();
    wait_for("the owner guard to refuse the lowering update", Duration::from_secs(30), || {
        subscriber.server_log().contains("LF004")
    });
    assert_eq!(one_i64(&mut s, "SELECT owner_fencing_token FROM tables WHERE id = 1"), 20);
    // Trusted: the update applies, but a trusted subscription never takes a
    // token away from this node's owner row: 20 is kept (and logged).
    s.batch_execute("SELECT lease.judge_replicated('payouts', false)").unwrap();
    wait_for("the owner update to apply, keeping 20", Duration::from_secs(60), || {
        subscriber.server_log().contains(
            "subscription \"game\" would take fencing token 20 away from owner row (id)=(1) of public.tables: its update is applied with token 20 instead of 8 kept",
        )
    });
    assert_eq!(one_i64(&mut s, "SELECT owner_fencing_token FROM tables WHERE id = 1"), 20);
    // Off the list again: judged again (a superuser owner is always
    // trusted). The subscriber's owner row moves past the publisher's: the
    // publisher's next payout is stale here.
    let judged_before = log_lines(&subscriber, "neither a superuser nor a role named").len();
    s.batch_execute("ALTER SYSTEM RESET pg_lease.trusted_subscription_owners").unwrap();
    s.batch_execute(
        "SELECT pg_reload_conf(); SELECT lease.judge_replicated('payouts', NULL);
         UPDATE tables SET owner_fencing_token = 30 WHERE id = 1;",
    )
    .unwrap();
    p.batch_execute("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 40, 8)").unwrap();
    wait_for("the payout to be judged", Duration::from_secs(30), || {
        log_lines(&subscriber, "neither a superuser nor a role named").len() > judged_before
    });
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts WHERE amount = 40"), 0);
    s.batch_execute("DROP SUBSCRIPTION game").unwrap();
}
