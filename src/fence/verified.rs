//! Per-transaction cache of resources whose current token this transaction
//! has already locked and read.
//!
//! An entry is only valid while the row lock that backs it is held: the lock
//! lives until the transaction ends, or until the subtransaction that took it
//! aborts. Entries therefore remember their subtransaction and are dropped with
//! it, follow it to its parent on subcommit, and all vanish at transaction end.
//! A change of an owner token by this very transaction (the owner guard) or a
//! raised high-water mark also drops entries, so the next row re-reads.

use crate::fence::FastMap;
use crate::pg::RowPlace;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

#[derive(Clone, Copy)]
struct Entry {
    /// The resource's current token when verified (None: the owner row's token is NULL).
    current: Option<i64>,
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    static VERIFIED: RefCell<FastMap<Box<[u8]>, Entry>> = RefCell::new(FastMap::default());
    /// The row version the last UPDATE let through, with the token it
    /// presented (see [`passed_update`]); forgotten at transaction end.
    static UPDATED: Cell<Option<(RowPlace, Option<i64>)>> = const { Cell::new(None) };
}

/// An UPDATE let the row version at `at` through with `token`. An UPDATE
/// that moves a row to another partition deletes it from this one next:
/// BEFORE DELETE fires for the very same row version, in the same
/// subtransaction (then BEFORE INSERT on the new partition). That DELETE is
/// the UPDATE's and presents its token (README: an UPDATE's token is its new
/// row's), not the bound one ([`update_deleting`]). Nothing else deletes a
/// row version an UPDATE has passed: the UPDATE goes on with it (no BEFORE
/// row trigger may run after the fence's: the DDL guard), and a version
/// this transaction updated is dead to it. Forgotten at transaction end.
pub fn passed_update(at: Option<RowPlace>, token: Option<i64>) {
    UPDATED.set(at.map(|at| (at, token)));
}

/// The token of the UPDATE that passed the row version at `at` just before
/// this DELETE of it (a move between partitions), if it was one; forgets it.
pub fn update_deleting(at: Option<RowPlace>) -> Option<Option<i64>> {
    match (UPDATED.take(), at) {
        (Some((passed, token)), Some(here)) if passed == here => Some(token),
        _ => None,
    }
}

/// The verified current token for this resource key, if this transaction holds its lock.
#[inline]
pub fn lookup(key: &[u8]) -> Option<Option<i64>> {
    VERIFIED.with(|v| v.borrow().get(key).map(|e| e.current))
}

pub fn remember(key: &[u8], current: Option<i64>) {
    // SAFETY: reads the current transaction state (a backend global); the
    // fence only runs inside a transaction.
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    VERIFIED.with(|v| {
        v.borrow_mut().insert(key.into(), Entry { current, subxact });
    });
}

pub fn forget_all() {
    UPDATED.set(None);
    VERIFIED.with(|v| {
        if let Ok(mut map) = v.try_borrow_mut() {
            map.clear()
        }
    });
}

pub unsafe extern "C-unwind" fn on_xact_event(_event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    // Commit, abort, prepare: every row lock is either released or handed to
    // the prepared transaction; nothing stays valid for the next transaction.
    forget_all();
}

pub unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    VERIFIED.with(|v| {
        let Ok(mut map) = v.try_borrow_mut() else {
            return;
        };
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => map.retain(|_, e| e.subxact != my_subid),
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
                for e in map.values_mut().filter(|e| e.subxact == my_subid) {
                    e.subxact = parent_subid;
                }
            }
            _ => {}
        }
    });
}
