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
//! while user code's statements go through them (SPI; a data-modifying CTE
//! may finish in ExecutorFinish), so pg_lease counts how deep this process is
//! in those hooks and trusts only what happens outside them. A row that user
//! code could have rewritten before the fence sees it (a BEFORE row trigger
//! that fires in the worker and sorts before pg_lease's) is judged too. High-water tables, fenced for sinks of
//! untrusted logs, judge replicated changes like any other.

use crate::errors::Invalid;
use crate::pg::{display, quote_ident, role_name, TriggerCall, TriggerOp};
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// How many ExecutorRun / ExecutorFinish / ProcessUtility calls this process is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The subscription of a refusal raised in this transaction, noted if
    /// the transaction aborts (see `on_xact`).
    static PENDING: std::cell::RefCell<Option<(pg_sys::Oid, String)>> = const { std::cell::RefCell::new(None) };
    /// See [`last_rewriting_trigger`].
    static REWRITER: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// Whether this process is a parallel apply worker (once known).
    static PARALLEL: Cell<Option<bool>> = const { Cell::new(None) };
    /// Whether this process is a table synchronization worker (once known).
    static TABLESYNC: Cell<Option<bool>> = const { Cell::new(None) };
    /// Whether this transaction of a table synchronization worker is its
    /// table's initial copy (once known; see `initial_copy`).
    static COPYING: Cell<Option<bool>> = const { Cell::new(None) };
    /// Owner tables this transaction's initial copy writes into, and whether
    /// each held a row with a token before it (see `copy_meets_tokens`).
    static COPY_TOKENS: std::cell::RefCell<Vec<(pg_sys::Oid, bool)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Whether this worker has logged that it skips changes to pg_lease's tables.
    static SKIP_LOGGED: Cell<bool> = const { Cell::new(false) };
    /// The partition and row of an owner-row delete a trusted worker skipped,
    /// until the owner guard's next call (see `note_skipped_delete`).
    static SKIPPED_DELETE: Cell<Option<(pg_sys::Oid, pg_sys::ItemPointerData)>> = const { Cell::new(None) };
    /// The depth each open subtransaction started at (see `on_subxact`).
    static SAVED: std::cell::RefCell<Vec<(pg_sys::SubTransactionId, u32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

static PREV_RUN: OnceLock<pg_sys::ExecutorRun_hook_type> = OnceLock::new();
static PREV_UTILITY: OnceLock<pg_sys::ProcessUtility_hook_type> = OnceLock::new();
static PREV_FINISH: OnceLock<pg_sys::ExecutorFinish_hook_type> = OnceLock::new();

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
    #[link_name = "standard_ExecutorFinish"]
    fn standard_executor_finish(query_desc: *mut pg_sys::QueryDesc);
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
        PREV_FINISH.get_or_init(|| pg_sys::ExecutorFinish_hook);
        pg_sys::ExecutorFinish_hook = Some(executor_finish);
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}

/// A transaction ended: no statement of it runs any more. A refusal raised
/// in a logical replication worker that aborts the transaction is noted for
/// `lease.audit_status()` now (a refusal that user code caught, letting the
/// transaction go on, held nothing back).
extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    DEPTH.with(|d| d.set(0));
    COPYING.with(|c| c.set(None));
    SKIPPED_DELETE.with(|c| c.set(None));
    COPY_TOKENS.with(|c| c.borrow_mut().clear());
    SAVED.with(|s| s.borrow_mut().clear());
    let pending = PENDING.with(|p| p.borrow_mut().take());
    if let Some((oid, name)) = pending {
        if event == pg_sys::XactEvent::XACT_EVENT_ABORT {
            crate::audit::note_replication_refusal(oid, &name);
        }
    }
}

/// For a row the initial copy ([`initial_copy`]) writes into owner table
/// `relid`: whether the table held a row with a token when the copy first
/// wrote into it (`carries`, asked once per table and transaction). Only
/// then can a copied key meet a row of this node that carries a token,
/// which the copy must not fail on or replace (`guards::trusted_change`);
/// a copy into a table without tokens costs nothing more per row.
pub fn copy_meets_tokens(relid: pg_sys::Oid, carries: impl FnOnce() -> bool) -> bool {
    if let Some((_, known)) = COPY_TOKENS.with(|c| c.borrow().iter().find(|(r, _)| *r == relid).copied()) {
        return known;
    }
    let known = carries();
    COPY_TOKENS.with(|c| c.borrow_mut().push((relid, known)));
    known
}

/// A trusted worker's delete of the owner row at `at` of partition `relid`
/// was skipped (`guards::trusted_change`). An apply worker applies an UPDATE
/// that moves a row to another partition as a delete from the one and, next,
/// an insert into the other: remembered until the next owner-row change this
/// transaction makes ([`take_skipped_delete`]).
pub fn note_skipped_delete(relid: pg_sys::Oid, at: pg_sys::ItemPointerData) {
    // SAFETY: a syscache lookup of a relation the trigger holds a lock on.
    let partition = unsafe { pg_sys::get_rel_relispartition(relid) };
    SKIPPED_DELETE.with(|c| c.set(partition.then_some((relid, at))));
}

/// The partition and row of a trusted owner-row delete skipped by the owner
/// guard's previous call in this transaction, if it was one
/// ([`note_skipped_delete`]); forgotten once asked, so every owner-guard call
/// asks. A trusted insert into another partition that comes right after it
/// is taken for the other half of that row's move.
pub fn take_skipped_delete() -> Option<(pg_sys::Oid, pg_sys::ItemPointerData)> {
    SKIPPED_DELETE.with(Cell::take)
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

/// ExecutorFinish runs what a statement left to do after ExecutorRun: the
/// data-modifying CTEs it did not read to the end, and its AFTER triggers.
unsafe extern "C-unwind" fn executor_finish(query_desc: *mut pg_sys::QueryDesc) {
    enter();
    // SAFETY: as in `executor_run`, for ExecutorFinish's argument.
    unsafe {
        match PREV_FINISH.get().copied().flatten() {
            Some(prev) => prev(query_desc),
            None => standard_executor_finish(query_desc),
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
    // SAFETY: pstmt is the statement being run, a utility statement.
    let stmt = unsafe { (*pstmt).utilityStmt };
    if let Some(refusal) =
        crate::fence::ddl::unguarded_refusal(stmt).or_else(|| crate::fence::citus::truncate_refusal(stmt))
    {
        // SAFETY: nothing of this function needs dropping, and nothing was
        // entered yet: the error unwinds to Postgres's handler.
        unsafe { crate::errors::raise(refusal) };
    }
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

/// Whether this process is a logical replication worker (table sync, apply
/// or parallel apply).
fn in_worker() -> bool {
    // SAFETY: IsLogicalWorker reads this process's own worker slot pointer
    // (set only by the logical replication launcher's workers).
    unsafe { pg_sys::IsLogicalWorker() }
}

/// Whether this is a change a logical replication worker (of any
/// subscription) applies itself, not one user code makes meanwhile.
pub fn applying() -> bool {
    DEPTH.with(|d| d.get()) == 0 && in_worker()
}

/// Whether this process is a table synchronization worker (asked once per
/// process: a worker never changes kind).
fn tablesync() -> bool {
    worker_kind(&TABLESYNC, "w.relid IS NOT NULL")
}

/// Whether this process is a parallel apply worker (`streaming = parallel`,
/// PostgreSQL 16 on), whose errors do not give the transaction's finish LSN
/// that `ALTER SUBSCRIPTION ... SKIP` needs (asked once per process, for a
/// refusal's HINT).
pub fn parallel_apply() -> bool {
    !cfg!(feature = "pg15") && in_worker() && worker_kind(&PARALLEL, "w.leader_pid IS NOT NULL")
}

/// `test`, a condition on this process's row `w` of `pg_stat_subscription`
/// (false without one), asked once per process and kept in `known`.
fn worker_kind(known: &'static std::thread::LocalKey<Cell<Option<bool>>>, test: &str) -> bool {
    if let Some(known) = known.with(Cell::get) {
        return known;
    }
    let answer = pgrx::spi::Spi::get_one::<bool>(&format!(
        "SELECT {test} FROM pg_catalog.pg_stat_subscription w
          WHERE w.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() LIMIT 1"
    ))
    .ok()
    .flatten()
    .unwrap_or(false);
    known.with(|k| k.set(Some(answer)));
    answer
}

/// Whether this is the initial copy of a table, applied by a table
/// synchronization worker itself: a snapshot of the publisher's rows, in no
/// particular order. Only the copy: the changes the worker then applies to
/// catch up with its subscription's apply worker came after the snapshot,
/// in commit order, like any replicated change. The worker copies in one
/// transaction while `pg_subscription_rel` says `d` (data is being copied;
/// it commits `f`, finished copy, with the copied rows), so this is asked
/// once per transaction (slow path).
pub fn initial_copy() -> bool {
    if !applying() || !tablesync() {
        return false;
    }
    if let Some(known) = COPYING.with(Cell::get) {
        return known;
    }
    let known = pgrx::spi::Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_subscription w
                          JOIN pg_catalog.pg_subscription_rel r
                            ON r.srsubid OPERATOR(pg_catalog.=) w.subid AND r.srrelid OPERATOR(pg_catalog.=) w.relid
                         WHERE w.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                           AND r.srsubstate OPERATOR(pg_catalog.=) 'd')",
    )
    .ok()
    .flatten()
    .unwrap_or(false);
    COPYING.with(|c| c.set(Some(known)));
    known
}

/// The role a logical replication worker connected as: its subscription's
/// owner (it stays so while the worker switches to table owners to apply,
/// PostgreSQL 16 on).
fn subscription_owner() -> pg_sys::Oid {
    // SAFETY: reads a backend global, set in every backend that runs SQL.
    unsafe { pg_sys::GetAuthenticatedUserId() }
}

/// Whether changes of subscriptions owned by `role` are trusted: a
/// superuser (a role that could write the table anyway), a role named in
/// `pg_lease.trusted_subscription_owners`, or the role Citus creates to own
/// a shard move's or split's subscription (what it replays between two
/// shards of one table was judged on the shard it copies; on PostgreSQL 15
/// only a superuser can hand a subscription to another role).
fn trusted_owner(role: pg_sys::Oid) -> bool {
    // SAFETY: superuser_arg is a syscache lookup, fresh after an ALTER ROLE
    // ... NOSUPERUSER.
    let superuser = unsafe { pg_sys::superuser_arg(role) };
    superuser
        || crate::gucs::trusted_subscription_owner(role)
        || crate::fence::citus::shard_transfer_role(&role_name(role))
}

/// Whether this is a change a logical replication worker of a trusted
/// subscription applies itself (not one user code makes meanwhile).
pub fn trusted_apply() -> bool {
    applying() && trusted_owner(subscription_owner())
}

/// Whether `call`'s row is trusted as applied by a trusted subscription:
/// [`trusted_apply`], and no other BEFORE INSERT/UPDATE row trigger that
/// fires in the worker (ENABLE ALWAYS or ENABLE REPLICA) runs before this
/// one, since it could have rewritten the row the worker applies (triggers
/// that sort after pg_lease's are refused by the fence check).
pub fn trusted_row(call: &TriggerCall) -> bool {
    if !trusted_apply() {
        return false;
    }
    let rewriter = rewriting_trigger(call);
    let trusted = rewriter.is_none();
    REWRITER.with(|r| *r.borrow_mut() = rewriter);
    trusted
}

/// The trigger that made the last [`trusted_row`] call judge its row, for
/// the refusal's message.
pub fn last_rewriting_trigger() -> Option<String> {
    REWRITER.with(|r| r.borrow().clone())
}

/// The first BEFORE INSERT/UPDATE row trigger on `call`'s relation that fires
/// in a logical replication worker and runs before `call`'s trigger.
pub fn rewriting_trigger(call: &TriggerCall) -> Option<String> {
    call.earlier_before_row_triggers(|t| {
        (t.tgenabled as u8 == pg_sys::TRIGGER_FIRES_ALWAYS || t.tgenabled as u8 == pg_sys::TRIGGER_FIRES_ON_REPLICA)
            && t.tgtype as u32 & (pg_sys::TRIGGER_TYPE_INSERT | pg_sys::TRIGGER_TYPE_UPDATE) != 0
    })
}

/// A logical replication worker's subscription, for messages (slow path).
pub struct Subscription {
    pub oid: pg_sys::Oid,
    pub name: String,
    pub owner: String,
    pub trusted: bool,
}

/// Logs that the trusted subscription applying this change `would` do
/// something pg_lease does not let it, and `what` it did instead.
pub fn log_kept(would: &str, what: &str) {
    let name = subscription().map_or_else(|| "(unknown)".to_owned(), |s| s.name);
    pgrx::log!("pg_lease: logical replication subscription \"{name}\" {would}: {what}");
}

/// In a logical replication worker: which subscription it applies, who owns
/// it and whether it is trusted. None elsewhere.
pub fn subscription() -> Option<Subscription> {
    if !in_worker() {
        return None;
    }
    let role = subscription_owner();
    let (oid, name) = pgrx::spi::Spi::get_two::<pg_sys::Oid, crate::pg::ShownText>(
        "SELECT s.oid, s.subname::pg_catalog.text FROM pg_catalog.pg_stat_subscription w
           JOIN pg_catalog.pg_subscription s ON s.oid OPERATOR(pg_catalog.=) w.subid
          WHERE w.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() LIMIT 1",
    )
    .ok()
    .unwrap_or((None, None));
    Some(Subscription {
        oid: oid.unwrap_or(pg_sys::InvalidOid),
        name: name.map_or_else(|| "(unknown)".to_owned(), |n| n.0),
        owner: role_name(role),
        trusted: trusted_owner(role),
    })
}

/// A refusal is being raised in the worker of `sub`: noted for
/// `lease.audit_status()` when the transaction aborts (the worker then
/// retries the change until it goes through, so it must not stay unnoticed).
pub fn note(sub: &Subscription) {
    PENDING.with(|p| *p.borrow_mut() = Some((sub.oid, sub.name.clone())));
}

/// [`note`], in a logical replication worker (for refusals that do not name
/// the subscription themselves).
pub fn note_refusal() {
    if let Some(sub) = subscription() {
        note(&sub);
    }
}

/// `lease._local_state()` on pg_lease's own tables (sql/local.sql): a
/// logical replication worker's own changes to them are skipped (BEFORE row
/// triggers) or, where only an AFTER UPDATE trigger watches (the tables
/// renewals update), undone (the old row written back); TRUNCATE is
/// refused from everyone.
pub fn local_state(call: &TriggerCall) -> Result<pg_sys::Datum, Invalid> {
    let table = display(call.relid());
    if call.op() == TriggerOp::Truncate {
        let sub = subscription();
        let mut refusal = Invalid::new("0A000", format!("pg_lease: TRUNCATE of {table} is not allowed"))
            .expect("a valid SQLSTATE")
            .with_detail(
                "pg_lease's own tables hold this node's fencing state (protections, high-water marks, leases and their tokens, the audit): a TRUNCATE would let tokens start over here, and a publication of the table would carry it to its subscribers.",
            );
        refusal.hint = Some(match sub {
            Some(sub) => {
                note(&sub);
                format!(
                    "Applied by logical replication subscription \"{}\", whose publisher truncated its {table}: skip it (ALTER SUBSCRIPTION {} SKIP (lsn = ...), the LSN is in this error's CONTEXT) and publish only your own tables there.",
                    sub.name,
                    quote_ident(&sub.name)
                )
            }
            None => format!(
                "Delete the rows you mean to remove instead (DELETE FROM {table} WHERE ...); pg_lease.audit_retention prunes lease.rejected_writes."
            ),
        });
        return Err(refusal);
    }
    if !applying() {
        return Ok(if call.is_before_row() { call.pass() } else { pg_sys::Datum::from(0usize) });
    }
    let sub = subscription();
    let name = sub.as_ref().map_or("(unknown)", |s| s.name.as_str()).to_owned();
    if call.is_before_row() {
        log_skipping(&name, &table);
        // NULL: the row is skipped.
        return Ok(pg_sys::Datum::from(0usize));
    }
    // AFTER UPDATE (lease_state and session_state, which take no BEFORE
    // UPDATE trigger: sql/local.sql): the worker's update is made. Writing
    // the old values back undoes it, which is skipping it: the row this node
    // holds stays as it was, whether this node wrote it or it came with a
    // physical copy (pg_createsubscriber), and the rest of the remote
    // transaction (the owner-row bump of an acquire among it) applies.
    let (Some(old), Some(new)) = (call.trigtuple(), call.newtuple()) else {
        return Ok(pg_sys::Datum::from(0usize));
    };
    // SAFETY: a trigger's new tuple is valid for the call (TriggerCall).
    let at = unsafe { (*new.tuple()).t_self };
    if !crate::pg::put_back_row(call.relid(), old, at) {
        if let Some(sub) = &sub {
            note(sub);
        }
        return Err(Invalid::new(
            "55000",
            format!("pg_lease: logical replication subscription \"{name}\" updated a row of {table} that could not be put back"),
        )
        .expect("a valid SQLSTATE")
        .with_detail(format!("{table} never takes replicated changes: each node's leases and tokens are its own.")));
    }
    log_skipping(&name, &table);
    Ok(pg_sys::Datum::from(0usize))
}

/// Logs, once per worker, that it skips changes to pg_lease's tables.
fn log_skipping(subscription: &str, table: &str) {
    if !SKIP_LOGGED.with(|l| l.replace(true)) {
        pgrx::log!(
            "pg_lease: logical replication subscription \"{subscription}\" publishes pg_lease's own tables (first: {table}); their changes are skipped here, each node keeps its own"
        );
    }
}
