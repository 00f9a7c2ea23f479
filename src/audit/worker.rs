//! The audit writer: one per destination (a database with queued refusals,
//! or the central database `pg_lease.database` names), started by the
//! launcher. It drains its destination's records into that database's
//! `lease.rejected_writes`, in batches, each in its own transaction; applies
//! retention; drains once more on a clean shutdown. A per-database writer
//! exits once it has had nothing to write for [`IDLE_EXIT`], or as soon as it
//! cannot record (the launcher retries every second), so it never holds a
//! connection that would keep `DROP DATABASE` waiting; the central writer
//! stays, as the one audit worker always did.
//!
//! No record can stop it. A batch whose insert fails is told apart:
//! - if the table takes no row at all (a probe row, inserted in a
//!   subtransaction that is always rolled back, fails too), or the error is
//!   of a kind no record causes (lock timeout, disk full, read-only, a changed
//!   table...), the writer is *failing*: records stay queued (counted as
//!   dropped only once the queue, or the destination's share of it, is full),
//!   the error goes to `lease.audit_status()` and, once per distinct error, to
//!   the log, and the writing is retried every second;
//! - otherwise the batch is written record by record, each in its own
//!   subtransaction (as PL/pgSQL's exception blocks do): a record that still
//!   fails is counted as dropped, with one LOG line saying why, and the others
//!   are recorded.

use super::sanitize::without_nul;
use super::shmem::{self, AuditRecord, Phase};
use crate::errors::LeaseError;
use crate::gucs;
use crate::pg::ServerText;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

const BATCH: usize = 512;
pub const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// How often writing is retried while a destination cannot record (or waits
/// for the extension), whatever `pg_lease.audit_flush_ms` says.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How often an idle, recording central writer checks the audit table is
/// still there.
const IDLE_CHECK_EVERY: Duration = Duration::from_secs(5);
/// A per-database writer exits after this long with nothing to write.
pub const IDLE_EXIT: Duration = Duration::from_secs(2);
/// A per-database writer gives its worker slot up after this long when other
/// databases wait for one.
const TURN: Duration = Duration::from_secs(5);
/// A writer never waits longer than this for a lock on the audit table (it
/// would look like it records while it does not).
const LOCK_TIMEOUT: &CStr = c"5s";
/// In a writer's start argument, beside the destination key: only apply
/// retention to the database, then exit.
pub const RETENTION_ONLY: u64 = 1 << 32;

thread_local! {
    /// The emit_log_hook installed before ours (called after it).
    static PREV_EMIT_LOG_HOOK: std::cell::Cell<pg_sys::emit_log_hook_type> = const { std::cell::Cell::new(None) };
    /// The destination this process writes (for its hooks).
    static DEST: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// In a writer only: an error that ends it (it cannot connect, or something
/// escaped) is what `lease.audit_status()` shows until a later write succeeds.
///
/// # Safety
/// Called by elog.c as `emit_log_hook` with a valid ErrorData (or null).
unsafe extern "C-unwind" fn on_writer_log(edata: *mut pg_sys::ErrorData) {
    // A missing database is not kept: the launcher and audit_status see it
    // for themselves.
    let missing_database = PgSqlErrorCode::ERRCODE_INVALID_CATALOG_NAME as isize as i32;
    // SAFETY: elog.c passes the ErrorData being reported, valid for the
    // call; `message` is NUL-terminated when not null.
    let message = unsafe {
        edata
            .as_ref()
            .filter(|e| e.elevel >= pg_sys::PGERROR as i32 && e.sqlerrcode != missing_database && !e.message.is_null())
            .map(|e| CStr::from_ptr(e.message).to_string_lossy().into_owned())
    };
    if let (Some(dest), Some(message)) = (DEST.with(|d| d.get()), message) {
        shmem::note_failure(dest, &message, crate::pg::now());
    }
    if let Some(prev) = PREV_EMIT_LOG_HOOK.with(|p| p.get()) {
        // SAFETY: the previous hook, called with what we were given.
        unsafe { prev(edata) };
    }
}

/// However the writer exits, it no longer serves its destination.
extern "C-unwind" fn on_writer_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if let Some(dest) = DEST.with(|d| d.get()) {
        shmem::detach(dest, crate::pg::my_pid(), false);
    }
}

fn set_worker_gucs() {
    for (name, value) in [
        (c"lock_timeout", LOCK_TIMEOUT),
        // Nothing a role created in the audit database resolves the
        // writer's (superuser) statements.
        (c"search_path", c"pg_catalog, pg_temp"),
        // A database owner's ALTER DATABASE ... SET cannot stall the audit
        // (nor make its commits asynchronous, or its role another).
        (c"default_transaction_read_only", c"off"),
        (c"statement_timeout", c"0"),
        (c"idle_in_transaction_session_timeout", c"0"),
        (c"default_transaction_isolation", c"read committed"),
        (c"synchronous_commit", c"on"),
        (c"role", c"none"),
        #[cfg(feature = "pg18")]
        (c"transaction_timeout", c"0"),
    ] {
        // SAFETY: two static NUL-terminated strings naming a setting and a
        // valid value; SetConfigOption raises on anything else.
        unsafe {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_OVERRIDE,
            )
        };
    }
}

/// Started by the launcher with the destination key (a database OID, or
/// [`shmem::CENTRAL`]) as its argument, maybe with [`RETENTION_ONLY`].
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_lease_audit_writer_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let arg = arg.value() as u64;
    let key = arg as u32;
    let central = gucs::central_database().filter(|_| key == shmem::CENTRAL);
    if arg & RETENTION_ONLY != 0 {
        BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(key)), None);
        set_worker_gucs();
        apply_retention();
        super::exit_process(0)
    }
    let me = crate::pg::my_pid();
    // SAFETY: MyProc is this process's PGPROC (a background worker with
    // shared memory access has one); its latch lives as long as the process.
    let latch = unsafe { &raw mut (*pg_sys::MyProc).procLatch };
    let Some(dest) = shmem::attach(key, central.as_deref().unwrap_or_default(), latch, me) else {
        // Another writer serves it, or no destination is free.
        super::exit_process(0)
    };
    DEST.with(|d| d.set(Some(dest)));
    // SAFETY: registers a static callback, and chains our log hook in front
    // of the one installed before (this process's only thread).
    unsafe {
        pg_sys::before_shmem_exit(Some(on_writer_exit), pg_sys::Datum::from(0));
        PREV_EMIT_LOG_HOOK.with(|p| p.set(pg_sys::emit_log_hook));
        pg_sys::emit_log_hook = Some(on_writer_log);
    }
    if matches!(shmem::phase(dest), Phase::Unknown | Phase::Dropped) {
        shmem::set_phase(dest, Phase::Connecting);
    }
    let database = match &central {
        Some(name) => {
            BackgroundWorker::connect_worker_to_spi(Some(name), None);
            name.clone()
        }
        None => {
            BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(key)), None);
            // The catalog is read in a transaction only.
            let name = in_transaction(|| crate::pg::database_name(crate::pg::my_database()).unwrap_or_default())
                .unwrap_or_else(|_| format!("OID {key}"));
            shmem::set_name(dest, &name);
            name
        }
    };
    set_worker_gucs();
    if central.is_some() {
        log!("pg_lease audit writer started: recording refusals of every database in \"{database}\"");
    } else {
        debug1!("pg_lease audit writer started for database \"{database}\"");
    }

    let mut writer = Writer::new(dest, database);
    let started = Instant::now();
    let mut idle_since = Instant::now();
    let mut last_retention: Option<Instant> = None;
    let flush = || Duration::from_millis(gucs::AUDIT_FLUSH_MS.get() as u64);
    let mut due = Instant::now() + flush();
    loop {
        // The latch is also set by things other than a full queue (a new
        // process starts with it set, sinval catch-up sets it): only a full
        // queue or the end of the process brings the flush forward.
        let alive = BackgroundWorker::wait_latch(Some(due.saturating_duration_since(Instant::now())));
        if BackgroundWorker::sighup_received() {
            crate::pg::reload_config();
            due = due.min(Instant::now() + flush());
        }
        if alive && Instant::now() < due && !shmem::half_full() {
            continue;
        }
        if writer.drain() || shmem::queued(dest) > 0 {
            idle_since = Instant::now();
        }
        if gucs::AUDIT_RETENTION_MIN.get() > 0 && last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            apply_retention();
            last_retention = Some(Instant::now());
        }
        due = Instant::now()
            + if central.is_some() {
                if shmem::phase(dest) == Phase::Recording {
                    flush()
                } else {
                    flush().max(RETRY_EVERY)
                }
            } else if shmem::queued(dest) > 0 {
                flush()
            } else {
                // Idle: look again within a flush interval, until it is time to go.
                flush().min(IDLE_EXIT.saturating_sub(idle_since.elapsed())).max(Duration::from_millis(10))
            };
        if !alive || central.is_some() {
            if alive {
                continue;
            }
            break;
        }
        // A per-database writer: it does not wait here while it cannot
        // record (the launcher retries), nor stays when idle, nor keeps its
        // slot from databases waiting for one.
        if shmem::phase(dest) != Phase::Recording {
            break;
        }
        if idle_since.elapsed() >= IDLE_EXIT && shmem::detach(dest, me, true) {
            break;
        }
        let starved = shmem::shared().is_some_and(|s| s.starved.load(std::sync::atomic::Ordering::Acquire));
        if starved && started.elapsed() >= TURN {
            break;
        }
    }
    shmem::detach(dest, me, false);
    if central.is_some() {
        log!("pg_lease audit writer stopped");
    }
    super::exit_process(0)
}

/// An error caught in the worker: its SQLSTATE and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Failure {
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
pub(super) fn in_transaction<R>(f: impl FnOnce() -> R) -> Result<R, Failure> {
    // SAFETY: a background worker between transactions starts one as
    // postgres.c does (statement time, transaction, snapshot); it is ended
    // below on every path.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = catch(f).and_then(|r| {
        // SAFETY: pops the snapshot pushed above and commits the transaction.
        catch(|| unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        })
        .map(|()| r)
    });
    if result.is_err() {
        // SAFETY: after an error (caught) or a failed commit the transaction
        // is aborted, as postgres.c's error recovery does.
        unsafe { pg_sys::AbortCurrentTransaction() };
    }
    result
}

/// Runs `f` in a subtransaction, as PL/pgSQL's exception blocks do: kept if
/// `f` returns and `keep` is true, rolled back otherwise. An error inside it
/// rolls back only what `f` did.
fn in_subtransaction<R>(keep: bool, f: impl FnOnce() -> R) -> Result<R, Failure> {
    // SAFETY: PL/pgSQL's exception-block protocol (pl_exec.c): begin an
    // internal subtransaction, run, release or roll it back, then restore the
    // caller's memory context and resource owner, which the subtransaction
    // calls change. Called inside a transaction (in_transaction).
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
fn probe(database: &str) -> Result<(), Failure> {
    let mut record = AuditRecord::EMPTY;
    record.rejected_at = crate::pg::now();
    record.sqlstate.copy_from_slice(LeaseError::StaleOwnerBoundaryWrite.sqlstate().as_bytes());
    record.database.set(database);
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

fn write(batch: &[AuditRecord], database: &str) -> Written {
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
        if probe(database).is_err() {
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

struct Writer {
    dest: usize,
    database: String,
    batch: Vec<AuditRecord>,
    last_check: Option<Instant>,
}

impl Writer {
    fn new(dest: usize, database: String) -> Writer {
        Writer { dest, database, batch: Vec::with_capacity(BATCH), last_check: None }
    }

    /// Writes queued records until none are left or nothing can be written;
    /// with nothing queued, checks that recording would work. Whether it
    /// wrote anything.
    fn drain(&mut self) -> bool {
        let mut wrote = false;
        loop {
            shmem::peek(self.dest, BATCH, &mut self.batch);
            if self.batch.is_empty() {
                break;
            }
            match write(&self.batch, &self.database) {
                Written::Done { n, dropped } => {
                    let now = crate::pg::now();
                    shmem::commit_recorded(self.dest, n, dropped.len(), now);
                    for (i, why) in &dropped {
                        self.report_drop(&self.batch[*i], why, now);
                    }
                    self.recording();
                    wrote = true;
                }
                Written::NoTable => {
                    self.waiting_for_extension();
                    return wrote;
                }
                Written::Failed(e) => {
                    self.failing(e);
                    return wrote;
                }
            }
        }
        let idle_check_due = self.last_check.is_none_or(|t| t.elapsed() >= IDLE_CHECK_EVERY);
        if !wrote && (shmem::phase(self.dest) != Phase::Recording || idle_check_due) {
            self.check();
        }
        wrote
    }

    /// With nothing to write: is the audit table there, and (after a failure)
    /// does it take rows again?
    fn check(&mut self) {
        self.last_check = Some(Instant::now());
        let after_failure = shmem::phase(self.dest) == Phase::Failing;
        let health = in_transaction(|| {
            if !audit_table_exists() {
                return Ok(false);
            }
            if after_failure {
                probe(&self.database)?;
            }
            Ok(true)
        });
        match health.and_then(|h| h) {
            Ok(true) => self.recording(),
            Ok(false) => self.waiting_for_extension(),
            Err(e) => self.failing(e),
        }
    }

    // The phase and notes live in shared memory, so that what a writer said
    // (and logged) holds across the writers the launcher starts one after
    // the other: a persisting failure is logged once, not once per writer.

    fn recording(&mut self) {
        self.last_check = Some(Instant::now());
        let before = shmem::phase(self.dest);
        if before != Phase::Recording {
            shmem::set_phase(self.dest, Phase::Recording);
            if shmem::set_last_error(self.dest, None, 0) && before == Phase::Failing {
                log!("pg_lease audit worker: recording again in \"{}\".lease.rejected_writes", self.database);
            }
        }
    }

    fn waiting_for_extension(&mut self) {
        if shmem::phase(self.dest) != Phase::WaitingExtension {
            shmem::set_phase(self.dest, Phase::WaitingExtension);
            shmem::set_last_error(self.dest, None, 0);
            warning!(
                "pg_lease audit worker: database \"{}\" has no lease.rejected_writes; its refusals stay queued (up to a quarter of the queue per database, then they count as dropped) until CREATE EXTENSION pg_lease runs there",
                self.database
            );
        }
    }

    fn failing(&mut self, error: Failure) {
        let now = crate::pg::now();
        shmem::set_phase(self.dest, Phase::Failing);
        let note = format!("cannot write to \"{}\".lease.rejected_writes: {error}", self.database);
        if shmem::set_last_error(self.dest, Some(&note), now) {
            log!(
                "pg_lease audit worker: cannot write to \"{}\".lease.rejected_writes, refusals stay queued and writing is retried every second: {error}",
                self.database
            );
        }
    }

    fn report_drop(&self, record: &AuditRecord, why: &Failure, now: i64) {
        let at = crate::pg::timestamp_text(record.rejected_at);
        let what = format!(
            "the refusal ({}) of {} in database \"{}\" at {at} by pid {}",
            String::from_utf8_lossy(&record.sqlstate),
            record.target_table.as_str(),
            record.database.as_str(),
            record.backend_pid,
        );
        log!("pg_lease audit worker: dropped {what}: it cannot be written to lease.rejected_writes: {why}");
        shmem::set_last_drop(self.dest, &format!("{what}: {why}"), now);
    }
}

/// One text column of a batch, in this database's encoding (records hold
/// UTF-8: the refused session converted from its database's encoding).
fn texts(batch: &[AuditRecord], f: impl Fn(&AuditRecord) -> Option<String>) -> Vec<Option<ServerText>> {
    batch.iter().map(|r| f(r).map(ServerText)).collect()
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

pub(super) fn apply_retention() {
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
