//! Audit of refused writes: every refusal is counted, logged as one
//! structured LOG line, and queued in shared memory for its destination (the
//! refusing database, or the central one `pg_lease.database` names). The
//! audit launcher starts a short-lived writer per destination with queued
//! records, which writes them to its `lease.rejected_writes` in its own
//! transaction, so they survive the writer's rollback.

pub mod launcher;
pub mod sanitize;
pub mod shmem;
pub mod status;
pub mod worker;

use crate::errors::Refusal;
use crate::gucs;
use crate::pg::owned;
use pgrx::pg_sys;
use shmem::{AuditRecord, StatSlot};
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// What one SQL-callable function decided: the datum to return or a
/// refusal, and the counters of the protected table whose row it judged
/// (None for calls that judge no row of a protected table).
pub struct Outcome {
    pub stats: Option<&'static StatSlot>,
    pub result: Result<pg_sys::Datum, Refusal>,
}

impl From<Result<pg_sys::Datum, Refusal>> for Outcome {
    fn from(result: Result<pg_sys::Datum, Refusal>) -> Outcome {
        Outcome { stats: None, result }
    }
}

/// Counts one judged row of a protected table as accepted or refused: the
/// one place `lease.stats` counters move (from `crate::boundary`).
pub fn count(stats: Option<&'static StatSlot>, accepted: bool) {
    let Some(slot) = stats else {
        return;
    };
    if accepted {
        slot.accepted.fetch_add(1, Ordering::Relaxed);
    } else {
        slot.refused.fetch_add(1, Ordering::Relaxed);
        // SAFETY: reads the clock.
        slot.last_refusal.store(unsafe { pg_sys::GetCurrentTimestamp() }, Ordering::Relaxed);
    }
}

/// Ends this background worker's process: `proc_exit` runs the exit
/// callbacks and never returns (pgrx's binding says so on 15, not on 18).
#[allow(unreachable_code)]
pub fn exit_process(code: i32) -> ! {
    // SAFETY: called from a background worker's main function with nothing
    // left to unwind; proc_exit is how Postgres ends a process.
    unsafe { pg_sys::proc_exit(code) };
    unreachable!("proc_exit returned")
}

/// The refused row as the `row_data` document (valid jsonb, at most
/// [`sanitize::ROW_DATA_MAX`] bytes), if `pg_lease.audit_row` asks for it.
pub fn row_json(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Option<String> {
    if !gucs::AUDIT_ROW.get() {
        return None;
    }
    unsafe {
        let size = row_size(tuple, desc);
        if size > sanitize::ROW_SERIALIZE_MAX {
            return Some(sanitize::truncated(size));
        }
        let record = pg_sys::heap_copy_tuple_as_datum(tuple, desc);
        let json =
            pg_sys::OidFunctionCall1Coll(pg_sys::Oid::from(pg_sys::F_ROW_TO_JSON_RECORD), pg_sys::InvalidOid, record);
        Some(sanitize::row_data(&owned(pg_sys::text_to_cstring(json.cast_mut_ptr()))))
    }
}

/// The size of a row's data, values counted uncompressed and detoasted
/// (without detoasting them).
unsafe fn row_size(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> usize {
    let natts = (*desc).natts as usize;
    let mut size = 0usize;
    for i in 0..natts {
        let att = attribute(desc, i);
        if att.attisdropped {
            continue;
        }
        let mut isnull = false;
        let datum = pg_sys::heap_getattr(tuple, i as i32 + 1, desc, &mut isnull);
        if isnull {
            continue;
        }
        size += match att.attlen {
            -1 => pg_sys::toast_raw_datum_size(datum),
            -2 => std::ffi::CStr::from_ptr(datum.cast_mut_ptr()).to_bytes().len(),
            n => n.max(0) as usize,
        };
    }
    size
}

/// The `i`th (0-based) attribute of a tuple descriptor. PostgreSQL 18 moved
/// the attribute array behind `compact_attrs` (TupleDescAttr is then a function).
unsafe fn attribute<'a>(desc: pg_sys::TupleDesc, i: usize) -> &'a pg_sys::FormData_pg_attribute {
    #[cfg(feature = "pg18")]
    {
        &*pg_sys::TupleDescAttr(desc, i as i32)
    }
    #[cfg(not(feature = "pg18"))]
    {
        &(*desc).attrs.as_slice((*desc).natts as usize)[i]
    }
}

struct Session {
    database: String,
    role: String,
    application_name: String,
    client_addr: String,
    pid: i32,
}

thread_local! {
    /// (database, client address): fixed for the life of a backend.
    static CONNECTION: std::cell::OnceCell<(String, String)> = const { std::cell::OnceCell::new() };
}

fn session() -> Session {
    let (database, client_addr) = CONNECTION.with(|c| {
        c.get_or_init(|| {
            let database = unsafe { owned(pg_sys::get_database_name(pg_sys::MyDatabaseId)) };
            // pgrx does not expose Port's fields; ask once per backend.
            let client =
                pgrx::spi::Spi::get_one::<String>("SELECT coalesce(pg_catalog.inet_client_addr()::text, '[local]')")
                    .ok()
                    .flatten()
                    .unwrap_or_default();
            (database, client)
        })
        .clone()
    });
    unsafe {
        Session {
            database,
            role: owned(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), true)),
            application_name: owned(pg_sys::application_name),
            client_addr,
            pid: pg_sys::MyProcPid,
        }
    }
}

fn json_token(t: Option<i64>) -> String {
    t.map_or_else(|| "null".to_owned(), |t| t.to_string())
}

thread_local! {
    static WARNED_NO_PRELOAD: Cell<bool> = const { Cell::new(false) };
}

/// Called for every refusal raised through `crate::boundary`, before the error:
/// the LOG line and the queued record.
pub fn on_refusal(refusal: &Refusal) {
    let Some(facts) = refusal.audit.as_deref() else {
        return;
    };
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    let who = session();
    if gucs::LOG_REJECTIONS.get() {
        pgrx::log!(
            "pg_lease rejected write: {{\"sqlstate\": \"{}\", \"error\": \"{}\", \"table\": {}, \"operation\": \"{}\", \"resource\": {}, \"presented_token\": {}, \"current_token\": {}, \"database\": {}, \"role\": {}, \"application_name\": {}, \"client_addr\": {}, \"pid\": {}}}",
            refusal.error.sqlstate(),
            refusal.error.name(),
            sanitize::json_string(&facts.table),
            facts.operation,
            sanitize::json_string(&facts.resource),
            json_token(facts.presented),
            json_token(facts.current),
            sanitize::json_string(&who.database),
            sanitize::json_string(&who.role),
            sanitize::json_string(&who.application_name),
            sanitize::json_string(&who.client_addr),
            who.pid
        );
    }
    if shmem::shared().is_none() {
        warn_once_without_preload();
        return;
    }
    let mut record = Box::new(AuditRecord::EMPTY);
    record.rejected_at = now;
    record.database_oid = unsafe { pg_sys::MyDatabaseId }.to_u32();
    record.database.set(&who.database);
    if !gucs::AUDIT.get() {
        // Counted (as dropped) for its database all the same.
        shmem::enqueue(&record, false);
        return;
    }
    record.backend_pid = who.pid;
    record.table_relid = facts.relid.to_u32();
    record.sqlstate.copy_from_slice(refusal.error.sqlstate().as_bytes());
    record.has_presented = facts.presented.is_some();
    record.presented = facts.presented.unwrap_or(0);
    record.has_current = facts.current.is_some();
    record.current = facts.current.unwrap_or(0);
    record.role.set(&who.role);
    record.application_name.set(&who.application_name);
    record.client_addr.set(&who.client_addr);
    record.operation.set(facts.operation);
    record.target_table.set(&facts.table);
    record.resource_key.set(&facts.resource);
    if gucs::AUDIT_STATEMENT.get() {
        record.statement.set(&unsafe { owned(pg_sys::debug_query_string) });
    }
    if let Some(json) = &facts.row_json {
        // Already at most ROW_DATA_MAX bytes: never stored cut.
        record.row_data.set(json);
    }
    shmem::enqueue(&record, true);
}

fn warn_once_without_preload() {
    if WARNED_NO_PRELOAD.with(|w| w.replace(true)) {
        return;
    }
    pgrx::warning!(
        "pg_lease: refused writes are not being recorded in lease.rejected_writes: pg_lease is not in shared_preload_libraries (they are still refused, and logged when pg_lease.log_rejections is on)"
    );
}

/// The stats slot for a protected table of the current database.
pub fn stat_slot(protected_relid: pg_sys::Oid, display: &str) -> Option<&'static StatSlot> {
    shmem::stat_slot(unsafe { pg_sys::MyDatabaseId }, protected_relid, display)
}

/// Registers shared memory and the launcher; from `_PG_init` during preload.
pub fn init_preloaded() {
    unsafe { shmem::install_hooks() };
    launcher::register();
}
