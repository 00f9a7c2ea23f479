//! What the DDL guard cannot see from SQL: the subcommands of an ALTER TABLE.

use crate::errors::Refusal;
use pgrx::pg_sys;

/// `lease._retyped_columns(command pg_ddl_command) → text[]`: the columns an
/// ALTER TABLE command gave a type with `ALTER COLUMN ... TYPE` (even the type
/// they had: `USING` then rewrites every row without firing a row trigger).
/// Empty for any other command. Call it only on the `command` column of
/// `pg_event_trigger_ddl_commands()`.
///
/// # Safety
/// Called by Postgres as a version-1 C function.
pub unsafe fn retyped_columns(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let arg = &*(*fcinfo).args.as_ptr();
    let mut names: Vec<pg_sys::Datum> = Vec::new();
    if !arg.isnull {
        // SAFETY: a pg_ddl_command datum is a pointer to the CollectedCommand
        // that pg_event_trigger_ddl_commands() is returning (event trigger
        // memory, alive for the whole ddl_command_end trigger).
        let cmd = &*(arg.value.cast_mut_ptr::<pg_sys::CollectedCommand>());
        if cmd.type_ == pg_sys::CollectedCommandType::SCT_AlterTable {
            let subcmds = cmd.d.alterTable.subcmds;
            let len = if subcmds.is_null() { 0 } else { (*subcmds).length as usize };
            for i in 0..len {
                let sub = (*(*subcmds).elements.add(i)).ptr_value as *const pg_sys::CollectedATSubcmd;
                let node = (*sub).parsetree;
                if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_AlterTableCmd {
                    continue;
                }
                let at = &*(node as *const pg_sys::AlterTableCmd);
                if at.subtype == pg_sys::AlterTableType::AT_AlterColumnType && !at.name.is_null() {
                    names.push(pg_sys::Datum::from(pg_sys::cstring_to_text(at.name)));
                }
            }
        }
    }
    Ok(crate::pg::text_array(&names))
}

/// `lease._exists_as_owner(rel, query)`: runs `query` (a SELECT EXISTS ...
/// about `rel`) as the owner of `rel` in a security-restricted operation, so
/// the DDL guard (SECURITY DEFINER) never runs a user's operators or casts
/// with its own rights. Not executable by PUBLIC.
#[pgrx::pg_extern(name = "_exists_as_owner", volatile, parallel_unsafe)]
pub fn exists_as_owner(rel: pg_sys::Oid, query: &str) -> bool {
    crate::pg::as_table_owner(rel, || {
        pgrx::spi::Spi::get_one::<bool>(query).unwrap_or_else(|e| pgrx::error!("pg_lease: {e}")).unwrap_or(false)
    })
}

/// `lease._guard_ddl_start()`: event trigger on `ddl_command_start`, for what
/// must be refused before a command commits anything. `ALTER TABLE ... DETACH
/// PARTITION ... CONCURRENTLY` commits its first phase before
/// `ddl_command_end` could refuse it: on an owner table (whose partitions hold
/// owner rows and their tokens) it is refused here (LF004).
///
/// # Safety
/// Called by Postgres as a version-1 C event trigger function.
pub unsafe fn guard_ddl_start(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    let ctx = (*fcinfo).context;
    if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_EventTriggerData {
        pgrx::error!("lease._guard_ddl_start() may only be called as an event trigger");
    }
    let data = &*(ctx as *const pg_sys::EventTriggerData);
    let tree = data.parsetree;
    if tree.is_null() || (*tree).type_ != pg_sys::NodeTag::T_AlterTableStmt {
        return Ok(pg_sys::Datum::from(0));
    }
    let stmt = &*(tree as *const pg_sys::AlterTableStmt);
    let cmds = stmt.cmds;
    let len = if cmds.is_null() { 0 } else { (*cmds).length as usize };
    for i in 0..len {
        let node = (*(*cmds).elements.add(i)).ptr_value as *const pg_sys::Node;
        if node.is_null() || (*node).type_ != pg_sys::NodeTag::T_AlterTableCmd {
            continue;
        }
        let cmd = &*(node as *const pg_sys::AlterTableCmd);
        if cmd.subtype != pg_sys::AlterTableType::AT_DetachPartition || cmd.def.is_null() {
            continue;
        }
        let part = &*(cmd.def as *const pg_sys::PartitionCmd);
        if !part.concurrent {
            continue;
        }
        let relid = pg_sys::RangeVarGetRelidExtended(
            stmt.relation,
            pg_sys::NoLock as i32,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        if relid != pg_sys::InvalidOid && crate::fence::config::is_owner_table(relid) {
            let display = crate::pg::display(relid);
            return Err(Refusal::new(
                crate::errors::LeaseError::FencingTokenRegression,
                format!("DETACH PARTITION of owner table {display} would take owner rows out of it"),
                format!("Table {display} holds the current fencing tokens of fenced resources; a detached partition's tokens could start over."),
            ));
        }
    }
    Ok(pg_sys::Datum::from(0))
}
