//! The audit worker: drains the shared-memory queue into
//! `lease.rejected_writes` of `pg_lease.database`, in batches, each in its own
//! transaction; applies retention; drains once more on a clean shutdown.

use super::shmem::{self, AuditRecord};
use crate::errors::LeaseError;
use crate::gucs;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

const BATCH: usize = 512;
const RETENTION_EVERY: Duration = Duration::from_secs(60);

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

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_lease_audit_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let database = gucs::database();
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    unsafe { shmem::set_worker(&raw mut (*pg_sys::MyProc).procLatch, pg_sys::MyProcPid) };
    log!("pg_lease audit worker started: recording refusals in database \"{database}\"");

    let mut batch = Vec::with_capacity(BATCH);
    let mut warned_missing = false;
    let mut last_retention: Option<Instant> = None;
    loop {
        let flush = Duration::from_millis(gucs::AUDIT_FLUSH_MS.get() as u64);
        let alive = BackgroundWorker::wait_latch(Some(flush));
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        drain(&mut batch, &mut warned_missing);
        if gucs::AUDIT_RETENTION_MIN.get() > 0 && last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            apply_retention();
            last_retention = Some(Instant::now());
        }
        if !alive {
            break;
        }
    }
    shmem::set_worker(std::ptr::null_mut(), 0);
    log!("pg_lease audit worker stopped");
}

/// Writes queued records until the queue is empty.
fn drain(batch: &mut Vec<AuditRecord>, warned_missing: &mut bool) {
    loop {
        shmem::peek(BATCH, batch);
        if batch.is_empty() {
            return;
        }
        let written = BackgroundWorker::transaction(|| {
            let exists = Spi::get_one::<bool>("SELECT to_regclass('lease.rejected_writes') IS NOT NULL")
                .ok()
                .flatten()
                .unwrap_or(false);
            if !exists {
                return false;
            }
            insert(batch);
            true
        });
        if !written {
            if !*warned_missing {
                warning!(
                    "pg_lease audit worker: database \"{}\" has no lease.rejected_writes; refusals stay queued (then count as dropped) until CREATE EXTENSION pg_lease runs there",
                    gucs::database()
                );
                *warned_missing = true;
            }
            return;
        }
        *warned_missing = false;
        shmem::commit_recorded(batch.len(), unsafe { pg_sys::GetCurrentTimestamp() });
    }
}

fn texts(batch: &[AuditRecord], f: impl Fn(&AuditRecord) -> Option<String>) -> Vec<Option<String>> {
    batch.iter().map(f).collect()
}

fn insert(batch: &[AuditRecord]) {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
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
    BackgroundWorker::transaction(|| {
        let exists = Spi::get_one::<bool>("SELECT to_regclass('lease.rejected_writes') IS NOT NULL")
            .ok()
            .flatten()
            .unwrap_or(false);
        if exists {
            Spi::run_with_args(
                "DELETE FROM lease.rejected_writes WHERE rejected_at < now() - $1 * interval '1 minute'",
                &[gucs::AUDIT_RETENTION_MIN.get().into()],
            )
            .expect("applying pg_lease.audit_retention");
        }
    });
}
