//! pg_lease's shared memory: the refusal queue, its counters, the state of
//! each audit destination, and per-table stats. Present only when pg_lease is
//! in `shared_preload_libraries`.
//!
//! The queue is a pool of fixed-size records, one FIFO list per
//! *destination*: the database whose `lease.rejected_writes` takes them (the
//! refusing database itself, or the one central database named by
//! `pg_lease.database`). One LWLock guards the pool, the lists and every
//! destination's counters and notes; it is held only to copy a record in or
//! out and to move counters, so a refusing backend never waits on an audit
//! table. Accounting closes exactly under that lock, for the whole queue and
//! for each destination: `refused = recorded + dropped + queued`.

use crate::gucs;
use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

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

/// How many bytes of UTF-8 a record keeps of the refused statement.
pub const STATEMENT_BYTES: usize = 512;

/// One refusal, as a writer will insert it into `lease.rejected_writes`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AuditRecord {
    pub rejected_at: i64,
    pub presented: i64,
    pub current: i64,
    pub backend_pid: i32,
    pub table_relid: u32,
    /// The refusing database's OID (its name is in `database`).
    pub database_oid: u32,
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
    pub statement: FixedStr<STATEMENT_BYTES>,
    pub row_data: FixedStr<512>,
}

impl AuditRecord {
    pub const EMPTY: AuditRecord = AuditRecord {
        rejected_at: 0,
        presented: 0,
        current: 0,
        backend_pid: 0,
        table_relid: 0,
        database_oid: 0,
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
/// A slot whose table or database no longer exists is freed for another
/// table once every slot is taken (see [`stat_slot`]).
#[repr(C)]
pub struct StatSlot {
    /// `(database OID << 32) | table OID`, 0 while the slot is free: one
    /// word, so a lock-free reader never pairs one claim's database with
    /// another's table. Written only under the lock.
    key: AtomicU64,
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    /// Rows applied by a trusted logical replication worker, accepted as
    /// judged at their origin.
    pub replicated: AtomicU64,
    pub last_refusal: AtomicI64,
    /// Written and read only under the lock (written while the slot is
    /// claimed, before `key` is published). Room for any qualified name as
    /// shown: two names of at most 63 bytes, each byte written out as `\xNN`
    /// at worst, quoted, and a dot (a record's `target_table` may be cut; it
    /// has the relid beside it).
    table_name: UnsafeCell<FixedStr<512>>,
}

impl StatSlot {
    /// Zeroes the counters (`lease.stats_reset()`, or a slot claimed anew).
    fn zero(&self) {
        self.accepted.store(0, Ordering::Relaxed);
        self.refused.store(0, Ordering::Relaxed);
        self.replicated.store(0, Ordering::Relaxed);
        self.last_refusal.store(0, Ordering::Relaxed);
    }
}

/// A claimed slot as `lease.stats` shows it (read under the lock).
pub struct StatRow {
    pub dboid: pg_sys::Oid,
    pub relid: pg_sys::Oid,
    pub table_name: String,
    pub accepted: u64,
    pub refused: u64,
    pub replicated: u64,
    pub last_refusal: i64,
}

fn stat_key(db: u32, rel: u32) -> u64 {
    (u64::from(db) << 32) | u64::from(rel)
}

fn split_key(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

/// Destinations tracked at once: databases with queued refusals or a running
/// writer always keep theirs; an idle one is reused, oldest first.
pub const DESTS: usize = 256;

/// The destination key of the central table (`pg_lease.database` set);
/// otherwise a destination's key is its database's OID.
pub const CENTRAL: u32 = 0;

/// What a destination's writer last found, as it said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Phase {
    /// No writer has looked yet.
    Unknown = 0,
    /// A writer started and is connecting to the database.
    Connecting = 1,
    /// Its last write (or check) of `lease.rejected_writes` succeeded.
    Recording = 2,
    /// Connected, but `lease.rejected_writes` does not exist there.
    WaitingExtension = 3,
    /// It cannot write `lease.rejected_writes`; the error is in `last_error`.
    Failing = 4,
    /// The database no longer exists: its queued records were discarded.
    Dropped = 5,
    /// The database does not accept connections (`datallowconn` is false):
    /// the launcher starts no writer for it until it does (`last_error` says so).
    NotAccepting = 6,
}

/// Whether a writer serves a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WorkerState {
    None = 0,
    /// Registered by the launcher, not yet attached.
    Launched = 1,
    Running = 2,
}

pub const NOTE_LEN: usize = 480;
const NIL: u32 = u32::MAX;

/// One destination: its list of queued records, counters, writer and notes.
/// Every field is read and written under the lock only.
#[repr(C)]
struct Dest {
    in_use: bool,
    key: u32,
    /// The database's name, as the refusing backend (or the writer) saw it.
    name: FixedStr<64>,
    head: u32,
    tail: u32,
    queued: u64,
    refused: u64,
    recorded: u64,
    dropped: u64,
    last_refusal: i64,
    last_flush: i64,
    phase: Phase,
    worker: WorkerState,
    worker_pid: i32,
    worker_latch: *mut pg_sys::Latch,
    launched_at: i64,
    /// Since when the launcher could not start a writer (no free background
    /// worker slot); 0 when it could.
    no_slot_since: i64,
    /// Since when records wait for a writer because `pg_lease.audit_workers`
    /// writers already run (for other databases); 0 when they do not.
    no_turn_since: i64,
    /// Refusals counted as dropped at enqueue, by cause, each with the time of
    /// the first one (since the start or `lease.stats_reset()`).
    full: Drops,
    share: Drops,
    off: Drops,
    /// Why the writer cannot record (set when a write fails or the writer
    /// dies, cleared when a later write succeeds), and since when.
    last_error: FixedStr<NOTE_LEN>,
    last_error_at: i64,
    /// Why the writer last dropped records it could not write, and when.
    last_drop: FixedStr<NOTE_LEN>,
    last_drop_at: i64,
}

/// Refusals dropped for one cause: how many, since when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    pub count: u64,
    pub since: i64,
}

impl Drops {
    fn add(&mut self, now: i64) {
        if self.count == 0 {
            self.since = now;
        }
        self.count += 1;
    }
}

/// Replicated changes the fence refused, per subscription (see
/// [`note_replication_refusal`]). Under the lock only.
#[repr(C)]
#[derive(Clone, Copy)]
struct SubscriptionNote {
    in_use: bool,
    dboid: u32,
    subid: u32,
    name: FixedStr<64>,
    refused: u64,
    first_at: i64,
    last_at: i64,
}

/// Subscriptions whose refusals are kept at once; beyond, the one refused
/// longest ago gives its place up.
pub const SUBSCRIPTION_NOTES: usize = 32;

/// A queued record and the index of the next one in its list.
#[repr(C)]
struct Node {
    next: u32,
    record: AuditRecord,
}

/// The state only the lock holder touches: the record pool, the
/// destinations and the totals. Reached only through [`Locked::state`].
#[repr(C)]
pub struct Queue {
    capacity: u64,
    free: u32,
    queued: u64,
    refused: u64,
    recorded: u64,
    dropped: u64,
    dests: [Dest; DESTS],
    subscriptions: [SubscriptionNote; SUBSCRIPTION_NOTES],
}

#[repr(C)]
pub struct Shared {
    /// Under the lock only (an UnsafeCell: `&Shared` is shared by every
    /// process, and the lock holder writes through it).
    queue: UnsafeCell<Queue>,
    // Lock-free:
    pub last_flush: AtomicI64,
    launcher_pid: AtomicI32,
    launcher_latch: AtomicPtr<pg_sys::Latch>,
    /// Set by the launcher while destinations with records wait for a writer
    /// because `pg_lease.audit_workers` are busy: writers then end their turn.
    pub starved: AtomicBool,
    /// How many stats slots follow the struct (`pg_lease.stats_tables` at
    /// server start); set before the struct is published, never changed.
    stat_slots: usize,
    /// Stats slots claimed since the server started (see [`claims`]).
    claims: AtomicU64,
    // `stat_slots` stats slots follow, then `capacity` nodes.
}

impl Shared {
    /// The stats slots that follow the struct.
    pub fn stats(&self) -> &[StatSlot] {
        // SAFETY: `startup` allocated `size_for(capacity, stat_slots)`
        // bytes: the struct, then `stat_slots` slots (all-zero bytes are a
        // free slot), which live as long as the server; slots are only
        // reached through atomics and the lock-guarded name.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Shared as *const u8).add(std::mem::size_of::<Shared>()) as *const StatSlot,
                self.stat_slots,
            )
        }
    }
}

/// The shared state and its lock, set once by `startup` in the postmaster
/// (inherited by every process it forks) or in a backend attaching to it.
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static LOCK: AtomicPtr<pg_sys::LWLock> = AtomicPtr::new(std::ptr::null_mut());
/// The hooks installed before ours (called first).
static PREV_REQUEST: OnceLock<pg_sys::shmem_request_hook_type> = OnceLock::new();
static PREV_STARTUP: OnceLock<pg_sys::shmem_startup_hook_type> = OnceLock::new();

const TRANCHE: &std::ffi::CStr = c"pg_lease";

fn size_for(capacity: usize, stat_slots: usize) -> usize {
    std::mem::size_of::<Shared>()
        + stat_slots * std::mem::size_of::<StatSlot>()
        + capacity * std::mem::size_of::<Node>()
}

/// The server-start settings that size the shared state.
fn sizes() -> (usize, usize) {
    (gucs::AUDIT_QUEUE_SIZE.get() as usize, gucs::STATS_TABLES.get() as usize)
}

/// Installs the shared-memory hooks.
///
/// # Safety
/// Only from `_PG_init` while shared_preload_libraries loads (the
/// postmaster, single-threaded, before any hook runs).
pub unsafe fn install_hooks() {
    // SAFETY: the caller's contract: nothing reads the hooks concurrently.
    unsafe {
        PREV_REQUEST.get_or_init(|| pg_sys::shmem_request_hook);
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP.get_or_init(|| pg_sys::shmem_startup_hook);
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

/// `shmem_request_hook`: the space and the lock pg_lease needs.
extern "C-unwind" fn request() {
    if let Some(prev) = PREV_REQUEST.get().copied().flatten() {
        // SAFETY: the hook installed before ours, called where it expects.
        unsafe { prev() };
    }
    // SAFETY: called in the postmaster's shared-memory request phase, the
    // only time these may be called.
    unsafe {
        let (capacity, stat_slots) = sizes();
        pg_sys::RequestAddinShmemSpace(size_for(capacity, stat_slots));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
    }
}

/// `shmem_startup_hook`: creates (or finds) the shared state.
extern "C-unwind" fn startup() {
    if let Some(prev) = PREV_STARTUP.get().copied().flatten() {
        // SAFETY: the hook installed before ours, called where it expects.
        unsafe { prev() };
    }
    let (capacity, stat_slots) = sizes();
    // SAFETY: the protocol of every extension's startup hook: under
    // AddinShmemInitLock (index 21 of MainLWLockArray, as lwlock.h defines
    // it), ShmemInitStruct returns `size_for(capacity, stat_slots)` bytes of shared
    // memory (the size requested in `request`), zeroed and initialized here
    // once (`found` false) before anyone else can see them; the named tranche
    // exists (requested in `request`).
    unsafe {
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let size = size_for(capacity, stat_slots);
        let shared = pg_sys::ShmemInitStruct(c"pg_lease".as_ptr(), size, &mut found) as *mut Shared;
        if !found {
            // All zero is a valid state for every field (no destination in use,
            // Phase::Unknown, WorkerState::None, free stats slots), except the
            // free list and the slot count.
            std::ptr::write_bytes(shared as *mut u8, 0, size);
            (*shared).stat_slots = stat_slots;
            let queue = &mut *(*shared).queue.get();
            queue.capacity = capacity as u64;
            let nodes = nodes(shared);
            for i in 0..capacity {
                (*nodes.add(i)).next = if i + 1 < capacity { (i + 1) as u32 } else { NIL };
            }
            queue.free = if capacity > 0 { 0 } else { NIL };
        }
        LOCK.store(&raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock, Ordering::Release);
        SHARED.store(shared, Ordering::Release);
        pg_sys::LWLockRelease(init_lock);
    }
}

/// The shared state, if pg_lease was preloaded.
pub fn shared() -> Option<&'static Shared> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: null, or the shared memory `startup` initialized, which lives
    // as long as the server; `Shared`'s locked part is only reached through
    // its UnsafeCell under the lock, the rest is atomics.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The lock, held until dropped; gives the locked state.
struct Locked;

impl Locked {
    /// Precondition: this process does not hold the lock already (LWLocks
    /// are not re-entrant: it would wait for itself). Panics without shared
    /// memory (callers check [`shared`] first).
    fn acquire() -> Locked {
        let lock = LOCK.load(Ordering::Acquire);
        assert!(!lock.is_null(), "pg_lease: the audit's shared memory is not set up");
        // SAFETY: the tranche's LWLock in shared memory (set by `startup`),
        // released by Drop, or by Postgres' error recovery (LWLockReleaseAll)
        // when an ERROR longjmps past the guard.
        unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        Locked
    }

    /// The locked state, borrowed from the guard: only under the lock, and
    /// only one `&mut` at a time.
    fn state(&mut self) -> &mut Queue {
        // SAFETY: SHARED is set (the guard exists only with shared memory);
        // this process holds the lock, which every access to `queue` takes,
        // and the `&mut self` borrow keeps this the only reference to it.
        unsafe { &mut *(*SHARED.load(Ordering::Acquire)).queue.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: the lock `acquire` took (a guard exists only then).
        unsafe { pg_sys::LWLockRelease(LOCK.load(Ordering::Acquire)) };
    }
}

/// The pool of nodes that follows the shared struct.
///
/// # Safety
/// `shared` points to the whole `size_for(capacity, stat_slots)` allocation,
/// its `stat_slots` set.
unsafe fn nodes(shared: *mut Shared) -> *mut Node {
    // SAFETY: the caller's contract: the nodes start right after the struct
    // and its stats slots.
    unsafe {
        (shared as *mut u8).add(std::mem::size_of::<Shared>() + (*shared).stat_slots * std::mem::size_of::<StatSlot>())
            as *mut Node
    }
}

/// Node `i` of the pool, borrowed from the locked queue.
fn node(s: &mut Queue, i: u32) -> &mut Node {
    assert!((i as u64) < s.capacity, "audit pool index {i} out of range");
    // SAFETY: SHARED spans the struct and `capacity` nodes (size_for); `s`
    // proves the lock is held, and borrowing it keeps the node unique.
    unsafe { &mut *nodes(SHARED.load(Ordering::Acquire)).add(i as usize) }
}

thread_local! {
    /// The destination this process found last: a backend refuses in one
    /// database, so a refusal usually finds its destination at once.
    static LAST_DEST: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// The index of the destination `key` (under the lock).
fn find(s: &Queue, key: u32) -> Option<usize> {
    let hint = LAST_DEST.with(|h| h.get());
    if hint < DESTS && s.dests[hint].in_use && s.dests[hint].key == key {
        return Some(hint);
    }
    let i = s.dests.iter().position(|d| d.in_use && d.key == key)?;
    LAST_DEST.with(|h| h.set(i));
    Some(i)
}

/// The destination `key`, claimed if new: a free slot, else the idle one
/// (nothing queued, no writer) whose last refusal is oldest. None when every
/// destination has records or a writer (under the lock).
fn find_or_claim(s: &mut Queue, key: u32, name: &str) -> Option<usize> {
    if let Some(i) = find(s, key) {
        return Some(i);
    }
    let i = s.dests.iter().position(|d| !d.in_use).or_else(|| {
        (0..DESTS)
            .filter(|&i| s.dests[i].queued == 0 && s.dests[i].worker == WorkerState::None)
            .min_by_key(|&i| s.dests[i].last_refusal)
    })?;
    let d = &mut s.dests[i];
    // Zero it whole: a reused destination starts with no counters or notes.
    // SAFETY: all-zero bytes are a valid Dest (integers, false, a null
    // latch, and enums whose 0 is a variant: Phase::Unknown, WorkerState::None),
    // written through the unique borrow `d`.
    unsafe { std::ptr::write_bytes(d as *mut Dest as *mut u8, 0, std::mem::size_of::<Dest>()) };
    d.in_use = true;
    d.key = key;
    d.name.set(name);
    d.head = NIL;
    d.tail = NIL;
    Some(i)
}

/// How many records a destination whose writer cannot record (waiting for
/// the extension, or failing) may keep queued, in per-database mode: a
/// quarter of the queue, so that databases that record keep the rest.
pub fn stuck_limit(capacity: u64) -> u64 {
    (capacity / 4).max(1)
}

/// Counts a refusal and queues its record for its destination, or counts it
/// dropped: auditing off (`keep` false: only the record's database is
/// read), queue full, its destination stuck at [`stuck_limit`], or no
/// destination free. Wakes the destination's writer when the queue is half
/// full, or the launcher when the destination had nothing queued and has no
/// writer. Takes the lock (see [`Locked`]).
pub fn enqueue(record: &AuditRecord, keep: bool) {
    let Some(shared) = shared() else {
        return;
    };
    let central = gucs::central_database();
    let wake = {
        let mut lock = Locked::acquire();
        let s = lock.state();
        s.refused += 1;
        let (key, name) = match &central {
            Some(name) => (CENTRAL, name.as_str()),
            None => (record.database_oid, record.database.as_str()),
        };
        let Some(i) = find_or_claim(s, key, name) else {
            s.dropped += 1;
            return;
        };
        let (capacity, free, queued_total) = (s.capacity, s.free, s.queued);
        let d = &mut s.dests[i];
        d.refused += 1;
        d.last_refusal = record.rejected_at;
        let stuck = matches!(d.phase, Phase::WaitingExtension | Phase::Failing | Phase::NotAccepting);
        let drop = if !keep {
            Some(&mut d.off)
        } else if free == NIL {
            Some(&mut d.full)
        } else if central.is_none() && stuck && d.queued >= stuck_limit(capacity) {
            Some(&mut d.share)
        } else {
            None
        };
        if let Some(cause) = drop {
            cause.add(record.rejected_at);
            d.dropped += 1;
            s.dropped += 1;
            return;
        }
        let (was_empty, tail, worker, latch) = (d.queued == 0, d.tail, d.worker, d.worker_latch);
        s.free = node(s, free).next;
        let n = node(s, free);
        n.next = NIL;
        n.record = *record;
        if tail == NIL {
            s.dests[i].head = free;
        } else {
            node(s, tail).next = free;
        }
        let d = &mut s.dests[i];
        d.tail = free;
        d.queued += 1;
        s.queued += 1;
        // A running writer looks at least every flush interval; it is woken
        // early only to keep the queue from filling.
        match worker {
            WorkerState::Running if queued_total + 1 >= capacity / 2 => latch,
            WorkerState::None if was_empty => shared.launcher_latch.load(Ordering::Acquire),
            _ => std::ptr::null_mut(),
        }
    };
    if !wake.is_null() {
        // SAFETY: a PGPROC latch (shared memory, lives as long as the
        // server) registered by a running writer or the launcher; setting the
        // latch of a process that has just exited is harmless.
        unsafe { pg_sys::SetLatch(wake) };
    }
}

/// Whether the queue is at least half full (writers then flush at once).
pub fn half_full() -> bool {
    let Some(_) = shared() else { return false };
    let mut lock = Locked::acquire();
    let s = lock.state();
    s.queued >= s.capacity / 2
}

/// Registers the calling process as the launcher (or unregisters it).
pub fn set_launcher(latch: *mut pg_sys::Latch, pid: i32) {
    if let Some(s) = shared() {
        s.launcher_latch.store(latch, Ordering::Release);
        s.launcher_pid.store(pid, Ordering::Release);
    }
}

pub fn launcher_pid() -> i32 {
    shared().map_or(0, |s| s.launcher_pid.load(Ordering::Acquire))
}

/// Makes the calling process the writer of destination `key` (claimed if
/// new, named `name`). None when another writer runs for it, or no
/// destination is free.
pub fn attach(key: u32, name: &str, latch: *mut pg_sys::Latch, pid: i32) -> Option<usize> {
    shared()?;
    let mut lock = Locked::acquire();
    let s = lock.state();
    let i = find_or_claim(s, key, name)?;
    let d = &mut s.dests[i];
    if d.worker == WorkerState::Running && d.worker_pid != pid {
        return None;
    }
    d.worker = WorkerState::Running;
    d.worker_pid = pid;
    d.worker_latch = latch;
    d.no_slot_since = 0;
    d.no_turn_since = 0;
    Some(i)
}

/// The writer `pid` of destination `i` stops serving it: only when nothing
/// is queued for it if `only_if_idle` (so a record queued meanwhile always
/// finds a writer or wakes the launcher). Whether it detached.
pub fn detach(i: usize, pid: i32, only_if_idle: bool) -> bool {
    if shared().is_none() {
        return true;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    if only_if_idle && d.queued > 0 {
        return false;
    }
    if d.worker_pid == pid {
        d.worker = WorkerState::None;
        d.worker_pid = 0;
        d.worker_latch = std::ptr::null_mut();
    }
    true
}

/// Claims destination `key` (named `name`) with nothing queued: the central
/// one, which has a writer whatever is queued.
pub fn claim(key: u32, name: &str) -> Option<usize> {
    shared()?;
    let mut lock = Locked::acquire();
    find_or_claim(lock.state(), key, name)
}

/// Renames destination `i` (the writer knows its database's current name).
pub fn set_name(i: usize, name: &str) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    lock.state().dests[i].name.set(name);
}

/// Copies up to `max` of destination `i`'s oldest queued records, leaving
/// them queued until [`commit_recorded`] says they are in the table.
pub fn peek(i: usize, max: usize, out: &mut Vec<AuditRecord>) {
    out.clear();
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    let s = lock.state();
    let mut at = s.dests[i].head;
    while at != NIL && out.len() < max {
        let n = node(s, at);
        out.push(n.record);
        at = n.next;
    }
}

/// Unlinks the first `n` records of destination `i`, back to the free list
/// (under the lock).
fn pop(s: &mut Queue, i: usize, n: u64) {
    for _ in 0..n {
        let at = s.dests[i].head;
        if at == NIL {
            break;
        }
        let next = node(s, at).next;
        node(s, at).next = s.free;
        s.free = at;
        let d = &mut s.dests[i];
        d.head = next;
        if next == NIL {
            d.tail = NIL;
        }
        d.queued -= 1;
        s.queued -= 1;
    }
}

/// The first `n` queued records of destination `i` are done with: `dropped`
/// of them could not be written and are counted as dropped, the others are
/// committed to the audit table.
pub fn commit_recorded(i: usize, n: usize, dropped: usize, now: i64) {
    let Some(shared) = shared() else { return };
    debug_assert!(dropped <= n);
    let mut lock = Locked::acquire();
    let s = lock.state();
    pop(s, i, n as u64);
    let recorded = (n - dropped) as u64;
    s.recorded += recorded;
    s.dropped += dropped as u64;
    let d = &mut s.dests[i];
    d.recorded += recorded;
    d.dropped += dropped as u64;
    d.last_flush = now;
    shared.last_flush.store(now, Ordering::Relaxed);
}

/// Discards every record queued for destination `i` (its database was
/// dropped), counting them as dropped; how many, and the database's name.
pub fn discard(i: usize, why: &str, now: i64) -> (u64, String) {
    if shared().is_none() {
        return (0, String::new());
    }
    let mut lock = Locked::acquire();
    let s = lock.state();
    let n = s.dests[i].queued;
    pop(s, i, n);
    s.dropped += n;
    let d = &mut s.dests[i];
    d.dropped += n;
    d.phase = Phase::Dropped;
    if n > 0 {
        d.last_drop.set(why);
        d.last_drop_at = now;
    }
    (n, d.name.as_str().to_owned())
}

pub fn set_phase(i: usize, phase: Phase) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    lock.state().dests[i].phase = phase;
}

pub fn phase(i: usize) -> Phase {
    if shared().is_none() {
        return Phase::Unknown;
    }
    let mut lock = Locked::acquire();
    lock.state().dests[i].phase
}

pub fn queued(i: usize) -> u64 {
    if shared().is_none() {
        return 0;
    }
    let mut lock = Locked::acquire();
    lock.state().dests[i].queued
}

/// Keeps `error` as a destination's last error; the same error again keeps
/// its first time, since it has lasted since then. Whether it changed.
fn keep_error(d: &mut Dest, error: &str, now: i64) -> bool {
    let mut note = FixedStr::EMPTY;
    note.set(error);
    if d.last_error.as_str() != note.as_str() || d.last_error_at == 0 {
        d.last_error = note;
        d.last_error_at = now;
        return true;
    }
    false
}

/// Records why destination `i`'s writer cannot record; `None` clears it.
/// Whether the note changed (a new error, or a cleared one).
pub fn set_last_error(i: usize, error: Option<&str>, now: i64) -> bool {
    if shared().is_none() {
        return false;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    match error {
        Some(e) => keep_error(d, e, now),
        None => {
            let had = !d.last_error.is_empty();
            d.last_error = FixedStr::EMPTY;
            d.last_error_at = 0;
            had
        }
    }
}

/// From a writer's error hook: the error that ends it is why destination
/// `i` is failing (unless it waits for the extension). Skipped when the lock
/// is already this process's (an error raised while holding it), rather than
/// self-deadlocking.
pub fn note_failure(i: usize, error: &str, now: i64) {
    // SAFETY: asks whether this process holds the (set) lock.
    if shared().is_none() || unsafe { pg_sys::LWLockHeldByMe(LOCK.load(Ordering::Acquire)) } {
        return;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    keep_error(d, error, now);
    if d.phase != Phase::WaitingExtension {
        d.phase = Phase::Failing;
    }
}

/// Records why destination `i`'s writer dropped a record.
pub fn set_last_drop(i: usize, why: &str, now: i64) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    d.last_drop.set(why);
    d.last_drop_at = now;
}

/// A destination as the launcher and the status functions see it.
#[derive(Clone, Debug)]
pub struct DestView {
    pub index: usize,
    pub key: u32,
    pub name: String,
    pub queued: u64,
    pub refused: u64,
    pub recorded: u64,
    pub dropped: u64,
    pub last_flush: i64,
    pub phase: Phase,
    pub worker: WorkerState,
    pub worker_pid: i32,
    pub launched_at: i64,
    pub no_slot_since: i64,
    pub no_turn_since: i64,
    pub full: Drops,
    pub share: Drops,
    pub off: Drops,
    pub last_error: Option<(String, i64)>,
    pub last_drop: Option<(String, i64)>,
}

fn view(i: usize, d: &Dest) -> DestView {
    let note = |text: &FixedStr<NOTE_LEN>, at: i64| (!text.is_empty()).then(|| (text.as_str().to_owned(), at));
    DestView {
        index: i,
        key: d.key,
        name: d.name.as_str().to_owned(),
        queued: d.queued,
        refused: d.refused,
        recorded: d.recorded,
        dropped: d.dropped,
        last_flush: d.last_flush,
        phase: d.phase,
        worker: d.worker,
        worker_pid: d.worker_pid,
        launched_at: d.launched_at,
        no_slot_since: d.no_slot_since,
        no_turn_since: d.no_turn_since,
        full: d.full,
        share: d.share,
        off: d.off,
        last_error: note(&d.last_error, d.last_error_at),
        last_drop: note(&d.last_drop, d.last_drop_at),
    }
}

/// Every destination in use.
pub fn destinations() -> Vec<DestView> {
    if shared().is_none() {
        return Vec::new();
    }
    let mut lock = Locked::acquire();
    let s = lock.state();
    (0..DESTS).filter(|&i| s.dests[i].in_use).map(|i| view(i, &s.dests[i])).collect()
}

/// The destination `key`, if in use.
pub fn destination(key: u32) -> Option<DestView> {
    shared()?;
    let mut lock = Locked::acquire();
    let s = lock.state();
    find(s, key).map(|i| view(i, &s.dests[i]))
}

/// The launcher registered a writer for destination `i`, or (`launched`
/// false) found no free background worker slot for it.
pub fn set_launched(i: usize, launched: bool, now: i64) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    if launched {
        if d.worker == WorkerState::None {
            d.worker = WorkerState::Launched;
            d.launched_at = now;
        }
        d.no_slot_since = 0;
        d.no_turn_since = 0;
        if d.phase == Phase::NotAccepting {
            // It accepts connections again: its writer says what it finds.
            d.phase = Phase::Connecting;
            d.last_error = FixedStr::EMPTY;
            d.last_error_at = 0;
        }
    } else if d.no_slot_since == 0 {
        d.no_slot_since = now;
    }
}

/// Destination `i` waits for a writer because `pg_lease.audit_workers`
/// writers already run (`waiting` true), or no longer does.
pub fn set_waiting_turn(i: usize, waiting: bool, now: i64) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    if !waiting {
        d.no_turn_since = 0;
    } else if d.no_turn_since == 0 {
        d.no_turn_since = now;
    }
}

/// Destination `i`'s database does not accept connections: no writer is
/// started for it, and `note` says why. Whether the note is new.
pub fn set_not_accepting(i: usize, note: &str, now: i64) -> bool {
    if shared().is_none() {
        return false;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    d.phase = Phase::NotAccepting;
    d.no_turn_since = 0;
    d.no_slot_since = 0;
    keep_error(d, note, now)
}

/// A writer the launcher registered for destination `i` never attached (it
/// could not be started, or failed before attaching): no writer serves it.
pub fn clear_launched(i: usize) {
    if shared().is_none() {
        return;
    }
    let mut lock = Locked::acquire();
    let d = &mut lock.state().dests[i];
    if d.worker == WorkerState::Launched {
        d.worker = WorkerState::None;
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
    let mut lock = Locked::acquire();
    let s = lock.state();
    Some(Counters {
        capacity: s.capacity,
        queued: s.queued,
        refused: s.refused,
        recorded: s.recorded,
        dropped: s.dropped,
    })
}

/// Zeroes the counters and per-table stats; what is still queued stays
/// counted as refused, so the accounting keeps closing.
pub fn reset() {
    let Some(shared) = shared() else { return };
    {
        let mut lock = Locked::acquire();
        let s = lock.state();
        s.refused = s.queued;
        s.recorded = 0;
        s.dropped = 0;
        for d in s.dests.iter_mut().filter(|d| d.in_use) {
            d.refused = d.queued;
            d.recorded = 0;
            d.dropped = 0;
            d.full = Drops::default();
            d.share = Drops::default();
            d.off = Drops::default();
            d.last_drop = FixedStr::EMPTY;
            d.last_drop_at = 0;
        }
        for n in s.subscriptions.iter_mut() {
            n.in_use = false;
        }
    }
    for slot in shared.stats() {
        slot.zero();
    }
}

/// A change applied by logical replication subscription `subid` (`name`) of
/// this database was refused at `now`: counted for `lease.audit_status()`.
pub fn note_replication_refusal(subid: pg_sys::Oid, name: &str, now: i64) {
    if shared().is_none() {
        return;
    }
    // SAFETY: reads a backend global, set in any process connected to a database.
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let mut lock = Locked::acquire();
    let notes = &mut lock.state().subscriptions;
    let i = notes
        .iter()
        .position(|n| n.in_use && n.dboid == db && n.subid == subid.to_u32())
        .or_else(|| notes.iter().position(|n| !n.in_use))
        .unwrap_or_else(|| (0..notes.len()).min_by_key(|&i| notes[i].last_at).unwrap_or(0));
    let n = &mut notes[i];
    if !(n.in_use && n.dboid == db && n.subid == subid.to_u32()) {
        *n = SubscriptionNote {
            in_use: true,
            dboid: db,
            subid: subid.to_u32(),
            name: FixedStr::EMPTY,
            refused: 0,
            first_at: now,
            last_at: now,
        };
    }
    n.name.set(name);
    n.refused += 1;
    n.last_at = now;
}

/// Database `dboid`'s subscriptions with refused changes: (oid, name,
/// refused, first, last), most recent first.
pub fn replication_refusals(dboid: pg_sys::Oid) -> Vec<(pg_sys::Oid, String, u64, i64, i64)> {
    if shared().is_none() {
        return Vec::new();
    }
    let mut lock = Locked::acquire();
    let mut found: Vec<_> = lock
        .state()
        .subscriptions
        .iter()
        .filter(|n| n.in_use && n.dboid == dboid.to_u32())
        .map(|n| (pg_sys::Oid::from(n.subid), n.name.as_str().to_owned(), n.refused, n.first_at, n.last_at))
        .collect();
    found.sort_by_key(|&(.., last)| std::cmp::Reverse(last));
    found
}

/// The stats slot of (database, table), claimed if new; None when every slot
/// is taken (the table then goes uncounted) or without shared memory.
///
/// When no slot is free, the slots of tables and databases that `gone`
/// says no longer exist are freed first, their counters with them. `gone` is
/// asked outside the lock (it may read catalogs and take heavyweight locks),
/// and must only say so of a table that no process can still count into:
/// one dropped for good (committed), not one being created or dropped.
pub fn stat_slot(
    dboid: pg_sys::Oid,
    relid: pg_sys::Oid,
    table_name: &str,
    gone: impl Fn(u32, u32) -> bool,
) -> Option<&'static StatSlot> {
    let shared = shared()?;
    let key = stat_key(dboid.to_u32(), relid.to_u32());
    if let Some(slot) = shared.stats().iter().find(|s| s.key.load(Ordering::Acquire) == key) {
        return Some(slot);
    }
    if let Some(claimed) = claim_stat_slot(shared, key, table_name, &[]) {
        return Some(claimed);
    }
    let mut dead: Vec<u64> = shared
        .stats()
        .iter()
        .map(|s| s.key.load(Ordering::Acquire))
        .filter(|&k| {
            let (db, rel) = split_key(k);
            k != 0 && k != key && gone(db, rel)
        })
        .collect();
    // Sorted here, so that each slot's test under the lock is a binary search.
    dead.sort_unstable();
    claim_stat_slot(shared, key, table_name, &dead)
}

/// Under the lock: the slot of `key` if another process claimed it
/// meanwhile, else a free one claimed for it after freeing the slots whose
/// keys are in `dead` (sorted); None when no slot is free.
fn claim_stat_slot(shared: &'static Shared, key: u64, table_name: &str, dead: &[u64]) -> Option<&'static StatSlot> {
    let _lock = Locked::acquire();
    let slots = shared.stats();
    if let Some(slot) = slots.iter().find(|s| s.key.load(Ordering::Relaxed) == key) {
        return Some(slot);
    }
    for slot in slots.iter().filter(|s| dead.binary_search(&s.key.load(Ordering::Relaxed)).is_ok()) {
        slot.key.store(0, Ordering::Release);
    }
    let slot = slots.iter().find(|s| s.key.load(Ordering::Relaxed) == 0)?;
    slot.zero();
    // SAFETY: a slot's name is written and read only under the lock (held:
    // `_lock`).
    unsafe { (*slot.table_name.get()).set(table_name) };
    // Release: a process that finds the key lock-free sees the zeroed counters.
    slot.key.store(key, Ordering::Release);
    shared.claims.fetch_add(1, Ordering::Release);
    Some(slot)
}

/// How many stats slots were claimed so far (0 without shared memory): a
/// process that found none free tries again once this moved.
pub fn claims() -> u64 {
    shared().map_or(0, |s| s.claims.load(Ordering::Acquire))
}

/// Every claimed stats slot, copied under the lock.
pub fn stat_rows() -> Vec<StatRow> {
    let Some(shared) = shared() else { return Vec::new() };
    let _lock = Locked::acquire();
    shared
        .stats()
        .iter()
        .filter_map(|slot| {
            let key = slot.key.load(Ordering::Relaxed);
            let (db, rel) = split_key(key);
            (key != 0).then(|| StatRow {
                dboid: db.into(),
                relid: rel.into(),
                // SAFETY: read under the lock (held: `_lock`), where only
                // `claim` writes it.
                table_name: unsafe { (*slot.table_name.get()).as_str().to_owned() },
                accepted: slot.accepted.load(Ordering::Relaxed),
                refused: slot.refused.load(Ordering::Relaxed),
                replicated: slot.replicated.load(Ordering::Relaxed),
                last_refusal: slot.last_refusal.load(Ordering::Relaxed),
            })
        })
        .collect()
}
