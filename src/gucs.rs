//! Every `pg_lease.*` setting, defined in one place with typed accessors.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};

thread_local! {
    /// The parsed value of `pg_lease.token`, kept in step by the assign hook so
    /// the per-row fence never parses a string.
    static BOUND_TOKEN: Cell<Option<i64>> = const { Cell::new(None) };
    /// `pg_lease.token`'s own GUC record, found once after it is defined.
    static TOKEN_GUC: Cell<*const pg_sys::config_generic> = const { Cell::new(std::ptr::null()) };
}

/// Backing storage Postgres writes the raw `pg_lease.token` string into.
/// Rust never reads or writes it: guc.c owns it (through the address given
/// in [`init`]); the parsed value lives in `BOUND_TOKEN`.
static mut TOKEN_RAW: *mut c_char = std::ptr::null_mut();

/// Record refusals in `lease.rejected_writes` (needs preload).
pub static AUDIT: GucSetting<bool> = GucSetting::<bool>::new(true);
/// Records the shared-memory queue holds; a full queue counts refusals as dropped.
pub static AUDIT_QUEUE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(2048);
/// Protected tables (of all databases) `lease.stats` counts at once.
pub static STATS_TABLES: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// How often, at most, the audit worker sleeps between flushes.
pub static AUDIT_FLUSH_MS: GucSetting<i32> = GucSetting::<i32>::new(200);
/// Also keep the refused statement's text (may hold personal data).
pub static AUDIT_STATEMENT: GucSetting<bool> = GucSetting::<bool>::new(false);
/// Also keep the refused row as jsonb (may hold personal data).
pub static AUDIT_ROW: GucSetting<bool> = GucSetting::<bool>::new(false);
/// Delete audit rows older than this many minutes (0: keep them).
pub static AUDIT_RETENTION_MIN: GucSetting<i32> = GucSetting::<i32>::new(0);
/// One structured LOG line per refusal.
pub static LOG_REJECTIONS: GucSetting<bool> = GucSetting::<bool>::new(true);
/// The one database whose `lease.rejected_writes` takes every database's
/// refusals; empty (the default): each database records its own.
pub static DATABASE: GucSetting<Option<std::ffi::CString>> = GucSetting::<Option<std::ffi::CString>>::new(Some(c""));
/// Most per-database audit writers running at once.
pub static AUDIT_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(2);

/// The central audit database, when `pg_lease.database` names one.
pub fn central_database() -> Option<String> {
    DATABASE.get().map(|c| c.to_string_lossy().trim().to_owned()).filter(|name| !name.is_empty())
}

/// Roles (besides superusers) whose logical replication subscriptions the
/// fence trusts: their workers' changes are accepted as judged at their origin.
pub static TRUSTED_SUBSCRIPTION_OWNERS: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(Some(c""));

thread_local! {
    static WARNED_BAD_OWNER_LIST: Cell<bool> = const { Cell::new(false) };
}

/// Whether `role` is named in `pg_lease.trusted_subscription_owners` (a
/// comma-separated list of role names, read as `search_path` is: unquoted
/// names fold to lower case). A list that does not parse trusts no one, with
/// one WARNING per process.
pub fn trusted_subscription_owner(role: pg_sys::Oid) -> bool {
    let Some(list) = TRUSTED_SUBSCRIPTION_OWNERS.get() else { return false };
    if list.to_bytes().iter().all(u8::is_ascii_whitespace) {
        return false;
    }
    // SAFETY: SplitIdentifierString splits a palloc'd copy of the list in
    // place (the list cells point into it) and reports whether it parsed;
    // get_role_oid is a syscache lookup that returns InvalidOid for an
    // unknown name (missing_ok). Everything is palloc'd in the current
    // memory context, freed with it.
    unsafe {
        let raw = pg_sys::pstrdup(list.as_ptr());
        let mut names: *mut pg_sys::List = std::ptr::null_mut();
        if !pg_sys::SplitIdentifierString(raw, b',' as c_char, &mut names) {
            if !WARNED_BAD_OWNER_LIST.with(|w| w.replace(true)) {
                pgrx::warning!(
                    "pg_lease: pg_lease.trusted_subscription_owners is not a list of role names; no subscription owner is trusted through it"
                );
            }
            return false;
        }
        let names = pgrx::PgList::<c_char>::from_pg(names);
        let trusted = names.iter_ptr().any(|name| pg_sys::get_role_oid(name, true) == role);
        trusted
    }
}

/// Shortest lease TTL `lease.acquire`/`renew` accept, in milliseconds.
pub static MIN_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(100);
/// Longest lease TTL `lease.acquire`/`renew` accept, in milliseconds (default one day).
pub static MAX_TTL_MS: GucSetting<i32> = GucSetting::<i32>::new(86_400_000);

/// The writer's fencing token bound to the current transaction with
/// `lease.bind_token(t)` or `SET LOCAL pg_lease.token = 't'`.
///
/// A value counts only in the transaction that set it: Postgres keeps a GUC
/// stack entry for a setting changed in the current transaction (by SET,
/// SET LOCAL, set_config or a function's SET clause) and pops it at commit or
/// abort, and at the abort of the subtransaction that made it. A value that
/// outlived its transaction (a session-level SET behind a transaction pooler,
/// `ALTER ROLE ... SET`, PGOPTIONS) has no stack entry and binds nothing.
#[inline]
pub fn bound_token() -> Option<i64> {
    let token = BOUND_TOKEN.with(|t| t.get())?;
    let guc = TOKEN_GUC.with(|g| g.get());
    // SAFETY: `guc` is null or the config_generic Postgres allocated for
    // pg_lease.token in this backend (find_token_guc), which guc.c never
    // frees or moves; reading its `stack` field by value, in the backend's
    // only thread, races with nothing.
    (!guc.is_null() && unsafe { !(*guc).stack.is_null() }).then_some(token)
}

/// Finds pg_lease.token's GUC record (call right after defining it).
fn find_token_guc() -> *const pg_sys::config_generic {
    // SAFETY: the GUC records belong to guc.c and are only read here, in
    // this backend's only thread; records are never freed. PG 18:
    // find_option takes a NUL-terminated name, creates no placeholder and,
    // with skip_errorstack, returns NULL when the name is unknown. Before:
    // get_guc_variables() is an array of GetNumConfigOptions() non-null
    // record pointers, each record's `name` a NUL-terminated string.
    unsafe {
        #[cfg(feature = "pg18")]
        {
            pg_sys::find_option(c"pg_lease.token".as_ptr(), false, true, pg_sys::PGERROR as i32)
        }
        #[cfg(not(feature = "pg18"))]
        {
            let vars = pg_sys::get_guc_variables();
            let n = pg_sys::GetNumConfigOptions() as usize;
            (0..n)
                .map(|i| *vars.add(i))
                .find(|&v| !v.is_null() && CStr::from_ptr((*v).name) == c"pg_lease.token")
                .map_or(std::ptr::null(), |v| v as *const _)
        }
    }
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

/// guc.c's check hook for `pg_lease.token`. Guarded: a Postgres ERROR
/// raised inside (out of memory in pstrdup) must not unwind into guc.c as a
/// Rust panic.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_token(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: guc.c calls a string check hook with a valid pointer to the
    // candidate value (which may itself be null).
    let newval = unsafe { *newval };
    if newval.is_null() {
        return true;
    }
    // SAFETY: a non-null candidate is a NUL-terminated string guc.c owns
    // until the hook returns; the text is copied if not valid UTF-8 and only
    // used within the hook.
    let text = unsafe { CStr::from_ptr(newval) }.to_string_lossy();
    match parse_token(&text) {
        // A token is bound per transaction; a value from the configuration
        // file, ALTER ROLE/DATABASE SET or the connection (PGOPTIONS) would
        // claim every transaction of a session: refuse it where it is set.
        Ok(Some(_)) if source != pg_sys::GucSource::PGC_S_SESSION && source != pg_sys::GucSource::PGC_S_OVERRIDE => {
            check_errdetail(c"pg_lease.token binds a fencing token to one transaction; it cannot be set for a role, a database, a connection or the server.");
            check_errhint(c"Call lease.bind_token(token) in each transaction that writes.");
            false
        }
        Ok(_) => true,
        Err(why) => {
            check_errdetail(why);
            false
        }
    }
}

/// What GUC_check_errdetail() does: the DETAIL guc.c reports right after a
/// check hook returns false (it resets the string before each hook call).
fn check_errdetail(detail: &CStr) {
    // SAFETY: pstrdup copies the NUL-terminated `detail` into the current
    // memory context, where guc.c reads it before the hook's caller returns;
    // GUC_check_errdetail_string is a plain backend global, assigned by value
    // (no reference to the `static mut` is taken) in the backend's only thread.
    unsafe { pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr()) };
}

/// What GUC_check_errhint() does (see [`check_errdetail`]).
fn check_errhint(hint: &CStr) {
    // SAFETY: as in check_errdetail, for GUC_check_errhint_string.
    unsafe { pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr()) };
}

/// guc.c's assign hook for `pg_lease.token` (guarded, as `check_token`).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn assign_token(newval: *const c_char, _extra: *mut c_void) {
    let parsed = if newval.is_null() {
        None
    } else {
        // SAFETY: guc.c calls the assign hook with the value just accepted
        // by check_token: a NUL-terminated string it owns for the call.
        parse_token(&unsafe { CStr::from_ptr(newval) }.to_string_lossy()).unwrap_or(None)
    };
    BOUND_TOKEN.with(|t| t.set(parsed));
}

pub fn init() {
    // SAFETY: called once per backend, from _PG_init. Name and descriptions
    // are 'static C literals (guc.c keeps pointers to the descriptions);
    // TOKEN_RAW is a 'static that only guc.c accesses, through this `&raw
    // mut` (no Rust reference to the `static mut` exists); the boot value is
    // a 'static literal; the hooks have guc.c's check/assign signatures.
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
        )
    };
    TOKEN_GUC.with(|g| g.set(find_token_guc()));
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
    GucRegistry::define_bool_guc(
        c"pg_lease.audit",
        c"Record refused writes in lease.rejected_writes (needs shared_preload_libraries).",
        c"",
        &AUDIT,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_lease.audit_flush_ms",
        c"Longest time the audit worker waits before writing queued refusals.",
        c"",
        &AUDIT_FLUSH_MS,
        10,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"pg_lease.audit_statement",
        c"Keep the text of refused statements in lease.rejected_writes.",
        c"Off by default: statements can hold personal data.",
        &AUDIT_STATEMENT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_lease.audit_row",
        c"Keep refused rows as jsonb in lease.rejected_writes.",
        c"Off by default: payouts can hold personal data.",
        &AUDIT_ROW,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_lease.audit_retention",
        c"Age after which the audit worker deletes rows of lease.rejected_writes; 0 keeps them.",
        c"",
        &AUDIT_RETENTION_MIN,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MIN,
    );
    GucRegistry::define_bool_guc(
        c"pg_lease.log_rejections",
        c"Write one structured LOG line per refused write.",
        c"",
        &LOG_REJECTIONS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_lease.trusted_subscription_owners",
        c"Roles, besides superusers, whose logical replication subscriptions the fence trusts.",
        c"Changes that their subscriptions' workers apply are accepted as judged at their origin; list only roles that may write the fenced tables anyway.",
        &TRUSTED_SUBSCRIPTION_OWNERS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // Server-start settings can only be defined while preloading; without
    // preload there is no queue or worker for them to configure.
    // SAFETY: reads (by value) a backend global guc.c/miscinit.c set
    // before loading libraries; this backend has one thread.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        GucRegistry::define_int_guc(
            c"pg_lease.audit_queue_size",
            c"Refusal records the shared-memory audit queue holds.",
            c"When it is full, refusals are counted as dropped (they still reach the log).",
            &AUDIT_QUEUE_SIZE,
            16,
            1 << 20,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_int_guc(
            c"pg_lease.stats_tables",
            c"Protected tables, of all databases, that lease.stats counts at once.",
            c"Each takes about 560 bytes of shared memory. When all are taken, those of dropped tables and databases are reused; further tables are fenced and audited but not counted.",
            &STATS_TABLES,
            16,
            1 << 16,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_string_guc(
                c"pg_lease.database",
                c"One database whose lease.rejected_writes records the refusals of every database; empty: each database records its own.",
                c"Empty (the default): refusals are recorded in the lease.rejected_writes of the database where they happened.",
                &DATABASE,
                GucContext::Postmaster,
                GucFlags::default(),
            );
        GucRegistry::define_int_guc(
            c"pg_lease.audit_workers",
            c"Most per-database audit writers running at once.",
            c"Each takes a max_worker_processes slot while it runs.",
            &AUDIT_WORKERS,
            1,
            64,
            GucContext::Sighup,
            GucFlags::default(),
        );
    }
    // Typos such as `SET pg_lease.tokne` then fail instead of creating a placeholder.
    // SAFETY: a NUL-terminated 'static literal, which guc.c copies into its
    // list of reserved prefixes.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pg_lease".as_ptr()) };
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

    #[pg_test]
    fn token_guc_record_is_found() {
        assert!(!find_token_guc().is_null());
        assert!(TOKEN_GUC.with(|g| g.get()) == find_token_guc());
    }

    #[pg_test(error = "invalid value for parameter \"pg_lease.token\": \"5\"")]
    fn token_cannot_be_set_per_role() {
        Spi::run("ALTER ROLE CURRENT_USER SET pg_lease.token = '5'").unwrap();
    }
}
