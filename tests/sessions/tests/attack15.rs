//! Attack review 15 (0.9.0: every token `epoch << 40 | counter`, the
//! counter drawn from one sequence, `lease.token_counter`; a stored token
//! above it gives `stored + 1` and moves the counter; one owner row, one
//! lease, judged by the row's token; acquire's commit forced synchronous),
//! over real connections. Review 14's tests (attack14.rs) are not repeated.
//!
//! Tests marked **Hole** fail at the commit they were written against
//! (28cee54); those marked **Defence holds** pass and document what was
//! tried. Most severe first:
//!
//! - high: a role allowed to UPDATE owner rows raises one row's token to its
//!   epoch's second-to-last counter (`E << 40 | 2^40 - 2`). The next acquire
//!   bound to that row issues `stored + 1`, whose counter is the sequence's
//!   MAXVALUE, and moves the counter there: from then on every acquire in the
//!   database, of every lease, bound or not, fails with the sequence's
//!   `2200H` "nextval: reached maximum value", and the re-take that would
//!   fence a stale process is impossible;
//! - high: the same without any act under 0.9.0: a lease whose 0.8.0 token
//!   has a counter near 2^40 (an owner row raised by hand under 0.8.0) makes
//!   the 0.8.0 -> 0.9.0 upgrade set the counter to it, and every acquire
//!   after `ALTER EXTENSION pg_lease UPDATE` fails with `2200H`;
//! - medium: two owner rows whose tokens are an epoch's last counter
//!   (`E << 40 | 2^40 - 1`) give two acquires the same token
//!   `(E + 1) << 40` (the `stored + 1` crosses into the next epoch, so the
//!   counter is not moved): "two acquires never get the same token" breaks;
//! - medium: with that shared token, the holder of one row re-binds its
//!   lease to the other row: the rival check is skipped because the row's
//!   token equals the lease's own, so it takes a row held by a live lease of
//!   another owner, with no `LF005` and no loss reported to that owner;
//! - low: `ALTER SEQUENCE lease.token_counter RESTART` (a DBA tidying
//!   sequences) is accepted, not `LF008`: the next fresh lease is issued a
//!   token another lease already holds;
//! - low: under row-level security, a role with only `UPDATE` on the owner
//!   table (which the README says suffices) cannot bind a row its UPDATE
//!   policy lets it update: aclchk's `42501` "permission denied for table";
//! - low: `FORCE ROW LEVEL SECURITY` with a SELECT-only policy makes every
//!   bound acquire fail with `LF007` "owner row ... does not exist" for a
//!   row that exists and the caller sees (the owner's `FOR UPDATE` lock is
//!   filtered by the forced policies): no holder can re-take its lease;
//! - low: two single autocommit calls deadlock (`40P01`): a bound acquire of
//!   a new name that waited for an in-flight payout, and the holder's own
//!   re-take queued behind it (README Limits says single calls cannot).
//!
//! Defences that held: a token seen in an acquire that rolled back under
//! `synchronous_commit = off` is not issued again after `kill -9`; an
//! acquire committed through `PREPARE TRANSACTION` / `COMMIT PREPARED` under
//! `synchronous_commit = off` survives `kill -9`, and so does one through a
//! wrapper function declared `SET synchronous_commit = off`; an owner token raised by
//! hand as high as allowed (`2^62 - 1`: past it is `22003`) moves every
//! lease to a high epoch, yet acquire still works after a failover.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const TTL: i32 = 60_000;
/// A token's counter bits (2^40 - 1): `lease.token_counter`'s MAXVALUE.
const MASK: i64 = (1 << 40) - 1;

fn ok(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {:?}", e.as_db_error()));
}

/// `acquire(...)`'s token, or its SQLSTATE and message.
fn acquire(c: &mut Client, args: &str) -> Result<i64, String> {
    c.query_one(&format!("SELECT token FROM lease.acquire({args})"), &[]).map(|r| r.get(0)).map_err(|e| {
        let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
        format!("{code}: {}", e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default())
    })
}

/// The epoch tokens are issued in now (the timeline, no raise).
fn epoch(c: &mut Client) -> i64 {
    one_i64(c, "SELECT lease._token_floor() >> 40")
}

/// A database with the poker owner table (rows 1..=4, no token yet) and a
/// role `upd_<db>` allowed to UPDATE its owner rows (as the README's roles
/// table allows a role to be: it cannot lower or clear a token).
fn owner_rows_and_updater(label: &str) -> (TestDb, Client, String) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    let updater = format!("upd_{}", db.name);
    ok(
        &mut c,
        &format!(
            "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
             INSERT INTO tables VALUES (1, NULL), (2, NULL), (3, NULL), (4, NULL);
             DO $$ BEGIN CREATE ROLE {updater} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT SELECT, UPDATE ON tables TO {updater};"
        ),
    );
    (db, c, updater)
}

/// **Hole (high).** Attack: a role allowed to UPDATE owner rows (no rights
/// on anything of pg_lease's) raises owner row 2's token to
/// `E << 40 | 2^40 - 2` (raising is allowed: only lowering is `LF004`).
/// srv2 acquires the lease bound to row 2: `stored + 1` has the counter's
/// MAXVALUE, and acquire moves `lease.token_counter` there. Observed: every
/// later acquire in the database fails with `2200H` "nextval: reached
/// maximum value of sequence token_counter" — srv1's re-take of its own
/// lease `a` on row 1 (how a restarted process fences its predecessor) and a
/// fresh unbound lease alike — until a superuser resets the sequence.
/// Expected: a stored token at an epoch's top does not exhaust the
/// database's counter (the token moves to a higher epoch, or the raise is
/// refused), and acquires of other leases keep working.
#[test]
fn hand_raised_owner_token_at_an_epochs_top_exhausts_the_counter_for_every_lease() {
    let (db, mut c, updater) = owner_rows_and_updater("a15_exhaust");
    let first = acquire(&mut c, &format!("'a', 'srv1', {TTL}, 'tables', '{{1}}'")).unwrap();
    let e = epoch(&mut c);
    let mut u = db.connect_as(&updater);
    ok(&mut u, &format!("UPDATE tables SET owner_fencing_token = {} WHERE id = 2", (e << 40) | (MASK - 1)));
    let b = acquire(&mut c, &format!("'b', 'srv2', {TTL}, 'tables', '{{2}}'")).unwrap();
    // (0.9.0 as first written issued stored + 1 here and moved the counter to
    // its top; now the token goes to the next epoch with the counter drawn.)
    assert!(b > (e << 40) | (MASK - 1), "the bound acquire issues above the row's token: {b}");
    let retake = acquire(&mut c, &format!("'a', 'srv1', {TTL}, 'tables', '{{1}}'"));
    let fresh = acquire(&mut c, &format!("'other', 'srv3', {TTL}"));
    assert!(
        retake.as_ref().is_ok_and(|&t| t > first) && fresh.is_ok(),
        "after one owner row was raised to the epoch's top, srv1's re-take of `a` gave {retake:?} and a fresh \
         unbound lease gave {fresh:?}"
    );
}

/// **Hole (high).** Attack: under 0.8.0 (each lease counted its own tokens)
/// a lease bound to an owner row that had been raised by hand to
/// `E << 40 | 2^40 - 2` holds `E << 40 | 2^40 - 1` (simulated here by the
/// row 0.8.0's acquire leaves, since the installed library is 0.9.0's). The
/// DBA runs `ALTER EXTENSION pg_lease UPDATE`, whose script sets the counter
/// to the highest counter of any lease's token. Observed: the counter is at
/// its MAXVALUE, and every acquire after the upgrade fails with `2200H`.
/// Expected: the upgrade carries existing tokens without leaving the
/// database unable to issue any token.
#[test]
fn upgrade_from_0_8_0_with_a_lease_at_an_epochs_top_leaves_no_token_to_issue() {
    let db = TestDb::new("a15_upgrade");
    let mut c = db.connect();
    let top = (1_i64 << 40) | MASK;
    ok(
        &mut c,
        &format!(
            "DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.8.0';
             CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
             INSERT INTO tables VALUES (1, {top}), (2, NULL);
             INSERT INTO lease.lease_state (name, owner, token, acquired_at, renewed_at, expires_at, owner_table, owner_key)
                  VALUES ('a', 'srv1', {top}, now(), now(), now() + interval '1 hour', 'tables', '{{1}}');
             ALTER EXTENSION pg_lease UPDATE TO '0.9.0';"
        ),
    );
    let b = acquire(&mut c, &format!("'b', 'srv2', {TTL}, 'tables', '{{2}}'"));
    let fresh = acquire(&mut c, &format!("'other', 'srv3', {TTL}"));
    assert!(b.is_ok() && fresh.is_ok(), "after the upgrade, a bound acquire gave {b:?} and an unbound one {fresh:?}");
}

/// Owner rows 2 and 4 raised (by the updater role) to the current epoch's
/// last counter, then leases `b` (srv2, row 2) and `d` (srv4, row 4)
/// acquired: their tokens.
fn two_leases_from_an_epochs_last_counter(label: &str) -> (TestDb, Client, i64, i64) {
    let (db, mut c, updater) = owner_rows_and_updater(label);
    let e = epoch(&mut c);
    let mut u = db.connect_as(&updater);
    ok(&mut u, &format!("UPDATE tables SET owner_fencing_token = {} WHERE id IN (2, 4)", (e << 40) | MASK));
    let d = acquire(&mut c, &format!("'d', 'srv4', {TTL}, 'tables', '{{4}}'")).unwrap();
    let b = acquire(&mut c, &format!("'b', 'srv2', {TTL}, 'tables', '{{2}}'")).unwrap();
    (db, c, b, d)
}

/// **Hole (medium).** Attack: owner rows 2 and 4 hold `E << 40 | 2^40 - 1`
/// (raised by a role allowed to UPDATE them). Leases `d` (row 4) and `b`
/// (row 2) are acquired. Their `stored + 1` is `(E + 1) << 40`, a token of
/// the next epoch, so acquire does not move the counter past it. Observed:
/// both acquires are issued the same token. Expected: "two acquires never
/// get the same token" (README, Tokens only rise) — the second is issued
/// above the first.
#[test]
fn two_owner_rows_at_an_epochs_last_counter_give_two_acquires_one_token() {
    let (_db, _c, b, d) = two_leases_from_an_epochs_last_counter("a15_dup");
    assert_ne!(b, d, "leases b and d were both issued token {b}");
}

/// **Hole (medium).** Attack: as above, `b` (srv2, row 2) and `d` (srv4,
/// row 4) share one token. srv2 then acquires `b` bound to row 4. acquire
/// looks for a rival lease only when the row's token differs from the
/// acquiring lease's own token; row 4's token is `b`'s own, so the check is
/// skipped. Observed: `b` takes row 4 from srv4's live lease `d` (two live
/// leases on row 4; srv4's writes are now refused) and srv4's heartbeat
/// reports nothing. Expected: LF005 naming lease `d`, as for any second
/// name on a held owner row.
#[test]
fn shared_token_lets_a_lease_rebind_to_a_live_owner_row_without_lf005() {
    let (_db, mut c, _b, _d) = two_leases_from_an_epochs_last_counter("a15_rebind");
    let rebind = acquire(&mut c, &format!("'b', 'srv2', {TTL}, 'tables', '{{4}}'"));
    let lost: Vec<String> = c
        .query("SELECT name || ':' || lost FROM lease.heartbeat('srv4', 60000)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        rebind.as_ref().is_err_and(|e| e.starts_with("LF005")),
        "srv2 re-bound `b` to row 4, held by srv4's live `d`: {rebind:?}; srv4's heartbeat reported {lost:?}"
    );
}

/// **Hole (low).** Attack: a DBA (superuser) tidying sequences runs
/// `ALTER SEQUENCE lease.token_counter RESTART`. pg_lease's event triggers
/// refuse DDL that weakens a fence (LF008), but not this. Observed: the DDL
/// is accepted and the next fresh lease is issued the token lease `a`
/// already holds. Expected: DDL that moves the token counter back is refused
/// (LF008) like other fence-weakening DDL, or acquire never issues a token
/// already issued.
#[test]
fn alter_sequence_restart_of_the_token_counter_reissues_a_held_token() {
    let db = TestDb::new("a15_restart");
    let mut c = db.connect();
    let a = acquire(&mut c, &format!("'a', 'srv1', {TTL}")).unwrap();
    let restart = try_sql(&mut c, "ALTER SEQUENCE lease.token_counter RESTART");
    let x = acquire(&mut c, &format!("'x', 'srv2', {TTL}"));
    assert!(
        restart == "LF008" || x.as_ref().is_ok_and(|&t| t > a),
        "ALTER SEQUENCE ... RESTART gave {restart:?} (\"\": accepted); lease x then got {x:?}, lease a holds {a}"
    );
}

/// A cluster of its own (no WAL writer or background writer flushing for
/// it), pg_lease and a committed control lease `y`; `attack` runs on a
/// `synchronous_commit = off` session and returns the token srv1 saw for
/// lease `x`. The server is then killed (`kill -9`) and restarted: returns
/// the cluster (kept alive for the caller), a connection, and that token.
fn killed_after(name: &str, port: u16, attack: impl FnOnce(&mut Client) -> i64) -> (Cluster, Client, i64) {
    let conf = ["wal_writer_delay = 10000ms", "bgwriter_lru_maxpages = 0", "max_prepared_transactions = 10"];
    let cluster = Cluster::start_with(name, port, &conf);
    let mut before = cluster.connect();
    ok(&mut before, "CREATE EXTENSION IF NOT EXISTS pg_lease; CHECKPOINT");
    acquire(&mut before, &format!("'y', 'srv1', {TTL}")).unwrap();
    ok(&mut before, "SET synchronous_commit = off");
    let seen = attack(&mut before);
    cluster.kill9();
    cluster.restart();
    let mut after = cluster.connect();
    assert_eq!(one_i64(&mut after, "SELECT count(*) FROM lease.leases WHERE name = 'y'"), 1, "control lost");
    (cluster, after, seen)
}

/// Rows of lease `x` held by srv1 after the crash, and srv2's acquire of `x`.
fn x_after_crash(c: &mut Client) -> (i64, Result<i64, String>) {
    (
        one_i64(c, "SELECT count(*) FROM lease.leases WHERE name = 'x' AND owner = 'srv1'"),
        acquire(c, &format!("'x', 'srv2', {TTL}")),
    )
}

/// **Defence holds.** Attack: under `synchronous_commit = off`, srv1 takes
/// lease `x` in a transaction, sees its token, and rolls back (its client
/// may use the token anyway); the counter value drawn is inside the range
/// the sequence's last WAL record already covers, so this acquire writes no
/// sequence WAL of its own. The server is killed at once. Observed: srv2's
/// acquire of `x` after the restart gets a token above the one srv1 saw.
/// Expected: that (README: a token an acquire returned is never issued
/// again, even when that acquire rolled back, across a crash).
#[test]
fn token_of_a_rolled_back_acquire_is_not_reissued_after_kill9() {
    let (_cluster, mut c, seen) = killed_after("a15_rollback", 15141, |c| {
        ok(c, "BEGIN");
        let seen = acquire(c, &format!("'x', 'srv1', {TTL}")).unwrap();
        ok(c, "ROLLBACK");
        seen
    });
    let (kept, again) = x_after_crash(&mut c);
    assert_eq!(kept, 0, "the rolled-back acquire's row survived");
    assert!(again.as_ref().is_ok_and(|&t| t > seen), "srv1 saw {seen} in its rolled-back acquire; srv2 got {again:?}");
}

/// **Defence holds.** Attack: under `synchronous_commit = off`, srv1 takes
/// lease `x` in a transaction it commits by two-phase commit (`PREPARE
/// TRANSACTION`, then `COMMIT PREPARED`, as a transaction manager does); the
/// server is killed right after. Observed: the lease survives and srv2 is
/// refused or issued a higher token. Expected: that (an acquire's commit is
/// durable however it commits).
#[test]
fn acquire_committed_by_two_phase_commit_survives_kill9() {
    let (_cluster, mut c, seen) = killed_after("a15_2pc", 15142, |c| {
        ok(c, "BEGIN; SELECT 1 FROM lease.acquire('x', 'srv1', 60000)");
        ok(c, "PREPARE TRANSACTION 'a15'");
        ok(c, "COMMIT PREPARED 'a15'");
        one_i64(c, "SELECT token FROM lease.leases WHERE name = 'x'")
    });
    let (kept, again) = x_after_crash(&mut c);
    assert!(
        kept == 1 && again != Ok(seen),
        "srv1's prepared acquire (token {seen}) was lost in the crash (rows kept: {kept}); srv2 got {again:?}"
    );
}

/// A database whose owner table `tables` (rows 1..=3) is owned by the role
/// `mig_<db>` (the README's migrator: owns and protects the tables, with
/// row-level security enabled by `rls`), and a role `app_<db>` with EXECUTE
/// on the lease functions and `grant` on `tables`.
fn rls_owner_table(label: &str, rls: &str, grant: &str) -> (TestDb, Client, Client) {
    let db = TestDb::new(label);
    let (mig, app) = (format!("mig_{}", db.name), format!("app_{}", db.name));
    let mut c = db.connect();
    ok(
        &mut c,
        &format!(
            "DO $$ BEGIN CREATE ROLE {mig} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE {app} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT CREATE ON SCHEMA public TO {mig};
             GRANT USAGE ON SCHEMA lease TO {mig}, {app};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lease TO {mig}, {app};
             SET ROLE {mig};
             CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
             INSERT INTO tables VALUES (1, NULL), (2, NULL), (3, NULL);
             GRANT {grant} ON tables TO {app};
             {rls}
             RESET ROLE;"
        ),
    );
    let (m, a) = (db.connect_as(&mig), db.connect_as(&app));
    drop(c);
    (db, m, a)
}

/// **Hole (low).** Attack: the application role has only `UPDATE` on the
/// owner table (the README: binding needs `SELECT` or `UPDATE`), and the
/// migrator enables row-level security with an `UPDATE` policy that lets
/// every row be updated. Observed: binding a lease to row 2 fails with
/// aclchk's `42501` "permission denied for table tables" (pg_lease's
/// visibility check reads the row with a SELECT the role may not run); the
/// same role binds the row once RLS is off. Expected: the row its UPDATE
/// policy lets it update is bound, as without RLS (or pg_lease's own error
/// saying what is missing).
#[test]
fn update_only_role_under_an_update_policy_cannot_bind_a_row_it_may_update() {
    let (_db, mut mig, mut app) = rls_owner_table(
        "a15_rls_upd",
        "ALTER TABLE tables ENABLE ROW LEVEL SECURITY; CREATE POLICY upd ON tables FOR UPDATE USING (true);",
        "UPDATE",
    );
    let with_rls = acquire(&mut app, &format!("'t2', 'srv1', {TTL}, 'tables', '{{2}}'"));
    ok(&mut mig, "ALTER TABLE tables DISABLE ROW LEVEL SECURITY");
    let without = acquire(&mut app, &format!("'t3', 'srv1', {TTL}, 'tables', '{{3}}'"));
    assert!(without.is_ok(), "without RLS the UPDATE-only role could not bind either: {without:?}");
    // Bound, or refused with pg_lease's own error (it cannot ask the
    // policies which rows a role without SELECT may see).
    assert!(
        with_rls.is_ok()
            || with_rls.as_ref().is_err_and(|e| e.contains("42501") && e.contains("under row-level security")),
        "under an UPDATE policy for every row, binding row 2 gave {with_rls:?}"
    );
}

/// **Hole (low).** Attack: the migrator sets `FORCE ROW LEVEL SECURITY` on
/// the owner table with one policy, `FOR SELECT USING (true)` (everyone may
/// read every row; nobody was meant to update them by hand). Observed: every
/// acquire bound to the table, by the application (which sees the row) and
/// by the table owner alike, fails with `LF007` "owner row {1} ... which
/// does not exist": acquire locks the row `FOR UPDATE` as the owner, whom
/// the forced policies give no UPDATE visibility. A holder can then never
/// re-take its lease to fence its previous process, and the message sends
/// the operator looking for a row that is there. Expected: the row is bound
/// (the caller sees it; pg_lease writes it as the owner, as the fence reads
/// it), or an error that names the forced policies, not a missing row.
#[test]
fn forced_row_security_without_an_update_policy_says_a_visible_owner_row_does_not_exist() {
    let (_db, mut mig, mut app) = rls_owner_table(
        "a15_rls_force",
        "ALTER TABLE tables ENABLE ROW LEVEL SECURITY; ALTER TABLE tables FORCE ROW LEVEL SECURITY;
         CREATE POLICY sel ON tables FOR SELECT USING (true);",
        "SELECT",
    );
    assert_eq!(one_i64(&mut app, "SELECT count(*) FROM tables WHERE id = 1"), 1, "the app sees row 1");
    let by_app = acquire(&mut app, &format!("'t1', 'srv1', {TTL}, 'tables', '{{1}}'"));
    let by_owner = acquire(&mut mig, &format!("'t2', 'srv2', {TTL}, 'tables', '{{2}}'"));
    assert!(
        by_app.is_ok() && by_owner.is_ok(),
        "binding visible rows under FORCE ROW LEVEL SECURITY: the app got {by_app:?}, the table owner {by_owner:?}"
    );
}

/// **Hole (low).** Attack: srv1 holds lease `a` bound to owner row 1, and a
/// payout of it is in flight (its fenced INSERT holds row 1 `FOR SHARE`).
/// srv3 acquires lease `c` for row 1 (it locks `c`, then waits for row 1);
/// srv1's restarted process re-takes `a` (it locks `a`, then waits for row
/// 1 behind srv3). The payout commits: srv3 gets row 1, finds `a`'s token
/// there and locks `a` as its rival, held by srv1's re-take, which waits
/// for srv3. Observed: PostgreSQL's deadlock detector aborts one of the two
/// single autocommit `acquire` calls with `40P01`. Expected: what README
/// Limits promises ("each takes its row locks in one order ... so single
/// calls cannot deadlock each other"): srv1's re-take succeeds and srv3
/// gets `LF005`, or srv3's acquire is refused without a deadlock.
#[test]
fn bound_acquire_and_the_holders_retake_deadlock_as_single_calls() {
    let (db, mut c, _updater) = owner_rows_and_updater("a15_deadlock");
    let a = acquire(&mut c, &format!("'a', 'srv1', {TTL}, 'tables', '{{1}}'")).unwrap();
    let mut payout = db.connect();
    ok(&mut payout, &format!("BEGIN; INSERT INTO payouts (table_id, fencing_token) VALUES (1, {a})"));
    let start = |name: &str, owner: &str| {
        let mut s = db.connect();
        let pid = backend_pid(&mut s);
        let args = format!("'{name}', '{owner}', {TTL}, 'tables', '{{1}}'");
        (pid, std::thread::spawn(move || acquire(&mut s, &args)))
    };
    let (srv3_pid, srv3) = start("c", "srv3");
    wait_until_blocked(&mut c, srv3_pid);
    let (srv1_pid, srv1) = start("a", "srv1");
    wait_until_blocked(&mut c, srv1_pid);
    ok(&mut payout, "COMMIT");
    let (srv3, srv1) = (srv3.join().unwrap(), srv1.join().unwrap());
    let deadlocked = |r: &Result<i64, String>| r.as_ref().is_err_and(|e| e.starts_with("40P01"));
    assert!(!deadlocked(&srv1) && !deadlocked(&srv3), "srv1's re-take gave {srv1:?}, srv3's acquire {srv3:?}");
}

/// **Defence holds.** Attack: a role allowed to UPDATE owner rows raises
/// row 2's token as high as it can, to burn the token epochs of the whole
/// database: a raise past `2^62 - 1` is refused (`22003`), so it sets
/// `2^62 - 1`, the last counter of epoch `2^22 - 1`. The game server then
/// acquires lease `b` bound to row 2, which raises the database's token
/// epoch base to that epoch (every lease's tokens now live there). The
/// primary then fails over to its streaming standby (timeline 2), where
/// tokens are judged in a still higher epoch. Observed: a fresh lease is
/// still acquired on the new primary, above the raised token. Expected:
/// that (README: owner tokens set by hand stop where acquire can always
/// issue a higher one).
#[test]
fn hand_raised_owner_token_at_its_limit_leaves_acquire_working_after_a_failover() {
    let primary = Cluster::start("a15_epoch_p", 15143);
    let mut p = primary.connect();
    ok(
        &mut p,
        "CREATE EXTENSION IF NOT EXISTS pg_lease;
             CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
             SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
             INSERT INTO tables VALUES (1, NULL), (2, NULL);
             DO $$ BEGIN CREATE ROLE a15_updater LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT SELECT, UPDATE ON tables TO a15_updater;
             SET ROLE a15_updater;",
    );
    let max = (1_i64 << 62) - 1;
    let over = try_sql(&mut p, &format!("UPDATE tables SET owner_fencing_token = {} WHERE id = 2", max + 1));
    assert_eq!(over, "22003", "a raise past 2^62 - 1 by hand");
    ok(&mut p, &format!("UPDATE tables SET owner_fencing_token = {max} WHERE id = 2; RESET ROLE"));
    acquire(&mut p, &format!("'b', 'srv2', {TTL}, 'tables', '{{2}}'")).unwrap();
    let before = acquire(&mut p, &format!("'x', 'srv3', {TTL}"));
    assert!(before.is_ok(), "before the failover a fresh lease gave {before:?}");
    let standby = Cluster::standby_of(&primary, "a15_epoch_s", 15144);
    let mut s = standby.connect();
    let start = std::time::Instant::now();
    while one_i64(&mut s, "SELECT count(*) FROM lease.leases WHERE name IN ('b', 'x')") < 2 {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "the standby never caught up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop((p, s));
    primary.stop();
    standby.promote();
    let mut n = standby.connect();
    let after = acquire(&mut n, &format!("'y', 'srv4', {TTL}"));
    assert!(after.as_ref().is_ok_and(|&t| t > max), "after the failover a fresh lease gave {after:?}");
}

/// **Defence holds.** Attack: the application takes leases through its own
/// wrapper function declared `SET synchronous_commit = off` (copied from its
/// payout functions); acquire's own transaction-local raise to `local` is
/// undone when the wrapper's SET clause is popped at its return, so the
/// autocommit COMMIT runs under `off`. The server is killed right after the
/// call returned. Observed: the lease survives (acquire's commit is forced
/// synchronous whatever the setting at COMMIT). Expected: that.
#[test]
fn acquire_through_a_function_declared_synchronous_commit_off_survives_kill9() {
    let (_cluster, mut c, seen) = killed_after("a15_fn_off", 15145, |c| {
        ok(
            c,
            "CREATE FUNCTION take(n text, o text) RETURNS bigint LANGUAGE sql SET synchronous_commit = off
                 AS $$ SELECT token FROM lease.acquire(n, o, 60000) $$",
        );
        one_i64(c, "SELECT take('x', 'srv1')")
    });
    let (kept, again) = x_after_crash(&mut c);
    assert!(
        kept == 1 && again != Ok(seen),
        "srv1's acquire through take() (token {seen}) was lost in the crash (rows kept: {kept}); srv2 got {again:?}"
    );
}
