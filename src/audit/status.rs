//! SQL views onto the shared counters: `lease._stats()`, `lease.audit_status()`,
//! `lease.stats_reset()`.

use super::shmem::{self, Phase};
use crate::gucs;
use crate::pg::ServerText;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

fn timestamp(t: i64) -> Option<TimestampWithTimeZone> {
    // SAFETY: a timestamptz datum is an i64 by value.
    (t != 0).then(|| unsafe { TimestampWithTimeZone::from_datum(pg_sys::Datum::from(t), false) }).flatten()
}

/// `lease._shown(t)`: `t` (a name read from a catalog shared by every
/// database, such as `pg_database.datname`, whose bytes need not be valid in
/// this database's encoding) as pg_lease shows text: every byte that is not
/// a character of this encoding with an exact UTF-8 form written out as
/// `\xNN` (`pg::from_server`), so the result can reach any client.
#[pg_extern(name = "_shown", stable, parallel_safe, strict)]
pub fn shown(t: crate::pg::ShownText) -> crate::pg::ShownText {
    t
}

/// Per protected table counters of every database (for the `lease.stats`
/// view; `lease._stats()` until 0.4.0, without `replicated`).
// pgrx reads the column names from `name!` in the signature itself.
#[allow(clippy::type_complexity)]
#[pg_extern(name = "_table_stats", volatile, parallel_safe)]
pub fn table_stats() -> TableIterator<
    'static,
    (
        name!(database_oid, pg_sys::Oid),
        name!(table_oid, pg_sys::Oid),
        name!(table_name, ServerText),
        name!(accepted, i64),
        name!(refused, i64),
        name!(last_refusal_at, Option<TimestampWithTimeZone>),
        name!(replicated, i64),
    ),
> {
    let here = crate::pg::my_database();
    let rows: Vec<_> = shmem::stat_rows()
        .into_iter()
        .map(|slot| {
            // A table of this database is named as it is now (it may have
            // been renamed or moved since its first counted write); others
            // by the name the slot kept.
            let name = (slot.dboid == here).then(|| crate::pg::display_if_exists(slot.relid)).flatten();
            (
                slot.dboid,
                slot.relid,
                ServerText(name.unwrap_or(slot.table_name)),
                slot.accepted as i64,
                slot.refused as i64,
                timestamp(slot.last_refusal),
                slot.replicated as i64,
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// `lease._stats()`: what `lease.stats` read until 0.4.0 (the counters
/// without `replicated`). Kept for the releases whose scripts declare it
/// (their `CREATE EXTENSION ... VERSION` needs the symbol) and for grants
/// made on it; `lease._table_stats()` is the one the view reads.
#[pg_extern(name = "_stats", volatile, parallel_safe)]
pub fn stats() -> TableIterator<
    'static,
    (
        name!(database_oid, pg_sys::Oid),
        name!(table_oid, pg_sys::Oid),
        name!(table_name, ServerText),
        name!(accepted, i64),
        name!(refused, i64),
        name!(last_refusal_at, Option<TimestampWithTimeZone>),
    ),
> {
    TableIterator::new(table_stats().map(|(d, t, n, a, r, l, _)| (d, t, n, a, r, l)))
}

/// Whether the refusals of the calling database reach `lease.rejected_writes`
/// (and which database's), and the whole queue's accounting:
/// `refused = recorded + dropped + queued`, always. `worker_pid` is the audit
/// launcher's; per-destination writers are in `lease.audit_databases()`.
// pgrx reads the column names from `name!` in the signature itself, so the
// type cannot move into an alias.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
pub fn audit_status() -> TableIterator<
    'static,
    (
        name!(preloaded, bool),
        name!(audit, bool),
        name!(audit_database, ServerText),
        name!(worker_pid, Option<i32>),
        name!(queue_size, i64),
        name!(queued, i64),
        name!(refused, i64),
        name!(recorded, i64),
        name!(dropped, i64),
        name!(last_flush_at, Option<TimestampWithTimeZone>),
        name!(status, ServerText),
    ),
> {
    let audit = gucs::AUDIT.get();
    let central = gucs::central_database();
    let here = crate::pg::my_database().to_u32();
    let database =
        central.clone().unwrap_or_else(|| crate::pg::database_name(crate::pg::my_database()).unwrap_or_default());
    let row = match (shmem::shared(), shmem::counters()) {
        (Some(s), Some(c)) => {
            let launcher = shmem::launcher_pid();
            let dest = shmem::destination(if central.is_some() { shmem::CENTRAL } else { here });
            let (_, status) =
                Destination { central: central.is_some(), name: &database, dest: dest.as_ref(), capacity: c.capacity }
                    .status(audit, launcher);
            let status = status + &replication_note(crate::pg::my_database());
            (
                true,
                audit,
                ServerText(database),
                (launcher != 0).then_some(launcher),
                c.capacity as i64,
                c.queued as i64,
                c.refused as i64,
                c.recorded as i64,
                c.dropped as i64,
                timestamp(s.last_flush.load(Ordering::Relaxed)),
                ServerText(status),
            )
        }
        _ => (
            false,
            audit,
            ServerText(database),
            None,
            0,
            0,
            0,
            0,
            0,
            None,
            ServerText(
                "not recording: add pg_lease to shared_preload_libraries and restart; refusals are still enforced and logged"
                    .to_owned(),
            ),
        ),
    };
    TableIterator::once(row)
}

/// What `lease.audit_status()` adds to `status` when changes applied by
/// logical replication in database `dboid` were refused: each subscription,
/// how many and when (its worker retries a refused change until it goes
/// through, holding back every later one). Empty otherwise.
fn replication_note(dboid: pg_sys::Oid) -> String {
    let show = |t: i64| timestamp(t).map(|t| t.to_string()).unwrap_or_default();
    shmem::replication_refusals(dboid)
        .into_iter()
        // Subscriptions dropped since (a new one may have the name) are not
        // news any more; a renamed one is shown under its name now.
        .filter_map(|(oid, _, refused, first, last)| {
            let crate::pg::ShownText(name) = pgrx::spi::Spi::get_one_with_args::<crate::pg::ShownText>(
                "SELECT s.subname::pg_catalog.text FROM pg_catalog.pg_subscription s
                  WHERE s.oid OPERATOR(pg_catalog.=) $1 AND s.subdbid OPERATOR(pg_catalog.=) $2",
                &[oid.into(), dboid.into()],
            )
            .ok()
            .flatten()?;
            Some((name, refused, first, last))
        })
        .map(|(name, refused, first, last)| {
            format!(
                "; replication: subscription {} had {refused} replicated change(s) refused by the fence (first at {}, last at {}): its worker retries the change until it goes through, holding back every later one (the refusal's HINT in the server log says the way out)",
                crate::pg::quote_ident(&name),
                show(first),
                show(last)
            )
        })
        .collect()
}

/// One row per audit destination the server has seen since it started: each
/// database with refusals (per database), or the central database. `state`
/// is what `status` starts with (see [`State`]).
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
pub fn audit_databases() -> TableIterator<
    'static,
    (
        name!(database, ServerText),
        name!(database_oid, Option<pg_sys::Oid>),
        name!(central, bool),
        name!(state, String),
        name!(worker_pid, Option<i32>),
        name!(queued, i64),
        name!(refused, i64),
        name!(recorded, i64),
        name!(dropped, i64),
        name!(last_flush_at, Option<TimestampWithTimeZone>),
        name!(last_error, Option<ServerText>),
        name!(last_error_at, Option<TimestampWithTimeZone>),
        name!(status, ServerText),
    ),
> {
    let audit = gucs::AUDIT.get();
    let launcher = shmem::launcher_pid();
    let capacity = shmem::counters().map_or(0, |c| c.capacity);
    let rows: Vec<_> = shmem::destinations()
        .into_iter()
        .map(|d| {
            let central = d.key == shmem::CENTRAL;
            let oid = if central {
                database_oid(&d.name)
            } else {
                crate::pg::database_name(pg_sys::Oid::from(d.key)).map(|_| pg_sys::Oid::from(d.key))
            };
            let name = match oid.filter(|_| !central) {
                Some(oid) => crate::pg::database_name(oid).unwrap_or_default(),
                None => d.name.clone(),
            };
            let (state, status) = if !central && oid.is_none() {
                // Dropped after its records were written (a drop with records
                // still queued says so itself).
                (State::Dropped, "dropped: the database no longer exists".to_owned())
            } else {
                Destination { central, name: &name, dest: Some(&d), capacity }.status(audit, launcher)
            };
            let state = state.as_str().to_owned();
            (
                ServerText(name.clone()),
                if central { oid } else { Some(pg_sys::Oid::from(d.key)) },
                central,
                state,
                (d.worker == shmem::WorkerState::Running).then_some(d.worker_pid),
                d.queued as i64,
                d.refused as i64,
                d.recorded as i64,
                d.dropped as i64,
                timestamp(d.last_flush),
                d.last_error.as_ref().map(|(e, _)| ServerText(e.clone())),
                d.last_error.as_ref().and_then(|(_, at)| timestamp(*at)),
                ServerText(status),
            )
        })
        .collect();
    TableIterator::new(rows)
}

fn database_oid(name: &str) -> Option<pg_sys::Oid> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a catalog lookup by a NUL-terminated name; missing_ok.
    let oid = unsafe { pg_sys::get_database_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

fn when(t: i64) -> String {
    crate::pg::timestamp_text(t)
}

/// What a destination's audit is doing: `lease.audit_databases().state`, and
/// the words its `status` starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Recording,
    Waiting,
    Failing,
    Starting,
    Dropped,
    NotRunning,
    Off,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Recording => "recording",
            State::Waiting => "waiting",
            State::Failing => "failing",
            State::Starting => "starting",
            State::Dropped => "dropped",
            State::NotRunning => "not running",
            State::Off => "off",
        }
    }
}

/// A destination as the status functions describe it.
struct Destination<'a> {
    central: bool,
    /// The database's name.
    name: &'a str,
    /// Its shared state, once a refusal (or the central writer) claimed it.
    dest: Option<&'a shmem::DestView>,
    capacity: u64,
}

impl Destination<'_> {
    /// Its state and `status`, which starts with the state's words:
    /// `recording`, `waiting` (for the database, the extension in it, a
    /// background worker slot or an audit worker slot), `failing` (with the
    /// last error), `starting`, `dropped`, `not running`, `off`. Refusals
    /// counted as dropped when they came (queue full, the database's share
    /// of it full, pg_lease.audit off) are named, with since when.
    fn status(&self, audit: bool, launcher: i32) -> (State, String) {
        let (state, mut text) = self.state(audit, launcher);
        text.push_str(&self.drops());
        (state, text)
    }

    fn drops(&self) -> String {
        let Some(d) = self.dest else { return String::new() };
        let mut text = String::new();
        let mut say = |drops: shmem::Drops, why: String| {
            if drops.count > 0 {
                let n = if drops.count == 1 {
                    "1 refusal was".to_owned()
                } else {
                    format!("{} refusals were", drops.count)
                };
                text.push_str(&format!("; {n} counted as dropped since {} {why}", when(drops.since)));
            }
        };
        say(d.full, format!("because the audit queue was full (pg_lease.audit_queue_size = {})", self.capacity));
        say(
            d.share,
            format!(
                "because the database already had {} queued while its audit was waiting or failing (a quarter of the queue)",
                shmem::stuck_limit(self.capacity)
            ),
        );
        say(d.off, "because pg_lease.audit was off (they were only logged)".to_owned());
        text
    }

    fn state(&self, audit: bool, launcher: i32) -> (State, String) {
        let database = self.name;
        let queued = self.dest.map_or(0, |d| d.queued);
        let phase = self.dest.map_or(Phase::Unknown, |d| d.phase);
        let limit = if self.central {
            "counted as dropped once the queue is full".to_owned()
        } else {
            format!(
                "while waiting or failing a database keeps at most {} queued, then they count as dropped",
                shmem::stuck_limit(self.capacity)
            )
        };
        let queue = match queued {
            0 => format!("refusals will stay queued ({limit})"),
            1 => format!("1 refusal waits in the queue ({limit})"),
            n => format!("{n} refusals wait in the queue ({limit})"),
        };
        let setting = if self.central { " (pg_lease.database)" } else { "" };
        if !audit {
            return (
                State::Off,
                "off: pg_lease.audit is off: refusals are counted as dropped and only logged".to_owned(),
            );
        }
        if phase == Phase::Dropped {
            let d = self.dest.expect("a dropped destination exists");
            let what = match &d.last_drop {
                Some((_, at)) => format!("its queued refusals were discarded at {} (counted as dropped)", when(*at)),
                None => "nothing of it was queued".to_owned(),
            };
            return (State::Dropped, format!("dropped: database \"{database}\" was dropped; {what}"));
        }
        if self.central && database_oid(database).is_none() {
            return (
                State::Waiting,
                format!(
                    "waiting for database \"{database}\"{setting} to exist: create it and CREATE EXTENSION pg_lease there; the launcher looks every second; {queue}"
                ),
            );
        }
        if phase == Phase::WaitingExtension {
            return (
                State::Waiting,
                format!("waiting for CREATE EXTENSION pg_lease in database \"{database}\"{setting}; {queue}"),
            );
        }
        let running = self.dest.is_some_and(|d| d.worker == shmem::WorkerState::Running);
        if let Some((error, at)) = self.dest.and_then(|d| d.last_error.clone()).filter(|_| phase != Phase::Recording) {
            let retry = if launcher == 0 {
                "the audit launcher is not running (it restarts within 5 s)"
            } else if phase == Phase::NotAccepting {
                "the launcher looks every second"
            } else {
                "writing is retried every second"
            };
            return (State::Failing, format!("failing since {}: {error}; {retry}; {queue}", when(at)));
        }
        if launcher == 0 {
            return if crate::pg::in_recovery() {
                (
                    State::NotRunning,
                    "not running: this server is a standby, which refuses no writes; the audit launcher starts once it is promoted"
                        .to_owned(),
                )
            } else {
                (
                    State::NotRunning,
                    format!(
                        "not running: the audit launcher is not running (stopped by pg_terminate_backend or by an error, it restarts within 5 s); {queue} for database \"{database}\""
                    ),
                )
            };
        }
        let idle = |t: i64| t != 0 && queued > 0 && !running;
        if let Some(since) = self.dest.map(|d| d.no_slot_since).filter(|&t| idle(t)) {
            return (
                State::Waiting,
                format!(
                    "waiting since {} for a free background worker slot to start the writer of database \"{database}\" (raise max_worker_processes); {queue}",
                    when(since)
                ),
            );
        }
        if let Some(since) =
            self.dest.filter(|d| d.worker == shmem::WorkerState::None).map(|d| d.no_turn_since).filter(|&t| idle(t))
        {
            return (
                State::Waiting,
                format!(
                    "waiting since {} for an audit worker slot: pg_lease.audit_workers ({}) writers are busy with other databases, the least recently served database goes next; {queue}",
                    when(since),
                    gucs::AUDIT_WORKERS.get()
                ),
            );
        }
        if queued > 0 && !running && phase != Phase::Recording {
            return (
                State::Starting,
                format!("starting: a writer for database \"{database}\" is being started; {queue}"),
            );
        }
        if phase == Phase::Connecting {
            return (
                State::Starting,
                format!("starting: the writer is connecting to database \"{database}\"; {queue}"),
            );
        }
        if self.central && phase == Phase::Unknown {
            return (
                State::Starting,
                format!("starting: the writer of database \"{database}\"{setting} is being started; {queue}"),
            );
        }
        let mut text = if self.central {
            format!("recording refusals of every database in \"{database}\".lease.rejected_writes")
        } else {
            format!("recording refusals of database \"{database}\" in its own lease.rejected_writes")
        };
        if let Some((why, at)) = self.dest.and_then(|d| d.last_drop.clone()) {
            text.push_str(&format!("; the last record it could not write was dropped at {}: {why}", when(at)));
        }
        (State::Recording, text)
    }
}

/// Zeroes accepted/refused/recorded/dropped counters (queued records stay).
#[pg_extern(volatile, parallel_unsafe)]
pub fn stats_reset() {
    shmem::reset();
}
