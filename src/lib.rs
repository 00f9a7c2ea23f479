//! pg_lease: fencing tokens enforced inside PostgreSQL.
//!
//! This file only wires modules together; see README.md for the design.

// Modules depend one way, each only on those declared above it (checked by
// scripts/check-modules.py in `make test`): thin Postgres wrappers, settings,
// the LF errors, the lease service's C parts, the audit, the fence, and the
// C-ABI entry points that run the fence, audit its refusals and raise them.
mod pg;
mod gucs;
mod errors;
mod lease;
mod lease_owner;
mod lease_calls;
mod audit;
mod fence;
mod boundary;

use pgrx::pg_sys;

::pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!(
    "../sql/fence.sql",
    name = "fence",
    requires = [
        "schema",
        fence::identity::key_identity_problem,
        fence::identity::is_token_type,
        fence::register::register,
        fence::register::unregister,
        fence::register::lock_owner_table,
        fence::ddl::exists_as_owner,
        fence::ddl::name_problem,
        fence::ddl::owner_key_index,
        fence::ddl::key_equality,
        fence::citus::shard_of_sql,
        fence::citus::shard_id_sql,
        lease::bound_token
    ]
);
pgrx::extension_sql_file!(
    "../sql/audit.sql",
    name = "audit",
    requires = [
        "schema",
        "lease",
        audit::status::table_stats,
        audit::status::shown,
        audit::status::stats,
        audit::status::audit_status,
        audit::status::audit_databases,
        audit::status::stats_reset
    ]
);
pgrx::extension_sql_file!(
    "../sql/lease.sql",
    name = "lease",
    requires = [
        "fence",
        lease::token_floor,
        lease::next_token_sql,
        lease::origin_sql,
        lease::band_above_sql,
        lease_owner::lock_owner_row,
        lease_owner::set_owner_token
    ]
);
pgrx::extension_sql_file!("../sql/local.sql", name = "local", requires = ["schema", "fence", "audit", "lease"]);

#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    errors::init();
    fence::init();
    // Shared memory and the audit worker exist only when preloaded (and not
    // while pg_upgrade runs the server in binary-upgrade mode).
    // SAFETY: reads (by value, no reference taken) two backend globals
    // Postgres sets before loading libraries and that nothing writes
    // concurrently: this backend has one thread.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress && !pg_sys::IsBinaryUpgrade };
    if preloading {
        audit::init_preloaded();
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
