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
use crate::pg::{self, owned, Row};
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
    /// The row was let through unjudged: applied by a trusted logical
    /// replication worker (judged where it was written).
    pub replicated: bool,
}

impl From<Result<pg_sys::Datum, Refusal>> for Outcome {
    fn from(result: Result<pg_sys::Datum, Refusal>) -> Outcome {
        Outcome { stats: None, result, replicated: false }
    }
}

/// Counts one row of a protected table as accepted, refused or replicated:
/// the one place `lease.stats` counters move (from `crate::boundary`).
pub fn count(outcome: &Outcome) {
    let Some(slot) = outcome.stats else {
        return;
    };
    match &outcome.result {
        Ok(_) if outcome.replicated => slot.replicated.fetch_add(1, Ordering::Relaxed),
        Ok(_) => slot.accepted.fetch_add(1, Ordering::Relaxed),
        Err(_) => {
            slot.last_refusal.store(pg::now(), Ordering::Relaxed);
            slot.refused.fetch_add(1, Ordering::Relaxed)
        }
    };
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
pub fn row_json(row: Row) -> Option<String> {
    if !gucs::AUDIT_ROW.get() {
        return None;
    }
    let size = row_size(row);
    if size > sanitize::ROW_SERIALIZE_MAX {
        return Some(sanitize::truncated(size));
    }
    // In a subtransaction of its own: row_to_json runs the casts to json
    // the columns' types have, which their owners may have made, and an
    // error there must not take the refusal's place (nor its count).
    let made = pg::subtransaction(|| {
        // Generated columns left out: the fence is a BEFORE trigger, which
        // sees them NULL (stored ones not computed yet; virtual ones, on
        // PostgreSQL 18, never stored), not as the row would have held them.
        let record = pg::record_datum_without(row, |a| a.attgenerated != 0);
        // SAFETY: `record` is a composite datum of a registered (or blessed)
        // row type; row_to_json(record) returns a text datum, and
        // text_to_cstring a palloc'd copy, read before this returns.
        Ok::<_, ()>(unsafe {
            let json = pg_sys::OidFunctionCall1Coll(
                pg_sys::Oid::from(pg_sys::F_ROW_TO_JSON_RECORD),
                pg_sys::InvalidOid,
                record,
            );
            let text = std::ffi::CStr::from_ptr(pg_sys::text_to_cstring(json.cast_mut_ptr()));
            sanitize::row_data(&crate::pg::from_server_json(text.to_bytes()))
        })
    });
    Some(match made {
        Ok(Ok(doc)) => doc,
        _ => sanitize::UNSERIALIZABLE.to_owned(),
    })
}

/// The size of a row's data, values counted uncompressed and detoasted
/// (without detoasting them).
fn row_size(row: Row) -> usize {
    let desc = row.desc();
    // SAFETY: Row's contract: `desc` is the tuple's valid descriptor.
    let natts = unsafe { (*desc).natts } as usize;
    let mut size = 0usize;
    for i in 0..natts {
        // SAFETY: i < natts.
        let (dropped, attlen) = unsafe {
            let att = pg::desc_attribute(desc, i);
            (att.attisdropped, att.attlen)
        };
        if dropped {
            continue;
        }
        let Some(datum) = row.attr(i as i16 + 1) else {
            continue;
        };
        size += match attlen {
            // SAFETY: a non-NULL varlena value of the row. Its data, without
            // the 4-byte header toast_raw_datum_size counts.
            -1 => unsafe { pg_sys::toast_raw_datum_size(datum) }.saturating_sub(pg_sys::VARHDRSZ),
            // SAFETY: a non-NULL cstring value of the row.
            -2 => unsafe { std::ffi::CStr::from_ptr(datum.cast_mut_ptr()).to_bytes().len() },
            n => n.max(0) as usize,
        };
    }
    size
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
            let database = pg::database_name(pg::my_database()).unwrap_or_default();
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
    // The role the session writes as (its SET ROLE), not the owner of a
    // SECURITY DEFINER function it called, nor a role pg_lease switched to.
    // SAFETY: GetOuterUserId reads this backend's outer role; application_name
    // is the GUC's current string (NULL or valid).
    let (role, application_name) =
        unsafe { (pg::role_name(pg_sys::GetOuterUserId()), owned(pg_sys::application_name)) };
    Session { database, role, application_name, client_addr, pid: pg::my_pid() }
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
    let now = pg::now();
    let who = session();
    if gucs::LOG_REJECTIONS.get() {
        // The server log is shared by databases of every encoding: outside
        // UTF-8 ones the line is ASCII, its JSON strings escaped.
        let ascii = !pg::database_is_utf8();
        let json_string = |s: &str| sanitize::json_string(s, ascii);
        pgrx::log!(
            "pg_lease rejected write: {{\"sqlstate\": \"{}\", \"error\": \"{}\", \"table\": {}, \"operation\": \"{}\", \"resource\": {}, \"presented_token\": {}, \"current_token\": {}, \"database\": {}, \"role\": {}, \"application_name\": {}, \"client_addr\": {}, \"pid\": {}}}",
            refusal.error.sqlstate(),
            refusal.error.name(),
            json_string(&facts.table),
            facts.operation,
            json_string(&facts.resource),
            json_token(facts.presented),
            json_token(facts.current),
            json_string(&who.database),
            json_string(&who.role),
            json_string(&who.application_name),
            json_string(&who.client_addr),
            who.pid
        );
    }
    if shmem::shared().is_none() {
        warn_once_without_preload();
        return;
    }
    let mut record = Box::new(AuditRecord::EMPTY);
    record.rejected_at = now;
    record.database_oid = pg::my_database().to_u32();
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
        record.statement.set(&statement_head());
    }
    if let Some(json) = &facts.row_json {
        // Already at most ROW_DATA_MAX bytes: never stored cut.
        record.row_data.set(json);
    }
    shmem::enqueue(&record, true);
}

/// The start of the statement being run, as the record keeps it: only its
/// first `4 × N` bytes are converted (a server character of k bytes is at
/// least k × 3/4 bytes of UTF-8), so a refusal costs the same whatever the
/// statement's length; what the cut spoils lies past the N bytes kept.
fn statement_head() -> String {
    const READ: usize = 4 * shmem::STATEMENT_BYTES;
    // SAFETY: debug_query_string is NULL or the statement being run (a
    // process global, NUL-terminated, valid while it runs); its bytes are
    // copied by from_server before this returns.
    unsafe {
        if pg_sys::debug_query_string.is_null() {
            return String::new();
        }
        let bytes = std::ffi::CStr::from_ptr(pg_sys::debug_query_string).to_bytes();
        pg::from_server(&bytes[..bytes.len().min(READ)])
    }
}

/// A change applied by logical replication subscription `subid` (`name`)
/// was refused: `lease.audit_status()` names it until `lease.stats_reset()`.
pub fn note_replication_refusal(subid: pg_sys::Oid, name: &str) {
    shmem::note_replication_refusal(subid, name, pg::now());
}

fn warn_once_without_preload() {
    if WARNED_NO_PRELOAD.with(|w| w.replace(true)) {
        return;
    }
    pgrx::warning!(
        "pg_lease: refused writes are not being recorded in lease.rejected_writes: pg_lease is not in shared_preload_libraries (they are still refused, and logged when pg_lease.log_rejections is on)"
    );
}

/// A protected table's stats slot as a backend's fence config holds it:
/// claimed when the config is built, or, if every slot was taken then, on a
/// later write once one can be had: at once when any process has claimed a
/// slot since (perhaps for this table), else at most once a second (a table
/// may have been dropped since, freeing one).
pub struct TableStats {
    relid: pg_sys::Oid,
    display: String,
    slot: Cell<Option<&'static StatSlot>>,
    /// Without a slot: `shmem::claims()` and the time at the last try.
    tried: Cell<(u64, pg_sys::TimestampTz)>,
}

impl TableStats {
    pub fn new(protected_relid: pg_sys::Oid, display: String) -> TableStats {
        let tried = (shmem::claims(), pg::now());
        let slot = stat_slot(protected_relid, &display);
        TableStats { relid: protected_relid, display, slot: Cell::new(slot), tried: Cell::new(tried) }
    }

    /// The slot to count in, None while the table goes uncounted.
    #[inline]
    pub fn slot(&self) -> Option<&'static StatSlot> {
        if let Some(slot) = self.slot.get() {
            return Some(slot);
        }
        let (claims, at) = self.tried.get();
        let (now_claims, now) = (shmem::claims(), pg::now());
        if now_claims == claims && now - at < 1_000_000 {
            return None;
        }
        self.tried.set((now_claims, now));
        let slot = stat_slot(self.relid, &self.display);
        self.slot.set(slot);
        slot
    }
}

/// The stats slot for a protected table of the current database. When every
/// slot is taken, those of dropped tables of this database and of dropped
/// databases are reused.
fn stat_slot(protected_relid: pg_sys::Oid, display: &str) -> Option<&'static StatSlot> {
    let here = pg::my_database();
    shmem::stat_slot(here, protected_relid, display, |db, rel| {
        if db == here.to_u32() {
            pg::relation_dropped(rel.into())
        } else {
            !pg::database_exists(db.into())
        }
    })
}

/// Registers shared memory and the launcher; from `_PG_init` during preload.
pub fn init_preloaded() {
    // SAFETY: called from _PG_init while shared_preload_libraries loads.
    unsafe { shmem::install_hooks() };
    launcher::register();
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::pg::Row;
    use pgrx::prelude::*;

    /// `row_json` of the one row `select` returns, with pg_lease.audit_row set.
    fn row_json_of(select: &std::ffi::CStr, audit_row: bool) -> Option<String> {
        Spi::run(&format!("SET LOCAL pg_lease.audit_row = {audit_row}")).unwrap();
        // SAFETY: an SPI connection of our own; the row and its descriptor
        // live in SPI's memory until SPI_finish, after row_json returned.
        unsafe {
            pg_sys::SPI_connect();
            assert_eq!(pg_sys::SPI_execute(select.as_ptr(), true, 1), pg_sys::SPI_OK_SELECT as i32);
            let table = &*pg_sys::SPI_tuptable;
            // A trigger's row has its table's type; a query's anonymous record
            // type must be registered (blessed) before row_to_json reads it.
            let desc = pg_sys::BlessTupleDesc(table.tupdesc);
            let json = super::row_json(Row::new(*table.vals, desc));
            pg_sys::SPI_finish();
            json
        }
    }

    #[pg_test]
    fn refused_rows_reach_the_audit_as_valid_jsonb_only_when_asked() {
        let select = c"SELECT 1 AS table_id, 'a\"b' AS note, 1e300::numeric AS big";
        assert_eq!(row_json_of(select, false), None);
        let doc = row_json_of(select, true).expect("a document");
        let back = Spi::get_one_with_args::<String>("SELECT ($1::jsonb ->> 'note')", &[doc.as_str().into()]).unwrap();
        assert_eq!(back.as_deref(), Some("a\"b"));
        // Too large to serialize: a marker with the row's size, not a cut document.
        let doc = row_json_of(c"SELECT repeat('x', 70000) AS note", true).expect("a marker");
        assert_eq!(doc, super::sanitize::truncated(70000));
    }
}
