//! A fenced row's resource key: its encoding for the per-transaction cache,
//! its lookup arguments, and how messages print it.

use crate::fence::config::{FenceConfig, KeyColumn};
use crate::fence::identity;
use crate::pg::{datum_text, quote_ident, Row};
use pgrx::pg_sys;
use std::cell::RefCell;

thread_local! {
    /// Reused for every row's key encoding, so the hot path does not allocate.
    static KEY_BUF: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64));
}

/// Appends one key datum's identity: type, length, bytes (owner mode: equal
/// bytes are equal values; the owner lookup judges the rest), or its
/// canonical form (high-water mode, where the cache must agree with the
/// marks' own identity).
///
/// # Safety
/// `datum` is a non-NULL value of `key.typid`.
#[inline]
unsafe fn encode_datum(buf: &mut Vec<u8>, key: &KeyColumn, datum: pg_sys::Datum) {
    buf.extend_from_slice(&key.typid.to_u32().to_ne_bytes());
    if let Some(canon) = key.canon {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        // SAFETY: `datum` is a valid non-NULL value of key.typid (the
        // caller's contract), the type `canon` was made for (config::build).
        unsafe { canon.append(buf, datum, key.typid) };
        let len = (buf.len() - start - 4) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        return;
    }
    if key.typbyval {
        buf.extend_from_slice(&datum.value().to_ne_bytes());
        return;
    }
    // SAFETY: key.typlen/typbyval are key.typid's (config::build), and a
    // by-reference datum of a type with this typlen points to a varlena (-1),
    // a NUL-terminated C string (-2) or typlen bytes (> 0), valid while the
    // row is (the caller's contract); the bytes are copied into `buf` before
    // returning.
    let bytes: &[u8] = unsafe {
        match key.typlen {
            -1 => identity::varlena_bytes(datum),
            -2 => std::ffi::CStr::from_ptr(datum.cast_mut_ptr()).to_bytes(),
            n => std::slice::from_raw_parts(datum.cast_mut_ptr::<u8>(), n as usize),
        }
    };
    buf.extend_from_slice(&(bytes.len() as u32).to_ne_bytes());
    buf.extend_from_slice(bytes);
}

/// Encodes the resource key of `row` (scope + key datums) into `buf`.
/// Returns false when a key column is NULL: such a row has no resource.
#[inline]
pub fn encode(buf: &mut Vec<u8>, cfg: &FenceConfig, row: Row) -> bool {
    buf.clear();
    buf.extend_from_slice(&cfg.scope);
    for key in &cfg.keys {
        match row.attr(key.attnum) {
            // SAFETY: a non-NULL column of the key's type: `cfg` is the
            // config of the relation `row` was fired on (callers pass
            // for_relation(call.relid()) with that call's rows), so
            // key.attnum/typid match the row's descriptor; a change of either
            // invalidates the config before the next row.
            Some(d) => unsafe { encode_datum(buf, key, d) },
            None => return false,
        }
    }
    true
}

/// `f` of the encoded resource key of `row` (None when a key column is
/// NULL), encoded into a reused buffer. `f` must not encode another key.
#[inline]
pub fn with_encoded<R>(cfg: &FenceConfig, row: Row, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    KEY_BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        let found = encode(&mut buf, cfg, row);
        f(found.then_some(buf.as_slice()))
    })
}

/// The encoded key of `row` (whose key columns are non-NULL).
pub fn of(cfg: &FenceConfig, row: Row) -> Box<[u8]> {
    let mut buf = Vec::new();
    encode(&mut buf, cfg, row);
    buf.into_boxed_slice()
}

/// Whether `a` and `b` name the same resource (both without one counts as the same).
pub fn same_resource(cfg: &FenceConfig, a: Row, b: Row) -> bool {
    let (mut ka, mut kb) = (Vec::new(), Vec::new());
    encode(&mut ka, cfg, a) == encode(&mut kb, cfg, b) && ka == kb
}

/// The row's key values: the arguments of the owner-row lookups.
pub fn args(cfg: &FenceConfig, row: Row) -> Vec<pg_sys::Datum> {
    cfg.keys.iter().map(|k| row.attr(k.attnum).expect("key checked non-NULL")).collect()
}

/// `(table_id, seat)=(7, 2)`, the way Postgres prints keys in its own errors:
/// each column `(attnum, type)` of `row` under its name. Values are shown
/// as the session-independent output of their type ([`pg::with_stable_output`]:
/// no DateStyle or TimeZone of the writer's), and one that could read as
/// something else (empty, `NULL`, holding a comma, a parenthesis, a quote or
/// white space) in double quotes, its quotes doubled: two keys that differ
/// are shown differently.
///
/// Every `(attnum, type)` must be a column of the relation `row` belongs to,
/// with that column's type (as [`config::column`] gives it for that
/// relation, or a [`FenceConfig`] built for it); the type's output function
/// reads the value as that type.
///
/// [`config::column`]: crate::fence::config::column
/// [`pg::with_stable_output`]: crate::pg::with_stable_output
pub fn describe<'a>(row: Row, columns: impl Iterator<Item = (&'a str, i16, pg_sys::Oid)>) -> String {
    let (names, values): (Vec<String>, Vec<String>) = crate::pg::with_stable_output(|| {
        columns
            .map(|(name, attnum, typid)| {
                // SAFETY: a non-NULL column `attnum` of `row`, whose type is
                // `typid` (this function's documented requirement, which both
                // callers meet: guards.rs with config::column of the
                // trigger's relation, describe_resource with the row's own
                // config); the value lives in the row, valid for the call.
                let value = row
                    .attr(attnum)
                    .map_or_else(|| "NULL".to_owned(), |d| quoted_value(unsafe { datum_text(d, typid) }));
                (quote_ident(name), value)
            })
            .unzip()
    });
    format!("({})=({})", names.join(", "), values.join(", "))
}

/// A key value's text for [`describe`]: as it is, or in double quotes with
/// its quotes doubled when it could be read as something else.
fn quoted_value(text: String) -> String {
    let ambiguous = text.is_empty()
        || text.eq_ignore_ascii_case("null")
        || text.chars().any(|c| matches!(c, '"' | '(' | ')' | ',') || c.is_whitespace());
    if ambiguous {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// [`describe`] for the fenced row's resource key.
pub fn describe_resource(cfg: &FenceConfig, row: Row) -> String {
    describe(row, cfg.keys.iter().map(|k| (k.name.as_str(), k.attnum, k.typid)))
}
