//! Thin safe wrappers over `pg_sys`: catalogs, names, datums, rows, trigger
//! calls, roles, saved plans. Depends on nothing else in pg_lease; every other
//! module reads Postgres through these (or through pgrx) rather than raw
//! pointers of its own.

use pgrx::pg_sys;
use std::ffi::CStr;

/// A C string owned by Postgres, copied into Rust (NULL becomes empty).
pub(crate) unsafe fn owned(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// (schema, relation name) of `relid`.
pub fn relation_names(relid: pg_sys::Oid) -> (String, String) {
    unsafe {
        let schema = owned(pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid)));
        let table = owned(pg_sys::get_rel_name(relid));
        (schema, table)
    }
}

/// An identifier quoted the way Postgres quotes it (only when needed).
pub fn quote_ident(name: &str) -> String {
    let cname = std::ffi::CString::new(name).expect("identifiers have no NUL");
    unsafe { owned(pg_sys::quote_identifier(cname.as_ptr())) }
}

pub fn qualified_name(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// The role that owns `relid` (lookups run as it, as RI triggers do).
pub fn rel_owner(relid: pg_sys::Oid) -> pg_sys::Oid {
    pgrx::spi::Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT relowner FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) $1",
        &[relid.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(pg_sys::InvalidOid)
}

/// Prepares `sql` with SPI and keeps the plan for the life of the backend.
/// Call inside an SPI connection.
pub unsafe fn prepare_saved(sql: &CStr, argtypes: &mut [pg_sys::Oid], what: &str) -> pg_sys::SPIPlanPtr {
    let plan = pg_sys::SPI_prepare(sql.as_ptr(), argtypes.len() as i32, argtypes.as_mut_ptr());
    if plan.is_null() {
        pgrx::error!("pg_lease: could not prepare {what}");
    }
    pg_sys::SPI_keepplan(plan);
    plan
}

/// Whether a column of type `typid` can hold a fencing token: int2, int4 or
/// int8 (`lease.protect` creates bigint ones; narrower ones it accepts).
pub fn is_token_type(typid: pg_sys::Oid) -> bool {
    typid == pg_sys::INT8OID || typid == pg_sys::INT4OID || typid == pg_sys::INT2OID
}

/// A token datum of a type [`is_token_type`] accepts, as i64.
#[inline]
pub fn token_from_datum(datum: pg_sys::Datum, typid: pg_sys::Oid) -> i64 {
    debug_assert!(is_token_type(typid));
    if typid == pg_sys::INT8OID {
        datum.value() as i64
    } else if typid == pg_sys::INT4OID {
        datum.value() as i32 as i64
    } else {
        datum.value() as i16 as i64
    }
}

/// The text form of a datum, for messages (slow path only).
pub fn datum_text(datum: pg_sys::Datum, typid: pg_sys::Oid) -> String {
    unsafe {
        let (mut out, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo(typid, &mut out, &mut varlena);
        owned(pg_sys::OidOutputFunctionCall(out, datum))
    }
}

/// Runs `f` as `role` with `flags` added to the security context, restoring
/// both afterwards (on error, (sub)transaction abort restores them).
fn with_user<R>(role: pg_sys::Oid, flags: u32, f: impl FnOnce() -> R) -> R {
    // SAFETY: saves and restores the current user and security context.
    unsafe {
        let (mut saved_user, mut saved_ctx) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_ctx);
        pg_sys::SetUserIdAndSecContext(role, saved_ctx | (pg_sys::SECURITY_LOCAL_USERID_CHANGE | flags) as i32);
        let r = f();
        pg_sys::SetUserIdAndSecContext(saved_user, saved_ctx);
        r
    }
}

/// Runs `f` as `role`, the way ri_triggers.c runs its checks as the owner of
/// the referenced table: the writer needs no privileges on pg_lease's lookups,
/// and row-level security cannot hide an owner row from the fence.
pub fn as_role<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(role, pg_sys::SECURITY_NOFORCE_RLS, f)
}

/// A type's name as Postgres prints it (`numeric`, `character varying`).
pub fn type_name(typid: pg_sys::Oid) -> String {
    // SAFETY: format_type_be returns a palloc'd C string or raises.
    unsafe { owned(pg_sys::format_type_be(typid)) }
}

/// `schema.table` of `relid`, quoted as needed.
pub fn display(relid: pg_sys::Oid) -> String {
    let (schema, table) = relation_names(relid);
    qualified_name(&schema, &table)
}

/// Runs `f` as the owner of `relid` in a security-restricted operation (as
/// VACUUM and REFRESH MATERIALIZED VIEW run user code): whatever that code is
/// (triggers, constraints, casts, operators of the table's types), it runs
/// with no more than the table owner's rights, and cannot SET ROLE or leave
/// state behind. pg_lease's SECURITY DEFINER code touches users' tables only
/// through this.
pub fn as_table_owner<R>(relid: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    with_user(rel_owner(relid), pg_sys::SECURITY_RESTRICTED_OPERATION, || {
        // SAFETY: settings the user code makes are undone at this nest level.
        let nest = unsafe { pg_sys::NewGUCNestLevel() };
        let r = f();
        unsafe { pg_sys::AtEOXact_GUC(true, nest) };
        r
    })
}

/// (attnum, type) of column `name` of `relid`, if it exists.
pub fn attribute(relid: pg_sys::Oid, name: &str) -> Option<(i16, pg_sys::Oid)> {
    let cname = std::ffi::CString::new(name).expect("column names have no NUL");
    // SAFETY: syscache lookups.
    unsafe {
        let attnum = pg_sys::get_attnum(relid, cname.as_ptr());
        (attnum > 0).then(|| (attnum, pg_sys::get_atttype(relid, attnum)))
    }
}

/// The collation of column `attnum` of `relid`.
pub fn attcollation(relid: pg_sys::Oid, attnum: i16) -> pg_sys::Oid {
    let (mut typid, mut typmod, mut collation) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
    // SAFETY: a syscache lookup of an existing column; raises if it is gone.
    unsafe { pg_sys::get_atttypetypmodcoll(relid, attnum, &mut typid, &mut typmod, &mut collation) };
    collation
}

/// `o.k1 OPERATOR(pg_catalog.=) $1 AND ...`: an owner row by its key columns,
/// the parameters numbered from 1 in column order.
pub fn key_match<S: AsRef<str>>(columns: &[S]) -> String {
    columns
        .iter()
        .enumerate()
        .map(|(i, name)| format!("o.{} OPERATOR(pg_catalog.=) ${}", quote_ident(name.as_ref()), i + 1))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The OID of one of pg_lease's own relations (`lease.protected`, ...).
pub fn own_relid(name: &str) -> pg_sys::Oid {
    pgrx::spi::Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT $1::pg_catalog.text::pg_catalog.regclass::pg_catalog.oid",
        &[name.into()],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("{name} exists"))
}

/// A text[] datum of `elems` (text datums), in the current memory context.
pub fn text_array(elems: &[pg_sys::Datum]) -> pg_sys::Datum {
    // SAFETY: text elements, by reference, int-aligned, as construct_array
    // expects; it copies them.
    unsafe {
        let array = pg_sys::construct_array(
            elems.as_ptr() as *mut pg_sys::Datum,
            elems.len() as i32,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
        );
        pg_sys::Datum::from(array)
    }
}

/// A heap tuple together with the descriptor it was formed with: the only way
/// pg_lease reads a row's columns.
#[derive(Clone, Copy)]
pub struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    /// # Safety
    /// `tuple` is a valid heap tuple formed with `desc`, and both stay valid
    /// (not freed, not modified) for as long as the `Row` or a copy is used.
    pub unsafe fn new(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
        Row { tuple, desc }
    }

    /// Column `attnum` (1-based), None when NULL.
    #[inline]
    pub fn attr(self, attnum: i16) -> Option<pg_sys::Datum> {
        let mut isnull = false;
        // SAFETY: `new`'s contract: a valid tuple and its descriptor;
        // heap_getattr returns NULL for attribute numbers past the tuple's.
        let d = unsafe { pg_sys::heap_getattr(self.tuple, attnum as i32, self.desc, &mut isnull) };
        (!isnull).then_some(d)
    }

    pub fn tuple(self) -> pg_sys::HeapTuple {
        self.tuple
    }

    pub fn desc(self) -> pg_sys::TupleDesc {
        self.desc
    }
}

/// The call of a trigger function: the event, the relation and its rows.
pub struct TriggerCall<'a> {
    td: &'a pg_sys::TriggerData,
}

/// What fired a row or statement trigger.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TriggerOp {
    Insert,
    Update,
    Delete,
    Truncate,
}

impl TriggerOp {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerOp::Insert => "INSERT",
            TriggerOp::Update => "UPDATE",
            TriggerOp::Delete => "DELETE",
            TriggerOp::Truncate => "TRUNCATE",
        }
    }
}

impl<'a> TriggerCall<'a> {
    /// The trigger call `fcinfo` carries; an ERROR naming `function` when it
    /// was not called by the trigger manager.
    ///
    /// # Safety
    /// `fcinfo` is the FunctionCallInfo Postgres passed to a version-1 C
    /// function, valid for `'a` (the call).
    pub unsafe fn from_fcinfo(fcinfo: pg_sys::FunctionCallInfo, function: &str) -> TriggerCall<'a> {
        // SAFETY: the caller's contract; `context` is a Node or null, and a
        // T_TriggerData node is a TriggerData (CALLED_AS_TRIGGER).
        unsafe {
            let ctx = (*fcinfo).context;
            if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
                pgrx::error!("{function}() may only be called as a trigger");
            }
            TriggerCall { td: &*(ctx as *const pg_sys::TriggerData) }
        }
    }

    /// Whether this is a BEFORE ... FOR EACH ROW call.
    pub fn is_before_row(&self) -> bool {
        let event = self.td.tg_event;
        event & pg_sys::TRIGGER_EVENT_ROW != 0
            && event & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_BEFORE
    }

    pub fn op(&self) -> TriggerOp {
        match self.td.tg_event & pg_sys::TRIGGER_EVENT_OPMASK {
            pg_sys::TRIGGER_EVENT_INSERT => TriggerOp::Insert,
            pg_sys::TRIGGER_EVENT_UPDATE => TriggerOp::Update,
            pg_sys::TRIGGER_EVENT_DELETE => TriggerOp::Delete,
            _ => TriggerOp::Truncate,
        }
    }

    /// The OID of the relation the trigger fired on.
    pub fn relid(&self) -> pg_sys::Oid {
        // SAFETY: the trigger manager's relation is open for the whole call.
        unsafe { (*self.td.tg_relation).rd_id }
    }

    fn desc(&self) -> pg_sys::TupleDesc {
        // SAFETY: as in `relid`.
        unsafe { (*self.td.tg_relation).rd_att }
    }

    /// The inserted row (INSERT), the old row (UPDATE, DELETE); None for
    /// statement-level calls.
    pub fn trigtuple(&self) -> Option<Row> {
        // SAFETY: the trigger manager's tuples are formed with the relation's
        // descriptor and live for the whole call.
        (!self.td.tg_trigtuple.is_null()).then(|| unsafe { Row::new(self.td.tg_trigtuple, self.desc()) })
    }

    /// The new row of an UPDATE.
    pub fn newtuple(&self) -> Option<Row> {
        // SAFETY: as in `trigtuple`.
        (!self.td.tg_newtuple.is_null()).then(|| unsafe { Row::new(self.td.tg_newtuple, self.desc()) })
    }

    /// What a BEFORE row trigger returns to let the row through unchanged.
    pub fn pass(&self) -> pg_sys::Datum {
        match self.op() {
            TriggerOp::Update => pg_sys::Datum::from(self.td.tg_newtuple),
            _ => pg_sys::Datum::from(self.td.tg_trigtuple),
        }
    }

    /// The trigger's arguments (`tgargs`).
    pub fn args(&self) -> Vec<String> {
        // SAFETY: tg_trigger and its tgnargs C strings belong to the relcache
        // entry, valid for the call.
        unsafe {
            let trigger = &*self.td.tg_trigger;
            (0..trigger.tgnargs as usize).map(|i| owned(*trigger.tgargs.add(i))).collect()
        }
    }
}

/// The first row of a saved one-row plan: its first column, an integer token
/// (None: no row; Some(None): NULL), and its second column as an oid
/// (InvalidOid when absent or NULL). Runs the plan as `role`.
///
/// # Safety
/// `plan` is a saved SPI plan taking `args.len()` parameters of the types the
/// datums in `args` have, whose first column is int2, int4 or int8.
pub unsafe fn run_token_plan(
    plan: pg_sys::SPIPlanPtr,
    args: &mut [pg_sys::Datum],
    role: pg_sys::Oid,
) -> (Option<Option<i64>>, pg_sys::Oid) {
    // SAFETY: the caller's contract for the plan and its arguments; the SPI
    // connection is opened and closed here (an error inside aborts the
    // (sub)transaction, which cleans SPI up).
    unsafe {
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
}
