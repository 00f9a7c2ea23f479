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

#[test]
fn refusal_in_a_rolled_back_transaction_is_recorded() {
    let (db, mut c) = {
        let db = TestDb::new("audit_rollback");
        let mut c = db.connect();
        c.batch_execute(POKER).unwrap();
        (db, c)
    };
    let mut audit = db.connect();
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
    // The database's writer is up (started at the first refusal), waiting
    // out its flush interval.
    wait_for("the writer", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(worker_pid) FROM lease.audit_databases() WHERE database = 'postgres'") == 1
    });
    drop(c);
    cluster.stop();
    cluster.restart();
    let mut c = cluster.connect();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE resource_key = '(table_id)=(2)'"), 20);
    assert!(cluster.server_log().contains("pg_lease audit launcher stopped"));
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
    expect_error(&mut app, "SELECT * FROM lease.audit_databases()", "42501");
    expect_error(
        &mut app,
        "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
         VALUES (now(), 'x', 'y', 'INSERT', 'LF001')",
        "42501",
    );
    c.batch_execute(&format!(
        "GRANT SELECT ON lease.rejected_writes, lease.stats TO {role};
         GRANT EXECUTE ON FUNCTION lease._table_stats(), lease.audit_status(), lease.audit_databases() TO {role};"
    ))
    .unwrap();
    app.batch_execute(
        "SELECT * FROM lease.rejected_writes; SELECT * FROM lease.stats; SELECT * FROM lease.audit_databases()",
    )
    .unwrap();
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
    // Automatic retention, applied in every database once the setting is on
    // (also where nothing was refused since the server started).
    c.batch_execute(old_row).unwrap();
    c.batch_execute("CREATE DATABASE kept").unwrap();
    let mut kept = cluster.connect_db("kept");
    kept.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    kept.batch_execute(old_row).unwrap();
    c.batch_execute("ALTER SYSTEM SET pg_lease.audit_retention = '1d'").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let old = "SELECT count(*) FROM lease.rejected_writes WHERE rejected_at < now() - interval '2 days'";
    wait_for("the retention", Duration::from_secs(10), || one_i64(&mut c, old) == 0 && one_i64(&mut kept, old) == 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), 2);
    assert_eq!(one_i64(&mut kept, "SELECT count(*) FROM lease.rejected_writes"), 1);
}

// ---------------------------------------------------------------------------
// No record can stop the audit, and audit_status tells the truth.
// ---------------------------------------------------------------------------

fn status(c: &mut Client) -> String {
    c.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0)
}

/// Waits until `lease.audit_status().status` satisfies `check`, returning it.
#[track_caller]
fn wait_for_status(c: &mut Client, what: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let s = status(c);
        if check(&s) {
            return s;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for the status to say {what}; it says: {s}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// A fenced table with a json column, beside the poker schema.
const NOTES: &str = "
    CREATE TABLE notes (
        id bigserial PRIMARY KEY,
        table_id int NOT NULL,
        fencing_token bigint,
        memo text,
        doc json
    );
    SELECT lease.protect('notes', '{table_id}', 'fencing_token');
";

#[track_caller]
fn refuse_note(c: &mut Client, memo: &str, doc: &str) {
    let sql = format!("INSERT INTO notes (table_id, fencing_token, memo, doc) VALUES (1, 4, '{memo}', '{doc}')");
    assert_eq!(try_sql(c, &sql), "LF001", "{sql}");
}

#[test]
fn json_that_jsonb_cannot_hold_does_not_stop_the_audit() {
    let cluster = Cluster::start("audit_json", 54435);
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER} {NOTES}")).unwrap();
    c.batch_execute("SET pg_lease.audit_row = on").unwrap();
    // All valid json, none of it valid jsonb as it stands.
    refuse_note(&mut c, "nul", r#"{"k": "a\u0000b", "\u0000": [1, "\u0000"]}"#);
    refuse_note(&mut c, "numbers", r#"{"big": 1e1000000, "tiny": 1e-20000, "exact": 12345678901234567890.123456789}"#);
    refuse_note(&mut c, "surrogate", r#"{"k": "\ud800"}"#);
    // Deeper than serde_json's 128 levels, short enough to be kept whole.
    let deep = format!("{}{}", "[".repeat(150), "]".repeat(150));
    refuse_note(&mut c, "deep", &deep);
    c.batch_execute("RESET pg_lease.audit_row").unwrap();
    // A plain refusal after them must be recorded too.
    refuse_note(&mut c, "plain", "{}");

    wait_for("all five audit rows", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes") == 5
    });
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped, a.queued), (5, 5, 0, 0), "{a:?}");
    assert!(status(&mut c).starts_with("recording"), "{}", status(&mut c));

    let text = |c: &mut Client, sql: &str| -> Option<String> { c.query_one(sql, &[]).unwrap().get(0) };
    // NUL characters, in values and in keys, become U+FFFD; the rest is kept.
    assert_eq!(
        text(&mut c, "SELECT row_data->'doc'->>'k' FROM lease.rejected_writes WHERE row_data->>'memo' = 'nul'"),
        Some("a\u{FFFD}b".to_owned())
    );
    assert_eq!(
        text(
            &mut c,
            "SELECT row_data->'doc'->'\u{FFFD}'->>1 FROM lease.rejected_writes WHERE row_data->>'memo' = 'nul'"
        ),
        Some("\u{FFFD}".to_owned())
    );
    // Numbers jsonb cannot hold are kept as their text; others keep every digit.
    let numbers = c
        .query_one(
            "SELECT row_data->'doc'->>'big', jsonb_typeof(row_data->'doc'->'big'), row_data->'doc'->>'tiny',
                    row_data->'doc'->>'exact', jsonb_typeof(row_data->'doc'->'exact')
               FROM lease.rejected_writes WHERE row_data->>'memo' = 'numbers'",
            &[],
        )
        .unwrap();
    assert_eq!(numbers.get::<_, String>(0), "1e+1000000");
    assert_eq!(numbers.get::<_, String>(1), "string");
    assert_eq!(numbers.get::<_, String>(2), "1e-20000");
    assert_eq!(numbers.get::<_, String>(3), "12345678901234567890.123456789");
    assert_eq!(numbers.get::<_, String>(4), "number");
    // JSON that cannot be structured at all is kept as its text.
    for memo in ["surrogate", "deep"] {
        let r = c
            .query_one(
                "SELECT jsonb_typeof(row_data), row_data #>> '{}' FROM lease.rejected_writes
                  WHERE resource_key = '(table_id)=(1)' AND row_data #>> '{}' LIKE '%\"memo\":\"' || $1 || '\"%'",
                &[&memo],
            )
            .unwrap_or_else(|e| panic!("the {memo} row: {e}"));
        assert_eq!(r.get::<_, String>(0), "string", "{memo}");
    }
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE row_data IS NULL"),
        1,
        "the plain refusal kept no row"
    );
}

#[test]
fn a_record_that_cannot_be_written_is_dropped_alone() {
    let cluster = Cluster::start("audit_poison", 54436);
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    // Whatever the reason a record cannot be inserted, here a constraint:
    c.batch_execute(
        "ALTER TABLE lease.rejected_writes ADD CONSTRAINT no_poison CHECK (application_name IS DISTINCT FROM 'poison')",
    )
    .unwrap();
    let refuse = |c: &mut Client, app: &str| {
        c.batch_execute(&format!("SET application_name = '{app}'")).unwrap();
        assert_eq!(try_sql(c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)"), "LF001");
    };
    refuse(&mut c, "poison");
    refuse(&mut c, "after-1");
    wait_for("the refusal after the poison", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE application_name = 'after-1'") == 1
    });
    // The worker counts a batch once it has committed it: the row can be
    // seen a moment before the counters move.
    wait_for("the queue to drain", Duration::from_secs(10), || accounting(&mut c).queued == 0);
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped, a.queued), (2, 1, 1, 0), "{a:?}");
    // One LOG line says which record was dropped and why.
    let log = cluster.server_log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("pg_lease audit worker: dropped")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("no_poison") && lines[0].contains("public.payouts"), "{}", lines[0]);
    let s = status(&mut c);
    assert!(s.starts_with("recording") && s.contains("no_poison"), "{s}");

    // The worker goes on recording, also in batches that hold a bad record.
    refuse(&mut c, "after-2");
    refuse(&mut c, "poison");
    refuse(&mut c, "after-3");
    wait_for("the later refusals", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE application_name LIKE 'after-%'") == 3
    });
    wait_for("the queue to drain", Duration::from_secs(10), || accounting(&mut c).queued == 0);
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped), (5, 3, 2), "{a:?}");
}

#[test]
fn invalid_utf8_from_a_sql_ascii_database_is_recorded() {
    let db =
        TestDb::with_options("audit_sqlascii", "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    let mut c = db.connect();
    // Key, text and json values, and the role, in bytes that are not UTF-8.
    // (Only through EXECUTE: the client speaks UTF-8. Identifiers stay ASCII:
    // a fence on a non-UTF-8 column name is another matter than the audit.)
    let role = format!("r{}", std::process::id());
    c.batch_execute(&format!(
        r#"CREATE TABLE rooms (id text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE bets (id bigserial, room text NOT NULL, memo text, doc json, fencing_token bigint);
           SELECT lease.protect('bets', '{{room}}', 'fencing_token', 'rooms');
           INSERT INTO rooms VALUES (E'\xff\xfe', 5);
           DO $$ BEGIN
             EXECUTE format('CREATE ROLE %I', '{role}' || E'\xfc');
             EXECUTE format('GRANT INSERT, SELECT ON bets, rooms TO %I', '{role}' || E'\xfc');
             EXECUTE format('GRANT USAGE ON SEQUENCE bets_id_seq TO %I', '{role}' || E'\xfc');
           END $$;
           SET pg_lease.audit_row = on; SET pg_lease.audit_statement = on;
           DO $$ BEGIN EXECUTE format('SET ROLE %I', '{role}' || E'\xfc'); END $$;"#
    ))
    .unwrap();
    let refused = try_sql(
        &mut c,
        r#"INSERT INTO bets (room, memo, doc, fencing_token)
           VALUES (E'\xff\xfe', E'caf\xe9', ('{"k": "' || E'\xe9' || '"}')::json, 4)"#,
    );
    assert_eq!(refused, "LF001");
    c.batch_execute(&format!(
        "RESET ROLE; DO $$ BEGIN EXECUTE format('DROP OWNED BY %I', '{role}' || E'\\xfc');
                               EXECUTE format('DROP ROLE %I', '{role}' || E'\\xfc'); END $$"
    ))
    .unwrap();
    let mut audit = db.connect();
    wait_for("the audit row", Duration::from_secs(10), || {
        one_i64(&mut audit, &format!("SELECT count(*) FROM lease.rejected_writes WHERE database = '{}'", db.name)) == 1
    });
    let r = audit
        .query_one(
            "SELECT role, resource_key, row_data->>'memo', row_data->'doc'->>'k', statement
               FROM lease.rejected_writes WHERE database = $1",
            &[&db.name],
        )
        .unwrap();
    // Bytes that are not UTF-8 are kept written out (README, audit).
    assert_eq!(r.get::<_, String>(0), format!("{role}\\xfc"));
    assert_eq!(r.get::<_, String>(1), r"(room)=(\xff\xfe)");
    assert_eq!(r.get::<_, String>(2), r"caf\xe9");
    assert_eq!(r.get::<_, String>(3), r"\xe9");
    assert!(r.get::<_, String>(4).contains("INSERT INTO bets"));
}

#[test]
fn oversized_values_are_cut_to_their_documented_limits() {
    let db = TestDb::new("audit_oversized");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE rooms (id text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE docs (id bigserial, room text NOT NULL, body text, fencing_token bigint);
         SELECT lease.protect('docs', '{room}', 'fencing_token', 'rooms');
         INSERT INTO rooms VALUES (repeat('k', 2000), 5);
         SET pg_lease.audit_row = on; SET pg_lease.audit_statement = on;",
    )
    .unwrap();
    // A 1 MB statement writing a 6 MB row with a 2 kB key.
    let literal = "s".repeat(1_000_000);
    let sql = format!(
        "INSERT INTO docs (room, body, fencing_token) VALUES (repeat('k', 2000), '{literal}' || repeat('x', 5000000), 4)"
    );
    assert_eq!(try_sql(&mut c, &sql), "LF001");
    let mut audit = db.connect();
    wait_for("the audit row", Duration::from_secs(10), || {
        one_i64(&mut audit, &format!("SELECT count(*) FROM lease.rejected_writes WHERE database = '{}'", db.name)) == 1
    });
    let r = audit
        .query_one(
            "SELECT row_data->>'truncated', (row_data->>'bytes')::bigint, octet_length(statement),
                    octet_length(resource_key), resource_key
               FROM lease.rejected_writes WHERE database = $1",
            &[&db.name],
        )
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "true");
    assert!(r.get::<_, i64>(1) >= 6_000_000, "bytes: {}", r.get::<_, i64>(1));
    assert!(r.get::<_, i32>(2) <= 512 && r.get::<_, i32>(2) > 400, "statement: {} bytes", r.get::<_, i32>(2));
    assert!(r.get::<_, i32>(3) <= 256, "resource key: {} bytes", r.get::<_, i32>(3));
    assert!(r.get::<_, String>(4).starts_with("(room)=(kkkk"));
}

#[test]
fn audit_status_says_when_the_worker_fails_and_when_it_recovers() {
    // The central table (pg_lease.database set): every database's refusals
    // in postgres's lease.rejected_writes, as before 0.4.0's default.
    let cluster = Cluster::start_with("audit_failing", 54437, &["pg_lease.database = 'postgres'"]);
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    c.batch_execute("CREATE DATABASE doomed").unwrap();
    wait_for_status(&mut c, "recording", Duration::from_secs(10), |s| s.starts_with("recording"));
    let mut doomed = cluster.connect_db("doomed");
    doomed.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();

    // Every insert into the audit table now fails.
    c.batch_execute("ALTER TABLE lease.rejected_writes ADD CONSTRAINT audit_blocked CHECK (false) NOT VALID").unwrap();
    assert_eq!(try_sql(&mut doomed, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)"), "LF001");
    assert_eq!(try_sql(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (2, 4)"), "LF001");
    // The refusing database goes away while its record waits in the queue.
    drop(doomed);
    c.batch_execute("DROP DATABASE doomed WITH (FORCE)").unwrap();

    let s = wait_for_status(&mut c, "failing", Duration::from_secs(10), |s| s.starts_with("failing"));
    assert!(s.contains("audit_blocked"), "the status carries the error: {s}");
    let a = accounting(&mut c);
    assert_eq!((a.queued, a.recorded, a.dropped), (2, 0, 0), "nothing is lost while failing: {a:?}");
    assert!(c
        .query_one("SELECT worker_pid FROM lease.audit_status()", &[])
        .unwrap()
        .get::<_, Option<i32>>(0)
        .is_some());

    c.batch_execute("ALTER TABLE lease.rejected_writes DROP CONSTRAINT audit_blocked").unwrap();
    wait_for_status(&mut c, "recording again", Duration::from_secs(10), |s| s.starts_with("recording"));
    wait_for("the queue to drain", Duration::from_secs(10), || accounting(&mut c).queued == 0);
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped), (2, 2, 0), "{a:?}");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE database = 'doomed'"), 1);
    // A launcher or a writer terminated by an administrator comes back.
    let old_pid: i32 = c.query_one("SELECT worker_pid FROM lease.audit_status()", &[]).unwrap().get(0);
    c.batch_execute("SELECT pg_terminate_backend(worker_pid) FROM lease.audit_status()").unwrap();
    wait_for("the launcher to come back", Duration::from_secs(15), || {
        let r = c.query_one("SELECT worker_pid, status FROM lease.audit_status()", &[]).unwrap();
        r.get::<_, Option<i32>>(0).is_some_and(|p| p != old_pid) && r.get::<_, String>(1).starts_with("recording")
    });
    let writer = |c: &mut Client| -> Option<i32> {
        c.query_one("SELECT worker_pid FROM lease.audit_databases() WHERE central", &[]).unwrap().get(0)
    };
    wait_for("the central writer", Duration::from_secs(10), || writer(&mut c).is_some());
    let old_writer = writer(&mut c).unwrap();
    c.batch_execute(&format!("SELECT pg_terminate_backend({old_writer})")).unwrap();
    wait_for("the central writer to come back", Duration::from_secs(10), || {
        writer(&mut c).is_some_and(|p| p != old_writer)
    });
    assert_eq!(try_sql(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (2, 4)"), "LF001");
    wait_for("a refusal after the restart", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE resource_key = '(table_id)=(2)'") == 2
    });

    // The worker said so in the log, once, not at every retry. (The ALTER
    // TABLEs can hold their lock for seconds on a busy machine: the worker
    // may also have logged its lock timeout, once.)
    let log = cluster.server_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pg_lease audit worker: cannot write") && l.contains("audit_blocked"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
}

#[test]
fn audit_status_says_what_the_worker_waits_for() {
    let cluster = Cluster::start_with("audit_waiting", 54438, &["pg_lease.database = 'audit_home'"]);
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER} {NOTES}")).unwrap();
    let s = wait_for_status(&mut c, "waiting for the database", Duration::from_secs(10), |s| {
        s.starts_with("waiting") && s.contains("database \"audit_home\"")
    });
    assert!(!s.contains("CREATE EXTENSION pg_lease in database"), "{s}");
    assert_eq!(try_sql(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)"), "LF001");

    // The database appears; the worker connects (it retries every 5 s) and
    // waits for the extension.
    // A SQL_ASCII audit database: its jsonb takes no \u escape beyond ASCII.
    c.batch_execute("CREATE DATABASE audit_home ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        .unwrap();
    wait_for_status(&mut c, "waiting for the extension", Duration::from_secs(20), |s| {
        s.starts_with("waiting") && s.contains("CREATE EXTENSION pg_lease") && s.contains("\"audit_home\"")
    });
    assert_eq!(accounting(&mut c).queued, 1);

    let mut home = cluster.connect_db("audit_home");
    home.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    wait_for_status(&mut c, "recording", Duration::from_secs(10), |s| s.starts_with("recording"));
    wait_for("the waiting record", Duration::from_secs(10), || {
        one_i64(&mut home, "SELECT count(*) FROM lease.rejected_writes") == 1
    });
    c.batch_execute("SET pg_lease.audit_row = on").unwrap();
    refuse_note(&mut c, "escaped", r#"{"k": "caf\u00e9 \ud83d\ude00"}"#);
    refuse_note(&mut c, "after", "{}");
    wait_for("the json refusals", Duration::from_secs(10), || {
        one_i64(&mut home, "SELECT count(*) FROM lease.rejected_writes") == 3
    });
    let k: String = home
        .query_one("SELECT row_data->'doc'->>'k' FROM lease.rejected_writes WHERE row_data->>'memo' = 'escaped'", &[])
        .unwrap()
        .get(0);
    assert_eq!(k, "café 😀");
    assert_eq!(accounting(&mut c).dropped, 0);

    // The worker cannot connect: failing, with the server's reason.
    c.batch_execute("ALTER DATABASE audit_home ALLOW_CONNECTIONS false").unwrap();
    drop(home);
    drop(c);
    cluster.stop();
    cluster.restart();
    let mut c = cluster.connect();
    let s = wait_for_status(&mut c, "failing to connect", Duration::from_secs(20), |s| s.starts_with("failing"));
    assert!(s.contains("not currently accepting connections"), "{s}");
    let r =
        c.query_one("SELECT worker_pid, state, last_error FROM lease.audit_databases() WHERE central", &[]).unwrap();
    assert!(r.get::<_, Option<i32>>(0).is_none());
    assert_eq!(r.get::<_, String>(1), "failing");
    assert!(r.get::<_, String>(2).contains("not currently accepting connections"));
    // No writer is started for it (each would die with a FATAL every second).
    thread::sleep(Duration::from_millis(1500));
    let log = cluster.server_log();
    assert!(!log.contains("FATAL:  database \"audit_home\" is not currently accepting connections"), "{log}");
    c.batch_execute("ALTER DATABASE audit_home ALLOW_CONNECTIONS true").unwrap();
    wait_for_status(&mut c, "recording after reconnecting", Duration::from_secs(20), |s| s.starts_with("recording"));

    // Off is off.
    c.batch_execute("ALTER SYSTEM SET pg_lease.audit = off").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for_status(&mut c, "off", Duration::from_secs(10), |s| s.contains("pg_lease.audit is off"));
}

// ---------------------------------------------------------------------------
// Per database (the default): each database's refusals in its own table.
// ---------------------------------------------------------------------------

/// One row of `lease.audit_databases()`: (state, queued, refused, recorded, dropped).
fn destination(c: &mut Client, database: &str) -> Option<(String, i64, i64, i64, i64)> {
    c.query_opt(
        "SELECT state, queued, refused, recorded, dropped FROM lease.audit_databases() WHERE database = $1",
        &[&database],
    )
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

#[track_caller]
fn refuse_n(c: &mut Client, n: usize, token: i64) {
    c.batch_execute(&format!(
        "DO $$ BEGIN FOR i IN 1..{n} LOOP
             BEGIN INSERT INTO payouts (table_id, fencing_token) VALUES (1, {token});
             EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL; END;
         END LOOP; END $$"
    ))
    .unwrap();
}

#[test]
fn refusals_land_in_the_refusing_database_without_any_setting() {
    let dbs = [TestDb::new("audit_own_a"), TestDb::new("audit_own_b")];
    for db in &dbs {
        db.connect().batch_execute(POKER).unwrap();
    }
    let mut c = dbs[0].connect();
    assert_eq!(c.query_one("SHOW pg_lease.database", &[]).unwrap().get::<_, String>(0), "", "no setting");
    // Both databases refuse at once, from two sessions each.
    const EACH: usize = 50;
    let flooders: Vec<_> = dbs
        .iter()
        .enumerate()
        .flat_map(|(i, db)| (0..2).map(move |_| (i, db.connect())))
        .map(|(i, mut s)| thread::spawn(move || refuse_n(&mut s, EACH, 3 + i as i64)))
        .collect();
    for f in flooders {
        f.join().unwrap();
    }
    for (i, db) in dbs.iter().enumerate() {
        let mut own = db.connect();
        wait_for("every refusal in its own database", Duration::from_secs(20), || {
            one_i64(&mut own, "SELECT count(*) FROM lease.rejected_writes") == 2 * EACH as i64
        });
        let r = own
            .query_one(
                "SELECT count(*) FILTER (WHERE database <> current_database()),
                        count(*) FILTER (WHERE presented_token <> $1), count(DISTINCT backend_pid)
                   FROM lease.rejected_writes",
                &[&(3 + i as i64)],
            )
            .unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)), (0, 0, 2), "{}", db.name);
        let status = own.query_one("SELECT audit_database, status FROM lease.audit_status()", &[]).unwrap();
        assert_eq!(status.get::<_, String>(0), db.name);
        let text: String = status.get(1);
        assert!(
            text.starts_with(&format!(
                "recording refusals of database \"{}\" in its own lease.rejected_writes",
                db.name
            )),
            "{text}"
        );
    }
    // Per database truth, seen from either: nothing queued, lost or doubled.
    thread::sleep(Duration::from_millis(500));
    for db in &dbs {
        assert_eq!(one_i64(&mut db.connect(), "SELECT count(*) FROM lease.rejected_writes"), 2 * EACH as i64);
        let d = destination(&mut c, &db.name).unwrap_or_else(|| panic!("no audit_databases row for {}", db.name));
        assert_eq!(d, ("recording".to_owned(), 0, 2 * EACH as i64, 2 * EACH as i64, 0), "{}", db.name);
    }
}

#[test]
fn a_database_that_cannot_record_waits_bounded_and_a_dropped_one_is_discarded() {
    let cluster = Cluster::start_with(
        "audit_perdb",
        54439,
        &["pg_lease.audit_queue_size = 16", "pg_lease.audit_flush_ms = 50", "pg_lease.log_rejections = off"],
    );
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    // A database created after the server started, the extension later still.
    c.batch_execute("CREATE DATABASE later").unwrap();
    let mut later = cluster.connect_db("later");
    later.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    refuse_n(&mut later, 1, 4);
    wait_for("the refusal in later", Duration::from_secs(10), || {
        one_i64(&mut later, "SELECT count(*) FROM lease.rejected_writes WHERE database = 'later'") == 1
    });
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), 0, "nothing lands in postgres");

    // Its audit table goes away: its records wait, at most a quarter of the
    // queue (4 of 16), while postgres goes on recording.
    later.batch_execute("ALTER TABLE lease.rejected_writes RENAME TO rejected_writes_away").unwrap();
    refuse_n(&mut later, 1, 4);
    wait_for("later to wait", Duration::from_secs(10), || {
        destination(&mut c, "later").is_some_and(|d| d.0 == "waiting")
    });
    let s: String = later.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(
        s.starts_with("waiting for CREATE EXTENSION pg_lease in database \"later\"") && s.contains("at most 4"),
        "{s}"
    );
    refuse_n(&mut later, 6, 4);
    assert_eq!(destination(&mut c, "later").unwrap(), ("waiting".to_owned(), 4, 8, 1, 3));
    refuse_n(&mut c, 2, 4);
    wait_for("postgres's refusals", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes") == 2
    });

    // The table is back: the waiting records land, once each.
    later.batch_execute("ALTER TABLE lease.rejected_writes_away RENAME TO rejected_writes").unwrap();
    wait_for("the waiting records", Duration::from_secs(10), || {
        destination(&mut c, "later").is_some_and(|d| d.0 == "recording" && d.1 == 0)
    });
    thread::sleep(Duration::from_millis(300));
    assert_eq!(one_i64(&mut later, "SELECT count(*) FROM lease.rejected_writes"), 5);
    assert_eq!(destination(&mut c, "later").unwrap(), ("recording".to_owned(), 0, 8, 5, 3));

    // Dropped while records wait: they are discarded, counted, and logged.
    later.batch_execute("ALTER TABLE lease.rejected_writes RENAME TO rejected_writes_away").unwrap();
    refuse_n(&mut later, 2, 4);
    wait_for("later to wait again", Duration::from_secs(10), || {
        destination(&mut c, "later").is_some_and(|d| d.0 == "waiting" && d.1 == 2)
    });
    drop(later);
    c.batch_execute("DROP DATABASE later WITH (FORCE)").unwrap();
    // (Its row says dropped at once; the launcher discards the records on its next round.)
    wait_for("the records of the dropped database to be discarded", Duration::from_secs(10), || {
        destination(&mut c, "later").is_some_and(|d| d.0 == "dropped" && d.1 == 0)
    });
    assert_eq!(destination(&mut c, "later").unwrap(), ("dropped".to_owned(), 0, 10, 5, 5));
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped, a.queued), (12, 7, 5, 0), "{a:?}");
    let log = cluster.server_log();
    assert_eq!(log.matches("discarded 2 queued refusal(s) of database \"later\"").count(), 1, "{log}");
}

#[test]
fn many_databases_refusing_at_once_share_a_bounded_number_of_writers() {
    let cluster = Cluster::start_with(
        "audit_many",
        54440,
        &[
            "pg_lease.audit_workers = 1",
            "pg_lease.audit_queue_size = 8192",
            "pg_lease.audit_flush_ms = 50",
            "pg_lease.log_rejections = off",
        ],
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    const DBS: usize = 4;
    const EACH: usize = 1000;
    for i in 0..DBS {
        c.batch_execute(&format!("CREATE DATABASE many_{i}")).unwrap();
        cluster.connect_db(&format!("many_{i}")).batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    }
    let flooders: Vec<_> = (0..DBS)
        .map(|i| {
            let mut s = cluster.connect_db(&format!("many_{i}"));
            thread::spawn(move || refuse_n(&mut s, EACH, 4))
        })
        .collect();
    let mut most = 0;
    let writers = "SELECT count(worker_pid) FROM lease.audit_databases()";
    while flooders.iter().any(|f| !f.is_finished()) {
        most = most.max(one_i64(&mut c, writers));
        thread::sleep(Duration::from_millis(10));
    }
    for f in flooders {
        f.join().unwrap();
    }
    wait_for("every database's records", Duration::from_secs(60), || {
        most = most.max(one_i64(&mut c, writers));
        accounting(&mut c).queued == 0
    });
    assert!(most <= 1, "{most} writers at once, with pg_lease.audit_workers = 1");
    let a = accounting(&mut c);
    assert_eq!((a.refused, a.recorded, a.dropped), ((DBS * EACH) as i64, (DBS * EACH) as i64, 0), "{a:?}");
    for i in 0..DBS {
        let name = format!("many_{i}");
        let mut own = cluster.connect_db(&name);
        let r = own
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE database <> current_database()) FROM lease.rejected_writes",
                &[],
            )
            .unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (EACH as i64, 0), "{name}");
        assert_eq!(destination(&mut c, &name).unwrap(), ("recording".to_owned(), 0, EACH as i64, EACH as i64, 0));
    }
    // Idle writers leave: none is connected a few seconds later.
    wait_for("the writers to exit", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_lease audit writer'") == 0
    });
}

#[test]
fn without_a_free_worker_slot_records_wait_and_the_status_says_why() {
    // The launcher takes the only background worker slot: no writer can start.
    let cluster = Cluster::start_with(
        "audit_noslot",
        54445,
        &["max_worker_processes = 1", "max_logical_replication_workers = 0", "max_parallel_workers = 0"],
    );
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    refuse_n(&mut c, 3, 4);
    let s = wait_for_status(&mut c, "waiting for a worker slot", Duration::from_secs(10), |s| s.starts_with("waiting"));
    assert!(s.contains("free background worker slot") && s.contains("max_worker_processes"), "{s}");
    assert_eq!(destination(&mut c, "postgres").unwrap(), ("waiting".to_owned(), 3, 3, 0, 0));
    // A clean shutdown cannot start a writer either: the launcher says what
    // is lost (each refusal is also in the log).
    drop(c);
    cluster.stop();
    let log = cluster.server_log();
    assert!(log.contains("shutting down with 3 refusal(s) of database \"postgres\" not recorded"), "{log}");
    assert_eq!(log.matches("pg_lease rejected write:").count(), 3);
}

/// A database owner's ALTER DATABASE ... SET default_transaction_read_only
/// (or a statement_timeout) does not stall its audit; a database dropped
/// after its refusals were recorded says `dropped`, not `recording`.
#[test]
fn database_settings_cannot_stall_the_audit_and_a_dropped_database_says_so() {
    let db = TestDb::new("audit_db_settings");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(&format!(
        "ALTER DATABASE {0} SET default_transaction_read_only = on; ALTER DATABASE {0} SET statement_timeout = '1ms'",
        db.name
    ))
    .unwrap();
    let mut fresh = db.connect();
    // The database's 1 ms statement_timeout applies to these SETs too: on a
    // busy machine one of them can be cancelled (57014); try again.
    for attempt in 1.. {
        match fresh.batch_execute("SET default_transaction_read_only = off; SET statement_timeout = 0") {
            Ok(()) => break,
            Err(e)
                if attempt < 100 && e.code() == Some(&pg_lease_sessions::postgres::error::SqlState::QUERY_CANCELED) => {
            }
            Err(e) => panic!("SET in a session of {}: {e}", db.name),
        }
    }
    refuse_n(&mut fresh, 3, 4);
    wait_for("refusals recorded despite the database's settings", Duration::from_secs(20), || {
        one_i64(&mut fresh, "SELECT count(*) FROM lease.rejected_writes") == 3
    });
    drop((c, fresh));
    let name = db.name.clone();
    drop(db);
    let other = TestDb::new("audit_db_settings_watch");
    let mut w = other.connect();
    let (state, ..) = destination(&mut w, &name).expect("the dropped database keeps its row");
    assert_eq!(state, "dropped");
}

/// The audit launcher's `worker_pid` in `lease.audit_status()`.
fn launcher_pid(c: &mut Client) -> Option<i32> {
    c.query_one("SELECT worker_pid FROM lease.audit_status()", &[]).unwrap().get(0)
}

/// Central mode: the launcher, connected to no database, finds the central
/// database (missing, then created) without the catalog index scans it
/// cannot do there: no FATAL, no restart, at the first start and the next.
/// Drops at a full queue are named in the status.
#[test]
fn the_central_launcher_finds_its_database_without_dying() {
    let cluster = Cluster::start_with(
        "audit_central_start",
        54444,
        &["pg_lease.database = 'audit_central'", "pg_lease.audit_queue_size = 16", "pg_lease.log_rejections = off"],
    );
    let mut c = cluster.connect();
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    wait_for("the launcher", Duration::from_secs(10), || launcher_pid(&mut c).is_some());
    let first = launcher_pid(&mut c).unwrap();
    wait_for_status(&mut c, "waiting for the database", Duration::from_secs(10), |s| {
        s.starts_with("waiting for database \"audit_central\"")
    });
    // Longer than the 5 s after which the postmaster restarts a dead launcher.
    thread::sleep(Duration::from_secs(6));
    assert_eq!(launcher_pid(&mut c), Some(first), "the launcher stayed up");
    let log = cluster.server_log();
    assert!(!log.contains("cannot read pg_class"), "{log}");
    assert_eq!(log.matches("pg_lease audit launcher started").count(), 1, "started once: {log}");
    // Nowhere to record: the queue fills, and the status says what it dropped.
    refuse_n(&mut c, 20, 4);
    let s = status(&mut c);
    assert!(
        s.starts_with("waiting for database \"audit_central\"")
            && s.contains("16 refusals wait in the queue")
            && s.contains("4 refusals were counted as dropped since")
            && s.contains("because the audit queue was full (pg_lease.audit_queue_size = 16)"),
        "{s}"
    );

    c.batch_execute("CREATE DATABASE audit_central").unwrap();
    let mut home = cluster.connect_db("audit_central");
    home.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    wait_for("the waiting records", Duration::from_secs(20), || {
        one_i64(&mut home, "SELECT count(*) FROM lease.rejected_writes") == 16
    });
    assert_eq!(launcher_pid(&mut c), Some(first), "the launcher stayed up");
    drop((c, home));

    // The next server start finds the database at once.
    cluster.stop();
    cluster.restart();
    let mut c = cluster.connect();
    wait_for_status(&mut c, "recording", Duration::from_secs(10), |s| s.starts_with("recording"));
    let again = launcher_pid(&mut c).unwrap();
    thread::sleep(Duration::from_secs(1));
    assert_eq!(launcher_pid(&mut c), Some(again));
    let log = cluster.server_log();
    assert!(!log.contains("cannot read pg_class"), "{log}");
    assert_eq!(log.matches("pg_lease audit launcher started").count(), 2, "one per server start: {log}");
}

/// A database that accepts no connections (ALLOW_CONNECTIONS false) gets no
/// writer (each would die with a FATAL); its records wait, bounded as a
/// failing database's are, and land once it accepts connections again.
#[test]
fn a_database_that_accepts_no_connections_gets_no_writer() {
    let cluster = Cluster::start_with(
        "audit_noconn",
        54446,
        &["pg_lease.audit_queue_size = 16", "pg_lease.audit_flush_ms = 50", "pg_lease.log_rejections = off"],
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    c.batch_execute("CREATE DATABASE closed").unwrap();
    let mut closed = cluster.connect_db("closed");
    closed.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
    // Sessions already connected stay, and refuse.
    c.batch_execute("ALTER DATABASE closed ALLOW_CONNECTIONS false").unwrap();
    refuse_n(&mut closed, 1, 4);
    wait_for("closed to say it cannot record", Duration::from_secs(10), || {
        destination(&mut c, "closed").is_some_and(|d| d.0 == "failing")
    });
    // At most a quarter of the queue (4 of 16) waits; the rest is dropped, and named.
    refuse_n(&mut closed, 6, 4);
    assert_eq!(destination(&mut c, "closed").unwrap(), ("failing".to_owned(), 4, 7, 0, 3));
    let s: String =
        c.query_one("SELECT status FROM lease.audit_databases() WHERE database = 'closed'", &[]).unwrap().get(0);
    assert!(
        s.starts_with("failing since")
            && s.contains("not currently accepting connections")
            && s.contains("4 refusals wait in the queue")
            && s.contains("3 refusals were counted as dropped since"),
        "{s}"
    );
    thread::sleep(Duration::from_secs(3));
    let log = cluster.server_log();
    assert_eq!(log.matches("FATAL:  database \"closed\" is not currently accepting connections").count(), 0, "{log}");
    assert_eq!(
        log.matches("pg_lease audit launcher: database \"closed\" is not accepting connections").count(),
        1,
        "said once: {log}"
    );

    c.batch_execute("ALTER DATABASE closed ALLOW_CONNECTIONS true").unwrap();
    wait_for("the waiting records", Duration::from_secs(10), || {
        destination(&mut c, "closed").is_some_and(|d| d.0 == "recording" && d.1 == 0)
    });
    assert_eq!(one_i64(&mut closed, "SELECT count(*) FROM lease.rejected_writes"), 4);
    assert_eq!(destination(&mut c, "closed").unwrap(), ("recording".to_owned(), 0, 7, 4, 3));
}

/// `status` says a database waits for an audit worker slot
/// (pg_lease.audit_workers) rather than `starting`; `state` is a state
/// (`off`, `not running`), never a cut word of the text; refusals while
/// pg_lease.audit is off are counted for their database.
#[test]
fn states_and_statuses_say_what_happens() {
    let cluster = Cluster::start_with(
        "audit_states",
        54447,
        &[
            "pg_lease.audit_workers = 1",
            // A writer waits a minute before writing: it keeps its slot.
            "pg_lease.audit_flush_ms = 60000",
            "pg_lease.log_rejections = off",
        ],
    );
    let mut c = cluster.connect();
    c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    let mut dbs = Vec::new();
    for name in ["busy", "next", "quiet"] {
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let mut s = cluster.connect_db(name);
        s.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
        dbs.push(s);
    }
    refuse_n(&mut dbs[0], 2, 4);
    wait_for("busy's writer", Duration::from_secs(10), || {
        one_i64(&mut c, "SELECT count(worker_pid) FROM lease.audit_databases() WHERE database = 'busy'") == 1
    });
    refuse_n(&mut dbs[1], 2, 4);
    let next_status = |c: &mut Client| -> String {
        c.query_one("SELECT status FROM lease.audit_databases() WHERE database = 'next'", &[]).unwrap().get(0)
    };
    wait_for("next to wait for an audit worker slot", Duration::from_secs(10), || {
        next_status(&mut c).starts_with("waiting since")
    });
    let s = next_status(&mut c);
    assert!(s.contains("for an audit worker slot") && s.contains("pg_lease.audit_workers (1)"), "{s}");
    assert_eq!(destination(&mut c, "next").unwrap().0, "waiting");

    // Off: counted for the database where it happened, and the state says off.
    c.batch_execute("ALTER SYSTEM SET pg_lease.audit = off").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let audit_on =
        |s: &mut Client| -> bool { s.query_one("SELECT audit FROM lease.audit_status()", &[]).unwrap().get(0) };
    wait_for("the reload", Duration::from_secs(10), || !audit_on(&mut dbs[2]) && !audit_on(&mut c));
    refuse_n(&mut dbs[2], 3, 4);
    assert_eq!(destination(&mut c, "quiet").unwrap(), ("off".to_owned(), 0, 3, 0, 3));
    assert_eq!(destination(&mut c, "busy").unwrap().0, "off");
    let s: String = dbs[2].query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(s.starts_with("off: pg_lease.audit is off"), "{s}");
    assert!(s.contains("3 refusals were counted as dropped since") && s.contains("pg_lease.audit was off"), "{s}");
    c.batch_execute("ALTER SYSTEM RESET pg_lease.audit").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    wait_for("the reload", Duration::from_secs(10), || audit_on(&mut c));

    // The launcher terminated: `not running` (it comes back within 5 s).
    c.batch_execute("SELECT pg_terminate_backend(worker_pid) FROM lease.audit_status()").unwrap();
    wait_for("not running", Duration::from_secs(4), || {
        destination(&mut c, "quiet").is_some_and(|d| d.0 == "not running")
    });
    let s: String =
        c.query_one("SELECT status FROM lease.audit_databases() WHERE database = 'quiet'", &[]).unwrap().get(0);
    assert!(s.starts_with("not running") && s.contains("pg_lease.audit was off"), "{s}");
}

/// `(accepted, refused)` of each table of this database in `lease.stats`,
/// by name.
fn counted(c: &mut Client) -> std::collections::BTreeMap<String, (i64, i64)> {
    c.query("SELECT table_name, accepted, refused FROM lease.stats WHERE database = current_database()", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), (r.get(1), r.get(2))))
        .collect()
}

/// A fenced table `name` (one owner row, token 5) written once with the
/// current token, so that it claims its stats slot if one is free.
fn counted_table(c: &mut Client, name: &str) {
    counted_table_against(c, name, "owners");
}

fn counted_table_against(c: &mut Client, name: &str, owners: &str) {
    must_run(
        c,
        &format!(
            "CREATE TABLE {name} (k int, tok bigint);
             SELECT lease.protect('{name}', '{{k}}', 'tok', '{owners}', '{{id}}', 'token');
             INSERT INTO {name} VALUES (1, 5)"
        ),
    );
}

/// `pg_lease.stats_tables` bounds the tables `lease.stats` counts at once.
/// Once every slot is taken, a new table takes the slot of a dropped table
/// of its own database or of any table of a dropped database, but never that
/// of a table still there: one created by a transaction still in progress,
/// or one that the claiming transaction itself dropped (it may roll back).
#[test]
fn stats_slots_of_dropped_tables_and_databases_are_reused() {
    const SLOTS: usize = 16;
    let cluster = Cluster::start_with("audit_stat_slots", 54448, &["pg_lease.stats_tables = 16"]);
    let mut admin = cluster.connect();
    must_run(&mut admin, "CREATE DATABASE a");
    must_run(&mut admin, "CREATE DATABASE b");
    let schema = "CREATE EXTENSION pg_lease;
                  CREATE TABLE owners (id int PRIMARY KEY, token bigint);
                  INSERT INTO owners VALUES (1, 5);
                  CREATE TABLE owners2 (id int PRIMARY KEY, token bigint);
                  INSERT INTO owners2 VALUES (1, 5)";
    let mut b = cluster.connect_db("b");
    must_run(&mut b, schema);
    counted_table(&mut b, "in_b");
    expect_error(&mut b, "INSERT INTO in_b VALUES (1, 4)", "LF001");
    assert_eq!(counted(&mut b).get("public.in_b"), Some(&(1, 1)));
    let mut a = cluster.connect_db("a");
    must_run(&mut a, schema);
    for i in 1..SLOTS {
        counted_table(&mut a, &format!("p{i}"));
    }
    let full = counted(&mut a);
    assert_eq!(full.len(), SLOTS - 1, "{full:?}");
    assert!(full.values().all(|&n| n == (1, 0)), "{full:?}");
    // Every slot taken: a further table is fenced but not counted, and a
    // dropped table of another database does not free a slot for it (only
    // its own database can tell that the table is gone).
    must_run(&mut b, "DROP TABLE in_b");
    counted_table(&mut a, "extra");
    expect_error(&mut a, "INSERT INTO extra VALUES (1, 4)", "LF001");
    assert!(!counted(&mut a).contains_key("public.extra"));

    // A dropped table's slot goes to a table made by a transaction that
    // stays open; a later claim cannot take that slot back from it.
    must_run(&mut a, "DROP TABLE p1");
    let mut creator = cluster.connect_db("a");
    must_run(&mut creator, "BEGIN");
    // (Against another owner table: a transaction that protects a table
    // holds back the other fence changes on its owner table, DROP TABLE p2
    // below among them.)
    counted_table_against(&mut creator, "n1", "owners2");
    must_run(&mut a, "DROP TABLE p2");
    counted_table(&mut a, "n2");
    must_run(&mut creator, "INSERT INTO n1 VALUES (1, 5); COMMIT");
    let now = counted(&mut a);
    assert_eq!(now.get("public.n1"), Some(&(2, 0)), "{now:?}");
    assert_eq!(now.get("public.n2"), Some(&(1, 0)), "{now:?}");
    assert!(!now.contains_key("public.p1") && !now.contains_key("public.p2"), "{now:?}");
    assert_eq!(now.len(), SLOTS - 1, "{now:?}");

    // A table dropped by the claiming transaction itself keeps its slot
    // (the transaction may roll back, as this one does).
    must_run(&mut a, "BEGIN; DROP TABLE p3");
    counted_table(&mut a, "n3");
    must_run(&mut a, "ROLLBACK");
    must_run(&mut a, "INSERT INTO p3 VALUES (1, 5)");
    let now = counted(&mut a);
    assert_eq!(now.get("public.p3"), Some(&(2, 0)), "{now:?}");
    assert!(!now.contains_key("public.n3"), "{now:?}");

    // A dropped database's slots are reused by any other database, their
    // counters starting from zero.
    drop(b);
    must_run(&mut admin, "DROP DATABASE b WITH (FORCE)");
    counted_table(&mut a, "n4");
    let everywhere: Vec<(String, String, i64, i64)> = a
        .query("SELECT database, table_name, accepted, refused FROM lease.stats ORDER BY 1, 2", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(everywhere.len(), SLOTS, "{everywhere:?}");
    assert!(everywhere.iter().all(|(db, ..)| db == "a"), "{everywhere:?}");
    assert!(everywhere.contains(&("a".into(), "public.n4".into(), 1, 0)), "{everywhere:?}");
    // The tables that were there all along kept their counts.
    for i in 4..SLOTS {
        assert!(everywhere.contains(&("a".into(), format!("public.p{i}"), 1, 0)), "p{i}: {everywhere:?}");
    }
    assert_eq!(one_i64(&mut a, "SELECT current_setting('pg_lease.stats_tables')::bigint"), SLOTS as i64);
}
