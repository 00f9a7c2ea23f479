//! Fifth red-team round (0.5.0). Each test asserts what the README promises,
//! so it fails while the break is open.
//!
//! 1. `DROP SCHEMA ... CASCADE` (or any cascade that drops an owner
//!    partition without naming it) deletes owner rows and their tokens: the
//!    drop guard only refuses a dropped owner partition when the table is an
//!    `original` object of the command (`tb.original` in `lease._guard_drop`),
//!    and skips the trigger check for dropped tables. The owner row can then
//!    be re-inserted with an older token and a stale write commits.
//! 2. `lease._check_label` in a LATIN1 database accepts a C1 control
//!    character (U+0085) and a name of only no-break spaces (U+00A0): the
//!    value is read as UTF-8 (`to_string_lossy`), so LATIN1 bytes >= 0x80
//!    become U+FFFD, which is neither control nor whitespace.

use pg_lease_sessions::*;

fn role(label: &str) -> String {
    format!("atk5_{label}_{}", std::process::id())
}

#[test]
fn dropping_a_schema_holding_an_owner_partition_is_refused() {
    let db = TestDb::new("atk5_schema_cascade");
    let (mig, game) = (role("mig"), role("game"));
    let mut su = db.connect();
    su.batch_execute(&format!(
        "DROP ROLE IF EXISTS {mig}; CREATE ROLE {mig} LOGIN;
         DROP ROLE IF EXISTS {game}; CREATE ROLE {game} LOGIN;
         GRANT CREATE ON SCHEMA public TO {mig};
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO {mig};
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) TO {game};
         CREATE SCHEMA part AUTHORIZATION {mig};"
    ))
    .unwrap();
    let mut m = db.connect_as(&mig);
    m.batch_execute(&format!(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE part.tables_0 PARTITION OF tables FOR VALUES FROM (0) TO (1000);
         CREATE TABLE payouts (table_id int, amount int, fencing_token bigint);
         SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token', 'tables');
         INSERT INTO tables VALUES (7, NULL);
         GRANT SELECT ON tables TO {game};
         GRANT SELECT, INSERT ON payouts TO {game};"
    ))
    .unwrap();
    let mut g = db.connect_as(&game);
    let old = one_i64(&mut g, "SELECT token FROM lease.acquire('table:7', 'host-12', 100000, 'tables', '{7}')");
    let cur = one_i64(&mut g, "SELECT token FROM lease.acquire('table:7', 'host-12', 100000, 'tables', '{7}')");
    assert!(cur > old);
    expect_error(&mut g, &format!("INSERT INTO payouts VALUES (7, 50, {old})"), "LF001");
    // Naming the partition is refused ...
    expect_error(&mut m, "DROP TABLE part.tables_0", "LF004");
    // ... and so must be dropping it through its schema.
    let outcome = try_sql(&mut m, "DROP SCHEMA part CASCADE");
    let tokens = one_i64(&mut su, "SELECT count(*) FROM tables WHERE owner_fencing_token IS NOT NULL");
    if outcome.is_empty() {
        // Show the consequence: the owner row comes back with the old token
        // and the stale writer's payout commits.
        su.batch_execute(&format!(
            "CREATE TABLE tables_0 PARTITION OF tables FOR VALUES FROM (0) TO (1000);
             INSERT INTO tables VALUES (7, {old});"
        ))
        .unwrap();
        let stale = try_sql(&mut g, &format!("INSERT INTO payouts VALUES (7, 50, {old})"));
        panic!("DROP SCHEMA CASCADE dropped owner rows with their tokens (owner rows left with a token: {tokens}); then a payout with the superseded token {old} (current was {cur}): {stale}");
    }
    assert_eq!(outcome, "LF004");
    assert_eq!(tokens, 1);
    drop(m);
    drop(g);
    drop(su);
    drop(db);
    let mut admin = connect_to("postgres", "postgres");
    for r in [&mig, &game] {
        let _ = admin.batch_execute(&format!("DROP OWNED BY {r}; DROP ROLE {r}"));
    }
}

#[test]
fn latin1_labels_follow_the_same_rule() {
    let db = TestDb::with_options("atk5_latin1", "ENCODING 'LATIN1' LOCALE 'C' TEMPLATE template0");
    let mut c = db.connect();
    c.batch_execute("SET client_encoding = 'UTF8'").unwrap();
    // U+0085 (NEXT LINE) is a control character; in a UTF8 database it is refused.
    assert_eq!(try_sql(&mut c, "SELECT lease._check_label('name', E'a\\u0085b')"), "22023");
    // Only no-break spaces: blank.
    assert_eq!(try_sql(&mut c, "SELECT lease._check_label('owner', E'\\u00a0\\u00a0')"), "22023");
}

/// The drop guard's rule for owner partitions (see `lease._guard_drop`): a
/// schema holding a whole fenced application (fenced table, partitioned owner
/// table, its partitions) can still be dropped in one command.
#[test]
fn dropping_a_whole_fenced_schema_with_its_owner_tree_is_allowed() {
    let db = TestDb::new("atk5_whole_schema");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE SCHEMA app;
         CREATE TABLE app.tables (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE app.tables_0 PARTITION OF app.tables FOR VALUES FROM (0) TO (1000);
         CREATE TABLE app.payouts (table_id int, fencing_token bigint);
         SELECT lease.protect('app.payouts', '{table_id}', 'fencing_token', 'app.tables');
         INSERT INTO app.tables VALUES (1, 5);",
    )
    .unwrap();
    c.batch_execute("DROP SCHEMA app CASCADE").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0);
}

#[test]
fn public_helpers_answer_bad_input_clearly() {
    let db = TestDb::new("atk5_helpers");
    let mut c = db.connect();
    let problem: Option<String> = c.query_one("SELECT lease._key_identity_problem(0, 0)", &[]).unwrap().get(0);
    assert!(problem.is_some_and(|p| p.contains("does not exist")));
    assert_eq!(try_sql(&mut c, "SELECT lease._check_label('name', E'a\\u2028b')"), "22023");
    let e = c.batch_execute("SELECT lease._check_label(repeat('w', 100000), NULL)").unwrap_err();
    assert!(e.as_db_error().unwrap().message().len() < 200);
}

/// A trigger that already bears one of pg_lease's names is taken over by
/// `lease.protect` when it runs pg_lease's function, made whole (every event,
/// no WHEN clause, ENABLE ALWAYS); protect never ends with a fence that is
/// not enforced.
#[test]
fn protect_never_keeps_a_neutered_trigger_of_its_name() {
    let db = TestDb::new("atk5_neutered");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (table_id int, fencing_token bigint);
         CREATE TRIGGER pg_lease_owner_guard BEFORE INSERT ON tables FOR EACH ROW WHEN (false)
             EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
         CREATE TRIGGER pg_lease_fence AFTER INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger();
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');",
    )
    .unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
    c.batch_execute("INSERT INTO tables VALUES (1, 5)").unwrap();
    expect_error(&mut c, "UPDATE tables SET owner_fencing_token = 1", "LF004");
    expect_error(&mut c, "INSERT INTO payouts VALUES (1, 4)", "LF001");
    // A neutered guard with other key columns is replaced too: the guard
    // then watches the key columns of every table fenced against the owner.
    let db = TestDb::new("atk5_neutered_keys");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE tables (id int PRIMARY KEY, code int UNIQUE, owner_fencing_token bigint);
         CREATE TABLE payouts (table_code int, fencing_token bigint);
         CREATE TRIGGER pg_lease_owner_guard BEFORE INSERT ON tables FOR EACH ROW WHEN (false)
             EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
         SELECT lease.protect('payouts', '{table_code}', 'fencing_token', 'tables', '{code}');
         INSERT INTO tables VALUES (1, 10, 5);",
    )
    .unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
    expect_error(&mut c, "UPDATE tables SET code = 11 WHERE id = 1", "LF004");
    expect_error(&mut c, "UPDATE tables SET owner_fencing_token = 4 WHERE id = 1", "LF004");
}
