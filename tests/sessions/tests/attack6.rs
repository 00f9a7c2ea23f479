//! Attack review 6. Each test states the behaviour pg_lease should have; at
//! commit time (3b3766f) both fail: they reproduce the findings.

use pg_lease_sessions::*;
use std::time::Duration;

/// The replication trust rule trusts the *process* (an apply worker of a
/// superuser's subscription), not the row: a non-superuser table owner on the
/// subscriber runs its own code inside the apply worker (an ENABLE ALWAYS
/// trigger, or a column DEFAULT the worker fills in) and that code's writes to
/// a fenced table and an owner table pass unjudged.
#[test]
fn code_a_table_owner_runs_in_the_apply_worker_is_still_judged() {
    let publisher = Cluster::start_with("a6_pub", 54495, &["wal_level = logical"]);
    let subscriber = Cluster::start("a6_sub", 54496);
    let mut p = publisher.connect();
    p.batch_execute(
        "CREATE TABLE events (id int PRIMARY KEY, table_id int, amount int);
         CREATE PUBLICATION ev FOR TABLE events;",
    )
    .unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(&format!(
        "CREATE EXTENSION pg_lease; {POKER}
         UPDATE tables SET owner_fencing_token = 7;
         CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT ON payouts TO app; GRANT USAGE ON SEQUENCE payouts_id_seq TO app;
         GRANT SELECT, UPDATE ON tables TO app;
         CREATE TABLE events (id int PRIMARY KEY, table_id int, amount int, x int);
         ALTER TABLE events OWNER TO app;
         CREATE SCHEMA appfn AUTHORIZATION app;
         SET ROLE app;
         CREATE FUNCTION appfn.smuggle() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
         BEGIN
           INSERT INTO payouts (table_id, amount, fencing_token) VALUES (NEW.table_id, NEW.amount, 1);
           UPDATE tables SET owner_fencing_token = 2 WHERE id = NEW.table_id;
           RETURN NEW;
         END $$;
         CREATE TRIGGER smuggle BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION appfn.smuggle();
         ALTER TABLE events ENABLE ALWAYS TRIGGER smuggle;
         CREATE FUNCTION appfn.dflt() RETURNS int LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public AS $$
         BEGIN
           INSERT INTO payouts (table_id, amount, fencing_token) VALUES (2, 555, 1);
           RETURN 0;
         END $$;
         ALTER TABLE events ALTER COLUMN x SET DEFAULT appfn.dflt();
         RESET ROLE;"
    ))
    .unwrap();
    // As itself, app can do neither.
    expect_error(
        &mut s,
        "SET ROLE app; INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, 1)",
        "LF001",
    );
    s.batch_execute("RESET ROLE").unwrap();
    expect_error(&mut s, "SET ROLE app; UPDATE tables SET owner_fencing_token = 2 WHERE id = 1", "LF004");
    s.batch_execute("RESET ROLE").unwrap();
    s.batch_execute(&format!(
        "CREATE SUBSCRIPTION ev CONNECTION 'host=127.0.0.1 port={} user=postgres dbname=postgres' PUBLICATION ev",
        publisher.port
    ))
    .unwrap();
    p.batch_execute("INSERT INTO events VALUES (1, 1, 1000000)").unwrap();
    std::thread::sleep(Duration::from_secs(5));
    // Expected: the smuggled writes are refused (the apply worker then retries;
    // nothing of them ever commits).
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts WHERE fencing_token < 7"), 0, "stale payout committed");
    assert_eq!(one_i64(&mut s, "SELECT min(owner_fencing_token) FROM tables"), 7, "owner token went down");
}

/// An owner table (or owner partition) made UNLOGGED loses every owner row at
/// crash recovery (and is empty on a promoted standby); the row can then be
/// inserted again with a lower token, and a stale writer's token is accepted.
#[test]
fn an_owner_table_cannot_be_made_unlogged() {
    let c = Cluster::start("a6_unlogged", 54497);
    let mut s = c.connect();
    s.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER} UPDATE tables SET owner_fencing_token = 7;")).unwrap();
    // Expected: refused (LF008 or LF004), as any other way to erase owner rows.
    let code = try_sql(&mut s, "ALTER TABLE tables SET UNLOGGED");
    if code.is_empty() {
        c.crash();
        c.restart();
        let mut s = c.connect();
        s.batch_execute("INSERT INTO tables VALUES (1, 1)").unwrap();
        let stale = try_sql(&mut s, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 1)");
        panic!("SET UNLOGGED on an owner table accepted; after a crash token 7 became 1 and a stale write: {stale}");
    }
    assert_eq!(code, "LF008");
    // Nor protect against one, nor attach one as an owner partition.
    s.batch_execute(
        "CREATE UNLOGGED TABLE own2 (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE p2 (k int, token bigint);
         CREATE TABLE own3 (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE p3 (k int, token bigint);
         SELECT lease.protect('p3', '{k}', 'token', 'own3');
         CREATE UNLOGGED TABLE own3_0 (id int PRIMARY KEY, owner_fencing_token bigint);",
    )
    .unwrap();
    expect_error(&mut s, "SELECT lease.protect('p2', '{k}', 'token', 'own2')", "LF008");
    expect_error(&mut s, "ALTER TABLE own3 ATTACH PARTITION own3_0 FOR VALUES FROM (0) TO (10)", "LF008");
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM lease.protected_tables WHERE NOT enforced"), 0);
}
