//! Protection config per relation, cached for the life of the backend.
//!
//! The row trigger finds its table's config here by relation OID. Entries are
//! built once from `lease.protected` (the only per-table SPI work) and dropped
//! by the relcache invalidation callback whenever the protected table, its
//! owner table, or anything they depend on changes (protect/unprotect create
//! and drop triggers, which invalidates the relation in every backend).

use crate::errors::{LeaseError, Refusal};
use crate::fence::citus;
use crate::fence::identity::Canon;
use crate::fence::FastMap;
use crate::pg::{
    attcollation, attribute, is_token_type, key_match, prepare_saved, qualified_name, quote_ident, rel_owner,
    relation_names, shown_relation_names, UniqueIndex,
};
use pgrx::prelude::*;
use pgrx::spi::Spi;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// A key column as it appears in the relation the trigger fired on (for a
/// partition, attribute numbers can differ from the parent's).
pub struct KeyColumn {
    pub attnum: i16,
    pub name: String,
    pub typid: pg_sys::Oid,
    pub typlen: i16,
    pub typbyval: bool,
    /// High-water mode: how the value names its resource in lease.high_water.
    pub canon: Option<Canon>,
}

pub enum TokenSource {
    /// `NEW.<column>` (int2, int4 or int8).
    Column { attnum: i16, typid: pg_sys::Oid },
    /// The transaction-bound `pg_lease.token`.
    Bound,
}

pub struct OwnerLookup {
    pub relid: pg_sys::Oid,
    pub rel_owner: pg_sys::Oid,
    pub display: String,
    /// `SELECT token, tableoid FROM owner WHERE keys = $n FOR SHARE`, saved
    /// with SPI_keepplan. Postgres may re-parse its text (by name) when it
    /// revalidates it, so every answer's tableoid is checked against `tables`.
    pub plan: pg_sys::SPIPlanPtr,
    /// The same lookup without the lock, for what a refusal that needs no
    /// verdict (no token presented) reports as the current token.
    pub peek: pg_sys::SPIPlanPtr,
    /// The owner key's unique index, through which `plan`'s lock is taken
    /// without SPI (fence::owner); None when the owner table is partitioned
    /// or no index compares exactly as `plan` does (then `plan` runs).
    pub index: Option<UniqueIndex>,
    /// The owner table's token column (attnum, integer type).
    pub token: (i16, pg_sys::Oid),
    /// The names of the owner table's token column and key columns (in key
    /// order), for the rare statements that write an owner row (fence::owner).
    pub token_name: String,
    pub key_names: Vec<String>,
    /// The owner table and its partitions: where an owner row may come from.
    pub tables: Vec<pg_sys::Oid>,
}

impl OwnerLookup {
    /// Whether a row of relation `tableoid` is a row of the owner table: the
    /// owner table or a partition in its tree, as listed when the config was
    /// built, or created since (the config is dropped when any of them is
    /// invalidated, but a lookup may meet a new partition first).
    pub fn holds(&self, tableoid: pg_sys::Oid) -> bool {
        if self.tables.contains(&tableoid) {
            return true;
        }
        // SAFETY: a syscache lookup accepting any OID.
        if !unsafe { pg_sys::get_rel_relispartition(tableoid) } {
            return false;
        }
        // SAFETY: OIDs are by-value datums, valid regclasses.
        let args = unsafe {
            [
                pgrx::datum::DatumWithOid::new(tableoid, pg_sys::REGCLASSOID),
                pgrx::datum::DatumWithOid::new(self.relid, pg_sys::REGCLASSOID),
            ]
        };
        let found = Spi::connect(|client| {
            client
                .select("SELECT FROM pg_catalog.pg_partition_ancestors($1) a WHERE a.relid = $2", Some(1), &args)
                .expect("reading the owner table's partitions")
                .len()
        });
        found == 1
    }
}

pub enum Mode {
    Owner(OwnerLookup),
    HighWater,
}

pub struct FenceConfig {
    /// The relation the trigger fired on (a partition or the protected table).
    pub relid: pg_sys::Oid,
    /// The table named in `lease.protect*()`.
    pub protected_relid: pg_sys::Oid,
    pub schema: String,
    pub table: String,
    pub display: String,
    pub keys: Vec<KeyColumn>,
    pub token: TokenSource,
    pub mode: Mode,
    /// What a resource key is scoped by in the per-transaction cache: the
    /// owner table and its key columns (owner mode: shared by every table
    /// fenced against the same owner key), or the protected table (high-water).
    pub scope: Vec<u8>,
    /// Shared accepted/refused counters of the protected table (with preload).
    pub stats: crate::audit::TableStats,
    /// Whether changes applied by logical replication are judged here too
    /// (`lease.protected.judge_replicated`, by default only in high-water mode).
    pub judge_replicated: bool,
}

impl FenceConfig {
    pub fn is_high_water(&self) -> bool {
        matches!(self.mode, Mode::HighWater)
    }

    /// Whether an invalidation of `relid` changes this config: the fenced
    /// table, the protected one (a partition's root), the owner table or any
    /// partition in its tree (a partition created under a sub-partition
    /// invalidates only that one, and `tables` must list it).
    fn depends_on(&self, relid: pg_sys::Oid) -> bool {
        self.relid == relid
            || self.protected_relid == relid
            || matches!(&self.mode, Mode::Owner(o) if o.relid == relid || o.tables.contains(&relid))
    }
}

impl Drop for FenceConfig {
    fn drop(&mut self) {
        if let Mode::Owner(owner) = &self.mode {
            // Drops can happen inside an invalidation callback, where freeing
            // plans is not safe; they are freed on the next config build.
            // At backend exit the list may already be gone: nothing to free then.
            let _ = STALE_PLANS.try_with(|p| p.borrow_mut().extend([owner.plan, owner.peek]));
        }
    }
}

thread_local! {
    static CONFIGS: RefCell<FastMap<pg_sys::Oid, Rc<FenceConfig>>> = RefCell::new(FastMap::default());
    static FLUSH_ALL: Cell<bool> = const { Cell::new(false) };
    static STALE_PLANS: RefCell<Vec<pg_sys::SPIPlanPtr>> = const { RefCell::new(Vec::new()) };
    /// Bumped by every relcache invalidation (see [`relcache_generation`]).
    static RELCACHE_GENERATION: Cell<u64> = const { Cell::new(0) };
    /// Relations the guards may run on: owner tables (and their partitions).
    static OWNER_TABLES: RefCell<FastMap<pg_sys::Oid, Option<bool>>> = RefCell::new(FastMap::default());
}

/// Carries out a flush requested by [`forget_all`] or an invalidation that
/// could not borrow the caches.
fn flush_if_requested() {
    if FLUSH_ALL.with(|f| f.replace(false)) {
        CONFIGS.with(|c| c.borrow_mut().clear());
        OWNER_TABLES.with(|o| o.borrow_mut().clear());
    }
}

/// The config for `relid`, building it on first use in this backend.
pub fn for_relation(relid: pg_sys::Oid) -> Result<Rc<FenceConfig>, Refusal> {
    flush_if_requested();
    if let Some(cfg) = CONFIGS.with(|c| c.borrow().get(&relid).cloned()) {
        return Ok(cfg);
    }
    free_stale_plans();
    let cfg = Rc::new(build(relid)?);
    CONFIGS.with(|c| c.borrow_mut().insert(relid, cfg.clone()));
    Ok(cfg)
}

/// Whether `cfg` is still the config this backend holds for its relation:
/// false once an invalidation (or [`forget_all`]) has dropped it, even while
/// a caller still holds it.
pub fn is_current(cfg: &FenceConfig) -> bool {
    !FLUSH_ALL.with(Cell::get)
        && CONFIGS.with(|c| {
            c.try_borrow().is_ok_and(|map| map.get(&cfg.relid).is_some_and(|held| std::ptr::eq(&**held, cfg)))
        })
}

/// Forgets every config (the next row rebuilds it from the catalogs).
pub fn forget_all() {
    FLUSH_ALL.with(|f| f.set(true));
}

/// A number that changes with every relcache invalidation this backend
/// receives: what is derived from a relation outside a [`FenceConfig`] (the
/// high-water store's index) is valid while it stays the same.
pub fn relcache_generation() -> u64 {
    RELCACHE_GENERATION.with(Cell::get)
}

/// Relcache invalidation: forget every config that depends on `relid`.
pub unsafe extern "C-unwind" fn on_relcache_invalidation(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    RELCACHE_GENERATION.with(|g| g.set(g.get().wrapping_add(1)));
    CONFIGS.with(|c| match c.try_borrow_mut() {
        Ok(mut map) if relid != pg_sys::InvalidOid => map.retain(|_, cfg| !cfg.depends_on(relid)),
        Ok(mut map) => map.clear(),
        // Never expected (no borrow is held across a call into Postgres), but
        // a lost invalidation would be a correctness bug: flush everything.
        Err(_) => forget_all(),
    });
    OWNER_TABLES.with(|o| match o.try_borrow_mut() {
        Ok(mut map) => map.clear(),
        Err(_) => forget_all(),
    });
}

/// Syscache invalidation of schemas (renames, drops): lookups are planned
/// from schema-qualified names, so every config is rebuilt with the names
/// that hold now.
pub unsafe extern "C-unwind" fn on_namespace_invalidation(_arg: pg_sys::Datum, _cacheid: i32, _hash: u32) {
    forget_all();
}

/// Whether `relid` is an owner table of a protected table, or a partition of
/// one: the owner guards refuse to run anywhere else (they would let any
/// role write audit records of its choosing).
pub fn is_owner_table(relid: pg_sys::Oid) -> bool {
    owner_table(relid).is_some()
}

/// None when `relid` is not an owner table (or a partition of one), else
/// whether its owner guards judge changes applied by logical replication:
/// when any table fenced against it does.
pub fn owner_table(relid: pg_sys::Oid) -> Option<bool> {
    flush_if_requested();
    if let Some(known) = OWNER_TABLES.with(|o| o.borrow().get(&relid).copied()) {
        return known;
    }
    // Under the latest snapshot: kept past this transaction (see load_row).
    let query = std::ffi::CString::new(format!(
        "SELECT pg_catalog.bool_or(COALESCE({JUDGE_REPLICATED}, false))::pg_catalog.text FROM lease.protected p
          WHERE {}",
        names_relation("p.owner_table", relid)
    ))
    .expect("no NUL");
    let known =
        crate::pg::query_text_under(&query, true, "reading lease.protected").map(|t| t == b"true").or_else(|| {
            // A Citus shard of an owner table: its distributed table is one
            // (this node's lease.protected says so, on a coordinator that holds
            // shards), or carries pg_lease's owner guard, which only protect
            // installs there and Citus copies to every node (fence::citus).
            let shard = citus::shard_of(relid)?;
            owner_table(shard.logical).or_else(|| {
                citus::shell_trigger_args(shard.logical, "pg_lease_owner_guard", "lease.owner_guard()").map(|_| false)
            })
        });
    OWNER_TABLES.with(|o| o.borrow_mut().insert(relid, known));
    known
}

/// How a refusal names `relid`: for a Citus shard, its distributed table
/// (what users write to and protect), else `relid` itself.
pub fn display_of(relid: pg_sys::Oid) -> String {
    crate::pg::display(citus::shard_of(relid).map_or(relid, |shard| shard.logical))
}

fn free_stale_plans() {
    let plans = STALE_PLANS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    for plan in plans {
        // SAFETY: each plan was saved with SPI_keepplan (prepare_saved) and
        // queued exactly once, by the Drop of the last reference to the
        // FenceConfig that owned it, so it is freed once and no code can run
        // it afterwards. Freeing is deferred to here, outside invalidation
        // callbacks, because SPI_freeplan may not run inside one.
        unsafe { pg_sys::SPI_freeplan(plan) };
    }
}

#[derive(Clone)]
struct ProtectedRow {
    protected_relid: pg_sys::Oid,
    mode: String,
    key_columns: Vec<String>,
    token_column: Option<String>,
    owner_table: Option<pg_sys::Oid>,
    owner_key_columns: Vec<String>,
    owner_token_column: Option<String>,
    judge_replicated: bool,
    /// Read from a Citus table's fence trigger argument, not lease.protected.
    from_trigger: bool,
}

/// `lease.protected p`'s `judge_replicated` (since 0.7.0), read so that the
/// query also runs in a database whose pg_lease is not yet updated to 0.7.0
/// (the library is installed before `ALTER EXTENSION ... UPDATE`): NULL there.
const JUDGE_REPLICATED: &str =
    "(pg_catalog.to_jsonb(p) OPERATOR(pg_catalog.->>) 'judge_replicated'::pg_catalog.text)::pg_catalog.bool";

/// SQL: `column` (a regclass of `lease.protected p`) names `relid` or one of
/// its partition ancestors (the rows of `lease.protected` that apply to it).
fn names_relation(column: &str, relid: pg_sys::Oid) -> String {
    let oid = relid.to_u32();
    format!(
        "{column}::pg_catalog.oid OPERATOR(pg_catalog.=) '{oid}'::pg_catalog.oid
             OR {column}::pg_catalog.oid OPERATOR(pg_catalog.=) ANY (ARRAY(
                    SELECT a.relid::pg_catalog.oid
                      FROM pg_catalog.pg_partition_ancestors('{oid}'::pg_catalog.oid::pg_catalog.regclass) a))"
    )
}

/// `relid`'s row of `lease.protected` (or its nearest partitioned
/// ancestor's), as committed now: read under the latest snapshot, since a
/// config is kept past this transaction (until an invalidation drops it),
/// and one read under an older snapshot (a REPEATABLE READ transaction's,
/// or a statement's that began before a `protect` or `unprotect` committed)
/// would outlive it, judging later transactions by a fence that is gone. A
/// transaction whose snapshot sees another row (it began before the change)
/// fails with `40001`, as it does when an owner row changed after its
/// snapshot: retried, it is judged by the fence as it is now.
fn load_row(relid: pg_sys::Oid) -> Option<ProtectedRow> {
    // Runs with the writer's search_path: every operator is schema-qualified,
    // so look-alike objects in other schemas cannot steer it.
    let query = std::ffi::CString::new(format!(
        "SELECT pg_catalog.json_build_array(p.relid::pg_catalog.oid::pg_catalog.int8, p.mode, p.key_columns, p.token_column,
                p.owner_table::pg_catalog.oid::pg_catalog.int8, p.owner_key_columns, p.owner_token_column,
                COALESCE({JUDGE_REPLICATED}, p.mode OPERATOR(pg_catalog.=) 'high_water'))::pg_catalog.text
           FROM lease.protected p
          WHERE {}
          LIMIT 1",
        names_relation("p.relid", relid)
    ))
    .expect("no NUL");
    let (now, older) = crate::pg::query_text_now(&query, "reading lease.protected");
    if older {
        crate::pg::serialization_failure(
            format!(
                "pg_lease: the fence on {} changed after this transaction's snapshot was taken",
                crate::pg::display(relid)
            ),
            "lease.protect or lease.unprotect committed since the transaction began, and a write is judged by the fence as it is now.",
        );
    }
    // Names in the database's encoding, as Rust text.
    type Read = (
        u32,
        String,
        Option<Vec<String>>,
        Option<String>,
        Option<u32>,
        Option<Vec<String>>,
        Option<String>,
        Option<bool>,
    );
    let (protected, mode, keys, token, owner, owner_keys, owner_token, judge): Read =
        serde_json::from_str(&crate::pg::from_server_json(&now?)).expect("lease.protected row as JSON");
    Some(ProtectedRow {
        protected_relid: pg_sys::Oid::from(protected),
        mode,
        key_columns: keys.unwrap_or_default(),
        token_column: token,
        owner_table: owner.map(pg_sys::Oid::from),
        owner_key_columns: owner_keys.unwrap_or_default(),
        owner_token_column: owner_token,
        judge_replicated: judge.unwrap_or(true),
        from_trigger: false,
    })
}

/// The config of a distributed table's shards on a node whose
/// `lease.protected` does not have it: the JSON argument `lease.protect` gave
/// the table's fence trigger (`lease._shard_config`), read from this node's
/// shell of the table. Err says what is missing.
fn shard_row(logical: pg_sys::Oid) -> Result<ProtectedRow, String> {
    let args = citus::shell_trigger_args(logical, "pg_lease_fence", "lease.fence_trigger()")
        .ok_or("the distributed table has no fence trigger on this node")?;
    let config: serde_json::Value = args
        .first()
        .and_then(|a| serde_json::from_str(a).ok())
        .ok_or("its fence trigger carries no config (it was protected before it was distributed)")?;
    let text = |k: &str| config[k].as_str().map(str::to_owned);
    let texts = |k: &str| -> Vec<String> {
        config[k]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let mode = text("mode").ok_or("its fence trigger's config has no mode")?;
    let owner_table = match text("owner_table") {
        None => None,
        Some(name) => Some(
            Spi::get_one_with_args::<pg_sys::Oid>(
                "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
                &[crate::pg::ServerText(name.clone()).into()],
            )
            .ok()
            .flatten()
            .filter(|&oid| oid != pg_sys::InvalidOid)
            .ok_or_else(|| format!("its owner table {name} does not exist on this node"))?,
        ),
    };
    Ok(ProtectedRow {
        protected_relid: logical,
        judge_replicated: mode == "high_water",
        mode,
        key_columns: texts("key_columns"),
        token_column: text("token_column"),
        owner_table,
        owner_key_columns: texts("owner_key_columns"),
        owner_token_column: text("owner_token_column"),
        from_trigger: true,
    })
}

fn misconfigured(display: &str, what: String) -> Refusal {
    Refusal::new(LeaseError::FenceTampering, format!("the fence on {display} is inconsistent"), what)
}

/// (attnum, type) of column `name` of `relid` (`display`), which a fence or
/// guard needs: LF008 when it no longer exists.
pub fn column(relid: pg_sys::Oid, display: &str, name: &str) -> Result<(i16, pg_sys::Oid), Refusal> {
    attribute(relid, name)
        .ok_or_else(|| misconfigured(display, format!("column \"{name}\" of {display} no longer exists")))
}

fn build(relid: pg_sys::Oid) -> Result<FenceConfig, Refusal> {
    // Shown only (messages, the audit): a fenced table is not named in SQL.
    let (mut schema, mut table) = shown_relation_names(relid);
    let mut display = qualified_name(&schema, &table);
    let (row, shard) = match load_row(relid) {
        Some(row) => (row, None),
        None => match citus::shard_of(relid) {
            Some(shard) => {
                // A Citus shard: its distributed table's config, as this node
                // has it (a coordinator that also holds shards) or as its
                // fence trigger carries it (fence::citus).
                (schema, table) = shown_relation_names(shard.logical);
                let logical = qualified_name(&schema, &table);
                let row = match load_row(shard.logical) {
                    Some(row) => row,
                    None => shard_row(shard.logical).map_err(|why| {
                        misconfigured(&logical, format!("shard {display} of {logical} has pg_lease's fence trigger, but {why}"))
                            .with_hint(format!(
                                "On the coordinator, run lease.unprotect('{logical}') and lease.protect again: protect gives a distributed table's fence trigger the config its shards read. Until then every write is refused."
                            ))
                    })?,
                };
                display = logical;
                (row, Some(shard))
            }
            None => {
                return Err(misconfigured(
                    &display,
                    format!("{display} carries pg_lease's fence trigger but lease.protected has no entry for it"),
                )
                .with_hint(format!(
                    "A schema-only dump and restore carries pg_lease's triggers but not its protection config (data): run lease.protect for {display} again (it takes the triggers over), or lease.unprotect('{display}') to remove them. Until then every write is refused."
                )))
            }
        },
    };

    let high_water = row.mode == "high_water";
    let mut keys = Vec::with_capacity(row.key_columns.len());
    for name in &row.key_columns {
        let (attnum, typid) = column(relid, &display, name)?;
        let (mut typlen, mut typbyval) = (0i16, false);
        // SAFETY: a syscache lookup of the column's type writing into two live
        // locals; an unknown type raises an ERROR.
        unsafe { pg_sys::get_typlenbyval(typid, &mut typlen, &mut typbyval) };
        let canon = if high_water {
            let collation = attcollation(relid, attnum);
            Some(Canon::of(typid, collation).map_err(|why| {
                misconfigured(&display, format!("key column \"{name}\" of {display} cannot identify a resource: {why}"))
            })?)
        } else {
            None
        };
        keys.push(KeyColumn { attnum, name: name.clone(), typid, typlen, typbyval, canon });
    }

    let token = match &row.token_column {
        None => TokenSource::Bound,
        Some(name) => {
            let (attnum, typid) = column(relid, &display, name)?;
            if !is_token_type(typid) {
                return Err(misconfigured(
                    &display,
                    format!("token column \"{name}\" of {display} is no longer an integer"),
                ));
            }
            TokenSource::Column { attnum, typid }
        }
    };

    let mut scope = Vec::with_capacity(16);
    let mode = if high_water {
        scope.push(b'h');
        scope.extend_from_slice(&row.protected_relid.to_u32().to_ne_bytes());
        Mode::HighWater
    } else {
        let (owner, owner_attnums) = match &shard {
            None => prepare_owner_lookup(&display, &row, &keys)?,
            Some(shard) => {
                let logical_owner =
                    row.owner_table.ok_or_else(|| misconfigured(&display, "no owner table recorded".into()))?;
                let owner_display = crate::pg::display(logical_owner);
                let owner_shard = citus::colocated_shard(logical_owner, shard).ok_or_else(|| {
                    misconfigured(
                        &display,
                        format!(
                            "shard {} of {display} has no shard of its owner table {owner_display} co-located with it on this node",
                            crate::pg::display(relid)
                        ),
                    )
                    .with_hint(format!(
                        "pg_lease finds a row's owner row on the node that holds the row: {owner_display} must stay distributed by the owner key and co-located with {display} (update_distributed_table_colocation may not separate them), or be a reference table. Co-locate them again, or lease.unprotect('{display}') on the coordinator."
                    ))
                })?;
                // The config came from a trigger argument, which whoever owns
                // the fenced table could have written: it may name only an
                // owner table whose owner the fenced table's owner acts as, as
                // lease.protect requires of its caller for both tables.
                let (fenced_owner, owner_owner) = (rel_owner(relid), rel_owner(owner_shard));
                // SAFETY: a role-membership check of two role OIDs (syscache).
                if row.from_trigger && !unsafe { pg_sys::has_privs_of_role(fenced_owner, owner_owner) } {
                    return Err(misconfigured(
                        &display,
                        format!(
                            "the fence trigger of {display} names owner table {owner_display}, whose owner {} {display}'s owner {} does not act as",
                            crate::pg::role_name(owner_owner),
                            crate::pg::role_name(fenced_owner)
                        ),
                    )
                    .with_hint(format!(
                        "Fences are set up by lease.protect on the Citus coordinator, by a role that owns both tables: lease.unprotect('{display}') there and protect it again."
                    )));
                }
                let row = ProtectedRow { owner_table: Some(owner_shard), ..row.clone() };
                let (mut owner, attnums) = prepare_owner_lookup(&display, &row, &keys)?;
                owner.display = owner_display;
                (owner, attnums)
            }
        };
        scope.push(b'o');
        scope.extend_from_slice(&owner.relid.to_u32().to_ne_bytes());
        for attnum in owner_attnums {
            scope.extend_from_slice(&attnum.to_ne_bytes());
        }
        Mode::Owner(owner)
    };

    let (protected_schema, protected_table) = shown_relation_names(row.protected_relid);
    let stats = crate::audit::TableStats::new(row.protected_relid, qualified_name(&protected_schema, &protected_table));
    Ok(FenceConfig {
        relid,
        protected_relid: row.protected_relid,
        schema,
        table,
        display,
        keys,
        token,
        mode,
        scope,
        stats,
        judge_replicated: row.judge_replicated,
    })
}

/// The owner lookup and the owner key's attribute numbers.
fn prepare_owner_lookup(
    display: &str,
    row: &ProtectedRow,
    keys: &[KeyColumn],
) -> Result<(OwnerLookup, Vec<i16>), Refusal> {
    let owner_relid = row.owner_table.ok_or_else(|| misconfigured(display, "no owner table recorded".into()))?;
    let token_column = row.owner_token_column.clone().unwrap_or_default();
    let (owner_schema, owner_table) = relation_names(owner_relid);
    let owner_display = qualified_name(&owner_schema, &owner_table);
    let (token_attnum, token_typid) = column(owner_relid, &owner_display, &token_column)?;
    if !is_token_type(token_typid) {
        return Err(misconfigured(
            display,
            format!("token column \"{token_column}\" of {owner_display} is no longer an integer"),
        ));
    }
    let mut owner_columns = Vec::with_capacity(row.owner_key_columns.len());
    for name in &row.owner_key_columns {
        owner_columns.push(column(owner_relid, &owner_display, name)?);
    }
    let owner_attnums: Vec<i16> = owner_columns.iter().map(|&(attnum, _)| attnum).collect();
    // A plain owner table is read ONLY: rows of inheritance children are not
    // owner rows (the DDL guard refuses such children anyway).
    // SAFETY: a syscache lookup accepting any OID (a missing relation gives
    // relkind 0, not an error).
    let partitioned = unsafe { pg_sys::get_rel_relkind(owner_relid) } as u8 == pg_sys::RELKIND_PARTITIONED_TABLE;
    let tables: Vec<pg_sys::Oid> = if partitioned {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT t.relid::pg_catalog.oid FROM pg_catalog.pg_partition_tree($1) t",
                    None,
                    // SAFETY: an OID is a by-value datum, a valid regclass.
                    &[unsafe { pgrx::datum::DatumWithOid::new(owner_relid, pg_sys::REGCLASSOID) }],
                )
                .expect("reading the owner table's partitions")
                .filter_map(|r| r.get::<pg_sys::Oid>(1).ok().flatten())
                .collect()
        })
    } else {
        vec![owner_relid]
    };

    let conditions = key_match(&row.owner_key_columns);
    let sql = format!(
        "SELECT o.{}, o.tableoid FROM {}{} o WHERE {}",
        quote_ident(&token_column),
        if partitioned { "" } else { "ONLY " },
        owner_display,
        conditions
    );
    let locking = crate::pg::server_cstring(&format!("{sql} FOR SHARE OF o"));
    let peeking = crate::pg::server_cstring(&sql);
    let mut argtypes: Vec<pg_sys::Oid> = keys.iter().map(|k| k.typid).collect();
    let (plan, peek) = Spi::connect(|_| {
        (
            prepare_saved(&locking, &mut argtypes, &format!("the owner lookup for {display}")),
            prepare_saved(&peeking, &mut argtypes, &format!("the owner lookup for {display}")),
        )
    });
    // Partitioned owner tables keep the SPI lookup: their rows live in the
    // partitions' indexes, which the planner picks among.
    let index = if partitioned {
        None
    } else {
        let columns: Vec<(i16, pg_sys::Oid, pg_sys::Oid)> =
            owner_columns.iter().zip(keys).map(|(&(attnum, coltype), key)| (attnum, coltype, key.typid)).collect();
        UniqueIndex::find(owner_relid, &columns)
    };
    Ok((
        OwnerLookup {
            relid: owner_relid,
            rel_owner: rel_owner(owner_relid),
            display: owner_display,
            plan,
            peek,
            index,
            token: (token_attnum, token_typid),
            token_name: token_column,
            key_names: row.owner_key_columns.clone(),
            tables,
        },
        owner_attnums,
    ))
}
