//! Attack review 28: what PostgreSQL 16, 17 and 18 added, attacked over
//! real connections and real clusters on PostgreSQL 18.6 (pg_lease 0.9.2,
//! the build installed in /opt/pg_lease/pg18). Earlier reviews ran on 15.
//!
//! (Session 15: pg_lease's event triggers are `ENABLE ALWAYS`, so
//! `session_replication_role` no longer silences the DDL guard; the audited
//! row leaves generated columns out; README's Backups section says how to
//! start a physical backup without its `recovery.signal` (raise the epoch
//! with `lease.issue_tokens_above(lease.token_ceiling())` first), and the
//! backup test follows it. Tests of PostgreSQL 17/18 features are not run
//! against an older server.
//! Session 16: a replicated UPDATE of a `lease.lease_state` or
//! `lease.session_state` row the subscriber holds is undone (the old row
//! written back) instead of refused, so the `pg_createsubscriber` findings
//! are closed: the rest of the publisher's transaction, the owner-row bump
//! among it, applies. With `event_triggers = off`, in a database with
//! pg_lease, pg_lease's ProcessUtility hook refuses every command an event
//! trigger would see (`LF008`); event trigger commands go through.)
//!
//! Findings, most severe first:
//!
//! - **Hole (high): a subscriber made by `pg_createsubscriber` (PostgreSQL
//!   17) loses the publisher's token bumps when the DBA does what pg_lease's
//!   refusal says, and a stale write then commits there after the cutover.**
//!   `pg_createsubscriber` turns a physical standby into a logical
//!   subscriber of a `FOR ALL TABLES` publication it creates, so the
//!   subscriber starts with a copy of every `lease.lease_state` row. The
//!   first re-acquire on the publisher of a lease that existed at the
//!   conversion updates that row, and the subscriber's apply worker is
//!   refused (`55000 pg_lease: logical replication subscription
//!   "pg_createsubscriber_..." would overwrite a row of lease.lease_state
//!   this node wrote`, DETAIL "this node took a lease or heartbeat session
//!   under a name the publisher's change is for": it took none), holding
//!   back every later change. The HINT offers `ALTER SUBSCRIPTION ... SKIP
//!   (lsn = ...)`; that skips the whole remote transaction, and the acquire's
//!   owner-row UPDATE (the token bump) is in it. The subscriber's owner row
//!   keeps the old token: after the README's cutover (writers stopped, the
//!   subscriber caught up, `DROP SUBSCRIPTION`), the superseded process's
//!   `INSERT INTO payouts (table_id, fencing_token) VALUES (1, <old token>)`
//!   commits on the new primary. README (Logical replication: "Before
//!   cutting over to the subscriber, stop the writers on the publisher and
//!   let the subscriber catch up: the owner rows carry their tokens over, so
//!   a writer's stale token is refused on the new side too")
//!   (`following_the_hint_after_pg_createsubscriber_keeps_the_token_bump`, fails).
//! - **Hole (high): a physical backup restored as PostgreSQL 17's
//!   `pg_combinebackup` (or plain `pg_basebackup`) leaves it re-issues every
//!   token handed out after the backup.** Full backup, then an incremental
//!   one (`pg_basebackup --incremental=<full>/backup_manifest`, with
//!   `summarize_wal = on`); host-a's next process re-takes table 1
//!   (0x10000000003) and pays; the server is lost; the DBA runs
//!   `pg_combinebackup full incr -o restored` and starts it (no
//!   `recovery.signal`: the combined backup holds the WAL it needs). Crash
//!   recovery from a `backup_label` ends on the same timeline (1), with the
//!   same system identifier (so `lease.token_origin` sees its own
//!   incarnation) and the counter of the backup: host-a's restarted process
//!   re-takes table 1 there and gets 0x10000000003 again, so the previous
//!   process's payout with it commits (two live holders of one token). The
//!   same happens to a plain `pg_basebackup -X stream` directory started as
//!   is (checked by hand). README (Backups: "Physical backups and PITR need
//!   nothing special"; Tokens only rise: "a token an acquire returned is
//!   never issued again")
//!   (`a_restored_incremental_backup_never_reissues_a_token`, fails).
//! - **Hole (medium): replication from a `pg_createsubscriber` copy stops at
//!   the publisher's first renewal, with a DETAIL that blames the
//!   subscriber.** Same setup as the first finding, without the SKIP: the
//!   subscriber never applies host-a's re-acquire (nor anything after it),
//!   so its owner row for table 1 stays at the old token and every payout
//!   after it is missing there. The README promises that "a subscriber
//!   skips every change a replication worker would apply to" pg_lease's
//!   tables and only refuses when "the subscriber took a lease (or heartbeat
//!   session) under a name the publisher also uses"; here it took none
//!   (`a_pg_createsubscriber_copy_applies_the_publishers_token_bumps`, fails).
//!   (`lease.audit_status()` says the changes were "refused by the fence";
//!   it was the guard of pg_lease's own tables.)
//! - **Hole (medium): a table owner allowed to set `session_replication_role`
//!   drops the fence.** pg_lease's event triggers are `ENABLE ORIGIN`
//!   (`pg_event_trigger.evtenabled = 'O'`), so `SET session_replication_role
//!   = replica` silences the whole DDL guard. PostgreSQL 15+ lets a
//!   superuser `GRANT SET ON PARAMETER session_replication_role` to a
//!   non-superuser (loaders and migration tools ask for it to skip
//!   triggers); the migrator, owner of `payouts`, then runs `SET
//!   session_replication_role = replica; DROP TRIGGER pg_lease_fence ON
//!   payouts` (accepted; `LF008` without the setting), and `INSERT INTO
//!   payouts (table_id, fencing_token) VALUES (1, 4)` (current 5) commits.
//!   README, Roles and grants: the migrator cannot "weaken a fence by DDL
//!   (LF008)"; the honest limit names only a superuser
//!   (`a_role_allowed_to_set_session_replication_role_cannot_drop_the_fence`, fails).
//! - **Hole (low): the same with PostgreSQL 17's `event_triggers`
//!   parameter** (the documented way out of a broken login event trigger):
//!   `GRANT SET ON PARAMETER event_triggers TO migrator`; `SET
//!   event_triggers = off; DROP TRIGGER pg_lease_fence ON payouts` is
//!   accepted and a stale INSERT commits. pg_lease's ProcessUtility hook
//!   runs whatever these settings say, and could refuse there
//!   (`a_role_allowed_to_turn_event_triggers_off_cannot_drop_the_fence`, fails).
//! - **Hole (low): with `pg_lease.audit_row` on, the audit says a refused
//!   row's `VIRTUAL` generated column (PostgreSQL 18's default kind) was
//!   NULL.** `bets.doubled GENERATED ALWAYS AS (amount * 2) VIRTUAL`; the
//!   refused `INSERT INTO bets (table_id, tok, amount) VALUES (1, 4, 7)` is
//!   recorded as `{"tok": 4, "amount": 7, "doubled": null, "table_id": 1}`:
//!   BEFORE triggers see virtual (and stored) generated columns as NULL; the
//!   row would have read 14. Leave them out, or compute them
//!   (`the_audited_row_does_not_claim_a_virtual_column_was_null`, fails).
//! - **Defence holds: `COPY ... (ON_ERROR ignore)` and `REJECT_LIMIT`
//!   (PostgreSQL 17/18) skip no refused row.** A stale row in the input
//!   aborts the whole COPY with `LF001`, nothing of it commits, and the
//!   refusal is in `lease.rejected_writes`; a row whose token does not even
//!   parse is skipped as the option says (it was never written)
//!   (`copy_on_error_ignore_never_skips_a_refused_row`).
//! - **Defence holds: MERGE's new forms are fenced.** `WHEN NOT MATCHED BY
//!   SOURCE THEN DELETE` (17) without a bound token (`LF003`) and with a
//!   stale one (`LF001`), MERGE into an auto-updatable view (17) inserting
//!   and updating with a stale token, `RETURNING merge_action(), old.*,
//!   new.*` (17/18): each refused (`merge_new_forms_are_fenced`).
//! - **Defence holds: a login event trigger (17) that sets `pg_lease.token`
//!   for the session binds nothing**: `SHOW pg_lease.token` shows the value,
//!   but `lease.bound_token()` is NULL and a DELETE in the next transaction
//!   gets `LF003` (`a_login_event_trigger_binds_no_token`).
//! - **Defence holds: PostgreSQL 18's owner-table shapes that could not
//!   identify a resource or hold its token are refused**: a temporal key
//!   (`PRIMARY KEY (id, valid_at WITHOUT OVERLAPS)`, `UNIQUE ... WITHOUT
//!   OVERLAPS`: a GiST index that PostgreSQL marks unique) is no owner key
//!   (`42830`); a `VIRTUAL` generated owner token column is refused
//!   (`42611`); dropping the btree owner constraint while a temporal primary
//!   key covers the same columns is `LF008`
//!   (`temporal_keys_and_virtual_owner_tokens_are_refused`).
//! - **Defence holds: a role with only `MAINTAIN` (17) on the fenced and
//!   owner tables** runs `REINDEX ... CONCURRENTLY` (the owner key index gets
//!   a new OID), `CLUSTER`, `VACUUM FULL`, `LOCK`; the fence then still
//!   refuses a stale write and accepts the current token in the same
//!   session (`maintenance_by_a_maintain_role_leaves_the_fence_working`).
//!
//! Looked at, no hole found (not kept as tests): virtual or stored generated
//! key and token columns arriving through `CREATE TABLE ... PARTITION OF`
//! with a generation expression or `ATTACH PARTITION` (PostgreSQL itself
//! refuses a generated child column under a plain parent column, 42611 /
//! 42804); `ALTER COLUMN ... SET EXPRESSION` on a fenced or owner token
//! column (only generated columns have one); `ALTER CONSTRAINT ... NOT
//! ENFORCED` / `DEFERRABLE` on the owner key (PostgreSQL refuses both for a
//! primary key); dropping a primary key column's `NOT NULL` constraint
//! (refused); `ALTER SYSTEM SET pg_lease.token` (17 accepts unknown custom
//! names; pg_lease's check hook refuses, 22023) and a misspelt `pg_lease.*`
//! name there (42602); `transaction_timeout` (17); `ALTER TABLE ... SPLIT /
//! MERGE PARTITION(S)` (not in 18.6: syntax error); `fenced_boundary_write`
//! into a table with virtual columns (written as they should be; a value
//! given for one is PostgreSQL's 428C9 with CONTEXT). Not tried for lack of
//! time: `pg_upgrade --swap` (18), subscriptions owned by non-superusers
//! with `run_as_owner` (16) beyond what replication.rs covers.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::process::Command;
use std::time::Duration;

fn scratch_root() -> String {
    std::env::var("PG_LEASE_SCRATCH").unwrap_or_else(|_| "/var/tmp/pg_lease".to_owned())
}

/// Runs a command as the postgres user (the servers' owner); its output.
#[track_caller]
fn as_postgres(args: &[&str]) -> String {
    let out = Command::new("sudo").arg("-u").arg("postgres").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn bin(program: &str) -> String {
    pg_bin(program).to_string_lossy().into_owned()
}

/// `owner` (re-)takes table 1, bound to its owner row.
fn take(c: &mut Client, owner: &str) -> i64 {
    c.query_one(&format!("SELECT token FROM lease.acquire('table:1', '{owner}', 60000, 'tables', '{{1}}')"), &[])
        .unwrap()
        .get(0)
}

fn owner_token(c: &mut Client) -> Option<i64> {
    c.query_one("SELECT owner_fencing_token FROM tables WHERE id = 1", &[]).unwrap().get(0)
}

/// A publisher (`wal_level = logical`) with database `game` (the poker
/// schema, host-a holding table 1), and a subscriber of it made from a
/// physical standby by `pg_createsubscriber`: (publisher, subscriber,
/// host-a's token at the conversion).
fn createsubscriber_pair(label: &str, port: u16) -> (Cluster, Cluster, i64) {
    let publisher = Cluster::start_with(&format!("{label}_pub"), port, &["wal_level = logical"]);
    let mut p = publisher.connect();
    must_run(&mut p, "CREATE DATABASE game");
    let mut g = publisher.connect_db("game");
    must_run(&mut g, &format!("CREATE EXTENSION pg_lease; {POKER}"));
    let before = take(&mut g, "host-a");
    must_run(&mut g, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {before})"));
    let standby = Cluster::standby_of(&publisher, &format!("{label}_sub"), port + 1);
    wait_for_replay(&mut p, &mut standby.connect());
    standby.stop();
    // PostgreSQL 17's way from a physical standby to a logical subscriber.
    let dir = format!("{}/{}", scratch_root(), standby.name);
    let publisher_conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=game", publisher.port);
    let out = Command::new("sudo")
        .current_dir("/tmp")
        .args(["-u", "postgres", &bin("pg_createsubscriber"), "-D", &dir, "-P", &publisher_conninfo])
        .args(["-d", "game", "-p", &standby.port.to_string(), "-s", &format!("{dir}.sock"), "-U", "postgres"])
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_createsubscriber: {}", String::from_utf8_lossy(&out.stderr));
    standby.restart();
    (publisher, standby, before)
}

/// Hole (high). See the module comment.
#[test]
fn following_the_hint_after_pg_createsubscriber_keeps_the_token_bump() {
    if !at_least(17, "pg_createsubscriber") {
        return;
    }
    let (publisher, subscriber, old) = createsubscriber_pair("a28_csskip", 55180);
    let mut g = publisher.connect_db("game");
    let mut s = subscriber.connect_db("game");
    // host-a's process is replaced on the publisher: the token is bumped.
    let new = take(&mut g, "host-a");
    assert!(new > old);
    // Cutover (README, Blue/green step 5): the writers stop; a last marker
    // row shows when the subscriber has everything.
    must_run(&mut g, "INSERT INTO balances VALUES ('marker', 1)");
    let arrived = |s: &mut Client| one_i64(s, "SELECT count(*) FROM balances WHERE player = 'marker'") == 1;
    if !poll_until(Duration::from_secs(20), || arrived(&mut s)) {
        // The worker is held back by pg_lease's refusal: do what its HINT says.
        let log = subscriber.server_log();
        let refused = log.lines().position(|l| l.contains("would overwrite a row of lease.lease_state"));
        let refused = refused.unwrap_or_else(|| panic!("replication stalled without pg_lease's refusal:\n{log}"));
        let hint = log.lines().skip(refused).find(|l| l.contains("HINT:")).unwrap_or("");
        assert!(hint.contains("SKIP (lsn = ...)"), "the refusal's HINT: {hint}");
        let lsn = log
            .lines()
            .skip(refused)
            .find_map(|l| l.split("finished at ").nth(1))
            .expect("the refused change's LSN in its CONTEXT")
            .trim()
            .to_owned();
        let sub: String = s.query_one("SELECT subname::text FROM pg_subscription", &[]).unwrap().get(0);
        must_run(&mut s, &format!("ALTER SUBSCRIPTION \"{sub}\" SKIP (lsn = '{lsn}')"));
        assert!(
            poll_until(Duration::from_secs(30), || arrived(&mut s)),
            "the subscriber never caught up, even after SKIP"
        );
    }
    let sub: String = s.query_one("SELECT subname::text FROM pg_subscription", &[]).unwrap().get(0);
    must_run(&mut s, &format!("DROP SUBSCRIPTION \"{sub}\""));
    // host-a's superseded process (token `old`) now reaches the new primary.
    let there = owner_token(&mut s);
    let stale = try_sql(&mut s, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {old})"));
    assert!(
        stale.starts_with("LF"),
        "the superseded token {old:#x} committed on the subscriber ({stale:?}): its owner row holds {there:?}, \
         the publisher's {new:#x} (the SKIP the HINT offers dropped the acquire's owner-row UPDATE)"
    );
    // The new primary's first acquire issues above everything it holds.
    let next = take(&mut s, "host-a");
    assert!(next > new, "the subscriber's first token {next:#x} is not above the publisher's {new:#x}");
    must_run(&mut s, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {next})"));
    expect_error(&mut s, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {new})"), "LF001");
}

/// Hole (medium). See the module comment.
#[test]
fn a_pg_createsubscriber_copy_applies_the_publishers_token_bumps() {
    if !at_least(17, "pg_createsubscriber") {
        return;
    }
    let (publisher, subscriber, old) = createsubscriber_pair("a28_csapply", 55184);
    let mut g = publisher.connect_db("game");
    let mut s = subscriber.connect_db("game");
    let new = take(&mut g, "host-a");
    must_run(&mut g, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {new})"));
    let caught_up = poll_until(Duration::from_secs(20), || owner_token(&mut s) == Some(new));
    let status: String = s.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(
        caught_up,
        "the subscriber's owner row for table 1 stays at {:?} (old {old:#x}, publisher {new:#x}); \
         pg_lease's status: {status}",
        owner_token(&mut s)
    );
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts"), 2);
}

/// A server lost after issuing a token, restored from a physical backup
/// taken before, started as it is (no `recovery.signal`), the README's raise
/// (Backups) run on it first; then host-a's restarted process re-takes table
/// 1 there and its previous process pays with the token the lost server
/// gave it. Returns (that token, the restored server's, the payout's
/// SQLSTATE, the timeline). `incremental`: a full and an incremental backup
/// combined by `pg_combinebackup` (PostgreSQL 17), else one
/// `pg_basebackup`.
fn backup_restored_as_it_is(label: &str, port: u16, incremental: bool) -> (i64, i64, String, i64) {
    let root = scratch_root();
    let dir = format!("{root}/{label}_restored");
    let full = format!("{root}/{label}_backup_full");
    let incr = format!("{root}/{label}_backup_incr");
    for d in [&dir, &format!("{dir}.sock"), &full, &incr] {
        as_postgres(&["rm", "-rf", d]);
    }
    let conf: &[&str] = if incremental { &["summarize_wal = on"] } else { &[] };
    let original = Cluster::start_with(&format!("{label}_src"), port, conf);
    let mut c = original.connect();
    must_run(&mut c, &format!("CREATE EXTENSION pg_lease; {POKER}"));
    let first = take(&mut c, "host-a");
    let backup = |extra: &[&str], into: &str| {
        let port = original.port.to_string();
        let mut args = vec![bin("pg_basebackup")];
        args.extend(
            ["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-X", "stream", "--no-sync", "-c", "fast", "-D", into]
                .map(str::to_owned),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        as_postgres(&args.iter().map(String::as_str).collect::<Vec<_>>());
    };
    if incremental {
        // The weekly full backup, then the nightly incremental one (17).
        backup(&[], &full);
        take(&mut c, "host-a");
        backup(&[&format!("--incremental={full}/backup_manifest")], &incr);
    } else {
        take(&mut c, "host-a");
        backup(&[], &dir);
    }
    // The next day host-a's newest process re-takes table 1 and pays.
    let handed_out = take(&mut c, "host-a");
    must_run(&mut c, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {handed_out})"));
    drop(c);
    // The server is lost; the DBA restores the backup.
    original.crash();
    if incremental {
        as_postgres(&[&bin("pg_combinebackup"), &full, &incr, "-o", &dir, "--no-sync"]);
    }
    let port = port + 1 + port_offset();
    as_postgres(&["mkdir", "-p", &format!("{dir}.sock")]);
    as_postgres(&[
        "sh",
        "-c",
        &format!(
            "printf \"port = {port}\\nunix_socket_directories = '{dir}.sock'\\n{}\" >> {dir}/postgresql.conf",
            if incremental { "summarize_wal = off\\n" } else { "" }
        ),
    ]);
    as_postgres(&[&bin("pg_ctl"), "-D", &dir, "-l", &format!("{dir}/server.log"), "-w", "start"]);
    let restored = Cluster { name: format!("{label}_restored"), port, pg_config: None };
    let mut r = restored.connect();
    assert!(first < handed_out && handed_out >> 40 == 1, "tokens of epoch 1 before the loss");
    assert_eq!(one_i64(&mut r, "SELECT count(*) FROM payouts"), 0, "restored to before the payout");
    // README, Backups: before it serves leases.
    must_run(&mut r, "SELECT lease.issue_tokens_above(lease.token_ceiling())");
    // host-a's process restarts against the restored server and re-takes
    // table 1; the previous one, still running with `handed_out`, pays.
    let next = take(&mut r, "host-a");
    let timeline = one_i64(&mut r, "SELECT timeline_id::bigint FROM pg_control_checkpoint()");
    let stale = try_sql(&mut r, &format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {handed_out})"));
    drop(r);
    drop(restored);
    for d in [&full, &incr] {
        as_postgres(&["rm", "-rf", d]);
    }
    (handed_out, next, stale, timeline)
}

/// Hole (high), closed by README (Backups): a backup directory started as it
/// is stays on the lost server's timeline with the backup's counter; the
/// README's raise before it serves leases keeps every token it issues above
/// the lost server's. See the module comment.
#[test]
fn a_restored_incremental_backup_never_reissues_a_token() {
    let mut runs = vec![("a28_base", 55188, false)];
    if server_version_num() >= 170_000 {
        runs.push(("a28_incr", 55190, true));
    }
    for (label, port, incremental) in runs {
        let (handed_out, next, stale, timeline) = backup_restored_as_it_is(label, port, incremental);
        assert!(
            next > handed_out && stale.starts_with("LF"),
            "{label}: the restored backup (timeline {timeline}), raised as README says, issued {next:#x}; host-a's \
             previous process holds {handed_out:#x} from the lost server; its payout there: {stale:?} (\"\" = committed)"
        );
    }
}

/// A database of the scratch cluster with the poker schema; table 1's
/// current token is 5 (`POKER`).
fn poker(label: &str) -> (TestDb, Client) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    must_run(&mut c, POKER);
    (db, c)
}

/// Defence holds. See the module comment.
#[test]
fn copy_on_error_ignore_never_skips_a_refused_row() {
    if !at_least(18, "COPY ... REJECT_LIMIT") {
        return;
    }
    let (_db, mut c) = poker("a28_copy");
    let audited = |c: &mut Client| {
        one_i64(c, "SELECT count(*) FROM lease.rejected_writes WHERE sqlstate = 'LF001' AND presented_token = 4")
    };
    for options in ["ON_ERROR ignore", "ON_ERROR ignore, REJECT_LIMIT 5"] {
        let before = audited(&mut c);
        let copy = format!("COPY payouts (table_id, hand, fencing_token) FROM STDIN WITH ({options})");
        let mut w = c.copy_in(copy.as_str()).unwrap();
        use std::io::Write;
        w.write_all(b"1\t1\t5\n1\t2\t4\n1\t3\tnot-a-token\n2\t4\t5\n").unwrap();
        let r = w.finish();
        assert_eq!(sqlstate(&r), "LF001", "COPY ({options}) with a stale row: {r:?}");
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 0, "nothing of the COPY ({options}) commits");
        assert!(
            poll_until(Duration::from_secs(10), || audited(&mut c) > before),
            "the refusal in COPY ({options}) was not audited"
        );
    }
    // The option still does its own job: a token that does not parse is
    // skipped (that row was never written), the valid rows commit.
    let mut w = c.copy_in("COPY payouts (table_id, hand, fencing_token) FROM STDIN WITH (ON_ERROR ignore)").unwrap();
    use std::io::Write;
    w.write_all(b"1\t1\t5\n1\t3\tnot-a-token\n").unwrap();
    assert_eq!(w.finish().unwrap(), 1);
}

/// Defence holds. See the module comment.
#[test]
fn merge_new_forms_are_fenced() {
    if !at_least(18, "RETURNING old/new") {
        return;
    }
    let (_db, mut c) = poker("a28_merge");
    must_run(&mut c, "INSERT INTO payouts (table_id, hand, fencing_token) VALUES (1, 1, 5), (2, 1, 5)");
    must_run(&mut c, "CREATE VIEW payouts_v AS SELECT * FROM payouts");
    let by_source = "MERGE INTO payouts p USING (SELECT 2 AS table_id) s ON p.table_id = s.table_id \
                     WHEN NOT MATCHED BY SOURCE THEN DELETE RETURNING merge_action(), old.*";
    assert_eq!(must_fail(&mut c, by_source)[0], "LF003", "NOT MATCHED BY SOURCE THEN DELETE, no token bound");
    let stale = format!("BEGIN; SELECT lease.bind_token(4); {by_source}; COMMIT");
    assert_eq!(must_fail(&mut c, &stale)[0], "LF001", "NOT MATCHED BY SOURCE THEN DELETE, stale token bound");
    must_run(&mut c, "ROLLBACK");
    let into_view = "MERGE INTO payouts_v v USING (VALUES (1, 9, 4)) s(t, h, k) ON v.hand = s.h \
                     WHEN NOT MATCHED THEN INSERT (table_id, hand, fencing_token) VALUES (s.t, s.h, s.k) RETURNING new.*";
    assert_eq!(must_fail(&mut c, into_view)[0], "LF001", "MERGE INSERT into a view, stale token");
    let update_view = "MERGE INTO payouts_v v USING (VALUES (1, 4)) s(t, k) ON v.table_id = s.t \
                       WHEN MATCHED THEN UPDATE SET fencing_token = s.k RETURNING old.fencing_token, new.fencing_token";
    assert_eq!(must_fail(&mut c, update_view)[0], "LF001", "MERGE UPDATE through a view, stale token");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts WHERE fencing_token = 5"), 2);
    // The current token goes through the same forms.
    must_run(&mut c, &format!("BEGIN; SELECT lease.bind_token(5); {by_source}; COMMIT"));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM payouts"), 1);
}

/// Defence holds. See the module comment.
#[test]
fn a_login_event_trigger_binds_no_token() {
    if !at_least(17, "a login event trigger") {
        return;
    }
    let (db, mut c) = poker("a28_login");
    must_run(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)");
    must_run(
        &mut c,
        "CREATE FUNCTION bind_at_login() RETURNS event_trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM set_config('pg_lease.token', '5', false); END $$;
         CREATE EVENT TRIGGER bind_at_login ON login EXECUTE FUNCTION bind_at_login();",
    );
    let mut s = db.connect();
    let shown: String = s.query_one("SHOW pg_lease.token", &[]).unwrap().get(0);
    assert_eq!(shown, "5", "the login trigger ran");
    let bound: Option<i64> = s.query_one("SELECT lease.bound_token()", &[]).unwrap().get(0);
    assert_eq!(bound, None, "a token set at login is bound to no later transaction");
    assert_eq!(must_fail(&mut s, "DELETE FROM payouts")[0], "LF003");
    assert_eq!(must_fail(&mut s, "BEGIN; DELETE FROM payouts; COMMIT")[0], "LF003");
    must_run(&mut s, "ROLLBACK");
    must_run(&mut c, "DROP EVENT TRIGGER bind_at_login");
}

/// Defence holds. See the module comment.
#[test]
fn temporal_keys_and_virtual_owner_tokens_are_refused() {
    if !at_least(18, "WITHOUT OVERLAPS") {
        return;
    }
    let db = TestDb::new("a28_temporal");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE rooms (id int4range, valid_at daterange, owner_fencing_token bigint,
                             PRIMARY KEY (id, valid_at WITHOUT OVERLAPS));
         CREATE TABLE rooms_u (id int4range, valid_at daterange, owner_fencing_token bigint,
                               UNIQUE (id, valid_at WITHOUT OVERLAPS));
         CREATE TABLE bets (room int4range, valid_at daterange, tok bigint);",
    );
    for owner in ["rooms", "rooms_u"] {
        let r = must_fail(
            &mut c,
            &format!("SELECT lease.protect('bets', '{{room,valid_at}}', 'tok', '{owner}', '{{id,valid_at}}')"),
        );
        assert_eq!(r[0], "42830", "a temporal key of {owner} as the owner key: {r:?}");
    }
    must_run(
        &mut c,
        "CREATE TABLE vt (id int PRIMARY KEY, raw bigint, owner_fencing_token bigint GENERATED ALWAYS AS (raw) VIRTUAL);
         CREATE TABLE vp (id int, tok bigint);",
    );
    let r = must_fail(&mut c, "SELECT lease.protect('vp', '{id}', 'tok', 'vt')");
    assert_eq!(r[0], "42611", "a virtual owner token column: {r:?}");
    // A btree key beside a temporal one over the same columns: the fence
    // uses the btree one, which cannot be dropped.
    must_run(
        &mut c,
        "CREATE TABLE rooms2 (id int4range, valid_at daterange, owner_fencing_token bigint,
                              PRIMARY KEY (id, valid_at WITHOUT OVERLAPS), CONSTRAINT bt UNIQUE (id, valid_at));
         SELECT lease.protect('bets', '{room,valid_at}', 'tok', 'rooms2', '{id,valid_at}');
         INSERT INTO rooms2 VALUES ('[1,2)', '[2026-01-01,2026-02-01)', 5);",
    );
    assert_eq!(must_fail(&mut c, "ALTER TABLE rooms2 DROP CONSTRAINT bt")[0], "LF008");
    let stale = "INSERT INTO bets VALUES ('[1,2)', '[2026-01-01,2026-02-01)', 4)";
    assert_eq!(must_fail(&mut c, stale)[0], "LF001");
}

/// Defence holds. See the module comment.
#[test]
fn maintenance_by_a_maintain_role_leaves_the_fence_working() {
    if !at_least(17, "the MAINTAIN privilege") {
        return;
    }
    let (db, mut c) = poker("a28_maintain");
    let role = format!("{}_mnt", db.name);
    must_run(
        &mut c,
        &format!("CREATE ROLE {role} LOGIN; GRANT MAINTAIN ON tables, payouts TO {role}; GRANT CONNECT ON DATABASE {} TO {role}", db.name),
    );
    let mut w = db.connect();
    must_run(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)");
    let index_before = one_i64(&mut c, "SELECT 'tables_pkey'::regclass::oid::bigint");
    let mut m = db.connect_as(&role);
    for maintenance in [
        "REINDEX TABLE CONCURRENTLY tables",
        "REINDEX INDEX CONCURRENTLY tables_pkey",
        "CLUSTER tables USING tables_pkey",
        "VACUUM FULL tables",
        "VACUUM FULL payouts",
        "ANALYZE tables",
        "BEGIN; LOCK TABLE tables IN ACCESS EXCLUSIVE MODE; COMMIT",
    ] {
        must_run(&mut m, maintenance);
    }
    assert_ne!(
        one_i64(&mut c, "SELECT 'tables_pkey'::regclass::oid::bigint"),
        index_before,
        "the key index was rebuilt"
    );
    // The same (warm) session, and a new one.
    assert_eq!(must_fail(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)")[0], "LF001");
    must_run(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)");
    assert_eq!(must_fail(&mut db.connect(), "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)")[0], "LF001");
    drop(m);
    must_run(&mut c, &format!("DROP OWNED BY {role}; DROP ROLE {role}"));
}

/// The owner of a fenced table, not a superuser, granted `SET` on
/// `parameter` (PostgreSQL 15's `GRANT SET ON PARAMETER`), sets it to
/// `value` and drops the fence: what the DDL guard said, and what a stale
/// INSERT then gave (`None`: the DROP was refused).
fn drop_fence_with(label: &str, parameter: &str, value: &str) -> (Option<[String; 2]>, String) {
    let (db, mut c) = poker(label);
    let role = format!("{}_mig", db.name);
    must_run(
        &mut c,
        &format!(
            "CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE {} TO {role};
             ALTER TABLE payouts OWNER TO {role}; ALTER TABLE tables OWNER TO {role};
             GRANT SET ON PARAMETER {parameter} TO {role};",
            db.name
        ),
    );
    let mut m = db.connect_as(&role);
    // Without the setting the guard refuses, as the README says.
    assert_eq!(must_fail(&mut m, "DROP TRIGGER pg_lease_fence ON payouts")[0], "LF008");
    must_run(&mut m, &format!("SET {parameter} = {value}"));
    let dropped = failure(&mut m, "DROP TRIGGER pg_lease_fence ON payouts");
    must_run(&mut m, &format!("RESET {parameter}"));
    let stale = try_sql(&mut m, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)");
    drop(m);
    must_run(
        &mut c,
        &format!(
            "REVOKE SET ON PARAMETER {parameter} FROM {role}; REASSIGN OWNED BY {role} TO postgres;
             DROP OWNED BY {role}; DROP ROLE {role}"
        ),
    );
    (dropped, stale)
}

/// Hole (medium), closed. See the module comment.
#[test]
fn a_role_allowed_to_set_session_replication_role_cannot_drop_the_fence() {
    let (refused, stale) = drop_fence_with("a28_srr", "session_replication_role", "replica");
    assert!(
        refused.is_some(),
        "with session_replication_role = replica the table's owner dropped pg_lease_fence (pg_lease's event \
         triggers are ENABLE ORIGIN); a stale INSERT then gave {stale:?} (\"\" = committed)"
    );
}

/// Hole (low). See the module comment.
#[test]
fn a_role_allowed_to_turn_event_triggers_off_cannot_drop_the_fence() {
    if !at_least(17, "the event_triggers parameter") {
        return;
    }
    let (refused, stale) = drop_fence_with("a28_evtoff", "event_triggers", "off");
    assert!(
        refused.is_some(),
        "with event_triggers = off the table's owner dropped pg_lease_fence; a stale INSERT then gave {stale:?} \
         (\"\" = committed)"
    );
    assert_eq!(refused.as_ref().map(|e| e[0].as_str()), Some("LF008"), "{refused:?}");
    // What the setting is for still works, and nothing else of a database
    // without pg_lease is refused.
    let db = TestDb::new("a28_evtoff_repair");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE FUNCTION broken() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'broken'; END $$;
         CREATE EVENT TRIGGER broken ON ddl_command_start EXECUTE FUNCTION broken();",
    );
    must_run(&mut c, "SET event_triggers = off; ALTER EVENT TRIGGER broken DISABLE; DROP EVENT TRIGGER broken");
    expect_error(&mut c, "CREATE TABLE t (a int)", "LF008");
    must_run(&mut c, "RESET event_triggers; CREATE TABLE t (a int)");
    let plain = TestDb::new("a28_evtoff_plain");
    let mut p = plain.connect();
    must_run(&mut p, "DROP EXTENSION pg_lease; SET event_triggers = off; CREATE TABLE t (a int); DROP TABLE t");
}

/// Hole (low), closed. See the module comment. A STORED generated column
/// too (any major): a BEFORE trigger sees it NULL as well.
#[test]
fn the_audited_row_does_not_claim_a_virtual_column_was_null() {
    let kinds: &[&str] = if server_version_num() >= 180_000 { &["STORED", "VIRTUAL"] } else { &["STORED"] };
    for kind in kinds {
        let db = TestDb::new(&format!("a28_audit_{}", kind.to_lowercase()));
        let mut c = db.connect();
        must_run(
            &mut c,
            &format!(
                "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
                 INSERT INTO tables VALUES (1, 5);
                 CREATE TABLE bets (table_id int, tok bigint, amount int,
                                    doubled int GENERATED ALWAYS AS (amount * 2) {kind});
                 SELECT lease.protect('bets', '{{table_id}}', 'tok', 'tables');"
            ),
        );
        must_run(&mut c, "SET pg_lease.audit_row = on");
        assert_eq!(must_fail(&mut c, "INSERT INTO bets (table_id, tok, amount) VALUES (1, 4, 7)")[0], "LF001");
        let recorded = |c: &mut Client| {
            one_i64(c, "SELECT count(*) FROM lease.rejected_writes WHERE target_table = 'public.bets' AND database = current_database()")
        };
        assert!(poll_until(Duration::from_secs(10), || recorded(&mut c) == 1), "the refusal was not audited");
        let row: String = c
            .query_one("SELECT row_data::text FROM lease.rejected_writes WHERE target_table = 'public.bets' AND database = current_database()", &[])
            .unwrap()
            .get(0);
        let doubled: Option<String> = c
            .query_one(
                "SELECT CASE WHEN row_data ? 'doubled' THEN row_data->>'doubled' ELSE 'absent' END
                   FROM lease.rejected_writes WHERE target_table = 'public.bets' AND database = current_database()",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            matches!(doubled.as_deref(), Some("14") | Some("absent")) && row.contains("\"amount\": 7"),
            "the refused row had doubled = 14 (amount 7 * 2, {kind}); the audit keeps {row}"
        );
    }
}
