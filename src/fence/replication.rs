//! Changes applied by logical replication.
//!
//! A change that arrives through a subscription was already judged by the
//! fence where it was written; re-judging it against the subscriber's own
//! state (which lags by design) would only stop replication: history copied
//! by the initial sync carries old tokens, a DELETE arrives without a bound
//! token, a payout committed before a bump may be applied after it. So the
//! fence and the owner guards let such changes through unjudged, counted as
//! replicated, when the process applying them is a real logical replication
//! worker (table sync, apply or parallel apply: `session_replication_role`
//! alone, which a superuser can set anywhere, does not count) of a
//! subscription owned by a superuser (a role that could write the table
//! anyway). High-water tables, fenced for sinks of untrusted logs, judge
//! replicated changes like any other.

use crate::pg::owned;
use pgrx::pg_sys;

/// Whether this process applies changes for a subscription owned by a
/// superuser.
pub fn trusted_apply() -> bool {
    // SAFETY: IsLogicalWorker reads this process's own worker slot pointer
    // (set only by the logical replication launcher's workers);
    // GetAuthenticatedUserId is the role the worker connected as, the
    // subscription's owner (it stays so while the worker switches to table
    // owners to apply, PostgreSQL 16 on); superuser_arg is a syscache lookup,
    // fresh after an ALTER ROLE ... NOSUPERUSER.
    unsafe { pg_sys::IsLogicalWorker() && pg_sys::superuser_arg(pg_sys::GetAuthenticatedUserId()) }
}

/// In a logical replication worker: which subscription it applies, and who
/// owns it, for the message of a refusal (slow path). None elsewhere.
pub fn subscription() -> Option<(String, String, bool)> {
    // SAFETY: as in `trusted_apply`.
    if !unsafe { pg_sys::IsLogicalWorker() } {
        return None;
    }
    // SAFETY: the worker's authenticated role; GetUserNameFromId(.., true)
    // returns NULL or a palloc'd name.
    let (owner, superuser) = unsafe {
        let role = pg_sys::GetAuthenticatedUserId();
        (owned(pg_sys::GetUserNameFromId(role, true)), pg_sys::superuser_arg(role))
    };
    let name = pgrx::spi::Spi::get_one::<String>(
        "SELECT s.subname::pg_catalog.text FROM pg_catalog.pg_stat_subscription w
           JOIN pg_catalog.pg_subscription s ON s.oid OPERATOR(pg_catalog.=) w.subid
          WHERE w.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() LIMIT 1",
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| "(unknown)".to_owned());
    Some((name, owner, superuser))
}
