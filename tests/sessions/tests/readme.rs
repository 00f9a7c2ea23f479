//! README.md as a test: every ```sql block runs, in order, in one psql session
//! on a fresh database (blocks marked ```sql expect=CODE must fail with that
//! SQLSTATE, all others must succeed; blocks marked ```sql on=SIDE belong to
//! the blue/green runbook, which tests/bluegreen.rs runs on two clusters, and
//! are left out here); then each role the README's
//! walkthrough creates connects, does its everyday work and is refused what
//! it must not do; and the metrics role runs monitoring/postgres_exporter.yml.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const ROLES: [&str; 4] = ["migrator", "game_server", "dba", "metrics"];

fn repo_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

struct Block {
    line: usize,
    sql: String,
    expect: Option<String>,
}

/// The ```sql blocks of `text`, with the line each starts on.
fn sql_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut current: Option<Block> = None;
    let mut other_side = false;
    for (i, line) in text.lines().enumerate() {
        if other_side {
            other_side = !line.trim_start().starts_with("```");
            continue;
        }
        match &mut current {
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```sql") {
                    if info.trim().starts_with("on=") {
                        other_side = true;
                        continue;
                    }
                    let expect = info.trim().strip_prefix("expect=").map(str::to_owned);
                    assert!(
                        info.trim().is_empty() || expect.is_some(),
                        "README.md:{}: unknown sql block option {info:?}",
                        i + 1
                    );
                    current = Some(Block { line: i + 1, sql: String::new(), expect });
                }
            }
            Some(block) => {
                if line.trim_start().starts_with("```") {
                    blocks.push(current.take().unwrap());
                } else {
                    block.sql.push_str(line);
                    block.sql.push('\n');
                }
            }
        }
    }
    assert!(current.is_none(), "README.md: unterminated sql block");
    blocks
}

fn drop_roles(admin: &mut Client) {
    // Databases of an interrupted run hold the roles' objects.
    let stale: Vec<String> = admin
        .query("SELECT datname::text FROM pg_database WHERE datname LIKE 't\\_readme\\_%'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for db in stale {
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
    }
    for role in ROLES {
        // Left over from an interrupted run: best effort.
        let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}"));
    }
}

/// Runs every block through psql, in order, in database `db`.
fn run_readme(db: &str) {
    let blocks = sql_blocks(&repo_file("README.md"));
    assert!(blocks.len() >= 10, "README.md has only {} sql blocks", blocks.len());
    assert!(blocks.iter().any(|b| b.expect.is_some()), "the walkthrough's refused write is marked expect=");
    let mut script = String::from("\\set ON_ERROR_STOP on\n");
    for b in &blocks {
        match &b.expect {
            None => script.push_str(&format!("{}\\echo @@ok {}\n", b.sql, b.line)),
            Some(_) => script.push_str(&format!(
                "\\set ON_ERROR_STOP off\n{}\\echo @@expect {} :SQLSTATE\n\\set ON_ERROR_STOP on\n",
                b.sql, b.line
            )),
        }
    }
    let mut child = Command::new("psql")
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &port().to_string(), "-U", "postgres", "-d", db])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql (PostgreSQL's client)");
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut done = 0;
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("@@expect ") {
            let (at, code) = rest.split_once(' ').unwrap();
            let block = blocks.iter().find(|b| b.line.to_string() == at).unwrap();
            assert_eq!(Some(code), block.expect.as_deref(), "README.md:{at}: SQLSTATE\n{stderr}");
            done += 1;
        } else if line.starts_with("@@ok ") {
            done += 1;
        }
    }
    if done < blocks.len() {
        let failed = &blocks[done];
        panic!("README.md:{}: this sql block failed:\n{}\npsql said:\n{stderr}", failed.line, failed.sql);
    }
    assert!(out.status.success(), "psql: {stderr}");
    // Only the blocks marked to fail may raise an error.
    let errors = stderr.lines().filter(|l| l.starts_with("ERROR:")).count();
    let expected = blocks.iter().filter(|b| b.expect.is_some()).count();
    assert_eq!(errors, expected, "unexpected errors:\n{stderr}");
}

#[track_caller]
fn refused(c: &mut Client, sql: &str, code: &str) {
    expect_error(c, sql, code);
}

/// The walkthrough, then each role's everyday work and limits.
#[test]
fn readme_sql_runs_and_each_role_can_do_its_work_and_no_more() {
    let name = format!("t_readme_{}", std::process::id());
    let mut admin = connect_to("postgres", "postgres");
    drop_roles(&mut admin);
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    run_readme(&name);

    let mut su = connect_to(&name, "postgres");
    // The walkthrough's refused write is recorded in this database's own
    // lease.rejected_writes, with no setting (the audit writer runs async).
    let mut recorded = 0;
    for _ in 0..100 {
        recorded = one_i64(&mut su, "SELECT count(*) FROM lease.rejected_writes WHERE sqlstate = 'LF001'");
        if recorded > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(recorded, 1, "the walkthrough's stale write in {name}'s own audit table");
    su.batch_execute(
        "CREATE TABLE admin_only (table_id int, fencing_token bigint);
         CREATE TABLE ledger (k int, token bigint)",
    )
    .unwrap();

    // The migrator: migrations and protection of its own tables.
    let mut m = connect_to(&name, "migrator");
    m.batch_execute(
        "ALTER TABLE payouts ADD COLUMN note text;
         CREATE TABLE seat_payouts (table_id int NOT NULL, seat int, fencing_token bigint);
         SELECT lease.protect('seat_payouts', '{table_id}', 'fencing_token', 'tables');
         GRANT INSERT ON seat_payouts TO game_server;",
    )
    .unwrap();
    refused(&mut m, "SELECT lease.protect('admin_only', '{table_id}', 'fencing_token', 'tables')", "42501");
    refused(&mut m, "SELECT lease.protect_high_water('ledger', '{k}', 'token')", "42501");
    refused(&mut m, "ALTER TABLE payouts DISABLE TRIGGER pg_lease_fence", "LF008");
    refused(&mut m, "DELETE FROM lease.protected", "42501");
    refused(&mut m, "UPDATE lease.lease_state SET token = 1", "42501");
    refused(&mut m, "SELECT * FROM lease.rejected_writes", "42501");

    // The game server: leases, fenced payouts, balances.
    let mut g = connect_to(&name, "game_server");
    let token: i64 = g
        .query_one("SELECT token FROM lease.acquire('table:8', 'host-20', 15000, 'tables', '{8}')", &[])
        .unwrap()
        .get(0);
    g.execute(
        "SELECT lease.fenced_boundary_write('payouts', $1, '[{\"table_id\": 8, \"hand\": 1, \"player\": \"ann\", \"amount\": 5}]')",
        &[&token],
    )
    .unwrap();
    g.execute(
        "INSERT INTO payouts (table_id, hand, player, amount, fencing_token) VALUES (8, 2, 'bob', 7, $1)",
        &[&token],
    )
    .unwrap();
    g.execute("INSERT INTO seat_payouts VALUES (8, 1, $1)", &[&token]).unwrap();
    g.batch_execute("UPDATE balances SET chips = chips + 5 WHERE player = 'ann'").unwrap();
    g.batch_execute("SELECT * FROM lease.heartbeat('host-20', 15000)").unwrap();
    g.batch_execute("SELECT * FROM lease.renew_all('host-20', 15000)").unwrap();
    g.execute("SELECT lease.renew('table:8', 'host-20', $1, 15000)", &[&token]).unwrap();
    refused(
        &mut g,
        &format!(
            "INSERT INTO payouts (table_id, hand, player, amount, fencing_token) VALUES (8, 3, 'x', 1, {})",
            token - 1
        ),
        "LF001",
    );
    refused(&mut g, "UPDATE tables SET owner_fencing_token = owner_fencing_token + 1 WHERE id = 8", "42501");
    refused(&mut g, "UPDATE balances SET player = 'eve' WHERE player = 'ann'", "42501");
    refused(&mut g, "DELETE FROM payouts", "42501");
    refused(&mut g, "SELECT * FROM lease.rejected_writes", "42501");
    refused(&mut g, "SELECT * FROM lease.lease_state", "42501");
    refused(&mut g, "SELECT * FROM lease.sessions", "42501");
    refused(&mut g, "SELECT * FROM lease.session_state", "42501");
    refused(&mut g, "SELECT lease.unprotect('payouts')", "42501");
    refused(&mut g, "SELECT lease.protect('balances', '{player}')", "42501");
    refused(&mut g, "SET pg_lease.min_ttl_ms = 1", "42501");
    assert_eq!(one_i64(&mut g, "SELECT lease.release_all('host-20')::bigint"), 1);

    // The DBA: reads everything pg_lease records, changes nothing.
    let mut d = connect_to(&name, "dba");
    for q in [
        "SELECT count(*) FROM lease.rejected_writes",
        "SELECT count(*) FROM lease.stats",
        "SELECT count(*) FROM lease.leases",
        "SELECT count(*) FROM lease.sessions",
        "SELECT count(*) FROM lease.protected_tables",
        "SELECT count(*) FROM lease.audit_status()",
    ] {
        one_i64(&mut d, q);
    }
    assert_eq!(one_i64(&mut d, "SELECT count(*) FROM lease.protected_tables WHERE enforced"), 2);
    refused(&mut d, "DELETE FROM lease.rejected_writes", "42501");
    refused(&mut d, "SELECT lease.acquire('table:8', 'dba', 1000)", "42501");
    refused(
        &mut d,
        "INSERT INTO payouts (table_id, hand, player, amount, fencing_token) VALUES (8, 1, 'x', 1, 1)",
        "42501",
    );
    refused(&mut d, "SELECT lease.stats_reset()", "42501");

    // The metrics exporter: exactly the queries of monitoring/postgres_exporter.yml.
    let mut x = connect_to(&name, "metrics");
    let yml = repo_file("monitoring/postgres_exporter.yml");
    let mut queries = 0;
    for chunk in yml.split("  query: |\n").skip(1) {
        let sql: String =
            chunk.lines().take_while(|l| l.starts_with("    ")).map(|l| format!("{}\n", l.trim_start())).collect();
        x.batch_execute(&sql).unwrap_or_else(|e| panic!("exporter query as metrics:\n{sql}\n{e}"));
        queries += 1;
    }
    assert!(queries >= 4, "{queries} exporter queries found");
    refused(&mut x, "SELECT * FROM lease.rejected_writes", "42501");
    refused(&mut x, "SELECT * FROM lease.sessions", "42501");
    refused(&mut x, "SELECT * FROM payouts", "42501");

    drop((m, g, d, x, su));
    admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).unwrap();
    drop_roles(&mut admin);
}
