//! Enforcement: the row trigger on protected tables, its config cache, the
//! per-transaction verified-resource cache, and the guards around them.

mod config;
pub(crate) mod ddl;
mod guards;
mod high_water;
pub(crate) mod identity;
pub(crate) mod pg;
pub(crate) mod register;
mod trigger;
mod verified;

use crate::c_function;
use pgrx::pg_sys;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (as in rustc): the keys are a few bytes, hashed once per row, and
/// only ever come from this transaction's own rows, so SipHash's resistance to
/// crafted collisions buys nothing here.
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().unwrap());
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(SEED);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The per-row lookups' hash map.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

c_function!(pg_lease_fence_trigger, pg_finfo_pg_lease_fence_trigger, trigger::fence_trigger);
c_function!(pg_lease_owner_guard, pg_finfo_pg_lease_owner_guard, guards::owner_guard);
c_function!(pg_lease_truncate_guard, pg_finfo_pg_lease_truncate_guard, guards::truncate_guard);
c_function!(pg_lease_retyped_columns, pg_finfo_pg_lease_retyped_columns, ddl::retyped_columns);
c_function!(pg_lease_guard_ddl_start, pg_finfo_pg_lease_guard_ddl_start, ddl::guard_ddl_start);

/// Registers the cache callbacks; called once per backend from `_PG_init`.
pub fn init() {
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(config::on_relcache_invalidation), pg_sys::Datum::from(0));
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
            Some(config::on_namespace_invalidation),
            pg_sys::Datum::from(0),
        );
        pg_sys::RegisterXactCallback(Some(verified::on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(verified::on_subxact_event), std::ptr::null_mut());
    }
}
