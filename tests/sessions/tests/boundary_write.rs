//! lease.fenced_boundary_write in Rust: its per-backend plan cache follows the
//! table through ALTER TABLE, DROP + CREATE and schema renames within one
//! long-lived session (and across sessions); values become column values as
//! `jsonb_populate_record` makes them (typmods, defaults, identity and
//! generated columns, arrays, json); errors name the element and column; the
//! caller's privileges apply.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

const LEDGER: &str = "
    CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
    INSERT INTO tables VALUES (1, 5), (2, 5);
    CREATE TABLE ledger (
        id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        table_id int NOT NULL,
        amount   bigint NOT NULL DEFAULT 7,
        fencing_token bigint
    );
    SELECT lease.protect('ledger', '{table_id}', 'fencing_token');
";

fn setup(label: &str) -> (TestDb, Client) {
    let db = TestDb::new(label);
    let mut c = db.connect();
    c.batch_execute(LEDGER).unwrap();
    (db, c)
}

fn write(c: &mut Client, table: &str, token: i64, rows: &str) -> Result<i64, String> {
    let sql = format!("SELECT lease.fenced_boundary_write('{table}', {token}, '{rows}')");
    match c.query_one(&sql, &[]) {
        Ok(r) => Ok(r.get(0)),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
            Err(format!("{} {}", db.code().code(), db.message()))
        }
    }
}

fn text(c: &mut Client, sql: &str) -> String {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

#[test]
fn the_plan_cache_follows_alter_table_in_one_session() {
    let (_db, mut c) = setup("bw_alter");
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 3}]"#), Ok(1));
    // A new column: usable at once, and its default fills rows that omit it.
    c.batch_execute("ALTER TABLE ledger ADD COLUMN note varchar(5) DEFAULT 'none'").unwrap();
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 4, "note": "hi"}, {"table_id": 1}]"#), Ok(2));
    assert_eq!(
        text(&mut c, "SELECT string_agg(note || ':' || amount, ',' ORDER BY id) FROM ledger WHERE note IS NOT NULL"),
        "none:3,hi:4,none:7"
    );
    // The typmod of the new column is enforced as Postgres enforces it.
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "note": "toolong"}]"#).unwrap_err();
    assert_eq!(e, "22001 lease.fenced_boundary_write: rows[0].note: value too long for type character varying(5)");
    // A dropped column is unknown again, in the same session.
    c.batch_execute("ALTER TABLE ledger DROP COLUMN note").unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "note": "hi"}]"#).unwrap_err();
    assert_eq!(e, "42703 lease.fenced_boundary_write: public.ledger has no column(s) note");
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 5}]"#), Ok(1));
    // A retyped column converts with its new type (and typmod).
    c.batch_execute("ALTER TABLE ledger ALTER COLUMN amount TYPE numeric(10,2)").unwrap();
    assert_eq!(
        write(&mut c, "ledger", 5, r#"[{"table_id": 2, "amount": 1.239}, {"table_id": 2, "amount": "2.5"}]"#),
        Ok(2)
    );
    assert_eq!(
        text(&mut c, "SELECT string_agg(amount::text, ',' ORDER BY id) FROM ledger WHERE table_id = 2"),
        "1.24,2.50"
    );
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 2, "amount": 123456789.5}]"#).unwrap_err();
    assert!(e.starts_with("22003 lease.fenced_boundary_write: rows[0].amount: numeric field overflow"), "{e}");
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 2, "amount": "lots"}]"#).unwrap_err();
    assert_eq!(
        e,
        r#"22P02 lease.fenced_boundary_write: rows[0].amount: invalid input syntax for type numeric: "lots""#
    );
    // Another session's ALTER reaches this session's cache too.
    let mut other = _db.connect();
    other.batch_execute("ALTER TABLE ledger ALTER COLUMN amount TYPE int").unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 2, "amount": 1.5}]"#).unwrap_err();
    assert_eq!(e, r#"22P02 lease.fenced_boundary_write: rows[0].amount: invalid input syntax for type integer: "1.5""#);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM ledger"), 6);
}

#[test]
fn drop_and_create_of_a_same_named_table_is_a_new_table() {
    let (db, mut c) = setup("bw_recreate");
    let mut other = db.connect();
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 3}]"#), Ok(1));
    other
        .batch_execute(
            "SELECT lease.unprotect('ledger'); DROP TABLE ledger;
             CREATE TABLE ledger (table_id int NOT NULL, label text NOT NULL, fencing_token bigint);
             SELECT lease.protect('ledger', '{table_id}', 'fencing_token');",
        )
        .unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 3}]"#).unwrap_err();
    assert_eq!(e, "42703 lease.fenced_boundary_write: public.ledger has no column(s) amount");
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "label": "x"}]"#), Ok(1));
    // And dropped without a successor: the name no longer resolves.
    other.batch_execute("SELECT lease.unprotect('ledger'); DROP TABLE ledger").unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert!(e.starts_with("42P01"), "{e}");
    // Unprotected, then the same name again: refused as unprotected.
    other.batch_execute("CREATE TABLE ledger (table_id int)").unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert_eq!(e, "55000 lease.fenced_boundary_write: public.ledger is not protected by pg_lease");
}

#[test]
fn names_come_from_the_oid_not_the_search_path() {
    let (_db, mut c) = setup("bw_search_path");
    c.batch_execute(
        "CREATE SCHEMA decoy; CREATE TABLE decoy.ledger (table_id int, amount bigint, fencing_token bigint);",
    )
    .unwrap();
    assert_eq!(write(&mut c, "public.ledger", 5, r#"[{"table_id": 1}]"#), Ok(1));
    c.batch_execute("SET search_path = decoy, public").unwrap();
    assert_eq!(write(&mut c, "public.ledger", 5, r#"[{"table_id": 1}]"#), Ok(1));
    // Messages name tables as the SQL version did, under its own search_path
    // (pg_catalog, pg_temp), whatever the caller's.
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert_eq!(e, "55000 lease.fenced_boundary_write: decoy.ledger is not protected by pg_lease");
    let shown = text(&mut c, "SELECT current_setting('search_path')");
    assert_eq!(shown, "decoy, public", "the caller's search_path is back after the call");
    c.batch_execute("RESET search_path").unwrap();
    // A renamed schema: the cached plan named the old one.
    c.batch_execute("ALTER SCHEMA public RENAME TO money").unwrap();
    assert_eq!(write(&mut c, "money.ledger", 5, r#"[{"table_id": 1}]"#), Ok(1));
    c.batch_execute("ALTER SCHEMA money RENAME TO public").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM public.ledger"), 3);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM decoy.ledger"), 0);
}

#[test]
fn defaults_identity_and_generated_columns() {
    let (_db, mut c) = setup("bw_defaults");
    c.batch_execute(
        "ALTER TABLE ledger ADD COLUMN doubled bigint GENERATED ALWAYS AS (amount * 2) STORED,
                            ADD COLUMN at_hand int DEFAULT 41 + 1,
                            ADD COLUMN seq bigserial",
    )
    .unwrap();
    // Rows with different key sets: each leaves its missing columns to their defaults.
    assert_eq!(
        write(
            &mut c,
            "ledger",
            5,
            r#"[{"table_id": 1}, {"table_id": 1, "amount": 10, "at_hand": null}, {"table_id": 1, "amount": 2}]"#
        ),
        Ok(3)
    );
    assert_eq!(
        text(&mut c, "SELECT string_agg(format('%s/%s/%s/%s', amount, doubled, at_hand, fencing_token), ',' ORDER BY seq) FROM ledger"),
        "7/14/42/5,10/20//5,2/4/42/5"
    );
    assert_eq!(text(&mut c, "SELECT string_agg(id::text, ',' ORDER BY id) FROM ledger"), "1,2,3");
    // Rows with the same keys, with others in between: inserted group by
    // group (same keys together, in order of first appearance).
    let before = one_i64(&mut c, "SELECT max(seq) FROM ledger");
    assert_eq!(
        write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 1}, {"table_id": 1}, {"table_id": 1, "amount": 3}]"#),
        Ok(3)
    );
    assert_eq!(
        text(&mut c, &format!("SELECT string_agg(amount::text, ',' ORDER BY seq) FROM ledger WHERE seq > {before}")),
        "1,3,7"
    );
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "doubled": 1}]"#).unwrap_err();
    assert!(e.starts_with("428C9 cannot insert a non-DEFAULT value into column \"doubled\""), "{e}");
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "id": 1}]"#).unwrap_err();
    assert!(e.starts_with("428C9"), "{e}");
    // A NOT NULL column with an explicit null: that element is named, even
    // when an earlier one leaves the column out.
    c.batch_execute("UPDATE ledger SET at_hand = 0 WHERE at_hand IS NULL").unwrap();
    c.batch_execute("ALTER TABLE ledger ALTER COLUMN at_hand SET NOT NULL, ALTER COLUMN at_hand DROP DEFAULT").unwrap();
    let e = write(
        &mut c,
        "ledger",
        5,
        r#"[{"table_id": 1, "at_hand": 1}, {"table_id": 1}, {"table_id": 1, "at_hand": null}]"#,
    )
    .unwrap_err();
    assert!(
        e.starts_with("23502 lease.fenced_boundary_write: rows[2].at_hand: null value in column \"at_hand\""),
        "{e}"
    );
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "at_hand": 1}, {"table_id": 1}]"#).unwrap_err();
    assert!(e.starts_with("23502 lease.fenced_boundary_write: rows[1].at_hand: "), "{e}");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM ledger"), 6, "all or nothing");
}

/// Every value lands as `jsonb_populate_record` would have made it.
#[test]
fn values_convert_as_jsonb_populate_record_converts_them() {
    let (_db, mut c) = setup("bw_types");
    c.batch_execute(
        "CREATE DOMAIN small_positive AS int CHECK (VALUE > 0);
         CREATE TYPE pair AS (a int, b text);
         CREATE TABLE kinds (
             n serial, table_id int, fencing_token bigint,
             t text, v varchar(5), c char(3), num numeric(6,2), f float8, b boolean, ts timestamptz,
             j json, jb jsonb, ints int[], texts text[], p pair, d small_positive, u uuid);
         SELECT lease.protect('kinds', '{table_id}', 'fencing_token');",
    )
    .unwrap();
    let rows = [
        r#"{"t": "plain", "v": "abc", "c": "x", "num": 1.005, "f": 1e-3, "b": true, "ts": "2026-01-02 03:04:05+00"}"#,
        r#"{"t": {"z": 1, "a": [true, null, "q\"\n"]}, "num": "12.3", "b": "yes", "f": "NaN"}"#,
        r#"{"t": 12.50, "j": "str", "jb": {"k": [1, 2.0]}, "ints": [1, 2, 3], "texts": ["a", "b c"]}"#,
        r#"{"j": {"b": 1, "a": 2}, "jb": "s", "ints": [], "p": {"a": 1, "b": "x"}, "d": 3, "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}"#,
        r#"{"t": null, "j": null, "jb": null, "ints": null, "p": null, "d": null, "t": true}"#,
    ];
    let rows: Vec<String> = rows.iter().map(|r| format!("{{\"table_id\": 1, {}", &r[1..])).collect();
    let array = format!("[{}]", rows.join(", "));
    c.batch_execute("SET TimeZone = 'UTC'").unwrap();
    assert_eq!(write(&mut c, "kinds", 5, &array.replace('\'', "''")), Ok(rows.len() as i64));
    for (i, row) in rows.iter().enumerate() {
        let same: bool = c
            .query_one(
                "SELECT (to_jsonb(k) - 'n' - 'fencing_token') = (to_jsonb(jsonb_populate_record(NULL::kinds, $1::text::jsonb)) - 'n' - 'fencing_token')
                   FROM kinds k WHERE n = $2",
                &[row, &(i as i32 + 1)],
            )
            .unwrap()
            .get(0);
        let got: String =
            c.query_one("SELECT to_jsonb(k)::text FROM kinds k WHERE n = $1", &[&(i as i32 + 1)]).unwrap().get(0);
        assert!(same, "row {i}: {row}\nstored: {got}");
    }
    // Errors of the special kinds name the element and column too.
    let e = write(&mut c, "kinds", 5, r#"[{"table_id": 1}, {"table_id": 1, "ints": [1, "x"]}]"#).unwrap_err();
    assert!(e.starts_with("22P02 lease.fenced_boundary_write: rows[1].ints: "), "{e}");
    // A domain's CHECK is a 23514, not a data error: raised as Postgres
    // raises it (under the function's search_path, so the domain is qualified).
    let e = write(&mut c, "kinds", 5, r#"[{"table_id": 1, "d": 0}]"#).unwrap_err();
    assert!(e.starts_with("23514 value for domain public.small_positive violates check constraint"), "{e}");
    // The first bad value in element order, then jsonb's key order (shorter keys first).
    let e = write(&mut c, "kinds", 5, r#"[{"table_id": 1, "num": "a", "b": "maybe"}, {"table_id": "z"}]"#).unwrap_err();
    assert_eq!(e, r#"22P02 lease.fenced_boundary_write: rows[0].b: invalid input syntax for type boolean: "maybe""#);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM kinds"), rows.len() as i64);
}

#[test]
fn the_callers_privileges_apply() {
    let (db, mut c) = setup("bw_grants");
    let role = format!("bw_clerk_{}", std::process::id());
    c.batch_execute(&format!("CREATE ROLE {role} LOGIN; GRANT SELECT ON ledger TO {role}")).unwrap();
    let mut clerk = db.connect_as(&role);
    let e = write(&mut clerk, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert_eq!(e, "42501 permission denied for table ledger");
    // Granted INSERT on one column only: the others cannot be written.
    c.batch_execute(&format!("GRANT INSERT (table_id, fencing_token) ON ledger TO {role}")).unwrap();
    assert_eq!(write(&mut clerk, "ledger", 5, r#"[{"table_id": 1}]"#), Ok(1));
    let e = write(&mut clerk, "ledger", 5, r#"[{"table_id": 1, "amount": 2}]"#).unwrap_err();
    assert_eq!(e, "42501 permission denied for table ledger");
    // Revoked again: the same session's cached plan does not keep the right.
    c.batch_execute(&format!("REVOKE INSERT ON ledger FROM {role}")).unwrap();
    let e = write(&mut clerk, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert_eq!(e, "42501 permission denied for table ledger");
    // Row-level security of the caller applies as for an INSERT.
    c.batch_execute(&format!(
        "GRANT INSERT ON ledger TO {role}; ALTER TABLE ledger ENABLE ROW LEVEL SECURITY;
         CREATE POLICY only_two ON ledger FOR INSERT TO {role} WITH CHECK (table_id = 2);"
    ))
    .unwrap();
    let e = write(&mut clerk, "ledger", 5, r#"[{"table_id": 1}]"#).unwrap_err();
    assert!(e.starts_with("42501 new row violates row-level security policy"), "{e}");
    assert_eq!(write(&mut clerk, "ledger", 5, r#"[{"table_id": 2}]"#), Ok(1));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM ledger"), 2);
    drop(clerk);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn the_fence_judges_every_row_and_a_bound_token_is_restored() {
    let (_db, mut c) = setup("bw_fence");
    c.batch_execute(
        "CREATE TABLE log (table_id int NOT NULL, line text);
         SELECT lease.protect('log', '{table_id}', owner_table => 'tables');
         UPDATE tables SET owner_fencing_token = 6 WHERE id = 2;",
    )
    .unwrap();
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1}, {"table_id": 2}]"#).unwrap_err();
    assert!(e.starts_with("LF001 StaleOwnerBoundaryWrite"), "{e}");
    let e = write(&mut c, "log", 5, r#"[{"table_id": 1}, {"table_id": 2}]"#).unwrap_err();
    assert!(e.starts_with("LF001 StaleOwnerBoundaryWrite"), "{e}");
    // A refusal caught by the caller leaves the transaction usable.
    c.batch_execute(
        r#"DO $$ BEGIN PERFORM lease.fenced_boundary_write('ledger', 5, '[{"table_id": 2}]');
           EXCEPTION WHEN SQLSTATE 'LF001' THEN PERFORM set_config('t.caught', 'yes', false); END $$"#,
    )
    .unwrap();
    assert_eq!(text(&mut c, "SELECT current_setting('t.caught')"), "yes");
    let mut tx = c.transaction().unwrap();
    tx.batch_execute("SELECT lease.bind_token(6)").unwrap();
    let n: i64 = tx
        .query_one(r#"SELECT lease.fenced_boundary_write('log', 5, '[{"table_id": 1, "line": "a"}]')"#, &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let bound: Option<i64> = tx.query_one("SELECT lease.bound_token()", &[]).unwrap().get(0);
    assert_eq!(bound, Some(6));
    tx.batch_execute("INSERT INTO log VALUES (2, 'b')").unwrap();
    tx.commit().unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM log"), 2);
    // Nested in a caller's transaction with an error caught in between, the cache still works.
    assert_eq!(write(&mut c, "ledger", 6, r#"[{"table_id": 2}, {"table_id": 2, "amount": 1}]"#), Ok(2));
}

/// In a LATIN1 database, names and values outside ASCII arrive intact (the
/// JSON is read as UTF-8 and converted back for the input functions).
#[test]
fn a_latin1_database_keeps_its_characters() {
    let db = TestDb::with_options("bw_latin1", "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    let mut c = db.connect();
    c.batch_execute(LEDGER).unwrap();
    c.batch_execute("ALTER TABLE ledger ADD COLUMN \"café\" text, ADD COLUMN tag char(2)").unwrap();
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "café": "crème brûlée", "tag": "é"}]"#), Ok(1));
    assert_eq!(text(&mut c, "SELECT \"café\" || '|' || tag || '|' FROM ledger"), "crème brûlée|é|");
    // One byte a character: stored as LATIN1.
    assert_eq!(one_i64(&mut c, "SELECT (octet_length(\"café\") + octet_length(tag))::bigint FROM ledger"), 12 + 2);
}

/// A call nested in another (from a trigger of the outer call's table): each
/// names its own elements.
#[test]
fn nested_calls_name_their_own_elements() {
    let (_db, mut c) = setup("bw_nested");
    c.batch_execute(
        r#"CREATE TABLE side (table_id int NOT NULL, note text NOT NULL, fencing_token bigint);
           SELECT lease.protect('side', '{table_id}', 'fencing_token');
           CREATE FUNCTION copy_to_side() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               -- Qualified: triggers run under the call's search_path (pg_catalog, pg_temp).
               PERFORM lease.fenced_boundary_write('public.side', 5,
                   jsonb_build_array(jsonb_build_object('table_id', NEW.table_id, 'note', 'n'),
                                     jsonb_build_object('table_id', NEW.table_id, 'note', CASE WHEN NEW.amount = 99 THEN NULL ELSE 'm' END)));
               RETURN NEW;
           END $$;
           CREATE TRIGGER copy BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION copy_to_side();"#,
    )
    .unwrap();
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 1}, {"table_id": 1, "amount": 2}]"#), Ok(2));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM side"), 4);
    // The outer call's NOT NULL violation, after nested calls succeeded.
    let e = write(
        &mut c,
        "ledger",
        5,
        r#"[{"table_id": 1, "amount": 1}, {"table_id": 1}, {"amount": null, "table_id": 1}]"#,
    )
    .unwrap_err();
    assert!(e.starts_with("23502 lease.fenced_boundary_write: rows[2].amount: null value in column \"amount\""), "{e}");
    // The nested call's own.
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "amount": 99}]"#).unwrap_err();
    assert!(e.starts_with("23502 lease.fenced_boundary_write: rows[1].note: null value in column \"note\""), "{e}");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM ledger"), 2);
}

/// The NOT NULL naming is raised from inside Postgres's error handling (an
/// error context callback): caught again and again in one session, it leaves
/// error reporting as it was (later errors keep their CONTEXT lines and
/// SQLSTATEs; the session stays usable).
#[test]
fn caught_not_null_namings_leave_error_reporting_intact() {
    let (_db, mut c) = setup("bw_nn_caught");
    c.batch_execute("ALTER TABLE ledger ADD COLUMN at_hand int NOT NULL").unwrap();
    c.batch_execute(
        r#"DO $$
           DECLARE n int := 0;
           BEGIN
             FOR i IN 1..20 LOOP
               BEGIN
                 PERFORM lease.fenced_boundary_write('ledger', 5, '[{"table_id": 1, "at_hand": null}]');
               EXCEPTION WHEN not_null_violation THEN n := n + 1;
               END;
             END LOOP;
             IF n <> 20 THEN RAISE EXCEPTION 'caught %', n; END IF;
           END $$"#,
    )
    .unwrap();
    // An ordinary error afterwards still carries its context and code.
    let e = c.batch_execute("DO $$ BEGIN PERFORM 1 / 0; END $$").unwrap_err();
    let db = e.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "22012");
    assert!(db.where_().is_some_and(|w| w.contains("PL/pgSQL function inline_code_block")), "{db:?}");
    // And the naming itself still works, uncaught, in the same session.
    let e = write(&mut c, "ledger", 5, r#"[{"table_id": 1, "at_hand": null}]"#).unwrap_err();
    assert!(e.starts_with("23502 lease.fenced_boundary_write: rows[0].at_hand: "), "{e}");
    assert_eq!(write(&mut c, "ledger", 5, r#"[{"table_id": 1, "at_hand": 3}]"#), Ok(1));
}
