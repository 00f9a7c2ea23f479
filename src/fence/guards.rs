//! Triggers that keep the fence's inputs honest: owner tokens only rise, and
//! TRUNCATE (which fires no row trigger) cannot bypass the fence.

use crate::audit::AuditFacts;
use crate::errors::{LeaseError, Refusal};
use crate::fence::pg::{datum_text, qualified_name, relation_names, token_from_datum};
use crate::fence::trigger::{show, trigger_args, trigger_data, Row};
use crate::fence::verified;
use pgrx::pg_sys;
use std::ffi::CString;

unsafe fn attnum_of(relid: pg_sys::Oid, name: &str) -> (i16, pg_sys::Oid) {
    let cname = CString::new(name).expect("no NUL in column names");
    let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
    if attnum <= 0 {
        pgrx::error!("pg_lease: owner guard column \"{name}\" does not exist");
    }
    (attnum, pg_sys::get_atttype(relid, attnum))
}

/// `lease.owner_guard(token_column, key_column...)`: BEFORE UPDATE FOR EACH ROW
/// on an owner table.
pub unsafe fn owner_guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let td = trigger_data(fcinfo, "lease.owner_guard");
    if td.tg_event & pg_sys::TRIGGER_EVENT_OPMASK != pg_sys::TRIGGER_EVENT_UPDATE
        || td.tg_event & pg_sys::TRIGGER_EVENT_ROW == 0
    {
        pgrx::error!("lease.owner_guard() must be a BEFORE UPDATE ... FOR EACH ROW trigger");
    }
    let args = trigger_args(td);
    let Some((token_column, key_columns)) = args.split_first() else {
        pgrx::error!("lease.owner_guard() needs the token column as its first argument");
    };
    let rel = &*td.tg_relation;
    let (attnum, typid) = attnum_of(rel.rd_id, token_column);
    let old = Row::new(td.tg_trigtuple, rel.rd_att);
    let new = Row::new(td.tg_newtuple, rel.rd_att);
    let before = old.attr(attnum).map(|d| token_from_datum(d, typid));
    let after = new.attr(attnum).map(|d| token_from_datum(d, typid));

    if let Some(b) = before {
        if after.is_none_or(|a| a < b) {
            let (schema, table) = relation_names(rel.rd_id);
            let display = qualified_name(&schema, &table);
            let key = describe_owner_key(rel.rd_id, old, key_columns);
            let facts = AuditFacts {
                stats: None,
                relid: rel.rd_id,
                table: display.clone(),
                operation: "UPDATE",
                resource: key.clone(),
                presented: after,
                current: Some(b),
                row_json: crate::audit::row_json(td.tg_newtuple, rel.rd_att),
            };
            return Err(Refusal::new(
                LeaseError::FencingTokenRegression,
                format!("owner row {key} of {display} would lower its fencing token from {b} to {}", show(after)),
                format!(
                    "Table {display}, owner row {key}, column \"{token_column}\": current token {b}, new token {}.",
                    show(after)
                ),
            )
            .on_table(&schema, &table)
            .audited(facts));
        }
    }
    if before != after {
        // This transaction now owns a new token: whatever it verified before
        // must be verified again against it.
        verified::forget_all();
    }
    Ok(pg_sys::Datum::from(td.tg_newtuple))
}

unsafe fn describe_owner_key(relid: pg_sys::Oid, row: Row, key_columns: &[String]) -> String {
    let values: Vec<String> = key_columns
        .iter()
        .map(|name| {
            let (attnum, typid) = attnum_of(relid, name);
            row.attr(attnum).map_or_else(|| "NULL".to_owned(), |d| datum_text(d, typid))
        })
        .collect();
    format!("({})=({})", key_columns.join(", "), values.join(", "))
}

/// `lease.truncate_guard('target' | 'owner')`: BEFORE TRUNCATE FOR EACH STATEMENT.
pub unsafe fn truncate_guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let td = trigger_data(fcinfo, "lease.truncate_guard");
    let rel = &*td.tg_relation;
    let (schema, table) = relation_names(rel.rd_id);
    let display = qualified_name(&schema, &table);
    let refusal = if trigger_args(td).first().map(String::as_str) == Some("owner") {
        Refusal::new(
            LeaseError::FencingTokenRegression,
            format!("TRUNCATE of owner table {display} would erase its fencing tokens"),
            format!("Table {display} holds the current fencing tokens of fenced resources; TRUNCATE would let tokens start over."),
        )
    } else {
        Refusal::new(
            LeaseError::FenceTampering,
            format!("TRUNCATE of fenced table {display} bypasses the fence"),
            format!("Table {display} is protected by pg_lease; TRUNCATE fires no row trigger, so no fencing token could be checked. Delete rows with a bound token, or call lease.unprotect first."),
        )
    };
    let facts = AuditFacts {
        stats: None,
        relid: rel.rd_id,
        table: display,
        operation: "TRUNCATE",
        resource: String::new(),
        presented: None,
        current: None,
        row_json: None,
    };
    Err(refusal.on_table(&schema, &table).audited(facts))
}
