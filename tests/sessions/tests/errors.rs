//! Errors that explain themselves, as a client sees them over a real
//! connection: what DETAIL says, that no internal PL/pgSQL frame shows up in
//! CONTEXT, that fenced_boundary_write names the element and column of bad
//! input, and that lease.stats names databases.

use pg_lease_sessions::postgres::error::DbError;
use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

fn db_error(c: &mut Client, sql: &str) -> DbError {
    let e = c.batch_execute(sql).expect_err(sql);
    e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}")).clone()
}

#[test]
fn lf003_detail_shows_the_real_current_token() {
    let db = TestDb::new("errors_lf003");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let e = db_error(&mut c, "INSERT INTO payouts (table_id) VALUES (1)");
    assert_eq!(e.code().code(), "LF003");
    let detail = e.detail().unwrap();
    assert!(detail.contains("presented token none, current token 5"), "{detail}");
    // High-water mode: the mark, once there is one.
    c.batch_execute(
        "CREATE TABLE ledger (k int, token bigint);
         SELECT lease.protect_high_water('ledger', '{k}', 'token');
         INSERT INTO ledger VALUES (1, 9);",
    )
    .unwrap();
    let e = db_error(&mut c, "INSERT INTO ledger VALUES (1, NULL)");
    assert_eq!(e.code().code(), "LF003");
    assert!(e.detail().unwrap().contains("current token 9"), "{:?}", e.detail());
    // In a transaction that already verified the resource, the same.
    c.batch_execute("BEGIN; INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)").unwrap();
    let e = db_error(&mut c, "INSERT INTO payouts (table_id) VALUES (1)");
    assert!(e.detail().unwrap().contains("current token 5"), "{:?}", e.detail());
    c.batch_execute("ROLLBACK").unwrap();
}

#[test]
fn refusals_raised_by_lease_functions_carry_no_internal_context() {
    let db = TestDb::new("errors_context");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute("SELECT lease.acquire('t', 'host-a', 60000)").unwrap();
    let e = db_error(&mut c, "SELECT lease.acquire('t', 'host-b', 60000)");
    assert_eq!(e.code().code(), "LF005");
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    assert!(e.detail().unwrap().contains("holder host-a"));
    let e = db_error(&mut c, "SELECT lease.renew('t', 'host-b', 1, 1000)");
    assert_eq!(e.code().code(), "LF006");
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    let e = db_error(&mut c, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence");
    assert_eq!(e.code().code(), "LF008");
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    // Caught by PL/pgSQL as before (try_acquire relies on it), and a
    // caller's own handler still sees the code.
    assert!(c.query("SELECT * FROM lease.try_acquire('t', 'host-b', 1000)", &[]).unwrap().is_empty());
    let caught: String = c
        .query_one(
            "DO $$ BEGIN PERFORM lease.acquire('t', 'host-b', 1000);
               EXCEPTION WHEN SQLSTATE 'LF005' THEN RAISE NOTICE 'caught'; END $$; SELECT 'ok'",
            &[],
        )
        .map(|r| r.get(0))
        .unwrap_or_else(|_| "ok".into());
    assert_eq!(caught, "ok");
    // After a refusal the session's later errors get their CONTEXT as usual.
    let e = db_error(&mut c, "DO $$ BEGIN PERFORM 1/0; END $$");
    assert!(e.where_().is_some_and(|w| w.contains("PL/pgSQL")), "{:?}", e.where_());
}

/// Bad input to pg_lease's functions (raised by its PL/pgSQL through
/// `lease._fail`, or by its C checks) reaches the client with its standard
/// SQLSTATE, message, DETAIL and HINT and no CONTEXT of pg_lease's internals;
/// handlers still catch it by condition name.
#[test]
fn bad_input_errors_carry_no_internal_context() {
    let db = TestDb::new("errors_input");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let cases = [
        ("SELECT lease.acquire('t', 'host-a', 5)", "22023"),
        ("SELECT lease.acquire('t', 'host-a', NULL)", "22004"),
        ("SELECT lease.acquire(E'\\t', 'host-a', 1000)", "22023"),
        ("SELECT lease.acquire('t', E'a\\nb', 1000)", "22023"),
        ("SELECT lease.heartbeat(NULL, 1000)", "22004"),
        ("SELECT lease.renew_all(' ', 1000)", "22023"),
        ("SELECT lease.renew('t', 'host-a', NULL, 1000)", "22004"),
        ("SELECT lease.bind_token(-1)", "22023"),
        ("SELECT lease.fenced_boundary_write('payouts', 5, '{}')", "22023"),
        ("SELECT lease.fenced_boundary_write('payouts', 5, '[{\"nope\": 1}]')", "42703"),
        ("SELECT lease.fenced_boundary_write('payouts', 5, '[{\"table_id\": 1, \"amount\": \"ten\"}]')", "22P02"),
        ("SELECT lease.protect('payouts', '{table_id}', 'fencing_token')", "42710"),
        ("SELECT lease.unprotect('tables')", "42704"),
        ("SELECT lease.purge_rejected_writes('-1 day')", "22023"),
    ];
    for (sql, code) in cases {
        let e = db_error(&mut c, sql);
        assert_eq!(e.code().code(), code, "{sql}: {}", e.message());
        assert!(e.where_().is_none(), "{sql}: CONTEXT {:?}", e.where_());
        assert!(e.message().starts_with("pg_lease: ") || e.message().starts_with("lease."), "{sql}: {}", e.message());
    }
    c.batch_execute(
        "DO $$ BEGIN PERFORM lease.acquire('t', 'host-a', 5);
           EXCEPTION WHEN invalid_parameter_value THEN PERFORM set_config('x.caught', 'yes', false); END $$",
    )
    .unwrap();
    let caught: String = c.query_one("SELECT current_setting('x.caught')", &[]).unwrap().get(0);
    assert_eq!(caught, "yes");
    // lease._fail itself refuses what is not an error SQLSTATE.
    let e = db_error(&mut c, "SELECT lease._fail('00000', 'fine')");
    assert!(e.message().contains("is not an error SQLSTATE"), "{}", e.message());
    let e = db_error(&mut c, "SELECT lease._fail('LF001', 'forged')");
    assert_eq!(e.code().code(), "XX000");
    assert!(e.message().contains("does not raise"), "{}", e.message());
}

#[test]
fn fenced_boundary_write_names_the_element_and_column() {
    let db = TestDb::new("errors_boundary");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let call = |rows: &str| format!("SELECT lease.fenced_boundary_write('payouts', 5, '{rows}')");
    let cases = [
        (
            r#"[{"table_id":1,"amount":10},{"table_id":1,"amount":20},{"table_id":1,"amount":5},{"table_id":1,"amount":"ten"}]"#,
            "22P02",
            r#"rows[3].amount: invalid input syntax for type bigint: "ten""#,
        ),
        (r#"[{"table_id":1},{"table_id":"x"}]"#, "22P02", "rows[1].table_id: invalid input syntax for type integer"),
        (r#"[{"table_id":1,"amount":1e30}]"#, "22003", "rows[0].amount: "),
        (r#"[{"table_id":1},{"table_id":1,"player":null}]"#, "23502", "rows[1].player: "),
        (r#"[{"table_id":1,"hand":2},{"table_id":1,"hand":null,"amount":3}]"#, "23502", "rows[1].hand: "),
    ];
    for (rows, code, text) in cases {
        let e = db_error(&mut c, &call(rows));
        assert_eq!(e.code().code(), code, "{rows}: {}", e.message());
        assert!(e.message().starts_with("lease.fenced_boundary_write: "), "{}", e.message());
        assert!(e.message().contains(text), "{rows}: {}", e.message());
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0, "all or nothing");
    // Fence refusals pass through untouched.
    let e = db_error(&mut c, &call(r#"[{"table_id":1}]"#).replace(", 5,", ", 4,"));
    assert_eq!(e.code().code(), "LF001");
    assert_eq!(one_i64(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', 5, '[{"table_id":1}]')"#), 1);
}

#[test]
fn stats_name_databases_and_dropped_ones() {
    let db = TestDb::new("errors_stats");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)").unwrap();
    let name: String = c
        .query_one(
            "SELECT database FROM lease.stats WHERE table_name = 'public.payouts' AND database = current_database()",
            &[],
        )
        .map(|r| r.get(0))
        .unwrap_or_default();
    assert_eq!(name, db.name);
    let dropped = TestDb::new("errors_stats_gone");
    let mut d = dropped.connect();
    d.batch_execute(POKER).unwrap();
    d.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)").unwrap();
    drop(d);
    drop(dropped);
    let rows = one_i64(&mut c, "SELECT count(*) FROM lease.stats WHERE database = '(dropped)'");
    assert!(rows >= 1);
    let oids = one_i64(&mut c, "SELECT count(*) FROM lease.stats WHERE database ~ '^[0-9]+$'");
    assert_eq!(oids, 0, "no bare OIDs");
}

/// What a role without any grant may execute in schema lease: only functions
/// that act as their caller and change nothing of pg_lease's (0.3.0 let any
/// role write or lock an owner row's token through `_set_owner_token` and
/// `_lock_owner_row`, which run as the owner table's owner).
#[test]
fn a_role_without_grants_executes_only_harmless_functions() {
    let db = TestDb::new("errors_public");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let role = format!("nobody_{}", std::process::id());
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN")).unwrap();
    let executable: Vec<String> = c
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')
                AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
              ORDER BY 1",
            &[&role],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let allowed = [
        "lease._boundary_problem(regclass,jsonb,text,text)",
        "lease._bound_token()",
        "lease._check_columns(regclass,text,text[],text)",
        "lease._check_enforced(regclass)",
        "lease._check_label(text,text)",
        "lease._check_not_protected(regclass)",
        "lease._check_ttl(integer)",
        "lease._column_type(regclass,text)",
        "lease._concerned(oid[])",
        "lease._create_trigger(regclass,name,regproc,text,text)",
        "lease._expected_triggers(oid[])",
        "lease._expiry(timestamp with time zone,timestamp with time zone,timestamp with time zone)",
        "lease._fail(text,text,text,text)",
        "lease._fence_problems(oid[])",
        "lease._guard_owner(regclass,text,text[])",
        "lease._install_owner_guards(regclass,text)",
        "lease._is_token_type(oid)",
        "lease._owner_guard_keys(regclass,text[])",
        "lease._install_owner_truncate_guard(regclass)",
        "lease._install_target_triggers(regclass,text)",
        "lease._install_truncate_guard(regclass)",
        "lease._key_equality(oid,oid)",
        "lease._key_identity_problem(oid,oid)",
        // Whether an owner key type's own equality is the one pg_lease uses
        // (a message or NULL).
        "lease._key_type_problem(oid)",
        // Whether an owner table's name can be written in SQL (a message or NULL).
        "lease._name_problem(oid)",
        // Catalog reads: the tables a DDL command reaches, and whether a
        // table is in a partition tree (lease.protected_tables reads it).
        "lease._reached(oid[])",
        "lease._related(oid[])",
        // lease.protected_tables reads them (the wrappers' bodies).
        "lease._expected_triggers_in(oid[],oid[])",
        "lease._fence_problems_in(oid[],oid[])",
        "lease._under(oid,oid[])",
        "lease._owner_key_index(oid,text[],oid[])",
        // protect's check for partitions left detach-pending (raises or nothing).
        "lease._refuse_detach_pending(oid[])",
        // Check that the caller holds EXECUTE on protect/unprotect/judge_replicated and owns the tables.
        "lease._judge_replicated(oid,boolean)",
        "lease._register(oid,text,text[],text,oid,text[],text)",
        "lease._token_floor()",
        "lease._unregister(oid)",
        // Serializes fence changes on an owner table; checks its caller as
        // _register/_unregister do (the drop guard's own role for a DROP).
        "lease._lock_owner_table(oid,oid,text)",
        // unprotect's LOCK TABLE of two tables, with the caller's rights.
        "lease._lock_pair_exclusive(regclass,regclass)",
        // Citus: catalog reads, the layout check and the trigger DDL protect
        // and unprotect run with their caller's rights (a role can only
        // create or drop triggers on tables it owns).
        "lease._check_citus_layout(regclass,text[],regclass,text[])",
        // The worker-side change rule (a hint or NULL); the DROP TABLE guard
        // calls it as the dropping role.
        "lease._citus_change_refused(regclass)",
        "lease._citus_coordinator()",
        "lease._citus_internal()",
        "lease._citus_kind(text)",
        "lease._citus_table(regclass)",
        "lease._node_fence_problems(json)",
        "lease._shard_config(regclass,text,text[],text,regclass,text[],text)",
        "lease._shard_id(oid)",
        "lease._shard_of(oid)",
        "lease._shard_problems(regclass,regclass[],boolean,boolean)",
        // A text as pg_lease shows it (lease.stats' database names).
        "lease._shown(text)",
        "lease._trigger_args(bytea)",
        "lease._trigger_ddl(regclass,text)",
        "lease.bind_token(bigint)",
        "lease.bound_token()",
        "lease.fenced_boundary_write(regclass,bigint,jsonb)",
    ];
    let unexpected: Vec<_> = executable.iter().filter(|f| !allowed.contains(&f.as_str())).collect();
    assert!(unexpected.is_empty(), "executable by a role without grants: {unexpected:?}");
    let mut nobody = db.connect_as(&role);
    let t = one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1");
    expect_error(&mut nobody, "SELECT lease._set_owner_token('tables'::regclass, '{1}', 99)", "42501");
    expect_error(&mut nobody, "SELECT lease._lock_owner_row('tables'::regclass, '{1}')", "42501");
    // No lock on a table it does not own, for any caller it names.
    for by in ["protect", "protect_high_water", "unprotect", "DROP TABLE"] {
        expect_error(
            &mut nobody,
            &format!("SELECT lease._lock_owner_table('payouts'::regclass, 'tables'::regclass, '{by}')"),
            "42501",
        );
    }
    assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1"), t);
    drop(nobody);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

/// fenced_boundary_write's errors as the application role: the documented
/// codes with the element and column, and no CONTEXT with pg_lease's frames.
#[test]
fn fenced_boundary_write_errors_as_the_application_role() {
    let db = TestDb::new("errors_app_boundary");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let role = format!("app_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN; GRANT SELECT, INSERT ON payouts TO {role}; GRANT USAGE ON SEQUENCE payouts_id_seq TO {role}"
    ))
    .unwrap();
    let mut app = db.connect_as(&role);
    let e =
        db_error(&mut app, r#"SELECT lease.fenced_boundary_write('payouts', 5, '[{"table_id":1,"amount":"ten"}]')"#);
    assert_eq!(e.code().code(), "22P02", "{}", e.message());
    assert!(e.message().contains("rows[0].amount"), "{}", e.message());
    let e = db_error(&mut app, r#"SELECT lease.fenced_boundary_write('payouts', 4, '[{"table_id":1}]')"#);
    assert_eq!(e.code().code(), "LF001");
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    let e = db_error(&mut app, r#"SELECT lease.fenced_boundary_write('payouts', NULL, '[{"table_id":1}]')"#);
    assert_eq!(e.code().code(), "LF003");
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    assert_eq!(one_i64(&mut app, r#"SELECT lease.fenced_boundary_write('payouts', 5, '[{"table_id":1}]')"#), 1);
    drop(app);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

/// pg_dump / pg_restore of a database with audit rows: the restored audit
/// table continues after its highest id (its sequence is dumped with it).
#[test]
fn a_restored_audit_table_continues_after_its_highest_id() {
    let src = TestDb::new("errors_dump_src");
    let mut c = src.connect();
    c.batch_execute(
        "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
         SELECT now(), current_database(), 'public.payouts', 'INSERT', 'LF001' FROM generate_series(1, 5)",
    )
    .unwrap();
    let dst = TestDb::new("errors_dump_dst");
    dst.connect().batch_execute("DROP EXTENSION pg_lease; DROP SCHEMA IF EXISTS lease").unwrap();
    let dump = std::process::Command::new(pg_bin("pg_dump"))
        .args(["-h", "127.0.0.1", "-p", &port().to_string(), "-U", "postgres", "-Fc", &src.name])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    let mut restore = std::process::Command::new(pg_bin("pg_restore"))
        .args(["-h", "127.0.0.1", "-p", &port().to_string(), "-U", "postgres", "--single-transaction", "-d", &dst.name])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    restore.stdin.take().unwrap().write_all(&dump.stdout).unwrap();
    assert!(restore.wait().unwrap().success());
    let mut d = dst.connect();
    assert_eq!(one_i64(&mut d, "SELECT count(*) FROM lease.rejected_writes"), 5);
    let id = one_i64(
        &mut d,
        "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
         VALUES (now(), current_database(), 'public.payouts', 'INSERT', 'LF001') RETURNING id",
    );
    assert_eq!(id, 6);
}

/// README (tamper resistance): `DROP EXTENSION pg_lease CASCADE` takes every
/// pg_lease trigger and the protection config with it; a new `CREATE
/// EXTENSION` protects nothing until `lease.protect` runs again.
#[test]
fn drop_extension_cascade_leaves_nothing_protected_until_protect_runs_again() {
    let db = TestDb::new("errors_drop_ext");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute("DROP EXTENSION pg_lease CASCADE; CREATE EXTENSION pg_lease").unwrap();
    let triggers: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
              WHERE t.tgname LIKE 'pg_lease%' AND NOT t.tgisinternal AND c.relnamespace <> 'lease'::regnamespace",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(triggers, 0);
    let protected: i64 = c.query_one("SELECT count(*) FROM lease.protected_tables", &[]).unwrap().get(0);
    assert_eq!(protected, 0);
    // Unfenced now: a stale token is not refused.
    c.batch_execute("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 1)").unwrap();
    c.batch_execute(
        "DELETE FROM payouts WHERE fencing_token = 1; SELECT lease.protect('payouts', '{table_id}', 'fencing_token')",
    )
    .unwrap();
    let e = db_error(&mut c, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 1)");
    assert_eq!(e.code().code(), "LF001");
}

/// pg_lease's own serialization failures (a fence changed after a REPEATABLE
/// READ snapshot: a write to the table, or a DDL command the guard must
/// judge) are `40001` with what happened in DETAIL and, as in every one, the
/// HINT to retry the transaction.
#[test]
fn pg_leases_serialization_failures_hint_a_retry() {
    let db = TestDb::new("errors_40001");
    let mut a = db.connect();
    a.batch_execute(
        "CREATE TABLE own (k int PRIMARY KEY, tok bigint);
         CREATE TABLE pay (k int, tok bigint);
         INSERT INTO own VALUES (1, 5);",
    )
    .unwrap();
    let mut b = db.connect();
    for (sql, detail) in [
        ("INSERT INTO pay VALUES (1, 5)", "lease.protect or lease.unprotect committed since the transaction began"),
        ("CREATE TABLE other (x int)", "must judge a command against the catalog as the command finds it"),
    ] {
        a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
        b.batch_execute("SELECT lease.unprotect('pay')").ok();
        b.batch_execute("SELECT lease.protect('pay', '{k}', 'tok', owner_table => 'own', owner_key_columns => '{k}', owner_token_column => 'tok')")
            .unwrap();
        let e = db_error(&mut a, sql);
        a.batch_execute("ROLLBACK").unwrap();
        assert_eq!(e.code().code(), "40001", "{sql}: {}", e.message());
        assert!(e.detail().unwrap_or("").contains(detail), "{sql}: DETAIL {:?}", e.detail());
        assert_eq!(e.hint(), Some("Retry the transaction."), "{sql}");
    }
}
