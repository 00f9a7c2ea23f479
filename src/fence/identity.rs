//! What makes two key values the same resource: the key type's own btree
//! equality, never its text output (which follows `TimeZone`, `DateStyle`,
//! `bytea_output` and keeps `numeric` scale) nor its raw bytes.
//!
//! - Owner mode looks owner rows up with the owner key's `=` operator, so the
//!   owner table decides. The per-transaction cache there is keyed by raw
//!   bytes, which is only conservative: equal bytes are always equal values,
//!   and equal values with different bytes just miss and look up again.
//! - High-water marks live in `lease.high_water` keyed by each value's
//!   [`Canon`] form: a byte string that is equal for two values exactly when
//!   the type's equality says they are equal. Key types without such a form
//!   cannot be high-water keys ([`key_identity_problem`]).

use pgrx::pg_sys;
use pgrx::prelude::*;

/// How a high-water key type is canonicalized (the base type of a domain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canon {
    /// int2/int4/int8: the decimal integer.
    Int16,
    Int32,
    Int64,
    /// numeric: its text without insignificant trailing zeros (1.0 = 1.00 = 1).
    Numeric,
    /// text/varchar with a deterministic collation: the bytes themselves.
    Text,
    /// char(n): the bytes without trailing spaces, which its equality ignores.
    Bpchar,
    /// uuid, bool: their text output, which no setting changes.
    Output,
    /// date: days since 2000-01-01 (DateStyle changes its text).
    Date,
    /// timestamp, timestamptz: microseconds since 2000-01-01 UTC (TimeZone
    /// and DateStyle change their text).
    Timestamp,
    /// bytea: `\x` and lowercase hex (bytea_output changes its text).
    Bytea,
}

impl Canon {
    /// The canonical kind of a key column, or why it has none.
    pub fn of(typid: pg_sys::Oid, collation: pg_sys::Oid) -> Result<Canon, String> {
        // SAFETY: a syscache lookup; '\0' when no such type exists.
        if unsafe { pg_sys::get_typtype(typid) } == 0 {
            return Err(format!("type {} does not exist", typid.to_u32()));
        }
        // SAFETY: a syscache walk down a domain chain; any OID is accepted
        // (a non-domain or unknown type is returned as is).
        let base = unsafe { pg_sys::getBaseType(typid) };
        let canon = match base {
            pg_sys::INT2OID => Canon::Int16,
            pg_sys::INT4OID => Canon::Int32,
            pg_sys::INT8OID => Canon::Int64,
            pg_sys::NUMERICOID => Canon::Numeric,
            pg_sys::TEXTOID | pg_sys::VARCHAROID => Canon::Text,
            pg_sys::BPCHAROID => Canon::Bpchar,
            pg_sys::UUIDOID | pg_sys::BOOLOID => Canon::Output,
            pg_sys::DATEOID => Canon::Date,
            pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => Canon::Timestamp,
            pg_sys::BYTEAOID => Canon::Bytea,
            _ => {
                return Err(format!(
                    "type {} has no canonical form pg_lease knows (use an integer, numeric, text, varchar, char, uuid, bool, date, timestamp, timestamptz or bytea key)",
                    crate::pg::type_name(typid)
                ))
            }
        };
        if matches!(canon, Canon::Text | Canon::Bpchar)
            && collation != pg_sys::InvalidOid
            // SAFETY: a syscache lookup of a valid collation OID (the
            // column's own); an unknown one raises an ERROR.
            && !unsafe { pg_sys::get_collation_isdeterministic(collation) }
        {
            return Err("its collation is nondeterministic, so equal values can differ in their bytes".to_owned());
        }
        Ok(canon)
    }

    /// Appends the canonical form of a non-NULL datum of this kind.
    ///
    /// # Safety
    /// `datum` must be a valid, non-NULL value of `typid`, the type this kind
    /// was made for ([`Canon::of`]), and stay valid during the call.
    pub unsafe fn append(self, out: &mut Vec<u8>, datum: pg_sys::Datum, typid: pg_sys::Oid) {
        use std::io::Write;
        match self {
            Canon::Int16 => write!(out, "{}", datum.value() as i16).unwrap(),
            Canon::Int32 => write!(out, "{}", datum.value() as i32).unwrap(),
            Canon::Int64 | Canon::Timestamp => write!(out, "{}", datum.value() as i64).unwrap(),
            Canon::Date => write!(out, "{}", datum.value() as i32).unwrap(),
            Canon::Numeric => {
                // SAFETY: a numeric datum is a (maybe toasted) varlena, which
                // pg_detoast_datum returns as is or as a palloc'd plain copy.
                let num = unsafe { pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) } as pg_sys::Numeric;
                // SAFETY: `num` is a plain numeric; numeric_normalize returns
                // a new palloc'd NUL-terminated string.
                let text = unsafe { pg_sys::numeric_normalize(num) };
                // SAFETY: `text` is that string, freed only after the copy.
                out.extend_from_slice(unsafe { std::ffi::CStr::from_ptr(text) }.to_bytes());
                // SAFETY: `text` was palloc'd above and nothing else refers to it.
                unsafe { pg_sys::pfree(text.cast()) };
            }
            // SAFETY: text and varchar are varlena types; `datum` is a valid
            // one (the caller's contract), used before it can go away.
            Canon::Text => out.extend_from_slice(unsafe { varlena_bytes(datum) }),
            Canon::Bpchar => {
                // SAFETY: char(n) is a varlena type; as for Text.
                let bytes = unsafe { varlena_bytes(datum) };
                let end = bytes.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
                out.extend_from_slice(&bytes[..end]);
            }
            // SAFETY: `datum` is a valid non-NULL value of `typid` (the
            // caller's contract).
            Canon::Output => out.extend_from_slice(unsafe { crate::pg::datum_text(datum, typid) }.as_bytes()),
            Canon::Bytea => {
                out.extend_from_slice(b"\\x");
                // SAFETY: bytea is a varlena type; as for Text.
                for b in unsafe { varlena_bytes(datum) } {
                    write!(out, "{b:02x}").unwrap();
                }
            }
        }
    }
}

/// The bytes of a varlena datum (detoasted when needed).
///
/// # Safety
/// `datum` must be a valid non-NULL varlena datum that outlives the result,
/// and the result must not outlive the current memory context (a detoasted
/// copy is palloc'd there).
pub unsafe fn varlena_bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    use pgrx::varlena::{varatt_is_1b_e, varatt_is_4b_c, vardata_any, varsize_any_exhdr};
    let mut v = datum.cast_mut_ptr::<pg_sys::varlena>();
    // SAFETY: `v` points to a valid varlena (the caller's contract); these
    // read its header only.
    if unsafe { varatt_is_1b_e(v) || varatt_is_4b_c(v) } {
        // SAFETY: an external or compressed varlena, which
        // pg_detoast_datum_packed fetches/decompresses into a palloc'd copy
        // in the current memory context (a short-header one it leaves as is).
        v = unsafe { pg_sys::pg_detoast_datum_packed(v) };
    }
    // SAFETY: `v` is now an in-line, uncompressed varlena (1- or 4-byte
    // header): its data starts at vardata_any and is varsize_any_exhdr bytes
    // long, valid as long as the datum or the detoasted copy is ('a, by the
    // caller's contract).
    unsafe { std::slice::from_raw_parts(vardata_any(v) as *const u8, varsize_any_exhdr(v)) }
}

/// Whether two non-NULL values of `typid` are equal under the type's default
/// btree equality with `collation` (bytes first: equal bytes are equal values).
/// A type without an equality operator never compares equal.
///
/// # Safety
/// Both datums must be valid non-NULL values of `typid`.
pub unsafe fn equal(a: pg_sys::Datum, b: pg_sys::Datum, typid: pg_sys::Oid, collation: pg_sys::Oid) -> bool {
    let mut typlen = 0i16;
    let mut byval = false;
    // SAFETY: a syscache lookup writing into two live locals; an unknown
    // type raises an ERROR.
    unsafe { pg_sys::get_typlenbyval(typid, &mut typlen, &mut byval) };
    let same_bytes = if byval {
        a.value() == b.value()
    } else if typlen == -1 {
        // SAFETY: by-reference values of a varlena type (typlen -1), valid
        // (the caller's contract), compared before this call returns.
        unsafe { varlena_bytes(a) == varlena_bytes(b) }
    } else if typlen > 0 {
        // SAFETY: a by-reference value of a fixed-length type points to
        // typlen bytes, valid for the call (the caller's contract).
        unsafe {
            std::slice::from_raw_parts(a.cast_mut_ptr::<u8>(), typlen as usize)
                == std::slice::from_raw_parts(b.cast_mut_ptr::<u8>(), typlen as usize)
        }
    } else {
        false
    };
    if same_bytes {
        return true;
    }
    // SAFETY: looks `typid` up in the type cache (raises if unknown).
    let entry = unsafe { pg_sys::lookup_type_cache(typid, pg_sys::TYPECACHE_EQ_OPR_FINFO as i32) };
    // SAFETY: a non-null entry is a TypeCacheEntry, which the type cache
    // never frees for the life of the backend.
    if entry.is_null() || unsafe { (*entry).eq_opr_finfo.fn_oid } == pg_sys::InvalidOid {
        return false;
    }
    // SAFETY: eq_opr_finfo is the type's equality function, looked up by
    // the type cache (fn_oid valid, checked above) and kept there, so a
    // &mut to it is what FunctionCall2Coll expects (it may cache fn_extra
    // in it; this backend has one thread, and nothing else holds a
    // reference to it during the call). `a` and `b` are valid non-NULL
    // values of `typid` (the caller's contract); the function is strict
    // and an ERROR (or a NULL result) raises.
    let result = unsafe { pg_sys::FunctionCall2Coll(&mut (*entry).eq_opr_finfo, collation, a, b) };
    result.value() != 0
}

/// `lease._key_identity_problem(typ, collation)`: NULL when a column of this
/// type and collation can be a high-water key, else why not. The one list of
/// supported key types, used by `protect_high_water` and the DDL guard.
#[pg_extern(name = "_key_identity_problem", stable, parallel_safe)]
pub fn key_identity_problem(typ: pg_sys::Oid, collation: default!(pg_sys::Oid, 0)) -> Option<crate::pg::ServerText> {
    Canon::of(typ, collation).err().map(crate::pg::ServerText)
}

/// `lease._key_type_problem(typ)`: NULL when an owner key of type `typ` is
/// compared with the type's own equality, else why not. The fence compares
/// keys with what `OPERATOR(pg_catalog.=)` resolves to
/// ([`crate::pg::key_equality`], immune to a look-alike `=` earlier on the
/// search_path); a type whose own `=` (its default btree equality) lives
/// elsewhere, as an extension's type's does (`citext`), would be compared
/// through a cast with another type's equality instead (`text`'s,
/// case-sensitive), which is not what its values mean nor what its unique
/// indexes enforce. A type with no equality, or none pg_lease can use, has
/// no problem here (protect's other checks refuse it, saying why).
#[pg_extern(name = "_key_type_problem", stable, parallel_safe)]
pub fn key_type_problem(typ: pg_sys::Oid) -> Option<crate::pg::ServerText> {
    // SAFETY: looks `typ` up in the type cache (raises if unknown); a
    // non-null entry is never freed for the life of the backend.
    let own = unsafe {
        let entry = pg_sys::lookup_type_cache(typ, pg_sys::TYPECACHE_EQ_OPR as i32);
        if entry.is_null() {
            return None;
        }
        (*entry).eq_opr
    };
    if own == pg_sys::InvalidOid {
        return None;
    }
    // (No usable equality at all: protect's later checks say why.)
    let used = crate::pg::key_equality(typ, typ)?.op;
    if used == own {
        return None;
    }
    // SAFETY: format_operator returns a palloc'd C string for any OID.
    let shown = |op: pg_sys::Oid| unsafe { crate::pg::owned(pg_sys::format_operator(op)) };
    Some(crate::pg::ServerText(format!(
        "type {}'s own equality is {}, but OPERATOR(pg_catalog.=), which pg_lease compares keys with, finds {} for it",
        crate::pg::type_name(typ),
        shown(own),
        shown(used)
    )))
}

/// `lease._is_token_type(typ)`: whether a column of `typ` can hold a fencing
/// token ([`crate::pg::is_token_type`], the one list of them), for the fence
/// checks in SQL.
#[pg_extern(name = "_is_token_type", immutable, parallel_safe)]
pub fn is_token_type(typ: pg_sys::Oid) -> bool {
    crate::pg::is_token_type(typ)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn equal_values_have_one_canonical_form() {
        Spi::run(
            "CREATE TABLE hw (k numeric, t timestamptz, c char(4), d date, token bigint);
             SELECT lease.protect_high_water('hw', '{k,t,c,d}', 'token');
             SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD';
             INSERT INTO hw VALUES (1.0, '2026-01-01 00:00:00+00', 'ab', '2026-01-02', 10);
             SET TimeZone = 'Asia/Tokyo'; SET DateStyle = 'SQL, DMY';",
        )
        .unwrap();
        // Same resource written in another form: a lower token is stale.
        let caught = Spi::get_one::<String>(
            "DO $$ BEGIN INSERT INTO hw VALUES (1.000, '2026-01-01 09:00:00+09', 'ab  ', '02/01/2026', 9);
               EXCEPTION WHEN SQLSTATE 'LF001' THEN PERFORM set_config('t.caught', 'LF001', true); END $$;
             SELECT current_setting('t.caught', true)",
        );
        assert_eq!(caught.unwrap().as_deref(), Some("LF001"));
        assert_eq!(Spi::get_one::<i64>("SELECT count(*) FROM lease.high_water").unwrap(), Some(1));
    }

    #[pg_test]
    fn nondeterministic_and_unknown_key_types_are_refused() {
        assert!(Spi::get_one::<String>("SELECT lease._key_identity_problem('int4'::regtype, 0)").unwrap().is_none());
        assert!(Spi::get_one::<String>("SELECT lease._key_identity_problem('point'::regtype, 0)").unwrap().is_some());
        assert!(Spi::get_one::<String>("SELECT lease._key_identity_problem('float8'::regtype, 0)").unwrap().is_some());
    }
}
