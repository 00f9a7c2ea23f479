//! pg_lease's shared memory: the refusal queue, its counters and per-table
//! stats. Present only when pg_lease is in `shared_preload_libraries`.
//!
//! The queue is a ring of fixed-size records guarded by one LWLock that is
//! held only to copy a record in or out and to move counters, so a refusing
//! backend never waits on the audit table. Accounting closes exactly under
//! that lock: `refused = recorded + dropped + (head - tail)`.

use crate::gucs;
use pgrx::pg_sys;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// A string truncated to fit, at a character boundary.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FixedStr<const N: usize> {
    len: u16,
    bytes: [u8; N],
}

impl<const N: usize> FixedStr<N> {
    pub const EMPTY: Self = FixedStr { len: 0, bytes: [0; N] };

    /// Stores `s`, NUL characters replaced by U+FFFD (text cannot hold
    /// them), cut to `N` bytes at a character boundary.
    pub fn set(&mut self, s: &str) {
        let s = super::sanitize::without_nul(s);
        let mut end = s.len().min(N);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes[..end].copy_from_slice(&s.as_bytes()[..end]);
        self.len = end as u16;
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One refusal, as the worker will insert it into `lease.rejected_writes`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AuditRecord {
    pub rejected_at: i64,
    pub presented: i64,
    pub current: i64,
    pub backend_pid: i32,
    pub table_relid: u32,
    pub has_presented: bool,
    pub has_current: bool,
    pub sqlstate: [u8; 5],
    pub database: FixedStr<64>,
    pub role: FixedStr<64>,
    pub application_name: FixedStr<64>,
    pub client_addr: FixedStr<64>,
    pub operation: FixedStr<16>,
    pub target_table: FixedStr<160>,
    pub resource_key: FixedStr<256>,
    pub statement: FixedStr<512>,
    pub row_data: FixedStr<512>,
}

impl AuditRecord {
    pub const EMPTY: AuditRecord = AuditRecord {
        rejected_at: 0,
        presented: 0,
        current: 0,
        backend_pid: 0,
        table_relid: 0,
        has_presented: false,
        has_current: false,
        sqlstate: [0; 5],
        database: FixedStr::EMPTY,
        role: FixedStr::EMPTY,
        application_name: FixedStr::EMPTY,
        client_addr: FixedStr::EMPTY,
        operation: FixedStr::EMPTY,
        target_table: FixedStr::EMPTY,
        resource_key: FixedStr::EMPTY,
        statement: FixedStr::EMPTY,
        row_data: FixedStr::EMPTY,
    };
}

/// Per protected table counters, claimed on first use by (database, table).
#[repr(C)]
pub struct StatSlot {
    pub dboid: AtomicU32,
    pub relid: AtomicU32,
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub last_refusal: AtomicI64,
    /// Written once, under the lock, when the slot is claimed.
    pub table_name: FixedStr<160>,
}

pub const STAT_SLOTS: usize = 1024;

/// What the audit worker is doing, as it last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// Not started, or exited.
    Stopped = 0,
    /// Started, connecting to `pg_lease.database`.
    Connecting = 1,
    /// Its last write (or check) of `lease.rejected_writes` succeeded.
    Recording = 2,
    /// Connected, but `lease.rejected_writes` does not exist there.
    WaitingExtension = 3,
    /// It cannot write `lease.rejected_writes`; the error is in `last_error`.
    Failing = 4,
}

impl Phase {
    fn from_u32(v: u32) -> Phase {
        match v {
            1 => Phase::Connecting,
            2 => Phase::Recording,
            3 => Phase::WaitingExtension,
            4 => Phase::Failing,
            _ => Phase::Stopped,
        }
    }
}

pub const NOTE_LEN: usize = 480;

#[repr(C)]
pub struct Shared {
    capacity: u64,
    // Under the lock:
    head: u64,
    tail: u64,
    refused: u64,
    recorded: u64,
    dropped: u64,
    /// Why the worker cannot record (set when a write fails or the worker
    /// dies, cleared when a later write succeeds), and since when.
    last_error: FixedStr<NOTE_LEN>,
    last_error_at: i64,
    /// Why the worker last dropped a record it could not write, and when.
    last_drop: FixedStr<NOTE_LEN>,
    last_drop_at: i64,
    // Lock-free:
    pub last_flush: AtomicI64,
    pub worker_pid: AtomicI32,
    phase: AtomicU32,
    worker_latch: AtomicPtr<pg_sys::Latch>,
    pub stats: [StatSlot; STAT_SLOTS],
    // `capacity` records follow.
}

static mut SHARED: *mut Shared = std::ptr::null_mut();
static mut LOCK: *mut pg_sys::LWLock = std::ptr::null_mut();
static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

const TRANCHE: &std::ffi::CStr = c"pg_lease";

fn size_for(capacity: usize) -> usize {
    std::mem::size_of::<Shared>() + capacity * std::mem::size_of::<AuditRecord>()
}

/// Installs the shared-memory hooks; only from `_PG_init` during preload.
pub unsafe fn install_hooks() {
    PREV_REQUEST = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request);
    PREV_STARTUP = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(startup);
}

unsafe extern "C-unwind" fn request() {
    if let Some(prev) = PREV_REQUEST {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(size_for(gucs::AUDIT_QUEUE_SIZE.get() as usize));
    pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
}

unsafe extern "C-unwind" fn startup() {
    if let Some(prev) = PREV_STARTUP {
        prev();
    }
    let capacity = gucs::AUDIT_QUEUE_SIZE.get() as usize;
    // AddinShmemInitLock, as lwlock.h defines it.
    let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
    pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let shared = pg_sys::ShmemInitStruct(c"pg_lease".as_ptr(), size_for(capacity), &mut found) as *mut Shared;
    if !found {
        std::ptr::write_bytes(shared as *mut u8, 0, size_for(capacity));
        (*shared).capacity = capacity as u64;
    }
    LOCK = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
    SHARED = shared;
    pg_sys::LWLockRelease(init_lock);
}

/// The shared state, if pg_lease was preloaded.
pub fn shared() -> Option<&'static Shared> {
    unsafe { (!SHARED.is_null()).then(|| &*SHARED) }
}

struct Locked;

impl Locked {
    fn acquire() -> Locked {
        unsafe { pg_sys::LWLockAcquire(LOCK, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        Locked
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        unsafe { pg_sys::LWLockRelease(LOCK) };
    }
}

unsafe fn records(shared: *mut Shared) -> *mut AuditRecord {
    (shared as *mut u8).add(std::mem::size_of::<Shared>()) as *mut AuditRecord
}

/// Counts a refusal and queues its record, or counts it dropped when the
/// queue is full (or auditing is off). The worker flushes every
/// `pg_lease.audit_flush_ms`; it is woken early once the queue is half full.
pub fn enqueue(record: Option<&AuditRecord>) {
    let Some(_) = shared() else { return };
    let half_full = unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        (*s).refused += 1;
        match record {
            Some(r) if (*s).head - (*s).tail < (*s).capacity => {
                let slot = records(s).add(((*s).head % (*s).capacity) as usize);
                std::ptr::copy_nonoverlapping(r, slot, 1);
                (*s).head += 1;
                (*s).head - (*s).tail >= (*s).capacity / 2
            }
            _ => {
                (*s).dropped += 1;
                false
            }
        }
    };
    if half_full {
        wake_worker();
    }
}

fn wake_worker() {
    if let Some(s) = shared() {
        let latch = s.worker_latch.load(Ordering::Acquire);
        if !latch.is_null() {
            unsafe { pg_sys::SetLatch(latch) };
        }
    }
}

/// Registers the calling process as the queue's worker (or unregisters it).
pub fn set_worker(latch: *mut pg_sys::Latch, pid: i32) {
    if let Some(s) = shared() {
        s.worker_latch.store(latch, Ordering::Release);
        s.worker_pid.store(pid, Ordering::Release);
    }
}

/// Copies up to `max` of the oldest queued records, leaving them queued
/// until [`commit_recorded`] says they are in the table.
pub fn peek(max: usize, out: &mut Vec<AuditRecord>) {
    out.clear();
    if shared().is_none() {
        return;
    }
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        let n = ((*s).head - (*s).tail).min(max as u64);
        for i in 0..n {
            out.push(*records(s).add((((*s).tail + i) % (*s).capacity) as usize));
        }
    }
}

/// The first `n` queued records are done with: `dropped` of them could not
/// be written and are counted as dropped, the others are committed to the
/// audit table.
pub fn commit_recorded(n: usize, dropped: usize, now: i64) {
    if shared().is_none() {
        return;
    }
    debug_assert!(dropped <= n);
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        (*s).tail += n as u64;
        (*s).recorded += (n - dropped) as u64;
        (*s).dropped += dropped as u64;
        (*s).last_flush.store(now, Ordering::Relaxed);
    }
}

pub fn set_phase(phase: Phase) {
    if let Some(s) = shared() {
        s.phase.store(phase as u32, Ordering::Release);
    }
}

pub fn phase() -> Phase {
    shared().map_or(Phase::Stopped, |s| Phase::from_u32(s.phase.load(Ordering::Acquire)))
}

/// Records why the worker cannot record; `None` clears it.
pub fn set_last_error(error: Option<&str>, now: i64) {
    if shared().is_none() {
        return;
    }
    unsafe {
        // From the worker's error hook the lock may already be ours (an
        // error raised while holding it): then the note is skipped rather
        // than self-deadlocking.
        if pg_sys::LWLockHeldByMe(LOCK) {
            return;
        }
        let _lock = Locked::acquire();
        let s = SHARED;
        match error {
            Some(e) => {
                let mut note = FixedStr::EMPTY;
                note.set(e);
                // The same error again: it has lasted since the first time.
                if (*s).last_error.as_str() != note.as_str() || (*s).last_error_at == 0 {
                    (*s).last_error = note;
                    (*s).last_error_at = now;
                }
            }
            None => {
                (*s).last_error = FixedStr::EMPTY;
                (*s).last_error_at = 0;
            }
        }
    }
}

/// Records why the worker dropped a record.
pub fn set_last_drop(why: &str, now: i64) {
    if shared().is_none() {
        return;
    }
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        (*s).last_drop.set(why);
        (*s).last_drop_at = now;
    }
}

/// What the worker last said went wrong: (message, when).
#[derive(Clone, Debug, Default)]
pub struct WorkerNotes {
    pub last_error: Option<(String, i64)>,
    pub last_drop: Option<(String, i64)>,
}

pub fn notes() -> WorkerNotes {
    if shared().is_none() {
        return WorkerNotes::default();
    }
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        let note = |text: &FixedStr<NOTE_LEN>, at: i64| (!text.is_empty()).then(|| (text.as_str().to_owned(), at));
        WorkerNotes {
            last_error: note(&(*s).last_error, (*s).last_error_at),
            last_drop: note(&(*s).last_drop, (*s).last_drop_at),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub capacity: u64,
    pub queued: u64,
    pub refused: u64,
    pub recorded: u64,
    pub dropped: u64,
}

/// A consistent snapshot of the queue counters.
pub fn counters() -> Option<Counters> {
    shared()?;
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        Some(Counters {
            capacity: (*s).capacity,
            queued: (*s).head - (*s).tail,
            refused: (*s).refused,
            recorded: (*s).recorded,
            dropped: (*s).dropped,
        })
    }
}

/// Zeroes the counters and per-table stats; what is still queued stays
/// counted as refused, so the accounting keeps closing.
pub fn reset() {
    let Some(shared) = shared() else { return };
    unsafe {
        let _lock = Locked::acquire();
        let s = SHARED;
        (*s).refused = (*s).head - (*s).tail;
        (*s).recorded = 0;
        (*s).dropped = 0;
        (*s).last_drop = FixedStr::EMPTY;
        (*s).last_drop_at = 0;
    }
    for slot in &shared.stats {
        slot.accepted.store(0, Ordering::Relaxed);
        slot.refused.store(0, Ordering::Relaxed);
        slot.last_refusal.store(0, Ordering::Relaxed);
    }
}

/// The stats slot of (database, table), claimed if new; None when every slot
/// is taken (the table then goes uncounted) or without shared memory.
pub fn stat_slot(dboid: pg_sys::Oid, relid: pg_sys::Oid, table_name: &str) -> Option<&'static StatSlot> {
    let shared = shared()?;
    let (db, rel) = (dboid.to_u32(), relid.to_u32());
    let find = || {
        shared.stats.iter().find(|s| s.dboid.load(Ordering::Acquire) == db && s.relid.load(Ordering::Acquire) == rel)
    };
    if let Some(slot) = find() {
        return Some(slot);
    }
    let _lock = Locked::acquire();
    if let Some(slot) = find() {
        return Some(slot);
    }
    let slot = shared.stats.iter().find(|s| s.relid.load(Ordering::Acquire) == 0)?;
    // Only this (locked) writer touches a free slot's name.
    unsafe { (*(slot as *const StatSlot as *mut StatSlot)).table_name.set(table_name) };
    slot.dboid.store(db, Ordering::Release);
    slot.relid.store(rel, Ordering::Release);
    Some(slot)
}
