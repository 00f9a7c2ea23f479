//! The only writers of `lease.protected` besides the DDL guards:
//! `lease._register` and `lease._unregister`, called by `lease.protect*` and
//! `lease.unprotect`. They run the write as the owner of `lease.protected`
//! after checking the *caller*: it must be allowed to call the public entry
//! point and own every table involved. Nobody else gets DML on
//! `lease.protected`, so a fence cannot be re-pointed behind pg_lease's back.

use crate::pg::{as_role, lease_relid, rel_owner, ServerText};
use pgrx::prelude::*;

fn require(ok: bool, message: String, detail: &str) {
    if !ok {
        crate::pg::error_without_context(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE, message, Some(detail));
    }
}

fn may_execute(role: pg_sys::Oid, function: &str) -> bool {
    Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.has_function_privilege($1, $2::pg_catalog.text::pg_catalog.regprocedure, 'EXECUTE')",
        &[role.into(), function.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// Checks the caller (the current user) of `entry_point`: it may execute
/// it (42501), and every table of `tables` exists (42P01, naming the OID)
/// and is the caller's (42501).
fn check_caller(entry_point: &str, tables: &[pg_sys::Oid]) {
    // SAFETY: GetUserId reads a backend global, set in any backend that
    // runs SQL.
    let caller = unsafe { pg_sys::GetUserId() };
    require(
        may_execute(caller, entry_point),
        format!("pg_lease: permission denied for {}", entry_point.split('(').next().unwrap_or(entry_point)),
        "Fences are set up and removed by the roles the DBA grants lease.protect, lease.protect_high_water and lease.unprotect to.",
    );
    let detail = if entry_point == PROTECT || entry_point == PROTECT_HIGH_WATER {
        "A role may fence only tables it owns, against owner tables it owns."
    } else {
        "A role may change or remove only the fences of tables it owns."
    };
    for &relid in tables {
        if !crate::pg::relation_exists(relid) {
            crate::pg::error_without_context(
                PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                crate::pg::no_such_table(relid),
                None,
            );
        }
        require(
            crate::pg::owns(caller, relid),
            format!("pg_lease: must be owner of table {}", crate::pg::display(relid)),
            detail,
        );
    }
}

/// Who changes the fences on an owner table (`lease._lock_owner_table`).
const PROTECT: &str = "lease.protect(regclass, text[], name, regclass, text[], name)";
const UNPROTECT: &str = "lease.unprotect(regclass)";
const PROTECT_HIGH_WATER: &str = "lease.protect_high_water(regclass, text[], name)";

/// `lease._lock_owner_table(target, owner, by)`: serializes the changes of
/// the fences that share owner table `owner`, for `lease.protect` (`by` =
/// 'protect'), `lease.protect_high_water` ('protect_high_water', `owner` 0:
/// no owner table), `lease.unprotect` ('unprotect', `owner` 0 for a
/// high-water fence) and the drop guard (`by` = its command's tag, after it
/// forgot the fences of dropped tables). Two changes of one table's fence
/// run one after the other too, so the second sees the first (the callers
/// check again that the table is not already protected). Each takes
/// `ShareUpdateExclusiveLock` (it conflicts with itself and with DDL, not
/// with reads and writes of rows) on every table of `owner`'s tree, protect
/// and unprotect on `target`'s tree first (whose TRUNCATE guards they
/// install or remove), before it decides anything from the fences on
/// `owner`: whether its owner guard is already in place, which key columns
/// it watches, whether the last fence using it is gone (its guards then
/// go), which partitions need guards. Decided under two snapshots, two such
/// changes (or one and a partition created under a partition) committed
/// side by side could leave a fence without its guards, or guards with no
/// fence. At READ COMMITTED the caller's next statement sees what the lock
/// waited for; in a REPEATABLE READ or SERIALIZABLE transaction, a change
/// committed after its snapshot is a serialization failure (40001,
/// `ddl::fresh_catalog`). The caller is checked as `lease._register` and
/// `lease._unregister` check it; a drop only from pg_lease's own event
/// trigger (running as the owner of lease.protected).
#[pg_extern(name = "_lock_owner_table", volatile, parallel_unsafe)]
pub fn lock_owner_table(target: pg_sys::Oid, owner: pg_sys::Oid, by: ServerText) {
    // protect locks its target too (first): DDL on it that another session
    // is running when protect finds pg_lease's triggers already in place
    // (and so creates none, which would have waited) is then judged by one
    // of the two, not by neither.
    let (tag, locked) = match by.0.as_str() {
        "protect" => {
            check_caller(PROTECT, &[target, owner]);
            ("lease.protect", vec![target, owner])
        }
        "protect_high_water" => {
            check_caller(PROTECT_HIGH_WATER, &[target]);
            ("lease.protect_high_water", vec![target])
        }
        "unprotect" => {
            check_caller(UNPROTECT, &[target]);
            ("lease.unprotect", [target, owner].into_iter().filter(|&r| r != pg_sys::InvalidOid).collect())
        }
        // (The drop guard passes its command's tag: DROP TABLE, DROP SCHEMA, ...)
        tag if tag.starts_with("DROP") => {
            // SAFETY: GetUserId reads a backend global.
            let user = unsafe { pg_sys::GetUserId() };
            require(
                user == rel_owner(lease_relid(c"protected")),
                "pg_lease: permission denied for lease._lock_owner_table".to_owned(),
                "Only pg_lease's own DDL guard locks owner tables for a drop.",
            );
            (tag, vec![owner])
        }
        other => error!("lease._lock_owner_table: unknown caller {other:?}"),
    };
    // Each whole tree: a partition created or attached under one of its
    // partitions (which locks that partition, not the root) is then either
    // committed before the change reads the tree, or waits for it and is
    // judged by the DDL guard against what it committed.
    let trees: Vec<pg_sys::Oid> =
        locked.iter().flat_map(|&relid| crate::pg::lock_tree(relid, pg_sys::ShareUpdateExclusiveLock)).collect();
    // (As the owner of lease.protected: the migrator that may protect may
    // not run pg_lease's internal catalog reads itself.)
    crate::pg::as_role(rel_owner(lease_relid(c"protected")), || {
        crate::fence::ddl::fresh_catalog(crate::pg::ShownText(tag.to_owned()), trees, false)
    });
}

/// `lease._register(...)`: records a protection set up by `lease.protect*`.
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "_register", volatile, parallel_unsafe)]
pub fn register(
    target: pg_sys::Oid,
    mode: ServerText,
    key_columns: Vec<ServerText>,
    token_column: Option<ServerText>,
    owner_table: Option<pg_sys::Oid>,
    owner_key_columns: Option<Vec<ServerText>>,
    owner_token_column: Option<ServerText>,
) {
    let entry_point = if mode.0 == "owner" { PROTECT } else { PROTECT_HIGH_WATER };
    let mut tables = vec![target];
    tables.extend(owner_table);
    check_caller(entry_point, &tables);
    for &relid in &tables {
        // The fence and `acquire` name these tables in SQL: a name pg_lease
        // could not tell from another's is refused now (22P05), not met later.
        crate::pg::relation_names(relid);
    }
    // (Recorded as who called protect, not as whom the row is written.)
    // SAFETY: GetUserId reads a backend global, set in any backend that
    // runs SQL.
    let caller = unsafe { pg_sys::GetUserId() };
    as_role(rel_owner(lease_relid(c"protected")), || {
        Spi::run_with_args(
            "INSERT INTO lease.protected (relid, mode, key_columns, token_column, owner_table, owner_key_columns,
                                          owner_token_column, protected_by, key_types, token_type, owner_key_types,
                                          owner_token_type)
             SELECT $1::pg_catalog.oid::pg_catalog.regclass, $2, $3, $4, $5::pg_catalog.oid::pg_catalog.regclass, $6, $7,
                    pg_catalog.pg_get_userbyid($8),
                    ARRAY(SELECT lease._column_type($1::pg_catalog.oid::pg_catalog.regclass, k)
                            FROM pg_catalog.unnest($3) WITH ORDINALITY u(k, n) ORDER BY n),
                    lease._column_type($1::pg_catalog.oid::pg_catalog.regclass, $4),
                    CASE WHEN $5 IS NOT NULL THEN ARRAY(SELECT lease._column_type($5::pg_catalog.oid::pg_catalog.regclass, k)
                                                        FROM pg_catalog.unnest($6) WITH ORDINALITY u(k, n) ORDER BY n) END,
                    lease._column_type($5::pg_catalog.oid::pg_catalog.regclass, $7)",
            &[
                target.into(),
                mode.into(),
                key_columns.into(),
                token_column.into(),
                owner_table.into(),
                owner_key_columns.into(),
                owner_token_column.into(),
                caller.into(),
            ],
        )
    })
    .unwrap_or_else(|e| error!("pg_lease: could not record the protection: {e}"));
    // Every backend's cached answers about these tables (a config, "not
    // guarded") are rebuilt when this commits, even when protect found
    // pg_lease's triggers already in place (a schema-only restore) and
    // created none, which would have invalidated them.
    for &relid in &tables {
        // SAFETY: queues a relcache invalidation of an existing relation for
        // the end of this transaction.
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    }
}

/// `lease._unregister(target)`: forgets a protection for `lease.unprotect`.
/// Returns whether there was one.
#[pg_extern(name = "_unregister", volatile, parallel_unsafe)]
pub fn unregister(target: pg_sys::Oid) -> bool {
    check_caller(UNPROTECT, &[target]);
    as_role(rel_owner(lease_relid(c"protected")), || {
        Spi::get_one_with_args::<bool>(
            "WITH d AS (DELETE FROM lease.protected p WHERE p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) $1 RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM d)",
            &[target.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// `lease._judge_replicated(target, judge)`: sets whether `target`'s fence
/// judges changes applied by logical replication (NULL: its mode's default)
/// for `lease.judge_replicated`. Returns whether `target` is protected.
#[pg_extern(name = "_judge_replicated", volatile, parallel_unsafe)]
pub fn judge_replicated(target: pg_sys::Oid, judge: Option<bool>) -> bool {
    check_caller("lease.judge_replicated(regclass, boolean)", &[target]);
    let found = as_role(rel_owner(lease_relid(c"protected")), || {
        Spi::get_one_with_args::<bool>(
            "WITH u AS (UPDATE lease.protected p SET judge_replicated = $2
                         WHERE p.relid::pg_catalog.oid OPERATOR(pg_catalog.=) $1 RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM u)",
            &[target.into(), judge.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(false);
    if found {
        // Every backend's cached config of the table (and of its partitions,
        // which depend on it) and its owner table's guard answers are
        // rebuilt when this commits.
        // SAFETY: queues a relcache invalidation of an existing relation for
        // the end of this transaction.
        unsafe { pg_sys::CacheInvalidateRelcacheByRelid(target) };
    }
    found
}
