//! (Session 13 closed eight of the ten holes below. Session 14 closed the
//! cost of many fences sharing an owner table (`lease._create_trigger`
//! re-creates nothing already in place; the DDL guard judges an owner
//! table's guards once, not once per fence against it): 12 fences of 12
//! partitions, `COMMENT ON TABLE own` 2.6 ms, the 13th protect 3–4 ms. The
//! unrelated `CREATE TABLE` at REPEATABLE READ beside a 1,000-partition
//! fence stays open: about 2–4 ms on PostgreSQL 18 (0.5 ms at READ
//! COMMITTED), but about 25 ms on 15 (5–10 ms at READ COMMITTED), where
//! the guard's SQL helpers cost more per call; DDL that concerns that fence
//! pays more at REPEATABLE READ: README, Limits.)
//! Attack review 24: the DDL guard (`pg_lease_guard_ddl`,
//! `pg_lease_guard_ddl_start`, `pg_lease_guard_drop`) after the rework of
//! review 23, on PostgreSQL 18.
//!
//! Findings, most severe first:
//! - Hole (high): a stale write commits through a BEFORE row trigger that
//!   the guard never saw. `u` (to become a partition of fenced `pay`)
//!   already has some trigger, so `pg_class.relhastriggers` is true and
//!   another session's `CREATE TRIGGER zz_lower BEFORE INSERT ON u` (which
//!   sets `NEW.tok := 1`; legal on an unfenced table) leaves `u`'s
//!   `pg_class` row alone; a REPEATABLE READ transaction whose snapshot
//!   predates it then runs `ALTER TABLE pay ATTACH PARTITION u`:
//!   `lease._catalog_version` (pg_lease's own triggers only, family
//!   `pg_class` rows) reads the same under both snapshots, no `40001`, and
//!   the trigger-order check reads `pg_trigger` through the old snapshot:
//!   accepted. `lease.protected_tables` then says not enforced ("trigger
//!   zz_lower ... runs after pg_lease_fence"), but writes are accepted:
//!   `INSERT INTO pay VALUES ('b', 1, 9)` passes the fence with the current
//!   token 9 and commits as `('b', 1, 1)`
//!   (`before_trigger_created_since_the_snapshot_is_refused_on_attach`).
//! - Hole (high, same root cause): the same on the owner side lowers an
//!   owner token: `u2` holding owner row `('b', 9)`, given (by another
//!   session, after the REPEATABLE READ snapshot) a trigger `zz_low BEFORE
//!   UPDATE` that sets `NEW.owner_fencing_token := 1`, is attached to the
//!   partitioned owner table `own`: accepted; `UPDATE own SET
//!   owner_fencing_token = 10 WHERE k = 'b'` passes the owner guard and
//!   stores 1, and a write to `pay` with token 1 commits
//!   (`owner_before_trigger_created_since_the_snapshot_is_refused_on_attach`).
//! - Hole (high): `pg_restore --single-transaction` of a dump with a
//!   partitioned fenced table fails as soon as any fenced row carries a
//!   token older than its owner row's current one (the normal state after a
//!   single takeover): pg_dump attaches `pay_a` in pre-data, before the
//!   COPY of `lease.protected`; the first DDL after the data (`ALTER TABLE
//!   ONLY own ADD CONSTRAINT own_pkey`) finds `pay_a` joined in this
//!   transaction, judges it for the first time as an ATTACH and refuses its
//!   historical rows (`LF008 ALTER TABLE would bring rows into fenced table
//!   public.pay that the fence would refuse`); nothing is restored. README
//!   (Backups): plain or `--single-transaction` restores work
//!   (`single_transaction_restore_of_a_partitioned_fence_with_history_succeeds`).
//! - Hole (medium): a fenced table with a foreign-table partition: refused
//!   when the partition comes after `protect` (`LF008`), but `protect` of a
//!   partitioned table that already has one is accepted,
//!   `lease.protected_tables` says enforced with no problem, and the
//!   foreign partition carries a fence whose rows are written on another
//!   server (README: a foreign-table partition of a fenced table is
//!   `LF008`; "a partition joined ... then protected" is never judged)
//!   (`protect_of_a_table_with_a_foreign_partition_is_refused`).
//! - Hole (medium): DDL on an owner table shared by several fenced tables
//!   costs time in proportion to fences × owner partitions, and
//!   `lease.protect` of one more table against it (which re-creates the
//!   owner guards on every partition, each firing the guard over every
//!   fence and partition) about fences × partitions²: with 40 fenced
//!   tables against an owner table of 40 partitions, `COMMENT ON TABLE own`
//!   takes 1.3 s, `ALTER TABLE own ADD COLUMN note text` 1.2 s, the 41st
//!   `lease.protect` 7.4 s, and setting the 40 up took 4 minutes (200
//!   fences, 52 partitions: the 201st protect 14.5 s). README: a few ms;
//!   10–30 ms beside 1,000 partitions
//!   (`ddl_on_an_owner_table_shared_by_many_fences_stays_fast`).
//! - Hole (medium): DDL on any table in a multiple-inheritance "diamond"
//!   chain costs time exponential in its depth once any table in the
//!   database is protected: `lease._reached` / `lease._related` walk
//!   `pg_inherits` with `UNION ALL` (README's comment: "inheritance has no
//!   cycles"), but multiple inheritance makes a DAG and every path is
//!   enumerated. 18 diamond levels: `COMMENT ON TABLE d0` 0.6 s (0.3 ms with
//!   nothing protected), each level doubling it (25 levels: minutes). The
//!   tables are not fenced or owner tables: README promises such commands
//!   pay "well under a millisecond"
//!   (`ddl_on_deep_multiple_inheritance_stays_fast`).
//! - Hole (medium): ordinary partition DDL refused with an unclear error:
//!   when the fenced table's owner is not the owner table's (ownership
//!   handed over after `protect`, `ALTER TABLE pay OWNER TO a24_y`), that
//!   owner can write through the fence but cannot `CREATE TABLE pay_d
//!   PARTITION OF pay` nor `ALTER TABLE pay ATTACH PARTITION` any table,
//!   even an empty one or one with only current tokens:
//!   `42501 permission denied for table own`, raised inside
//!   `lease._guard_ddl` (the row check joins the owner table `FOR SHARE`
//!   as the attached table's owner, not as the owner table's owner as the
//!   fence reads it)
//!   (`attach_by_a_fenced_table_owner_without_rights_on_the_owner_table_succeeds`).
//! - Hole (low): spurious `40001` for ordinary migrations: a REPEATABLE
//!   READ transaction whose snapshot predates a `GRANT SELECT ON pay` (or
//!   an `ADD COLUMN`, a `CREATE INDEX`: anything that rewrites the fenced
//!   table's `pg_class` row) committed by another session cannot run any
//!   DDL at all, even `CREATE TABLE unrelated (x int)`:
//!   `lease._fresh_catalog` compares the `xmin` of every `pg_class` row of
//!   the fenced and owner tables' families, and runs before the guard asks
//!   whether the command concerns a fence. README: 40001 only after a change
//!   to a fence, partitions/inheritance or pg_lease's triggers
//!   (`unrelated_ddl_at_repeatable_read_after_a_grant_succeeds`).
//! - Hole (low): dropping any index anywhere (`DROP TABLE unrelated` of a
//!   table with a primary key, `ALTER TABLE unrelated DROP CONSTRAINT
//!   unrelated_pkey`) re-checks every fence in the database in full
//!   (`lease._guard_drop`: "a dropped index no longer names its table: look
//!   at every owner table" calls `lease._fence_problems()`): beside a
//!   fenced table of 500 partitions 25–40 ms instead of 1.5–5 ms, growing
//!   with every partition (1000: 130 ms); README: commands elsewhere pay
//!   well under a millisecond
//!   (`dropping_an_unrelated_index_stays_fast_beside_a_large_fence`).
//! - Hole (low, same root cause as the spurious 40001): at REPEATABLE
//!   READ every DDL command in the database, `CREATE TABLE unrelated` too,
//!   computes `lease._catalog_version()` twice (a walk and a text of every
//!   partition of every fenced and owner table): beside a fenced table of
//!   1000 partitions 60–90 ms per command (READ COMMITTED: about 7 ms)
//!   (`unrelated_ddl_at_repeatable_read_stays_fast_beside_a_large_fence`).
//! - Defence holds: a migrator (not a superuser) attaching its own staging
//!   table with a stale row hidden by a `FORCE ROW LEVEL SECURITY` policy
//!   (`USING (tok >= 5)`) gets `LF008`: the guard's row check is not fooled
//!   by the table owner's policies
//!   (`attach_check_sees_rows_hidden_by_forced_row_security`).
//! - Defence holds: token columns protected as `GENERATED BY DEFAULT AS
//!   IDENTITY` (fenced and partitioned owner table) turned `SET GENERATED
//!   ALWAYS` afterwards: `LF008` for both (PostgreSQL refuses it on the
//!   owner partition itself)
//!   (`identity_token_columns_set_generated_always_are_refused`).
//! - Defence holds: at REPEATABLE READ, dropping the second of two unique
//!   constraints on the owner key after another session dropped the first
//!   (committed since the snapshot) is `LF008`; the owner key stays unique
//!   (`owner_key_constraints_dropped_by_two_sessions_are_refused`).
//!
//! Tried with psql, not kept (defences hold or documented): a `DO INSTEAD
//! NOTHING` rule on `UPDATE` of an owner table is accepted by the guard,
//! but `lease.acquire` then refuses (`LF008 the token bump ... did not
//! reach owner row`); an UNLOGGED owner partition joined before `protect`
//! in the same transaction, with `protect` retried after a rolled-back
//! savepoint: `LF008` both times; `ALTER CONSTRAINT own_pkey DEFERRABLE` /
//! `NOT ENFORCED` / `NO INHERIT`: refused by PostgreSQL; a foreign
//! partition of a partitioned owner table: refused by PostgreSQL (unique
//! index); a judgment made in a rolled-back savepoint (`lease._first_judgment`
//! keeps its mark) only matters for partitions joined before `protect`,
//! whose rows README does not cover, and attaching a partitioned table
//! re-judges its whole subtree; 1000 partitions created in one transaction
//! beside an empty fenced table: about 11 ms each (unprotected: about 4 ms),
//! 30 ms each beside 1,400 existing ones, as README's Limits say. Server
//! log: no PANIC, no backend terminated by a signal.

use pg_lease_sessions::*;
use std::time::{Duration, Instant};

/// Runs `program` (pg_dump, pg_restore) against the test cluster; its
/// exit status and stderr.
fn run_tool(program: &str, args: &[&str]) -> (bool, String) {
    let port = port().to_string();
    let out = std::process::Command::new(pg_bin(program))
        .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Builds `levels` inheritance diamonds below `d0 (x int)`: `d<i>a` and
/// `d<i>b` inherit `d<i-1>`, `d<i>` inherits both.
fn diamonds(c: &mut postgres::Client, levels: i32) {
    must_run(
        c,
        &format!(
            "SET client_min_messages = warning;
             CREATE TABLE d0 (x int);
             DO $$ BEGIN FOR i IN 1..{levels} LOOP
               EXECUTE format('CREATE TABLE d%sa () INHERITS (d%s)', i, i - 1);
               EXECUTE format('CREATE TABLE d%sb () INHERITS (d%s)', i, i - 1);
               EXECUTE format('CREATE TABLE d%s () INHERITS (d%sa, d%sb)', i, i, i);
             END LOOP; END $$"
        ),
    );
}

fn timed(c: &mut postgres::Client, sql: &str) -> Duration {
    let start = Instant::now();
    must_run(c, sql);
    start.elapsed()
}

/// **Hole (medium): DDL on a deep multiple-inheritance hierarchy is
/// exponential in its depth while any table is protected.** UTF-8
/// database, superuser: `pay` fenced against `own` (unrelated to what
/// follows); 17 levels of inheritance diamonds below `d0` (`d<i>a`,
/// `d<i>b` inherit `d<i-1>`, `d<i>` inherits both: 52 tables, legal in
/// PostgreSQL, which walks them with `find_all_inheritors` once each).
/// `COMMENT ON TABLE d0 IS 'x'` and `COMMENT ON TABLE d17 IS 'x'`: the DDL
/// guard's `lease._related` (`lease._reached` down, its own walk up) uses
/// `WITH RECURSIVE ... UNION ALL` and so enumerates every path, 2^17 of
/// them, before it can even tell that no protected table is concerned:
/// about 0.3 s each, doubling with every level (18: 0.6 s; 25: over a
/// minute, 30: most of an hour, holding an ACCESS EXCLUSIVE lock where the
/// command takes one); with nothing protected, 0.3 ms. Expected (README,
/// Limits): commands that touch no fenced or owner table pay well under a
/// millisecond. Measured as tuples read (`tuples_read`): under 10 times what
/// the COMMENT reads on a table outside any hierarchy (PostgreSQL 15: 1.0
/// times on the top, 2.5 on the bottom; each path enumerated reads at least
/// one `pg_inherits` row, 2^17 of them).
#[test]
fn ddl_on_deep_multiple_inheritance_stays_fast() {
    let db = TestDb::new("a24_diamonds");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    diamonds(&mut c, 17);
    must_run(&mut c, "CREATE TABLE lone (x int)");
    let lone = tuples_read(&mut c, "COMMENT ON TABLE lone IS 'x'");
    let down = tuples_read(&mut c, "COMMENT ON TABLE d0 IS 'x'");
    let up = tuples_read(&mut c, "COMMENT ON TABLE d17 IS 'x'");
    assert!(
        down < lone * 10 && up < lone * 10,
        "tuples read by COMMENT ON TABLE beside 17 inheritance diamonds, a fence elsewhere in the database: \
         on the top {down}, on the bottom {up}; on a table outside any hierarchy {lone}"
    );
}

/// **Defence holds: the owner key's unique constraints dropped by two
/// sessions, one at REPEATABLE READ.** UTF-8 database, superuser: owner
/// table `own` with two unique constraints on `k` (`p` PRIMARY KEY, `u`
/// UNIQUE), `pay` fenced against it, owner row `a` at 5. Session A: `BEGIN
/// ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pay`. Session B:
/// `ALTER TABLE own DROP CONSTRAINT p` (accepted: `u` remains). Session A:
/// `ALTER TABLE own DROP CONSTRAINT u` — under A's snapshot `p` still
/// exists, and `pg_constraint` is not part of `lease._catalog_version`.
/// Refused all the same (`LF008`): the owner key stays unique, a second
/// owner row `a` at 1 is a unique violation, a write with token 1 `LF001`.
#[test]
fn owner_key_constraints_dropped_by_two_sessions_are_refused() {
    let db = TestDb::new("a24_two_uniques");
    let mut a = db.connect();
    must_run(
        &mut a,
        "CREATE TABLE own (k text, owner_fencing_token bigint);
         ALTER TABLE own ADD CONSTRAINT p PRIMARY KEY (k);
         ALTER TABLE own ADD CONSTRAINT u UNIQUE (k);
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);",
    );
    let mut b = db.connect();
    must_run(&mut a, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pay");
    must_run(&mut b, "ALTER TABLE own DROP CONSTRAINT p");
    let dropped = failure(&mut a, "ALTER TABLE own DROP CONSTRAINT u");
    let _ = failure(&mut a, "ROLLBACK");
    let twin = failure(&mut b, "INSERT INTO own VALUES ('a', 1)");
    let stale = failure(&mut b, "INSERT INTO pay VALUES ('a', 1, 1)");
    assert!(
        dropped.as_ref().is_some_and(|r| r[0] == "LF008" || r[0] == "40001")
            && twin.as_ref().is_some_and(|r| r[0] == "23505")
            && stale.as_ref().is_some_and(|r| r[0] == "LF001"),
        "last unique constraint dropped at REPEATABLE READ: {dropped:?}; second owner row: {twin:?}; stale write: {stale:?}"
    );
}

/// **Hole (low): spurious `40001` for DDL that concerns no fence.** UTF-8
/// database, superuser: `pay` fenced against `own`. Session A: `BEGIN
/// ISOLATION LEVEL REPEATABLE READ; SELECT 1`. Session B: `GRANT SELECT ON
/// pay TO PUBLIC` (committed; no fence, partition, inheritance link or
/// pg_lease trigger changes). Session A: `CREATE TABLE unrelated (x int)`:
/// `40001 pg_lease: CREATE TABLE cannot be judged under this transaction's
/// snapshot` — `lease._catalog_version()` includes each family table's
/// `pg_class.xmin`, which a GRANT (relacl), an ADD COLUMN (relnatts) or a
/// CREATE INDEX (relhasindex) changes, and `lease._fresh_catalog` runs for
/// every DDL command before the guard looks at what the command touches.
/// Expected (README, Limits: 40001 after "a change to a fence, to a fenced
/// or owner table's partitions or inheritance, or to pg_lease's
/// triggers"): the `CREATE TABLE` succeeds.
#[test]
fn unrelated_ddl_at_repeatable_read_after_a_grant_succeeds() {
    let db = TestDb::new("a24_rr_grant");
    let mut a = db.connect();
    must_run(
        &mut a,
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    let mut b = db.connect();
    must_run(&mut a, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1");
    must_run(&mut b, "GRANT SELECT ON pay TO PUBLIC");
    let created = failure(&mut a, "CREATE TABLE unrelated (x int)");
    let _ = failure(&mut a, "ROLLBACK");
    assert!(
        created.is_none(),
        "CREATE TABLE unrelated at REPEATABLE READ after another session's GRANT SELECT ON pay: {created:?}"
    );
}

/// **Hole (high): `pg_restore --single-transaction` refuses a fenced
/// partitioned table's history.** UTF-8 database, superuser: `own (k,
/// owner_fencing_token)`, `pay (k, v, tok) PARTITION BY LIST (k)` with
/// partition `pay_a`, fenced against `own`; owner row `a` at 5, `INSERT
/// INTO pay VALUES ('a', 1, 5)` (accepted), then the token is bumped to 9
/// (a takeover: the row stays, as history). `pg_dump -Fc`, then
/// `pg_restore --single-transaction` into a new empty database: exit
/// status 1, `LF008 FenceTampering: ALTER TABLE would bring rows into
/// fenced table public.pay that the fence would refuse ... Table
/// public.pay_a holds rows whose token is not their owner row's current
/// token`, raised at `ALTER TABLE ONLY public.own ADD CONSTRAINT own_pkey`:
/// `pay_a` was attached (pre-data) before `lease.protected` was loaded, so
/// the first guarded DDL after the data judges it as a partition joined in
/// this transaction and checks its rows like an ATTACH. A plain
/// `pg_restore` of the same dump succeeds. Expected (README, Backups):
/// the single-transaction restore succeeds, the fence enforced after.
#[test]
fn single_transaction_restore_of_a_partitioned_fence_with_history_succeeds() {
    let db = TestDb::new("a24_restore");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5);
         INSERT INTO pay VALUES ('a', 1, 5);
         UPDATE own SET owner_fencing_token = 9;",
    );
    let file = std::env::temp_dir().join(format!("{}.dump", db.name));
    let file = file.to_str().unwrap().to_owned();
    let (dumped, err) = run_tool("pg_dump", &["-Fc", "-f", &file, &db.name]);
    assert!(dumped, "pg_dump: {err}");
    let target = format!("{}_r", db.name);
    let mut admin = connect_to("postgres", "postgres");
    must_run(&mut admin, &format!("CREATE DATABASE {target}"));
    let (restored, err) = run_tool("pg_restore", &["--single-transaction", "-d", &target, &file]);
    let enforced = restored && {
        let mut r = connect_to(&target, "postgres");
        one_i64(&mut r, "SELECT count(*) FROM lease.protected_tables WHERE enforced") == 1
    };
    must_run(&mut admin, &format!("DROP DATABASE {target} WITH (FORCE)"));
    let _ = std::fs::remove_file(&file);
    assert!(
        restored && enforced,
        "pg_restore --single-transaction of a fenced partition with a row at an older token: {err}"
    );
}

/// **Hole (low): dropping an unrelated index re-checks every fence.** UTF-8
/// database, superuser: `pay (k, r, tok) PARTITION BY RANGE (r)` with 500
/// partitions, fenced against `own`. `CREATE TABLE unrelated (x int
/// PRIMARY KEY)`, then `DROP TABLE unrelated`: 25–40 ms (a table without
/// an index: 1.5–5 ms), as is `ALTER TABLE ... DROP CONSTRAINT ..._pkey` —
/// the sql_drop guard sees a dropped index, cannot tell its table any more,
/// and runs `lease._fence_problems()` over every fence and every partition;
/// 1000 partitions: 130 ms. Expected (README, Limits): commands that touch
/// no fenced or owner table pay well under a millisecond. Measured as
/// tuples read (`tuples_read`): under 4 times what `DROP TABLE plain` reads
/// (PostgreSQL 15: 2.7 times, 3,179 against 1,179; a fence check of every
/// partition reads at least their triggers, thousands of rows).
#[test]
fn dropping_an_unrelated_index_stays_fast_beside_a_large_fence() {
    let db = TestDb::new("a24_drop_index");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k int, r int, tok bigint) PARTITION BY RANGE (r);
         DO $$ BEGIN FOR i IN 0..499 LOOP
           EXECUTE format('CREATE TABLE pay_%s PARTITION OF pay FOR VALUES FROM (%s) TO (%s)', i, i * 10, i * 10 + 10);
         END LOOP; END $$;
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         CREATE TABLE unrelated (x int PRIMARY KEY);
         CREATE TABLE plain (x int);",
    );
    let with_index = tuples_read(&mut c, "DROP TABLE unrelated");
    let without = tuples_read(&mut c, "DROP TABLE plain");
    assert!(
        with_index < without * 4,
        "tuples read by DROP TABLE of an unrelated table with a primary key beside a fenced table of 500 partitions: \
         {with_index} (without an index: {without})"
    );
}

/// **Hole (high): a BEFORE row trigger created since a REPEATABLE READ
/// snapshot rides into a fenced table with ATTACH PARTITION.** UTF-8
/// database, superuser (the tables' owner would do): `pay (k, v, tok)
/// PARTITION BY LIST (k)` fenced against `own` (rows `a` at 5, `b` at 9);
/// an unfenced `u (k, v, tok)` with an AFTER trigger `audit` (so
/// `u.relhastriggers` is already true). Session A: `BEGIN ISOLATION LEVEL
/// REPEATABLE READ; SELECT 1`. Session B: `CREATE TRIGGER zz_lower BEFORE
/// INSERT ON u FOR EACH ROW` running `NEW.tok := 1` (committed; `u` is not
/// fenced, and `u`'s `pg_class` row does not change). Session A: `ALTER
/// TABLE pay ATTACH PARTITION u FOR VALUES IN ('b'); COMMIT`: accepted — no
/// `40001` (`lease._catalog_version` covers pg_lease's own triggers, not
/// others on family tables) and no `LF008` (the order check reads
/// `pg_trigger` under A's snapshot, where `zz_lower` does not exist).
/// `lease.protected_tables` then reports the trigger, but `INSERT INTO pay
/// VALUES ('b', 1, 9)` is accepted by the fence and `zz_lower` commits it
/// as `('b', 1, 1)`: a row with token 1 while `b`'s token is 9. Expected
/// (README, Tamper resistance: a BEFORE row trigger named to fire after
/// pg_lease's is refused; Limits: 40001 when the snapshot cannot judge):
/// the ATTACH refused (`LF008` or `40001`), no row with a stale token.
#[test]
fn before_trigger_created_since_the_snapshot_is_refused_on_attach() {
    let db = TestDb::new("a24_rr_trigger");
    let mut a = db.connect();
    must_run(
        &mut a,
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5), ('b', 9);
         CREATE TABLE u (k text, v int, tok bigint);
         CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER audit AFTER INSERT ON u FOR EACH ROW EXECUTE FUNCTION noop();
         CREATE FUNCTION lower_tok() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.tok := 1; RETURN NEW; END $$;",
    );
    let mut b = db.connect();
    must_run(&mut a, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1");
    must_run(&mut b, "CREATE TRIGGER zz_lower BEFORE INSERT ON u FOR EACH ROW EXECUTE FUNCTION lower_tok()");
    let attach = failure(&mut a, "ALTER TABLE pay ATTACH PARTITION u FOR VALUES IN ('b'); COMMIT");
    let _ = failure(&mut a, "ROLLBACK");
    let write = failure(&mut b, "INSERT INTO pay VALUES ('b', 1, 9)");
    let stale = one_i64(&mut b, "SELECT count(*) FROM pay WHERE k = 'b' AND tok < 9");
    assert!(
        attach.is_some() && stale == 0,
        "ATTACH PARTITION at REPEATABLE READ of a table given a late BEFORE trigger since the snapshot: {attach:?}; \
         INSERT ('b', 1, 9): {write:?}; rows of b with a token below 9: {stale}"
    );
}

/// **Defence holds: rows hidden by the table owner's forced row-level
/// security are still checked on ATTACH.** UTF-8 database; a migrator role
/// as README's "Roles and grants" describes it (`CREATE` on `public`,
/// `EXECUTE` on `protect`), owning `own`, `pay` (partitioned, fenced) and a
/// staging table `stage` holding `('b', 1, 1)` (owner row `b` at 5), with
/// `ENABLE` and `FORCE ROW LEVEL SECURITY` and a policy `USING (tok >= 5)`
/// that hides the stale row from its owner, the role the guard's check runs
/// as. `ALTER TABLE pay ATTACH PARTITION stage FOR VALUES IN ('b')`:
/// `LF008`, nothing attached.
#[test]
fn attach_check_sees_rows_hidden_by_forced_row_security() {
    let db = TestDb::new("a24_rls_attach");
    let mut c = db.connect();
    must_run(
        &mut c,
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'a24_migrator') THEN
             CREATE ROLE a24_migrator LOGIN; END IF; END $$;
         GRANT CREATE ON SCHEMA public TO a24_migrator;
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO a24_migrator;",
    );
    let mut m = db.connect_as("a24_migrator");
    must_run(
        &mut m,
        "CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    must_run(&mut c, "INSERT INTO own VALUES ('a', 5), ('b', 5)");
    must_run(
        &mut m,
        "CREATE TABLE stage (k text, v int, tok bigint);
         INSERT INTO stage VALUES ('b', 1, 1);
         ALTER TABLE stage ENABLE ROW LEVEL SECURITY;
         ALTER TABLE stage FORCE ROW LEVEL SECURITY;
         CREATE POLICY hide ON stage USING (tok >= 5);",
    );
    let attach = failure(&mut m, "ALTER TABLE pay ATTACH PARTITION stage FOR VALUES IN ('b')");
    let stale = one_i64(&mut c, "SELECT count(*) FROM pay WHERE tok < 5");
    assert!(
        attach.as_ref().is_some_and(|r| r[0] == "LF008") && stale == 0,
        "ATTACH of a staging table whose stale row its owner's forced policy hides: {attach:?}; stale rows in pay: {stale}"
    );
}

/// **Hole (medium): DDL on an owner table shared by many fences is
/// fences × partitions, `protect` fences × partitions².** UTF-8 database,
/// superuser: `own (k int, owner_fencing_token) PARTITION BY RANGE (k)`
/// with 12 partitions, 12 tables `pay<i> (k, tok)` fenced against it (the
/// set-up alone takes a few seconds). `COMMENT ON TABLE own IS 'x'`: 18–30 ms;
/// a 13th `lease.protect` against `own`: about 0.22 s. Both grow steeply:
/// with 40 fences and 40 partitions the COMMENT takes 1.3 s, `ALTER TABLE
/// own ADD COLUMN note text` 1.2 s, the 41st protect 7.4 s, and the set-up
/// 4 minutes. (The guard's partition walk and `lease._fence_problems_in`
/// run once per concerned fence, each over every owner partition; protect
/// re-creates the owner guard and each partition's TRUNCATE guard, each
/// such command judged over all of it.) Expected (README, Limits): a DDL
/// command touching an owner table costs a few ms, whatever the number of
/// fences against it. Measured as tuples read (`tuples_read`; a timed bound
/// of 4 times failed under CI load at 4.06, with 1.6 measured idle): the
/// COMMENT reads under 3 times what it reads on a like owner table with one
/// fence (PostgreSQL 15: 1.7 times; before session 14's fix 9.9), and the
/// 13th protect under 1.5 times what a second one reads (1.0; before, 2.4
/// times, and 9 times more to begin with).
#[test]
fn ddl_on_an_owner_table_shared_by_many_fences_stays_fast() {
    let db = TestDb::new("a24_many_fences");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k int, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY RANGE (k);
         CREATE TABLE own1 (k int, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY RANGE (k);
         DO $$ BEGIN FOR i IN 0..11 LOOP
           EXECUTE format('CREATE TABLE own_%s PARTITION OF own FOR VALUES FROM (%s) TO (%s)', i, i * 100, i * 100 + 100);
           EXECUTE format('CREATE TABLE own1_%s PARTITION OF own1 FOR VALUES FROM (%s) TO (%s)', i, i * 100, i * 100 + 100);
         END LOOP; END $$;
         DO $$ BEGIN FOR i IN 1..12 LOOP
           EXECUTE format('CREATE TABLE pay%s (k int, tok bigint)', i);
           PERFORM lease.protect(format('pay%s', i)::regclass, '{k}', 'tok', 'own', '{k}');
         END LOOP; END $$;
         CREATE TABLE solo (k int, tok bigint);
         SELECT lease.protect('solo', '{k}', 'tok', 'own1', '{k}');
         CREATE TABLE payx (k int, tok bigint);",
    );
    let one = tuples_read(&mut c, "COMMENT ON TABLE own1 IS 'x'");
    let twelve = tuples_read(&mut c, "COMMENT ON TABLE own IS 'x'");
    let protect_one = tuples_read(&mut c, "SELECT lease.protect('payx', '{k}', 'tok', 'own1', '{k}')");
    let protect_thirteenth = tuples_read(&mut c, "SELECT lease.protect('payx', '{k}', 'tok', 'own', '{k}')");
    assert!(
        twelve < one * 3 && protect_thirteenth * 2 < protect_one * 3,
        "tuples read, owner table of 12 partitions: COMMENT ON TABLE with 12 fences against it {twelve}, \
         with one {one}; protect against it as the 13th fence {protect_thirteenth}, as the second {protect_one}"
    );
}

/// **Hole (high): owner token lowered through a BEFORE trigger created
/// since a REPEATABLE READ snapshot and attached with its table into the
/// owner table.** UTF-8 database, superuser (the tables' owner would do):
/// `own (k, owner_fencing_token) PARTITION BY LIST (k)` (partition `own_a`),
/// `pay` fenced against it; an unfenced `u2 (k, owner_fencing_token)`
/// holding `('b', 9)` with an AFTER trigger `audit`. Session A: `BEGIN
/// ISOLATION LEVEL REPEATABLE READ; SELECT 1`. Session B: `CREATE TRIGGER
/// zz_low BEFORE UPDATE ON u2 FOR EACH ROW` setting
/// `NEW.owner_fencing_token := 1`. Session A: `ALTER TABLE own ATTACH
/// PARTITION u2 FOR VALUES IN ('b'); COMMIT`: accepted (no `40001`, no
/// `LF008`: `zz_low` is invisible to A's snapshot and changes nothing
/// `lease._catalog_version` reads). Then `UPDATE own SET owner_fencing_token
/// = 10 WHERE k = 'b'`: the owner guard sees 9 → 10, `zz_low` stores 1;
/// `INSERT INTO pay VALUES ('b', 1, 1)` commits. Expected: the ATTACH
/// refused (`LF008` or `40001`), `b`'s token never below 9, the write
/// `LF001`.
#[test]
fn owner_before_trigger_created_since_the_snapshot_is_refused_on_attach() {
    let db = TestDb::new("a24_rr_owner_trigger");
    let mut a = db.connect();
    must_run(
        &mut a,
        "CREATE TABLE own (k text, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY LIST (k);
         CREATE TABLE own_a PARTITION OF own FOR VALUES IN ('a');
         CREATE TABLE pay (k text, v int, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         CREATE TABLE u2 (k text NOT NULL, owner_fencing_token bigint);
         INSERT INTO u2 VALUES ('b', 9);
         CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER audit AFTER INSERT ON u2 FOR EACH ROW EXECUTE FUNCTION noop();
         CREATE FUNCTION lower_tok() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN NEW.owner_fencing_token := 1; RETURN NEW; END $$;",
    );
    let mut b = db.connect();
    must_run(&mut a, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1");
    must_run(&mut b, "CREATE TRIGGER zz_low BEFORE UPDATE ON u2 FOR EACH ROW EXECUTE FUNCTION lower_tok()");
    let attach = failure(&mut a, "ALTER TABLE own ATTACH PARTITION u2 FOR VALUES IN ('b'); COMMIT");
    let _ = failure(&mut a, "ROLLBACK");
    let bump = failure(&mut b, "UPDATE own SET owner_fencing_token = 10 WHERE k = 'b'");
    let token = one_i64(&mut b, "SELECT coalesce(max(owner_fencing_token), 9) FROM own WHERE k = 'b'");
    let stale = failure(&mut b, "INSERT INTO pay VALUES ('b', 1, 1)");
    assert!(
        attach.is_some() && token >= 9 && stale.as_ref().is_some_and(|r| r[0] == "LF001" || r[0] == "LF007"),
        "ATTACH into the owner table at REPEATABLE READ of a table given a late BEFORE trigger: {attach:?}; \
         token bump: {bump:?}, b's token now {token}; write with token 1: {stale:?}"
    );
}

/// **Hole (medium): CREATE ... PARTITION OF and ATTACH refused with
/// `permission denied for table own` when the fenced table's owner has no
/// rights on the owner table.** UTF-8
/// database: the superuser creates `own`, `pay (k, v, tok) PARTITION BY
/// LIST (k)` with `pay_a`, protects `pay` against `own` (rows `a`, `b` at 5)
/// and hands `pay` and `pay_a` to a role `a24_y` (`CREATE` on `public`, no
/// rights on `own`). As `a24_y`: `INSERT INTO pay VALUES ('a', 1, 5)`
/// passes the fence (owner rows are read as their owner), but `CREATE
/// TABLE stage2 (k text, v int, tok bigint)` (empty) and `ALTER TABLE pay
/// ATTACH PARTITION stage2 FOR VALUES IN ('c')` fails with `42501
/// permission denied for table own` (CONTEXT: `lease._guard_ddl()`); so
/// does attaching a table whose rows carry the current token, and so does
/// `CREATE TABLE pay_d PARTITION OF pay FOR VALUES IN ('d')` (a new, empty
/// partition: its "rows brought in" are checked the same way). Expected:
/// all succeed (the guard reads owner rows as the owner table's
/// owner, as the fence does), or at least an `LF` error that says what is
/// missing.
#[test]
fn attach_by_a_fenced_table_owner_without_rights_on_the_owner_table_succeeds() {
    let db = TestDb::new("a24_attach_rights");
    let mut c = db.connect();
    must_run(
        &mut c,
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'a24_y') THEN
             CREATE ROLE a24_y LOGIN; END IF; END $$;
         GRANT CREATE ON SCHEMA public TO a24_y;
         CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');
         INSERT INTO own VALUES ('a', 5), ('b', 5);
         ALTER TABLE pay OWNER TO a24_y;
         ALTER TABLE pay_a OWNER TO a24_y;",
    );
    let mut y = db.connect_as("a24_y");
    let write = failure(&mut y, "INSERT INTO pay VALUES ('a', 1, 5)");
    let empty = failure(
        &mut y,
        "CREATE TABLE stage2 (k text, v int, tok bigint);
         ALTER TABLE pay ATTACH PARTITION stage2 FOR VALUES IN ('c')",
    );
    let current = failure(
        &mut y,
        "CREATE TABLE stage (k text, v int, tok bigint);
         INSERT INTO stage VALUES ('b', 1, 5);
         ALTER TABLE pay ATTACH PARTITION stage FOR VALUES IN ('b')",
    );
    let created = failure(&mut y, "CREATE TABLE pay_d PARTITION OF pay FOR VALUES IN ('d')");
    assert!(
        write.is_none() && empty.is_none() && current.is_none() && created.is_none(),
        "as the fenced table's owner without rights on the owner table: fenced INSERT {write:?}; \
         ATTACH of an empty table {empty:?}; ATTACH of rows at the current token {current:?}; \
         CREATE TABLE ... PARTITION OF {created:?}"
    );
}

/// **Hole (medium): `protect` accepts a partitioned table that already has
/// a foreign-table partition.** UTF-8 database, superuser (a foreign data
/// wrapper without handler and a server `elsewhere`, enough for the
/// catalog): `pay (k, v, tok) PARTITION BY LIST (k)` with `pay_a` and
/// `CREATE FOREIGN TABLE pay_f PARTITION OF pay FOR VALUES IN ('f') SERVER
/// elsewhere`, then `lease.protect('pay', '{k}', 'tok', 'own', '{k}')`:
/// accepted; `lease.protected_tables` says enforced, problems NULL. The
/// same partition created after protect is refused (`LF008 CREATE FOREIGN
/// TABLE would make foreign table public.pay_g a partition of fenced table
/// public.pay ... Rows of a foreign table are written on another server,
/// where pg_lease's fence cannot see them`): the refusal lives only in the
/// DDL guard's judgment of newly joined partitions, and neither protect nor
/// `lease._fence_problems` looks for foreign partitions. Expected: protect
/// refused (`LF008`, or `42809` as for other non-tables), or at least the
/// partition listed in `problems` and `enforced` false.
#[test]
fn protect_of_a_table_with_a_foreign_partition_is_refused() {
    let db = TestDb::new("a24_foreign_part");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE FOREIGN DATA WRAPPER a24_dummy;
         CREATE SERVER elsewhere FOREIGN DATA WRAPPER a24_dummy;
         CREATE TABLE own (k text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k text, v int, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         CREATE FOREIGN TABLE pay_f PARTITION OF pay FOR VALUES IN ('f') SERVER elsewhere;",
    );
    let protect = failure(&mut c, "SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}')");
    let enforced =
        one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE table_name::text = 'pay' AND enforced");
    let later = failure(&mut c, "CREATE FOREIGN TABLE pay_g PARTITION OF pay FOR VALUES IN ('g') SERVER elsewhere");
    assert!(
        protect.is_some() || enforced == 0,
        "protect of a table with a foreign partition: {protect:?}; enforced fences: {enforced}; \
         a foreign partition created after protect: {later:?}"
    );
}

/// **Hole (low): every DDL command at REPEATABLE READ pays for the whole
/// fenced catalog.** UTF-8 database, superuser: `pay (k, r, tok)
/// PARTITION BY RANGE (r)` with 1000 partitions (created before protect),
/// fenced against `own`. `BEGIN ISOLATION LEVEL REPEATABLE READ; CREATE
/// TABLE rr1 (x int); CREATE TABLE rr2 (x int)`: 60–90 ms each (the same
/// at READ COMMITTED: about 7 ms): `lease._fresh_catalog` runs for every
/// command, before the guard asks whether it concerns a fence, and builds
/// `lease._catalog_version()` (every family table's `pg_class` and
/// `pg_inherits` row) under two snapshots. Expected (README, Limits):
/// commands elsewhere pay well under a millisecond; say 10 ms here.
#[test]
#[ignore = "open (low): on PostgreSQL 15 about 25 ms at REPEATABLE READ against 5-10 ms at READ COMMITTED (on 18 about 2-4 ms); see session 14's closing note"]
fn unrelated_ddl_at_repeatable_read_stays_fast_beside_a_large_fence() {
    let db = TestDb::new("a24_rr_cost");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE pay (k int, r int, tok bigint) PARTITION BY RANGE (r);
         DO $$ BEGIN FOR i IN 0..999 LOOP
           EXECUTE format('CREATE TABLE pay_%s PARTITION OF pay FOR VALUES FROM (%s) TO (%s)', i, i * 10, i * 10 + 10);
         END LOOP; END $$;
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    let rc = timed(&mut c, "CREATE TABLE rc1 (x int)");
    must_run(&mut c, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    let rr = (1..=3).map(|i| timed(&mut c, &format!("CREATE TABLE rr{i} (x int)"))).min().unwrap();
    must_run(&mut c, "COMMIT");
    assert!(
        rr < Duration::from_millis(10),
        "CREATE TABLE of an unrelated table at REPEATABLE READ beside a fenced table of 1000 partitions: {rr:?} \
         (READ COMMITTED: {rc:?})"
    );
}

/// **Defence holds: `SET GENERATED ALWAYS` on identity token columns.**
/// UTF-8 database, superuser: `own (k, owner_fencing_token bigint GENERATED
/// BY DEFAULT AS IDENTITY) PARTITION BY LIST (k)` with `own_a`, `pay (k, v,
/// tok bigint GENERATED BY DEFAULT AS IDENTITY)`, protected (accepted).
/// `ALTER TABLE own ALTER COLUMN owner_fencing_token SET GENERATED ALWAYS`
/// and `ALTER TABLE pay ALTER COLUMN tok SET GENERATED ALWAYS`: both
/// `LF008`; the fence stays enforced.
#[test]
fn identity_token_columns_set_generated_always_are_refused() {
    let db = TestDb::new("a24_identity_always");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k text, owner_fencing_token bigint GENERATED BY DEFAULT AS IDENTITY, PRIMARY KEY (k))
           PARTITION BY LIST (k);
         CREATE TABLE own_a PARTITION OF own FOR VALUES IN ('a');
         CREATE TABLE pay (k text, v int, tok bigint GENERATED BY DEFAULT AS IDENTITY);
         SELECT lease.protect('pay', '{k}', 'tok', 'own', '{k}');",
    );
    let owner = failure(&mut c, "ALTER TABLE own ALTER COLUMN owner_fencing_token SET GENERATED ALWAYS");
    let fenced = failure(&mut c, "ALTER TABLE pay ALTER COLUMN tok SET GENERATED ALWAYS");
    let enforced = one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced");
    assert!(
        owner.as_ref().is_some_and(|r| r[0] == "LF008") && fenced.as_ref().is_some_and(|r| r[0] == "LF008") && enforced == 1,
        "SET GENERATED ALWAYS on the owner token column: {owner:?}; on the fenced token column: {fenced:?}; enforced: {enforced}"
    );
}

/// **Defence holds (session 14): `protect` against a shared owner table
/// leaves the owner guards in place untouched, and still repairs them.**
/// Superuser: `own` of three partitions, `pay1` fenced against it. A second
/// `protect` (`pay2`) finds every owner guard as it would install it and
/// re-creates none (their `pg_trigger` row versions are unchanged: no DDL,
/// so no guard run per fence). With the DDL guard disabled, a clone of the
/// owner guard on one partition and the TRUNCATE guard of another are
/// disabled; a third `protect` (`pay3`, guard still disabled, as a repair
/// would run) enables both again and every fence is enforced.
#[test]
fn protect_against_a_shared_owner_table_keeps_and_repairs_its_guards() {
    let db = TestDb::new("a24_shared_owner_guards");
    let mut c = db.connect();
    must_run(
        &mut c,
        "CREATE TABLE own (k int, owner_fencing_token bigint, PRIMARY KEY (k)) PARTITION BY RANGE (k);
         CREATE TABLE own_0 PARTITION OF own FOR VALUES FROM (0) TO (100);
         CREATE TABLE own_1 PARTITION OF own FOR VALUES FROM (100) TO (200);
         CREATE TABLE own_2 PARTITION OF own FOR VALUES FROM (200) TO (300);
         CREATE TABLE pay1 (k int, tok bigint);
         CREATE TABLE pay2 (k int, tok bigint);
         CREATE TABLE pay3 (k int, tok bigint);
         SELECT lease.protect('pay1', '{k}', 'tok', 'own', '{k}');",
    );
    let versions = "SELECT string_agg(tgrelid::regclass::text || tgname || xmin::text, ',' ORDER BY tgrelid, tgname)
                      FROM pg_trigger WHERE tgname LIKE 'pg_lease_owner%'";
    let before: String = c.query_one(versions, &[]).unwrap().get(0);
    must_run(&mut c, "SELECT lease.protect('pay2', '{k}', 'tok', 'own', '{k}')");
    let after: String = c.query_one(versions, &[]).unwrap().get(0);
    must_run(
        &mut c,
        "ALTER EVENT TRIGGER pg_lease_guard_ddl DISABLE;
         ALTER TABLE own_1 DISABLE TRIGGER pg_lease_owner_guard;
         ALTER TABLE own_2 DISABLE TRIGGER pg_lease_owner_truncate;
         SELECT lease.protect('pay3', '{k}', 'tok', 'own', '{k}');
         ALTER EVENT TRIGGER pg_lease_guard_ddl ENABLE;",
    );
    let disabled = one_i64(
        &mut c,
        "SELECT count(*) FROM pg_trigger WHERE tgrelid::regclass::text LIKE 'own%' AND tgenabled <> 'A'",
    );
    let enforced = one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE enforced");
    assert!(
        before == after && disabled == 0 && enforced == 3,
        "owner guards before the second protect: {before}; after: {after}; \
         after the repairing protect, disabled pg_lease triggers: {disabled}, enforced fences: {enforced} of 3"
    );
}
