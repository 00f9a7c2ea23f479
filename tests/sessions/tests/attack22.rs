//! Attack review 22 (found at the end of session 12; the 13 holes were
//! closed in session 13, and the tests below keep them closed): the DDL
//! guard (`pg_lease_guard_ddl`,
//! `pg_lease_guard_ddl_start`, `pg_lease_guard_drop`) and what
//! `lease.protected_tables` reports.
//!
//! Findings, most severe first:
//! - Hole (high): an owner table that is an inheritance child (`CREATE TABLE
//!   own (...) INHERITS (obase)`, accepted by `protect`) has its token
//!   column rewritten by `ALTER TABLE obase ALTER COLUMN owner_fencing_token
//!   TYPE bigint USING 1` on the parent: accepted (`lease._concerned` walks
//!   from the touched table up to its parents, never down to the children
//!   an ALTER on a parent recurses into), no row trigger fires, owner row `a`
//!   goes from token 5 to 1 and a write with token 1 commits: a token
//!   regression by the table owner
//!   (`owner_token_rewritten_through_inheritance_parent_is_refused`).
//! - Hole (high, same root cause): an owner table that is a partition of a
//!   partitioned table (attached to a new `bigown` after `protect`, by its
//!   owner; or so from the start) likewise: `ALTER TABLE bigown ALTER COLUMN
//!   owner_fencing_token TYPE bigint USING 1` rewrites its tokens, and
//!   `ALTER TABLE bigpay RENAME COLUMN tok TO tok2` renames the fenced
//!   table's token column (`owner_table_as_partition_keeps_its_tokens`).
//! - Hole (high, same root cause): a BEFORE row trigger created on that
//!   partitioned parent (`CREATE TRIGGER zzz BEFORE UPDATE ON bigown ...`)
//!   is cloned onto the owner table, sorts after `pg_lease_owner_guard` and
//!   lowers the token the guard just approved: accepted (README: such
//!   triggers are `LF008`), and `UPDATE own SET owner_fencing_token = 6`
//!   leaves it at 1 (`before_trigger_cloned_from_parent_onto_owner_table_is_refused`).
//! - Hole (high): an owner partition created (or attached) inside a
//!   subtransaction (`SAVEPOINT`, a PL/pgSQL block with `EXCEPTION`) gets no
//!   `pg_lease_owner_truncate` guard: the guard finds partitions joined in
//!   this transaction by `pg_inherits.xmin = pg_current_xact_id()`, the
//!   top-level xid, never a subtransaction's. The table owner can then
//!   `TRUNCATE` it (tokens gone, no `LF004`), re-insert the owner row at
//!   token 1, and a write with token 1 commits after one with token 9
//!   (`owner_partition_created_in_subtransaction_keeps_its_truncate_guard`).
//! - Hole (high): the same blind spot lets the table owner `ATTACH
//!   PARTITION` (inside a savepoint) a table holding a row whose token is
//!   not its owner row's current one into a fenced table: the stale row is
//!   committed in the fenced table unjudged (no `LF008`), and the attached
//!   partition has no TRUNCATE guard either
//!   (`fenced_partition_attached_in_savepoint_is_checked`).
//! - Hole (medium): the inheritance-parent door renames and retypes fenced and owner
//!   key/token columns (`ALTER TABLE pbase RENAME COLUMN tok TO tok2`,
//!   `... ALTER COLUMN k TYPE varchar` on the parent of the fenced table):
//!   accepted; writes then fail `LF008 ... inconsistent`, the stale one
//!   losing `LF001`
//!   (`fenced_columns_renamed_through_inheritance_parent_are_refused`).
//! - Hole (medium): `ALTER TYPE <row type> RENAME ATTRIBUTE ... CASCADE` and
//!   `ALTER TYPE ... ALTER ATTRIBUTE ... TYPE ... CASCADE` rename and retype
//!   the fenced and owner key/token columns of typed tables (`CREATE TABLE
//!   pay OF pt`) unrefused: the guard sees only the composite type. Every
//!   write is then `LF008 the fence ... is inconsistent` (the stale one
//!   loses `LF001`), `lease.acquire` fails with `42703 column
//!   o.owner_fencing_token does not exist`, pg_lease's own SQL
//!   (`typed_table_columns_renamed_or_retyped_through_alter_type_are_refused`).
//! - Hole (medium): likewise an owner partition holding a token above
//!   4611686018427387903 is attached in a savepoint without the `22003`
//!   refusal (`lease.acquire` could then issue no higher token for it)
//!   (`owner_partition_attached_in_savepoint_is_checked_for_huge_tokens`).
//! - Hole (low): a refusal where README promises success: `BEGIN; SELECT
//!   lease.protect('pay', ...); CREATE TABLE pay_b PARTITION OF pay ...;
//!   COMMIT` (one migration transaction) fails at `COMMIT` with `LF008 the
//!   transaction would commit partition public.pay_b of public.pay without
//!   its pg_lease guards`, and the whole migration rolls back (README: a
//!   partitioned target covers every partition, present and future)
//!   (`partition_created_after_protect_in_one_transaction_commits`).
//! - Hole (low: a superuser's command, and `lease.protected_tables`
//!   reports it): `ALTER EXTENSION <ext> SET SCHEMA` moves an owner table
//!   that is a member of a relocatable extension (`ALTER EXTENSION lo ADD
//!   TABLE own`) into a schema whose name has no exact UTF-8 form (EUC_JP NEC
//!   0xADF5); the guard lets it through (it sees a `pg_extension` command,
//!   not the table), so every write fenced against it fails `22P05`
//!   unaudited, the stale one losing `LF001`
//!   (`euc_jp_alter_extension_set_schema_moving_owner_table_is_refused`).
//! - Hole (low): a foreign-table partition of a fenced table (`CREATE FOREIGN
//!   TABLE ... PARTITION OF pay`, or `ATTACH PARTITION` of one) is refused
//!   with PostgreSQL's `42809 "pay_f" is a foreign table / Foreign tables
//!   cannot have TRUNCATE triggers`, its CONTEXT quoting pg_lease's internal
//!   `CREATE TRIGGER pg_lease_truncate ...`: no `LF008`, nothing saying that
//!   the fence is why (`foreign_partition_of_fenced_table_is_refused_clearly`).
//! - Hole (low): `lease.stats` keeps the name a fenced table had at its
//!   first counted write: after `ALTER TABLE pay RENAME TO pay_old` and a
//!   new `pay` fenced, both show as `public.pay`, and which counters are
//!   whose cannot be told (`lease_stats_follows_a_renamed_fenced_table`).
//! - Hole (low): an owner partition detached while a superuser had
//!   `pg_lease_guard_ddl` disabled is not reported: after `ENABLE`,
//!   `lease.protected_tables` says `enforced`, no problems, while its owner
//!   rows are gone from the fence (writes `LF007`), and the next `CREATE
//!   TABLE ... PARTITION OF own` is refused with `LF004 ALTER TABLE would
//!   take a partition out of an owner table (public.own_a)`, naming another
//!   command and table (`owner_partition_detached_unseen_is_reported`).
//! - Defence holds: `ALTER EXTENSION pg_lease UPDATE` from 0.9.1 leaves the
//!   same catalog as a fresh 0.9.2 install (functions, their ACLs, settings
//!   and security, event triggers, pg_lease's own tables, triggers,
//!   constraints, indexes) (`upgrade_from_0_9_1_matches_a_fresh_install`).
//! - Defence holds: `DETACH PARTITION ... CONCURRENTLY` of a leaf through an
//!   intermediate partition of an owner table is refused before its first
//!   phase commits (`LF004`), and owner rows stay
//!   (`detach_concurrently_through_intermediate_owner_partition_is_refused`).
//! - Defence holds: EUC_JP, `pg_lease.audit_statement` on: stale writes
//!   whose statement has a 2-byte, a 3-byte (JIS X 0212) or a NEC character
//!   straddling the 512-byte cut are all `LF001` and audited, each record
//!   at most 512 bytes (`euc_jp_audited_statement_cut_inside_a_character`).
//!
//! Tried with psql, not kept (defences hold): `ALTER INDEX/FOREIGN
//! TABLE/SEQUENCE/VIEW ... RENAME` of the owner table to a NEC name (refused
//! or not a ...); `DROP EXTENSION` with the owner table a member (`LF008`);
//! `REINDEX INDEX/TABLE CONCURRENTLY` of the owner key's index with warm
//! caches in another session (still `LF001`); a deferrable unique
//! constraint swapped in for the owner key's primary key (`LF008`);
//! `FORCE ROW LEVEL SECURITY` with a hiding policy on the owner table (the
//! fence still sees the row) and on a high-water table attached with rows
//! (`LF008`); `CREATE SCHEMA ... CREATE TABLE ... PARTITION OF` owner and
//! fenced tables (guards installed); `DROP SCHEMA ... CASCADE` of a whole
//! application and `DROP TABLE` of fenced and owner tables together (as
//! README says); `ALTER TABLE <parent> DISABLE TRIGGER ALL` (does not reach
//! pg_lease's triggers); MULE_INTERNAL rename of the owner table to a
//! non-ASCII name (`LF008`); pg_lease's PUBLIC-executable C functions with
//! odd OIDs (errors, no crash); `CREATE RULE ... DO INSTEAD NOTHING` on
//! owner-row UPDATE (`lease.acquire` notices the bump did not land).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

const EUC_JP: &str = "ENCODING 'EUC_JP' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";

/// EUC_JP NEC `√` (row 13, 0xADF5), as SQL.
const NEC_ROOT: &str = r"convert_from('\xadf5'::bytea, 'EUC_JP')";

/// Waits (up to 10 s) until `lease.rejected_writes` holds `n` rows; how many
/// it holds then.
fn audited(c: &mut Client, n: i64) -> i64 {
    let mut got = 0;
    for _ in 0..100 {
        got = one_i64(c, "SELECT count(*) FROM lease.rejected_writes");
        if got >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    got
}

/// Fenced `pay (k, v, tok)` against owner table `own (k, owner_fencing_token)`,
/// owner row `a` at token 5.
const OWN_PAY: &str = "
    CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE pay (k text, v int, tok bigint);
    SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
    INSERT INTO own VALUES ('a', 5);
";

/// **Hole (low): `ALTER EXTENSION ... SET SCHEMA` moves an owner table to
/// a name pg_lease cannot write, unrefused.** (Low: only a superuser can
/// move an extension's objects — a database owner's trusted `lo` has
/// members owned by the bootstrap superuser, `must be owner of type e.lo` —
/// and `lease.protected_tables` reports the result; but README's Limits
/// says such a move is refused, and a DBA may do it without malice.) EUC_JP database, `pay` fenced
/// against `own` (ASCII names), owner row `a` at token 5. As a superuser:
/// `CREATE SCHEMA e; CREATE EXTENSION lo SCHEMA e` (a relocatable contrib
/// extension; the test uses `dblink`, which the PostgreSQL 18 build has too),
/// `ALTER TABLE own SET SCHEMA e; ALTER EXTENSION lo ADD TABLE
/// e.own` (both accepted: ASCII names), then `CREATE SCHEMA "s√"` (NEC
/// 0xADF5) and `ALTER EXTENSION lo SET SCHEMA "s√"`, which moves every member
/// object, the owner table included. README (Limits) says the DDL guard
/// refuses moving an owner table to such a name (`LF008`: `ALTER TABLE ...
/// SET SCHEMA` and `ALTER SCHEMA ... RENAME` are refused); this door is
/// open: the guard sees only a `pg_extension` object in
/// `pg_event_trigger_ddl_commands()`. Afterwards the stale write (token 4)
/// is refused with `22P05` (`schema name "s\xadf5" ... has a character with
/// no exact UTF-8 form`) instead of `LF001`, not audited, and the current
/// write (token 5) is refused too (`lease.protected_tables` does say not
/// enforced). Expected: the `ALTER EXTENSION ... SET SCHEMA` is refused
/// (`LF008`), and afterwards the stale write is `LF001` and audited, the
/// current one accepted.
#[test]
fn euc_jp_alter_extension_set_schema_moving_owner_table_is_refused() {
    let (_db, mut c) = db_with(
        "a22_ext_schema",
        EUC_JP,
        &format!(
            "{OWN_PAY}
             CREATE SCHEMA e; CREATE EXTENSION dblink SCHEMA e;
             ALTER TABLE own SET SCHEMA e; ALTER EXTENSION dblink ADD TABLE e.own;"
        ),
    );
    let r = failure(
        &mut c,
        &format!(
            "DO $$ BEGIN
               EXECUTE format('CREATE SCHEMA %I', 's' || {NEC_ROOT});
               EXECUTE format('ALTER EXTENSION dblink SET SCHEMA %I', 's' || {NEC_ROOT});
             END $$"
        ),
    );
    let stale = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    let current = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 5)");
    let n = audited(&mut c, 1);
    assert!(
        r.as_ref().is_some_and(|r| r[0] == "LF008")
            && stale.as_ref().is_some_and(|s| s[0] == "LF001")
            && current.is_none()
            && n == 1,
        "ALTER EXTENSION dblink SET SCHEMA \"s\\xadf5\" (owner table a member): {r:?}; then stale write {stale:?}, \
         current write {current:?}, audit rows {n}"
    );
}

/// As the migrator: partitioned owner table `own (k, owner_fencing_token)`
/// with partition `own_a` (row `a` at token 5), `pay (k, v, tok)` fenced
/// against it, partitioned by `k` with partition `pay_a`.
const PART_OWN_PAY: &str = "
    CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (k);
    CREATE TABLE own_a PARTITION OF own FOR VALUES IN ('a');
    CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
    CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
    SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
    INSERT INTO own VALUES ('a', 5);
";

/// A database with README's migrator role (`role`), connected as it, with
/// `PART_OWN_PAY` set up by it.
fn migrator_db(label: &str, role: &MigratorRole) -> (TestDb, Client) {
    let db = TestDb::with_options(label, "");
    role.grant(&mut db.connect());
    let mut m = db.connect_as(&role.0);
    must_run(&mut m, PART_OWN_PAY);
    (db, m)
}

/// **Hole (high): a token regression through an owner partition made in a
/// subtransaction.** UTF-8 database; as README's migrator (the tables'
/// owner, with only README's grants): partitioned owner table `own`, `pay`
/// fenced against it. The migrator creates a new owner partition inside a
/// PL/pgSQL block with an `EXCEPTION` clause (a subtransaction, as
/// migration tools and savepoints make): `DO $$ BEGIN CREATE TABLE own_d
/// PARTITION OF own FOR VALUES IN ('d'); EXCEPTION WHEN others THEN RAISE;
/// END $$`. It gets the owner guard (cloned from the parent) but not
/// `pg_lease_owner_truncate`: `lease._guard_ddl` looks for partitions joined
/// in this transaction with `pg_inherits.xmin = xid(pg_current_xact_id())`,
/// the top-level xid, while the row was written by the subtransaction.
/// Owner row `d` gets token 9 and a write with token 9 commits; then
/// `TRUNCATE own_d` succeeds (README: TRUNCATE of an owner table or any
/// partition of it raises `LF004`), `INSERT INTO own VALUES ('d', 1)`, and a
/// write with token 1 commits after the one with token 9.
/// `lease.protected_tables` does list the missing trigger. Expected: the
/// partition gets its TRUNCATE guard (or the DDL is refused); `TRUNCATE
/// own_d` is `LF004`, and no write with token 1 commits.
#[test]
fn owner_partition_created_in_subtransaction_keeps_its_truncate_guard() {
    let role = MigratorRole::new("a22_mig_trunc");
    let (_db, mut m) = migrator_db("a22_own_subxact", &role);
    must_run(
        &mut m,
        "DO $$ BEGIN CREATE TABLE own_d PARTITION OF own FOR VALUES IN ('d'); EXCEPTION WHEN others THEN RAISE; END $$;
         CREATE TABLE pay_d PARTITION OF pay FOR VALUES IN ('d');
         INSERT INTO own VALUES ('d', 9);
         INSERT INTO pay VALUES ('d', 1, 9);",
    );
    let truncate = failure(&mut m, "TRUNCATE own_d");
    let stale = failure(&mut m, "INSERT INTO own VALUES ('d', 1); INSERT INTO pay VALUES ('d', 2, 1)");
    let committed = one_i64(&mut m, "SELECT count(*) FROM pay WHERE tok = 1");
    assert!(
        truncate.as_ref().is_some_and(|r| r[0] == "LF004") && committed == 0,
        "TRUNCATE of an owner partition created in a subtransaction: {truncate:?}; \
         re-keyed owner row and write with token 1: {stale:?}; rows with token 1 committed: {committed}"
    );
}

/// **Hole (high): stale rows attached into a fenced table in a savepoint.**
/// UTF-8 database, as README's migrator: `pay` (partitioned) fenced against
/// `own`, owner row `b` at token 7. `CREATE TABLE pay_b (LIKE pay); INSERT
/// INTO pay_b VALUES ('b', 1, 1)` (token 1, stale), then `BEGIN; SAVEPOINT
/// s; ALTER TABLE pay ATTACH PARTITION pay_b FOR VALUES IN ('b'); RELEASE s;
/// COMMIT`: accepted. Without the savepoint it is refused (`LF008 ... would
/// bring rows into fenced table public.pay that the fence would refuse`):
/// the guard finds joined partitions by the top-level xid only. The stale
/// row is now in the fenced table, and `pay_b` has no `pg_lease_truncate`
/// guard (`TRUNCATE pay_b` passes; `lease.protected_tables` lists it
/// missing). Expected: the attach is refused with `LF008`, as it is outside
/// a savepoint.
#[test]
fn fenced_partition_attached_in_savepoint_is_checked() {
    let role = MigratorRole::new("a22_mig_attach");
    let (_db, mut m) = migrator_db("a22_pay_savepoint", &role);
    must_run(
        &mut m,
        "CREATE TABLE own_b PARTITION OF own FOR VALUES IN ('b'); INSERT INTO own VALUES ('b', 7);
         CREATE TABLE pay_b (LIKE pay); INSERT INTO pay_b VALUES ('b', 1, 1);",
    );
    // Outside a savepoint the guard refuses it.
    let plain = must_fail(&mut m, "ALTER TABLE pay ATTACH PARTITION pay_b FOR VALUES IN ('b')");
    assert_eq!(plain[0], "LF008", "{plain:?}");
    let r = failure(
        &mut m,
        "BEGIN; SAVEPOINT s; ALTER TABLE pay ATTACH PARTITION pay_b FOR VALUES IN ('b'); RELEASE s; COMMIT",
    );
    let _ = m.batch_execute("ROLLBACK");
    let stale_rows = one_i64(&mut m, "SELECT count(*) FROM pay WHERE tok = 1");
    assert!(
        r.as_ref().is_some_and(|r| r[0] == "LF008") && stale_rows == 0,
        "ATTACH PARTITION of a table holding a stale row, in a savepoint: {r:?}; stale rows now in pay: {stale_rows}"
    );
}

/// **Hole (medium): an owner partition with a token above 2^62 − 1 attached
/// in a savepoint.** UTF-8 database, as README's migrator: `CREATE TABLE
/// own_c (LIKE own); INSERT INTO own_c VALUES ('c', 4611686018427387904)`,
/// then `BEGIN; SAVEPOINT s; ALTER TABLE own ATTACH PARTITION own_c FOR
/// VALUES IN ('c'); RELEASE s; COMMIT`: accepted (outside a savepoint:
/// `22003 ... would bring owner rows with fencing tokens above
/// 4611686018427387903 into public.own`; README: a role other than a
/// superuser cannot set an owner token above 2^62 − 1, so `lease.acquire`
/// can always go higher), and `own_c` has no `pg_lease_owner_truncate`.
/// Expected: `22003`, as outside a savepoint.
#[test]
fn owner_partition_attached_in_savepoint_is_checked_for_huge_tokens() {
    let role = MigratorRole::new("a22_mig_huge");
    let (_db, mut m) = migrator_db("a22_own_huge", &role);
    must_run(&mut m, "CREATE TABLE own_c (LIKE own); INSERT INTO own_c VALUES ('c', 4611686018427387904)");
    let plain = must_fail(&mut m, "ALTER TABLE own ATTACH PARTITION own_c FOR VALUES IN ('c')");
    assert_eq!(plain[0], "22003", "{plain:?}");
    let r = failure(
        &mut m,
        "BEGIN; SAVEPOINT s; ALTER TABLE own ATTACH PARTITION own_c FOR VALUES IN ('c'); RELEASE s; COMMIT",
    );
    let _ = m.batch_execute("ROLLBACK");
    assert!(
        r.as_ref().is_some_and(|r| r[0] == "22003"),
        "owner partition with a huge token attached in a savepoint: {r:?}"
    );
}

/// **Hole (low): a clear error missing.** UTF-8 database, superuser:
/// partitioned `pay` fenced against `own`; `CREATE EXTENSION file_fdw`, a
/// server, then `CREATE FOREIGN TABLE pay_f PARTITION OF pay FOR VALUES IN
/// ('f') SERVER files OPTIONS (filename ..., format 'csv')`. Refused — rightly:
/// a foreign partition's rows are written elsewhere, past the fence — but with
/// PostgreSQL's `42809 "pay_f" is a foreign table` (DETAIL: `Foreign tables
/// cannot have TRUNCATE triggers.`), whose CONTEXT is pg_lease's internal
/// `CREATE TRIGGER pg_lease_truncate BEFORE TRUNCATE ON public.pay_f ...` and
/// five PL/pgSQL frames of `lease._guard_ddl`: the user learns about
/// TRUNCATE triggers, not that the table is fenced. Same for `ATTACH
/// PARTITION` of a foreign table. Expected: `LF008` naming the fenced table
/// (a foreign partition would bring in rows the fence never judges).
#[test]
fn foreign_partition_of_fenced_table_is_refused_clearly() {
    let csv = std::env::temp_dir().join(format!("a22_rows_{}.csv", std::process::id()));
    std::fs::write(&csv, "f,1,1\n").unwrap();
    let (_db, mut c) = db_with(
        "a22_foreign",
        "",
        &format!("CREATE EXTENSION file_fdw; CREATE SERVER files FOREIGN DATA WRAPPER file_fdw; {PART_OWN_PAY}"),
    );
    let created = must_fail(
        &mut c,
        &format!(
            "CREATE FOREIGN TABLE pay_f PARTITION OF pay FOR VALUES IN ('f') SERVER files
               OPTIONS (filename '{}', format 'csv')",
            csv.display()
        ),
    );
    must_run(
        &mut c,
        &format!(
            "CREATE FOREIGN TABLE pay_g (k text, v int, tok bigint) SERVER files OPTIONS (filename '{}', format 'csv')",
            csv.display()
        ),
    );
    let attached = must_fail(&mut c, "ALTER TABLE pay ATTACH PARTITION pay_g FOR VALUES IN ('f')");
    let _ = std::fs::remove_file(&csv);
    for r in [&created, &attached] {
        assert!(r[0] == "LF008" && r[1].contains("pay"), "foreign partition of a fenced table refused as {r:?}");
    }
}

/// **Hole (medium): fenced columns renamed and retyped through `ALTER TYPE
/// ... CASCADE`.** UTF-8 database, superuser (the tables' owner would do):
/// `CREATE TYPE ot AS (k text, owner_fencing_token bigint); CREATE TYPE pt
/// AS (k text, v int, tok bigint); CREATE TABLE own OF ot (PRIMARY KEY (k));
/// CREATE TABLE pay OF pt`, `pay` fenced against `own`, owner row `a` at
/// token 5. README: renaming or retyping a fenced key or token column,
/// "through any command", is `LF008`. Yet each of
/// `ALTER TYPE pt RENAME ATTRIBUTE tok TO tok2 CASCADE`,
/// `ALTER TYPE ot RENAME ATTRIBUTE owner_fencing_token TO t2 CASCADE` and
/// `ALTER TYPE pt ALTER ATTRIBUTE tok TYPE numeric CASCADE` is accepted
/// (`pg_event_trigger_ddl_commands()` names the composite type, not the
/// typed tables the cascade reaches): `lease.protected_tables` then says
/// not enforced, the stale write (token 4) is `LF008 the fence on
/// public.pay is inconsistent` instead of `LF001`, the current one is
/// refused too, and `lease.acquire` fails with `42703 column
/// o.owner_fencing_token does not exist` (pg_lease's internal query).
/// Expected: each `ALTER TYPE ... CASCADE` refused with `LF008`, and the
/// fence working after.
#[test]
fn typed_table_columns_renamed_or_retyped_through_alter_type_are_refused() {
    let (_db, mut c) = db_with(
        "a22_typed",
        "",
        "CREATE TYPE ot AS (k text, owner_fencing_token bigint);
         CREATE TYPE pt AS (k text, v int, tok bigint);
         CREATE TABLE own OF ot (PRIMARY KEY (k));
         CREATE TABLE pay OF pt;
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);",
    );
    let mut accepted = Vec::new();
    for ddl in [
        "ALTER TYPE pt RENAME ATTRIBUTE tok TO tok2 CASCADE",
        "ALTER TYPE ot RENAME ATTRIBUTE owner_fencing_token TO t2 CASCADE",
        "ALTER TYPE pt ALTER ATTRIBUTE tok TYPE numeric CASCADE",
        "ALTER TYPE pt RENAME ATTRIBUTE k TO k2 CASCADE",
    ] {
        // Each alone, rolled back after.
        let r = failure(&mut c, &format!("BEGIN; {ddl}; ROLLBACK;"));
        let _ = c.batch_execute("ROLLBACK");
        if r.as_ref().is_none_or(|r| r[0] != "LF008") {
            accepted.push(format!("{ddl}: {r:?}"));
        }
    }
    let _ = c.batch_execute("ALTER TYPE pt RENAME ATTRIBUTE tok TO tok2 CASCADE");
    let stale = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    assert!(
        accepted.is_empty() && stale.as_ref().is_some_and(|r| r[0] == "LF001"),
        "not refused: {accepted:#?}; stale write after the first: {stale:?}"
    );
}

/// As the migrator: `own` (owner table) and `pay` (fenced against it) are
/// inheritance children of plain tables `obase (k, owner_fencing_token)`
/// and `pbase (k, v, tok)` (`protect` accepts that), owner row `a` at 5.
const INHERITED: &str = "
    CREATE TABLE obase (k text, owner_fencing_token bigint);
    CREATE TABLE pbase (k text, v int, tok bigint);
    CREATE TABLE own (PRIMARY KEY (k)) INHERITS (obase);
    CREATE TABLE pay () INHERITS (pbase);
    SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
    INSERT INTO own VALUES ('a', 5);
";

/// **Hole (high): a token regression through the owner table's inheritance
/// parent.** UTF-8 database, as README's migrator (owner of every table,
/// README's grants only): `INHERITED` (`own` inherits from `obase`, `pay`
/// from `pbase`; `protect` accepts both). `ALTER TABLE obase ALTER COLUMN
/// owner_fencing_token TYPE bigint USING 1` recurses into `own` and rewrites
/// every owner token to 1 — no row trigger sees a table rewrite. On an owner
/// table that inherits from nothing the same command is `LF008` (README:
/// retyping a fenced column, even to its own type, rewrites it; on `own`
/// itself PostgreSQL refuses it, the column being inherited); on the parent
/// it is accepted:
/// `lease._guard_ddl` collects the touched table `obase` and
/// `lease._concerned` walks from it *up* to its parents, never down to the
/// children the ALTER recursed into. Owner row `a` now reads token 1
/// (`lease.protected_tables`: enforced, no problems), and a write with token
/// 1 — older than the 5 that was current — commits. Expected: `LF008`, the
/// token still 5, the write `LF001`.
#[test]
fn owner_token_rewritten_through_inheritance_parent_is_refused() {
    let role = MigratorRole::new("a22_mig_inherit");
    let db = TestDb::with_options("a22_inherit_token", "");
    role.grant(&mut db.connect());
    let mut m = db.connect_as(&role.0);
    must_run(&mut m, INHERITED);
    let r = failure(&mut m, "ALTER TABLE obase ALTER COLUMN owner_fencing_token TYPE bigint USING 1");
    let token = one_i64(&mut m, "SELECT owner_fencing_token FROM own WHERE k = 'a'");
    let stale = failure(&mut m, "INSERT INTO pay VALUES ('a', 1, 1)");
    assert!(
        r.as_ref().is_some_and(|r| r[0] == "LF008") && token == 5 && stale.as_ref().is_some_and(|s| s[0] == "LF001"),
        "ALTER TABLE obase ALTER COLUMN owner_fencing_token TYPE bigint USING 1: {r:?}; \
         owner row a's token after: {token}; write with token 1: {stale:?}"
    );
}

/// **Hole (medium): fenced columns renamed and retyped through the fenced
/// table's inheritance parent.** UTF-8 database, as README's migrator,
/// `INHERITED`. Each alone (rolled back after): `ALTER TABLE pbase RENAME
/// COLUMN tok TO tok2`, `ALTER TABLE pbase RENAME COLUMN k TO k2`, `ALTER
/// TABLE pbase ALTER COLUMN tok TYPE numeric`, `ALTER TABLE obase RENAME
/// COLUMN owner_fencing_token TO t2` is accepted, recursing into `pay` /
/// `own` (on tables that inherit from nothing they are `LF008`). After the first,
/// the stale write is `LF008 the fence on public.pay is inconsistent`
/// (not `LF001`, and the current writer is refused too). Expected: `LF008`
/// for each, as on the children themselves.
#[test]
fn fenced_columns_renamed_through_inheritance_parent_are_refused() {
    let role = MigratorRole::new("a22_mig_inh_cols");
    let db = TestDb::with_options("a22_inherit_cols", "");
    role.grant(&mut db.connect());
    let mut m = db.connect_as(&role.0);
    must_run(&mut m, INHERITED);
    let mut accepted = Vec::new();
    for ddl in [
        "ALTER TABLE pbase RENAME COLUMN tok TO tok2",
        "ALTER TABLE pbase RENAME COLUMN k TO k2",
        "ALTER TABLE pbase ALTER COLUMN tok TYPE numeric",
        "ALTER TABLE obase RENAME COLUMN owner_fencing_token TO t2",
    ] {
        let r = failure(&mut m, &format!("BEGIN; {ddl}; ROLLBACK;"));
        let _ = m.batch_execute("ROLLBACK");
        if r.as_ref().is_none_or(|r| r[0] != "LF008") {
            accepted.push(format!("{ddl}: {r:?}"));
        }
    }
    let _ = m.batch_execute("ALTER TABLE pbase RENAME COLUMN tok TO tok2");
    let stale = failure(&mut m, "INSERT INTO pay VALUES ('a', 1, 4)");
    assert!(
        accepted.is_empty() && stale.as_ref().is_some_and(|r| r[0] == "LF001"),
        "not refused: {accepted:#?}; stale write after the first: {stale:?}"
    );
}

/// **Hole (high): a token regression through the partitioned table an owner
/// table belongs to.** UTF-8 database, superuser (the tables' owner would
/// do): plain `own` and `pay`, `pay` fenced against `own`, owner row `a`
/// at 5; then `bigown (k, owner_fencing_token) PARTITION BY LIST (k)` and
/// `ALTER TABLE bigown ATTACH PARTITION own FOR VALUES IN ('a', 'b')`, and
/// `pay` likewise into `bigpay`: both accepted (a protected owner or fenced
/// table may become a partition; `protect` also accepts leaf partitions
/// from the start). `ALTER TABLE
/// bigown ALTER COLUMN owner_fencing_token TYPE bigint USING 1` is
/// accepted and rewrites `own`'s tokens to 1 (`lease.protected_tables`:
/// enforced), and then a write with token 1 commits; `ALTER TABLE bigpay
/// RENAME COLUMN tok TO tok2` is accepted too. (An `UPDATE bigown SET
/// owner_fencing_token = 1` is `LF004`, and a stale write through `bigpay`
/// `LF001`: rows are guarded, the table rewrite is not.) Expected: both
/// `ALTER TABLE`s refused with `LF008`; the token stays 5.
#[test]
fn owner_table_as_partition_keeps_its_tokens() {
    let (_db, mut c) = db_with(
        "a22_owner_partition",
        "",
        // Plain tables protected first; the parents come after (accepted).
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);
         CREATE TABLE bigown (k text, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY LIST (k);
         ALTER TABLE bigown ATTACH PARTITION own FOR VALUES IN ('a', 'b');
         CREATE TABLE bigpay (k text, v int, tok bigint) PARTITION BY LIST (k);
         ALTER TABLE bigpay ATTACH PARTITION pay FOR VALUES IN ('a', 'b');",
    );
    let rename = failure(&mut c, "BEGIN; ALTER TABLE bigpay RENAME COLUMN tok TO tok2; ROLLBACK;");
    let _ = c.batch_execute("ROLLBACK");
    let r = failure(&mut c, "ALTER TABLE bigown ALTER COLUMN owner_fencing_token TYPE bigint USING 1");
    let token = one_i64(&mut c, "SELECT owner_fencing_token FROM own WHERE k = 'a'");
    let stale = failure(&mut c, "INSERT INTO bigpay VALUES ('a', 1, 1)");
    assert!(
        rename.as_ref().is_some_and(|r| r[0] == "LF008")
            && r.as_ref().is_some_and(|r| r[0] == "LF008")
            && token == 5
            && stale.as_ref().is_some_and(|s| s[0] == "LF001"),
        "ALTER TABLE bigpay RENAME COLUMN tok: {rename:?}; ALTER TABLE bigown ALTER COLUMN owner_fencing_token \
         TYPE bigint USING 1: {r:?}; own's token after: {token}; write with token 1: {stale:?}"
    );
}

/// Owner table `own` a partition of `bigown` and fenced `pay` of `bigpay`
/// (parents pg_lease does not protect), owner row `a` at token 5.
const LEAF_OWN_PAY: &str = "
    CREATE TABLE bigown (k text, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY LIST (k);
    CREATE TABLE own PARTITION OF bigown FOR VALUES IN ('a', 'b');
    CREATE TABLE bigpay (k text, v int, tok bigint) PARTITION BY LIST (k);
    CREATE TABLE pay PARTITION OF bigpay FOR VALUES IN ('a', 'b');
    SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
    INSERT INTO own VALUES ('a', 5);
";

/// **Hole (high): a BEFORE trigger cloned from the parent lowers owner
/// tokens.** UTF-8 database, superuser (the tables' owner would do): owner
/// table `own` a partition of `bigown`, `pay` of `bigpay`, `pay` fenced
/// against `own`, owner row `a` at 5. `CREATE TRIGGER zzz BEFORE UPDATE ON
/// bigown FOR EACH ROW EXECUTE FUNCTION lower_tok()` (which sets
/// `NEW.owner_fencing_token := 1`) is accepted; PostgreSQL clones it onto
/// `own`, where it sorts after `pg_lease_owner_guard`. README: a BEFORE row
/// trigger named to fire after pg_lease's is refused (`LF008`), and it is,
/// on `own` itself; here `lease.protected_tables` does list it, but the DDL
/// passed. `UPDATE own SET owner_fencing_token = 6 WHERE k = 'a'` is judged
/// (6 > 5) by the owner guard, then lowered to 1 by `zzz`; a write with
/// token 1 then commits. Expected: the `CREATE TRIGGER` refused with
/// `LF008`; the token never below 5.
#[test]
fn before_trigger_cloned_from_parent_onto_owner_table_is_refused() {
    let (_db, mut c) = db_with(
        "a22_cloned_trigger",
        "",
        &format!(
            "{LEAF_OWN_PAY}
         CREATE FUNCTION lower_tok() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN NEW.owner_fencing_token := 1; RETURN NEW; END $$;"
        ),
    );
    // On the owner table itself it is refused.
    let direct = must_fail(&mut c, "CREATE TRIGGER zzz BEFORE UPDATE ON own FOR EACH ROW EXECUTE FUNCTION lower_tok()");
    assert_eq!(direct[0], "LF008", "{direct:?}");
    let r = failure(&mut c, "CREATE TRIGGER zzz BEFORE UPDATE ON bigown FOR EACH ROW EXECUTE FUNCTION lower_tok()");
    let _ = c.batch_execute("UPDATE own SET owner_fencing_token = 6 WHERE k = 'a'");
    let token = one_i64(&mut c, "SELECT owner_fencing_token FROM own WHERE k = 'a'");
    let stale = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 1)");
    assert!(
        r.as_ref().is_some_and(|r| r[0] == "LF008") && token >= 5 && stale.is_some(),
        "CREATE TRIGGER zzz BEFORE UPDATE ON bigown (cloned onto owner table own): {r:?}; \
         own's token after a bump to 6: {token}; write with token 1: {stale:?}"
    );
}

/// **Defence holds.** Two EUC_JP databases: one with `CREATE EXTENSION
/// pg_lease VERSION '0.9.1'` then `ALTER EXTENSION pg_lease UPDATE`, one
/// with a fresh 0.9.2. Every function in schema `lease` (definition, ACL,
/// SECURITY DEFINER, settings, volatility, owner), the event triggers (event,
/// enabled, function, tags), pg_lease's relations, columns, constraints,
/// triggers and indexes are the same in both.
#[test]
fn upgrade_from_0_9_1_matches_a_fresh_install() {
    let upgraded = TestDb::with_options("a22_up", EUC_JP);
    let fresh = TestDb::with_options("a22_fresh", EUC_JP);
    let mut u = upgraded.connect();
    must_run(
        &mut u,
        "DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.9.1'; ALTER EXTENSION pg_lease UPDATE",
    );
    let queries = [
        "SELECT concat_ws(' ', p.proname, pg_get_function_identity_arguments(p.oid), md5(pg_get_functiondef(p.oid)),
                p.proacl, p.prosecdef, p.proconfig, p.provolatile, p.proowner::regrole)
           FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace AND p.prokind <> 'a'",
        "SELECT concat_ws(' ', evtname, evtevent, evtenabled, evtfoid::regproc, evttags) FROM pg_event_trigger",
        "SELECT concat_ws(' ', c.relname, c.relkind, c.relpersistence, c.relacl, md5(pg_get_viewdef(c.oid)))
           FROM pg_class c WHERE c.relnamespace = 'lease'::regnamespace",
        "SELECT concat_ws(' ', a.attrelid::regclass, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull)
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          WHERE c.relnamespace = 'lease'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped",
        "SELECT concat_ws(' ', conrelid::regclass, conname, pg_get_constraintdef(oid))
           FROM pg_constraint WHERE connamespace = 'lease'::regnamespace",
        "SELECT concat_ws(' ', tgrelid::regclass, tgname, tgenabled, tgfoid::regproc) FROM pg_trigger
          WHERE tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'lease'::regnamespace)",
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index
          WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'lease'::regnamespace)",
    ];
    let mut f = fresh.connect();
    for q in queries {
        let rows = |c: &mut Client| -> Vec<String> {
            let mut v: Vec<String> = c.query(q, &[]).unwrap().iter().map(|r| r.get(0)).collect();
            v.sort();
            v
        };
        let (a, b) = (rows(&mut u), rows(&mut f));
        let only_upgraded: Vec<&String> = a.iter().filter(|x| !b.contains(x)).collect();
        let only_fresh: Vec<&String> = b.iter().filter(|x| !a.contains(x)).collect();
        assert!(
            only_upgraded.is_empty() && only_fresh.is_empty(),
            "{q}\nupgraded only: {only_upgraded:#?}\nfresh only: {only_fresh:#?}"
        );
    }
}

/// **Defence holds.** UTF-8 database: owner table `own` partitioned, its
/// partition `own_mid` partitioned again with leaf `own_leaf` (owner row `a`
/// at 5), `pay` fenced against `own`. `ALTER TABLE own_mid DETACH PARTITION
/// own_leaf CONCURRENTLY` (the command names `own_mid`, not the owner
/// table) is refused with `LF004` by `pg_lease_guard_ddl_start`, before its
/// first phase commits: `own_leaf` is not left detach-pending, and the
/// stale write is still `LF001`.
#[test]
fn detach_concurrently_through_intermediate_owner_partition_is_refused() {
    let (_db, mut c) = db_with(
        "a22_detach_mid",
        "",
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (k);
         CREATE TABLE own_mid PARTITION OF own FOR VALUES IN ('a', 'b') PARTITION BY LIST (k);
         CREATE TABLE own_leaf PARTITION OF own_mid FOR VALUES IN ('a');
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);",
    );
    let r = must_fail(&mut c, "ALTER TABLE own_mid DETACH PARTITION own_leaf CONCURRENTLY");
    assert_eq!(r[0], "LF004", "{r:?}");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending"), 0);
    let stale = must_fail(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    assert_eq!(stale[0], "LF001", "{stale:?}");
}

/// **Defence holds.** EUC_JP database with `pg_lease.audit_statement = on`,
/// `pay` fenced against `own` (row `a` at 5). From an EUC_JP client (psql),
/// 33 stale writes whose statement puts a 2-byte JIS character (`\xc5ec`),
/// a 3-byte JIS X 0212 one (`\x8fb0a1`) or a NEC one (`\xadf5`) across
/// bytes 505..515: each is `LF001`, each audited, no record over 512 bytes.
#[test]
fn euc_jp_audited_statement_cut_inside_a_character() {
    let (db, mut c) = db_with("a22_stmt_cut", EUC_JP, OWN_PAY);
    must_run(&mut c, &format!("ALTER DATABASE {} SET pg_lease.audit_statement = on", db.name));
    let head: &[u8] = b"INSERT INTO pay SELECT 'a', 1, 4 FROM (SELECT '";
    let mut script = b"\\set VERBOSITY terse\n".to_vec();
    let mut n = 0;
    for off in 505..516 {
        for ch in [&b"\xc5\xec"[..], b"\x8f\xb0\xa1", b"\xad\xf5"] {
            script.extend_from_slice(head);
            script.extend(std::iter::repeat_n(b'x', off - head.len()));
            for _ in 0..4 {
                script.extend_from_slice(ch);
            }
            script.extend_from_slice(b"' AS n) s;\n");
            n += 1;
        }
    }
    let (_, err) = psql(&db.name, "postgres", "EUC_JP", &script);
    assert_eq!(err.matches("ERROR:  StaleOwnerBoundaryWrite").count(), n, "{err}");
    assert_eq!(audited(&mut c, n as i64), n as i64);
    assert_eq!(one_i64(&mut c, "SELECT max(octet_length(statement))::bigint FROM lease.rejected_writes"), 512);
}

/// **Hole (low): a detach the guard did not see is not reported.** UTF-8
/// database: partitioned owner table `own` with partition `own_a` (row `a`
/// at 5), `pay` fenced against it. A superuser runs `ALTER EVENT TRIGGER
/// pg_lease_guard_ddl DISABLE; ALTER TABLE own DETACH PARTITION own_a; ALTER
/// EVENT TRIGGER pg_lease_guard_ddl ENABLE` (maintenance, say). Afterwards
/// `lease.protected_tables` says `enforced` with no problems, yet owner row
/// `a` and its token have left the fence: a write for `a` is `LF007` (no
/// owner row), and `own_a` still carries `pg_lease_owner_truncate`. The next
/// `CREATE TABLE own_a2 PARTITION OF own FOR VALUES IN ('a')` is refused
/// with `LF004 ALTER TABLE would take a partition out of an owner table
/// (public.own_a)`. Compare an owner table renamed unseen (attack21), which
/// is listed in `problems`. Expected: `problems` names the detached
/// partition `own_a` (its owner rows are outside the owner table), so
/// `enforced` is false.
#[test]
fn owner_partition_detached_unseen_is_reported() {
    let (_db, mut c) = db_with(
        "a22_detach_unseen",
        "",
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (k);
         CREATE TABLE own_a PARTITION OF own FOR VALUES IN ('a');
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);
         ALTER EVENT TRIGGER pg_lease_guard_ddl DISABLE;
         ALTER TABLE own DETACH PARTITION own_a;
         ALTER EVENT TRIGGER pg_lease_guard_ddl ENABLE;",
    );
    let r = c
        .query_one(
            "SELECT enforced, coalesce(problems::text, '') FROM lease.protected_tables WHERE table_name = 'pay'::regclass",
            &[],
        )
        .unwrap();
    let (enforced, problems): (bool, String) = (r.get(0), r.get(1));
    let write = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 5)");
    assert!(
        !enforced && problems.contains("own_a"),
        "after an unseen DETACH of owner partition own_a: enforced {enforced}, problems {problems:?}; write for a: {write:?}"
    );
}

/// **Hole (low): `lease.stats` shows two fenced tables under one name after
/// a rename.** UTF-8 database, `pay` fenced against `own` (row `a` at 5):
/// one stale write (refused). `ALTER TABLE pay RENAME TO pay_old` (allowed:
/// fenced tables may be renamed), a new `pay` created and fenced, two stale
/// writes to it, one accepted write to `pay_old`. `lease.stats` then has
/// two rows both named `public.pay` (accepted 1 / refused 1, and 0 / 2):
/// the slot keeps the name of its first counted write, and the view has no
/// relid to tell them apart (attack21 fixed the same symptom for long
/// names). Expected: the rows name `public.pay_old` and `public.pay`.
#[test]
fn lease_stats_follows_a_renamed_fenced_table() {
    let (_db, mut c) = db_with("a22_stats_rename", "", OWN_PAY);
    let _ = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    must_run(
        &mut c,
        "ALTER TABLE pay RENAME TO pay_old;
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    let _ = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    let _ = failure(&mut c, "INSERT INTO pay VALUES ('a', 1, 4)");
    must_run(&mut c, "INSERT INTO pay_old VALUES ('a', 1, 5)");
    let names: Vec<String> = c
        .query("SELECT table_name FROM lease.stats WHERE database = current_database() ORDER BY table_name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names, ["public.pay", "public.pay_old"], "lease.stats table_names after a rename");
}

/// **Hole (low): a refusal where README promises success.** UTF-8 database:
/// partitioned `own` (partition `own_a`) and partitioned `pay`, as a
/// migration tool runs a migration, in one transaction: `BEGIN; SELECT
/// lease.protect('pay', '{k}', 'tok', 'own', '{k}'); CREATE TABLE pay_b
/// PARTITION OF pay FOR VALUES IN ('b'); COMMIT`. The `COMMIT` fails with
/// `LF008 the transaction would commit partition public.pay_b of public.pay
/// without its pg_lease guards`: the guard defers a partition's TRUNCATE
/// guard when the root's fence was created in this transaction (for a
/// single-transaction `pg_restore`, which brings the triggers from the dump)
/// and nothing installs it; everything rolls back. Creating the partition
/// before `protect` in the same transaction works. README: "A partitioned
/// target covers every partition, present and future." Expected: the
/// transaction commits, `pay_b` is guarded (a stale write into it `LF001`).
#[test]
fn partition_created_after_protect_in_one_transaction_commits() {
    let (_db, mut c) = db_with(
        "a22_protect_then_part",
        "",
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (k);
         CREATE TABLE own_a PARTITION OF own FOR VALUES IN ('a', 'b');
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         INSERT INTO own VALUES ('b', 5);",
    );
    let r = failure(
        &mut c,
        "BEGIN;
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         CREATE TABLE pay_b PARTITION OF pay FOR VALUES IN ('b');
         COMMIT;",
    );
    let _ = c.batch_execute("ROLLBACK");
    assert!(r.is_none(), "protect, then a partition, in one transaction: {r:?}");
    let stale = must_fail(&mut c, "INSERT INTO pay VALUES ('b', 1, 4)");
    assert_eq!(stale[0], "LF001", "{stale:?}");
}

/// Found while closing the holes above: `protect` accepts an owner table and
/// a fenced table that are partitions of tables pg_lease does not protect,
/// but the DDL guard took a partition's root (`pg_partition_root`) for the
/// protected table, so any `ALTER TABLE` of them (even `SET (fillfactor)`)
/// was refused with `LF004 ... would take a partition out of an owner
/// table`. Expected: plain DDL is accepted; the tables may leave their
/// parents (DETACH) keeping every guard: TRUNCATE of the owner table is
/// `LF004`, a stale write `LF001`.
#[test]
fn protected_partitions_of_unprotected_parents_take_plain_ddl() {
    let (_db, mut c) = db_with("a22_leaf_ddl", "", LEAF_OWN_PAY);
    must_run(
        &mut c,
        "ALTER TABLE own SET (fillfactor = 50); ALTER TABLE pay SET (fillfactor = 50);
         ALTER TABLE bigown ADD COLUMN note text; ALTER TABLE bigpay ADD COLUMN note text;",
    );
    let stale = must_fail(&mut c, "INSERT INTO bigpay (k, v, tok) VALUES ('a', 1, 4)");
    assert_eq!(stale[0], "LF001", "{stale:?}");
    must_run(&mut c, "ALTER TABLE bigown DETACH PARTITION own; ALTER TABLE bigpay DETACH PARTITION pay");
    let truncate = must_fail(&mut c, "TRUNCATE own");
    assert_eq!(truncate[0], "LF004", "{truncate:?}");
    let stale = must_fail(&mut c, "INSERT INTO pay (k, v, tok) VALUES ('a', 1, 4)");
    assert_eq!(stale[0], "LF001", "{stale:?}");
    let enforced = one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced");
    assert_eq!(enforced, 1);
}
