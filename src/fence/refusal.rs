//! The refusals the fence and its guards raise: message, DETAIL and the
//! facts the audit records, built in one place.

use crate::audit;
use crate::errors::{Facts, LeaseError, Refusal};
use crate::fence::config::{FenceConfig, Mode, TokenSource};
use crate::fence::{key, replication};
use crate::pg::{display, owned, quote_ident, shown_relation_names, Row, TriggerOp};
use pgrx::pg_sys;

/// A token as messages print it.
pub fn show(token: Option<i64>) -> String {
    token.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// The audit's facts of a refused operation on `relid`; `row` (the refused
/// row, if any) becomes `row_data` when `pg_lease.audit_row` is on.
pub fn facts(
    relid: pg_sys::Oid,
    table: &str,
    op: TriggerOp,
    resource: String,
    presented: Option<i64>,
    current: Option<i64>,
    row: Option<Row>,
) -> Facts {
    Facts {
        relid,
        table: table.to_owned(),
        operation: op.as_str(),
        resource,
        presented,
        current,
        row_json: row.and_then(audit::row_json),
    }
}

/// A refusal on relation `relid` with the audit's facts.
pub fn on_relation(error: LeaseError, relid: pg_sys::Oid, summary: String, detail: String, facts: Facts) -> Refusal {
    let (schema, table) = shown_relation_names(relid);
    Refusal::new(error, summary, detail).on_table(&schema, &table).audited(facts)
}

/// The fence's refusal of `row`, with the DETAIL every LF error carries.
pub fn of_row(
    error: LeaseError,
    cfg: &FenceConfig,
    row: Row,
    op: TriggerOp,
    presented: Option<i64>,
    current: Option<i64>,
) -> Refusal {
    let key = key::describe_resource(cfg, row);
    let (op_name, table) = (op.as_str(), &cfg.display);
    let summary = match error {
        LeaseError::StaleOwnerBoundaryWrite => format!(
            "{op_name} on {table} for resource {key} presents fencing token {} but the current token is {}",
            show(presented),
            show(current)
        ),
        LeaseError::FencingTokenAhead if current.is_none() => format!(
            "{op_name} on {table} for resource {key} presents fencing token {}, but no token has been issued for this resource",
            show(presented)
        ),
        LeaseError::FencingTokenAhead => format!(
            "{op_name} on {table} for resource {key} presents fencing token {}, ahead of the current token {}",
            show(presented),
            show(current)
        ),
        LeaseError::MissingFencingToken => {
            format!("{op_name} on {table} for resource {key} presents no fencing token")
        }
        LeaseError::FenceOwnerMissing => format!("{op_name} on {table} for resource {key} has no owner row"),
        other => format!("{op_name} on {table} refused ({})", other.name()),
    };
    let source = match &cfg.mode {
        Mode::Owner(owner) => format!("owner row in {}", owner.display),
        Mode::HighWater => "high-water mark".to_owned(),
    };
    let detail = format!(
        "Table {table}, resource {key}, presented token {}, current token {} ({source}).",
        show(presented),
        show(current)
    );
    let hint = hint(error, cfg, op, current);
    let facts = facts(cfg.protected_relid, table, op, key, presented, current, Some(row));
    let refusal = Refusal::new(error, summary, detail).on_table(&cfg.schema, &cfg.table).audited(facts);
    match hint {
        Some(hint) => refusal.with_hint(hint),
        None => refusal,
    }
}

/// The SKIP way out of a refused replicated change, where it applies: not to
/// a table's initial copy, which ALTER SUBSCRIPTION ... SKIP cannot skip.
fn skip(subscription: &str) -> String {
    let sub = quote_ident(subscription);
    let drops = "it drops the whole remote transaction, owner-token raises in it too: compare the owner tables' tokens with the publisher's after";
    if replication::initial_copy() {
        String::new()
    } else if replication::parallel_apply() {
        format!(
            "skip the transaction (a parallel apply worker's error does not give its LSN: ALTER SUBSCRIPTION {sub} SET (streaming = on) first, then ALTER SUBSCRIPTION {sub} SKIP (lsn = ...) with the LSN in the retried error's CONTEXT; {drops}), "
        )
    } else {
        format!("skip the transaction (ALTER SUBSCRIPTION {sub} SKIP (lsn = ...), the LSN is in this error's CONTEXT; {drops}), ")
    }
}

/// The HINT of a refusal in the logical replication worker of `sub`: whose
/// change it is, why it was judged here, and the way out (nothing may get
/// stuck silently; lease.audit_status() shows it too). `table`: the
/// protected table concerned, when the refusal is about one (`high_water`:
/// in that mode, judging replicated changes by default).
pub fn replication_hint(sub: &replication::Subscription, table: Option<(&str, bool)>) -> String {
    let name = &sub.name;
    let skip = skip(name);
    let (why, way_out) = if !replication::applying() {
        (
            "this write was made by code running inside the worker (a trigger or a default of a replicated table), not by a replicated change, so it is judged".to_owned(),
            "remove or fix that code on the subscriber".to_owned(),
        )
    } else if let Some(trigger) = replication::last_rewriting_trigger() {
        (
            format!("trigger {} fires in the worker before pg_lease's and could rewrite the replicated row, so the row is judged", quote_ident(&trigger)),
            format!("let that trigger fire on the origin only (ALTER TABLE ... ENABLE TRIGGER {}), {skip}or rename it to sort after pg_lease's triggers where it need not change the row", quote_ident(&trigger)),
        )
    } else if !sub.trusted {
        (
            format!(
                "subscription \"{name}\" is owned by {}, neither a superuser nor a role named in pg_lease.trusted_subscription_owners, so its changes are judged here",
                quote_ident(&sub.owner)
            ),
            format!("give the subscription a trusted owner (a superuser, or a role the DBA names in pg_lease.trusted_subscription_owners), {skip}or lease.unprotect the table while it syncs"),
        )
    } else {
        match table {
            Some((table, true)) => (
                format!("{table} is a high-water table, which judges replicated changes too (or is set to: lease.judge_replicated)"),
                format!("{skip}or take this table's replicated changes as judged at their origin, its marks still rising (lease.judge_replicated('{table}', false))"),
            ),
            Some((table, false)) => (
                format!("{table} is set to judge replicated changes (lease.judge_replicated)"),
                format!("{skip}trust this table's replicated changes (lease.judge_replicated('{table}', false)), or lease.unprotect the table while it syncs"),
            ),
            None => (
                "a table fenced against this one is set to judge replicated changes (lease.judge_replicated)".to_owned(),
                format!("{skip}or trust those tables' replicated changes (lease.judge_replicated(..., false))"),
            ),
        }
    };
    worker_hint(name, &why, &way_out)
}

/// The HINT of a replicated TRUNCATE of owner table `table`, refused from
/// every subscription (trusted or not): it would erase this node's tokens.
pub fn owner_truncate_hint(sub: &replication::Subscription, table: &str) -> String {
    worker_hint(
        &sub.name,
        "this node's owner tokens are never taken away by replication",
        &format!(
            "{}and publish {table} without truncate (ALTER PUBLICATION ... SET (publish = 'insert, update, delete'))",
            skip(&sub.name)
        ),
    )
}

/// A refusal's HINT in the logical replication worker of subscription
/// `name`: why its change was refused here, and the way out.
fn worker_hint(name: &str, why: &str, way_out: &str) -> String {
    format!("Applied by logical replication subscription \"{name}\": {why}. The worker retries until the write goes through: {way_out}.")
}

/// A refusal raised in a logical replication worker: its subscription is
/// noted for lease.audit_status() (replication::note), and the refusal names
/// it and the way out, whatever refused it (the fence's row refusals already
/// do, with the table's own ways out; the guards' do not).
pub fn in_replication_worker(refusal: &mut Refusal) {
    let Some(sub) = replication::subscription() else { return };
    replication::note(&sub);
    if !refusal.hint.as_deref().is_some_and(|h| h.starts_with("Applied by logical replication")) {
        refusal.hint = Some(replication_hint(&sub, None).into_boxed_str());
    }
}

/// A hint for this table and case where the error's general one would
/// mislead: whose replicated change it is, which way this table takes
/// tokens, or that a resource never had one.
fn hint(error: LeaseError, cfg: &FenceConfig, op: TriggerOp, current: Option<i64>) -> Option<String> {
    if let Some(sub) = replication::subscription() {
        let protected =
            if cfg.protected_relid == cfg.relid { cfg.display.clone() } else { display(cfg.protected_relid) };
        return Some(replication_hint(&sub, Some((&protected, cfg.is_high_water()))));
    }
    match (error, &cfg.token) {
        (LeaseError::MissingFencingToken, TokenSource::Column { attnum, .. }) if op != TriggerOp::Delete => {
            // SAFETY: a syscache lookup of a column of an open relation;
            // missing_ok, so a concurrently dropped column gives NULL.
            let column = unsafe { owned(pg_sys::get_attname(cfg.relid, *attnum, true)) };
            Some(format!(
                "Stamp the writer's fencing token into column {} of every row written to {}.",
                quote_ident(&column),
                cfg.display
            ))
        }
        (LeaseError::MissingFencingToken, _) => Some(format!(
            "{} takes the writer's token from the transaction: call lease.bind_token(token) (or SET LOCAL pg_lease.token) in the same transaction, before the {}.",
            cfg.display,
            op.as_str()
        )),
        (LeaseError::FencingTokenAhead, _) if current.is_none() => Some(match &cfg.mode {
            Mode::Owner(owner) => format!(
                "The owner row in {} carries no token yet: acquire the lease with lease.acquire(..., owner_table => '{}', owner_key => ...) so that it records one, and write with the token it returns.",
                owner.display, owner.display
            ),
            Mode::HighWater => "No token has been accepted for this resource yet.".to_owned(),
        }),
        _ => None,
    }
}
