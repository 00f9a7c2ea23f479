//! README's blue/green major upgrade ("Blue/green major upgrade (15 → 18) by
//! logical replication"), executed: every ```sql on=blue / on=green block of
//! that section runs, in order, through the psql of the side it names, and the
//! section's one ```sh block (roles and schema) is mirrored here.
//!
//! Blue runs on `PG_LEASE_UPGRADE_FROM`'s PostgreSQL when it is set (`make test
//! PG=18`: 15 → 18), else on the suite's own (`make test`: 15 → 15); green on
//! the suite's. It proves, with pg_lease preloaded on both: blue's history at
//! old tokens is copied by the initial sync (every table reaches state 'r');
//! later payouts, owner-token bumps, DELETEs under a bound token and
//! high-water rows are applied on green; stale writes on blue are refused
//! there (LF001) and never reach green; no replication worker ever errs
//! (pg_stat_subscription_stats counts stay 0, no LF refusal in green's log);
//! at the cutover every replicated table is identical on both sides; on green
//! the first acquire of an owner-bound lease and of an unbound one issue
//! tokens above every token blue issued (lease.issue_tokens_above with blue's
//! lease.token_ceiling), a writer still holding blue's last token is refused
//! (LF001), blue's writers are locked out, and green fences its own writers.
//!
//! The blocks' psql variables: `blue_conninfo` is set here (blue's `game`
//! database, as the superuser), and every `SELECT ... AS name \gset` of a block
//! is passed on to the later blocks of both sides (`psql -v name=value`), as a
//! reader carries `blue_ceiling` from blue's psql to green's with `\set`.

use pg_lease_sessions::postgres::{Client, NoTls};
use pg_lease_sessions::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SECTION: &str = "### Blue/green major upgrade (15 → 18) by logical replication";

/// Blue before the upgrade: the walkthrough's roles and schema (owner rows
/// in `tables`, fenced `payouts`, `balances`), plus a high-water table written
/// under an unbound lease.
const BLUE_SCHEMA: &str = "
    CREATE EXTENSION pg_lease;
    CREATE ROLE migrator LOGIN;
    CREATE ROLE game_server LOGIN;
    GRANT CREATE ON SCHEMA public TO migrator;
    GRANT EXECUTE ON FUNCTION lease.protect(regclass, text[], name, regclass, text[], name),
        lease.protect_high_water(regclass, text[], name) TO migrator;
    GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
        lease.release(text, text, bigint) TO game_server;
    SET ROLE migrator;
    CREATE TABLE tables (id int PRIMARY KEY, name text NOT NULL, owner_fencing_token bigint);
    CREATE TABLE payouts (
        id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        table_id      int    NOT NULL REFERENCES tables,
        hand          int    NOT NULL,
        player        text   NOT NULL,
        amount        bigint NOT NULL,
        fencing_token bigint NOT NULL
    );
    CREATE TABLE balances (player text PRIMARY KEY, chips bigint NOT NULL);
    CREATE TABLE jackpot_log (
        id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        pool          text   NOT NULL,
        amount        bigint NOT NULL,
        fencing_token bigint NOT NULL
    );
    INSERT INTO tables (id, name) VALUES (7, 'High rollers'), (8, 'Beginners');
    INSERT INTO balances VALUES ('ann', 1000), ('bob', 1000);
    SELECT lease.protect('payouts', key_columns => '{table_id}', token_column => 'fencing_token',
                         owner_table => 'tables');
    SELECT lease.protect_high_water('jackpot_log', '{pool}', 'fencing_token');
    GRANT SELECT ON tables, balances TO game_server;
    GRANT SELECT, INSERT, DELETE ON payouts TO game_server;
    GRANT SELECT, INSERT ON jackpot_log TO game_server;
    GRANT UPDATE (chips) ON balances TO game_server;
    RESET ROLE;
";

/// The replicated tables, compared row for row.
const TABLES: [&str; 4] = ["tables", "payouts", "balances", "jackpot_log"];

enum Step {
    Sql { line: usize, side: String, sql: String },
    Sh { line: usize, text: String },
}

impl Step {
    fn text(&self) -> &str {
        match self {
            Step::Sql { sql, .. } => sql,
            Step::Sh { text, .. } => text,
        }
    }
}

/// The runbook section's ```sql on=SIDE and ```sh blocks, in order.
fn runbook() -> Vec<Step> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme.find(SECTION).unwrap_or_else(|| panic!("README.md has no section {SECTION:?}"));
    let first_line = readme[..start].lines().count() + 1;
    let mut steps = Vec::new();
    let mut open: Option<(usize, Option<String>, String)> = None; // (line, side or None for sh, text)
    for (i, line) in readme[start..].lines().enumerate().skip(1) {
        let at = first_line + i;
        if open.is_none() && (line.starts_with("## ") || line.starts_with("### ")) {
            break;
        }
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let info = info.trim();
                if let Some(side) = info.strip_prefix("sql on=") {
                    assert!(side == "blue" || side == "green", "README.md:{at}: unknown side {side:?}");
                    open = Some((at, Some(side.to_owned()), String::new()));
                } else if info == "sh" {
                    open = Some((at, None, String::new()));
                } else {
                    assert!(!info.starts_with("sql"), "README.md:{at}: a runbook sql block must name its side (on=)");
                    open = Some((at, Some(String::new()), String::new())); // other text: skipped
                }
            }
            (Some(_), Some(_)) => {
                let (line, side, text) = open.take().unwrap();
                match side {
                    None => steps.push(Step::Sh { line, text }),
                    Some(side) if !side.is_empty() => steps.push(Step::Sql { line, side, sql: text }),
                    Some(_) => {}
                }
            }
            (Some((_, _, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md: unterminated block in {SECTION:?}");
    steps
}

/// The names a block sets with `SELECT ... AS name \gset`.
fn gset_names(sql: &str) -> Vec<String> {
    sql.lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "\\gset")?;
            (at >= 2 && words[at - 2].eq_ignore_ascii_case("AS")).then(|| words[at - 1].to_owned())
        })
        .collect()
}

struct Side<'a> {
    cluster: &'a Cluster,
    psql: PathBuf,
}

/// Runs one block through `side`'s psql in database `game`, with the
/// variables known so far; adds the ones it `\gset`s.
fn run_sql(side: &Side, line: usize, sql: &str, vars: &mut BTreeMap<String, String>) {
    let names = gset_names(sql);
    let mut script = format!("\\set ON_ERROR_STOP on\n{sql}");
    for name in &names {
        script.push_str(&format!("\\echo @@var {name} :{name}\n"));
    }
    script.push_str("\\echo @@done\n");
    let mut psql = Command::new(&side.psql);
    psql.args(["-X", "-q", "-h", "127.0.0.1", "-p", &side.cluster.port.to_string(), "-U", "postgres", "-d", "game"]);
    for (name, value) in vars.iter() {
        psql.arg("-v").arg(format!("{name}={value}"));
    }
    let out = pipe(psql, script.as_bytes());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "@@done"),
        "README.md:{line} on {}: this block failed:\n{sql}\npsql said:\n{stderr}",
        side.cluster.name
    );
    for l in stdout.lines() {
        if let Some((name, value)) = l.strip_prefix("@@var ").and_then(|r| r.split_once(' ')) {
            vars.insert(name.to_owned(), value.to_owned());
        }
    }
    for name in names {
        assert!(vars.contains_key(&name), "README.md:{line}: {name} was not set");
    }
}

/// Runs `command` with `input` on its stdin.
fn pipe(mut command: Command, input: &[u8]) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// The output of a program of `pg_config`'s PostgreSQL (blue's dump tools).
fn run_tool(pg_config: &str, program: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(pg_bin_of(pg_config, program)).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The section's shell step, mirrored: blue's roles, then its schema (with
/// blue's own pg_dump) restored through green's psql.
fn copy_roles_and_schema(line: usize, text: &str, blue: &Cluster, blue_pg_config: &str, green: &Side) {
    for needle in
        ["pg_dumpall", "--roles-only", "pg_dump ", "--schema-only --create --no-publications --no-subscriptions"]
    {
        assert!(text.contains(needle), "README.md:{line}: the shell step no longer says {needle:?}:\n{text}");
    }
    let blue_port = blue.port.to_string();
    let from = ["-h", "127.0.0.1", "-p", &blue_port, "-U", "postgres"];
    let green_port = green.cluster.port.to_string();
    let into = |on_error_stop: &str| {
        let mut c = Command::new(&green.psql);
        c.args(["-X", "-q", "-h", "127.0.0.1", "-p", &green_port, "-U", "postgres", "-d", "postgres"]);
        c.args(["-v", &format!("ON_ERROR_STOP={on_error_stop}")]);
        c
    };
    let roles = run_tool(blue_pg_config, "pg_dumpall", &[&from[..], &["--roles-only"]].concat());
    let out = pipe(into("0"), &roles);
    let errors: Vec<_> =
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains("ERROR")).map(String::from).collect();
    assert!(
        errors.iter().all(|e| e.contains("role \"postgres\" already exists")),
        "restoring blue's roles: {errors:?}"
    );
    let schema = run_tool(
        blue_pg_config,
        "pg_dump",
        &[&from[..], &["--schema-only", "--create", "--no-publications", "--no-subscriptions", "game"]].concat(),
    );
    let out = pipe(into("1"), &schema);
    assert!(out.status.success(), "restoring blue's schema: {}", String::from_utf8_lossy(&out.stderr));
}

fn connect(cluster: &Cluster, user: &str) -> Result<Client, postgres::Error> {
    Client::connect(&format!("host=127.0.0.1 port={} user={user} dbname=game", cluster.port), NoTls)
}

/// Every row of every replicated table, in one ordered text per table.
fn contents(c: &mut Client) -> Vec<String> {
    TABLES
        .iter()
        .map(|t| {
            let sql = format!("SELECT '{t}: ' || coalesce(string_agg(x::text, ';' ORDER BY x::text), '') FROM {t} x");
            c.query_one(&sql, &[]).unwrap().get(0)
        })
        .collect()
}

fn acquire(c: &mut Client, name: &str, owner: &str, bound: Option<i32>) -> i64 {
    let row = match bound {
        Some(id) => c.query_one(
            "SELECT token FROM lease.acquire($1, $2, 60000, 'tables', ARRAY[$3::text])",
            &[&name, &owner, &id.to_string()],
        ),
        None => c.query_one("SELECT token FROM lease.acquire($1, $2, 60000)", &[&name, &owner]),
    };
    row.unwrap_or_else(|e| panic!("acquire {name} for {owner}: {:?}", e.as_db_error())).get(0)
}

fn pay(c: &mut Client, table: i32, hands: std::ops::RangeInclusive<i32>, token: i64) {
    c.execute(
        "INSERT INTO payouts (table_id, hand, player, amount, fencing_token)
         SELECT $1, g, CASE WHEN g % 2 = 0 THEN 'ann' ELSE 'bob' END, g * 10, $4 FROM generate_series($2::int, $3::int) g",
        &[&table, hands.start(), hands.end(), &token],
    )
    .unwrap_or_else(|e| panic!("payouts of table {table} at {token}: {e}"));
}

fn jackpot(c: &mut Client, amount: i64, token: i64) -> String {
    sqlstate(
        &c.execute("INSERT INTO jackpot_log (pool, amount, fencing_token) VALUES ('main', $1, $2)", &[&amount, &token]),
    )
}

fn stale_payout(c: &mut Client, table: i32, token: i64) -> String {
    sqlstate(&c.execute(
        "INSERT INTO payouts (table_id, hand, player, amount, fencing_token) VALUES ($1, 0, 'eve', 1, $2)",
        &[&table, &token],
    ))
}

#[test]
fn blue_green_upgrade_by_logical_replication_follows_the_readme() {
    let started = Instant::now();
    let blue_pg_config = std::env::var("PG_LEASE_UPGRADE_FROM").ok();
    let blue = Cluster::start_on(
        blue_pg_config.as_deref(),
        "bg_blue",
        54488,
        &["wal_level = logical", "pg_lease.audit_flush_ms = 50"],
    );
    let green = Cluster::start_with("bg_green", 54489, &["pg_lease.audit_flush_ms = 50"]);
    let blue_pg_config = blue_pg_config.unwrap_or_else(pg_config);
    let blue_side = Side { cluster: &blue, psql: pg_bin_of(&blue_pg_config, "psql") };
    let green_side = Side { cluster: &green, psql: pg_bin("psql") };
    let version = |c: &Cluster| one_i64(&mut c.connect(), "SELECT current_setting('server_version_num')::bigint");
    println!("blue/green: {} -> {}", version(&blue), version(&green));

    // Blue in service, with history at tokens older than the owner rows'.
    blue.connect().batch_execute("CREATE DATABASE game").unwrap();
    let mut b = blue.connect_db("game");
    b.batch_execute(BLUE_SCHEMA).unwrap();
    let mut app = connect(&blue, "game_server").unwrap();
    let t7a = acquire(&mut app, "table:7", "host-1", Some(7));
    pay(&mut app, 7, 1..=300, t7a);
    let t8a = acquire(&mut app, "table:8", "host-2", Some(8));
    pay(&mut app, 8, 1..=50, t8a);
    app.execute("SELECT lease.release('table:7', 'host-1', $1)", &[&t7a]).unwrap();
    let t7b = acquire(&mut app, "table:7", "host-3", Some(7));
    pay(&mut app, 7, 301..=320, t7b);
    let j1 = acquire(&mut app, "jackpot", "jp-1", None);
    for amount in 1..=5 {
        assert_eq!(jackpot(&mut app, amount, j1), "");
    }
    let j2 = acquire(&mut app, "jackpot", "jp-1", None);
    assert_eq!(jackpot(&mut app, 6, j2), "");
    app.batch_execute("UPDATE balances SET chips = chips + 3000 WHERE player = 'ann'").unwrap();
    assert!(t7a < t7b && j1 < j2);

    let steps = runbook();
    let find = |needle: &str| {
        steps
            .iter()
            .position(|s| s.text().contains(needle))
            .unwrap_or_else(|| panic!("no runbook step with {needle:?}"))
    };
    let (subscribe, stop_writers, drop_subscription) =
        (find("CREATE SUBSCRIPTION"), find("NOLOGIN"), find("DROP SUBSCRIPTION"));
    assert!(subscribe < stop_writers && stop_writers < drop_subscription, "runbook order");
    assert_eq!(steps.iter().filter(|s| matches!(s, Step::Sh { .. })).count(), 1, "one shell step");
    let mut vars = BTreeMap::new();
    vars.insert("blue_conninfo".to_owned(), format!("host=127.0.0.1 port={} user=postgres dbname=game", blue.port));
    let run = |range: std::ops::Range<usize>, vars: &mut BTreeMap<String, String>| {
        for step in &steps[range] {
            match step {
                Step::Sh { line, text } => copy_roles_and_schema(*line, text, &blue, &blue_pg_config, &green_side),
                Step::Sql { line, side, sql } => {
                    let on = if side == "blue" { &blue_side } else { &green_side };
                    run_sql(on, *line, sql, vars);
                }
            }
        }
    };

    // Schema, fences, publication, subscription: up to the initial copy's end.
    run(0..subscribe + 1, &mut vars);
    let mut g = green.connect_db("game");
    let not_ready = "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'";
    assert_eq!(one_i64(&mut g, not_ready), 0);
    assert_eq!(one_i64(&mut g, "SELECT count(*) FROM pg_subscription_rel"), TABLES.len() as i64);
    wait_for("the history on green", Duration::from_secs(60), || contents(&mut g) == contents(&mut b));
    assert_eq!(one_i64(&mut g, "SELECT count(*) FROM payouts"), 370);
    assert_eq!(one_i64(&mut g, "SELECT owner_fencing_token FROM tables WHERE id = 7"), t7b);
    // Green alone would start its tokens over: an unbound lease's below blue's.
    assert!(one_i64(&mut g, "SELECT lease.token_ceiling()") <= j2, "green's own ceiling before the raise");

    // Blue serves on while green applies: payouts, bumps, a DELETE under a
    // bound token, high-water rows; stale writes are refused on blue.
    pay(&mut app, 7, 321..=340, t7b);
    app.execute("SELECT lease.release('table:8', 'host-2', $1)", &[&t8a]).unwrap();
    let t8b = acquire(&mut app, "table:8", "host-4", Some(8));
    pay(&mut app, 8, 51..=60, t8b);
    app.batch_execute(&format!(
        "BEGIN; SELECT lease.bind_token({t7b}); DELETE FROM payouts WHERE table_id = 7 AND hand <= 10; COMMIT"
    ))
    .unwrap();
    assert_eq!(stale_payout(&mut app, 7, t7a), "LF001", "a stale payout on blue");
    assert_eq!(stale_payout(&mut app, 8, t8a), "LF001");
    let j3 = acquire(&mut app, "jackpot", "jp-1", None);
    assert_eq!(jackpot(&mut app, 7, j3), "");
    assert_eq!(jackpot(&mut app, 8, j2), "LF001", "a stale jackpot row on blue");
    app.batch_execute("UPDATE balances SET chips = chips - 500 WHERE player = 'bob'").unwrap();
    wait_for("blue's changes on green", Duration::from_secs(60), || contents(&mut g) == contents(&mut b));
    assert_eq!(one_i64(&mut g, "SELECT count(*) FROM payouts WHERE table_id = 7 AND hand <= 10"), 0);
    assert_eq!(one_i64(&mut g, "SELECT owner_fencing_token FROM tables WHERE id = 8"), t8b);
    assert_eq!(one_i64(&mut g, "SELECT count(*) FROM payouts WHERE player = 'eve'"), 0);

    // Nothing refused or stuck on green, ever.
    let no_errors =
        "SELECT (apply_error_count + sync_error_count)::bigint FROM pg_stat_subscription_stats WHERE subname = 'green'";
    assert_eq!(one_i64(&mut g, no_errors), 0);
    assert_eq!(one_i64(&mut g, not_ready), 0);
    assert_eq!(one_i64(&mut g, "SELECT coalesce(sum(refused), 0)::bigint FROM lease.stats"), 0);
    assert!(one_i64(&mut g, "SELECT coalesce(sum(replicated), 0)::bigint FROM lease.stats") > 0);
    assert!(!green.server_log().contains("LF00"), "green refused a replicated change:\n{}", green.server_log());

    // The cutover, as README says, up to the end of the subscription.
    run(subscribe + 1..drop_subscription, &mut vars);
    assert!(connect(&blue, "game_server").is_err(), "blue's writers are locked out");
    assert!(app.is_closed() || app.batch_execute("SELECT 1").is_err(), "blue's writer sessions ended");
    assert_eq!(contents(&mut g), contents(&mut b), "both sides identical at the cutover");
    assert_eq!(one_i64(&mut g, no_errors), 0);
    let blue_ceiling: i64 = vars["blue_ceiling"].parse().unwrap();
    let blue_max = one_i64(&mut b, "SELECT max(token) FROM lease.lease_state");
    assert_eq!(blue_max, [t7b, t8b, j3].into_iter().max().unwrap());
    assert!(blue_ceiling > blue_max, "blue's ceiling {blue_ceiling:#x} above its tokens ({blue_max:#x})");
    run(drop_subscription..steps.len(), &mut vars);
    assert_eq!(one_i64(&mut g, "SELECT count(*) FROM pg_subscription"), 0);

    // Green in service: every first token above blue's, bound or not.
    let mut app = connect(&green, "game_server").unwrap();
    let g7 = acquire(&mut app, "table:7", "host-9", Some(7));
    let gj = acquire(&mut app, "jackpot", "jp-9", None);
    assert!(g7 > blue_ceiling && gj > blue_ceiling, "green's first tokens {g7:#x}, {gj:#x} vs {blue_ceiling:#x}");
    assert_eq!(one_i64(&mut g, "SELECT owner_fencing_token FROM tables WHERE id = 7"), g7);
    pay(&mut app, 7, 400..=401, g7); // the sequence was moved past blue's rows
    assert_eq!(jackpot(&mut app, 9, gj), "");
    // A writer still holding blue's last token is refused on green.
    assert_eq!(stale_payout(&mut app, 7, t7b), "LF001");
    assert_eq!(jackpot(&mut app, 10, j3), "LF001");
    // Green fences its own writers.
    let g8 = acquire(&mut app, "table:8", "host-10", Some(8));
    assert!(g8 > blue_ceiling);
    assert_eq!(stale_payout(&mut app, 8, t8b), "LF001");
    pay(&mut app, 8, 100..=100, g8);
    let g8b = acquire(&mut app, "table:8", "host-10", Some(8));
    assert_eq!(stale_payout(&mut app, 8, g8), "LF001");
    pay(&mut app, 8, 101..=101, g8b);
    assert!(one_i64(&mut g, "SELECT lease.token_ceiling()") > g8b);
    println!("blue/green runbook: {:.1} s", started.elapsed().as_secs_f64());
}

/// Both cutover functions are for a primary: a standby refuses them (25006),
/// without a CONTEXT line, as it refuses acquire.
#[test]
fn a_standby_refuses_token_ceiling_and_issue_tokens_above() {
    let primary = Cluster::start("bg_primary", 54490);
    // (A checkpoint first: pg_basebackup's own, spread over the dirty pages, is then instant.)
    primary.connect().batch_execute("CREATE EXTENSION pg_lease; CHECKPOINT").unwrap();
    let standby = Cluster::standby_of(&primary, "bg_standby", 54491);
    let mut s = standby.connect();
    wait_for("the extension on the standby", Duration::from_secs(60), || {
        one_i64(&mut s, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_lease'") == 1
    });
    for sql in ["SELECT lease.token_ceiling()", "SELECT lease.issue_tokens_above(1)"] {
        let e = s.batch_execute(sql).expect_err(sql);
        let e = e.as_db_error().unwrap();
        assert_eq!(e.code().code(), "25006", "{sql}: {}", e.message());
        assert!(e.message().ends_with("tokens are issued on the primary only"), "{}", e.message());
        assert_eq!(e.where_(), None, "{sql}: no CONTEXT");
    }
    expect_error(&mut s, "SELECT lease.acquire('x', 'o', 1000)", "25006");
}
