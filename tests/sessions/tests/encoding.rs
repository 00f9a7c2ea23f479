//! pg_lease in databases whose encoding is not UTF-8 (LATIN1, WIN1251,
//! EUC_JP), with names and keys outside ASCII: refusals and lease errors
//! show tables, columns, keys, leases and owners as they are stored, the
//! audit records them so (two keys that differ in one accented letter stay
//! two keys), and every feature works with such names as with ASCII ones.
//! The client speaks UTF-8; the server converts.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::{Duration, Instant};

fn db(label: &str, encoding: &str) -> TestDb {
    TestDb::with_options(label, &format!("ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"))
}

/// The message and DETAIL of the error `sql` fails with, which must be `code`.
fn refused(c: &mut Client, sql: &str, code: &str) -> String {
    expect_error(c, sql, code)
}

fn texts(c: &mut Client, sql: &str) -> Vec<String> {
    c.query(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).iter().map(|r| r.get::<_, String>(0)).collect()
}

/// The audit's rows for `table` once there are `n`, as `resource_key | target_table`.
fn audited(c: &mut Client, n: usize) -> Vec<String> {
    let sql = "SELECT resource_key || ' | ' || target_table FROM lease.rejected_writes ORDER BY id";
    let start = Instant::now();
    loop {
        let rows = texts(c, sql);
        if rows.len() >= n || start.elapsed() > Duration::from_secs(10) {
            return rows;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn latin1_fence_refusals_and_the_audit_name_tables_columns_and_keys_as_stored() {
    let db = db("enc_latin1_fence", "LATIN1");
    let mut c = db.connect();
    c.batch_execute(
        r#"CREATE TABLE "tablé" ("clé" text PRIMARY KEY, jeton bigint);
           CREATE TABLE "paié" (id bigserial, "clé" text NOT NULL, montant bigint, "jetoné" bigint);
           SELECT lease.protect('"paié"', '{clé}', 'jetoné', '"tablé"', '{clé}', 'jeton');
           INSERT INTO "tablé" VALUES ('à', 6), ('è', 6);"#,
    )
    .unwrap();
    let protected = texts(&mut c, "SELECT relid::text || key_columns::text || token_column FROM lease.protected");
    assert_eq!(protected, [r#""paié"{clé}jetoné"#]);

    let a = refused(&mut c, r#"INSERT INTO "paié" ("clé", montant, "jetoné") VALUES ('à', 1, 5)"#, "LF001");
    assert!(
        a.starts_with(
            r#"StaleOwnerBoundaryWrite: INSERT on public."paié" for resource ("clé")=(à) presents fencing token 5"#
        ) && a.contains(r#"(owner row in public."tablé")"#),
        "{a}"
    );
    let e = refused(&mut c, r#"INSERT INTO "paié" ("clé", montant, "jetoné") VALUES ('è', 1, 4)"#, "LF001");
    assert!(e.contains(r#"("clé")=(è)"#), "{e}");
    // The same fence through fenced_boundary_write, whose columns are JSON keys.
    let w =
        refused(&mut c, r#"SELECT lease.fenced_boundary_write('"paié"', 5, '[{"clé": "à", "montant": 3}]')"#, "LF001");
    assert!(w.contains(r#"("clé")=(à)"#), "{w}");
    assert_eq!(
        one_i64(&mut c, r#"SELECT lease.fenced_boundary_write('"paié"', 6, '[{"clé": "à", "montant": 3}]')"#),
        1
    );
    assert_eq!(texts(&mut c, r#"SELECT "clé" || montant || "jetoné" FROM "paié""#), ["à36"]);
    // Bad input names them as given.
    let unknown =
        refused(&mut c, r#"SELECT lease.fenced_boundary_write('"paié"', 6, '[{"clé": "à", "colonné": 3}]')"#, "42703");
    assert!(unknown.contains(r#""colonné""#) && unknown.contains(r#""paié""#), "{unknown}");
    // A missing owner row, and a DDL guard's refusal, name them too.
    let missing = refused(&mut c, r#"INSERT INTO "paié" ("clé", "jetoné") VALUES ('ù', 6)"#, "LF007");
    assert!(missing.contains(r#"("clé")=(ù)"#), "{missing}");
    let dropped = refused(&mut c, r#"ALTER TABLE "paié" DROP COLUMN "jetoné""#, "LF008");
    assert!(dropped.contains(r#""paié""#), "{dropped}");

    let rows = audited(&mut c, 4);
    assert_eq!(
        rows,
        [
            r#"("clé")=(à) | public."paié""#,
            r#"("clé")=(è) | public."paié""#,
            r#"("clé")=(à) | public."paié""#,
            r#"("clé")=(ù) | public."paié""#,
        ]
    );
    assert_eq!(
        texts(&mut c, "SELECT table_name FROM lease.stats WHERE database = current_database()"),
        [r#"public."paié""#]
    );
}

#[test]
fn latin1_lease_calls_name_leases_owners_and_owner_keys_as_stored() {
    let db = db("enc_latin1_lease", "LATIN1");
    let mut c = db.connect();
    c.batch_execute(
        r#"CREATE TABLE "tablé" ("clé" text PRIMARY KEY, jeton bigint);
           CREATE TABLE "paié" ("clé" text NOT NULL, montant bigint, "jetoné" bigint);
           SELECT lease.protect('"paié"', '{clé}', 'jetoné', '"tablé"', '{clé}', 'jeton');
           INSERT INTO "tablé" VALUES ('à', NULL);"#,
    )
    .unwrap();
    let t = one_i64(&mut c, "SELECT token FROM lease.acquire('tablé:7', 'hôte-1', 60000)");
    let held = refused(&mut c, "SELECT lease.acquire('tablé:7', 'hôte-2', 60000)", "LF005");
    assert!(held.starts_with(r#"LeaseOwnedElsewhere: lease "tablé:7" is held by hôte-1"#), "{held}");
    let stale = refused(&mut c, &format!("SELECT lease.renew('tablé:7', 'hôte-2', {t}, 60000)"), "LF006");
    assert!(stale.contains("tablé:7") && stale.contains("hôte-2"), "{stale}");
    assert_eq!(texts(&mut c, "SELECT name || '|' || owner FROM lease.leases"), ["tablé:7|hôte-1"]);

    // A lease bound to an owner row whose key and columns are not ASCII.
    let bound = one_i64(
        &mut c,
        r#"SELECT token FROM lease.acquire('salle:à', 'hôte-1', 60000, owner_table => '"tablé"', owner_key => '{à}')"#,
    );
    assert_eq!(one_i64(&mut c, r#"SELECT jeton FROM "tablé" WHERE "clé" = 'à'"#), bound);
    c.batch_execute(&format!(r#"INSERT INTO "paié" VALUES ('à', 1, {bound})"#)).unwrap();
    let other = refused(
        &mut c,
        r#"SELECT lease.acquire('salle:autre', 'hôte-2', 60000, owner_table => '"tablé"', owner_key => '{à}')"#,
        "LF005",
    );
    assert!(other.contains("salle:à") && other.contains("hôte-1"), "{other}");
    assert!(
        one_i64(&mut c, &format!("SELECT count(*) FROM lease.release('salle:à', 'hôte-1', {bound}) r WHERE r")) == 1
    );
}

#[test]
fn win1251_high_water_refusals_name_the_sink_and_key() {
    let db = db("enc_win1251_hw", "WIN1251");
    let mut c = db.connect();
    c.batch_execute(
        r#"CREATE TABLE "сток" ("ключ" text, "жетон" bigint);
           SELECT lease.protect_high_water('"сток"', '{ключ}', 'жетон');
           INSERT INTO "сток" VALUES ('я', 5), ('ю', 5);"#,
    )
    .unwrap();
    let r = refused(&mut c, r#"INSERT INTO "сток" VALUES ('я', 4)"#, "LF001");
    assert!(r.contains(r#"public."сток" for resource ("ключ")=(я)"#), "{r}");
    assert!(refused(&mut c, r#"INSERT INTO "сток" VALUES ('ю', 3)"#, "LF001").contains("=(ю)"));
    assert_eq!(audited(&mut c, 2), [r#"("ключ")=(я) | public."сток""#, r#"("ключ")=(ю) | public."сток""#]);
}

#[test]
fn euc_jp_keys_are_shown_and_audited_as_written() {
    let db = db("enc_eucjp", "EUC_JP");
    let mut c = db.connect();
    c.batch_execute(
        "CREATE TABLE 卓 (番号 text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE 支払 (番号 text NOT NULL, fencing_token bigint);
         SELECT lease.protect('支払', '{番号}', 'fencing_token', '卓', '{番号}', 'owner_fencing_token');
         INSERT INTO 卓 VALUES ('鍵', 6), ('錠', 6);",
    )
    .unwrap();
    let r = refused(&mut c, "INSERT INTO 支払 VALUES ('鍵', 5)", "LF001");
    assert!(r.contains("public.\"支払\" for resource (\"番号\")=(鍵)"), "{r}");
    assert!(refused(&mut c, "INSERT INTO 支払 VALUES ('錠', 5)", "LF001").contains("=(錠)"));
    assert_eq!(audited(&mut c, 2), ["(\"番号\")=(鍵) | public.\"支払\"", "(\"番号\")=(錠) | public.\"支払\""]);
    let t = one_i64(&mut c, "SELECT token FROM lease.acquire('卓:鍵', '主', 60000)");
    let held = refused(&mut c, "SELECT lease.acquire('卓:鍵', '客', 60000)", "LF005");
    assert!(held.contains("卓:鍵") && held.contains("主") && held.contains(&t.to_string()), "{held}");
}

/// Refusals of a UTF-8 database recorded in a central audit database whose
/// encoding is LATIN1 (`pg_lease.database`): keys LATIN1 can hold arrive as
/// written, a character it cannot hold as `?` (README, the audit).
#[test]
fn a_latin1_audit_database_records_what_it_can_hold() {
    let cluster = Cluster::start_with("enc_central", 15195, &["pg_lease.database = 'audit_latin1'"]);
    let mut c = cluster.connect();
    c.batch_execute("CREATE DATABASE audit_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        .unwrap();
    c.batch_execute(
        "CREATE EXTENSION pg_lease;
         CREATE TABLE rooms (name text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE bets (room text NOT NULL, fencing_token bigint);
         SELECT lease.protect('bets', '{room}', 'fencing_token', 'rooms', '{name}');
         INSERT INTO rooms VALUES ('clé', 6), ('鍵', 6);",
    )
    .unwrap();
    let mut home = cluster.connect_db("audit_latin1");
    home.batch_execute("CREATE EXTENSION pg_lease").unwrap();
    assert!(refused(&mut c, "INSERT INTO bets VALUES ('clé', 5)", "LF001").contains("(room)=(clé)"));
    assert!(refused(&mut c, "INSERT INTO bets VALUES ('鍵', 5)", "LF001").contains("(room)=(鍵)"));
    assert_eq!(audited(&mut home, 2), ["(room)=(clé) | public.bets", "(room)=(?) | public.bets"]);
    // The LOG line: UTF-8 from a UTF-8 database, ASCII with JSON escapes
    // from the LATIN1 one (README, the audit).
    home.batch_execute(
        "CREATE TABLE rooms (name text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE bets (room text NOT NULL, fencing_token bigint);
         SELECT lease.protect('bets', '{room}', 'fencing_token', 'rooms', '{name}');
         INSERT INTO rooms VALUES ('clè', 6);",
    )
    .unwrap();
    refused(&mut home, "INSERT INTO bets VALUES ('clè', 5)", "LF001");
    let log = cluster.server_log();
    assert!(log.contains(r#""resource": "(room)=(clé)""#), "{log}");
    assert!(log.contains(r#""resource": "(room)=(cl\u00e8)", "presented_token": 5"#), "{log}");
}
