//! The parts of the lease service that need C: the token epoch and TTL bounds.
//! The service itself is SQL (sql/lease.sql): it runs on row locks and
//! `clock_timestamp()`, which PL/pgSQL expresses directly.

use crate::errors::Invalid;
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
    if crate::pg::in_recovery() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "pg_lease: leases can only be taken on the primary",
            "This server is a standby in recovery."
        );
    }
    // SAFETY: reads the WAL insertion timeline; on a primary (checked above)
    // it is set once recovery has ended.
    let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() } as i64;
    timeline << EPOCH_SHIFT
}

/// The longest lease name or owner, in characters.
pub const MAX_LABEL_CHARS: usize = 256;

/// The rule for lease names and owners (`what` says which): not NULL, not
/// blank (Unicode whitespace only), no control characters, at most
/// [`MAX_LABEL_CHARS`] characters. `lease._check_label(what, value)`.
pub fn check_label(what: &str, value: Option<&str>) -> Result<(), Invalid> {
    let invalid = |code, message: String| Err(Invalid::new(code, message).expect("a valid SQLSTATE"));
    // `what` is "name" or "owner" from pg_lease's own SQL; bounded anyway.
    let what: String = what.chars().take(32).collect();
    let Some(value) = value else {
        return invalid("22004", format!("pg_lease: lease {what} must not be NULL"));
    };
    if value.trim().is_empty() {
        return invalid("22023", format!("pg_lease: lease {what} must not be blank"));
    }
    // Control characters, and the line and paragraph separators, which break
    // a name across lines in logs as a newline does. The value is not echoed.
    let breaks = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if let Some((at, c)) = value.chars().enumerate().find(|&(_, c)| breaks(c)) {
        return invalid(
            "22023",
            format!("pg_lease: lease {what} contains a control character (U+{:04X} at character {})", c as u32, at + 1),
        );
    }
    let chars = value.chars().count();
    if chars > MAX_LABEL_CHARS {
        return invalid(
            "22023",
            format!("pg_lease: lease {what} is {chars} characters long; at most {MAX_LABEL_CHARS} are allowed"),
        );
    }
    Ok(())
}

/// `lease._check_ttl(ttl_ms)`: the TTL if within `pg_lease.min_ttl_ms` ..
/// `pg_lease.max_ttl_ms`, else a clear 22004/22023 error.
pub fn check_ttl(ttl_ms: Option<i32>) -> Result<i32, Invalid> {
    let (min, max) = (gucs::MIN_TTL_MS.get(), gucs::MAX_TTL_MS.get());
    match ttl_ms {
        None => Err(Invalid::new("22004", "pg_lease: ttl_ms must not be NULL").expect("a valid SQLSTATE")),
        Some(ttl) if ttl < min || ttl > max => {
            Err(Invalid::new("22023", format!("pg_lease: ttl_ms {ttl} is out of range"))
                .expect("a valid SQLSTATE")
                .with_detail(format!("pg_lease.min_ttl_ms = {min}, pg_lease.max_ttl_ms = {max}.")))
        }
        Some(ttl) => Ok(ttl),
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

    #[pg_test]
    fn labels_follow_one_rule() {
        use super::check_label;
        assert!(check_label("name", Some("room:1")).is_ok());
        assert!(check_label("name", Some(&"x".repeat(256))).is_ok());
        assert!(check_label("name", Some(&"é".repeat(256))).is_ok());
        for bad in [
            None,
            Some(""),
            Some("   "),
            Some("\t"),
            Some("\u{a0}"),
            Some("a\nb"),
            Some("a\u{85}b"),
            Some("a\u{2028}b"),
            Some(&*"x".repeat(257)),
        ] {
            assert!(check_label("owner", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[pg_test]
    fn ttl_bounds_come_from_the_settings() {
        assert_eq!(super::check_ttl(Some(1000)).ok(), Some(1000));
        assert!(super::check_ttl(Some(5)).unwrap_err().message.contains("ttl_ms 5 is out of range"));
        assert!(super::check_ttl(None).is_err());
    }
}
