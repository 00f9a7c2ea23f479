//! The `LF` SQLSTATE class: its codes, the facts of a refusal, and the one
//! place that raises it. A leaf: depends only on `pg_sys`.
//!
//! pgrx's `PgSqlErrorCode` is a closed enum and every pgrx guard rewrites an
//! unknown SQLSTATE to XX000, so an `LF001` raised through `ereport!` would
//! reach clients as an internal error. Functions that can refuse are therefore
//! exported as plain version-1 C functions (`crate::boundary`): their work runs
//! inside `pgrx_extern_c_guard` and returns a [`Refusal`], which [`raise`] turns
//! into an `ErrorData` thrown with our own binding of `ThrowErrorData`, from a
//! frame that owns nothing with a destructor.

use pgrx::pg_sys;
use std::ffi::c_char;

/// Every error pg_lease raises itself. The codes are public API: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseError {
    StaleOwnerBoundaryWrite,
    FencingTokenAhead,
    MissingFencingToken,
    FencingTokenRegression,
    LeaseOwnedElsewhere,
    LeaseLost,
    FenceOwnerMissing,
    FenceTampering,
}

/// One row per error: (error, SQLSTATE, name, hint). The only place an LF
/// code, its name or its hint is written down.
const TABLE: [(LeaseError, &str, &str, &str); 8] = [
    (
        LeaseError::StaleOwnerBoundaryWrite,
        "LF001",
        "StaleOwnerBoundaryWrite",
        "This writer is a stale owner: another process took over the resource. Stop writing for it and do not retry; retrying cannot succeed.",
    ),
    (
        LeaseError::FencingTokenAhead,
        "LF002",
        "FencingTokenAhead",
        "The writer presents a token the database never recorded (for example one issued by a primary whose WAL was lost in a failover). Stop writing and re-acquire the lease.",
    ),
    (
        LeaseError::MissingFencingToken,
        "LF003",
        "MissingFencingToken",
        "Stamp the writer's fencing token into the token column, or bind it for the transaction with lease.bind_token(token).",
    ),
    (
        LeaseError::FencingTokenRegression,
        "LF004",
        "FencingTokenRegression",
        "Fencing tokens only rise. Issue a new, higher token instead of lowering or clearing the current one.",
    ),
    (
        LeaseError::LeaseOwnedElsewhere,
        "LF005",
        "LeaseOwnedElsewhere",
        "Another live owner holds this lease. Wait for it to expire or be released, or use lease.try_acquire.",
    ),
    (
        LeaseError::LeaseLost,
        "LF006",
        "LeaseLost",
        "This owner no longer holds the lease. Freeze the resource and stop writing for it.",
    ),
    (
        LeaseError::FenceOwnerMissing,
        "LF007",
        "FenceOwnerMissing",
        "Every fenced row must match an owner row. Create the owner row first, or check the key columns.",
    ),
    (
        LeaseError::FenceTampering,
        "LF008",
        "FenceTampering",
        "pg_lease's triggers and fenced columns can only be removed with lease.unprotect(table).",
    ),
];

// `LeaseError::row` indexes TABLE by discriminant: checked at compile time.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(TABLE[i].0 as usize == i);
        i += 1;
    }
};

impl LeaseError {
    /// Every error, in code order (tests walk it).
    #[cfg(any(test, feature = "pg_test"))]
    pub const ALL: [LeaseError; 8] = {
        let mut all = [LeaseError::StaleOwnerBoundaryWrite; 8];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static (LeaseError, &'static str, &'static str, &'static str) {
        // The table lists the variants in declaration order.
        &TABLE[self as usize]
    }

    pub fn sqlstate(self) -> &'static str {
        self.row().1
    }

    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// What the operator (or the client's error handler) should do about it.
    pub fn hint(self) -> &'static str {
        self.row().3
    }

    pub fn from_name(name: &str) -> Option<LeaseError> {
        TABLE.iter().find(|r| r.2 == name).map(|r| r.0)
    }

    pub fn from_sqlstate(code: &str) -> Option<LeaseError> {
        TABLE.iter().find(|r| r.1 == code).map(|r| r.0)
    }

    /// The MAKE_SQLSTATE encoding Postgres keeps in `ErrorData.sqlerrcode`.
    pub fn sqlerrcode(self) -> i32 {
        encode_sqlstate(self.sqlstate())
    }
}

/// A refusal decided by pg_lease, raised with its own SQLSTATE by [`raise`].
pub struct Refusal {
    pub error: LeaseError,
    /// Follows the error's name in the message: `StaleOwnerBoundaryWrite: <summary>`.
    pub summary: String,
    pub detail: String,
    pub schema: Option<Box<str>>,
    pub table: Option<Box<str>>,
    /// Set for refused writes: what the audit records.
    pub audit: Option<Box<Facts>>,
    /// Replaces the error's general hint when this case has a better one.
    pub hint: Option<Box<str>>,
}

/// What a refused write leaves behind beyond the error itself: the audit's
/// record of it (`lease.rejected_writes`, the LOG line).
pub struct Facts {
    /// The protected (or owner) table the refusal happened on.
    pub relid: pg_sys::Oid,
    /// Its `schema.table`, quoted as needed.
    pub table: String,
    /// INSERT, UPDATE, DELETE or TRUNCATE.
    pub operation: &'static str,
    /// The resource key as `(col, ...)=(value, ...)`; empty for TRUNCATE.
    pub resource: String,
    pub presented: Option<i64>,
    pub current: Option<i64>,
    /// The refused row as JSON, when `pg_lease.audit_row` asked for it.
    pub row_json: Option<String>,
}

impl Refusal {
    pub fn new(error: LeaseError, summary: impl Into<String>, detail: impl Into<String>) -> Self {
        Refusal {
            error,
            summary: summary.into(),
            detail: detail.into(),
            schema: None,
            table: None,
            audit: None,
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into().into_boxed_str());
        self
    }

    pub fn audited(mut self, facts: Facts) -> Self {
        self.audit = Some(Box::new(facts));
        self
    }

    pub fn on_table(mut self, schema: &str, table: &str) -> Self {
        self.schema = Some(schema.into());
        self.table = Some(table.into());
        self
    }

    pub fn message(&self) -> String {
        format!("{}: {}", self.error.name(), self.summary)
    }
}

extern "C-unwind" {
    // Our own binding on purpose: pgrx's wrapper turns the longjmp into a Rust
    // panic that nothing above this frame could catch.
    #[link_name = "ThrowErrorData"]
    fn throw_error_data(edata: *mut pg_sys::ErrorData);
}

/// Copies a Rust string into the current memory context.
fn pstrdup(s: &str) -> *mut c_char {
    // Messages are in the database's encoding, as the server sends them.
    let s = crate::pg::to_server(s);
    let len = s.len();
    // SAFETY: palloc returns len + 1 writable bytes (or raises); the copy
    // and the terminator stay inside them.
    unsafe {
        let p = pg_sys::palloc(len + 1) as *mut u8;
        std::ptr::copy_nonoverlapping(s.as_ptr(), p, len);
        *p.add(len) = 0;
        p as *mut c_char
    }
}

/// Bad input to one of pg_lease's functions, raised like a refusal (no
/// CONTEXT lines) but with a standard SQLSTATE, and never audited.
pub struct Invalid {
    sqlerrcode: i32,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl Invalid {
    /// `sqlstate` is five characters of 0-9 and A-Z (as Postgres defines them).
    pub fn new(sqlstate: &str, message: impl Into<String>) -> Result<Invalid, String> {
        let valid = sqlstate.len() == 5 && sqlstate.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase());
        if !valid || sqlstate.starts_with("00") {
            return Err(format!("\"{sqlstate}\" is not an error SQLSTATE (five characters 0-9, A-Z, not class 00)"));
        }
        Ok(Invalid { sqlerrcode: encode_sqlstate(sqlstate), message: message.into(), detail: None, hint: None })
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// The MAKE_SQLSTATE encoding of a five-character SQLSTATE.
fn encode_sqlstate(code: &str) -> i32 {
    code.bytes().enumerate().map(|(i, c)| (((c as i32) - ('0' as i32)) & 0x3F) << (6 * i)).sum()
}

/// What an error report is made of.
pub struct Fields<'a> {
    sqlerrcode: i32,
    message: String,
    detail: Option<&'a str>,
    hint: Option<&'a str>,
    schema: Option<&'a str>,
    table: Option<&'a str>,
}

/// Anything [`raise`] can throw.
pub trait Raisable {
    fn fields(&self) -> Fields<'_>;
}

impl Raisable for Refusal {
    fn fields(&self) -> Fields<'_> {
        Fields {
            sqlerrcode: self.error.sqlerrcode(),
            message: self.message(),
            detail: Some(&self.detail),
            hint: Some(self.hint.as_deref().unwrap_or(self.error.hint())),
            schema: self.schema.as_deref(),
            table: self.table.as_deref(),
        }
    }
}

impl Raisable for Invalid {
    fn fields(&self) -> Fields<'_> {
        Fields {
            sqlerrcode: self.sqlerrcode,
            message: self.message.clone(),
            detail: self.detail.as_deref(),
            hint: self.hint.as_deref(),
            schema: None,
            table: None,
        }
    }
}

/// How a lease call (crate::lease_calls) can fail: bad input, or a refusal.
pub enum Failure {
    Invalid(Invalid),
    Refused(Refusal),
}

impl From<Invalid> for Failure {
    fn from(invalid: Invalid) -> Failure {
        Failure::Invalid(invalid)
    }
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Failure {
        Failure::Refused(refusal)
    }
}

impl Raisable for Failure {
    fn fields(&self) -> Fields<'_> {
        match self {
            Failure::Invalid(invalid) => invalid.fields(),
            Failure::Refused(refusal) => refusal.fields(),
        }
    }
}

/// Builds the palloc'd `ErrorData`.
fn build_error_data(f: Fields) -> *mut pg_sys::ErrorData {
    // SAFETY: palloc0 returns zeroed memory for an ErrorData in the current
    // memory context (or raises); every string is copied into that context.
    unsafe {
        let edata = pg_sys::palloc0(std::mem::size_of::<pg_sys::ErrorData>()) as *mut pg_sys::ErrorData;
        let e = &mut *edata;
        e.elevel = pg_sys::PGERROR as i32;
        e.sqlerrcode = f.sqlerrcode;
        e.message = pstrdup(&f.message);
        e.detail = f.detail.filter(|d| !d.is_empty()).map_or(std::ptr::null_mut(), pstrdup);
        e.hint = f.hint.filter(|h| !h.is_empty()).map_or(std::ptr::null_mut(), pstrdup);
        e.domain = c"pg_lease".as_ptr();
        e.filename = c"errors.rs".as_ptr();
        e.funcname = c"pg_lease".as_ptr();
        e.schema_name = f.schema.map_or(std::ptr::null_mut(), pstrdup);
        e.table_name = f.table.map_or(std::ptr::null_mut(), pstrdup);
        e.assoc_context = pg_sys::CurrentMemoryContext;
        edata
    }
}

/// Raises `error` as an ERROR with its SQLSTATE. Never returns.
///
/// # Safety
/// Must be called from an unguarded `extern "C-unwind"` frame (a `c_function!`)
/// whose locals have no destructors still to run: the longjmp skips them.
pub unsafe fn raise(error: impl Raisable) -> ! {
    // SAFETY: the guard turns a Postgres error while building (out of
    // memory) into a normal ERROR; `error` is dropped inside it.
    let edata = unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(move || build_error_data(error.fields())) };
    // No CONTEXT lines: pg_lease's own PL/pgSQL frames (fenced_boundary_write's
    // generated INSERT, the call of `lease._raise` or `lease._fail` with its
    // arguments) are internals, not news to the client; the message and
    // DETAIL already say everything.
    // Except in a logical replication worker: there the CONTEXT line is the
    // worker's own, naming the remote transaction and its finish LSN, which
    // `ALTER SUBSCRIPTION ... SKIP (lsn = ...)` needs.
    // SAFETY: the callbacks on this stack only add CONTEXT lines; every
    // handler that catches the error (PG_TRY, PL/pgSQL exception blocks, the
    // top-level sigsetjmp) restores the stack it saved, so clearing it for
    // this throw affects this error's report and nothing after it.
    // IsLogicalWorker reads this process's own worker slot pointer. Then the
    // ErrorData (palloc'd, complete) is thrown; this frame owns nothing.
    unsafe {
        if !pg_sys::IsLogicalWorker() {
            pg_sys::error_context_stack = std::ptr::null_mut();
        }
        throw_error_data(edata);
    }
    // ThrowErrorData at ERROR level always longjmps.
    std::process::abort()
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::LeaseError;
    use pgrx::prelude::*;

    #[pg_test]
    fn sqlerrcode_uses_postgres_encoding() {
        // Same arithmetic as MAKE_SQLSTATE, checked against a code Postgres defines.
        let serialization_failure: i32 =
            "40001".bytes().enumerate().map(|(i, c)| ((c as i32 - 48) & 0x3F) << (6 * i)).sum();
        assert_eq!(serialization_failure, PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE as i32);
        let codes: Vec<_> = LeaseError::ALL.iter().map(|e| e.sqlstate()).collect();
        assert_eq!(codes, ["LF001", "LF002", "LF003", "LF004", "LF005", "LF006", "LF007", "LF008"]);
        for e in LeaseError::ALL {
            assert_eq!(LeaseError::from_name(e.name()), Some(e));
            assert!(!e.hint().is_empty());
        }
        // Postgres renders the encoded code back to the same five characters.
        // SAFETY: unpack_sql_state returns a pointer to a static buffer.
        let rendered =
            unsafe { std::ffi::CStr::from_ptr(pg_sys::unpack_sql_state(LeaseError::FenceTampering.sqlerrcode())) };
        assert_eq!(rendered.to_str().unwrap(), "LF008");
    }

    #[pg_test]
    fn a_refusal_reported_as_xx000_gets_its_code_back() {
        let (error, internal) = (pgrx::PgLogLevel::ERROR as i32, PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32);
        let lost = |message: &str| super::lost_code(error, internal, message.as_bytes());
        assert_eq!(
            lost("StaleOwnerBoundaryWrite: INSERT on public.payouts ..."),
            Some(LeaseError::StaleOwnerBoundaryWrite)
        );
        assert_eq!(lost("FenceTampering: the fence on t is inconsistent"), Some(LeaseError::FenceTampering));
        // Only pg_lease's error names, followed by ": ", only XX000 ERRORs.
        for message in ["StaleOwnerBoundaryWriteX: a", "StaleOwnerBoundaryWrite:x", "pg_lease: a", "no colon", ""] {
            assert_eq!(lost(message), None, "{message:?}");
        }
        let unique = PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION as i32;
        assert_eq!(super::lost_code(error, unique, b"StaleOwnerBoundaryWrite: a"), None);
        assert_eq!(super::lost_code(pgrx::PgLogLevel::WARNING as i32, internal, b"StaleOwnerBoundaryWrite: a"), None);
    }

    #[pg_test]
    fn refusals_abort_the_statement_and_write_nothing() {
        Spi::run(
            "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id int, fencing_token bigint);
             SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
             INSERT INTO tables VALUES (1, 3);
             INSERT INTO payouts VALUES (1, 3);",
        )
        .unwrap();
        let caught = Spi::get_one::<String>(
            "DO $$ BEGIN INSERT INTO payouts VALUES (1, 2); EXCEPTION WHEN SQLSTATE 'LF001' THEN
                 PERFORM set_config('pg_lease_test.caught', 'LF001', true); END $$;
             SELECT current_setting('pg_lease_test.caught')",
        );
        assert_eq!(caught.unwrap().as_deref(), Some("LF001"));
        assert_eq!(Spi::get_one::<i64>("SELECT count(*) FROM payouts").unwrap(), Some(1));
    }
}

static PREV_EMIT_LOG: std::sync::OnceLock<pg_sys::emit_log_hook_type> = std::sync::OnceLock::new();

/// Installs [`emit_log`]; called once per process from `_PG_init`. Also
/// turns Rust's library backtraces off in this process (and the processes
/// the postmaster forks from it) unless `RUST_LIB_BACKTRACE` says
/// otherwise: pgrx puts the backtrace it captures when a Postgres error
/// crosses Rust code (a cancelled lock wait inside `lease.acquire`) into the
/// error's DETAIL, so a server started from a shell with `RUST_BACKTRACE=1`
/// showed clients some 60 frames with build paths. (`RUST_BACKTRACE` itself
/// stays, for the panic messages of the server log.)
pub fn init() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // (_PG_init runs once per process before any thread is started:
        // Postgres backends and the postmaster have one thread, so nothing
        // reads the environment concurrently; std reads the variable at the
        // first backtrace capture, which comes later.)
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    // SAFETY: _PG_init runs once per process, single-threaded; the hook is a
    // static function with the signature Postgres calls.
    unsafe {
        PREV_EMIT_LOG.get_or_init(|| pg_sys::emit_log_hook);
        pg_sys::emit_log_hook = Some(emit_log);
    }
}

/// The LF error an error report is, when it lost its SQLSTATE on the way:
/// an `XX000` ERROR whose message is `<error name>: ...`, as pg_lease words
/// every refusal. Citus reports a worker's error through its COPY path (and
/// an `INSERT ... SELECT` the coordinator evaluates) that way, with the
/// message and DETAIL but without the SQLSTATE or HINT.
fn lost_code(elevel: i32, sqlerrcode: i32, message: &[u8]) -> Option<LeaseError> {
    if elevel != pgrx::PgLogLevel::ERROR as i32 || sqlerrcode != pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as i32 {
        return None;
    }
    let name = &message[..message.iter().position(|&b| b == b':')?];
    LeaseError::from_name(std::str::from_utf8(name).ok()?).filter(|e| message[e.name().len()..].starts_with(b": "))
}

/// `emit_log_hook`: puts back the LF SQLSTATE (and the error's hint, when
/// the report has none) of a refusal that reaches this process as `XX000`
/// ([`lost_code`]), before the report goes to the client and the log. A
/// PL/pgSQL `EXCEPTION` block that catches the error still sees `XX000`
/// (the hook runs only when the error is reported).
unsafe extern "C-unwind" fn emit_log(edata: *mut pg_sys::ErrorData) {
    // SAFETY: Postgres passes the error being reported (or NULL); its
    // message is a NUL-terminated string in ErrorContext, where the hint is
    // copied too (the report and the hint are freed with it).
    unsafe {
        if let Some(e) = edata.as_mut() {
            if !e.message.is_null() {
                let message = std::ffi::CStr::from_ptr(e.message).to_bytes();
                // Only where Citus runs in this process (it is what loses
                // the code): elsewhere an XX000 so worded is someone
                // else's error, left as it is.
                let citus = !pg_sys::GetConfigOption(c"citus.version".as_ptr(), true, false).is_null();
                if let Some(error) = lost_code(e.elevel, e.sqlerrcode, message).filter(|_| citus) {
                    e.sqlerrcode = error.sqlerrcode();
                    if e.hint.is_null() {
                        let hint = std::ffi::CString::new(error.hint()).expect("hints have no NUL");
                        e.hint = pg_sys::MemoryContextStrdup(pg_sys::ErrorContext, hint.as_ptr());
                    }
                }
            }
        }
        if let Some(Some(prev)) = PREV_EMIT_LOG.get() {
            prev(edata);
        }
    }
}
