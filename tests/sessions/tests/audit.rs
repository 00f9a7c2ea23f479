//! The audit of refused writes: recorded despite the writer's rollback, fully
//! accounted under a flood, drained on a clean shutdown, honest without
//! preload, readable only by the roles a DBA grants.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, PartialEq, Clone, Copy)]
struct Accounting {
    queued: i64,
    refused: i64,
    recorded: i64,
    dropped: i64,
}

fn accounting(c: &mut Client) -> Accounting {
    let r = c.query_one("SELECT queued, refused, recorded, dropped FROM lease.audit_status()", &[]).unwrap();
    Accounting { queued: r.get(0), refused: r.get(1), recorded: r.get(2), dropped: r.get(3) }
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn refusal_in_a_rolled_back_transaction_is_recorded() {
    let (db, mut c) = {
        let db = TestDb::new("audit_rollback");
        let mut c = db.connect();
        c.batch_execute(POKER).unwrap();
        (db, c)
    };
    let mut audit = audit_db();
    c.batch_execute(
        "SET application_name = 'game-server-7';
         SET pg_lease.audit_statement = on; SET pg_lease.audit_row = on;
         BEGIN;
         INSERT INTO payouts (table_id, player, amount, fencing_token) VALUES (1, 'ann', 500, 5);",
    )
    .unwrap();
    let err =
        try_sql(&mut c, "INSERT INTO payouts (table_id, player, amount, fencing_token) VALUES (1, 'ann', 300, 4)");
    assert_eq!(err, "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0, "the writer rolled back");

    let waited = wait_for("the audit row", Duration::from_secs(10), || {
        one_i64(&mut audit, &format!("SELECT count(*) FROM lease.rejected_writes WHERE database = '{}'", db.name)) == 1
    });
    // pg_lease.audit_flush_ms is 200 ms: allow scheduling slack on a busy CI machine, no more.
    assert!(waited < Duration::from_millis(1_000), "recorded only after {waited:?}");
    let r = audit
        .query_one(
            "SELECT role, application_name, client_addr, backend_pid IS NOT NULL, target_table, operation,
                    resource_key, presented_token, current_token, sqlstate, error_name, statement,
                    row_data->>'amount'
               FROM lease.rejected_writes WHERE database = $1",
            &[&db.name],
        )
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "postgres");
    assert_eq!(r.get::<_, String>(1), "game-server-7");
    assert!(r.get::<_, String>(2).starts_with("127.0.0.1"));
    assert!(r.get::<_, bool>(3));
    assert_eq!(r.get::<_, String>(4), "public.payouts");
    assert_eq!(r.get::<_, String>(5), "INSERT");
    assert_eq!(r.get::<_, String>(6), "(table_id)=(1)");
    assert_eq!(r.get::<_, i64>(7), 4);
    assert_eq!(r.get::<_, i64>(8), 5);
    assert_eq!(r.get::<_, String>(9), "LF001");
    assert_eq!(r.get::<_, String>(10), "StaleOwnerBoundaryWrite");
    assert!(r.get::<_, String>(11).contains("VALUES (1, 'ann', 300, 4)"));
    assert_eq!(r.get::<_, String>(12), "300");

    // Without the opt-in settings no statement or row is kept.
    c.batch_execute("RESET pg_lease.audit_statement; RESET pg_lease.audit_row").unwrap();
    assert_eq!(try_sql(&mut c, "UPDATE tables SET owner_fencing_token = 1"), "LF004");
    wait_for("the second audit row", Duration::from_secs(10), || {
        one_i64(
            &mut audit,
            &format!(
                "SELECT count(*) FROM lease.rejected_writes WHERE database = '{}' AND sqlstate = 'LF004'
                   AND statement IS NULL AND row_data IS NULL AND presented_token = 1",
                db.name
            ),
        ) == 1
    });
}

#[test]
fn a_flood_of_refusals_is_fully_accounted() {
    // A small queue, so that the flood also exercises the drop path.
    let cluster = Cluster::start_with(
        "audit_flood",
        54431,
        &["pg_lease.audit_queue_size = 256", "pg_lease.log_rejections = off"],
    );
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    const SESSIONS: usize = 4;
    const EACH: i64 = 25_000;
    let flooders: Vec<_> = (0..SESSIONS)
        .map(|_| {
            let mut s = cluster.connect();
            thread::spawn(move || {
                s.batch_execute(&format!(
                    "DO $$ BEGIN FOR i IN 1..{EACH} LOOP
                         BEGIN INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4);
                         EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL; END;
                     END LOOP; END $$"
                ))
                .unwrap();
            })
        })
        .collect();
    // Meanwhile, the books must close at every instant.
    let mut observer = cluster.connect();
    let mut snapshots = 0;
    while flooders.iter().any(|f| !f.is_finished()) {
        let a = accounting(&mut observer);
        assert_eq!(a.refused, a.recorded + a.dropped + a.queued, "{a:?}");
        snapshots += 1;
        thread::sleep(Duration::from_millis(20));
    }
    for f in flooders {
        f.join().unwrap();
    }
    wait_for("the queue to drain", Duration::from_secs(30), || accounting(&mut observer).queued == 0);
    let a = accounting(&mut observer);
    let total = SESSIONS as i64 * EACH;
    assert_eq!(a.refused, total, "{a:?}");
    assert_eq!(a.recorded + a.dropped, total, "{a:?}");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), a.recorded);
    let (refused, dropped): (i64, i64) = {
        let r =
            c.query_one("SELECT refused, dropped FROM lease.stats WHERE table_name = 'public.payouts'", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(refused, total, "the stats view agrees");
    assert_eq!(dropped, a.dropped);
    println!("{snapshots} consistent snapshots; recorded {} dropped {}", a.recorded, a.dropped);

    // Accepted writes are counted too, and a reset keeps the books closed.
    c.batch_execute("INSERT INTO payouts (table_id, fencing_token) SELECT 1, 5 FROM generate_series(1, 10)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT accepted FROM lease.stats WHERE table_name = 'public.payouts'"), 10);
    c.batch_execute("SELECT lease.stats_reset()").unwrap();
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped, a.queued), (0, 0, 0, 0));
    assert_eq!(one_i64(&mut c, "SELECT accepted + refused FROM lease.stats"), 0);
}

#[test]
fn a_clean_shutdown_drains_the_queue() {
    // The worker would wait a minute before flushing; only shutdown makes it.
    let cluster = Cluster::start_with("audit_drain", 54432, &["pg_lease.audit_flush_ms = 60000"]);
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    // Let the worker take its first (empty) look and go to sleep.
    thread::sleep(Duration::from_millis(300));
    for _ in 0..20 {
        assert_eq!(try_sql(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (2, 3)"), "LF001");
    }
    let a = accounting(&mut c);
    assert_eq!((a.queued, a.recorded), (20, 0), "{a:?}");
    drop(c);
    cluster.stop();
    cluster.restart();
    let mut c = cluster.connect();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE resource_key = '(table_id)=(2)'"), 20);
    assert!(cluster.server_log().contains("pg_lease audit worker stopped"));
}

#[test]
fn without_preload_fencing_works_and_says_the_audit_is_off() {
    let cluster = Cluster::start_with("audit_nopreload", 54433, &["shared_preload_libraries = ''"]);
    let (mut c, notices) = cluster.connect_collecting_notices();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    assert!(
        notices.lock().unwrap().iter().any(|n| n.starts_with("WARNING") && n.contains("will not be recorded")),
        "{:?}",
        notices.lock().unwrap()
    );
    notices.lock().unwrap().clear();
    for _ in 0..3 {
        assert_eq!(try_sql(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)"), "LF001");
    }
    let warnings: Vec<_> = notices.lock().unwrap().iter().filter(|n| n.starts_with("WARNING")).cloned().collect();
    assert_eq!(warnings.len(), 1, "one warning per session: {warnings:?}");
    assert!(warnings[0].contains("shared_preload_libraries"));
    let r = c.query_one("SELECT preloaded, status FROM lease.audit_status()", &[]).unwrap();
    assert!(!r.get::<_, bool>(0));
    assert!(r.get::<_, String>(1).contains("shared_preload_libraries"));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.stats"), 0);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), 0);
    // The server log keeps a copy of each refusal.
    let log = cluster.server_log();
    assert_eq!(log.matches("pg_lease rejected write: {\"sqlstate\": \"LF001\"").count(), 3, "{log}");
}

#[test]
fn audit_rows_and_stats_are_for_granted_roles_only() {
    let db = TestDb::new("audit_grants");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let role = format!("auditor_{}", std::process::id());
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN")).unwrap();
    let mut app = db.connect_as(&role);
    expect_error(&mut app, "SELECT * FROM lease.rejected_writes", "42501");
    expect_error(&mut app, "SELECT * FROM lease.stats", "42501");
    expect_error(&mut app, "SELECT * FROM lease.audit_status()", "42501");
    expect_error(
        &mut app,
        "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
         VALUES (now(), 'x', 'y', 'INSERT', 'LF001')",
        "42501",
    );
    c.batch_execute(&format!(
        "GRANT SELECT ON lease.rejected_writes, lease.stats TO {role};
         GRANT EXECUTE ON FUNCTION lease._stats(), lease.audit_status() TO {role};"
    ))
    .unwrap();
    app.batch_execute("SELECT * FROM lease.rejected_writes; SELECT * FROM lease.stats").unwrap();
    // Reading is not writing: audit rows cannot be forged or erased.
    expect_error(&mut app, "DELETE FROM lease.rejected_writes", "42501");
    expect_error(&mut app, "UPDATE lease.rejected_writes SET sqlstate = 'x'", "42501");
    expect_error(&mut app, "SELECT lease.purge_rejected_writes('0')", "42501");
    expect_error(&mut app, "SELECT lease.stats_reset()", "42501");
    drop(app);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn retention_purges_old_audit_rows() {
    let cluster = Cluster::start_with("audit_retention", 54434, &["pg_lease.audit_flush_ms = 50"]);
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    let old_row = "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
                   VALUES (now() - interval '3 days', 'x', 'y', 'INSERT', 'LF001'),
                          (now(), 'x', 'y', 'INSERT', 'LF001')";
    c.batch_execute(old_row).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT lease.purge_rejected_writes('1 day')"), 1);
    expect_error(&mut c, "SELECT lease.purge_rejected_writes('-1 day')", "22023");
    // Automatic retention, run by the worker once the setting is on.
    c.batch_execute(old_row).unwrap();
    c.batch_execute("ALTER SYSTEM SET pg_lease.audit_retention = '1d'").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("the worker's retention", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE rejected_at < now() - interval '2 days'") == 0
    });
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), 2);
}
