//! Tokens only rise across restart, crash, kill -9, dump/restore and the
//! promotion of an asynchronous standby that missed the primary's last WAL.
//! Each test runs clusters of its own on loopback ports.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::process::Command;

fn setup(c: &mut Client) {
    c.batch_execute(&format!("CREATE EXTENSION pg_lease; {POKER}")).unwrap();
}

/// The game server on host-a (re-)takes table 1: every call bumps the token.
fn take(c: &mut Client) -> i64 {
    c.query_one("SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')", &[]).unwrap().get(0)
}

fn current(c: &mut Client) -> i64 {
    one_i64(c, "SELECT token FROM lease.leases WHERE name = 'table:1'")
}

#[test]
fn tokens_rise_across_restart_crash_and_kill9() {
    let cluster = Cluster::start("dur_restart", 54411);
    let mut c = cluster.connect();
    setup(&mut c);
    // Even with asynchronous commit configured, a token is flushed before it is returned.
    c.batch_execute("ALTER SYSTEM SET synchronous_commit = off").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    drop(c);
    let mut c = cluster.connect();
    assert_eq!(c.query_one("SHOW synchronous_commit", &[]).unwrap().get::<_, String>(0), "off");
    let mut last = take(&mut c);
    for (how, fault) in [
        ("clean restart", Cluster::stop as fn(&Cluster)),
        ("crash (immediate stop)", Cluster::crash),
        ("kill -9 of the postmaster", Cluster::kill9),
    ] {
        let issued = take(&mut c);
        assert!(issued > last, "{how}");
        drop(c);
        fault(&cluster);
        cluster.restart();
        c = cluster.connect();
        assert_eq!(current(&mut c), issued, "the last issued token survived the {how}");
        assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1"), issued);
        let next = take(&mut c);
        assert!(next > issued, "token after {how}: {next} <= {issued}");
        last = next;
    }
}

#[test]
fn tokens_and_fences_survive_dump_and_restore() {
    let src = TestDb::new("dump_src");
    let mut c = src.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(
        "CREATE TABLE ledger (p int, token bigint);
         SELECT lease.protect_high_water('ledger', '{p}', 'token');
         INSERT INTO ledger VALUES (1, 9);",
    )
    .unwrap();
    let before = take(&mut c);
    let dump = std::env::temp_dir().join(format!("pg_lease_dump_{}.dump", std::process::id()));
    let port = port().to_string();
    let status = Command::new(pg_bin("pg_dump"))
        .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-Fc", "-f"])
        .arg(&dump)
        .arg(&src.name)
        .status()
        .unwrap();
    assert!(status.success());

    // Restore into a database without the extension: pg_restore creates it.
    let dst_name = format!("{}_restored", src.name);
    let mut admin = connect_to("postgres", "postgres");
    admin.batch_execute(&format!("CREATE DATABASE {dst_name}")).unwrap();
    let dst = TestDb { name: dst_name };
    let out = Command::new(pg_bin("pg_restore"))
        .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "--exit-on-error", "-d", &dst.name])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(out.status.success(), "pg_restore: {}", String::from_utf8_lossy(&out.stderr));

    let mut r = dst.connect();
    assert_eq!(current(&mut r), before);
    assert_eq!(
        one_i64(&mut r, "SELECT count(*) FROM lease.protected_tables WHERE enforced"),
        2,
        "both fences restored whole"
    );
    expect_error(&mut r, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {})", before - 1), "LF001");
    expect_error(&mut r, "INSERT INTO ledger VALUES (1, 8)", "LF001");
    expect_error(&mut r, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence", "LF008");
    let after = take(&mut r);
    assert!(after > before);
}

#[test]
fn tokens_rise_after_promoting_a_standby_that_missed_the_last_wal() {
    let primary = Cluster::start("dur_primary", 54421);
    let mut p = primary.connect();
    setup(&mut p);
    let replicated = take(&mut p);
    let standby = Cluster::standby_of(&primary, "dur_standby", 54422);
    let mut s = standby.connect();
    wait_for_replay(&mut p, &mut s);
    assert_eq!(current(&mut s), replicated);
    expect_error(&mut s, "SELECT lease.acquire('x', 'y', 1000)", "25006");

    // The standby falls behind: the primary issues a token it never receives,
    // and a game server starts using it...
    drop(s);
    standby.stop();
    let lost = take(&mut p);
    assert!(lost > replicated);
    p.batch_execute(&format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {lost})")).unwrap();
    // ...then the primary dies and the stale standby is promoted.
    drop(p);
    primary.crash();
    standby.restart();
    standby.promote();
    let mut n = standby.connect();
    assert_eq!(current(&mut n), replicated, "the new primary never saw the lost token");
    assert_eq!(one_i64(&mut n, "SELECT count(*) FROM payouts"), 0);

    // The process holding the lost token is refused as ahead of the database...
    let ahead =
        expect_error(&mut n, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {lost})"), "LF002");
    assert!(ahead.starts_with("FencingTokenAhead"), "{ahead}");
    expect_error(&mut n, &format!("SELECT lease.renew('table:1', 'host-a', {lost}, 60000)"), "LF006");
    // ...and the next token issued beats the lost one, though its WAL is gone.
    let next = take(&mut n);
    assert!(next > lost, "after failover: {next} <= lost {lost}");
    assert!(next >> 40 > lost >> 40, "a new timeline epoch");
}

/// Dump/restore (and pg_upgrade) restart the timeline at 1 while stored tokens
/// keep their old, higher epoch. An acquire lost in an async failover after
/// such a restore must never be issued again by the promoted standby.
#[test]
fn a_token_lost_in_failover_after_a_restore_is_never_issued_twice() {
    // The "old" cluster: its tokens are in epoch 3 (as if it had been
    // promoted twice), written as the superuser restoring them would.
    let old = Cluster::start("dur_epoch_old", 54441);
    let mut o = old.connect();
    setup(&mut o);
    take(&mut o);
    let stored = (3i64 << 40) | 5;
    o.batch_execute(&format!(
        "UPDATE lease.lease_state SET token = {stored}; UPDATE tables SET owner_fencing_token = {stored} WHERE id = 1"
    ))
    .unwrap();
    let dump = std::env::temp_dir().join(format!("pg_lease_epoch_{}.sql", std::process::id()));
    let old_port = old.port.to_string();
    let status = Command::new(pg_bin("pg_dump"))
        .args(["-h", "127.0.0.1", "-p", &old_port, "-U", "postgres", "-f"])
        .arg(&dump)
        .arg("postgres")
        .status()
        .unwrap();
    assert!(status.success());
    drop(o);
    old.stop();

    // Restored into a new cluster (timeline 1), with an async standby.
    let primary = Cluster::start("dur_epoch_primary", 54442);
    let primary_port = primary.port.to_string();
    let status = Command::new(pg_bin("psql"))
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &primary_port,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-f",
        ])
        .arg(&dump)
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(status.success(), "restoring the dump");
    let mut p = primary.connect();
    assert_eq!(current(&mut p), stored);
    let standby = Cluster::standby_of(&primary, "dur_epoch_standby", 54443);
    let mut s = standby.connect();
    wait_for_replay(&mut p, &mut s);
    drop(s);
    standby.stop();

    // The primary issues a token the standby never receives, then dies.
    let lost = take(&mut p);
    assert!(lost > stored && lost >> 40 > stored >> 40, "a new epoch above the restored one: {lost:#x}");
    drop(p);
    primary.crash();
    standby.restart();
    standby.promote();
    let mut n = standby.connect();
    assert_eq!(current(&mut n), stored, "the new primary never saw the lost token");
    let next = take(&mut n);
    assert_ne!(next, lost, "the lost token was issued twice");
    assert!(next > lost, "after failover: {next:#x} <= lost {lost:#x}");
    expect_error(&mut n, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {lost})"), "LF001");
    n.batch_execute(&format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {next})")).unwrap();
    // Later acquires stay in the new epoch.
    let again = take(&mut n);
    assert_eq!(again, next + 1);
}
