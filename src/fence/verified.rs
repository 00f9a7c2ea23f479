//! Per-transaction caches of resources: those whose current token this
//! transaction has already locked and read (the verdicts), and those whose
//! owner row it has seen at or above a token (the catch-up of trusted
//! replicated rows, `fence::owner::catch_up`).
//!
//! A verdict entry is only valid while the row lock that backs it is held:
//! the lock lives until the transaction ends, or until the subtransaction that
//! took it aborts. A catch-up entry holds while what it saw does: an owner
//! row's token only rises, but a raise this (sub)transaction made is undone
//! if it aborts. Entries therefore remember their subtransaction and are
//! dropped with it, follow it to its parent on subcommit, and all vanish at
//! transaction end. A change of an owner token by this very transaction (the
//! owner guard) or a raised high-water mark also drops entries, so the next
//! row re-reads.

use crate::fence::FastMap;
use crate::pg::RowPlace;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

#[derive(Clone, Copy)]
struct Entry<V> {
    value: V,
    subxact: pg_sys::SubTransactionId,
}

/// Entries keyed by encoded resource key (`key::encode`), each remembering
/// the subtransaction it was made in.
struct Scoped<V>(FastMap<Box<[u8]>, Entry<V>>);

impl<V: Copy> Scoped<V> {
    fn get(&self, key: &[u8]) -> Option<V> {
        self.0.get(key).map(|e| e.value)
    }

    fn insert(&mut self, key: &[u8], value: V) {
        // SAFETY: reads the current transaction state (a backend global); the
        // fence only runs inside a transaction.
        let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
        self.0.insert(key.into(), Entry { value, subxact });
    }

    fn on_subxact_event(
        &mut self,
        event: pg_sys::SubXactEvent::Type,
        my: pg_sys::SubTransactionId,
        parent: pg_sys::SubTransactionId,
    ) {
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => self.0.retain(|_, e| e.subxact != my),
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
                for e in self.0.values_mut().filter(|e| e.subxact == my) {
                    e.subxact = parent;
                }
            }
            _ => {}
        }
    }
}

thread_local! {
    /// Verdicts: the resource's current token when locked and read (None:
    /// the owner row's token is NULL).
    static VERIFIED: RefCell<Scoped<Option<i64>>> = RefCell::new(Scoped(FastMap::default()));
    /// Catch-up: a token the resource's owner row was seen to hold, or was
    /// raised to, by this transaction (a lower bound of its token).
    static SEEN: RefCell<Scoped<i64>> = RefCell::new(Scoped(FastMap::default()));
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
    VERIFIED.with(|v| v.borrow().get(key))
}

pub fn remember(key: &[u8], current: Option<i64>) {
    VERIFIED.with(|v| v.borrow_mut().insert(key, current));
}

/// The highest token this transaction has seen the owner row of this
/// resource key hold (or raised it to), if any: its token is at least that.
#[inline]
pub fn seen(key: &[u8]) -> Option<i64> {
    SEEN.with(|v| v.borrow().get(key))
}

/// This transaction saw the owner row of this resource key hold `token`, or
/// raised it to `token`.
pub fn saw(key: &[u8], token: i64) {
    SEEN.with(|v| {
        let mut map = v.borrow_mut();
        if map.get(key).is_none_or(|t| t < token) {
            map.insert(key, token);
        }
    });
}

pub fn forget_all() {
    UPDATED.set(None);
    VERIFIED.with(|v| {
        if let Ok(mut map) = v.try_borrow_mut() {
            map.0.clear()
        }
    });
    SEEN.with(|v| {
        if let Ok(mut map) = v.try_borrow_mut() {
            map.0.clear()
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
        if let Ok(mut map) = v.try_borrow_mut() {
            map.on_subxact_event(event, my_subid, parent_subid);
        }
    });
    SEEN.with(|v| {
        if let Ok(mut map) = v.try_borrow_mut() {
            map.on_subxact_event(event, my_subid, parent_subid);
        }
    });
}
