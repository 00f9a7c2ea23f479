//! Test support: a database per test in the scratch cluster that `make test`
//! starts (port in `PG_LEASE_TEST_PORT`), and small helpers over `postgres`.

use postgres::{Client, NoTls};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use postgres;

pub fn port() -> u16 {
    std::env::var("PG_LEASE_TEST_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .expect("PG_LEASE_TEST_PORT is set by `make test` (scripts/test.sh)")
}

pub fn connect_to(dbname: &str, user: &str) -> Client {
    let conn = format!("host=127.0.0.1 port={} user={user} dbname={dbname} application_name=pg_lease_tests", port());
    Client::connect(&conn, NoTls).unwrap_or_else(|e| panic!("connect to {dbname} as {user}: {e}"))
}

/// A fresh database with pg_lease installed, dropped again on drop.
pub struct TestDb {
    pub name: String,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl TestDb {
    pub fn new(label: &str) -> TestDb {
        Self::with_options(label, "")
    }

    /// Same, created with `CREATE DATABASE <name> <options>` (e.g. an encoding).
    pub fn with_options(label: &str, options: &str) -> TestDb {
        let name = format!("t_{label}_{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
        let mut admin = connect_to("postgres", "postgres");
        admin.batch_execute(&format!("CREATE DATABASE {name} {options}")).unwrap();
        let db = TestDb { name };
        db.connect().batch_execute("CREATE EXTENSION pg_lease").unwrap();
        db
    }

    pub fn connect(&self) -> Client {
        connect_to(&self.name, "postgres")
    }

    pub fn connect_as(&self, user: &str) -> Client {
        connect_to(&self.name, user)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) =
            Client::connect(&format!("host=127.0.0.1 port={} user=postgres dbname=postgres", port()), NoTls)
        {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}

/// The SQLSTATE of a failed statement ("" when it succeeded).
pub fn sqlstate<T>(r: &Result<T, postgres::Error>) -> String {
    match r {
        Ok(_) => String::new(),
        Err(e) => e.code().map(|c| c.code().to_owned()).unwrap_or_else(|| format!("no sqlstate: {e}")),
    }
}

/// What running `sql` failed with, None when it ran: [SQLSTATE, message]
/// (a failure without one: ["no sqlstate: ...", ""]).
pub fn failure(c: &mut Client, sql: &str) -> Option<[String; 2]> {
    c.batch_execute(sql).err().map(|e| match e.as_db_error() {
        Some(db) => [db.code().code().to_owned(), db.message().to_owned()],
        None => [format!("no sqlstate: {e}"), String::new()],
    })
}

/// Runs `sql`, which must succeed.
#[track_caller]
pub fn must_run(c: &mut Client, sql: &str) {
    if let Some(r) = failure(c, sql) {
        panic!("{sql}\nfailed: {r:?}");
    }
}

/// Runs `sql`, which must fail: [SQLSTATE, message].
#[track_caller]
pub fn must_fail(c: &mut Client, sql: &str) -> [String; 2] {
    failure(c, sql).unwrap_or_else(|| panic!("expected an error from: {sql}"))
}

/// A database of its own made with `options` (`ENCODING ...`), then `setup` run in it.
#[track_caller]
pub fn db_with(label: &str, options: &str, setup: &str) -> (TestDb, Client) {
    let db = TestDb::with_options(label, options);
    let mut c = db.connect();
    must_run(&mut c, setup);
    (db, c)
}

/// Runs `sql` and returns its SQLSTATE ("" on success).
pub fn try_sql(c: &mut Client, sql: &str) -> String {
    sqlstate(&c.batch_execute(sql))
}

/// Asserts `sql` fails with `code`, returning the error message and detail.
#[track_caller]
pub fn expect_error(c: &mut Client, sql: &str, code: &str) -> String {
    match c.batch_execute(sql) {
        Ok(()) => panic!("expected {code} from: {sql}\nbut it succeeded"),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("expected {code}, got non-db error {e}"));
            assert_eq!(db.code().code(), code, "SQLSTATE for: {sql}\nmessage: {}", db.message());
            format!("{} | {}", db.message(), db.detail().unwrap_or(""))
        }
    }
}

pub fn one_i64(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

/// The test cluster's `server_version_num` (150007, 180001, ...), for tests
/// of features an older major lacks.
pub fn server_version_num() -> i64 {
    one_i64(&mut connect_to("postgres", "postgres"), "SELECT current_setting('server_version_num')::bigint")
}

/// Polls `check` (an observation of another process's state, not a sleep
/// standing in for one) every 20 ms until it holds or `timeout` has passed;
/// whether it held.
pub fn poll_until(timeout: std::time::Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// [`poll_until`] that fails the test, naming `what`, when `timeout` passes;
/// how long it took.
#[track_caller]
pub fn wait_for(what: &str, timeout: std::time::Duration, check: impl FnMut() -> bool) -> std::time::Duration {
    let start = std::time::Instant::now();
    assert!(poll_until(timeout, check), "timed out after {timeout:?} waiting for {what}");
    start.elapsed()
}

/// Whether the server is PostgreSQL `major` or later; prints why a test is
/// not run when it is not.
pub fn at_least(major: i64, what: &str) -> bool {
    let ok = server_version_num() >= major * 10_000;
    if !ok {
        println!("not run: {what} needs PostgreSQL {major}");
    }
    ok
}

/// `lease.acquire('table:<id>', owner, 60 s, 'tables', '{<id>}')` ([`POKER`]'s
/// owner table): the token.
pub fn acquire_table(c: &mut Client, id: i32, owner: &str) -> i64 {
    c.query_one(&format!("SELECT token FROM lease.acquire('table:{id}', '{owner}', 60000, 'tables', '{{{id}}}')"), &[])
        .unwrap()
        .get(0)
}

/// Commits mark `n` into the publisher's `marks (n int)` (published to `s`)
/// and waits until the subscriber has it (everything committed before it
/// applied), or until `subscriber`'s log has `failure` (then false).
pub fn mark_applied(p: &mut Client, s: &mut Client, subscriber: &Cluster, n: i32, failure: &str) -> bool {
    p.batch_execute(&format!("INSERT INTO marks VALUES ({n})")).unwrap();
    let mut arrived = false;
    wait_for("the mark, or the apply worker's failure", std::time::Duration::from_secs(60), || {
        arrived = one_i64(s, &format!("SELECT count(*) FROM marks WHERE n = {n}")) == 1;
        arrived || subscriber.log_has(failure)
    });
    arrived
}

/// Disables and drops subscription `name` (a test's cleanup: failures ignored).
pub fn drop_subscription(s: &mut Client, name: &str) {
    s.batch_execute(&format!("ALTER SUBSCRIPTION {name} DISABLE")).ok();
    s.batch_execute(&format!("DROP SUBSCRIPTION {name}")).ok();
}

/// The work one SQL command does, as the tuples it reads from tables and
/// catalogs (sequential reads and index fetches, `pg_stat_xact_all_tables`):
/// the fewest of three runs, each rolled back (the first may fill caches).
/// Unlike its time this count is the same on an idle and on a loaded
/// machine, so cost tests compare it, with a reference command's, instead of
/// timing either (timings belong to `make bench`).
pub fn tuples_read(c: &mut Client, sql: &str) -> i64 {
    const READ: &str = "SELECT sum(seq_tup_read + idx_tup_fetch)::bigint FROM pg_stat_xact_all_tables";
    (0..3)
        .map(|_| {
            must_run(c, "BEGIN");
            let before = one_i64(c, READ);
            must_run(c, sql);
            let after = one_i64(c, READ);
            must_run(c, "ROLLBACK");
            after - before
        })
        .min()
        .unwrap()
}

/// The poker schema from the incident: owner rows in `tables`, fenced `payouts`.
pub const POKER: &str = "
    CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE balances (player text PRIMARY KEY, chips bigint NOT NULL);
    CREATE TABLE payouts (
        id bigserial PRIMARY KEY,
        table_id int NOT NULL,
        hand int NOT NULL DEFAULT 0,
        player text NOT NULL DEFAULT 'house',
        amount bigint NOT NULL DEFAULT 0,
        fencing_token bigint
    );
    SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
    INSERT INTO tables VALUES (1, 5), (2, 5);
";

/// A cluster of its own, for tests that restart, crash or fail over a server.
/// Managed through scripts/cluster.sh; stopped on drop.
pub struct Cluster {
    pub name: String,
    pub port: u16,
    /// The pg_config whose binaries run it; `None`: the suite's (`$PG_CONFIG`).
    pub pg_config: Option<String>,
}

/// The suite's pg_config: `$PG_CONFIG` (scripts/test.sh sets it to the chosen
/// major's), else the one on PATH.
pub fn pg_config() -> String {
    std::env::var("PG_CONFIG").unwrap_or_else(|_| "pg_config".to_owned())
}

/// The path of a PostgreSQL program (`pg_dump`, `psql`...) of the given
/// pg_config's installation.
pub fn pg_bin_of(pg_config: &str, program: &str) -> std::path::PathBuf {
    let out = std::process::Command::new(pg_config)
        .arg("--bindir")
        .output()
        .unwrap_or_else(|e| panic!("running {pg_config} --bindir: {e}"));
    assert!(out.status.success(), "{pg_config} --bindir failed");
    std::path::Path::new(String::from_utf8_lossy(&out.stdout).trim()).join(program)
}

/// The path of a program of the suite's PostgreSQL (see [`pg_config`]).
pub fn pg_bin(program: &str) -> std::path::PathBuf {
    pg_bin_of(&pg_config(), program)
}

/// Runs a PostgreSQL client program of the suite's installation (pg_dump,
/// pg_restore, ...) and returns its stdout; panics with its output unless
/// it succeeds.
pub fn run_client(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(pg_bin(program)).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Added to every [`Cluster`] port, so that two checkouts can run their
/// suites on one machine at once (`PG_LEASE_PORT_OFFSET`, default 0). An
/// offset such as 6600 also lifts the ports above Linux's ephemeral range
/// (32768-60999), where a busy machine's client sockets can hold them.
pub fn port_offset() -> u16 {
    std::env::var("PG_LEASE_PORT_OFFSET").ok().and_then(|p| p.parse().ok()).unwrap_or(0)
}

/// scripts/cluster.sh, run with the binaries of `pg_config` (else the suite's).
fn cluster_sh_command(pg_config: Option<&str>, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/cluster.sh"));
    command.args(args);
    if let Some(pg_config) = pg_config {
        command.env("PG_CONFIG", pg_config);
    }
    command
}

fn cluster_sh(pg_config: Option<&str>, args: &[&str]) {
    let status =
        cluster_sh_command(pg_config, args).status().unwrap_or_else(|e| panic!("running cluster.sh {args:?}: {e}"));
    assert!(status.success(), "cluster.sh {args:?} failed");
}

impl Cluster {
    /// A fresh primary with pg_lease preloaded. `port` must be unique per test.
    pub fn start(name: &str, port: u16) -> Cluster {
        Self::start_with(name, port, &[])
    }

    /// Same, with extra postgresql.conf lines (later lines win).
    pub fn start_with(name: &str, port: u16, conf: &[&str]) -> Cluster {
        Self::start_on(None, name, port, conf)
    }

    /// Same, on the PostgreSQL of `pg_config` (`None`: the suite's).
    pub fn start_on(pg_config: Option<&str>, name: &str, port: u16, conf: &[&str]) -> Cluster {
        let port = port + port_offset();
        let port_s = port.to_string();
        let mut args = vec!["start", name, &port_s];
        args.extend_from_slice(conf);
        cluster_sh(pg_config, &args);
        Cluster { name: name.to_owned(), port, pg_config: pg_config.map(str::to_owned) }
    }

    /// A fresh primary of the suite's PostgreSQL whose server runs with the
    /// environment variables `env` set (or removed, for a value of None) on
    /// top of the suite's.
    pub fn start_with_env(name: &str, port: u16, conf: &[&str], env: &[(&str, Option<&str>)]) -> Cluster {
        let port = port + port_offset();
        let port_s = port.to_string();
        let mut args = vec!["start", name, &port_s];
        args.extend_from_slice(conf);
        let mut command = cluster_sh_command(None, &args);
        for (key, value) in env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let status = command.status().unwrap_or_else(|e| panic!("running cluster.sh {args:?}: {e}"));
        assert!(status.success(), "cluster.sh {args:?} failed");
        Cluster { name: name.to_owned(), port, pg_config: None }
    }

    /// A new cluster of the suite's PostgreSQL made from the stopped cluster
    /// `old` by pg_upgrade (initdb'd with `initdb_args`, then upgraded and started).
    pub fn pg_upgrade(old: &Cluster, name: &str, port: u16, initdb_args: &str) -> Cluster {
        let port = port + port_offset();
        let port_s = port.to_string();
        let status = cluster_sh_command(None, &["init", name, &port_s])
            .env("PG_LEASE_INITDB_ARGS", initdb_args)
            .status()
            .unwrap_or_else(|e| panic!("running cluster.sh init: {e}"));
        assert!(status.success(), "cluster.sh init {name} failed");
        let new = Cluster { name: name.to_owned(), port, pg_config: None };
        let old_pg_config = old.pg_config.clone().unwrap_or_else(pg_config);
        cluster_sh(None, &["upgrade", name, &old.name, &old_pg_config]);
        new
    }

    /// The server log, for tests that check what reached it.
    pub fn server_log(&self) -> String {
        let root = std::env::var("PG_LEASE_SCRATCH").unwrap_or_else(|_| "/var/tmp/pg_lease".to_owned());
        // Lines of databases in other encodings than UTF-8 hold their bytes.
        std::fs::read(format!("{root}/{}/server.log", self.name))
            .map(|log| String::from_utf8_lossy(&log).into_owned())
            .unwrap_or_default()
    }

    /// Whether a line of the server log contains `needle`.
    pub fn log_has(&self, needle: &str) -> bool {
        self.server_log().lines().any(|l| l.contains(needle))
    }

    /// A libpq connection string for `postgres` on this cluster over TCP
    /// (what a subscription's `CONNECTION` needs).
    pub fn conninfo(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// A connection that also collects the notices and warnings it receives.
    pub fn connect_collecting_notices(&self) -> (Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = notices.clone();
        let client = postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .notice_callback(move |n| sink.lock().unwrap().push(format!("{}: {}", n.severity(), n.message())))
            .connect(NoTls)
            .unwrap();
        (client, notices)
    }

    /// A streaming standby of `primary` (asynchronous, via pg_basebackup -R).
    pub fn standby_of(primary: &Cluster, name: &str, port: u16) -> Cluster {
        let port = port + port_offset();
        let pg_config = primary.pg_config.as_deref();
        cluster_sh(pg_config, &["standby", name, &port.to_string(), &primary.port.to_string()]);
        Cluster { name: name.to_owned(), port, pg_config: pg_config.map(str::to_owned) }
    }

    pub fn connect(&self) -> Client {
        self.connect_db("postgres")
    }

    /// A connection to another database of this cluster.
    pub fn connect_db(&self, dbname: &str) -> Client {
        let conn = format!("host=127.0.0.1 port={} user=postgres dbname={dbname}", self.port);
        let start = std::time::Instant::now();
        loop {
            match Client::connect(&conn, NoTls) {
                Ok(c) => return c,
                Err(e) if start.elapsed() < std::time::Duration::from_secs(30) => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => panic!("connect to cluster {}: {e}", self.name),
            }
        }
    }

    pub fn stop(&self) {
        self.cluster_sh("stop");
    }
    pub fn crash(&self) {
        self.cluster_sh("crash");
    }
    pub fn kill9(&self) {
        self.cluster_sh("kill9");
    }
    pub fn restart(&self) {
        self.cluster_sh("restart");
    }
    pub fn promote(&self) {
        self.cluster_sh("promote");
    }

    fn cluster_sh(&self, command: &str) {
        cluster_sh(self.pg_config.as_deref(), &[command, &self.name]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = cluster_sh_command(self.pg_config.as_deref(), &["stop", &self.name]).status();
    }
}

/// The backend process ID of `c`'s session.
pub fn backend_pid(c: &mut Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Waits (up to 20 s) until backend `pid` is blocked on a lock, so that a
/// race a test sets up is really a race.
pub fn wait_until_blocked(observer: &mut Client, pid: i32) {
    let start = std::time::Instant::now();
    loop {
        let row = observer.query_opt("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap();
        if row.is_some_and(|r| r.get::<_, Option<String>>(0).as_deref() == Some("Lock")) {
            return;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "backend {pid} never blocked");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `pg_dump --schema-only` of database `from` on `from_port`, restored into
/// database `into` on `into_port` (psql, stopping at the first error).
pub fn schema_only_copy(from_port: u16, from: &str, into_port: u16, into: &str) {
    let dump = std::process::Command::new(pg_bin("pg_dump"))
        .args(["-h", "127.0.0.1", "-p", &from_port.to_string(), "-U", "postgres", "--schema-only", from])
        .output()
        .expect("pg_dump");
    assert!(dump.status.success(), "pg_dump: {}", String::from_utf8_lossy(&dump.stderr));
    let mut psql = std::process::Command::new(pg_bin("psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &into_port.to_string(), "-U", "postgres"])
        .arg(into)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    use std::io::Write;
    psql.stdin.take().unwrap().write_all(&dump.stdout).unwrap();
    let out = psql.wait_with_output().unwrap();
    assert!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
}

/// Whether amcheck can be used in `c`'s database, creating it there when it
/// is available and not yet created. PostgreSQL 15 from Debian ships it; the
/// PostgreSQL 18 built from source for these tests has no contrib modules,
/// so callers skip their amcheck steps there (their other checks still run).
pub fn amcheck(c: &mut Client) -> bool {
    if one_i64(c, "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'amcheck'") == 1 {
        return true;
    }
    if one_i64(c, "SELECT count(*) FROM pg_catalog.pg_available_extensions WHERE name = 'amcheck'") == 0 {
        return false;
    }
    c.batch_execute("CREATE EXTENSION amcheck").unwrap();
    true
}

/// amcheck (`bt_index_check` with heapallindexed) on every index of
/// `lease.lease_state` where amcheck is installed in `c`'s database (see
/// [`amcheck`]): the number of indexes checked (0 without amcheck), or the
/// first failure.
pub fn lease_state_amcheck(c: &mut Client) -> Result<i64, String> {
    // (Asked first: without amcheck the check's query does not even parse.)
    if one_i64(c, "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'amcheck'") == 0 {
        return Ok(0);
    }
    c.query_one(
        "SELECT count(bt_index_check(i.indexrelid, true)) FROM pg_catalog.pg_index i
          WHERE i.indrelid = 'lease.lease_state'::regclass",
        &[],
    )
    .map(|r| r.get(0))
    .map_err(|e| format!("amcheck of lease.lease_state's indexes: {e}"))
}

/// [`lease_state_amcheck`] (amcheck created first where available), then
/// every row of `lease.lease_state` reachable through its primary key and
/// every live row (no released one) through its owner index, by index
/// scans; panics naming what failed.
pub fn check_lease_state_indexes(c: &mut Client) {
    amcheck(c);
    lease_state_amcheck(c).unwrap_or_else(|e| panic!("{e}"));
    let heap = one_i64(c, "SELECT count(*) FROM ONLY lease.lease_state");
    let live = one_i64(c, "SELECT count(*) FROM ONLY lease.lease_state WHERE released_at IS NULL");
    c.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off").unwrap();
    let by_pkey = one_i64(
        c,
        "SELECT count(*) FROM ONLY lease.lease_state l WHERE l.name IN (SELECT name FROM ONLY lease.lease_state)",
    );
    let by_owner = one_i64(
        c,
        "SELECT count(*) FROM ONLY lease.lease_state WHERE owner IN (SELECT owner FROM ONLY lease.lease_state) AND released_at IS NULL",
    );
    c.batch_execute("RESET enable_seqscan; RESET enable_bitmapscan").unwrap();
    assert_eq!(by_pkey, heap, "rows through lease_state_pkey");
    assert_eq!(by_owner, live, "live rows through lease_state_owner");
}

/// Runs `script` with psql in database `db` as `user`, client encoding
/// `encoding` (a MULE_INTERNAL database takes no UTF-8 client: PostgreSQL
/// has no conversion between them); (stdout, stderr).
pub fn psql(db: &str, user: &str, encoding: &str, script: impl AsRef<[u8]>) -> (String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(pg_bin("psql"))
        .args(["-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", &port().to_string(), "-U", user, "-d", db])
        .env("PGCLIENTENCODING", encoding)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    child.stdin.take().expect("stdin").write_all(script.as_ref()).expect("script");
    let out = child.wait_with_output().expect("psql");
    (String::from_utf8_lossy(&out.stdout).trim().to_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A real PgBouncer (Debian's package, run as postgres) in transaction mode
/// in front of the test cluster, with `pool_size` server connections per
/// database and user; stopped through its pid file when dropped.
pub struct Bouncer {
    dir: std::path::PathBuf,
    listen: u16,
}

impl Bouncer {
    pub fn start(listen: u16, pool_size: u32) -> Bouncer {
        let dir = std::env::temp_dir().join(format!("pg_lease_bouncer_{}_{listen}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\n\
                 unix_socket_dir =\nauth_type = trust\nauth_file = {d}/userlist.txt\npool_mode = transaction\n\
                 default_pool_size = {pool_size}\nmin_pool_size = 0\nmax_client_conn = 100\nserver_reset_query =\n\
                 ignore_startup_parameters = extra_float_digits,options\nlogfile = {d}/pgbouncer.log\n\
                 pidfile = {d}/pgbouncer.pid\n",
                port(),
                d = dir.display()
            ),
        )
        .unwrap();
        std::process::Command::new("chown").args(["-R", "postgres:"]).arg(&dir).status().unwrap();
        // PgBouncer refuses to run as root; -d: daemon, writes its pid file.
        let status = std::process::Command::new("sudo")
            .args(["-u", "postgres", "pgbouncer", "-d"])
            .arg(dir.join("pgbouncer.ini"))
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pgbouncer (Debian package pgbouncer, installed by scripts/setup.sh)");
        assert!(status.success(), "pgbouncer did not start");
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", listen)).is_err() {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "pgbouncer did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Bouncer { dir, listen }
    }

    pub fn connect(&self, dbname: &str) -> Client {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(self.listen)
            .user("postgres")
            .dbname(dbname)
            .connect(postgres::NoTls)
            .expect("connect through pgbouncer")
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let pid = pid.trim().to_owned();
            let _ = std::process::Command::new("kill").arg(&pid).status();
            let start = std::time::Instant::now();
            while std::path::Path::new(&format!("/proc/{pid}")).exists()
                && start.elapsed() < std::time::Duration::from_secs(5)
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (30 s at most) until `standby` has replayed everything `primary` has written so far.
pub fn wait_for_replay(primary: &mut Client, standby: &mut Client) {
    let target: String = primary.query_one("SELECT pg_current_wal_lsn()::text", &[]).unwrap().get(0);
    let start = std::time::Instant::now();
    loop {
        let caught_up: bool =
            standby.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&target]).unwrap().get(0);
        if caught_up {
            return;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "standby never caught up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A login role of its own for one test, with README's migrator grants
/// (`grant`), dropped on drop (after the test's database: declare it first).
pub struct MigratorRole(pub String);

impl MigratorRole {
    pub fn new(name: &str) -> MigratorRole {
        let name = format!("{name}_{}", std::process::id());
        let mut admin = connect_to("postgres", "postgres");
        admin.batch_execute(&format!("DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN")).unwrap();
        MigratorRole(name)
    }

    /// README's migrator grants in `c`'s database.
    pub fn grant(&self, c: &mut Client) {
        must_run(
            c,
            &format!(
                "GRANT CREATE ON SCHEMA public TO {0};
                 GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
                     lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass) TO {0};",
                self.0
            ),
        );
    }
}

impl Drop for MigratorRole {
    fn drop(&mut self) {
        let _ = connect_to("postgres", "postgres").batch_execute(&format!("DROP ROLE IF EXISTS {}", self.0));
    }
}
