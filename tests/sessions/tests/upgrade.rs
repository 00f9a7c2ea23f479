//! Upgrades: install the previous release with data, `ALTER EXTENSION pg_lease
//! UPDATE`, and check that the result is the current release, object for
//! object, with protections, leases, marks and audit rows intact and working.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const PREVIOUS: &str = "0.1.0";

/// Every object of the extension with a digest of its definition and grants.
/// (Lists are aggregated in the order of their own text: `ORDER BY 1` inside an
/// aggregate sorts by a constant, and PostgreSQL 18 keeps NOT NULL constraints
/// in pg_constraint, where their order beside others follows the catalog's heap.)
const FINGERPRINT: &str = "
    SELECT pg_describe_object(d.classid, d.objid, 0) || ' ' || coalesce(
        CASE d.classid
            WHEN 'pg_proc'::regclass THEN
                (SELECT md5(pg_get_functiondef(p.oid) || coalesce(p.proacl::text, '')) FROM pg_proc p WHERE p.oid = d.objid)
            WHEN 'pg_class'::regclass THEN
                (SELECT md5(coalesce(string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' '
                                                || a.attnotnull || ' ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), ''),
                                                ',' ORDER BY a.attnum), '')
                            || coalesce(pg_get_viewdef(d.objid), '')
                            || coalesce((SELECT relacl::text FROM pg_class WHERE oid = d.objid), '')
                            || coalesce((SELECT string_agg(pg_get_indexdef(i.indexrelid), ';'
                                                           ORDER BY pg_get_indexdef(i.indexrelid))
                                           FROM pg_index i WHERE i.indrelid = d.objid), '')
                            || coalesce((SELECT string_agg(pg_get_constraintdef(c.oid), ';'
                                                           ORDER BY pg_get_constraintdef(c.oid))
                                           FROM pg_constraint c WHERE c.conrelid = d.objid), ''))
                   FROM pg_attribute a LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                  WHERE a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped)
            WHEN 'pg_event_trigger'::regclass THEN
                (SELECT md5(evtevent || evtfoid::regproc::text || coalesce(evttags::text, '')) FROM pg_event_trigger WHERE oid = d.objid)
        END, '')
      FROM pg_depend d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_lease')
     ORDER BY 1";

fn fingerprint(c: &mut Client) -> Vec<String> {
    c.query(FINGERPRINT, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

#[test]
fn upgrading_the_previous_release_keeps_everything_and_matches_a_fresh_install() {
    let old = TestDb::new("upgrade_old");
    let mut c = old.connect();
    c.batch_execute(&format!("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '{PREVIOUS}'")).unwrap();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(
        "CREATE TABLE ledger (p int, token bigint);
         SELECT lease.protect_high_water('ledger', '{p}', 'token');
         INSERT INTO ledger VALUES (1, 9);
         INSERT INTO lease.rejected_writes (rejected_at, database, target_table, operation, sqlstate)
         VALUES (now(), current_database(), 'public.payouts', 'INSERT', 'LF001');",
    )
    .unwrap();
    let token: i64 = c
        .query_one("SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')", &[])
        .unwrap()
        .get(0);
    c.batch_execute(&format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {token})")).unwrap();

    c.batch_execute("ALTER EXTENSION pg_lease UPDATE").unwrap();
    let version: String =
        c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'", &[]).unwrap().get(0);
    let fresh = TestDb::new("upgrade_fresh");
    let expected: String = fresh
        .connect()
        .query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, expected);
    assert_ne!(version, PREVIOUS);

    // Object for object, the upgraded extension is the current one.
    let (upgraded, current) = (fingerprint(&mut c), fingerprint(&mut fresh.connect()));
    let only_upgraded: Vec<_> = upgraded.iter().filter(|o| !current.contains(o)).collect();
    let only_current: Vec<_> = current.iter().filter(|o| !upgraded.contains(o)).collect();
    assert!(
        only_upgraded.is_empty() && only_current.is_empty(),
        "upgrade script out of step with the schema:\nonly after upgrade: {only_upgraded:#?}\nonly in a fresh install: {only_current:#?}"
    );

    // The data came through and everything still works on it.
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 2);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes"), 1);
    assert_eq!(one_i64(&mut c, "SELECT token FROM lease.high_water"), 9);
    expect_error(&mut c, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {})", token - 1), "LF001");
    expect_error(&mut c, "INSERT INTO ledger VALUES (1, 8)", "LF001");
    expect_error(&mut c, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence", "LF008");
    expect_error(&mut c, "SELECT lease.acquire('table:1', 'host-b', 60000)", "LF005");
    let next: i64 = c
        .query_one("SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')", &[])
        .unwrap()
        .get(0);
    assert!(next > token);
    // New in this version.
    c.batch_execute(&format!("BEGIN; SELECT lease.bind_token({next})")).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT lease.bound_token()"), next);
    c.batch_execute("COMMIT").unwrap();
}

/// 0.2.0 -> current with the data 0.2.0 could hold that 0.3.0 judges
/// differently: high-water marks keyed by text output (equal values under two
/// keys), owner guards that only watched UPDATE, owner partitions without
/// TRUNCATE guards.
#[test]
fn upgrading_from_0_2_0_rekeys_marks_and_rearms_owner_guards() {
    let db = TestDb::new("upgrade_020");
    let mut c = db.connect();
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.2.0'").unwrap();
    c.batch_execute(
        "CREATE TABLE own (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE own_a PARTITION OF own FOR VALUES FROM (0) TO (100);
         CREATE TABLE pay (t int, token bigint);
         SELECT lease.protect('pay', '{t}', 'token', 'own');
         INSERT INTO own VALUES (1, 10), (2, 20);
         CREATE TABLE ledger (k numeric, at timestamptz, token bigint);
         SELECT lease.protect_high_water('ledger', '{k,at}', 'token');
         -- Marks as 0.2.0's library wrote them: the keys' text output under
         -- the writer's TimeZone. (The library installed now is the new one
         -- for every SQL version, so they are written here by hand.)
         INSERT INTO lease.high_water (target, resource, token) VALUES
             ('ledger', '{1.0,\"2026-01-01 00:00:00+00\"}', 10),
             ('ledger', '{1.00,\"2026-01-01 09:00:00+09\"}', 12);",
    )
    .unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.high_water"), 2, "0.2.0 kept two marks for one resource");

    c.batch_execute("ALTER EXTENSION pg_lease UPDATE").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.high_water"), 1, "merged into one mark");
    assert_eq!(one_i64(&mut c, "SELECT token FROM lease.high_water"), 12, "the highest wins");
    expect_error(&mut c, "INSERT INTO ledger VALUES (1, '2026-01-01 00:00+00', 11)", "LF001");
    c.batch_execute("INSERT INTO ledger VALUES (1.000, '2025-12-31 19:00-05', 12)").unwrap();
    // Owner guards now refuse key moves and deletes; owner partitions refuse TRUNCATE.
    expect_error(&mut c, "UPDATE own SET id = 3 WHERE id = 1", "LF004");
    expect_error(&mut c, "DELETE FROM own WHERE id = 2", "LF004");
    expect_error(&mut c, "TRUNCATE own_a", "LF004");
    expect_error(&mut c, "INSERT INTO pay VALUES (1, 9)", "LF001");
    c.batch_execute("INSERT INTO pay VALUES (1, 10)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 2);
    // The recorded column types came through, so retypes are refused.
    expect_error(&mut c, "ALTER TABLE pay ALTER COLUMN t TYPE bigint", "LF008");
}

/// 0.3.0 -> current with leases held, expired and taken over: every lease keeps
/// its token and expiry, and the first heartbeat after the upgrade reports the
/// losses of 0.3.0 once and carries the live leases from then on.
#[test]
fn upgrading_from_0_3_0_carries_held_leases_into_heartbeat_sessions() {
    let db = TestDb::new("upgrade_030");
    let mut c = db.connect();
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.3.0'").unwrap();
    c.batch_execute(
        "SELECT lease.acquire('held', 'h1', 60000);
         SELECT lease.acquire('brief', 'h1', 200);
         SELECT lease.acquire('gone', 'h1', 200);
         SELECT lease.acquire('theirs', 'h2', 60000);",
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.batch_execute("SELECT lease.acquire('gone', 'h2', 60000)").unwrap();
    let before: Vec<(String, String, i64)> = c
        .query("SELECT name, owner, token FROM lease.leases ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();

    c.batch_execute("ALTER EXTENSION pg_lease UPDATE").unwrap();
    let after: Vec<(String, String, i64)> = c
        .query("SELECT name, owner, token FROM lease.leases ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(before, after, "every lease keeps its holder and token");
    let live: Vec<String> = c
        .query("SELECT name FROM lease.leases WHERE live ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(live, ["gone", "held", "theirs"]);
    expect_error(&mut c, "SELECT lease.acquire('held', 'h2', 1000)", "LF005");

    // The first heartbeat: 0.3.0's losses, once each; then nothing.
    let beat = |c: &mut Client| -> Vec<(String, String)> {
        c.query("SELECT name, lost FROM lease.heartbeat('h1', 60000) ORDER BY name", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    assert_eq!(beat(&mut c), [("brief".to_owned(), "expired".to_owned()), ("gone".to_owned(), "taken".to_owned())]);
    assert!(beat(&mut c).is_empty());
    // The held lease rides on the session now, past its own expiry too.
    c.batch_execute("SELECT lease.renew('held', 'h1', token, 200) FROM lease.leases WHERE name = 'held'").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    expect_error(&mut c, "SELECT lease.acquire('held', 'h2', 1000)", "LF005");
    let rows = one_i64(&mut c, "SELECT count(*) FROM lease.renew_all('h1', 60000) WHERE renewed");
    assert_eq!(rows, 1);
    // Tokens keep rising across the upgrade.
    let brief = after.iter().find(|(n, _, _)| n == "brief").unwrap().2;
    let next = one_i64(&mut c, "SELECT token FROM lease.acquire('brief', 'h2', 1000)");
    assert!(next > brief);
}

/// 0.5.0 -> 0.6.0 with data: fences, owner rows, leases and audit records
/// carry over; fenced_boundary_write (now C) writes through the fence; and a
/// fence 0.5.0 accepted on an owner key unique only in another collation
/// (two owner rows could match one key) is reported by the upgrade itself
/// and shown as not enforced.
#[test]
fn upgrading_from_0_5_0_reports_owner_keys_that_are_not_unique_under_the_fence() {
    let db = TestDb::new("upgrade_050");
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut c = pg_lease_sessions::postgres::Config::new()
        .host("127.0.0.1")
        .port(port())
        .user("postgres")
        .dbname(&db.name)
        .notice_callback(move |n| sink.lock().unwrap().push(format!("{}: {}", n.severity(), n.message())))
        .connect(pg_lease_sessions::postgres::NoTls)
        .unwrap();
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.5.0'").unwrap();
    c.batch_execute(&format!(
        "{POKER}
         CREATE COLLATION IF NOT EXISTS public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE players (name text COLLATE public.ci, owner_fencing_token bigint);
         CREATE UNIQUE INDEX players_name ON players (name COLLATE \"C\");
         CREATE TABLE bets (player text COLLATE public.ci, fencing_token bigint);
         SELECT lease.protect('bets', '{{player}}', 'fencing_token', owner_table => 'players', owner_key_columns => '{{name}}');
         INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5);
         SELECT lease.acquire('table:9', 'server-a', 60000);"
    ))
    .unwrap();
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    // The refusal's audit record lands (written by the audit worker).
    let start = std::time::Instant::now();
    while one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes") == 0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "no audit record");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    c.batch_execute("ALTER EXTENSION pg_lease UPDATE TO '0.6.0'").unwrap();
    let seen = notices.lock().unwrap().clone();
    assert!(
        seen.iter().any(|n| n.starts_with("WARNING: pg_lease: 0.6.0 finds a problem with the fence on public.bets")),
        "{seen:?}"
    );
    let enforced: Vec<(String, bool)> = c
        .query("SELECT table_name::text, enforced FROM lease.protected_tables ORDER BY 1", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(enforced, [("bets".to_owned(), false), ("payouts".to_owned(), true)]);
    // Everything else carried over and works with the new library.
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes WHERE sqlstate = 'LF001'"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE name = 'table:9' AND live"), 1);
    assert_eq!(
        one_i64(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', 5, '[{"table_id": 1}, {"table_id": 1}]')"#),
        2
    );
    expect_error(&mut c, r#"SELECT lease.fenced_boundary_write('payouts', 4, '[{"table_id": 1}]')"#, "LF001");
    // The way out the warning gives: a unique constraint in the key's own collation.
    c.batch_execute("ALTER TABLE players ADD CONSTRAINT players_key UNIQUE (name)").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 2);
}

/// 0.6.0 -> 0.7.0 with data: a BEFORE row trigger that fires in logical
/// replication workers ahead of pg_lease's fence (ENABLE ALWAYS), which 0.6.0
/// accepted, is reported by the upgrade and shown as not enforced; the
/// protection config gains `judge_replicated` (NULL: the mode's default);
/// pg_lease's own tables refuse TRUNCATE; tokens keep rising.
#[test]
fn upgrading_from_0_6_0_reports_triggers_that_fire_before_the_fence_in_replication() {
    let db = TestDb::new("upgrade_060");
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut c = pg_lease_sessions::postgres::Config::new()
        .host("127.0.0.1")
        .port(port())
        .user("postgres")
        .dbname(&db.name)
        .notice_callback(move |n| sink.lock().unwrap().push(format!("{}: {}", n.severity(), n.message())))
        .connect(pg_lease_sessions::postgres::NoTls)
        .unwrap();
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.6.0'").unwrap();
    c.batch_execute(&format!(
        "{POKER}
         CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER a_stamp BEFORE INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION stamp();
         ALTER TABLE payouts ENABLE ALWAYS TRIGGER a_stamp;
         INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5);"
    ))
    .unwrap();
    let before = one_i64(&mut c, "SELECT token FROM lease.acquire('job', 'h', 60000)");
    c.batch_execute("ALTER EXTENSION pg_lease UPDATE TO '0.7.0'").unwrap();
    let seen = notices.lock().unwrap().clone();
    assert!(
        seen.iter().any(|n| n.starts_with("WARNING: pg_lease: 0.7.0 finds a problem with the fence on public.payouts")
            && n.contains("a_stamp")),
        "{seen:?}"
    );
    assert!(!c
        .query_one("SELECT enforced FROM lease.protected_tables WHERE table_name = 'payouts'::regclass", &[])
        .unwrap()
        .get::<_, bool>(0));
    assert_eq!(
        c.query_one("SELECT judge_replicated FROM lease.protected", &[]).unwrap().get::<_, Option<bool>>(0),
        None
    );
    expect_error(&mut c, "TRUNCATE lease.rejected_writes", "0A000");
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    // Origin-only: the fence is whole again.
    c.batch_execute("ALTER TABLE payouts ENABLE TRIGGER a_stamp").unwrap();
    assert!(c
        .query_one("SELECT enforced FROM lease.protected_tables WHERE table_name = 'payouts'::regclass", &[])
        .unwrap()
        .get::<_, bool>(0));
    let after = one_i64(&mut c, "SELECT token FROM lease.acquire('job', 'h', 60000)");
    assert!(after > before);
}
