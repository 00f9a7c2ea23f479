//! The C-ABI boundary: every SQL-callable function that can refuse with an
//! `LF` code enters pg_lease here.
//!
//! Each entry point is a plain version-1 C function ([`c_function!`]) whose
//! body runs one step at a time, top to bottom:
//! 1. the work (the fence's verdict on a row, a guard, ...) runs under pgrx's
//!    guard, so Rust panics and Postgres errors inside it are reported
//!    normally; it returns the datum to hand back, or a [`Refusal`];
//! 2. still under the guard, the protected table's counters count the row as
//!    accepted or refused ([`audit::count`], the one place either is counted)
//!    and a refusal is handed to the audit ([`audit::on_refusal`]: LOG line,
//!    queued record);
//! 3. outside the guard, a refusal is raised with its own SQLSTATE
//!    ([`errors::raise`]).

use crate::audit::{self, Outcome};
use crate::errors::{self, Failure, Invalid, LeaseError, Refusal};
use crate::fence;
use crate::lease;
use crate::lease_calls::{self, Label};
use crate::pg::{owned, text_datum, RowSink, TriggerCall};
use pgrx::pg_sys;

/// Runs `work` under pgrx's guard, counts and audits its verdict, and raises
/// a refusal with its SQLSTATE.
///
/// # Safety
/// Call only as the whole body of a version-1 C function (see [`c_function!`]):
/// [`errors::raise`] longjmps out of this frame.
#[inline(always)]
unsafe fn run(work: impl FnOnce() -> Outcome) -> pg_sys::Datum {
    let judged = || {
        let mut outcome = work();
        audit::count(&outcome);
        if let Err(refusal) = &mut outcome.result {
            audit::on_refusal(refusal);
            fence::refusal::in_replication_worker(refusal);
        }
        outcome.result
    };
    // SAFETY: the guard catches Rust panics and Postgres errors raised in
    // `judged` and reports them normally; called from a C entry point.
    match unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(judged) } {
        Ok(datum) => datum,
        // SAFETY: this frame holds nothing with a destructor (the closure and
        // its captures were consumed by the guard); our caller is the C entry.
        Err(refusal) => unsafe { errors::raise(refusal) },
    }
}

/// [`run`] for work that returns a plain result.
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn run_refusing<T: Into<Outcome>>(work: impl FnOnce() -> T) -> pg_sys::Datum {
    // SAFETY: the caller's contract.
    unsafe { run(|| work().into()) }
}

/// Runs `work` (checks of a function's arguments) under pgrx's guard and
/// raises its [`Invalid`] with its SQLSTATE and without CONTEXT lines.
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn run_checked(work: impl FnOnce() -> Result<pg_sys::Datum, Invalid>) -> pg_sys::Datum {
    // SAFETY: as in `run`.
    match unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(work) } {
        Ok(datum) => datum,
        // SAFETY: as in `run`.
        Err(invalid) => unsafe { errors::raise(invalid) },
    }
}

/// Runs a lease call under pgrx's guard: bad input is raised as by
/// [`run_checked`], a refusal as by [`run`] (audited, then raised).
///
/// # Safety
/// As for [`run`].
#[inline(always)]
unsafe fn run_lease(work: impl FnOnce() -> Result<pg_sys::Datum, Failure>) -> pg_sys::Datum {
    let judged = || {
        let result = work();
        if let Err(Failure::Refused(refusal)) = &result {
            audit::on_refusal(refusal);
            fence::replication::note_refusal();
        }
        result
    };
    // SAFETY: as in `run`.
    match unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(judged) } {
        Ok(datum) => datum,
        // SAFETY: as in `run`.
        Err(failure) => unsafe { errors::raise(failure) },
    }
}

/// Exports `$name` as a version-1 C function whose body is `$body(fcinfo)`,
/// run through [`run`] (or `$runner`). Declare it in SQL with `LANGUAGE C`.
macro_rules! c_function {
    ($name:ident, $finfo:ident, $body:path) => {
        c_function!($name, $finfo, $body, run_refusing);
    };
    ($name:ident, $finfo:ident, $body:path, $runner:ident) => {
        #[no_mangle]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        /// # Safety
        /// Called by Postgres' function manager with a valid `fcinfo`.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            // SAFETY: the whole body of a version-1 C function; `fcinfo` is
            // valid for the call (the function manager's contract).
            unsafe { $runner(|| $body(fcinfo)) }
        }
    };
}

// Each entry point below is `unsafe fn(fcinfo)` because it reads `fcinfo`,
// which the function manager guarantees valid for the call.

/// `lease.fence_trigger()`: the fence, BEFORE INSERT OR UPDATE OR DELETE FOR
/// EACH ROW on protected tables (read fence::trigger next).
unsafe fn fence_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Outcome {
    // SAFETY: `fcinfo` is this call's (the entry point's contract).
    fence::trigger::fence_row(&unsafe { TriggerCall::from_fcinfo(fcinfo, "lease.fence_trigger") })
}
c_function!(pg_lease_fence_trigger, pg_finfo_pg_lease_fence_trigger, fence_trigger);

/// `lease.owner_guard(...)`: owner tokens only rise (fence::guards).
unsafe fn owner_guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: as above.
    fence::guards::owner_guard(&unsafe { TriggerCall::from_fcinfo(fcinfo, "lease.owner_guard") })
}
c_function!(pg_lease_owner_guard, pg_finfo_pg_lease_owner_guard, owner_guard);

/// `lease.truncate_guard(...)`: TRUNCATE cannot bypass the fence (fence::guards).
unsafe fn truncate_guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: as above.
    fence::guards::truncate_guard(&unsafe { TriggerCall::from_fcinfo(fcinfo, "lease.truncate_guard") })
}
c_function!(pg_lease_truncate_guard, pg_finfo_pg_lease_truncate_guard, truncate_guard);

/// `lease._local_state()`: pg_lease's own tables stay local (fence::replication).
unsafe fn local_state(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Invalid> {
    // SAFETY: as above.
    fence::replication::local_state(&unsafe { TriggerCall::from_fcinfo(fcinfo, "lease._local_state") })
}
c_function!(pg_lease_local_state, pg_finfo_pg_lease_local_state, local_state, run_checked);

// The DDL guard's C parts (fence::ddl).
c_function!(pg_lease_retyped_columns, pg_finfo_pg_lease_retyped_columns, fence::ddl::retyped_columns);
c_function!(pg_lease_first_judgment, pg_finfo_pg_lease_first_judgment, fence::ddl::first_judgment);
c_function!(pg_lease_guard_ddl_start, pg_finfo_pg_lease_guard_ddl_start, fence::ddl::guard_ddl_start);
c_function!(pg_lease_this_transaction, pg_finfo_pg_lease_this_transaction, fence::ddl::this_transaction);
c_function!(pg_lease_protected_here, pg_finfo_pg_lease_protected_here, fence::ddl::protected_here);

// `lease._raise(name text, summary text, detail text)`: lets pg_lease's own
// PL/pgSQL (the lease service, the DDL event trigger) raise through here, so
// every LF error carries the same message shape and hint.
c_function!(pg_lease_raise, pg_finfo_pg_lease_raise, raise_by_name);

/// The body of `lease._raise`: always a refusal (or an ERROR for an unknown name).
///
/// # Safety
/// `fcinfo` carries three text-or-NULL arguments (the SQL declaration's).
unsafe fn raise_by_name(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let arg = |i: usize| -> String {
        // SAFETY: the caller's contract: argument i exists and is text or NULL.
        unsafe { text_arg(fcinfo, i) }.unwrap_or_default()
    };
    let name = arg(0);
    let Some(error) = LeaseError::from_name(&name) else {
        pgrx::error!("pg_lease: unknown error name \"{name}\"");
    };
    Err(Refusal::new(error, arg(1), arg(2)))
}

/// Argument `i` (text) as a palloc'd C string in the server encoding, None
/// when NULL.
///
/// # Safety
/// `fcinfo` is the call's and argument `i` exists and is of type text.
unsafe fn text_arg_cstr(fcinfo: pg_sys::FunctionCallInfo, i: usize) -> Option<*mut std::ffi::c_char> {
    // SAFETY: the caller's contract: a non-NULL text datum is a varlena, and
    // text_to_cstring returns a palloc'd, NUL-terminated copy of it.
    unsafe {
        let a = &*(*fcinfo).args.as_ptr().add(i);
        (!a.isnull).then(|| pg_sys::text_to_cstring(a.value.cast_mut_ptr()))
    }
}

/// Argument `i` of a function called with text arguments, None when NULL,
/// as Rust text (converted from the database's encoding: in a LATIN1
/// database byte 0x85 is U+0085, and is judged as that character).
///
/// # Safety
/// As for [`text_arg_cstr`].
unsafe fn text_arg(fcinfo: pg_sys::FunctionCallInfo, i: usize) -> Option<String> {
    // SAFETY: the caller's contract; the C string is read before returning.
    unsafe { text_arg_cstr(fcinfo, i).map(|c| owned(c)) }
}

/// `lease._fail(sqlstate, message, detail, hint)`: how pg_lease's PL/pgSQL
/// reports bad input (see sql/fence.sql).
///
/// # Safety
/// `fcinfo` carries four text-or-NULL arguments (the SQL declaration's).
unsafe fn fail(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Invalid> {
    let arg = |i| {
        // SAFETY: the caller's contract: four text arguments.
        unsafe { text_arg(fcinfo, i) }
    };
    let sqlstate = arg(0).unwrap_or_default();
    if sqlstate.starts_with("LF") {
        // pg_lease's own codes come only from the fence and lease._raise.
        pgrx::error!("lease._fail: {sqlstate} is one of pg_lease's LF codes, which lease._fail does not raise");
    }
    let mut invalid =
        Invalid::new(&sqlstate, arg(1).unwrap_or_default()).unwrap_or_else(|why| pgrx::error!("lease._fail: {why}"));
    invalid.detail = arg(2);
    invalid.hint = arg(3);
    Err(invalid)
}
c_function!(pg_lease_fail, pg_finfo_pg_lease_fail, fail, run_checked);

/// `lease._check_label(what, value)`: the lease name/owner rule (crate::lease).
///
/// # Safety
/// `fcinfo` carries two text-or-NULL arguments.
unsafe fn check_label(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Invalid> {
    // SAFETY: the caller's contract (as `lease._label`'s).
    unsafe { label(fcinfo) }.map(|_| pg_sys::Datum::from(0))
}
c_function!(pg_lease_check_label, pg_finfo_pg_lease_check_label, check_label, run_checked);

/// `lease._label(what, value) → text`: `value` itself once it passes the
/// lease name/owner rule (crate::lease). The lease functions check and copy a
/// label in one plain expression (a PL/pgSQL assignment, no SQL statement).
///
/// # Safety
/// `fcinfo` carries two text-or-NULL arguments.
unsafe fn label(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Invalid> {
    // SAFETY: the caller's contract; the datum stays valid for the caller,
    // which handed it in.
    unsafe { label_arg(fcinfo, 1, &text_arg(fcinfo, 0).unwrap_or_default()) }.map(|label| label.0)
}
c_function!(pg_lease_label, pg_finfo_pg_lease_label, label, run_checked);

/// Argument `i` (a by-value integer: int4 or int8), None when NULL.
///
/// # Safety
/// `fcinfo` is the call's and argument `i` exists and is an int4 or int8.
unsafe fn int_arg(fcinfo: pg_sys::FunctionCallInfo, i: usize) -> Option<i64> {
    // SAFETY: the caller's contract: int4 and int8 datums are by value.
    unsafe {
        let a = &*(*fcinfo).args.as_ptr().add(i);
        (!a.isnull).then(|| a.value.value() as i64)
    }
}

/// `lease._check_ttl(ttl_ms integer) → integer` (crate::lease).
///
/// # Safety
/// `fcinfo` carries one int4-or-NULL argument.
unsafe fn check_ttl(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Invalid> {
    // SAFETY: the caller's contract.
    let ttl = unsafe { int_arg(fcinfo, 0) }.map(|t| t as i32);
    lease::check_ttl(ttl).map(pg_sys::Datum::from)
}
c_function!(pg_lease_check_ttl, pg_finfo_pg_lease_check_ttl, check_ttl, run_checked);
// The symbol releases up to 0.4.0 declared `lease._check_ttl` with (pgrx's
// wrapper name): kept so that their scripts still install (CREATE EXTENSION
// ... VERSION '0.4.0', then ALTER EXTENSION UPDATE) with this library.
c_function!(check_ttl_wrapper, pg_finfo_check_ttl_wrapper, check_ttl, run_checked);

/// `lease.fenced_boundary_write(target regclass, token bigint, rows jsonb)`
/// (fence::boundary_write): checks and converts under pgrx's guard (bad input
/// raised with its SQLSTATE and no CONTEXT), then runs the inserts outside
/// it, so the fence's refusals reach the caller with their LF codes.
#[no_mangle]
pub extern "C" fn pg_finfo_pg_lease_fenced_boundary_write() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[no_mangle]
pub unsafe extern "C-unwind" fn pg_lease_fenced_boundary_write(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    use fence::boundary_write::{finish, insert_all, prepare};
    // SAFETY: `fcinfo` is this call's, with the SQL declaration's three
    // arguments; the guard reports Postgres errors and panics normally.
    let prepared = match unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(|| prepare(fcinfo)) } {
        Ok(p) => p,
        // SAFETY: this frame holds nothing with a destructor yet.
        Err(invalid) => unsafe { errors::raise(invalid) },
    };
    // SAFETY: `prepared` is plain data; this frame and insert_all's hold
    // nothing with a destructor, so an ERROR from an INSERT (or the fence
    // trigger it fires) longjmps through them untouched.
    let total = unsafe { insert_all(&prepared) };
    // SAFETY: as for the first step.
    unsafe { pgrx::pg_sys::panic::pgrx_extern_c_guard(|| finish(&prepared, total)) }
}

/// Argument `i` as a lease name or owner (`what`), once it passes the rule
/// (crate::lease), as `lease._label` checks it.
///
/// # Safety
/// `fcinfo` is the call's and argument `i` exists and is text.
unsafe fn label_arg(fcinfo: pg_sys::FunctionCallInfo, i: usize, what: &str) -> Result<Label, Invalid> {
    // SAFETY: the caller's contract.
    // Each character with no exact UTF-8 form counts as one (U+FFFD).
    // SAFETY: the caller's contract; the C string is read before returning.
    let text = unsafe {
        text_arg_cstr(fcinfo, i).map(|c| crate::pg::from_server_replacing(std::ffi::CStr::from_ptr(c).to_bytes()))
    };
    lease::check_label(what, text.as_deref())?;
    // SAFETY: argument i exists and is not NULL (the rule refuses NULL); its
    // datum stays valid for the call.
    Ok(Label(unsafe { (*(*fcinfo).args.as_ptr().add(i)).value }))
}

/// The owner of the function being called: lease calls run as it, as their
/// SECURITY DEFINER versions did.
///
/// # Safety
/// `fcinfo` is the call's.
unsafe fn definer(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    // SAFETY: the function manager sets flinfo for every call.
    crate::pg::function_owner(unsafe { (*(*fcinfo).flinfo).fn_oid })
}

/// `lease.renew(name text, owner text, token bigint, ttl_ms integer) →
/// timestamptz` (crate::lease_calls). Arguments are checked in the order the
/// PL/pgSQL version checked them: ttl_ms, name, owner, token.
///
/// # Safety
/// `fcinfo` carries the SQL declaration's four arguments.
unsafe fn renew(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract: ttl_ms is argument 3, an int4.
    let ttl = lease::check_ttl(unsafe { int_arg(fcinfo, 3) }.map(|t| t as i32))?;
    // SAFETY: name and owner are arguments 0 and 1, text; token is argument
    // 2, an int8.
    let (name, owner, token) =
        unsafe { (label_arg(fcinfo, 0, "name")?, label_arg(fcinfo, 1, "owner")?, int_arg(fcinfo, 2)) };
    let Some(token) = token else {
        return Err(Invalid::new("22004", "pg_lease: token must not be NULL").expect("a valid SQLSTATE").into());
    };
    // SAFETY: as above.
    Ok(lease_calls::renew(unsafe { definer(fcinfo) }, name, owner, token, ttl)?)
}
c_function!(pg_lease_renew, pg_finfo_pg_lease_renew, renew, run_lease);

/// `lease.release(name text, owner text, token bigint) → boolean`
/// (crate::lease_calls).
///
/// # Safety
/// `fcinfo` carries the SQL declaration's three arguments.
unsafe fn release(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract: name and owner are arguments 0 and 1,
    // text; token is argument 2, an int8.
    let (name, owner, token) =
        unsafe { (label_arg(fcinfo, 0, "name")?, label_arg(fcinfo, 1, "owner")?, int_arg(fcinfo, 2)) };
    // SAFETY: as above.
    Ok(lease_calls::release(unsafe { definer(fcinfo) }, name, owner, token).into())
}
c_function!(pg_lease_release, pg_finfo_pg_lease_release, release, run_lease);

/// `lease.release_all(owner text) → integer` (crate::lease_calls).
///
/// # Safety
/// `fcinfo` carries the SQL declaration's one argument.
unsafe fn release_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract: owner is argument 0, text.
    let owner = unsafe { label_arg(fcinfo, 0, "owner") }?;
    // SAFETY: as above.
    Ok(lease_calls::release_all(unsafe { definer(fcinfo) }, owner).into())
}
c_function!(pg_lease_release_all, pg_finfo_pg_lease_release_all, release_all, run_lease);

/// `lease.acquire(name text, owner text, ttl_ms integer, owner_table
/// regclass, owner_key text[]) → TABLE (token bigint, expires_at
/// timestamptz)` (crate::lease_calls): one row.
///
/// # Safety
/// `fcinfo` carries the SQL declaration's five arguments, in a call that
/// accepts a set.
unsafe fn acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    let call = unsafe { acquire_arguments(fcinfo) }?;
    // SAFETY: as above.
    let acquired = lease_calls::acquire(unsafe { definer(fcinfo) }, &call)?;
    // SAFETY: as above: rows of (int8, timestamptz).
    unsafe { return_acquired(fcinfo, Some(acquired)) };
    Ok(pg_sys::Datum::from(0))
}
c_function!(pg_lease_acquire, pg_finfo_pg_lease_acquire, acquire, run_lease);

/// `lease.try_acquire(...)`: as `lease.acquire`, but no row when another
/// live owner holds the lease (crate::lease_calls).
///
/// # Safety
/// As for [`acquire`].
unsafe fn try_acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    let call = unsafe { acquire_arguments(fcinfo) }?;
    // SAFETY: as above.
    let acquired = lease_calls::try_acquire(unsafe { definer(fcinfo) }, &call)?;
    // SAFETY: as above.
    unsafe { return_acquired(fcinfo, acquired) };
    Ok(pg_sys::Datum::from(0))
}
c_function!(pg_lease_try_acquire, pg_finfo_pg_lease_try_acquire, try_acquire, run_lease);

/// acquire's arguments, checked in the order the PL/pgSQL version checked
/// them: on a primary, ttl_ms, name, owner, then owner_table and owner_key
/// together.
///
/// # Safety
/// As for [`acquire`].
unsafe fn acquire_arguments(fcinfo: pg_sys::FunctionCallInfo) -> Result<lease_calls::Acquire, Invalid> {
    let timeline = lease_calls::timeline();
    // SAFETY: the caller's contract: ttl_ms is argument 2, an int4.
    let ttl = lease::check_ttl(unsafe { int_arg(fcinfo, 2) }.map(|t| t as i32))?;
    // SAFETY: name and owner are arguments 0 and 1, text.
    let (name, owner) = unsafe { (label_arg(fcinfo, 0, "name")?, label_arg(fcinfo, 1, "owner")?) };
    // SAFETY: owner_table (regclass, by value) and owner_key (text[]) are
    // arguments 3 and 4.
    let (table, key) = unsafe {
        let arg = |i: usize| {
            let a = &*(*fcinfo).args.as_ptr().add(i);
            (!a.isnull).then_some(a.value)
        };
        (arg(3).map(|d| pg_sys::Oid::from(d.value() as u32)), arg(4))
    };
    let bound = match (table, key) {
        (Some(table), Some(key)) => Some((table, key)),
        (None, None) => None,
        _ => {
            return Err(
                Invalid::new("22023", "pg_lease: owner_table and owner_key go together").expect("a valid SQLSTATE")
            )
        }
    };
    Ok(lease_calls::Acquire { timeline, ttl, name, owner, bound })
}

/// Returns acquire's row (token, expires_at), or none.
///
/// # Safety
/// As for [`acquire`].
unsafe fn return_acquired(fcinfo: pg_sys::FunctionCallInfo, acquired: Option<lease_calls::Acquired>) {
    // SAFETY: the caller's contract: the function returns a set of (int8,
    // timestamptz) rows.
    unsafe {
        let sink = RowSink::new(fcinfo);
        if let Some(a) = acquired {
            sink.put(&[Some(pg_sys::Datum::from(a.token)), Some(a.expires_at)]);
        }
    }
}

/// The heartbeat's arguments `(owner text, ttl_ms integer)`, checked in the
/// order lease._beat checked them: ttl_ms, then owner.
///
/// # Safety
/// `fcinfo` carries a text and an int4 argument.
unsafe fn beat_arguments(fcinfo: pg_sys::FunctionCallInfo) -> Result<(Label, i32), Invalid> {
    // SAFETY: the caller's contract: ttl_ms is argument 1, an int4.
    let ttl = lease::check_ttl(unsafe { int_arg(fcinfo, 1) }.map(|t| t as i32))?;
    // SAFETY: owner is argument 0, text.
    Ok((unsafe { label_arg(fcinfo, 0, "owner") }?, ttl))
}

/// The three heartbeat functions: `lease.heartbeat` (name, token, lost
/// text), `lease.renew_all` (name, token, expires_at, renewed) and
/// `lease._beat` (name, token, expires_at, taken) over one
/// [`lease_calls::beat`].
#[derive(Clone, Copy, PartialEq)]
enum Beat {
    Heartbeat,
    RenewAll,
    Step,
}

/// # Safety
/// `fcinfo` carries the SQL declaration's two arguments, in a call of the
/// function `which` names, that accepts a set.
unsafe fn beat(fcinfo: pg_sys::FunctionCallInfo, which: Beat) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    let (owner, ttl) = unsafe { beat_arguments(fcinfo) }?;
    // SAFETY: as above: each function returns a set of the rows put below.
    let sink = unsafe { RowSink::new(fcinfo) };
    // SAFETY: as above.
    let definer = (which != Beat::Step).then(|| unsafe { definer(fcinfo) });
    let (taken, expired) = (text_datum(b"taken"), text_datum(b"expired"));
    let mut emit = |row: lease_calls::BeatRow| {
        let (name, token) = (Some(row.name), Some(pg_sys::Datum::from(row.token)));
        let b = |v: bool| Some(pg_sys::Datum::from(v));
        // SAFETY: the datums are of the result columns' types: text, int8,
        // then text, or timestamptz and boolean.
        unsafe {
            match (which, row.lost) {
                (Beat::Heartbeat, Some(lost)) => {
                    sink.put(&[name, token, Some(if lost { taken } else { expired }.datum())])
                }
                (Beat::Heartbeat, None) => unreachable!("heartbeat lists only lost leases"),
                (Beat::RenewAll, lost) => sink.put(&[name, token, row.expires_at, b(lost.is_none())]),
                (Beat::Step, lost) => sink.put(&[name, token, row.expires_at, b(lost == Some(true))]),
            }
        }
    };
    lease_calls::beat(definer, owner, ttl, which == Beat::RenewAll, &mut emit);
    Ok(pg_sys::Datum::from(0))
}

/// `lease.heartbeat(owner text, ttl_ms integer) → TABLE (name text, token
/// bigint, lost text)` (crate::lease_calls).
///
/// # Safety
/// As for [`beat`].
unsafe fn heartbeat(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    unsafe { beat(fcinfo, Beat::Heartbeat) }
}
c_function!(pg_lease_heartbeat, pg_finfo_pg_lease_heartbeat, heartbeat, run_lease);

/// `lease.renew_all(owner text, ttl_ms integer) → TABLE (name text, token
/// bigint, expires_at timestamptz, renewed boolean)` (crate::lease_calls).
///
/// # Safety
/// As for [`beat`].
unsafe fn renew_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    unsafe { beat(fcinfo, Beat::RenewAll) }
}
c_function!(pg_lease_renew_all, pg_finfo_pg_lease_renew_all, renew_all, run_lease);

/// `lease._beat(owner_id text, ttl_ms integer) → TABLE (name text, token
/// bigint, expires_at timestamptz, taken boolean)`: the heartbeat's step as
/// the caller (crate::lease_calls).
///
/// # Safety
/// As for [`beat`].
unsafe fn beat_step(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Failure> {
    // SAFETY: the caller's contract.
    unsafe { beat(fcinfo, Beat::Step) }
}
c_function!(pg_lease_beat, pg_finfo_pg_lease_beat, beat_step, run_lease);
