//! pg_upgrade from PostgreSQL 15 to the suite's major with pg_lease installed
//! and preloaded: a 15 cluster holding every kind of fence, leases whose
//! tokens come from a second timeline (a real failover, with a token lost in
//! it), audit rows and stats is upgraded, and on the new cluster, whose
//! timeline starts again at 1, every fence still holds, every new token is
//! above every token issued before, and the audit goes on.
//!
//! Runs when `PG_LEASE_UPGRADE_FROM` names the older major's pg_config
//! (`make test PG=18` sets it to 15's); otherwise it says so and passes.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::{Duration, Instant};

/// Every protection mode README documents, each over data written before the upgrade.
const SCHEMA: &str = "
    CREATE EXTENSION pg_lease;
    -- owner row, the writer's token in a column (the poker schema: payouts against tables)
    CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, amount bigint NOT NULL DEFAULT 0,
                          fencing_token bigint);
    SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
    INSERT INTO tables VALUES (1, 5), (2, 5);
    -- owner row, the writer's token bound to the transaction (no token column)
    CREATE TABLE chips (table_id int NOT NULL, amount bigint NOT NULL);
    SELECT lease.protect('chips', '{table_id}');
    -- owner row in an owner table of its own, composite key, partitioned target
    CREATE TABLE rooms (region text, num int, tok bigint, PRIMARY KEY (region, num));
    CREATE TABLE moves (region text NOT NULL, num int NOT NULL, move text, token bigint) PARTITION BY LIST (region);
    CREATE TABLE moves_eu PARTITION OF moves FOR VALUES IN ('eu');
    CREATE TABLE moves_us PARTITION OF moves FOR VALUES IN ('us');
    SELECT lease.protect('moves', '{region,num}', 'token', 'rooms', '{region,num}', 'tok');
    INSERT INTO rooms VALUES ('eu', 1, 10), ('us', 1, 20);
    -- high-water, token column, keys whose identity is not their text (numeric scale, time zones)
    CREATE TABLE ledger (k numeric, at timestamptz, token bigint);
    SELECT lease.protect_high_water('ledger', '{k,at}', 'token');
    -- high-water, token bound to the transaction
    CREATE TABLE sink (stream uuid, payload text);
    SELECT lease.protect_high_water('sink', '{stream}');
";

const STREAM: &str = "'6f1c3bd0-5d6e-4c35-9d43-1f3e2a1b7c55'";

fn acquire(c: &mut Client, name: &str, owner_table: &str, key: &str) -> i64 {
    let sql = format!("SELECT token FROM lease.acquire('{name}', 'host-a', 60000, '{owner_table}', '{key}')");
    c.query_one(&sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

/// What must come through pg_upgrade unchanged, as text lines.
fn contents(c: &mut Client) -> Vec<String> {
    let queries = [
        "SELECT 'payouts ' || table_id || ' ' || fencing_token || ' ' || count(*) FROM payouts GROUP BY table_id, fencing_token ORDER BY 1",
        "SELECT 'chips ' || table_id || ' ' || sum(amount) FROM chips GROUP BY table_id ORDER BY 1",
        "SELECT 'moves ' || tableoid::regclass || ' ' || region || ' ' || token || ' ' || count(*) FROM moves \
         GROUP BY tableoid, region, token ORDER BY 1",
        "SELECT 'ledger ' || k || ' ' || at || ' ' || token FROM ledger ORDER BY 1",
        "SELECT 'sink ' || stream || ' ' || payload FROM sink ORDER BY 1",
        "SELECT 'tables ' || id || ' ' || owner_fencing_token FROM tables ORDER BY 1",
        "SELECT 'rooms ' || region || num || ' ' || tok FROM rooms ORDER BY 1",
        "SELECT 'lease ' || name || ' ' || owner || ' ' || token || ' ' || coalesce(owner_table::text, '-') FROM lease.leases ORDER BY 1",
        "SELECT 'mark ' || target || ' ' || resource::text || ' ' || token FROM lease.high_water ORDER BY 1",
        "SELECT 'fence ' || table_name || ' ' || mode || ' ' || key_columns::text || ' ' || token_source || ' ' || enforced \
         FROM lease.protected_tables ORDER BY 1",
        "SELECT 'refused ' || target_table || ' ' || sqlstate || ' ' || coalesce(presented_token::text, '-') \
         || ' ' || coalesce(current_token::text, '-') FROM lease.rejected_writes ORDER BY 1",
        "SELECT 'epoch ' || base FROM lease.token_epoch ORDER BY 1",
    ];
    queries
        .iter()
        .flat_map(|q| {
            c.query(*q, &[]).unwrap_or_else(|e| panic!("{q}: {e:?}")).into_iter().map(|r| r.get::<_, String>(0))
        })
        .collect()
}

/// The refusals every fence must give, before and after the upgrade.
fn stale_writes_are_refused(c: &mut Client, zombie: i64) {
    expect_error(c, "INSERT INTO payouts (table_id, fencing_token) VALUES (2, 5)", "LF001");
    // The process that still holds the token lost in the failover: ahead of what the database recorded.
    expect_error(c, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {zombie})"), "LF002");
    expect_error(c, "INSERT INTO payouts (table_id) VALUES (1)", "LF003");
    expect_error(c, "BEGIN; SELECT lease.bind_token(5); INSERT INTO chips VALUES (2, 1)", "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    expect_error(c, "INSERT INTO chips VALUES (1, 1)", "LF003");
    expect_error(c, "INSERT INTO moves VALUES ('eu', 1, 'stale', 9)", "LF001");
    expect_error(c, "INSERT INTO moves VALUES ('us', 1, 'stale', 19)", "LF001");
    expect_error(c, "INSERT INTO moves VALUES ('us', 2, 'nobody', 1)", "LF007");
    // 1.00 at 09:00+09 is the resource 1.0 at 00:00 UTC, whose mark is 9.
    expect_error(c, "INSERT INTO ledger VALUES (1.00, '2026-01-01 09:00:00+09', 8)", "LF001");
    expect_error(c, &format!("BEGIN; SELECT lease.bind_token(2); INSERT INTO sink VALUES ({STREAM}, 'old')"), "LF001");
    c.batch_execute("ROLLBACK").unwrap();
    // The guards: no trigger can be switched off, no protected table truncated.
    expect_error(c, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence", "LF008");
    expect_error(c, "TRUNCATE moves_eu", "LF008");
    expect_error(c, "UPDATE tables SET owner_fencing_token = 1 WHERE id = 2", "LF004");
}

/// The number of audit rows once the queue is drained.
fn recorded_when_drained(c: &mut Client) -> i64 {
    let start = Instant::now();
    while one_i64(c, "SELECT queued FROM lease.audit_status()") > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "the audit queue never drained");
        std::thread::sleep(Duration::from_millis(50));
    }
    one_i64(c, "SELECT count(*) FROM lease.rejected_writes")
}

fn timeline(c: &mut Client) -> i64 {
    // The control file's timeline is the last checkpoint's: a promotion
    // only requests its end-of-recovery checkpoint, which a busy machine
    // may not have run yet (CI saw 1 here right after promoting).
    c.batch_execute("CHECKPOINT").unwrap();
    one_i64(c, "SELECT timeline_id::bigint FROM pg_control_checkpoint()")
}

#[test]
fn pg_upgrade_keeps_every_fence_raises_every_token_and_continues_the_audit() {
    let Ok(old_pg_config) = std::env::var("PG_LEASE_UPGRADE_FROM") else {
        println!("pg_upgrade test not run: PG_LEASE_UPGRADE_FROM (the older major's pg_config) is unset");
        return;
    };
    let old_pg_config = Some(old_pg_config.as_str());

    // The 15 cluster, filled on timeline 1.
    let primary = Cluster::start_on(old_pg_config, "upg_primary", 54451, &["pg_lease.audit_flush_ms = 50"]);
    let mut p = primary.connect();
    p.batch_execute(SCHEMA).unwrap();
    let t1 = acquire(&mut p, "table:1", "tables", "{1}");
    let t2 = acquire(&mut p, "table:2", "tables", "{2}");
    assert_eq!((t1 >> 40, t2 >> 40), (1, 1));
    p.batch_execute(&format!(
        "INSERT INTO payouts (table_id, amount, fencing_token) SELECT 1, g, {t1} FROM generate_series(1, 100) g;
         INSERT INTO payouts (table_id, amount, fencing_token) VALUES (2, 7, {t2});
         BEGIN; SELECT lease.bind_token({t1}); INSERT INTO chips SELECT 1, g FROM generate_series(1, 50) g; COMMIT;
         INSERT INTO moves VALUES ('eu', 1, 'e4', 10), ('us', 1, 'd4', 20);
         INSERT INTO ledger VALUES (1.0, '2026-01-01 00:00:00+00', 9), (2, '2026-01-02 00:00:00+00', 3);
         BEGIN; SELECT lease.bind_token(4); INSERT INTO sink VALUES ({STREAM}, 'first'); COMMIT;"
    ))
    .unwrap();

    // A real failover: an asynchronous standby misses the primary's last
    // acquire (a game server goes on holding that token), the primary dies,
    // and the standby is promoted onto timeline 2.
    let standby = Cluster::standby_of(&primary, "upg_standby", 54452);
    let mut s = standby.connect();
    wait_for_replay(&mut p, &mut s);
    drop(s);
    standby.stop();
    let lost = acquire(&mut p, "table:1", "tables", "{1}");
    assert!(lost > t1 && lost >> 40 == 1, "the lost token, still of timeline 1: {lost:#x}");
    drop(p);
    primary.crash();
    standby.restart();
    standby.promote();
    let mut o = standby.connect();
    assert_eq!(timeline(&mut o), 2, "the promoted standby runs on timeline 2");
    assert_eq!(one_i64(&mut o, "SELECT token FROM lease.leases WHERE name = 'table:1'"), t1, "the lost token is gone");

    // On timeline 2: leases taken there (table:1 is not, so its last token is still of timeline 1).
    let t2b = acquire(&mut o, "table:2", "tables", "{2}");
    let room = acquire(&mut o, "room:us", "rooms", "{us,1}");
    assert_eq!((t2b >> 40, room >> 40), (2, 2));
    o.batch_execute(&format!(
        "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (2, 8, {t2b});
         INSERT INTO moves VALUES ('us', 1, 'c4', {room});
         INSERT INTO ledger VALUES (1, '2026-01-01 00:00:00+00', 9);"
    ))
    .unwrap();
    stale_writes_are_refused(&mut o, lost);
    // What one round of stale writes leaves in the audit and the stats.
    let per_check = recorded_when_drained(&mut o);
    let refused_per_check = one_i64(&mut o, "SELECT sum(refused)::bigint FROM lease.stats");
    assert!(per_check >= 10 && refused_per_check >= 10, "audit rows {per_check}, stats {refused_per_check}");
    assert!(one_i64(&mut o, "SELECT sum(accepted)::bigint FROM lease.stats") > 0);
    let issued_max = [lost, t2b, room].into_iter().max().unwrap();
    assert_eq!(one_i64(&mut o, "SELECT max(token) FROM lease.leases").max(lost), issued_max);

    // README, Upgrades: record the token epoch just before the old cluster stops.
    o.batch_execute(PRE_UPGRADE).unwrap();
    let before = contents(&mut o);
    let old_version = one_i64(&mut o, "SELECT current_setting('server_version_num')::bigint");
    drop(o);
    standby.stop();

    // pg_upgrade into a new cluster of the suite's major (no checksums, like the old one).
    let new = Cluster::pg_upgrade(&standby, "upg_new", 54453, "--no-data-checksums");
    let mut n = new.connect();
    let version = one_i64(&mut n, "SELECT current_setting('server_version_num')::bigint");
    println!("upgraded from server_version_num {old_version} to {version}, timeline {}", timeline(&mut n));
    assert!(version / 10000 > old_version / 10000, "the new cluster runs a newer major: {version}");
    assert_eq!(timeline(&mut n), 1, "pg_upgrade starts the new cluster on timeline 1");

    // Nothing lost: data, leases, marks, fences, audit rows, epoch.
    assert_eq!(contents(&mut n), before);
    assert_eq!(one_i64(&mut n, "SELECT count(*) FROM payouts"), 102);
    assert_eq!(one_i64(&mut n, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 5);

    // Every fence still holds, with its code, and the audit goes on.
    let audit_status: String = n.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    stale_writes_are_refused(&mut n, lost);
    assert_eq!(recorded_when_drained(&mut n), 2 * per_check);
    assert_eq!(one_i64(&mut n, "SELECT count(*) FROM lease.rejected_writes WHERE sqlstate = 'LF002'"), 2);
    let status: String = n.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(status.starts_with("recording"), "audit status after the upgrade: {status} (at start: {audit_status})");
    // Stats live in shared memory: they start again from zero with the new server.
    assert_eq!(one_i64(&mut n, "SELECT sum(refused)::bigint FROM lease.stats"), refused_per_check);

    // Tokens only rise: every lease, first of all table:1 whose last token is
    // of timeline 1 (the lost one was issued there too), and a new lease.
    let a1 = acquire(&mut n, "table:1", "tables", "{1}");
    assert!(a1 > issued_max, "table:1 after pg_upgrade: {a1:#x} <= {issued_max:#x}, issued before");
    assert_eq!(
        a1 >> 40,
        2049,
        "epoch: the lease state is the old cluster's incarnation (another system identifier): two bands \
         (1,024 epochs each) above its epoch 2, + timeline 1"
    );
    for (name, table, key) in
        [("table:2", "tables", "{2}"), ("room:us", "rooms", "{us,1}"), ("room:eu", "rooms", "{eu,1}")]
    {
        let token = acquire(&mut n, name, table, key);
        assert!(token > issued_max, "{name} after pg_upgrade: {token:#x} <= {issued_max:#x}");
    }
    let fresh: i64 = n.query_one("SELECT token FROM lease.acquire('table:new', 'host-a', 60000)", &[]).unwrap().get(0);
    assert!(fresh > issued_max, "a new lease after pg_upgrade: {fresh:#x} <= {issued_max:#x}");
    // The new holder writes; the zombie with the lost token is now simply stale.
    n.batch_execute(&format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 9, {a1})")).unwrap();
    expect_error(&mut n, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {lost})"), "LF001");
    assert_eq!(recorded_when_drained(&mut n), 2 * per_check + 1);
}

/// The steps README's Upgrades section asks for on the old cluster right
/// before it stops, in every database with pg_lease.
///
/// The token epoch is not carried over by hand: lease.token_origin names the
/// old cluster's incarnation, so the first acquire on the new cluster
/// (timeline 1) raises the base two bands above every epoch it knows.
const PRE_UPGRADE: &str = "
    -- Debian's PostgreSQL 15.20 stamps every column with an attribute option
    -- (pg_attver) that PostgreSQL 18.6 rejects, failing pg_upgrade on any table.
    UPDATE pg_catalog.pg_attribute
       SET attoptions = NULLIF(ARRAY(SELECT o FROM unnest(attoptions) o WHERE o NOT LIKE 'pg_attver=%'), '{}')
     WHERE attrelid >= 16384 AND attoptions::text LIKE '%pg_attver=%';
";
