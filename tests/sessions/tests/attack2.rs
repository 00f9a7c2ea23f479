//! Second red-team round: attacks on pg_lease's promise over real
//! connections, each a test that asserts what the README promises (so each
//! fails while the break is open).
//!
//! Roles, as in the README's "Recommended grants":
//! - `migrator`: EXECUTE on protect/unprotect; creates and protects the tables;
//! - `app`: an application role that then OWNS the tables (common in
//!   practice) but has no EXECUTE on protect/unprotect ("An application role
//!   that owns its tables therefore cannot unprotect them");
//! - `game`: the game server (INSERT on payouts, EXECUTE on the lease functions);
//! - `ownerw`: a role allowed INSERT/UPDATE/DELETE on the owner table.
//!
//! Breaks found (see each test):
//! 1. The ATTACH PARTITION check reads owner tokens without locking them: a
//!    token bump that commits between the check and the ATTACH's commit
//!    leaves committed rows carrying the superseded token.
//! 2. The DETACH PARTITION check of an owner partition runs on the
//!    transaction's snapshot: under REPEATABLE READ it misses owner rows
//!    committed after the snapshot, which then leave the owner table with
//!    their tokens (tokens start over).
//! 3. (and 4.) The DDL guard gives new partitions no TRUNCATE guard when
//!    pg_lease's row trigger on the root was (re)written in the same
//!    transaction, which any table owner can do with CREATE OR REPLACE
//!    TRIGGER of the identical trigger: a fenced partition can then be
//!    truncated, and an owner partition truncated or detached, so owner
//!    tokens start over.
//! 5. ATTACH PARTITION of an owner partition brings owner tokens above the
//!    2^62 - 1 cap, so lease.acquire can no longer issue a token.
//! 6. DETACH PARTITION ... CONCURRENTLY of an owner partition is refused only
//!    after its first transaction committed: the partition stays detach
//!    pending, its owner rows leave the owner table, and all later DDL on
//!    protected tables fails.

use pg_lease_sessions::*;
use postgres::Client;

/// A role name unique to this test process.
fn role(label: &str) -> String {
    format!("atk2_{label}_{}", std::process::id())
}

const LEASE_GRANTS: &str = "lease.acquire(text, text, integer, regclass, text[]),
    lease.try_acquire(text, text, integer, regclass, text[]), lease.renew(text, text, bigint, integer),
    lease.renew_all(text, integer), lease.release(text, text, bigint), lease.release_all(text)";

const PROTECT_GRANTS: &str = "lease.protect(regclass, text[], name, regclass, text[], name),
    lease.protect_high_water(regclass, text[], name), lease.unprotect(regclass)";

struct Roles {
    migrator: String,
    app: String,
    game: String,
    ownerw: String,
}

impl Roles {
    fn new(label: &str) -> Roles {
        Roles {
            migrator: role(&format!("{label}_mig")),
            app: role(&format!("{label}_app")),
            game: role(&format!("{label}_game")),
            ownerw: role(&format!("{label}_ow")),
        }
    }

    fn all(&self) -> [&str; 4] {
        [&self.migrator, &self.app, &self.game, &self.ownerw]
    }
}

/// Creates the roles with the README's grants. The migrator then runs
/// `migration` (creating and protecting tables), the superuser hands every
/// table in `public` to `app`, and grants the game server and `ownerw` their
/// rights on `owner_table` / `fenced`.
fn setup(db: &TestDb, r: &Roles, migration: &str, owner_table: &str, fenced: &str) -> Client {
    let mut su = db.connect();
    for name in r.all() {
        su.batch_execute(&format!("DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN")).unwrap();
    }
    su.batch_execute(&format!(
        "GRANT CREATE ON SCHEMA public TO {mig}, {app};
         GRANT EXECUTE ON FUNCTION {PROTECT_GRANTS} TO {mig};
         GRANT EXECUTE ON FUNCTION {LEASE_GRANTS} TO {game}, {app};",
        mig = r.migrator,
        app = r.app,
        game = r.game
    ))
    .unwrap();
    db.connect_as(&r.migrator).batch_execute(migration).unwrap();
    su.batch_execute(&format!(
        "DO $$ DECLARE t regclass; BEGIN
             FOR t IN SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
                        AND c.relkind IN ('r', 'p') LOOP
                 EXECUTE format('ALTER TABLE %s OWNER TO {app}', t);
             END LOOP;
         END $$;
         GRANT SELECT, INSERT ON {fenced} TO {game};
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {game};
         GRANT SELECT ON {owner_table} TO {game};
         GRANT SELECT, INSERT, UPDATE, DELETE ON {owner_table} TO {ownerw};",
        app = r.app,
        game = r.game,
        ownerw = r.ownerw
    ))
    .unwrap();
    su
}

/// Drops the test database (whose guards may refuse to drop what a break
/// left behind), then the roles.
fn cleanup(db: TestDb, r: &Roles) {
    drop(db);
    let mut admin = connect_to("postgres", "postgres");
    for name in r.all() {
        let _ = admin.batch_execute(&format!("DROP OWNED BY {name}"));
        let _ = admin.batch_execute(&format!("DROP ROLE {name}"));
    }
}

/// Payout rows whose token is below their owner row's current token.
fn stale_payouts(c: &mut Client) -> i64 {
    one_i64(
        c,
        "SELECT count(*) FROM payouts p JOIN tables t ON t.id = p.table_id
          WHERE p.fencing_token < t.owner_fencing_token",
    )
}

const PARTITIONED_PAYOUTS: &str = "
    CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE payouts (id bigint NOT NULL, table_id int NOT NULL, amount bigint NOT NULL DEFAULT 0,
                          fencing_token bigint) PARTITION BY LIST (table_id);
    CREATE TABLE payouts_1 PARTITION OF payouts FOR VALUES IN (1);
    SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
    INSERT INTO tables VALUES (1, 5), (2, 5), (3, 5);";

const PARTITIONED_OWNER: &str = "
    CREATE TABLE tables (id int NOT NULL, owner_fencing_token bigint, PRIMARY KEY (id)) PARTITION BY RANGE (id);
    CREATE TABLE tables_a PARTITION OF tables FOR VALUES FROM (0) TO (100);
    CREATE TABLE tables_b PARTITION OF tables FOR VALUES FROM (100) TO (200);
    CREATE TABLE payouts (id bigserial PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
    SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
    INSERT INTO tables VALUES (1, 5);";

// ---------------------------------------------------------------------------
// 1. ATTACH PARTITION checks that every row it brings in carries its owner
//    row's current token, but reads the owner rows without a lock. The
//    game server's acquire (a token bump) does not wait for the ATTACH and
//    commits before it: rows with the superseded token become committed rows
//    of the fenced table after the bump committed. At READ COMMITTED.
//
//    app:  BEGIN; ALTER TABLE payouts ATTACH PARTITION p_old FOR VALUES IN (2);
//    game: SELECT lease.acquire('table:2', 'host-b', 10000, 'tables', '{2}');  -- commits: 5 -> 2^40+1
//    app:  COMMIT;   -- payouts now holds (table_id 2, token 5)
// ---------------------------------------------------------------------------
#[test]
fn attach_check_holds_against_a_bump_committed_before_the_attach() {
    let db = TestDb::new("atk2_attach_race");
    let r = Roles::new("ar");
    let mut su = setup(&db, &r, PARTITIONED_PAYOUTS, "tables", "payouts");
    let mut app = db.connect_as(&r.app);
    app.batch_execute(
        "CREATE TABLE p_old (id bigint NOT NULL, table_id int NOT NULL, amount bigint NOT NULL DEFAULT 0,
                             fencing_token bigint);
         INSERT INTO p_old VALUES (100, 2, 1000000, 5);   -- the current token of table 2, for now
         BEGIN;",
    )
    .unwrap();
    let attach = try_sql(&mut app, "ALTER TABLE payouts ATTACH PARTITION p_old FOR VALUES IN (2)");
    let mut game = db.connect_as(&r.game);
    // With a fix the bump may wait for the ATTACH: it then gives up (55P03).
    let bump = try_sql(
        &mut game,
        "SET lock_timeout = '2s'; SELECT lease.acquire('table:2', 'host-b', 10000, 'tables', '{2}')",
    );
    let commit = try_sql(&mut app, "COMMIT");
    let stale = stale_payouts(&mut su);
    drop((app, game));
    drop(su);
    cleanup(db, &r);
    assert_eq!(
        stale, 0,
        "ATTACH ({attach:?}) committed ({commit:?}) rows whose token a bump ({bump:?}) had superseded before"
    );
}

// ---------------------------------------------------------------------------
// 2. DETACH PARTITION of an owner partition is refused while it holds owner
//    rows, but the check reads the partition with the transaction's
//    snapshot: at REPEATABLE READ, an owner row committed after the snapshot
//    is not seen, leaves with the partition, and its token starts over.
//
//    app:    BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM tables_c;
//    ownerw: INSERT INTO tables VALUES (250, 7000);
//    app:    ALTER TABLE tables DETACH PARTITION tables_c; COMMIT;
//    app:    CREATE TABLE tables_c2 PARTITION OF tables FOR VALUES FROM (200) TO (300);
//            INSERT INTO tables VALUES (250, 1); INSERT INTO payouts ... token 1  -- accepted
// ---------------------------------------------------------------------------
#[test]
fn detach_of_an_owner_partition_sees_owner_rows_committed_after_its_snapshot() {
    let db = TestDb::new("atk2_detach_rr");
    let r = Roles::new("dr");
    let mut su = setup(&db, &r, PARTITIONED_OWNER, "tables", "payouts");
    let mut app = db.connect_as(&r.app);
    app.batch_execute("CREATE TABLE tables_c PARTITION OF tables FOR VALUES FROM (200) TO (300)").unwrap();
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM tables_c").unwrap();
    let mut ownerw = db.connect_as(&r.ownerw);
    ownerw.batch_execute("INSERT INTO tables VALUES (250, 7000)").unwrap();
    let detach = try_sql(&mut app, "ALTER TABLE tables DETACH PARTITION tables_c");
    let commit = try_sql(&mut app, "COMMIT");
    let kept = one_i64(&mut su, "SELECT count(*) FROM tables WHERE id = 250 AND owner_fencing_token = 7000");
    // What the break allows next: the token starts over.
    let restart = if kept == 0 {
        try_sql(
            &mut app,
            "CREATE TABLE tables_c2 PARTITION OF tables FOR VALUES FROM (200) TO (300);
             INSERT INTO tables VALUES (250, 1);
             INSERT INTO payouts (table_id, fencing_token) VALUES (250, 1);",
        )
    } else {
        String::new()
    };
    drop((app, ownerw));
    drop(su);
    cleanup(db, &r);
    assert_eq!(
        kept, 1,
        "DETACH ({detach:?}, commit {commit:?}) took owner row 250 (token 7000) out of the owner table; \
         re-inserting it with token 1 and writing with token 1 then gave {restart:?} (empty = accepted)"
    );
}

// ---------------------------------------------------------------------------
// 3. The DDL guard installs the TRUNCATE guard of a new partition only if
//    pg_lease_fence on the root was not written in the current transaction
//    (meant for pg_restore). CREATE OR REPLACE TRIGGER of the identical
//    trigger, which the table's owner may run, rewrites that pg_trigger row:
//    partitions created in the same transaction get no TRUNCATE guard, and
//    their rows can be erased without a token (LF008 promised).
//
//    app: BEGIN;
//         CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON payouts
//             FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger();
//         CREATE TABLE payouts_9 PARTITION OF payouts FOR VALUES IN (9);
//         COMMIT;
//         TRUNCATE payouts_9;   -- succeeds
// ---------------------------------------------------------------------------
#[test]
fn replacing_the_fence_trigger_does_not_exempt_new_partitions_from_the_truncate_guard() {
    let db = TestDb::new("atk2_trunc_part");
    let r = Roles::new("tp");
    let mut su = setup(&db, &r, PARTITIONED_PAYOUTS, "tables", "payouts");
    let mut app = db.connect_as(&r.app);
    // (A fix may refuse the replacement: then the partition is created alone.)
    let replaced = try_sql(
        &mut app,
        "BEGIN;
         CREATE OR REPLACE TRIGGER pg_lease_fence BEFORE INSERT OR UPDATE OR DELETE ON payouts
             FOR EACH ROW EXECUTE FUNCTION lease.fence_trigger();
         CREATE TABLE payouts_9 PARTITION OF payouts FOR VALUES IN (9);
         COMMIT;",
    );
    let _ = app.batch_execute("ROLLBACK");
    app.batch_execute(
        "CREATE TABLE IF NOT EXISTS payouts_9 PARTITION OF payouts FOR VALUES IN (9);
         INSERT INTO tables VALUES (9, 50);
         INSERT INTO payouts (id, table_id, amount, fencing_token) VALUES (1, 9, 10, 50);",
    )
    .unwrap();
    // A DELETE without a token is refused; TRUNCATE of the fenced partition must be too.
    expect_error(&mut app, "DELETE FROM payouts WHERE table_id = 9", "LF003");
    let truncate = try_sql(&mut app, "TRUNCATE payouts_9");
    let left = one_i64(&mut su, "SELECT count(*) FROM payouts WHERE table_id = 9");
    drop(app);
    drop(su);
    cleanup(db, &r);
    assert_eq!(
        truncate, "LF008",
        "TRUNCATE of a fenced partition created after CREATE OR REPLACE TRIGGER pg_lease_fence \
         ({replaced:?}) was not refused; {left} row(s) left"
    );
}

// ---------------------------------------------------------------------------
// 4. The same on the owner side, where it lets tokens start over: after
//    CREATE OR REPLACE TRIGGER pg_lease_owner_guard (identical), an owner
//    partition created in the same transaction gets no owner TRUNCATE guard;
//    TRUNCATE erases its owner rows with their tokens (LF004 promised), and
//    since the DETACH check looks for that guard, DETACH takes them out too.
//
//    app: BEGIN;
//         CREATE OR REPLACE TRIGGER pg_lease_owner_guard BEFORE INSERT OR UPDATE OR DELETE ON tables
//             FOR EACH ROW EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
//         CREATE TABLE tables_d PARTITION OF tables FOR VALUES FROM (300) TO (400);
//         COMMIT;
//         INSERT INTO tables VALUES (350, 9000); INSERT INTO payouts ... (350, token 9000);
//         TRUNCATE tables_d; INSERT INTO tables VALUES (350, 1);
//         INSERT INTO payouts ... (350, token 1);   -- accepted after a bump to 9000 committed
// ---------------------------------------------------------------------------
#[test]
fn replacing_the_owner_guard_does_not_exempt_new_owner_partitions() {
    let db = TestDb::new("atk2_trunc_owner");
    let r = Roles::new("to");
    let mut su = setup(&db, &r, PARTITIONED_OWNER, "tables", "payouts");
    let mut app = db.connect_as(&r.app);
    let replaced = try_sql(
        &mut app,
        "BEGIN;
         CREATE OR REPLACE TRIGGER pg_lease_owner_guard BEFORE INSERT OR UPDATE OR DELETE ON tables
             FOR EACH ROW EXECUTE FUNCTION lease.owner_guard('owner_fencing_token', 'id');
         CREATE TABLE tables_d PARTITION OF tables FOR VALUES FROM (300) TO (400);
         CREATE TABLE tables_e PARTITION OF tables FOR VALUES FROM (400) TO (500);
         COMMIT;",
    );
    let _ = app.batch_execute("ROLLBACK");
    app.batch_execute(
        "CREATE TABLE IF NOT EXISTS tables_d PARTITION OF tables FOR VALUES FROM (300) TO (400);
         CREATE TABLE IF NOT EXISTS tables_e PARTITION OF tables FOR VALUES FROM (400) TO (500);
         INSERT INTO tables VALUES (350, 9000), (450, 9000);
         INSERT INTO payouts (table_id, fencing_token) VALUES (350, 9000), (450, 9000);",
    )
    .unwrap();
    let truncate = try_sql(&mut app, "TRUNCATE tables_d");
    let detach = try_sql(&mut app, "ALTER TABLE tables DETACH PARTITION tables_e");
    // Whatever got through: can the tokens start over?
    let _ =
        app.batch_execute("CREATE TABLE IF NOT EXISTS tables_e2 PARTITION OF tables FOR VALUES FROM (400) TO (500)");
    let _ = app.batch_execute("INSERT INTO tables VALUES (350, 1)");
    let _ = app.batch_execute("INSERT INTO tables VALUES (450, 1)");
    let _ = app.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (350, 1)");
    let _ = app.batch_execute("INSERT INTO payouts (table_id, fencing_token) VALUES (450, 1)");
    let low = one_i64(&mut su, "SELECT count(*) FROM payouts WHERE fencing_token = 1");
    drop(app);
    drop(su);
    cleanup(db, &r);
    assert_eq!(truncate, "LF004", "TRUNCATE of an owner partition was not refused (replace: {replaced:?})");
    assert_eq!(detach, "LF004", "DETACH of an owner partition holding owner rows was not refused");
    assert_eq!(low, 0, "writes with token 1 committed after owner tokens 9000 had committed");
}

// ---------------------------------------------------------------------------
// 5. "A role other than a superuser cannot set an owner token above
//    2^62 - 1 (22003), so lease.acquire can always go higher." ATTACH
//    PARTITION of an owner partition brings in owner rows no row trigger
//    checked: a token of 2^63 - 1 and acquire is out of tokens for good.
//
//    app: CREATE TABLE tables_x (id int NOT NULL, owner_fencing_token bigint, PRIMARY KEY (id));
//         INSERT INTO tables_x VALUES (450, 9223372036854775807);
//         ALTER TABLE tables ATTACH PARTITION tables_x FOR VALUES FROM (400) TO (500);
//    game: SELECT lease.acquire('t450', 'h', 10000, 'tables', '{450}');  -- 22003, forever
// ---------------------------------------------------------------------------
#[test]
fn attached_owner_rows_respect_the_token_cap() {
    let db = TestDb::new("atk2_attach_cap");
    let r = Roles::new("ac");
    let su = setup(&db, &r, PARTITIONED_OWNER, "tables", "payouts");
    let mut app = db.connect_as(&r.app);
    // The direct way is refused.
    expect_error(&mut app, "INSERT INTO tables VALUES (50, 9223372036854775807)", "22003");
    app.batch_execute(
        "CREATE TABLE tables_x (id int NOT NULL, owner_fencing_token bigint, PRIMARY KEY (id));
         INSERT INTO tables_x VALUES (450, 9223372036854775807);",
    )
    .unwrap();
    let attach = try_sql(&mut app, "ALTER TABLE tables ATTACH PARTITION tables_x FOR VALUES FROM (400) TO (500)");
    let mut game = db.connect_as(&r.game);
    let acquire = if attach.is_empty() {
        try_sql(&mut game, "SELECT lease.acquire('t450', 'host-a', 10000, 'tables', '{450}')")
    } else {
        String::new()
    };
    drop((app, game));
    drop(su);
    cleanup(db, &r);
    assert!(
        !attach.is_empty() || acquire.is_empty(),
        "ATTACH brought in an owner token above the cap; lease.acquire then failed with {acquire}"
    );
}

// ---------------------------------------------------------------------------
// 6. DETACH PARTITION ... CONCURRENTLY of an owner partition runs in two
//    transactions; the DDL guard's LF004 comes in the second, after the
//    first committed. The partition is left "detach pending": its owner rows
//    (and their tokens) are gone from the owner table (fenced writes get
//    LF007, acquire cannot find the row), and every later DDL that concerns
//    a protected table, FINALIZE included, fails with LF004.
//
//    ownerw: INSERT INTO tables VALUES (150, 7000);
//    app:    ALTER TABLE tables DETACH PARTITION tables_b CONCURRENTLY;   -- LF004, but half done
//    game:   INSERT INTO payouts (table_id, fencing_token) VALUES (150, 7000);  -- LF007
// ---------------------------------------------------------------------------
#[test]
fn a_refused_concurrent_detach_leaves_the_owner_table_whole() {
    let db = TestDb::new("atk2_detach_conc");
    let r = Roles::new("dc");
    let mut su = setup(&db, &r, PARTITIONED_OWNER, "tables", "payouts");
    let mut ownerw = db.connect_as(&r.ownerw);
    ownerw.batch_execute("INSERT INTO tables VALUES (150, 7000)").unwrap();
    let mut app = db.connect_as(&r.app);
    let detach = try_sql(&mut app, "ALTER TABLE tables DETACH PARTITION tables_b CONCURRENTLY");
    let visible = one_i64(&mut su, "SELECT count(*) FROM tables WHERE id = 150 AND owner_fencing_token = 7000");
    let pending = one_i64(&mut su, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending");
    let mut game = db.connect_as(&r.game);
    let write = try_sql(&mut game, "INSERT INTO payouts (table_id, fencing_token) VALUES (150, 7000)");
    let later_ddl = try_sql(&mut app, "ALTER TABLE payouts ADD COLUMN note text");
    drop((app, game, ownerw));
    drop(su);
    cleanup(db, &r);
    assert_eq!(detach, "LF004", "DETACH CONCURRENTLY of an owner partition holding owner rows");
    assert_eq!(
        (visible, pending),
        (1, 0),
        "the refused DETACH CONCURRENTLY left the owner partition detach-pending and its owner row out of the \
         owner table (fenced write: {write:?}, later DDL on a protected table: {later_ddl:?})"
    );
    assert_eq!(write, "", "a write with the current token of an owner row was refused");
    assert_eq!(later_ddl, "", "DDL on a protected table fails after the refused DETACH CONCURRENTLY");
}
