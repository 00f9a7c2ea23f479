//! Every `pg_lease.*` setting, defined in one place with typed accessors.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};

thread_local! {
    /// The parsed value of `pg_lease.token`, kept in step by the assign hook so
    /// the per-row fence never parses a string.
    static BOUND_TOKEN: Cell<Option<i64>> = const { Cell::new(None) };
}

/// Backing storage Postgres writes the raw `pg_lease.token` string into.
static mut TOKEN_RAW: *mut c_char = std::ptr::null_mut();

/// Shortest lease TTL `lease.acquire`/`renew` accept, in milliseconds.
pub static MIN_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
/// Longest lease TTL `lease.acquire`/`renew` accept, in milliseconds (default one day).
pub static MAX_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(86_400_000);

/// The writer's fencing token bound to the current transaction with
/// `lease.bind_token(t)` or `SET LOCAL pg_lease.token = 't'`.
#[inline]
pub fn bound_token() -> Option<i64> {
    BOUND_TOKEN.with(|t| t.get())
}

/// Parses a token as written in `pg_lease.token`: empty means unbound.
pub fn parse_token(text: &str) -> Result<Option<i64>, &'static CStr> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<i64>() {
        Ok(t) if t >= 0 => Ok(Some(t)),
        Ok(_) => Err(c"Fencing tokens are non-negative."),
        Err(_) => Err(c"A fencing token is a bigint written in decimal, or empty for none."),
    }
}

unsafe extern "C-unwind" fn check_token(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    if (*newval).is_null() {
        return true;
    }
    let text = CStr::from_ptr(*newval).to_string_lossy();
    match parse_token(&text) {
        Ok(_) => true,
        Err(why) => {
            // What GUC_check_errdetail() does; Postgres reports it right after we return.
            pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(why.as_ptr());
            false
        }
    }
}

unsafe extern "C-unwind" fn assign_token(newval: *const c_char, _extra: *mut c_void) {
    let parsed = if newval.is_null() {
        None
    } else {
        parse_token(&CStr::from_ptr(newval).to_string_lossy()).unwrap_or(None)
    };
    BOUND_TOKEN.with(|t| t.set(parsed));
}

pub fn init() {
    unsafe {
        pg_sys::DefineCustomStringVariable(
            c"pg_lease.token".as_ptr(),
            c"Fencing token the current writer presents when the protected table has no token column.".as_ptr(),
            c"Set it per transaction with lease.bind_token(token) or SET LOCAL.".as_ptr(),
            &raw mut TOKEN_RAW,
            c"".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_token),
            Some(assign_token),
            None,
        );
        GucRegistry::define_int_guc(
            c"pg_lease.min_ttl_ms",
            c"Shortest lease TTL accepted by lease.acquire and lease.renew, in milliseconds.",
            c"",
            &MIN_TTL_MS,
            1,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_MS,
        );
        GucRegistry::define_int_guc(
            c"pg_lease.max_ttl_ms",
            c"Longest lease TTL accepted by lease.acquire and lease.renew, in milliseconds.",
            c"",
            &MAX_TTL_MS,
            1,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_MS,
        );
        // Typos such as `SET pg_lease.tokne` then fail instead of creating a placeholder.
        #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18"))]
        pg_sys::MarkGUCPrefixReserved(c"pg_lease".as_ptr());
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn token_text_parses_strictly() {
        assert_eq!(parse_token(""), Ok(None));
        assert_eq!(parse_token(" 42 "), Ok(Some(42)));
        assert_eq!(parse_token("9223372036854775807"), Ok(Some(i64::MAX)));
        assert!(parse_token("-1").is_err());
        assert!(parse_token("4x").is_err());
        assert!(parse_token("9223372036854775808").is_err());
    }

    #[pg_test]
    fn bound_token_follows_set_local() {
        Spi::run("SET LOCAL pg_lease.token = '17'").unwrap();
        assert_eq!(bound_token(), Some(17));
        Spi::run("SELECT lease.bind_token(18)").unwrap();
        assert_eq!(bound_token(), Some(18));
        Spi::run("SET LOCAL pg_lease.token = ''").unwrap();
        assert_eq!(bound_token(), None);
    }
}
