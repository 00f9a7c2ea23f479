//! Attack review 29: the audit of refused writes (`lease.rejected_writes`,
//! `lease.audit_status()`, `lease.purge_rejected_writes`), attacked over
//! real connections on PostgreSQL 15 (pg_lease 0.9.2, preloaded).
//!
//! (Session 16 closed all six holes, and each test below now passes: the
//! audit writer also sets `role = none`, `synchronous_commit = on`, the
//! isolation level and the idle and transaction timeouts whatever the
//! database's settings say; `row_data` is made in a subtransaction and is
//! `{"unserializable": true}` when a cast to json raises; key values are
//! shown under fixed output settings and quoted when they could read as
//! something else; `role` is the session's outer role (`GetOuterUserId`);
//! `purge_rejected_writes` refuses an interval that reaches past `now()`.)
//!
//! Findings, most severe first:
//!
//! - **Hole (medium): a database owner who is not a superuser stalls its
//!   database's audit with one `ALTER DATABASE ... SET role`.** The audit
//!   writer is a background worker connected as the bootstrap superuser;
//!   `InitPostgres` applies the database's `pg_db_role_setting`, and the
//!   writer overrides only `search_path`, `lock_timeout`,
//!   `default_transaction_read_only` and `statement_timeout`. So after
//!   `ALTER DATABASE game SET role = 'metrics'` (run by the database's
//!   owner, e.g. `CREATE DATABASE game OWNER migrator`, who need not even be
//!   a member of that role: the check at ALTER time only gives a NOTICE) the
//!   writer runs as `metrics`, its INSERT fails with `42501 permission denied
//!   for table rejected_writes`, the database is "failing" for good, and past
//!   512 queued records every further refusal is dropped. Ordinary sessions
//!   that are not members get a WARNING and are otherwise unaffected, so
//!   the application keeps writing. README (Auditing: "pg_lease records
//!   refusals outside the writer's transaction ... the writer inserts batches
//!   ... into `lease.rejected_writes`"; Roles and grants: the application
//!   roles "cannot" write the audit; the code's and `audit.rs`'s stated
//!   intent: "A database owner's ALTER DATABASE ... SET cannot stall the
//!   audit") (`a_database_owners_role_setting_cannot_stall_the_audit`, fails).
//! - **Hole (medium): with `pg_lease.audit_row` on, the table owner's cast
//!   to json makes a stale write lose `LF001`, its count, its LOG line and
//!   its audit row.** `row_to_json` calls a user-defined cast to `json` for
//!   a column of a user type (an enum here). The migrator (who owns the fenced table and may create types and
//!   casts) adds `CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood)`
//!   whose function raises; the game server's stale INSERT then fails with
//!   the function's `22000 not today` instead of `LF001`, and
//!   `lease.audit_databases()` counts nothing for the database: refused,
//!   recorded, dropped and queued are all unchanged. The cast function also runs, as the writer,
//!   in the middle of every refusal. README (Auditing: "Every refusal is
//!   counted: `refused = recorded + dropped + queued` holds exactly"; "values
//!   are cut ... never refused"; Roles: the migrator cannot "write `lease.*`
//!   state (... audit)"; Error codes: LF001 "never retry")
//!   (`a_json_cast_cannot_hide_a_refusal_from_the_audit_row`, fails).
//! - **Hole (medium): two different resources are audited under one
//!   `resource_key`.** A fence keyed on `(room, seat)` text columns: the stale
//!   writes for `('a, b', 'c')` and for `('a', 'b, c')` (two owner rows, two
//!   leases, two current tokens) are both recorded as `(room, seat)=(a, b,
//!   c)`: values are joined with ", " without quoting. README (Auditing:
//!   "names and keys read as they are stored ... so two keys that differ stay
//!   two keys")
//!   (`two_resources_are_never_audited_under_one_key`, fails).
//! - **Hole (medium): the stale writer's own `DateStyle` / `TimeZone` decide
//!   the audited key.** Owner rows for `2024-07-01` and `2024-01-07`: a writer
//!   with `DateStyle = 'SQL, DMY'` refused for July 1st and one with `'SQL,
//!   MDY'` refused for January 7th are both audited as `(d)=(01/07/2024)`; a
//!   `timestamptz` resource is audited as `(ts)=(2024-07-01 09:00:00+09)`
//!   by a session in `Asia/Tokyo` and `(ts)=(2024-07-01 00:00:00+00)` by
//!   one in UTC. The
//!   README's "who is still writing" query groups by `resource_key`: it
//!   splits one resource and merges two, as the stale writer likes. README
//!   (Auditing: "names and keys read as they are stored ... so two keys that
//!   differ stay two keys") (`the_audited_key_does_not_depend_on_the_writers_datestyle`, fails).
//! - **Hole (low): a refusal inside a `SECURITY DEFINER` function is
//!   audited as the function's owner.** The record's `role` is
//!   `GetUserId()` at the refusal: the game server calling the migrator's
//!   `SECURITY DEFINER` helper with a stale token is recorded as `migrator`,
//!   who wrote nothing; the README's "top stale writers" query then blames
//!   the migrator. README (walkthrough step 6: "recorded ... with who, where
//!   and which tokens"; the LOG line's `"role": "game_server"`)
//!   (`a_security_definer_helper_does_not_change_who_is_audited`, fails).
//! - **Hole (low): `lease.purge_rejected_writes` with a non-negative interval
//!   deletes rows recorded a moment ago.** Its guard compares the interval
//!   with `interval '0'` (months counted as 30 days), the DELETE subtracts it
//!   from `now()` by the calendar: `'-1 year 360 days'` passes the guard (it
//!   equals 0 there) and `now() - interval '-1 year 360 days'` is 5 days in
//!   the future, so every audit row goes. README (Auditing:
//!   "`lease.purge_rejected_writes(older_than interval)` ... deletes older
//!   audit rows of this database"; its error: "older_than must be a
//!   non-negative interval")
//!   (`purge_never_deletes_rows_younger_than_asked`, fails).
//! - **Held:** refusals caught by a PL/pgSQL `EXCEPTION` block, rolled back
//!   to a savepoint, inside a transaction that could not then be prepared
//!   (2PC), through `MERGE`, and a migrator's `TRUNCATE` (`LF008`) are all
//!   recorded, with the caller's role
//!   (`caught_rolled_back_and_merged_refusals_are_all_recorded`, passes).
//! - **Held:** the README's migrator, game_server, dba and metrics cannot
//!   insert, update, delete, truncate or alter audit rows, nor purge, reset
//!   the counters or read the cluster-wide audit; metrics and the game server
//!   cannot read the audit (`roles_cannot_forge_or_remove_audit_rows`,
//!   passes).
//!
//! Not tested: a database owner's `ALTER DATABASE ... SET synchronous_commit
//! = off` also reaches the writer, so rows it already took off the queue
//! can be lost in a crash (beyond "a crash loses what was still queued");
//! racy to show, so only noted.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::thread;
use std::time::{Duration, Instant};

#[track_caller]
fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > timeout {
            eprintln!("timed out waiting for {what}");
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Cluster-wide roles, made once (tests run in parallel: each uses its own names).
fn roles(c: &mut Client, names: &[&str]) {
    for n in names {
        // A concurrent CREATE ROLE of the same name by another test run: ignore 23505/42710.
        let _ = c.batch_execute(&format!(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{n}') THEN CREATE ROLE {n}; END IF; END $$"
        ));
    }
}

fn audited(c: &mut Client, filter: &str) -> i64 {
    one_i64(c, &format!("SELECT count(*) FROM lease.rejected_writes WHERE {filter}"))
}

/// This database's (refused, recorded, dropped, queued), from `lease.audit_databases()`.
fn counters(c: &mut Client) -> (i64, i64, i64, i64) {
    let r = c
        .query_one(
            "SELECT coalesce(sum(refused), 0)::bigint, coalesce(sum(recorded), 0)::bigint,
                    coalesce(sum(dropped), 0)::bigint, coalesce(sum(queued), 0)::bigint
               FROM lease.audit_databases() WHERE database = current_database()",
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[test]
fn a_database_owners_role_setting_cannot_stall_the_audit() {
    let db = TestDb::new("a29_dbrole");
    let mut c = db.connect();
    roles(&mut c, &["a29_owner", "a29_metrics"]);
    must_run(&mut c, POKER);
    // The writer's connection is opened before the setting, so it is not affected itself.
    let mut writer = db.connect();
    must_run(&mut writer, "SET application_name = 'a29-dbrole'");
    must_run(&mut c, &format!("ALTER DATABASE {} OWNER TO a29_owner", db.name));
    // The database's owner, not a superuser, and not a member of a29_metrics.
    must_run(&mut c, &format!("SET ROLE a29_owner; ALTER DATABASE {} SET role = 'a29_metrics'; RESET ROLE", db.name));
    for tok in [1, 2, 3] {
        expect_error(&mut writer, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {tok})"), "LF001");
    }
    let recorded = wait_until("the three refusals in lease.rejected_writes", Duration::from_secs(10), || {
        audited(&mut c, "application_name = 'a29-dbrole'") == 3
    });
    let status: String = c.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    let _ = c.batch_execute(&format!("ALTER DATABASE {} RESET role", db.name));
    assert!(recorded, "a database owner's ALTER DATABASE ... SET role stalled the audit: {status}");
}

/// The other settings a database owner can give every session of the
/// database, all at once: the audit writer pins its own (README, Auditing:
/// "whatever ALTER DATABASE ... SET a database owner made").
#[test]
fn a_database_owners_other_settings_cannot_stall_the_audit() {
    let db = TestDb::new("a29_dbsettings");
    let mut c = db.connect();
    roles(&mut c, &["a29_owner2"]);
    must_run(&mut c, POKER);
    let mut writer = db.connect();
    must_run(&mut writer, "SET application_name = 'a29-dbsettings'");
    must_run(&mut c, &format!("ALTER DATABASE {} OWNER TO a29_owner2", db.name));
    let mut settings = vec![
        "default_transaction_read_only = on",
        "default_transaction_isolation = 'serializable'",
        "statement_timeout = 1",
        "lock_timeout = 1",
        "idle_in_transaction_session_timeout = 1",
        "synchronous_commit = off",
        "search_path = nowhere",
    ];
    if server_version_num() >= 170_000 {
        settings.push("transaction_timeout = 1");
    }
    must_run(&mut c, "SET ROLE a29_owner2");
    for setting in &settings {
        must_run(&mut c, &format!("ALTER DATABASE {} SET {setting}", db.name));
    }
    must_run(&mut c, "RESET ROLE");
    for tok in [1, 2, 3] {
        expect_error(&mut writer, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {tok})"), "LF001");
    }
    // The reader takes the database's settings too: it undoes every one
    // that could fail its own queries (a 1 ms transaction_timeout did, now
    // and then, on PostgreSQL 18).
    let mut reader = db.connect();
    must_run(
        &mut reader,
        "SET default_transaction_read_only = off; SET statement_timeout = 0; SET lock_timeout = 0;
         SET idle_in_transaction_session_timeout = 0",
    );
    if server_version_num() >= 170_000 {
        must_run(&mut reader, "SET transaction_timeout = 0");
    }
    let recorded = wait_until("the three refusals in lease.rejected_writes", Duration::from_secs(10), || {
        audited(&mut reader, "application_name = 'a29-dbsettings'") == 3
    });
    let status: String = reader.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    let _ = reader.batch_execute(&format!("ALTER DATABASE {} RESET ALL", db.name));
    assert!(recorded, "a database owner's ALTER DATABASE ... SET stalled the audit: {status}");
}

#[test]
fn a_json_cast_cannot_hide_a_refusal_from_the_audit_row() {
    let db = TestDb::new("a29_jsoncast");
    let mut c = db.connect();
    roles(&mut c, &["a29_cast_migrator", "a29_cast_game"]);
    must_run(
        &mut c,
        "GRANT CREATE ON SCHEMA public TO a29_cast_migrator;
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO a29_cast_migrator;
         SET ROLE a29_cast_migrator;
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TYPE mood AS ENUM ('ok');
         CREATE FUNCTION mood_json(mood) RETURNS json LANGUAGE plpgsql
             AS $$ BEGIN RAISE EXCEPTION 'not today' USING ERRCODE = '22000'; END $$;
         CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood);
         CREATE TABLE notes (table_id int NOT NULL, m mood, fencing_token bigint);
         SELECT lease.protect('notes', '{table_id}', 'fencing_token', 'tables');
         INSERT INTO tables VALUES (1, 5);
         GRANT INSERT ON notes TO a29_cast_game;
         RESET ROLE;",
    );
    let mut w = db.connect();
    // pg_lease.audit_row is a superuser setting: as a server-wide postgresql.conf line would set it.
    must_run(&mut w, "SET pg_lease.audit_row = on; SET application_name = 'a29-cast'; SET ROLE a29_cast_game");
    let before = counters(&mut c);
    let code = try_sql(&mut w, "INSERT INTO notes VALUES (1, 'ok', 4)");
    let got = wait_until("the refusal in lease.rejected_writes", Duration::from_secs(10), || {
        audited(&mut c, "application_name = 'a29-cast'") == 1
    });
    let after = counters(&mut c);
    assert_eq!(code, "LF001", "the stale write's SQLSTATE (counters before {before:?}, after {after:?})");
    assert!(got, "the refusal was not audited (counters before {before:?}, after {after:?})");
    assert_eq!(after.0, before.0 + 1, "the refusal was not counted for its database");
    let doc: String = c
        .query_one("SELECT row_data::text FROM lease.rejected_writes WHERE application_name = 'a29-cast'", &[])
        .unwrap()
        .get(0);
    assert_eq!(doc, r#"{"unserializable": true}"#);
}

#[test]
fn two_resources_are_never_audited_under_one_key() {
    let (_db, mut c) = db_with(
        "a29_twokeys",
        "",
        "CREATE TABLE seats (room text, seat text, owner_fencing_token bigint, PRIMARY KEY (room, seat));
         CREATE TABLE seat_pay (room text NOT NULL, seat text NOT NULL, fencing_token bigint);
         SELECT lease.protect('seat_pay', '{room,seat}', 'fencing_token', 'seats', '{room,seat}');
         INSERT INTO seats VALUES ('a, b', 'c', 5), ('a', 'b, c', 6);",
    );
    must_run(&mut c, "SET application_name = 'a29-seats'");
    expect_error(&mut c, "INSERT INTO seat_pay VALUES ('a, b', 'c', 1)", "LF001");
    expect_error(&mut c, "INSERT INTO seat_pay VALUES ('a', 'b, c', 1)", "LF001");
    assert!(
        wait_until("both refusals", Duration::from_secs(10), || audited(&mut c, "application_name = 'a29-seats'") == 2)
    );
    let keys = one_i64(
        &mut c,
        "SELECT count(DISTINCT resource_key) FROM lease.rejected_writes WHERE application_name = 'a29-seats'",
    );
    let shown: Vec<String> = c
        .query("SELECT resource_key FROM lease.rejected_writes WHERE application_name = 'a29-seats' ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, 2, "two resources (two owner rows, current tokens 5 and 6) audited as {shown:?}");
}

#[test]
fn the_audited_key_does_not_depend_on_the_writers_datestyle() {
    let (_db, mut c) = db_with(
        "a29_datestyle",
        "",
        "CREATE TABLE days (d date PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE day_pay (d date NOT NULL, fencing_token bigint);
         SELECT lease.protect('day_pay', '{d}', 'fencing_token', 'days', '{d}');
         INSERT INTO days VALUES ('2024-07-01', 5), ('2024-01-07', 6);
         CREATE TABLE instants (ts timestamptz PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE ts_pay (ts timestamptz NOT NULL, fencing_token bigint);
         SELECT lease.protect('ts_pay', '{ts}', 'fencing_token', 'instants', '{ts}');
         INSERT INTO instants VALUES ('2024-07-01 00:00:00+00', 7);",
    );
    must_run(&mut c, "SET application_name = 'a29-dates'");
    // Two stale writers, each in its own style: July 1st and January 7th.
    expect_error(&mut c, "SET DateStyle = 'SQL, DMY'; INSERT INTO day_pay VALUES ('2024-07-01', 1)", "LF001");
    expect_error(&mut c, "SET DateStyle = 'SQL, MDY'; INSERT INTO day_pay VALUES ('2024-01-07', 1)", "LF001");
    // One resource, two writers in two time zones.
    expect_error(
        &mut c,
        "SET TimeZone = 'Asia/Tokyo'; INSERT INTO ts_pay VALUES ('2024-07-01 00:00:00+00', 1)",
        "LF001",
    );
    expect_error(&mut c, "SET TimeZone = 'UTC'; INSERT INTO ts_pay VALUES ('2024-07-01 00:00:00+00', 1)", "LF001");
    must_run(&mut c, "RESET DateStyle; RESET TimeZone");
    assert!(
        wait_until("four refusals", Duration::from_secs(10), || audited(&mut c, "application_name = 'a29-dates'") == 4)
    );
    let rows: Vec<(String, String, i64)> = c
        .query(
            "SELECT target_table, resource_key, current_token FROM lease.rejected_writes
              WHERE application_name = 'a29-dates' ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_ne!(rows[0].1, rows[1].1, "July 1st and January 7th audited under one key: {rows:?}");
    assert_eq!(rows[2].1, rows[3].1, "one instant audited under two keys: {rows:?}");
}

#[test]
fn a_security_definer_helper_does_not_change_who_is_audited() {
    let db = TestDb::new("a29_secdef");
    let mut c = db.connect();
    roles(&mut c, &["a29_def_owner", "a29_def_game"]);
    must_run(
        &mut c,
        &(POKER.to_owned()
            + "GRANT INSERT ON payouts TO a29_def_owner;
               GRANT USAGE ON SEQUENCE payouts_id_seq TO a29_def_owner;
               GRANT CREATE ON SCHEMA public TO a29_def_owner;
               SET ROLE a29_def_owner;
               CREATE FUNCTION pay(tok bigint) RETURNS void LANGUAGE sql SECURITY DEFINER
                   SET search_path = public, pg_catalog
                   AS $$ INSERT INTO payouts (table_id, fencing_token) VALUES (1, tok) $$;
               GRANT EXECUTE ON FUNCTION pay(bigint) TO a29_def_game;
               RESET ROLE;"),
    );
    let mut w = db.connect();
    must_run(&mut w, "SET application_name = 'a29-secdef'; SET ROLE a29_def_game");
    expect_error(&mut w, "SELECT pay(4)", "LF001");
    assert!(
        wait_until("the refusal", Duration::from_secs(10), || audited(&mut c, "application_name = 'a29-secdef'") == 1)
    );
    let role: String = c
        .query_one("SELECT role FROM lease.rejected_writes WHERE application_name = 'a29-secdef'", &[])
        .unwrap()
        .get(0);
    assert_eq!(role, "a29_def_game", "the caller's stale write is audited as the helper's owner");
}

#[test]
fn purge_never_deletes_rows_younger_than_asked() {
    let (_db, mut c) = db_with("a29_purge", "", POKER);
    must_run(&mut c, "SET application_name = 'a29-purge'");
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    assert!(
        wait_until("the refusal", Duration::from_secs(10), || audited(&mut c, "application_name = 'a29-purge'") == 1)
    );
    // Not negative by the function's own test (it raises 22023 for those) ...
    assert!(!c.query_one("SELECT interval '-1 year 360 days' < interval '0'", &[]).unwrap().get::<_, bool>(0));
    // ... yet it reaches days ahead: refused as a negative one, nothing deleted.
    let e = expect_error(&mut c, "SELECT lease.purge_rejected_writes('-1 year 360 days')", "22023");
    assert!(e.contains("non-negative"), "{e}");
    assert_eq!(audited(&mut c, "application_name = 'a29-purge'"), 1);
    // A month back by the calendar deletes nothing recorded a moment ago either.
    assert_eq!(one_i64(&mut c, "SELECT lease.purge_rejected_writes('1 mon -20 days')"), 0);
    assert_eq!(audited(&mut c, "application_name = 'a29-purge'"), 1);
}

#[test]
fn caught_rolled_back_and_merged_refusals_are_all_recorded() {
    let db = TestDb::new("a29_caught");
    let mut c = db.connect();
    roles(&mut c, &["a29_held_game", "a29_held_migrator"]);
    must_run(
        &mut c,
        &(POKER.to_owned()
            + "GRANT INSERT ON payouts TO a29_held_game; GRANT USAGE ON SEQUENCE payouts_id_seq TO a29_held_game;
               ALTER TABLE payouts OWNER TO a29_held_migrator;"),
    );
    let mut w = db.connect();
    must_run(&mut w, "SET application_name = 'a29-caught'; SET ROLE a29_held_game");
    must_run(
        &mut w,
        "DO $$ BEGIN INSERT INTO payouts (table_id, fencing_token) VALUES (1, 1);
                 EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL; END $$",
    );
    must_run(&mut w, "BEGIN; SAVEPOINT s");
    expect_error(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 2)", "LF001");
    must_run(&mut w, "ROLLBACK TO s; COMMIT");
    must_run(&mut w, "BEGIN");
    expect_error(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 3)", "LF001");
    let _ = w.batch_execute("PREPARE TRANSACTION 'a29_x'"); // an aborted transaction cannot be prepared
    let _ = w.batch_execute("ROLLBACK");
    expect_error(
        &mut w,
        "MERGE INTO payouts p USING (SELECT 1 AS t) s ON false
           WHEN NOT MATCHED THEN INSERT (table_id, fencing_token) VALUES (1, 4)",
        "LF001",
    );
    must_run(&mut w, "RESET ROLE; SET ROLE a29_held_migrator");
    expect_error(&mut w, "TRUNCATE payouts", "LF008");
    assert!(
        wait_until("five refusals", Duration::from_secs(10), || audited(&mut c, "application_name = 'a29-caught'")
            == 5),
        "refusals missing from the audit"
    );
    assert_eq!(
        audited(
            &mut c,
            "application_name = 'a29-caught' AND role = 'a29_held_game' AND sqlstate = 'LF001'
             AND presented_token BETWEEN 1 AND 4 AND current_token = 5"
        ),
        4
    );
    assert_eq!(
        audited(&mut c, "application_name = 'a29-caught' AND role = 'a29_held_migrator' AND sqlstate = 'LF008'"),
        1
    );
}

#[test]
fn roles_cannot_forge_or_remove_audit_rows() {
    let db = TestDb::new("a29_roles");
    let mut c = db.connect();
    roles(&mut c, &["a29_r_migrator", "a29_r_game", "a29_r_dba", "a29_r_metrics"]);
    must_run(
        &mut c,
        &(POKER.to_owned()
            + "GRANT CREATE ON SCHEMA public TO a29_r_migrator;
               GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
                   lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass) TO a29_r_migrator;
               GRANT SELECT ON lease.rejected_writes, lease.stats, lease.leases, lease.sessions,
                   lease.protected_tables TO a29_r_dba;
               GRANT SELECT ON lease.stats, lease.leases TO a29_r_metrics;
               GRANT EXECUTE ON FUNCTION lease._table_stats(), lease.audit_status(), lease.audit_databases()
                   TO a29_r_dba, a29_r_metrics;"),
    );
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    assert!(wait_until("the refusal", Duration::from_secs(10), || audited(&mut c, "true") == 1));
    for role in ["a29_r_migrator", "a29_r_game", "a29_r_dba", "a29_r_metrics"] {
        must_run(&mut c, &format!("SET ROLE {role}"));
        for sql in [
            "INSERT INTO lease.rejected_writes (sqlstate, database) VALUES ('LF001', 'forged')",
            "UPDATE lease.rejected_writes SET role = 'someone else'",
            "DELETE FROM lease.rejected_writes",
            "TRUNCATE lease.rejected_writes",
            "ALTER TABLE lease.rejected_writes ADD COLUMN x int",
            "CREATE TRIGGER x BEFORE INSERT ON lease.rejected_writes FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
            "SELECT lease.purge_rejected_writes('0')",
            "SELECT lease.stats_reset()",
            "SELECT * FROM lease.cluster_rejected_writes(now() - interval '1 day')",
        ] {
            let code = try_sql(&mut c, sql);
            assert_eq!(code, "42501", "{role}: {sql}");
        }
        if role != "a29_r_dba" {
            assert_eq!(try_sql(&mut c, "SELECT * FROM lease.rejected_writes"), "42501", "{role} reads the audit");
        }
        must_run(&mut c, "RESET ROLE");
    }
    assert_eq!(audited(&mut c, "sqlstate = 'LF001' AND database <> 'forged'"), 1);
}
