//! Small helpers over Postgres catalogs and datums used by the fence.

use pgrx::pg_sys;
use std::ffi::CStr;

/// A C string owned by Postgres, copied into Rust (NULL becomes empty).
pub(crate) unsafe fn owned(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// (schema, relation name) of `relid`.
pub fn relation_names(relid: pg_sys::Oid) -> (String, String) {
    unsafe {
        let schema = owned(pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid)));
        let table = owned(pg_sys::get_rel_name(relid));
        (schema, table)
    }
}

/// An identifier quoted the way Postgres quotes it (only when needed).
pub fn quote_ident(name: &str) -> String {
    let cname = std::ffi::CString::new(name).expect("identifiers have no NUL");
    unsafe { owned(pg_sys::quote_identifier(cname.as_ptr())) }
}

pub fn qualified_name(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// The role that owns `relid` (lookups run as it, as RI triggers do).
pub fn rel_owner(relid: pg_sys::Oid) -> pg_sys::Oid {
    pgrx::spi::Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT relowner FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) $1",
        &[relid.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(pg_sys::InvalidOid)
}

/// Prepares `sql` with SPI and keeps the plan for the life of the backend.
/// Call inside an SPI connection.
pub unsafe fn prepare_saved(sql: &CStr, argtypes: &mut [pg_sys::Oid], what: &str) -> pg_sys::SPIPlanPtr {
    let plan = pg_sys::SPI_prepare(sql.as_ptr(), argtypes.len() as i32, argtypes.as_mut_ptr());
    if plan.is_null() {
        pgrx::error!("pg_lease: could not prepare {what}");
    }
    pg_sys::SPI_keepplan(plan);
    plan
}

/// An integer token datum of type int2/int4/int8 as i64.
#[inline]
pub fn token_from_datum(datum: pg_sys::Datum, typid: pg_sys::Oid) -> i64 {
    if typid == pg_sys::INT8OID {
        datum.value() as i64
    } else if typid == pg_sys::INT4OID {
        datum.value() as i32 as i64
    } else {
        datum.value() as i16 as i64
    }
}

/// The text form of a datum, for messages (slow path only).
pub fn datum_text(datum: pg_sys::Datum, typid: pg_sys::Oid) -> String {
    unsafe {
        let (mut out, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo(typid, &mut out, &mut varlena);
        owned(pg_sys::OidOutputFunctionCall(out, datum))
    }
}

/// Runs `f` as `role` with `flags` added to the security context, restoring
/// both afterwards (on error, (sub)transaction abort restores them).
fn with_user<R>(role: pg_sys::Oid, flags: u32, f: impl FnOnce() -> R) -> R {
    // SAFETY: saves and restores the current user and security context.
    unsafe {
        let (mut saved_user, mut saved_ctx) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_ctx);
        pg_sys::SetUserIdAndSecContext(role, saved_ctx | (pg_sys::SECURITY_LOCAL_USERID_CHANGE | flags) as i32);
        let r = f();
        pg_sys::SetUserIdAndSecContext(saved_user, saved_ctx);
        r
    }
}

/// Runs `f` as `role`, the way ri_triggers.c runs its checks as the owner of
/// the referenced table: the writer needs no privileges on pg_lease's lookups,
/// and row-level security cannot hide an owner row from the fence.
pub fn as_role<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(role, pg_sys::SECURITY_NOFORCE_RLS, f)
}

/// A type's name as Postgres prints it (`numeric`, `character varying`).
pub fn type_name(typid: pg_sys::Oid) -> String {
    // SAFETY: format_type_be returns a palloc'd C string or raises.
    unsafe { owned(pg_sys::format_type_be(typid)) }
}

/// `schema.table` of `relid`, quoted as needed.
pub fn display(relid: pg_sys::Oid) -> String {
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
    with_user(rel_owner(relid), pg_sys::SECURITY_RESTRICTED_OPERATION, || {
        // SAFETY: settings the user code makes are undone at this nest level.
        let nest = unsafe { pg_sys::NewGUCNestLevel() };
        let r = f();
        unsafe { pg_sys::AtEOXact_GUC(true, nest) };
        r
    })
}

/// (attnum, type) of column `name` of `relid`, if it exists.
pub fn attribute(relid: pg_sys::Oid, name: &str) -> Option<(i16, pg_sys::Oid)> {
    let cname = std::ffi::CString::new(name).expect("column names have no NUL");
    // SAFETY: syscache lookups.
    unsafe {
        let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
        (attnum > 0).then(|| (attnum, pg_sys::get_atttype(relid, attnum)))
    }
}

/// The collation of column `attnum` of `relid`.
pub fn attcollation(relid: pg_sys::Oid, attnum: i16) -> pg_sys::Oid {
    let (mut typid, mut typmod, mut collation) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
    // SAFETY: a syscache lookup of an existing column; raises if it is gone.
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

/// The OID of one of pg_lease's own relations (`lease.protected`, ...).
pub fn own_relid(name: &str) -> pg_sys::Oid {
    pgrx::spi::Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT $1::pg_catalog.text::pg_catalog.regclass::pg_catalog.oid",
        &[name.into()],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("{name} exists"))
}

/// A text[] datum of `elems` (text datums), in the current memory context.
pub fn text_array(elems: &[pg_sys::Datum]) -> pg_sys::Datum {
    // SAFETY: text elements, by reference, int-aligned, as construct_array
    // expects; it copies them.
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
