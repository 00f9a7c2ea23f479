//! High-water fencing for sinks fed from an untrusted log: no owner row, the
//! current token of a resource is the highest token ever accepted for it.
//!
//! A mark equal to the writer's token is verified under a `FOR SHARE` lock on
//! its `lease.high_water` row (equal writers do not block each other); a higher
//! token raises the mark with an upsert, whose row lock makes later writers
//! wait for this transaction and then compare against the raised mark.

use crate::errors::{LeaseError, Refusal};
use crate::fence::config::{self, FenceConfig};
use crate::fence::{key, refusal, verified};
use crate::pg::{
    as_role, attribute, lease_relid, prepare_saved, rel_owner, run_token_plan, text_array, text_datum, Access, Probe,
    Row, TriggerOp, UniqueIndex,
};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Clone, Copy)]
struct Plans {
    select: pg_sys::SPIPlanPtr,
    /// `select` without the lock (see [`peek`]).
    peek: pg_sys::SPIPlanPtr,
    upsert: pg_sys::SPIPlanPtr,
    /// Owner of `lease.high_water`: writers need no privileges on it.
    role: pg_sys::Oid,
}

thread_local! {
    static PLANS: Cell<Option<Plans>> = const { Cell::new(None) };
    /// The primary key of `lease.high_water`, through which `select`'s lock
    /// is taken without SPI, and the relcache generation it was found in.
    static INDEX: RefCell<Option<StoreIndex>> = const { RefCell::new(None) };
}

#[derive(Clone)]
struct StoreIndex {
    index: Rc<UniqueIndex>,
    /// The relcache generation it was found in.
    generation: u64,
    /// `token`'s attribute number.
    token: i16,
}

/// `lease.high_water`'s (target, resource) index as of the current relcache
/// generation; None if it has none the lookup can use (then `select` runs).
fn index() -> Option<StoreIndex> {
    if let Some(found) = INDEX.with(|i| i.borrow().clone()).filter(|i| i.generation == config::relcache_generation()) {
        return Some(found);
    }
    let relid = lease_relid(c"high_water");
    let column = |name| attribute(relid, name).unwrap_or_else(|| pgrx::error!("lease.high_water has no column {name}"));
    let ((target, target_type), (resource, resource_type)) = (column("target"), column("resource"));
    let columns = [(target, target_type, pg_sys::REGCLASSOID), (resource, resource_type, pg_sys::TEXTARRAYOID)];
    let token = column("token").0;
    // Finding it may itself deliver invalidations: the generation read after
    // it is the one it holds for.
    let found = UniqueIndex::find(relid, &columns).map(|index| StoreIndex {
        index: Rc::new(index),
        generation: config::relcache_generation(),
        token,
    });
    INDEX.with(|i| *i.borrow_mut() = found.clone());
    found
}

fn plans() -> Plans {
    if let Some(p) = PLANS.with(|p| p.get()) {
        return p;
    }
    let p = pgrx::spi::Spi::connect(|_| {
        let mut args = [pg_sys::REGCLASSOID, pg_sys::TEXTARRAYOID, pg_sys::INT8OID];
        Plans {
            select: prepare_saved(
                c"SELECT token FROM lease.high_water WHERE target OPERATOR(pg_catalog.=) $1 AND resource OPERATOR(pg_catalog.=) $2 FOR SHARE",
                &mut args[..2],
                "the high-water lookup",
            ),
            peek: prepare_saved(
                c"SELECT token FROM lease.high_water WHERE target OPERATOR(pg_catalog.=) $1 AND resource OPERATOR(pg_catalog.=) $2",
                &mut args[..2],
                "the high-water lookup",
            ),
            upsert: prepare_saved(
                c"INSERT INTO lease.high_water AS h (target, resource, token) VALUES ($1, $2, $3)
                  ON CONFLICT (target, resource) DO UPDATE
                  SET token = pg_catalog.int8larger(h.token, excluded.token), updated_at = pg_catalog.now()
                  RETURNING h.token",
                &mut args,
                "the high-water upsert",
            ),
            role: pg_sys::InvalidOid,
        }
    });
    let p = Plans { role: rel_owner(lease_relid(c"high_water")), ..p };
    PLANS.with(|c| c.set(Some(p)));
    p
}

/// The key values' canonical forms as text[], the resource's name in
/// `lease.high_water` (see identity.rs).
fn resource_datum(cfg: &FenceConfig, row: Row) -> pg_sys::Datum {
    let mut buf = Vec::with_capacity(32);
    let elems: Vec<_> = cfg
        .keys
        .iter()
        .map(|k| {
            buf.clear();
            let canon = k.canon.expect("high-water keys have a canonical form");
            let datum = row.attr(k.attnum).expect("key checked non-NULL");
            // SAFETY: `datum` is non-NULL (just checked) and a value of
            // k.typid: `cfg` was built for the relation `row` belongs to, so
            // k.attnum is that key column in the row's descriptor and k.typid
            // its type (a change of either invalidates the config); it lives
            // in the row, valid for this call.
            unsafe { canon.append(&mut buf, datum, k.typid) };
            text_datum(&buf)
        })
        .collect();
    text_array(&elems)
}

/// The resource's mark under the latest snapshot, without a lock: for the
/// DETAIL of a refusal that needs no verdict.
pub fn peek(cfg: &FenceConfig, row: Row) -> Option<i64> {
    read_mark(cfg, row, Access::Read)
}

/// The resource's mark, share-locked; None if it has none yet.
pub fn read_and_lock(cfg: &FenceConfig, row: Row) -> Option<i64> {
    read_mark(cfg, row, Access::LockShare)
}

/// The resource's mark, read as `access` says: through `lease.high_water`'s
/// primary key without SPI when it can be used (see
/// `pg::UniqueIndex::probe`), else through the saved plan (`select` or
/// `peek`).
fn read_mark(cfg: &FenceConfig, row: Row, access: Access) -> Option<i64> {
    let mut args = [pg_sys::Datum::from(cfg.protected_relid), resource_datum(cfg, row)];
    if let Some(store) = index() {
        // SAFETY: (regclass, text[]) datums, the argument types the index was
        // found for; `store.token` is lease.high_water's int8 token column;
        // this runs as the table's owner, as the saved plan does.
        let probe = as_role(plans().role, || unsafe {
            store.index.probe(&args, (store.token, pg_sys::INT8OID), access, || {
                config::relcache_generation() == store.generation
            })
        });
        match probe {
            Probe::Found(mark) => return mark,
            Probe::Missing => return None,
            Probe::Stale => {}
        }
    }
    let plan = match access {
        Access::LockShare => plans().select,
        Access::Read => plans().peek,
    };
    // SAFETY: both lookups (plans()) take (regclass, text[]), which `args`
    // holds (an OID by value, a text[] from text_array), and return the int8
    // token first.
    unsafe { run_token_plan(plan, &mut args, plans().role, access) }.0.flatten()
}

fn raise_mark(cfg: &FenceConfig, row: Row, token: i64) -> i64 {
    let p = plans();
    let mut args = [pg_sys::Datum::from(cfg.protected_relid), resource_datum(cfg, row), pg_sys::Datum::from(token)];
    // SAFETY: the upsert (plans()) takes (regclass, text[], int8), which
    // `args` holds, and returns the int8 mark first.
    unsafe { run_token_plan(p.upsert, &mut args, p.role, Access::LockShare) }
        .0
        .flatten()
        .expect("the upsert returns the mark")
}

/// Verdict for `token` against `mark`. `key` is Some when the mark was just
/// read (and locked) in this call, so it must be remembered. `copying`: the
/// row is part of an initial copy by logical replication, taken below the
/// mark too (the mark still rises above it).
pub fn check(
    cfg: &FenceConfig,
    row: Row,
    op: TriggerOp,
    token: i64,
    mark: Option<i64>,
    key: Option<Box<[u8]>>,
    copying: bool,
) -> Result<(), Refusal> {
    match mark {
        Some(m) if token <= m => {
            if let Some(key) = key {
                verified::remember(&key, Some(m));
            }
            if token == m || copying {
                Ok(())
            } else {
                Err(refusal::of_row(LeaseError::StaleOwnerBoundaryWrite, cfg, row, op, Some(token), Some(m)))
            }
        }
        _ => {
            let raised = raise_mark(cfg, row, token);
            let key = key.unwrap_or_else(|| key::of(cfg, row));
            verified::remember(&key, Some(raised));
            if raised == token {
                Ok(())
            } else {
                Err(refusal::of_row(LeaseError::StaleOwnerBoundaryWrite, cfg, row, op, Some(token), Some(raised)))
            }
        }
    }
}
