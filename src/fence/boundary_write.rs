//! `lease.fenced_boundary_write(target, token, rows)`: a JSON array of row
//! objects inserted into a protected table under one fencing token, all or
//! nothing, with the fence trigger judging every row.
//!
//! Per backend and target relation, [`Target`] caches the table's columns
//! (type input function, I/O parameter, typmod) and one saved
//! `INSERT INTO <schema.table> (<columns>) VALUES ($1, ...)` plan per column
//! set. Entries go stale on a relcache invalidation of the table (ALTER
//! TABLE, protect/unprotect, DROP) and on any schema change; a stale entry is
//! freed only once no call is still using it.
//!
//! A call runs in three steps (see `crate::boundary`): [`prepare`] checks the
//! input, converts every value with its column's input function (naming the
//! element and column of a bad one) and binds the token; the inserts run
//! outside pgrx's guard ([`insert_all`]), so the fence's LF errors reach the
//! client untouched; [`finish`] restores the transaction's own binding.

use crate::errors::Invalid;
use crate::fence::FastMap;
use crate::gucs;
use crate::pg::{owned, quote_ident, set_guc};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::PgTryBuilder;
use serde_json::{Map, Value};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::{c_char, c_void, CStr, CString};
use std::rc::Rc;

const FN: &str = "lease.fenced_boundary_write";

/// How a JSON value becomes a column's value (as `jsonb_populate_record` does).
enum Kind {
    /// The value's text (a string's contents, a number's digits, true/false)
    /// through the type's input function, with the column's typmod.
    Scalar,
    /// json/jsonb: the value's JSON text.
    Json,
    /// Arrays, composites, domains over them: `jsonb_populate_record` itself.
    Populate(pg_sys::SPIPlanPtr),
}

struct Column {
    typid: pg_sys::Oid,
    typmod: i32,
    ioparam: pg_sys::Oid,
    input: *mut pg_sys::FmgrInfo,
    kind: Kind,
}

/// An INSERT's column names (sorted) and row count.
type InsertShape = (Vec<String>, usize);

struct Target {
    relid: pg_sys::Oid,
    qualified: String,
    display: String,
    token_column: Option<String>,
    /// Holds the input functions' FmgrInfo (and what they cache).
    mcxt: pg_sys::MemoryContext,
    /// By name; None: no such live column.
    columns: RefCell<FastMap<String, Option<Rc<Column>>>>,
    /// By column set (sorted names) and row count.
    plans: RefCell<FastMap<InsertShape, Box<SavedInsert>>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        let plans = self.plans.get_mut().drain().map(|(_, p)| p.plan.get()).filter(|p| !p.is_null());
        let probes = self.columns.get_mut().drain().filter_map(|(_, c)| match c.as_deref() {
            Some(Column { kind: Kind::Populate(p), .. }) => Some(*p),
            _ => None,
        });
        for plan in plans.chain(probes.collect::<Vec<_>>()) {
            // SAFETY: each plan was saved with SPI_keepplan by this entry and
            // is freed once, here; Targets are dropped only in `prepare`,
            // never inside an invalidation callback, and only when no call
            // still uses them.
            unsafe { pg_sys::SPI_freeplan(plan) };
        }
        // SAFETY: the context was created for this entry alone; nothing
        // outside it points into it once the entry is gone.
        unsafe { pg_sys::MemoryContextDelete(self.mcxt) };
    }
}

/// One call's elements, as parsed.
type CallRows = Vec<Map<String, Value>>;

thread_local! {
    static TARGETS: RefCell<FastMap<pg_sys::Oid, Rc<Target>>> = RefCell::new(FastMap::default());
    /// Invalidated entries, freed by the next call once nothing uses them.
    static STALE: RefCell<Vec<Rc<Target>>> = const { RefCell::new(Vec::new()) };
    /// Entries pinned by calls in progress, with the subtransaction that
    /// pinned them (released when it aborts, or at transaction end).
    static IN_USE: RefCell<Vec<(pg_sys::SubTransactionId, Rc<Target>)>> = const { RefCell::new(Vec::new()) };
    /// INSERTs made for one call only (its target's plan cache is full),
    /// kept until that call ends, with the subtransaction that made them.
    static TRANSIENT: RefCell<Vec<(pg_sys::SubTransactionId, Box<SavedInsert>)>> = const { RefCell::new(Vec::new()) };
    static FLUSH_ALL: Cell<bool> = const { Cell::new(false) };
    /// The rows (token stamped) of each call in progress, innermost last,
    /// read by [`name_null_column`]; emptied at transaction end.
    static ROWS: UnsafeCell<Vec<(pg_sys::SubTransactionId, CallRows)>> = const { UnsafeCell::new(Vec::new()) };
}

/// Relcache invalidation: the entry of `relid` (every entry for InvalidOid) goes stale.
pub unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid {
        FLUSH_ALL.with(|f| f.set(true));
        return;
    }
    TARGETS.with(|t| match t.try_borrow_mut() {
        Ok(mut map) => {
            if let Some(stale) = map.remove(&relid) {
                STALE.with(|s| match s.try_borrow_mut() {
                    Ok(mut s) => s.push(stale),
                    Err(_) => std::mem::forget(stale),
                });
            }
        }
        Err(_) => FLUSH_ALL.with(|f| f.set(true)),
    });
}

/// Schema renames and drops: plans name tables schema-qualified.
pub unsafe extern "C-unwind" fn on_namespace_invalidation(_arg: pg_sys::Datum, _cacheid: i32, _hash: u32) {
    FLUSH_ALL.with(|f| f.set(true));
}

/// Transaction end: calls that failed left their pins behind.
pub unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_ABORT) {
        // SAFETY: no call is in progress at transaction end; nothing else
        // holds a reference into ROWS (it is only read within one statement).
        ROWS.with(|r| unsafe { (&mut *r.get()).clear() });
        release_pins(|_| true);
    }
}

/// A subtransaction aborted: the calls that failed in it (and in its
/// children, whose IDs are higher) left their rows, pins and one-call
/// INSERTs behind; a loop that catches failures must not accumulate them.
pub unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent_subid: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    if event != pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        return;
    }
    // SAFETY: no reference into ROWS is held across a subtransaction abort
    // (the callback reading it runs within one error report); entries are
    // in push order, so those of the aborted subtransaction are the tail.
    ROWS.with(|r| unsafe { (&mut *r.get()).retain(|(subid, _)| *subid < my_subid) });
    release_pins(|subid| subid >= my_subid);
}

/// Moves the pins taken in subtransactions `gone` selects to STALE (freed by
/// the next call once unused) and drops their one-call INSERTs (their plans
/// were never saved: SPI freed them with its connection).
fn release_pins(gone: impl Fn(pg_sys::SubTransactionId) -> bool) {
    let pinned: Vec<Rc<Target>> = IN_USE.with(|u| match u.try_borrow_mut() {
        Ok(mut u) => {
            let keep = u.iter().position(|(subid, _)| gone(*subid)).unwrap_or(u.len());
            u.drain(keep..).map(|(_, t)| t).collect()
        }
        Err(_) => Vec::new(),
    });
    STALE.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => s.extend(pinned),
        Err(_) => std::mem::forget(pinned),
    });
    TRANSIENT.with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            let keep = t.iter().position(|(subid, _)| gone(*subid)).unwrap_or(t.len());
            t.truncate(keep);
        }
    });
}

fn current_subxact() -> pg_sys::SubTransactionId {
    // SAFETY: reads the current transaction state (a backend global); the
    // boundary write only runs inside a transaction.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// Moves invalidated entries to STALE and frees those no call uses.
fn collect_stale() {
    if FLUSH_ALL.with(|f| f.replace(false)) {
        let all: Vec<_> = TARGETS.with(|t| t.borrow_mut().drain().map(|(_, v)| v).collect());
        STALE.with(|s| s.borrow_mut().extend(all));
    }
    let free: Vec<_> = STALE.with(|s| {
        let mut s = s.borrow_mut();
        let (free, keep): (Vec<_>, Vec<_>) = s.drain(..).partition(|t| Rc::strong_count(t) == 1);
        *s = keep;
        free
    });
    drop(free);
}

/// A Rust (UTF-8) string in the server encoding, for input functions,
/// catalog lookups and SQL text ([`crate::pg::server_cstring`]); a NUL, which
/// no text holds, is bad input.
fn to_server(s: &str) -> CString {
    if s.contains('\0') {
        pgrx::error!("{FN}: a value contains a NUL character");
    }
    crate::pg::server_cstring(s)
}

/// `relid` as regclass prints it (qualified unless visible on the pinned search_path).
fn regclass_text(relid: pg_sys::Oid) -> String {
    // SAFETY: an OID is a valid regclass datum; regclassout accepts any OID.
    unsafe {
        owned(pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_REGCLASSOUT), pg_sys::Datum::from(relid)))
    }
}

fn target(relid: pg_sys::Oid) -> Result<Rc<Target>, Invalid> {
    collect_stale();
    if let Some(t) = TARGETS.with(|t| t.borrow().get(&relid).cloned()) {
        return Ok(t);
    }
    // Runs as the caller, as lease.protected is readable by every role. A
    // partition of a fenced table is fenced too (its fence trigger judges
    // each row against the protected ancestor's config), with the same
    // column names: the nearest protected table among it and its ancestors.
    let row = pgrx::spi::Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT t.token_column
                   FROM (SELECT p.token_column, a.n
                           FROM pg_catalog.pg_partition_ancestors($1) WITH ORDINALITY a (relid, n)
                           JOIN lease.protected p ON p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) a.relid::pg_catalog.oid
                         UNION ALL
                         SELECT p.token_column, 0 FROM lease.protected p
                          WHERE p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) $1) t
                  ORDER BY t.n LIMIT 1",
                Some(1),
                &[relid.into()],
            )
            .expect("reading lease.protected");
        (!rows.is_empty()).then(|| rows.first().get::<crate::pg::ServerText>(1).unwrap().map(|t| t.0))
    });
    let Some(token_column) = row else {
        let invalid = Invalid::new("55000", format!("{FN}: {} is not protected by pg_lease", regclass_text(relid)));
        let mut invalid = invalid.expect("a valid SQLSTATE");
        invalid.hint = Some("Protect it first with lease.protect() or lease.protect_high_water().".into());
        return Err(invalid);
    };
    let (schema, table) = crate::pg::relation_names(relid);
    // SAFETY: CacheMemoryContext lives as long as the backend; the new
    // context is deleted by the entry's Drop.
    let mcxt = unsafe {
        pg_sys::AllocSetContextCreateExtended(
            pg_sys::CacheMemoryContext,
            c"pg_lease boundary write".as_ptr(),
            pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
            pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
            pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
        )
    };
    let t = Rc::new(Target {
        relid,
        qualified: format!("{}.{}", quote_ident(&schema), quote_ident(&table)),
        display: regclass_text(relid),
        token_column,
        mcxt,
        columns: RefCell::default(),
        plans: RefCell::default(),
    });
    TARGETS.with(|m| m.borrow_mut().insert(relid, t.clone()));
    Ok(t)
}

impl Target {
    /// Column `name`, if the table has it (live, not a system column).
    fn column(&self, name: &str) -> Option<Rc<Column>> {
        if let Some(c) = self.columns.borrow().get(name) {
            return c.clone();
        }
        let server_name = to_server(name);
        // SAFETY: get_attnum and get_atttype are syscache lookups that accept
        // any name and attnum (a dropped or missing column gives
        // InvalidAttrNumber, a system column a negative number).
        let found = unsafe {
            let attnum = pg_sys::get_attnum(self.relid, server_name.as_ptr());
            (attnum > 0).then(|| (attnum, pg_sys::get_atttype(self.relid, attnum)))
        };
        let column = found.map(|(attnum, typid)| Rc::new(self.build_column(name, attnum, typid)));
        self.columns.borrow_mut().insert(name.to_owned(), column.clone());
        column
    }

    fn build_column(&self, name: &str, attnum: i16, typid: pg_sys::Oid) -> Column {
        let (mut t, mut typmod, mut coll) = (pg_sys::InvalidOid, -1, pg_sys::InvalidOid);
        let (mut input, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
        // SAFETY: syscache lookups writing into live locals (a missing
        // column or type raises an ERROR); the FmgrInfo is allocated in and
        // filled for the entry's own context, which outlives every use.
        let (finfo, base, base_is_array, is_composite) = unsafe {
            pg_sys::get_atttypetypmodcoll(self.relid, attnum, &mut t, &mut typmod, &mut coll);
            pg_sys::getTypeInputInfo(typid, &mut input, &mut ioparam);
            let finfo = pg_sys::MemoryContextAllocZero(self.mcxt, std::mem::size_of::<pg_sys::FmgrInfo>())
                as *mut pg_sys::FmgrInfo;
            pg_sys::fmgr_info_cxt(input, finfo, self.mcxt);
            let base = pg_sys::getBaseType(typid);
            (finfo, base, pg_sys::get_element_type(base) != pg_sys::InvalidOid, pg_sys::type_is_rowtype(base))
        };
        let kind = if typid == pg_sys::JSONOID || typid == pg_sys::JSONBOID {
            Kind::Json
        } else if base_is_array || is_composite || base == pg_sys::JSONOID || base == pg_sys::JSONBOID {
            let sql = format!(
                "SELECT (pg_catalog.jsonb_populate_record(NULL::{}, $1)).{}",
                self.qualified,
                quote_ident(name)
            );
            let sql = to_server(&sql);
            Kind::Populate(crate::pg::prepare_saved(&sql, &mut [pg_sys::JSONBOID], "a boundary write conversion"))
        } else {
            Kind::Scalar
        };
        Column { typid, typmod, ioparam, input: finfo, kind }
    }

    /// The INSERT of `rows` rows with exactly the columns `names` (sorted):
    /// its SQL and parameter types, and its plan once `insert_all` saved one.
    /// Boxed: `insert_all` reaches it by address.
    fn plan(&self, names: &[String], columns: &[Rc<Column>], rows: usize) -> *const SavedInsert {
        let key = (names.to_vec(), rows);
        if let Some(p) = self.plans.borrow().get(&key) {
            return &**p;
        }
        let keep = self.plans.borrow().len() < MAX_SAVED_PLANS;
        let sql = if names.is_empty() {
            format!("INSERT INTO {} DEFAULT VALUES", self.qualified)
        } else {
            let cols: Vec<_> = names.iter().map(|n| quote_ident(n)).collect();
            let tuples: Vec<_> = (0..rows)
                .map(|r| {
                    let params: Vec<_> = (1..=names.len()).map(|i| format!("${}", r * names.len() + i)).collect();
                    format!("({})", params.join(", "))
                })
                .collect();
            format!("INSERT INTO {} ({}) VALUES {}", self.qualified, cols.join(", "), tuples.join(", "))
        };
        let saved = Box::new(SavedInsert {
            sql: to_server(&sql),
            types: (0..rows).flat_map(|_| columns.iter().map(|c| c.typid)).collect(),
            plan: Cell::new(std::ptr::null_mut()),
            keep,
        });
        let p: *const SavedInsert = &*saved;
        if keep {
            self.plans.borrow_mut().insert(key, saved);
        } else {
            TRANSIENT.with(|t| t.borrow_mut().push((current_subxact(), saved)));
        }
        p
    }
}

/// An INSERT of a Target: prepared and saved by [`insert_all`] on first use,
/// outside pgrx's guard, so that an error in it (an identity or generated
/// column given a value) reaches the caller as Postgres raised it, with its
/// CONTEXT, after the values were checked.
pub struct SavedInsert {
    sql: CString,
    types: Vec<pg_sys::Oid>,
    plan: Cell<pg_sys::SPIPlanPtr>,
    /// Saved in its Target's cache (SPI_keepplan); false: made for one call
    /// (the cache is full), its plan left to SPI, which frees it with the
    /// call's connection.
    keep: bool,
}

/// Saved INSERTs per target at most: each column set and row count has one,
/// and a caller choosing column sets must not grow a pooled backend forever.
const MAX_SAVED_PLANS: usize = 128;

/// How many rows one INSERT takes at most (fewer when rows are wide: a
/// statement has at most 65535 parameters).
const MAX_ROWS_PER_INSERT: usize = 64;

/// Row counts of the INSERTs for `n` rows of `width` columns: powers of two,
/// largest first, so a few saved plans serve every count.
fn chunks(n: usize, width: usize) -> impl Iterator<Item = usize> {
    let most = 65535usize.checked_div(width).map_or(1, |fit| MAX_ROWS_PER_INSERT.min(fit).max(1));
    let most = 1 << most.ilog2();
    let mut left = n;
    std::iter::from_fn(move || {
        (left > 0).then(|| {
            let size = most.min(1 << left.ilog2());
            left -= size;
            size
        })
    })
}

/// One row to insert: its plan and its parameters (palloc'd in the SPI
/// procedure's context, freed by SPI_finish or abort).
#[derive(Clone, Copy)]
pub struct Insert {
    plan: *const SavedInsert,
    values: *mut pg_sys::Datum,
    nulls: *mut c_char,
}

/// What [`prepare`] hands to [`insert_all`] and [`finish`]: plain data, no destructors.
#[derive(Clone, Copy)]
pub struct Prepared {
    inserts: *const Insert,
    count: usize,
    /// Bound-token tables: the transaction's own binding to restore.
    restore: Option<Option<i64>>,
    /// The GUC nest level of the pinned search_path.
    nest: i32,
    /// The caller's search_path (palloc'd in the SPI procedure's context),
    /// for the inserts themselves.
    caller_search_path: *const c_char,
    /// This call's entry in ROWS.
    rows_at: usize,
    /// Where this call's one-call INSERTs start in TRANSIENT.
    transient_at: usize,
}

fn invalid(sqlstate: &str, message: String) -> Invalid {
    Invalid::new(sqlstate, message).expect("a valid SQLSTATE")
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Keys in jsonb's order: shorter first, then bytewise.
fn jsonb_key_order(a: &&String, b: &&String) -> std::cmp::Ordering {
    a.len().cmp(&b.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

fn escape_json(s: &str, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A value's text as jsonb prints it (`{"a": 1, "b": [true, null]}`).
fn jsonb_text(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => escape_json(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                jsonb_text(e, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort_by(jsonb_key_order);
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                escape_json(k, out);
                out.push_str(": ");
                jsonb_text(&m[k], out);
            }
            out.push('}');
        }
    }
}

fn to_jsonb_text(v: &Value) -> String {
    let mut s = String::new();
    jsonb_text(v, &mut s);
    s
}

/// Whether a JSON value equals the token as jsonb compares them (numbers by
/// numeric value; jsonb prints them in plain decimal).
fn equals_token(v: &Value, token: Option<i64>) -> bool {
    let (Some(token), Value::Number(n)) = (token, v) else { return token.is_none() && v.is_null() };
    let text = n.to_string();
    let text = match text.split_once('.') {
        Some((int, frac)) if frac.bytes().all(|b| b == b'0') => int.to_owned(),
        Some(_) => return false,
        None => text,
    };
    text.parse::<i64>().is_ok_and(|n| n == token)
}

/// The error of element `i`, whose token column `column` holds `value`,
/// which is not the call's `token`.
fn contradiction(i: usize, column: &str, token: Option<i64>, value: &Value) -> Invalid {
    let call = token.map_or_else(|| "NULL".to_owned(), |t| t.to_string());
    invalid(
        "22023",
        format!(
            "{FN}: a row contradicts the call's token {call}: element {i} carries {column} = {}",
            to_jsonb_text(value)
        ),
    )
}

/// The five characters of an encoded SQLSTATE.
fn sqlstate_text(code: i32) -> String {
    (0..5).map(|i| (((code >> (6 * i)) & 0x3F) as u8 + b'0') as char).collect()
}

/// Reads the call's arguments and does everything before the inserts.
///
/// # Safety
/// `fcinfo` is the call's, with arguments (regclass, int8, jsonb) or NULLs.
pub unsafe fn prepare(fcinfo: pg_sys::FunctionCallInfo) -> Result<Prepared, Invalid> {
    // SAFETY: the caller's contract: three arguments.
    let arg = |i: usize| unsafe {
        let a = &*(*fcinfo).args.as_ptr().add(i);
        (!a.isnull).then_some(a.value)
    };
    let Some(relid) = arg(0).map(|d| pg_sys::Oid::from(d.value() as u32)) else {
        return Err(invalid("22004", format!("{FN}: target must not be NULL")));
    };
    // SAFETY: paired with SPI_finish in `finish`; an ERROR (or bad input,
    // raised as one) in between aborts the (sub)transaction, which cleans
    // the connection up. Plans are prepared inside it.
    unsafe { pg_sys::SPI_connect() };
    // The caller's search_path, for the inserts (insert_all): the table's
    // triggers, rules and defaults run as they do for the caller's own
    // INSERT. (The INSERT's text names nothing but the qualified table and
    // its columns.)
    // SAFETY: GetConfigOption returns the current value (never NULL for a
    // built-in setting), copied at once into the SPI procedure's context.
    let caller_search_path =
        unsafe { pg_sys::pstrdup(pg_sys::GetConfigOption(c"search_path".as_ptr(), false, false)) }.cast_const();
    // As the SQL function did (SET search_path = pg_catalog, pg_temp): the
    // names in messages and the input functions see that path, whatever the
    // caller's.
    // SAFETY: opens a GUC nest level, closed in `finish` (or by abort).
    let nest = unsafe { pg_sys::NewGUCNestLevel() };
    set_guc(c"search_path", c"pg_catalog, pg_temp", pg_sys::GucAction::GUC_ACTION_SAVE);
    let target = target(relid)?;
    check_schema_usage(relid)?;
    let token = arg(1).map(|d| d.value() as i64);
    if let Some(t) = token.filter(|t| *t < 0) {
        return Err(invalid("22023", format!("{FN}: token must not be negative (got {t})")));
    }
    let parsed: Option<Result<Result<Value, serde_json::Error>, Invalid>> = arg(2).map(|d| {
        // SAFETY: a non-NULL jsonb datum; its output function returns a palloc'd C string.
        let text = unsafe { CStr::from_ptr(pg_sys::OidOutputFunctionCall(pg_sys::Oid::from(pg_sys::F_JSONB_OUT), d)) };
        // Values and column names go back into SQL: they must come back as
        // they are, so a text with no exact UTF-8 form is refused (22P05).
        let text = crate::pg::try_exact_from_server(text.to_bytes()).map_err(|_| {
            let mut e = invalid(
                "22P05",
                format!(
                    "{FN}: rows hold a character with no exact UTF-8 form in this {} database",
                    crate::pg::encoding_name()
                ),
            );
            e.detail = Some(crate::pg::INEXACT_DETAIL.into());
            e.hint = Some(crate::pg::INEXACT_HINT.into());
            e
        })?;
        Ok(serde_json::from_str(&text))
    });
    // jsonb is valid JSON; what serde_json refuses is nesting deeper than it reads (128).
    let parsed =
        parsed.transpose()?.transpose().map_err(|e| invalid("54001", format!("{FN}: rows cannot be read: {e}")))?;
    let elements = match parsed {
        Some(Value::Array(a)) => a,
        other => {
            let got = other.as_ref().map_or("NULL", json_type);
            return Err(invalid("22023", format!("{FN}: rows must be a JSON array of objects, got {got}")));
        }
    };
    let mut rows = Vec::with_capacity(elements.len());
    for (i, e) in elements.into_iter().enumerate() {
        match e {
            Value::Object(m) => rows.push(m),
            other => {
                let what = json_type(&other);
                return Err(invalid(
                    "22023",
                    format!("{FN}: rows must be a JSON array of objects: element {i} is {what}"),
                ));
            }
        }
    }
    let mut unknown: Vec<String> =
        rows.iter().flat_map(|r| r.keys()).filter(|k| target.column(k).is_none()).map(|k| quote_ident(k)).collect();
    if !unknown.is_empty() {
        unknown.sort();
        unknown.dedup();
        return Err(invalid("42703", format!("{FN}: {} has no column(s) {}", target.display, unknown.join(", "))));
    }
    let restore = match &target.token_column {
        Some(tc) => {
            // (A string is converted by the column's input function, as
            // any column's string value is, and compared once converted.)
            for (i, r) in rows.iter().enumerate() {
                if let Some(v) = r.get(tc).filter(|v| !v.is_string() && !equals_token(v, token)) {
                    return Err(contradiction(i, tc, token, v));
                }
            }
            let stamp = token.map_or(Value::Null, |t| Value::Number(t.into()));
            for r in rows.iter_mut() {
                if !r.get(tc).is_some_and(Value::is_string) {
                    r.insert(tc.clone(), stamp.clone());
                }
            }
            None
        }
        None => {
            let previous = gucs::bound_token();
            bind_token(token);
            Some(previous)
        }
    };

    // Rows are inserted in groups with the same keys (in the order each
    // group first appears), so a column an object leaves out takes its default.
    let mut groups: Vec<(Vec<String>, Vec<usize>)> = Vec::new();
    let mut group_of: FastMap<Vec<String>, usize> = FastMap::default();
    for (i, r) in rows.iter().enumerate() {
        let keys: Vec<String> = r.keys().cloned().collect(); // a BTreeMap: sorted
        let g = *group_of.entry(keys.clone()).or_insert_with(|| {
            groups.push((keys, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }

    let transient_at = TRANSIENT.with(|t| t.borrow().len());
    IN_USE.with(|u| u.borrow_mut().push((current_subxact(), target.clone())));

    // Where each element's values go: (insert index) per element.
    let n = rows.len();
    // SAFETY: palloc in the SPI procedure context (current after SPI_connect).
    let inserts = unsafe { pg_sys::palloc(std::mem::size_of::<Insert>() * n.max(1)) as *mut Insert };
    // Where each element's values go: (INSERT, first parameter, columns).
    let mut slot_of = vec![(0usize, 0usize, Vec::new()); n];
    let mut k = 0;
    for (names, members) in &groups {
        let columns: Vec<Rc<Column>> = names.iter().map(|c| target.column(c).expect("checked above")).collect();
        let width = names.len();
        let mut members = members.iter();
        for rows_in_chunk in chunks(members.len(), width) {
            let plan = target.plan(names, &columns, rows_in_chunk);
            let params = (width * rows_in_chunk).max(1);
            // SAFETY: palloc'd arrays of `params` entries in the SPI context;
            // each of the `k < n` slots of `inserts` is written once.
            unsafe {
                let values = pg_sys::palloc0(std::mem::size_of::<pg_sys::Datum>() * params) as *mut pg_sys::Datum;
                let nulls = pg_sys::palloc0(params) as *mut c_char;
                inserts.add(k).write(Insert { plan, values, nulls });
            }
            for (row, &i) in members.by_ref().take(rows_in_chunk).enumerate() {
                slot_of[i] = (k, row * width, columns.clone());
            }
            k += 1;
        }
    }

    // Every value converted before anything is inserted, element by element
    // and key by key in jsonb's order: the first bad one is named.
    let place: Cell<(usize, *const String)> = Cell::new((0, std::ptr::null()));
    let seen = std::panic::AssertUnwindSafe(&place);
    let converted = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        for (i, r) in rows.iter().enumerate() {
            let (k, first, columns) = &slot_of[i];
            // SAFETY: slot k was written above.
            let ins = unsafe { inserts.add(*k).read() };
            let mut keys: Vec<(usize, &String)> = r.keys().enumerate().collect();
            keys.sort_by(|a, b| jsonb_key_order(&a.1, &b.1));
            for (pos, key) in keys {
                place.set((i, key as *const String));
                let (datum, isnull) = convert(&columns[pos], key, &r[key]);
                // The token column: the call's token, or a value equal to it.
                if target.token_column.as_ref() == Some(key)
                    && (if isnull { token.is_some() } else { Some(datum.value() as i64) != token })
                {
                    return Err(contradiction(i, key, token, &r[key]));
                }
                // SAFETY: `first + pos` < the INSERT's parameter count (this
                // row's place in it times its width, plus a column of it).
                unsafe {
                    *ins.values.add(first + pos) = datum;
                    *ins.nulls.add(first + pos) = if isnull { b'n' as c_char } else { b' ' as c_char };
                }
            }
        }
        Ok(())
    }))
    .catch_others(move |e| match e {
        // Bad input of one element's value: a data exception, or a domain's
        // NOT NULL refusing its null (named as NOT NULL columns are; a
        // domain's CHECK is raised as Postgres raises it, as in 0.5.0).
        CaughtError::PostgresError(ref report)
            if matches!(sqlstate_text(report.sql_error_code() as i32).as_str(), c if c.starts_with("22") || c == "23502") =>
        {
            let (i, key) = seen.get();
            // SAFETY: `key` points to a key of `rows`, alive and unmoved here.
            let key = unsafe { &*key };
            let code = sqlstate_text(report.sql_error_code() as i32);
            let mut err = invalid(&code, format!("{FN}: rows[{i}].{key}: {}", report.message()));
            err.detail = report.detail().map(str::to_owned);
            Err(err)
        }
        other => other.rethrow(),
    })
    .execute();
    converted?;
    // SAFETY: only this call's own entry is ever read through a reference,
    // by the callback, never across this push.
    let rows_at = ROWS.with(|r| unsafe {
        let stack = &mut *r.get();
        stack.push((current_subxact(), rows));
        stack.len() - 1
    });
    Ok(Prepared { inserts, count: k, restore, nest, caller_search_path, rows_at, transient_at })
}

/// The caller's USAGE on the target's schema, which a saved INSERT (naming the
/// table schema-qualified) checked only when another caller prepared it: the
/// plan cache is per backend, shared by every role a pooled backend serves.
fn check_schema_usage(relid: pg_sys::Oid) -> Result<(), Invalid> {
    // SAFETY: syscache lookups and an ACL check of the current user on an
    // existing schema (the target was just resolved); names are palloc'd.
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        #[cfg(not(feature = "pg18"))]
        let acl = pg_sys::pg_namespace_aclcheck(namespace, pg_sys::GetUserId(), pg_sys::ACL_USAGE as pg_sys::AclMode);
        #[cfg(feature = "pg18")]
        let acl = pg_sys::object_aclcheck(
            pg_sys::NamespaceRelationId,
            namespace,
            pg_sys::GetUserId(),
            pg_sys::ACL_USAGE as pg_sys::AclMode,
        );
        if acl == pg_sys::AclResult::ACLCHECK_OK {
            return Ok(());
        }
        Err(invalid("42501", format!("permission denied for schema {}", owned(pg_sys::get_namespace_name(namespace)))))
    }
}

/// Binds `token` (or nothing) for this transaction, as `set_config('pg_lease.token', ..., true)`.
fn bind_token(token: Option<i64>) {
    let value = CString::new(token.map(|t| t.to_string()).unwrap_or_default()).expect("digits");
    set_guc(c"pg_lease.token", &value, pg_sys::GucAction::GUC_ACTION_LOCAL);
}

/// One JSON value as a value of `column`: (datum, isnull).
fn convert(column: &Column, key: &str, v: &Value) -> (pg_sys::Datum, bool) {
    let text = match (&column.kind, v) {
        (Kind::Populate(plan), _) => return populate(*plan, key, v),
        (_, Value::Null) => None,
        (Kind::Json, v) => Some(to_jsonb_text(v)),
        (Kind::Scalar, Value::String(s)) => Some(s.clone()),
        (Kind::Scalar, v) => Some(to_jsonb_text(v)),
    };
    let text = text.map(|t| to_server(&t));
    let ptr = text.as_ref().map_or(std::ptr::null_mut(), |t| t.as_ptr() as *mut c_char);
    // SAFETY: `input` is the column type's input function (FmgrInfo filled
    // for it), `ptr` NULL or a NUL-terminated string alive across the call.
    // A NULL goes through too: a domain's input function checks it.
    let datum = unsafe { pg_sys::InputFunctionCall(column.input, ptr, column.ioparam, column.typmod) };
    (datum, text.is_none())
}

/// `(jsonb_populate_record(NULL::target, {key: v})).key` for the types it treats specially.
fn populate(plan: pg_sys::SPIPlanPtr, key: &str, v: &Value) -> (pg_sys::Datum, bool) {
    let mut obj = String::new();
    escape_json(key, &mut obj);
    obj.push_str(": ");
    jsonb_text(v, &mut obj);
    let obj = to_server(&format!("{{{obj}}}"));
    let (mut input, mut ioparam) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: jsonb's input function on a NUL-terminated string; the plan
    // takes one jsonb parameter and returns one column; the result tuple
    // lives in the SPI procedure context until SPI_finish.
    unsafe {
        pg_sys::getTypeInputInfo(pg_sys::JSONBOID, &mut input, &mut ioparam);
        let mut arg = [pg_sys::OidInputFunctionCall(input, obj.as_ptr() as *mut c_char, ioparam, -1)];
        let rc = pg_sys::SPI_execute_plan(plan, arg.as_mut_ptr(), std::ptr::null(), true, 1);
        if rc != pg_sys::SPI_OK_SELECT as i32 || pg_sys::SPI_processed != 1 {
            pgrx::error!("{FN}: converting a value failed (SPI code {rc})");
        }
        let table = &*pg_sys::SPI_tuptable;
        let mut isnull = false;
        let datum = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut isnull);
        (datum, isnull)
    }
}

extern "C-unwind" {
    // Our own bindings: pgrx's wrappers turn an ERROR into a Rust panic,
    // which would lose the fence's LF SQLSTATE; these let it longjmp through.
    #[link_name = "SPI_execute_plan"]
    fn spi_execute_plan(
        plan: pg_sys::SPIPlanPtr,
        values: *mut pg_sys::Datum,
        nulls: *const c_char,
        read_only: bool,
        tcount: std::ffi::c_long,
    ) -> i32;
    #[link_name = "SPI_prepare"]
    fn spi_prepare(src: *const c_char, nargs: i32, argtypes: *mut pg_sys::Oid) -> pg_sys::SPIPlanPtr;
    #[link_name = "SPI_keepplan"]
    fn spi_keepplan(plan: pg_sys::SPIPlanPtr) -> i32;
    #[link_name = "geterrcode"]
    fn geterrcode() -> i32;
    #[link_name = "CopyErrorData"]
    fn copy_error_data() -> *mut pg_sys::ErrorData;
}

const NOT_NULL_VIOLATION: i32 = 2 | (3 << 6) | (5 << 12) | (2 << 24);

/// The error context callback around the inserts.
#[repr(C)]
struct Watch {
    cb: pg_sys::ErrorContextCallback,
    mcxt: pg_sys::MemoryContext,
    rows_at: usize,
}

/// A NOT NULL violation of one of our INSERTs names its element and column,
/// `rows[1].player: null value in column ...`: the first element with an
/// explicit null there, else the first that leaves the column out. It is
/// raised in place of the original error (as an error raised in a context
/// callback is: Postgres abandons the original), with its DETAIL and without
/// CONTEXT lines, as bad input is.
unsafe extern "C-unwind" fn name_null_column(arg: *mut c_void) {
    let watch = arg as *mut Watch;
    // SAFETY: `arg` is the Watch of `insert_all`, alive while it is on the
    // error context stack; errfinish calls this for the error on top of the
    // error stack, and error_context_stack is the innermost callback. The
    // copy of the error is made in the SPI procedure context, which the
    // throw below (resetting ErrorContext) leaves alone; `named` owns no
    // Rust value once it returns, and `raise` consumes the Invalid.
    unsafe {
        if geterrcode() != NOT_NULL_VIOLATION {
            return;
        }
        // Only the INSERT's own error (SPI's callback directly inside ours),
        // not one raised, and perhaps caught, deeper in a trigger.
        let top = pg_sys::error_context_stack;
        if top.is_null() || (*top).previous != std::ptr::addr_of_mut!((*watch).cb) {
            return;
        }
        let saved = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = (*watch).mcxt;
        let edata = copy_error_data();
        match named(&*edata, (*watch).rows_at) {
            Some(invalid) => crate::errors::raise(invalid),
            None => pg_sys::CurrentMemoryContext = saved,
        }
    }
}

/// The NOT NULL violation `e` with the element and column named, if one is.
fn named(e: &pg_sys::ErrorData, rows_at: usize) -> Option<Invalid> {
    if e.column_name.is_null() {
        return None;
    }
    // SAFETY: fields of a complete ErrorData copy: NUL-terminated or NULL.
    let (column, message, detail) = unsafe { (owned(e.column_name), owned(e.message), owned(e.detail)) };
    let place = ROWS.with(|r| {
        // SAFETY: the rows of the call in progress, only read here.
        let rows = unsafe { &(&*r.get()).get(rows_at)?.1 };
        let explicit = rows.iter().position(|r| r.get(&column) == Some(&Value::Null));
        explicit.or_else(|| rows.iter().position(|r| !r.contains_key(&column)))
    })?;
    let mut err = invalid("23502", format!("{FN}: rows[{place}].{column}: {message}"));
    err.detail = Some(detail).filter(|d| !d.is_empty());
    Some(err)
}

/// Runs the inserts; returns the number of rows inserted, or a negative SPI code.
///
/// # Safety
/// Call from an unguarded C entry point whose frame holds nothing with a
/// destructor (an ERROR longjmps through), with what `prepare` returned.
#[inline(always)]
pub unsafe fn insert_all(p: &Prepared) -> i64 {
    // SAFETY: a plain C struct on this frame, linked into the error context
    // stack for the loop and unlinked after it (an ERROR's handler restores
    // the stack it saved, which does not include it). `inserts` and their
    // parameter arrays live in the SPI procedure context; each SavedInsert is
    // boxed in a Target that this call pinned (IN_USE), so it stays put and
    // alive even if the Target is invalidated meanwhile.
    unsafe {
        let mut watch = Watch {
            cb: pg_sys::ErrorContextCallback {
                previous: pg_sys::error_context_stack,
                callback: Some(name_null_column),
                arg: std::ptr::null_mut(),
            },
            mcxt: pg_sys::CurrentMemoryContext,
            rows_at: p.rows_at,
        };
        watch.cb.arg = std::ptr::addr_of_mut!(watch) as *mut c_void;
        pg_sys::error_context_stack = std::ptr::addr_of_mut!(watch.cb);
        // The inserts run under the caller's search_path (see `prepare`), in
        // a GUC nest level of their own, closed after the loop (or by abort).
        let inner = pg_sys::NewGUCNestLevel();
        set_guc(c"search_path", CStr::from_ptr(p.caller_search_path), pg_sys::GucAction::GUC_ACTION_SAVE);
        let mut total = 0i64;
        for i in 0..p.count {
            let ins = *p.inserts.add(i);
            let saved = &*ins.plan;
            if saved.plan.get().is_null() {
                let plan = spi_prepare(saved.sql.as_ptr(), saved.types.len() as i32, saved.types.as_ptr().cast_mut());
                if plan.is_null() || (saved.keep && spi_keepplan(plan) != 0) {
                    total = -1;
                    break;
                }
                saved.plan.set(plan);
            }
            let rc = spi_execute_plan(saved.plan.get(), ins.values, ins.nulls, false, 0);
            // A DO INSTEAD rule on the target rewrites the INSERT: it ran,
            // with whatever rows its replacement touched.
            if rc != pg_sys::SPI_OK_INSERT as i32 && rc != pg_sys::SPI_OK_REWRITTEN as i32 {
                total = rc as i64;
                break;
            }
            total += pg_sys::SPI_processed as i64;
        }
        pg_sys::AtEOXact_GUC(true, inner);
        pg_sys::error_context_stack = watch.cb.previous;
        total
    }
}

/// After the inserts: closes SPI, restores the transaction's binding.
pub fn finish(p: &Prepared, total: i64) -> pg_sys::Datum {
    // SAFETY: the connection opened in `prepare`.
    unsafe { pg_sys::SPI_finish() };
    if total < 0 {
        pgrx::error!("{FN}: insert failed (SPI code {total})");
    }
    if let Some(previous) = p.restore {
        bind_token(previous);
    }
    // SAFETY: the level `prepare` opened, still the innermost: the inserts
    // returned normally, so every level they opened they also closed.
    unsafe { pg_sys::AtEOXact_GUC(true, p.nest) };
    IN_USE.with(|u| {
        u.borrow_mut().pop();
    });
    // SAFETY: no reference into ROWS is held; entries above this call's
    // (nested calls that failed) are dropped with it.
    ROWS.with(|r| unsafe { (&mut *r.get()).truncate(p.rows_at) });
    // Its one-call INSERTs (and those of calls it made, which ended before it).
    TRANSIENT.with(|t| t.borrow_mut().truncate(p.transient_at));
    pg_sys::Datum::from(total)
}
