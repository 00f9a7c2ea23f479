//! The audit worker: drains the shared-memory queue into
//! `lease.rejected_writes` of `pg_lease.database`, in batches, each in its own
//! transaction; applies retention; drains once more on a clean shutdown.
//!
//! No record can stop it. A batch whose insert fails is told apart:
//! - if the table takes no row at all (a probe row, inserted in a
//!   subtransaction that is always rolled back, fails too), or the error is
//!   of a kind no record causes (lock timeout, disk full, read-only, a changed
//!   table...), the worker is *failing*: records stay queued (counted as
//!   dropped only once the queue is full, as always), the error goes to
//!   `lease.audit_status()` and, once per distinct error, to the log, and the
//!   worker retries every second;
//! - otherwise the batch is written record by record, each in its own
//!   subtransaction (as PL/pgSQL's exception blocks do): a record that still
//!   fails is counted as dropped, with one LOG line saying why, and the others
//!   are recorded.

use super::sanitize::without_nul;
use super::shmem::{self, AuditRecord, Phase};
use crate::errors::LeaseError;
use crate::gucs;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

const BATCH: usize = 512;
const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// How often the worker retries while it cannot record (or waits for the
/// extension), whatever `pg_lease.audit_flush_ms` says.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How often an idle, recording worker checks the audit table is still there.
const IDLE_CHECK_EVERY: Duration = Duration::from_secs(5);
/// The worker never waits longer than this for a lock on the audit table
/// (it would look like it records while it does not).
const LOCK_TIMEOUT: &CStr = c"5s";

pub fn register() {
    BackgroundWorkerBuilder::new("pg_lease audit worker")
        .set_type("pg_lease audit")
        .set_library("pg_lease")
        .set_function("pg_lease_audit_worker_main")
        .enable_spi_access()
        // Writes need a primary; a standby refuses no writes anyway.
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

static mut PREV_EMIT_LOG_HOOK: pg_sys::emit_log_hook_type = None;

/// In the worker only: an error that ends the worker (it cannot connect, or
/// something escaped) is what `lease.audit_status()` shows until a later
/// write succeeds.
unsafe extern "C-unwind" fn on_worker_log(edata: *mut pg_sys::ErrorData) {
    // A missing database is not kept: audit_status sees it for itself, and
    // stops saying so as soon as the database exists.
    let missing_database = PgSqlErrorCode::ERRCODE_INVALID_CATALOG_NAME as isize as i32;
    if !edata.is_null()
        && (*edata).elevel >= pg_sys::PGERROR as i32
        && (*edata).sqlerrcode != missing_database
        && !(*edata).message.is_null()
    {
        let message = CStr::from_ptr((*edata).message).to_string_lossy();
        shmem::set_last_error(Some(&message), pg_sys::GetCurrentTimestamp());
    }
    if let Some(prev) = PREV_EMIT_LOG_HOOK {
        prev(edata);
    }
}

/// However the worker exits, it no longer claims to be running.
unsafe extern "C-unwind" fn on_worker_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    shmem::set_worker(std::ptr::null_mut(), 0);
    shmem::set_phase(Phase::Stopped);
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_lease_audit_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    unsafe {
        pg_sys::before_shmem_exit(Some(on_worker_exit), pg_sys::Datum::from(0));
        PREV_EMIT_LOG_HOOK = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(on_worker_log);
    }
    shmem::set_phase(Phase::Connecting);
    let database = gucs::database();
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    unsafe {
        for (name, value) in [
            (c"lock_timeout", LOCK_TIMEOUT),
            // Nothing a role created in the audit database resolves the
            // worker's (superuser) statements.
            (c"search_path", c"pg_catalog, pg_temp"),
        ] {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_OVERRIDE,
            );
        }
        shmem::set_worker(&raw mut (*pg_sys::MyProc).procLatch, pg_sys::MyProcPid);
    }
    log!("pg_lease audit worker started: recording refusals in database \"{database}\"");

    let mut worker = Worker::new(database);
    let mut last_retention: Option<Instant> = None;
    loop {
        let flush = Duration::from_millis(gucs::AUDIT_FLUSH_MS.get() as u64);
        let wait = if shmem::phase() == Phase::Recording { flush } else { flush.max(RETRY_EVERY) };
        let alive = BackgroundWorker::wait_latch(Some(wait));
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        worker.drain();
        if gucs::AUDIT_RETENTION_MIN.get() > 0 && last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            apply_retention();
            last_retention = Some(Instant::now());
        }
        if !alive {
            break;
        }
    }
    shmem::set_worker(std::ptr::null_mut(), 0);
    shmem::set_phase(Phase::Stopped);
    log!("pg_lease audit worker stopped");
    // Exit code 0 would unregister the worker for good: a SIGTERM that is not
    // a server shutdown (pg_terminate_backend) would end the audit until the
    // next restart. With 1 the postmaster starts it again after 5 s, unless
    // it is shutting down.
    unsafe { pg_sys::proc_exit(1) };
}

/// An error caught in the worker: its SQLSTATE and message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Failure {
    sqlstate: String,
    message: String,
}

impl Failure {
    fn from_caught(e: CaughtError) -> Failure {
        let report = match &e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) | CaughtError::RustPanic { ereport: r, .. } => {
                r
            }
        };
        let code = report.sql_error_code() as isize as i32;
        let sqlstate = (0..5).map(|i| (((code >> (6 * i)) & 0x3F) as u8 + b'0') as char).collect();
        Failure { sqlstate, message: report.message().to_owned() }
    }

    /// Errors that come from the state of the server or of the audit table,
    /// never from the values of one record: retrying record by record would
    /// only drop good records.
    fn is_environmental(&self) -> bool {
        // 08 connection, 25 transaction state (read only), 40 serialization or
        // deadlock, 42 undefined/changed objects or privileges, 53 resources
        // (disk full, memory), 55 lock not available, 57 operator intervention
        // (cancel, shutdown), 58 system (I/O).
        ["08", "25", "40", "42", "53", "55", "57", "58"].iter().any(|class| self.sqlstate.starts_with(class))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.sqlstate)
    }
}

/// Runs `f`, turning a Postgres error or a Rust panic into a [`Failure`].
/// The caller rolls back what `f` did when it fails.
fn catch<R>(f: impl FnOnce() -> R) -> Result<R, Failure> {
    PgTryBuilder::new(AssertUnwindSafe(|| Ok(f()))).catch_others(|e| Err(Failure::from_caught(e))).execute()
}

/// Runs `f` in a transaction of its own: committed if `f` returns, rolled
/// back (and the error returned) if it or the commit fails.
fn in_transaction<R>(f: impl FnOnce() -> R) -> Result<R, Failure> {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = catch(f).and_then(|r| {
        catch(|| unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        })
        .map(|()| r)
    });
    if result.is_err() {
        unsafe { pg_sys::AbortCurrentTransaction() };
    }
    result
}

/// Runs `f` in a subtransaction, as PL/pgSQL's exception blocks do: kept if
/// `f` returns and `keep` is true, rolled back otherwise. An error inside it
/// rolls back only what `f` did.
fn in_subtransaction<R>(keep: bool, f: impl FnOnce() -> R) -> Result<R, Failure> {
    unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let result = catch(f);
        if result.is_ok() && keep {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
        result
    }
}

fn audit_table_exists() -> bool {
    Spi::get_one::<bool>("SELECT pg_catalog.to_regclass('lease.rejected_writes') IS NOT NULL")
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Whether the audit table takes a row at all: a plain record, inserted in
/// a subtransaction that is always rolled back.
fn probe() -> Result<(), Failure> {
    let mut record = AuditRecord::EMPTY;
    record.rejected_at = unsafe { pg_sys::GetCurrentTimestamp() };
    record.sqlstate.copy_from_slice(LeaseError::StaleOwnerBoundaryWrite.sqlstate().as_bytes());
    record.database.set(&gucs::database());
    record.target_table.set("lease.rejected_writes");
    record.operation.set("INSERT");
    in_subtransaction(false, || insert(std::slice::from_ref(&record)))
}

/// What one attempt at the oldest queued records came to.
enum Written {
    /// The first `n` records are done with; `dropped` lists those among them
    /// that could not be written (index, why).
    Done { n: usize, dropped: Vec<(usize, Failure)> },
    /// `lease.rejected_writes` does not exist (yet) in the audit database.
    NoTable,
    /// Nothing can be written now.
    Failed(Failure),
}

fn write(batch: &[AuditRecord]) -> Written {
    let attempt = in_transaction(|| {
        if !audit_table_exists() {
            return Written::NoTable;
        }
        let error = match in_subtransaction(true, || insert(batch)) {
            Ok(()) => return Written::Done { n: batch.len(), dropped: Vec::new() },
            Err(e) => e,
        };
        if error.is_environmental() {
            return Written::Failed(error);
        }
        if probe().is_err() {
            // The table takes no row at all: no record is to blame.
            return Written::Failed(error);
        }
        let mut dropped = Vec::new();
        for (i, record) in batch.iter().enumerate() {
            if let Err(e) = in_subtransaction(true, || insert(std::slice::from_ref(record))) {
                if e.is_environmental() {
                    // Keep what is written, stop before this record.
                    return if i == 0 { Written::Failed(e) } else { Written::Done { n: i, dropped } };
                }
                dropped.push((i, e));
            }
        }
        Written::Done { n: batch.len(), dropped }
    });
    attempt.unwrap_or_else(Written::Failed)
}

struct Worker {
    database: String,
    batch: Vec<AuditRecord>,
    /// The failure last logged, so a persisting one is logged once.
    logged_failure: Option<Failure>,
    warned_missing: bool,
    last_check: Option<Instant>,
}

impl Worker {
    fn new(database: String) -> Worker {
        Worker {
            database,
            batch: Vec::with_capacity(BATCH),
            logged_failure: None,
            warned_missing: false,
            last_check: None,
        }
    }

    /// Writes queued records until the queue is empty or nothing can be
    /// written; with nothing queued, checks that recording would work.
    fn drain(&mut self) {
        let mut wrote = false;
        loop {
            shmem::peek(BATCH, &mut self.batch);
            if self.batch.is_empty() {
                break;
            }
            match write(&self.batch) {
                Written::Done { n, dropped } => {
                    let now = unsafe { pg_sys::GetCurrentTimestamp() };
                    shmem::commit_recorded(n, dropped.len(), now);
                    for (i, why) in &dropped {
                        self.report_drop(&self.batch[*i], why, now);
                    }
                    self.recording();
                    wrote = true;
                }
                Written::NoTable => return self.waiting_for_extension(),
                Written::Failed(e) => return self.failing(e),
            }
        }
        let idle_check_due = self.last_check.is_none_or(|t| t.elapsed() >= IDLE_CHECK_EVERY);
        if !wrote && (shmem::phase() != Phase::Recording || idle_check_due) {
            self.check();
        }
    }

    /// With nothing to write: is the audit table there, and (after a failure)
    /// does it take rows again?
    fn check(&mut self) {
        self.last_check = Some(Instant::now());
        let after_failure = shmem::phase() == Phase::Failing;
        let health = in_transaction(|| {
            if !audit_table_exists() {
                return Ok(false);
            }
            if after_failure {
                probe()?;
            }
            Ok(true)
        });
        match health.and_then(|h| h) {
            Ok(true) => self.recording(),
            Ok(false) => self.waiting_for_extension(),
            Err(e) => self.failing(e),
        }
    }

    fn recording(&mut self) {
        self.last_check = Some(Instant::now());
        if shmem::phase() != Phase::Recording {
            shmem::set_phase(Phase::Recording);
            shmem::set_last_error(None, 0);
        }
        if self.logged_failure.take().is_some() {
            log!("pg_lease audit worker: recording again in \"{}\".lease.rejected_writes", self.database);
        }
        self.warned_missing = false;
    }

    fn waiting_for_extension(&mut self) {
        if shmem::phase() != Phase::WaitingExtension {
            shmem::set_phase(Phase::WaitingExtension);
            shmem::set_last_error(None, 0);
        }
        if !self.warned_missing {
            warning!(
                "pg_lease audit worker: database \"{}\" has no lease.rejected_writes; refusals stay queued (then count as dropped) until CREATE EXTENSION pg_lease runs there",
                self.database
            );
            self.warned_missing = true;
        }
    }

    fn failing(&mut self, error: Failure) {
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        shmem::set_phase(Phase::Failing);
        shmem::set_last_error(
            Some(&format!("cannot write to \"{}\".lease.rejected_writes: {error}", self.database)),
            now,
        );
        if self.logged_failure.as_ref() != Some(&error) {
            log!(
                "pg_lease audit worker: cannot write to \"{}\".lease.rejected_writes, refusals stay queued and the worker retries every second: {error}",
                self.database
            );
            self.logged_failure = Some(error);
        }
    }

    fn report_drop(&self, record: &AuditRecord, why: &Failure, now: i64) {
        let at = unsafe { crate::fence::pg::owned(pg_sys::timestamptz_to_str(record.rejected_at)) };
        let what = format!(
            "the refusal ({}) of {} in database \"{}\" at {at} by pid {}",
            String::from_utf8_lossy(&record.sqlstate),
            record.target_table.as_str(),
            record.database.as_str(),
            record.backend_pid,
        );
        log!("pg_lease audit worker: dropped {what}: it cannot be written to lease.rejected_writes: {why}");
        shmem::set_last_drop(&format!("{what}: {why}"), now);
    }
}

fn texts(batch: &[AuditRecord], f: impl Fn(&AuditRecord) -> Option<String>) -> Vec<Option<String>> {
    batch.iter().map(f).collect()
}

fn insert(batch: &[AuditRecord]) {
    // Records hold UTF-8 without NUL (see FixedStr::set); this is the last
    // line of defence, should one come from elsewhere.
    let some = |s: &str| (!s.is_empty()).then(|| without_nul(s).into_owned());
    let code = |r: &AuditRecord| String::from_utf8_lossy(&r.sqlstate).into_owned();
    let args: Vec<pgrx::datum::DatumWithOid> = vec![
        batch.iter().map(|r| r.rejected_at).collect::<Vec<i64>>().into(),
        texts(batch, |r| some(r.database.as_str())).into(),
        texts(batch, |r| some(r.role.as_str())).into(),
        texts(batch, |r| some(r.application_name.as_str())).into(),
        texts(batch, |r| some(r.client_addr.as_str())).into(),
        batch.iter().map(|r| r.backend_pid).collect::<Vec<i32>>().into(),
        texts(batch, |r| some(r.target_table.as_str())).into(),
        batch.iter().map(|r| r.table_relid as i64).collect::<Vec<i64>>().into(),
        texts(batch, |r| some(r.operation.as_str())).into(),
        texts(batch, |r| some(r.resource_key.as_str())).into(),
        batch.iter().map(|r| r.has_presented.then_some(r.presented)).collect::<Vec<Option<i64>>>().into(),
        batch.iter().map(|r| r.has_current.then_some(r.current)).collect::<Vec<Option<i64>>>().into(),
        texts(batch, |r| Some(code(r))).into(),
        texts(batch, |r| LeaseError::from_sqlstate(&code(r)).map(|e| e.name().to_owned())).into(),
        texts(batch, |r| some(r.statement.as_str())).into(),
        texts(batch, |r| some(r.row_data.as_str())).into(),
    ];
    Spi::run_with_args(
        "INSERT INTO lease.rejected_writes
             (rejected_at, database, role, application_name, client_addr, backend_pid, target_table, target_relid,
              operation, resource_key, presented_token, current_token, sqlstate, error_name, statement, row_data)
         SELECT timestamptz '2000-01-01 00:00:00+00' + u.us * interval '1 microsecond', u.db, u.role, u.app,
                u.client, u.pid, u.tbl, u.relid::oid, u.op, u.res, u.presented, u.cur, u.code, u.name, u.stmt,
                u.row_data::jsonb
           FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[],
                       $8::bigint[], $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::text[],
                       $14::text[], $15::text[], $16::text[])
                AS u(us, db, role, app, client, pid, tbl, relid, op, res, presented, cur, code, name, stmt, row_data)",
        &args,
    )
    .expect("inserting into lease.rejected_writes");
}

fn apply_retention() {
    let purged = in_transaction(|| {
        if audit_table_exists() {
            Spi::run_with_args(
                "DELETE FROM lease.rejected_writes WHERE rejected_at < now() - $1 * interval '1 minute'",
                &[gucs::AUDIT_RETENTION_MIN.get().into()],
            )
            .expect("applying pg_lease.audit_retention");
        }
    });
    if let Err(e) = purged {
        log!("pg_lease audit worker: could not apply pg_lease.audit_retention, retrying in a minute: {e}");
    }
}
