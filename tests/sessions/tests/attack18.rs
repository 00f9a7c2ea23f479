//! Attack review 18: pg_lease in databases whose encoding is not UTF-8
//! (LATIN1, WIN1251, EUC_JP, SQL_ASCII) and with non-ASCII names, over real
//! connections (client_encoding UTF8, as the Rust client always uses).
//! Expected everywhere: everything works as in a UTF-8 database, and every
//! name and key is shown exactly as stored.
//!
//! The root cause of most holes: pg_lease reads names and key texts from
//! Postgres as UTF-8 with replacement (`pg::owned`, `to_string_lossy`), so in
//! a LATIN1 database `é` (byte 0xE9) becomes U+FFFD, whose UTF-8 bytes
//! (EF BF BD) are then taken as LATIN1 again (`ï¿½`) wherever the string goes
//! back to Postgres: error texts, audit rows, and SQL pg_lease builds itself.
//!
//! Tests marked **Hole** fail against debe8e6 and pass since 0.9.2 (text read
//! and written in the database's encoding: `pg::from_server`, `to_server`,
//! `ServerText`); those marked **Defence holds** pass and document what was
//! tried. Holes, most severe first:
//!
//! - high: LATIN1, an owner table with a non-ASCII name (`"tablés"`): the
//!   owner lookups and `lease.acquire`'s owner-row bump are SQL built from the
//!   mangled name `public."tablï¿½s"`. A role that may create tables in that
//!   schema creates a look-alike table under the mangled name: `acquire`
//!   then writes the new token into the look-alike, the real owner row keeps
//!   the old token, and the stale writer's payouts keep committing
//!   (`latin1_acquire_bound_to_an_accented_owner_table_fences_the_stale_writer`);
//! - high (availability): without a look-alike, every write to a table
//!   fenced against such an owner table (LATIN1 `"tablés"`, an owner table
//!   in schema `"jeu_é"`, EUC_JP `"所有者"`), and every `acquire` bound to
//!   its rows, fails with `42P01 relation "public.tablï¿½s" does not exist`;
//!   with an owner key column `"clé"` (accepted by `protect`), inserting an
//!   owner row is `LF008` ("column "clï¿½" ... no longer exists"), and every
//!   fenced write and bound acquire `42703`;
//! - medium: EUC_JP, refusals whose message holds a name or key that does
//!   not survive the round trip are reported as `22021 invalid byte sequence
//!   for encoding "EUC_JP"` instead of their code: a stale write (`LF001`),
//!   `acquire` of a held lease (`LF005`), `renew` of a lost one (`LF006`:
//!   the game server does not learn it must freeze), and
//!   `fenced_boundary_write`'s unknown column (`42703`);
//! - medium: EUC_JP, the audit stores invalid EUC_JP text: once a refusal
//!   names a Japanese table or key, `SELECT resource_key FROM
//!   lease.rejected_writes` and `lease.stats` fail (22021); and since
//!   `lease.stats` lists every database's tables, one refusal on `"paiés"`
//!   in a LATIN1 database breaks `SELECT * FROM lease.stats` in every EUC_JP
//!   database of the cluster (monitoring);
//! - medium (known since attack 12, documented as a limit): LATIN1 and
//!   WIN1251, distinct resources (`é`/`ü`, `стол`/`стул`) are audited under
//!   one `resource_key`; `target_table` and `lease.stats.table_name` mangled;
//!   with `pg_lease.audit_row`/`audit_statement` on, every non-ASCII
//!   character of the audited row and statement is lost (`Zoë` = `Zoé`);
//! - medium: LATIN1, `lease.protect` / `protect_high_water` with a
//!   non-ASCII token column (the fenced table's, or the owner table's) fails
//!   with XX000 (a pgrx panic: "datums converted to &str should be valid
//!   UTF-8, ...") and a CONTEXT line;
//! - low (documented as a limit): LATIN1, LF001/LF002/LF003/LF007 messages,
//!   DETAILs and the error's schema/table fields, LF005/LF006 of the lease
//!   functions, LF008 of the DDL guards, and `fenced_boundary_write`'s 42703
//!   (there `Ã©`, converted twice) show names as mojibake.
//!
//! Not tested here: the LOG line of a refusal (`pg_lease rejected write:
//! {...}`) is UTF-8 with U+FFFD for every non-ASCII character of a LATIN1
//! or EUC_JP database's names and keys (seen in the server log; `é` and
//! `ü` log as the same resource).
//!
//! Defences that hold: in LATIN1 the guards on accented owner and fenced
//! tables (LF004 for lowering, clearing, deleting, re-keying, truncating
//! owner tokens; LF008 for dropping the owner key constraint, retyping
//! fenced columns, disabling or dropping the fence trigger); in a UTF-8 database every non-ASCII name (tables,
//! columns, owner key and token columns, keys, lease names, owners) works
//! and is shown as stored; in LATIN1 the verdicts (owner mode, high-water
//! marks, lease identity, boundary writes with accented values) follow the
//! stored keys exactly; SQL_ASCII with UTF-8 names works and shows them.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

const LATIN1: &str = "ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const WIN1251: &str = "ENCODING 'WIN1251' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const EUC_JP: &str = "ENCODING 'EUC_JP' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const SQL_ASCII: &str = "ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";

/// An accented fenced table against an ASCII owner table (so that the fence
/// itself works in LATIN1): resource `é` at token 5, `ü` at token 7.
const ACCENTED_FENCED: &str = r#"
    CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE "paiés" (id bigserial PRIMARY KEY, "clé" text NOT NULL, montant int NOT NULL DEFAULT 0, jeton bigint);
    SELECT lease.protect('"paiés"', '{clé}', 'jeton', 'tables');
    INSERT INTO tables VALUES ('é', 5), ('ü', 7);
"#;

/// An accented owner table too: `"paiés"` fenced against `"tablés"`.
const ACCENTED_OWNER: &str = r#"
    CREATE TABLE "tablés" (id text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE "paiés" (id bigserial PRIMARY KEY, "clé" text NOT NULL, montant int NOT NULL DEFAULT 0, jeton bigint);
    SELECT lease.protect('"paiés"', '{clé}', 'jeton', '"tablés"');
    INSERT INTO "tablés" VALUES ('é', 5), ('ü', 7);
"#;

/// EUC_JP: payouts `"支払"` keyed by `"卓"`, resources `日本` and `東京` at
/// token 5.
const EUC_JP_PAYOUTS: &str = r#"
    CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE "支払" (id bigserial, "卓" text NOT NULL, token bigint);
    SELECT lease.protect('"支払"', '{卓}', 'token');
    INSERT INTO tables VALUES ('日本', 5), ('東京', 5);
"#;

/// What a failed statement reported.
#[derive(Debug, Default)]
struct Reported {
    code: String,
    message: String,
    detail: String,
    schema: String,
    table: String,
}

/// Runs `sql`: None when it succeeded, else what the error said.
fn run(c: &mut Client, sql: &str) -> Option<Reported> {
    match c.batch_execute(sql) {
        Ok(()) => None,
        Err(e) => Some(match e.as_db_error() {
            Some(db) => Reported {
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
                detail: db.detail().unwrap_or("").to_owned(),
                schema: db.schema().unwrap_or("").to_owned(),
                table: db.table().unwrap_or("").to_owned(),
            },
            None => Reported { code: format!("no sqlstate: {e}"), ..Reported::default() },
        }),
    }
}

/// Runs `sql`, which must fail; what it reported.
#[track_caller]
fn fails(c: &mut Client, sql: &str) -> Reported {
    run(c, sql).unwrap_or_else(|| panic!("expected an error from: {sql}"))
}

/// `other` acquires lease `name`, which another owner holds, then renews it
/// with token 1: the SQLSTATE and message of each refusal.
fn lease_conflict(c: &mut Client, name: &str, other: &str) -> ([String; 2], [String; 2]) {
    (
        refusal(c, &format!("SELECT lease.acquire('{name}', '{other}', 60000)")),
        refusal(c, &format!("SELECT lease.renew('{name}', '{other}', 1, 60000)")),
    )
}

/// A fresh database created with `options`, `setup` run in it, and a
/// connection (superuser) to it.
fn db_with(label: &str, options: &str, setup: &str) -> (TestDb, Client) {
    let db = TestDb::with_options(label, options);
    let mut c = db.connect();
    ok(&mut c, setup);
    (db, c)
}

/// Asserts the rows `sql` returns (one text column), in order.
#[track_caller]
fn expect_texts(c: &mut Client, sql: &str, expected: &[&str]) {
    assert_eq!(texts(c, sql), Ok(expected.iter().map(|e| e.to_string()).collect::<Vec<_>>()), "{sql}");
}

/// Runs `sql`, which must fail: its SQLSTATE and message.
#[track_caller]
fn refusal(c: &mut Client, sql: &str) -> [String; 2] {
    let r = fails(c, sql);
    [r.code, r.message]
}

#[track_caller]
fn ok(c: &mut Client, sql: &str) {
    if let Some(r) = run(c, sql) {
        panic!("{sql}\nfailed: {r:?}");
    }
}

fn texts(c: &mut Client, sql: &str) -> Result<Vec<String>, String> {
    c.query(sql, &[])
        .map(|rows| rows.iter().map(|r| r.get::<_, Option<String>>(0).unwrap_or_else(|| "NULL".into())).collect())
        .map_err(|e| e.as_db_error().map_or_else(|| e.to_string(), |d| format!("{}: {}", d.code().code(), d.message())))
}

/// Waits (up to 15 s) until `lease.rejected_writes` holds `n` rows.
fn wait_for_audit(c: &mut Client, n: i64) {
    for _ in 0..150 {
        if one_i64(c, "SELECT count(*) FROM lease.rejected_writes") >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the audit never recorded {n} refusals");
}

/// A role of this test's own (roles are cluster-wide), dropped with what it
/// owns before the test's database is dropped (declare it after the TestDb).
struct Role<'a> {
    db: &'a TestDb,
    name: String,
}

impl<'a> Role<'a> {
    fn create(db: &'a TestDb, suffix: &str) -> Role<'a> {
        let name = format!("{}_{suffix}", db.name);
        db.connect().batch_execute(&format!("CREATE ROLE {name} LOGIN")).unwrap();
        Role { db, name }
    }
}

impl Drop for Role<'_> {
    fn drop(&mut self) {
        let mut c = self.db.connect();
        let _ = c.batch_execute(&format!("DROP OWNED BY {0}; DROP ROLE {0}", self.name));
    }
}

/// **Hole (high): a stale writer keeps committing.** LATIN1 database, owner
/// table `"tablés"`, payouts fenced against it. A role allowed to create
/// tables in `public` (no rights on `"tablés"` or the payouts) creates
/// `"tablï¿½s"` (the UTF-8 bytes of U+FFFD read as LATIN1) with the same
/// columns and a row for `é`. `lease.acquire('table:é', ..., '"tablés"',
/// '{é}')` builds its owner-row UPDATE from the name read lossily as UTF-8,
/// `public."tablï¿½s"`: it returns a new token but writes it into the
/// look-alike; the real owner row keeps token 5, so the previous holder's
/// INSERT with token 5 commits (and the new holder's token is refused as
/// `LF002`). Expected: the new token lands in `"tablés"` and the write with
/// token 5 is `LF001`.
#[test]
fn latin1_acquire_bound_to_an_accented_owner_table_fences_the_stale_writer() {
    let db = TestDb::with_options("a18_lookalike", LATIN1);
    let intruder = Role::create(&db, "intrus");
    let mut su = db.connect();
    ok(&mut su, ACCENTED_OWNER);
    ok(&mut su, &format!("GRANT CREATE ON SCHEMA public TO {}", intruder.name));
    let mut intr = db.connect_as(&intruder.name);
    ok(
        &mut intr,
        "CREATE TABLE \"tabl\u{ef}\u{bf}\u{bd}s\" (id text PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO \"tabl\u{ef}\u{bf}\u{bd}s\" VALUES ('é', 1);",
    );
    let acquired =
        texts(&mut su, "SELECT token::text FROM lease.acquire('table:é', 'hôte-13', 60000, '\"tablés\"', '{é}')");
    let stale = run(&mut su, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5)");
    assert_eq!(
        stale.as_ref().map(|r| r.code.as_str()),
        Some("LF001"),
        "the old holder's payout with token 5 after acquire returned {acquired:?}; the owner row of \"tablés\" holds {:?}, the look-alike {:?}",
        texts(&mut su, "SELECT owner_fencing_token::text FROM \"tablés\" WHERE id = 'é'"),
        texts(&mut su, "SELECT owner_fencing_token::text FROM \"tabl\u{ef}\u{bf}\u{bd}s\""),
    );
    let token = acquired.expect("acquire")[0].clone();
    expect_texts(&mut su, "SELECT owner_fencing_token::text FROM \"tablés\" WHERE id = 'é'", &[&token]);
    expect_texts(&mut su, "SELECT owner_fencing_token::text FROM \"tabl\u{ef}\u{bf}\u{bd}s\"", &["1"]);
}

/// **Hole (high, availability).** LATIN1 database, payouts fenced against
/// the owner table `"tablés"`: every write to them, with the current token
/// too, fails with `42P01 relation "public.tablï¿½s" does not exist` (the
/// fence prepares its owner lookup from the name read lossily as UTF-8), and
/// so does their TRUNCATE (still refused, but not as LF008). Expected: the
/// write with the current token 5 commits, one with token 4 is `LF001`, and
/// TRUNCATE is `LF008`.
#[test]
fn latin1_writes_fenced_against_an_accented_owner_table_are_judged() {
    let (_db, mut c) = db_with("a18_ownerdos", LATIN1, ACCENTED_OWNER);
    let current = run(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5)");
    assert!(current.is_none(), "a payout with the current token: {current:?}");
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 4)").code, "LF001");
    assert_eq!(
        run(&mut c, "SELECT lease.fenced_boundary_write('\"paiés\"', 7, '[{\"clé\": \"ü\", \"montant\": 3}]')")
            .map(|r| r.code),
        None
    );
    assert_eq!(try_sql(&mut c, "TRUNCATE \"paiés\""), "LF008");
}

/// **Hole (high, availability).** LATIN1 database: `lease.acquire` bound to
/// a row of the owner table `"tablés"` fails with `42P01 relation
/// "public.tablï¿½s" does not exist`. Expected: a token, written into the
/// owner row.
#[test]
fn latin1_acquire_bound_to_an_accented_owner_table_succeeds() {
    let (_db, mut c) = db_with("a18_ownacq", LATIN1, ACCENTED_OWNER);
    let token =
        texts(&mut c, "SELECT token::text FROM lease.acquire('table:é', 'hôte-13', 60000, '\"tablés\"', '{é}')");
    let row = texts(&mut c, "SELECT owner_fencing_token::text FROM \"tablés\" WHERE id = 'é'").unwrap();
    assert_eq!(token.as_ref().ok(), Some(&row), "acquire returned {token:?}; the owner row holds {row:?}");
}

/// **Hole (medium): protect panics.** LATIN1 database: protecting with a
/// non-ASCII token column fails with `XX000 datums converted to &str should
/// be valid UTF-8, database encoding is only UTF-8 compatible for ASCII` (a
/// pgrx panic reading `lease.protected` in `lease._register`) and a CONTEXT
/// line: an owner token column `"jeton_é"` (`lease.protect(...,
/// owner_token_column => 'jeton_é')`), a fenced table's token column
/// `"jeton_é"`, and a high-water table's. Expected: each protected, as in a
/// UTF-8 database, and a stale write `LF001`.
#[test]
fn latin1_protect_with_accented_token_columns() {
    let (_db, mut c) = db_with(
        "a18_tokcols",
        LATIN1,
        r#"CREATE TABLE proprios (id text PRIMARY KEY, "jeton_é" bigint);
           CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE "paiés" ("clé" text NOT NULL, jeton bigint);
           CREATE TABLE mises ("clé" text NOT NULL, "jeton_é" bigint);
           CREATE TABLE puits ("clé" text NOT NULL, "jeton_é" bigint);
           INSERT INTO proprios VALUES ('é', 5);
           INSERT INTO tables VALUES ('é', 5);"#,
    );
    let protects = [
        "SELECT lease.protect('\"paiés\"', '{clé}', 'jeton', 'proprios', '{id}', 'jeton_é')",
        "SELECT lease.protect('mises', '{clé}', 'jeton_é', 'tables')",
        "SELECT lease.protect_high_water('puits', '{clé}', 'jeton_é')",
    ];
    let results: Vec<Option<Reported>> = protects.iter().map(|sql| run(&mut c, sql)).collect();
    assert!(results.iter().all(Option::is_none), "{results:?}");
    ok(
        &mut c,
        "INSERT INTO \"paiés\" VALUES ('é', 5); INSERT INTO mises VALUES ('é', 5); INSERT INTO puits VALUES ('é', 5)",
    );
    for table in ["\"paiés\"", "mises", "puits"] {
        assert_eq!(fails(&mut c, &format!("INSERT INTO {table} VALUES ('é', 4)")).code, "LF001", "{table}");
    }
}

/// **Hole (high, availability).** LATIN1 database: an owner table whose key
/// column is `"clé"` is accepted by `lease.protect(..., owner_key_columns
/// => '{clé}')`, but then inserting an owner row fails with `LF008
/// FenceTampering: the fence on public.proprios is inconsistent` (DETAIL
/// `column "clï¿½" of public.proprios no longer exists`), every write to the
/// fenced table and every bound `acquire` with `42703 column o.clï¿½ does
/// not exist`. Expected: the owner row is inserted, the write with the
/// current token commits, a stale one is `LF001`, acquire bumps the row.
#[test]
fn latin1_owner_key_column_with_an_accent() {
    let (_db, mut c) = db_with(
        "a18_ownkey",
        LATIN1,
        r#"CREATE TABLE proprios ("clé" text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE paie (k text NOT NULL, jeton bigint);
           SELECT lease.protect('paie', '{k}', 'jeton', 'proprios', '{clé}');"#,
    );
    let owner_row = run(&mut c, "INSERT INTO proprios VALUES ('é', 5)");
    assert!(owner_row.is_none(), "inserting an owner row: {owner_row:?}");
    let write = run(&mut c, "INSERT INTO paie VALUES ('é', 5)");
    assert!(write.is_none(), "a write with the current token: {write:?}");
    assert_eq!(fails(&mut c, "INSERT INTO paie VALUES ('é', 4)").code, "LF001");
    let token = texts(&mut c, "SELECT token::text FROM lease.acquire('t:é', 'hôte', 60000, 'proprios', '{é}')");
    assert_eq!(token, texts(&mut c, "SELECT owner_fencing_token::text FROM proprios"));
}

/// **Hole (medium): unreadable audit.** EUC_JP database, payouts table
/// `"支払"` keyed by `"卓"`. After a refusal for resource `東京`, `SELECT
/// resource_key FROM lease.rejected_writes` and `SELECT table_name FROM
/// lease.stats` fail with `22021 invalid byte sequence for encoding
/// "EUC_JP"`: the audit stored the key and table name as UTF-8 with
/// replacement characters, bytes that are not valid EUC_JP. Every reader of
/// the audit and the stats in that database (monitoring included) fails.
/// Expected: `("卓")=(東京)` and `public."支払"`.
#[test]
fn euc_jp_audit_and_stats_stay_readable() {
    let (_db, mut c) = db_with("a18_eucaudit", EUC_JP, EUC_JP_PAYOUTS);
    // Refused, whatever SQLSTATE it is reported with (see the next test).
    let _ = fails(&mut c, "INSERT INTO \"支払\" (\"卓\", token) VALUES ('東京', 4)");
    wait_for_audit(&mut c, 1);
    expect_texts(
        &mut c,
        "SELECT resource_key || ' ' || target_table FROM lease.rejected_writes",
        &["(\"卓\")=(東京) public.\"支払\""],
    );
    expect_texts(
        &mut c,
        "SELECT table_name FROM lease.stats WHERE database = current_database()",
        &["public.\"支払\""],
    );
}

/// **Hole (medium): one database breaks another's monitoring.**
/// `lease.stats` lists every database's fenced tables. After a refusal on
/// `"paiés"` in a LATIN1 database (its name kept as `pai` U+FFFD `s` in
/// UTF-8), `SELECT database, table_name FROM lease.stats` in an EUC_JP
/// database of the same cluster fails with `22021 invalid byte sequence
/// for encoding "EUC_JP"`, for whoever reads it there (the metrics
/// exporter). Expected: the query works and shows that row's table as
/// `public."paiés"`.
#[test]
fn euc_jp_stats_survive_another_databases_accented_names() {
    let latin = TestDb::with_options("a18_statslatin", LATIN1);
    let mut l = latin.connect();
    ok(&mut l, ACCENTED_FENCED);
    assert_eq!(fails(&mut l, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 4)").code, "LF001");
    let euc = TestDb::with_options("a18_statseuc", EUC_JP);
    let mut e = euc.connect();
    expect_texts(
        &mut e,
        &format!("SELECT table_name FROM lease.stats WHERE database = '{}'", latin.name),
        &["public.\"paiés\""],
    );
    let all = texts(&mut e, "SELECT database || ' ' || table_name FROM lease.stats");
    assert!(all.is_ok(), "lease.stats read in an EUC_JP database: {all:?}");
}

/// **Hole (medium): the LF code is lost.** EUC_JP database: a stale write
/// for resource `東京` is refused, but the client receives `22021 invalid
/// byte sequence for encoding "EUC_JP": 0xbd 0x29` instead of `LF001`: the
/// message holds the key as UTF-8 with replacement characters, which the
/// server cannot convert from EUC_JP for the client. A client that freezes
/// on LF001 (and retries other errors) retries. (For `日本` the bytes
/// happen to pair up and the client gets LF001 with `鐃緒申` mojibake.)
/// Expected: `LF001` with the message naming `public."支払"` and
/// `("卓")=(東京)`.
#[test]
fn euc_jp_stale_write_is_refused_with_lf001() {
    let (_db, mut c) = db_with("a18_euclf001", EUC_JP, EUC_JP_PAYOUTS);
    assert_eq!(
        refusal(&mut c, "INSERT INTO \"支払\" (\"卓\", token) VALUES ('東京', 4)"),
        [
            "LF001",
            "StaleOwnerBoundaryWrite: INSERT on public.\"支払\" for resource (\"卓\")=(東京) presents fencing token 4 but the current token is 5"
        ]
    );
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM \"支払\""), 0);
}

/// **Hole (medium).** EUC_JP database: `lease.fenced_boundary_write` with
/// an unknown column `額` fails with `22021 invalid byte sequence for
/// encoding "EUC_JP"` instead of `42703` (its message, converted to UTF-8,
/// is taken as EUC_JP again). Expected: `42703` naming the table and column.
#[test]
fn euc_jp_boundary_write_unknown_column_is_42703() {
    let (_db, mut c) = db_with("a18_eucbw", EUC_JP, EUC_JP_PAYOUTS);
    ok(&mut c, "SELECT lease.fenced_boundary_write('\"支払\"', 5, '[{\"卓\": \"日本\"}]')");
    assert_eq!(
        refusal(&mut c, "SELECT lease.fenced_boundary_write('\"支払\"', 5, '[{\"卓\": \"日本\", \"額\": 3}]')"),
        ["42703", "lease.fenced_boundary_write: public.\"支払\" has no column(s) \"額\""]
    );
}

/// **Hole (medium): the lease functions' LF codes are lost.** EUC_JP
/// database: `lease.acquire('東京', 'ホスト2', ...)` of a lease `ホスト1`
/// holds fails with `22021 invalid byte sequence for encoding "EUC_JP":
/// 0xbd 0x22` instead of `LF005`, and `lease.renew` by a non-holder with
/// `22021` instead of `LF006` (their messages hold the names as UTF-8 with
/// replacement characters). A game server that freezes on LF006 keeps
/// dealing. (`try_acquire` still returns no row: it catches LF005 before
/// the message reaches the client.) Expected: `LF005` and `LF006`, naming
/// the lease and owners as stored.
#[test]
fn euc_jp_lease_refusals_keep_their_lf_codes() {
    let (_db, mut c) = db_with("a18_euclease", EUC_JP, "SELECT lease.acquire('東京', 'ホスト1', 60000)");
    expect_texts(&mut c, "SELECT token::text FROM lease.try_acquire('東京', 'ホスト2', 60000)", &[]);
    let (taken, lost) = lease_conflict(&mut c, "東京", "ホスト2");
    assert_eq!(
        [taken, lost],
        [
            ["LF005", "LeaseOwnedElsewhere: lease \"東京\" is held by ホスト1"],
            ["LF006", "LeaseLost: ホスト2 no longer holds lease \"東京\" with token 1"],
        ]
    );
}

/// **Hole (high, availability).** EUC_JP database, a table fenced against
/// the owner table `"所有者"`: every write fails with `42P01 relation
/// "public.鐃緒申有鐃緒申" does not exist`, and so does `lease.acquire`
/// bound to its rows (as in LATIN1). Expected: the write with the current
/// token commits; acquire writes its token into the owner row.
#[test]
fn euc_jp_writes_fenced_against_a_japanese_owner_table_are_judged() {
    let (_db, mut c) = db_with(
        "a18_eucowner",
        EUC_JP,
        r#"CREATE TABLE "所有者" (id text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE pay (k text NOT NULL, token bigint);
           SELECT lease.protect('pay', '{k}', 'token', '"所有者"');
           INSERT INTO "所有者" VALUES ('東京', 5);"#,
    );
    let write = run(&mut c, "INSERT INTO pay VALUES ('東京', 5)");
    assert!(write.is_none(), "a write with the current token: {write:?}");
    let token =
        texts(&mut c, "SELECT token::text FROM lease.acquire('卓:東京', 'ホスト1', 60000, '\"所有者\"', '{東京}')");
    assert_eq!(token, texts(&mut c, "SELECT owner_fencing_token::text FROM \"所有者\""));
}

/// **Hole (high, availability).** LATIN1 database: an ASCII owner table
/// `tables` in the schema `jeu_é`: every write to the table fenced against
/// it fails with `42P01 relation "jeu_ï¿½.tables" does not exist` (the
/// schema name, too, is read lossily; whoever may create that schema could
/// plant a look-alike as in
/// `latin1_acquire_bound_to_an_accented_owner_table_fences_the_stale_writer`).
/// Expected: the write with the current token commits, a stale one is LF001.
#[test]
fn latin1_owner_table_in_an_accented_schema() {
    let (_db, mut c) = db_with(
        "a18_latinschema",
        LATIN1,
        r#"CREATE SCHEMA "jeu_é";
           CREATE TABLE "jeu_é".tables (id int PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE "jeu_é".payouts (table_id int NOT NULL, token bigint);
           SELECT lease.protect('"jeu_é".payouts', '{table_id}', 'token', '"jeu_é".tables');
           INSERT INTO "jeu_é".tables VALUES (1, 5);"#,
    );
    let write = run(&mut c, "INSERT INTO \"jeu_é\".payouts VALUES (1, 5)");
    assert!(write.is_none(), "a write with the current token: {write:?}");
    assert_eq!(fails(&mut c, "INSERT INTO \"jeu_é\".payouts VALUES (1, 4)").code, "LF001");
}

/// **Hole (medium).** LATIN1 database with `pg_lease.audit_row` and
/// `pg_lease.audit_statement` on: the refused row is audited as
/// `{"clï¿½": "ï¿½", "nom": "Zoï¿½", ...}` and the statement as `INSERT INTO
/// "rangées" VALUES ('ï¿½', 'Zoï¿½', 1)`: every non-ASCII character of the
/// payload (names of players, ...) is lost, `Zoë` and `Zoé` alike.
/// Expected: the row and the statement as written.
#[test]
fn latin1_audit_row_and_statement_keep_the_text() {
    let (_db, mut c) = db_with(
        "a18_latinrow",
        LATIN1,
        r#"CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE "rangées" ("clé" text NOT NULL, nom text, token bigint);
           SELECT lease.protect('"rangées"', '{clé}', 'token');
           INSERT INTO tables VALUES ('é', 5);
           SET pg_lease.audit_row = on;
           SET pg_lease.audit_statement = on;"#,
    );
    assert_eq!(fails(&mut c, "INSERT INTO \"rangées\" VALUES ('é', 'Zoë', 1)").code, "LF001");
    wait_for_audit(&mut c, 1);
    let expected = texts(&mut c, "SELECT '{\"clé\": \"é\", \"nom\": \"Zoë\", \"token\": 1}'::jsonb::text").unwrap();
    assert_eq!(texts(&mut c, "SELECT row_data::text FROM lease.rejected_writes"), Ok(expected));
    expect_texts(
        &mut c,
        "SELECT statement FROM lease.rejected_writes",
        &["INSERT INTO \"rangées\" VALUES ('é', 'Zoë', 1)"],
    );
}

/// **Hole (medium, documented limit; first seen in attack 12): two
/// resources audited under one key.** LATIN1 database: stale writes for
/// resources `é` and `ü` are refused correctly, but both audit rows read
/// `resource_key = ("clï¿½")=(ï¿½)` and `target_table = public."paiï¿½s"`, and
/// `lease.stats.table_name` is `public."paiï¿½s"`. Expected: `("clé")=(é)`,
/// `("clé")=(ü)` and `public."paiés"`.
#[test]
fn latin1_audit_records_each_resource_under_its_own_key() {
    let (_db, mut c) = db_with("a18_latinaudit", LATIN1, ACCENTED_FENCED);
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 4)").code, "LF001");
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('ü', 6)").code, "LF001");
    wait_for_audit(&mut c, 2);
    expect_texts(
        &mut c,
        "SELECT resource_key || ' ' || target_table FROM lease.rejected_writes ORDER BY id",
        &["(\"clé\")=(é) public.\"paiés\"", "(\"clé\")=(ü) public.\"paiés\""],
    );
    expect_texts(
        &mut c,
        "SELECT table_name FROM lease.stats WHERE database = current_database()",
        &["public.\"paiés\""],
    );
}

/// **Hole (medium, documented limit): two resources audited under one
/// key**, in WIN1251. Stale writes for `стол` and `стул` (every Cyrillic
/// letter one byte >= 0xE0 there, none of them valid UTF-8) are both
/// audited as `(k)=(пїЅпїЅпїЅпїЅ)`. Expected: `(k)=(стол)` and `(k)=(стул)`.
#[test]
fn win1251_audit_records_each_resource_under_its_own_key() {
    let (_db, mut c) = db_with(
        "a18_win1251",
        WIN1251,
        "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE bets (k text NOT NULL, token bigint);
         SELECT lease.protect('bets', '{k}', 'token');
         INSERT INTO tables VALUES ('стол', 5), ('стул', 5);",
    );
    let stol = fails(&mut c, "INSERT INTO bets VALUES ('стол', 4)");
    let stul = fails(&mut c, "INSERT INTO bets VALUES ('стул', 4)");
    assert_eq!((stol.code.as_str(), stul.code.as_str()), ("LF001", "LF001"));
    wait_for_audit(&mut c, 2);
    expect_texts(&mut c, "SELECT resource_key FROM lease.rejected_writes ORDER BY id", &["(k)=(стол)", "(k)=(стул)"]);
}

/// **Hole (low, documented limit).** LATIN1 database: the fence's refusals
/// show the table, key column and key as mojibake: `INSERT on
/// public."paiï¿½s" for resource ("clï¿½")=(ï¿½) ...`, in the message, the
/// DETAIL and the error's table field (`paiï¿½s`), for LF001, LF002, LF003
/// and LF007 alike. Expected: the names as stored.
#[test]
fn latin1_refusals_name_tables_and_keys_as_stored() {
    let (_db, mut c) = db_with("a18_latinmsg", LATIN1, ACCENTED_FENCED);
    let r = fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 4)");
    assert_eq!(r.code, "LF001");
    assert_eq!(
        r.message,
        "StaleOwnerBoundaryWrite: INSERT on public.\"paiés\" for resource (\"clé\")=(é) presents fencing token 4 but the current token is 5"
    );
    assert_eq!(
        r.detail,
        "Table public.\"paiés\", resource (\"clé\")=(é), presented token 4, current token 5 (owner row in public.tables)."
    );
    assert_eq!((r.schema.as_str(), r.table.as_str()), ("public", "paiés"));
    assert_eq!(refusal(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('ü', 8)"), [
            "LF002",
            "FencingTokenAhead: INSERT on public.\"paiés\" for resource (\"clé\")=(ü) presents fencing token 8, ahead of the current token 7"
        ]);
    assert_eq!(
        refusal(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('ö', 5)"),
        ["LF007", "FenceOwnerMissing: INSERT on public.\"paiés\" for resource (\"clé\")=(ö) has no owner row"]
    );
}

/// **Hole (low, documented limit).** LATIN1 database: the lease functions'
/// refusals show lease names and owners as mojibake: `LeaseOwnedElsewhere:
/// lease "tï¿½ble:ï¿½" is held by hï¿½te-1`, `LeaseLost: hï¿½te-2 no longer
/// holds lease "tï¿½ble:ï¿½" with token 1`. Expected: the names as stored.
#[test]
fn latin1_lease_refusals_name_leases_and_owners_as_stored() {
    let (_db, mut c) = db_with("a18_latinlease", LATIN1, "SELECT lease.acquire('tâble:é', 'hôte-1', 60000)");
    let (taken, lost) = lease_conflict(&mut c, "tâble:é", "hôte-2");
    assert_eq!(
        [taken, lost],
        [
            ["LF005", "LeaseOwnedElsewhere: lease \"tâble:é\" is held by hôte-1"],
            ["LF006", "LeaseLost: hôte-2 no longer holds lease \"tâble:é\" with token 1"],
        ]
    );
    let detail = fails(&mut c, "SELECT lease.acquire('tâble:é', 'hôte-2', 60000)").detail;
    assert!(detail.starts_with("Lease tâble:é, holder hôte-1, token "), "{detail}");
}

/// **Hole (low).** LATIN1 database: `lease.fenced_boundary_write` with an
/// unknown column `montânt` says `public."paiÃ©s" has no column(s)
/// "montÃ¢nt"` (names converted to UTF-8, then taken as LATIN1 again).
/// Expected: `public."paiés" has no column(s) "montânt"`.
#[test]
fn latin1_boundary_write_errors_name_columns_as_stored() {
    let (_db, mut c) = db_with("a18_latinbw", LATIN1, ACCENTED_FENCED);
    assert_eq!(
        refusal(&mut c, "SELECT lease.fenced_boundary_write('\"paiés\"', 5, '[{\"clé\": \"é\", \"montânt\": 3}]')"),
        ["42703", "lease.fenced_boundary_write: public.\"paiés\" has no column(s) \"montânt\""]
    );
}

/// **Hole (low, documented limit).** LATIN1 database: the DDL guards'
/// `LF008` name the fenced table as `public."paiï¿½s"` (TRUNCATE) and its key
/// column as `"clï¿½"` (a rename). Expected: the names as stored.
#[test]
fn latin1_ddl_guards_name_tables_as_stored() {
    let (_db, mut c) = db_with("a18_latinddl", LATIN1, ACCENTED_FENCED);
    assert_eq!(
        refusal(&mut c, "TRUNCATE \"paiés\""),
        ["LF008", "FenceTampering: TRUNCATE of fenced table public.\"paiés\" bypasses the fence"]
    );
    let r = fails(&mut c, "ALTER TABLE \"paiés\" RENAME COLUMN \"clé\" TO k2");
    assert_eq!(
        (r.code.as_str(), r.detail.as_str()),
        ("LF008", "Table public.\"paiés\": key column \"clé\" of public.\"paiés\" is missing.")
    );
}

/// **Defence holds.** A UTF-8 database with non-ASCII names everywhere:
/// owner table `"tablés"` with key column `"clé_o"` and token column
/// `"jeton_é"`, fenced table `"paiés"` keyed by `"clé"`, keys `é`/`ü`, lease
/// names and owners with accents. protect, a bound acquire, the fence's
/// verdicts and messages, fenced_boundary_write (accented columns and
/// values, its 42703), the DDL guard's LF008, LF005 and the audit all show
/// the names as stored, and the two resources are audited apart.
#[test]
fn utf8_database_with_accented_names_everywhere() {
    let (_db, mut c) = db_with(
        "a18_utf8",
        "",
        r#"CREATE TABLE "tablés" ("clé_o" text PRIMARY KEY, "jeton_é" bigint);
           CREATE TABLE "paiés" (id bigserial PRIMARY KEY, "clé" text NOT NULL, "montant€" int NOT NULL DEFAULT 0, jeton bigint);
           SELECT lease.protect('"paiés"', '{clé}', 'jeton', '"tablés"', '{clé_o}', 'jeton_é');
           INSERT INTO "tablés" VALUES ('é', 5), ('ü', 7);"#,
    );
    ok(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5)");
    let r = fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 4)");
    assert_eq!(r.code, "LF001");
    assert_eq!(
        r.message,
        "StaleOwnerBoundaryWrite: INSERT on public.\"paiés\" for resource (\"clé\")=(é) presents fencing token 4 but the current token is 5"
    );
    assert_eq!(
        r.detail,
        "Table public.\"paiés\", resource (\"clé\")=(é), presented token 4, current token 5 (owner row in public.\"tablés\")."
    );
    assert_eq!((r.schema.as_str(), r.table.as_str()), ("public", "paiés"));
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('ü', 6)").code, "LF001");

    let token = one_i64(&mut c, "SELECT token FROM lease.acquire('table:é', 'hôte-13', 60000, '\"tablés\"', '{é}')");
    assert_eq!(one_i64(&mut c, "SELECT \"jeton_é\" FROM \"tablés\" WHERE \"clé_o\" = 'é'"), token);
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5)").code, "LF001");
    ok(
        &mut c,
        &format!("SELECT lease.fenced_boundary_write('\"paiés\"', {token}, '[{{\"clé\": \"é\", \"montant€\": 3}}]')"),
    );
    assert_eq!(one_i64(&mut c, "SELECT sum(\"montant€\") FROM \"paiés\" WHERE \"clé\" = 'é'"), 3);
    assert_eq!(
        refusal(&mut c, "SELECT lease.fenced_boundary_write('\"paiés\"', 7, '[{\"clé\": \"ü\", \"montânt\": 3}]')"),
        ["42703", "lease.fenced_boundary_write: public.\"paiés\" has no column(s) \"montânt\""]
    );
    assert_eq!(
        refusal(&mut c, "TRUNCATE \"paiés\""),
        ["LF008", "FenceTampering: TRUNCATE of fenced table public.\"paiés\" bypasses the fence"]
    );
    assert_eq!(
        refusal(&mut c, "SELECT lease.acquire('table:é', 'hôte-14', 60000)"),
        ["LF005", "LeaseOwnedElsewhere: lease \"table:é\" is held by hôte-13"]
    );
    wait_for_audit(&mut c, 4);
    expect_texts(&mut c, "SELECT resource_key || ' ' || target_table FROM lease.rejected_writes WHERE resource_key IS NOT NULL ORDER BY id", &["(\"clé\")=(é) public.\"paiés\"",
            "(\"clé\")=(ü) public.\"paiés\"",
            "(\"clé\")=(é) public.\"paiés\""]);
    expect_texts(
        &mut c,
        "SELECT table_name FROM lease.stats WHERE database = current_database()",
        &["public.\"paiés\""],
    );
}

/// **Defence holds.** LATIN1 database: whatever the messages show, the
/// verdicts follow the stored keys. Owner rows `é` (token 5) and `ü` (7):
/// each passes with its own token and is refused with the other's (LF001
/// for the lower, LF002 for the higher), also through
/// fenced_boundary_write with accented values; high-water marks (sink
/// `"puits_é"`) of `é` and `ü` are kept apart; leases `tâble:é` and
/// `tâble:ü` are two leases; a lease bound to owner row `é` bumps that row
/// only.
#[test]
fn latin1_verdicts_follow_the_stored_keys() {
    let (_db, mut c) = db_with("a18_latinverdict", LATIN1, ACCENTED_FENCED);
    ok(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5), ('ü', 7)");
    // A varchar domain key compares the same way.
    ok(
        &mut c,
        r#"CREATE DOMAIN "nom_é" AS varchar(20);
           CREATE TABLE "mises" ("clé" "nom_é" NOT NULL, jeton bigint);
           SELECT lease.protect('"mises"', '{clé}', 'jeton', 'tables');
           INSERT INTO "mises" VALUES ('ü', 7);"#,
    );
    assert_eq!(fails(&mut c, "INSERT INTO \"mises\" VALUES ('ü', 5)").code, "LF001");
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('ü', 5)").code, "LF001");
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 7)").code, "LF002");
    ok(&mut c, "SELECT lease.fenced_boundary_write('\"paiés\"', 7, '[{\"clé\": \"ü\", \"montant\": 2}]')");
    assert_eq!(
        fails(&mut c, "SELECT lease.fenced_boundary_write('\"paiés\"', 5, '[{\"clé\": \"ü\", \"montant\": 2}]')").code,
        "LF001"
    );
    expect_texts(&mut c, "SELECT string_agg(\"clé\", ',' ORDER BY id) FROM \"paiés\"", &["é,ü,ü"]);

    ok(
        &mut c,
        r#"CREATE TABLE "puits_é" ("clé" text NOT NULL, jeton bigint);
           SELECT lease.protect_high_water('"puits_é"', '{clé}', 'jeton');
           INSERT INTO "puits_é" VALUES ('é', 10);
           INSERT INTO "puits_é" VALUES ('ü', 3);"#,
    );
    assert_eq!(fails(&mut c, "INSERT INTO \"puits_é\" VALUES ('é', 3)").code, "LF001");
    expect_texts(&mut c, "SELECT resource::text || token FROM lease.high_water ORDER BY token", &["{ü}3", "{é}10"]);

    let a = one_i64(&mut c, "SELECT token FROM lease.acquire('tâble:é', 'hôte-1', 60000)");
    let b = one_i64(&mut c, "SELECT token FROM lease.acquire('tâble:ü', 'hôte-2', 60000)");
    assert!(b > a);
    expect_texts(
        &mut c,
        "SELECT name || '/' || owner FROM lease.leases ORDER BY token",
        &["tâble:é/hôte-1", "tâble:ü/hôte-2"],
    );
    // A lease bound to owner row `é` bumps that row only.
    let t = one_i64(&mut c, "SELECT token FROM lease.acquire('t:é', 'hôte-3', 60000, 'tables', '{é}')");
    expect_texts(&mut c, "SELECT id || owner_fencing_token FROM tables ORDER BY 1", &[&format!("é{t}"), "ü7"]);
    assert_eq!(fails(&mut c, "INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', 5)").code, "LF001");
    ok(&mut c, &format!("INSERT INTO \"paiés\" (\"clé\", jeton) VALUES ('é', {t}), ('ü', 7)"));
}

/// **Defence holds.** A SQL_ASCII database holding UTF-8 names (what a
/// UTF-8 client writes there): accented owner and fenced tables, an
/// accented token column, a bound acquire; the refusal and the audit show
/// the names as stored.
#[test]
fn sql_ascii_database_with_utf8_names() {
    let (_db, mut c) = db_with(
        "a18_sqlascii",
        SQL_ASCII,
        r#"CREATE TABLE "tablés" (id text PRIMARY KEY, owner_fencing_token bigint);
           CREATE TABLE "paiés" (id bigserial, "clé" text NOT NULL, "jeton_é" bigint);
           SELECT lease.protect('"paiés"', '{clé}', 'jeton_é', '"tablés"');
           INSERT INTO "tablés" VALUES ('é', 5);"#,
    );
    assert_eq!(refusal(&mut c, "INSERT INTO \"paiés\" (\"clé\", \"jeton_é\") VALUES ('é', 4)"), [
            "LF001",
            "StaleOwnerBoundaryWrite: INSERT on public.\"paiés\" for resource (\"clé\")=(é) presents fencing token 4 but the current token is 5"
        ]);
    let token = one_i64(&mut c, "SELECT token FROM lease.acquire('table:é', 'hôte', 60000, '\"tablés\"', '{é}')");
    assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM \"tablés\""), token);
    ok(&mut c, &format!("SELECT lease.fenced_boundary_write('\"paiés\"', {token}, '[{{\"clé\": \"é\"}}]')"));
    wait_for_audit(&mut c, 1);
    expect_texts(
        &mut c,
        "SELECT resource_key || ' ' || target_table FROM lease.rejected_writes",
        &["(\"clé\")=(é) public.\"paiés\""],
    );
}

/// **Defence holds.** LATIN1 database, owner table `"tablés"` and fenced
/// table `"paiés"`: whatever the messages show, the guards refuse what they
/// refuse in a UTF-8 database.
#[test]
fn latin1_guards_hold_on_accented_tables() {
    let (_db, mut c) = db_with("a18_latinguards", LATIN1, ACCENTED_OWNER);
    let attempts = [
        ("UPDATE \"tablés\" SET owner_fencing_token = 1", "LF004"),
        ("UPDATE \"tablés\" SET owner_fencing_token = NULL", "LF004"),
        ("UPDATE \"tablés\" SET id = 'x' WHERE id = 'é'", "LF004"),
        ("DELETE FROM \"tablés\"", "LF004"),
        ("TRUNCATE \"tablés\"", "LF004"),
        ("ALTER TABLE \"tablés\" DROP CONSTRAINT \"tablés_pkey\"", "LF008"),
        ("ALTER TABLE \"tablés\" ALTER owner_fencing_token TYPE numeric", "LF008"),
        ("ALTER TABLE \"paiés\" DISABLE TRIGGER pg_lease_fence", "LF008"),
        ("DROP TRIGGER pg_lease_fence ON \"paiés\"", "LF008"),
        ("ALTER TABLE \"paiés\" RENAME COLUMN \"clé\" TO k", "LF008"),
    ];
    let got: Vec<(&str, String)> = attempts.iter().map(|(sql, _)| (*sql, try_sql(&mut c, sql))).collect();
    let expected: Vec<(&str, String)> = attempts.iter().map(|(sql, code)| (*sql, code.to_string())).collect();
    assert_eq!(got, expected);
    expect_texts(&mut c, "SELECT id || owner_fencing_token FROM \"tablés\" ORDER BY 1", &["é5", "ü7"]);
}
