//! Citus: the fence on the shards of distributed tables.
//!
//! Citus stores a distributed table's rows in shards (`payouts_102012`), plain
//! tables on the worker nodes, and copies the table's row triggers onto every
//! shard. pg_lease's trigger therefore fires on a shard, on a node whose
//! `lease.protected` knows nothing of it (that table is local to each node).
//! What it needs comes from Citus's own metadata, present on every node:
//! the distributed table a shard belongs to (`pg_dist_shard`), the fence's
//! config (the argument `lease.protect` gave the distributed table's fence
//! trigger, which Citus copies to every node's shell and shard, present and
//! future), and the shard of the owner table co-located with it on this node
//! (`lease.protect` refuses layouts without one), whose rows are the owner
//! rows of the shard's rows.
//!
//! Every answer is a catalog read made when a config is built; the config
//! cache is dropped by the relcache invalidations of the shard, the
//! distributed table's shell (its trigger) and the owner shard.

use crate::errors::{LeaseError, Refusal};
use crate::pg::{display, shown_relation_names};
use pgrx::prelude::*;
use pgrx::spi::Spi;

/// A shard of a Citus table on this node.
pub struct Shard {
    /// This node's shell of the distributed table.
    pub logical: pg_sys::Oid,
    /// Citus's id of the shard (the suffix of its name and of its triggers').
    pub id: i64,
    /// The shard's hash range (None for a reference table's one shard).
    range: (Option<String>, Option<String>),
    /// Whether Citus's metadata places it on this node: false for the new
    /// shard of a move or split still being built here (or the old one left
    /// for Citus's cleanup).
    placed: bool,
}

/// Whether Citus's metadata exists in this database.
pub fn present() -> bool {
    // SAFETY: a syscache lookup of a name in pg_catalog with a NUL-terminated
    // literal; a missing relation gives InvalidOid.
    let relid = unsafe { pg_sys::get_relname_relid(c"pg_dist_shard".as_ptr(), pg_sys::PG_CATALOG_NAMESPACE.into()) };
    relid != pg_sys::InvalidOid
}

/// The shard `relid` is, when it is a Citus shard on this node: its name
/// carries the shard id and is the name Citus gives that shard
/// (`shard_name`), so a table merely named like one is not taken for it.
/// Whether Citus's metadata places the shard here yet is not asked: while
/// Citus moves or splits a shard, the new one is written (its copy, a
/// logical move's catch-up) before the metadata says it is there.
pub fn shard_of(relid: pg_sys::Oid) -> Option<Shard> {
    if !present() {
        return None;
    }
    let (_, name) = shown_relation_names(relid);
    let id: i64 = name.rsplit_once('_')?.1.parse().ok()?;
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT s.logicalrelid::pg_catalog.oid, s.shardminvalue, s.shardmaxvalue,
                        EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g
                                 WHERE p.shardid OPERATOR(pg_catalog.=) s.shardid
                                   AND p.groupid OPERATOR(pg_catalog.=) g.groupid)
                   FROM pg_catalog.pg_dist_shard s
                  WHERE s.shardid OPERATOR(pg_catalog.=) $1
                    AND pg_catalog.to_regclass(pg_catalog.shard_name(s.logicalrelid, s.shardid, false))::pg_catalog.oid
                        OPERATOR(pg_catalog.=) $2",
                Some(1),
                &[id.into(), relid.into()],
            )
            .ok()?;
        let row = rows.first();
        if row.is_empty() {
            return None;
        }
        Some(Shard {
            id,
            logical: row.get::<pg_sys::Oid>(1).ok()??,
            range: (row.get::<String>(2).ok()?, row.get::<String>(3).ok()?),
            placed: row.get::<bool>(4).ok()?.unwrap_or(false),
        })
    })
}

/// This node's shard of `owner` (a distributed table's shell) that holds the
/// owner rows of `shard`'s rows: the co-located shard with the same hash
/// range, or the reference table's one shard, placed here as `shard` is
/// (Citus moves co-located shards together: a placed shard's owner rows are
/// in a placed shard, never in one a move left behind for cleanup; a shard
/// still being built finds the owner shard being built beside it). None
/// when there is none.
pub fn colocated_shard(owner: pg_sys::Oid, shard: &Shard) -> Option<pg_sys::Oid> {
    Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regclass(pg_catalog.shard_name(o.logicalrelid, o.shardid, false))::pg_catalog.oid
           FROM pg_catalog.pg_dist_shard o
           JOIN pg_catalog.pg_dist_partition d ON d.logicalrelid OPERATOR(pg_catalog.=) o.logicalrelid
          WHERE o.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass
            AND ((d.partmethod OPERATOR(pg_catalog.=) 'n' AND d.repmodel OPERATOR(pg_catalog.=) 't')
                 OR (d.partmethod OPERATOR(pg_catalog.=) 'h'
                     AND o.shardminvalue OPERATOR(pg_catalog.=) $2 AND o.shardmaxvalue OPERATOR(pg_catalog.=) $3))
            AND pg_catalog.to_regclass(pg_catalog.shard_name(o.logicalrelid, o.shardid, false)) IS NOT NULL
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g
                         WHERE p.shardid OPERATOR(pg_catalog.=) o.shardid
                           AND p.groupid OPERATOR(pg_catalog.=) g.groupid) OPERATOR(pg_catalog.=) $4
          LIMIT 1",
        &[owner.into(), shard.range.0.clone().into(), shard.range.1.clone().into(), shard.placed.into()],
    )
    .ok()
    .flatten()
    .filter(|&oid| oid != pg_sys::InvalidOid)
}

/// The arguments of the trigger `name` running `function` on `relid` (this
/// node's shell of a distributed table), None when it has no such trigger.
pub fn shell_trigger_args(relid: pg_sys::Oid, name: &str, function: &str) -> Option<Vec<String>> {
    let bytes = Spi::get_one_with_args::<Vec<u8>>(
        "SELECT t.tgargs FROM pg_catalog.pg_trigger t
          WHERE t.tgrelid OPERATOR(pg_catalog.=) $1 AND t.tgname OPERATOR(pg_catalog.=) $2
            AND t.tgfoid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure($3)::pg_catalog.oid",
        &[relid.into(), name.into(), function.into()],
    )
    .ok()
    .flatten()?;
    // tgargs: each argument NUL-terminated.
    Some(bytes.split(|&b| b == 0).take(bytes.iter().filter(|&&b| b == 0).count()).map(crate::pg::from_server).collect())
}

/// `lease._shard_of(rel)`: this node's shell of the distributed table whose
/// shard `rel` is, NULL when `rel` is not a Citus shard on this node
/// (what the DDL guards check shards by, [`shard_of`]'s one rule).
#[pg_extern(name = "_shard_of", stable, parallel_safe)]
pub fn shard_of_sql(rel: pg_sys::Oid) -> Option<pg_sys::Oid> {
    shard_of(rel).map(|shard| shard.logical)
}

/// `lease._shard_id(rel)`: Citus's id of the shard `rel` is (NULL as for
/// `lease._shard_of`). SQL cannot read a shard's name from pg_class: Citus
/// hides shards there from most sessions.
#[pg_extern(name = "_shard_id", stable, parallel_safe)]
pub fn shard_id_sql(rel: pg_sys::Oid) -> Option<i64> {
    shard_of(rel).map(|shard| shard.id)
}

/// The names Citus gives the roles it creates to own the subscription of a
/// logical shard move or split (`multi_logical_replication.c`: created
/// SUPERUSER, given the subscription, then made NOSUPERUSER and a member of
/// the table's owner).
const TRANSFER_ROLE_PREFIXES: [&str; 2] =
    ["citus_shard_move_subscription_role_", "citus_shard_split_subscription_role_"];

/// Whether `role_name` is a role Citus creates to own a shard transfer's
/// subscription, in a database where Citus is installed. What such a
/// subscription applies was judged by the fence on the shard it copies.
pub fn shard_transfer_role(role_name: &str) -> bool {
    TRANSFER_ROLE_PREFIXES.iter().any(|prefix| role_name.starts_with(prefix)) && present()
}

/// A TRUNCATE statement's refusal, when it names a shard of a fenced or
/// owner table on this node: Citus copies statement triggers (pg_lease's
/// TRUNCATE guards among them) only to the shards it moves, so a shard
/// truncated straight on its node (or through run_command_on_workers) is
/// judged here, as the guards judge a TRUNCATE of the table itself. (A
/// TRUNCATE of the table through the coordinator is refused there first.)
pub fn truncate_refusal(stmt: *mut pg_sys::Node) -> Option<Refusal> {
    // SAFETY: `stmt` is the utility statement ProcessUtility was given (or
    // NULL); its tag says which node struct it is.
    if stmt.is_null() || unsafe { (*stmt).type_ } != pg_sys::NodeTag::T_TruncateStmt || !present() {
        return None;
    }
    // SAFETY: a TruncateStmt (checked above), whose relations list holds RangeVars.
    let relations =
        unsafe { pgrx::PgList::<pg_sys::RangeVar>::from_pg((*(stmt as *mut pg_sys::TruncateStmt)).relations) };
    for rv in relations.iter_ptr() {
        // SAFETY: a name lookup of a RangeVar of the statement, no lock taken,
        // a missing relation giving InvalidOid (TRUNCATE itself reports it).
        let relid = unsafe {
            pg_sys::RangeVarGetRelidExtended(
                rv,
                pg_sys::NoLock as pg_sys::LOCKMODE,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            )
        };
        if relid == pg_sys::InvalidOid {
            continue;
        }
        let Some(shard) = shard_of(relid) else { continue };
        let (shard_name, table) = (display(relid), display(shard.logical));
        if shell_trigger_args(shard.logical, "pg_lease_owner_guard", "lease.owner_guard()").is_some() {
            return Some(Refusal::new(
                LeaseError::FencingTokenRegression,
                format!("TRUNCATE of shard {shard_name} of owner table {table} would erase its fencing tokens"),
                format!("Table {table} holds the current fencing tokens of fenced resources; TRUNCATE would let tokens start over."),
            ));
        }
        if shell_trigger_args(shard.logical, "pg_lease_fence", "lease.fence_trigger()").is_some() {
            return Some(Refusal::new(
                LeaseError::FenceTampering,
                format!("TRUNCATE of shard {shard_name} of fenced table {table} bypasses the fence"),
                format!("Table {table} is protected by pg_lease; TRUNCATE fires no row trigger, so no fencing token could be checked. Delete rows with a bound token, or call lease.unprotect first."),
            ));
        }
    }
    None
}
