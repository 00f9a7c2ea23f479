//! Thin safe wrappers over `pg_sys`: catalogs, names, datums, rows, trigger
//! calls, roles, saved plans. Depends on nothing else in pg_lease; every other
//! module reads Postgres through these (or through pgrx) rather than raw
//! pointers of its own.
//!
//! The safe functions here rely on what holds for all of pg_lease's code: it
//! runs in a backend's one thread, inside a transaction (so syscache and
//! catalog lookups are allowed), called through pgrx or `crate::boundary`,
//! which turn a Postgres ERROR raised inside a `pg_sys` call into a Rust
//! panic and back. Pointers Postgres returns from a lookup are palloc'd in
//! `CurrentMemoryContext`, which no callee here resets, and are copied into
//! Rust values before the function returns.

use pgrx::pg_sys;
use std::ffi::CStr;

/// A C string owned by Postgres, in the database's encoding, copied into Rust
/// as UTF-8 ([`from_server`]; NULL becomes empty).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that stays valid and
/// unmodified for the duration of this call (e.g. a palloc'd result of the
/// `pg_sys` call that produced it, or a backend global).
pub(crate) unsafe fn owned(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null here, and NUL-terminated and valid for the call by
        // the caller's contract; the bytes are copied before returning.
        from_server(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// [`owned`] for a name that goes back into SQL ([`exact_from_server`]).
///
/// # Safety
/// As for [`owned`].
pub(crate) unsafe fn owned_exact(p: *const std::ffi::c_char, what: &str) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: as in `owned`.
        exact_from_server(unsafe { CStr::from_ptr(p) }.to_bytes(), what)
    }
}

// Text and the database's encoding. Rust text is UTF-8; PostgreSQL's text
// (names, values, SQL, messages) is in the database's encoding. Every text
// pg_lease reads from PostgreSQL comes through `from_server` (`owned`,
// `ServerText`; never pgrx's `String`/`&str`, which take the bytes as UTF-8),
// and every text it hands back through `to_server` (generated SQL through
// `server_cstring`; values through `ServerText`;
// messages in `errors`).

/// The database's encoding (fixed for a backend's life).
fn database_encoding() -> i32 {
    // SAFETY: reads a backend global set at connection.
    unsafe { pg_sys::GetDatabaseEncoding() }
}

/// Whether the database's encoding is UTF-8, in which Rust text is its text.
pub fn database_is_utf8() -> bool {
    database_encoding() == pg_sys::pg_enc::PG_UTF8 as i32
}

/// Text in the database's encoding as Rust text, never raising (messages,
/// the audit, error callbacks): converted by PostgreSQL. A character that
/// has no exact UTF-8 form (one that would come back as another character
/// or as none: an EUC_JP NEC duplicate or user-defined character, a byte
/// sequence invalid in the encoding, in SQL_ASCII a byte that is not UTF-8)
/// is shown as its bytes, `\xadf5`, so two texts that differ stay
/// different. Where a text names something ([`exact_from_server`]) such a
/// character is refused instead.
pub fn from_server(bytes: &[u8]) -> String {
    decode(bytes, Escape::Text).0
}

/// [`from_server`] with each character that has no exact UTF-8 form read as
/// one U+FFFD: for rules that count or classify characters (a lease name's
/// length), never for text that is shown or compared.
pub fn from_server_replacing(bytes: &[u8]) -> String {
    decode(bytes, Escape::Replace).0
}

/// [`from_server`] for JSON text (`row_to_json`'s): a character with no
/// exact UTF-8 form can only stand inside a JSON string, and is written
/// `\\xadf5` there, so the JSON stays valid and the string reads `\xadf5`.
pub fn from_server_json(bytes: &[u8]) -> String {
    decode(bytes, Escape::Json).0
}

/// How a character with no exact UTF-8 form is written.
#[derive(Clone, Copy)]
enum Escape {
    /// Its bytes in hex after `\x`.
    Text,
    /// Its bytes in hex after `\\x` (inside a JSON string).
    Json,
    /// U+FFFD.
    Replace,
}

/// [`from_server`] for a text that names something (a table, a column, an
/// owner key value) and goes back into SQL: raises `22P05` when it has a
/// character with no exact UTF-8 form, which pg_lease could not tell from
/// another text's. `what` says which text it is.
pub fn exact_from_server(bytes: &[u8], what: &str) -> String {
    let (text, exact) = decode(bytes, Escape::Text);
    if !exact {
        inexact(what, bytes);
    }
    text
}

/// [`exact_from_server`], an Err (the text as [`from_server`] shows it)
/// instead of raising.
pub fn try_exact_from_server(bytes: &[u8]) -> Result<String, String> {
    match decode(bytes, Escape::Text) {
        (text, true) => Ok(text),
        (text, false) => Err(text),
    }
}

/// What PostgreSQL's reply says of a character with no exact UTF-8 form
/// (22P05), for callers that raise their own error.
pub const INEXACT_DETAIL: &str = "pg_lease reads names and key values as UTF-8; the characters shown as \\x.. would come back as other characters or as none (a vendor duplicate such as EUC_JP's NEC row 13, a user-defined character, or in SQL_ASCII bytes that are not UTF-8), so pg_lease could not tell this text from another.";

/// Raises 22P05 for `what` (its `bytes`). The message is ASCII, every other
/// byte written out: pgrx hands its bytes on as they are, and this database
/// is not UTF-8.
fn inexact(what: &str, bytes: &[u8]) -> ! {
    let (text, _) = escape_non_ascii(bytes, Escape::Text);
    pgrx::pg_sys::panic::ErrorReport::new(
        pgrx::PgSqlErrorCode::ERRCODE_UNTRANSLATABLE_CHARACTER,
        format!(
            "pg_lease: {what} \"{text}\" (bytes past ASCII written out) has a character with no exact UTF-8 form in this {} database",
            encoding_name()
        ),
        "pg_lease",
    )
    .set_detail(INEXACT_DETAIL)
    .set_hint(INEXACT_HINT)
    .report(pgrx::PgLogLevel::ERROR);
    unreachable!("an ERROR does not return");
}

/// Raises `40001` with `message` and `detail` and the HINT every such error
/// of pg_lease has: the transaction can be retried (as a serialization
/// failure of PostgreSQL's own).
pub fn serialization_failure(message: String, detail: &str) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(pgrx::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE, message, "pg_lease")
        .set_detail(detail)
        .set_hint("Retry the transaction.")
        .report(pgrx::PgLogLevel::ERROR);
    unreachable!("an ERROR does not return");
}

/// The database's encoding's name (`EUC_JP`).
pub fn encoding_name() -> String {
    // SAFETY: GetDatabaseEncodingName returns a static ASCII name.
    unsafe { owned(pg_sys::GetDatabaseEncodingName()) }
}

/// The hint of [`inexact`].
pub const INEXACT_HINT: &str =
    "Use names and key values whose every character has one Unicode form (the standard one).";

/// Text in the database's encoding as Rust text, and whether every character
/// made the round trip back to the same bytes.
fn decode(bytes: &[u8], escape: Escape) -> (String, bool) {
    let encoding = database_encoding();
    let utf8 = encoding == pg_sys::pg_enc::PG_UTF8 as i32 || encoding == pg_sys::pg_enc::PG_SQL_ASCII as i32;
    if bytes.is_ascii() || utf8 {
        return escape_non_utf8(bytes, escape);
    }
    // SAFETY: the conversion catalog may be read only inside a transaction
    // (IsTransactionState reads backend state); a catalog lookup of the
    // default conversion, InvalidOid when there is none.
    let proc_ = unsafe {
        if !pg_sys::IsTransactionState() {
            return escape_non_ascii(bytes, escape);
        }
        pg_sys::FindDefaultConversionProc(encoding, pg_sys::pg_enc::PG_UTF8 as i32)
    };
    if proc_ == pg_sys::InvalidOid {
        // MULE_INTERNAL: PostgreSQL has no conversion to UTF-8.
        return escape_non_ascii(bytes, escape);
    }
    let (whole, done) = convert(proc_, encoding, pg_sys::pg_enc::PG_UTF8 as i32, bytes);
    if done == bytes.len() && to_server(&String::from_utf8_lossy(&whole)).as_ref() == bytes {
        return (String::from_utf8_lossy(&whole).into_owned(), true);
    }
    // Character by character: which ones do not come back, alone or after
    // the character before (EUC_JIS_2004 has characters that convert to two
    // code points, which another pair of characters also converts to).
    let mut out = String::with_capacity(bytes.len() * 2);
    let mut rest = bytes;
    let mut prev: Option<(&[u8], String)> = None;
    while !rest.is_empty() {
        // SAFETY: `rest` is live for the call; pg_encoding_verifymbchar reads
        // at most `len` bytes and returns the length of the valid character
        // there, or -1.
        let n = unsafe { pg_sys::pg_encoding_verifymbchar(encoding, rest.as_ptr().cast(), rest.len() as i32) };
        let n = if n > 0 { (n as usize).min(rest.len()) } else { 1 };
        let ch = &rest[..n];
        let (c, done) = convert(proc_, encoding, pg_sys::pg_enc::PG_UTF8 as i32, ch);
        let c = String::from_utf8_lossy(&c).into_owned();
        let alone = done == n && to_server(&c).as_ref() == ch;
        let after_prev =
            |(p, text): &(&[u8], String)| to_server(&format!("{text}{c}")).as_ref() == [*p, ch].concat().as_slice();
        if alone && prev.as_ref().is_none_or(after_prev) {
            out.push_str(&c);
            prev = Some((ch, c));
        } else {
            escape_bytes(ch, escape, &mut out);
            prev = None;
        }
        rest = &rest[n..];
    }
    (out, false)
}

/// Text in an encoding with no conversion to UTF-8: ASCII as it is, every
/// other byte written as `escape` says (a run of them as one).
fn escape_non_ascii(bytes: &[u8], escape: Escape) -> (String, bool) {
    let mut out = String::with_capacity(bytes.len() * 2);
    for (ascii, run) in bytes.chunk_by(|a, b| a.is_ascii() == b.is_ascii()).map(|r| (r[0].is_ascii(), r)) {
        if ascii {
            out.push_str(std::str::from_utf8(run).expect("ASCII"));
        } else {
            escape_bytes(run, escape, &mut out);
        }
    }
    (out, bytes.is_ascii())
}

/// UTF-8 bytes as Rust text; any byte that is not UTF-8 shown as `\xNN`.
fn escape_non_utf8(bytes: &[u8], escape: Escape) -> (String, bool) {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_owned(), true);
    }
    let mut out = String::with_capacity(bytes.len() * 2);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        if !chunk.invalid().is_empty() {
            escape_bytes(chunk.invalid(), escape, &mut out);
        }
    }
    (out, false)
}

/// The character of `bytes` written as `escape` says.
fn escape_bytes(bytes: &[u8], escape: Escape, out: &mut String) {
    use std::fmt::Write;
    out.push_str(match escape {
        Escape::Text => "\\x",
        Escape::Json => "\\\\x",
        Escape::Replace => {
            out.push(char::REPLACEMENT_CHARACTER);
            return;
        }
    });
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
}

/// Converts `src` from encoding `from` to `to` with conversion `proc_`,
/// never raising: the converted bytes and how many bytes of `src` they
/// cover (fewer than all when a character cannot be converted or is
/// invalid).
fn convert(proc_: pg_sys::Oid, from: i32, to: i32, src: &[u8]) -> (Vec<u8>, usize) {
    let mut src = src.to_vec();
    let mut dest = vec![0u8; src.len() * pg_sys::MAX_CONVERSION_GROWTH as usize + 1];
    // SAFETY: `src` and `dest` are live, writable buffers of the lengths
    // passed; with noError the conversion stops at the first character it
    // cannot convert (or that is invalid) and returns how many source bytes
    // it converted, writing a NUL-terminated result into `dest` (sized for
    // the worst growth, so no input is cut short).
    let done = unsafe {
        pg_sys::pg_do_encoding_conversion_buf(
            proc_,
            from,
            to,
            src.as_mut_ptr(),
            src.len() as i32,
            dest.as_mut_ptr(),
            dest.len() as i32,
            true,
        )
    } as usize;
    let written = dest.iter().position(|&b| b == 0).unwrap_or(0);
    dest.truncate(written);
    (dest, done.min(src.len()))
}

/// Rust text in the database's encoding, for PostgreSQL: a character the
/// database's encoding cannot hold becomes `?` (text read from the database
/// converts back whole, or was shown escaped; only pg_lease's own words
/// could not, and they are ASCII).
pub fn to_server(s: &str) -> std::borrow::Cow<'_, [u8]> {
    let encoding = database_encoding();
    if s.is_ascii() || encoding == pg_sys::pg_enc::PG_UTF8 as i32 || encoding == pg_sys::pg_enc::PG_SQL_ASCII as i32 {
        return std::borrow::Cow::Borrowed(s.as_bytes());
    }
    // SAFETY: a catalog lookup of the default conversion, only inside a
    // transaction; InvalidOid when there is none.
    let proc_ = unsafe {
        if pg_sys::IsTransactionState() {
            pg_sys::FindDefaultConversionProc(pg_sys::pg_enc::PG_UTF8 as i32, encoding)
        } else {
            pg_sys::InvalidOid
        }
    };
    if proc_ == pg_sys::InvalidOid {
        // Outside a transaction (no catalog), or MULE_INTERNAL: no conversion from UTF-8; its own text read from
        // the database came as ASCII (escape_non_ascii).
        return std::borrow::Cow::Owned(s.chars().map(|c| if c.is_ascii() { c as u8 } else { b'?' }).collect());
    }
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s;
    while !rest.is_empty() {
        let (converted, done) = convert(proc_, pg_sys::pg_enc::PG_UTF8 as i32, encoding, rest.as_bytes());
        out.extend_from_slice(&converted);
        rest = &rest[done.min(rest.len())..];
        if let Some(c) = rest.chars().next() {
            // The conversion stopped at `c`: the database cannot hold it.
            out.push(b'?');
            rest = &rest[c.len_utf8()..];
        }
    }
    std::borrow::Cow::Owned(out)
}

/// [`to_server`] as a C string (SQL text, messages); a NUL ends it there
/// (PostgreSQL's text has none).
pub fn server_cstring(s: &str) -> std::ffi::CString {
    cstring_to_nul(&to_server(s))
}

/// `bytes` up to their first NUL (all of them when there is none) as a C
/// string.
fn cstring_to_nul(bytes: &[u8]) -> std::ffi::CString {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::ffi::CString::new(&bytes[..end]).expect("cut at the first NUL")
}

/// A text value crossing between SQL and Rust, converted from and to the
/// database's encoding ([`from_server`], [`to_server`]): what pg_lease's SQL
/// functions take and return where pgrx's `String` would require UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServerText(pub String);

impl pgrx::datum::FromDatum for ServerText {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _typoid: pg_sys::Oid) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: the caller's contract: a non-NULL text datum.
        Some(ServerText(exact_from_server(unsafe { datum_bytes(datum) }, "text")))
    }
}

/// The bytes of a non-NULL text datum.
///
/// # Safety
/// `datum` is a non-NULL text (or varchar, or name coerced to text) datum
/// valid for the call.
unsafe fn datum_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: the caller's contract; detoasted (a fresh palloc'd copy when
    // it was toasted or compressed, in the current memory context, which
    // outlives the caller's use of the bytes).
    unsafe {
        let t = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
        let len = pgrx::varlena::varsize_any_exhdr(t);
        let data = pgrx::varlena::vardata_any(t) as *const u8;
        std::slice::from_raw_parts(data, len)
    }
}

/// A text read from SQL only to be shown (a message, a status line): as
/// [`ServerText`], but a character with no exact UTF-8 form is shown as its
/// bytes ([`from_server`]) instead of refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShownText(pub String);

impl pgrx::datum::FromDatum for ShownText {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _typoid: pg_sys::Oid) -> Option<Self> {
        // SAFETY: the caller's contract: a text datum when not NULL.
        (!is_null).then(|| ShownText(from_server(unsafe { datum_bytes(datum) })))
    }
}

impl pgrx::datum::IntoDatum for ShownText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        ServerText(self.0).into_datum()
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// A text taken from SQL as the database's bytes, never converted: SQL text
/// that pg_lease's own SQL built (quoting names with `%s`/`%I` as they are
/// stored) and that goes back to SPI as it came ([`ServerBytes::sql`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBytes(pub Vec<u8>);

impl ServerBytes {
    /// The bytes as a C string for SPI (text holds no NUL).
    pub fn sql(&self) -> std::ffi::CString {
        cstring_to_nul(&self.0)
    }
}

impl pgrx::datum::FromDatum for ServerBytes {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _typoid: pg_sys::Oid) -> Option<Self> {
        // SAFETY: the caller's contract: a text datum when not NULL.
        (!is_null).then(|| ServerBytes(unsafe { datum_bytes(datum) }.to_vec()))
    }
}

impl pgrx::datum::IntoDatum for ServerBytes {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(text_datum(&self.0).0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// The impls a text type needs to be a pg_extern argument, array element and
/// result, beyond its own `FromDatum` and `IntoDatum`: as pgrx's `String`.
macro_rules! text_abi {
    ($t:ident) => {
        // SAFETY: `unbox` reads a non-NULL text datum (pgrx unboxes array
        // elements and arguments only when they are not NULL), detoasted as
        // in `FromDatum`.
        unsafe impl pgrx::datum::UnboxDatum for $t {
            type As<'src> = $t;
            unsafe fn unbox<'src>(datum: pgrx::datum::Datum<'src>) -> $t
            where
                Self: 'src,
            {
                // SAFETY: the trait's contract: a non-NULL text datum.
                unsafe { <$t as pgrx::datum::FromDatum>::from_datum(datum.sans_lifetime(), false) }.expect("not NULL")
            }
        }

        // SAFETY: a text argument, unboxed through `FromDatum` as pgrx
        // unboxes `String` arguments.
        unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for $t {
            unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                // SAFETY: the trait's contract: a text argument.
                unsafe { arg.unbox_arg_using_from_datum() }
                    .unwrap_or_else(|| panic!("argument {index} must not be null"))
            }

            unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
                // SAFETY: as above.
                unsafe { arg.unbox_arg_using_from_datum() }.into()
            }
        }

        // SAFETY: returns the text datum `into_datum` makes, as pgrx returns
        // `String`.
        unsafe impl pgrx::callconv::BoxRet for $t {
            unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
                use pgrx::datum::IntoDatum;
                match self.into_datum() {
                    // SAFETY: a text datum of the function's text result.
                    Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
                    None => fcinfo.return_null(),
                }
            }
        }

        pgrx::pgrx_sql_entity_graph::impl_sql_translatable!($t, "TEXT");
    };
}

text_abi!(ServerText);
text_abi!(ShownText);
text_abi!(ServerBytes);

impl pgrx::datum::IntoDatum for ServerText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(text_datum(&to_server(&self.0)).0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
    }
}

/// (schema, relation name) of `relid`, exactly (they go into SQL):
/// [`exact_from_server`] refuses a name pg_lease could not tell from another.
pub fn relation_names(relid: pg_sys::Oid) -> (String, String) {
    // SAFETY: get_rel_namespace, get_namespace_name and get_rel_name are
    // syscache lookups that accept any OID (a missing object gives
    // InvalidOid or NULL, not an error); the names they return are palloc'd
    // NUL-terminated copies (or NULL), which `owned_exact` accepts and copies.
    unsafe {
        let schema = owned_exact(pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid)), "schema name");
        let table = owned_exact(pg_sys::get_rel_name(relid), "table name");
        (schema, table)
    }
}

/// Whether [`relation_names`] would take `relid`'s names without raising:
/// both have exact UTF-8 forms (or `relid` is gone).
pub fn relation_names_exact(relid: pg_sys::Oid) -> bool {
    // SAFETY: syscache lookups accepting any OID, as in `relation_names`;
    // each name is NULL or a palloc'd NUL-terminated copy, read here only.
    unsafe {
        [pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid)), pg_sys::get_rel_name(relid)]
            .iter()
            .all(|&p| p.is_null() || try_exact_from_server(std::ffi::CStr::from_ptr(p).to_bytes()).is_ok())
    }
}

/// An identifier quoted the way Postgres quotes it (only when needed: an
/// identifier with a character other than a lower-case ASCII letter, digit
/// or underscore, or a keyword, is quoted).
pub fn quote_ident(name: &str) -> String {
    if !name.is_ascii() {
        // quote_identifier quotes every identifier with a non-ASCII byte.
        return format!("\"{}\"", name.replace('"', "\"\""));
    }
    let cname = std::ffi::CString::new(name).expect("identifiers have no NUL");
    // SAFETY: `cname` is NUL-terminated and lives to the end of this
    // function; quote_identifier only reads it and returns either that same
    // pointer (no quoting needed) or a palloc'd quoted copy, so what `owned`
    // copies is valid either way (ASCII, read as it is).
    unsafe { owned(pg_sys::quote_identifier(cname.as_ptr())) }
}

pub fn qualified_name(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// Whether `role` may act as the owner of `relid` (superusers may).
pub fn owns(role: pg_sys::Oid, relid: pg_sys::Oid) -> bool {
    // SAFETY: has_privs_of_role is a catalog lookup accepting any role
    // OIDs (an unknown one simply has no privileges).
    unsafe { pg_sys::has_privs_of_role(role, rel_owner(relid)) }
}

/// The role that owns `relid` (lookups run as it, as RI triggers do);
/// InvalidOid when there is no such relation. A syscache read: no SPI, so
/// usable where a transaction must not get an xid (`DROP INDEX
/// CONCURRENTLY` must be its transaction's first action).
pub fn rel_owner(relid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: SearchSysCache1 returns a pinned pg_class tuple or NULL
    // (checked); its data is a FormData_pg_class, read before the tuple is
    // released.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(relid));
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple)).relowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// Whether `index` is a unique index (false when it is no index). A
/// syscache read, as [`rel_owner`].
pub fn index_is_unique(index: pg_sys::Oid) -> bool {
    // SAFETY: SearchSysCache1 returns a pinned pg_index tuple or NULL
    // (checked); its data is a FormData_pg_index, whose fixed-size fields
    // are read before the tuple is released.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::INDEXRELID as i32, pg_sys::Datum::from(index));
        if tuple.is_null() {
            return false;
        }
        let unique = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_index>(tuple)).indisunique;
        pg_sys::ReleaseSysCache(tuple);
        unique
    }
}

/// Prepares `sql` with SPI and keeps the plan for the life of the backend.
/// Call inside an SPI connection (outside one, SPI_prepare fails with
/// SPI_ERROR_UNCONNECTED and this raises an ERROR).
pub fn prepare_saved(sql: &CStr, argtypes: &mut [pg_sys::Oid], what: &str) -> pg_sys::SPIPlanPtr {
    // SAFETY: `sql` is NUL-terminated; `argtypes` points to exactly
    // `argtypes.len()` OIDs, which SPI_prepare only reads and copies into the
    // plan's own memory. Without a connection it returns NULL (checked below)
    // rather than touching SPI state; a bad query raises an ERROR.
    let plan = unsafe { pg_sys::SPI_prepare(sql.as_ptr(), argtypes.len() as i32, argtypes.as_mut_ptr()) };
    if plan.is_null() {
        pgrx::error!("pg_lease: could not prepare {what}");
    }
    // SAFETY: `plan` is a non-null, not yet saved plan SPI_prepare just
    // returned; SPI_keepplan moves it under CacheMemoryContext.
    unsafe { pg_sys::SPI_keepplan(plan) };
    plan
}

/// Whether a column of type `typid` can hold a fencing token: int2, int4 or
/// int8 (`lease.protect` creates bigint ones; narrower ones it accepts).
pub fn is_token_type(typid: pg_sys::Oid) -> bool {
    typid == pg_sys::INT8OID || typid == pg_sys::INT4OID || typid == pg_sys::INT2OID
}

/// A token datum of a type [`is_token_type`] accepts, as i64.
#[inline]
pub fn token_from_datum(datum: pg_sys::Datum, typid: pg_sys::Oid) -> i64 {
    debug_assert!(is_token_type(typid));
    if typid == pg_sys::INT8OID {
        datum.value() as i64
    } else if typid == pg_sys::INT4OID {
        datum.value() as i32 as i64
    } else {
        datum.value() as i16 as i64
    }
}

/// The text form of a datum, for messages (slow path only).
///
/// # Safety
/// `datum` is a valid, non-NULL value of type `typid` (the type's output
/// function dereferences it when the type is passed by reference).
pub unsafe fn datum_text(datum: pg_sys::Datum, typid: pg_sys::Oid) -> String {
    let (mut out, mut varlena) = (pg_sys::InvalidOid, false);
    // SAFETY: a syscache lookup writing into two live locals; an unknown type
    // raises an ERROR.
    unsafe { pg_sys::getTypeOutputInfo(typid, &mut out, &mut varlena) };
    // SAFETY: `out` is `typid`'s output function and `datum` a valid value
    // of that type (the caller's contract); it returns a palloc'd C string.
    unsafe { owned(pg_sys::OidOutputFunctionCall(out, datum)) }
}

/// Runs `f` as `role` with `flags` added to the security context, restoring
/// both afterwards (on error, (sub)transaction abort restores them).
fn with_user<R>(role: pg_sys::Oid, flags: u32, f: impl FnOnce() -> R) -> R {
    let (mut saved_user, mut saved_ctx) = (pg_sys::InvalidOid, 0);
    // SAFETY: reads two backend globals into live locals.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_ctx) };
    // SAFETY: SetUserIdAndSecContext only assigns backend globals; it is
    // always paired with the restore below, and if `f` raises, transaction or
    // subtransaction abort restores the user and context saved at its start
    // (as for ri_triggers.c's identical pattern).
    unsafe { pg_sys::SetUserIdAndSecContext(role, saved_ctx | (pg_sys::SECURITY_LOCAL_USERID_CHANGE | flags) as i32) };
    let r = f();
    // SAFETY: restores exactly what was read above.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_ctx) };
    r
}

/// Runs `f` as `role`, the way ri_triggers.c runs its checks as the owner of
/// the referenced table: the writer needs no privileges on pg_lease's lookups,
/// and row-level security cannot hide an owner row from the fence.
pub fn as_role<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(role, pg_sys::SECURITY_NOFORCE_RLS, f)
}

/// Runs `f` as `role` with its row-level security as a query of its own
/// would have it (to ask what `role` may see).
pub fn as_caller<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(role, 0, f)
}

/// The owner of function `fn_oid`: the role a SECURITY DEFINER function
/// runs as (see [`as_definer`]).
pub fn function_owner(fn_oid: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: SearchSysCache1 returns a pinned pg_proc tuple or NULL
    // (checked); its data is a FormData_pg_proc, read before the tuple is
    // released.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::PROCOID as i32, pg_sys::Datum::from(fn_oid));
        if tuple.is_null() {
            pgrx::error!("pg_lease: cache lookup failed for function {}", fn_oid.to_u32());
        }
        let owner = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple)).proowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// Runs `f` as `role` exactly as the function manager runs a SECURITY
/// DEFINER function's body (fmgr_security_definer): the user switched with
/// SECURITY_LOCAL_USERID_CHANGE, restored afterwards, and on error by the
/// (sub)transaction abort.
pub fn as_definer<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(role, 0, f)
}

/// Runs `f` inside its own SPI connection, where [`exec_saved`] runs saved
/// plans and [`result_datum`] / [`result_text`] read their first row.
pub fn spi_connected<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: SPI_connect and SPI_finish pair up around `f`; if `f` raises,
    // the (sub)transaction abort cleans the connection up (AtEOXact_SPI).
    unsafe { pg_sys::SPI_connect() };
    let r = f();
    // SAFETY: the connection opened above, still the innermost one.
    unsafe { pg_sys::SPI_finish() };
    r
}

/// Whether this transaction reads through one snapshot for its whole life
/// (REPEATABLE READ or SERIALIZABLE).
pub fn uses_transaction_snapshot() -> bool {
    // SAFETY: reads a backend global (the transaction's isolation level).
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Runs `sql`, a query of one column and at most one row, read-write (its
/// row locks are taken) under the latest snapshot (`latest`) or the
/// transaction's, as RI checks read at REPEATABLE READ what has committed
/// since the transaction's snapshot; the value's bytes as text (None: no
/// row, or NULL). Opens its own SPI connection.
pub fn query_text_under(sql: &CStr, latest: bool, what: &str) -> Option<Vec<u8>> {
    spi_connected(|| {
        // SAFETY: `sql` is NUL-terminated; a query without parameters. A bad
        // query raises an ERROR; NULL only without a connection (checked).
        let plan = unsafe { pg_sys::SPI_prepare(sql.as_ptr(), 0, std::ptr::null_mut()) };
        if plan.is_null() {
            pgrx::error!("pg_lease: could not prepare {what}");
        }
        // SAFETY: a backend's snapshots: GetLatestSnapshot's is static until
        // the next call, GetTransactionSnapshot's lives for the transaction;
        // SPI_execute_snapshot pushes a copy of it for the query (read-write:
        // with this command's id), and `plan` is the unsaved plan above, in
        // this connection's memory, taking no parameters.
        let rc = unsafe {
            let snapshot = if latest { pg_sys::GetLatestSnapshot() } else { pg_sys::GetTransactionSnapshot() };
            pg_sys::SPI_execute_snapshot(
                plan,
                std::ptr::null_mut(),
                std::ptr::null(),
                snapshot,
                std::ptr::null_mut(),
                false,
                false,
                1,
            )
        };
        if rc < 0 {
            pgrx::error!("pg_lease: {what} failed (SPI code {rc})");
        }
        // SAFETY: the query above returned a row of one column when any.
        (result_rows() > 0).then(|| unsafe { result_bytes(1) }).flatten()
    })
}

/// `sql` ([`query_text_under`]) as committed now, and whether this
/// transaction's own snapshot (REPEATABLE READ and above) reads something
/// else: what depends on it then cannot be judged under that snapshot
/// (the caller fails with `40001`).
pub fn query_text_now(sql: &CStr, what: &str) -> (Option<Vec<u8>>, bool) {
    let now = query_text_under(sql, true, what);
    let older = uses_transaction_snapshot() && query_text_under(sql, false, what) != now;
    (now, older)
}

/// SPI's parameter arrays for `params` (None: NULL): the values, and the
/// nulls as SPI spells them (`'n'` for NULL, `' '` otherwise).
fn spi_args(params: &[Option<pg_sys::Datum>]) -> (Vec<pg_sys::Datum>, Vec<std::ffi::c_char>) {
    params
        .iter()
        .map(|p| (p.unwrap_or(pg_sys::Datum::from(0)), if p.is_some() { b' ' } else { b'n' } as std::ffi::c_char))
        .unzip()
}

/// Executes the saved `plan` with `params` (None: NULL) in the current SPI
/// connection, read-write (a fresh snapshot per statement, as PL/pgSQL
/// runs it), to completion; whether it returned or changed a row.
///
/// # Safety
/// Call inside [`spi_connected`]; `plan` is a saved plan taking exactly
/// `params.len()` parameters, each of the type of the datum given.
pub unsafe fn exec_saved(plan: pg_sys::SPIPlanPtr, params: &[Option<pg_sys::Datum>], what: &str) -> bool {
    let (mut values, nulls) = spi_args(params);
    // SAFETY: the caller's contract for the plan, its parameters and the
    // connection; `values` and `nulls` hold one entry per parameter, which
    // SPI only reads during the call.
    let rc = unsafe { pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0) };
    if rc < 0 {
        pgrx::error!("pg_lease: {what} failed (SPI code {rc})");
    }
    // SAFETY: SPI's global row count, set by the call above.
    unsafe { pg_sys::SPI_processed > 0 }
}

/// Column `col` (from 1) of the first row [`exec_saved`] last returned,
/// None when NULL. A by-reference value lives until the SPI connection ends.
///
/// # Safety
/// The last [`exec_saved`] in this connection returned a row with at least
/// `col` columns.
pub unsafe fn result_datum(col: i32) -> Option<pg_sys::Datum> {
    // SAFETY: the caller's contract.
    unsafe { row_datum(0, col) }
}

/// Writes `old`'s values back into the row version at `at` of `relid`: the
/// AFTER UPDATE row trigger's way to undo the update it fired for
/// ([`write_row_at`] of every column). Whether it found the row (the version
/// at `at` is the one this transaction sees).
pub fn put_back_row(relid: pg_sys::Oid, old: Row, at: pg_sys::ItemPointerData) -> bool {
    write_row_at(relid, old, at, &[], None)
}

/// Writes `row`'s values into the row version at `at` of `relid`: one
/// `UPDATE ... SET (every live, not generated column of row but keep) =
/// ROW($1, ...) WHERE ctid = $n`, through SPI, as the table's owner
/// ([`as_table_owner`]); column `raise` (of `row`) is set to the greater of
/// its value there and `row`'s (`GREATEST`: never lowered, a NULL in `row`
/// leaves it). Columns are matched by name, so `row` may come from another
/// partition of the table. Whether it found the row (the version at `at` is
/// the one this transaction sees).
pub fn write_row_at(
    relid: pg_sys::Oid,
    row: Row,
    at: pg_sys::ItemPointerData,
    keep: &[i16],
    raise: Option<i16>,
) -> bool {
    let desc = row.desc();
    // SAFETY: a Row's descriptor is valid (Row::new's contract).
    let natts = unsafe { (*desc).natts } as usize;
    let mut columns = Vec::new();
    let mut exprs = Vec::new();
    let mut types = Vec::new();
    let mut values = Vec::new();
    for i in 0..natts {
        // SAFETY: i < natts.
        let a = unsafe { desc_attribute(desc, i) };
        if a.attisdropped || a.attgenerated != 0 || keep.contains(&a.attnum) {
            continue;
        }
        // SAFETY: attname is a NUL-terminated NameData.
        let name = quote_ident(&from_server(unsafe { CStr::from_ptr(a.attname.data.as_ptr()) }.to_bytes()));
        types.push(a.atttypid);
        values.push(row.attr(a.attnum));
        exprs.push(if raise == Some(a.attnum) {
            format!("GREATEST(t.{name}, ${})", values.len())
        } else {
            format!("${}", values.len())
        });
        columns.push(name);
    }
    let n = columns.len();
    let sql = server_cstring(&format!(
        "UPDATE {} AS t SET ({}) = ROW({}) WHERE t.ctid OPERATOR(pg_catalog.=) ${}",
        sql_name(relid),
        columns.join(", "),
        exprs.join(", "),
        n + 1
    ));
    let mut tid = at;
    types.push(pg_sys::TIDOID);
    values.push(Some(pg_sys::Datum::from(&mut tid as *mut pg_sys::ItemPointerData)));
    // (`tid` lives on this frame until the call returns.)
    execute_as_owner(relid, &sql, &mut types, &values, "writing a row") == 1
}

/// For a row about to be inserted into owner table `relid`: whether a row
/// with the same `keys` (by `OPERATOR(pg_catalog.=)`) already carries a
/// token in `token`'s column; if so, its token is raised to `row`'s where
/// that is higher (never lowered). One UPDATE through SPI as the table's
/// owner; parsed per call (a rare path: a replicated insert of an owner row).
/// False at once when a key value of `row` is NULL (no row can equal it).
pub fn raise_token_of_same_key(
    relid: pg_sys::Oid,
    token: (&str, i16, pg_sys::Oid),
    keys: &[(&str, i16, pg_sys::Oid)],
    row: Row,
) -> bool {
    let Some(mut update) = KeyedUpdate::of(keys, row) else { return false };
    let (column, n) = (quote_ident(token.0), update.param(token.2, row.attr(token.1)));
    update.conditions.push(format!("t.{column} IS NOT NULL"));
    update.run(relid, &format!("{column} = GREATEST(t.{column}, ${n})"), "raising a token") > 0
}

/// Raises `column` of the row of table `relid` whose key columns equal
/// `row`'s values to `row`'s token, where it is lower or NULL (never lowers
/// it): whether it did. `keys`: each key column's name in `relid`, with the
/// attnum and type of its value in `row`, compared by
/// `OPERATOR(pg_catalog.=)`; `token`: the attnum and type of the token in
/// `row`. One UPDATE through SPI as the table's owner, parsed per call (a
/// rare path: a replicated write ahead of this node's owner row). False at
/// once when a key value or the token of `row` is NULL.
pub fn raise_token_to(
    relid: pg_sys::Oid,
    column: &str,
    keys: &[(&str, i16, pg_sys::Oid)],
    row: Row,
    token: (i16, pg_sys::Oid),
) -> bool {
    let Some(mut update) = KeyedUpdate::of(keys, row) else { return false };
    let Some(value) = row.attr(token.0) else { return false };
    let (column, n) = (quote_ident(column), update.param(token.1, Some(value)));
    update.conditions.push(format!("(t.{column} IS NULL OR t.{column} OPERATOR(pg_catalog.<) ${n})"));
    update.run(relid, &format!("{column} = ${n}"), "raising a token") > 0
}

/// An UPDATE of the row whose key columns equal a row's values, built up
/// for [`raise_token_of_same_key`] and [`raise_token_to`].
struct KeyedUpdate {
    conditions: Vec<String>,
    types: Vec<pg_sys::Oid>,
    values: Vec<Option<pg_sys::Datum>>,
}

impl KeyedUpdate {
    /// `t.k1 OPERATOR(pg_catalog.=) $1 AND ...` for `keys` (name in the
    /// updated table, attnum and type in `row`); None when a key value is NULL.
    fn of(keys: &[(&str, i16, pg_sys::Oid)], row: Row) -> Option<KeyedUpdate> {
        let mut update = KeyedUpdate { conditions: Vec::new(), types: Vec::new(), values: Vec::new() };
        for &(name, attnum, typid) in keys {
            let value = row.attr(attnum)?;
            let n = update.param(typid, Some(value));
            update.conditions.push(format!("t.{} OPERATOR(pg_catalog.=) ${n}", quote_ident(name)));
        }
        Some(update)
    }

    /// Adds a parameter; its number.
    fn param(&mut self, typid: pg_sys::Oid, value: Option<pg_sys::Datum>) -> usize {
        self.types.push(typid);
        self.values.push(value);
        self.values.len()
    }

    /// `UPDATE relid AS t SET <set> WHERE <conditions>` as the table's owner;
    /// the rows it changed. The values must stay valid during the call (read
    /// from a row valid for the trigger call).
    fn run(mut self, relid: pg_sys::Oid, set: &str, what: &str) -> usize {
        let sql = server_cstring(&format!(
            "UPDATE {} AS t SET {set} WHERE {}",
            sql_name(relid),
            self.conditions.join(" AND ")
        ));
        execute_as_owner(relid, &sql, &mut self.types, &self.values, what)
    }
}

/// Whether owner table `relid` (this relation only, not its partitions)
/// has a row whose `token_column` is not NULL, as this transaction sees it:
/// one SELECT through SPI as the table's owner, parsed per call (asked once
/// per table by a table synchronization worker's copy).
pub fn carries_tokens(relid: pg_sys::Oid, token_column: &str) -> bool {
    let column = quote_ident(token_column);
    let sql =
        server_cstring(&format!("SELECT FROM ONLY {} AS t WHERE t.{column} IS NOT NULL LIMIT 1", sql_name(relid)));
    execute_as_owner(relid, &sql, &mut [], &[], "looking for tokens") > 0
}

/// Runs `sql` (one statement on table `relid`, with parameters of `types`
/// and `values`) through SPI as the table's owner ([`as_table_owner`]);
/// the rows it changed. Raises, naming `what`, when SPI fails.
///
/// `values` must be datums of their `types` that stay valid during the call
/// (read from a row valid for the trigger call, or on the caller's frame).
fn execute_as_owner(
    relid: pg_sys::Oid,
    sql: &CStr,
    types: &mut [pg_sys::Oid],
    values: &[Option<pg_sys::Datum>],
    what: &str,
) -> usize {
    assert_eq!(types.len(), values.len(), "one type per parameter");
    let (mut datums, nulls) = spi_args(values);
    as_table_owner(relid, || {
        spi_connected(|| {
            // SAFETY: `sql` is NUL-terminated; `types`, `datums` and `nulls`
            // hold one entry per parameter, each datum of its type (the
            // caller's contract); SPI only reads them during the call.
            let rc = unsafe {
                pg_sys::SPI_execute_with_args(
                    sql.as_ptr(),
                    types.len() as i32,
                    types.as_mut_ptr(),
                    datums.as_mut_ptr(),
                    nulls.as_ptr(),
                    false,
                    0,
                )
            };
            if rc < 0 {
                pgrx::error!("pg_lease: {what} of {} failed (SPI code {rc})", display(relid));
            }
            result_rows()
        })
    })
}

/// How many rows the last [`exec_saved`] returned (or changed).
pub fn result_rows() -> usize {
    // SAFETY: SPI's global row count, set by the last statement.
    unsafe { pg_sys::SPI_processed as usize }
}

/// Column `col` (from 1) of row `row` (from 0) that [`exec_saved`] last
/// returned, None when NULL. A by-reference value lives until the SPI
/// connection ends.
///
/// # Safety
/// The last [`exec_saved`] in this connection returned more than `row` rows
/// with at least `col` columns.
pub unsafe fn row_datum(row: usize, col: i32) -> Option<pg_sys::Datum> {
    let mut isnull = false;
    // SAFETY: the caller's contract: SPI_tuptable holds that row.
    let datum = unsafe {
        let table = &*pg_sys::SPI_tuptable;
        pg_sys::SPI_getbinval(*table.vals.add(row), table.tupdesc, col, &mut isnull)
    };
    (!isnull).then_some(datum)
}

/// [`result_datum`]'s column as text (its type's output function), None
/// when NULL.
///
/// # Safety
/// As for [`result_datum`].
pub unsafe fn result_text(col: i32) -> Option<String> {
    // SAFETY: the caller's contract is `result_bytes`'.
    unsafe { result_bytes(col) }.map(|bytes| from_server(&bytes))
}

/// [`result_text`] as the database's bytes (what a comparison of texts
/// needs: no character written out).
///
/// # Safety
/// As for [`result_datum`].
pub unsafe fn result_bytes(col: i32) -> Option<Vec<u8>> {
    // SAFETY: the caller's contract; SPI_getvalue returns NULL for NULL or a
    // palloc'd C string, copied at once.
    unsafe {
        let table = &*pg_sys::SPI_tuptable;
        let text = pg_sys::SPI_getvalue(*table.vals, table.tupdesc, col);
        (!text.is_null()).then(|| CStr::from_ptr(text).to_bytes().to_vec())
    }
}

/// A type's name as Postgres prints it (`numeric`, `character varying`).
pub fn type_name(typid: pg_sys::Oid) -> String {
    // SAFETY: format_type_be returns a palloc'd C string or raises.
    unsafe { owned(pg_sys::format_type_be(typid)) }
}

/// `schema.table` of `relid`, quoted as needed.
pub fn display(relid: pg_sys::Oid) -> String {
    let (schema, table) = shown_relation_names(relid);
    qualified_name(&schema, &table)
}

/// [`display`] of `relid` as it is named now, None when no relation has
/// that OID in this database.
pub fn display_if_exists(relid: pg_sys::Oid) -> Option<String> {
    relation_exists(relid).then(|| display(relid))
}

/// Whether a relation has OID `relid` in this database, as the syscache
/// sees it now.
pub fn relation_exists(relid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup accepting any OID (NULL when missing); the
    // palloc'd copy it returns is only tested for NULL here.
    unsafe { !pg_sys::get_rel_name(relid).is_null() }
}

/// (schema, relation name) of `relid` to be shown ([`from_server`]: never
/// raises), not put into SQL.
pub fn shown_relation_names(relid: pg_sys::Oid) -> (String, String) {
    // SAFETY: as in `relation_names`; `owned` never raises.
    unsafe { (owned(pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid))), owned(pg_sys::get_rel_name(relid))) }
}

/// `relid`'s qualified name for SQL text: [`display`], but exact
/// ([`relation_names`]).
pub fn sql_name(relid: pg_sys::Oid) -> String {
    let (schema, table) = relation_names(relid);
    qualified_name(&schema, &table)
}

/// Runs `f` as the owner of `relid` in a security-restricted operation (as
/// VACUUM and REFRESH MATERIALIZED VIEW run user code): whatever that code is
/// (triggers, constraints, casts, operators of the table's types), it runs
/// with no more than the table owner's rights, and cannot SET ROLE or leave
/// state behind. pg_lease's SECURITY DEFINER code touches users' tables only
/// through this.
pub fn as_table_owner<R>(relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    // (SECURITY_NOFORCE_RLS: as ri_triggers.c, the owner's own lookups see
    // every row even under FORCE ROW LEVEL SECURITY.)
    with_user(rel_owner(relid), pg_sys::SECURITY_RESTRICTED_OPERATION | pg_sys::SECURITY_NOFORCE_RLS, || {
        // SAFETY: NewGUCNestLevel only increments guc.c's nest counter;
        // settings the user code makes are undone at this level below (or by
        // abort, if `f` raises).
        let nest = unsafe { pg_sys::NewGUCNestLevel() };
        let r = f();
        // SAFETY: `nest` is the level opened above, still the innermost one:
        // `f` returned normally, so any level it opened it also closed.
        unsafe { pg_sys::AtEOXact_GUC(true, nest) };
        r
    })
}

/// The `i`th (0-based) attribute of a tuple descriptor. PostgreSQL 18 moved
/// the attribute array behind `compact_attrs` (TupleDescAttr is then a function).
///
/// # Safety
/// `desc` is a valid tuple descriptor and `i` < its `natts`.
pub unsafe fn desc_attribute<'a>(desc: pg_sys::TupleDesc, i: usize) -> &'a pg_sys::FormData_pg_attribute {
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the caller's contract.
        unsafe { &*pg_sys::TupleDescAttr(desc, i as i32) }
    }
    #[cfg(not(feature = "pg18"))]
    {
        // SAFETY: the caller's contract: `attrs` holds `natts` attributes.
        unsafe { &(*desc).attrs.as_slice((*desc).natts as usize)[i] }
    }
}

/// The `i`th (0-based) attribute of a tuple descriptor, to change (a copy
/// this code made; [`desc_attribute`]).
///
/// # Safety
/// `desc` is a valid tuple descriptor no one else uses and `i` < its `natts`.
unsafe fn desc_attribute_mut<'a>(desc: pg_sys::TupleDesc, i: usize) -> &'a mut pg_sys::FormData_pg_attribute {
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the caller's contract.
        unsafe { &mut *pg_sys::TupleDescAttr(desc, i as i32) }
    }
    #[cfg(not(feature = "pg18"))]
    {
        // SAFETY: the caller's contract: `attrs` holds `natts` attributes.
        unsafe { &mut (*desc).attrs.as_mut_slice((*desc).natts as usize)[i] }
    }
}

/// `row` as a composite datum (in the current memory context), without the
/// live columns `leave_out` picks: described by a copy of its descriptor as
/// an anonymous record type, blessed (so that row_to_json, for one, can read
/// it back), with those columns marked dropped and the row formed again with
/// them NULL (a value in a column its descriptor calls dropped is an error
/// to readers). The blessed type, one per distinct shape, lives as long as
/// the backend (PostgreSQL's record type cache). Without such columns, the
/// row as it is, of its own type.
pub fn record_datum_without(row: Row, leave_out: impl Fn(&pg_sys::FormData_pg_attribute) -> bool) -> pg_sys::Datum {
    let desc = row.desc();
    // SAFETY: a Row's descriptor is valid (Row::new's contract).
    let natts = unsafe { (*desc).natts } as usize;
    // (Picked in `desc` itself: CreateTupleDescCopy clears attgenerated and
    // attidentity in its copy.)
    let picked: Vec<usize> = (0..natts)
        .filter(|&i| {
            // SAFETY: i < natts.
            let a = unsafe { desc_attribute(desc, i) };
            !a.attisdropped && leave_out(a)
        })
        .collect();
    // SAFETY: `row` is a valid tuple formed with `desc` (Row's contract).
    // CreateTupleDescCopy copies `desc` (without its constraints) into the
    // current memory context, the copy this function's alone until blessed;
    // PostgreSQL 18 keeps a compact copy of each attribute, refreshed after
    // the change; BlessTupleDesc registers an anonymous record type
    // (RECORDOID, typmod -1) and sets its typmod. heap_deform_tuple fills
    // `natts` entries (NULL past the tuple's own attributes), the copy's
    // count too, and heap_form_tuple / heap_copy_tuple_as_datum build the
    // new row and its datum from them in the current memory context.
    unsafe {
        if picked.is_empty() {
            return pg_sys::heap_copy_tuple_as_datum(row.tuple(), desc);
        }
        let copy = pg_sys::CreateTupleDescCopy(desc);
        for &i in &picked {
            desc_attribute_mut(copy, i).attisdropped = true;
            #[cfg(feature = "pg18")]
            pg_sys::populate_compact_attribute(copy, i as i32);
        }
        (*copy).tdtypeid = pg_sys::RECORDOID;
        (*copy).tdtypmod = -1;
        let copy = pg_sys::BlessTupleDesc(copy);
        let mut values = vec![pg_sys::Datum::from(0usize); natts];
        let mut nulls = vec![true; natts];
        pg_sys::heap_deform_tuple(row.tuple(), desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        for i in picked {
            nulls[i] = true;
        }
        let tuple = pg_sys::heap_form_tuple(copy, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::heap_copy_tuple_as_datum(tuple, copy)
    }
}

/// The attnum of the live (not dropped) column `name` of tuple descriptor
/// `desc`, None when it has none of that name or its type is not `typid`.
///
/// # Safety
/// `desc` is a valid tuple descriptor.
unsafe fn desc_attnum(desc: pg_sys::TupleDesc, name: &CStr, typid: pg_sys::Oid) -> Option<i16> {
    // SAFETY: the caller's contract; every index is below natts; attname is
    // a NUL-terminated NameData.
    unsafe {
        (0..(*desc).natts as usize).find_map(|i| {
            let att = desc_attribute(desc, i);
            (!att.attisdropped && CStr::from_ptr(att.attname.data.as_ptr()) == name && att.atttypid == typid)
                .then_some(att.attnum)
        })
    }
}

/// (attnum, type) of column `name` of `relid`, if it exists.
pub fn attribute(relid: pg_sys::Oid, name: &str) -> Option<(i16, pg_sys::Oid)> {
    let cname = server_cstring(name);
    // SAFETY: `cname` is NUL-terminated and outlives the call; get_attnum
    // and get_atttype are syscache lookups that accept any relid/attnum
    // (missing ones give InvalidAttrNumber / InvalidOid, no error).
    unsafe {
        let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
        (attnum > 0).then(|| (attnum, pg_sys::get_atttype(relid, attnum)))
    }
}

/// The collation of column `attnum` of `relid`.
pub fn attcollation(relid: pg_sys::Oid, attnum: i16) -> pg_sys::Oid {
    let (mut typid, mut typmod, mut collation) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
    // SAFETY: a syscache lookup writing into three live locals; a missing
    // column raises an ERROR ("cache lookup failed") rather than reading
    // anything invalid.
    unsafe { pg_sys::get_atttypetypmodcoll(relid, attnum, &mut typid, &mut typmod, &mut collation) };
    collation
}

/// `o.k1 OPERATOR(pg_catalog.=) $1 AND ...`: an owner row by its key columns,
/// the parameters numbered from 1 in column order.
pub fn key_match<S: AsRef<str>>(columns: &[S]) -> String {
    columns
        .iter()
        .enumerate()
        .map(|(i, name)| format!("o.{} OPERATOR(pg_catalog.=) ${}", quote_ident(name.as_ref()), i + 1))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The largest value of int8 column `attnum` of pg_lease's own table
/// `lease.<name>` (None when it has no non-NULL one), read as a statement run
/// here would read it: a fresh snapshot at READ COMMITTED (so, after a lock
/// wait, what committed meanwhile), the transaction's above it, and this
/// transaction's own earlier writes; the table locked AccessShareLock to
/// transaction end, as SELECT locks it. No privilege check: for pg_lease's
/// code reading its own tables. A sequential scan, for the token-epoch
/// tables (a row or two each), without SPI.
pub fn own_table_max_int8(name: &CStr, attnum: i16) -> Option<i64> {
    own_table_int8_rows(lease_relid(name), name, &[attnum]).into_iter().filter_map(|row| row[0]).max()
}

/// Bigint columns `attnums` of every row of pg_lease's own table `relid`
/// (`lease.<name>`), each value None when NULL, read in one scan as
/// [`own_table_max_int8`] reads them.
pub fn own_table_int8_rows(relid: pg_sys::Oid, name: &CStr, attnums: &[i16]) -> Vec<Vec<Option<i64>>> {
    // SAFETY: the relation is opened (an ERROR if it vanished) and
    // kept locked to transaction end; the snapshot is pushed, with the
    // command counter advanced, as SPI does for a statement, and popped
    // before return (an ERROR in between unwinds the snapshot stack, the scan,
    // the slot and the relation reference at (sub)transaction abort); the
    // columns are read only from rows with at least `attnum` columns of type
    // int8 (each checked against the tuple descriptor first).
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        if let Some(&attnum) = attnums.iter().find(|&&a| a < 1 || pg_sys::get_atttype(relid, a) != pg_sys::INT8OID) {
            pg_sys::table_close(rel, pg_sys::NoLock as _);
            pgrx::error!("pg_lease: column {attnum} of lease.{} is not a bigint", name.to_string_lossy());
        }
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        pg_sys::CommandCounterIncrement();
        pg_sys::UpdateActiveSnapshotCommandId();
        let scan = pg_sys::table_beginscan(rel, pg_sys::GetActiveSnapshot(), 0, std::ptr::null_mut());
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let mut rows = Vec::new();
        while pg_sys::table_scan_getnextslot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            rows.push(attnums.iter().map(|&a| slot_attr(slot, a).map(|v| v.value() as i64)).collect());
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::table_endscan(scan);
        pg_sys::PopActiveSnapshot();
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        rows
    }
}

/// One of pg_lease's own sequences (`lease.<name>`), found by name on each
/// use (two syscache lookups): no OID outlives a DROP EXTENSION.
pub struct OwnSequence(pg_sys::Oid);

/// `lease.<name>`, a sequence of pg_lease's.
pub fn own_sequence(name: &CStr) -> OwnSequence {
    OwnSequence(lease_relid(name))
}

/// The OID of pg_lease's own relation `lease.<name>` (table, index or
/// sequence), by two syscache lookups; an ERROR when it is missing.
pub fn lease_relid(name: &CStr) -> pg_sys::Oid {
    lease_relid_if_any(name).unwrap_or_else(|| pgrx::error!("pg_lease: lease.{} is missing", name.to_string_lossy()))
}

/// The OID of pg_lease's own relation `lease.<name>`, None when there is
/// none (a table of a newer version, before `ALTER EXTENSION pg_lease
/// UPDATE` has created it).
pub fn lease_relid_if_any(name: &CStr) -> Option<pg_sys::Oid> {
    // SAFETY: catalog lookups by name; missing_ok false raises for a missing
    // schema.
    let relid =
        unsafe { pg_sys::get_relname_relid(name.as_ptr(), pg_sys::get_namespace_oid(c"lease".as_ptr(), false)) };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

impl OwnSequence {
    /// Flushes WAL up to the sequence page's last change: every value
    /// nextval() handed out so far (by any backend) is then covered by a
    /// durable WAL record, so no crash gives one back (nextval logs ahead 32
    /// values in a record nobody flushes until some commit does).
    pub fn flush_wal(&self) {
        // SAFETY: the sequence relation exists (found by name this call) and
        // is opened and closed with AccessShareLock; its one block is read,
        // pinned and share-locked while its page LSN is read, then released;
        // XLogFlush flushes WAL up to an LSN that was already inserted.
        unsafe {
            let rel = pg_sys::relation_open(self.0, pg_sys::AccessShareLock as _);
            let buf = pg_sys::ReadBuffer(rel, 0);
            pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_SHARE as _);
            let lsn = pg_sys::BufferGetLSNAtomic(buf);
            pg_sys::UnlockReleaseBuffer(buf);
            pg_sys::relation_close(rel, pg_sys::AccessShareLock as _);
            pg_sys::XLogFlush(lsn);
        }
    }

    /// The sequence's last value, as `pg_sequence_last_value` reads it (no
    /// transaction sees another value: sequences are not transactional);
    /// None before its first value (a sequence pg_lease made is given one
    /// at once). Raises without SELECT or USAGE on it for the current user.
    pub fn last_value(&self) -> Option<i64> {
        // SAFETY: pg_sequence_last_value(regclass) is a built-in function of
        // one oid argument returning int8 or NULL, called through fmgr with
        // a call info of our own that reports a NULL result instead of
        // raising (OidFunctionCall would raise on NULL).
        unsafe {
            let mut flinfo = std::mem::MaybeUninit::<pg_sys::FmgrInfo>::zeroed();
            pg_sys::fmgr_info(pg_sys::Oid::from(pg_sys::F_PG_SEQUENCE_LAST_VALUE), flinfo.as_mut_ptr());
            let mut flinfo = flinfo.assume_init();
            let size =
                std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>() + std::mem::size_of::<pg_sys::NullableDatum>();
            let fcinfo = pg_sys::palloc0(size) as pg_sys::FunctionCallInfo;
            (*fcinfo).flinfo = &mut flinfo;
            (*fcinfo).nargs = 1;
            (*fcinfo).fncollation = pg_sys::InvalidOid;
            let args = (*fcinfo).args.as_mut_ptr();
            *args = pg_sys::NullableDatum { value: self.0.into(), isnull: false };
            let call = flinfo.fn_addr.expect("a built-in function");
            // (Through pgrx's guard, as pgrx's own bindings: an ERROR, such
            // as a permission error, becomes a Rust panic on this side.)
            let value = pg_sys::ffi::pg_guard_ffi_boundary(|| call(fcinfo));
            let isnull = (*fcinfo).isnull;
            pg_sys::pfree(fcinfo.cast());
            (!isnull).then(|| value.value() as i64)
        }
    }

    /// Raises the sequence's value to `value` unless it is there already
    /// (setval: not transactional, WAL-logged; flushed before this returns,
    /// so that a crash cannot lower it again), one raiser at a time: the
    /// read and the setval run under a `ShareUpdateExclusiveLock` on the
    /// sequence (self-conflicting; nextval and readers do not take it),
    /// released right after. Whether it raised.
    pub fn raise_to(&self, value: i64) -> bool {
        // SAFETY: LockRelationOid/UnlockRelationOid on an existing relation
        // with a valid lock mode, paired within this call (nothing else in
        // pg_lease takes this mode on its sequences, so the unlock releases
        // only this lock); an ERROR in between releases it at abort.
        unsafe { pg_sys::LockRelationOid(self.0, pg_sys::ShareUpdateExclusiveLock as _) };
        let raise = self.last_value().is_none_or(|v| v < value);
        if raise {
            // SAFETY: setval(regclass, bigint, bool) is a built-in function
            // of those arguments returning int8 (never NULL), called through
            // fmgr as SQL would call it.
            unsafe {
                pg_sys::OidFunctionCall3Coll(
                    pg_sys::Oid::from(pg_sys::F_SETVAL_REGCLASS_INT8_BOOL),
                    pg_sys::InvalidOid,
                    self.0.into(),
                    value.into(),
                    true.into(),
                );
            }
        }
        // SAFETY: as above.
        unsafe { pg_sys::UnlockRelationOid(self.0, pg_sys::ShareUpdateExclusiveLock as _) };
        if raise {
            self.flush_wal();
        }
        raise
    }

    /// nextval(): non-transactional, raises when the sequence is exhausted
    /// (and without USAGE or UPDATE on it for the current user).
    pub fn next(&self) -> i64 {
        // SAFETY: nextval(regclass) is a built-in function of one oid
        // argument returning int8 (never NULL), called through fmgr as SQL
        // would call it.
        unsafe {
            pg_sys::OidFunctionCall1Coll(pg_sys::Oid::from(pg_sys::F_NEXTVAL), pg_sys::InvalidOid, self.0.into())
                .value() as i64
        }
    }
}

/// A `text` datum made by [`text_datum`]: the only elements [`text_array`]
/// accepts, so that it never hands construct_array something that is not a
/// text varlena.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct TextDatum(pg_sys::Datum);

impl TextDatum {
    pub fn datum(self) -> pg_sys::Datum {
        self.0
    }
}

/// `bytes` as a text datum, palloc'd in the current memory context.
pub fn text_datum(bytes: &[u8]) -> TextDatum {
    // SAFETY: cstring_to_text_with_len copies exactly `len` bytes from the
    // live slice (no NUL needed) into a new palloc'd text. A length past
    // i32::MAX would wrap negative and make palloc raise "invalid memory
    // alloc request size" before anything is copied.
    let text = unsafe { pg_sys::cstring_to_text_with_len(bytes.as_ptr().cast(), bytes.len() as i32) };
    TextDatum(pg_sys::Datum::from(text))
}

/// A text[] datum of `elems`, in the current memory context.
pub fn text_array(elems: &[TextDatum]) -> pg_sys::Datum {
    // SAFETY: `TextDatum` is a transparent Datum, so the slice is
    // `elems.len()` Datums, each a valid text varlena (only `text_datum`
    // makes them); text is by reference (-1), int-aligned, as passed;
    // construct_array only reads the elements and copies them into the new
    // array.
    unsafe {
        let array = pg_sys::construct_array(
            elems.as_ptr() as *mut pg_sys::Datum,
            elems.len() as i32,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
        );
        pg_sys::Datum::from(array)
    }
}

/// `node` as a `&T` when it is non-null and tagged `tag`.
///
/// # Safety
/// `node` is null or points to a valid parse/plan Node that outlives `'a`,
/// and `T` is the struct Postgres uses for nodes tagged `tag`.
pub unsafe fn cast_node<'a, T>(node: *const pg_sys::Node, tag: pg_sys::NodeTag) -> Option<&'a T> {
    // SAFETY: non-null is checked first; then `node` points to a valid Node
    // (the caller's contract), whose first field is its tag, and a node with
    // tag `tag` is a `T` living for 'a (also the caller's contract).
    (!node.is_null() && unsafe { (*node).type_ } == tag).then(|| unsafe { &*(node as *const T) })
}

/// The pointer elements of a Postgres `List` (NIL, a null pointer, is empty).
///
/// # Safety
/// `list` is null or a valid pointer `List` (T_List) that is not modified or
/// freed while the iterator is used.
pub unsafe fn list_ptrs<'a>(list: *const pg_sys::List) -> impl Iterator<Item = *mut std::ffi::c_void> + 'a {
    // SAFETY: a non-null `list` is a valid List (the caller's contract).
    let len = if list.is_null() { 0 } else { (unsafe { (*list).length }) as usize };
    // SAFETY: i < length, and a List's `elements` array holds `length`
    // cells; a pointer List's cells are read through `ptr_value`.
    (0..len).map(move |i| unsafe { (*(*list).elements.add(i)).ptr_value })
}

/// The relations a `DROP TABLE` or `DROP INDEX` names, as their names
/// resolve now (without a lock; names that resolve to nothing are left
/// out), in the statement's order; nothing for a DROP of any other kind,
/// whose objects need not be relation names.
pub fn drop_stmt_relids(drop: &pg_sys::DropStmt) -> Vec<pg_sys::Oid> {
    if drop.removeType != pg_sys::ObjectType::OBJECT_TABLE && drop.removeType != pg_sys::ObjectType::OBJECT_INDEX {
        return Vec::new();
    }
    // SAFETY: the objects of a DROP TABLE or DROP INDEX are a List of name
    // Lists (String nodes, gram.y any_name_list) of the statement's parse
    // tree, which nothing modifies while the caller holds `drop`.
    unsafe { list_ptrs(drop.objects) }
        // SAFETY: `names` is one such name List; makeRangeVarFromNameList
        // reads it (raising on too many dotted names, as the DROP itself
        // would); with NoLock and RVR_MISSING_OK the lookup is a plain name
        // lookup returning InvalidOid for a missing relation; no callback,
        // no callback arg.
        .map(|names| unsafe {
            let rv = pg_sys::makeRangeVarFromNameList(names as *mut pg_sys::List);
            pg_sys::RangeVarGetRelidExtended(
                rv,
                pg_sys::NoLock as i32,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            )
        })
        .filter(|&relid| relid != pg_sys::InvalidOid)
        .collect()
}

/// The elements of a Postgres OID `List` (T_OidList; NIL, a null pointer,
/// is empty), copied out.
///
/// # Safety
/// `list` is null or a valid OID `List`.
pub unsafe fn list_oids(list: *const pg_sys::List) -> Vec<pg_sys::Oid> {
    // SAFETY: a non-null `list` is a valid List (the caller's contract).
    let len = if list.is_null() { 0 } else { (unsafe { (*list).length }) as usize };
    // SAFETY: i < length, and a List's `elements` array holds `length`
    // cells; an OID List's cells are read through `oid_value`.
    (0..len).map(|i| unsafe { (*(*list).elements.add(i)).oid_value }).collect()
}

/// Locks `relid` and every table under it (partitions and inheritance
/// children, at any depth) in `mode`, to transaction end, parents before
/// children (the order Postgres's own recursing commands take): the tables
/// locked. A child attached or created meanwhile is found once its parent's
/// lock is granted, so none joins the tree unseen while the locks are held.
/// A `relid` dropped meanwhile is an error ([`lock_existing`]).
pub fn lock_tree(relid: pg_sys::Oid, mode: u32) -> Vec<pg_sys::Oid> {
    extern "C-unwind" {
        // (catalog/pg_inherits.h, which pgrx does not bind.)
        fn find_all_inheritors(
            parent: pg_sys::Oid,
            lockmode: pg_sys::LOCKMODE,
            numparents: *mut *mut pg_sys::List,
        ) -> *mut pg_sys::List;
    }
    lock_existing(relid, mode);
    // SAFETY: find_all_inheritors (the parent being locked) locks each child
    // it finds and returns a palloc'd OID List (the parent first); called on
    // the backend's main thread through pgrx's guard, which turns an ERROR
    // (a lock wait cancelled) into a Rust panic as for pgrx's own bindings.
    unsafe {
        list_oids(pg_sys::ffi::pg_guard_ffi_boundary(|| find_all_inheritors(relid, mode as _, std::ptr::null_mut())))
    }
}

/// Raises an ERROR with `code`, `message` and `detail` and no CONTEXT lines,
/// as `errors::raise` does for pg_lease's own errors: what pg_lease's
/// internal functions report about bad input (permissions, a table dropped
/// meanwhile) shows the client no frames of pg_lease's PL/pgSQL. (In a
/// logical replication worker the CONTEXT stays: it names the remote
/// transaction.)
pub fn error_without_context(code: pgrx::PgSqlErrorCode, message: String, detail: Option<&str>) -> ! {
    // SAFETY: the callbacks on this stack only add CONTEXT lines; every
    // handler that catches the error (PG_TRY, PL/pgSQL exception blocks, the
    // top-level sigsetjmp) restores the stack it saved, so clearing it for
    // this error affects its report and nothing after it; nothing between
    // here and the report (pgrx unwinding to its guard) adds a callback.
    // IsLogicalWorker reads this process's own worker slot pointer.
    unsafe {
        if !pg_sys::IsLogicalWorker() {
            pg_sys::error_context_stack = std::ptr::null_mut();
        }
    }
    if let Some(detail) = detail {
        pgrx::ereport!(ERROR, code, message, detail);
    }
    pgrx::ereport!(ERROR, code, message);
}

/// Locks relation `relid` in `mode` (to transaction end) and checks that it
/// is still there: a relation dropped by the transaction the lock waited for
/// is an error naming it (42P01), where opening it would be "could not open
/// relation with OID" (XX000).
pub fn lock_existing(relid: pg_sys::Oid, mode: u32) {
    // Its name while it is still visible (a drop waited for is not yet).
    let name = display_if_exists(relid);
    // SAFETY: LockRelationOid takes a heavyweight lock on any OID and then
    // accepts pending invalidations, so the syscache lookup below sees a
    // drop committed while it waited.
    unsafe { pg_sys::LockRelationOid(relid, mode as _) };
    if !relation_exists(relid) {
        error_without_context(
            pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            match name {
                Some(name) => format!("pg_lease: table {name} was dropped by a concurrent transaction"),
                None => no_such_table(relid),
            },
            None,
        );
    }
}

/// The message of a relation OID that names nothing (42P01).
pub fn no_such_table(relid: pg_sys::Oid) -> String {
    format!("pg_lease: there is no table with OID {}", u32::from(relid))
}

/// A heap tuple together with the descriptor it was formed with: the only way
/// pg_lease reads a row's columns.
#[derive(Clone, Copy)]
pub struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    /// # Safety
    /// `tuple` is a valid heap tuple formed with `desc`, and both stay valid
    /// (not freed, not modified) for as long as the `Row` or a copy is used.
    /// Datums read from the row point into the tuple (by-reference types), so
    /// they are valid as long as the row is.
    pub unsafe fn new(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
        Row { tuple, desc }
    }

    /// Column `attnum` (1-based), None when NULL.
    #[inline]
    pub fn attr(self, attnum: i16) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        // SAFETY: `new`'s contract: a valid tuple and its descriptor;
        // heap_getattr returns NULL for attribute numbers past the tuple's.
        let d = unsafe { pg_sys::heap_getattr(self.tuple, attnum as i32, self.desc, &mut isnull) };
        (!isnull).then_some(d)
    }

    pub fn tuple(self) -> pg_sys::HeapTuple {
        self.tuple
    }

    pub fn desc(self) -> pg_sys::TupleDesc {
        self.desc
    }
}

/// The call of a trigger function: the event, the relation and its rows.
pub struct TriggerCall<'a> {
    td: &'a pg_sys::TriggerData,
}

/// A tuple identifier's block number and offset (ItemPointerGetBlockNumber
/// and ItemPointerGetOffsetNumber, which are inline C).
pub fn tid_parts(tid: &pg_sys::ItemPointerData) -> (u32, u16) {
    ((u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo), tid.ip_posid)
}

/// A row version as one trigger call met it ([`TriggerCall::row_place`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RowPlace {
    relid: pg_sys::Oid,
    block: u32,
    offset: u16,
    subxact: pg_sys::SubTransactionId,
}

/// What fired a row or statement trigger.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TriggerOp {
    Insert,
    Update,
    Delete,
    Truncate,
}

impl TriggerOp {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerOp::Insert => "INSERT",
            TriggerOp::Update => "UPDATE",
            TriggerOp::Delete => "DELETE",
            TriggerOp::Truncate => "TRUNCATE",
        }
    }
}

impl<'a> TriggerCall<'a> {
    /// The trigger call `fcinfo` carries; an ERROR naming `function` when it
    /// was not called by the trigger manager.
    ///
    /// # Safety
    /// `fcinfo` is the FunctionCallInfo Postgres passed to a version-1 C
    /// function, valid for `'a` (the call).
    pub unsafe fn from_fcinfo(fcinfo: pg_sys::FunctionCallInfo, function: &str) -> TriggerCall<'a> {
        // SAFETY: `fcinfo` is valid for the call (the caller's contract);
        // `context` is null or a Node (fmgr.h), and a node tagged
        // T_TriggerData is a TriggerData (the CALLED_AS_TRIGGER test), which
        // the trigger manager keeps alive until the function returns.
        unsafe {
            let ctx = (*fcinfo).context;
            if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
                pgrx::error!("{function}() may only be called as a trigger");
            }
            TriggerCall { td: &*(ctx as *const pg_sys::TriggerData) }
        }
    }

    /// Whether this is a BEFORE ... FOR EACH ROW call.
    pub fn is_before_row(&self) -> bool {
        let event = self.td.tg_event;
        event & pg_sys::TRIGGER_EVENT_ROW != 0
            && event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE
    }

    pub fn op(&self) -> TriggerOp {
        match self.td.tg_event & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_INSERT => TriggerOp::Insert,
            pg_sys::TRIGGER_EVENT_UPDATE => TriggerOp::Update,
            pg_sys::TRIGGER_EVENT_DELETE => TriggerOp::Delete,
            _ => TriggerOp::Truncate,
        }
    }

    /// The OID of the relation the trigger fired on.
    pub fn relid(&self) -> pg_sys::Oid {
        // SAFETY: tg_relation is the non-null, open Relation the trigger
        // fired on; the trigger manager holds it open for the whole call.
        unsafe { (*self.td.tg_relation).rd_id }
    }

    fn desc(&self) -> pg_sys::TupleDesc {
        // SAFETY: as in `relid`.
        unsafe { (*self.td.tg_relation).rd_att }
    }

    /// The inserted row (INSERT), the old row (UPDATE, DELETE); None for
    /// statement-level calls.
    pub fn trigtuple(&self) -> Option<Row> {
        // SAFETY: a non-null tg_trigtuple is formed with the relation's
        // descriptor (rd_att) and lives (in the executor's slot) at least
        // until the trigger function returns, which is the TriggerCall's 'a.
        (!self.td.tg_trigtuple.is_null()).then(|| unsafe { Row::new(self.td.tg_trigtuple, self.desc()) })
    }

    /// Where the row the trigger fired for (`trigtuple`) is: this relation
    /// and its tuple's ctid, in this subtransaction. Two calls of one
    /// transaction with the same place are about the same row version while
    /// it is live (a version this transaction updated or deleted is dead to
    /// it from then on, and its slot cannot be reused before the
    /// transaction ends). The command counter is not part of it: a trigger
    /// that runs SQL in between advances it.
    pub fn row_place(&self) -> Option<RowPlace> {
        if self.td.tg_trigtuple.is_null() {
            return None;
        }
        // SAFETY: tg_trigtuple is non-null (checked) and valid for the call
        // (as in `trigtuple`); the rest reads this backend's transaction
        // state.
        unsafe {
            let (block, offset) = tid_parts(&(*self.td.tg_trigtuple).t_self);
            Some(RowPlace { relid: self.relid(), block, offset, subxact: pg_sys::GetCurrentSubTransactionId() })
        }
    }

    /// The new row of an UPDATE.
    pub fn newtuple(&self) -> Option<Row> {
        // SAFETY: as in `trigtuple`.
        (!self.td.tg_newtuple.is_null()).then(|| unsafe { Row::new(self.td.tg_newtuple, self.desc()) })
    }

    /// What a BEFORE row trigger returns to let the row through unchanged.
    pub fn pass(&self) -> pg_sys::Datum {
        match self.op() {
            TriggerOp::Update => pg_sys::Datum::from(self.td.tg_newtuple),
            _ => pg_sys::Datum::from(self.td.tg_trigtuple),
        }
    }

    /// What a BEFORE UPDATE row trigger returns to let the update through
    /// with `columns` (attribute numbers) as the old row has them.
    pub fn pass_keeping_old(&self, columns: &[i16]) -> pg_sys::Datum {
        assert!(self.op() == TriggerOp::Update, "pass_keeping_old is for BEFORE UPDATE row triggers");
        // SAFETY: an UPDATE row trigger's old and new tuples are valid for
        // the call and formed with the relation's descriptor; `columns` are
        // its columns (heap_getattr gives NULL past the old tuple's);
        // heap_modify_tuple_by_cols copies the new tuple, with the old values
        // (copied in too), into a tuple palloc'd in the trigger's context, as
        // a BEFORE trigger may return.
        unsafe {
            let desc = (*self.td.tg_relation).rd_att;
            let mut numbers: Vec<i32> = columns.iter().map(|&a| i32::from(a)).collect();
            let mut isnull = vec![false; columns.len()];
            let mut values: Vec<pg_sys::Datum> = numbers
                .iter()
                .zip(isnull.iter_mut())
                .map(|(&a, null)| pg_sys::heap_getattr(self.td.tg_trigtuple, a, desc, null))
                .collect();
            let tuple = pg_sys::heap_modify_tuple_by_cols(
                self.td.tg_newtuple,
                desc,
                numbers.len() as i32,
                numbers.as_mut_ptr(),
                values.as_mut_ptr(),
                isnull.as_mut_ptr(),
            );
            pg_sys::Datum::from(tuple)
        }
    }

    /// The name of the first trigger on this call's relation that fires
    /// before this call's trigger (name order), is a BEFORE row trigger of
    /// another function, and satisfies `pred`.
    pub fn earlier_before_row_triggers(&self, pred: impl Fn(&pg_sys::Trigger) -> bool) -> Option<String> {
        // SAFETY: tg_trigger is this call's trigger; tg_relation's trigdesc
        // is null or holds `numtriggers` triggers, sorted by name as they
        // fire, all owned by the relcache entry held open for the call.
        unsafe {
            let me = &*self.td.tg_trigger;
            let desc = (*self.td.tg_relation).trigdesc;
            if desc.is_null() {
                return None;
            }
            let all = std::slice::from_raw_parts((*desc).triggers, (*desc).numtriggers as usize);
            all.iter()
                .take_while(|t| t.tgoid != me.tgoid)
                .find(|t| {
                    let kind = t.tgtype as u32;
                    kind & pg_sys::TRIGGER_TYPE_ROW != 0
                        && kind & pg_sys::TRIGGER_TYPE_TIMING_MASK == pg_sys::TRIGGER_TYPE_BEFORE
                        && t.tgfoid != me.tgfoid
                        && pred(t)
                })
                .map(|t| owned(t.tgname))
        }
    }

    /// The trigger's arguments (`tgargs`).
    pub fn args(&self) -> Vec<String> {
        // SAFETY: tg_trigger is non-null for every trigger call and belongs
        // to the relcache entry held open for the call; tgargs holds tgnargs
        // NUL-terminated strings (and may be NULL only when tgnargs is 0, in
        // which case it is never dereferenced).
        unsafe {
            let trigger = &*self.td.tg_trigger;
            (0..trigger.tgnargs as usize).map(|i| owned(*trigger.tgargs.add(i))).collect()
        }
    }
}

/// The first row of a saved one-row plan: its first column, an integer token
/// (None: no row; Some(None): NULL), and its second column as an oid
/// (InvalidOid when absent or NULL). Runs the plan as `role`: with
/// [`Access::Read`] under the latest snapshot (see there), else under a fresh
/// one as any statement of the transaction.
///
/// # Safety
/// `plan` is a saved SPI plan taking `args.len()` parameters of the types the
/// datums in `args` have, whose first column is int2, int4 or int8.
pub unsafe fn run_token_plan(
    plan: pg_sys::SPIPlanPtr,
    args: &mut [pg_sys::Datum],
    role: pg_sys::Oid,
    access: Access,
) -> (Option<Option<i64>>, pg_sys::Oid) {
    // SAFETY: the caller's contract for the plan and its arguments (`args`
    // holds exactly the plan's parameters; a null `nulls` means none is
    // NULL). SPI_connect/SPI_finish pair up here; an ERROR in between aborts
    // the (sub)transaction, which cleans SPI up. SPI_tuptable and its first
    // row are read only when SPI_processed > 0, and only before SPI_finish
    // frees them; column 1 is an integer (caller's contract), column 2 is
    // read only when the descriptor has it and as the oid it is.
    unsafe {
        pg_sys::SPI_connect();
        // read_only = false: a fresh snapshot, so READ COMMITTED sees the latest
        // committed token, and the lock waits for (then follows) concurrent bumps.
        let rc = as_role(role, || match access {
            Access::LockShare => pg_sys::SPI_execute_plan(plan, args.as_mut_ptr(), std::ptr::null(), false, 1),
            Access::Read => pg_sys::SPI_execute_snapshot(
                plan,
                args.as_mut_ptr(),
                std::ptr::null(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(),
                false,
                true,
                1,
            ),
        });
        if rc < 0 {
            pgrx::error!("pg_lease: fence lookup failed (SPI code {rc})");
        }
        let result = if pg_sys::SPI_processed == 0 {
            (None, pg_sys::InvalidOid)
        } else {
            let table = &*pg_sys::SPI_tuptable;
            let mut isnull = false;
            let datum = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut isnull);
            let typid = pg_sys::SPI_gettypeid(table.tupdesc, 1);
            let token = (!isnull).then(|| token_from_datum(datum, typid));
            let mut oid = pg_sys::InvalidOid;
            if (*table.tupdesc).natts >= 2 {
                let d = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 2, &mut isnull);
                if !isnull {
                    oid = pg_sys::Oid::from(d.value() as u32);
                }
            }
            (Some(token), oid)
        };
        pg_sys::SPI_finish();
        result
    }
}

/// The current time (`GetCurrentTimestamp`: microseconds since 2000-01-01 UTC).
pub fn now() -> pg_sys::TimestampTz {
    // SAFETY: reads the clock; no precondition.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Whether `xid` (a catalog row's xmin) is this transaction's or one of its
/// subtransactions' (open, or committed into it: a released SAVEPOINT, a
/// PL/pgSQL block with EXCEPTION). A frozen or invalid xid is not.
pub fn written_by_this_transaction(xid: pg_sys::TransactionId) -> bool {
    // SAFETY: reads only this backend's transaction state; any xid value is
    // valid input (it is compared, never looked up in pg_xact).
    unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xid) }
}

/// Whether the row version at `tid` in table `relid` was inserted by this
/// transaction (or one of its subtransactions) as a new row: its xmin is
/// ours and it is not the new version of an UPDATE (`HEAP_UPDATED`), which
/// also carries our xmin. False when there is no such row version.
pub fn inserted_by_this_transaction(relid: pg_sys::Oid, tid: pg_sys::ItemPointerData) -> bool {
    // SAFETY: table_open takes AccessShareLock (kept to transaction end,
    // NoLock at close) and raises for a missing relation. heap_fetch with
    // SnapshotAny finds whatever version is at `tid` (false for an unused
    // or out-of-range item), pinning its buffer (keep_buf), which is read
    // under a share content lock and released before returning; the tuple
    // header it points into is valid while the pin is held. The infomask
    // bit read is set when the version is made and never changes, and xmin
    // is compared with this backend's own transaction state only.
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
        tuple.t_self = tid;
        let mut buffer: pg_sys::Buffer = pg_sys::InvalidBuffer as _;
        let snapshot = std::ptr::addr_of_mut!(pg_sys::SnapshotAnyData);
        let found = pg_sys::heap_fetch(rel, snapshot, &mut tuple, &mut buffer, true);
        let inserted = found && {
            pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as _);
            let header = &*tuple.t_data;
            let xmin = header.t_choice.t_heap.t_xmin;
            let fresh = header.t_infomask as u32 & pg_sys::HEAP_UPDATED == 0;
            pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_UNLOCK as _);
            fresh && written_by_this_transaction(xmin)
        };
        if buffer != pg_sys::InvalidBuffer as pg_sys::Buffer {
            pg_sys::ReleaseBuffer(buffer);
        }
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        inserted
    }
}

/// This backend's process id.
pub fn my_pid() -> i32 {
    // SAFETY: a process-global integer Postgres sets at process start and
    // never changes afterwards; read in this process's only thread.
    unsafe { pg_sys::MyProcPid }
}

/// The database this backend is connected to (InvalidOid for a process
/// connected to none).
pub fn my_database() -> pg_sys::Oid {
    // SAFETY: as in `my_pid`: set once at connection time.
    unsafe { pg_sys::MyDatabaseId }
}

/// The name of database `oid`, None when it does not exist. Needs a
/// transaction (a syscache lookup).
pub fn database_name(oid: pg_sys::Oid) -> Option<String> {
    // SAFETY: get_database_name returns NULL or a palloc'd C string.
    let name = unsafe { pg_sys::get_database_name(oid) };
    // SAFETY: non-null: a NUL-terminated string in the current context.
    (!name.is_null()).then(|| unsafe { owned(name) })
}

/// Whether the syscache `cache`, keyed by one OID, has a row for `oid`.
/// Needs a transaction.
fn syscache_has(cache: pg_sys::SysCacheIdentifier::Type, oid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache probe of a one-OID-key cache, which accepts any OID.
    unsafe {
        pg_sys::SearchSysCacheExists(
            cache as i32,
            pg_sys::Datum::from(oid),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// Whether database `oid` exists (a committed `pg_database` row: a backend
/// can only connect to such a one). Needs a transaction.
pub fn database_exists(oid: pg_sys::Oid) -> bool {
    syscache_has(pg_sys::SysCacheIdentifier::DATABASEOID, oid)
}

/// Whether relation `relid` of this database is dropped for good: it does
/// not exist, and no transaction can still bring it back or be creating
/// it. A table created or dropped by a transaction still in progress is
/// locked `ACCESS EXCLUSIVE` by it until it ends (so a probing lock cannot be
/// had: not dropped); one this transaction dropped is not dropped for good
/// until it commits. Never waits. Needs a transaction.
pub fn relation_dropped(relid: pg_sys::Oid) -> bool {
    let tag = pg_sys::LOCKTAG {
        locktag_field1: my_database().to_u32(),
        locktag_field2: relid.to_u32(),
        locktag_field3: 0,
        locktag_field4: 0,
        locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    };
    let exclusive = pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE;
    // SAFETY: reads this backend's local lock table.
    #[cfg(not(feature = "pg18"))]
    let mine = unsafe { pg_sys::LockHeldByMe(&tag, exclusive) };
    // SAFETY: as above (17+ takes `orstronger`; nothing is stronger).
    #[cfg(feature = "pg18")]
    let mine = unsafe { pg_sys::LockHeldByMe(&tag, exclusive, false) };
    if mine {
        return false;
    }
    let share = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: a conditional lock on any relation OID (it never waits; the
    // lock manager needs no such relation) that also takes in the catalog
    // invalidations of transactions that committed before it was granted.
    if !unsafe { pg_sys::ConditionalLockRelationOid(relid, share) } {
        return false;
    }
    let exists = syscache_has(pg_sys::SysCacheIdentifier::RELOID, relid);
    // SAFETY: the lock taken above, released right after the probe.
    unsafe { pg_sys::UnlockRelationOid(relid, share) };
    !exists
}

/// A timestamp as Postgres prints it (`DateStyle`, `TimeZone`).
pub fn timestamp_text(t: pg_sys::TimestampTz) -> String {
    // SAFETY: timestamptz_to_str formats into a static buffer, copied at once.
    unsafe { owned(pg_sys::timestamptz_to_str(t)) }
}

/// Whether this server is a standby (in recovery).
pub fn in_recovery() -> bool {
    // SAFETY: reads shared recovery state; no precondition.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// The name of role `role` (empty when it no longer exists).
pub fn role_name(role: pg_sys::Oid) -> String {
    // SAFETY: GetUserNameFromId(.., noerr = true) returns NULL or a palloc'd
    // name, copied at once.
    unsafe { owned(pg_sys::GetUserNameFromId(role, true)) }
}

/// Rereads the configuration files, as every process does on SIGHUP.
pub fn reload_config() {
    // SAFETY: called between transactions of a background worker's loop, as
    // postgres.c does for a backend.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

/// One key column of a unique btree index, matched to a lookup argument.
pub struct IndexKey {
    /// Position of the argument this index column is compared with.
    pub arg: usize,
    /// The table column the index column is.
    pub attnum: i16,
    /// The function of `pg_catalog.=` for (column type, argument type): the
    /// operator a query `column OPERATOR(pg_catalog.=) $n` resolves to.
    pub eq_proc: pg_sys::RegProcedure,
    /// The argument's type when it differs from the column's (else InvalidOid).
    pub subtype: pg_sys::Oid,
    /// The index column's collation, which is the table column's.
    pub collation: pg_sys::Oid,
}

/// A unique btree index through which a row is found by its key without SPI:
/// the same row, the same lock and the same errors as
/// `SELECT ... FROM ONLY t WHERE k1 OPERATOR(pg_catalog.=) $1 AND ... FOR SHARE`.
pub struct UniqueIndex {
    pub heap: pg_sys::Oid,
    pub index: pg_sys::Oid,
    /// In index column order.
    pub keys: Vec<IndexKey>,
}

/// How [`UniqueIndex::probe`] reads the row.
#[derive(Clone, Copy)]
pub enum Access {
    /// Locked `FOR SHARE`: the verdict.
    LockShare,
    /// Unlocked, under the latest snapshot (what is committed now, at any
    /// isolation level, and this transaction's own changes): what a refusal
    /// reports, what a trusted replicated row is compared with.
    Read,
}

/// What [`UniqueIndex::probe`] found.
pub enum Probe {
    /// The row (locked `FOR SHARE` with `Access::LockShare`): its token
    /// column (None when NULL).
    Found(Option<i64>),
    /// No such row (or it went away while waiting for its lock).
    Missing,
    /// The caller's view of the table changed while its lock was taken
    /// (an invalidation arrived): nothing was read; ask again another way.
    Stale,
}

/// The operator `left OPERATOR(pg_catalog.=) right` resolves to, the way the
/// parser resolves it (exact match, binary coercion, polymorphism, domains),
/// or InvalidOid when none or no single one does.
fn resolve_eq(left: pg_sys::Oid, right: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: makeString keeps the palloc'd names, lappend builds a palloc'd
    // List of them (NIL = null to start); oper() with noError returns NULL
    // or a syscache entry of pg_operator, released here after oprid reads it.
    unsafe {
        let mut names =
            pg_sys::lappend(std::ptr::null_mut(), pg_sys::makeString(pg_sys::pstrdup(c"pg_catalog".as_ptr())).cast());
        names = pg_sys::lappend(names, pg_sys::makeString(pg_sys::pstrdup(c"=".as_ptr())).cast());
        let tuple = pg_sys::oper(std::ptr::null_mut(), names, left, right, true, -1);
        if tuple.is_null() {
            return pg_sys::InvalidOid;
        }
        let op = pg_sys::oprid(tuple);
        pg_sys::ReleaseSysCache(tuple);
        op
    }
}

/// The equality a key pair is compared with (see [`key_equality`]).
pub struct KeyEquality {
    pub op: pg_sys::Oid,
    pub proc_: pg_sys::RegProcedure,
    /// The operator's declared input types.
    pub left: pg_sys::Oid,
    pub right: pg_sys::Oid,
}

/// The equality of an owner key column of type `left` and a fenced key
/// column of type `right`: the operator `left OPERATOR(pg_catalog.=) right`
/// resolves to, provided both sides reach its input types without a
/// conversion function and it is immutable (a key's identity must not depend
/// on the session: `date = timestamptz` depends on TimeZone). None otherwise.
pub fn key_equality(left: pg_sys::Oid, right: pg_sys::Oid) -> Option<KeyEquality> {
    let op = resolve_eq(left, right);
    if op == pg_sys::InvalidOid {
        return None;
    }
    let (mut op_left, mut op_right) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: syscache lookups of an existing operator and its function,
    // writing into live locals.
    unsafe {
        pg_sys::op_input_types(op, &mut op_left, &mut op_right);
        let proc_ = pg_sys::get_opcode(op);
        let usable = pg_sys::IsBinaryCoercible(left, op_left)
            && pg_sys::IsBinaryCoercible(right, op_right)
            && pg_sys::func_volatile(proc_) as u8 == pg_sys::PROVOLATILE_IMMUTABLE;
        usable.then_some(KeyEquality { op, proc_, left: op_left, right: op_right })
    }
}

/// The scan key for index column `c` of `irel` compared with an argument of
/// `argtype`: the operator `column OPERATOR(pg_catalog.=) $n` resolves to
/// must be the `=` of the index's operator family for the index's input
/// type, reached from both sides without a conversion function, in the
/// column's collation. None otherwise.
///
/// # Safety
/// `irel` is an open index of `heap` with more than `c` key columns.
unsafe fn index_key(
    heap: pg_sys::Oid,
    irel: pg_sys::Relation,
    c: usize,
    arg: usize,
    (attnum, coltype, argtype): (i16, pg_sys::Oid, pg_sys::Oid),
) -> Option<IndexKey> {
    // SAFETY: the caller's contract: rd_opfamily, rd_opcintype and
    // rd_indcollation hold an entry per key column; the lookups below are
    // syscache reads accepting any OIDs.
    unsafe {
        let opfamily = *(*irel).rd_opfamily.add(c);
        let opcintype = *(*irel).rd_opcintype.add(c);
        let collation = *(*irel).rd_indcollation.add(c);
        if collation != attcollation(heap, attnum) {
            return None;
        }
        let eq = key_equality(coltype, argtype)?;
        if pg_sys::get_op_opfamily_strategy(eq.op, opfamily) != pg_sys::BTEqualStrategyNumber as i32
            || eq.left != opcintype
        {
            return None;
        }
        let right = eq.right;
        let subtype = if right == opcintype { pg_sys::InvalidOid } else { right };
        Some(IndexKey { arg, attnum, eq_proc: eq.proc_, subtype, collation })
    }
}

impl UniqueIndex {
    /// A unique, immediate, valid, non-partial btree index of `heap` on plain
    /// columns whose key is exactly `columns` (table attnum, column type,
    /// argument type; any order), each compared by the operator the SPI
    /// lookup would use ([`index_key`]). None when there is no such index:
    /// callers then use SPI.
    pub fn find(heap: pg_sys::Oid, columns: &[(i16, pg_sys::Oid, pg_sys::Oid)]) -> Option<UniqueIndex> {
        // SAFETY: table_open/index_open take the locks a query reading the
        // table takes (AccessShareLock, kept to transaction end: NoLock at
        // close) and raise if a relation is gone; rd_index, rd_rel and the
        // per-column arrays (rd_opfamily, rd_opcintype, rd_indcollation,
        // indkey.values) of an open index hold indnkeyatts entries at least;
        // RelationGetIndexList/Predicate/Expressions return palloc'd copies
        // (NIL = null when empty); the syscache lookups accept any OIDs.
        unsafe {
            let rel = pg_sys::table_open(heap, pg_sys::AccessShareLock as _);
            let mut found = None;
            for index in list_oids(pg_sys::RelationGetIndexList(rel)) {
                let irel = pg_sys::index_open(index, pg_sys::AccessShareLock as _);
                let ind = &*(*irel).rd_index;
                let nkeys = ind.indnkeyatts as usize;
                let usable = ind.indisunique
                    && ind.indimmediate
                    && ind.indisvalid
                    && ind.indisready
                    && ind.indislive
                    && (*(*irel).rd_rel).relam == pg_sys::BTREE_AM_OID
                    && nkeys == columns.len()
                    && pg_sys::RelationGetIndexPredicate(irel).is_null()
                    && pg_sys::RelationGetIndexExpressions(irel).is_null();
                let keys: Option<Vec<IndexKey>> = usable
                    .then(|| {
                        let attnums = ind.indkey.values.as_slice(nkeys);
                        (0..nkeys)
                            .map(|c| {
                                let arg = columns.iter().position(|&(a, _, _)| a == attnums[c])?;
                                index_key(heap, irel, c, arg, columns[arg])
                            })
                            .collect()
                    })
                    .flatten();
                pg_sys::index_close(irel, pg_sys::NoLock as _);
                if let Some(keys) = keys {
                    found = Some(UniqueIndex { heap, index, keys });
                    break;
                }
            }
            pg_sys::table_close(rel, pg_sys::NoLock as _);
            found
        }
    }

    /// With [`Access::LockShare`], locks `FOR SHARE` the row whose key equals
    /// `args` (in argument order) and reads its token column `token` (attnum,
    /// integer type), exactly as the SPI lookup with a fresh snapshot does: at
    /// READ COMMITTED a row updated concurrently is waited for and its newest
    /// version locked (and matched against the key again, as EvalPlanQual
    /// would); above it, a row changed since the transaction's snapshot is a
    /// serialization failure; a row deleted meanwhile, or changed by this
    /// transaction in a later command, is not found. With [`Access::Read`],
    /// reads the token under the latest snapshot (the same lookup without
    /// `FOR SHARE`, as READ COMMITTED would run it at any isolation level),
    /// taking only a plain SELECT's locks and waiting for no row lock.
    /// `still_current` runs once the table's lock is held (which delivers
    /// pending invalidations): false ends the probe with [`Probe::Stale`]
    /// before the index is touched.
    ///
    /// # Safety
    /// `args` holds valid, non-NULL datums of the argument types this index
    /// was found for, `token` is an integer column of the table, and the
    /// caller runs inside a transaction as the role the lookup should run as.
    pub unsafe fn probe(
        &self,
        args: &[pg_sys::Datum],
        token: (i16, pg_sys::Oid),
        access: Access,
        still_current: impl FnOnce() -> bool,
    ) -> Probe {
        // SAFETY: the locks are those of SELECT ... FOR SHARE (RowShareLock on
        // the table, AccessShareLock on the index, both kept to transaction
        // end), or of a plain SELECT (AccessShareLock on both) when not
        // locking; the snapshot is pushed and the command counter advanced as
        // SPI does for a non-read-only statement, and popped before return
        // (an ERROR in between unwinds both at (sub)transaction abort, as do
        // the scan, the slot and the relation references); the scan keys are
        // copied by index_rescan; the slot is the table AM's own, dropped
        // after its values are read; tuple_lock is the table AM's callback,
        // called as table_tuple_lock (an inline function) calls it; `args`
        // are valid datums of the types the operators take (the caller's
        // contract).
        unsafe {
            let lock = matches!(access, Access::LockShare);
            let table_lock = if lock { pg_sys::RowShareLock } else { pg_sys::AccessShareLock };
            let heap = pg_sys::table_open(self.heap, table_lock as _);
            if !still_current() {
                pg_sys::table_close(heap, pg_sys::NoLock as _);
                return Probe::Stale;
            }
            let index = pg_sys::index_open(self.index, pg_sys::AccessShareLock as _);
            pg_sys::PushActiveSnapshot(if lock {
                pg_sys::GetTransactionSnapshot()
            } else {
                pg_sys::GetLatestSnapshot()
            });
            pg_sys::CommandCounterIncrement();
            pg_sys::UpdateActiveSnapshotCommandId();
            let snapshot = pg_sys::GetActiveSnapshot();

            let mut scankeys: Vec<pg_sys::ScanKeyData> = Vec::with_capacity(self.keys.len());
            for (c, key) in self.keys.iter().enumerate() {
                let mut sk = pg_sys::ScanKeyData::default();
                pg_sys::ScanKeyEntryInitialize(
                    &mut sk,
                    0,
                    (c + 1) as pg_sys::AttrNumber,
                    pg_sys::BTEqualStrategyNumber as _,
                    key.subtype,
                    key.collation,
                    key.eq_proc,
                    args[key.arg],
                );
                scankeys.push(sk);
            }
            let nkeys = scankeys.len() as i32;
            #[cfg(not(feature = "pg18"))]
            let scan = pg_sys::index_beginscan(heap, index, snapshot, nkeys, 0);
            #[cfg(feature = "pg18")]
            let scan = pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), nkeys, 0);
            pg_sys::index_rescan(scan, scankeys.as_mut_ptr(), nkeys, std::ptr::null_mut(), 0);
            let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
            let visible = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            let mut tid = (*slot).tts_tid;
            pg_sys::index_endscan(scan);

            let probe = if !visible {
                Probe::Missing
            } else if !lock {
                Probe::Found(slot_int(slot, token))
            } else {
                let xact_snapshot = pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32;
                let mut flags = pg_sys::TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS;
                if !xact_snapshot {
                    flags |= pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
                }
                let mut tmfd = pg_sys::TM_FailureData::default();
                let tuple_lock = (*(*heap).rd_tableam).tuple_lock.expect("a table AM locks tuples");
                let result = tuple_lock(
                    heap,
                    &mut tid,
                    snapshot,
                    slot,
                    pg_sys::GetCurrentCommandId(true),
                    pg_sys::LockTupleMode::LockTupleShare,
                    pg_sys::LockWaitPolicy::LockWaitBlock,
                    flags as u8,
                    &mut tmfd,
                );
                match result {
                    pg_sys::TM_Result::TM_Ok if tmfd.traversed && !self.same_key(slot, args) => Probe::Missing,
                    pg_sys::TM_Result::TM_Ok => Probe::Found(slot_int(slot, token)),
                    pg_sys::TM_Result::TM_SelfModified | pg_sys::TM_Result::TM_WouldBlock => Probe::Missing,
                    pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted if xact_snapshot => {
                        pgrx::ereport!(
                            ERROR,
                            pgrx::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                            "could not serialize access due to concurrent update"
                        );
                    }
                    pg_sys::TM_Result::TM_Deleted => Probe::Missing,
                    other => pgrx::error!("unexpected table_tuple_lock status: {other}"),
                }
            };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::PopActiveSnapshot();
            pg_sys::index_close(index, pg_sys::NoLock as _);
            pg_sys::table_close(heap, pg_sys::NoLock as _);
            probe
        }
    }

    /// Whether the row in `slot` (a newer version than the one the index
    /// scan matched) still has the key `args`.
    ///
    /// # Safety
    /// `slot` holds a row of this index's table; `args` as for `probe`.
    unsafe fn same_key(&self, slot: *mut pg_sys::TupleTableSlot, args: &[pg_sys::Datum]) -> bool {
        self.keys.iter().all(|key| {
            // SAFETY: the caller's contract; the operator function takes
            // (column type, argument type) datums and returns a bool datum.
            unsafe {
                match slot_attr(slot, key.attnum) {
                    None => false,
                    Some(value) => {
                        pg_sys::OidFunctionCall2Coll(key.eq_proc, key.collation, value, args[key.arg]).value() != 0
                    }
                }
            }
        })
    }
}

/// The row [`update_own_row`] found, as its `change` sees it.
pub struct OwnRow {
    desc: pg_sys::TupleDesc,
    slot: *mut pg_sys::TupleTableSlot,
}

impl OwnRow {
    /// The attnum of column `name`, which must exist with type `typid`
    /// (looked up in the open relation's descriptor, not the syscache).
    fn attnum(&self, name: &CStr, typid: pg_sys::Oid) -> i16 {
        // SAFETY: the descriptor of the relation update_own_row holds open.
        unsafe { desc_attnum(self.desc, name, typid) }.unwrap_or_else(|| {
            pgrx::error!("pg_lease: column {} of its own table is missing or of another type", name.to_string_lossy())
        })
    }

    /// Column `name` (of type `typid`, checked) of the row, None when NULL.
    pub fn attr(&self, name: &CStr, typid: pg_sys::Oid) -> Option<pg_sys::Datum> {
        let attnum = self.attnum(name, typid);
        // SAFETY: the slot holds a row of the relation, which has column
        // `attnum` (just looked up).
        unsafe { slot_attr(self.slot, attnum) }
    }
}

/// Whether a trigger of `rel` fires on UPDATE in this session (by the
/// rules of TriggerEnabled: `session_replication_role` against each
/// trigger's ENABLE mode).
///
/// # Safety
/// `rel` is an open relation.
unsafe fn update_triggers_fire(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's contract; trigdesc (NULL without triggers) holds
    // numtriggers entries.
    unsafe {
        let desc = (*rel).trigdesc;
        if desc.is_null() {
            return false;
        }
        let replica = pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
        (0..(*desc).numtriggers as usize).any(|i| {
            let t = &*(*desc).triggers.add(i);
            let fires = match t.tgenabled as u8 {
                b'A' => true,
                b'R' => replica,
                b'O' => !replica,
                _ => false,
            };
            fires && (t.tgtype as u32 & pg_sys::TRIGGER_TYPE_UPDATE) != 0
        })
    }
}

/// Whether a table's constraints leave its columns plain: no CHECK
/// constraint and no generated column (stored, or on PostgreSQL 18
/// virtual), whose values an UPDATE statement computes or checks.
fn plain_columns(constr: &pg_sys::TupleConstr) -> bool {
    #[cfg(feature = "pg18")]
    let virtual_columns = constr.has_generated_virtual;
    #[cfg(not(feature = "pg18"))]
    let virtual_columns = false;
    constr.num_check == 0 && !constr.has_generated_stored && !virtual_columns
}

/// The largest timestamp PostgreSQL accepts (END_TIMESTAMP, exclusive).
pub const END_TIMESTAMP: pg_sys::TimestampTz = 9_223_371_331_200_000_000;

/// Updates, without a statement, the row of pg_lease's own table
/// `lease.<table>` whose primary key, the text column `key_column` alone
/// (compared with `texteq` in the index's collation), equals `key`:
/// the row a fresh snapshot sees (as a statement run here would: READ
/// COMMITTED sees what committed before, REPEATABLE READ its snapshot, and
/// both this transaction's earlier writes), given to `change`, which returns
/// the new values of some columns (name, type, value) and the caller's result, or None
/// to leave the row alone. The update is the table AM's, as an UPDATE's:
/// it waits for a transaction that locked or is changing the row, writes a
/// HOT version when it can, else inserts the new version's index entries.
///
/// None — nothing written — whenever the caller must run its statement
/// instead: no row, `change` declined, the row was changed concurrently
/// (the statement then follows the update chain at READ COMMITTED or fails
/// to serialize above it, as it always did), or the table is not plain
/// enough for this path (a read-only transaction or parallel mode, where
/// the statement raises its error; an UPDATE trigger that fires in this
/// session, a rule, a table inheriting from it or a partitioned table it is
/// a partition of, row-level security, CHECK constraints or generated
/// columns, no SELECT or no UPDATE right for the current user (the
/// statement reads and writes), a primary key that is not `key_column`
/// alone, plain).
///
/// # Safety
/// `key` is a valid, non-NULL text datum; the caller runs inside a
/// transaction, as the role the statement would run as.
pub unsafe fn update_own_row<R>(
    table: &CStr,
    key_column: &CStr,
    key: pg_sys::Datum,
    change: impl FnOnce(&OwnRow) -> Option<(Vec<(&'static CStr, pg_sys::Oid, pg_sys::Datum)>, R)>,
) -> Option<R> {
    let relid = lease_relid(table);
    // SAFETY: the locks are an UPDATE's (RowExclusiveLock on the table, kept
    // to transaction end; its primary key index, found through the open
    // relation and checked to be a plain btree on `key_column` alone, for
    // the scan AccessShareLock, and
    // RowExclusiveLock on every index when entries are inserted, through
    // ExecOpenIndices); the snapshot is pushed and the command counter
    // advanced as SPI does for a statement, and popped before return (an
    // ERROR in between unwinds it, the scan, the slots, the executor state
    // and the relation references at (sub)transaction abort); the scan key
    // is copied by index_rescan; the rows' values are copied into a virtual
    // slot of the table's descriptor before any is replaced; tuple_update is
    // the table AM's callback, called as table_tuple_update (an inline
    // function) calls it, on the TID the index scan returned; the executor
    // state made for the index entries has no range table: its
    // ResultRelInfo has index 0, for which the executor's "updated columns"
    // are none (as for a trigger-only ResultRelInfo).
    unsafe {
        let rel = pg_sys::table_open(relid, pg_sys::RowExclusiveLock as _);
        let class = &*(*rel).rd_rel;
        let constr = (*(*rel).rd_att).constr;
        let key_attnum = desc_attnum((*rel).rd_att, key_column, pg_sys::TEXTOID).unwrap_or(0);
        #[cfg(not(feature = "pg18"))]
        let indexid = pg_sys::RelationGetPrimaryKeyIndex(rel);
        #[cfg(feature = "pg18")]
        let indexid = pg_sys::RelationGetPrimaryKeyIndex(rel, false);
        let plain = !pg_sys::XactReadOnly
            && !pg_sys::IsInParallelMode()
            && !update_triggers_fire(rel)
            && !class.relhasrules
            && !class.relhassubclass
            && !class.relispartition
            && !class.relrowsecurity
            && (constr.is_null() || plain_columns(&*constr))
            && [pg_sys::ACL_SELECT, pg_sys::ACL_UPDATE].iter().all(|&right| {
                pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), right as _) == pg_sys::AclResult::ACLCHECK_OK
            })
            && key_attnum > 0
            && indexid != pg_sys::InvalidOid;
        let irel = if plain { pg_sys::index_open(indexid, pg_sys::AccessShareLock as _) } else { std::ptr::null_mut() };
        let usable = !irel.is_null() && {
            let ind = &*(*irel).rd_index;
            ind.indisvalid
                && ind.indimmediate
                && ind.indnkeyatts == 1
                && ind.indnatts == 1
                && *ind.indkey.values.as_ptr() == key_attnum
                && (*(*irel).rd_rel).relam == pg_sys::BTREE_AM_OID
                && *(*irel).rd_opcintype == pg_sys::TEXTOID
                && pg_sys::RelationGetIndexPredicate(irel).is_null()
                && pg_sys::RelationGetIndexExpressions(irel).is_null()
        };
        if !usable {
            if !irel.is_null() {
                pg_sys::index_close(irel, pg_sys::NoLock as _);
            }
            pg_sys::table_close(rel, pg_sys::NoLock as _);
            return None;
        }
        pg_sys::CheckCmdReplicaIdentity(rel, pg_sys::CmdType::CMD_UPDATE);
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        pg_sys::CommandCounterIncrement();
        pg_sys::UpdateActiveSnapshotCommandId();
        let snapshot = pg_sys::GetActiveSnapshot();

        let collation = *(*irel).rd_indcollation;
        let mut sk = pg_sys::ScanKeyData::default();
        pg_sys::ScanKeyEntryInitialize(
            &mut sk,
            0,
            1,
            pg_sys::BTEqualStrategyNumber as _,
            pg_sys::InvalidOid,
            collation,
            pg_sys::RegProcedure::from(pg_sys::F_TEXTEQ),
            key,
        );
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(rel, irel, snapshot, 1, 0);
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(rel, irel, snapshot, std::ptr::null_mut(), 1, 0);
        pg_sys::index_rescan(scan, &mut sk, 1, std::ptr::null_mut(), 0);
        let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
        let visible = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
        pg_sys::index_endscan(scan);

        let same_key = visible
            && slot_attr(slot, key_attnum).is_some_and(|k| {
                pg_sys::OidFunctionCall2Coll(pg_sys::Oid::from(pg_sys::F_TEXTEQ), collation, k, key).value() != 0
            });
        let mut result = None;
        let row = OwnRow { desc: (*rel).rd_att, slot };
        if let Some((changes, r)) = same_key.then(|| change(&row)).flatten() {
            let desc = (*rel).rd_att;
            let natts = (*desc).natts;
            pg_sys::slot_getsomeattrs_int(slot, natts);
            let new = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsVirtual);
            pg_sys::ExecClearTuple(new);
            std::ptr::copy_nonoverlapping((*slot).tts_values, (*new).tts_values, natts as usize);
            std::ptr::copy_nonoverlapping((*slot).tts_isnull, (*new).tts_isnull, natts as usize);
            for (name, typid, value) in changes {
                let i = row.attnum(name, typid) as usize - 1;
                *(*new).tts_values.add(i) = value;
                *(*new).tts_isnull.add(i) = false;
            }
            pg_sys::ExecStoreVirtualTuple(new);

            let mut tid = (*slot).tts_tid;
            let mut tmfd = pg_sys::TM_FailureData::default();
            let mut lockmode = pg_sys::LockTupleMode::LockTupleNoKeyExclusive;
            #[cfg(not(feature = "pg18"))]
            let mut update_indexes = false;
            #[cfg(feature = "pg18")]
            let mut update_indexes = pg_sys::TU_UpdateIndexes::TU_None;
            let tuple_update = (*(*rel).rd_tableam).tuple_update.expect("a table AM updates tuples");
            let status = tuple_update(
                rel,
                &mut tid,
                new,
                pg_sys::GetCurrentCommandId(true),
                snapshot,
                std::ptr::null_mut(),
                true,
                &mut tmfd,
                &mut lockmode,
                &mut update_indexes,
            );
            if status == pg_sys::TM_Result::TM_Ok {
                #[cfg(not(feature = "pg18"))]
                let (insert, only_summarizing) = (update_indexes, false);
                #[cfg(feature = "pg18")]
                let (insert, only_summarizing) = (
                    update_indexes != pg_sys::TU_UpdateIndexes::TU_None,
                    update_indexes == pg_sys::TU_UpdateIndexes::TU_Summarizing,
                );
                if insert {
                    let estate = pg_sys::CreateExecutorState();
                    let rri = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()).cast();
                    pg_sys::InitResultRelInfo(rri, rel, 0, std::ptr::null_mut(), 0);
                    pg_sys::ExecOpenIndices(rri, false);
                    let (no_conflict, no_arbiters) = (std::ptr::null_mut(), std::ptr::null_mut());
                    #[cfg(not(feature = "pg18"))]
                    let _ = only_summarizing;
                    #[cfg(not(feature = "pg18"))]
                    pg_sys::ExecInsertIndexTuples(rri, new, estate, true, false, no_conflict, no_arbiters);
                    #[cfg(feature = "pg18")]
                    pg_sys::ExecInsertIndexTuples(
                        rri,
                        new,
                        estate,
                        true,
                        false,
                        no_conflict,
                        no_arbiters,
                        only_summarizing,
                    );
                    pg_sys::ExecCloseIndices(rri);
                    pg_sys::FreeExecutorState(estate);
                }
                result = Some(r);
            }
            pg_sys::ExecDropSingleTupleTableSlot(new);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::PopActiveSnapshot();
        pg_sys::index_close(irel, pg_sys::NoLock as _);
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        result
    }
}

/// Column `attnum` of the row in `slot`, None when NULL.
///
/// # Safety
/// `slot` holds a row with at least `attnum` columns (slot_getattr's contract).
unsafe fn slot_attr(slot: *mut pg_sys::TupleTableSlot, attnum: i16) -> Option<pg_sys::Datum> {
    // SAFETY: slot_getattr's body (an inline function in tuptable.h):
    // deform up to `attnum`, then read the slot's value/null arrays, which
    // hold tts_nvalid >= attnum entries afterwards.
    unsafe {
        if (*slot).tts_nvalid < attnum {
            pg_sys::slot_getsomeattrs_int(slot, attnum as i32);
        }
        let i = attnum as usize - 1;
        (!*(*slot).tts_isnull.add(i)).then(|| *(*slot).tts_values.add(i))
    }
}

/// Integer column `(attnum, type)` of the row in `slot`.
///
/// # Safety
/// As [`slot_attr`], with `typid` the column's int2, int4 or int8 type.
unsafe fn slot_int(slot: *mut pg_sys::TupleTableSlot, (attnum, typid): (i16, pg_sys::Oid)) -> Option<i64> {
    // SAFETY: the caller's contract.
    unsafe { slot_attr(slot, attnum) }.map(|d| token_from_datum(d, typid))
}

/// Sets a setting as SET LOCAL (GUC_ACTION_LOCAL) or as a function's SET
/// clause does (GUC_ACTION_SAVE: undone when the current GUC nest level ends).
pub fn set_guc(name: &CStr, value: &CStr, action: pg_sys::GucAction::Type) {
    // SAFETY: NUL-terminated name and value live across the call; a refused
    // value raises an ERROR.
    unsafe {
        let context = if pg_sys::superuser() { pg_sys::GucContext::PGC_SUSET } else { pg_sys::GucContext::PGC_USERSET };
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            context,
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            0,
            false,
        );
    }
}

/// Runs `f` with `search_path = pg_catalog, pg_temp`, exactly as a function
/// declared with that SET clause runs its body: a GUC nest level of its own,
/// closed afterwards (on error, by the (sub)transaction abort).
pub fn with_pinned_search_path<R>(f: impl FnOnce() -> R) -> R {
    with_settings(&[(c"search_path", c"pg_catalog, pg_temp")], f)
}

/// Runs `f` with the settings that shape values' text output fixed
/// (search_path, DateStyle, IntervalStyle, TimeZone, extra_float_digits,
/// bytea_output, lc_monetary), as [`with_pinned_search_path`] pins its setting: text a
/// value of a key is shown as then depends on the value alone, not on the
/// session that shows it.
pub fn with_stable_output<R>(f: impl FnOnce() -> R) -> R {
    with_settings(
        &[
            // (regclass and the other reg* types print a name without its
            // schema when the search path finds it.)
            (c"search_path", c"pg_catalog, pg_temp"),
            (c"DateStyle", c"ISO, YMD"),
            (c"IntervalStyle", c"postgres"),
            (c"TimeZone", c"UTC"),
            (c"extra_float_digits", c"1"),
            (c"bytea_output", c"hex"),
            (c"lc_monetary", c"C"),
        ],
        f,
    )
}

/// Runs `f` with `settings` made as a function's SET clauses make them: a
/// GUC nest level of its own, closed afterwards (on error, by the
/// (sub)transaction abort).
fn with_settings<R>(settings: &[(&CStr, &CStr)], f: impl FnOnce() -> R) -> R {
    // SAFETY: NewGUCNestLevel only increments guc.c's nest counter; the
    // level is closed below, or by abort if `f` raises.
    let nest = unsafe { pg_sys::NewGUCNestLevel() };
    for (name, value) in settings {
        set_guc(name, value, pg_sys::GucAction::GUC_ACTION_SAVE);
    }
    let r = f();
    // SAFETY: `nest` is the level opened above, still the innermost one: `f`
    // returned normally, so any level it opened it also closed.
    unsafe { pg_sys::AtEOXact_GUC(true, nest) };
    r
}

/// Runs `f` in a subtransaction of its own, as a PL/pgSQL block with an
/// EXCEPTION clause runs its body: committed when `f` returns `Ok`, rolled
/// back (its writes, row locks, SPI connections, user and settings undone)
/// when it returns `Err` or raises. A raised error (a pgrx panic payload) is
/// handed back after the rollback, for the caller to judge or rethrow with
/// [`std::panic::resume_unwind`].
pub fn subtransaction<R, E>(f: impl FnOnce() -> Result<R, E>) -> Result<Result<R, E>, Box<dyn std::any::Any + Send>> {
    // SAFETY: reads two backend globals, restored below as PL/pgSQL's
    // exec_stmt_block restores them around its subtransaction.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    // SAFETY: starts a subtransaction inside the current transaction (a
    // lease call always runs in one); the memory context switch keeps `f`'s
    // allocations in the caller's context, as PL/pgSQL does.
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // SAFETY: the subtransaction begun above is the current one: `f` either
    // returned normally (closing whatever it opened) or raised, and pgrx's
    // guard caught the error (its error state flushed) before unwinding here.
    unsafe {
        match &outcome {
            Ok(Ok(_)) => pg_sys::ReleaseCurrentSubTransaction(),
            _ => pg_sys::RollbackAndReleaseCurrentSubTransaction(),
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    outcome
}

/// The rows a set-returning function returns, in a tuplestore
/// (materialize mode, as PL/pgSQL's functions return theirs).
pub struct RowSink(*mut pg_sys::ReturnSetInfo);

impl RowSink {
    /// Makes the current call return its rows through the sink; raises when
    /// the caller cannot accept a set.
    ///
    /// # Safety
    /// `fcinfo` is the call's, of a function declared to return a set of
    /// rows.
    pub unsafe fn new(fcinfo: pg_sys::FunctionCallInfo) -> RowSink {
        // SAFETY: the caller's contract; InitMaterializedSRF checks the call
        // context (raising when no set is accepted) and creates the
        // tuplestore and its descriptor in the query's memory.
        unsafe {
            pg_sys::InitMaterializedSRF(fcinfo, 0);
            (*fcinfo).isnull = true;
            RowSink((*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo)
        }
    }

    /// Adds a row (None: NULL), copied into the tuplestore.
    ///
    /// # Safety
    /// `row`'s datums are valid values of the function's result columns'
    /// types, in order.
    pub unsafe fn put(&self, row: &[Option<pg_sys::Datum>]) {
        let mut values: Vec<pg_sys::Datum> = row.iter().map(|d| d.unwrap_or(pg_sys::Datum::from(0))).collect();
        let mut nulls: Vec<bool> = row.iter().map(Option::is_none).collect();
        // SAFETY: the caller's contract; the tuplestore and descriptor were
        // set up by `new` for this call; the values are copied.
        unsafe {
            pg_sys::tuplestore_putvalues(
                (*self.0).setResult,
                (*self.0).setDesc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            )
        };
    }
}
