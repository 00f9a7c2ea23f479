//! Owner mode's lookups: the owner row's current token, locked `FOR SHARE`
//! (the verdict) or peeked at without a lock (a refusal's DETAIL).

use crate::fence::config::{self, FenceConfig, OwnerLookup, TokenSource};
use crate::fence::{key, replication, verified};
use crate::pg::{as_role, run_token_plan, token_from_datum, Access, Probe, Row, TriggerCall, TriggerOp};
use pgrx::pg_sys;

/// `SELECT token ... FOR SHARE` on the owner row, as the owner table's owner.
/// None: no owner row. Some(None): the owner row's token is NULL.
pub fn lock(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<Option<i64>> {
    lookup(cfg, owner, row, Access::LockShare)
}

/// The owner row's token under the latest snapshot, without a lock; None
/// also when the row is missing.
pub fn peek(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<i64> {
    lookup(cfg, owner, row, Access::Read).flatten()
}

/// The owner row's token, read as `access` says, as the owner table's owner.
/// None: no owner row. Some(None): the owner row's token is NULL.
///
/// Through the owner key's unique index when there is one (no SPI, no
/// planner, no executor: the same row, lock and errors, see
/// `pg::UniqueIndex::probe`), else through the saved plan (`plan` or
/// `peek`).
fn lookup(cfg: &FenceConfig, owner: &OwnerLookup, row: Row, access: Access) -> Option<Option<i64>> {
    let mut args = key::args(cfg, row);
    if let Some(index) = &owner.index {
        // SAFETY: `args` are the row's non-NULL key datums (the caller
        // checked them), of the key columns' types, the argument types the
        // index was found for (config::prepare_owner_lookup); owner.token is
        // the owner table's integer token column; this runs as the owner
        // table's owner, as the saved plan does.
        let probe =
            as_role(owner.rel_owner, || unsafe { index.probe(&args, owner.token, access, || config::is_current(cfg)) });
        match probe {
            Probe::Found(token) => return Some(token),
            Probe::Missing => return None,
            // An invalidation arrived with the lock: the saved plan
            // revalidates itself (and the next row rebuilds the config).
            Probe::Stale => {}
        }
    }
    let plan = match access {
        Access::LockShare => owner.plan,
        Access::Read => owner.peek,
    };
    // SAFETY: both saved plans take the key columns' types, in key order,
    // which key::args gives (the row's key datums, valid while the row is),
    // and return (token, tableoid) with the token column checked to be an
    // integer (config::prepare_owner_lookup).
    let (found, tableoid) = unsafe { run_token_plan(plan, &mut args, owner.rel_owner, access) };
    // The saved plans name the owner table by its schema-qualified name, and
    // Postgres re-parses that text when it revalidates a plan: after a
    // schema or table rename it could find a look-alike table. Only rows of
    // the owner table itself (or of a partition in its tree) count: a
    // verdict taken from another table is a serialization failure, a peek at
    // one finds nothing.
    if found.is_some() && !owner.holds(tableoid) {
        if let Access::Read = access {
            return None;
        }
        config::forget_all();
        crate::pg::serialization_failure(
            format!("pg_lease: the owner table of {} changed while this session was using it", cfg.display),
            &format!("The owner lookup found a row of relation {} instead of {}.", tableoid.to_u32(), owner.display),
        );
    }
    found
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
/// Costs the unlocked owner lookup per such row (an index probe where
/// the owner key has a unique index, else the saved plan); the UPDATE
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
    if replication::initial_copy() {
        return;
    }
    // Tokens only rise: an owner row this transaction saw at or above the
    // token (or raised to it) still is (an abort of the subtransaction that
    // raised it drops what it remembered). A row with a NULL key column has
    // no resource (no key): nothing to raise.
    let unseen = |key: &&[u8]| verified::seen(key).is_none_or(|seen| seen < token);
    let Some(key) = key::with_encoded(cfg, row, |key| key.filter(unseen).map(Box::<[u8]>::from)) else { return };
    let Some(current) = lookup(cfg, owner, row, Access::Read) else { return };
    if let Some(c) = current.filter(|&c| c >= token) {
        verified::saw(&key, c);
        return;
    }
    let keys: Vec<(&str, i16, pg_sys::Oid)> =
        owner.key_names.iter().zip(&cfg.keys).map(|(name, k)| (name.as_str(), k.attnum, k.typid)).collect();
    if crate::pg::raise_token_to(owner.relid, &owner.token_name, &keys, row, (attnum, typid)) {
        verified::saw(&key, token);
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
