//! Attack review 19: pg_lease 0.9.2 (text converted between the database's
//! encoding and UTF-8: `pg::from_server`, `to_server`, `ServerText`) in
//! databases whose encoding is not UTF-8, over real connections
//! (client_encoding UTF8, as the Rust client always uses). attack18.rs and
//! encoding.rs hold what the previous review found; none is repeated here.
//!
//! The root cause of the holes below: a text that does not survive the round
//! trip server encoding -> UTF-8 -> server encoding. Three kinds exist:
//! - SQL_ASCII: bytes that are not UTF-8 (a legacy Latin-1 `é`, 0xE9) are read
//!   as U+FFFD and written back as its UTF-8 bytes EF BF BD: `é` and `è`
//!   become one text, and that text is another existing value or name;
//! - EUC_JP: NEC's duplicates (row 13, `√` 0xADF5) are read as the Unicode
//!   character and written back as its JIS X 0208 twin (`√` 0xA2E5), another
//!   value or name (any SJIS/CP932 client writes the NEC forms);
//! - EUC_JP: user-defined characters (0xF5A1 ...) have no UTF-8 twin at all:
//!   PostgreSQL's conversion raises `22P05`.
//!
//! `lease.acquire`'s owner-row lookup and bump (its `owner_key` values and the
//! owner table's name go into SQL that way) then name another row or another
//! table, and an error raised by that conversion inside an error context
//! callback aborts the server. Tests marked **Hole** fail against the
//! current code; **Defence holds** pass. Most severe first:
//!
//! - critical: EUC_JP, `lease.fenced_boundary_write` whose INSERT fails with
//!   a NOT NULL violation while the row (a default, say) or a column name
//!   holds a user-defined character: the error context callback that names
//!   the element (`name_null_column`) converts the error's DETAIL to UTF-8,
//!   PostgreSQL raises 22P05 inside it, pgrx turns that into a Rust panic
//!   with nothing to catch it: `fatal runtime error: failed to initiate
//!   panic, error 5, aborting`, signal 6, every backend of the cluster
//!   terminated, crash recovery
//!   (`euc_jp_boundary_write_not_null_violation_does_not_crash_the_server`);
//! - high: a stale writer keeps committing: `lease.acquire` bound to an owner
//!   row writes the new token into another row (SQL_ASCII `é` -> the row of
//!   `�`; EUC_JP NEC `√` -> the row of JIS `√`) or into a look-alike table
//!   (SQL_ASCII `"tabl\xE9s"` -> `"tabl�s"`; EUC_JP `"own√"` NEC -> JIS);
//!   without the other row or table, `acquire` fails (`LF007`, `42P01`);
//! - high (availability): SQL_ASCII / EUC_JP, every write to a table fenced
//!   against a partitioned owner table whose name converts alike fails with
//!   `42P01` (the fence's saved lookup plan names `po�`; in EUC_JP the
//!   message reads `"public.po鐃緒申"`, U+FFFD's bytes as EUC_JP)
//!   (`writes_fenced_against_a_partitioned_owner_table_whose_name_converts_alike_are_judged`);
//! - high: the fence guards another column than the one named: SQL_ASCII,
//!   `lease.protect` with key column `"cl\xE9"` registers the look-alike
//!   `"cl�"` when the table has one (a stale write commits by filling it
//!   with another resource's key); without it, `protect` with such a key or
//!   token column fails (`LF008 ... is missing`)
//!   (EUC_JP: NEC/JIS `√` alike;
//!   `protect_with_a_key_column_that_converts_alike_fences_that_column`);
//! - medium: EUC_JP, two resources audited as one: stale writes for NEC `√`
//!   and JIS `√` are both recorded under the JIS key
//!   (`euc_jp_audit_keeps_nec_and_jis_resources_apart`);
//! - medium: SQL_ASCII, `fenced_boundary_write` does not refuse bytes that
//!   are not UTF-8 (as README says it does): values are stored with U+FFFD
//!   and a column name `"n\xE9"` writes into a look-alike column `"n�"`
//!   (`sql_ascii_boundary_write_refuses_bytes_that_are_not_utf8`);
//! - medium: EUC_JP, a refusal of a write whose key holds a user-defined
//!   character (LF001/LF002/LF003) reaches the client as `22P05` and is
//!   neither audited nor counted (silent loss, against "every refusal is
//!   counted");
//! - medium (availability): LATIN1, a partition with a non-ASCII name of an
//!   owner table (CREATE TABLE ... PARTITION OF, ATTACH PARTITION) or of a
//!   high-water table fails with `XX000 datums converted to &str should be
//!   valid UTF-8` (`lease._exists_as_owner(oid, text)` takes pgrx's `&str`);
//! - medium: EUC_JP with `pg_lease.audit_row` or `audit_statement` on, a
//!   stale writer keeps its refusals out of the audit by holding a
//!   user-defined character in any column or anywhere in its statement (a
//!   comment): `22P05`, no record, no count
//!   (`euc_jp_audit_row_and_statement_with_a_user_defined_character_keep_the_refusal`);
//! - medium: an EUC_JP database whose name was written by a UTF-8 session
//!   with non-ASCII characters (`…_鍵`): `CREATE EXTENSION pg_lease` fails
//!   (`22021`), and after a rename every refusal is `22021`, unaudited
//!   (`euc_jp_database_with_a_utf8_name_keeps_refusals_and_their_audit`);
//! - low (availability): EUC_JP, `lease.acquire` of a lease name, or bound to
//!   an owner key, holding a user-defined character fails with `22P05`.
//!
//! Defences that hold: an EUC_JP fenced table with an unrelated column named
//! with a user-defined character works; an accented partition of an
//! owner-mode fenced table is attached and judged in LATIN1; lease names
//! (SQL_ASCII `é`/`è`, EUC_JP NEC/JIS `√`) stay two leases, and high-water
//! marks of such keys stay two marks; client encodings LATIN1 (against
//! LATIN1 and UTF8 databases) get pg_lease's messages converted as
//! PostgreSQL's (tried with psql, not kept as a test); NAMEDATALEN-long
//! accented names (63 `é` in LATIN1) are fenced, refused, audited and guarded.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

const LATIN1: &str = "ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const EUC_JP: &str = "ENCODING 'EUC_JP' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const SQL_ASCII: &str = "ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";

/// A payout table `pay` fenced against `tables` (text keys).
const PAY: &str = "
    CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE pay (k text NOT NULL, tok bigint);
    SELECT lease.protect('pay', '{k}', 'tok');
";

/// EUC_JP NEC `√` (row 13, 0xADF5), as SQL; its JIS X 0208 twin is 0xA2E5,
/// what a UTF-8 client's `√` becomes.
const NEC_ROOT: &str = r"convert_from('\xadf5'::bytea, 'EUC_JP')";
/// An EUC_JP user-defined character (0xF5A1): no UTF-8 twin.
const UDC: &str = r"convert_from('\xf5a1'::bytea, 'EUC_JP')";
/// SQL_ASCII: the Latin-1 byte of `é` (not UTF-8) and the UTF-8 bytes of
/// U+FFFD, as SQL.
const LATIN1_E: &str = "chr(233)";
const FFFD: &str = r"convert_from('\xefbfbd'::bytea, 'SQL_ASCII')";

use pg_lease_sessions::{failure as run, must_fail as refusal, must_run as ok};

/// [`db_with`] `PAY`, resource `a` at token 5, then `extra`.
fn pay_db(label: &str, options: &str, extra: &str) -> (TestDb, Client) {
    db_with(label, options, &format!("{PAY} INSERT INTO tables VALUES ('a', 5); {extra}"))
}

/// `lease.acquire`'s token, or what it failed with.
fn acquire(c: &mut Client, sql: &str) -> Result<i64, [String; 2]> {
    c.query_one(sql, &[]).map(|r| r.get::<_, i64>(0)).map_err(|e| match e.as_db_error() {
        Some(db) => [db.code().code().to_owned(), db.message().to_owned()],
        None => [format!("no sqlstate: {e}"), String::new()],
    })
}

/// Waits (up to 15 s) until `lease.rejected_writes` holds `n` rows; how many
/// it holds then.
fn audited(c: &mut Client, n: i64) -> i64 {
    let mut got = 0;
    for _ in 0..150 {
        got = one_i64(c, "SELECT count(*) FROM lease.rejected_writes");
        if got >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    got
}

/// **Hole (critical): any writer crashes the whole server.** EUC_JP database
/// on a cluster of its own, payouts `bw (k text NOT NULL, n int NOT NULL,
/// note text DEFAULT <a user-defined character>, tok bigint)` fenced against
/// `tables`. A writer with the current token calls
/// `lease.fenced_boundary_write('bw', 5, '[{"k": "a"}]')`, leaving out `n`.
/// The INSERT's NOT NULL violation runs pg_lease's error context callback
/// (`name_null_column`), which converts the error's DETAIL (`Failing row
/// contains (a, null, <UDC>, 5)`) to UTF-8; PostgreSQL raises 22P05 inside
/// it, pgrx makes that a Rust panic with no frame to catch it, and the
/// backend aborts (`fatal runtime error: failed to initiate panic, error 5,
/// aborting`, signal 6): the postmaster terminates every backend and runs
/// crash recovery. The same with a NOT NULL column whose *name* holds such a
/// character. Expected: an error for this call only (the plain INSERT's
/// `22P05`, or `23502` naming `rows[0].n`), the other sessions and the
/// server unaffected.
#[test]
fn euc_jp_boundary_write_not_null_violation_does_not_crash_the_server() {
    let cluster = Cluster::start("att19_crash", 15196);
    let mut admin = cluster.connect();
    admin.batch_execute(&format!("CREATE DATABASE ej {EUC_JP}")).unwrap();
    let mut c = cluster.connect_db("ej");
    ok(
        &mut c,
        &format!(
            "CREATE EXTENSION pg_lease;
             CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
             INSERT INTO tables VALUES ('a', 5);
             CREATE TABLE bw (k text NOT NULL, n int NOT NULL, note text DEFAULT {UDC}, tok bigint);
             SELECT lease.protect('bw', '{{k}}', 'tok');
             DO $$ BEGIN
               EXECUTE format('CREATE TABLE bw2 (k text NOT NULL, %I int NOT NULL, tok bigint)', 'n' || {UDC});
             END $$;
             SELECT lease.protect('bw2', '{{k}}', 'tok');"
        ),
    );
    let started = one_i64(&mut admin, "SELECT extract(epoch FROM pg_postmaster_start_time())::bigint");
    // A write that fits goes in.
    ok(&mut c, r#"SELECT lease.fenced_boundary_write('bw', 5, '[{"k": "a", "n": 1}]')"#);
    for call in [
        r#"SELECT lease.fenced_boundary_write('bw', 5, '[{"k": "a"}]')"#,
        r#"SELECT lease.fenced_boundary_write('bw2', 5, '[{"k": "a"}]')"#,
    ] {
        let r = refusal(&mut c, call);
        assert!(r[0] == "22P05" || r[0] == "23502", "{call}: {r:?}");
        // The bystander session and the server are still there.
        assert_eq!(one_i64(&mut admin, "SELECT 1::bigint"), 1, "the other session was terminated by {call}");
        assert_eq!(one_i64(&mut admin, "SELECT extract(epoch FROM pg_postmaster_start_time())::bigint"), started);
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM bw"), 1);
    }
}

/// `pay` fenced against `tables`, whose rows for keys `key` and `twin` (SQL
/// expressions) are both at token 5.
fn twin_rows(key: &str, twin: &str) -> String {
    format!("{PAY} INSERT INTO tables VALUES ({key}, 5), ({twin}, 5);")
}

/// Acquires a lease bound to the owner row of `key`; then (what acquire
/// failed with, the token of `key`'s row, of `twin`'s row). Since 0.9.2 an
/// owner key with no exact UTF-8 form is refused (`22P05`): pg_lease cannot
/// name its row without taking the twin's.
fn bump_key(c: &mut Client, key: &str, twin: &str) -> (String, i64, i64) {
    let failed = acquire(c, &format!("SELECT token FROM lease.acquire('L', 'host-13', 60000, 'tables', ARRAY[{key}])"))
        .map_or_else(|e| e[0].clone(), |t| format!("acquired {t}"));
    let of = |c: &mut Client, k: &str| one_i64(c, &format!("SELECT owner_fencing_token FROM tables WHERE id = {k}"));
    let (real, other) = (of(c, key), of(c, twin));
    (failed, real, other)
}

/// **Hole (high): a stale writer keeps committing.** EUC_JP database, owner
/// table `tables` with a row for NEC `√` (0xADF5, what an SJIS/CP932 client
/// sends) and one for its JIS X 0208 twin `√` (0xA2E5, what a UTF-8 client
/// sends), both at token 5; payouts `pay` fenced against it.
/// `lease.acquire('卓', 'host-13', 60000, 'tables', ARRAY[<NEC √>])` reads
/// the key as UTF-8 and writes it back as JIS: it returns a new token but
/// writes it into the JIS row; the NEC row keeps token 5, so the previous
/// holder's INSERT with token 5 for the NEC resource commits (and without the
/// JIS row, acquire fails with `LF007` "does not exist"). Fixed in 0.9.2:
/// `acquire` refuses such a key with `22P05` (README, Limits) and writes no
/// token anywhere: both rows keep 5.
#[test]
fn euc_jp_acquire_bound_to_an_nec_key_bumps_that_row() {
    let (_db, mut c) = db_with("a19_nec_key", EUC_JP, &twin_rows(NEC_ROOT, "'√'"));
    assert_eq!(bump_key(&mut c, NEC_ROOT, "'√'"), ("22P05".to_owned(), 5, 5));
}

/// **Hole (high): a stale writer keeps committing.** SQL_ASCII database
/// (legacy data in Latin-1 bytes), owner table `tables` with a row for `é`
/// (byte 0xE9) and one for `�` (bytes EF BF BD, U+FFFD as a UTF-8 client
/// writes it), both at token 5; payouts fenced against it. `lease.acquire(...,
/// 'tables', ARRAY[chr(233)])` reads 0xE9 as U+FFFD and bumps the `�` row;
/// the `é` row keeps token 5, so the stale holder's INSERT with token 5
/// commits; every other non-UTF-8 byte (`è`, `ü`, ...) names the same `�`
/// row (without it: `LF007`). Fixed in 0.9.2: `acquire` refuses the key
/// with `22P05`; both rows keep 5.
#[test]
fn sql_ascii_acquire_bound_to_a_latin1_key_bumps_that_row() {
    let (_db, mut c) = db_with("a19_sa_key", SQL_ASCII, &twin_rows(LATIN1_E, FFFD));
    assert_eq!(bump_key(&mut c, LATIN1_E, FFFD), ("22P05".to_owned(), 5, 5));
}

/// Owner table `owner_a` (a name built from SQL `a`) and a look-alike
/// `owner_b`, each with row `x` at token 5; `pay` fenced against `owner_a`.
fn look_alike(a: &str, b: &str) -> String {
    format!(
        "DO $$ BEGIN
           EXECUTE format('CREATE TABLE %I (id text PRIMARY KEY, owner_fencing_token bigint)', 'own' || {a});
           EXECUTE format('CREATE TABLE %I (id text PRIMARY KEY, owner_fencing_token bigint)', 'own' || {b});
           EXECUTE format('INSERT INTO %I VALUES (''x'', 5)', 'own' || {a});
           EXECUTE format('INSERT INTO %I VALUES (''x'', 5)', 'own' || {b});
         END $$;
         CREATE FUNCTION tok(t text) RETURNS bigint LANGUAGE plpgsql AS $f$
           DECLARE v bigint;
           BEGIN EXECUTE format('SELECT owner_fencing_token FROM %I WHERE id = ''x''', t) INTO v; RETURN v; END $f$;
         CREATE TABLE pay (k text NOT NULL, tok bigint);"
    )
}

/// Protects `pay` against the owner table named `'own' || a`, then acquires
/// a lease bound to its row `x`; (what protect failed with, what acquire
/// failed with, token of `'own' || a`, token of `'own' || b`). Since 0.9.2
/// `protect` refuses an owner table whose name has no exact UTF-8 form
/// (`22P05`), so no lease can be bound to it and no token reaches the
/// look-alike.
fn bump_through_look_alike(c: &mut Client, a: &str, b: &str) -> (String, String, i64, i64) {
    let protect = run(c, &format!("SELECT lease.protect('pay', '{{k}}', 'tok', format('%I', 'own' || {a})::regclass)"))
        .map_or_else(|| "protected".to_owned(), |r| r[0].clone());
    let acquired = acquire(
        c,
        &format!(
            "SELECT token FROM lease.acquire('L', 'host-13', 60000, format('%I', 'own' || {a})::regclass, '{{x}}')"
        ),
    )
    .map_or_else(|e| e[0].clone(), |t| format!("acquired {t}"));
    let real = one_i64(c, &format!("SELECT tok('own' || {a})"));
    let fake = one_i64(c, &format!("SELECT tok('own' || {b})"));
    (protect, acquired, real, fake)
}

/// **Hole (high): a stale writer keeps committing.** SQL_ASCII database,
/// owner table `"own\xE9"` (a Latin-1 `é`), payouts fenced against it. A
/// role that may create tables in the schema creates `"own�"` (EF BF BD)
/// with the same columns and row. `lease.acquire(..., '"own\xE9"', '{x}')`
/// builds its owner-row UPDATE from the name read as UTF-8 (`own�`) and
/// writes the new token into the look-alike; the real row keeps token 5 and
/// the previous holder's INSERT with token 5 commits (without the look-alike:
/// `42P01`). Fixed in 0.9.2: `protect` refuses the owner table (`22P05`),
/// `acquire` cannot bind to it (`55000`, not an owner table), and neither
/// table's token moves.
#[test]
fn sql_ascii_acquire_bound_to_a_latin1_owner_table_fences_the_stale_writer() {
    let (_db, mut c) = db_with("a19_sa_table", SQL_ASCII, &look_alike(LATIN1_E, FFFD));
    let got = bump_through_look_alike(&mut c, LATIN1_E, FFFD);
    assert_eq!(got, ("22P05".to_owned(), "55000".to_owned(), 5, 5));
}

/// **Hole (high): a stale writer keeps committing.** EUC_JP database, owner
/// table `"own√"` with NEC `√` (0xADF5, as an SJIS/CP932 client names it),
/// and another `"own√"` with the JIS twin (0xA2E5, as a UTF-8 client names
/// it). `lease.acquire` bound to a row of the NEC table writes the new token
/// into the JIS one; the stale holder's INSERT with token 5 commits.
/// Fixed in 0.9.2: `protect` refuses the NEC-named owner table (`22P05`)
/// and no token moves.
#[test]
fn euc_jp_acquire_bound_to_an_nec_owner_table_fences_the_stale_writer() {
    let (_db, mut c) = db_with("a19_nec_table", EUC_JP, &look_alike(NEC_ROOT, "'√'"));
    let got = bump_through_look_alike(&mut c, NEC_ROOT, "'√'");
    assert_eq!(got, ("22P05".to_owned(), "55000".to_owned(), 5, 5));
}

/// **Hole (high, availability).** SQL_ASCII database, a partitioned owner
/// table `"po\xE9"` (a Latin-1 `é`), payouts `pp` fenced against it: every
/// write to `pp`, with the current token too, fails with `42P01 relation
/// "public.po�" does not exist` (the fence's saved lookup plan for a
/// partitioned owner table is SQL built from the name read as U+FFFD). The
/// same in EUC_JP with a NEC `√` (0xADF5) in the name: `42P01 relation
/// "public.po鐃緒申" does not exist` (mojibake of U+FFFD in the message too;
/// a JIS name such as `"所有"` works, and so does LATIN1 `"pé"`).
/// Fixed in 0.9.2 by refusing such an owner table in `protect` (`22P05`,
/// README Limits), before any write depends on it; renaming a table fenced
/// first to such a name is refused by the DDL guard (`LF008`, since session
/// 12: it failed closed before, every write `22P05`).
#[test]
fn writes_fenced_against_a_partitioned_owner_table_whose_name_converts_alike_are_judged() {
    for (label, encoding, char) in [("a19_sa_parted", SQL_ASCII, LATIN1_E), ("a19_ej_parted", EUC_JP, NEC_ROOT)] {
        let (_db, mut c) = db_with(
            label,
            encoding,
            &format!(
                "DO $$ BEGIN
                   EXECUTE format('CREATE TABLE %I (id text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (id)', 'po' || {char});
                   EXECUTE format('CREATE TABLE po_a PARTITION OF %I FOR VALUES IN (''a'')', 'po' || {char});
                   CREATE TABLE pp (k text NOT NULL, tok bigint);
                   EXECUTE format('INSERT INTO %I VALUES (''a'', 5)', 'po' || {char});
                 END $$;"
            ),
        );
        let protect =
            run(&mut c, &format!("SELECT lease.protect('pp', '{{k}}', 'tok', format('%I', 'po' || {char})::regclass)"));
        assert_eq!(protect.map(|r| r[0].clone()).as_deref(), Some("22P05"), "{label}");
        // Fenced under an ASCII name, then renamed to one with no exact UTF-8 form.
        ok(
            &mut c,
            "CREATE TABLE po2 (id text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (id);
             CREATE TABLE po2_a PARTITION OF po2 FOR VALUES IN ('a');
             INSERT INTO po2 VALUES ('a', 5);
             SELECT lease.protect('pp', '{k}', 'tok', 'po2');
             INSERT INTO pp VALUES ('a', 5);",
        );
        let rename = run(
            &mut c,
            &format!("DO $$ BEGIN EXECUTE format('ALTER TABLE po2 RENAME TO %I', 'po' || {char} || '2'); END $$"),
        );
        let current = run(&mut c, "INSERT INTO pp VALUES ('a', 5)").map(|r| r[0].clone());
        let stale = run(&mut c, "INSERT INTO pp VALUES ('a', 4)").map(|r| r[0].clone());
        assert_eq!(
            (rename.map(|r| r[0].clone()).as_deref(), current.as_deref(), stale.as_deref()),
            (Some("LF008"), None, Some("LF001")),
            "{label}"
        );
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pp"), 2, "{label}");
    }
}

/// **Hole (high): the fence guards another column than the one named.**
/// SQL_ASCII database, payouts whose key column is `"cl\xE9"` (a Latin-1
/// `é`), with a second text column `"cl�"` (EF BF BD) beside it.
/// `lease.protect(..., key_columns => ARRAY['cl' || chr(233)], ...)` reads the
/// name as U+FFFD and registers `"cl�"` (`lease.protected.key_columns`), so
/// the fence judges a row by the look-alike column: a stale writer for
/// resource `a` (token 5 now) commits with token 9 by putting `b` (token 9)
/// in `"cl�"`. Without the look-alike, `protect` fails with `LF008 ... key
/// column "cl�" of ... is missing` (and the same for a token column
/// `"jet\xE9"`). The same in EUC_JP with a NEC `√` (0xADF5) in the column
/// name and its JIS twin (0xA2E5) in the look-alike's. Fixed in 0.9.2:
/// each protect is refused (`22P05`): pg_lease could not name the column it
/// was given without naming the look-alike.
#[test]
fn protect_with_a_key_column_that_converts_alike_fences_that_column() {
    for (label, encoding, char, twin) in
        [("a19_sa_column", SQL_ASCII, LATIN1_E, FFFD), ("a19_ej_column", EUC_JP, NEC_ROOT, "'√'")]
    {
        let (_db, mut c) = db_with(
            label,
            encoding,
            &format!(
                "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
                 INSERT INTO tables VALUES ('a', 5), ('b', 9);
                 DO $$ BEGIN
                   EXECUTE format('CREATE TABLE pay (%I text NOT NULL, tok bigint)', 'cl' || {char});
                   EXECUTE format('CREATE TABLE pay2 (k text NOT NULL, %I bigint)', 'jet' || {char});
                   EXECUTE format('CREATE TABLE pay3 (%I text NOT NULL, %I text, tok bigint)', 'cl' || {char}, 'cl' || {twin});
                 END $$;"
            ),
        );
        for sql in [
            format!("SELECT lease.protect('pay', ARRAY['cl' || {char}], 'tok')"),
            format!("SELECT lease.protect('pay2', '{{k}}', 'jet' || {char})"),
            format!("SELECT lease.protect('pay3', ARRAY['cl' || {char}], 'tok')"),
        ] {
            assert_eq!(refusal(&mut c, &sql)[0], "22P05", "{label}: {sql}");
        }
        assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected"), 0, "{label}");
    }
}

/// **Defence holds.** EUC_JP database: a fenced table with an unrelated
/// column whose name holds a user-defined character (0xF5A1, no UTF-8 twin)
/// is protected, judged (current token accepted, stale `LF001`), written by
/// `fenced_boundary_write`, altered (ADD / retype / RENAME of other columns
/// and of that one) and listed by `lease.protected_tables`.
#[test]
fn euc_jp_fenced_table_with_an_unrelated_user_defined_character_column() {
    let (_db, mut c) = pay_db(
        "a19_udc_column",
        EUC_JP,
        &format!("DO $$ BEGIN EXECUTE format('ALTER TABLE pay ADD COLUMN %I text', 'memo' || {UDC}); END $$;"),
    );
    ok(&mut c, "INSERT INTO pay VALUES ('a', 5)");
    assert_eq!(refusal(&mut c, "INSERT INTO pay VALUES ('a', 4)")[0], "LF001");
    ok(&mut c, r#"SELECT lease.fenced_boundary_write('pay', 5, '[{"k": "a"}]')"#);
    ok(
        &mut c,
        &format!(
            "ALTER TABLE pay ADD COLUMN z int; ALTER TABLE pay ALTER COLUMN z TYPE bigint;
             DO $$ BEGIN EXECUTE format('ALTER TABLE pay RENAME COLUMN %I TO memo', 'memo' || {UDC}); END $$;"
        ),
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.protected_tables WHERE table_name::text = 'pay'"), 1);
}

/// **Defence holds.** High-water marks are kept per stored key: in SQL_ASCII
/// `é` (0xE9) and `è` (0xE8), in EUC_JP NEC `√` (0xADF5) and JIS `√`
/// (0xA2E5), are two resources (a mark of 10 on one does not refuse token 3
/// on the other), and each refuses a token below its own mark.
#[test]
fn high_water_marks_of_keys_that_convert_alike_stay_apart() {
    for (label, encoding, one, other) in
        [("a19_hw_sa", SQL_ASCII, LATIN1_E, "chr(232)"), ("a19_hw_ej", EUC_JP, NEC_ROOT, "'√'")]
    {
        let (_db, mut c) = db_with(
            label,
            encoding,
            "CREATE TABLE hw (k text NOT NULL, tok bigint); SELECT lease.protect_high_water('hw', '{k}', 'tok');",
        );
        ok(&mut c, &format!("INSERT INTO hw VALUES ({one}, 10)"));
        ok(&mut c, &format!("INSERT INTO hw VALUES ({other}, 3)"));
        assert_eq!(refusal(&mut c, &format!("INSERT INTO hw VALUES ({one}, 9)"))[0], "LF001", "{label}");
        assert_eq!(refusal(&mut c, &format!("INSERT INTO hw VALUES ({other}, 2)"))[0], "LF001", "{label}");
    }
}

/// **Hole (medium): two resources audited as one.** EUC_JP database, owner
/// rows for NEC `√` (0xADF5) and JIS `√` (0xA2E5), two distinct keys, both
/// at token 5. A stale write (token 4) for each is refused (`LF001`), but
/// both are recorded in `lease.rejected_writes` with the JIS key: the NEC
/// resource is audited as the other one (the record's text goes through
/// UTF-8; README promises names and keys "as they are stored", and only
/// characters the audit database cannot hold become `?`). Fixed in 0.9.2:
/// a character with no exact UTF-8 form is recorded as its bytes written
/// out: `(k)=(\xadf5)` and `(k)=(√)`, told apart (README, audit).
#[test]
fn euc_jp_audit_keeps_nec_and_jis_resources_apart() {
    let (_db, mut c) = db_with("a19_nec_audit", EUC_JP, &twin_rows(NEC_ROOT, "'√'"));
    assert_eq!(refusal(&mut c, &format!("INSERT INTO pay VALUES ({NEC_ROOT}, 4)"))[0], "LF001");
    assert_eq!(refusal(&mut c, "INSERT INTO pay VALUES ('√', 4)")[0], "LF001");
    assert_eq!(audited(&mut c, 2), 2);
    let sql = "SELECT string_agg(encode(convert_to(resource_key, 'EUC_JP'), 'hex'), ' ' ORDER BY id)
                 FROM lease.rejected_writes";
    let keys: String = c.query_one(sql, &[]).unwrap().get(0);
    // "(k)=(\xadf5)" and "(k)=(" JIS √ ")".
    assert_eq!(keys, "286b293d285c786164663529 286b293d28a2e529");
}

/// **Hole (medium): silent data corruption.** SQL_ASCII database, payouts
/// `p (k, "n\xE9" text, "n�" text, note text, tok)` fenced against
/// `tables`. README (Limits) says `fenced_boundary_write` refuses "SQL_ASCII
/// bytes that are not UTF-8"; instead it reads them as U+FFFD and commits:
/// `{"k": "a", "note": "v\xE9"}` stores `note` = `v�` (EF BF BD), and
/// `{"k": "a", "n\xE9": "w"}` (or `"n\xE8"`) writes `w` into the other
/// column `"n�"`. Expected: each call refused (nothing written), as README
/// says, or the bytes stored as sent into the column named.
#[test]
fn sql_ascii_boundary_write_refuses_bytes_that_are_not_utf8() {
    let (_db, mut c) = pay_db(
        "a19_sa_bw",
        SQL_ASCII,
        &format!(
            "DO $$ BEGIN
               EXECUTE format('ALTER TABLE pay ADD COLUMN %I text, ADD COLUMN %I text, ADD COLUMN note text',
                              'n' || {LATIN1_E}, 'n' || {FFFD});
             END $$;"
        ),
    );
    let mut written = vec![];
    for rows in [
        format!(r#"'[{{"k": "a", "note": "v' || {LATIN1_E} || '"}}]'"#),
        format!(r#"'[{{"k": "a", "n' || {LATIN1_E} || '": "w"}}]'"#),
    ] {
        let call = format!("SELECT lease.fenced_boundary_write('pay', 5, ({rows})::jsonb)");
        if run(&mut c, &call).is_none() {
            written.push(call);
        }
    }
    let mangled =
        one_i64(&mut c, &format!("SELECT count(*) FROM pay WHERE note = 'v' || {FFFD} OR \"n\u{FFFD}\" IS NOT NULL"));
    assert_eq!((written, mangled), (Vec::<String>::new(), 0));
}

/// **Hole (medium): refusals lose their code and their audit.** EUC_JP
/// database, owner row for a key holding a user-defined character (0xF5A1,
/// no UTF-8 twin) at token 5. A stale write (token 4), one ahead (6) and one
/// without a token, for that key, are each refused with `22P05 character
/// with byte sequence 0xf5 0xa1 in encoding "EUC_JP" has no equivalent in
/// encoding "UTF8"` (the refusal's text is converted to UTF-8 while it is
/// built) instead of `LF001`/`LF002`/`LF003`: a client that freezes on LF001
/// retries; and none reaches `lease.rejected_writes` or `lease.stats`
/// (`refused` stays 0), against "every refusal is counted". The write with
/// the current token is accepted. Expected: the LF codes, three audit rows
/// and `refused = 3`.
#[test]
fn euc_jp_refusals_for_a_key_without_a_utf8_twin_keep_their_codes_and_are_audited() {
    let (_db, mut c) = db_with("a19_udc", EUC_JP, &format!("{PAY} INSERT INTO tables VALUES ({UDC}, 5);"));
    ok(&mut c, &format!("INSERT INTO pay VALUES ({UDC}, 5)"));
    let codes: Vec<String> = ["4", "6", "NULL"]
        .iter()
        .map(|t| refusal(&mut c, &format!("INSERT INTO pay VALUES ({UDC}, {t})"))[0].clone())
        .collect();
    assert_eq!(codes, ["LF001", "LF002", "LF003"]);
    assert_eq!(audited(&mut c, 3), 3);
    assert_eq!(
        one_i64(
            &mut c,
            "SELECT refused FROM lease.stats WHERE database = current_database() AND table_name = 'public.pay'"
        ),
        3
    );
}

/// Runs `script` (bytes in EUC_JP) with psql as an EUC_JP client
/// (`PGCLIENTENCODING=EUC_JP`, as a Japanese application connects) in `db`;
/// its stderr.
fn psql_euc_jp(db: &TestDb, script: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(pg_bin("psql"))
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &port().to_string(), "-U", "postgres", "-d", &db.name])
        .env("PGCLIENTENCODING", "EUC_JP")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    child.stdin.take().expect("stdin").write_all(script).expect("script");
    let out = child.wait_with_output().expect("psql");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// **Hole (medium): a stale writer escapes the audit.** EUC_JP database,
/// `pg_lease.audit_row` / `pg_lease.audit_statement` on (a DBA's choice).
/// A stale write (token 4, current 5, ASCII key `a`) whose row holds a
/// user-defined character (0xF5A1) in any other column, or whose statement
/// holds one anywhere (a trailing `-- <UDC>` comment, sent by an EUC_JP
/// client), is refused with `22P05 character with byte sequence 0xf5 0xa1 in
/// encoding "EUC_JP" has no equivalent in encoding "UTF8"` instead of
/// `LF001`, and is neither audited nor counted: the row's JSON and the
/// statement are converted to UTF-8 while the refusal is built. Any writer
/// can so keep its stale writes out of `lease.rejected_writes`. Expected:
/// `LF001` for both, two audit rows (`?` or U+FFFD for the character, as
/// README says of characters the audit cannot hold).
#[test]
fn euc_jp_audit_row_and_statement_with_a_user_defined_character_keep_the_refusal() {
    let (db, mut c) = pay_db("a19_udc_audit", EUC_JP, "ALTER TABLE pay ADD COLUMN note text;");
    let row = refusal(&mut c, &format!("SET pg_lease.audit_row = on; INSERT INTO pay VALUES ('a', 4, {UDC})"));
    let mut script = b"SET pg_lease.audit_statement = on;\nINSERT INTO pay VALUES ('a', 4, 'x') -- ".to_vec();
    script.extend_from_slice(b"\xf5\xa1\n;\n");
    let statement = psql_euc_jp(&db, &script);
    assert_eq!(row[0], "LF001", "{row:?}");
    assert!(statement.contains("StaleOwnerBoundaryWrite"), "{statement}");
    assert_eq!(audited(&mut c, 2), 2);
}

/// A database of this test's own named `name` (non-ASCII), dropped on drop.
struct NamedDb(String);

impl Drop for NamedDb {
    fn drop(&mut self) {
        let _ = connect_to("postgres", "postgres")
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.0));
    }
}

/// **Hole (medium): refusals lose their code and their audit, by the
/// database's name.** An EUC_JP database named `…_鍵` from a UTF-8 session
/// (the cluster stores database names as the creating session's database
/// wrote them: here UTF-8 bytes E9 8D B5, not valid EUC_JP; PostgreSQL itself
/// runs such a database). pg_lease converts the name as EUC_JP: `CREATE
/// EXTENSION pg_lease` there fails with `22021 invalid byte sequence for
/// encoding "EUC_JP": 0xe9 0x8d` (in `lease.audit_status()`), and in a
/// database renamed so after the extension was created every stale write is
/// refused with that `22021` instead of `LF001`, and is neither audited nor
/// counted (accepted writes and `acquire` work). Expected: the extension is
/// created, the stale write is `LF001` and audited.
#[test]
fn euc_jp_database_with_a_utf8_name_keeps_refusals_and_their_audit() {
    let mut admin = connect_to("postgres", "postgres");
    let fresh = NamedDb(format!("a19_{}_鍵", std::process::id()));
    let renamed = NamedDb(format!("a19_{}_錠", std::process::id()));
    let ascii = NamedDb(format!("a19_{}_renamed", std::process::id()));
    let ascii = &ascii.0;
    admin.batch_execute(&format!("CREATE DATABASE \"{}\" {EUC_JP}", fresh.0)).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {ascii} {EUC_JP}")).unwrap();
    let created = run(&mut connect_to(&fresh.0, "postgres"), "CREATE EXTENSION pg_lease");
    connect_to(ascii, "postgres")
        .batch_execute(&format!("CREATE EXTENSION pg_lease; {PAY} INSERT INTO tables VALUES ('a', 5);"))
        .unwrap();
    admin.batch_execute(&format!("ALTER DATABASE {ascii} RENAME TO \"{}\"", renamed.0)).unwrap();
    let mut c = connect_to(&renamed.0, "postgres");
    ok(&mut c, "INSERT INTO pay VALUES ('a', 5)");
    let stale = refusal(&mut c, "INSERT INTO pay VALUES ('a', 4)");
    assert_eq!((created, stale[0].as_str()), (None, "LF001"), "{stale:?}");
    assert_eq!(audited(&mut c, 1), 1);
}

/// **Hole (low, availability).** EUC_JP database: `lease.acquire` of a
/// lease whose name holds a user-defined character (0xF5A1), or bound to an
/// owner row whose key holds one, fails with `22P05 character with byte
/// sequence 0xf5 0xa1 in encoding "EUC_JP" has no equivalent in encoding
/// "UTF8"` (README's Limits name only `fenced_boundary_write` for such
/// characters). Fixed in 0.9.2: lease names are compared as stored, so such
/// a lease is acquired (and shown with the character as `\xf5a1`); an
/// owner key with one is refused with pg_lease's own `22P05` (README,
/// Limits), the row's token unchanged.
#[test]
fn euc_jp_acquire_with_a_user_defined_character() {
    let (_db, mut c) = db_with("a19_udc_lease", EUC_JP, &format!("{PAY} INSERT INTO tables VALUES ({UDC}, 5);"));
    let named = acquire(&mut c, &format!("SELECT token FROM lease.acquire('u' || {UDC}, 'host-1', 60000)"));
    assert!(named.is_ok(), "{named:?}");
    let bound =
        acquire(&mut c, &format!("SELECT token FROM lease.acquire('uu', 'host-1', 60000, 'tables', ARRAY[{UDC}])"));
    let [code, message] = bound.expect_err("an owner key with no exact UTF-8 form");
    assert_eq!(code, "22P05");
    assert!(message.contains("\\xf5a1") && message.contains("no exact UTF-8 form"), "{message}");
    assert_eq!(one_i64(&mut c, &format!("SELECT owner_fencing_token FROM tables WHERE id = {UDC}")), 5);
}

/// **Hole (medium, availability).** LATIN1 database, an owner table
/// partitioned by key and a high-water table partitioned by key, both
/// fenced. `CREATE TABLE "propriés" PARTITION OF owners ...`, `ALTER TABLE
/// owners ATTACH PARTITION "propriés2" ...` and `ALTER TABLE hw ATTACH
/// PARTITION "hwé" ...` (empty) fail with `XX000 datums converted to &str
/// should be valid UTF-8, database encoding is only UTF-8 compatible for
/// ASCII` and a PL/pgSQL CONTEXT (`lease._guard_ddl`: the query it hands
/// `lease._exists_as_owner(oid, text)`, which takes pgrx's `&str`, names the
/// partition). Expected: each partition is created or attached, as with an
/// ASCII name, and a stale write through the partitioned owner's fence is
/// `LF001`.
#[test]
fn latin1_accented_partitions_of_owner_and_high_water_tables() {
    let (_db, mut c) = db_with(
        "a19_parts",
        LATIN1,
        "CREATE TABLE owners (id text PRIMARY KEY, owner_fencing_token bigint) PARTITION BY LIST (id);
         CREATE TABLE owners_a PARTITION OF owners FOR VALUES IN ('a');
         CREATE TABLE pay (k text NOT NULL, tok bigint);
         SELECT lease.protect('pay', '{k}', 'tok', 'owners');
         CREATE TABLE hw (k text NOT NULL, tok bigint) PARTITION BY LIST (k);
         SELECT lease.protect_high_water('hw', '{k}', 'tok');
         CREATE TABLE \"propriés2\" (id text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE \"hwé\" (k text NOT NULL, tok bigint);",
    );
    let mut failed = vec![];
    for ddl in [
        "CREATE TABLE \"propriés\" PARTITION OF owners FOR VALUES IN ('é')",
        "ALTER TABLE owners ATTACH PARTITION \"propriés2\" FOR VALUES IN ('è')",
        "ALTER TABLE hw ATTACH PARTITION \"hwé\" FOR VALUES IN ('é')",
    ] {
        if let Some(r) = run(&mut c, ddl) {
            failed.push(format!("{ddl}: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
    ok(&mut c, "INSERT INTO owners VALUES ('é', 5)");
    assert_eq!(refusal(&mut c, "INSERT INTO pay VALUES ('é', 4)")[0], "LF001");
}

/// **Defence holds.** LATIN1 database: an accented partition `"payé"` of an
/// owner-mode fenced table (with a token column) is attached (its rows are
/// checked with `lease._key_match`, not `_exists_as_owner`), and a stale
/// write through it is `LF001`, the current token accepted.
#[test]
fn latin1_accented_partition_of_a_fenced_table_is_judged() {
    let (_db, mut c) = db_with(
        "a19_fenced_part",
        LATIN1,
        "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES ('é', 5);
         CREATE TABLE pay (k text NOT NULL, tok bigint) PARTITION BY LIST (k);
         SELECT lease.protect('pay', '{k}', 'tok');
         CREATE TABLE \"payé\" (k text NOT NULL, tok bigint);",
    );
    // In a transaction of its own: one that also protected the table would
    // commit the partition before its guards (LF008, whatever the names).
    ok(&mut c, "ALTER TABLE pay ATTACH PARTITION \"payé\" FOR VALUES IN ('é')");
    ok(&mut c, "INSERT INTO pay VALUES ('é', 5)");
    let r = refusal(&mut c, "INSERT INTO \"payé\" VALUES ('é', 4)");
    assert_eq!(r[0], "LF001", "{r:?}");
    assert!(r[1].contains("(k)=(é)"), "{r:?}");
}

/// **Defence holds.** Lease names that differ only in a character that
/// converts alike are two leases (stored as given): in SQL_ASCII `é` (0xE9)
/// and `è` (0xE8), in EUC_JP NEC `√` (0xADF5) and JIS `√` (0xA2E5). Two
/// owners each take theirs, and each renews it.
#[test]
fn lease_names_that_convert_alike_are_two_leases() {
    for (label, encoding, one, other) in
        [("a19_sa_names", SQL_ASCII, LATIN1_E, "chr(232)"), ("a19_ej_names", EUC_JP, NEC_ROOT, "'√'")]
    {
        let (_db, mut c) = db_with(label, encoding, "");
        let a =
            acquire(&mut c, &format!("SELECT token FROM lease.acquire('t' || {one}, 'host-1', 60000)")).expect(label);
        let b =
            acquire(&mut c, &format!("SELECT token FROM lease.acquire('t' || {other}, 'host-2', 60000)")).expect(label);
        assert_ne!(a, b);
        ok(&mut c, &format!("SELECT lease.renew('t' || {one}, 'host-1', {a}, 60000)"));
        ok(&mut c, &format!("SELECT lease.renew('t' || {other}, 'host-2', {b}, 60000)"));
        assert_eq!(one_i64(&mut c, "SELECT count(DISTINCT name) FROM lease.leases"), 2, "{label}");
    }
}
