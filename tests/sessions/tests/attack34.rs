//! Attack review 34 (PostgreSQL 18, pg_lease built from main at 2383a43):
//! fresh eyes on the whole contract, as README.md's roles (a migrator with
//! the documented grants, the game server, a role with UPDATE on owner
//! rows), over real connections. Earlier reviews (attack*.rs) are not
//! repeated.
//!
//! (Session 18 closed all three holes: `fence::config` reads `lease.protected`
//! under the latest snapshot, for the fence config and for which tables are
//! owner tables, and a REPEATABLE READ or SERIALIZABLE transaction whose
//! snapshot sees another row fails with `40001`; every test below passes.)
//!
//! Findings, most severe first:
//!
//! - **Hole (high): a backend that built a fence's config inside a REPEATABLE
//!   READ transaction whose snapshot predates a re-protect keeps the old
//!   config after that transaction, and stale writes commit there at READ
//!   COMMITTED.** `fence::config::load_row` reads `lease.protected` through
//!   SPI under the transaction's snapshot, and `config::for_relation` caches
//!   what it built for the life of the backend (until the next relcache
//!   invalidation of the fenced or the *old* owner table). Reproduction:
//!   `payouts` fenced against `tables`; the game server holds token `T1`
//!   (`lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')`). Its
//!   pooled connection runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`.
//!   The migrator moves the fence to a new owner table: `BEGIN; SELECT
//!   lease.unprotect('payouts'); SELECT lease.protect('payouts',
//!   '{table_id}', 'fencing_token', 'tables2'); COMMIT`, and a new process
//!   takes the resource there: `lease.acquire('table2:1', 'host-b', 60000,
//!   'tables2', '{1}')` = `T2 > T1`, committed. The old connection's
//!   `INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 50,
//!   T1)` is accepted (judged against `tables`) and commits; after `COMMIT`
//!   the same connection, now at READ COMMITTED, keeps accepting `T1` and
//!   refuses the current token `T2` with `LF002 ... ahead of the current token
//!   T1 (owner row in public.tables)`. `lease.protected_tables` meanwhile
//!   says the fence is against `tables2`, enforced. README, What is
//!   guaranteed: no committed write carries a token older than a token bump
//!   that committed before it, whatever the client does; Connection poolers:
//!   server connections are shared by every client
//!   (`a_config_read_under_an_old_snapshot_is_not_kept_by_the_backend`,
//!   fails). Fix: read `lease.protected` under a fresh catalog snapshot (as
//!   the DDL guard's `fresh_catalog` does) and fail with `40001` when the
//!   transaction's snapshot reads it differently; never cache a config built
//!   from an older snapshot.
//! - **Hole (medium, same root cause): inside that REPEATABLE READ
//!   transaction the stale write itself commits.** Same reproduction, the
//!   `INSERT ... T1` followed by `COMMIT` in the transaction whose snapshot
//!   predates the re-protect: it commits after `T2`'s acquire committed,
//!   instead of failing with `LF001` or `40001` as README's concurrency
//!   guarantee has a REPEATABLE READ writer fail
//!   (`a_repeatable_read_writer_is_judged_by_the_fence_as_it_is_now`, fails).
//! - **Hole (low): a REPEATABLE READ writer whose snapshot predates a
//!   `lease.protect` is refused with `LF008 FenceTampering: the fence on
//!   public.p3 is inconsistent`**, DETAIL "carries pg_lease's fence trigger
//!   but lease.protected has no entry for it" and a HINT about schema-only
//!   dumps that tells the client to run `lease.protect` again: nothing was
//!   tampered with, and retrying the transaction succeeds. README gives LF008
//!   to DDL that weakens a fence and TRUNCATE; a transaction that could not
//!   judge the write with its snapshot should get `40001`
//!   (`a_write_at_repeatable_read_older_than_the_protect_is_a_serialization_failure`,
//!   fails).
//! - **Defence holds: trigger-state doors in ALTER TABLE.** As the migrator
//!   (owner of both tables): `DISABLE TRIGGER USER` on the fenced and on the
//!   owner table, `ENABLE REPLICA TRIGGER pg_lease_fence`, `ENABLE TRIGGER
//!   pg_lease_fence` (which would take ALWAYS away), `ENABLE REPLICA
//!   TRIGGER pg_lease_owner_guard`: all `LF008`; PostgreSQL 18 itself refuses
//!   `ALTER CONSTRAINT tables_pkey DEFERRABLE` and `NOT ENFORCED` on the owner
//!   key; a stale write is still `LF001` and an owner token still cannot be
//!   lowered (`LF004`) afterwards
//!   (`trigger_state_doors_in_alter_table_are_refused`).
//!
//! Looked at, no hole found (not kept as tests): high-water canonical forms
//! (numeric `-0`, `NaN`, deterministic ICU text, `char(n)`), owner keys
//! compared under nondeterministic collations and domains over them (the
//! owner guard's `same_key` and the lookup use the same equality), the
//! cross-partition UPDATE token hand-over (`verified::update_deleting`, only
//! ever hands a DELETE a token the fence has just found current), high-water
//! upserts racing (`int8larger`), `INSERT ... ON CONFLICT DO NOTHING` raising
//! a mark without a row (conservative), acquire's read-back of the owner
//! token after its UPDATE (a redirecting rule is caught), `ALTER TABLE ... SET
//! ACCESS METHOD`, `CREATE STATISTICS`, `SET STORAGE`/`SET STATISTICS` on a
//! token column (harmless). Not tried for lack of time: the same stale-config
//! read for `protect_high_water` after `unprotect` (owner -> high-water) and
//! for `config::owner_table`'s cache of owner tables.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const MIGRATOR: &str = "a34_migrator";
const GAME: &str = "a34_game";

fn roles(c: &mut Client) {
    for n in [MIGRATOR, GAME] {
        // A concurrent CREATE ROLE of the same name by another test: ignore it.
        let _ = c.batch_execute(&format!(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{n}') THEN CREATE ROLE {n}; END IF; END $$"
        ));
    }
}

/// README's deployment, plus `tables2`: the owner table a migration moves
/// the fence to (same rows, no token yet).
fn poker(c: &mut Client) {
    roles(c);
    must_run(
        c,
        &format!(
            "GRANT CREATE ON SCHEMA public TO {MIGRATOR};
             GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
                 lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass) TO {MIGRATOR};
             GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) TO {GAME};
             SET ROLE {MIGRATOR};
             CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE tables2 (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id int NOT NULL, amount bigint NOT NULL, fencing_token bigint NOT NULL);
             INSERT INTO tables VALUES (1, NULL);
             INSERT INTO tables2 VALUES (1, NULL);
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token', 'tables');
             GRANT SELECT ON tables, tables2 TO {GAME};
             GRANT SELECT, INSERT ON payouts TO {GAME};
             RESET ROLE;"
        ),
    );
}

fn connect_as_role(db: &TestDb, role: &str) -> Client {
    let mut c = db.connect();
    must_run(&mut c, &format!("SET ROLE {role}"));
    c
}

fn acquire(c: &mut Client, name: &str, owner: &str, table: &str) -> i64 {
    one_i64(c, &format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000, '{table}', '{{1}}')"))
}

/// The old process's connection `w` opens a REPEATABLE READ transaction
/// and takes its snapshot; the migrator moves the fence to `tables2`; a new
/// process acquires there. Returns (old token, new token).
fn move_the_fence_under_an_open_snapshot(db: &TestDb, w: &mut Client) -> (i64, i64) {
    let old = acquire(w, "table:1", "host-a", "tables");
    // The snapshot is taken by the first query; `SELECT 1` takes no lock
    // that the migration would wait for.
    must_run(w, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1");
    let mut m = connect_as_role(db, MIGRATOR);
    must_run(
        &mut m,
        "BEGIN;
         SELECT lease.unprotect('payouts');
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables2');
         COMMIT;",
    );
    let mut g = connect_as_role(db, GAME);
    let new = acquire(&mut g, "table2:1", "host-b", "tables2");
    assert!(new > old, "the new process's token {new} is above the old one {old}");
    let owner: String = db
        .connect()
        .query_one("SELECT owner_table::text FROM lease.protected_tables WHERE table_name::text = 'payouts'", &[])
        .unwrap()
        .get(0);
    assert_eq!(owner, "tables2");
    (old, new)
}

#[test]
fn a_repeatable_read_writer_is_judged_by_the_fence_as_it_is_now() {
    let db = TestDb::new("a34_rr");
    let mut c = db.connect();
    poker(&mut c);
    let mut w = connect_as_role(&db, GAME);
    let (old, _new) = move_the_fence_under_an_open_snapshot(&db, &mut w);
    let insert = format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 50, {old})");
    let state = match w.batch_execute(&insert) {
        Ok(()) => sqlstate(&w.batch_execute("COMMIT")),
        Err(e) => {
            let _ = w.batch_execute("ROLLBACK");
            sqlstate::<()>(&Err(e))
        }
    };
    let committed = one_i64(&mut c, &format!("SELECT count(*) FROM payouts WHERE fencing_token = {old}"));
    assert_eq!(
        committed, 0,
        "a payout with token {old} committed after a bump on the fence's owner table (write: {state:?})"
    );
    assert!(state == "LF001" || state == "40001", "the stale write fails with LF001 or 40001, not {state:?}");
}

#[test]
fn a_config_read_under_an_old_snapshot_is_not_kept_by_the_backend() {
    let db = TestDb::new("a34_kept");
    let mut c = db.connect();
    poker(&mut c);
    let mut w = connect_as_role(&db, GAME);
    let (old, new) = move_the_fence_under_an_open_snapshot(&db, &mut w);
    // Whatever the write in the old snapshot does, the transaction ends.
    let _ = w.batch_execute(&format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1, {old})"));
    let _ = w.batch_execute("ROLLBACK");
    // The same server connection, the next client's transaction, at READ
    // COMMITTED (a transaction pooler hands it on).
    let stale = format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 50, {old})");
    let current = format!("INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 80, {new})");
    let stale_state = try_sql(&mut w, &stale);
    let current_state = try_sql(&mut w, &current);
    // A fresh connection judges by the fence as it is.
    let mut fresh = connect_as_role(&db, GAME);
    assert_eq!(try_sql(&mut fresh, &stale), "LF001", "a fresh connection refuses the old token");
    let committed = one_i64(&mut c, &format!("SELECT count(*) FROM payouts WHERE fencing_token = {old}"));
    assert_eq!(
        (stale_state.as_str(), committed, current_state.as_str()),
        ("LF001", 0, ""),
        "on the connection that read the fence under an old snapshot: the old token {old} \
         (then {committed} such payouts committed) and the current token {new}"
    );
}

#[test]
fn a_write_at_repeatable_read_older_than_the_protect_is_a_serialization_failure() {
    let db = TestDb::new("a34_new");
    let mut c = db.connect();
    poker(&mut c);
    must_run(
        &mut c,
        &format!(
            "SET ROLE {MIGRATOR};
             CREATE TABLE p3 (table_id int NOT NULL, fencing_token bigint NOT NULL);
             GRANT SELECT, INSERT ON p3 TO {GAME};
             RESET ROLE;"
        ),
    );
    let mut g = connect_as_role(&db, GAME);
    let token = acquire(&mut g, "table:1", "host-a", "tables");
    let mut w = connect_as_role(&db, GAME);
    must_run(&mut w, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1");
    let mut m = connect_as_role(&db, MIGRATOR);
    must_run(&mut m, "SELECT lease.protect('p3', '{table_id}', 'fencing_token', 'tables')");
    let insert = format!("INSERT INTO p3 VALUES (1, {token})");
    let state = try_sql(&mut w, &insert);
    let _ = w.batch_execute("ROLLBACK");
    // Retried, the transaction succeeds: nothing was tampered with.
    must_run(&mut w, &format!("BEGIN ISOLATION LEVEL REPEATABLE READ; {insert}; COMMIT"));
    assert_eq!(
        state, "40001",
        "a write whose snapshot predates the protect fails as a serialization failure (retry), not as FenceTampering"
    );
}

#[test]
fn trigger_state_doors_in_alter_table_are_refused() {
    let db = TestDb::new("a34_doors");
    let mut c = db.connect();
    poker(&mut c);
    let mut g = connect_as_role(&db, GAME);
    let old = acquire(&mut g, "table:1", "host-a", "tables");
    let new = acquire(&mut g, "table:1", "host-a", "tables");
    let mut m = connect_as_role(&db, MIGRATOR);
    for sql in [
        "ALTER TABLE payouts DISABLE TRIGGER USER",
        "ALTER TABLE tables DISABLE TRIGGER USER",
        "ALTER TABLE payouts ENABLE REPLICA TRIGGER pg_lease_fence",
        "ALTER TABLE payouts ENABLE TRIGGER pg_lease_fence",
        "ALTER TABLE tables ENABLE REPLICA TRIGGER pg_lease_owner_guard",
    ] {
        expect_error(&mut m, sql, "LF008");
    }
    // PostgreSQL 18 itself: only foreign keys change deferrability, and a
    // unique constraint's enforceability cannot change.
    assert_ne!(try_sql(&mut m, "ALTER TABLE tables ALTER CONSTRAINT tables_pkey DEFERRABLE"), "");
    assert_ne!(try_sql(&mut m, "ALTER TABLE tables ALTER CONSTRAINT tables_pkey NOT ENFORCED"), "");
    expect_error(&mut g, &format!("INSERT INTO payouts VALUES (1, 50, {old})"), "LF001");
    must_run(&mut g, &format!("INSERT INTO payouts VALUES (1, 50, {new})"));
    expect_error(&mut m, &format!("UPDATE tables SET owner_fencing_token = {old} WHERE id = 1"), "LF004");
}
