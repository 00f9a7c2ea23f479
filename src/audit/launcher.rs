//! The audit launcher: the one static background worker of the audit. It is
//! connected to no database (only the shared catalogs, to see which databases
//! exist) and starts writers ([`super::worker`]):
//! - per database (the default): a short-lived writer for each database with
//!   queued refusals, at most `pg_lease.audit_workers` at once, the least
//!   recently served first; a writer that cannot record is started again a
//!   second later; the records of a database that was dropped are discarded
//!   (counted as dropped, one LOG line);
//! - central (`pg_lease.database` set): one writer for that database, always.
//!
//! It reads pg_database with a heap scan (valid with no database, unlike
//! catalog index scans) and starts no writer for a database that is missing
//! or does not accept connections (`datallowconn` false: the writer would die
//! with a FATAL every second); that database's records wait, as a failing
//! database's do, and its status says why.
//!
//! With `pg_lease.audit_retention` on, it also starts a short retention-only
//! writer in every database that accepts connections, once a minute.

use super::shmem::{self, DestView, Phase, WorkerState, CENTRAL};
use super::worker::{in_transaction, RETENTION_EVERY, RETENTION_ONLY, RETRY_EVERY};
use crate::gucs;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The launcher's own pace when nothing wakes it.
const TICK: Duration = Duration::from_secs(1);
/// A writer registered by an earlier launcher that has not attached after
/// this long never will.
const STALE_LAUNCH_US: i64 = 30_000_000;

pub fn register() {
    BackgroundWorkerBuilder::new("pg_lease audit launcher")
        .set_type("pg_lease audit launcher")
        .set_library("pg_lease")
        .set_function("pg_lease_audit_launcher_main")
        .enable_spi_access()
        // Writes need a primary; a standby refuses no writes anyway.
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// `before_shmem_exit` callback: the launcher is gone.
extern "C-unwind" fn on_launcher_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    shmem::set_launcher(std::ptr::null_mut(), 0);
}

/// A writer this launcher registered.
struct Started {
    key: u32,
    retention_only: bool,
    handle: *mut pg_sys::BackgroundWorkerHandle,
}

#[derive(Default)]
struct Launcher {
    started: Vec<Started>,
    /// Destinations not to start a writer for before then.
    retry_at: HashMap<u32, Instant>,
    /// Databases still to visit in this retention round.
    retention_due: VecDeque<u32>,
    last_sweep: Option<Instant>,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_lease_audit_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the shared catalogs (pg_database) only.
    BackgroundWorker::connect_worker_to_spi(None, None);
    // SAFETY: registers a callback with a static function; MyProc is this
    // process's PGPROC (set for every background worker with shared memory
    // access) and its latch lives as long as the process.
    unsafe {
        pg_sys::before_shmem_exit(Some(on_launcher_exit), pg_sys::Datum::from(0));
        shmem::set_launcher(&raw mut (*pg_sys::MyProc).procLatch, crate::pg::my_pid());
    }
    match gucs::central_database() {
        Some(db) => log!(
            "pg_lease audit launcher started: refusals of every database are recorded in \"{db}\" (pg_lease.database)"
        ),
        None => log!("pg_lease audit launcher started: refusals are recorded in the database where they happen"),
    }
    let mut launcher = Launcher::default();
    loop {
        launcher.reap();
        launcher.serve();
        launcher.sweep_retention();
        let alive = BackgroundWorker::wait_latch(Some(TICK));
        if BackgroundWorker::sighup_received() {
            crate::pg::reload_config();
        }
        if !alive {
            break;
        }
    }
    launcher.report_unserved();
    shmem::set_launcher(std::ptr::null_mut(), 0);
    log!("pg_lease audit launcher stopped");
    // Exit code 0 would unregister it for good: a SIGTERM that is not a
    // server shutdown (pg_terminate_backend) would end the audit until the
    // next restart. With 1 the postmaster starts it again after 5 s, unless
    // it is shutting down.
    super::exit_process(1)
}

fn now() -> i64 {
    crate::pg::now()
}

impl Launcher {
    /// Forgets the writers that stopped; a destination whose writer stopped
    /// without recording is retried a second later.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.started.len() {
            let s = &self.started[i];
            let mut pid = 0;
            // SAFETY: `handle` came from RegisterDynamicBackgroundWorker and is
            // freed only below, after the worker stopped.
            let status = unsafe { pg_sys::GetBackgroundWorkerPid(s.handle, &mut pid) };
            if status != pg_sys::BgwHandleStatus::BGWH_STOPPED {
                i += 1;
                continue;
            }
            let s = self.started.swap_remove(i);
            // SAFETY: palloc'd in TopMemoryContext by `start`, removed from
            // `started` above, so freed once.
            unsafe { pg_sys::pfree(s.handle.cast()) };
            if s.retention_only {
                continue;
            }
            if let Some(d) = shmem::destination(s.key) {
                if d.worker == WorkerState::Launched {
                    // It never attached (could not start, or died first).
                    shmem::clear_launched(d.index);
                }
                if d.phase != Phase::Recording {
                    self.retry_at.insert(s.key, Instant::now() + RETRY_EVERY);
                }
            }
        }
    }

    fn running(&self, dests: &[DestView]) -> usize {
        dests.iter().filter(|d| d.worker != WorkerState::None).count()
            + self.started.iter().filter(|s| s.retention_only).count()
    }

    /// Starts writers for the destinations that need one.
    fn serve(&mut self) {
        let central = gucs::central_database();
        if let Some(name) = &central {
            // The central writer runs always, even with nothing queued.
            if shmem::destination(CENTRAL).is_none() {
                shmem::claim(CENTRAL, name);
            }
        }
        let dests = shmem::destinations();
        let now_ts = now();
        for d in &dests {
            let ours = self.started.iter().any(|s| s.key == d.key && !s.retention_only);
            if d.worker == WorkerState::Launched && !ours && now_ts - d.launched_at > STALE_LAUNCH_US {
                shmem::clear_launched(d.index);
            }
        }
        let mut running = self.running(&dests);
        let mut waiting: Vec<&DestView> = dests
            .iter()
            .filter(|d| d.worker == WorkerState::None)
            .filter(|d| if central.is_some() { d.key == CENTRAL } else { d.key != CENTRAL && d.queued > 0 })
            .filter(|d| self.retry_at.get(&d.key).is_none_or(|t| *t <= Instant::now()))
            .collect();
        if waiting.is_empty() {
            if let Some(s) = shmem::shared() {
                s.starved.store(false, Ordering::Release);
            }
            return;
        }
        waiting.sort_by_key(|d| d.launched_at);
        // One look at pg_database for all of them: a heap scan, which needs
        // no database (get_database_oid's index scan does).
        let databases = match in_transaction(databases) {
            Ok(dbs) => dbs,
            Err(e) => {
                log!("pg_lease audit launcher: could not read pg_database: {e}");
                return;
            }
        };
        let mut starved = false;
        let mut no_slot = false;
        for d in waiting {
            let found = match central.as_deref() {
                Some(name) => databases.iter().find(|db| db.name == name),
                None => databases.iter().find(|db| db.oid == d.key),
            };
            match found {
                None if central.is_some() => {
                    // audit_status says so; look again in a second.
                    self.retry_at.insert(d.key, Instant::now() + RETRY_EVERY);
                    continue;
                }
                None => {
                    let why = format!("database \"{}\" (OID {}) was dropped", d.name, d.key);
                    let (n, name) = shmem::discard(d.index, &why, now_ts);
                    if n > 0 {
                        log!(
                            "pg_lease audit launcher: discarded {n} queued refusal(s) of database \"{name}\" (OID {}), counted as dropped: the database was dropped",
                            d.key
                        );
                    }
                    continue;
                }
                Some(db) if !db.allow_connections => {
                    // A writer could not connect (it would die with a FATAL
                    // every second): none is started until it accepts
                    // connections; its records wait, as a failing
                    // database's do (per database: at most a quarter of the
                    // queue).
                    let note = format!(
                        "database \"{}\" is not currently accepting connections (ALLOW_CONNECTIONS false): no writer is started for it until ALTER DATABASE ... ALLOW_CONNECTIONS true",
                        db.name
                    );
                    if shmem::set_not_accepting(d.index, &note, now_ts) {
                        let bound = if central.is_some() {
                            "until the queue is full"
                        } else {
                            "at most a quarter of the queue"
                        };
                        log!(
                            "pg_lease audit launcher: database \"{}\" is not accepting connections: refusals for it stay queued ({bound}, then they count as dropped) and no writer is started until it does",
                            db.name
                        );
                    }
                    self.retry_at.insert(d.key, Instant::now() + RETRY_EVERY);
                    continue;
                }
                Some(_) => {}
            }
            if no_slot {
                continue;
            }
            if running >= gucs::AUDIT_WORKERS.get() as usize {
                // pg_lease.audit_workers writers run: it waits for its turn.
                shmem::set_waiting_turn(d.index, true, now_ts);
                starved = true;
                continue;
            }
            match start_writer(d.key, false, &d.name) {
                Some(handle) => {
                    self.started.push(Started { key: d.key, retention_only: false, handle });
                    shmem::set_launched(d.index, true, now_ts);
                    self.retry_at.remove(&d.key);
                    running += 1;
                }
                None => {
                    // Every background worker slot is taken (max_worker_processes).
                    shmem::set_launched(d.index, false, now_ts);
                    self.retry_at.insert(d.key, Instant::now() + RETRY_EVERY);
                    starved = true;
                    no_slot = true;
                }
            }
        }
        if let Some(s) = shmem::shared() {
            s.starved.store(starved, Ordering::Release);
        }
    }

    /// With `pg_lease.audit_retention` on, per database: a retention-only
    /// writer in every database that accepts connections, once a minute
    /// (the central writer applies it to the central table itself).
    fn sweep_retention(&mut self) {
        if gucs::AUDIT_RETENTION_MIN.get() == 0 || gucs::central_database().is_some() {
            self.retention_due.clear();
            self.last_sweep = None;
            return;
        }
        if self.last_sweep.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            self.last_sweep = Some(Instant::now());
            match in_transaction(connectable_databases) {
                Ok(dbs) => self.retention_due = dbs.into(),
                Err(e) => log!("pg_lease audit launcher: could not list databases for pg_lease.audit_retention: {e}"),
            }
        }
        while let Some(&db) = self.retention_due.front() {
            let dests = shmem::destinations();
            // A writer running there applies retention itself.
            if dests.iter().any(|d| d.key == db && d.worker != WorkerState::None) {
                self.retention_due.pop_front();
                continue;
            }
            if self.running(&dests) >= gucs::AUDIT_WORKERS.get() as usize {
                return;
            }
            let Some(handle) = start_writer(db, true, "") else { return };
            self.started.push(Started { key: db, retention_only: true, handle });
            self.retention_due.pop_front();
        }
    }

    /// At shutdown: the records of databases no writer was draining are lost
    /// with the shared memory; say so (each refusal is also in the log, as a
    /// `pg_lease rejected write` line, when `pg_lease.log_rejections` is on).
    fn report_unserved(&self) {
        for d in shmem::destinations() {
            if d.queued > 0 && d.worker != WorkerState::Running {
                log!(
                    "pg_lease audit launcher: shutting down with {} refusal(s) of database \"{}\" not recorded (no writer was running for it)",
                    d.queued,
                    d.name
                );
            }
        }
    }
}

/// A database, as pg_database says.
struct Db {
    oid: u32,
    name: String,
    allow_connections: bool,
    template: bool,
}

/// Every database, read by a heap scan of pg_database, as autovacuum's
/// get_database_list does: valid in a process connected to no database,
/// where catalog index scans are not (get_database_oid fails there with
/// "cannot read pg_class without having selected a database"). Call it in
/// a transaction (`in_transaction`): table_open needs one, and raises
/// otherwise.
fn databases() -> Vec<Db> {
    // SAFETY: pg_database is a shared catalog, opened and scanned as
    // autovacuum does, under AccessShareLock; the scan and relation are
    // closed below (an error in between aborts the transaction, which
    // releases both).
    let (rel, scan) = unsafe {
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        (rel, pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut()))
    };
    let mut dbs = Vec::new();
    loop {
        // SAFETY: `scan` is open; the tuple returned stays valid until the next call.
        let tuple = unsafe { pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection) };
        if tuple.is_null() {
            break;
        }
        // SAFETY: a pg_database tuple's fixed part is a FormData_pg_database,
        // whose datname is a NUL-terminated NameData.
        let (form, name) = unsafe {
            let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
            (form, std::ffi::CStr::from_ptr(form.datname.data.as_ptr()).to_string_lossy().into_owned())
        };
        dbs.push(Db {
            oid: form.oid.to_u32(),
            name,
            allow_connections: form.datallowconn,
            template: form.datistemplate,
        });
    }
    // SAFETY: closes what was opened above, once.
    unsafe {
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    }
    dbs
}

/// The databases a retention writer may visit: those that accept connections
/// and are not templates (a connection to a template would make CREATE
/// DATABASE fail).
fn connectable_databases() -> Vec<u32> {
    databases().into_iter().filter(|db| db.allow_connections && !db.template).map(|db| db.oid).collect()
}

/// Registers a writer for destination `key`; None when no background worker
/// slot is free.
fn start_writer(key: u32, retention_only: bool, name: &str) -> Option<*mut pg_sys::BackgroundWorkerHandle> {
    let what = if retention_only { "retention" } else { "writer" };
    let title =
        if name.is_empty() { format!("pg_lease audit {what} {key}") } else { format!("pg_lease audit {what} {name}") };
    let builder = BackgroundWorkerBuilder::new(&title)
        .set_type("pg_lease audit writer")
        .set_library("pg_lease")
        .set_function("pg_lease_audit_writer_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .set_argument(Some(pg_sys::Datum::from(key as u64 | if retention_only { RETENTION_ONLY } else { 0 })))
        .set_notify_pid(crate::pg::my_pid());
    let mut worker: pg_sys::BackgroundWorker = (&builder).into();
    let mut handle: *mut pg_sys::BackgroundWorkerHandle = std::ptr::null_mut();
    // The handle lives until the writer stops (freed in reap), whatever
    // memory context is current.
    // SAFETY: `worker` is a complete registration built by pgrx's builder;
    // the handle is allocated in TopMemoryContext (restored right after).
    let registered = unsafe {
        let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
        let ok = pg_sys::RegisterDynamicBackgroundWorker(&mut worker, &mut handle);
        pg_sys::MemoryContextSwitchTo(old);
        ok
    };
    registered.then_some(handle)
}
