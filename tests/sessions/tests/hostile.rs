//! Bad input and hostile clients: extreme tokens, huge or malformed input,
//! foreign tables, and an application role that tries to lower tokens or to
//! hijack pg_lease's functions with look-alike objects.

use pg_lease_sessions::*;

#[test]
fn extreme_tokens_get_clear_answers() {
    let db = TestDb::new("hostile_tokens");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let max = i64::MAX;
    assert!(expect_error(&mut c, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {max})"), "LF002")
        .starts_with("FencingTokenAhead"));
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, -1)", "LF001");
    expect_error(
        &mut c,
        &format!("SELECT lease.fenced_boundary_write('payouts', {max}, '[{{\"table_id\":1}}]')"),
        "LF002",
    );
    expect_error(&mut c, "SELECT lease.bind_token(-5)", "22023");
    c.batch_execute(&format!("BEGIN; SELECT lease.bind_token({max}); COMMIT")).unwrap();
    // An owner token at the very top cannot be exceeded: acquire says so and changes nothing.
    c.batch_execute(&format!("UPDATE tables SET owner_fencing_token = {max} WHERE id = 2")).unwrap();
    expect_error(&mut c, "SELECT lease.acquire('table:2', 'host-a', 10000, 'tables', '{2}')", "22003");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases"), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0);
}

#[test]
fn huge_and_odd_input_is_handled() {
    let db = TestDb::new("hostile_input");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    // 100,000 rows in one call: all written, one resource checked once.
    let n = one_i64(
        &mut c,
        "SELECT lease.fenced_boundary_write('payouts', 5,
                (SELECT jsonb_agg(jsonb_build_object('table_id', 1, 'hand', g, 'amount', g)) FROM generate_series(1, 100000) g))",
    );
    assert_eq!(n, 100_000);
    // A huge batch with one bad row writes nothing.
    expect_error(
        &mut c,
        "SELECT lease.fenced_boundary_write('payouts', 5,
                (SELECT jsonb_agg(jsonb_build_object('table_id', CASE WHEN g = 99999 THEN 2 ELSE 1 END, 'hand', g))
                   FROM generate_series(1, 100000) g) || '[{\"table_id\": 1, \"hand\": \"x\"}]')",
        "22P02",
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 100_000);
    expect_error(&mut c, "SELECT lease.fenced_boundary_write('payouts', 5, '[{\"table_id\": 1,]')", "22P02");
    expect_error(&mut c, "SELECT lease.fenced_boundary_write('payouts', 5, '[[1]]')", "22023");
    c.batch_execute(
        "CREATE EXTENSION file_fdw; CREATE SERVER files FOREIGN DATA WRAPPER file_fdw;
         CREATE FOREIGN TABLE ft (table_id int, t bigint) SERVER files OPTIONS (filename '/dev/null');
         CREATE MATERIALIZED VIEW mv AS SELECT 1 AS table_id, 1::bigint AS t;",
    )
    .unwrap();
    expect_error(&mut c, "SELECT lease.protect('ft', '{table_id}', 't')", "42809");
    expect_error(&mut c, "SELECT lease.protect('mv', '{table_id}', 't')", "42809");
    expect_error(&mut c, "SELECT lease.protect('no_such_table', '{table_id}', 't')", "42P01");
}

#[test]
fn an_application_role_cannot_lower_tokens_or_hijack_pg_lease() {
    let db = TestDb::new("hostile_role");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(
        "CREATE TABLE ledger (p int, token bigint); SELECT lease.protect_high_water('ledger', '{p}', 'token')",
    )
    .unwrap();
    let role = format!("mallory_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT INSERT, UPDATE, DELETE ON payouts, ledger TO {role};
         GRANT SELECT, UPDATE ON tables TO {role};
         GRANT USAGE ON SEQUENCE payouts_id_seq TO {role};
         GRANT CREATE ON SCHEMA public TO {role};
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) TO {role};"
    ))
    .unwrap();
    let mut m = db.connect_as(&role);

    // A role that may update owner rows still cannot lower or clear a token.
    expect_error(&mut m, "UPDATE tables SET owner_fencing_token = 1 WHERE id = 1", "LF004");
    expect_error(&mut m, "UPDATE tables SET owner_fencing_token = NULL WHERE id = 1", "LF004");
    expect_error(&mut m, "TRUNCATE tables", "42501");

    // Look-alikes ahead of pg_catalog on the search_path, in public and pg_temp.
    m.batch_execute(
        "CREATE FUNCTION public.hijacked(oid, oid) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.hijacked);
         CREATE FUNCTION public.int8larger(bigint, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
         CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT 'epoch'::timestamptz$$;
         CREATE TEMP TABLE protected (relid oid);
         SET search_path = public, pg_temp, pg_catalog;",
    )
    .unwrap();
    expect_error(&mut m, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    m.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)").unwrap();
    m.batch_execute("INSERT INTO ledger VALUES (1, 7)").unwrap();
    expect_error(&mut m, "INSERT INTO ledger VALUES (1, 6)", "LF001");
    let t1: i64 = m.query_one("SELECT token FROM lease.acquire('t', 'mallory', 60000)", &[]).unwrap().get(0);
    expect_error(&mut m, "SELECT lease.acquire('t', 'other', 60000)", "LF005");
    let t2: i64 = m.query_one("SELECT token FROM lease.acquire('t', 'mallory', 60000)", &[]).unwrap().get(0);
    assert!(t2 > t1);

    // Nothing of pg_lease's own can be written or switched off.
    for sql in [
        "UPDATE lease.lease_state SET token = 0",
        "UPDATE lease.high_water SET token = 0",
        "DELETE FROM lease.protected",
        "INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate) VALUES (now(), 'x', 'y', 'z', 'LF001')",
        "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence",
        "DROP TRIGGER pg_lease_fence ON payouts",
        "SELECT lease.unprotect('payouts')",
        "SELECT lease.release_all('mallory')",
    ] {
        expect_error(&mut m, sql, "42501");
    }
    drop(m);

    // Every SECURITY DEFINER function pins its search_path.
    let unpinned = one_i64(
        &mut c,
        "SELECT count(*) FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
           JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pg_lease'
          WHERE p.prosecdef AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)",
    );
    assert_eq!(unpinned, 0);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}
