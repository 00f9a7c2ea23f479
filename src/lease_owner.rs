//! The owner-row half of `lease.acquire`: lock an owner row and read its
//! token, then write the new token. `lease.acquire` runs as the extension
//! owner (a superuser); these run the statements as the owner table's owner in
//! a security-restricted operation ([`as_table_owner`]), so triggers, rules,
//! constraints and casts on a user's owner table never run with more than that
//! user's rights.

use crate::pg::{
    as_table_owner, attribute, display, key_match, quote_ident, server_cstring, sql_name, to_server, ServerText,
};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use std::ffi::CString;

/// The owner key columns (name, type) and token column of `owner`, from
/// lease.protected (every table fenced against one owner table agrees).
fn binding(owner: pg_sys::Oid) -> (Vec<(String, pg_sys::Oid)>, String) {
    let (keys, token) = Spi::get_two_with_args::<Vec<ServerText>, ServerText>(
        "SELECT p.owner_key_columns, p.owner_token_column::pg_catalog.text FROM lease.protected p
          WHERE p.owner_table::pg_catalog.oid OPERATOR(pg_catalog.=) $1 LIMIT 1",
        &[owner.into()],
    )
    .unwrap_or_else(|e| error!("pg_lease: reading the owner binding: {e}"));
    let (Some(keys), Some(ServerText(token))) = (keys, token) else {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("pg_lease: {} is not the owner table of any table protected with lease.protect", display(owner))
        );
    };
    let keys = keys
        .into_iter()
        .map(|ServerText(name)| {
            let (_, typid) = attribute(owner, &name).unwrap_or_else(|| {
                error!("pg_lease: owner key column \"{name}\" of {} does not exist", display(owner))
            });
            (name, typid)
        })
        .collect();
    (keys, token)
}

/// The key values (text, as `lease.acquire` receives them) as datums of the
/// key columns' types, through each type's input function.
fn key_datums(keys: &[(String, pg_sys::Oid)], key: &[Option<String>]) -> Vec<(pg_sys::Datum, pg_sys::Oid)> {
    if key.len() != keys.len() || key.iter().any(Option::is_none) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("pg_lease: owner_key needs {} non-NULL values", keys.len())
        );
    }
    keys.iter()
        .zip(key)
        .map(|((_, typid), value)| {
            // Text from SQL never holds NUL.
            let text = CString::new(to_server(value.as_deref().unwrap_or_default())).expect("SQL text has no NUL");
            // SAFETY: getTypeInputInfo is a syscache lookup of the key
            // column's type writing into live locals; OidInputFunctionCall
            // runs that type's own input function on `text`, a NUL-terminated
            // string alive until the end of this closure (input functions
            // read it, never write, despite the *mut), and returns a datum
            // palloc'd in the current memory context (or raises).
            unsafe {
                let (mut input, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
                pg_sys::getTypeInputInfo(*typid, &mut input, &mut ioparam);
                (pg_sys::OidInputFunctionCall(input, text.as_ptr() as *mut _, ioparam, -1), *typid)
            }
        })
        .collect()
}

/// SPI arguments over datums made by [`key_datums`] in this call.
fn args(datums: &[(pg_sys::Datum, pg_sys::Oid)]) -> Vec<DatumWithOid<'static>> {
    // SAFETY: each datum is a value of `typid` made by that type's input
    // function in key_datums, palloc'd in the current memory context (or by
    // value), which outlives the SPI statements they are passed to within
    // the same call; 'static only says nothing in Rust borrows them.
    datums.iter().map(|&(d, typid)| unsafe { DatumWithOid::new(d, typid) }).collect()
}

fn key_columns(keys: &[(String, pg_sys::Oid)]) -> Vec<&str> {
    keys.iter().map(|(name, _)| name.as_str()).collect()
}

/// `lease._lock_owner_row(owner_table, owner_key)`: `SELECT token ... FOR
/// UPDATE` on the owner row (waiting for writers still fenced under the old
/// token). An empty array: no such row; else its token (maybe NULL).
#[pg_extern(name = "_lock_owner_row", volatile, parallel_unsafe)]
pub fn lock_owner_row(owner_table: pg_sys::Oid, owner_key: Vec<Option<ServerText>>) -> Vec<Option<i64>> {
    lock_owner_row_of(owner_table, &texts(owner_key))
}

/// An owner key (text[]) as Rust text.
pub fn texts(key: Vec<Option<ServerText>>) -> Vec<Option<String>> {
    key.into_iter().map(|k| k.map(|k| k.0)).collect()
}

/// [`lock_owner_row`], for Rust callers.
pub fn lock_owner_row_of(owner_table: pg_sys::Oid, owner_key: &[Option<String>]) -> Vec<Option<i64>> {
    let (keys, token) = binding(owner_table);
    as_table_owner(owner_table, || {
        let args = args(&key_datums(&keys, owner_key));
        let sql = format!(
            "SELECT o.{}::pg_catalog.int8 FROM {} o WHERE {} FOR UPDATE OF o",
            quote_ident(&token),
            sql_name(owner_table),
            key_match(&key_columns(&keys))
        );
        Spi::connect_mut(|client| {
            let rows = client.update(&server_cstring(&sql), Some(1), &args).unwrap_or_else(|e| error!("pg_lease: {e}"));
            if rows.is_empty() {
                vec![]
            } else {
                vec![rows.first().get_one::<i64>().unwrap_or_else(|e| error!("pg_lease: {e}"))]
            }
        })
    })
}

/// Whether `caller` may see owner row `key` of `owner_table` where
/// row-level security applies to it: the owner row is read and written as
/// the table's owner, so a row its policies hide from `caller` must count as
/// missing for it (binding a lease there would fence that row's writers).
/// Some(true) without row-level security for `caller` (no query then); None
/// when `caller` may not SELECT the key columns, so that its policies cannot
/// be asked. The query runs as `caller`.
pub fn visible_to(caller: pg_sys::Oid, owner_table: pg_sys::Oid, key: &[Option<String>]) -> Option<bool> {
    // SAFETY: a catalog check of the table's RLS flags for `caller`; with
    // noError it never raises.
    let rls = unsafe { pg_sys::check_enable_rls(owner_table, caller, true) };
    if rls != pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32 {
        return Some(true);
    }
    let (keys, _) = binding(owner_table);
    let select = pg_sys::ACL_SELECT as pg_sys::AclMode;
    // SAFETY: privilege lookups of `caller` on an existing table and its
    // existing key columns (binding found them).
    let may_select = unsafe {
        pg_sys::pg_class_aclcheck(owner_table, caller, select) == pg_sys::AclResult::ACLCHECK_OK
            || keys.iter().all(|(name, _)| {
                attribute(owner_table, name).is_some_and(|(attnum, _)| {
                    pg_sys::pg_attribute_aclcheck(owner_table, attnum, caller, select) == pg_sys::AclResult::ACLCHECK_OK
                })
            })
    };
    if !may_select {
        return None;
    }
    let datums = key_datums(&keys, key);
    let sql =
        format!("SELECT EXISTS (SELECT FROM {} o WHERE {})", sql_name(owner_table), key_match(&key_columns(&keys)));
    Some(crate::pg::as_caller(caller, || exists(&sql, &datums)))
}

/// Whether `sql` (`SELECT EXISTS ...` over key datums made by [`key_datums`])
/// is true.
fn exists(sql: &str, datums: &[(pg_sys::Datum, pg_sys::Oid)]) -> bool {
    Spi::connect(|client| {
        client
            .select(&server_cstring(sql), Some(1), &args(datums))
            .and_then(|rows| rows.first().get_one::<bool>())
            .unwrap_or_else(|e| error!("pg_lease: {e}"))
            == Some(true)
    })
}

/// Whether owner keys `a` and `b` (text, as `lease.acquire` receives them)
/// name the same row of `owner_table`: a row matches both, by the key
/// columns' own `=` as the owner lookup compares (`'07'` and `'7'` are one
/// integer key), read as the owner table's owner.
pub fn same_owner_row(owner_table: pg_sys::Oid, a: &[Option<String>], b: &[Option<String>]) -> bool {
    if a == b {
        return true;
    }
    let (keys, _) = binding(owner_table);
    as_table_owner(owner_table, || {
        let mut datums = key_datums(&keys, a);
        datums.extend(key_datums(&keys, b));
        let n = keys.len();
        let second = keys
            .iter()
            .enumerate()
            .map(|(i, (name, _))| format!("o.{} OPERATOR(pg_catalog.=) ${}", quote_ident(name), n + i + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        let sql = format!(
            "SELECT EXISTS (SELECT FROM {} o WHERE {} AND {})",
            sql_name(owner_table),
            key_match(&key_columns(&keys)),
            second
        );
        exists(&sql, &datums)
    })
}

/// `lease._set_owner_token(owner_table, owner_key, token)`: writes the new
/// token into the owner row; returns the token the row holds afterwards, or
/// NULL if no row was written (a trigger or rule swallowed the UPDATE).
#[pg_extern(name = "_set_owner_token", volatile, parallel_unsafe)]
pub fn set_owner_token(owner_table: pg_sys::Oid, owner_key: Vec<Option<ServerText>>, token: i64) -> Option<i64> {
    set_owner_token_of(owner_table, &texts(owner_key), token)
}

/// [`set_owner_token`], for Rust callers.
pub fn set_owner_token_of(owner_table: pg_sys::Oid, owner_key: &[Option<String>], token: i64) -> Option<i64> {
    let (keys, column) = binding(owner_table);
    as_table_owner(owner_table, || {
        let datums = key_datums(&keys, owner_key);
        let mut update_args = args(&datums);
        update_args.push(token.into());
        // No RETURNING: Postgres refuses it on a table with a DO INSTEAD rule,
        // which must read as "the bump did not land", not as an error.
        let update = format!(
            "UPDATE {} o SET {} = ${} WHERE {}",
            sql_name(owner_table),
            quote_ident(&column),
            keys.len() + 1,
            key_match(&key_columns(&keys))
        );
        let read = format!(
            "SELECT o.{}::pg_catalog.int8 FROM {} o WHERE {}",
            quote_ident(&column),
            sql_name(owner_table),
            key_match(&key_columns(&keys))
        );
        Spi::connect_mut(|client| {
            let written =
                client.update(&server_cstring(&update), None, &update_args).unwrap_or_else(|e| error!("pg_lease: {e}"));
            if written.len() != 1 {
                return None;
            }
            let rows =
                client.update(&server_cstring(&read), None, &args(&datums)).unwrap_or_else(|e| error!("pg_lease: {e}"));
            if rows.is_empty() {
                None
            } else {
                rows.first().get_one::<i64>().unwrap_or_else(|e| error!("pg_lease: {e}"))
            }
        })
    })
}
