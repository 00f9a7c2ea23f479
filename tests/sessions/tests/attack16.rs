//! Attack review 16: `lease.renew` without a statement (4927f8b: the lease
//! row found through `lease_state_pkey` with a fresh snapshot, judged in
//! Rust, written by the table AM's `tuple_update`, index entries inserted by
//! hand when the update is not HOT; the old UPDATE statement otherwise),
//! over real connections. The statement's behaviour is the contract.
//!
//! Tests marked **Hole** failed at the commit they were written against
//! (4927f8b) and pass since the in-place write declines for rules and
//! inheriting tables and finds the row through the primary key on `name`
//! (whatever the index is called); those marked **Defence holds** pass and
//! document what was tried. The holes, most severe first:
//!
//! - medium: a DBA's `DO INSTEAD NOTHING` rule on `lease.lease_state` (a
//!   freeze of the table) makes the statement refuse (`0A000`, nothing
//!   written); the in-place renew ignores rules and extends the lease;
//! - medium: a DBA's `DO ALSO` rule on `lease.lease_state` (an audit log of
//!   every update) runs for the statement, not for the in-place renew: the
//!   common renew leaves no audit row;
//! - low: renaming the primary key index (`ALTER INDEX ... RENAME`, e.g. a
//!   naming convention; nothing else in pg_lease names it, acquire's
//!   `ON CONFLICT (name)` infers it) makes every renew fail with `XX000`
//!   "pg_lease: lease.lease_state_pkey is missing" instead of falling back to
//!   the statement, which renews: every holder loses its lease;
//! - low: the in-place renew takes whichever index is called
//!   `lease_state_pkey` and never checks that its key is `name`: after a DBA
//!   moves that name to a unique index on `lower(name)`, `renew('a', ...)`
//!   of a lease that does not exist extends the caller's lease "A" instead
//!   of `LF006` "it never existed";
//! - low: a table that INHERITS `lease.lease_state` (an archive a DBA keeps
//!   of its rows): the statement (`UPDATE lease.lease_state`) also renews the
//!   child's row of the same name; the in-place renew only the parent's.
//!
//! Defences that hold: thousands of renews in one transaction (non-HOT,
//! pages filling) with savepoints rolled back, DBA indexes on `expires_at`
//! (plain and partial) and an added column with a default leave every index
//! of `lease_state` consistent (`bt_index_check(idx, true)`) and every row
//! reachable through each; a release or a takeover committed while the
//! renew waits for the row gives `LF006`; REPEATABLE READ / SERIALIZABLE
//! with a renew committed after the snapshot give `40001`; read-only
//! transactions give `25006`; a trigger enabled for `session_replication_role
//! = replica` fires; an owner that looks the same (NFC vs NFD) is another
//! owner; DROP/CREATE EXTENSION in the same session; an aborted
//! subtransaction's renew is undone; two sessions hammering
//! renew/acquire/release leave the indexes consistent; a DBA's ADD/DROP
//! COLUMN and new index in another session while this one's caches are
//! warm; pg_stat counts one (HOT) update per renew as the statement did;
//! 2000 renews then kill -9 right after the last commit: its expiry
//! survives, reaches a hot standby (amcheck clean on both), and a renew
//! on the standby is `25006`.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

fn acquire(c: &mut Client, name: &str, owner: &str, ttl: i32) -> i64 {
    one_i64(c, &format!("SELECT token FROM lease.acquire('{name}', '{owner}', {ttl})"))
}

/// The row's expires_at, as microseconds since the epoch.
fn expiry(c: &mut Client, name: &str) -> i64 {
    one_i64(
        c,
        &format!(
            "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM ONLY lease.lease_state WHERE name = '{name}'"
        ),
    )
}

/// Host-a's renew of lease a with token `t` in session `c`, started once
/// `other` holds the row's lock, which runs `then` and commits once the
/// renew waits for it; the renew's SQLSTATE ("" when it renewed).
fn renew_waiting_for(c: Client, other: &mut Client, obs: &mut Client, t: i64, then: &str) -> String {
    let mut c = c;
    let pid = backend_pid(&mut c);
    let h = std::thread::spawn(move || {
        let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
        sqlstate(&r)
    });
    wait_until_blocked(obs, pid);
    other.batch_execute(&format!("{then}; COMMIT")).unwrap();
    h.join().unwrap()
}

/// **Hole.** Attack: a DBA freezes lease.lease_state with
/// `CREATE RULE ... ON UPDATE TO lease.lease_state DO INSTEAD NOTHING` after a
/// lease was acquired, then its holder renews. The statement refuses
/// (`0A000` "cannot perform UPDATE RETURNING on relation", nothing written:
/// shown here with a `CHECK (true) NOT VALID` constraint that routes renew to
/// the statement). Observed: the in-place renew ignores the rule and extends
/// the lease. Expected: 0A000 and expires_at unchanged.
#[test]
fn a_do_instead_nothing_rule_on_lease_state_stops_renew() {
    let db = TestDb::new("a16_instead");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    let b = acquire(&mut c, "b", "host-b", 60000);
    c.batch_execute("CREATE RULE dba_freeze AS ON UPDATE TO lease.lease_state DO INSTEAD NOTHING").unwrap();

    // The statement's behaviour (the contract), on lease b.
    c.batch_execute("ALTER TABLE lease.lease_state ADD CONSTRAINT dba_force_statement CHECK (true) NOT VALID").unwrap();
    let before_b = expiry(&mut c, "b");
    let r = c.query_one(&format!("SELECT lease.renew('b', 'host-b', {b}, 600000)"), &[]);
    assert_eq!(sqlstate(&r), "0A000", "the statement under the rule: {r:?}");
    assert_eq!(expiry(&mut c, "b"), before_b);
    c.batch_execute("ALTER TABLE lease.lease_state DROP CONSTRAINT dba_force_statement").unwrap();

    // The in-place renew, on lease a.
    let before = expiry(&mut c, "a");
    let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 600000)"), &[]);
    let after = expiry(&mut c, "a");
    assert_eq!(after, before, "renew wrote lease_state through a DO INSTEAD NOTHING rule (result {r:?})");
    assert_eq!(sqlstate(&r), "0A000", "renew under a DO INSTEAD NOTHING rule: {r:?}");
}

/// **Hole.** Attack: a DBA logs every update of lease.lease_state with
/// `CREATE RULE ... DO ALSO INSERT INTO renew_log ...` (created after the
/// acquire: acquire's data-modifying WITH refuses DO ALSO rules), then the
/// holder renews. Observed: the statement logs one row (shown with a
/// `CHECK (true) NOT VALID` constraint routing renew to it), the in-place
/// renew none. Expected: one log row per renew, as the statement wrote.
#[test]
fn a_do_also_rule_on_lease_state_runs_for_every_renew() {
    let db = TestDb::new("a16_also");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    c.batch_execute(
        "CREATE TABLE public.renew_log (name text NOT NULL);
         CREATE RULE dba_log AS ON UPDATE TO lease.lease_state DO ALSO INSERT INTO public.renew_log VALUES (OLD.name);
         ALTER TABLE lease.lease_state ADD CONSTRAINT dba_force_statement CHECK (true) NOT VALID",
    )
    .unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.renew_log"), 1, "the statement runs the rule");

    c.batch_execute("ALTER TABLE lease.lease_state DROP CONSTRAINT dba_force_statement").unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM public.renew_log"),
        2,
        "the in-place renew skipped the DO ALSO rule on lease.lease_state"
    );
}

/// **Hole.** Attack: a DBA renames lease.lease_state's primary key index
/// (`ALTER INDEX lease.lease_state_pkey RENAME TO lease_state_name_pk`);
/// nothing else in pg_lease names it (acquire's `ON CONFLICT (name)` infers
/// the index). Observed: every renew fails with XX000 "pg_lease:
/// lease.lease_state_pkey is missing" (every holder loses its lease at its
/// next renew). Expected: renew renews, as the statement (which the
/// in-place path falls back to whenever it cannot run) does.
#[test]
fn renaming_lease_state_pkey_leaves_renew_working() {
    let db = TestDb::new("a16_pkey");
    let mut c = db.connect();
    c.batch_execute("ALTER INDEX lease.lease_state_pkey RENAME TO lease_state_name_pk").unwrap();
    // acquire is unaffected.
    let t = acquire(&mut c, "a", "host-a", 60000);
    let before = expiry(&mut c, "a");
    std::thread::sleep(Duration::from_millis(20));
    let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
    assert_eq!(sqlstate(&r), "", "renew after the pkey index was renamed: {r:?}");
    assert!(expiry(&mut c, "a") > before);
}

/// **Hole.** Attack: a DBA keeps an archive table that INHERITS
/// lease.lease_state, holding a copy of a live lease's row. The statement
/// `UPDATE lease.lease_state ...` covers the child too: its row of that name
/// is renewed (shown with a `CHECK (true) NOT VALID` constraint routing renew
/// to the statement). Observed: the in-place renew renews only the parent's
/// row. Expected: both rows renewed, as by the statement.
#[test]
fn renew_renews_the_row_of_a_table_inheriting_lease_state() {
    let db = TestDb::new("a16_inherit");
    let mut c = db.connect();
    let a = acquire(&mut c, "a", "host-a", 60000);
    let b = acquire(&mut c, "b", "host-b", 60000);
    c.batch_execute(
        "CREATE TABLE public.lease_archive () INHERITS (lease.lease_state);
         INSERT INTO public.lease_archive SELECT * FROM ONLY lease.lease_state;",
    )
    .unwrap();
    let child = |c: &mut Client, name: &str| {
        one_i64(
            c,
            &format!(
                "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM public.lease_archive WHERE name = '{name}'"
            ),
        )
    };
    // The statement: both rows of b.
    c.batch_execute("ALTER TABLE lease.lease_state ADD CONSTRAINT dba_force_statement CHECK (true) NOT VALID").unwrap();
    let before = child(&mut c, "b");
    std::thread::sleep(Duration::from_millis(20));
    c.query_one(&format!("SELECT lease.renew('b', 'host-b', {b}, 600000)"), &[]).unwrap();
    assert!(child(&mut c, "b") > before, "the statement renews the child's row");
    // (Each row reads the clock itself.)
    assert!((child(&mut c, "b") - expiry(&mut c, "b")).abs() < 1_000_000);
    c.batch_execute("ALTER TABLE lease.lease_state DROP CONSTRAINT dba_force_statement").unwrap();

    // In place: a.
    let before = child(&mut c, "a");
    std::thread::sleep(Duration::from_millis(20));
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {a}, 600000)"), &[]).unwrap();
    assert!(child(&mut c, "a") > before, "the in-place renew left the inheriting table's row of the lease alone");
}

/// **Defence holds.** Attack: 3000 renews of one lease in one transaction,
/// 500 more in a savepoint rolled back, then more, with DBA indexes on
/// expires_at (plain, partial) forcing non-HOT updates and an added column
/// with a (missing-value) default; a second lease renewed alternately.
/// Observed and expected: every index of lease_state passes
/// `bt_index_check(idx, true)`, every row is found through the primary key
/// and the owner index, the added column keeps its default, the expiry is
/// the last renew's.
#[test]
fn many_non_hot_renews_with_savepoints_keep_every_index_consistent() {
    let db = TestDb::new("a16_nonhot");
    let mut c = db.connect();
    let a = acquire(&mut c, "a", "host-a", 60000);
    let b = acquire(&mut c, "bb", "host-b", 60000);
    c.batch_execute(
        "CREATE INDEX dba_expiry ON lease.lease_state (expires_at);
         CREATE INDEX dba_recent ON lease.lease_state (name) WHERE expires_at > '2000-01-01';
         ALTER TABLE lease.lease_state ADD COLUMN dba_note text NOT NULL DEFAULT 'kept';",
    )
    .unwrap();
    c.batch_execute(&format!(
        "BEGIN;
         SELECT count(lease.renew('a', 'host-a', {a}, 60000)), count(lease.renew('bb', 'host-b', {b}, 60000))
           FROM generate_series(1, 3000);
         SAVEPOINT s;
         SELECT count(lease.renew('a', 'host-a', {a}, 600000)) FROM generate_series(1, 500);
         ROLLBACK TO s;
         SELECT lease.renew('a', 'host-a', {a}, 90000);
         COMMIT;"
    ))
    .unwrap();
    check_lease_state_indexes(&mut c);
    let kept = one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE dba_note = 'kept'");
    assert_eq!(kept, 2);
    let left = one_i64(
        &mut c,
        "SELECT extract(epoch FROM expires_at - clock_timestamp())::bigint FROM lease.lease_state WHERE name = 'a'",
    );
    assert!((80..=90).contains(&left), "a's expiry is the last renew's (90 s): {left} s left");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE name = 'a'"), 1);
}

/// **Defence holds.** Attack: the lease's owner releases it in another
/// session (uncommitted) while its renew runs: the renew finds the live row
/// and waits for the release's row lock. Observed and expected: after the
/// release commits, the renew reports `LF006` (lost) and the row stays
/// released.
#[test]
fn a_release_committed_while_renew_waits_gives_lease_lost() {
    let db = TestDb::new("a16_release_wait");
    let mut c = db.connect();
    let mut other = db.connect();
    let mut obs = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    other.batch_execute(&format!("BEGIN; SELECT lease.release('a', 'host-a', {t});")).unwrap();
    assert_eq!(renew_waiting_for(c, &mut other, &mut obs, t, "SELECT 1"), "LF006");
    assert_eq!(one_i64(&mut obs, "SELECT count(*) FROM lease.lease_state WHERE released_at IS NULL"), 0);
    check_lease_state_indexes(&mut obs);
}

/// **Defence holds.** Attack: in an open transaction a DBA expires the lease
/// by hand (an UPDATE: the row is locked) and another owner takes it over;
/// meanwhile the holder renews: it finds the live row its snapshot sees and
/// waits for the row lock. Observed and expected: after the takeover
/// commits, the renew reports `LF006` and the new holder keeps the lease
/// with its token.
#[test]
fn a_takeover_committed_while_renew_waits_gives_lease_lost() {
    let db = TestDb::new("a16_takeover_wait");
    let mut c = db.connect();
    let mut other = db.connect();
    let mut obs = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    // A DBA hands the lease over by hand-expiring it in an open transaction,
    // then host-b acquires in the same transaction.
    other
        .batch_execute(
            "BEGIN;
             UPDATE lease.lease_state SET expires_at = clock_timestamp() - interval '1 second' WHERE name = 'a';",
        )
        .unwrap();
    let take = "SELECT lease.acquire('a', 'host-b', 60000)";
    assert_eq!(renew_waiting_for(c, &mut other, &mut obs, t, take), "LF006");
    let holder: String = obs.query_one("SELECT owner FROM lease.lease_state WHERE name = 'a'", &[]).unwrap().get(0);
    assert_eq!(holder, "host-b");
    assert!(one_i64(&mut obs, "SELECT token FROM lease.lease_state WHERE name = 'a'") > t);
    check_lease_state_indexes(&mut obs);
}

/// **Defence holds.** Attack: REPEATABLE READ and SERIALIZABLE transactions
/// take their snapshot, another session renews the lease and commits, then
/// the transaction renews. Observed and expected: `40001` as the statement
/// gives (the in-place update meets the newer version).
#[test]
fn a_renew_committed_after_the_snapshot_fails_to_serialize() {
    let db = TestDb::new("a16_rr");
    let mut c = db.connect();
    let mut other = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}; SELECT 1 FROM lease.lease_state")).unwrap();
        other.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
        let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
        assert_eq!(sqlstate(&r), "40001", "{level}: {r:?}");
        c.batch_execute("ROLLBACK").unwrap();
    }
    check_lease_state_indexes(&mut c);
}

/// **Defence holds.** Attack: renew in `BEGIN READ ONLY` and under
/// `default_transaction_read_only = on`. Observed and expected: `25006`, the
/// row unchanged.
#[test]
fn renew_in_a_read_only_transaction_is_refused() {
    let db = TestDb::new("a16_ro");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    let before = expiry(&mut c, "a");
    c.batch_execute("BEGIN READ ONLY").unwrap();
    let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
    assert_eq!(sqlstate(&r), "25006");
    c.batch_execute("ROLLBACK; SET default_transaction_read_only = on").unwrap();
    let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
    assert_eq!(sqlstate(&r), "25006");
    c.batch_execute("RESET default_transaction_read_only").unwrap();
    assert_eq!(expiry(&mut c, "a"), before);
}

/// **Defence holds.** Attack: a DBA's counting trigger on lease_state enabled
/// `ENABLE REPLICA`, renew under `session_replication_role = replica`; and a
/// plain one (ENABLE ORIGIN) under `replica`, which must not fire. Observed
/// and expected: the replica trigger fires once per renew, the origin one
/// never there.
#[test]
fn session_replication_role_decides_which_trigger_fires() {
    let db = TestDb::new("a16_srr");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    c.batch_execute(
        "CREATE TABLE public.fired (which text);
         CREATE FUNCTION public.count_rep() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO public.fired VALUES (TG_ARGV[0]); RETURN NEW; END $$;
         CREATE TRIGGER rep BEFORE UPDATE ON lease.lease_state FOR EACH ROW EXECUTE FUNCTION public.count_rep('rep');
         ALTER TABLE lease.lease_state ENABLE REPLICA TRIGGER rep;",
    )
    .unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.fired"), 0);
    c.batch_execute("SET session_replication_role = replica").unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.fired WHERE which = 'rep'"), 1);
    c.batch_execute(
        "RESET session_replication_role;
         CREATE TRIGGER orig BEFORE UPDATE ON lease.lease_state FOR EACH ROW EXECUTE FUNCTION public.count_rep('orig');
         SET session_replication_role = replica;",
    )
    .unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.fired WHERE which = 'orig'"), 0);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.fired WHERE which = 'rep'"), 2);
    c.batch_execute("RESET session_replication_role").unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.fired WHERE which = 'orig'"), 1);
}

/// **Defence holds.** Attack: an owner (and a name) that look the same but
/// differ in bytes (NFC "é" vs NFD "e" + U+0301), long non-ASCII labels at
/// the length limit. Observed and expected: another owner is `LF006`, the
/// row unchanged; the same bytes renew.
#[test]
fn an_owner_that_only_looks_the_same_is_another_owner() {
    let db = TestDb::new("a16_nfc");
    let mut c = db.connect();
    let nfc = "caf\u{e9}-h\u{f6}st";
    let nfd = "cafe\u{301}-h\u{f6}st";
    let long_name: String = "\u{1F512}".repeat(256);
    let t = one_i64(&mut c, &format!("SELECT token FROM lease.acquire('{long_name}', '{nfc}', 60000)"));
    let before = expiry(&mut c, &long_name);
    let r = c.query_one(&format!("SELECT lease.renew('{long_name}', '{nfd}', {t}, 600000)"), &[]);
    assert_eq!(sqlstate(&r), "LF006");
    assert_eq!(expiry(&mut c, &long_name), before);
    let r = c.query_one(&format!("SELECT lease.renew('{long_name}', '{nfc}', {t}, 600000)"), &[]);
    assert_eq!(sqlstate(&r), "");
    assert!(expiry(&mut c, &long_name) > before);
    check_lease_state_indexes(&mut c);
}

/// **Defence holds.** Attack: in one session with warm caches, renew, DROP
/// EXTENSION, CREATE EXTENSION, acquire and renew again; and a renew in a
/// PL/pgSQL block whose error is caught (the subtransaction rolls back).
/// Observed and expected: the second renew renews the new table's row; the
/// caught renew is undone.
#[test]
fn drop_create_extension_and_a_rolled_back_renew() {
    let db = TestDb::new("a16_dropcreate");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    c.batch_execute("DROP EXTENSION pg_lease CASCADE; CREATE EXTENSION pg_lease").unwrap();
    let t = acquire(&mut c, "a", "host-a", 60000);
    let before = expiry(&mut c, "a");
    std::thread::sleep(Duration::from_millis(20));
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    let after = expiry(&mut c, "a");
    assert!(after > before);
    c.batch_execute(&format!(
        "DO $$ BEGIN PERFORM lease.renew('a', 'host-a', {t}, 900000); RAISE EXCEPTION 'undo';
           EXCEPTION WHEN raise_exception THEN NULL; END $$"
    ))
    .unwrap();
    assert_eq!(expiry(&mut c, "a"), after);
    check_lease_state_indexes(&mut c);
}

/// **Defence holds.** Attack: two sessions, for two seconds, renew, release
/// and re-acquire the same three leases (READ COMMITTED), with a DBA index on
/// expires_at forcing non-HOT updates. Observed and expected: every renew
/// either renews with the current token or reports LF006; afterwards every
/// index is consistent and each name has one row.
#[test]
fn two_sessions_hammering_renew_acquire_release_keep_lease_state_consistent() {
    let db = TestDb::new("a16_hammer");
    let mut c = db.connect();
    c.batch_execute("CREATE INDEX dba_expiry ON lease.lease_state (expires_at)").unwrap();
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let mut s = db.connect();
            std::thread::spawn(move || {
                let owner = format!("host-{w}");
                let start = std::time::Instant::now();
                let mut i = 0u32;
                while start.elapsed() < Duration::from_secs(2) {
                    let name = format!("l{}", i % 3);
                    i += 1;
                    let Ok(row) =
                        s.query_one(&format!("SELECT token FROM lease.try_acquire('{name}', '{owner}', 60000)"), &[])
                    else {
                        continue;
                    };
                    let Some(t) = row.get::<_, Option<i64>>(0) else { continue };
                    for _ in 0..3 {
                        let r = s.query_one(&format!("SELECT lease.renew('{name}', '{owner}', {t}, 60000)"), &[]);
                        let st = sqlstate(&r);
                        assert!(st.is_empty() || st == "LF006", "renew: {r:?}");
                    }
                    let _ = s.query_one(&format!("SELECT lease.release('{name}', '{owner}', {t})"), &[]);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    check_lease_state_indexes(&mut c);
    assert_eq!(one_i64(&mut c, "SELECT count(DISTINCT name) - count(*) FROM lease.lease_state"), 0);
}

/// **Defence holds.** Attack: a standby streams from the primary; on the
/// primary 2000 renews (non-HOT: a DBA index on expires_at), the last one
/// committed right before the primary is killed (`kill -9`) and restarted;
/// then a renew on the hot standby. Observed and expected: the last renew's
/// expiry survives the crash and reaches the standby, every index passes
/// amcheck on both, and the standby refuses the renew with `25006`.
#[test]
fn renews_survive_kill9_and_replay_on_a_hot_standby() {
    let primary = Cluster::start("a16_crash_p", 15161);
    let mut p = primary.connect();
    p.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS pg_lease;
         CREATE INDEX IF NOT EXISTS dba_expiry ON lease.lease_state (expires_at);",
    )
    .unwrap();
    amcheck(&mut p);
    let t = acquire(&mut p, "a", "host-a", 60000);
    let standby = Cluster::standby_of(&primary, "a16_crash_s", 15162);
    p.batch_execute(&format!(
        "SELECT count(lease.renew('a', 'host-a', {t}, 60000)) FROM generate_series(1, 1000);
         BEGIN; SELECT count(lease.renew('a', 'host-a', {t}, 60000)) FROM generate_series(1, 1000); COMMIT;"
    ))
    .unwrap();
    let last = one_i64(
        &mut p,
        &format!("SELECT (extract(epoch FROM lease.renew('a', 'host-a', {t}, 60000)) * 1000000)::bigint"),
    );
    primary.kill9();
    primary.restart();
    let mut p = primary.connect();
    assert_eq!(expiry(&mut p, "a"), last, "the last renew's expiry after kill -9");
    check_lease_state_indexes(&mut p);
    let mut s = standby.connect();
    let start = std::time::Instant::now();
    while one_i64(&mut s, "SELECT count(*) FROM lease.lease_state WHERE name = 'a' AND expires_at >= to_timestamp(0)")
        == 0
        || expiry(&mut s, "a") != last
    {
        assert!(start.elapsed() < Duration::from_secs(30), "the standby never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    check_lease_state_indexes(&mut s);
    let r = s.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]);
    assert_eq!(sqlstate(&r), "25006", "renew on a hot standby: {r:?}");
}

/// **Defence holds.** Attack: pg_stat counters of lease_state for one renew
/// in place and one through the statement (routed there by a
/// `CHECK (true) NOT VALID` constraint), in the same transaction's
/// `pg_stat_xact_user_tables`. Observed and expected: each counts one
/// update (`n_tup_upd`), HOT when no indexed column changes.
#[test]
fn renew_counts_one_update_in_pg_stat_as_the_statement_did() {
    let db = TestDb::new("a16_stat");
    let mut c = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    let counts = |c: &mut Client| -> (i64, i64) {
        let r = c
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = 'lease.lease_state'::regclass",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let mut deltas = Vec::new();
    for force in [false, true] {
        if force {
            c.batch_execute("ALTER TABLE lease.lease_state ADD CONSTRAINT dba_force_statement CHECK (true) NOT VALID")
                .unwrap();
        }
        c.batch_execute("BEGIN").unwrap();
        let (u0, h0) = counts(&mut c);
        c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
        let (u1, h1) = counts(&mut c);
        c.batch_execute("COMMIT").unwrap();
        deltas.push((u1 - u0, h1 - h0));
    }
    assert_eq!(deltas[0], (1, 1), "in place");
    assert_eq!(deltas[0], deltas[1], "in place vs the statement");
}

/// **Defence holds.** Attack: a session renews (its caches warm), then a DBA
/// in another session adds a column with a default, drops another one it
/// had added, and adds an index on expires_at (renews no longer HOT); the
/// first session renews again without reconnecting. Observed and expected:
/// the renew writes the current layout (the default kept, the dropped column
/// gone), every index passes amcheck.
#[test]
fn renew_after_a_dba_alters_lease_state_in_another_session() {
    let db = TestDb::new("a16_alter");
    let mut c = db.connect();
    let mut dba = db.connect();
    let t = acquire(&mut c, "a", "host-a", 60000);
    dba.batch_execute("ALTER TABLE lease.lease_state ADD COLUMN dba_tmp int DEFAULT 7").unwrap();
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    dba.batch_execute(
        "ALTER TABLE lease.lease_state ADD COLUMN dba_note text NOT NULL DEFAULT 'kept';
         ALTER TABLE lease.lease_state DROP COLUMN dba_tmp;
         CREATE INDEX dba_expiry ON lease.lease_state (expires_at);",
    )
    .unwrap();
    let before = expiry(&mut c, "a");
    std::thread::sleep(Duration::from_millis(20));
    c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), &[]).unwrap();
    assert!(expiry(&mut c, "a") > before);
    assert_eq!(one_i64(&mut dba, "SELECT count(*) FROM lease.lease_state WHERE dba_note = 'kept'"), 1);
    check_lease_state_indexes(&mut dba);
}

/// **Hole.** Attack: a DBA makes lease names unique regardless of case with
/// a unique index on `lower(name)` and, tidying names, moves the primary
/// key's index name to it (`ALTER INDEX lease.lease_state_pkey RENAME TO
/// lease_state_name_key; CREATE UNIQUE INDEX lease_state_pkey ON
/// lease.lease_state (lower(name))`). The in-place renew takes whichever
/// index is called lease_state_pkey and never checks that its key is the
/// `name` column, nor the found row's name. Observed: `lease.renew('a', ...)`
/// of a lease named "a" that does not exist (its holder holds "A") succeeds
/// and extends lease "A". Expected: `LF006` ("it never existed"), as the
/// statement (`WHERE name = 'a'`) gives, and lease "A" unchanged.
#[test]
fn renew_finds_the_lease_only_through_the_primary_key_on_name() {
    let db = TestDb::new("a16_pkey_expr");
    let mut c = db.connect();
    let t = acquire(&mut c, "A", "host-a", 60000);
    c.batch_execute(
        "ALTER INDEX lease.lease_state_pkey RENAME TO lease_state_name_key;
         CREATE UNIQUE INDEX lease_state_pkey ON lease.lease_state (pg_catalog.lower(name));",
    )
    .unwrap();
    let before = expiry(&mut c, "A");
    std::thread::sleep(Duration::from_millis(20));
    let r = c.query_one(&format!("SELECT lease.renew('a', 'host-a', {t}, 600000)"), &[]);
    assert_eq!(expiry(&mut c, "A"), before, "renew of 'a' extended lease 'A' (result {r:?})");
    assert_eq!(sqlstate(&r), "LF006", "renew of a lease that never existed: {r:?}");
}
