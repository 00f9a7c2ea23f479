//! Attack review 12 (0.8.0, Citus support, after review 11's fixes): pg_lease
//! on a real Citus cluster (a coordinator and two workers on loopback, ports
//! 54850-54852 plus `PG_LEASE_PORT_OFFSET`; Citus 13.2.2 built by
//! shared/vendor/citus/build.sh), attacked first where review 11's defences
//! were added: the worker-side DDL guard on shards (`lease._guard_shards`),
//! the TRUNCATE-of-a-shard refusal in the ProcessUtility hook, the
//! emit_log_hook that turns an `XX000` named like a pg_lease error into its
//! LF code, and the lease functions ported to Rust (single node: a LATIN1
//! database, look-alike triggers and rules on owner tables).
//!
//! Roles as README.md's "Roles and grants": a migrator that owns the fenced
//! and owner tables (no superuser), the application role, a role with UPDATE
//! on owner rows, connected to the coordinator or straight to a worker.
//! Tests marked **Hole** fail at the commit they were written against
//! (7ebd265); those marked **Defence holds** pass and document what was
//! tried. Review 11's findings (attack11.rs) are not repeated. In short,
//! most severe first:
//!
//! - critical: the worker-side guard (`lease._guard_shards`) judges trigger
//!   copies, `ALTER COLUMN ... TYPE` and late BEFORE triggers only. On a
//!   worker (or from the coordinator alone through
//!   `run_command_on_placements`), the table owner renames or drops an owner
//!   shard's token column and adds a new one at a stale value: tokens go
//!   back, stale writes commit, `cluster_fence_problems()` is silent;
//! - critical: the TRUNCATE refusal looks only at the relations a TRUNCATE
//!   names: an owner shard made a child of another table (`INHERIT`) or
//!   given a foreign key to one is emptied by `TRUNCATE parent` /
//!   `TRUNCATE other CASCADE`; its tokens are gone;
//! - critical: `DROP TABLE` of a shard on a worker is not refused: an owner
//!   shard re-created at stale tokens, or a fenced shard replaced by an
//!   unfenced copy, takes stale writes (`cluster_fence_problems()` names it
//!   after the fact);
//! - high: on a worker, an owner shard is made `UNLOGGED` (a crash empties
//!   it), or loses its unique key (a second owner row for one key);
//! - medium: in a LATIN1 database the fence's refusals and the audit's
//!   `resource_key` show a non-ASCII text key mangled (`clé` as `clï¿½`):
//!   distinct resources are audited under one wrong key;
//! - medium: any role with `EXECUTE` on `lease.acquire` bumps owner rows of
//!   tables it cannot even read; a second lease *name* bound to a held owner
//!   row takes it without `LF005` (the first holder's heartbeat reports
//!   nothing); `citus.shard_replication_factor = 2` is protected but
//!   `acquire` can never bump its owner rows; Citus's
//!   `alter_table_set_access_method` of a local fenced table strips its
//!   protection (writes then refused with a misleading HINT);
//! - low: the emit_log_hook turns any `XX000` whose message starts with a
//!   pg_lease error name (a user's `RAISE`) into that LF code; in a LATIN1
//!   database the lease functions' messages mangle non-ASCII names;
//!   unclear errors for a 2-D `owner_key`, for distributing a protected
//!   local owner table, and an OID in place of an owner table's name.

use pg_lease_sessions::postgres::{Client, NoTls};
use pg_lease_sessions::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread;

/// Ports of the coordinator and the two workers (plus `PG_LEASE_PORT_OFFSET`).
const COORDINATOR_PORT: u16 = 54850;
const WORKER_PORTS: [u16; 2] = [54851, 54852];
/// Owner rows each test creates (ids 1..=OWNERS, token 5).
const OWNERS: i64 = 40;
/// The table owner the attacks run as: no superuser, the grants README.md's
/// "Roles and grants" gives `migrator`.
const MIGRATOR: &str = "a12_migrator";
/// The application role: INSERT on payouts, no rights on owner rows.
const APP: &str = "a12_app";
/// A role granted UPDATE and DELETE on owner rows (README: "Even a role
/// allowed to UPDATE owner rows cannot lower or clear a token").
const UPDATER: &str = "a12_updater";

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
            let coordinator = s.spawn(|| Cluster::start_with("a12_coord", COORDINATOR_PORT, CONF));
            let workers: Vec<_> = WORKER_PORTS
                .iter()
                .enumerate()
                .map(|(i, &port)| s.spawn(move || Cluster::start_with(&format!("a12_w{}", i + 1), port, CONF)))
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
        let conn = format!("host=127.0.0.1 port={port} user={user} dbname=postgres application_name=attack12");
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

/// A connection as `user` to database `db` on the node listening on `port`.
fn db_as(port: u16, db: &str, user: &str) -> Client {
    let conn = format!("host=127.0.0.1 port={port} user={user} dbname={db} application_name=attack12");
    Client::connect(&conn, NoTls).unwrap_or_else(|e| panic!("connect to {db} on {port} as {user}: {e}"))
}

/// A database of its own on the coordinator's server without Citus (pg_lease
/// as on one node), created with `options`; the migrator may create tables
/// and protect them there. Returns its name.
fn single_node_db(name: &str, options: &str) -> String {
    let db = format!("{name}{}", SEQ.fetch_add(1, Ordering::SeqCst));
    let port = citus().coordinator.port;
    ok(&mut citus().coordinator.connect(), &format!("CREATE DATABASE {db} {options}"));
    ok(
        &mut db_as(port, &db, "postgres"),
        &format!(
            "CREATE EXTENSION pg_lease;
             GRANT CREATE ON SCHEMA public TO {MIGRATOR};
             GRANT EXECUTE ON FUNCTION lease.protect, lease.unprotect TO {MIGRATOR};"
        ),
    );
    db
}

/// Owner 7's token after `lease.acquire` for it as a superuser on the
/// coordinator: (token acquire returned, token the owner row carries), or
/// acquire's error.
fn acquire_7(t: &str) -> Result<(i64, i64), String> {
    let mut su = citus().coordinator.connect();
    let row = su
        .query_one(&format!("SELECT token FROM lease.acquire('{t}:7', 'a12-host', 15000, '{t}', '{{7}}')"), &[])
        .map_err(|e| describe(&e))?;
    Ok((row.get(0), token_of(&mut su, t, 7)))
}

/// How many rows `lease.cluster_fence_problems(&poker)` gives on the coordinator
/// about `poker`'s tables (what monitoring would see).
fn fence_problems(Poker { t, p }: &Poker) -> i64 {
    one_i64(
        &mut citus().coordinator.connect(),
        &format!("SELECT count(*) FROM lease.cluster_fence_problems() WHERE target ~ '({t}|{p})'"),
    )
}

/// **Hole (critical).** Attack: the migrator, on the worker that holds owner
/// row 7's shard, renames the shard's token column away and adds a new
/// `owner_fencing_token` column whose default is the stale token 5
/// (`citus.enable_manual_changes_to_shards` on, as review 11 did). On one
/// node renaming a fenced column is refused (`LF008`); `lease._guard_shards`
/// only checks trigger copies, retyped columns and late BEFORE triggers.
/// Observed: both commands commit; the shard's fence reads the new column
/// (5), so the holder of stale token 5 writes again and the coordinator
/// reads token 5 for owner 7; `lease.cluster_fence_problems()` has no row
/// for these tables (monitoring silent). Expected: `LF008` for the rename
/// (and the drop of a fenced column) on a shard, as on one node; token
/// stays 6.
#[test]
fn citus_worker_owner_shard_token_column_renamed_and_replaced_accepts_stale_writes() {
    let (poker, mut m) = attacked("ren");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "ALTER TABLE {shard} RENAME COLUMN owner_fencing_token TO was_token;
             ALTER TABLE {shard} ADD COLUMN owner_fencing_token bigint DEFAULT 5"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && failed_with(&r, &["LF008"]),
        "rename on the worker gave {r:?}; {state}; cluster_fence_problems rows: {}",
        fence_problems(&poker)
    );
}

/// **Hole (critical).** Attack: on the worker, the migrator drops the token
/// column of owner 7's shard of the owner table and adds it back, all rows
/// at NULL, then sets them to 5 with the owner guard's copy still on. On one
/// node dropping a fenced column is refused (`LF008`). Observed: the drop
/// commits (tokens lost), the guard's copy then takes NULL -> 5 as a first
/// token, stale writes commit, and `cluster_fence_problems()` is silent.
/// Expected: `LF008` at the DROP COLUMN; token stays 6.
#[test]
fn citus_worker_owner_shard_token_column_dropped_loses_tokens() {
    let (poker, mut m) = attacked("dropcol");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "ALTER TABLE {shard} DROP COLUMN owner_fencing_token;
             ALTER TABLE {shard} ADD COLUMN owner_fencing_token bigint"
        ),
    );
    let _ = as_migrator_on_worker(port, &format!("UPDATE {shard} SET owner_fencing_token = 5"));
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && failed_with(&r, &["LF008", "LF004"]),
        "drop column on the worker gave {r:?}; {state}; cluster_fence_problems rows: {}",
        fence_problems(&poker)
    );
}

/// **Hole (critical).** Attack: on the worker, the migrator makes owner 7's
/// owner shard a child of a table of its own (`ALTER TABLE shard INHERIT
/// parent`) and truncates the parent. The ProcessUtility hook only looks at
/// the relations the TRUNCATE names, and shards carry no copy of the
/// TRUNCATE guard, so the shard's rows (its tokens) go with the parent's.
/// Then the owner row is inserted again at the stale token through the
/// coordinator (the migrator owns the table). Expected: the INHERIT or the
/// TRUNCATE refused (`LF004`/`LF008`, as TRUNCATE of the shard itself is);
/// owner 7 keeps token 6.
#[test]
fn citus_worker_owner_shard_truncated_through_an_inheritance_parent_loses_tokens() {
    let (poker, mut m) = attacked("inh");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let parent = format!("{}_parent", poker.t);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "CREATE TABLE {parent} (id bigint, owner_fencing_token bigint);
             ALTER TABLE {shard} INHERIT {parent};
             TRUNCATE {parent}"
        ),
    );
    let rows = one_i64(&mut m, &format!("SELECT count(*) FROM {} WHERE id = 7", poker.t));
    if rows == 0 {
        ok(&mut m, &format!("INSERT INTO {} VALUES (7, 5)", poker.t));
    }
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && rows == 1,
        "INHERIT + TRUNCATE of the parent on the worker gave {r:?}; owner rows for 7 after it: {rows}; {state}"
    );
}

/// **Hole (critical).** Attack: as above through a foreign key: on the
/// worker the migrator adds to owner 7's owner shard a foreign key to a
/// table of its own and runs `TRUNCATE that_table CASCADE`, which truncates
/// the shard too without naming it. Expected: refused (`LF004`); observed:
/// the owner shard is emptied (owner row 7 and its token 6 are gone; the
/// foreign key left behind then happens to refuse a re-insert, but any
/// holder of the same table could drop it).
#[test]
fn citus_worker_owner_shard_truncated_by_a_foreign_key_cascade_loses_tokens() {
    let (poker, mut m) = attacked("fkc");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let keys = format!("{}_keys", poker.t);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "CREATE TABLE {keys} (id bigint PRIMARY KEY);
             INSERT INTO {keys} SELECT id FROM {shard};
             ALTER TABLE {shard} ADD FOREIGN KEY (id) REFERENCES {keys};
             TRUNCATE {keys} CASCADE"
        ),
    );
    let rows = one_i64(&mut m, &format!("SELECT count(*) FROM {} WHERE id = 7", poker.t));
    assert!(
        rows == 1,
        "FK + TRUNCATE ... CASCADE on the worker gave {r:?}; owner rows for 7 after it: {rows} (its token is gone)"
    );
    still_fenced(&mut m, &poker, 7);
}

/// **Hole (high).** Attack: on the worker, the migrator makes owner 7's
/// owner shard `UNLOGGED` (refused on one node: a crash or a failover empties
/// an unlogged table and its tokens with it). Expected: `LF008`; observed:
/// the shard is unlogged, so the next crash of that worker loses every token
/// it holds.
#[test]
fn citus_worker_owner_shard_set_unlogged_is_refused() {
    let (poker, mut m) = attacked("unl");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(port, &format!("ALTER TABLE {shard} SET UNLOGGED"));
    let mut w = citus().node_as(port, "postgres");
    ok(&mut w, "SET citus.override_table_visibility = off");
    let persistence: String = w
        .query_one(&format!("SELECT relpersistence::text FROM pg_class WHERE oid = '{shard}'::regclass"), &[])
        .unwrap()
        .get(0);
    still_fenced(&mut m, &poker, 7);
    assert!(
        failed_with(&r, &["LF008"]) && persistence == "p",
        "SET UNLOGGED on the worker gave {r:?}; relpersistence {persistence}"
    );
}

/// **Hole (high).** Attack: on the worker, the migrator drops the primary
/// key of owner 7's owner shard (the owner key's last unique constraint,
/// refused on one node with `LF008`) and inserts a second owner row 7 at the
/// stale token 5. Observed: both commit; the coordinator sees two owner rows
/// for 7 (tokens 6 and 5); which one the fence's lookup finds is now up to
/// the heap order (this run it found 6). Expected: `LF008` at the DROP
/// CONSTRAINT; one owner row; the stale token stays refused.
#[test]
fn citus_worker_owner_shard_unique_key_dropped_admits_a_second_owner_row() {
    let (poker, mut m) = attacked("pk");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(port, &format!("ALTER TABLE {shard} DROP CONSTRAINT {}_pkey_{ts}", poker.t));
    let second = as_migrator_on_worker(port, &format!("INSERT INTO {shard} VALUES (7, 5)"));
    let rows = one_i64(&mut m, &format!("SELECT count(*) FROM {} WHERE id = 7", poker.t));
    let stale = attempt(&mut m, &pay(&poker.p, 7, 5));
    assert!(
        failed_with(&r, &["LF008"]) && rows == 1 && failed_with(&stale, &["LF001"]),
        "DROP CONSTRAINT of the owner shard's key on the worker gave {r:?}, a second owner row {second:?}; \
         owner rows for 7: {rows}; a write with stale token 5 gave {stale:?}"
    );
}

/// **Defence holds** (fails closed). Attack: on the worker, the migrator
/// adds a rule to owner 7's owner shard: `ON UPDATE DO INSTEAD NOTHING`, so
/// `lease.acquire`'s owner-row bump through the coordinator would do nothing
/// and the token it returns would be lost. Observed: the rule is accepted,
/// but `acquire` fails with `LF008` ("the token bump ... did not reach owner
/// row"), so no token is issued that the owner row lacks. (The resource can
/// then not be re-acquired until the rule is dropped: the old holder, whose
/// token is still current, keeps writing; a denial of service by the table
/// owner, no stale write.) Expected: as observed, or the rule refused.
#[test]
fn citus_worker_rule_on_owner_shard_swallows_acquire_bumps() {
    let (poker, mut m) = attacked("rule");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(port, &format!("CREATE RULE swallow AS ON UPDATE TO {shard} DO INSTEAD NOTHING"));
    let acquired = acquire_7(&poker.t);
    let stale = attempt(&mut m, &pay(&poker.p, 7, 6));
    let held = match &acquired {
        Ok((token, now)) => token == now && failed_with(&stale, &["LF001"]),
        Err(_) => true,
    };
    assert!(held, "rule on the worker gave {r:?}; acquire gave (returned, owner row) {acquired:?}; a write with the old token 6 gave {stale:?}");
}

/// One node: the migrator's tables (owner 7 at token 6), then `ddl` run as
/// the migrator, then `lease.acquire` for owner 7 as a superuser. Whether no
/// token was lost: acquire failed, or the owner row carries the token it
/// returned and the previous token 6 is refused; and what happened.
fn single_node_bump_after(name: &str, ddl: &str) -> (bool, String) {
    let db = single_node_db(name, "");
    let port = citus().coordinator.port;
    let mut mig = db_as(port, &db, MIGRATOR);
    ok(
        &mut mig,
        "CREATE TABLE tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables', '{id}', 'owner_fencing_token');
         INSERT INTO tables VALUES (7, 6);",
    );
    let r = attempt(&mut mig, ddl);
    let mut su = db_as(port, &db, "postgres");
    let acquired = su
        .query_one("SELECT token FROM lease.acquire('table:7', 'a12-host', 15000, 'tables', '{7}')", &[])
        .map(|row| row.get::<_, i64>(0))
        .map_err(|e| describe(&e));
    let now = one_i64(&mut su, "SELECT owner_fencing_token FROM tables WHERE id = 7");
    let stale = attempt(&mut mig, "INSERT INTO payouts VALUES (7, 10, 6)");
    let held = match &acquired {
        Ok(token) => *token == now && failed_with(&stale, &["LF001"]),
        Err(_) => true,
    };
    (held, format!("the DDL gave {r:?}; acquire returned {acquired:?}, owner row carries {now}; a write with the old token 6 gave {stale:?}"))
}

/// **Defence holds** (fails closed), one node. Attack: the migrator (owner
/// of the owner table, no superuser) adds a rule `ON UPDATE TO tables DO
/// INSTEAD NOTHING`; no DDL guard refuses rules. Observed: `lease.acquire`
/// then fails with `LF008` (its bump did not reach the owner row), so no
/// token is lost. Expected: that, or the rule refused.
#[test]
fn citus_rule_on_owner_table_swallows_acquire_bumps() {
    let (held, state) =
        single_node_bump_after("a12rule", "CREATE RULE swallow AS ON UPDATE TO tables DO INSTEAD NOTHING");
    assert!(held, "{state}");
}

/// **Defence holds** (fails closed), one node. Attack: the migrator adds a
/// BEFORE UPDATE row trigger named to sort *before* `pg_lease_owner_guard`
/// (allowed: only later ones are refused) that returns NULL, skipping every
/// update of an owner row, `lease.acquire`'s token bump included. Observed:
/// acquire fails with `LF008` (its bump did not reach the owner row).
/// Expected: that (or such a trigger refused).
#[test]
fn citus_before_trigger_skipping_owner_updates_swallows_acquire_bumps() {
    let (held, state) = single_node_bump_after(
        "a12skip",
        "CREATE FUNCTION skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER a_skip BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION skip();",
    );
    assert!(held, "{state}");
}

/// **Documented, not a hole.** Attack: any role raises its own error with
/// SQLSTATE `XX000` and a message starting `StaleOwnerBoundaryWrite: `
/// (PL/pgSQL `RAISE ... USING ERRCODE = 'internal_error'`). On a Citus
/// coordinator pg_lease's emit_log_hook takes it for a refusal Citus relayed
/// without its code and the client sees `LF001`. Any role can raise
/// `SQLSTATE 'LF001'` itself just as well, so this gives no one anything new;
/// the test pins both (README "SQLSTATEs through COPY": the rewrite happens
/// only where Citus is loaded).
#[test]
fn citus_user_raised_internal_error_named_like_a_refusal_is_no_more_than_raising_lf001() {
    let mut app = citus().coordinator_as(APP);
    let rewritten = attempt(
        &mut app,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'internal_error',
                 MESSAGE = 'StaleOwnerBoundaryWrite: not from pg_lease'; END $$",
    );
    let raised = attempt(
        &mut app,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'LF001', MESSAGE = 'StaleOwnerBoundaryWrite: not from pg_lease'; END $$",
    );
    assert!(failed_with(&rewritten, &["LF001"]) && failed_with(&raised, &["LF001"]), "{rewritten:?} / {raised:?}");
}

/// **Defence holds.** A refusal relayed by Citus's COPY path comes back with
/// its LF code and HINT on the coordinator (README "SQLSTATEs through COPY").
#[test]
fn citus_copy_through_the_coordinator_relays_lf001() {
    let (poker, mut m) = attacked("copy");
    let mut app = citus().coordinator_as(APP);
    let r = attempt(
        &mut app,
        &format!(
            "INSERT INTO {} (table_id, amount, fencing_token) SELECT 7, g, 5 FROM generate_series(1, 3) g",
            poker.p
        ),
    );
    assert!(failed_with(&r, &["LF001"]), "{r:?}");
    still_fenced(&mut m, &poker, 7);
}

/// **Hole (low), fixed in 0.9.2.** The lease functions (ported to Rust) in a LATIN1
/// database, with lease names and owner ids holding non-ASCII characters.
/// Observed: acquire, heartbeat and renew_all work and `lease.leases` shows
/// the names as given, but `LF005`'s message and DETAIL show `tablï¿½:7`
/// held by `hï¿½te-1`: the name is read as UTF-8 (lossily, U+FFFD) and the
/// result, UTF-8 bytes, is then taken as LATIN1 by the server (`LF006`'s and
/// `LF007`'s messages and DETAILs too, and `LF007` shows an owner key
/// `{zé}` as `{zï¿½}`). Expected: the names as stored, `tablé:7` and
/// `hôte-1`.
#[test]
fn citus_lease_functions_in_a_latin1_database_keep_non_ascii_names() {
    let db = single_node_db("a12latin", "ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'");
    let mut su = db_as(citus().coordinator.port, &db, "postgres");
    ok(&mut su, "SET client_encoding = 'UTF8'");
    let token = su
        .query_one("SELECT token FROM lease.acquire('tablé:7', 'hôte-1', 15000)", &[])
        .map(|row| row.get::<_, i64>(0))
        .map_err(|e| describe(&e));
    assert!(token.is_ok(), "acquire with a non-ASCII name: {token:?}");
    let name: String = su.query_one("SELECT name || '|' || owner FROM lease.leases", &[]).unwrap().get(0);
    assert_eq!(name, "tablé:7|hôte-1");
    let beat = attempt(
        &mut su,
        "SELECT * FROM lease.heartbeat('hôte-1', 15000); SELECT * FROM lease.renew_all('hôte-1', 15000)",
    );
    assert!(beat.is_ok(), "{beat:?}");
    let other = attempt(&mut su, "SELECT * FROM lease.acquire('tablé:7', 'hôte-2', 15000)");
    assert!(other.as_ref().is_err_and(|e| e.starts_with("LF005") && e.contains("hôte-1")), "{other:?}");
}

/// **Hole (critical).** Attack: on the worker, the migrator drops owner 7's
/// owner shard and creates it again under the same name with every owner row at the
/// stale token 5 (`DROP TABLE` of an owner table in use is refused on one
/// node, `LF008`). Observed: all of it commits, the shard's fence finds the
/// new table by name, the coordinator reads token 5 for owner 7 and the
/// stale token 5 writes again (`cluster_fence_problems()` names the shard,
/// which lacks its owner guard copy, after the fact). Expected: the DROP
/// refused; owner 7 keeps token 6.
#[test]
fn citus_worker_owner_shard_dropped_and_recreated_restarts_tokens() {
    let (poker, mut m) = attacked("drop");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "CREATE TABLE {shard}_copy AS SELECT id, 5::bigint AS owner_fencing_token FROM {shard};
             DROP TABLE {shard};
             ALTER TABLE {shard}_copy RENAME TO {shard};
             ALTER TABLE {shard} ADD PRIMARY KEY (id)"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && failed_with(&r, &["LF008", "LF004"]),
        "DROP + re-CREATE of the owner shard on the worker gave {r:?}; {state}; cluster_fence_problems rows: {}",
        fence_problems(&poker)
    );
}

/// **Defence holds** (fails closed, as on one node). Attack: on the
/// worker, the migrator adds to owner 7's owner shard a BEFORE UPDATE row
/// trigger that sorts before the owner guard's copy (allowed: only later
/// ones are refused) and returns NULL, so every update of an owner row on
/// that shard is skipped, the bump of `lease.acquire` through the
/// coordinator included. Observed: `acquire` fails with `LF008` (its bump
/// did not reach the owner row). Expected: that, or `acquire` returning the
/// token the owner row then carries, the previous token 6 refused after it.
#[test]
fn citus_worker_before_trigger_skipping_owner_updates_swallows_acquire_bumps() {
    let (poker, mut m) = attacked("skip");
    let (port, ts, _) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ts}", poker.t);
    // Citus refuses CREATE FUNCTION on a worker: made through the coordinator.
    ok(
        &mut m,
        &format!("CREATE FUNCTION {shard}_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"),
    );
    let r = as_migrator_on_worker(
        port,
        &format!("CREATE TRIGGER a_skip BEFORE UPDATE ON {shard} FOR EACH ROW EXECUTE FUNCTION {shard}_skip()"),
    );
    let acquired = acquire_7(&poker.t);
    let stale = attempt(&mut m, &pay(&poker.p, 7, 6));
    let held = match &acquired {
        Ok((token, now)) => token == now && failed_with(&stale, &["LF001"]),
        Err(_) => true,
    };
    assert!(held, "trigger on the worker gave {r:?}; acquire gave (returned, owner row) {acquired:?}; a write with the old token 6 gave {stale:?}");
}

/// **Hole (critical).** Attack: the migrator never connects to a worker:
/// from the coordinator, `run_command_on_placements` runs its DDL on every
/// shard of the owner table as the migrator, renaming each shard's token
/// column away and adding a new one whose default is the stale token 5
/// (review 11 showed `run_command_on_workers`; this is the per-shard door,
/// and the worker-side guard does not judge column renames). Observed: every
/// owner's token reads 5 and stale writes commit. Expected: `LF008` from
/// the worker-side guard; tokens stay.
#[test]
fn citus_run_command_on_placements_from_the_coordinator_replaces_every_token_column() {
    let (poker, mut m) = attacked("rcp");
    let t = &poker.t;
    let renamed = attempt(
        &mut m,
        &format!(
            "SELECT success, result FROM run_command_on_placements('{t}',
                 $$SET citus.enable_manual_changes_to_shards = on; ALTER TABLE %s RENAME COLUMN owner_fencing_token TO was_token$$)"
        ),
    );
    let results: Vec<(bool, String)> = m
        .query(
            &format!(
                "SELECT success, result FROM run_command_on_placements('{t}',
                     $$SET citus.enable_manual_changes_to_shards = on; ALTER TABLE %s ADD COLUMN owner_fencing_token bigint DEFAULT 5$$)"
            ),
            &[],
        )
        .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default();
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(held, "rename through run_command_on_placements gave {renamed:?}, the added columns {results:?}; {state}");
}

/// **Defence holds.** Attack: a pooled client binds a token inside a
/// savepoint, rolls the savepoint back (its bind is gone on the coordinator)
/// and then deletes fenced rows, with a worker connection opened before the
/// savepoint and none opened since. Expected: the DELETE sees no token on
/// the shard (`LF003`), as it would on one node; a rolled-back bind must not
/// linger on the workers.
#[test]
fn citus_bind_token_rolled_back_to_a_savepoint_does_not_linger_on_the_workers() {
    let (poker, mut m) = attacked("svp");
    let p = &poker.p;
    ok(&mut m, &format!("GRANT DELETE ON {p} TO {APP}"));
    ok(&mut m, &pay(p, 7, 6));
    let mut app = citus().coordinator_as(APP);
    let r = attempt(
        &mut app,
        &format!(
            "BEGIN;
             SELECT count(*) FROM {p} WHERE table_id = 7;
             SAVEPOINT s;
             SELECT lease.bind_token(6);
             SELECT count(*) FROM {p} WHERE table_id = 7;
             ROLLBACK TO SAVEPOINT s;
             DELETE FROM {p} WHERE table_id = 7;
             COMMIT;"
        ),
    );
    let _ = app.batch_execute("ROLLBACK");
    let left = one_i64(&mut m, &format!("SELECT count(*) FROM {p} WHERE table_id = 7"));
    assert!(
        failed_with(&r, &["LF003"]) && left == 1,
        "DELETE after the bind was rolled back gave {r:?}; rows left: {left}"
    );
}

/// A second table access method, `a12_heap` (heap's handler) on every node, so that
/// Citus's `alter_table_set_access_method` has somewhere to go.
fn second_heap() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for node in std::iter::once(&citus().coordinator).chain(&citus().workers) {
            ok(&mut node.connect(), "CREATE ACCESS METHOD a12_heap TYPE TABLE HANDLER heap_tableam_handler");
        }
    });
}

/// **Hole (medium).** Attack: on the coordinator (Citus installed), the
/// migrator keeps a plain local fenced table and owner table (pg_lease as on
/// one node) and calls Citus's `alter_table_set_access_method('payouts',
/// 'a12_heap')` (a second heap access method), which copies the rows into a
/// new table, drops the old one and renames the new one into its place.
/// Observed: it succeeds; the protection config is gone with the old table,
/// the new table carries Citus's copy of the fence trigger, and every write
/// is then refused with `LF008` "lease.protected has no entry for it", whose
/// HINT speaks of a schema-only dump and restore (fails closed, but the
/// table is silently unprotected in `lease.protected` and the error
/// misleads). Expected: refused (`LF008`, as `DROP TABLE` of a fenced Citus
/// table is, since Citus's UDF drops it after copying its rows), or the
/// fence carried over (a stale write refused with `LF001`).
#[test]
#[ignore = "open (medium): the fence fails closed (LF008) with a misleading hint; see the session 7 closing note"]
fn citus_alter_table_set_access_method_of_a_local_fenced_table_keeps_the_fence() {
    second_heap();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("am{n}_tables"), format!("am{n}_payouts"));
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');
             INSERT INTO {t} VALUES (7, 6);"
        ),
    );
    let r = attempt(&mut m, &format!("SELECT alter_table_set_access_method('{p}', 'a12_heap')"));
    let stale = attempt(&mut m, &format!("INSERT INTO {p} VALUES (7, 10, 5)"));
    let protected = one_i64(&mut m, &format!("SELECT count(*) FROM lease.protected WHERE relid::text = '{p}'"));
    assert!(
        failed_with(&stale, &["LF001"]) && protected == 1,
        "alter_table_set_access_method gave {r:?}; a stale write then gave {stale:?}; protections of {p}: {protected}"
    );
}

/// **Hole (low, unclear error; the defence holds), fixed in 0.9.2.** The same with the owner table:
/// `alter_table_set_access_method` of the local owner table is refused
/// (`LF008`), and the guard and fence stay. But the refusal reads "DROP
/// TABLE would drop owner table 17515 of fenced table ...": an OID, not the
/// table's name, and a DROP the caller never wrote. Expected: the owner
/// table named.
#[test]
fn citus_alter_table_set_access_method_of_a_local_owner_table_is_refused_naming_the_table() {
    second_heap();
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("amo{n}_tables"), format!("amo{n}_payouts"));
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');
             INSERT INTO {t} VALUES (7, 6);"
        ),
    );
    let r = attempt(&mut m, &format!("SELECT alter_table_set_access_method('{t}', 'a12_heap')"));
    let lower = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 5 WHERE id = 7"));
    let stale = attempt(&mut m, &format!("INSERT INTO {p} VALUES (7, 10, 5)"));
    assert!(
        failed_with(&lower, &["LF004"])
            && failed_with(&stale, &["LF001"])
            && r.as_ref().err().is_none_or(|e| e.contains(&format!("owner table public.{t}"))),
        "alter_table_set_access_method gave {r:?}; lowering the token then gave {lower:?}; a stale write {stale:?}"
    );
}

/// **Hole (low), one node.** Bad input to the Rust `lease.acquire`: an
/// `owner_key` given as a two-dimensional array (`'{{7}}'`). Observed:
/// `0A000` "searching for elements in multidimensional arrays is not
/// supported", PostgreSQL's words from an internal query, not pg_lease's.
/// Expected: `22023` with a message starting `pg_lease:` that says
/// owner_key must be a one-dimensional array, as for the other malformed
/// owner keys (`{}`, `{7,8}`, `{NULL}` give "owner_key ... does not match
/// the key columns").
#[test]
fn citus_acquire_with_a_two_dimensional_owner_key_gets_a_clear_error() {
    let db = single_node_db("a12dims", "");
    let mut su = db_as(citus().coordinator.port, &db, "postgres");
    ok(
        &mut su,
        "CREATE TABLE tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables', '{id}', 'owner_fencing_token');
         INSERT INTO tables VALUES (7, 6);",
    );
    let r = attempt(&mut su, "SELECT * FROM lease.acquire('table:7', 'a12-host', 15000, 'tables', '{{7}}')");
    assert!(r.as_ref().is_err_and(|e| e.starts_with("22023: pg_lease:")), "{r:?}");
}

/// **Hole (critical).** Attack: on the worker that holds owner 7's shards,
/// the migrator replaces the *fenced* table's shard by a copy without
/// pg_lease's trigger: `CREATE TABLE copy (LIKE shard INCLUDING ALL)`, copy
/// the rows, `DROP TABLE shard`, rename the copy to the shard's name. The
/// worker-side guard only judges copies of pg_lease's triggers that a shard
/// still carries (a missing copy is left to `cluster_fence_problems`, since
/// Citus drops copies over several transactions), and nothing refuses the
/// DROP of a fenced shard. Observed: a write with the stale token 5 through
/// the coordinator commits (`cluster_fence_problems()` does name the shard:
/// this is the documented "copy dropped from a shard" limit reached by a
/// door a worker can judge, DROP TABLE / a table renamed into a shard's
/// name). Expected: `LF008` (the DROP of a fenced table's shard, or the new
/// shard without its copy of the fence).
#[test]
fn citus_worker_fenced_shard_replaced_by_an_unfenced_copy_accepts_stale_writes() {
    let (poker, mut m) = attacked("swap");
    let (port, _, ps) = placement(&mut m, &poker.t, &poker.p, 7);
    let shard = format!("{}_{ps}", poker.p);
    let r = as_migrator_on_worker(
        port,
        &format!(
            "CREATE TABLE {shard}_copy (LIKE {shard} INCLUDING ALL);
             INSERT INTO {shard}_copy SELECT * FROM {shard};
             DROP TABLE {shard};
             ALTER TABLE {shard}_copy RENAME TO {shard}"
        ),
    );
    let (held, state) = fence_state(&mut m, &poker, 7);
    let problems = fence_problems(&poker);
    assert!(
        held && failed_with(&r, &["LF008"]),
        "replacing the fenced shard on the worker gave {r:?}; {state}; cluster_fence_problems rows: {problems}"
    );
}

/// A fresh pair of names (`{name}{n}_tables`, `{name}{n}_payouts`) and the
/// migrator's `CREATE TABLE`s for them, as `unprotected` makes them.
fn new_pair(name: &str) -> (Poker, String) {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let (t, p) = (format!("{name}{n}_tables"), format!("{name}{n}_payouts"));
    let create = format!(
        "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE {p} (table_id bigint NOT NULL, hand bigint NOT NULL DEFAULT 0,
                           amount bigint NOT NULL DEFAULT 0, fencing_token bigint);"
    );
    (Poker { t, p }, create)
}

/// A plain local owner table and fenced table on the coordinator, protected
/// as on one node by the migrator (owner 7 at token 6), with Citus's
/// trigger switch on in the returned migrator session.
fn local_pair(name: &str) -> (Poker, Client) {
    let (poker, create) = new_pair(name);
    let Poker { t, p } = &poker;
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "{create}
             INSERT INTO {t} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;
             UPDATE {t} SET owner_fencing_token = 6 WHERE id = 7;
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');
             SET citus.enable_unsafe_triggers = on;"
        ),
    );
    (poker, m)
}

/// **Hole (low, unclear error; the fence holds).** A legitimate migration
/// done in the wrong order: the migrator protected a local pair on the
/// coordinator and then distributes it, owner table first, fenced table
/// co-located with it (`create_distributed_table`, Citus's trigger switch
/// on). Observed: the fence holds, but the refusal is `XX000` "pg_lease:
/// lease.owner_guard() fired on public.cdt0_tables_102015, which pg_lease
/// does not guard" (a shard name the user never saw; HINT about trigger
/// functions), not a refusal saying what to do. Expected: a clear refusal
/// (`LF008` or `0A000`: unprotect, distribute, protect again), or the
/// shards fenced.
#[test]
#[ignore = "open (low): refused (XX000 from the owner guard), unclearly; see the session 7 closing note"]
fn citus_create_distributed_table_of_a_protected_local_owner_table_is_refused_clearly() {
    let (poker, mut m) = local_pair("cdt");
    let Poker { t, p } = &poker;
    let owner = attempt(
        &mut m,
        &format!("SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none')"),
    );
    let fenced =
        attempt(&mut m, &format!("SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}')"));
    let lowered = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 1 WHERE id = 7"));
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && failed_with(&lowered, &["LF004"]) && (owner.is_ok() || failed_with(&owner, &["LF008", "0A000"])),
        "distributing the owner table gave {owner:?}, the fenced table {fenced:?}; lowering a token {lowered:?}; {state}"
    );
}

/// **Defence holds.** As above with `create_distributed_table_concurrently`
/// for the fenced table (Citus copies the rows with logical replication,
/// through a subscription pg_lease may trust): the owner table cannot be
/// distributed first (as above), so the fenced one is not either; the local
/// fence and owner guard stay in force.
#[test]
fn citus_create_distributed_table_concurrently_of_a_protected_local_pair_keeps_the_fence_or_is_refused() {
    let (poker, mut m) = local_pair("cdtc");
    let Poker { t, p } = &poker;
    let owner = attempt(
        &mut m,
        &format!("SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none')"),
    );
    let fenced = attempt(
        &mut m,
        &format!("SELECT create_distributed_table_concurrently('{p}', 'table_id', colocate_with => '{t}')"),
    );
    let lowered = attempt(&mut m, &format!("UPDATE {t} SET owner_fencing_token = 1 WHERE id = 7"));
    let (held, state) = fence_state(&mut m, &poker, 7);
    assert!(
        held && failed_with(&lowered, &["LF004"]),
        "distributing the owner table gave {owner:?}, the fenced table concurrently {fenced:?}; lowering a token {lowered:?}; {state}"
    );
}

/// **Hole (medium).** Tables distributed with `citus.shard_replication_factor
/// = 2` (statement-based replication: every shard on both workers; a layout
/// README's co-location rule does not name). Observed: `lease.protect`
/// accepts it and the replicas fence (the stale token is refused), but
/// `lease.acquire` with the owner table fails on every call with Citus's
/// `0A000` "could not run distributed query with FOR UPDATE/SHARE commands"
/// (its owner-row lock is not supported on replicated shards): no lease can
/// ever write its token into an owner row. Expected: `protect` refuses the
/// layout clearly (`0A000` naming the replication factor), or `acquire`
/// works and its bump reaches both replicas of the owner row.
#[test]
fn citus_replicated_shards_are_fenced_on_every_replica_or_refused() {
    let (poker, create) = new_pair("rf");
    let Poker { t, p } = &poker;
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "SET citus.shard_replication_factor = 2;
             {create}
             SELECT create_distributed_table('{t}', 'id', shard_count => 4, colocate_with => 'none');
             SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}');
             INSERT INTO {t} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;"
        ),
    );
    let protect = attempt(
        &mut m,
        &format!(
            "SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token')"
        ),
    );
    if protect.is_err() {
        assert!(failed_with(&protect, &["0A000"]), "protect of replicated shards: {protect:?}");
        return;
    }
    bump_to_6(&mut m, t, 7);
    still_fenced(&mut m, &poker, 7);
    let acquired = acquire_7(t);
    let replicas: Vec<i64> = citus()
        .workers
        .iter()
        .map(|w| {
            let mut c = citus().node_as(w.port, "postgres");
            one_i64(&mut c, &format!("SELECT owner_fencing_token FROM {t} WHERE id = 7"))
        })
        .collect();
    let token = acquired.as_ref().map(|(token, _)| *token).unwrap_or(-1);
    assert!(
        replicas.iter().all(|r| *r == token),
        "acquire gave {acquired:?}; the replicas of owner row 7 carry {replicas:?}"
    );
}

/// **Defence holds.** A reference owner table (README: allowed; every node
/// holds every owner row): `lease.acquire` bound to an owner row must write
/// its token to every node's copy, and the previous token be refused after.
#[test]
fn citus_acquire_bumps_a_reference_owner_row_on_every_node() {
    let (poker, create) = new_pair("ref");
    let Poker { t, p } = &poker;
    let mut m = citus().coordinator_as(MIGRATOR);
    ok(
        &mut m,
        &format!(
            "{create}
             SELECT create_reference_table('{t}');
             SELECT create_distributed_table('{p}', 'table_id', shard_count => 4, colocate_with => 'none');
             INSERT INTO {t} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;
             SELECT lease.protect('{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token');"
        ),
    );
    bump_to_6(&mut m, t, 7);
    let acquired = acquire_7(t);
    let copies: Vec<i64> = std::iter::once(citus().coordinator.port)
        .chain(citus().workers.iter().map(|w| w.port))
        .map(|port| {
            let mut c = citus().node_as(port, "postgres");
            ok(&mut c, "SET citus.override_table_visibility = off");
            let shard: String = c
                .query_one(&format!("SELECT shard_name('{t}'::regclass, shardid) FROM pg_dist_shard WHERE logicalrelid = '{t}'::regclass"), &[])
                .unwrap()
                .get(0);
            one_i64(&mut c, &format!("SELECT owner_fencing_token FROM {shard} WHERE id = 7"))
        })
        .collect();
    let old = attempt(&mut m, &pay(p, 7, 6));
    let token = acquired.as_ref().map(|(token, _)| *token).unwrap_or(-1);
    assert!(
        copies.iter().all(|c| *c == token) && failed_with(&old, &["LF001"]),
        "acquire gave {acquired:?}; the copies of owner row 7 carry {copies:?}; the previous token 6 then gave {old:?}"
    );
}

/// **Defence holds.** A pooled client that forgot to bind, on a coordinator
/// session whose previous client bound token 6 (`lease.bind_token` in its
/// transaction, which also set `citus.propagate_set_commands` and opened
/// worker connections that Citus keeps for the session), and another that
/// set `pg_lease.token` for the session with `citus.propagate_set_commands
/// = 'local'` set for the session too. Expected: the next transaction's
/// DELETE without a bind is refused on the shard (`LF003`), not judged with
/// the earlier token left on the cached worker connection.
#[test]
fn citus_forgotten_bind_after_a_bound_transaction_on_cached_worker_connections_is_refused() {
    let (poker, mut m) = attacked("pool");
    let p = &poker.p;
    ok(&mut m, &format!("GRANT DELETE ON {p} TO {APP}"));
    ok(&mut m, &format!("{}; {}", pay(p, 7, 6), pay(p, 7, 6)));
    let mut app = citus().coordinator_as(APP);
    ok(
        &mut app,
        &format!("BEGIN; SELECT lease.bind_token(6); DELETE FROM {p} WHERE table_id = 7 AND ctid = (SELECT min(ctid) FROM {p} WHERE table_id = 7); COMMIT;"),
    );
    let forgot = attempt(&mut app, &format!("DELETE FROM {p} WHERE table_id = 7"));
    let _ = app.batch_execute("ROLLBACK");
    let session = attempt(
        &mut app,
        &format!(
            "SET citus.propagate_set_commands = 'local'; SET pg_lease.token = '6';
             BEGIN; SELECT 1; COMMIT;
             DELETE FROM {p} WHERE table_id = 7"
        ),
    );
    let left = one_i64(&mut m, &format!("SELECT count(*) FROM {p} WHERE table_id = 7"));
    assert!(
        failed_with(&forgot, &["LF003"]) && failed_with(&session, &["LF003", "22023"]) && left == 1,
        "a DELETE without a bind after a bound transaction gave {forgot:?}; after a session-level SET {session:?}; rows left {left}"
    );
}

/// **Defence holds.** `alter_table_set_access_method` of a distributed
/// fenced table and of a distributed owner table (Citus rebuilds each: rows
/// copied into a new table, the old one dropped). Expected: refused with
/// `LF008`, the fence and the owner guard intact.
#[test]
fn citus_alter_table_set_access_method_of_distributed_fenced_tables_is_refused() {
    second_heap();
    let (poker, mut m) = attacked("dam");
    let fenced = attempt(&mut m, &format!("SELECT alter_table_set_access_method('{}', 'a12_heap')", poker.p));
    let owner = attempt(&mut m, &format!("SELECT alter_table_set_access_method('{}', 'a12_heap')", poker.t));
    still_fenced(&mut m, &poker, 7);
    let lowered = attempt(&mut m, &format!("UPDATE {} SET owner_fencing_token = 1 WHERE id = 7", poker.t));
    assert!(
        failed_with(&fenced, &["LF008"])
            && failed_with(&owner, &["LF008", "LF004"])
            && failed_with(&lowered, &["LF004"]),
        "fenced table: {fenced:?}; owner table: {owner:?}; lowering a token after: {lowered:?}"
    );
}

/// One node: the migrator's `tables`/`payouts` pair protected in a fresh
/// database (owner 7 at token 6); a superuser connection to it.
fn single_node_pair(name: &str) -> (String, Client) {
    let db = single_node_db(name, "");
    let port = citus().coordinator.port;
    ok(
        &mut db_as(port, &db, MIGRATOR),
        "CREATE TABLE tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables', '{id}', 'owner_fencing_token');
         INSERT INTO tables VALUES (7, 6);",
    );
    let su = db_as(port, &db, "postgres");
    (db, su)
}

/// **Hole (medium).** Attack: a role granted `EXECUTE` on the lease
/// functions but no privilege at all on the owner table (it cannot even
/// `SELECT` it: another tenant's game server, a metrics job granted the
/// lease functions by mistake) calls `lease.acquire('anything', ...,
/// 'tables', '{7}')`. `acquire` runs as the extension owner and writes the
/// new token into owner row 7: the legitimate holder is fenced out
/// (`LF001`, "freeze the resource, never retry") by a role that could not
/// read the table. Expected: `42501` unless the caller may at least read
/// (or update) the owner table, as `protect` requires ownership.
#[test]
fn citus_acquire_by_a_role_without_rights_on_the_owner_table_is_refused() {
    let (db, mut su) = single_node_pair("a12outsider");
    ok(
        &mut su,
        "DO $$ BEGIN CREATE ROLE a12_outsider LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         GRANT USAGE ON SCHEMA lease TO a12_outsider;
         GRANT EXECUTE ON FUNCTION lease.acquire, lease.try_acquire TO a12_outsider;",
    );
    let mut outsider = db_as(citus().coordinator.port, &db, "a12_outsider");
    let read = attempt(&mut outsider, "SELECT * FROM tables");
    let bump = attempt(&mut outsider, "SELECT * FROM lease.acquire('not-mine', 'intruder', 15000, 'tables', '{7}')");
    let now = one_i64(&mut su, "SELECT owner_fencing_token FROM tables WHERE id = 7");
    assert!(
        failed_with(&bump, &["42501"]) && now == 6,
        "a role that cannot read the owner table ({read:?}) bumped owner row 7: acquire gave {bump:?}, token now {now}"
    );
}

/// **Hole (medium).** Attack: host A holds lease `table:7` bound to owner
/// row 7 (live). Host B acquires a lease of *another name*, `room:7`, bound
/// to the same owner row. README: "Held by another live owner: LF005".
/// Observed: B's acquire succeeds and bumps owner row 7 above A's token; A's
/// lease stays live, its heartbeat reports nothing lost, yet every write of
/// A is now refused (`LF001`): the lease no longer gives one holder per
/// resource, and A learns it lost the resource only from a refused write.
/// Expected: `LF005` while a live lease of another name is bound to that
/// owner row (or one lease name per owner row enforced).
#[test]
fn citus_a_second_lease_name_for_a_held_owner_row_is_refused() {
    let (_db, mut su) = single_node_pair("a12twonames");
    let a: i64 = su
        .query_one("SELECT token FROM lease.acquire('table:7', 'host-a', 60000, 'tables', '{7}')", &[])
        .unwrap()
        .get(0);
    let b = attempt(&mut su, "SELECT * FROM lease.acquire('room:7', 'host-b', 60000, 'tables', '{7}')");
    let lost = one_i64(&mut su, "SELECT count(*) FROM lease.heartbeat('host-a', 60000)");
    let write = attempt(&mut su, &format!("INSERT INTO payouts VALUES (7, 10, {a})"));
    assert!(
        failed_with(&b, &["LF005"]),
        "host A holds table:7 (token {a}); host B's acquire of room:7 for the same owner row gave {b:?}; \
         A's heartbeat then reported {lost} losses and A's write gave {write:?}"
    );
}

/// **Defence holds.** The Rust `lease.acquire` turns `owner_key` text into
/// the owner key's type. The migrator gives the owner key a domain whose
/// CHECK calls a function of its own that reports the role it runs as.
/// README: pg_lease's privileged code runs users' code "only as the table's
/// owner, in a security-restricted operation". Expected: the function runs
/// as the migrator, never as the extension owner (a superuser) nor as the
/// application calling `acquire`.
#[test]
fn citus_acquire_runs_an_owner_key_domain_check_only_as_the_owner_tables_owner() {
    let db = single_node_db("a12domain", "");
    let port = citus().coordinator.port;
    ok(
        &mut db_as(port, &db, MIGRATOR),
        &format!(
            "CREATE FUNCTION who_checks(v bigint) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN
                 IF current_user <> '{MIGRATOR}' THEN
                     RAISE EXCEPTION 'owner key check ran as %', current_user;
                 END IF;
                 RETURN true;
             END $$;
             CREATE DOMAIN table_id AS bigint CHECK (who_checks(VALUE));
             CREATE TABLE tables (id table_id PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id table_id NOT NULL, amount bigint, fencing_token bigint);
             SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token', 'tables', '{{id}}', 'owner_fencing_token');
             INSERT INTO tables VALUES (7, 6);
             GRANT SELECT ON tables TO {APP};"
        ),
    );
    ok(
        &mut db_as(port, &db, "postgres"),
        &format!("GRANT USAGE ON SCHEMA lease TO {APP}; GRANT EXECUTE ON FUNCTION lease.acquire TO {APP};"),
    );
    let mut app = db_as(port, &db, APP);
    let r = attempt(&mut app, "SELECT * FROM lease.acquire('table:7', 'a12-host', 15000, 'tables', '{7}')");
    assert!(r.is_ok(), "acquire with a domain owner key: {r:?}");
}

/// **Defence holds** (one node, for comparison with the shard holes above).
/// The migrator makes the owner table a child of a table of its own and
/// truncates the parent, or gives it a foreign key to a table of its own
/// and truncates that `CASCADE`. The owner table's own TRUNCATE guard fires
/// for both: `LF004`, the tokens stay.
#[test]
fn citus_owner_table_truncated_through_a_parent_or_a_cascade_is_refused() {
    let db = single_node_db("a12trunc", "");
    let mut mig = db_as(citus().coordinator.port, &db, MIGRATOR);
    ok(
        &mut mig,
        "CREATE TABLE tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (table_id bigint NOT NULL, amount bigint, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables', '{id}', 'owner_fencing_token');
         INSERT INTO tables VALUES (7, 6);
         CREATE TABLE parent (id bigint, owner_fencing_token bigint);
         CREATE TABLE keys (id bigint PRIMARY KEY);
         INSERT INTO keys VALUES (7);",
    );
    let inherit = attempt(&mut mig, "ALTER TABLE tables INHERIT parent; TRUNCATE parent");
    let cascade = attempt(&mut mig, "ALTER TABLE tables ADD FOREIGN KEY (id) REFERENCES keys; TRUNCATE keys CASCADE");
    let now = one_i64(&mut mig, "SELECT owner_fencing_token FROM tables WHERE id = 7");
    assert!(
        failed_with(&inherit, &["LF004", "LF008"]) && failed_with(&cascade, &["LF004", "LF008"]) && now == 6,
        "INHERIT + TRUNCATE parent: {inherit:?}; FK + TRUNCATE CASCADE: {cascade:?}; owner 7's token: {now}"
    );
}

/// **Hole (medium), fixed in 0.9.2: the audit recorded a different resource.** In a LATIN1
/// database with a text key, a stale write for resource `clé` is refused
/// (`LF001`), but its message, its DETAIL and the audit row's
/// `resource_key` in `lease.rejected_writes` read `(room)=(clï¿½)`: the key's
/// text is read as UTF-8 (lossily) and written back as LATIN1. Resources
/// `clé` and `clè` are then audited under the same wrong key. Expected:
/// `(room)=(clé)` in the message and the audit.
#[test]
fn citus_fence_refusals_in_a_latin1_database_audit_the_resource_key_as_written() {
    let db = single_node_db("a12latinfence", "ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'");
    let mut su = db_as(citus().coordinator.port, &db, "postgres");
    ok(
        &mut su,
        "SET client_encoding = 'UTF8';
         CREATE TABLE rooms (name text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE bets (room text NOT NULL, amount bigint, fencing_token bigint);
         SELECT lease.protect('bets', '{room}', 'fencing_token', 'rooms', '{name}', 'owner_fencing_token');
         INSERT INTO rooms VALUES ('clé', 6);",
    );
    let refused = attempt(&mut su, "INSERT INTO bets VALUES ('clé', 1, 5)");
    let mut audited = Vec::new();
    for _ in 0..100 {
        audited = su
            .query("SELECT resource_key FROM lease.rejected_writes", &[])
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        if !audited.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        refused.as_ref().is_err_and(|e| e.starts_with("LF001") && e.contains("(room)=(clé)"))
            && audited == ["(room)=(clé)"],
        "the stale write gave {refused:?}; audited resource keys: {audited:?}"
    );
}
