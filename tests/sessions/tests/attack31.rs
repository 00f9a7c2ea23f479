//! Attack review 31: pg_lease under logical replication and role switching,
//! over real connections and real clusters on PostgreSQL 18.6 (pg_lease built
//! from main at bfe4236, installed in /opt/pg_lease/pg18). Tests of 16/17
//! features return early (saying why) on an older server.
//!
//! (Session 17: all three holes closed. A table synchronization worker's
//! catch-up is judged: only the copy itself, while `pg_subscription_rel`
//! says `d`, is taken unjudged. A trusted subscription never takes a token
//! away from an owner row: an update that would lower it applies with the
//! local token kept, a delete of a row with a token is skipped, each
//! logged; two-way replication then converges on the higher token.)
//!
//! Findings, most severe first:
//!
//! - **Hole (medium): rows a trusted table-sync worker applies after its
//!   copy (its catch-up) are taken unjudged by a high-water table.** README
//!   (Logical replication): high-water tables judge replicated changes,
//!   "except a table's initial copy by a trusted subscription ... what
//!   follows the copy is judged against them". `replication::initial_copy()`
//!   is true for everything the table-sync process applies, the catch-up
//!   stream after the COPY included. Reproduction: publisher (no pg_lease:
//!   the untrusted log a high-water fence is for) `CREATE TABLE ledger (id
//!   int PRIMARY KEY, k int, token bigint); INSERT INTO ledger VALUES (1, 2,
//!   9); CREATE PUBLICATION hw FOR TABLE ledger`; subscriber `SELECT
//!   lease.protect_high_water('ledger', '{k}', 'token')`, a session holds
//!   `BEGIN; INSERT INTO ledger VALUES (1, 99, 1)` (the sync's COPY waits on
//!   it, after its slot took its snapshot), superuser `CREATE SUBSCRIPTION
//!   hw ...`; the publisher then commits `INSERT INTO ledger VALUES (2, 2,
//!   3)`; once the apply worker has passed that LSN the session rolls back.
//!   The sync worker copies (1, 2, 9) (mark 9), then catches up and applies
//!   (2, 2, 3) unjudged: the subscriber holds a row at token 3 for key 2
//!   under a mark of 9, counted as `replicated` (2), no refusal
//!   (`rows_after_a_high_water_tables_initial_copy_are_judged_even_in_the_sync_workers_catch_up`,
//!   fails). Fix: trust as a copy only what `copy_table` inserts (e.g. note
//!   the sync worker's state: `SUBREL_STATE_DATASYNC` until FINISHEDCOPY),
//!   or say in the README that the catch-up is taken too.
//! - **Hole (medium): bidirectional replication (`origin = none`, 16+)
//!   lowers a node's owner token, and a stale write then commits there.**
//!   Two nodes, both with pg_lease and the same fenced `payouts` / owner
//!   `tables`, each `CREATE SUBSCRIPTION ... WITH (origin = none, copy_data
//!   = false)` to the other as superuser (trusted). Node A: `lease.acquire
//!   ('table:1', 'host-a', ...)`, `lease.release`, `lease.acquire('table:1',
//!   'host-x', ...)` = 1099511627778, a payout at it; node B meanwhile:
//!   `lease.acquire('table:1', 'host-b', ...)` = 1099511627777, a payout at
//!   it. When the links come up, B's owner-row UPDATE is applied on A
//!   unjudged (trusted): A's `owner_fencing_token` goes from ...778 down to
//!   ...777, and `INSERT INTO payouts VALUES ('stale', 1, 1099511627777)`
//!   commits on A after host-x's bump committed there. README, What is
//!   guaranteed: "a resource's current token never goes down", no committed
//!   write older than a bump that committed before it; the Logical
//!   replication section's reasoning ("the subscriber's own state lags by
//!   design") does not hold when both nodes issue tokens, and nothing says
//!   bidirectional setups are out
//!   (`a_nodes_owner_token_never_goes_down_under_bidirectional_replication`,
//!   fails). Fix: never apply a trusted owner-row update that lowers the
//!   local token (skip it, or refuse so it is reported), or document that
//!   `origin = none` topologies need `judge_replicated` / are unsupported.
//! - **Hole (low): a publication row filter on the owner table deletes an
//!   owner row that carries a token on every subscriber.** Publisher (with
//!   pg_lease): `ALTER TABLE tables REPLICA IDENTITY FULL; CREATE
//!   PUBLICATION game FOR TABLE tables WHERE (name <> 'retired'), payouts`;
//!   `UPDATE tables SET name = 'retired' WHERE id = 1` is allowed by the
//!   owner guard (key and token unchanged), and logical replication sends it
//!   as a DELETE: the trusted subscriber deletes owner row 1 with its token 7
//!   (its fence then says LF007, and after a cutover the row comes back
//!   without its token history). README: owner rows that carry a token can
//!   never be deleted; the subscriber carries owner rows and their tokens
//!   (`a_row_filter_on_the_owner_table_never_deletes_an_owner_row_with_a_token_on_the_subscriber`,
//!   fails). (A column list leaving out `owner_fencing_token` loses the
//!   tokens the same way; not kept as a test.) Fix: `protect` / the DDL guard
//!   could refuse (or warn about) publications of an owner table with a row
//!   filter or a column list without the token column; or a trusted DELETE of
//!   an owner row with a token could be skipped.
//! - **Defence holds: a subscription owned by a non-superuser** (member of
//!   `pg_create_subscription` and of the tables' owner, `password_required =
//!   false`, `run_as_owner = false`, `streaming = parallel` with the
//!   publisher's `debug_logical_replication_streaming = immediate`, so
//!   parallel apply workers apply, `binary = true`): a rewound owner token
//!   (`UPDATE tables SET owner_fencing_token = 3 WHERE id = 1`, current 7) is
//!   refused (LF004), a stale payout (5 under 7) is refused (LF001), nothing
//!   counted as replicated, `lease.audit_status()` names the subscription,
//!   and the audit records table, key, tokens and `role` = the subscription
//!   owner (`a_non_superuser_subscription_cannot_push_stale_payouts_or_rewind_owner_tokens`).
//! - **Defence holds: `event_triggers = off` set any way a role granted SET
//!   on it can** (`SET`, `SET LOCAL`, `set_config`, `ALTER ROLE ... IN
//!   DATABASE ... SET`, PGOPTIONS `-c event_triggers=off`, a function's SET
//!   clause, a DO block, a procedure that commits between `set_config` and
//!   the DDL) against DROP TRIGGER, DISABLE TRIGGER (one, ALL; on the owner
//!   table too), RENAME COLUMN, ALTER COLUMN TYPE, a late BEFORE trigger,
//!   dropping the owner key, SET UNLOGGED, DROP TABLE of the owner table,
//!   CREATE RULE: all `LF008`, and the fence still works
//!   (`event_triggers_off_set_any_way_refuses_every_command_on_fenced_and_owner_tables`).
//! - **Defence holds: the audit's `role` under `SET SESSION AUTHORIZATION`**
//!   (a superuser session become the app role), through a SECURITY DEFINER
//!   wrapper owned by the migrator, through `lease.fenced_boundary_write`,
//!   and after `SET ROLE` to a role the app is a member of: every stale
//!   write refused (LF001) and recorded with the session's role, table, key
//!   and tokens
//!   (`the_audit_names_the_role_the_session_wrote_as_under_session_authorization_and_definer_wrappers`).
//!
//! Looked at, no hole found (not kept as tests): a demoted or re-owned
//! subscription (PostgreSQL 16+ restarts the worker when the owner changes,
//! and trust reads `superuser_arg` fresh); user code in the worker (ALWAYS
//! AFTER triggers, deferred constraint triggers at commit, column defaults)
//! writes through SPI, hence ExecutorRun, and is judged; FK actions do not
//! fire in apply workers; lease.* changes are skipped whatever the
//! subscription's trust; `pg_lease.trusted_subscription_owners` cannot be set
//! per role or database (SIGHUP); `creating_extension` exempts only extension
//! scripts, and the only trusted extension installed here is plpgsql. Not
//! tried for lack of time: `two_phase = true`, `publish_via_partition_root`
//! with partitioned owner tables, `ALTER SUBSCRIPTION ... SKIP` of a
//! transaction mixing fenced and lease.* changes. Side note: a refusal in an
//! apply worker is audited with `client_addr` `[local]`.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

fn pg_lsn(c: &mut Client, sql: &str) -> String {
    c.query_one(&format!("SELECT ({sql})::text"), &[]).unwrap().get(0)
}

/// Whether LSN `a` (text) has reached `b`, asked of `c`.
fn lsn_reached(c: &mut Client, a: Option<String>, b: &str) -> bool {
    let Some(a) = a else { return false };
    c.query_one("SELECT $1::text::pg_lsn >= $2::text::pg_lsn", &[&a, &b]).unwrap().get(0)
}

// ---------------------------------------------------------------------------
// 1. High-water: rows a trusted table-sync worker applies AFTER its copy
//    (the catch-up) are taken unjudged.
// ---------------------------------------------------------------------------

#[test]
fn rows_after_a_high_water_tables_initial_copy_are_judged_even_in_the_sync_workers_catch_up() {
    if !at_least(16, "the same steps on 16+ (run on 18 here)") {
        return;
    }
    let publisher = Cluster::start_with("a31_hw_pub", 54560, &["wal_level = logical"]);
    let subscriber = Cluster::start("a31_hw_sub", 54561);
    // The publisher is the untrusted log a high-water fence is for: no
    // pg_lease there. Key 2's history is at token 9.
    let mut p = publisher.connect();
    p.batch_execute(
        "CREATE TABLE ledger (id int PRIMARY KEY, k int, token bigint);
         INSERT INTO ledger VALUES (1, 2, 9);
         CREATE PUBLICATION hw FOR TABLE ledger;",
    )
    .unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(
        "CREATE EXTENSION pg_lease;
         CREATE TABLE ledger (id int PRIMARY KEY, k int, token bigint);
         SELECT lease.protect_high_water('ledger', '{k}', 'token');",
    )
    .unwrap();
    // A subscriber session holds an uncommitted row with id 1 (another
    // resource, k = 99): the table-sync worker's COPY waits on it, after
    // its slot took the snapshot the copy reads.
    let mut blocker = subscriber.connect();
    blocker.batch_execute("BEGIN; INSERT INTO ledger VALUES (1, 99, 1)").unwrap();
    s.batch_execute(&format!("CREATE SUBSCRIPTION hw CONNECTION '{}' PUBLICATION hw", publisher.conninfo())).unwrap();
    let mut sync_pid = 0;
    wait_for("the table-sync worker", Duration::from_secs(30), || {
        sync_pid = s
            .query_opt("SELECT pid FROM pg_stat_subscription WHERE relid IS NOT NULL AND pid IS NOT NULL", &[])
            .unwrap()
            .map_or(0, |r| r.get(0));
        sync_pid != 0
    });
    wait_until_blocked(&mut s, sync_pid);
    // The publisher's log now carries a row for key 2 at token 3: stale
    // against the copied mark (9), committed after the copy's snapshot.
    p.batch_execute("INSERT INTO ledger VALUES (2, 2, 3)").unwrap();
    let after = pg_lsn(&mut p, "pg_current_wal_lsn()");
    // The apply worker has received it (and skipped it: the table is not
    // synchronized yet), so the sync worker must catch up to it.
    wait_for("the apply worker to pass the stale row", Duration::from_secs(30), || {
        let lsn: Option<String> = s
            .query_opt("SELECT latest_end_lsn::text FROM pg_stat_subscription WHERE relid IS NULL", &[])
            .unwrap()
            .and_then(|r| r.get(0));
        lsn_reached(&mut s, lsn, &after)
    });
    blocker.batch_execute("ROLLBACK").unwrap();
    // Either the table gets synchronized, or a refusal holds it back.
    wait_for("the sync to finish or be refused", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            || subscriber.log_has("StaleOwnerBoundaryWrite")
    });
    let mark: i64 = one_i64(&mut s, "SELECT max(token) FROM lease.high_water");
    assert_eq!(mark, 9, "the copied row raised the mark to 9");
    // README (Logical replication): a trusted subscription's initial copy
    // is taken whatever its order, "what follows the copy is judged against
    // them". The row at 3 followed the copy.
    let stale = one_i64(&mut s, "SELECT count(*) FROM ledger WHERE id = 2");
    s.batch_execute("DROP SUBSCRIPTION hw").ok();
    assert_eq!(
        stale, 0,
        "a row at token 3 for key 2 that the publisher committed after the copy (mark 9) was applied unjudged by the table-sync worker's catch-up"
    );
}

// ---------------------------------------------------------------------------
// 2. Bidirectional replication (origin = none, PostgreSQL 16+): each node
//    trusts the other's owner-row updates, so a node's token goes down.
// ---------------------------------------------------------------------------

fn acquire(c: &mut Client, owner: &str) -> i64 {
    c.query_one(&format!("SELECT token FROM lease.acquire('table:1', '{owner}', 60000, 'tables', '{{1}}')"), &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_nodes_owner_token_never_goes_down_under_bidirectional_replication() {
    if !at_least(16, "origin = none") {
        return;
    }
    let a = Cluster::start_with("a31_bi_a", 54562, &["wal_level = logical"]);
    let b = Cluster::start_with("a31_bi_b", 54563, &["wal_level = logical"]);
    let setup = "CREATE EXTENSION pg_lease;
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (id text PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         INSERT INTO tables VALUES (1, NULL);
         CREATE PUBLICATION game FOR TABLE tables, payouts;";
    let mut ca = a.connect();
    let mut cb = b.connect();
    ca.batch_execute(setup).unwrap();
    cb.batch_execute(setup).unwrap();
    // Each node subscribes to the other's changes that originated there
    // (origin = none: no loop), as superuser: trusted both ways.
    for (node, other, name) in [(&mut ca, &b, "from_b"), (&mut cb, &a, "from_a")] {
        node.batch_execute(&format!(
            "CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION game
                 WITH (origin = none, copy_data = false, enabled = false)",
            other.conninfo()
        ))
        .unwrap();
    }
    // Node A: host-a took table 1, released it, host-x took it over and
    // paid with its token.
    let first = acquire(&mut ca, "host-a");
    ca.batch_execute(&format!("SELECT lease.release('table:1', 'host-a', {first})")).unwrap();
    let current = acquire(&mut ca, "host-x");
    ca.batch_execute(&format!("INSERT INTO payouts VALUES ('a1', 1, {current})")).unwrap();
    // Node B (meanwhile, its own lease service): host-b took table 1 once.
    let older = acquire(&mut cb, "host-b");
    cb.batch_execute(&format!("INSERT INTO payouts VALUES ('b1', 1, {older})")).unwrap();
    assert!(older < current, "B's token {older} is below A's {current}");
    // The links come up.
    ca.batch_execute("ALTER SUBSCRIPTION from_b ENABLE").unwrap();
    cb.batch_execute("ALTER SUBSCRIPTION from_a ENABLE").unwrap();
    wait_for("B's changes to reach A", Duration::from_secs(60), || {
        one_i64(&mut ca, "SELECT count(*) FROM payouts WHERE id = 'b1'") == 1
    });
    let on_a = one_i64(&mut ca, "SELECT owner_fencing_token FROM tables WHERE id = 1");
    println!("A: host-x's token {current}, B's {older}; A's owner row now {on_a}");
    // README, What is guaranteed: "a resource's current token never goes
    // down", and no committed write carries a token older than a bump that
    // committed before it. On A, host-x's bump committed first.
    let stale = try_sql(&mut ca, &format!("INSERT INTO payouts VALUES ('stale', 1, {older})"));
    ca.batch_execute("ALTER SUBSCRIPTION from_b DISABLE; DROP SUBSCRIPTION from_b").ok();
    cb.batch_execute("ALTER SUBSCRIPTION from_a DISABLE; DROP SUBSCRIPTION from_a").ok();
    assert!(
        on_a >= current,
        "node A's owner token went down from {current} to {on_a} (B's update applied unjudged); a payout at {older} there: {stale}"
    );
    assert_eq!(stale, "LF001", "a write at B's older token {older} on A after A's bump to {current}");
}

// ---------------------------------------------------------------------------
// 3. A subscription owned by a non-superuser (PostgreSQL 16+:
//    pg_create_subscription), applying as the table owner (run_as_owner =
//    false), through parallel apply workers (streaming = parallel), binary.
// ---------------------------------------------------------------------------

#[test]
fn a_non_superuser_subscription_cannot_push_stale_payouts_or_rewind_owner_tokens() {
    if !at_least(16, "pg_create_subscription, run_as_owner, streaming = parallel") {
        return;
    }
    // Every transaction streamed: the subscriber's parallel apply workers
    // apply them.
    let publisher = Cluster::start_with(
        "a31_np_pub",
        54564,
        &["wal_level = logical", "debug_logical_replication_streaming = immediate"],
    );
    let subscriber = Cluster::start("a31_np_sub", 54565);
    // The publisher is the subscription owner's: no pg_lease there.
    let mut p = publisher.connect();
    p.batch_execute(
        "CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (id text PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
         INSERT INTO tables VALUES (1, 7), (2, 7);
         CREATE PUBLICATION own FOR TABLE tables;
         CREATE PUBLICATION pay FOR TABLE payouts;",
    )
    .unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(
        "CREATE EXTENSION pg_lease;
         CREATE ROLE migrator LOGIN;
         GRANT CREATE ON SCHEMA public TO migrator;
         GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO migrator;
         SET ROLE migrator;
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE payouts (id text PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         INSERT INTO tables VALUES (1, 7), (2, 7);
         RESET ROLE;
         CREATE ROLE subown LOGIN IN ROLE pg_create_subscription, migrator;
         GRANT CREATE ON DATABASE postgres TO subown;",
    )
    .unwrap();
    for (name, publication) in [("own_s", "own"), ("pay_s", "pay")] {
        s.batch_execute(&format!(
            "CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION {publication}
                 WITH (enabled = false, copy_data = false, password_required = false, run_as_owner = false,
                       streaming = parallel, binary = true, disable_on_error = false)",
            publisher.conninfo()
        ))
        .unwrap();
        s.batch_execute(&format!("ALTER SUBSCRIPTION {name} OWNER TO subown")).unwrap();
        s.batch_execute(&format!("ALTER SUBSCRIPTION {name} ENABLE")).unwrap();
    }
    wait_for("both apply workers", Duration::from_secs(30), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL") >= 2
    });
    // Through subscription own_s: table 1's token rewound, table 2's token
    // moved to key 3. Through pay_s: a payout at 5 (current 7).
    p.batch_execute("UPDATE tables SET owner_fencing_token = 3 WHERE id = 1").unwrap();
    p.batch_execute("UPDATE tables SET id = 3 WHERE id = 2").unwrap();
    p.batch_execute("INSERT INTO payouts VALUES ('stale', 1, 5)").unwrap();
    wait_for("both refusals", Duration::from_secs(60), || {
        subscriber.log_has("FencingTokenRegression") && subscriber.log_has("StaleOwnerBoundaryWrite")
    });
    assert_eq!(
        s.query_one("SELECT string_agg(id || '=' || owner_fencing_token, ',' ORDER BY id) FROM tables", &[])
            .unwrap()
            .get::<_, String>(0),
        "1=7,2=7"
    );
    assert_eq!(one_i64(&mut s, "SELECT count(*) FROM payouts"), 0);
    assert_eq!(one_i64(&mut s, "SELECT coalesce(sum(replicated), 0)::bigint FROM lease.stats"), 0);
    // Nothing stuck silently: audit_status names the subscriptions, and the
    // refused payout is audited.
    wait_for("the audit", Duration::from_secs(30), || {
        one_i64(&mut s, "SELECT count(*) FROM lease.rejected_writes WHERE error_name = 'StaleOwnerBoundaryWrite'") >= 1
    });
    let status: String = s.query_one("SELECT status FROM lease.audit_status()", &[]).unwrap().get(0);
    assert!(status.contains("subscription pay_s had"), "{status}");
    let row = s
        .query_one(
            "SELECT role, target_table, resource_key, presented_token, current_token FROM lease.rejected_writes
              WHERE error_name = 'StaleOwnerBoundaryWrite' ORDER BY id LIMIT 1",
            &[],
        )
        .unwrap();
    let (role, table, key, presented, current): (String, String, String, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    println!("audited: role {role}, {table} {key} {presented}/{current}");
    assert_eq!((table.as_str(), key.as_str(), presented, current), ("public.payouts", "(table_id)=(1)", 5, 7));
    // The worker's session role: the subscription owner it connected as.
    assert_eq!(role, "subown");
    for name in ["own_s", "pay_s"] {
        s.batch_execute(&format!("ALTER SUBSCRIPTION {name} DISABLE")).ok();
        s.batch_execute(&format!("DROP SUBSCRIPTION {name}")).ok();
    }
}

// ---------------------------------------------------------------------------
// 4. event_triggers = off (PostgreSQL 17+), every way a role granted SET on
//    it can set it, against every command that reaches a fenced or owner
//    table.
// ---------------------------------------------------------------------------

fn poker_owned_by(label: &str) -> (TestDb, String) {
    let db = TestDb::new(label);
    let role = format!("{}_mig", db.name);
    let mut c = db.connect();
    must_run(
        &mut c,
        &format!(
            "CREATE ROLE {role} LOGIN; GRANT CONNECT ON DATABASE {db} TO {role};
             GRANT CREATE ON SCHEMA public TO {role};
             GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name) TO {role};
             SET ROLE {role};
             {POKER}
             RESET ROLE;",
            db = db.name
        ),
    );
    (db, role)
}

#[test]
fn event_triggers_off_set_any_way_refuses_every_command_on_fenced_and_owner_tables() {
    if !at_least(17, "event_triggers") {
        return;
    }
    let (db, role) = poker_owned_by("a31_evt");
    let mut c = db.connect();
    must_run(&mut c, &format!("GRANT SET ON PARAMETER event_triggers TO {role}"));
    let commands = [
        "DROP TRIGGER pg_lease_fence ON payouts",
        "ALTER TABLE payouts DISABLE TRIGGER ALL",
        "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence",
        "ALTER TABLE payouts RENAME COLUMN fencing_token TO t",
        "ALTER TABLE payouts ALTER COLUMN fencing_token TYPE bigint",
        "CREATE TRIGGER zz BEFORE INSERT ON payouts FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "ALTER TABLE tables DROP CONSTRAINT tables_pkey",
        "ALTER TABLE tables SET UNLOGGED",
        "DROP TABLE tables CASCADE",
        "CREATE RULE r AS ON INSERT TO payouts DO INSTEAD NOTHING",
        "ALTER TABLE tables DISABLE TRIGGER ALL",
    ];
    // Ways the role itself can turn it off (the role's own ALTER ROLE SET is
    // a superuser's: done here by one, as a DBA would for a loader).
    must_run(&mut c, &format!("ALTER ROLE {role} IN DATABASE {} SET event_triggers = off", db.name));
    let mut byrole = db.connect_as(&role);
    let off: String = byrole.query_one("SHOW event_triggers", &[]).unwrap().get(0);
    assert_eq!(off, "off", "ALTER ROLE ... SET applied");
    let mut by_options = {
        let mut config = postgres::Config::new();
        config.host("127.0.0.1").port(port()).user(&role).dbname(&db.name).options("-c event_triggers=off");
        config.connect(postgres::NoTls).unwrap()
    };
    must_run(&mut c, &format!("ALTER ROLE {role} IN DATABASE {} RESET event_triggers", db.name));
    let mut plain = db.connect_as(&role);
    must_run(
        &mut plain,
        "CREATE FUNCTION run_off(cmd text) RETURNS void LANGUAGE plpgsql SET event_triggers = off
             AS $$ BEGIN EXECUTE cmd; END $$;
         CREATE PROCEDURE run_committed(cmd text) LANGUAGE plpgsql
             AS $$ BEGIN PERFORM set_config('event_triggers', 'off', false); COMMIT; EXECUTE cmd; END $$;",
    );
    for cmd in commands {
        let q = cmd.replace('\'', "''");
        let attempts: Vec<(&str, &mut Client, String)> =
            vec![("ALTER ROLE SET", &mut byrole, cmd.to_owned()), ("PGOPTIONS", &mut by_options, cmd.to_owned())];
        for (how, client, sql) in attempts {
            let got = try_sql(client, &sql);
            assert_eq!(got, "LF008", "{how}: {cmd}");
        }
        for (how, sql) in [
            ("SET", format!("SET event_triggers = off; {cmd}")),
            ("SET LOCAL", format!("BEGIN; SET LOCAL event_triggers = off; {cmd}; COMMIT")),
            ("set_config", format!("SELECT set_config('event_triggers', 'off', true); {cmd}")),
            ("function SET clause", format!("SELECT run_off('{q}')")),
            ("DO", format!("DO $$ BEGIN PERFORM set_config('event_triggers', 'off', true); EXECUTE '{q}'; END $$")),
            ("procedure with COMMIT", format!("CALL run_committed('{q}')")),
        ] {
            let got = try_sql(&mut plain, &sql);
            plain.batch_execute("ROLLBACK; RESET event_triggers").ok();
            assert_eq!(got, "LF008", "{how}: {cmd}");
        }
    }
    // The fence is whole.
    expect_error(&mut plain, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    must_run(&mut plain, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 5)");
    must_run(&mut plain, "UPDATE tables SET owner_fencing_token = 6 WHERE id = 1");
    expect_error(&mut plain, "UPDATE tables SET owner_fencing_token = 2 WHERE id = 1", "LF004");
}

// ---------------------------------------------------------------------------
// 5. The audit's role under SET SESSION AUTHORIZATION, SET ROLE and
//    SECURITY DEFINER wrappers.
// ---------------------------------------------------------------------------

#[test]
fn the_audit_names_the_role_the_session_wrote_as_under_session_authorization_and_definer_wrappers() {
    let (db, role) = poker_owned_by("a31_role");
    let app = format!("{}_app", db.name);
    let other = format!("{}_other", db.name);
    let mut c = db.connect();
    must_run(
        &mut c,
        &format!(
            "CREATE ROLE {app}; CREATE ROLE {other}; GRANT {other} TO {app};
             GRANT USAGE ON SCHEMA lease TO {app}, {other};
             GRANT SELECT, INSERT ON payouts TO {app}, {other};
             GRANT USAGE ON SEQUENCE payouts_id_seq TO {app}, {other};
             -- a wrapper the migrator owns, SECURITY DEFINER
             SET ROLE {role};
             CREATE FUNCTION pay(t bigint) RETURNS void LANGUAGE sql SECURITY DEFINER
                 AS $$ INSERT INTO public.payouts (table_id, fencing_token) VALUES (1, t) $$;
             GRANT EXECUTE ON FUNCTION pay(bigint) TO {app};
             RESET ROLE;"
        ),
    );
    // A superuser session becomes the app role, then writes stale: plain,
    // through the definer wrapper, through fenced_boundary_write, and after
    // SET ROLE to a role it is a member of.
    must_run(&mut c, &format!("SET SESSION AUTHORIZATION {app}"));
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 1)", "LF001");
    expect_error(&mut c, "SELECT pay(2)", "LF001");
    expect_error(&mut c, "SELECT lease.fenced_boundary_write('payouts', 3, '[{\"table_id\": 1}]')", "LF001");
    must_run(&mut c, &format!("SET ROLE {other}"));
    expect_error(&mut c, "INSERT INTO payouts (table_id, fencing_token) VALUES (1, 4)", "LF001");
    must_run(&mut c, "RESET ROLE; RESET SESSION AUTHORIZATION");
    wait_for("the audit", Duration::from_secs(30), || {
        one_i64(&mut c, "SELECT count(*) FROM lease.rejected_writes") >= 4
    });
    let got: String = c
        .query_one(
            "SELECT string_agg(presented_token || ':' || role || ':' || target_table || ':' || resource_key || ':' || current_token, ',' ORDER BY presented_token)
               FROM lease.rejected_writes",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        got,
        format!(
            "1:{app}:public.payouts:(table_id)=(1):5,2:{app}:public.payouts:(table_id)=(1):5,3:{app}:public.payouts:(table_id)=(1):5,4:{other}:public.payouts:(table_id)=(1):5"
        )
    );
}

// ---------------------------------------------------------------------------
// 6. A publication row filter on the owner table turns an UPDATE the
//    publisher's owner guard allows into a DELETE on the subscriber.
// ---------------------------------------------------------------------------

#[test]
fn a_row_filter_on_the_owner_table_never_deletes_an_owner_row_with_a_token_on_the_subscriber() {
    if !at_least(15, "publication row filters") {
        return;
    }
    let publisher = Cluster::start_with("a31_rf_pub", 54566, &["wal_level = logical"]);
    let subscriber = Cluster::start("a31_rf_sub", 54567);
    let schema = "CREATE EXTENSION pg_lease;
         CREATE TABLE tables (id int PRIMARY KEY, name text NOT NULL DEFAULT 'open', owner_fencing_token bigint);
         CREATE TABLE payouts (id text PRIMARY KEY, table_id int NOT NULL, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');";
    let mut p = publisher.connect();
    p.batch_execute(&format!(
        "{schema}
         INSERT INTO tables (id, owner_fencing_token) VALUES (1, 7), (2, 7);
         ALTER TABLE tables REPLICA IDENTITY FULL;
         CREATE PUBLICATION game FOR TABLE tables WHERE (name <> 'retired'), payouts;"
    ))
    .unwrap();
    let mut s = subscriber.connect();
    s.batch_execute(schema).unwrap();
    s.batch_execute(&format!("CREATE SUBSCRIPTION game CONNECTION '{}' PUBLICATION game", publisher.conninfo()))
        .unwrap();
    wait_for("the initial sync", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'") == 0
            && one_i64(&mut s, "SELECT count(*) FROM tables") == 2
    });
    // On the publisher the owner guard allows it: key and token stay.
    p.batch_execute("UPDATE tables SET name = 'retired' WHERE id = 1").unwrap();
    p.batch_execute("INSERT INTO payouts VALUES ('marker', 2, 7)").unwrap();
    wait_for("the update to be applied", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM payouts WHERE id = 'marker'") == 1
            || subscriber.log_has("FencingTokenRegression")
    });
    let left = one_i64(&mut s, "SELECT count(*) FROM tables WHERE id = 1 AND owner_fencing_token = 7");
    s.batch_execute("ALTER SUBSCRIPTION game DISABLE").ok();
    s.batch_execute("DROP SUBSCRIPTION game").ok();
    // README: owner rows that carry a token are never deleted (LF004), and
    // replication carries owner rows and their tokens to the subscriber.
    assert_eq!(left, 1, "the subscriber's owner row 1 (token 7) was deleted by the publication's row filter");
}
