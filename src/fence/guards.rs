//! Triggers that keep the fence's inputs honest: owner tokens only rise, and
//! TRUNCATE (which fires no row trigger) cannot bypass the fence.

use crate::errors::{LeaseError, Refusal};
use crate::fence::refusal::{self, show};
use crate::fence::{config, identity, key, replication, verified};
use crate::lease::MAX_TOKEN;
use crate::pg::{attcollation, display, token_from_datum, Row, TriggerCall, TriggerOp};
use pgrx::pg_sys;

/// `lease.owner_guard(token_column, key_column...)`: BEFORE INSERT OR UPDATE
/// OR DELETE FOR EACH ROW on an owner table. An owner row's token only rises
/// and never passes [`MAX_TOKEN`]; a row that carries a token keeps its key
/// (by the key type's equality) and is never deleted, since either would let
/// the resource's token start over (LF004).
pub fn owner_guard(call: &TriggerCall) -> Result<pg_sys::Datum, Refusal> {
    if !call.is_before_row() {
        pgrx::error!("lease.owner_guard() must be a BEFORE ... FOR EACH ROW trigger");
    }
    // Asked on every call: it is for the call right after the skipped delete.
    let skipped = replication::take_skipped_delete();
    let relid = call.relid();
    let Some(judges) = config::owner_table(relid) else {
        not_protected("lease.owner_guard", relid);
    };
    // A trusted subscription's change is judged where it was written
    // (fence::replication), except that it never takes a token away from
    // this node (below).
    let trusted = replication::trusted_row(call) && !judges;
    let args = call.args();
    let Some((token_column, key_names)) = args.split_first() else {
        pgrx::error!("lease.owner_guard() needs the token column as its first argument");
    };
    // The table's name is for messages only: built when one is (on a Citus
    // shard it takes a catalog query), not on every owner-row write.
    let owner_display = std::cell::LazyCell::new(|| config::display_of(relid));
    let column =
        |name: &str| crate::pg::attribute(relid, name).map_or_else(|| config::column(relid, &owner_display, name), Ok);
    let (attnum, typid) = column(token_column)?;
    let mut keys = Vec::with_capacity(key_names.len());
    for name in key_names {
        let (attnum, typid) = column(name)?;
        keys.push((name.as_str(), attnum, typid));
    }
    let op = call.op();
    let old = call.trigtuple().expect("a row trigger has a row");
    let token_of = |row: Row| row.attr(attnum).map(|d| token_from_datum(d, typid));

    let (before, after, new) = match op {
        TriggerOp::Insert => (None, token_of(old), Some(old)),
        TriggerOp::Update => {
            let new = call.newtuple().expect("an UPDATE has a new row");
            (token_of(old), token_of(new), Some(new))
        }
        _ => (token_of(old), None, None),
    };

    if trusted {
        return Ok(trusted_change(call, skipped, (token_column, attnum, typid), &keys, before, after, &owner_display));
    }
    // SAFETY: superuser() is a syscache lookup of the current user (a
    // backend global), valid in any transaction.
    if let Some(a) = after.filter(|&a| a > MAX_TOKEN && !unsafe { pg_sys::superuser() }) {
        pgrx::ereport!(
            ERROR,
            pgrx::PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("pg_lease: fencing token {a} is out of range for owner table {}", *owner_display),
            format!(
                "Owner tokens set by hand stop at {MAX_TOKEN}, so that lease.acquire can always issue a higher one."
            )
        );
    }
    let Some(b) = before else {
        return Ok(call.pass());
    };
    let regression = match (op, new) {
        (TriggerOp::Delete, _) => Some(format!("would be deleted with its fencing token {b}")),
        (_, Some(_)) if after.is_none_or(|a| a < b) => {
            Some(format!("would lower its fencing token from {b} to {}", show(after)))
        }
        (_, Some(new)) if !same_key(relid, old, new, &keys) => {
            Some(format!("would move its fencing token {b} to key {}", key::describe(new, keys.iter().copied())))
        }
        _ => None,
    };
    if let Some(what) = regression {
        let key = key::describe(old, keys.iter().copied());
        let facts = refusal::facts(relid, &owner_display, op, key.clone(), after, Some(b), Some(new.unwrap_or(old)));
        return Err(refusal::on_relation(
            LeaseError::FencingTokenRegression,
            relid,
            format!("owner row {key} of {} {what}", *owner_display),
            format!(
                "Table {}, owner row {key}, column \"{token_column}\": current token {b}, new token {}.",
                *owner_display,
                show(after)
            ),
            facts,
        ));
    }
    if before != after {
        // This transaction now owns a new token: whatever it verified before
        // must be verified again against it.
        verified::forget_all();
    }
    Ok(call.pass())
}

/// A trusted subscription's change of an owner row: applied as its
/// publisher made it, except where it would take this node's token away.
/// Where both nodes issue tokens (two-way replication, `origin = none`), or
/// this node acquired on its own, a change made where the row carried no (or
/// a lower) token would lower, move or erase this node's; and a
/// publication's row filter turns an UPDATE that leaves the filter into a
/// DELETE. So an INSERT ([`Trusted::insert`]), a DELETE
/// ([`Trusted::delete`]) and an UPDATE ([`Trusted::update`]) each keep what
/// this node holds, and log it. Each node thereby ends at the highest token
/// either issued, and no token starts over.
fn trusted_change(
    call: &TriggerCall,
    skipped: Option<(pg_sys::Oid, pg_sys::ItemPointerData)>,
    token: (&str, i16, pg_sys::Oid),
    keys: &[(&str, i16, pg_sys::Oid)],
    before: Option<i64>,
    after: Option<i64>,
    owner_display: &str,
) -> pg_sys::Datum {
    let change = Trusted { call, old: call.trigtuple().expect("a row trigger has a row"), token, keys, owner_display };
    match (call.op(), before) {
        (TriggerOp::Insert, _) => change.insert(skipped, after),
        (_, None) => call.pass(),
        (TriggerOp::Delete, Some(b)) => change.delete(b),
        (_, Some(b)) => change.update(b, after),
    }
}

/// The trigger call of a trusted change of an owner row, with the owner
/// table's token column (name, attnum, type) and key columns.
struct Trusted<'a> {
    call: &'a TriggerCall<'a>,
    old: Row,
    token: (&'a str, i16, pg_sys::Oid),
    keys: &'a [(&'a str, i16, pg_sys::Oid)],
    owner_display: &'a str,
}

impl Trusted<'_> {
    /// An INSERT of a key whose row here carries a token is skipped, that
    /// row's token raised to the inserted one where that is higher (it would
    /// otherwise fail on the key, stopping the subscription: the row's delete
    /// may have been skipped by [`delete`](Self::delete)). The second half of
    /// a move between partitions whose delete was skipped updates the row
    /// where it stayed instead.
    fn insert(&self, skipped: Option<(pg_sys::Oid, pg_sys::ItemPointerData)>, after: Option<i64>) -> pg_sys::Datum {
        let relid = self.call.relid();
        // SAFETY: a syscache lookup of the trigger's (locked) relation.
        let moved_here = skipped.filter(|&(from, _)| from != relid && unsafe { pg_sys::get_rel_relispartition(relid) });
        if let Some((from, at)) = moved_here {
            // The second half of an update moving a row that carries a
            // token to this partition: the row stays where it is with its
            // key, taking the update's other columns and its token where
            // higher, as an update within one partition would.
            let keep: Vec<i16> = self.keys.iter().map(|&(_, attnum, _)| attnum).collect();
            if crate::pg::write_row_at(from, self.old, at, &keep, Some(self.token.1)) {
                replication::log_kept(
                    &format!(
                        "would move an owner row that carries a token from partition {} to key {} in partition {}",
                        display(from),
                        self.key(),
                        self.owner_display
                    ),
                    "its update is applied with the row's key kept, and the higher token",
                );
                return pg_sys::Datum::from(0usize);
            }
        }
        // A table's initial copy meets rows of this node only where the
        // table had tokens before it (asked once per copy).
        let copy_alone = replication::initial_copy()
            && !replication::copy_meets_tokens(relid, || crate::pg::carries_tokens(relid, self.token.0));
        if copy_alone || !crate::pg::raise_token_of_same_key(relid, self.token, self.keys, self.old) {
            return self.call.pass();
        }
        replication::log_kept(
            &format!("would insert owner row {} of {}, which carries a token here", self.key(), self.owner_display),
            &format!(
                "its insert of a row with token {} is skipped (the row there keeps the higher token)",
                show(after)
            ),
        );
        pg_sys::Datum::from(0usize)
    }

    /// A DELETE of a row that carries token `b` is skipped (and remembered,
    /// for the INSERT half of a move between partitions).
    fn delete(&self, b: i64) -> pg_sys::Datum {
        self.log_taken_away(b, "its delete of the row is skipped");
        // SAFETY: a trigger's row is valid for the call (TriggerCall).
        replication::note_skipped_delete(self.call.relid(), unsafe { (*self.old.tuple()).t_self });
        pg_sys::Datum::from(0usize)
    }

    /// An UPDATE of a row that carries token `b` keeps that token where it
    /// would lower it (or set it NULL), and the row's key where it would move
    /// it; its other columns apply.
    fn update(&self, b: i64, after: Option<i64>) -> pg_sys::Datum {
        let new = self.call.newtuple().expect("an UPDATE has a new row");
        let moved = !same_key(self.call.relid(), self.old, new, self.keys);
        let lowered = after.is_none_or(|a| a < b);
        if !moved && !lowered {
            return self.call.pass();
        }
        let (mut columns, mut kept) = (Vec::new(), Vec::new());
        if lowered {
            columns.push(self.token.1);
            kept.push(format!("token {b} instead of {}", show(after)));
        }
        if moved {
            columns.extend(self.keys.iter().map(|&(_, attnum, _)| attnum));
            kept.push("the row's key".to_owned());
        }
        self.log_taken_away(b, &format!("its update is applied with {} kept", kept.join(" and ")));
        self.call.pass_keeping_old(&columns)
    }

    /// The key of the row changed, as `(k)=(v)`.
    fn key(&self) -> String {
        key::describe(self.old, self.keys.iter().copied())
    }

    fn log_taken_away(&self, b: i64, what: &str) {
        replication::log_kept(
            &format!("would take fencing token {b} away from owner row {} of {}", self.key(), self.owner_display),
            what,
        );
    }
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
fn same_key(relid: pg_sys::Oid, old: Row, new: Row, keys: &[(&str, i16, pg_sys::Oid)]) -> bool {
    keys.iter().all(|&(_, attnum, typid)| match (old.attr(attnum), new.attr(attnum)) {
        (None, None) => true,
        // SAFETY: two non-NULL values of column `attnum` of the trigger's
        // relation `relid` (old and new rows of this call, valid for it),
        // whose type `typid` config::column read for that same relation.
        (Some(a), Some(b)) => unsafe { identity::equal(a, b, typid, attcollation(relid, attnum)) },
        _ => false,
    })
}

/// `lease.truncate_guard('target' | 'owner')`: BEFORE TRUNCATE FOR EACH STATEMENT.
pub fn truncate_guard(call: &TriggerCall) -> Result<pg_sys::Datum, Refusal> {
    let relid = call.relid();
    let owner = call.args().first().map(String::as_str) == Some("owner");
    // Whether it is guarded, and whether it judges replicated changes.
    let target = if owner { None } else { config::for_relation(relid).ok() };
    let judges = match &target {
        Some(cfg) => Some(cfg.judge_replicated),
        None if owner => config::owner_table(relid),
        None => None,
    };
    let Some(judges) = judges else {
        not_protected("lease.truncate_guard", relid);
    };
    // A trusted subscription's TRUNCATE of a fenced table was judged where
    // it was made; of an owner table it would erase this node's tokens
    // (which a trusted subscription never takes away: see `trusted_change`).
    if !judges && !owner && replication::trusted_apply() {
        return Ok(call.pass());
    }
    let table = config::display_of(relid);
    let (error, summary, detail) = if owner {
        (
            LeaseError::FencingTokenRegression,
            format!("TRUNCATE of owner table {table} would erase its fencing tokens"),
            format!("Table {table} holds the current fencing tokens of fenced resources; TRUNCATE would let tokens start over."),
        )
    } else {
        (
            LeaseError::FenceTampering,
            format!("TRUNCATE of fenced table {table} bypasses the fence"),
            format!("Table {table} is protected by pg_lease; TRUNCATE fires no row trigger, so no fencing token could be checked. Delete rows with a bound token, or call lease.unprotect first."),
        )
    };
    let facts = refusal::facts(relid, &table, TriggerOp::Truncate, String::new(), None, None, None);
    let refused = refusal::on_relation(error, relid, summary, detail, facts);
    // A replicated TRUNCATE names the subscription and the way out (the
    // subscription is noted for lease.audit_status() where every refusal in
    // a worker is: refusal::in_replication_worker).
    let replicated = replication::subscription().map(|sub| match &target {
        Some(cfg) => refusal::replication_hint(&sub, Some((&display(cfg.protected_relid), cfg.is_high_water()))),
        None => refusal::owner_truncate_hint(&sub, &table),
    });
    Err(match replicated {
        Some(hint) => refused.with_hint(hint),
        None => refused,
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::fence::tests::sqlstate_of;
    use pgrx::prelude::*;

    #[pg_test]
    fn owner_tokens_only_rise_and_stay_with_their_key() {
        Spi::run(
            "CREATE TABLE tables (id numeric PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id numeric, fencing_token bigint);
             SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
             INSERT INTO tables VALUES (1, 5), (2, NULL);",
        )
        .unwrap();
        assert_eq!(sqlstate_of("UPDATE tables SET owner_fencing_token = 4 WHERE id = 1"), "LF004");
        assert_eq!(sqlstate_of("UPDATE tables SET owner_fencing_token = NULL WHERE id = 1"), "LF004");
        assert_eq!(sqlstate_of("UPDATE tables SET id = 3 WHERE id = 1"), "LF004");
        assert_eq!(sqlstate_of("DELETE FROM tables WHERE id = 1"), "LF004");
        assert_eq!(sqlstate_of("TRUNCATE tables CASCADE"), "LF004");
        // Equal by the key type's equality is the same key: 1.00 = 1.
        assert_eq!(sqlstate_of("UPDATE tables SET id = 1.00 WHERE id = 1"), "ok");
        assert_eq!(sqlstate_of("UPDATE tables SET owner_fencing_token = 6 WHERE id = 1"), "ok");
        // A row without a token may move and go.
        assert_eq!(sqlstate_of("UPDATE tables SET id = 4 WHERE id = 2"), "ok");
        assert_eq!(sqlstate_of("DELETE FROM tables WHERE id = 4"), "ok");
    }
}
