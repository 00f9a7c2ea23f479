//! Logical replication and schema-only dumps with fenced tables (README,
//! "Logical replication"): a subscriber copies the history and applies every
//! later change, although they carry tokens older than its own state (they
//! were judged where they were written); nothing gets stuck; the subscriber
//! still refuses its own stale writes; a schema-only restore fails closed
//! until `lease.protect` takes pg_lease's triggers over.

use pg_lease_sessions::*;
use postgres::Client;
use std::process::Command;
use std::time::{Duration, Instant};

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every row of `table`, in one ordered text: what both sides must agree on.
fn content(c: &mut Client, table: &str) -> String {
    c.query_one(&format!("SELECT coalesce(string_agg(t::text, ';' ORDER BY t::text), '') FROM {table} t"), &[])
        .unwrap()
        .get(0)
}

/// `pg_dump --schema-only` of database `from` on `from_port`, restored into
/// database `into` on `into_port` (psql, stopping at the first error).
fn schema_only_copy(from_port: u16, from: &str, into_port: u16, into: &str) {
    let dump = Command::new(pg_bin("pg_dump"))
        .args(["-h", "127.0.0.1", "-p", &from_port.to_string(), "-U", "postgres", "--schema-only", from])
        .output()
        .expect("pg_dump");
    assert!(dump.status.success(), "pg_dump: {}", String::from_utf8_lossy(&dump.stderr));
    let mut psql = Command::new(pg_bin("psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &into_port.to_string(), "-U", "postgres"])
        .arg(into)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    use std::io::Write;
    psql.stdin.take().unwrap().write_all(&dump.stdout).unwrap();
    let out = psql.wait_with_output().unwrap();
    assert!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
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
         SELECT lease.protect_high_water('ledger', '{k}', 'token');
         CREATE PUBLICATION game FOR TABLE tables, payouts, ledger;",
    )
    .unwrap();

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

    // The subscriber still fences its own writers against the replicated tokens.
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
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM ledger WHERE token = 5"), 0);
    s.batch_execute("SELECT lease.unprotect('ledger')").unwrap();
    wait_for("the ledger row to apply", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM ledger WHERE token = 5") == 1
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
