//! Enforcement: the row trigger on protected tables (trigger.rs, the verdict
//! path), its config cache (config.rs), the resource key (key.rs), the owner
//! and high-water lookups (owner.rs, high_water.rs), the per-transaction
//! verified-resource cache (verified.rs), the refusals (refusal.rs) and the
//! guards around them (guards.rs, ddl.rs, register.rs).
//!
//! Citus shards of distributed tables find their config and owner shard
//! through citus.rs.
//!
//! Inside fence, modules depend one way too: identity, citus ← config ← key ←
//! verified ← replication ← refusal ← owner ← high_water ← trigger; guards, ddl
//! and register use the lower ones. The C entry points live in `crate::boundary`.

pub(crate) mod boundary_write;
pub(crate) mod citus;
mod config;
pub(crate) mod ddl;
pub(crate) mod guards;
mod high_water;
pub(crate) mod identity;
mod key;
mod owner;
pub(crate) mod refusal;
pub(crate) mod register;
pub(crate) mod replication;
pub(crate) mod trigger;
mod verified;

use pgrx::pg_sys;

/// The per-row lookups' hash map: FxHash, since the keys are a few bytes,
/// hashed once per row, and only ever come from this transaction's own rows
/// (SipHash's resistance to crafted collisions buys nothing here).
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// Registers the cache callbacks; called once per backend from `_PG_init`.
pub fn init() {
    type Relcache = unsafe extern "C-unwind" fn(pg_sys::Datum, pg_sys::Oid);
    type Syscache = unsafe extern "C-unwind" fn(pg_sys::Datum, i32, u32);
    type Xact = unsafe extern "C-unwind" fn(pg_sys::XactEvent::Type, *mut std::ffi::c_void);
    // The fence's config cache and the boundary write's plan cache.
    let caches: [(Relcache, Syscache, Xact); 2] = [
        (config::on_relcache_invalidation, config::on_namespace_invalidation, verified::on_xact_event),
        (
            boundary_write::on_relcache_invalidation,
            boundary_write::on_namespace_invalidation,
            boundary_write::on_xact_event,
        ),
    ];
    for (relcache, namespace, xact) in caches {
        // SAFETY: each registration appends a function pointer to a fixed
        // backend-local array (the callbacks are plain `extern "C-unwind"` fns
        // that live as long as the library, never unloaded); the Datum and void
        // arguments are unused by the callbacks, so 0 and null are fine. Called
        // once per backend (_PG_init), so the limited callback slots are not
        // exhausted by repeats.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(relcache), pg_sys::Datum::from(0));
            pg_sys::CacheRegisterSyscacheCallback(
                pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
                Some(namespace),
                pg_sys::Datum::from(0),
            );
            pg_sys::RegisterXactCallback(Some(xact), std::ptr::null_mut());
        }
    }
    // SAFETY: as above.
    unsafe {
        pg_sys::RegisterSubXactCallback(Some(verified::on_subxact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(boundary_write::on_subxact_event), std::ptr::null_mut());
    }
    replication::init();
}

#[cfg(any(test, feature = "pg_test"))]
pub(crate) mod tests {
    use pgrx::prelude::*;

    /// Runs `sql` in a PL/pgSQL block and returns its error's SQLSTATE
    /// (caught there, where LF codes survive), or "ok".
    pub fn sqlstate_of(sql: &str) -> String {
        Spi::get_one::<String>(&format!(
            "DO $$ BEGIN {sql}; PERFORM set_config('t.code', 'ok', true);
                 EXCEPTION WHEN OTHERS THEN PERFORM set_config('t.code', SQLSTATE, true); END $$;
             SELECT current_setting('t.code')"
        ))
        .unwrap()
        .unwrap()
    }
}
