//! Attack review 38 (helper-61): the token epochs after session 24's floor
//! (`lease.token_epoch_floor`), over real clusters on PostgreSQL 15 (main at
//! 97ad188). Findings, most severe first:
//!
//! - **Hole (critical, older than the floor): a standby promoted after an
//!   acquire above a hand-set owner token issued tokens the old primary had
//!   issued, and a stale holder beat the new one.** The owner table's owner
//!   set an owner row's token by hand above the counter; the next acquire
//!   moved to the next epoch (base + timeline + 1). That is the next
//!   timeline's own epoch: a standby that received the raise, but not the
//!   acquires the old primary made in that epoch afterwards, was promoted
//!   onto timeline 2 and issued in the same epoch again with a counter behind
//!   the old primary's (`lease.token_ceiling()` equal to a token already
//!   handed out, the same token given to two leases, a stale write to a
//!   high-water table accepted and the new holder refused). Now such an
//!   acquire raises the base to the next band, as a cutover does (an epoch
//!   a promotion never reaches), and a floor recorded on another timeline
//!   is issued strictly above
//!   (`a_standby_promoted_after_a_hand_set_raise_never_issues_a_token_again`).
//! - **Superuser only: the guard on the token sequences could be
//!   sidestepped** with `ALTER TABLE ... RENAME / SET SCHEMA / OWNER TO` on
//!   them (a new owner could then setval the counter back), and a floor
//!   sequence taken out of the extension and dropped was read as "a schema
//!   before 0.9.2", bringing the rolled-back-raise hole back. Now `ALTER
//!   TABLE` of either sequence is refused as `ALTER SEQUENCE` is (LF008), and
//!   a missing floor in a 0.9.2 schema is an error
//!   (`the_token_sequences_cannot_be_renamed_moved_given_away_or_lost`).
//! - **Doc**: "A token is `timeline << 40 | counter`" said less than the
//!   rule (the epoch is base + timeline); fixed.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

fn acquire(c: &mut Client, name: &str, owner: &str, bound: Option<i32>) -> i64 {
    let sql = match bound {
        Some(id) => format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000, 'tables', '{{{id}}}')"),
        None => format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000)"),
    };
    one_i64(c, &sql)
}

#[test]
fn a_standby_promoted_after_a_hand_set_raise_never_issues_a_token_again() {
    let primary = Cluster::start("a38_primary", 54664);
    let mut p = primary.connect();
    p.batch_execute(
        "CREATE EXTENSION pg_lease;
         CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES (8, NULL);
         CREATE TABLE payouts (table_id int, fencing_token bigint);
         SELECT lease.protect('payouts', '{table_id}', 'fencing_token');
         CREATE TABLE jlog (pool text, amount bigint, fencing_token bigint);
         SELECT lease.protect_high_water('jlog', '{pool}', 'fencing_token');",
    )
    .unwrap();
    let epoch = acquire(&mut p, "warm", "w", None) >> 40;
    p.batch_execute(&format!("UPDATE tables SET owner_fencing_token = {} WHERE id = 8", (epoch << 40) + 1_000_000))
        .unwrap();
    let raised = acquire(&mut p, "table:8", "h8", Some(8));
    assert!(raised >> 40 > epoch);
    let standby = Cluster::standby_of(&primary, "a38_standby", 54665);
    let mut s = standby.connect();
    wait_for_replay(&mut p, &mut s);
    drop(s);
    standby.stop();
    // The primary goes on issuing in the raised epoch; none of it reaches the standby.
    let lost: Vec<i64> = (0..5).map(|i| acquire(&mut p, &format!("jp:{i}"), "old", None)).collect();
    let stale = *lost.last().unwrap();
    p.batch_execute(&format!("INSERT INTO jlog VALUES ('jp', 1, {stale})")).unwrap();
    drop(p);
    primary.crash();
    standby.restart();
    standby.promote();
    let mut n = standby.connect();
    let ceiling = one_i64(&mut n, "SELECT lease.token_ceiling()");
    assert!(ceiling > stale, "the new primary's ceiling {ceiling} must be above the lost {stale}");
    let fresh: Vec<i64> = (0..5).map(|i| acquire(&mut n, &format!("jp:{i}"), "new", None)).collect();
    for t in &fresh {
        assert!(*t > stale, "{t} issued after failover is not above the lost {stale}");
    }
    // The new holder's write goes in; the stale one is refused.
    n.batch_execute(&format!("INSERT INTO jlog VALUES ('jp', 2, {})", fresh[4])).unwrap();
    assert_eq!(try_sql(&mut n, &format!("INSERT INTO jlog VALUES ('jp', 3, {stale})")), "LF001");
}

#[test]
fn the_token_sequences_cannot_be_renamed_moved_given_away_or_lost() {
    let role = format!("a38_new_owner_{}", std::process::id());
    let db = TestDb::new("a38_sequences");
    let mut c = db.connect();
    c.batch_execute(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; CREATE SCHEMA elsewhere")).unwrap();
    for seq in ["lease.token_counter", "lease.token_epoch_floor"] {
        for ddl in [
            format!("ALTER TABLE {seq} RENAME TO moved"),
            format!("ALTER TABLE {seq} SET SCHEMA elsewhere"),
            format!("ALTER TABLE {seq} OWNER TO {role}"),
            format!("ALTER SEQUENCE {seq} OWNER TO {role}"),
            format!("ALTER SEQUENCE {seq} RESTART"),
        ] {
            let e = expect_error(&mut c, &ddl, "LF008");
            assert!(e.contains("of pg_lease's sequence ") && e.contains("is refused"), "{ddl}: {e}");
        }
    }
    let before = acquire(&mut c, "a", "h", None);
    // A superuser that takes the floor out of the extension and drops it:
    // no token is issued without it.
    c.batch_execute(
        "ALTER EXTENSION pg_lease DROP SEQUENCE lease.token_epoch_floor; DROP SEQUENCE lease.token_epoch_floor",
    )
    .unwrap();
    let e = expect_error(&mut c, "SELECT lease.acquire('a', 'h', 60000)", "XX000");
    assert!(e.contains("lease.token_epoch_floor is missing"), "{e}");
    assert_eq!(one_i64(&mut c, "SELECT max(token) FROM lease.lease_state"), before);
    drop(c);
    connect_to("postgres", "postgres").batch_execute(&format!("DROP ROLE {role}")).unwrap();
}
