//! Enforcement: the row trigger on protected tables, its config cache, the
//! per-transaction verified-resource cache, and the guards around them.

mod config;
mod guards;
mod high_water;
mod pg;
mod trigger;
mod verified;

use crate::c_function;
use pgrx::pg_sys;

c_function!(pg_lease_fence_trigger, pg_finfo_pg_lease_fence_trigger, trigger::fence_trigger);
c_function!(pg_lease_owner_guard, pg_finfo_pg_lease_owner_guard, guards::owner_guard);
c_function!(pg_lease_truncate_guard, pg_finfo_pg_lease_truncate_guard, guards::truncate_guard);

/// Registers the cache callbacks; called once per backend from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(config::on_relcache_invalidation), pg_sys::Datum::from(0));
        pg_sys::RegisterXactCallback(Some(verified::on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(verified::on_subxact_event), std::ptr::null_mut());
    }
}
