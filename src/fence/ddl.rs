//! What the DDL guard cannot see from SQL: the subcommands of an ALTER TABLE.

use crate::errors::Refusal;
use pgrx::pg_sys;

/// The subcommands of an ALTER TABLE (or ALTER TYPE, ALTER VIEW, ...)
/// command that `pg_event_trigger_ddl_commands()` collected; empty for any
/// other command, or a NULL one.
///
/// # Safety
/// `fcinfo` is valid for the call and its first argument is a
/// `pg_ddl_command` that pg_event_trigger_ddl_commands() returned in this
/// `ddl_command_end` event trigger, or NULL.
unsafe fn subcommands<'a>(fcinfo: pg_sys::FunctionCallInfo) -> Vec<&'a pg_sys::AlterTableCmd> {
    // SAFETY: `fcinfo` is valid for the call and carries one argument (the
    // caller's contract), so args[0] exists.
    let arg = unsafe { &*(*fcinfo).args.as_ptr() };
    if arg.isnull {
        return Vec::new();
    }
    // SAFETY: a pg_ddl_command datum is a pointer to the CollectedCommand
    // that pg_event_trigger_ddl_commands() is returning (event trigger
    // memory, alive for the whole ddl_command_end trigger).
    let cmd = unsafe { &*(arg.value.cast_mut_ptr::<pg_sys::CollectedCommand>()) };
    if cmd.type_ != pg_sys::CollectedCommandType::SCT_AlterTable {
        return Vec::new();
    }
    // SAFETY: `d` is the union member SCT_AlterTable selects; its subcmds is
    // NIL or a pointer List of CollectedATSubcmd, in the same event trigger
    // memory as `cmd`.
    let subcmds = unsafe { crate::pg::list_ptrs(cmd.d.alterTable.subcmds) };
    subcmds
        .filter_map(|sub| {
            // SAFETY: each element is a non-null CollectedATSubcmd
            // (event_trigger.c's EventTriggerCollectAlterTableSubcmd), alive
            // as `cmd` is; its parsetree is null or a Node.
            let sub = unsafe { &*(sub as *const pg_sys::CollectedATSubcmd) };
            // SAFETY: `parsetree` is null or a valid Node living as `cmd`
            // does; a T_AlterTableCmd node is an AlterTableCmd.
            unsafe { crate::pg::cast_node::<pg_sys::AlterTableCmd>(sub.parsetree, pg_sys::NodeTag::T_AlterTableCmd) }
        })
        .collect()
}

/// `lease._retyped_columns(command pg_ddl_command) → text[]`: the columns an
/// ALTER TABLE command gave a type with `ALTER COLUMN ... TYPE` (even the type
/// they had: `USING` then rewrites every row without firing a row trigger).
/// Empty for any other command. Call it only on the `command` column of
/// `pg_event_trigger_ddl_commands()`.
///
/// # Safety
/// Called by Postgres as a version-1 C function: `fcinfo` is valid for the
/// call and has the one argument the SQL declaration gives it, a
/// `pg_ddl_command` that pg_event_trigger_ddl_commands() returned in this
/// `ddl_command_end` event trigger.
pub unsafe fn retyped_columns(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: the caller's contract is `subcommands`'.
    let names: Vec<crate::pg::TextDatum> = unsafe { subcommands(fcinfo) }
        .into_iter()
        .filter(|at| at.subtype == pg_sys::AlterTableType::AT_AlterColumnType && !at.name.is_null())
        // SAFETY: a non-null AlterTableCmd.name is the column's
        // NUL-terminated name, alive as the parse tree is.
        .map(|at| crate::pg::text_datum(unsafe { std::ffi::CStr::from_ptr(at.name) }.to_bytes()))
        .collect();
    Ok(crate::pg::text_array(&names))
}

/// The join events (`pg_inherits` row versions, by xmin and ctid) the DDL
/// guard has judged in this transaction, and the transaction they belong to
/// (cleared when another begins).
struct Judged {
    xact: pg_sys::TransactionId,
    rows: std::collections::HashSet<(u32, u32, u16)>,
}

thread_local! {
    static JUDGED: std::cell::RefCell<Judged> = std::cell::RefCell::new(Judged {
        xact: pg_sys::TransactionId::INVALID,
        rows: std::collections::HashSet::new(),
    });
}

/// `lease._first_judgment(xmin xid, ctid tid) → boolean`: true the first
/// time the DDL guard asks about this `pg_inherits` row version in this
/// transaction, false after. Each partition a transaction creates or
/// attaches is judged once, by the command that joined it, instead of again
/// by every later command of the transaction (which made a migration that
/// creates many partitions quadratic). A row version is one join: a
/// partition detached and attached again has a new one; one whose
/// subtransaction rolled back is gone.
///
/// # Safety
/// Called by Postgres as a version-1 C function: `fcinfo` is valid for the
/// call and has the two arguments the SQL declaration gives it, an `xid` and
/// a `tid` (by reference), neither NULL (STRICT).
pub unsafe fn first_judgment(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: `fcinfo` is valid and carries two arguments (the caller's
    // contract); an xid datum is the value itself, a tid datum a pointer to
    // an ItemPointerData alive for the call.
    let (xmin, block, offset) = unsafe {
        let args = (*fcinfo).args.as_slice(2);
        let (block, offset) = crate::pg::tid_parts(&*args[1].value.cast_mut_ptr::<pg_sys::ItemPointerData>());
        (args[0].value.value() as u32, block, offset)
    };
    // SAFETY: reads this backend's transaction state.
    let xact = unsafe { pg_sys::GetTopTransactionIdIfAny() };
    let first = JUDGED.with(|j| {
        let mut j = j.borrow_mut();
        if j.xact != xact {
            j.xact = xact;
            j.rows.clear();
        }
        j.rows.insert((xmin, block, offset))
    });
    Ok(pg_sys::Datum::from(first))
}

/// PostgreSQL 17's `event_triggers = off` silences every event trigger,
/// the DDL guard among them: while it is off, in a database where pg_lease
/// is installed, a command an event trigger would see is refused before it
/// runs (from the ProcessUtility hook), except the commands of an extension
/// script. Commands on event triggers themselves, what the setting is for
/// (repairing a broken one), fire none and go through.
pub fn unguarded_refusal(stmt: *mut pg_sys::Node) -> Option<Refusal> {
    #[cfg(feature = "pg18")]
    {
        // SAFETY: reads two backend globals; `stmt` is the utility statement
        // ProcessUtility was given (checked non-NULL), which CreateCommandTag
        // only reads; get_extension_oid is a catalog lookup (missing_ok).
        let silenced = unsafe {
            !pg_sys::event_triggers
                && !pg_sys::creating_extension
                && !stmt.is_null()
                && pg_sys::command_tag_event_trigger_ok(pg_sys::CreateCommandTag(stmt))
                && pg_sys::get_extension_oid(c"pg_lease".as_ptr(), true) != pg_sys::InvalidOid
        };
        if silenced {
            let mut refusal = Refusal::new(
                crate::errors::LeaseError::FenceTampering,
                "DDL is refused while event_triggers is off",
                "pg_lease's DDL guard runs as event triggers, which event_triggers = off silences: a command could then weaken a fence unseen.",
            );
            refusal.hint = Some(
                "SET event_triggers = on (ALTER EVENT TRIGGER and DROP EVENT TRIGGER, which fire no event trigger, work with it off)."
                    .into(),
            );
            return Some(refusal);
        }
    }
    #[cfg(not(feature = "pg18"))]
    let _ = stmt;
    None
}

/// The (sub)transaction in which the DDL guard is running pg_lease's own
/// DDL (a TRUNCATE guard on a partition it judged, a stray guard dropped),
/// if it is: that DDL fires the guard again, which has nothing to judge in
/// it. Valid only in the very subtransaction that set it, so an error that
/// aborts the internal command (and any savepoint around it) leaves no
/// state behind that a later command could use to pass unjudged.
fn current_subtransaction() -> (pg_sys::TransactionId, pg_sys::SubTransactionId) {
    // SAFETY: read this backend's transaction state.
    unsafe { (pg_sys::GetTopTransactionIdIfAny(), pg_sys::GetCurrentSubTransactionId()) }
}

thread_local! {
    static INTERNAL_DDL: std::cell::Cell<Option<(pg_sys::TransactionId, pg_sys::SubTransactionId)>> =
        const { std::cell::Cell::new(None) };
}

/// `lease._internal_ddl(running boolean)`: the DDL guard marks the start
/// (true) and end (false) of its own DDL. Not executable by PUBLIC.
#[pgrx::pg_extern(name = "_internal_ddl", volatile, parallel_unsafe)]
pub fn internal_ddl(running: bool) {
    INTERNAL_DDL.with(|c| c.set(running.then(current_subtransaction)));
}

/// `lease._in_internal_ddl() → boolean`: whether this command is the DDL
/// guard's own (see `lease._internal_ddl`), in this very subtransaction.
#[pgrx::pg_extern(name = "_in_internal_ddl", volatile, parallel_unsafe)]
pub fn in_internal_ddl() -> bool {
    INTERNAL_DDL.with(|c| c.get() == Some(current_subtransaction()))
}

/// `lease._this_transaction(xmin xid) → boolean`: whether a catalog row was
/// written by this transaction or one of its subtransactions, so that the
/// DDL guard recognises a partition created or attached, or a trigger
/// created, inside a SAVEPOINT or a PL/pgSQL block with EXCEPTION as "in
/// this transaction" (comparing with `pg_current_xact_id()` sees the
/// top-level xid only).
///
/// # Safety
/// Called by Postgres as a version-1 C function: `fcinfo` is valid for the
/// call and has the one argument the SQL declaration gives it, an `xid`
/// (the function is STRICT: never NULL).
pub unsafe fn this_transaction(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: `fcinfo` is valid for the call and carries one argument (the
    // caller's contract), so args[0] exists.
    let arg = unsafe { &*(*fcinfo).args.as_ptr() };
    // (An xid datum is the 32-bit value itself.)
    let xid = pg_sys::TransactionId::from_inner(arg.value.value() as u32);
    Ok(pg_sys::Datum::from(crate::pg::written_by_this_transaction(xid)))
}

/// `lease._protected_here(ctid tid) → boolean`: whether the `lease.protected`
/// row at `ctid` was inserted by this transaction (a fence protected, or
/// restored, in it), not merely updated by it (`lease.judge_replicated`
/// updates the row, which gives it this transaction's xmin too): the DDL
/// guard does not judge the rows an ATTACH brings into a fence that did not
/// exist before this transaction.
///
/// # Safety
/// Called by Postgres as a version-1 C function: `fcinfo` is valid for the
/// call and has the one argument the SQL declaration gives it, a `tid`
/// (the function is STRICT: never NULL).
pub unsafe fn protected_here(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: `fcinfo` is valid for the call and carries one argument (the
    // caller's contract), so args[0] exists; a tid datum points to an
    // ItemPointerData (passed by reference, non-NULL: STRICT).
    let tid = unsafe { *((*(*fcinfo).args.as_ptr()).value.cast_mut_ptr::<pg_sys::ItemPointerData>()) };
    let protected = crate::pg::lease_relid(c"protected");
    Ok(pg_sys::Datum::from(crate::pg::inserted_by_this_transaction(protected, tid)))
}

/// `lease._exists_as_owner(rel, query)`: runs `query` (a SELECT EXISTS ...
/// about `rel`) as the owner of `rel` in a security-restricted operation, so
/// the DDL guard (SECURITY DEFINER) never runs a user's operators or casts
/// with its own rights. Not executable by PUBLIC.
#[pgrx::pg_extern(name = "_exists_as_owner", volatile, parallel_unsafe)]
pub fn exists_as_owner(rel: pg_sys::Oid, query: crate::pg::ServerBytes) -> bool {
    // (As the guard built it: the table's name as stored, whatever it is in
    // UTF-8. Under the latest snapshot: rows committed since a REPEATABLE
    // READ transaction's snapshot are what the command brings in too.)
    let query = query.sql();
    crate::pg::as_table_owner(rel, || latest_is_true(&query))
}

/// Whether `query` (one boolean) is true under the latest snapshot.
fn latest_is_true(query: &std::ffi::CStr) -> bool {
    crate::pg::query_text_under(query, true, "the DDL guard's check").is_some_and(|v| v == b"t")
}

/// `lease._exists_latest(query)`: runs `query` (a SELECT of one boolean the
/// DDL guard built, comparing keys only through built-in operators) with
/// the guard's own rights under the latest snapshot, so that rows
/// committed since a REPEATABLE READ transaction's snapshot are judged, and
/// a table owner without rights on the owner table can still attach a
/// partition. Not executable by PUBLIC.
#[pgrx::pg_extern(name = "_exists_latest", volatile, parallel_unsafe)]
pub fn exists_latest(query: crate::pg::ServerBytes) -> bool {
    latest_is_true(&query.sql())
}

/// `lease._fresh_catalog(tag)`: nothing at READ COMMITTED; in a REPEATABLE
/// READ or SERIALIZABLE transaction, a serialization failure (40001) when
/// what the DDL guard's verdict depends on (`lease._catalog_version()`)
/// reads otherwise under the transaction's snapshot than under the latest:
/// the guard reads the catalog in SQL, through the transaction's snapshot,
/// while the command acts on the catalog as it is now (a fence protected,
/// a partition attached or created since), so its verdict could be about
/// another catalog.
/// `touched`: the tables the command names; `whole`: judge against every
/// fence (commands that find their tables in the catalog).
#[pgrx::pg_extern(name = "_fresh_catalog", volatile, parallel_unsafe)]
pub fn fresh_catalog(tag: crate::pg::ShownText, touched: Vec<pg_sys::Oid>, whole: bool) {
    if !crate::pg::uses_transaction_snapshot() {
        return;
    }
    let rels: Vec<String> = touched.iter().map(|o| o.to_u32().to_string()).collect();
    let query = std::ffi::CString::new(format!(
        "SELECT lease._catalog_version('{{{}}}'::pg_catalog.oid[], {whole})",
        rels.join(",")
    ))
    .expect("digits and punctuation");
    if crate::pg::query_text_now(&query, "lease._catalog_version()").1 {
        crate::pg::serialization_failure(
            format!(
                "pg_lease: {} cannot be judged under this transaction's snapshot: a fence, a partition or inheritance link of a fenced or owner table, or a pg_lease trigger changed after the snapshot was taken",
                tag.0
            ),
            "pg_lease's DDL guard must judge a command against the catalog as the command finds it, which a REPEATABLE READ or SERIALIZABLE transaction whose snapshot is older cannot read.",
        );
    }
}

/// `lease._name_problem(rel)`: NULL when pg_lease can name owner table `rel`
/// in SQL (its schema and table names have exact UTF-8 forms, which
/// `protect` requires); otherwise why not, for `lease._fence_problems`: the
/// fence and `lease.acquire` read owner rows through SQL that names the
/// table, and would refuse every write (22P05) after a rename or a move to
/// such a name.
#[pgrx::pg_extern(name = "_name_problem", stable, parallel_safe)]
pub fn name_problem(rel: pg_sys::Oid) -> Option<crate::pg::ShownText> {
    (!crate::pg::relation_names_exact(rel)).then(|| {
        crate::pg::ShownText(format!(
            "owner table {} has a name with a character that has no exact UTF-8 form in this {} database (shown as \\x..), which pg_lease cannot name in SQL: rename it",
            crate::pg::display(rel),
            crate::pg::encoding_name()
        ))
    })
}

/// `lease._guard_ddl_start()`: event trigger on `ddl_command_start`, for what
/// must be refused before a command commits anything. `ALTER TABLE ... DETACH
/// PARTITION ... CONCURRENTLY` commits its first phase before
/// `ddl_command_end` could refuse it, and `... FINALIZE` finishes an
/// interrupted one (whose partition no guard may have reached since): on an
/// owner table (whose partitions hold owner rows and their tokens) both are
/// refused here (LF004). `DROP INDEX CONCURRENTLY`: see
/// `refuse_concurrent_owner_key_drop`.
///
/// # Safety
/// Called by Postgres as a version-1 C event trigger function: `fcinfo` is
/// valid for the call.
pub unsafe fn guard_ddl_start(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: `fcinfo` is valid for the call (the caller's contract); its
    // context is null or a Node, and a T_EventTriggerData node is an
    // EventTriggerData the event trigger machinery keeps alive for the call.
    let data = unsafe {
        crate::pg::cast_node::<pg_sys::EventTriggerData>((*fcinfo).context, pg_sys::NodeTag::T_EventTriggerData)
    };
    let Some(data) = data else {
        pgrx::error!("lease._guard_ddl_start() may only be called as an event trigger");
    };
    // SAFETY: as below, for a T_DropStmt node.
    if let Some(drop) = unsafe { crate::pg::cast_node::<pg_sys::DropStmt>(data.parsetree, pg_sys::NodeTag::T_DropStmt) }
    {
        let named = crate::pg::drop_stmt_relids(drop);
        refuse_concurrent_owner_key_drop(drop, &named)?;
        refuse_citus_fenced_drop(drop, &named)?;
        lock_owner_tables_of_last_fences(drop, &named);
        return Ok(pg_sys::Datum::from(0));
    }
    // SAFETY: parsetree is null or the command's parse tree, alive for the
    // whole event trigger call; a T_AlterTableStmt node is an AlterTableStmt.
    let stmt =
        unsafe { crate::pg::cast_node::<pg_sys::AlterTableStmt>(data.parsetree, pg_sys::NodeTag::T_AlterTableStmt) };
    let Some(stmt) = stmt else {
        return Ok(pg_sys::Datum::from(0));
    };
    // SAFETY: an AlterTableStmt's cmds is NIL or a pointer List of Nodes
    // belonging to the same parse tree, which nothing modifies while this
    // trigger runs.
    let cmds = unsafe { crate::pg::list_ptrs(stmt.cmds) };
    for node in cmds {
        // SAFETY: each element is a Node of the parse tree (null is
        // rejected); a T_AlterTableCmd node is an AlterTableCmd.
        let cmd = unsafe {
            crate::pg::cast_node::<pg_sys::AlterTableCmd>(node as *const pg_sys::Node, pg_sys::NodeTag::T_AlterTableCmd)
        };
        let Some(cmd) = cmd else {
            continue;
        };
        // DETACH ... CONCURRENTLY, and DETACH ... FINALIZE (which finishes
        // one that was interrupted, committing the detach at once).
        let finalize = cmd.subtype == pg_sys::AlterTableType::AT_DetachPartitionFinalize;
        if !finalize && (cmd.subtype != pg_sys::AlterTableType::AT_DetachPartition || cmd.def.is_null()) {
            continue;
        }
        // SAFETY: the grammar makes the def of a DETACH PARTITION a
        // PartitionCmd (gram.y, partition_cmd), non-null as checked above.
        if !finalize && !unsafe { &*(cmd.def as *const pg_sys::PartitionCmd) }.concurrent {
            continue;
        }
        // SAFETY: stmt.relation is the statement's non-null RangeVar; with
        // NoLock and RVR_MISSING_OK this is a plain name lookup that returns
        // InvalidOid for a missing relation; no callback, no callback arg.
        let relid = unsafe {
            pg_sys::RangeVarGetRelidExtended(
                stmt.relation,
                pg_sys::NoLock as i32,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            )
        };
        lock_if_owned(relid);
        if relid != pg_sys::InvalidOid && crate::fence::config::is_owner_table(relid) {
            let display = crate::pg::display(relid);
            return Err(Refusal::new(
                crate::errors::LeaseError::FencingTokenRegression,
                format!(
                    "DETACH PARTITION ... {} on {display} would take owner rows out of an owner table",
                    if finalize { "FINALIZE" } else { "CONCURRENTLY" }
                ),
                format!("Table {display} holds the current fencing tokens of fenced resources; a detached partition's tokens could start over."),
            )
            .with_hint("An owner table keeps its partitions while tables are fenced against it: to take one out, lease.unprotect the tables fenced against it first."));
        }
    }
    Ok(pg_sys::Datum::from(0))
}

/// Takes the `ShareUpdateExclusiveLock` on `relid` that a concurrent
/// `DETACH PARTITION` or `DROP INDEX` takes first, before the guard looks
/// at whether it is an owner table: a `lease.protect` making it one, running
/// meanwhile, then commits before the guard looks (and the command is
/// refused), or waits until the command is done. Only for a role that may
/// run the command on it (its owner), as Postgres checks before it locks:
/// no other role can make anyone wait this way (the command fails on
/// permissions anyway).
/// (No SPI: `DROP INDEX CONCURRENTLY` must be its transaction's first
/// action, and a read-write SPI query would give the transaction an xid.)
fn lock_if_owned(relid: pg_sys::Oid) {
    // SAFETY: GetUserId reads a backend global, set in any backend that
    // runs SQL.
    if relid != pg_sys::InvalidOid && crate::pg::owns(unsafe { pg_sys::GetUserId() }, relid) {
        // SAFETY: LockRelationOid locks any OID, to transaction end.
        unsafe { pg_sys::LockRelationOid(relid, pg_sys::ShareUpdateExclusiveLock as _) };
    }
}

/// `DROP INDEX CONCURRENTLY` of a unique index on an owner table (or a
/// partition of one): refused (LF008) before it starts. It commits its first
/// steps (the index no longer kept up, then no longer valid) before the drop
/// guard could refuse it, and an owner key no unique index keeps unique lets
/// a look-alike owner row match a stale writer's row. A plain `DROP INDEX`
/// is judged by the drop guard before it commits. The table is locked first
/// (`lock_if_owned`).
fn refuse_concurrent_owner_key_drop(drop: &pg_sys::DropStmt, named: &[pg_sys::Oid]) -> Result<(), Refusal> {
    if drop.removeType != pg_sys::ObjectType::OBJECT_INDEX || !drop.concurrent {
        return Ok(());
    }
    for &index in named {
        // SAFETY: IndexGetRelation with missing_ok returns InvalidOid for an
        // OID that is not an index.
        let table = unsafe { pg_sys::IndexGetRelation(index, true) };
        if table == pg_sys::InvalidOid {
            continue;
        }
        lock_if_owned(table);
        let unique = crate::pg::index_is_unique(index);
        if unique && crate::fence::config::is_owner_table(table) {
            let (name, display) = (crate::pg::display(index), crate::pg::display(table));
            return Err(Refusal::new(
                crate::errors::LeaseError::FenceTampering,
                format!("DROP INDEX CONCURRENTLY of unique index {name} on owner table {display} is refused"),
                "DROP INDEX CONCURRENTLY commits its first steps before pg_lease's guard can judge it, and an owner key that no unique index keeps unique lets a stale writer's row match another owner row.".to_owned(),
            )
            .with_hint(format!("Use DROP INDEX without CONCURRENTLY: pg_lease lets it commit unless the index is the one that makes {display}'s owner key unique.")));
        }
    }
    Ok(())
}

/// `DROP TABLE` of the last tables fenced against an owner table locks that
/// owner table `ACCESS EXCLUSIVE` here, before PostgreSQL locks the tables
/// it drops: the drop guard then removes the owner table's guards, which
/// takes that lock, and took it after the fenced table's, so a game
/// server's transaction that read or updated its owner row and then wrote
/// the fenced table deadlocked with the drop. Now the transaction finishes
/// first, as beside `lease.unprotect` (which changes the owner table's
/// triggers first too). Only for tables the role may drop (their owner),
/// as Postgres checks before it locks.
fn lock_owner_tables_of_last_fences(drop: &pg_sys::DropStmt, named: &[pg_sys::Oid]) {
    if drop.removeType != pg_sys::ObjectType::OBJECT_TABLE {
        return;
    }
    // SAFETY: GetUserId reads a backend global, set in any backend that
    // runs SQL.
    let user = unsafe { pg_sys::GetUserId() };
    let named: Vec<pg_sys::Oid> = named.iter().copied().filter(|&relid| crate::pg::owns(user, relid)).collect();
    if named.is_empty() {
        return;
    }
    let owners: Vec<pg_sys::Oid> = pgrx::spi::Spi::connect(|client| {
        client
            .select(
                "SELECT DISTINCT p.owner_table::pg_catalog.oid FROM lease.protected p
                  WHERE p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1) AND p.owner_table IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM lease.protected o
                                     WHERE o.owner_table OPERATOR(pg_catalog.=) p.owner_table
                                       AND NOT o.relid::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1))
                  ORDER BY 1",
                None,
                &[named.into()],
            )?
            .map(|row| row.get::<pg_sys::Oid>(1))
            .collect::<Result<Vec<_>, _>>()
            .map(|owners| owners.into_iter().flatten().collect())
    })
    .unwrap_or_else(|e| pgrx::error!("pg_lease: {e}"));
    for owner in owners {
        // SAFETY: LockRelationOid locks any OID, to transaction end.
        unsafe { pg_sys::LockRelationOid(owner, pg_sys::AccessExclusiveLock as _) };
    }
}

/// DROP TABLE of a fenced Citus table: refused (LF008) until it is
/// unprotected. On one node a dropped table takes its rows and its fence
/// with it; Citus's alter_distributed_table and undistribute_table drop a
/// table after copying its rows into a new one under the same name, which
/// would carry the rows on without the fence.
fn refuse_citus_fenced_drop(drop: &pg_sys::DropStmt, named: &[pg_sys::Oid]) -> Result<(), Refusal> {
    if drop.removeType != pg_sys::ObjectType::OBJECT_TABLE {
        return Ok(());
    }
    for &relid in named {
        let fenced_citus = pgrx::spi::Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM lease.protected p WHERE p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) $1)
                AND (lease._citus_table($1::pg_catalog.oid::pg_catalog.regclass)).kind IS NOT NULL",
            &[relid.into()],
        )
        .ok()
        .flatten()
        .unwrap_or(false);
        // A shard of a fenced or owner table, dropped straight on its node:
        // only Citus drops shards (after a move or split), the rule
        // lease._citus_change_refused holds for every change of one.
        if let Some(shard) = crate::fence::citus::shard_of(relid) {
            let refused = pgrx::spi::Spi::get_one_with_args::<crate::pg::ShownText>(
                "SELECT lease._citus_change_refused($1::pg_catalog.oid::pg_catalog.regclass)",
                &[relid.into()],
            )
            .unwrap_or_else(|e| pgrx::error!("pg_lease: {e}"));
            if let Some(crate::pg::ShownText(hint)) = refused {
                let (name, table) = (crate::pg::display(relid), crate::pg::display(shard.logical));
                return Err(Refusal::new(
                    crate::errors::LeaseError::FenceTampering,
                    format!("DROP TABLE of shard {name} of {table} is refused on this node"),
                    hint,
                ));
            }
        }
        if fenced_citus {
            let display = crate::pg::display(relid);
            return Err(Refusal::new(
                crate::errors::LeaseError::FenceTampering,
                format!("DROP TABLE of fenced Citus table {display} would drop its fence"),
                format!("Table {display} is fenced by pg_lease. Citus's alter_distributed_table and undistribute_table drop a table after copying its rows into a new one: run lease.unprotect('{display}') first (and lease.protect again after, where the rows live on)."),
            ));
        }
    }
    Ok(())
}

/// `lease._owner_key_index(owner, owner_key_columns, key_types)`: the unique
/// index that makes `owner`'s key unique under the equality the fence
/// compares keys with (owner key column `=` a fenced key of the paired type
/// in `key_types`, immutable, in the column's collation; a unique,
/// non-deferrable, non-partial btree on exactly those columns:
/// `pg::UniqueIndex::find`), or NULL when there is none, so that two owner
/// rows could match one fenced row. Executable by PUBLIC (lease.protect runs
/// with its caller's rights; it tells nothing the catalogs do not), on an
/// owner table pg_lease guards or one the caller may read (42501 otherwise).
#[pgrx::pg_extern(name = "_owner_key_index", stable, parallel_safe)]
pub fn owner_key_index(
    owner: pg_sys::Oid,
    owner_key_columns: Vec<crate::pg::ServerText>,
    key_types: Vec<Option<pg_sys::Oid>>,
) -> Option<pg_sys::Oid> {
    let owner_key_columns: Vec<String> = owner_key_columns.into_iter().map(|c| c.0).collect();
    if owner_key_columns.len() != key_types.len() {
        return None;
    }
    // Finding the index opens the table and its indexes (AccessShareLock to
    // transaction end): for any role, only on an owner table pg_lease
    // already guards, or on one the caller may read.
    if !crate::pg::relation_exists(owner) {
        return None;
    }
    // SAFETY: an ACL check of the current user on a relation that exists.
    let readable = unsafe {
        pg_sys::pg_class_aclcheck(owner, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    };
    if !readable && !crate::fence::config::is_owner_table(owner) {
        crate::pg::error_without_context(
            pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {}", crate::pg::display(owner)),
            None,
        );
    }
    // (The lock `find` takes, first: a drop it waits for is then an error
    // naming the table.)
    crate::pg::lock_existing(owner, pg_sys::AccessShareLock);
    let mut columns = Vec::with_capacity(key_types.len());
    for (name, key_type) in owner_key_columns.iter().zip(key_types) {
        let (attnum, typid) = crate::pg::attribute(owner, name)?;
        columns.push((attnum, typid, key_type?));
    }
    crate::pg::UniqueIndex::find(owner, &columns).map(|index| index.index)
}

/// `lease._key_equality(left, right)`: the operator an owner key of type
/// `left` and a fenced key of type `right` are compared with
/// (`pg::key_equality`: what `OPERATOR(pg_catalog.=)` resolves to, immutable,
/// reached without a conversion function), or NULL when there is none.
/// Executable by PUBLIC, like `_owner_key_index`.
#[pgrx::pg_extern(name = "_key_equality", stable, parallel_safe)]
pub fn key_equality(left: pg_sys::Oid, right: pg_sys::Oid) -> Option<pg_sys::Oid> {
    crate::pg::key_equality(left, right).map(|eq| eq.op)
}
