//! One test per class of stale-commit hole found by attacking 0.2.0: resource
//! identity, catalog drift, privileges, pooled sessions. Each would have let a
//! write with a stale token commit (or a resource's token go down).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

fn poker(label: &str) -> (TestDb, Client) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    (db, c)
}

// ---- 1. Resource identity is the key type's own identity -----------------

#[test]
fn owner_rows_keep_their_key_and_their_token() {
    let (db, mut c) = poker("id_owner_rows");
    let role = format!("rowmover_{}", std::process::id());
    c.batch_execute(&format!(
        "UPDATE tables SET owner_fencing_token = 100 WHERE id = 1;
         UPDATE tables SET owner_fencing_token = 50 WHERE id = 2;
         CREATE ROLE {role} LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON tables TO {role};
         GRANT INSERT ON payouts TO {role}; GRANT USAGE ON SEQUENCE payouts_id_seq TO {role};"
    ))
    .unwrap();
    let mut m = db.connect_as(&role);
    // The swap of 0.2.0: resource 1 would end up with resource 2's lower token.
    expect_error(
        &mut m,
        "BEGIN; UPDATE tables SET id = -1 WHERE id = 1; UPDATE tables SET id = 1 WHERE id = 2;
         UPDATE tables SET id = 2 WHERE id = -1; COMMIT;",
        "LF004",
    );
    m.batch_execute("ROLLBACK").unwrap();
    // DELETE + re-INSERT with a lower token.
    expect_error(&mut m, "DELETE FROM tables WHERE id = 1", "LF004");
    expect_error(&mut m, "BEGIN; DELETE FROM tables WHERE id = 1; INSERT INTO tables VALUES (1, 1); COMMIT", "LF004");
    m.batch_execute("ROLLBACK").unwrap();
    // An owner token beyond what lease.acquire could raise would poison the resource.
    expect_error(&mut m, "UPDATE tables SET owner_fencing_token = 9223372036854775807 WHERE id = 1", "22003");
    expect_error(&mut m, "INSERT INTO tables VALUES (3, 9223372036854775000)", "22003");
    // Equal keys are not a move; a row without a token may be re-keyed or deleted.
    m.batch_execute("UPDATE tables SET id = id").unwrap();
    m.batch_execute(
        "INSERT INTO tables VALUES (3, NULL); UPDATE tables SET id = 4 WHERE id = 3; DELETE FROM tables WHERE id = 4",
    )
    .unwrap();
    expect_error(&mut m, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 50)", "LF001");
    m.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 100)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1"), 100);
    drop(m);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn partition_routing_cannot_move_an_owner_row() {
    let db = TestDb::new("id_owner_partitions");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE own (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE own_lo PARTITION OF own FOR VALUES FROM (0) TO (100);
         CREATE TABLE own_hi PARTITION OF own FOR VALUES FROM (100) TO (200);
         CREATE TABLE pay (t int, token bigint);
         SELECT lease.protect('pay', '{t}', 'token', 'own');
         INSERT INTO own VALUES (1, 10), (150, 3);",
    )
    .unwrap();
    expect_error(&mut c, "UPDATE own SET id = 101 WHERE id = 1", "LF004");
    // Each partition of the owner table refuses TRUNCATE, and cannot leave.
    expect_error(&mut c, "TRUNCATE own_lo", "LF004");
    expect_error(&mut c, "ALTER TABLE own DETACH PARTITION own_hi", "LF004");
    expect_error(&mut c, "DROP TABLE own_hi", "LF004");
    // A new owner partition gets its guards.
    c.batch_execute(
        "CREATE TABLE own_top PARTITION OF own FOR VALUES FROM (200) TO (300); INSERT INTO own VALUES (250, 4)",
    )
    .unwrap();
    expect_error(&mut c, "TRUNCATE own_top", "LF004");
    expect_error(&mut c, "DELETE FROM own WHERE id = 250", "LF004");
    expect_error(&mut c, "INSERT INTO pay VALUES (250, 3)", "LF001");
    c.batch_execute("INSERT INTO pay VALUES (250, 4), (1, 10)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
}

#[test]
fn high_water_marks_follow_equality_not_text() {
    let db = TestDb::new("id_high_water");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE n (k numeric, token bigint); SELECT lease.protect_high_water('n', '{k}', 'token');
         CREATE TABLE ts (k timestamptz, token bigint); SELECT lease.protect_high_water('ts', '{k}', 'token');
         CREATE TABLE d (k date, token bigint); SELECT lease.protect_high_water('d', '{k}', 'token');
         CREATE TABLE b (k bytea, token bigint); SELECT lease.protect_high_water('b', '{k}', 'token');
         CREATE TABLE two (a int, s text, token bigint); SELECT lease.protect_high_water('two', '{a,s}', 'token');
         SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET bytea_output = 'hex';
         INSERT INTO n VALUES (1.0, 10); INSERT INTO ts VALUES ('2026-05-01 12:00:00+00', 10);
         INSERT INTO d VALUES ('2026-05-01', 10); INSERT INTO b VALUES ('\\x01ff', 10);
         INSERT INTO two VALUES (1, 'x', 10);",
    )
    .unwrap();
    c.batch_execute("SET TimeZone = 'America/New_York'; SET DateStyle = 'SQL, DMY'; SET bytea_output = 'escape'")
        .unwrap();
    // The same resource, written another way: a lower token is stale.
    for sql in [
        "INSERT INTO n VALUES (1.000, 9)",
        "INSERT INTO n VALUES (1, 9)",
        "INSERT INTO ts VALUES ('2026-05-01 08:00:00-04', 9)",
        "INSERT INTO d VALUES ('01/05/2026', 9)",
        "INSERT INTO b VALUES ('\\x01FF'::bytea, 9)",
        "INSERT INTO two VALUES (1, 'x', 9)",
    ] {
        expect_error(&mut c, sql, "LF001");
    }
    // Within one transaction too: the cache agrees with the marks.
    expect_error(&mut c, "BEGIN; INSERT INTO n VALUES (1.00, 12); INSERT INTO n VALUES (1.0, 11); COMMIT", "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    // Different values stay different resources.
    c.batch_execute("INSERT INTO n VALUES (1.5, 1); INSERT INTO two VALUES (1, 'X', 1), (2, 'x', 1)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.high_water"), 8);
    // Key types whose equality has no exact canonical form are refused.
    c.batch_execute(
        "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE f (k float8, token bigint); CREATE TABLE t (k text COLLATE ci, token bigint);",
    )
    .unwrap();
    expect_error(&mut c, "SELECT lease.protect_high_water('f', '{k}', 'token')", "0A000");
    expect_error(&mut c, "SELECT lease.protect_high_water('t', '{k}', 'token')", "0A000");
}

#[test]
fn tables_fenced_through_different_owner_keys_do_not_share_verdicts() {
    let db = TestDb::new("id_cache_scope");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE own (id int PRIMARY KEY, alt int UNIQUE, owner_fencing_token bigint);
         INSERT INTO own VALUES (1, 2, 10), (2, 1, 20);
         CREATE TABLE by_id (k int, token bigint); SELECT lease.protect('by_id', '{k}', 'token', 'own', '{id}');
         CREATE TABLE by_alt (k int, token bigint); SELECT lease.protect('by_alt', '{k}', 'token', 'own', '{alt}');",
    )
    .unwrap();
    // by_id k=1 is row id 1 (token 10); by_alt k=1 is row id 2 (token 20).
    expect_error(&mut c, "BEGIN; INSERT INTO by_id VALUES (1, 10); INSERT INTO by_alt VALUES (1, 10); COMMIT", "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    expect_error(&mut c, "BEGIN; INSERT INTO by_alt VALUES (1, 20); INSERT INTO by_id VALUES (1, 20); COMMIT", "LF002");
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute("BEGIN; INSERT INTO by_id VALUES (1, 10); INSERT INTO by_alt VALUES (1, 20); COMMIT").unwrap();
}

// ---- 2. Catalog drift is followed -----------------------------------------

#[test]
fn a_warm_session_is_not_fooled_by_a_renamed_schema_and_a_look_alike() {
    let db = TestDb::new("drift_schema");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE SCHEMA g;
         CREATE TABLE g.own (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE g.pay2 (t int, token bigint);
         SELECT lease.protect('g.pay2', '{t}', 'token', 'g.own');
         INSERT INTO g.own VALUES (1, 10);",
    )
    .unwrap();
    let mut warm = db.connect();
    warm.batch_execute("INSERT INTO g.pay2 VALUES (1, 10)").unwrap();
    c.batch_execute(
        "ALTER SCHEMA g RENAME TO g_old;
         CREATE SCHEMA g;
         CREATE TABLE g.own (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO g.own VALUES (1, 3);
         ANALYZE g_old.own;",
    )
    .unwrap();
    // Judged against the real owner row (token 10), never the look-alike (3).
    let r = warm.batch_execute("INSERT INTO g_old.pay2 VALUES (1, 3)");
    let code = sqlstate(&r);
    assert!(code == "LF001" || code == "40001", "stale write after a schema rename: {code:?}");
    warm.batch_execute("INSERT INTO g_old.pay2 VALUES (1, 10)").unwrap();
    expect_error(&mut warm, "INSERT INTO g_old.pay2 VALUES (1, 3)", "LF001");
}

#[test]
fn ddl_that_would_change_what_a_resource_is_is_refused() {
    let (_db, mut c) = poker("drift_ddl");
    c.batch_execute("CREATE TABLE gen (t int, g int GENERATED ALWAYS AS (t + 1) STORED, token bigint)").unwrap();
    expect_error(&mut c, "SELECT lease.protect('gen', '{g}', 'token')", "42611");
    c.batch_execute("CREATE TABLE narrow (t int, token int)").unwrap();
    expect_error(&mut c, "SELECT lease.protect('narrow', '{t}', 'token')", "42804");
    for sql in [
        // Through every door that renames or retypes a fenced column.
        "ALTER VIEW payouts RENAME COLUMN table_id TO t",
        "ALTER TABLE payouts RENAME COLUMN fencing_token TO t",
        "ALTER TABLE payouts ALTER COLUMN table_id TYPE bigint",
        "ALTER TABLE payouts ALTER COLUMN table_id TYPE text",
        "ALTER TABLE payouts ALTER COLUMN fencing_token TYPE numeric",
        "ALTER TABLE tables ALTER COLUMN id TYPE bigint",
        "ALTER VIEW tables RENAME COLUMN owner_fencing_token TO x",
        "CREATE TABLE child () INHERITS (payouts)",
        "CREATE TABLE owner_child () INHERITS (tables)",
        "ALTER TABLE tables DROP CONSTRAINT tables_pkey",
        // Narrowing one of pg_lease's triggers in place.
        "CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON payouts FOR EACH ROW
             WHEN (false) EXECUTE FUNCTION lease.fence_trigger()",
        "CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OF amount OR DELETE ON payouts FOR EACH ROW
             EXECUTE FUNCTION lease.fence_trigger()",
        "CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger()",
        "CREATE OR REPLACE TRIGGER pg_lease_owner_guard BEFORE INSERT OR UPDATE OR DELETE ON tables FOR EACH ROW
             EXECUTE FUNCTION lease.owner_guard('owner_fencing_token')",
    ] {
        expect_error(&mut c, sql, "LF008");
    }
    // Another unique index on the owner key may take over from the primary key...
    c.batch_execute("CREATE UNIQUE INDEX tables_id_uq ON tables (id); ALTER TABLE tables DROP CONSTRAINT tables_pkey")
        .unwrap();
    // ...but the last one cannot go.
    expect_error(&mut c, "DROP INDEX tables_id_uq", "LF008");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
}

#[test]
fn no_trigger_can_change_a_row_after_the_fence_judged_it() {
    let (_db, mut c) = poker("drift_trigger_order");
    c.batch_execute(
        "CREATE FUNCTION move_row() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.table_id := 2; RETURN NEW; END $$;
         CREATE FUNCTION lower_token() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.owner_fencing_token := 1; RETURN NEW; END $$;",
    )
    .unwrap();
    // Named to run after pg_lease_fence / pg_lease_owner_guard: refused.
    expect_error(
        &mut c,
        "CREATE TRIGGER zz_move BEFORE INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION move_row()",
        "LF008",
    );
    expect_error(
        &mut c,
        "CREATE TRIGGER zz_lower BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION lower_token()",
        "LF008",
    );
    // Renaming one into that place is refused too.
    c.batch_execute("CREATE TRIGGER a_move BEFORE INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION move_row()").unwrap();
    expect_error(&mut c, "ALTER TRIGGER a_move ON payouts RENAME TO zz_move", "LF008");
    // Before the fence, it is harmless: the fence judges the row it changed.
    c.batch_execute("UPDATE tables SET owner_fencing_token = 9 WHERE id = 2").unwrap();
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)", "LF001");
    c.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 9)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts WHERE table_id = 2"), 1);
    // AFTER triggers and statement triggers cannot change the row: allowed.
    c.batch_execute("CREATE TRIGGER zz_after AFTER INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION move_row()")
        .unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
}

#[test]
fn attach_and_detach_keep_the_fence_whole() {
    let db = TestDb::new("drift_partitions");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (1, 5), (2, 7);
         CREATE TABLE pay (t int, token bigint) PARTITION BY LIST (t);
         CREATE TABLE pay1 PARTITION OF pay FOR VALUES IN (1);
         SELECT lease.protect('pay', '{t}', 'token');
         CREATE TABLE stale (t int, token bigint); INSERT INTO stale VALUES (2, 6);
         CREATE TABLE fresh (t int, token bigint); INSERT INTO fresh VALUES (2, 7);",
    )
    .unwrap();
    expect_error(&mut c, "ALTER TABLE pay ATTACH PARTITION stale FOR VALUES IN (2)", "LF008");
    c.batch_execute("ALTER TABLE pay ATTACH PARTITION fresh FOR VALUES IN (2)").unwrap();
    expect_error(&mut c, "TRUNCATE fresh", "LF008");
    expect_error(&mut c, "INSERT INTO pay VALUES (2, 6)", "LF001");
    c.batch_execute("ALTER TABLE pay DETACH PARTITION fresh").unwrap();
    // Detached: no longer fenced, so no guard is left behind on it.
    c.batch_execute("INSERT INTO fresh VALUES (2, 1); TRUNCATE fresh").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'fresh'::regclass"), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
}

// ---- 3. Privilege boundaries ----------------------------------------------

#[test]
fn only_granted_owners_fence_and_guards_run_only_where_they_guard() {
    let (db, mut c) = poker("priv_boundaries");
    let pid = std::process::id();
    let (app, migrator) = (format!("app_{pid}"), format!("migrator_{pid}"));
    c.batch_execute(&format!(
        "CREATE ROLE {app} LOGIN; CREATE ROLE {migrator} LOGIN;
         GRANT CREATE ON SCHEMA public TO {app}, {migrator};
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
             lease.unprotect(regclass) TO {migrator};
         GRANT INSERT ON payouts TO {app}; GRANT USAGE ON SEQUENCE payouts_id_seq TO {app};"
    ))
    .unwrap();
    let mut a = db.connect_as(&app);
    let mut m = db.connect_as(&migrator);
    // Nobody writes lease.protected directly.
    for sql in [
        "INSERT INTO lease.protected (relid, mode, key_columns) VALUES ('payouts', 'high_water', '{id}')",
        "DELETE FROM lease.protected",
        "UPDATE lease.protected SET owner_table = NULL",
    ] {
        expect_error(&mut m, sql, "42501");
    }
    // The migrator fences only tables it owns, against owner tables it owns.
    m.batch_execute("CREATE TABLE mine (t int, token bigint); CREATE TABLE my_owner (id int PRIMARY KEY, owner_fencing_token bigint)")
        .unwrap();
    expect_error(&mut m, "SELECT lease.protect('mine', '{t}', 'token', 'public.tables')", "42501");
    expect_error(&mut m, "SELECT lease.unprotect('payouts')", "42501");
    m.batch_execute("SELECT lease.protect('mine', '{t}', 'token', 'my_owner')").unwrap();
    // An application role that owns a fenced table still cannot unfence it.
    c.batch_execute(&format!("ALTER TABLE mine OWNER TO {app}")).unwrap();
    expect_error(&mut a, "SELECT lease.unprotect('mine')", "42501");
    expect_error(&mut a, "SELECT lease._unregister('mine'::regclass)", "42501");
    expect_error(&mut a, "ALTER TABLE mine DISABLE TRIGGER pg_lease_fence", "LF008");
    // Internal helpers are not for PUBLIC; guards refuse foreign tables, unaudited.
    expect_error(&mut a, "SELECT lease._raise('StaleOwnerBoundaryWrite', 'x', 'y')", "42501");
    a.batch_execute(
        "CREATE TEMP TABLE forge (id int, owner_fencing_token bigint);
         CREATE TRIGGER g BEFORE UPDATE ON forge FOR EACH ROW EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
         CREATE TRIGGER t BEFORE TRUNCATE ON forge FOR EACH STATEMENT EXECUTE FUNCTION lease.truncate_guard('owner');
         CREATE TRIGGER f BEFORE INSERT ON forge FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger();",
    )
    .unwrap();
    expect_error(&mut a, "INSERT INTO forge VALUES (1, 5)", "LF008");
    a.batch_execute("DROP TRIGGER f ON forge; INSERT INTO forge VALUES (1, 5)").unwrap();
    expect_error(&mut a, "UPDATE forge SET owner_fencing_token = 1", "55000");
    expect_error(&mut a, "TRUNCATE forge", "55000");
    // The audit queue is drained in order: once a later, real refusal is
    // recorded, anything forged before it would be too.
    a.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (1, 1)").unwrap_err();
    let mut audit = db.connect();
    let recorded = |audit: &mut Client, table: &str| -> i64 {
        audit
            .query_one(
                "SELECT count(*) FROM lease.rejected_writes WHERE database = $1 AND target_table LIKE $2",
                &[&db.name, &format!("%{table}")],
            )
            .unwrap()
            .get(0)
    };
    let start = std::time::Instant::now();
    while recorded(&mut audit, "payouts") == 0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "the control refusal was never recorded");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(recorded(&mut audit, "forge"), 0, "no audit record forged through a guard");
    drop((a, m));
    c.batch_execute(&format!(
        "DROP TABLE mine, my_owner; DROP OWNED BY {app}, {migrator}; DROP ROLE {app}; DROP ROLE {migrator}"
    ))
    .unwrap();
}

// ---- 4. No token outlives its transaction ----------------------------------

#[test]
fn a_token_set_for_the_session_binds_nothing_in_the_next_transaction() {
    let (db, mut c) = poker("tx_token");
    c.batch_execute("CREATE TABLE bound (table_id int, amount int); SELECT lease.protect('bound', '{table_id}')")
        .unwrap();
    c.batch_execute("SET pg_lease.token = '5'").unwrap();
    expect_error(&mut c, "INSERT INTO bound VALUES (1, 1)", "LF003");
    assert_eq!(c.query_one("SELECT lease.bound_token()", &[]).unwrap().get::<_, Option<i64>>(0), None);
    // Set inside the transaction: binds that transaction only.
    c.batch_execute("BEGIN; SET pg_lease.token = '5'; INSERT INTO bound VALUES (1, 2); COMMIT").unwrap();
    expect_error(&mut c, "INSERT INTO bound VALUES (1, 3)", "LF003");
    // A savepoint rolled back does not bring a stale session value back.
    c.batch_execute("SET pg_lease.token = '5'").unwrap();
    expect_error(
        &mut c,
        "BEGIN; SAVEPOINT a; SET LOCAL pg_lease.token = '5'; ROLLBACK TO a; INSERT INTO bound VALUES (1, 4); COMMIT",
        "LF003",
    );
    c.batch_execute("ROLLBACK").unwrap();
    // fenced_boundary_write restores only what this transaction bound.
    expect_error(
        &mut c,
        "BEGIN; SELECT lease.fenced_boundary_write('bound', 5, '[{\"table_id\": 1}]'); INSERT INTO bound VALUES (1, 5); COMMIT",
        "LF003",
    );
    c.batch_execute("ROLLBACK").unwrap();
    // Per role, per database, per connection: refused where it is set.
    expect_error(&mut c, &format!("ALTER DATABASE {} SET pg_lease.token = '5'", db.name), "22023");
    expect_error(&mut c, "ALTER ROLE CURRENT_USER SET pg_lease.token = '5'", "22023");
    let r = postgres::Config::new()
        .host("127.0.0.1")
        .port(port())
        .user("postgres")
        .dbname(&db.name)
        .options("-c pg_lease.token=5")
        .connect(postgres::NoTls);
    assert!(r.is_err(), "a connection carrying pg_lease.token must be refused");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bound"), 1);
}

#[test]
fn behind_a_transaction_pooler_every_forgetful_client_gets_lf003() {
    let (db, mut c) = poker("tx_pooler");
    c.batch_execute("CREATE TABLE bound (table_id int, amount int); SELECT lease.protect('bound', '{table_id}')")
        .unwrap();
    // A port of its own, moved with the suite's other servers (PG_LEASE_PORT_OFFSET).
    let bouncer = Bouncer::start(54460 + port_offset(), 2);
    // The stale process binds its token for its session, not its transaction...
    let mut stale = bouncer.connect(&db.name);
    stale.batch_execute("SET pg_lease.token = '5'").unwrap();
    // ...and the value stays on the server connection it used. Clients that
    // never bound a token now share those two server connections.
    let mut forgetful: Vec<Client> = (0..6).map(|_| bouncer.connect(&db.name)).collect();
    let mut leaked_seen = 0;
    for round in 0..20 {
        for (i, client) in forgetful.iter_mut().enumerate() {
            // Simple protocol only: a transaction pooler cannot keep a named
            // prepared statement on one server connection.
            let leaked = client
                .simple_query("SELECT current_setting('pg_lease.token')")
                .unwrap()
                .into_iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .unwrap_or_default();
            if leaked == "5" {
                leaked_seen += 1;
            }
            let r = client.batch_execute(&format!("INSERT INTO bound VALUES (1, {})", round * 10 + i));
            assert_eq!(sqlstate(&r), "LF003", "client {i} in round {round} wrote without binding a token");
        }
        stale.batch_execute("SET pg_lease.token = '5'").unwrap();
    }
    assert!(leaked_seen > 0, "the session-level value never reached another client: the test proves nothing");
    // A client that binds per transaction works through the same pooler.
    let mut good = bouncer.connect(&db.name);
    good.batch_execute("BEGIN; SELECT lease.bind_token(5); INSERT INTO bound VALUES (1, 999); COMMIT").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bound"), 1);
}

/// Through a real PgBouncer in transaction mode, eight clients on two server
/// connections: leases, heartbeats and fenced writes work as on a direct
/// connection, tokens bound per transaction never reach another client, and
/// LF errors arrive with SQLSTATE, DETAIL and HINT (README, Connection poolers).
#[test]
fn leases_fenced_writes_and_error_fields_through_a_transaction_pooler() {
    let (db, mut c) = poker("tx_pooler_leases");
    c.batch_execute("CREATE TABLE bound (table_id int, amount int); SELECT lease.protect('bound', '{table_id}')")
        .unwrap();
    c.batch_execute("INSERT INTO tables VALUES (3, NULL), (4, NULL), (5, NULL), (6, NULL), (7, NULL), (8, NULL)")
        .unwrap();
    let bouncer = Bouncer::start(54461 + port_offset(), 2);
    let mut hosts: Vec<Client> = (0..8).map(|_| bouncer.connect(&db.name)).collect();
    let one = |c: &mut Client, sql: &str| -> String {
        c.simple_query(sql)
            .unwrap()
            .into_iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap_or_default()
    };
    // Each host takes its own table (ids 1..8), writes with its token, heartbeats.
    let mut tokens = Vec::new();
    for (i, h) in hosts.iter_mut().enumerate() {
        let id = i + 1;
        let t: i64 =
            one(h, &format!("SELECT token FROM lease.acquire('table:{id}', 'host-{id}', 60000, 'tables', '{{{id}}}')"))
                .parse()
                .unwrap();
        tokens.push(t);
    }
    for round in 0..3 {
        for (i, h) in hosts.iter_mut().enumerate() {
            let (id, t) = (i + 1, tokens[i]);
            h.batch_execute(&format!(
                "SELECT lease.fenced_boundary_write('payouts', {t}, '[{{\"table_id\": {id}, \"hand\": {round}}}]')"
            ))
            .unwrap();
            // Bound for one transaction: the next transaction of any client
            // on that server connection has no token.
            h.batch_execute(&format!(
                "BEGIN; SELECT lease.bind_token({t}); INSERT INTO bound VALUES ({id}, {round}); COMMIT"
            ))
            .unwrap();
            assert_eq!(sqlstate(&h.batch_execute(&format!("INSERT INTO bound VALUES ({id}, -1)"))), "LF003");
            assert_eq!(one(h, &format!("SELECT count(*) FROM lease.heartbeat('host-{id}', 60000)")), "0");
        }
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 24);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bound"), 24);
    // Error fields pass through the pooler untouched.
    let e = hosts[0].batch_execute("SELECT lease.acquire('table:2', 'host-1', 1000)").unwrap_err();
    let db_err = e.as_db_error().unwrap();
    assert_eq!(db_err.code().code(), "LF005");
    assert!(db_err.detail().unwrap().contains("holder host-2"), "{:?}", db_err.detail());
    assert!(db_err.hint().unwrap().contains("try_acquire"), "{:?}", db_err.hint());
    let stale = tokens[2] - 1;
    let e = hosts[5]
        .batch_execute(&format!("INSERT INTO payouts (table_id, fencing_token) VALUES (3, {stale})"))
        .unwrap_err();
    let db_err = e.as_db_error().unwrap();
    assert_eq!(db_err.code().code(), "LF001");
    assert!(db_err.detail().unwrap().contains(&format!("presented token {stale}")));
    assert_eq!(db_err.table(), Some("payouts"));
    // Shutdown through the pooler.
    for (i, h) in hosts.iter_mut().enumerate() {
        assert_eq!(one(h, &format!("SELECT lease.release_all('host-{}')", i + 1)), "1");
    }
}

/// An owner table shared by tables fenced through different owner key
/// columns: its guard watches every one of them (a token row may move under
/// none), shrinks back when one table is unprotected, and the fences stay
/// enforced throughout.
#[test]
fn an_owner_guard_watches_the_key_columns_of_every_fenced_table() {
    let db = TestDb::new("guard_key_union");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE own (id int PRIMARY KEY, alt int UNIQUE, owner_fencing_token bigint);
         INSERT INTO own VALUES (1, 2, 10), (2, 1, 20);
         CREATE TABLE by_id (k int, token bigint); SELECT lease.protect('by_id', '{k}', 'token', 'own', '{id}');
         CREATE TABLE by_alt (k int, token bigint); SELECT lease.protect('by_alt', '{k}', 'token', 'own', '{alt}');",
    )
    .unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 2);
    // Swapping alt values would hand row 2's token 20 to alt 2 and row 1's 10 to alt 1.
    expect_error(&mut c, "UPDATE own SET alt = alt + 10", "LF004");
    expect_error(&mut c, "UPDATE own SET id = id + 10", "LF004");
    c.batch_execute("SELECT lease.unprotect('by_alt')").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
    // Only id is watched now: alt is free to change, and to be dropped.
    c.batch_execute("UPDATE own SET alt = alt + 10; ALTER TABLE own DROP COLUMN alt").unwrap();
    expect_error(&mut c, "UPDATE own SET id = id + 10", "LF004");
}
