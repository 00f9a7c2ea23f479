//! Attack review 27: today's changes (66286b7..3fa4d85) attacked over real
//! connections on PostgreSQL 15: the token origin (`lease.token_origin`,
//! the two-band jump on foreign lease state), the MOVING memory of the
//! fence trigger, `_create_trigger`'s skip of triggers already in place.
//!
//! (Session 14 closed four of the five holes: `lease.token_epoch_issued`
//! names the incarnation that wrote it (NULL before 0.9.2 or from a 0.9.1
//! dump: foreign, so the first acquire after a restore of a 0.9.1 dump, or
//! after an update in place, jumps two bands once); `protect` refuses a
//! pg_lease trigger name held by a clone of a parent's trigger (42710, as
//! before the skip, now with pg_lease's message); the move memory no longer
//! compares the command counter (forgotten at transaction end instead); an
//! acquire with no epoch left says so. Open (ignored test, README Limits):
//! two copies of one pre-0.9.2 database, each updated in place, jump to the
//! same band.)
//!
//! Findings, most severe first:
//!
//! - **Hole (high)**: a database dumped while on pg_lease 0.9.1 and restored
//!   where 0.9.2 is installed re-issues, token for token, what its source
//!   hands out after the dump. pg_dump writes `CREATE EXTENSION IF NOT
//!   EXISTS pg_lease WITH SCHEMA lease` (no version), so the restore creates
//!   0.9.2, whose `lease.token_origin` holds only the *new* database's
//!   incarnation (the 0.9.1 dump has no such rows): the restored state is
//!   not recognised as foreign and its first acquire makes no two-band jump.
//!   Reproduction: `CREATE EXTENSION pg_lease VERSION '0.9.1'`;
//!   `lease.acquire('table:1','host-a',60000)` → 0x10000000001; `pg_dump
//!   -Fc`; the source acquires `table:2` → 0x10000000002; `pg_restore` into
//!   a new database; there `lease.acquire('table:2','host-b',60000)` →
//!   0x10000000002 again (epoch 1, `token_origin` has one row, its own).
//!   The same happens to `CREATE DATABASE c TEMPLATE src` of a 0.9.1
//!   database followed by `ALTER EXTENSION pg_lease UPDATE` in each (the
//!   update script records the database's own incarnation: "an update in
//!   place is this database's own state"), and (by reading the script,
//!   not run) to a
//!   0.9.1 cluster pg_upgraded and then updated. README ("Tokens only rise",
//!   pg_upgrade step 2: "The same holds for a pg_dump restored anywhere")
//!   (`a_restored_091_dump_never_reissues_a_token_the_source_issued_after_the_dump`,
//!   fails; `a_template_copy_of_a_091_database_updated_in_place_never_reissues_a_token`, fails).
//! - **Hole (high)**: the fence on a table, or the owner guard on an owner
//!   table, can be removed by an ordinary `ALTER TABLE ... DETACH
//!   PARTITION`, and a stale write then commits. `_create_trigger` now
//!   skips a trigger "already in place" without asking whether it is a
//!   partition *clone* (`tgparentid <> 0`); before today its `CREATE OR
//!   REPLACE TRIGGER` failed on such a trigger ("is an internal or a child
//!   trigger"), so protect refused. Table `kid` is a partition of
//!   unprotected `par`; the table owner has created `pg_lease_fence BEFORE
//!   INSERT OR DELETE OR UPDATE ON par FOR EACH ROW EXECUTE FUNCTION
//!   lease.fence_trigger()` (ENABLE ALWAYS), so `kid` carries an identical
//!   clone; `lease.protect('kid','{table_id}','tok','tables')` keeps that
//!   clone as the fence. `ALTER TABLE par DETACH PARTITION kid` is let
//!   through by the DDL guard, and PostgreSQL drops the cloned trigger with
//!   the detach: `INSERT INTO kid VALUES (7, 1, 4)` (current token 5)
//!   commits; lease.protected_tables then reports "trigger pg_lease_fence on
//!   public.kid is missing". (DROP TRIGGER and DISABLE TRIGGER on `par` are
//!   refused.) Same on the owner side: owner table `tables` a partition of
//!   unprotected `alltables` carrying a clone of `pg_lease_owner_guard
//!   ('owner_fencing_token','id')`; after `ALTER TABLE alltables DETACH
//!   PARTITION tables`, `UPDATE tables SET owner_fencing_token = 4` (was 5,
//!   LF004 before) and then `INSERT INTO pay VALUES (7, 4)` both commit
//!   (`detaching_a_fenced_partition_from_its_unprotected_parent_keeps_the_fence`,
//!   `detaching_an_owner_partition_from_its_unprotected_parent_keeps_the_owner_guard`, both fail).
//! - **Hole (medium)**: the MOVING memory is keyed by the command id, which
//!   any SQL run by an ordinary BEFORE trigger advances: with an audit
//!   trigger `a_audit BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW`
//!   (named `a_…` as README asks) that does `INSERT INTO plog ...`, `UPDATE
//!   pp SET hand = 151 WHERE hand = 2` (same resource, current token in
//!   `tok`, moving the row to another partition) fails `LF003
//!   MissingFencingToken: DELETE on public.pp1 ... presents no fencing
//!   token`, and is audited as a DELETE without token. PostgreSQL fires the
//!   old partition's BEFORE DELETE triggers between the fence's UPDATE and
//!   DELETE calls; any SQL statement there (even `SELECT count(*) INTO n
//!   FROM tables` in a plpgsql `a_lookup BEFORE INSERT OR UPDATE OR
//!   DELETE`: a volatile function's SPI advances the command counter) makes
//!   `RowPlace.command` differ, and the DELETE is judged with the bound
//!   token. (A BEFORE UPDATE-only trigger with SQL does not break it.) The
//!   fix of attack 25 only holds for tables without such a trigger (README
//!   "How the fence works": its new row's token counts for the delete too)
//!   (`a_partition_move_with_the_current_token_passes_under_an_audit_trigger`, fails).
//! - **Hole (low)**: error mis-attributed when the two-band jump finds no
//!   band left. A database at the last band (`SELECT
//!   lease.issue_tokens_above((8388608 - 1500)::bigint << 40)`, one
//!   acquire) copied by `CREATE DATABASE c TEMPLATE src`: in `c`,
//!   `lease.acquire('fresh','b',60000)` fails `22003 pg_lease: lease
//!   "fresh" has no fencing token left (current 0)`, HINT "this resource's
//!   token is at the top of their range": the resource has no token; it is
//!   the database's epochs that the foreign-state jump (two bands) ran out
//!   of, and every lease of the copy fails so, for good
//!   (`an_acquire_without_an_epoch_left_on_restored_state_says_so`, fails).
//! - **Defence holds**: two sessions on cloned (foreign) lease state: at READ
//!   COMMITTED the second acquire waits for the first's uncommitted jump and
//!   then issues another token in the same jumped epoch; at REPEATABLE READ a
//!   snapshot taken before the other session's jump gets `40001 could not
//!   serialize access due to concurrent update`; one origin row is left
//!   (`two_sessions_acquiring_on_cloned_state_never_share_a_token`).
//! - **Defence holds**: `lease.token_origin` cannot be forged, updated or
//!   emptied by the application role (acquire granted) or by the owner of
//!   the fenced tables (42501); the application role's own acquire on
//!   cloned state jumps and absorbs the foreign row
//!   (`only_a_superuser_touches_lease_token_origin`).
//! - **Defence holds**: moves in a three-level partition tree (across
//!   sub-trees, by an UPDATE of a sub-partitioned table, by MERGE) pass with
//!   the current token and are refused (LF001) with a stale one
//!   (`moves_in_a_three_level_tree_are_judged_by_the_updates_token`).
//! - **Defence holds**: a trigger that could make an UPDATE that passed the
//!   fence not happen (`suppress_redundant_updates_trigger` sorted after
//!   `pg_lease_fence`) is refused by the DDL guard, and a writable CTE that
//!   UPDATEs a row (passing with the row's current token) and DELETEs it in
//!   the same command under a stale bound token deletes nothing; a MERGE
//!   doing both on one row fails "cannot affect row a second time"
//!   (`an_update_in_the_same_command_lends_no_token_to_a_delete`, passes).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

fn scratch_file(name: &str) -> String {
    let base = std::env::var("PG_LEASE_SCRATCH").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let dir = base.join(format!("a27_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).to_string_lossy().into_owned()
}

fn acquire(c: &mut Client, name: &str, holder: &str) -> i64 {
    one_i64(c, &format!("SELECT token FROM lease.acquire('{name}', '{holder}', 60000)"))
}

/// A database whose pg_lease was created at 0.9.1.
fn db_091(label: &str) -> (TestDb, Client) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    must_run(&mut c, "DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease VERSION '0.9.1'");
    (db, c)
}

/// Hole (high): see the module doc.
#[test]
fn a_restored_091_dump_never_reissues_a_token_the_source_issued_after_the_dump() {
    let (src, mut c) = db_091("a27_dump091");
    let dumped = acquire(&mut c, "table:1", "host-a");
    let dump = scratch_file("src091.dump");
    let port = port().to_string();
    run_client("pg_dump", &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-Fc", "-f", &dump, &src.name]);
    // The source goes on issuing after the dump.
    let after = acquire(&mut c, "table:2", "host-a");
    assert!(after > dumped);

    let dst = TestDb { name: format!("{}_restored", src.name) };
    connect_to("postgres", "postgres").batch_execute(&format!("CREATE DATABASE {}", dst.name)).unwrap();
    run_client(
        "pg_restore",
        &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "--exit-on-error", "-d", &dst.name, &dump],
    );
    let _ = std::fs::remove_file(&dump);
    let mut r = dst.connect();
    let version: String =
        r.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'", &[]).unwrap().get(0);
    let next = acquire(&mut r, "table:2", "host-b");
    assert_ne!(
        next, after,
        "the database restored (pg_lease {version}) from a 0.9.1 dump issued {next:#x}, which its source \
         handed out after the dump"
    );
    assert!(next >> 40 >= 2048, "no two-band jump on the restored 0.9.1 state: {next:#x} (epoch {})", next >> 40);
}

/// Hole (high): see the module doc (same cause: the 0.9.1 -> 0.9.2 script
/// records the database it runs in as the origin of its lease state).
#[test]
#[ignore = "open (low): two copies of one database made before 0.9.2, each updated in place, jump to the same band: nothing tells the copy from its source (README, Limits)"]
fn a_template_copy_of_a_091_database_updated_in_place_never_reissues_a_token() {
    let (src, mut c) = db_091("a27_tmpl091");
    acquire(&mut c, "table:1", "host-a");
    drop(c);
    let copy = TestDb { name: format!("{}_copy", src.name) };
    connect_to("postgres", "postgres")
        .batch_execute(&format!("CREATE DATABASE {} TEMPLATE {}", copy.name, src.name))
        .unwrap();
    let mut c = src.connect();
    must_run(&mut c, "ALTER EXTENSION pg_lease UPDATE");
    let mut k = copy.connect();
    must_run(&mut k, "ALTER EXTENSION pg_lease UPDATE");
    let a = acquire(&mut c, "table:2", "host-a");
    let b = acquire(&mut k, "table:2", "host-b");
    assert_ne!(a, b, "the template copy and its source both issued {a:#x} for table:2");
}

/// Hole (high): see the module doc.
#[test]
fn detaching_a_fenced_partition_from_its_unprotected_parent_keeps_the_fence() {
    let db = TestDb::new("a27_clone");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (7, 5);
         CREATE TABLE par (table_id int NOT NULL, hand int NOT NULL, tok bigint) PARTITION BY LIST (table_id);
         CREATE TABLE kid PARTITION OF par FOR VALUES IN (7);
         CREATE TRIGGER pg_lease_fence BEFORE INSERT OR DELETE OR UPDATE ON par
             FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger();
         ALTER TABLE par ENABLE ALWAYS TRIGGER pg_lease_fence;",
    );
    // (Session 14: protect refuses a fence trigger cloned from the parent,
    // as it did before the skip: 42710, pg_lease's message.)
    let protect = try_sql(&mut c, "SELECT lease.protect('kid', '{table_id}', 'tok', 'tables')");
    if !protect.is_empty() {
        assert_eq!(protect, "42710", "protect of a table whose pg_lease_fence is its parent's clone");
        return;
    }
    expect_error(&mut c, "INSERT INTO kid VALUES (7, 1, 4)", "LF001");
    let detach = try_sql(&mut c, "ALTER TABLE par DETACH PARTITION kid");
    let stale = try_sql(&mut c, "INSERT INTO kid VALUES (7, 1, 4)");
    let problems: Option<String> = c
        .query_one("SELECT problems::text FROM lease.protected_tables WHERE table_name::text = 'kid'", &[])
        .map(|r| r.get(0))
        .unwrap_or(None);
    assert!(
        stale.starts_with("LF"),
        "after DETACH ({detach:?}, \"\" = done), a stale INSERT into the fenced kid committed ({stale:?}); \
         lease.protected_tables says {problems:?}"
    );
}

/// Hole (medium): see the module doc.
#[test]
fn a_partition_move_with_the_current_token_passes_under_an_audit_trigger() {
    let db = TestDb::new("a27_move");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (7, 5);
         CREATE TABLE pp (table_id int NOT NULL, hand int NOT NULL, tok bigint) PARTITION BY RANGE (hand);
         CREATE TABLE pp1 PARTITION OF pp FOR VALUES FROM (0) TO (100);
         CREATE TABLE pp2 PARTITION OF pp FOR VALUES FROM (100) TO (200);
         SELECT lease.protect('pp', '{table_id}', 'tok', 'tables');
         CREATE TABLE plog (op text);
         CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO plog VALUES (TG_OP); IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$;
         INSERT INTO pp VALUES (7, 1, 5), (7, 2, 5);",
    );
    // Without the audit trigger the move passes (attack 25's fix).
    must_run(&mut c, "UPDATE pp SET hand = 150 WHERE hand = 1");
    must_run(
        &mut c,
        "CREATE TRIGGER a_audit BEFORE INSERT OR UPDATE OR DELETE ON pp FOR EACH ROW EXECUTE FUNCTION audit()",
    );
    let r = try_sql(&mut c, "UPDATE pp SET hand = 151 WHERE hand = 2");
    assert_eq!(
        r, "",
        "moving a row to another partition with the current token 5 in tok, under an audit trigger, was refused ({r})"
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pp2"), 2);
}

/// Defence holds: see the module doc.
#[test]
fn an_update_in_the_same_command_lends_no_token_to_a_delete() {
    let db = TestDb::new("a27_cte");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (7, 5);
         CREATE TABLE t (table_id int PRIMARY KEY, tok bigint, v int);
         SELECT lease.protect('t', '{table_id}', 'tok', 'tables');
         INSERT INTO t VALUES (7, 5, 1);",
    );
    expect_error(
        &mut c,
        "CREATE TRIGGER suppress_noop BEFORE UPDATE ON t FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "LF008",
    );
    let r = try_sql(
        &mut c,
        "BEGIN; SELECT lease.bind_token(4);
         WITH u AS (UPDATE t SET v = v WHERE table_id = 7 RETURNING 1)
         DELETE FROM t WHERE table_id = 7 AND EXISTS (SELECT FROM u); COMMIT",
    );
    let _ = c.batch_execute("ROLLBACK");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM t"), 1, "the stale DELETE in the CTE committed ({r:?})");
    let r = try_sql(
        &mut c,
        "BEGIN; SELECT lease.bind_token(4);
         MERGE INTO t USING (VALUES (1, 'u'), (2, 'd')) s (n, op) ON t.table_id = 7
           WHEN MATCHED AND s.op = 'u' THEN UPDATE SET v = t.v
           WHEN MATCHED AND s.op = 'd' THEN DELETE; COMMIT",
    );
    let _ = c.batch_execute("ROLLBACK");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM t"), 1, "the stale DELETE in the MERGE committed ({r:?})");
}

/// Hole (high): see the module doc (the owner side of the same skip).
#[test]
fn detaching_an_owner_partition_from_its_unprotected_parent_keeps_the_owner_guard() {
    let db = TestDb::new("a27_oclone");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE alltables (id int PRIMARY KEY, owner_fencing_token bigint) PARTITION BY RANGE (id);
         CREATE TABLE tables PARTITION OF alltables FOR VALUES FROM (0) TO (1000);
         INSERT INTO tables VALUES (7, 5);
         CREATE TRIGGER pg_lease_owner_guard BEFORE INSERT OR DELETE OR UPDATE ON alltables
             FOR EACH ROW EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
         ALTER TABLE alltables ENABLE ALWAYS TRIGGER pg_lease_owner_guard;
         CREATE TABLE pay (table_id int, tok bigint);",
    );
    // (Session 14: refused, as for the fence side.)
    let protect = try_sql(&mut c, "SELECT lease.protect('pay', '{table_id}', 'tok', 'tables')");
    if !protect.is_empty() {
        assert_eq!(protect, "42710", "protect against an owner table whose guard is its parent's clone");
        return;
    }
    expect_error(&mut c, "UPDATE tables SET owner_fencing_token = 4 WHERE id = 7", "LF004");
    let detach = try_sql(&mut c, "ALTER TABLE alltables DETACH PARTITION tables");
    let lowered = try_sql(&mut c, "UPDATE tables SET owner_fencing_token = 4 WHERE id = 7");
    let stale = try_sql(&mut c, "INSERT INTO pay VALUES (7, 4)");
    assert!(
        lowered.starts_with("LF"),
        "after DETACH ({detach:?}, \"\" = done) the owner token of table 7 was lowered from 5 to 4 ({lowered:?}), \
         and a payout with the stale token 4 gave {stale:?} (\"\" = committed)"
    );
}

/// Hole (low): see the module doc.
#[test]
fn an_acquire_without_an_epoch_left_on_restored_state_says_so() {
    let src = TestDb::new("a27_exh");
    let mut c = src.connect();
    // A cutover to the last band of epochs (README: 8,192 bands in all).
    one_i64(&mut c, "SELECT lease.issue_tokens_above((8388608 - 1500)::bigint << 40)");
    acquire(&mut c, "x", "a");
    drop(c);
    let copy = TestDb { name: format!("{}_copy", src.name) };
    connect_to("postgres", "postgres")
        .batch_execute(&format!("CREATE DATABASE {} TEMPLATE {}", copy.name, src.name))
        .unwrap();
    let mut k = copy.connect();
    let e = match k.batch_execute("SELECT lease.acquire('fresh', 'b', 60000)") {
        Ok(()) => return, // a token was left after all
        Err(e) => e,
    };
    let db = e.as_db_error().expect("a database error");
    let text = format!("{} | {}", db.message(), db.hint().unwrap_or(""));
    assert_eq!(db.code().code(), "22003", "{text}");
    assert!(
        !text.contains("current 0") && !text.contains("this resource's token is at the top"),
        "a fresh lease whose token is 0 is said to be at the top of the token range: {text}"
    );
}

/// Defence holds: lease state cloned from another database (a 0.9.2
/// template) jumps once, whichever of two sessions acquires first, at READ
/// COMMITTED (the second waits for the first and issues another token) and
/// at REPEATABLE READ (a snapshot from before the first's jump: 40001, or
/// another token two bands up).
#[test]
fn two_sessions_acquiring_on_cloned_state_never_share_a_token() {
    let src = TestDb::new("a27_conc");
    let mut c = src.connect();
    acquire(&mut c, "x", "a");
    drop(c);
    let copy = TestDb { name: format!("{}_copy", src.name) };
    connect_to("postgres", "postgres")
        .batch_execute(&format!("CREATE DATABASE {} TEMPLATE {}", copy.name, src.name))
        .unwrap();
    // REPEATABLE READ first: its snapshot predates the other's jump.
    let mut rr = copy.connect();
    let mut a = copy.connect();
    must_run(&mut rr, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lease.leases");
    let ta = acquire(&mut a, "y", "a");
    assert!(ta >> 40 >= 2049, "no jump on cloned state: {ta:#x}");
    let r = rr.query_one("SELECT token FROM lease.acquire('z', 'b', 60000)", &[]);
    match r {
        Ok(row) => {
            let tb: i64 = row.get(0);
            rr.batch_execute("COMMIT").unwrap();
            assert_ne!(ta, tb);
            assert!(tb >> 40 >= 2049, "{tb:#x}");
        }
        Err(e) => {
            assert_eq!(e.code().map(|s| s.code()), Some("40001"), "{e}");
            rr.batch_execute("ROLLBACK").unwrap();
        }
    }
    assert_eq!(one_i64(&mut a, "SELECT count(*) FROM lease.token_origin"), 1);

    // READ COMMITTED, both on foreign state: the second waits for the first.
    let copy2 = TestDb { name: format!("{}_copy2", src.name) };
    connect_to("postgres", "postgres")
        .batch_execute(&format!("CREATE DATABASE {} TEMPLATE {}", copy2.name, src.name))
        .unwrap();
    let mut first = copy2.connect();
    let mut observer = copy2.connect();
    must_run(&mut first, "BEGIN");
    let t1 = acquire(&mut first, "y", "a");
    let mut second = copy2.connect();
    let pid = backend_pid(&mut second);
    let h = std::thread::spawn(move || acquire(&mut second, "z", "b"));
    wait_until_blocked(&mut observer, pid);
    must_run(&mut first, "COMMIT");
    let t2 = h.join().unwrap();
    assert_ne!(t1, t2);
    assert!(t1 >> 40 >= 2049 && t2 >> 40 >= 2049, "{t1:#x} {t2:#x}");
    assert_eq!(one_i64(&mut observer, "SELECT count(*) FROM lease.token_origin"), 1);
}

/// Defence holds: no role but a superuser can forge or delete a
/// lease.token_origin row (the application role, with acquire granted, and
/// the owner of fenced tables both get 42501), and the application role's
/// acquire on cloned state still jumps and absorbs the foreign row.
#[test]
fn only_a_superuser_touches_lease_token_origin() {
    let src = TestDb::new("a27_roles");
    let mut c = src.connect();
    acquire(&mut c, "x", "a");
    must_run(
        &mut c,
        "DO $$ BEGIN CREATE ROLE a27_app LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         DO $$ BEGIN CREATE ROLE a27_migrator LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;",
    );
    must_run(&mut c, "GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]) TO a27_app");
    drop(c);
    let copy = TestDb { name: format!("{}_copy", src.name) };
    connect_to("postgres", "postgres")
        .batch_execute(&format!("CREATE DATABASE {} TEMPLATE {}", copy.name, src.name))
        .unwrap();
    for role in ["a27_app", "a27_migrator"] {
        let mut r = copy.connect_as(role);
        expect_error(&mut r, "DELETE FROM lease.token_origin", "42501");
        expect_error(&mut r, "INSERT INTO lease.token_origin (origin) VALUES (42)", "42501");
        expect_error(&mut r, "UPDATE lease.token_origin SET origin = 42", "42501");
    }
    let mut app = copy.connect_as("a27_app");
    let t = acquire(&mut app, "y", "app");
    assert!(t >> 40 >= 2049, "{t:#x}");
    let mut su = copy.connect();
    assert_eq!(one_i64(&mut su, "SELECT count(*) FROM lease.token_origin WHERE origin = lease._origin()"), 1);
    assert_eq!(one_i64(&mut su, "SELECT count(*) FROM lease.token_origin"), 1);
}

/// Defence holds: moves in a three-level partition tree (across sub-trees,
/// through a sub-partitioned table, by MERGE) pass with the current token
/// and are refused with a stale one.
#[test]
fn moves_in_a_three_level_tree_are_judged_by_the_updates_token() {
    let db = TestDb::new("a27_tree");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (7, 5);
         CREATE TABLE r (table_id int NOT NULL, hand int NOT NULL, tok bigint) PARTITION BY RANGE (hand);
         CREATE TABLE r1 PARTITION OF r FOR VALUES FROM (0) TO (100) PARTITION BY RANGE (hand);
         CREATE TABLE r1a PARTITION OF r1 FOR VALUES FROM (0) TO (50);
         CREATE TABLE r1b PARTITION OF r1 FOR VALUES FROM (50) TO (100);
         CREATE TABLE r2 PARTITION OF r FOR VALUES FROM (100) TO (200) PARTITION BY LIST (table_id);
         CREATE TABLE r2x PARTITION OF r2 FOR VALUES IN (7);
         SELECT lease.protect('r', '{table_id}', 'tok', 'tables');
         INSERT INTO r VALUES (7, 1, 5), (7, 2, 5), (7, 3, 5);",
    );
    must_run(&mut c, "UPDATE r SET hand = 150 WHERE hand = 1");
    must_run(&mut c, "UPDATE r1 SET hand = 60 WHERE hand = 2");
    must_run(&mut c, "MERGE INTO r USING (VALUES (3)) s (h) ON r.hand = s.h WHEN MATCHED THEN UPDATE SET hand = 160");
    expect_error(&mut c, "UPDATE r SET hand = 10, tok = 4 WHERE hand = 150", "LF001");
    expect_error(
        &mut c,
        "MERGE INTO r USING (VALUES (160)) s (h) ON r.hand = s.h WHEN MATCHED THEN UPDATE SET hand = 20, tok = 4",
        "LF001",
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM r2x"), 2);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM r1b"), 1);
}
