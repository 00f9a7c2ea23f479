//! Attacks on pg_lease's promise by non-superuser roles, each a test that
//! asserts the refusal (or the invariant) the README promises.
//!
//! Roles, as in the README's "Recommended grants":
//! - `migrator`: EXECUTE on protect/unprotect, owns the tables it migrates;
//! - `game_server`: INSERT on payouts, SELECT on the tables, EXECUTE on the
//!   lease functions;
//! - `app`: an application role that OWNS its tables (common in practice) but
//!   has no EXECUTE on protect/unprotect ("An application role that owns its
//!   tables therefore cannot unprotect them").

use pg_lease_sessions::*;
use postgres::Client;

/// A role name unique to this test process.
fn role(label: &str) -> String {
    format!("atk_{label}_{}", std::process::id())
}

const LEASE_GRANTS: &str = "lease.acquire(text, text, integer, regclass, text[]),
    lease.try_acquire(text, text, integer, regclass, text[]), lease.renew(text, text, bigint, integer),
    lease.renew_all(text, integer), lease.release(text, text, bigint), lease.release_all(text)";

/// `tables` and `payouts` created by the superuser, fenced, then handed to
/// the application role `app` (which gets no EXECUTE on protect/unprotect).
fn app_owned(db: &TestDb, app: &str) -> Client {
    let mut c = db.connect();
    c.batch_execute(&format!(
        "DROP ROLE IF EXISTS {app}; CREATE ROLE {app} LOGIN;
         GRANT CREATE ON SCHEMA public TO {app};
         GRANT EXECUTE ON FUNCTION {LEASE_GRANTS} TO {app};
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, amount bigint NOT NULL DEFAULT 0,
                               fencing_token bigint);
         SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
         INSERT INTO tables VALUES (1, 100), (2, 100);
         INSERT INTO payouts (table_id, fencing_token) VALUES (1, 100), (2, 100);
         ALTER TABLE tables OWNER TO {app}; ALTER TABLE payouts OWNER TO {app};
         ALTER SEQUENCE payouts_id_seq OWNER TO {app};"
    ))
    .unwrap();
    db.connect_as(app)
}

fn owner_token(c: &mut Client, id: i32) -> Option<i64> {
    c.query_opt("SELECT owner_fencing_token FROM tables WHERE id = $1", &[&id]).unwrap().and_then(|r| r.get(0))
}

/// Committed payouts whose token is not their owner row's current token
/// (no token was bumped in these tests, so there must be none).
fn stale_rows(c: &mut Client) -> i64 {
    one_i64(
        c,
        "SELECT count(*) FROM payouts p LEFT JOIN tables t ON t.id = p.table_id
          WHERE t.owner_fencing_token IS DISTINCT FROM p.fencing_token",
    )
}

/// Runs `sql`; when it fails, its SQLSTATE must be one of `allowed`.
#[track_caller]
fn refused_with_or_ok(c: &mut Client, sql: &str, allowed: &[&str]) -> String {
    let code = try_sql(c, sql);
    assert!(code.is_empty() || allowed.contains(&code.as_str()), "{sql}: unexpected SQLSTATE {code}");
    code
}

fn cleanup(c: &mut Client, roles: &[&str]) {
    for r in roles {
        let _ = c.batch_execute(&format!("ALTER ROLE {r} NOSUPERUSER"));
        let _ = c.batch_execute(&format!("DROP OWNED BY {r}"));
        let _ = c.batch_execute(&format!("DROP ROLE {r}"));
    }
}

// ---------------------------------------------------------------------------
// 1. lease.acquire is SECURITY DEFINER (extension owner, a superuser) and
//    UPDATEs the owner row with that identity: every trigger (and CHECK,
//    generated column, index expression) on the owner table runs as a
//    superuser. The owner table's owner (the migrator) plants a trigger; the
//    game server's next acquire makes the migrator a superuser.
// ---------------------------------------------------------------------------
#[test]
fn acquire_does_not_run_owner_table_triggers_as_superuser() {
    let db = TestDb::new("atk_escalate");
    let mut su = db.connect();
    let migrator = role("migrator");
    let game = role("game");
    su.batch_execute(&format!(
        "CREATE ROLE {migrator} LOGIN; CREATE ROLE {game} LOGIN;
         GRANT CREATE ON SCHEMA public TO {migrator};
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
             lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass) TO {migrator};
         GRANT EXECUTE ON FUNCTION {LEASE_GRANTS} TO {game};"
    ))
    .unwrap();
    let mut m = db.connect_as(&migrator);
    m.batch_execute(&format!(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
         SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
         INSERT INTO tables VALUES (1, NULL);
         GRANT INSERT ON payouts TO {game}; GRANT USAGE ON SEQUENCE payouts_id_seq TO {game};
         GRANT SELECT ON tables, payouts TO {game};
         CREATE TABLE seen (who name, super boolean);
         GRANT INSERT ON seen TO PUBLIC;
         CREATE FUNCTION plant() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.seen SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user;
             BEGIN
                 EXECUTE 'ALTER ROLE {migrator} SUPERUSER';
             EXCEPTION WHEN OTHERS THEN NULL;
             END;
             RETURN NEW;
         END $$;
         CREATE TRIGGER a_plant BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION plant();"
    ))
    .unwrap();
    // (Named to run before the owner guard: one named after it is refused.)
    expect_error(
        &mut m,
        "CREATE TRIGGER zz_plant BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION plant()",
        "LF008",
    );
    let mut g = db.connect_as(&game);
    // The game server's ordinary acquire (it may also refuse: that is fine).
    let _ = g.batch_execute("SELECT lease.acquire('table:1', 'host-a', 10000, 'tables', '{1}')");
    let escalated: bool =
        su.query_one(&format!("SELECT rolsuper FROM pg_roles WHERE rolname = '{migrator}'"), &[]).unwrap().get(0);
    let ran_as_super = one_i64(&mut su, "SELECT count(*) FROM seen WHERE super");
    drop((m, g));
    cleanup(&mut su, &[&migrator, &game]);
    assert!(!escalated, "the migrator became a superuser through lease.acquire");
    assert_eq!(ran_as_super, 0, "a trigger on the owner table ran as a superuser inside lease.acquire");
}

// ---------------------------------------------------------------------------
// 2. A BEFORE trigger on the owner table that sorts after
//    pg_lease_owner_guard changes NEW after the guard judged it: the token
//    goes down (LF004 promised).
// ---------------------------------------------------------------------------
#[test]
fn owner_token_cannot_be_lowered_by_a_later_before_trigger() {
    let db = TestDb::new("atk_owner_late_trigger");
    let app = role("app_olt");
    let mut a = app_owned(&db, &app);
    let create = refused_with_or_ok(
        &mut a,
        "CREATE FUNCTION lower_it() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.owner_fencing_token := 1; RETURN NEW; END $$;
         CREATE TRIGGER zz_lower BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION lower_it();",
        &["LF008"],
    );
    if create.is_empty() {
        // A legitimate-looking bump.
        refused_with_or_ok(&mut a, "UPDATE tables SET owner_fencing_token = 200 WHERE id = 1", &["LF004", "LF008"]);
    }
    let t = owner_token(&mut a, 1);
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
    assert!(t >= Some(100), "owner token went down from 100 to {t:?}");
}

// ---------------------------------------------------------------------------
// 3. A BEFORE trigger on the fenced table that sorts after pg_lease_fence
//    rewrites the token or the key after the fence accepted the row: a row
//    with a stale token (7, current 100) commits.
// ---------------------------------------------------------------------------
#[test]
fn fenced_row_cannot_be_rewritten_after_the_fence() {
    let db = TestDb::new("atk_fence_late_trigger");
    let app = role("app_flt");
    let mut a = app_owned(&db, &app);
    let create = refused_with_or_ok(
        &mut a,
        "CREATE FUNCTION restamp() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN NEW.table_id := 2; NEW.fencing_token := 7; RETURN NEW; END $$;
         CREATE TRIGGER zz_restamp BEFORE INSERT OR UPDATE ON payouts FOR EACH ROW EXECUTE FUNCTION restamp();",
        &["LF008"],
    );
    if create.is_empty() {
        refused_with_or_ok(
            &mut a,
            "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 1000, 100)",
            &["LF001", "LF008"],
        );
    }
    let stale = stale_rows(&mut a);
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(stale, 0, "a payout with a stale token committed");
}

// ---------------------------------------------------------------------------
// 4. A BEFORE UPDATE trigger returning NULL (or a DO INSTEAD NOTHING rule) on
//    the owner table swallows lease.acquire's token bump: acquire hands out a
//    new token, the owner row keeps the old one, and the previous holder's
//    writes with the old token still commit after the acquire committed.
// ---------------------------------------------------------------------------
fn bump_swallowed_by(label: &str, plant: &str) {
    let db = TestDb::new(label);
    let app = role(label);
    let mut a = app_owned(&db, &app);
    let planted = refused_with_or_ok(&mut a, plant, &["LF008"]);
    if planted.is_empty() {
        let got = a.query_one("SELECT token FROM lease.acquire('table:1', 'host-new', 10000, 'tables', '{1}')", &[]);
        if let Ok(row) = got {
            let token: i64 = row.get(0);
            assert_eq!(owner_token(&mut a, 1), Some(token), "acquire issued {token} but the owner row kept its token");
        }
        // Whatever happened, the old holder's write must not commit after a
        // committed acquire.
        if one_i64(&mut db.connect(), "SELECT count(*) FROM lease.leases WHERE name = 'table:1'") > 0 {
            expect_error(&mut a, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 5, 100)", "LF001");
        }
    }
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
}

#[test]
fn acquire_bump_cannot_be_swallowed_by_a_trigger() {
    bump_swallowed_by(
        "atk_swallow_trigger",
        "CREATE FUNCTION skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
         CREATE TRIGGER a_skip BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION skip();",
    );
}

#[test]
fn acquire_bump_cannot_be_swallowed_by_a_rule() {
    bump_swallowed_by("atk_swallow_rule", "CREATE RULE no_bump AS ON UPDATE TO tables DO INSTEAD NOTHING");
}

// ---------------------------------------------------------------------------
// 5. ALTER TABLE ... ALTER COLUMN ... TYPE <same type> USING <expr> rewrites
//    every row without firing a trigger, and the type does not change, so the
//    DDL guard sees nothing: owner tokens go down, owner rows are re-keyed,
//    fenced rows get stale tokens or move to other resources.
// ---------------------------------------------------------------------------
#[test]
fn same_type_rewrite_cannot_lower_owner_tokens() {
    let db = TestDb::new("atk_retype_owner_token");
    let app = role("app_rot");
    let mut a = app_owned(&db, &app);
    refused_with_or_ok(
        &mut a,
        "ALTER TABLE tables ALTER COLUMN owner_fencing_token TYPE bigint USING 3",
        &["LF004", "LF008"],
    );
    let t = owner_token(&mut a, 1);
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(t, Some(100), "owner token rewritten from 100 to {t:?}");
}

#[test]
fn same_type_rewrite_cannot_rekey_owner_rows() {
    let db = TestDb::new("atk_retype_owner_key");
    let app = role("app_rok");
    let mut a = app_owned(&db, &app);
    refused_with_or_ok(&mut a, "ALTER TABLE tables ALTER COLUMN id TYPE int USING id + 10", &["LF004", "LF008"]);
    let t = owner_token(&mut a, 1);
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(t, Some(100), "owner row 1 re-keyed away (its token can start over)");
}

#[test]
fn same_type_rewrite_cannot_restamp_fenced_rows() {
    let db = TestDb::new("atk_retype_fenced");
    let app = role("app_rf");
    let mut a = app_owned(&db, &app);
    refused_with_or_ok(
        &mut a,
        "ALTER TABLE payouts ALTER COLUMN fencing_token TYPE bigint USING 7",
        &["LF001", "LF008"],
    );
    refused_with_or_ok(
        &mut a,
        "ALTER TABLE payouts ALTER COLUMN table_id TYPE int USING 3 - table_id",
        &["LF001", "LF008"],
    );
    let mut su = db.connect();
    // The second statement moves rows to other resources: check with the real tokens.
    su.batch_execute("UPDATE tables SET owner_fencing_token = 100").ok();
    let stale = stale_rows(&mut su);
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(stale, 0, "fenced rows rewritten to tokens the fence never accepted");
}

// ---------------------------------------------------------------------------
// 6. ATTACH PARTITION of a *partitioned* table: the DDL guard only checks
//    ONLY <attached table> (empty: its rows live in its leaves) and only
//    partitions whose pg_inherits row is new, so stale rows come in and the
//    leaves get no TRUNCATE guard. On an owner table, TRUNCATE of such a leaf
//    deletes owner rows: tokens start over.
// ---------------------------------------------------------------------------
#[test]
fn attach_of_a_partitioned_table_is_checked_to_its_leaves() {
    let db = TestDb::new("atk_attach_subpart");
    let app = role("app_asp");
    let mut su = db.connect();
    su.batch_execute(&format!(
        "CREATE ROLE {app} LOGIN; GRANT CREATE ON SCHEMA public TO {app};
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (1, 100);
         CREATE TABLE payouts (table_id int NOT NULL, region int NOT NULL, amount bigint, fencing_token bigint)
             PARTITION BY LIST (region);
         CREATE TABLE payouts_r1 PARTITION OF payouts FOR VALUES IN (1);
         SELECT lease.protect('payouts', '{{table_id}}', 'fencing_token');
         ALTER TABLE tables OWNER TO {app}; ALTER TABLE payouts OWNER TO {app}; ALTER TABLE payouts_r1 OWNER TO {app};"
    ))
    .unwrap();
    let mut a = db.connect_as(&app);
    a.batch_execute(
        "CREATE TABLE payouts_r3 (LIKE payouts) PARTITION BY LIST (amount);
         CREATE TABLE payouts_r3_all PARTITION OF payouts_r3 DEFAULT;
         INSERT INTO payouts_r3 VALUES (1, 3, 999, 5);",
    )
    .unwrap();
    let attach = try_sql(&mut a, "ALTER TABLE payouts ATTACH PARTITION payouts_r3 FOR VALUES IN (3)");
    let stale = stale_rows(&mut a);
    let truncate = if attach.is_empty() { try_sql(&mut a, "TRUNCATE payouts_r3_all") } else { "LF008".into() };
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(stale, 0, "ATTACH brought a row with token 5 (current 100) into the fenced table (attach: {attach:?})");
    assert_eq!(truncate, "LF008", "TRUNCATE of a fenced leaf partition was not refused");
}

#[test]
fn owner_leaf_of_an_attached_partitioned_table_cannot_be_truncated() {
    let db = TestDb::new("atk_attach_owner_subpart");
    let app = role("app_aos");
    let mut su = db.connect();
    su.batch_execute(&format!(
        "CREATE ROLE {app} LOGIN; GRANT CREATE ON SCHEMA public TO {app};
         CREATE TABLE tables (id int, region int, owner_fencing_token bigint, PRIMARY KEY (id, region))
             PARTITION BY LIST (region);
         CREATE TABLE tables_r1 PARTITION OF tables FOR VALUES IN (1);
         CREATE TABLE payouts (table_id int NOT NULL, region int NOT NULL, fencing_token bigint);
         SELECT lease.protect('payouts', '{{table_id,region}}', 'fencing_token', 'tables', '{{id,region}}');
         ALTER TABLE tables OWNER TO {app}; ALTER TABLE tables_r1 OWNER TO {app}; ALTER TABLE payouts OWNER TO {app};"
    ))
    .unwrap();
    let mut a = db.connect_as(&app);
    // Separate transactions: the leaf's partition link predates the ATTACH.
    a.batch_execute(
        "CREATE TABLE tables_r2 (LIKE tables) PARTITION BY LIST (id);
         CREATE TABLE tables_r2_all PARTITION OF tables_r2 DEFAULT;",
    )
    .unwrap();
    a.batch_execute("ALTER TABLE tables ATTACH PARTITION tables_r2 FOR VALUES IN (2)").unwrap();
    a.batch_execute("INSERT INTO tables VALUES (7, 2, 100); INSERT INTO payouts VALUES (7, 2, 100);").unwrap();
    let truncate = try_sql(&mut a, "TRUNCATE tables_r2_all");
    if truncate.is_empty() {
        // The token starts over.
        a.batch_execute("INSERT INTO tables VALUES (7, 2, 1); INSERT INTO payouts VALUES (7, 2, 1)").unwrap();
    }
    let t: Option<i64> =
        a.query_one("SELECT max(owner_fencing_token) FROM tables WHERE id = 7 AND region = 2", &[]).unwrap().get(0);
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(truncate, "LF004", "TRUNCATE of an owner leaf partition was not refused; token is now {t:?}");
}

// ---------------------------------------------------------------------------
// 7. CREATE OR REPLACE TRIGGER pg_lease_fence ... EXECUTE FUNCTION <other>:
//    the replaced trigger counts as 'missing' (same name, other function),
//    which the DDL guard ignores, and nothing is dropped, so the sql_drop
//    guard never runs. The fence, the owner guard and the TRUNCATE guards can
//    all be swapped for no-ops by the tables' owner.
// ---------------------------------------------------------------------------
#[test]
fn pg_lease_triggers_cannot_be_replaced_by_other_functions() {
    let db = TestDb::new("atk_replace_trigger");
    let app = role("app_rt");
    let mut a = app_owned(&db, &app);
    a.batch_execute("CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$").unwrap();
    let fence = try_sql(
        &mut a,
        "CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON payouts
             FOR EACH ROW EXECUTE FUNCTION noop()",
    );
    let stale_insert = try_sql(&mut a, "INSERT INTO payouts (table_id, amount, fencing_token) VALUES (1, 5, 1)");
    let guard = try_sql(
        &mut a,
        "CREATE OR REPLACE TRIGGER pg_lease_owner_guard BEFORE INSERT OR UPDATE OR DELETE ON tables
             FOR EACH ROW EXECUTE FUNCTION noop()",
    );
    let lower = try_sql(&mut a, "UPDATE tables SET owner_fencing_token = 0 WHERE id = 2");
    let token = owner_token(&mut a, 2);
    let stale = stale_rows(&mut a);
    let mut su = db.connect();
    drop(a);
    cleanup(&mut su, &[&app]);
    assert_eq!(fence, "LF008", "pg_lease_fence replaced by a no-op (then a stale insert gave {stale_insert:?})");
    assert_eq!(guard, "LF008", "pg_lease_owner_guard replaced by a no-op (then lowering gave {lower:?})");
    assert_eq!(token, Some(100), "owner token went down");
    assert_eq!(stale, 0, "a stale payout committed");
}
