//! The fence on Citus distributed tables, on a real cluster on loopback: a
//! coordinator and two workers (a third joins in the shard-placement test),
//! Citus built from its vendored source by scripts/citus.sh (`make test` does
//! it on PostgreSQL 15 and skips these tests, named `citus_*`, on 18, which
//! Citus 13.2.2 does not support).
//!
//! One cluster set serves every test of this binary (started by the first test,
//! stopped at exit); each test uses tables of its own, distributed in a
//! co-location group of its own (`colocate_with => 'none'`), so a shard move in
//! one test never moves another's shards. The test that adds the third worker
//! and rebalances runs alone (a write lock on the topology).
//!
//! Writes and DDL go through the coordinator, as an application's would;
//! the workers are read to find shards, lock waits and audit rows, and written
//! directly only where a test attacks a shard there. README.md's `sql on=citus`
//! blocks run here too, in order, on the coordinator.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Ports of the coordinator and the three workers (plus `PG_LEASE_PORT_OFFSET`).
const COORDINATOR_PORT: u16 = 54700;
const WORKER_PORTS: [u16; 3] = [54701, 54702, 54703];
/// Owner rows each test creates (ids 1..=OWNERS, token 5): enough for every
/// shard, also after a split, to hold some.
const OWNERS: i64 = 200;

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
    /// The first two are in the cluster from the start; the third is added by
    /// `citus_shards_moved_split_and_rebalanced_onto_a_new_node_stay_fenced`.
    workers: Vec<Cluster>,
}

static CLUSTER: OnceLock<CitusCluster> = OnceLock::new();
static TOPOLOGY: RwLock<()> = RwLock::new(());

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
        // Four servers at once: each start is mostly initdb.
        let (coordinator, workers) = thread::scope(|s| {
            let coordinator = s.spawn(|| Cluster::start_with("citus_coord", COORDINATOR_PORT, CONF));
            let workers: Vec<_> = WORKER_PORTS
                .iter()
                .enumerate()
                .map(|(i, &port)| s.spawn(move || Cluster::start_with(&format!("citus_w{}", i + 1), port, CONF)))
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
        for node in &citus.workers[..2] {
            c.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&i32::from(node.port)]).unwrap();
        }
        // Citus creates the extension on the workers.
        c.batch_execute("CREATE EXTENSION pg_lease").unwrap();
        for node in &citus.workers[..2] {
            let there = one_i64(&mut node.connect(), "SELECT count(*) FROM pg_extension WHERE extname = 'pg_lease'");
            assert_eq!(there, 1, "CREATE EXTENSION pg_lease on the coordinator reached worker {}", node.name);
        }
        citus
    })
}

/// The cluster, shared with the other tests (the topology stays as it is).
fn shared() -> (&'static CitusCluster, RwLockReadGuard<'static, ()>) {
    let guard = TOPOLOGY.read().unwrap_or_else(|e| e.into_inner());
    (citus(), guard)
}

/// The cluster, alone (for adding a node and rebalancing).
fn exclusive() -> (&'static CitusCluster, RwLockWriteGuard<'static, ()>) {
    let guard = TOPOLOGY.write().unwrap_or_else(|e| e.into_inner());
    (citus(), guard)
}

impl CitusCluster {
    fn connect(&self) -> Client {
        self.coordinator.connect()
    }

    /// A connection to the node listening on `port` (a worker or the coordinator).
    fn node(&self, port: u16) -> Client {
        self.workers
            .iter()
            .chain([&self.coordinator])
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
            .connect()
    }
}

/// A test's pair of tables: owner rows in `t` (`id bigint PRIMARY KEY,
/// owner_fencing_token bigint`) distributed by id, fenced `p` distributed by
/// table_id and co-located with `t`, both in a co-location group of their own.
struct Poker {
    t: String,
    p: String,
}

/// A shard of the owner table, one owner id stored in it, and the port of the
/// worker holding it.
#[derive(Debug, Clone)]
struct Shard {
    shardid: i64,
    id: i64,
    port: u16,
}

fn poker(c: &mut Client, name: &str) -> Poker {
    poker_with(c, name, 4)
}

fn poker_with(c: &mut Client, name: &str, shard_count: u32) -> Poker {
    let (t, p) = (format!("{name}_tables"), format!("{name}_payouts"));
    c.batch_execute(&format!(
        "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE {p} (table_id bigint NOT NULL, hand bigint NOT NULL DEFAULT 0,
                           amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
         SELECT create_distributed_table('{t}', 'id', shard_count => {shard_count}, colocate_with => 'none');
         SELECT create_distributed_table('{p}', 'table_id', colocate_with => '{t}');
         INSERT INTO {t} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;"
    ))
    .unwrap();
    protect(c, &format!("'{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token'"));
    Poker { t, p }
}

/// `lease.protect(args)`.
fn protect(c: &mut Client, args: &str) {
    ok(c, &format!("SELECT lease.protect({args})"));
}

/// `lease.protect(args)` in a session that set Citus's unsafe-trigger switch
/// off itself: protect turns on what it needs, whatever the session says.
fn protect_with_unsafe_triggers_off(c: &mut Client, args: &str) {
    ok(c, &format!("SET citus.enable_unsafe_triggers = off; SELECT lease.protect({args})"));
    ok(c, "RESET citus.enable_unsafe_triggers");
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

/// One owner id per shard of the distributed table `t`, with the worker holding it.
fn shards(c: &mut Client, t: &str) -> Vec<Shard> {
    let rows = c
        .query(
            &format!(
                "SELECT DISTINCT ON (s.shardid) s.shardid, g.id, n.nodeport
                   FROM pg_dist_shard s
                   JOIN pg_dist_placement pl USING (shardid)
                   JOIN pg_dist_node n USING (groupid)
                   LEFT JOIN (SELECT id, get_shard_id_for_distribution_column('{t}', id) AS shardid
                                FROM {t}) g USING (shardid)
                  WHERE s.logicalrelid = '{t}'::regclass
                  ORDER BY s.shardid, g.id"
            ),
            &[],
        )
        .unwrap();
    rows.iter()
        .map(|r| {
            let id: Option<i64> = r.get(1);
            let shardid: i64 = r.get(0);
            Shard {
                shardid,
                id: id.unwrap_or_else(|| panic!("shard {shardid} of {t} holds no owner row")),
                port: u16::try_from(r.get::<_, i32>(2)).unwrap(),
            }
        })
        .collect()
}

/// The ports of the workers in the cluster: two, or three once the
/// shard-placement test has added one (tests hold the topology lock, so this
/// does not change under them). With 4 shards a table has some on each.
fn workers(c: &mut Client) -> BTreeSet<u16> {
    c.query("SELECT nodeport FROM pg_dist_node WHERE shouldhaveshards AND isactive AND groupid <> 0", &[])
        .unwrap()
        .iter()
        .map(|r| u16::try_from(r.get::<_, i32>(0)).unwrap())
        .collect()
}

/// The worker ports `shards` lie on.
fn ports(shards: &[Shard]) -> BTreeSet<u16> {
    shards.iter().map(|s| s.port).collect()
}

/// Asserts `sql` fails with one of `codes`, returning "message | detail | hint".
#[track_caller]
fn refused(c: &mut Client, sql: &str, codes: &[&str]) -> String {
    match c.batch_execute(sql) {
        Ok(()) => panic!("expected {codes:?} from: {sql}\nbut it succeeded"),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("expected {codes:?} from {sql}, got {e}"));
            assert!(codes.contains(&db.code().code()), "SQLSTATE for: {sql}\n{}", describe(&e));
            format!("{} | {} | {}", db.message(), db.detail().unwrap_or(""), db.hint().unwrap_or(""))
        }
    }
}

/// Runs `sql` in a transaction, after `SET LOCAL`s that bind `token` on every
/// node the transaction reaches; commits if it succeeded, else rolls back.
/// Each statement is sent on its own: Citus propagates a `SET LOCAL` by
/// sending the client's whole query string to the workers, so a `SET LOCAL`
/// sharing its query string with the write makes the workers run the write
/// too (on the distributed table, which fails there).
fn with_bound_token(c: &mut Client, token: i64, sql: &str) -> Result<(), postgres::Error> {
    let mut tx = c.transaction()?;
    tx.batch_execute("SET LOCAL citus.propagate_set_commands = 'local'")?;
    tx.batch_execute(&format!("SET LOCAL pg_lease.token = '{token}'"))?;
    tx.batch_execute(sql)?;
    tx.commit()
}

#[track_caller]
fn ok(c: &mut Client, sql: &str) {
    c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
}

fn pay(p: &str, id: i64, token: i64) -> String {
    format!("INSERT INTO {p} (table_id, amount, fencing_token) VALUES ({id}, 10, {token})")
}

/// Per shard of `poker`: a stale INSERT and UPDATE refused with LF001, a
/// current INSERT accepted. Returns the workers the shards lie on.
fn stale_refused_on_every_shard(c: &mut Client, poker: &Poker, current: i64) -> BTreeSet<u16> {
    let Poker { t, p } = poker;
    let shards = shards(c, t);
    for s in &shards {
        let msg = refused(c, &pay(p, s.id, current - 1), &["LF001"]);
        assert!(msg.starts_with("StaleOwnerBoundaryWrite"), "shard {s:?}: {msg}");
        ok(c, &pay(p, s.id, current));
        refused(c, &format!("UPDATE {p} SET fencing_token = {} WHERE table_id = {}", current - 1, s.id), &["LF001"]);
    }
    ports(&shards)
}

#[test]
fn citus_stale_writes_refused_on_every_shard_of_every_worker() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    // Citus's default 32 shards, so that multi-shard statements run over
    // several connections to each worker.
    let poker = poker_with(&mut c, "stale", 32);
    let Poker { t, p } = &poker;
    let shards = shards(&mut c, t);
    assert_eq!(ports(&shards), workers(&mut c), "{t}'s shards lie on every worker: {shards:?}");

    for s in &shards {
        let id = s.id;
        // Single-row INSERT.
        let msg = refused(&mut c, &pay(p, id, 4), &["LF001"]);
        assert!(msg.starts_with("StaleOwnerBoundaryWrite"), "{msg}");
        assert!(msg.contains("presented token 4, current token 5"), "{msg}");
        ok(&mut c, &pay(p, id, 5));
        // Multi-row INSERT, one stale row among current ones, also across shards.
        refused(
            &mut c,
            &format!("INSERT INTO {p} (table_id, fencing_token) VALUES ({id}, 5), ({id}, 4), ({id}, 5)"),
            &["LF001"],
        );
        let others: String = shards.iter().map(|o| format!("({}, 5), ", o.id)).collect();
        refused(&mut c, &format!("INSERT INTO {p} (table_id, fencing_token) VALUES {others}({id}, 4)"), &["LF001"]);
        ok(&mut c, &format!("INSERT INTO {p} (table_id, fencing_token) VALUES ({id}, 5), ({id}, 5)"));
        // Prepared: past the point where the plan becomes generic.
        let insert = c.prepare(&format!("INSERT INTO {p} (table_id, fencing_token) VALUES ($1, $2)")).unwrap();
        for _ in 0..7 {
            let r = c.execute(&insert, &[&id, &4i64]);
            assert_eq!(sqlstate(&r), "LF001", "prepared stale INSERT into shard {s:?}");
        }
        c.execute(&insert, &[&id, &5i64]).unwrap();
        // Co-located INSERT ... SELECT (pushed down to the shards).
        refused(
            &mut c,
            &format!(
                "INSERT INTO {p} (table_id, fencing_token) SELECT id, owner_fencing_token - 1 FROM {t} WHERE id = {id}"
            ),
            &["LF001"],
        );
        ok(
            &mut c,
            &format!(
                "INSERT INTO {p} (table_id, fencing_token) SELECT id, owner_fencing_token FROM {t} WHERE id = {id}"
            ),
        );
        // INSERT ... SELECT the coordinator evaluates itself (Citus reports
        // the worker's error as XX000; pg_lease puts LF001 back).
        refused(
            &mut c,
            &format!("INSERT INTO {p} (table_id, fencing_token) SELECT {id}, g FROM generate_series(4, 5) g"),
            &["LF001"],
        );
        // UPDATE stamping a stale token; one keeping the current token passes.
        refused(&mut c, &format!("UPDATE {p} SET fencing_token = 4 WHERE table_id = {id}"), &["LF001"]);
        ok(&mut c, &format!("UPDATE {p} SET amount = amount + 1 WHERE table_id = {id}"));
        // DELETE with a bound token: the rows inserted without an amount
        // (now 1), not the first one (10, now 11).
        let delete = format!("DELETE FROM {p} WHERE table_id = {id} AND amount = 1");
        let r = with_bound_token(&mut c, 4, &delete);
        assert_eq!(sqlstate(&r), "LF001", "DELETE with a stale bound token on shard {s:?}: {r:?}");
        let r = with_bound_token(&mut c, 5, &delete);
        assert!(r.is_ok(), "DELETE with the current bound token on shard {s:?}: {r:?}");
    }
    // 1 + 2 + 1 + 1 rows accepted per shard, the 4 without an amount deleted.
    let rows = one_i64(&mut c, &format!("SELECT count(*) FROM {p}"));
    assert_eq!(rows, shards.len() as i64, "rows left in {p}");
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE fencing_token <> 5 OR amount <> 11")), 0);
}

#[test]
fn citus_bound_token_tables_and_copy_are_fenced_on_every_shard() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "bound");
    // A table without a token column: writers bind their token.
    let nt = format!("{p}_bound");
    ok(
        &mut c,
        &format!(
            "CREATE TABLE {nt} (table_id bigint NOT NULL, amount bigint NOT NULL);
             SELECT create_distributed_table('{nt}', 'table_id', colocate_with => '{t}');"
        ),
    );
    protect(&mut c, &format!("'{nt}', '{{table_id}}', NULL, '{t}', '{{id}}', 'owner_fencing_token'"));
    let shards = shards(&mut c, &t);
    for s in &shards {
        let id = s.id;
        let insert = format!("INSERT INTO {nt} VALUES ({id}, 1)");
        let r = with_bound_token(&mut c, 4, &insert);
        assert_eq!(sqlstate(&r), "LF001", "stale bound INSERT on shard {s:?}: {r:?}");
        let r = c.batch_execute(&insert);
        assert_eq!(sqlstate(&r), "LF003", "unbound INSERT on shard {s:?}: {r:?}");
        with_bound_token(&mut c, 5, &insert).unwrap();
        // lease.bind_token binds on every node the transaction writes through.
        for (token, want) in [(4, "LF001"), (5, "")] {
            let mut tx = c.transaction().unwrap();
            let r =
                tx.batch_execute(&format!("SELECT lease.bind_token({token})")).and_then(|()| tx.batch_execute(&insert));
            let r = r.and_then(|()| tx.commit());
            assert_eq!(sqlstate(&r), want, "INSERT after lease.bind_token({token}) on shard {s:?}: {r:?}");
        }
        // A bare SET LOCAL stays on the coordinator: the shard sees no token.
        let mut tx = c.transaction().unwrap();
        let r = tx.batch_execute("SET LOCAL pg_lease.token = '5'").and_then(|()| tx.batch_execute(&insert));
        assert_eq!(sqlstate(&r), "LF003", "INSERT after a SET LOCAL Citus did not propagate, shard {s:?}: {r:?}");
        drop(tx);

        // COPY: Citus reports a worker's error on its COPY path as XX000
        // with pg_lease's message and DETAIL; pg_lease on the coordinator
        // puts the LF code and the hint back before the client sees it.
        let stale = copy_in(&mut c, &p, &format!("{id}\t4\n"));
        let e = stale.expect_err("stale COPY row accepted");
        let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
        assert_eq!(code, "LF001", "stale COPY: {}", describe(&e));
        let db = e.as_db_error().expect("a server error");
        assert!(db.message().starts_with("StaleOwnerBoundaryWrite: "), "stale COPY: {}", describe(&e));
        assert!(db.hint().is_some_and(|h| h.contains("stale owner")), "stale COPY: {}", describe(&e));
        copy_in(&mut c, &p, &format!("{id}\t5\n{id}\t5\n")).unwrap();
    }
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {nt}")), 2 * shards.len() as i64);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p}")), 2 * shards.len() as i64);
}

/// `COPY p (table_id, fencing_token) FROM STDIN` of `data` (text format).
fn copy_in(c: &mut Client, p: &str, data: &str) -> Result<u64, postgres::Error> {
    use std::io::Write;
    let mut w = c.copy_in(&format!("COPY {p} (table_id, fencing_token) FROM STDIN"))?;
    w.write_all(data.as_bytes()).unwrap();
    w.finish()
}

#[test]
fn citus_owner_rows_keep_their_token_on_every_shard() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "guard");
    let shards = shards(&mut c, &t);
    for s in &shards {
        let id = s.id;
        let msg = refused(&mut c, &format!("UPDATE {t} SET owner_fencing_token = 4 WHERE id = {id}"), &["LF004"]);
        assert!(msg.starts_with("FencingTokenRegression"), "{msg}");
        refused(&mut c, &format!("UPDATE {t} SET owner_fencing_token = NULL WHERE id = {id}"), &["LF004"]);
        refused(&mut c, &format!("DELETE FROM {t} WHERE id = {id}"), &["LF004"]);
        // Citus itself refuses to move a row's distribution column; the key
        // move of an owner row is judged on a reference table below.
        assert_ne!(try_sql(&mut c, &format!("UPDATE {t} SET id = id + 100000 WHERE id = {id}")), "");
        ok(&mut c, &format!("UPDATE {t} SET owner_fencing_token = 6 WHERE id = {id}"));
    }
    ok(&mut c, &pay(&p, shards[0].id, 6));
    // TRUNCATE fires no row trigger: refused for both tables.
    refused(&mut c, &format!("TRUNCATE {p}"), &["LF008"]);
    refused(&mut c, &format!("TRUNCATE {t}"), &["LF004"]);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p}")), 1);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {t}")), OWNERS);
    assert_eq!(
        one_i64(&mut c, &format!("SELECT count(*) FROM {t} WHERE owner_fencing_token = 6")),
        shards.len() as i64
    );
}

#[test]
fn citus_reference_owner_table_fences_distributed_payouts() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let (t, p) = ("ref_tables", "ref_payouts");
    ok(
        &mut c,
        &format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, owner_fencing_token bigint);
             SELECT create_reference_table('{t}');
             INSERT INTO {t} SELECT g, 5 FROM generate_series(1, {OWNERS}) g;
             CREATE TABLE {p} (table_id bigint NOT NULL, hand bigint NOT NULL DEFAULT 0,
                               amount bigint NOT NULL DEFAULT 0, fencing_token bigint);
             SELECT create_distributed_table('{p}', 'table_id', shard_count => 4, colocate_with => 'none');"
        ),
    );
    protect(&mut c, &format!("'{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token'"));
    // Shards of the payouts (the owner table has one shard, on every node).
    let rows = c
        .query(
            &format!(
                "SELECT DISTINCT ON (s.shardid) g, n.nodeport FROM pg_dist_shard s
                   JOIN pg_dist_placement pl USING (shardid) JOIN pg_dist_node n USING (groupid),
                   generate_series(1, {OWNERS}) g
                  WHERE s.logicalrelid = '{p}'::regclass
                    AND get_shard_id_for_distribution_column('{p}', g) = s.shardid
                  ORDER BY s.shardid, g"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 4);
    let mut nodes = BTreeSet::new();
    for r in &rows {
        let id: i64 = r.get::<_, i32>(0).into();
        nodes.insert(r.get::<_, i32>(1));
        refused(&mut c, &pay(p, id, 4), &["LF001"]);
        ok(&mut c, &pay(p, id, 5));
        let bump = format!("UPDATE {t} SET owner_fencing_token = 6 WHERE id = {id}");
        ok(&mut c, &bump);
        refused(&mut c, &pay(p, id, 5), &["LF001"]);
        ok(&mut c, &pay(p, id, 6));
        // The owner guard on every placement of the reference table.
        refused(&mut c, &format!("UPDATE {t} SET owner_fencing_token = 5 WHERE id = {id}"), &["LF004"]);
        refused(&mut c, &format!("UPDATE {t} SET id = id + 100000 WHERE id = {id}"), &["LF004"]);
        refused(&mut c, &format!("DELETE FROM {t} WHERE id = {id}"), &["LF004"]);
    }
    let workers: BTreeSet<i32> = workers(&mut c).into_iter().map(i32::from).collect();
    assert_eq!(nodes, workers, "the payouts' shards lie on every worker");
    refused(&mut c, &format!("TRUNCATE {t}"), &["LF004"]);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {t} WHERE owner_fencing_token = 6")), 4);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p}")), 8);
}

/// Waits (up to 20 s) until a backend of the node behind `observer` waits for
/// a lock while running a statement on a shard of `table` (Citus names
/// shards `<table>_<shardid>`).
fn wait_until_lock_wait(observer: &mut Client, table: &str) {
    let start = Instant::now();
    loop {
        let waiting = one_i64(
            observer,
            &format!(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND strpos(query, '{table}_') > 0"
            ),
        );
        if waiting > 0 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "nothing on {table}'s shards ever waited for a lock");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn citus_token_bump_serializes_with_writers_on_the_workers() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "bump");
    let shards = shards(&mut c, &t);
    for s in [&shards[0], shards.iter().find(|o| o.port != shards[0].port).unwrap()] {
        let id = s.id;
        let mut worker = citus.node(s.port);
        // An in-flight writer that verified token 5 holds the bump back...
        let mut writer = citus.connect();
        writer.batch_execute(&format!("BEGIN; {}", pay(&p, id, 5))).unwrap();
        let bump = thread::spawn({
            let mut bumper = citus.connect();
            let sql = format!("UPDATE {t} SET owner_fencing_token = 6 WHERE id = {id}");
            move || bumper.batch_execute(&sql)
        });
        wait_until_lock_wait(&mut worker, &t);
        thread::sleep(Duration::from_millis(200));
        assert!(!bump.is_finished(), "the bump on shard {s:?} did not wait for the writer");
        writer.batch_execute("COMMIT").unwrap();
        bump.join().unwrap().unwrap();
        assert_eq!(one_i64(&mut c, &format!("SELECT owner_fencing_token FROM {t} WHERE id = {id}")), 6);
        assert_eq!(
            one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE table_id = {id} AND fencing_token = 5")),
            1
        );

        // ...and a writer arriving during an open bump waits, then is refused.
        let mut bumper = citus.connect();
        bumper.batch_execute(&format!("BEGIN; UPDATE {t} SET owner_fencing_token = 7 WHERE id = {id}")).unwrap();
        let late = thread::spawn({
            let mut late = citus.connect();
            let sql = pay(&p, id, 6);
            move || late.batch_execute(&sql)
        });
        wait_until_lock_wait(&mut worker, &p);
        thread::sleep(Duration::from_millis(200));
        assert!(!late.is_finished(), "the writer on shard {s:?} did not wait for the open bump");
        bumper.batch_execute("COMMIT").unwrap();
        let r = late.join().unwrap();
        assert_eq!(sqlstate(&r), "LF001", "writer after the bump on shard {s:?}: {r:?}");
        assert_eq!(
            one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE table_id = {id} AND fencing_token = 6")),
            0
        );
    }
}

/// Asserts `lease.<call>` is refused with 0A000 and a message naming co-location.
#[track_caller]
fn layout_refused(c: &mut Client, call: &str) {
    let msg = refused(c, &format!("SELECT lease.{call}"), &["0A000"]);
    let lower = msg.to_lowercase();
    assert!(lower.contains("co-locat") || lower.contains("colocat"), "lease.{call}: {msg}");
}

#[test]
fn citus_protect_refuses_layouts_the_shards_cannot_enforce() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    ok(
        &mut c,
        "CREATE TABLE lay_tables (id bigint PRIMARY KEY, owner_fencing_token bigint);
         SELECT create_distributed_table('lay_tables', 'id', shard_count => 4, colocate_with => 'none');
         -- owner not co-located: the same key, a co-location group of its own
         CREATE TABLE lay_apart (table_id bigint NOT NULL, fencing_token bigint);
         SELECT create_distributed_table('lay_apart', 'table_id', shard_count => 4, colocate_with => 'none');
         -- co-located, but distributed by a column that is not the key
         CREATE TABLE lay_by_id (id bigint NOT NULL, table_id bigint NOT NULL, fencing_token bigint);
         SELECT create_distributed_table('lay_by_id', 'id', colocate_with => 'lay_tables');
         -- a local table of the coordinator
         CREATE TABLE lay_local (table_id bigint NOT NULL, fencing_token bigint);
         -- owner key (x, y) distributed by y; the target's matching column for x is its distribution column
         CREATE TABLE lay_owner2 (x bigint, y bigint, owner_fencing_token bigint, PRIMARY KEY (x, y));
         SELECT create_distributed_table('lay_owner2', 'y', shard_count => 4, colocate_with => 'none');
         CREATE TABLE lay_target2 (a bigint NOT NULL, b bigint NOT NULL, fencing_token bigint);
         SELECT create_distributed_table('lay_target2', 'a', colocate_with => 'lay_owner2');
         -- for high-water mode
         CREATE TABLE lay_sink (table_id bigint NOT NULL, fencing_token bigint);
         SELECT create_distributed_table('lay_sink', 'table_id', colocate_with => 'lay_tables');",
    );
    let owner = "'lay_tables', '{id}', 'owner_fencing_token'";
    layout_refused(&mut c, &format!("protect('lay_apart', '{{table_id}}', 'fencing_token', {owner})"));
    layout_refused(&mut c, &format!("protect('lay_by_id', '{{table_id}}', 'fencing_token', {owner})"));
    layout_refused(&mut c, &format!("protect('lay_local', '{{table_id}}', 'fencing_token', {owner})"));
    layout_refused(
        &mut c,
        "protect('lay_target2', '{a,b}', 'fencing_token', 'lay_owner2', '{x,y}', 'owner_fencing_token')",
    );
    layout_refused(&mut c, "protect_high_water('lay_sink', '{table_id}', 'fencing_token')");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE table_name::text LIKE 'lay%'"), 0);
    // What these layouts lack, they can get: distributed by the key, co-located.
    protect_with_unsafe_triggers_off(&mut c, &format!("'lay_sink', '{{table_id}}', 'fencing_token', {owner}"));
    ok(
        &mut c,
        "SELECT undistribute_table('lay_target2');
         SELECT create_distributed_table('lay_target2', 'b', colocate_with => 'lay_owner2');",
    );
    protect_with_unsafe_triggers_off(
        &mut c,
        "'lay_target2', '{a,b}', 'fencing_token', 'lay_owner2', '{x,y}', 'owner_fencing_token'",
    );
    ok(&mut c, "INSERT INTO lay_owner2 VALUES (1, 2, 5); INSERT INTO lay_target2 VALUES (1, 2, 5)");
    refused(&mut c, "INSERT INTO lay_target2 VALUES (1, 2, 4)", &["LF001"]);
}

/// An online (logical) shard move while a writer keeps writing to the shard:
/// Citus copies the shard, then replays what was written meanwhile on the
/// new shard, whose fence fires there (ENABLE ALWAYS) before Citus's metadata
/// places the shard on that node. Every accepted write arrives, every stale
/// one is refused, and nothing else fails.
#[test]
fn citus_an_online_shard_move_under_fenced_writes_loses_nothing() {
    let (citus, _topology) = exclusive();
    let mut c = citus.connect();
    let poker = poker(&mut c, "online");
    let Poker { t, p } = &poker;
    let all = shards(&mut c, t);
    let target = all[0].clone();
    let id = target.id;
    // (A logical move publishes the shard: UPDATE and DELETE need a replica identity.)
    ok(&mut c, &format!("ALTER TABLE {p} REPLICA IDENTITY FULL"));
    // Enough rows that the copy takes a while; under the current token 5.
    ok(
        &mut c,
        &format!("INSERT INTO {p} (table_id, amount, fencing_token) SELECT {id}, 0, 5 FROM generate_series(1, 200000)"),
    );
    let other =
        citus.workers.iter().map(|w| w.port).find(|&w| w != target.port && all.iter().any(|s| s.port == w)).unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, p, mut w) = (stop.clone(), p.clone(), citus.connect());
        thread::spawn(move || {
            let (mut accepted, mut refusals, mut i) = (0i64, 0i64, 1i64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // A current write, its bound-token delete of the previous one,
                // an update keeping the token, and a stale write.
                w.batch_execute(&format!("INSERT INTO {p} (table_id, amount, fencing_token) VALUES ({id}, {i}, 5)"))
                    .unwrap_or_else(|e| panic!("current INSERT during the move: {}", describe(&e)));
                with_bound_token(&mut w, 5, &format!("DELETE FROM {p} WHERE table_id = {id} AND amount = {}", i - 1))
                    .unwrap_or_else(|e| panic!("bound DELETE during the move: {}", describe(&e)));
                w.batch_execute(&format!("UPDATE {p} SET hand = hand + 1 WHERE table_id = {id} AND amount = {i}"))
                    .unwrap_or_else(|e| panic!("UPDATE during the move: {}", describe(&e)));
                let r =
                    w.batch_execute(&format!("INSERT INTO {p} (table_id, amount, fencing_token) VALUES ({id}, -1, 4)"));
                assert_eq!(sqlstate(&r), "LF001", "stale INSERT during the move: {r:?}");
                refusals += 1;
                accepted += 1;
                i += 1;
            }
            (accepted, refusals, i - 1)
        })
    };
    thread::sleep(Duration::from_millis(300));
    ok(
        &mut c,
        &format!(
            "SELECT citus_move_shard_placement({}, '127.0.0.1', {}, '127.0.0.1', {other}, shard_transfer_mode => 'force_logical')",
            target.shardid, target.port
        ),
    );
    thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (accepted, _refusals, last) = writer.join().unwrap();
    assert!(accepted > 2, "the writer wrote {accepted} times during the move");
    let moved = shards(&mut c, t);
    assert_eq!(moved.iter().find(|s| s.shardid == target.shardid).unwrap().port, other, "{moved:?}");
    // The writer's rows: the last one (the earlier ones deleted in turn), and
    // the 200,000 rows of amount 0 (deleted by the first round's DELETE).
    assert_eq!(
        one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE table_id = {id}")),
        1,
        "rows of resource {id} after the move"
    );
    assert_eq!(one_i64(&mut c, &format!("SELECT max(amount) FROM {p} WHERE table_id = {id}")), last);
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE fencing_token <> 5")), 0);
    stale_refused_on_every_shard(&mut c, &poker, 5);
}

fn node_id(c: &mut Client, port: u16) -> i32 {
    c.query_one("SELECT nodeid FROM pg_dist_node WHERE nodeport = $1", &[&i32::from(port)]).unwrap().get(0)
}

#[test]
fn citus_shards_moved_split_and_rebalanced_onto_a_new_node_stay_fenced() {
    let (citus, _topology) = exclusive();
    let mut c = citus.connect();
    let poker = poker(&mut c, "place");
    let Poker { t, p } = &poker;
    // Rows written under token 5, then every owner's token bumped to 6: the
    // copies a move, split or rebalance makes carry rows older than the
    // current token, which must not stop them.
    let all = shards(&mut c, t);
    for s in &all {
        ok(&mut c, &pay(p, s.id, 5));
    }
    ok(&mut c, &format!("UPDATE {t} SET owner_fencing_token = 6"));
    let [w1, w2] = [citus.workers[0].port, citus.workers[1].port];

    // A move of a shard (and its co-located payouts shard) to the other worker.
    let moved = all.iter().find(|s| s.port == w1).unwrap().clone();
    ok(
        &mut c,
        &format!(
            "SELECT citus_move_shard_placement({}, '127.0.0.1', {w1}, '127.0.0.1', {w2}, shard_transfer_mode => 'block_writes')",
            moved.shardid
        ),
    );
    let after = shards(&mut c, t);
    assert_eq!(after.iter().find(|s| s.shardid == moved.shardid).unwrap().port, w2, "{after:?}");
    stale_refused_on_every_shard(&mut c, &poker, 6);

    // A split of a shard into two, one on each worker.
    let (shardid, min, max): (i64, String, String) = {
        let r = c
            .query_one(
                &format!(
                    "SELECT shardid, shardminvalue, shardmaxvalue FROM pg_dist_shard
                      WHERE logicalrelid = '{t}'::regclass ORDER BY shardid LIMIT 1"
                ),
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let mid = (min.parse::<i64>().unwrap() + max.parse::<i64>().unwrap()) / 2;
    let (n1, n2) = (node_id(&mut c, w1), node_id(&mut c, w2));
    ok(
        &mut c,
        &format!(
            "SELECT citus_split_shard_by_split_points({shardid}, ARRAY['{mid}'], ARRAY[{n1}, {n2}], shard_transfer_mode => 'block_writes')"
        ),
    );
    assert_eq!(shards(&mut c, t).len(), 5);
    stale_refused_on_every_shard(&mut c, &poker, 6);

    // A third worker joins; rebalancing moves shards onto it.
    let w3 = citus.workers[2].port;
    c.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&i32::from(w3)]).unwrap();
    ok(
        &mut c,
        &format!(
            "SELECT rebalance_table_shards('{t}', rebalance_strategy => 'by_shard_count', shard_transfer_mode => 'block_writes')"
        ),
    );
    let covered = stale_refused_on_every_shard(&mut c, &poker, 6);
    assert_eq!(covered, BTreeSet::from([w1, w2, w3]), "{t}'s shards after the rebalance: {:?}", shards(&mut c, t));
    // The rows the copies carried are all there.
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p} WHERE fencing_token = 5")), all.len() as i64);

    // Shards created from now on, on the new worker too, are fenced.
    let fresh = poker_with(&mut c, "fresh", 6);
    let covered = stale_refused_on_every_shard(&mut c, &fresh, 5);
    assert_eq!(covered, BTreeSet::from([w1, w2, w3]));
}

#[test]
fn citus_lease_acquire_writes_the_distributed_owner_row() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "leases");
    let shards = shards(&mut c, &t);
    let acquire = |c: &mut Client, id: i64, owner: &str| -> i64 {
        let sql = format!("SELECT token FROM lease.acquire('{t}:{id}', '{owner}', 60000, '{t}', ARRAY['{id}'])");
        c.query_one(&sql, &[]).unwrap_or_else(|e| panic!("{sql}: {}", describe(&e))).get(0)
    };
    for s in &shards {
        let id = s.id;
        let token = acquire(&mut c, id, "host-a");
        assert!(token > 5, "token {token}");
        let stored = format!("SELECT owner_fencing_token FROM {t} WHERE id = {id}");
        assert_eq!(one_i64(&mut c, &stored), token, "owner row of shard {s:?}");
        refused(&mut c, &pay(&p, id, 5), &["LF001"]);
        ok(&mut c, &pay(&p, id, token));
        // Re-acquired by its owner: a higher token fences the earlier one.
        let again = acquire(&mut c, id, "host-a");
        assert!(again > token, "{again} after {token}");
        assert_eq!(one_i64(&mut c, &stored), again);
        refused(&mut c, &pay(&p, id, token), &["LF001"]);
        // Released and taken by another owner: higher still.
        let released: bool =
            c.query_one(&format!("SELECT lease.release('{t}:{id}', 'host-a', {again})"), &[]).unwrap().get(0);
        assert!(released);
        let other = acquire(&mut c, id, "host-b");
        assert!(other > again, "{other} after {again}");
        assert_eq!(one_i64(&mut c, &stored), other);
        refused(&mut c, &pay(&p, id, again), &["LF001"]);
        ok(&mut c, &pay(&p, id, other));
    }
    assert_eq!(one_i64(&mut c, &format!("SELECT count(*) FROM {p}")), 2 * shards.len() as i64);
}

#[test]
fn citus_refusals_are_audited_on_their_worker_and_gathered_on_the_coordinator() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "audit");
    let shards = shards(&mut c, &t);
    let mut expected: BTreeMap<u16, i64> = BTreeMap::new();
    for s in &shards {
        for _ in 0..2 {
            refused(&mut c, &pay(&p, s.id, 4), &["LF001"]);
        }
        *expected.entry(s.port).or_default() += 2;
        ok(&mut c, &pay(&p, s.id, 5));
    }
    assert_eq!(expected.keys().copied().collect::<BTreeSet<_>>(), workers(&mut c), "{shards:?}");
    // Each worker records its own refusals.
    let mine = format!("strpos(target_table, '{p}') > 0");
    for (&port, &n) in &expected {
        let mut worker = citus.node(port);
        let start = Instant::now();
        loop {
            let recorded = one_i64(&mut worker, &format!("SELECT count(*) FROM lease.rejected_writes WHERE {mine}"));
            assert!(recorded <= n, "worker {port} recorded {recorded} refusals of {p}, {n} were refused there");
            if recorded == n {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "worker {port} recorded {recorded} of {n} refusals");
            thread::sleep(Duration::from_millis(100));
        }
        let wrong = one_i64(
            &mut worker,
            &format!("SELECT count(*) FROM lease.rejected_writes WHERE {mine} AND (sqlstate <> 'LF001' OR presented_token <> 4 OR current_token <> 5)"),
        );
        assert_eq!(wrong, 0);
    }
    // The coordinator gathers them, naming each node.
    let rows = c.query("SELECT * FROM lease.cluster_rejected_writes()", &[]).unwrap();
    let first = &rows.first().expect("no rows from lease.cluster_rejected_writes()").columns()[0];
    assert_eq!((first.name(), first.type_().name()), ("node", "text"));
    let gathered: BTreeMap<u16, i64> = c
        .query(&format!("SELECT node, count(*) FROM lease.cluster_rejected_writes() WHERE {mine} GROUP BY node"), &[])
        .unwrap()
        .iter()
        .map(|r| {
            let node: String = r.get(0);
            let port = node.strip_prefix("127.0.0.1:").and_then(|p| p.parse().ok());
            (port.unwrap_or_else(|| panic!("node {node} is not 127.0.0.1:<port>")), r.get(1))
        })
        .collect();
    assert_eq!(gathered, expected);
    // lease.stats likewise.
    let rows = c.query("SELECT * FROM lease.cluster_stats()", &[]).unwrap();
    let first = &rows.first().expect("no rows from lease.cluster_stats()").columns()[0];
    assert_eq!((first.name(), first.type_().name()), ("node", "text"));
    let refused_per_node: BTreeMap<String, i64> = c
        .query(
            &format!(
                "SELECT node, sum(refused)::bigint FROM lease.cluster_stats()
                  WHERE strpos(table_name::text, '{p}') > 0 GROUP BY node"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (port, n) in &expected {
        let got = refused_per_node.get(&format!("127.0.0.1:{port}")).copied().unwrap_or(0);
        assert_eq!(got, *n, "lease.cluster_stats() of worker {port}: {refused_per_node:?}");
    }
}

#[test]
fn citus_fence_tampering_refused_and_unprotect_reaches_every_shard() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    // Citus's default 32 shards: with that many per worker, Citus runs a DDL
    // command over several connections to each worker (with 4 shards, one).
    let poker = poker_with(&mut c, "tamper", 32);
    let Poker { t, p } = &poker;
    let shards = shards(&mut c, t);
    // Through the coordinator: Citus refuses trigger DDL on distributed
    // tables by itself; with its switch on, pg_lease's guard refuses it.
    for (switch, codes) in [("off", &["LF008", "XX000"][..]), ("on", &["LF008"][..])] {
        ok(&mut c, &format!("SET citus.enable_unsafe_triggers = {switch}"));
        for ddl in [
            format!("ALTER TABLE {p} DISABLE TRIGGER pg_lease_fence"),
            format!("DROP TRIGGER pg_lease_fence ON {p}"),
            format!("ALTER TABLE {t} DISABLE TRIGGER pg_lease_owner_guard"),
            format!("DROP TRIGGER pg_lease_owner_guard ON {t}"),
        ] {
            refused(&mut c, &ddl, codes);
        }
    }
    ok(&mut c, "RESET citus.enable_unsafe_triggers");
    // On a worker, the copies of the triggers on each shard: disabled or
    // changed, refused at commit.
    for s in &shards {
        let ps: i64 = one_i64(&mut c, &format!("SELECT get_shard_id_for_distribution_column('{p}', {})", s.id));
        let (p_shard, t_shard) = (format!("{p}_{ps}"), format!("{t}_{}", s.shardid));
        let mut worker = citus.node(s.port);
        for ddl in [
            format!("ALTER TABLE {p_shard} DISABLE TRIGGER pg_lease_fence_{ps}"),
            format!("ALTER TABLE {p_shard} ENABLE REPLICA TRIGGER pg_lease_fence_{ps}"),
            format!(
                "CREATE OR REPLACE TRIGGER pg_lease_fence_{ps} BEFORE INSERT ON {p_shard} FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger()"
            ),
            format!(
                "CREATE OR REPLACE TRIGGER pg_lease_fence_{ps} BEFORE INSERT OR UPDATE OR DELETE ON {p_shard} FOR EACH ROW WHEN (false) EXECUTE FUNCTION lease.fence_trigger()"
            ),
            format!("ALTER TABLE {t_shard} DISABLE TRIGGER pg_lease_owner_guard_{}", s.shardid),
            format!("ALTER TABLE {t_shard} DISABLE TRIGGER ALL"),
        ] {
            refused(&mut worker, &ddl, &["LF008"]);
        }
        // A write straight into the shard is judged as one through the coordinator.
        refused(
            &mut worker,
            &format!("INSERT INTO {p_shard} (table_id, fencing_token) VALUES ({}, 4)", s.id),
            &["LF001"],
        );
    }
    stale_refused_on_every_shard(&mut c, &poker, 5);
    assert_eq!(fence_problems_of(&mut c, p), Vec::<String>::new());

    // A copy dropped from a shard straight on its worker: refused there too
    // (only Citus's own connections change a fenced table's shards).
    let s = &shards[0];
    let ps: i64 = one_i64(&mut c, &format!("SELECT get_shard_id_for_distribution_column('{p}', {})", s.id));
    let mut worker = citus.node(s.port);
    refused(&mut worker, &format!("DROP TRIGGER pg_lease_fence_{ps} ON {p}_{ps}"), &["LF008"]);
    assert_eq!(fence_problems_of(&mut c, p), Vec::<String>::new());

    // lease.unprotect on the coordinator removes the fence from every shard...
    ok(&mut c, &format!("SELECT lease.unprotect('{p}')"));
    for s in &shards {
        ok(&mut c, &pay(p, s.id, 4));
    }
    // ...and protect puts it back on every shard.
    protect(&mut c, &format!("'{p}', '{{table_id}}', 'fencing_token', '{t}', '{{id}}', 'owner_fencing_token'"));
    stale_refused_on_every_shard(&mut c, &poker, 5);
}

/// README.md's ```sql on=citus blocks, in order: (line, expected SQLSTATE, text).
fn readme_citus_blocks() -> Vec<(usize, Option<String>, String)> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Option<String>, String)> = None;
    for (i, line) in readme.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let words: Vec<&str> = info.split_whitespace().collect();
                if words.first() == Some(&"sql") && words.contains(&"on=citus") {
                    let expect = words.iter().find_map(|w| w.strip_prefix("expect=")).map(str::to_owned);
                    for w in &words[1..] {
                        assert!(
                            *w == "on=citus" || w.starts_with("expect="),
                            "README.md:{}: unknown option {w}",
                            i + 1
                        );
                    }
                    open = Some((i + 1, expect, String::new()));
                }
            }
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some((_, _, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md: unterminated sql on=citus block");
    blocks
}

#[test]
fn citus_readme_blocks_run_on_the_coordinator() {
    let (citus, _topology) = shared();
    let blocks = readme_citus_blocks();
    assert!(blocks.len() >= 3, "README.md has {} sql on=citus blocks", blocks.len());
    assert!(
        blocks.iter().any(|b| b.1.as_deref() == Some("LF001")),
        "README.md's Citus stale write is marked expect=LF001"
    );
    let mut script = String::from("\\set ON_ERROR_STOP on\n");
    for (line, expect, sql) in &blocks {
        match expect {
            None => script.push_str(&format!("{sql}\\echo @@ok {line}\n")),
            Some(_) => script.push_str(&format!(
                "\\set ON_ERROR_STOP off\n{sql}\\echo @@expect {line} :SQLSTATE\n\\set ON_ERROR_STOP on\n"
            )),
        }
    }
    let mut psql = std::process::Command::new(pg_bin("psql"))
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &citus.coordinator.port.to_string(), "-U", "postgres", "postgres"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    {
        use std::io::Write;
        psql.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    }
    let out = psql.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let mut done = 0;
    for l in stdout.lines() {
        if let Some(rest) = l.strip_prefix("@@expect ") {
            let (at, code) = rest.split_once(' ').unwrap();
            let block = blocks.iter().find(|b| b.0.to_string() == at).unwrap();
            assert_eq!(Some(code), block.1.as_deref(), "README.md:{at}: SQLSTATE\n{stderr}");
            done += 1;
        } else if l.starts_with("@@ok ") {
            done += 1;
        }
    }
    if let Some((line, _, sql)) = blocks.get(done) {
        panic!("README.md:{line}: this sql on=citus block failed:\n{sql}\npsql said:\n{stderr}");
    }
    assert!(out.status.success(), "psql: {stderr}");
    let errors = stderr.lines().filter(|l| l.starts_with("ERROR:")).count();
    assert_eq!(errors, blocks.iter().filter(|b| b.1.is_some()).count(), "unexpected errors:\n{stderr}");

    // The refused write reaches the coordinator's gathered audit, from the
    // worker holding table 7; every node's fence is in place.
    let mut c = citus.connect();
    let worker = format!(
        "127.0.0.1:{}",
        one_i64(&mut c, "SELECT nodeport::bigint FROM pg_dist_shard_placement WHERE shardid = get_shard_id_for_distribution_column('tables', 7)")
    );
    let start = Instant::now();
    loop {
        let rows = c
            .query(
                "SELECT node FROM lease.cluster_rejected_writes()
                  WHERE target_table = 'public.payouts' AND resource_key = '(table_id)=(7)' AND sqlstate = 'LF001'",
                &[],
            )
            .unwrap();
        let nodes: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if !nodes.is_empty() {
            assert_eq!(nodes.join(", "), worker);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the README's refused write never reached lease.cluster_rejected_writes()"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // (Other tests break other tables' fences on purpose.)
    let problems =
        "SELECT count(*) FROM lease.cluster_fence_problems() WHERE target IN ('public.payouts', 'public.tables')";
    assert_eq!(one_i64(&mut c, problems), 0);
}

#[test]
fn citus_cluster_fence_problems_names_a_worker_stripped_of_the_fence() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "stripped");
    let problems = format!("SELECT node FROM lease.cluster_fence_problems() WHERE target = 'public.{p}'");
    assert!(c.query(&problems, &[]).unwrap().is_empty());
    // What no worker can tell from Citus's own changes: a table owner on a
    // worker, DDL propagation off, drops the fence from the shell and every
    // shard there in one transaction.
    let port = shards(&mut c, &t)[0].port;
    let on_worker: Vec<i64> = c
        .query(
            &format!(
                "SELECT shardid FROM pg_dist_shard JOIN pg_dist_shard_placement USING (shardid)
                  WHERE logicalrelid = '{p}'::regclass AND nodeport = {port}"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!on_worker.is_empty());
    let mut worker = citus.node(port);
    let mut tx = worker.transaction().unwrap();
    tx.batch_execute(&format!("SET LOCAL citus.enable_ddl_propagation = off; DROP TRIGGER pg_lease_fence ON {p};"))
        .unwrap();
    for id in &on_worker {
        tx.batch_execute(&format!("DROP TRIGGER pg_lease_fence_{id} ON {p}_{id}")).unwrap();
    }
    tx.commit().unwrap();
    // The coordinator's check finds it, on that node only.
    let nodes: Vec<String> = c.query(&problems, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(nodes, [format!("127.0.0.1:{port}")]);
}

#[test]
fn citus_a_refusal_on_one_worker_aborts_the_whole_distributed_transaction() {
    let (citus, _topology) = shared();
    let mut c = citus.connect();
    let Poker { t, p } = poker(&mut c, "twophase");
    let shards = shards(&mut c, &t);
    let a = &shards[0];
    let b = shards.iter().find(|s| s.port != a.port).expect("shards on two workers");
    // Current writes on both workers commit together (two-phase commit)...
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(&pay(&p, a.id, 5)).unwrap();
    tx.batch_execute(&pay(&p, b.id, 5)).unwrap();
    tx.commit().unwrap();
    // ...a stale one on the second worker takes the first worker's write with it,
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(&pay(&p, a.id, 5)).unwrap();
    let r = tx.batch_execute(&pay(&p, b.id, 4));
    assert_eq!(sqlstate(&r), "LF001", "{r:?}");
    drop(tx);
    // and so does a bump on the second worker after a write the first accepted.
    let mut tx = c.transaction().unwrap();
    tx.batch_execute(&pay(&p, a.id, 5)).unwrap();
    let r = tx.batch_execute(&format!("UPDATE {t} SET owner_fencing_token = 4 WHERE id = {}", b.id));
    assert_eq!(sqlstate(&r), "LF004", "{r:?}");
    drop(tx);
    let rows = format!("SELECT count(*) FROM {p} WHERE table_id IN ({}, {})", a.id, b.id);
    assert_eq!(one_i64(&mut c, &rows), 2);
}

/// lease.cluster_fence_problems() rows about `table`, as "node target problem".
fn fence_problems_of(c: &mut Client, table: &str) -> Vec<String> {
    c.query(
        "SELECT node || ' ' || target || ' ' || problem FROM lease.cluster_fence_problems()
          WHERE target = (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
                            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::text::regclass)",
        &[&table],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}
