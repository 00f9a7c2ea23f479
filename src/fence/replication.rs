//! Changes applied by logical replication.
//!
//! A change that arrives through a subscription was already judged by the
//! fence where it was written; re-judging it against the subscriber's own
//! state (which lags by design) would only stop replication: history copied
//! by the initial sync carries old tokens, a DELETE arrives without a bound
//! token, a payout committed before a bump may be applied after it. So the
//! fence and the owner guards let such changes through unjudged, counted as
//! replicated, when the process applying them is a real logical replication
//! worker (table sync, apply or parallel apply: `session_replication_role`
//! alone, which a superuser can set anywhere, does not count) of a
//! subscription owned by a superuser (a role that could write the table
//! anyway), and only for the worker's own changes: a write that user code
//! makes while the worker applies (a trigger or a column default of a
//! replicated table, running a statement) is judged like any other. The
//! worker applies its changes without the executor's ExecutorRun or
//! ProcessUtility (ExecSimpleRelationInsert, CopyFrom, ExecuteTruncateGuts),
//! while user code's statements go through them (SPI), so pg_lease counts
//! how deep this process is in those two hooks and trusts only what happens
//! outside them. High-water tables, fenced for sinks of
//! untrusted logs, judge replicated changes like any other.

use crate::pg::role_name;
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// How many ExecutorRun / ProcessUtility calls this process is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The depth each open subtransaction started at (see `on_subxact`).
    static SAVED: std::cell::RefCell<Vec<(pg_sys::SubTransactionId, u32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

static PREV_RUN: OnceLock<pg_sys::ExecutorRun_hook_type> = OnceLock::new();
static PREV_UTILITY: OnceLock<pg_sys::ProcessUtility_hook_type> = OnceLock::new();

// The executor's and ProcessUtility's standard implementations, bound
// directly: pgrx's bindings turn a Postgres error into a Rust panic, which
// would change the error (its SQLSTATE among others) on its way through
// these hooks. An error here longjmps through the hook frames, which own
// nothing with a destructor; the depth those frames added is given back by
// the (sub)transaction abort that every caught error goes through
// (`on_xact`, `on_subxact`).
extern "C-unwind" {
    #[cfg(not(feature = "pg18"))]
    #[link_name = "standard_ExecutorRun"]
    fn standard_executor_run(
        query_desc: *mut pg_sys::QueryDesc,
        direction: pg_sys::ScanDirection::Type,
        count: u64,
        execute_once: bool,
    );
    #[cfg(feature = "pg18")]
    #[link_name = "standard_ExecutorRun"]
    fn standard_executor_run(query_desc: *mut pg_sys::QueryDesc, direction: pg_sys::ScanDirection::Type, count: u64);
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

fn enter() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

fn leave() {
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
}

/// Installs the two hooks that count statement nesting, and the callbacks
/// that keep the count right across errors; from `_PG_init`.
pub fn init() {
    // SAFETY: _PG_init runs once per process, single-threaded; the hooks and
    // callbacks are static functions with the signatures Postgres calls.
    unsafe {
        PREV_RUN.get_or_init(|| pg_sys::ExecutorRun_hook);
        pg_sys::ExecutorRun_hook = Some(executor_run);
        PREV_UTILITY.get_or_init(|| pg_sys::ProcessUtility_hook);
        pg_sys::ProcessUtility_hook = Some(process_utility);
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}

/// A transaction ended: no statement of it runs any more.
extern "C-unwind" fn on_xact(_event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    DEPTH.with(|d| d.set(0));
    SAVED.with(|s| s.borrow_mut().clear());
}

/// A subtransaction started (remember the depth), ended (forget it) or
/// aborted (back to the depth it started at: an error caught by a PL/pgSQL
/// exception block skipped the hooks' exits).
extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    SAVED.with(|s| {
        let Ok(mut saved) = s.try_borrow_mut() else { return };
        match event {
            pg_sys::SubXactEvent::SUBXACT_EVENT_START_SUB => saved.push((my_subid, DEPTH.with(|d| d.get()))),
            pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => saved.retain(|&(id, _)| id != my_subid),
            pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
                if let Some(i) = saved.iter().position(|&(id, _)| id == my_subid) {
                    let (_, depth) = saved.remove(i);
                    DEPTH.with(|d| d.set(depth));
                }
            }
            _ => {}
        }
    });
}

#[cfg(not(feature = "pg18"))]
unsafe extern "C-unwind" fn executor_run(
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    enter();
    // SAFETY: the executor's own arguments, passed on to the previous hook
    // or the standard implementation; nothing here needs dropping if it
    // longjmps.
    unsafe {
        match PREV_RUN.get().copied().flatten() {
            Some(prev) => prev(query_desc, direction, count, execute_once),
            None => standard_executor_run(query_desc, direction, count, execute_once),
        }
    }
    leave();
}

#[cfg(feature = "pg18")]
unsafe extern "C-unwind" fn executor_run(
    query_desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    enter();
    // SAFETY: as above (PostgreSQL 18's ExecutorRun has no execute_once).
    unsafe {
        match PREV_RUN.get().copied().flatten() {
            Some(prev) => prev(query_desc, direction, count),
            None => standard_executor_run(query_desc, direction, count),
        }
    }
    leave();
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    enter();
    // SAFETY: as in `executor_run`, for ProcessUtility's arguments.
    unsafe {
        match PREV_UTILITY.get().copied().flatten() {
            Some(prev) => prev(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
            None => standard_process_utility(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
        }
    }
    leave();
}

/// Whether this is a change a logical replication worker of a subscription
/// owned by a superuser applies itself (not one user code makes meanwhile).
pub fn trusted_apply() -> bool {
    if DEPTH.with(|d| d.get()) != 0 {
        return false;
    }
    // SAFETY: IsLogicalWorker reads this process's own worker slot pointer
    // (set only by the logical replication launcher's workers);
    // GetAuthenticatedUserId is the role the worker connected as, the
    // subscription's owner (it stays so while the worker switches to table
    // owners to apply, PostgreSQL 16 on); superuser_arg is a syscache lookup,
    // fresh after an ALTER ROLE ... NOSUPERUSER.
    unsafe { pg_sys::IsLogicalWorker() && pg_sys::superuser_arg(pg_sys::GetAuthenticatedUserId()) }
}

/// In a logical replication worker: which subscription it applies, and who
/// owns it, for the message of a refusal (slow path). None elsewhere.
pub fn subscription() -> Option<(String, String, bool)> {
    // SAFETY: as in `trusted_apply`.
    if !unsafe { pg_sys::IsLogicalWorker() } {
        return None;
    }
    // SAFETY: the role the worker connected as (see `trusted_apply`).
    let role = unsafe { pg_sys::GetAuthenticatedUserId() };
    // SAFETY: a syscache lookup of that role.
    let (owner, superuser) = (role_name(role), unsafe { pg_sys::superuser_arg(role) });
    let name = pgrx::spi::Spi::get_one::<String>(
        "SELECT s.subname::pg_catalog.text FROM pg_catalog.pg_stat_subscription w
           JOIN pg_catalog.pg_subscription s ON s.oid OPERATOR(pg_catalog.=) w.subid
          WHERE w.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() LIMIT 1",
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| "(unknown)".to_owned());
    Some((name, owner, superuser))
}
