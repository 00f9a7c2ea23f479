//! `lease.fence_trigger()`, the fence itself: the verdict on one row of a
//! protected table, read top to bottom.
//!
//! Hot path for a row whose resource this transaction already verified: read
//! the key and token datums, encode the key into a reused buffer, one hash
//! lookup, compare. No SPI, no allocation. A miss takes the `FOR SHARE` lock on
//! the owner row (fence::owner) or the high-water mark (fence::high_water)
//! through a plan prepared once per backend, and remembers the answer for the
//! rest of the transaction (fence::verified).

use crate::audit::Outcome;
use crate::errors::{LeaseError, Refusal};
use crate::fence::config::{self, FenceConfig, Mode, TokenSource};
use crate::fence::{high_water, key, owner, refusal, replication, verified};
use crate::gucs;
use crate::pg::{token_from_datum, Row, TriggerCall, TriggerOp};

/// BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW: the row passes, or the
/// refusal to raise. The outcome carries the table's counters.
pub fn fence_row(call: &TriggerCall) -> Outcome {
    if !call.is_before_row() {
        pgrx::error!("lease.fence_trigger() must be a BEFORE ... FOR EACH ROW trigger");
    }
    let cfg = match config::for_relation(call.relid()) {
        Ok(cfg) => cfg,
        Err(refusal) => return Outcome::from(Err(refusal)),
    };
    // A trusted subscription's own row, as its worker applies it (judged
    // where it was written: fence::replication).
    let trusted = replication::trusted_row(call);
    let adopting = match &cfg.mode {
        Mode::Owner(lookup) if trusted && !cfg.judge_replicated => {
            // The row's token was current at its origin: this node's owner
            // row must not stay below it.
            owner::catch_up(&cfg, lookup, call);
            return Outcome { stats: cfg.stats.slot(), result: Ok(call.pass()), replicated: true };
        }
        Mode::Owner(_) => false,
        // High-water marks must still rise to what is applied, even when
        // the table trusts replicated rows; and a table's initial copy is a
        // snapshot in no order (a row at 9 can come before one at 5): every
        // such row is taken, its token raising the mark.
        Mode::HighWater => trusted && (!cfg.judge_replicated || replication::initial_copy()),
    };
    let result = judge(&cfg, call, adopting).map(|()| call.pass());
    Outcome { stats: cfg.stats.slot(), result, replicated: adopting }
}

fn judge(cfg: &FenceConfig, call: &TriggerCall, adopting: bool) -> Result<(), Refusal> {
    let op = call.op();
    let old = call.trigtuple().expect("a row trigger has a row");
    match op {
        TriggerOp::Insert => check(cfg, old, presented_token(cfg, old), op, adopting),
        TriggerOp::Update => {
            let new = call.newtuple().expect("an UPDATE has a new row");
            let token = presented_token(cfg, new);
            check(cfg, new, token, op, adopting)?;
            if !key::same_resource(cfg, old, new) {
                // Moving a row between resources needs the right to write both.
                check(cfg, old, token, op, adopting)?;
            }
            verified::passed_update(call.row_place(), token);
            Ok(())
        }
        TriggerOp::Delete => {
            // (The DELETE half of an UPDATE moving the row to another
            // partition presents that UPDATE's token.)
            let token = verified::update_deleting(call.row_place()).unwrap_or_else(gucs::bound_token);
            check(cfg, old, token, op, adopting)
        }
        TriggerOp::Truncate => pgrx::error!("lease.fence_trigger() does not handle TRUNCATE"),
    }
}

/// The token the writer presents for `row`: its token column, or the token
/// bound to this transaction.
#[inline]
fn presented_token(cfg: &FenceConfig, row: Row) -> Option<i64> {
    match cfg.token {
        TokenSource::Column { attnum, typid } => row.attr(attnum).map(|d| token_from_datum(d, typid)),
        TokenSource::Bound => gucs::bound_token(),
    }
}

/// What this transaction knows of the row's resource.
enum Known {
    /// A key column is NULL.
    NoResource,
    /// Verified earlier in this transaction: its current token.
    Verified(Option<i64>),
    /// Not yet verified; the encoded key to remember it under.
    Unverified(Box<[u8]>),
}

fn known(cfg: &FenceConfig, row: Row) -> Known {
    key::with_encoded(cfg, row, |key| match key {
        None => Known::NoResource,
        Some(key) => match verified::lookup(key) {
            Some(current) => Known::Verified(current),
            None => Known::Unverified(key.into()),
        },
    })
}

/// The verdict on writing `row` with `token`. `copying` (high-water mode):
/// the row is taken whatever its token, the mark raised to it.
fn check(cfg: &FenceConfig, row: Row, token: Option<i64>, op: TriggerOp, copying: bool) -> Result<(), Refusal> {
    let known = known(cfg, row);
    let refuse = |error, current| Err(refusal::of_row(error, cfg, row, op, token, current));
    let Some(token) = token else {
        if copying {
            return Ok(());
        }
        // Refused whatever the current token is; it is read (without a row
        // lock, under the latest snapshot, so this refusal never waits or
        // fails on a concurrent bump; it waits for a lock on the owner table
        // itself, as every fenced write does) only so that DETAIL and the
        // audit can say what it is.
        let current = match (&cfg.mode, known) {
            (_, Known::NoResource) => None,
            (_, Known::Verified(current)) => current,
            (Mode::Owner(lookup), Known::Unverified(_)) => owner::peek(cfg, lookup, row),
            (Mode::HighWater, Known::Unverified(_)) => high_water::peek(cfg, row),
        };
        return refuse(LeaseError::MissingFencingToken, current);
    };
    match &cfg.mode {
        Mode::Owner(lookup) => {
            let current = match known {
                Known::Verified(current) => current,
                Known::NoResource => return refuse(LeaseError::FenceOwnerMissing, None),
                Known::Unverified(key) => match owner::lock(cfg, lookup, row) {
                    Some(current) => {
                        verified::remember(&key, current);
                        current
                    }
                    None => return refuse(LeaseError::FenceOwnerMissing, None),
                },
            };
            match current {
                Some(c) if token == c => Ok(()),
                Some(c) if token < c => refuse(LeaseError::StaleOwnerBoundaryWrite, current),
                _ => refuse(LeaseError::FencingTokenAhead, current),
            }
        }
        Mode::HighWater => match known {
            Known::NoResource if copying => Ok(()),
            Known::NoResource => refuse(LeaseError::FenceOwnerMissing, None),
            Known::Verified(mark) => high_water::check(cfg, row, op, token, mark, None, copying),
            Known::Unverified(key) => {
                let mark = high_water::read_and_lock(cfg, row);
                high_water::check(cfg, row, op, token, mark, Some(key), copying)
            }
        },
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::fence::tests::sqlstate_of;
    use pgrx::prelude::*;

    fn poker() {
        Spi::run(
            "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id int, fencing_token bigint);
             SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
             INSERT INTO tables VALUES (1, 5), (2, NULL);",
        )
        .unwrap();
    }

    #[pg_test]
    fn the_verdict_on_each_kind_of_row() {
        poker();
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, 5)"), "ok");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, 4)"), "LF001");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, 6)"), "LF002");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, NULL)"), "LF003");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (3, 5)"), "LF007");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (NULL, 5)"), "LF007");
        // An owner row without a token yet: nothing can be current.
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (2, 1)"), "LF002");
        // Moving a row to another resource needs the right to write both.
        assert_eq!(sqlstate_of("UPDATE payouts SET table_id = 2 WHERE table_id = 1"), "LF002");
        // DELETE takes the bound token.
        assert_eq!(sqlstate_of("DELETE FROM payouts"), "LF003");
        assert_eq!(sqlstate_of("PERFORM lease.bind_token(5); DELETE FROM payouts"), "ok");
    }

    #[pg_test]
    fn a_bump_in_this_transaction_is_judged_again() {
        poker();
        // Verified (and cached) at 5, then this transaction bumps the owner
        // row: the cache is dropped, so 5 is now stale.
        Spi::run("INSERT INTO payouts VALUES (1, 5); UPDATE tables SET owner_fencing_token = 7 WHERE id = 1").unwrap();
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, 5)"), "LF001");
        assert_eq!(sqlstate_of("INSERT INTO payouts VALUES (1, 7)"), "ok");
    }
}
