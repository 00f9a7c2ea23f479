//! Owner mode's lookups: the owner row's current token, locked `FOR SHARE`
//! (the verdict) or peeked at without a lock (a refusal's DETAIL).

use crate::fence::config::{self, FenceConfig, OwnerLookup, TokenSource};
use crate::fence::{key, replication};
use crate::pg::{as_role, run_token_plan, token_from_datum, Probe, Row, TriggerCall, TriggerOp};
use pgrx::pg_sys;

/// `SELECT token ... FOR SHARE` on the owner row, as the owner table's owner.
/// None: no owner row. Some(None): the owner row's token is NULL.
///
/// Through the owner key's unique index when there is one (no SPI, no
/// planner, no executor: the same row, lock and errors, see
/// `pg::UniqueIndex::lock_share`), else through the saved plan.
pub fn lock(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<Option<i64>> {
    if let Some(index) = &owner.index {
        let args = key::args(cfg, row);
        // SAFETY: `args` are the row's non-NULL key datums (the caller
        // checked them), of the key columns' types, the argument types the
        // index was found for (config::prepare_owner_lookup); owner.token is
        // the owner table's integer token column; this runs as the owner
        // table's owner, as the saved plan does.
        let probe =
            as_role(owner.rel_owner, || unsafe { index.lock_share(&args, owner.token, || config::is_current(cfg)) });
        match probe {
            Probe::Found(token) => return Some(token),
            Probe::Missing => return None,
            // An invalidation arrived with the lock: the saved plan
            // revalidates itself (and the next row rebuilds the config).
            Probe::Stale => {}
        }
    }
    // SAFETY: the saved plan takes the key columns' types, in key order,
    // which key::args gives (the row's key datums, valid while the row is),
    // and returns (token, tableoid) with the token column checked to be an
    // integer (config::prepare_owner_lookup).
    let (found, tableoid) = unsafe { run_token_plan(owner.plan, &mut key::args(cfg, row), owner.rel_owner) };
    // The saved plan names the owner table by its schema-qualified name, and
    // Postgres re-parses that text when it revalidates the plan: after a
    // schema or table rename it could find a look-alike table. Only rows of
    // the owner table itself count.
    if found.is_some() && !owner.tables.contains(&tableoid) {
        config::forget_all();
        pgrx::ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!("pg_lease: the owner table of {} changed while this session was using it", cfg.display),
            format!("The owner lookup found a row of relation {} instead of {}.", tableoid.to_u32(), owner.display)
        );
    }
    found
}

/// The owner row's token as this statement's snapshot sees it, without a
/// lock; None also when the row is missing or not of the owner table.
pub fn peek(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<i64> {
    peek_row(cfg, owner, row).flatten()
}

/// As [`peek`], telling a missing owner row (None) from one without a token
/// (Some(None)).
fn peek_row(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<Option<i64>> {
    // SAFETY: as in `lock`, for the unlocked twin of the plan.
    let (found, tableoid) = unsafe { run_token_plan(owner.peek, &mut key::args(cfg, row), owner.rel_owner) };
    found.filter(|_| owner.tables.contains(&tableoid))
}

/// A trusted subscription applies the row of `call` (an INSERT, or an
/// UPDATE's new row) to an owner-mode table fenced by a token column,
/// unjudged here: its publisher's fence accepted it at the token it carries,
/// so the publisher's owner row held that token. Where this node's owner row
/// holds a lower token or none, the change that raised it did not arrive
/// (`ALTER SUBSCRIPTION ... SKIP` of the transaction that carried it, a row
/// filter or column list on the owner table): the row is raised to the token
/// now, as that change would have raised it, and the raise is logged. Tokens
/// only rise; a missing owner row is left missing.
///
/// Costs the unlocked owner lookup per such row (the saved plan); the UPDATE
/// only when the row is behind. Not during a table's initial copy, whose rows
/// are the publisher's history, not its present.
pub fn catch_up(cfg: &FenceConfig, owner: &OwnerLookup, call: &TriggerCall) {
    let TokenSource::Column { attnum, typid } = cfg.token else { return };
    let row = match call.op() {
        TriggerOp::Insert => call.trigtuple(),
        TriggerOp::Update => call.newtuple(),
        _ => None,
    };
    let Some(row) = row else { return };
    let Some(token) = row.attr(attnum).map(|d| token_from_datum(d, typid)) else { return };
    if replication::initial_copy() || cfg.keys.iter().any(|k| row.attr(k.attnum).is_none()) {
        return;
    }
    let Some(current) = peek_row(cfg, owner, row) else { return };
    if current.is_some_and(|c| c >= token) {
        return;
    }
    let keys: Vec<(&str, i16, pg_sys::Oid)> =
        owner.key_names.iter().zip(&cfg.keys).map(|(name, k)| (name.as_str(), k.attnum, k.typid)).collect();
    if crate::pg::raise_token_to(owner.relid, &owner.token_name, &keys, row, (attnum, typid)) {
        let resource = key::describe_resource(cfg, row);
        replication::log_kept(
            &format!(
                "applied a write to {} for resource {resource} at fencing token {token}, above owner row's token {} in {}",
                cfg.display,
                current.map_or_else(|| "NULL".to_owned(), |c| c.to_string()),
                owner.display
            ),
            &format!("the owner row is raised to {token} (the change that raised it on the publisher did not arrive here)"),
        );
    }
}
