//! Attack review 11 (0.8.0, Citus support): pg_lease on a real Citus cluster
//! (a coordinator and two workers on loopback, ports 54800-54802 plus
//! `PG_LEASE_PORT_OFFSET`; Citus 13.2.2 built by
//! shared/vendor/citus/build.sh), attacked as the roles README.md's "Roles
//! and grants" names: a migrator that owns the fenced and owner tables (no
//! superuser), the application role, a role with UPDATE on owner rows, a DBA
//! (superuser doing maintenance, not tampering), connected to the
//! coordinator or straight to a worker.
//!
//! Each test states the attack, what happened and what should happen. Every
//! test marked **Hole** fails at the commit it was written against
//! (8d405cb); those marked **Defence holds** pass and document what was
//! tried. In short, most severe first:
//!
//! - critical: what the table owner can do on a worker it can do from the
//!   coordinator alone with Citus's `run_command_on_workers`
//!   (`citus_run_command_on_workers_from_the_coordinator_lowers_a_token`):
//!   README's `pg_hba.conf` mitigation does not stop the holes below;
//! - critical: on a worker, the table owner disables a shard's copy of
//!   pg_lease's trigger, writes, and re-enables it ALWAYS in one
//!   transaction: the commit-time check sees the copy whole, so owner tokens
//!   go back (`..._owner_guard_disabled_and_reenabled_...`) and stale rows
//!   commit (`..._fence_copy_disabled_and_reenabled_...`);
//! - critical: on a worker the DDL guard stops at once (the worker's
//!   `lease.protected` is empty): retyping the owner shard's token column
//!   `USING` lowers tokens; a BEFORE trigger named after the fence rewrites
//!   judged rows; TRUNCATE of an owner shard loses its tokens;
//! - critical: shards find their owner table by the *name* in the shell's
//!   trigger argument: renaming shells/shards on a worker, or replacing the
//!   shell's fence config there (DDL propagation off), points them at a
//!   look-alike owner table;
//! - high: `lease.protect` with `citus.enable_ddl_propagation = off`
//!   fences no shard, silently;
//! - high: a fence trigger with a hand-written config on a table nobody
//!   protected runs on its shards: it reads another role's owner rows (the
//!   current token in the refusal), counts and audits forged verdicts;
//! - high: a DBA's `alter_distributed_table` / `undistribute_table` strips
//!   the protection config and the owner guard silently (tokens can then be
//!   lowered), and after `alter_distributed_table` every `ALTER TABLE` in the
//!   database fails in pg_lease's DDL guard;
//! - medium: `update_distributed_table_colocation` breaks the co-location
//!   rule unrefused (a later move makes every write LF008, monitoring
//!   silent); the migrator's `alter_distributed_table` / `undistribute_table`
//!   fail with Citus's `25001` raised inside pg_lease's drop guard;
//! - low: renaming an owner table or moving it to another schema through
//!   the coordinator (allowed on one node) is refused with a wrong reason.

use pg_lease_sessions::postgres::{Client, NoTls};
use pg_lease_sessions::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;

/// Ports of the coordinator and the two workers (plus `PG_LEASE_PORT_OFFSET`).
const COORDINATOR_PORT: u16 = 54800;
const WORKER_PORTS: [u16; 2] = [54801, 54802];
/// Owner rows each test creates (ids 1..=OWNERS, token 5).
const OWNERS: i64 = 40;
/// The table owner the attacks run as: no superuser, the grants README.md's
/// "Roles and grants" gives `migrator`.
const MIGRATOR: &str = "a11_migrator";
/// The application role: INSERT on payouts, no rights on owner rows.
const APP: &str = "a11_app";
/// A role granted UPDATE and DELETE on owner rows (README: "Even a role
/// allowed to UPDATE owner rows cannot lower or clear a token").
const UPDATER: &str = "a11_updater";

const CONF: &[&str] = &[
    "shared_preload_libraries = 'citus,pg_lease'",
    "max_prepared_transactions = 100",
    "wal_level = logical",
    "max_worker_processes = 32",
    "max_connections = 200",
    "citus.node_conninfo = 'sslmode=disable'",
];

struct CitusCluster {
    coordinator: Cluster,
    workers: Vec<Cluster>,
}

static CLUSTER: OnceLock<CitusCluster> = OnceLock::new();
static SEQ: AtomicUsize = AtomicUsize::new(0);
/// Held for reading by every test, for writing by those that leave tables in
/// a state that makes pg_lease's DDL guard fail on any later `ALTER TABLE`
/// in the database (a table stripped of its protection by Citus but still
/// carrying pg_lease's TRUNCATE trigger: the guard drops such a trigger, and
/// Citus refuses trigger DDL on distributed tables), until they cleaned up.
static STATE: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    STATE.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    STATE.write().unwrap_or_else(|e| e.into_inner())
}

/// Drops a test's tables when it ends, passed or failed (as a superuser, with
/// Citus's trigger switch on, the fenced table first).
struct DropAtEnd(Vec<String>);

impl Drop for DropAtEnd {
    fn drop(&mut self) {
        let mut su = citus().coordinator.connect();
        let _ = su.batch_execute("SET citus.enable_unsafe_triggers = on");
        for table in &self.0 {
            let _ = su.batch_execute(&format!("DROP TABLE IF EXISTS {table} CASCADE"));
        }
    }
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn stop_clusters() {
    if let Some(citus) = CLUSTER.get() {
        for node in citus.workers.iter().chain([&citus.coordinator]) {
            node.stop();
        }
    }
}

fn citus() -> &'static CitusCluster {
    CLUSTER.get_or_init(|| {
        let (coordinator, workers) = thread::scope(|s| {
            let coordinator = s.spawn(|| Cluster::start_with("a11_coord", COORDINATOR_PORT, CONF));
            let workers: Vec<_> = WORKER_PORTS
                .iter()
                .enumerate()
                .map(|(i, &port)| s.spawn(move || Cluster::start_with(&format!("a11_w{}", i + 1), port, CONF)))
                .collect();
            (coordinator.join().unwrap(), workers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>())
        });
        let citus = CitusCluster { coordinator, workers };
        // SAFETY: atexit only stores the pointer of a function that lives as
        // long as the program; it runs at exit, after the tests.
        let registered = unsafe { atexit(stop_clusters) };
        assert_eq!(registered, 0, "atexit");
        for node in &citus.workers {
            node.connect().batch_execute("CREATE EXTENSION citus").unwrap();
        }
        let mut c = citus.coordinator.connect();
        c.batch_execute("CREATE EXTENSION citus").unwrap();
        c.execute("SELECT citus_set_coordinator_host('127.0.0.1', $1)", &[&i32::from(citus.coordinator.port)]).unwrap();
        for node in &citus.workers {
            c.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&i32::from(node.port)]).unwrap();
        }
        c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
        // Roles as README.md's walkthrough grants them (Citus propagates
        // roles and grants to the workers).
        c.batch_execute(&format!(
            "CREATE ROLE {MIGRATOR} LOGIN;
             GRANT CREATE ON SCHEMA public TO {MIGRATOR};
             GRANT EXECUTE ON FUNCTION lease.protect, lease.unprotect TO {MIGRATOR};
             CREATE ROLE {APP} LOGIN;
             GRANT USAGE ON SCHEMA lease TO {APP};
             CREATE ROLE {UPDATER} LOGIN;"
        ))
        .unwrap();
        citus
    })
}

impl CitusCluster {
    /// A connection as `user` to the node listening on `port`.
    fn node_as(&self, port: u16, user: &str) -> Client {
        let conn = format!("host=127.0.0.1 port={port} user={user} dbname=postgres application_name=attack11");
        Client::connect(&conn, NoTls).unwrap_or_else(|e| panic!("connect to {port} as {user}: {e}"))
    }

    fn coordinator_as(&self, user: &str) -> Client {
        self.node_as(self.coordinator.port, user)
    }
}

fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{}: {} | {} | {}",
            db.code().code(),
            db.message(),
            db.detail().unwrap_or(""),
            db.hint().unwrap_or("")
        ),
        None => e.to_string(),
    }
}

#[track_caller]
fn ok(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
}

/// `Err("SQLSTATE: message | detail | hint")` or `Ok(())`.
fn attempt(c: &mut Client, sql: &str) -> Result<(), String> {
    c.batch_execute(sql).map_err(|e| describe(&e))
}

/// A test's tables, owned by the migrator: owner rows in `t` (`id bigint
/// PRIMARY KEY, owner_fencing_token bigint`, ids 1..=OWNERS at token 5)
/// distributed by id, fenced `p` distributed by table_id co-located with
/// `t`, in a co-location group of their own; the application may insert
/// into `p` and read `t`.
struct Poker {
    t: String,
    p: String,
}

fn poker(name: &str) -> Poker {
    let poker = unprotected(name, 5);
    let Poker { t, p } = &poker;
    ok(
        &mut citus().coordinator_as(MIGRATOR),
        &format!(
            "SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');
             GRANT SELECT ON {t} TO {APP};
             GRANT SELECT, UPDATE, DELETE ON {t} TO {UPDATER};
             GRANT SELECT, INSERT ON {p} TO {APP};"
        ),
    );
    poker
}

/// The tables of `poker(name)`, owner rows at `token`, not protected.
fn unprotected(name: &str, token: i64) -> Poker {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("{name}{n}_tables"), format!("{name}{n}_payouts"));
    ok(
        &mut citus().coordinator_as(MIGRATOR),
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id bigint NOT NULL, hand bigint NOT NULL DEFAULT 0,
                               amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
             SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none');
             SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}');
             INSERT INTO {t} SELECT g, {token} FROM generate_series(1, {OWNERS}) g;"
        ),
    );
    Poker { t, p }
}

/// The config argument `lease.protect` gives the fence trigger of a Citus
/// table fenced by `table_id`/`fencing_token` against `owner` (`id`,
/// `owner_fencing_token`), written by hand.
fn config_naming(owner: &str) -> String {
    format!(
        r#"{{"mode": "owner", "key_columns": ["table_id"], "owner_table": "public.{owner}", "token_column": "fencing_token", "owner_key_columns": ["id"], "owner_token_column": "owner_fencing_token"}}"#
    )
}

fn pay(p: &str, id: i64, token: i64) -> String {
    format!("INSERT INTO {p} (table_id, amount, fencing_token) VALUES ({id}, 10, {token})")
}

/// Where owner row `id` of `t` lives: (port of its worker, shard id of `t`,
/// shard id of `p` co-located with it).
fn placement(c: &mut Client, t: &str, p: &str, id: i64) -> (u16, i64, i64) {
    let row = c
        .query_one(
            &format!(
                "SELECT n.nodeport, get_shard_id_for_distribution_column('{t}', {id}),
                        get_shard_id_for_distribution_column('{p}', {id})
                   FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                  WHERE pl.shardid = get_shard_id_for_distribution_column('{t}', {id})"
            ),
            &[],
        )
        .unwrap();
    (u16::try_from(row.get::<_, i32>(0)).unwrap(), row.get(1), row.get(2))
}

fn token_of(c: &mut Client, t: &str, id: i64) -> i64 {
    one_i64(c, &format!("SELECT owner_fencing_token FROM {t} WHERE id = {id}"))
}

/// Bumps owner row `id` of `t` to token 6 through the coordinator (as
/// `lease.acquire` would): 5 is stale from then on.
fn bump_to_6(c: &mut Client, t: &str, id: i64) {
    ok(c, &format!("UPDATE {t} SET owner_fencing_token = 6 WHERE id = {id}"));
}

/// What the fence says about owner `id` after an attack, and whether it
/// held: its token (6 before the attack), what a write with the stale token
/// 5 through the coordinator gave, and how many rows with a token below 6
/// owner `id` has.
fn fence_state(c: &mut Client, Poker { t, p }: &Poker, id: i64) -> (bool, String) {
    let token = token_of(c, t, id);
    let stale = attempt(c, &pay(p, id, 5));
    let stale_rows = one_i64(c, &format!("SELECT count(*) FROM {p} WHERE table_id = {id} AND fencing_token < 6"));
    let held = token == 6 && stale.as_ref().is_err_and(|e| e.starts_with("LF001")) && stale_rows == 0;
    (held, format!("owner {id}: token {token} (was 6), a write with stale token 5 gave {stale:?}, rows with a stale token: {stale_rows}"))
}

/// The stale token 5 for owner `id` must still be refused through the
/// coordinator, and the owner row must still carry 6.
#[track_caller]
fn still_fenced(c: &mut Client, poker: &Poker, id: i64) {
    let (held, state) = fence_state(c, poker, id);
    assert!(held, "{state}");
}

/// A fresh pair of tables (`poker(name)`) and a coordinator connection as
/// the migrator, after owner 7's token was raised to 6.
fn attacked(name: &str) -> (Poker, Client) {
    let poker = poker(name);
    let mut m = citus().coordinator_as(MIGRATOR);
    bump_to_6(&mut m, &poker.t, 7);
    (poker, m)
}

/// Runs `body` as the migrator straight on the worker at `port`, in one
/// transaction that allows manual changes to shards; rolled back on error.
fn as_migrator_on_worker(port: u16, body: &str) -> Result<(), String> {
    let mut w = citus().node_as(port, MIGRATOR);
    let r = attempt(&mut w, &format!("BEGIN; SET LOCAL citus.enable_manual_changes_to_shards = on; {body}; COMMIT;"));
    let _ = w.batch_execute("ROLLBACK");
    r
}

/// Whether `r` failed with one of the SQLSTATEs `codes`.
fn failed_with(r: &Result<(), String>, codes: &[&str]) -> bool {
    r.as_ref().is_err_and(|e| codes.iter().any(|code| e.starts_with(code)))
}

/// **Hole (critical).** Attack: the migrator, who owns the tables, connects
/// straight to the worker that holds owner row 7's shard and, in ONE
/// transaction, disables the shard's copy of `pg_lease_owner_guard`, lowers
/// the owner token from 6 back to 5, and re-enables the copy `ALWAYS`.
/// On one node (and on the coordinator) the DISABLE is refused at once
/// (LF008). On a worker, the guard only checks at commit that the copy is
/// enabled ALWAYS again: observed, the transaction commits and the token
/// goes back to 5, so the holder of the stale token 5 writes again.
/// Expected: LF008 (the DISABLE refused as on one node, or the commit
/// refused because the owner token was lowered); the token stays 6.
#[test]
fn citus_worker_owner_guard_disabled_and_reenabled_in_one_transaction_lowers_a_token() {
    let _state = shared();
    let (poker, mut m) = attacked("og");
    let Poker { t, p } = &poker;
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "ALTER TABLE {t}_{ts} DISABLE TRIGGER pg_lease_owner_guard_{ts};
             UPDATE {t}_{ts} SET owner_fencing_token = 5 WHERE id = 7;
             ALTER TABLE {t}_{ts} ENABLE ALWAYS TRIGGER pg_lease_owner_guard_{ts}"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(failed_with(&r, &["LF008", "LF004"]) && held, "worker tampering gave {r:?}; {state}");
}

/// **Hole (critical: no worker access needed).** README's mitigation for
/// what a table owner can do on a worker is "give roles that own fenced
/// tables no direct access to workers (`pg_hba.conf`)". Attack: the
/// migrator, connected to the coordinator only, sends the disable / lower /
/// re-enable transaction of
/// `citus_worker_owner_guard_disabled_and_reenabled_in_one_transaction_lowers_a_token`
/// to the workers with Citus's `run_command_on_workers` (executable by any
/// role; it connects to each worker as the caller). Observed: owner 7's
/// token goes from 6 back to 5 and the stale token 5 writes. Expected: the
/// token stays 6 (LF008/LF004 on the worker).
#[test]
fn citus_run_command_on_workers_from_the_coordinator_lowers_a_token() {
    let _state = shared();
    let (poker, mut m) = attacked("rcw");
    let Poker { t, p } = &poker;
    let (_, ts, _) = placement(&mut m, t, p, 7);
    let results: Vec<(bool, String)> = m
        .query(
            &format!(
                "SELECT success, result FROM run_command_on_workers(
                     'BEGIN; ALTER TABLE {t}_{ts} DISABLE TRIGGER pg_lease_owner_guard_{ts};
                      UPDATE {t}_{ts} SET owner_fencing_token = 5 WHERE id = 7;
                      ALTER TABLE {t}_{ts} ENABLE ALWAYS TRIGGER pg_lease_owner_guard_{ts}; COMMIT')"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(held, "run_command_on_workers gave {results:?}; {state}");
}

/// **Hole (critical).** Attack: the migrator on the worker holding the
/// payouts shard of owner 7, in one transaction: disable the shard's copy of
/// `pg_lease_fence`, insert a payout with the stale token 5 (current 6),
/// re-enable the copy `ALWAYS`, commit. Observed: the stale row commits.
/// Expected: LF008 at the DISABLE (as on one node and on the coordinator),
/// no stale row.
#[test]
fn citus_worker_fence_copy_disabled_and_reenabled_in_one_transaction_commits_a_stale_row() {
    let _state = shared();
    let (poker, mut m) = attacked("fc");
    let Poker { t, p } = &poker;
    let (port, _, ps) = placement(&mut m, t, p, 7);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "ALTER TABLE {p}_{ps} DISABLE TRIGGER pg_lease_fence_{ps};
             INSERT INTO {p}_{ps} (table_id, amount, fencing_token) VALUES (7, 1000000, 5);
             ALTER TABLE {p}_{ps} ENABLE ALWAYS TRIGGER pg_lease_fence_{ps}"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(failed_with(&r, &["LF008"]) && held, "worker tampering gave {r:?}; {state}");
}

/// **Hole (critical).** Attack: the migrator on the worker rewrites the
/// owner shard's token column with `ALTER COLUMN ... TYPE bigint USING`
/// (same type; the rewrite passes no row trigger), setting owner 7's token
/// back from 6 to 5. On one node and on the coordinator this is LF008
/// ("would rewrite a fenced column"); on a worker the DDL guard stops early
/// (the worker's `lease.protected` is empty) and the commit-time shard check
/// only looks at trigger copies. Observed: the token goes back to 5.
/// Expected: LF008.
#[test]
fn citus_worker_owner_shard_token_column_retyped_lowers_a_token() {
    let _state = shared();
    let (poker, mut m) = attacked("rt");
    let Poker { t, p } = &poker;
    // The same on the coordinator is refused.
    let r = attempt(
        &mut m,
        &format!("ALTER TABLE {t} ALTER COLUMN owner_fencing_token TYPE bigint USING owner_fencing_token - 1"),
    );
    assert!(failed_with(&r, &["LF008"]), "retype through the coordinator: {r:?}");
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "ALTER TABLE {t}_{ts} ALTER COLUMN owner_fencing_token TYPE bigint
                   USING CASE WHEN id = 7 THEN 5 ELSE owner_fencing_token END"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(failed_with(&r, &["LF008"]) && held, "retype on the worker gave {r:?}; {state}");
}

/// **Hole (high).** Attack: the migrator on a worker adds to the payouts
/// shard a BEFORE ROW trigger named to fire after the shard's copy of
/// `pg_lease_fence` (`zz_...`), which moves the row the fence accepted for
/// owner 7 (token 6) to another owner of the same shard, whose token is 9
/// and which the writer never held. On one node and on the coordinator such a
/// trigger is refused (LF008: it could change the row the fence judged).
/// Observed on the worker: accepted, and a row for that other owner commits
/// with a token that is not its own. Expected: LF008 at CREATE TRIGGER (or at commit).
#[test]
fn citus_worker_trigger_after_the_fence_copy_rewrites_judged_rows() {
    let _state = shared();
    let (poker, mut m) = attacked("af");
    let Poker { t, p } = &poker;
    let (port, _, ps) = placement(&mut m, t, p, 7);
    // Another owner on the same shard.
    let other = (1..=OWNERS)
        .find(|&id| id != 7 && placement(&mut m, t, p, id).2 == ps)
        .expect("a second owner on owner 7's shard");
    ok(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 9 WHERE id = {other}"));
    ok(
        &mut m,
        &format!(
            "CREATE FUNCTION {p}_move() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN NEW.table_id := {other}; RETURN NEW; END $$"
        ),
    );
    // Through the coordinator: refused.
    let through_coordinator = (|| {
        let mut tx = m.transaction()?;
        tx.batch_execute("SET LOCAL citus.enable_unsafe_triggers = on")?;
        tx.batch_execute(&format!(
            "CREATE TRIGGER zz_move BEFORE INSERT ON {p} FOR EACH ROW EXECUTE FUNCTION {p}_move()"
        ))?;
        tx.commit()
    })()
    .map_err(|e| describe(&e));
    assert!(failed_with(&through_coordinator, &["LF008"]), "{through_coordinator:?}");
    let r = as_migrator_on_worker(
        port,
        &format!("CREATE TRIGGER zz_move BEFORE INSERT ON {p}_{ps} FOR EACH ROW EXECUTE FUNCTION {p}_move()"),
    );
    if r.is_ok() {
        // The application writes for owner 7 with 7's current token...
        let mut app = citus().coordinator_as(APP);
        let _ = app.batch_execute(&pay(p, 7, 6));
    }
    let moved = one_i64(&mut m, &format!("SELECT count(*) FROM {p} WHERE table_id = {other}"));
    assert!(
        failed_with(&r, &["LF008"]) && moved == 0,
        "a trigger firing after the fence on a shard: {r:?}; rows that landed on owner {other} (token 9) with token 6: {moved}"
    );
}

/// **Hole (high).** Attack: the migrator, owner of both tables, truncates
/// the owner table's shard straight on its worker. TRUNCATE of an owner
/// table is LF004 on one node and through the coordinator; Citus copies
/// statement triggers only to shards it moves, so a shard never moved has no
/// TRUNCATE guard. Observed: every owner row on that shard and its token
/// vanish; re-inserted through the coordinator (the owner may insert owner
/// rows) at the old token 5, the holder of stale token 5 writes again.
/// Expected: LF004 (or LF008), owner rows kept.
#[test]
fn citus_worker_truncate_of_an_owner_shard_loses_tokens() {
    let _state = shared();
    let (poker, mut m) = attacked("tr");
    let Poker { t, p } = &poker;
    let r = attempt(&mut m, &format!("TRUNCATE {t}"));
    assert!(failed_with(&r, &["LF004", "LF008"]), "{r:?}");
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let r = as_migrator_on_worker(port, &format!("TRUNCATE {t}_{ts}"));
    if r.is_ok() {
        let _ = m.batch_execute(&format!("INSERT INTO {t} VALUES (7, 5)"));
    }
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(failed_with(&r, &["LF004", "LF008"]) && held, "TRUNCATE of the owner shard gave {r:?}; {state}");
}

/// **Defence holds.** The application role connected straight to a worker
/// writes into the payouts shard with the stale token (LF001) and into the
/// worker's shell of the distributed table (routed by Citus, LF001); setting
/// `pg_lease.token` for a role on the coordinator (propagated by Citus) is
/// refused.
#[test]
fn citus_application_on_a_worker_is_fenced() {
    let _state = shared();
    let (poker, mut m) = attacked("app");
    let Poker { t, p } = &poker;
    let (port, _, ps) = placement(&mut m, t, p, 7);
    let mut w = citus().node_as(port, APP);
    for sql in [format!("INSERT INTO {p}_{ps} (table_id, amount, fencing_token) VALUES (7, 10, 5)"), pay(p, 7, 5)] {
        let r = attempt(&mut w, &sql);
        assert!(r.as_ref().is_err_and(|e| e.starts_with("LF001")), "{sql}: {r:?}");
    }
    let mut su = citus().coordinator.connect();
    let r = attempt(&mut su, &format!("ALTER ROLE {APP} SET pg_lease.token = '6'"));
    assert!(r.as_ref().is_err_and(|e| e.starts_with("22023")), "ALTER ROLE SET pg_lease.token: {r:?}");
    still_fenced(&mut m, &poker, 7);
}

/// A second owner table `d` (same shape as `t`, co-located with it, owner
/// rows 1..=OWNERS at token 5, owned by the migrator): a look-alike.
fn decoy(m: &mut Client, Poker { t, .. }: &Poker) -> String {
    let d = format!("{t}_decoy");
    ok(
        m,
        &format!(
            "CREATE TABLE {d} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             SELECT create_distributed_table('{d}', 'id', colocate_with => '{t}');
             INSERT INTO {d} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;"
        ),
    );
    d
}

/// **Defence holds** (today because the owner table's rename is refused,
/// see `citus_owner_table_rename_through_the_coordinator_works_as_on_one_node`:
/// a fix that allows it must keep this one passing).
/// Attack: a look-alike owner table by renames through the coordinator.
/// The migrator renames the owner table away and a co-located look-alike
/// (owner 7 at the stale token 5) into its name, through the coordinator
/// (Citus renames shells and shards on every worker). A shard's fence finds
/// its owner table by the *name* in its trigger's config (`"owner_table":
/// "public.<t>"`), where one node follows the table's oid ("a look-alike
/// table is never consulted"). Expected: either the renames are refused, or
/// the fence keeps judging against the real owner table (stale token 5
/// refused, current 6 accepted); never a stale write accepted against the
/// look-alike.
#[test]
fn citus_owner_table_renamed_through_the_coordinator_never_consults_a_look_alike() {
    let _state = shared();
    let (poker, mut m) = attacked("rn");
    let Poker { t, p } = &poker;
    let d = decoy(&mut m, &poker);
    let renamed =
        attempt(&mut m, &format!("BEGIN; ALTER TABLE {t} RENAME TO {t}_real; ALTER TABLE {d} RENAME TO {t}; COMMIT;"));
    let _ = m.batch_execute("ROLLBACK");
    let real = if renamed.is_ok() { format!("{t}_real") } else { t.clone() };
    let mut app = citus().coordinator_as(APP);
    let stale = attempt(&mut app, &pay(p, 7, 5));
    let current = attempt(&mut app, &pay(p, 7, 6));
    eprintln!("renames through the coordinator: {renamed:?}; stale: {stale:?}; current: {current:?}");
    assert_eq!(token_of(&mut m, &real, 7), 6);
    assert!(
        stale.as_ref().is_err_and(|e| e.starts_with("LF001")) && current.is_ok(),
        "after renames ({renamed:?}): stale token 5 gave {stale:?}, current token 6 gave {current:?}"
    );
}

/// **Limit, detected.** Attack: a look-alike owner
/// table by renames on a worker. The
/// migrator on the worker holding owner 7, with
/// `citus.enable_ddl_propagation = off`, renames the owner table's shell and
/// its shards there away and a co-located look-alike's shell and shards
/// (owner 7 at the stale token 5) into their names. The shards' fence finds
/// its owner table by name: the application's stale write (token 5) through
/// the coordinator is then judged against the look-alike. Observed: the
/// renames commit on the worker and the stale write (token 5, current 6) is
/// accepted and committed; only `lease.cluster_fence_problems()` notices
/// afterwards ("the owner guard of <t> here is missing"). Kept as a
/// documented limit (the table owner can unprotect anyway; Citus's own
/// changes reach a worker the same way): the coordinator's
/// `lease.cluster_fence_problems()` must name the worker.
#[test]
fn citus_owner_shell_swapped_on_a_worker_is_refused() {
    let _state = shared();
    let (poker, mut m) = attacked("sw");
    let Poker { t, p } = &poker;
    let d = decoy(&mut m, &poker);
    let (port, _, _) = placement(&mut m, t, p, 7);
    let shard_ids = |m: &mut Client, rel: &str| -> Vec<i64> {
        m.query(
            &format!(
                "SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement pl USING (shardid)
                   JOIN pg_dist_node n USING (groupid)
                  WHERE s.logicalrelid = '{rel}'::regclass AND n.nodeport = {port} ORDER BY s.shardid"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let (t_shards, d_shards) = (shard_ids(&mut m, t), shard_ids(&mut m, &d));
    let mut sql = format!(
        "SET LOCAL citus.enable_ddl_propagation = off;
         ALTER TABLE {t} RENAME TO {t}_real; ALTER TABLE {d} RENAME TO {t};"
    );
    for s in &t_shards {
        sql += &format!("ALTER TABLE {t}_{s} RENAME TO {t}_real_{s};");
    }
    for s in &d_shards {
        sql += &format!("ALTER TABLE {d}_{s} RENAME TO {t}_{s};");
    }
    sql += "SELECT 1";
    let renamed = as_migrator_on_worker(port, &sql);
    // Refused on the worker since review 12 (only Citus's own connections
    // change a fenced table's shards there); the coordinator's
    // lease.cluster_fence_problems() would name it otherwise.
    assert!(failed_with(&renamed, &["LF008"]), "{renamed:?}");
    let mut app = citus().coordinator_as(APP);
    let stale = attempt(&mut app, &pay(p, 7, 5));
    assert!(failed_with(&stale, &["LF001"]), "{stale:?}");
}

/// Whether `r` is a refusal that says what pg_lease refuses: one of its LF
/// codes, or 0A000 (an unsupported layout), never a Citus internal error
/// raised from inside pg_lease's own guard.
fn clear_refusal(r: &Result<(), String>) -> bool {
    r.as_ref().is_err_and(|e| e.starts_with("LF") || e.starts_with("0A000"))
}

/// **Hole (medium: a legitimate Citus operation broken, unclear error).**
/// Attack: the migrator runs `alter_distributed_table` (a new shard count
/// for the fenced table and, cascading, its co-located owner table): Citus
/// builds new tables, copies the rows, drops the old ones and renames the
/// new ones into place. Observed: `25001 cannot perform query on placements
/// that were modified in this transaction by a different user`, raised from
/// pg_lease's drop guard (`lease._guard_drop` drops the owner guard of the
/// owner table as the extension owner, in the migrator's transaction that
/// Citus already wrote as the migrator). The same on unprotected tables
/// succeeds. Expected: either it works and the tables stay fenced (stale
/// token refused, current accepted, both tables still in
/// `lease.protected`), or pg_lease refuses it with its own clear error
/// (LF008/0A000 saying to unprotect first).
#[test]
fn citus_alter_distributed_table_by_the_migrator_keeps_the_fence_or_is_refused_clearly() {
    let _state = shared();
    let (poker, mut m) = attacked("adt");
    let p = &poker.p;
    let r = attempt(
        &mut m,
        &format!("SELECT alter_distributed_table('{p}', shard_count => 8, cascade_to_colocated => true)"),
    );
    let stale = attempt(&mut m, &pay(p, 7, 5));
    let current = attempt(&mut m, &pay(p, 7, 6));
    let protected = one_i64(&mut m, &format!("SELECT count(*) FROM lease.protected WHERE relid = '{p}'::regclass"));
    eprintln!(
        "migrator alter_distributed_table: {r:?}; stale: {stale:?}; current: {current:?}; protected: {protected}"
    );
    assert!(
        clear_refusal(&r)
            || (r.is_ok() && failed_with(&stale, &["LF001"]) && current.is_ok() && protected == 1),
        "alter_distributed_table gave {r:?}; then stale token 5: {stale:?}, current token 6: {current:?}, protected: {protected}"
    );
    if r.is_err() {
        still_fenced(&mut m, &poker, 7);
    }
}

/// **Hole (high: tokens can go backwards; the fence and the audit's view of
/// it silently lost).** Attack: a DBA (superuser, doing maintenance, not
/// tampering) changes the shard count of a fenced table and its owner table
/// with `alter_distributed_table(..., cascade_to_colocated => true)`, with
/// `citus.enable_unsafe_triggers = on` (without it Citus refuses to recreate
/// pg_lease's triggers: `triggers are not supported on distributed
/// tables`, an unclear error). Observed: it succeeds; `lease.protected` and
/// `lease.protected_tables` no longer list either table, the owner table
/// has no `pg_lease_owner_guard` any more, so an UPDATE lowers owner 7's
/// token from 6 to 5 (accepted) and the stale token 5 then writes; and
/// `lease.cluster_fence_problems()` reports nothing. Worse, the fenced
/// table keeps pg_lease's TRUNCATE trigger: from then on every `ALTER TABLE`
/// anyone runs in the database fails (`XX000 triggers are not supported on
/// distributed tables`, from pg_lease's DDL guard dropping that stray
/// trigger). Expected: the operation keeps the fence (config, owner guard:
/// lowering is LF004) or is refused with a clear pg_lease error
/// (LF008/0A000: unprotect first); other DDL unaffected.
#[test]
fn citus_alter_distributed_table_by_a_dba_keeps_the_owner_guard_or_is_refused() {
    let _state = exclusive();
    let c = citus();
    let poker = poker("adtsu");
    let Poker { t, p } = &poker;
    let _drop = DropAtEnd(vec![p.clone(), t.clone()]);
    let mut su = c.coordinator.connect();
    bump_to_6(&mut su, t, 7);
    let r = attempt(
        &mut su,
        &format!(
            "SET citus.enable_unsafe_triggers = on;
             SELECT alter_distributed_table('{p}', shard_count => 8, cascade_to_colocated => true);"
        ),
    );
    ok(&mut su, "RESET citus.enable_unsafe_triggers");
    let protected = one_i64(&mut su, &format!("SELECT count(*) FROM lease.protected WHERE relid = '{p}'::regclass"));
    let problems =
        one_i64(&mut su, &format!("SELECT count(*) FROM lease.cluster_fence_problems() WHERE target LIKE '%{p}'"));
    // A role allowed to UPDATE owner rows lowers a token.
    let lowered = attempt(&mut su, &format!("UPDATE {t} SET owner_fencing_token = 5 WHERE id = 7"));
    let (held, state) = fence_state(&mut su, &poker, 7);
    // Unrelated DDL in the database still works.
    let other = self::poker("adtother");
    let unrelated =
        attempt(&mut citus().coordinator_as(MIGRATOR), &format!("ALTER TABLE {} ADD COLUMN note text", other.t));
    assert!(
        (clear_refusal(&r)
            || (r.is_ok() && protected == 1 && lowered.as_ref().is_err_and(|e| e.starts_with("LF004")) && held))
            && unrelated.is_ok(),
        "alter_distributed_table gave {r:?}; lease.protected rows for {p}: {protected}; \
         cluster_fence_problems rows: {problems}; lowering owner 7's token to 5 gave {lowered:?}; {state}; \
         then an unrelated ALTER TABLE by the migrator gave {unrelated:?}"
    );
}

/// **Hole (medium: unclear error).** Attack: the migrator runs
/// `undistribute_table` on the fenced table (Citus recreates it as a local
/// table; the owner table stays distributed, a layout `lease.protect`
/// refuses). Observed: `25001 cannot perform query on placements that were
/// modified in this transaction by a different user`, from inside
/// pg_lease's drop guard. Expected: refused with a clear pg_lease error
/// (LF008/0A000), the table still fenced.
#[test]
fn citus_undistribute_table_of_a_fenced_table_by_the_migrator_is_refused_clearly() {
    let _state = shared();
    let (poker, mut m) = attacked("und");
    let p = &poker.p;
    let r = attempt(&mut m, &format!("SELECT undistribute_table('{p}')"));
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(clear_refusal(&r) && held, "undistribute_table gave {r:?}; {state}");
}

/// **Hole (high: tokens can go backwards).** Attack: a DBA (superuser)
/// runs `undistribute_table` on the fenced table. Observed: it succeeds;
/// the new local table carries `pg_lease_fence` but `lease.protected` has
/// no entry (every write LF008 with a hint about schema-only dumps), and the
/// owner table lost `pg_lease_owner_guard`: an UPDATE lowers owner 7's token
/// from 6 to 1 unchecked (once the table is protected again, old tokens
/// write). Expected: refused with a clear error (the layout it leaves is
/// one `lease.protect` refuses: unprotect first), owner guard kept
/// (lowering LF004).
#[test]
fn citus_undistribute_table_by_a_dba_keeps_the_owner_guard_or_is_refused() {
    let _state = exclusive();
    let c = citus();
    let poker = poker("undsu");
    let Poker { t, p } = &poker;
    let _drop = DropAtEnd(vec![p.clone(), t.clone()]);
    let mut su = c.coordinator.connect();
    bump_to_6(&mut su, t, 7);
    let r = attempt(&mut su, &format!("SELECT undistribute_table('{p}')"));
    let lowered = attempt(&mut su, &format!("UPDATE {t} SET owner_fencing_token = 1 WHERE id = 7"));
    assert!(
        clear_refusal(&r) && lowered.as_ref().is_err_and(|e| e.starts_with("LF004")),
        "undistribute_table gave {r:?}; lowering owner 7's token to 1 then gave {lowered:?}"
    );
}

/// **Defence holds.** `undistribute_table` of the owner table is refused
/// by pg_lease (LF008: it would drop an owner table in use), tokens kept.
#[test]
fn citus_undistribute_table_of_an_owner_table_is_refused() {
    let _state = shared();
    let c = citus();
    let poker = poker("undo");
    let Poker { t, .. } = &poker;
    let mut m = c.coordinator_as(MIGRATOR);
    bump_to_6(&mut m, t, 7);
    let r = attempt(&mut m, &format!("SELECT undistribute_table('{t}', cascade_via_foreign_keys => false)"));
    assert!(clear_refusal(&r), "undistribute_table of an owner table in use: {r:?}");
    still_fenced(&mut m, &poker, 7);
}

/// **Hole (low: legitimate DDL refused with a wrong reason).** The
/// migrator renames the owner table through the coordinator, which one node
/// allows (the fence follows the table, README: "A session with warm caches
/// keeps judging against the real owner table after schema and table
/// renames"). Observed: LF008 "ALTER TABLE would leave the fence on
/// <payouts> incomplete | trigger pg_lease_fence on <payouts> no longer fires
/// on every INSERT, UPDATE and DELETE of every row" — the trigger is
/// untouched; what changed is the owner table's name in the fence
/// trigger's Citus config. (Renaming the fenced table itself works.)
/// Expected: the rename works and the fence keeps judging against the
/// renamed owner table (stale refused, current accepted), or a refusal
/// that says the owner table of a distributed fence cannot be renamed.
#[test]
fn citus_owner_table_rename_through_the_coordinator_works_as_on_one_node() {
    let _state = shared();
    let (poker, mut m) = attacked("orn");
    let Poker { t, p } = &poker;
    let r = attempt(&mut m, &format!("ALTER TABLE {t} RENAME TO {t}_new"));
    let renamed = Poker { t: if r.is_ok() { format!("{t}_new") } else { t.clone() }, p: p.clone() };
    let current = attempt(&mut m, &pay(p, 7, 6));
    let (held, state) = fence_state(&mut m, &renamed, 7);
    assert!(
        (r.is_ok() || r.as_ref().is_err_and(|e| e.contains("rename"))) && held && current.is_ok(),
        "renaming owner table {t} gave {r:?}; current token 6: {current:?}; {state}"
    );
}

/// **Limit, detected and failing closed.** Attack: the migrator moves the fenced
/// table out of its owner table's co-location group with
/// `update_distributed_table_colocation(p, colocate_with => 'none')`, a
/// layout `lease.protect` refuses (0A000). Observed: accepted;
/// `lease.cluster_fence_problems()` reports nothing; the next routine move
/// of the owner table's shard (Citus now moves it alone) leaves the payouts
/// shard without its owner rows on its node: every write for those owners,
/// current tokens included, is LF008 "has no shard of its owner table
/// co-located with it on this node". Expected: the co-location change
/// refused while the fence needs it (0A000/LF008), so that writes with the
/// current token keep working after the move.
#[test]
fn citus_update_distributed_table_colocation_is_named_and_fails_closed() {
    let _state = shared();
    let (poker, mut m) = attacked("col");
    let Poker { t, p } = &poker;
    let r = attempt(&mut m, &format!("SELECT update_distributed_table_colocation('{p}', colocate_with => 'none')"));
    let mut su = citus().coordinator.connect();
    let problems =
        one_i64(&mut su, &format!("SELECT count(*) FROM lease.cluster_fence_problems() WHERE target LIKE '%{p}'"));
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let to = WORKER_PORTS.iter().map(|w| w + port_offset()).find(|&w| w != port).unwrap();
    ok(
        &mut su,
        &format!("SELECT citus_move_shard_placement({ts}, '127.0.0.1', {port}, '127.0.0.1', {to}, 'block_writes')"),
    );
    let current = attempt(&mut m, &pay(p, 7, 6));
    let stale = attempt(&mut m, &pay(p, 7, 5));
    // A limit (a function call, which no event trigger sees): the
    // coordinator's check names it at once, and after the move every write
    // of those owners fails closed (LF008) with a hint that says why.
    assert!(r.is_ok(), "{r:?}");
    assert!(problems > 0, "lease.cluster_fence_problems() after update_distributed_table_colocation: {problems} rows");
    for w in [&current, &stale] {
        assert!(
            failed_with(w, &["LF008"]) && w.as_ref().is_err_and(|e| e.contains("co-located")),
            "after moving owner 7's shard away from its payouts: {w:?}"
        );
    }
}

/// **Defence holds.** Owner tables protected while local, then handed to
/// Citus by the migrator: `citus_add_local_table_to_metadata` is refused
/// (LF008, pg_lease's triggers would be dropped from the table that becomes
/// the shard), `create_reference_table` fails (with the unsafe-trigger
/// switch on, pg_lease's owner guard refuses to run on the new shard: "fired
/// on <t>_1021xx, which pg_lease does not guard", unclear but safe); the
/// fence keeps working on the local tables.
#[test]
fn citus_local_fenced_tables_handed_to_citus_keep_their_fence() {
    let _state = shared();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let poker = Poker { t: format!("loc{n}_tables"), p: format!("loc{n}_payouts") };
    let Poker { t, p } = &poker;
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id bigint NOT NULL, amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
             INSERT INTO {t} SELECT g, 6 FROM generate_series(1, {OWNERS}) g;
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');
             SET citus.enable_unsafe_triggers = on;"
        ),
    );
    for sql in [
        format!("SELECT citus_add_local_table_to_metadata('{p}')"),
        format!("SELECT citus_add_local_table_to_metadata('{t}')"),
    ] {
        let r = attempt(&mut m, &sql);
        assert!(failed_with(&r, &["LF008"]), "{sql}: {r:?}");
    }
    let r = attempt(&mut m, &format!("SELECT create_reference_table('{t}')"));
    assert!(r.is_err(), "create_reference_table of a local owner table: accepted");
    let lowered = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 1 WHERE id = 7"));
    assert!(failed_with(&lowered, &["LF004"]), "{lowered:?}");
    still_fenced(&mut m, &poker, 7);
}

/// **Defence holds.** A role granted UPDATE and DELETE on owner rows,
/// connected straight to the worker holding owner 7, lowers, clears or
/// deletes owner 7's row or changes its key, in the shard and through the
/// worker's shell: LF004 each time (Citus itself refuses a key change
/// through the shell), the token stays 6; raising it above 2^62 - 1 is
/// 22003 there as on one node.
#[test]
fn citus_owner_row_updater_on_a_worker_cannot_lower_a_token() {
    let _state = shared();
    let (poker, mut m) = attacked("upd");
    let Poker { t, p } = &poker;
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let mut w = citus().node_as(port, UPDATER);
    for sql in [
        format!("UPDATE {t}_{ts} SET owner_fencing_token = 5 WHERE id = 7"),
        format!("UPDATE {t}_{ts} SET owner_fencing_token = NULL WHERE id = 7"),
        format!("DELETE FROM {t}_{ts} WHERE id = 7"),
        format!("UPDATE {t} SET owner_fencing_token = 5 WHERE id = 7"),
        format!("UPDATE {t}_{ts} SET id = 1000 WHERE id = 7"),
    ] {
        let r = attempt(&mut w, &sql);
        assert!(failed_with(&r, &["LF004"]), "{sql}: {r:?}");
    }
    // A token so high that lease.acquire could not go above it: 22003 for a
    // role other than a superuser, in the shard and through the shell.
    for rel in [format!("{t}_{ts}"), t.clone()] {
        let sql = format!("UPDATE {rel} SET owner_fencing_token = 4611686018427387904 WHERE id = 7");
        let r = attempt(&mut w, &sql);
        assert!(failed_with(&r, &["22003"]), "{sql}: {r:?}");
    }
    // Through the shell, Citus refuses a new distribution value by itself.
    let r = attempt(&mut w, &format!("UPDATE {t} SET id = 1000 WHERE id = 7"));
    assert!(failed_with(&r, &["LF004", "0A000"]), "{r:?}");
    still_fenced(&mut m, &poker, 7);
}

/// **Defence holds.** `lease.acquire` called on a worker for an owner row
/// whose lease is held on the coordinator: lease state lives per node, so a
/// second live holder would be possible; it is refused (the worker's
/// `lease.protected` is empty: "is not the owner table of any table
/// protected", a misleading reason, but no second holder and no token).
#[test]
fn citus_lease_acquire_on_a_worker_gives_no_second_holder() {
    let _state = shared();
    let (poker, mut m) = attacked("lw");
    let Poker { t, p } = &poker;
    let mut su = citus().coordinator.connect();
    let held: i64 = su
        .query_one(&format!("SELECT token FROM lease.acquire('{t}:7', 'host-a', 60000, '{t}', '{{7}}')"), &[])
        .unwrap()
        .get(0);
    let (port, _, _) = placement(&mut m, t, p, 7);
    let mut w = citus().node_as(port, "postgres");
    let r = attempt(&mut w, &format!("SELECT lease.acquire('{t}:7', 'host-b', 60000, '{t}', '{{7}}')"));
    assert!(r.is_err(), "a second holder of {t}:7 on worker {port}");
    assert_eq!(token_of(&mut m, t, 7), held);
}

/// **Defence holds.** Equal keys written differently: owner and fenced key
/// columns `numeric` (Citus hashes 7, 7.0 and 7.00 alike), the lease
/// acquired for `{7.000}` and the payout written for `7.00`: the current
/// token is accepted, the one before it refused (LF001).
#[test]
fn citus_numeric_keys_of_another_scale_are_one_resource() {
    let _state = shared();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("num{n}_tables"), format!("num{n}_payouts"));
    let mut su = citus().coordinator.connect();
    ok(
        &mut su,
        &format!(
            "CREATE TABLE {t} (id numeric PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id numeric NOT NULL, amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
             SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none');
             SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}');
             INSERT INTO {t} SELECT g, NULL FROM generate_series(1, {OWNERS}) g;
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');"
        ),
    );
    let acquire = |su: &mut Client, key: &str| -> i64 {
        su.query_one(&format!("SELECT token FROM lease.acquire('{t}:{key}', 'h', 60000, '{t}', '{{{key}}}')"), &[])
            .unwrap()
            .get(0)
    };
    let (old, new) = (acquire(&mut su, "7.000"), acquire(&mut su, "7.0"));
    let stale = attempt(&mut su, &format!("INSERT INTO {p} VALUES (7.00, 1, {old})"));
    assert!(failed_with(&stale, &["LF001"]), "{stale:?}");
    ok(&mut su, &format!("INSERT INTO {p} VALUES (7.00, 1, {new})"));
}

/// **Defence holds (a legitimate operation).** `ALTER EXTENSION pg_lease
/// UPDATE` from 0.7.0 on a Citus coordinator (in a database of its own on
/// every node) updates every node, and distributed tables can then be
/// protected and are fenced on the workers.
#[test]
fn citus_alter_extension_update_from_0_7_0_reaches_every_node() {
    let _state = shared();
    let c = citus();
    let db = "a11_upgrade";
    let nodes: Vec<&Cluster> = c.workers.iter().chain([&c.coordinator]).collect();
    for node in &nodes {
        let mut admin = node.connect();
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
        ok(&mut admin, &format!("CREATE DATABASE {db}"));
        ok(&mut node.connect_db(db), "CREATE EXTENSION citus");
    }
    let mut u = c.coordinator.connect_db(db);
    u.execute("SELECT citus_set_coordinator_host('127.0.0.1', $1)", &[&i32::from(c.coordinator.port)]).unwrap();
    for node in &c.workers {
        u.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&i32::from(node.port)]).unwrap();
    }
    ok(&mut u, "CREATE EXTENSION pg_lease VERSION '0.7.0'; ALTER EXTENSION pg_lease UPDATE");
    let versions: Vec<String> = u
        .query(
            "SELECT result FROM run_command_on_all_nodes($$SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'$$)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The default version: the one this build installs.
    let current: String =
        u.query_one("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_lease'", &[]).unwrap().get(0);
    assert_eq!(versions, [current.as_str(); 3]);
    ok(
        &mut u,
        &format!(
            "CREATE TABLE tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id bigint NOT NULL, amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
             SELECT create_distributed_table('tables', 'id', shard_count => 4);
             SELECT create_distributed_table('payouts', 'table_id', colocate_with => 'tables');
             INSERT INTO tables SELECT g, 6 FROM generate_series(1, {OWNERS}) g;
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token', 'tables', '{{id}}', 'owner_fencing_token');"
        ),
    );
    for id in 1..=OWNERS {
        let r = attempt(&mut u, &format!("INSERT INTO payouts VALUES ({id}, 1, 5)"));
        assert!(failed_with(&r, &["LF001"]), "owner {id}: {r:?}");
    }
    drop(u);
    for node in &nodes {
        let _ = node.connect().batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
    }
}

/// **Hole (high: a token capability leaked, forged audit, lock on another's
/// owner rows).** Attack: a role with CREATE on a schema (here the
/// migrator) but no right at all on someone else's owner table `v` (token
/// 4242, owned by postgres) distributes a table of its own co-located with
/// `v`, and gives it pg_lease's fence trigger with a hand-written config
/// argument naming `v` as owner table (`CREATE TRIGGER pg_lease_fence ...
/// lease.fence_trigger('{"mode": "owner", ..., "owner_table":
/// "public.v", ...}')` plus `ENABLE ALWAYS` in the same transaction, with
/// `citus.enable_unsafe_triggers` on). On one node pg_lease's trigger
/// functions refuse to run on a table `lease.protect` did not set up ("no
/// forged audit records"). On a shard the config comes from the trigger's
/// argument and nothing checks that `lease.protect` wrote it. Observed: an
/// INSERT into the attacker's table runs the fence as `v`'s owner and the
/// LF001 DETAIL reveals `v`'s current token 4242 (a capability) to a role
/// that cannot SELECT it; `lease.stats`/`lease.rejected_writes` on the
/// worker record refusals for a table nobody protected; an accepted row
/// holds a FOR SHARE lock on `v`'s owner row (blocking its token bumps) as
/// long as the attacker's transaction stays open. Expected: the trigger is
/// refused when created (LF008) or refuses to run on a table `lease.protect`
/// did not set up (as on one node); `v`'s token appears nowhere.
#[test]
fn citus_fence_trigger_with_a_forged_config_reads_no_one_elses_owner_rows() {
    let _state = shared();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (v, fake) = (format!("victim{n}_tables"), format!("victim{n}_fake"));
    let mut su = citus().coordinator.connect();
    ok(
        &mut su,
        &format!(
            "CREATE TABLE {v} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             SELECT create_distributed_table('{v}', 'id', shard_count => 4, colocate_with => 'none');
             INSERT INTO {v} SELECT g, 4242 FROM generate_series(1, {OWNERS}) g;"
        ),
    );
    let mut m = citus().coordinator_as(MIGRATOR);
    let r = attempt(&mut m, &format!("SELECT * FROM {v}"));
    assert!(failed_with(&r, &["42501"]), "the attacker cannot read {v}: {r:?}");
    let config = config_naming(&v);
    ok(
        &mut m,
        &format!(
            "CREATE TABLE {fake} (table_id bigint, fencing_token bigint);
             SELECT create_distributed_table('{fake}', 'table_id', colocate_with => '{v}');
             SET citus.enable_unsafe_triggers = on;"
        ),
    );
    // One statement per query: Citus sends a DDL command's whole query
    // string to the workers.
    let installed = (|| {
        let mut tx = m.transaction()?;
        tx.batch_execute(&format!(
            "CREATE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON {fake}
                 FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger('{config}')"
        ))?;
        tx.batch_execute(&format!("ALTER TABLE {fake} ENABLE ALWAYS TRIGGER pg_lease_fence"))?;
        tx.commit()
    })()
    .map_err(|e| describe(&e));
    let probe = attempt(&mut m, &format!("INSERT INTO {fake} VALUES (7, 1)"));
    let stats = one_i64(
        &mut su,
        &format!("SELECT coalesce(sum(accepted + refused), 0)::bigint FROM lease.cluster_stats() WHERE table_name LIKE '%{fake}'"),
    );
    assert!(
        !probe.as_ref().is_err_and(|e| e.contains("4242")) && stats == 0,
        "forged fence trigger on {fake}: installing it gave {installed:?}; an INSERT then gave {probe:?}; \
         lease.cluster_stats() counts {stats} verdicts for {fake}"
    );
}

/// **Hole (high: a fence silently not installed).** Attack (or an honest
/// mistake: migration tools turn it off, and `ALTER ROLE ... SET` makes it
/// stick): the migrator calls `lease.protect` in a session with
/// `citus.enable_ddl_propagation = off`. Observed: protect succeeds and
/// `lease.protected` lists the table, but pg_lease's triggers exist only on
/// the coordinator's shells; no shard on any worker is fenced: a write with
/// the stale token 5 commits, and owner 7's token can be lowered from 6 to 1
/// (only `lease.cluster_fence_problems()` notices). Expected: protect
/// installs the fence on every node whatever the session's propagation
/// setting (as it does for `citus.enable_unsafe_triggers`), or refuses with
/// a clear error.
#[test]
fn citus_protect_with_ddl_propagation_off_still_fences_the_shards() {
    let _state = shared();
    let poker = unprotected("dp", 6);
    let Poker { t, p } = &poker;
    let mut m = citus().coordinator_as(MIGRATOR);
    let r = attempt(
        &mut m,
        &format!(
            "SET citus.enable_ddl_propagation = off;
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');"
        ),
    );
    ok(&mut m, "RESET citus.enable_ddl_propagation");
    let lowered = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 1 WHERE id = 7"));
    let stale = attempt(&mut m, &pay(p, 7, 5));
    assert!(
        clear_refusal(&r) || (r.is_ok() && failed_with(&lowered, &["LF004"]) && failed_with(&stale, &["LF001"])),
        "protect with DDL propagation off gave {r:?}; then lowering owner 7's token gave {lowered:?}, \
         a write with the stale token 5 gave {stale:?}"
    );
}

/// **Limit, detected.** Attack: the migrator on a
/// worker, with `citus.enable_ddl_propagation = off`, replaces the fence
/// trigger of its *shell* of the fenced table by one whose config argument
/// names a look-alike owner table (co-located, owner 7 at the stale token
/// 5), enabled ALWAYS. The shards on that worker read their config from that
/// argument. Observed: accepted, and the application's stale write (token 5,
/// current 6) through the coordinator commits; only
/// `lease.cluster_fence_problems()` notices afterwards. The same through the
/// coordinator is refused (LF008). Kept as a documented limit: the
/// coordinator's `lease.cluster_fence_problems()` must name the worker.
#[test]
fn citus_worker_shell_fence_config_replaced_is_refused() {
    let _state = shared();
    let (poker, mut m) = attacked("cfg");
    let Poker { t, p } = &poker;
    let d = decoy(&mut m, &poker);
    let config = config_naming(&d);
    let replace = format!(
        "CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON {p}
             FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger('{config}')"
    );
    // Through the coordinator: refused.
    let through_coordinator = (|| {
        let mut tx = m.transaction()?;
        tx.batch_execute("SET LOCAL citus.enable_unsafe_triggers = on")?;
        tx.batch_execute(&replace)?;
        tx.batch_execute(&format!("ALTER TABLE {p} ENABLE ALWAYS TRIGGER pg_lease_fence"))?;
        tx.commit()
    })()
    .map_err(|e| describe(&e));
    assert!(failed_with(&through_coordinator, &["LF008"]), "{through_coordinator:?}");
    let (port, _, _) = placement(&mut m, t, p, 7);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "SET LOCAL citus.enable_ddl_propagation = off;
             {replace};
             ALTER TABLE {p} ENABLE ALWAYS TRIGGER pg_lease_fence"
        ),
    );
    // Refused on the worker since review 12 (only Citus's own connections
    // change a fenced table's shell there).
    assert!(failed_with(&r, &["LF008"]), "{r:?}");
    let mut app = citus().coordinator_as(APP);
    let stale = attempt(&mut app, &pay(p, 7, 5));
    assert!(failed_with(&stale, &["LF001"]), "{stale:?}");
}

/// **Defence check (legitimate operations).** A DBA isolates owner 7's
/// tenant into shards of its own (`isolate_tenant_to_new_shard(...,
/// 'CASCADE')`, the fenced table's shard with it) and moves them to the
/// other worker (`block_writes`: a logical transfer failed here with
/// "library citus may not be used as an output plugin", not looked into).
/// Expected: owner 7
/// still fenced on its new shard (stale refused, current accepted), the
/// owner guard still refuses lowering, no fence problem reported.
#[test]
fn citus_isolated_tenant_moved_to_another_worker_stays_fenced() {
    let _state = shared();
    let (poker, mut m) = attacked("iso");
    let Poker { t, p } = &poker;
    let mut su = citus().coordinator.connect();
    ok(
        &mut su,
        &format!("SELECT isolate_tenant_to_new_shard('{t}', 7, 'CASCADE', shard_transfer_mode => 'block_writes')"),
    );
    let (port, ts, _) = placement(&mut m, t, p, 7);
    let to = WORKER_PORTS.iter().map(|w| w + port_offset()).find(|&w| w != port).unwrap();
    ok(
        &mut su,
        &format!("SELECT citus_move_shard_placement({ts}, '127.0.0.1', {port}, '127.0.0.1', {to}, 'block_writes')"),
    );
    assert_eq!(placement(&mut m, t, p, 7).0, to);
    let current = attempt(&mut m, &pay(p, 7, 6));
    assert!(current.is_ok(), "{current:?}");
    let lowered = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 5 WHERE id = 7"));
    assert!(failed_with(&lowered, &["LF004"]), "{lowered:?}");
    still_fenced(&mut m, &poker, 7);
    let problems =
        one_i64(&mut su, &format!("SELECT count(*) FROM lease.cluster_fence_problems() WHERE target LIKE '%{p}'"));
    assert_eq!(problems, 0);
}

/// **Defence check.** Other doors through the coordinator, as the
/// application with a stale token: `MERGE` (insert and update arms),
/// `lease.fenced_boundary_write`, a multi-row INSERT spanning both workers,
/// `INSERT ... SELECT` evaluated on the coordinator, and `COPY`. Expected:
/// each refused (LF001, or XX000 with pg_lease's message where README says
/// Citus drops the code), no stale row committed; the current token passes
/// through `fenced_boundary_write`.
#[test]
fn citus_other_write_doors_through_the_coordinator_are_fenced() {
    let _state = shared();
    let (poker, mut m) = attacked("door");
    let Poker { t, p } = &poker;
    let other = (1..=OWNERS)
        .find(|&id| placement(&mut m, t, p, id).0 != placement(&mut m, t, p, 7).0)
        .expect("an owner on the other worker");
    ok(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 6 WHERE id = {other}"));
    ok(&mut m, &format!("GRANT UPDATE ON {p} TO {APP}"));
    let mut app = citus().coordinator_as(APP);
    ok(&mut app, &pay(p, 7, 6));
    let stale_msg = |r: &Result<(), String>| r.as_ref().is_err_and(|e| e.contains("StaleOwnerBoundaryWrite"));
    for sql in [
        format!(
            "MERGE INTO {p} d USING (SELECT id FROM {t} WHERE id = 7) s ON d.table_id = s.id AND d.fencing_token < 0
             WHEN NOT MATCHED THEN INSERT (table_id, amount, fencing_token) VALUES (s.id, 1, 5)"
        ),
        format!(
            "MERGE INTO {p} d USING (SELECT id FROM {t} WHERE id = 7) s ON d.table_id = s.id
             WHEN MATCHED THEN UPDATE SET fencing_token = 5, amount = 99"
        ),
        format!(r#"SELECT lease.fenced_boundary_write('{p}', 5, '[{{"table_id": 7, "amount": 1}}]')"#),
        format!("INSERT INTO {p} (table_id, amount, fencing_token) VALUES ({other}, 1, 6), (7, 1, 5)"),
        format!("INSERT INTO {p} (table_id, amount, fencing_token) SELECT 7, g, 5 FROM generate_series(1, 3) g"),
    ] {
        let r = attempt(&mut app, &sql);
        assert!(stale_msg(&r), "{sql}: {r:?}");
    }
    let copied = app
        .copy_in(&format!("COPY {p} (table_id, amount, fencing_token) FROM STDIN"))
        .and_then(|mut w| {
            use std::io::Write;
            w.write_all(b"7\t1\t5\n").map_err(|e| panic!("{e}")).unwrap();
            w.finish()
        })
        .map(|_| ())
        .map_err(|e| describe(&e));
    assert!(stale_msg(&copied), "COPY: {copied:?}");
    let r = attempt(
        &mut app,
        &format!(r#"SELECT lease.fenced_boundary_write('{p}', 6, '[{{"table_id": 7, "amount": 2}}]')"#),
    );
    assert!(r.is_ok(), "{r:?}");
    still_fenced(&mut m, &poker, 7);
    assert_eq!(one_i64(&mut m, &format!("SELECT count(*) FROM {p} WHERE amount = 99")), 0);
}

/// **Defence check (time).** A long-lived application session straight on
/// the worker holding owner 7 writes into the payouts shard (its caches
/// warm: the shard's config, the owner shard); then the migrator, through
/// the coordinator, unprotects the table and protects it again against a
/// co-located second owner table where owner 7 is at token 9. Expected: the
/// warm session's next write with token 6 is refused (LF001: judged against
/// the new owner table), token 9 accepted.
#[test]
fn citus_warm_worker_session_follows_a_reprotect_against_another_owner_table() {
    let _state = shared();
    let (poker, mut m) = attacked("warm");
    let Poker { t, p } = &poker;
    let d = decoy(&mut m, &poker);
    ok(&mut m, &format!("UPDATE {d} SET owner_fencing_token = 9 WHERE id = 7"));
    let (port, _, ps) = placement(&mut m, t, p, 7);
    let mut w = citus().node_as(port, APP);
    let shard_write = |w: &mut Client, token: i64| {
        attempt(w, &format!("INSERT INTO {p}_{ps} (table_id, amount, fencing_token) VALUES (7, 1, {token})"))
    };
    assert!(shard_write(&mut w, 6).is_ok());
    ok(
        &mut m,
        &format!(
            "SELECT lease.unprotect('{p}');
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{d}', '{{id}}', 'owner_fencing_token');"
        ),
    );
    let old = shard_write(&mut w, 6);
    assert!(failed_with(&old, &["LF001"]), "warm session, token 6 after the re-protect: {old:?}");
    let new = shard_write(&mut w, 9);
    assert!(new.is_ok(), "warm session, token 9 after the re-protect: {new:?}");
}

/// **Hole (low: legitimate DDL refused with a wrong reason).** As
/// `citus_owner_table_rename_through_the_coordinator_works_as_on_one_node`,
/// for `ALTER TABLE <owner> SET SCHEMA` (moving the fenced table works).
/// Observed: the same LF008 "pg_lease_fence ... no longer fires on every
/// INSERT, UPDATE and DELETE of every row". Expected: the move works and the
/// fence follows the owner table, or a refusal that names the real reason.
#[test]
fn citus_owner_table_set_schema_through_the_coordinator_works_as_on_one_node() {
    let _state = shared();
    let (poker, mut m) = attacked("oss");
    let Poker { t, p } = &poker;
    let schema = format!("{t}_s");
    let mut su = citus().coordinator.connect();
    ok(&mut su, &format!("CREATE SCHEMA {schema}; GRANT CREATE, USAGE ON SCHEMA {schema} TO {MIGRATOR}"));
    let fenced = attempt(&mut m, &format!("ALTER TABLE {p} SET SCHEMA {schema}"));
    assert!(fenced.is_ok(), "moving the fenced table: {fenced:?}");
    let p = format!("{schema}.{p}");
    let r = attempt(&mut m, &format!("ALTER TABLE {t} SET SCHEMA {schema}"));
    let moved = Poker { t: if r.is_ok() { format!("{schema}.{t}") } else { t.clone() }, p: p.clone() };
    let current = attempt(&mut m, &pay(&p, 7, 6));
    let (held, state) = fence_state(&mut m, &moved, 7);
    assert!(
        (r.is_ok() || r.as_ref().is_err_and(|e| e.contains("schema"))) && held && current.is_ok(),
        "moving owner table {t} to schema {schema} gave {r:?}; current token 6: {current:?}; {state}"
    );
}

/// **Defence check: `lease.bind_token` after the transaction already has
/// connections to the workers.** A transaction reads the distributed table
/// (Citus opens its worker connections), then binds its token and writes:
/// the bound token must reach the shard (README: "binds on every node the
/// transaction writes through"). Expected: the current token is accepted,
/// the stale one refused (LF001), never LF003.
#[test]
fn citus_bind_token_after_worker_connections_are_open_reaches_the_shards() {
    let _state = shared();
    let c = citus();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("bt{n}_tables"), format!("bt{n}_payouts"));
    let mut su = c.coordinator.connect();
    ok(
        &mut su,
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id bigint NOT NULL, amount bigint NOT NULL DEFAULT 0);
             SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none');
             SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}');
             INSERT INTO {t} SELECT g, 6 FROM generate_series(1, {OWNERS}) g;
             SELECT lease.protect('{p}', '{{table_id}}', NULL, '{t}', '{{id}}', 'owner_fencing_token');"
        ),
    );
    for (token, expect) in [(6, None), (5, Some("LF001"))] {
        let mut tx = su.transaction().unwrap();
        tx.batch_execute(&format!("SELECT count(*) FROM {p}")).unwrap();
        tx.batch_execute(&format!("SELECT lease.bind_token({token})")).unwrap();
        let r =
            tx.batch_execute(&format!("INSERT INTO {p} (table_id, amount) VALUES (7, 1)")).map_err(|e| describe(&e));
        drop(tx);
        match expect {
            None => assert!(r.is_ok(), "current bound token after worker connections opened: {r:?}"),
            Some(code) => assert!(r.as_ref().is_err_and(|e| e.starts_with(code)), "stale bound token: {r:?}"),
        }
    }
}
