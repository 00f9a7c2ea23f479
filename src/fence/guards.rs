//! Triggers that keep the fence's inputs honest: owner tokens only rise, and
//! TRUNCATE (which fires no row trigger) cannot bypass the fence.

use crate::audit::AuditFacts;
use crate::errors::{LeaseError, Refusal};
use crate::fence::pg::{
    attcollation, attribute, datum_text, display, qualified_name, relation_names, token_from_datum,
};
use crate::fence::trigger::{show, trigger_args, trigger_data, Row};
use crate::fence::{config, identity, verified};
use crate::lease::MAX_TOKEN;
use pgrx::pg_sys;

fn attnum_of(relid: pg_sys::Oid, name: &str) -> (i16, pg_sys::Oid) {
    attribute(relid, name).unwrap_or_else(|| pgrx::error!("pg_lease: owner guard column \"{name}\" does not exist"))
}

/// `lease.owner_guard(token_column, key_column...)`: BEFORE INSERT OR UPDATE
/// OR DELETE FOR EACH ROW on an owner table. An owner row's token only rises
/// and never passes [`MAX_TOKEN`]; a row that carries a token keeps its key
/// (by the key type's equality) and is never deleted, since either would let
/// the resource's token start over (LF004).
pub unsafe fn owner_guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let td = trigger_data(fcinfo, "lease.owner_guard");
    let op = td.tg_event & pg_sys::TRIGGER_EVENT_OPMASK;
    if td.tg_event & pg_sys::TRIGGER_EVENT_ROW == 0
        || td.tg_event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_BEFORE
    {
        pgrx::error!("lease.owner_guard() must be a BEFORE ... FOR EACH ROW trigger");
    }
    let rel = &*td.tg_relation;
    if !config::is_owner_table(rel.rd_id) {
        not_protected("lease.owner_guard", rel.rd_id);
    }
    let args = trigger_args(td);
    let Some((token_column, key_columns)) = args.split_first() else {
        pgrx::error!("lease.owner_guard() needs the token column as its first argument");
    };
    let (attnum, typid) = attnum_of(rel.rd_id, token_column);
    let old = Row::new(td.tg_trigtuple, rel.rd_att);
    let token_of = |row: Row| row.attr(attnum).map(|d| token_from_datum(d, typid));

    let (before, after, new) = match op {
        pg_sys::TRIGGER_EVENT_INSERT => (None, token_of(old), Some(old)),
        pg_sys::TRIGGER_EVENT_UPDATE => {
            let new = Row::new(td.tg_newtuple, rel.rd_att);
            (token_of(old), token_of(new), Some(new))
        }
        _ => (token_of(old), None, None),
    };
    let result = match op {
        pg_sys::TRIGGER_EVENT_UPDATE => pg_sys::Datum::from(td.tg_newtuple),
        _ => pg_sys::Datum::from(td.tg_trigtuple),
    };

    // SAFETY: reads the current user's superuser flag.
    if let Some(a) = after.filter(|&a| a > MAX_TOKEN && !pg_sys::superuser()) {
        pgrx::ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("pg_lease: fencing token {a} is out of range for owner table {}", display(rel.rd_id)),
            format!(
                "Owner tokens set by hand stop at {MAX_TOKEN}, so that lease.acquire can always issue a higher one."
            )
        );
    }
    let Some(b) = before else {
        return Ok(result);
    };
    let regression = match (op, new) {
        (pg_sys::TRIGGER_EVENT_DELETE, _) => Some(format!("would be deleted with its fencing token {b}")),
        (_, Some(_)) if after.is_none_or(|a| a < b) => {
            Some(format!("would lower its fencing token from {b} to {}", show(after)))
        }
        (_, Some(new)) if !same_key(rel.rd_id, old, new, key_columns) => {
            Some(format!("would move its fencing token {b} to key {}", describe_owner_key(rel.rd_id, new, key_columns)))
        }
        _ => None,
    };
    if let Some(what) = regression {
        let (schema, table) = relation_names(rel.rd_id);
        let display = qualified_name(&schema, &table);
        let key = describe_owner_key(rel.rd_id, old, key_columns);
        let operation = if op == pg_sys::TRIGGER_EVENT_DELETE { "DELETE" } else { "UPDATE" };
        let facts = AuditFacts {
            stats: None,
            relid: rel.rd_id,
            table: display.clone(),
            operation,
            resource: key.clone(),
            presented: after,
            current: Some(b),
            row_json: crate::audit::row_json(new.map_or(td.tg_trigtuple, |_| td.tg_newtuple), rel.rd_att),
        };
        return Err(Refusal::new(
            LeaseError::FencingTokenRegression,
            format!("owner row {key} of {display} {what}"),
            format!(
                "Table {display}, owner row {key}, column \"{token_column}\": current token {b}, new token {}.",
                show(after)
            ),
        )
        .on_table(&schema, &table)
        .audited(facts));
    }
    if before != after {
        // This transaction now owns a new token: whatever it verified before
        // must be verified again against it.
        verified::forget_all();
    }
    Ok(result)
}

/// A guard fired on a relation pg_lease does not guard: refuse plainly (and
/// record nothing), so no role can forge audit records through it.
fn not_protected(function: &str, relid: pg_sys::Oid) -> ! {
    pgrx::ereport!(
        ERROR,
        pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("pg_lease: {function}() fired on {}, which pg_lease does not guard", display(relid)),
        "pg_lease's trigger functions only run on the tables lease.protect() set them up on."
    );
}

/// Whether `old` and `new` have the same owner key, by each key type's equality.
unsafe fn same_key(relid: pg_sys::Oid, old: Row, new: Row, key_columns: &[String]) -> bool {
    key_columns.iter().all(|name| {
        let (attnum, typid) = attnum_of(relid, name);
        match (old.attr(attnum), new.attr(attnum)) {
            (None, None) => true,
            (Some(a), Some(b)) => identity::equal(a, b, typid, attcollation(relid, attnum)),
            _ => false,
        }
    })
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
    let owner = trigger_args(td).first().map(String::as_str) == Some("owner");
    let guarded = if owner { config::is_owner_table(rel.rd_id) } else { config::for_relation(rel.rd_id).is_ok() };
    if !guarded {
        not_protected("lease.truncate_guard", rel.rd_id);
    }
    let (schema, table) = relation_names(rel.rd_id);
    let display = qualified_name(&schema, &table);
    let refusal = if owner {
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
