//! The row trigger on protected tables: the fence itself.
//!
//! Hot path for a row whose resource this transaction already verified: read
//! the key and token datums, encode the key into a reused buffer, one hash
//! lookup, compare. No SPI, no allocation. A miss takes the `FOR SHARE` lock on
//! the owner row (or the high-water mark) through a plan prepared once per
//! backend, and remembers the answer for the rest of the transaction.

use crate::audit::{self, AuditFacts};
use crate::errors::{LeaseError, Refusal};
use crate::fence::config::{self, FenceConfig, KeyColumn, Mode, OwnerLookup, TokenSource};
use crate::fence::pg::{as_role, datum_text, token_from_datum};
use crate::fence::{high_water, verified};
use crate::gucs;
use pgrx::pg_sys;
use std::cell::RefCell;

thread_local! {
    /// Reused for every row's key encoding, so the hot path does not allocate.
    static KEY_BUF: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64));
}

#[derive(Clone, Copy)]
pub enum Op {
    Insert,
    Update,
    Delete,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "INSERT",
            Op::Update => "UPDATE",
            Op::Delete => "DELETE",
        }
    }
}

/// A heap tuple of the relation the trigger fired on.
#[derive(Clone, Copy)]
pub struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    pub fn new(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
        Row { tuple, desc }
    }

    #[inline]
    pub fn attr(self, attnum: i16) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        let d = unsafe { pg_sys::heap_getattr(self.tuple, attnum as i32, self.desc, &mut isnull) };
        (!isnull).then_some(d)
    }
}

/// Validates the call and returns its `TriggerData`.
pub unsafe fn trigger_data<'a>(fcinfo: pg_sys::FunctionCallInfo, name: &str) -> &'a pg_sys::TriggerData {
    let ctx = (*fcinfo).context;
    if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
        pgrx::error!("{name}() may only be called as a trigger");
    }
    &*(ctx as *const pg_sys::TriggerData)
}

/// The trigger's arguments (`tgargs`).
pub unsafe fn trigger_args(td: &pg_sys::TriggerData) -> Vec<String> {
    let trigger = &*td.tg_trigger;
    (0..trigger.tgnargs as usize)
        .map(|i| std::ffi::CStr::from_ptr(*trigger.tgargs.add(i)).to_string_lossy().into_owned())
        .collect()
}

/// `lease.fence_trigger()`: BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW.
pub unsafe fn fence_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let td = trigger_data(fcinfo, "lease.fence_trigger");
    let event = td.tg_event;
    if event & pg_sys::TRIGGER_EVENT_ROW == 0
        || event & pg_sys::TRIGGER_EVENT_TIMINGMASK != pg_sys::TRIGGER_EVENT_BEFORE
    {
        pgrx::error!("lease.fence_trigger() must be a BEFORE ... FOR EACH ROW trigger");
    }
    let rel = &*td.tg_relation;
    let cfg = config::for_relation(rel.rd_id)?;
    let old = Row::new(td.tg_trigtuple, rel.rd_att);
    match event & pg_sys::TRIGGER_EVENT_OPMASK {
        pg_sys::TRIGGER_EVENT_INSERT => {
            check_row(&cfg, old, presented_token(&cfg, old), Op::Insert)?;
            Ok(pg_sys::Datum::from(td.tg_trigtuple))
        }
        pg_sys::TRIGGER_EVENT_UPDATE => {
            let new = Row::new(td.tg_newtuple, rel.rd_att);
            let token = presented_token(&cfg, new);
            check_row(&cfg, new, token, Op::Update)?;
            if !same_resource(&cfg, old, new) {
                // Moving a row between resources needs the right to write both.
                check_row(&cfg, old, token, Op::Update)?;
            }
            Ok(pg_sys::Datum::from(td.tg_newtuple))
        }
        pg_sys::TRIGGER_EVENT_DELETE => {
            check_row(&cfg, old, gucs::bound_token(), Op::Delete)?;
            Ok(pg_sys::Datum::from(td.tg_trigtuple))
        }
        _ => pgrx::error!("lease.fence_trigger() does not handle TRUNCATE"),
    }
}

#[inline]
fn presented_token(cfg: &FenceConfig, row: Row) -> Option<i64> {
    match cfg.token {
        TokenSource::Column { attnum, typid } => row.attr(attnum).map(|d| token_from_datum(d, typid)),
        TokenSource::Bound => gucs::bound_token(),
    }
}

/// Appends one key datum's identity: type, length, bytes (owner mode: equal
/// bytes are equal values; the owner lookup judges the rest), or its
/// canonical form (high-water mode, where the cache must agree with the
/// marks' own identity).
#[inline]
unsafe fn encode_datum(buf: &mut Vec<u8>, key: &KeyColumn, datum: pg_sys::Datum) {
    buf.extend_from_slice(&key.typid.to_u32().to_ne_bytes());
    if let Some(canon) = key.canon {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        canon.append(buf, datum, key.typid);
        let len = (buf.len() - start - 4) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        return;
    }
    if key.typbyval {
        buf.extend_from_slice(&datum.value().to_ne_bytes());
        return;
    }
    let bytes: &[u8] = match key.typlen {
        -1 => crate::fence::identity::varlena_bytes(datum),
        -2 => std::ffi::CStr::from_ptr(datum.cast_mut_ptr()).to_bytes(),
        n => std::slice::from_raw_parts(datum.cast_mut_ptr::<u8>(), n as usize),
    };
    buf.extend_from_slice(&(bytes.len() as u32).to_ne_bytes());
    buf.extend_from_slice(bytes);
}

/// Encodes the resource key of `row` (scope + key datums) into `buf`.
/// Returns false when a key column is NULL: such a row has no resource.
#[inline]
fn encode_key(buf: &mut Vec<u8>, cfg: &FenceConfig, row: Row) -> bool {
    buf.clear();
    buf.extend_from_slice(&cfg.scope);
    for key in &cfg.keys {
        match row.attr(key.attnum) {
            Some(d) => unsafe { encode_datum(buf, key, d) },
            None => return false,
        }
    }
    true
}

/// The encoded key of `row` (its resource has non-NULL key columns).
pub fn key_of(cfg: &FenceConfig, row: Row) -> Box<[u8]> {
    let mut buf = Vec::new();
    encode_key(&mut buf, cfg, row);
    buf.into_boxed_slice()
}

fn same_resource(cfg: &FenceConfig, a: Row, b: Row) -> bool {
    let mut other = Vec::new();
    let b_has_key = encode_key(&mut other, cfg, b);
    KEY_BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        encode_key(&mut buf, cfg, a) == b_has_key && *buf == other
    })
}

/// `(table_id, seat)=(7, 2)`, the way Postgres prints keys in its own errors.
pub fn describe_key(cfg: &FenceConfig, row: Row) -> String {
    let names: Vec<String> = cfg.keys.iter().map(|k| crate::fence::pg::quote_ident(&k.name)).collect();
    let values: Vec<String> = cfg
        .keys
        .iter()
        .map(|k| row.attr(k.attnum).map_or_else(|| "NULL".to_owned(), |d| datum_text(d, k.typid)))
        .collect();
    format!("({})=({})", names.join(", "), values.join(", "))
}

pub fn show(token: Option<i64>) -> String {
    token.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// A refusal for this row, with the DETAIL every LF error carries.
pub fn refusal(
    error: LeaseError,
    cfg: &FenceConfig,
    row: Row,
    op: Op,
    presented: Option<i64>,
    current: Option<i64>,
) -> Refusal {
    let key = describe_key(cfg, row);
    let summary = match error {
        LeaseError::StaleOwnerBoundaryWrite => {
            format!(
                "{} on {} for resource {key} presents fencing token {} but the current token is {}",
                op.as_str(),
                cfg.display,
                show(presented),
                show(current)
            )
        }
        LeaseError::FencingTokenAhead => format!(
            "{} on {} for resource {key} presents fencing token {}, ahead of the current token {}",
            op.as_str(),
            cfg.display,
            show(presented),
            show(current)
        ),
        LeaseError::MissingFencingToken => {
            format!("{} on {} for resource {key} presents no fencing token", op.as_str(), cfg.display)
        }
        LeaseError::FenceOwnerMissing => {
            format!("{} on {} for resource {key} has no owner row", op.as_str(), cfg.display)
        }
        other => format!("{} on {} refused ({})", op.as_str(), cfg.display, other.name()),
    };
    let source = match &cfg.mode {
        Mode::Owner(owner) => format!("owner row in {}", owner.display),
        Mode::HighWater => "high-water mark".to_owned(),
    };
    let detail = format!(
        "Table {}, resource {key}, presented token {}, current token {} ({source}).",
        cfg.display,
        show(presented),
        show(current)
    );
    let facts = AuditFacts {
        stats: cfg.stats,
        relid: cfg.protected_relid,
        table: cfg.display.clone(),
        operation: op.as_str(),
        resource: key,
        presented,
        current,
        row_json: audit::row_json(row.tuple, row.desc),
    };
    Refusal::new(error, summary, detail).on_table(&cfg.schema, &cfg.table).audited(facts)
}

enum Known {
    /// A key column is NULL.
    NoResource,
    /// Verified earlier in this transaction.
    Verified(Option<i64>),
    /// Not yet verified; the encoded key to remember it under.
    Unverified(Box<[u8]>),
}

fn check_row(cfg: &FenceConfig, row: Row, token: Option<i64>, op: Op) -> Result<(), Refusal> {
    let verdict = verdict(cfg, row, token, op);
    if let (Ok(()), Some(stats)) = (&verdict, cfg.stats) {
        stats.accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    verdict
}

fn verdict(cfg: &FenceConfig, row: Row, token: Option<i64>, op: Op) -> Result<(), Refusal> {
    let known = KEY_BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        if !encode_key(&mut buf, cfg, row) {
            return Known::NoResource;
        }
        match verified::lookup(&buf) {
            Some(current) => Known::Verified(current),
            None => Known::Unverified(buf.as_slice().into()),
        }
    });
    let Some(token) = token else {
        // Refused whatever the current token is; it is read (without a lock,
        // so this refusal never waits or fails on a concurrent bump) only so
        // that DETAIL and the audit can say what it is.
        let current = match (&cfg.mode, known) {
            (_, Known::NoResource) => None,
            (_, Known::Verified(current)) => current,
            (Mode::Owner(owner), Known::Unverified(_)) => peek_owner_row(cfg, owner, row),
            (Mode::HighWater, Known::Unverified(_)) => high_water::peek(cfg, row),
        };
        return Err(refusal(LeaseError::MissingFencingToken, cfg, row, op, None, current));
    };
    match &cfg.mode {
        Mode::Owner(owner) => {
            let current = match known {
                Known::Verified(current) => current,
                Known::NoResource => {
                    return Err(refusal(LeaseError::FenceOwnerMissing, cfg, row, op, Some(token), None))
                }
                Known::Unverified(key) => match lock_owner_row(cfg, owner, row) {
                    Some(current) => {
                        verified::remember(&key, current);
                        current
                    }
                    None => return Err(refusal(LeaseError::FenceOwnerMissing, cfg, row, op, Some(token), None)),
                },
            };
            match current {
                Some(c) if token == c => Ok(()),
                Some(c) if token < c => {
                    Err(refusal(LeaseError::StaleOwnerBoundaryWrite, cfg, row, op, Some(token), current))
                }
                _ => Err(refusal(LeaseError::FencingTokenAhead, cfg, row, op, Some(token), current)),
            }
        }
        Mode::HighWater => match known {
            Known::NoResource => Err(refusal(LeaseError::FenceOwnerMissing, cfg, row, op, Some(token), None)),
            Known::Verified(mark) => high_water::check(cfg, row, op, token, mark, None),
            Known::Unverified(key) => {
                let mark = high_water::read_and_lock(cfg, row);
                high_water::check(cfg, row, op, token, mark, Some(key))
            }
        },
    }
}

/// The owner row's token as this statement's snapshot sees it, without a
/// lock; None also when the row is missing or not of the owner table.
fn peek_owner_row(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<i64> {
    let (found, tableoid) = unsafe { run_plan(owner.peek, &mut key_args(cfg, row), owner.rel_owner) };
    found.flatten().filter(|_| owner.tables.contains(&tableoid))
}

/// The row's key values: the arguments of both owner-row lookups.
fn key_args(cfg: &FenceConfig, row: Row) -> Vec<pg_sys::Datum> {
    cfg.keys.iter().map(|k| row.attr(k.attnum).expect("key checked non-NULL")).collect()
}

/// `SELECT token ... FOR SHARE` on the owner row, as the owner table's owner.
/// None: no owner row. Some(None): the owner row's token is NULL.
fn lock_owner_row(cfg: &FenceConfig, owner: &OwnerLookup, row: Row) -> Option<Option<i64>> {
    let (found, tableoid) = unsafe { run_plan(owner.plan, &mut key_args(cfg, row), owner.rel_owner) };
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

/// Executes a saved one-row plan whose first column is an integer token.
pub unsafe fn run_plan_for_token(
    plan: pg_sys::SPIPlanPtr,
    args: &mut [pg_sys::Datum],
    role: pg_sys::Oid,
) -> Option<Option<i64>> {
    run_plan(plan, args, role).0
}

/// Executes a saved one-row plan whose first column is an integer token and
/// whose second column, if any, is an oid (else InvalidOid is returned).
unsafe fn run_plan(
    plan: pg_sys::SPIPlanPtr,
    args: &mut [pg_sys::Datum],
    role: pg_sys::Oid,
) -> (Option<Option<i64>>, pg_sys::Oid) {
    pg_sys::SPI_connect();
    // read_only = false: a fresh snapshot, so READ COMMITTED sees the latest
    // committed token, and the lock waits for (then follows) concurrent bumps.
    let rc = as_role(role, || pg_sys::SPI_execute_plan(plan, args.as_mut_ptr(), std::ptr::null(), false, 1));
    if rc < 0 {
        pgrx::error!("pg_lease: fence lookup failed (SPI code {rc})");
    }
    let result = if pg_sys::SPI_processed == 0 {
        (None, pg_sys::InvalidOid)
    } else {
        let table = &*pg_sys::SPI_tuptable;
        let mut isnull = false;
        let datum = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut isnull);
        let typid = pg_sys::SPI_gettypeid(table.tupdesc, 1);
        let token = (!isnull).then(|| token_from_datum(datum, typid));
        let mut oid = pg_sys::InvalidOid;
        if (*table.tupdesc).natts >= 2 {
            let d = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 2, &mut isnull);
            if !isnull {
                oid = pg_sys::Oid::from(d.value() as u32);
            }
        }
        (Some(token), oid)
    };
    pg_sys::SPI_finish();
    result
}
