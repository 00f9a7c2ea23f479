//! The parts of the lease service that need C: the token epoch and TTL bounds.
//! The service itself is SQL (sql/lease.sql): it runs on row locks and
//! `clock_timestamp()`, which PL/pgSQL expresses directly.

use crate::gucs;
use pgrx::prelude::*;

/// Tokens are `epoch << EPOCH_SHIFT | counter`. The epoch is the WAL timeline,
/// which rises at every standby promotion and point-in-time recovery, so a
/// token issued after a failover beats every token of the old timeline even
/// if the WAL that recorded them was lost. 2^40 acquisitions per lease per
/// timeline, 2^23 timelines.
pub const EPOCH_SHIFT: u32 = 40;

/// The highest fencing token a role other than a superuser may write into an
/// owner row (2^62 - 1). `lease.acquire` (which runs as the extension's
/// superuser owner) issues tokens up to bigint's maximum, so from any token
/// set by hand it can still issue 2^62 more: no one can poison a resource.
pub const MAX_TOKEN: i64 = (1 << 62) - 1;

/// `lease._bound_token()`: the token bound to the current transaction (see
/// [`gucs::bound_token`]: a value left from an earlier transaction is none).
#[pg_extern(name = "_bound_token", stable, parallel_safe)]
pub fn bound_token() -> Option<i64> {
    gucs::bound_token()
}

/// `lease._token_floor()`: the smallest token of the current epoch. Every new
/// token is above it and above every token this database has recorded.
#[pg_extern(name = "_token_floor", volatile, parallel_unsafe)]
pub fn token_floor() -> i64 {
    if unsafe { pg_sys::RecoveryInProgress() } {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "pg_lease: leases can only be taken on the primary",
            "This server is a standby in recovery."
        );
    }
    let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() } as i64;
    timeline << EPOCH_SHIFT
}

/// `lease._check_ttl(ttl_ms)`: the TTL if within `pg_lease.min_ttl_ms` ..
/// `pg_lease.max_ttl_ms`, else a clear 22004/22023 error.
#[pg_extern(name = "_check_ttl", volatile, parallel_unsafe)]
pub fn check_ttl(ttl_ms: Option<i32>) -> i32 {
    let (min, max) = (gucs::MIN_TTL_MS.get(), gucs::MAX_TTL_MS.get());
    match ttl_ms {
        None => {
            ereport!(ERROR, PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "pg_lease: ttl_ms must not be NULL");
        }
        Some(ttl) if ttl < min || ttl > max => {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("pg_lease: ttl_ms {ttl} is out of range"),
                format!("pg_lease.min_ttl_ms = {min}, pg_lease.max_ttl_ms = {max}.")
            );
        }
        Some(ttl) => ttl,
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn token_floor_is_the_timeline_epoch() {
        let floor = Spi::get_one::<i64>("SELECT lease._token_floor()").unwrap().unwrap();
        let timeline = Spi::get_one::<i64>("SELECT timeline_id::bigint FROM pg_control_checkpoint()").unwrap().unwrap();
        assert_eq!(floor, timeline << super::EPOCH_SHIFT);
    }

    #[pg_test(error = "pg_lease: ttl_ms 5 is out of range")]
    fn ttl_below_minimum_is_refused() {
        Spi::run("SELECT lease._check_ttl(5)").unwrap();
    }
}
