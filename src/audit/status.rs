//! SQL views onto the shared counters: `lease._stats()`, `lease.audit_status()`,
//! `lease.stats_reset()`.

use super::shmem::{self, Phase};
use crate::gucs;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

fn timestamp(t: i64) -> Option<TimestampWithTimeZone> {
    (t != 0).then(|| unsafe { TimestampWithTimeZone::from_datum(pg_sys::Datum::from(t), false) }).flatten()
}

/// Per protected table counters of every database (for the `lease.stats` view).
#[pg_extern(name = "_stats", volatile, parallel_safe)]
pub fn stats() -> TableIterator<
    'static,
    (
        name!(database_oid, pg_sys::Oid),
        name!(table_oid, pg_sys::Oid),
        name!(table_name, String),
        name!(accepted, i64),
        name!(refused, i64),
        name!(last_refusal_at, Option<TimestampWithTimeZone>),
    ),
> {
    let rows: Vec<_> = shmem::shared()
        .map(|s| {
            s.stats
                .iter()
                .filter(|slot| slot.relid.load(Ordering::Acquire) != 0)
                .map(|slot| {
                    (
                        pg_sys::Oid::from(slot.dboid.load(Ordering::Relaxed)),
                        pg_sys::Oid::from(slot.relid.load(Ordering::Relaxed)),
                        slot.table_name.as_str().to_owned(),
                        slot.accepted.load(Ordering::Relaxed) as i64,
                        slot.refused.load(Ordering::Relaxed) as i64,
                        timestamp(slot.last_refusal.load(Ordering::Relaxed)),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    TableIterator::new(rows)
}

/// Whether refusals reach `lease.rejected_writes`, and the queue's accounting:
/// `refused = recorded + dropped + queued`, always.
// pgrx reads the column names from `name!` in the signature itself, so the
// type cannot move into an alias.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
pub fn audit_status() -> TableIterator<
    'static,
    (
        name!(preloaded, bool),
        name!(audit, bool),
        name!(audit_database, String),
        name!(worker_pid, Option<i32>),
        name!(queue_size, i64),
        name!(queued, i64),
        name!(refused, i64),
        name!(recorded, i64),
        name!(dropped, i64),
        name!(last_flush_at, Option<TimestampWithTimeZone>),
        name!(status, String),
    ),
> {
    let database = gucs::database();
    let audit = gucs::AUDIT.get();
    let row = match (shmem::shared(), shmem::counters()) {
        (Some(s), Some(c)) => {
            let pid = s.worker_pid.load(Ordering::Acquire);
            let status = status_text(audit, &database, pid, c.queued);
            (
                true,
                audit,
                database,
                (pid != 0).then_some(pid),
                c.capacity as i64,
                c.queued as i64,
                c.refused as i64,
                c.recorded as i64,
                c.dropped as i64,
                timestamp(s.last_flush.load(Ordering::Relaxed)),
                status,
            )
        }
        _ => (
            false,
            audit,
            database,
            None,
            0,
            0,
            0,
            0,
            0,
            None,
            "not recording: add pg_lease to shared_preload_libraries and restart; refusals are still enforced and logged"
                .to_owned(),
        ),
    };
    TableIterator::once(row)
}

fn database_exists(name: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(name) else { return false };
    unsafe { pg_sys::get_database_oid(name.as_ptr(), true) != pg_sys::InvalidOid }
}

fn when(t: i64) -> String {
    unsafe { crate::fence::pg::owned(pg_sys::timestamptz_to_str(t)) }
}

/// What `status` says, first word first: `recording`, `waiting` (for the
/// database or for the extension in it), `failing` (with the worker's last
/// error), `starting`, `not running`; or that `pg_lease.audit is off`.
fn status_text(audit: bool, database: &str, pid: i32, queued: u64) -> String {
    let phase = shmem::phase();
    let notes = shmem::notes();
    let queue = match queued {
        0 => "refusals will stay queued".to_owned(),
        1 => "1 refusal waits in the queue".to_owned(),
        n => format!("{n} refusals wait in the queue"),
    };
    let queue = format!("{queue} (counted as dropped once it is full)");
    if !audit {
        return "pg_lease.audit is off: refusals are counted as dropped and only logged".to_owned();
    }
    if !database_exists(database) {
        return format!(
            "waiting for database \"{database}\" (pg_lease.database) to exist: create it and CREATE EXTENSION pg_lease there; the audit worker retries every 5 s; {queue}"
        );
    }
    if pid != 0 && phase == Phase::WaitingExtension {
        return format!(
            "waiting for CREATE EXTENSION pg_lease in database \"{database}\" (pg_lease.database); {queue}"
        );
    }
    if let Some((error, at)) = notes.last_error.filter(|_| pid == 0 || phase == Phase::Failing) {
        let running = if pid == 0 {
            "the audit worker is not running (it restarts every 5 s)"
        } else {
            "the audit worker retries every second"
        };
        return format!("failing since {}: {error}; {running}; {queue}", when(at));
    }
    if pid == 0 {
        return if unsafe { pg_sys::RecoveryInProgress() } {
            "not running: this server is a standby, which refuses no writes; the audit worker starts once it is promoted"
                .to_owned()
        } else if phase == Phase::Connecting {
            format!("starting: the audit worker is connecting to database \"{database}\"; {queue}")
        } else {
            format!(
                "not running: the audit worker is not running (stopped by pg_terminate_backend or by an error, it restarts within 5 s); {queue} for database \"{database}\""
            )
        };
    }
    if phase == Phase::Connecting {
        return format!("starting: the audit worker is checking database \"{database}\"; {queue}");
    }
    let mut text = format!("recording refusals of every database in \"{database}\".lease.rejected_writes");
    if let Some((why, at)) = notes.last_drop {
        text.push_str(&format!("; the last record it could not write was dropped at {}: {why}", when(at)));
    }
    text
}

/// Zeroes accepted/refused/recorded/dropped counters (queued records stay).
#[pg_extern(volatile, parallel_unsafe)]
pub fn stats_reset() {
    shmem::reset();
}
