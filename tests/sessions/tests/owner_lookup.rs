//! The owner lookup without SPI (0.6.0): the fence finds and locks the owner
//! row through the owner key's unique index itself. Whatever index the owner
//! table has, or loses, or gains while long-lived sessions write, the verdict
//! is the one the SQL lookup `... WHERE key OPERATOR(pg_catalog.=) $1 FOR
//! SHARE` gives: the same row (by the key type's own equality), the same lock,
//! the same errors.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::thread;

/// The verdicts every layout below must give: current accepted, stale LF001,
/// ahead LF002, unknown owner LF007.
fn verdicts(c: &mut Client, insert: impl Fn(&str, i64) -> String, key: &str, other_form: &str, unknown: &str) {
    assert_eq!(try_sql(c, &insert(key, 5)), "", "{key}");
    assert_eq!(try_sql(c, &insert(other_form, 5)), "", "{other_form} is the same resource as {key}");
    expect_error(c, &insert(other_form, 4), "LF001");
    expect_error(c, &insert(key, 6), "LF002");
    expect_error(c, &insert(unknown, 5), "LF007");
}

#[test]
fn keys_of_other_types_and_forms_find_their_owner_row() {
    let db = TestDb::new("lookup_types");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE COLLATION IF NOT EXISTS public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         -- int8 owner key, int4 fenced key: the cross-type operator of the index's family.
         CREATE TABLE wide (id int8 PRIMARY KEY, tok int8);
         CREATE TABLE wide_pay (id int4, tok int8);
         SELECT lease.protect('wide_pay', '{id}', 'tok', owner_table => 'wide', owner_key_columns => '{id}',
                              owner_token_column => 'tok');
         INSERT INTO wide VALUES (4294967297, 5), (1, 5);
         -- numeric: 1.0 and 1.00 are one key.
         CREATE TABLE num (k numeric PRIMARY KEY, tok int8);
         CREATE TABLE num_pay (k numeric, tok int8);
         SELECT lease.protect('num_pay', '{k}', 'tok', owner_table => 'num', owner_key_columns => '{k}',
                              owner_token_column => 'tok');
         INSERT INTO num VALUES (1.0, 5);
         -- a nondeterministic collation: 'Alpha' and 'ALPHA' are one key.
         CREATE TABLE ci_owner (k text COLLATE public.ci PRIMARY KEY, tok int8);
         CREATE TABLE ci_pay (k text COLLATE public.ci, tok int8);
         SELECT lease.protect('ci_pay', '{k}', 'tok', owner_table => 'ci_owner', owner_key_columns => '{k}',
                              owner_token_column => 'tok');
         INSERT INTO ci_owner VALUES ('alpha', 5);
         -- varchar: `=` resolves to texteq through binary coercion (text_ops).
         CREATE TABLE vc (k varchar(10) PRIMARY KEY, tok int8);
         CREATE TABLE vc_pay (k varchar(10), tok int8);
         SELECT lease.protect('vc_pay', '{k}', 'tok', owner_table => 'vc', owner_key_columns => '{k}',
                              owner_token_column => 'tok');
         INSERT INTO vc VALUES ('t1', 5);",
    )
    .unwrap();
    verdicts(&mut c, |k, t| format!("INSERT INTO wide_pay VALUES ({k}, {t})"), "1", "1::int2", "2");
    // 2^32 + 1 in the owner table never matches a truncated int4.
    expect_error(&mut c, "INSERT INTO wide_pay VALUES (1::int8 << 32 | 1, 5)", "22003");
    verdicts(&mut c, |k, t| format!("INSERT INTO num_pay VALUES ({k}, {t})"), "1", "1.000", "1.001");
    verdicts(&mut c, |k, t| format!("INSERT INTO ci_pay VALUES ('{k}', {t})"), "Alpha", "ALPHA", "beta");
    verdicts(&mut c, |k, t| format!("INSERT INTO vc_pay VALUES ('{k}', {t})"), "t1", "t1", "t2");
}

#[test]
fn composite_keys_match_an_index_in_any_column_order() {
    let db = TestDb::new("lookup_composite");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE seats (room text, seat int, tok int8, PRIMARY KEY (seat, room));
         CREATE TABLE seat_pay (room text, seat int, tok int8);
         SELECT lease.protect('seat_pay', '{room,seat}', 'tok', owner_table => 'seats',
                              owner_key_columns => '{room,seat}', owner_token_column => 'tok');
         INSERT INTO seats VALUES ('a', 1, 5), ('a', 2, 9), ('b', 1, 7);",
    )
    .unwrap();
    assert_eq!(try_sql(&mut c, "INSERT INTO seat_pay VALUES ('a', 1, 5), ('a', 2, 9), ('b', 1, 7)"), "");
    expect_error(&mut c, "INSERT INTO seat_pay VALUES ('a', 2, 7)", "LF001");
    expect_error(&mut c, "INSERT INTO seat_pay VALUES ('b', 1, 9)", "LF002");
    expect_error(&mut c, "INSERT INTO seat_pay VALUES ('b', 2, 5)", "LF007");
}

/// A session that has used the owner key's index keeps fencing correctly
/// while that index is rebuilt, replaced and dropped under it.
#[test]
fn warm_sessions_follow_the_owner_index_through_ddl() {
    let db = TestDb::new("lookup_ddl");
    let mut admin = db.connect();
    admin.batch_execute(POKER).unwrap();
    let mut w = db.connect();
    let pay = |t: i64| format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {t})");
    let check = |w: &mut Client, current: i64| {
        assert_eq!(try_sql(w, &pay(current)), "");
        expect_error(w, &pay(current - 1), "LF001");
        expect_error(w, &pay(current + 1), "LF002");
    };
    check(&mut w, 5);
    admin.batch_execute("REINDEX TABLE tables").unwrap();
    check(&mut w, 5);
    admin.batch_execute("REINDEX TABLE CONCURRENTLY tables").unwrap();
    check(&mut w, 5);
    admin.batch_execute("CREATE UNIQUE INDEX CONCURRENTLY tables_id ON tables (id)").unwrap();
    admin.batch_execute("ALTER TABLE tables DROP CONSTRAINT tables_pkey").unwrap();
    check(&mut w, 5);
    admin.batch_execute("UPDATE tables SET owner_fencing_token = 8 WHERE id = 1").unwrap();
    check(&mut w, 8);
    // Replaced by an index the fence cannot use for lookups (a partial one
    // beside a constraint it can): the constraint is used.
    admin
        .batch_execute(
            "ALTER TABLE tables ADD CONSTRAINT tables_pk PRIMARY KEY (id);
             DROP INDEX tables_id;
             CREATE UNIQUE INDEX tables_partial ON tables (id) WHERE id > 0;",
        )
        .unwrap();
    check(&mut w, 8);
}

/// The index a writer's config names is dropped while the writer waits for
/// the owner table's lock: the writer sees the change when the lock is
/// granted and looks the row up again instead of opening a dropped index.
#[test]
fn an_index_dropped_while_a_writer_waits_is_not_used() {
    let db = TestDb::new("lookup_race");
    let mut admin = db.connect();
    admin.batch_execute(POKER).unwrap();
    // A second unique index, later in the index list than the primary key
    // the writer's lookups use.
    admin.batch_execute("CREATE UNIQUE INDEX tables_id ON tables (id)").unwrap();
    let mut w = db.connect();
    let pay = |t: i64| format!("INSERT INTO payouts (table_id, fencing_token) VALUES (1, {t})");
    assert_eq!(try_sql(&mut w, &pay(5)), "");
    let writer_pid = backend_pid(&mut w);
    let mut ddl = db.connect();
    ddl.batch_execute(
        "BEGIN;
         ALTER TABLE tables DROP CONSTRAINT tables_pkey;
         UPDATE tables SET owner_fencing_token = 6 WHERE id = 1;",
    )
    .unwrap();
    let writer = thread::spawn(move || {
        let stale = try_sql(&mut w, &pay(5));
        let current = try_sql(&mut w, &pay(6));
        (stale, current)
    });
    wait_until_blocked(&mut admin, writer_pid);
    ddl.batch_execute("COMMIT").unwrap();
    let (stale, current) = writer.join().unwrap();
    assert_eq!(stale, "LF001", "the writer waited for the bump, then judged 5 stale");
    assert_eq!(current, "");
}

/// READ COMMITTED writers wait for an uncommitted bump and judge the new
/// token; a bump that moves on leaves the old version locked by nobody.
#[test]
fn writers_follow_the_owner_rows_update_chain() {
    let db = TestDb::new("lookup_chain");
    let mut admin = db.connect();
    admin.batch_execute(POKER).unwrap();
    let mut w = db.connect();
    let writer_pid = backend_pid(&mut w);
    let mut bumper = db.connect();
    bumper
        .batch_execute(
            "BEGIN;
             UPDATE tables SET owner_fencing_token = 6 WHERE id = 1;
             UPDATE tables SET owner_fencing_token = 7 WHERE id = 1;",
        )
        .unwrap();
    let writer = thread::spawn(move || {
        let r = try_sql(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 7)");
        (r, w)
    });
    wait_until_blocked(&mut admin, writer_pid);
    bumper.batch_execute("COMMIT").unwrap();
    let (r, mut w) = writer.join().unwrap();
    assert_eq!(r, "", "the newest version (token 7) was judged");
    // At REPEATABLE READ a bump committed after the snapshot is a
    // serialization failure, as for SELECT ... FOR SHARE.
    w.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    admin.batch_execute("UPDATE tables SET owner_fencing_token = 8 WHERE id = 1").unwrap();
    expect_error(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 8)", "40001");
    w.batch_execute("ROLLBACK").unwrap();
    // An owner row deleted while a writer waits is missing (a row without a
    // token yet: the owner guard refuses deleting one that has a token).
    admin.batch_execute("INSERT INTO tables VALUES (3, NULL)").unwrap();
    let writer_pid = backend_pid(&mut w);
    let mut deleter = db.connect();
    deleter.batch_execute("BEGIN; DELETE FROM tables WHERE id = 3;").unwrap();
    let writer = thread::spawn(move || try_sql(&mut w, "INSERT INTO payouts (table_id, fencing_token) VALUES (3, 1)"));
    wait_until_blocked(&mut admin, writer_pid);
    deleter.batch_execute("COMMIT").unwrap();
    assert_eq!(writer.join().unwrap(), "LF007");
}

/// ATTACH PARTITION brings rows in without the fence trigger: the DDL guard
/// matches them to their owner rows by the key type's own equality, as the
/// fence would (0.5.0 compared the keys' text: 1.00 did not find 1.0).
#[test]
fn attached_rows_find_their_owner_rows_by_key_equality() {
    let db = TestDb::new("lookup_attach");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE COLLATION IF NOT EXISTS public.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE owners (k numeric PRIMARY KEY, name text COLLATE public.ci UNIQUE, tok int8);
         INSERT INTO owners VALUES (1.0, 'alpha', 5);
         CREATE TABLE pay (part int, k numeric, tok int8) PARTITION BY LIST (part);
         CREATE TABLE pay0 PARTITION OF pay FOR VALUES IN (0);
         SELECT lease.protect('pay', '{k}', 'tok', owner_table => 'owners', owner_key_columns => '{k}',
                              owner_token_column => 'tok');
         CREATE TABLE by_name (part int, name text COLLATE public.ci, tok int8) PARTITION BY LIST (part);
         CREATE TABLE by_name0 PARTITION OF by_name FOR VALUES IN (0);
         SELECT lease.protect('by_name', '{name}', 'tok', owner_table => 'owners', owner_key_columns => '{name}',
                              owner_token_column => 'tok');
         CREATE TABLE good (LIKE pay); INSERT INTO good VALUES (1, 1.000, 5);
         CREATE TABLE stale (LIKE pay); INSERT INTO stale VALUES (2, 1.00, 4);
         CREATE TABLE good_name (LIKE by_name); INSERT INTO good_name VALUES (1, 'ALPHA', 5);",
    )
    .unwrap();
    assert_eq!(try_sql(&mut c, "ALTER TABLE pay ATTACH PARTITION good FOR VALUES IN (1)"), "");
    expect_error(&mut c, "ALTER TABLE pay ATTACH PARTITION stale FOR VALUES IN (2)", "LF008");
    assert_eq!(try_sql(&mut c, "ALTER TABLE by_name ATTACH PARTITION good_name FOR VALUES IN (1)"), "");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pay"), 1);
}

/// `lease._owner_key_index` (used by protect and the fence check, executable
/// by PUBLIC) opens the table it is asked about: only an owner table pg_lease
/// guards or one the caller may read, so no role can lock arbitrary tables
/// with it; a monitoring role without rights on the tables still sees the
/// fences as enforced.
#[test]
fn the_owner_key_index_check_opens_no_table_the_caller_may_not_read() {
    let db = TestDb::new("lookup_keyindex_acl");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(
        "CREATE TABLE secret (id int PRIMARY KEY);
         DROP ROLE IF EXISTS lookup_peeker; CREATE ROLE lookup_peeker LOGIN;
         GRANT USAGE ON SCHEMA lease TO lookup_peeker; GRANT SELECT ON lease.protected_tables TO lookup_peeker;",
    )
    .unwrap();
    let mut peeker = db.connect_as("lookup_peeker");
    expect_error(&mut peeker, "SELECT lease._owner_key_index('secret'::regclass, '{id}', '{23}')", "42501");
    // Called from PL/pgSQL (as lease.protect calls it): the error shows no
    // frames of the caller's functions, as pg_lease's other permission errors.
    let e = peeker
        .batch_execute("DO $$ BEGIN PERFORM lease._owner_key_index('secret'::regclass, '{id}', '{23}'); END $$")
        .unwrap_err();
    let e = e.as_db_error().unwrap();
    assert_eq!((e.code().code(), e.message()), ("42501", "permission denied for table public.secret"));
    assert!(e.where_().is_none(), "CONTEXT: {:?}", e.where_());
    let held: i64 = one_i64(
        &mut c,
        "SELECT count(*) FROM pg_locks WHERE relation = 'secret'::regclass AND pid <> pg_backend_pid()",
    );
    assert_eq!(held, 0);
    // The owner table of a fence: allowed (the fence check needs it).
    assert_eq!(
        one_i64(
            &mut peeker,
            "SELECT count(*) FROM lease._owner_key_index('tables'::regclass, '{id}', '{23}') i WHERE i IS NOT NULL"
        ),
        1
    );
    assert_eq!(one_i64(&mut peeker, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 1);
    drop(peeker);
    c.batch_execute("DROP OWNED BY lookup_peeker; DROP ROLE lookup_peeker").unwrap();
}

/// A write without a token is refused whatever the current token is; the
/// token its DETAIL reports is read without a lock (through the index, as
/// the verdict's lookup): the committed one while a bump is in flight (no
/// waiting for it), this transaction's own bump once made, the one of the
/// key written in another form, none for a resource without an owner row,
/// and for high-water tables the mark a fresh snapshot sees.
#[test]
fn refusals_without_a_token_report_the_current_token_without_waiting() {
    let db = TestDb::new("lookup_peek");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE num (k numeric PRIMARY KEY, tok int8);
         CREATE TABLE num_pay (k numeric, tok int8);
         SELECT lease.protect('num_pay', '{k}', 'tok', owner_table => 'num', owner_key_columns => '{k}',
                              owner_token_column => 'tok');
         INSERT INTO num VALUES (1.0, 5), (2, NULL);
         CREATE TABLE sink (k int, tok int8);
         SELECT lease.protect_high_water('sink', '{k}', 'tok');
         INSERT INTO sink VALUES (1, 7);
         SET statement_timeout = '5s';",
    )
    .unwrap();
    let detail = |c: &mut Client, sql: &str| expect_error(c, sql, "LF003");
    assert!(detail(&mut c, "INSERT INTO num_pay VALUES (1.000, NULL)").contains("current token 5"));
    let mut bumper = db.connect();
    bumper.batch_execute("BEGIN; UPDATE num SET tok = 6 WHERE k = 1; INSERT INTO sink VALUES (1, 8)").unwrap();
    let seen = detail(&mut c, "INSERT INTO num_pay VALUES (1, NULL)");
    assert!(seen.contains("current token 5"), "the committed token, without waiting for the bump: {seen}");
    let mark = detail(&mut c, "INSERT INTO sink VALUES (1, NULL)");
    assert!(mark.contains("current token 7"), "the committed mark, without waiting for the raise: {mark}");
    bumper.batch_execute("COMMIT").unwrap();
    assert!(detail(&mut c, "INSERT INTO num_pay VALUES (1.0, NULL)").contains("current token 6"));
    c.batch_execute("BEGIN; UPDATE num SET tok = 9 WHERE k = 1").unwrap();
    let own = detail(&mut c, "INSERT INTO num_pay VALUES (1.00, NULL)");
    assert!(own.contains("current token 9"), "this transaction's own bump: {own}");
    c.batch_execute("ROLLBACK").unwrap();
    let none = detail(&mut c, "INSERT INTO num_pay VALUES (2, NULL)");
    assert!(none.contains("current token none"), "{none}");
    let missing = detail(&mut c, "INSERT INTO num_pay VALUES (3, NULL)");
    assert!(missing.contains("current token none"), "{missing}");
    assert!(detail(&mut c, "INSERT INTO sink VALUES (1, NULL)").contains("current token 8"));
}
