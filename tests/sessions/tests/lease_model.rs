//! Model-based property test of the lease service with heartbeat sessions:
//! random sequences of acquire, renew, release, release_all, heartbeat and
//! renew_all by four owners on four leases, with pauses that let short TTLs
//! and sessions lapse, run against a real server and checked step by step
//! against a model of the documented rules (who holds what, every error, every
//! loss reported exactly once, `lease.leases.live`).
//!
//! Time is modelled in phases: a step runs at (phase, index); a short TTL set
//! in phase p ends in the pause before phase p + 1 (a phase takes less than
//! `PHASE_BUDGET`, well under `SHORT_MS`, and a pause is longer than
//! `SHORT_MS`). A case whose phase overran its budget on a loaded machine is
//! discarded, not judged. Long TTLs outlast any case.
//!
//! Owner rows: an acquire may bind its lease to one of two owner rows of
//! `tables` (an int key, spelled `7`, `07` or ` 7`: one row by the key
//! type's own `=`). One owner row is one resource: while a live lease of
//! another owner and another name holds the row (its token is the row's),
//! binding it is LF005; an expired one is taken over and its holder hears of
//! the loss at its next heartbeat. Every bound token is above the row's.
//!
//! Renew bursts (120 renewals in one statement) fill the lease row's page,
//! so renew's in-place write (0.9.1) moves rows and indexes them itself; at
//! every check amcheck (where installed) verifies each index of
//! `lease.lease_state` against its rows.
//!
//! Identity: leases 2 and 3 and owners 2 and 3 are the upper-case spellings
//! of leases and owners 0 and 1, and a step may pass its name and owner with a
//! case-insensitive nondeterministic collation (`ci`): they must stay
//! distinct, since identity is the stored text, whatever collation a caller's
//! arguments carry.
//!
//! Environment: `PG_LEASE_TEST_PORT` (required), `PG_LEASE_LEASE_MODEL_CASES`
//! (16), `PG_LEASE_MODEL_SEED` (fixed default).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::{lease_state_amcheck, TestDb};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

const LEASES: u8 = 4;
/// Owner rows per case (`tables` ids `case * 10 + row`).
const ROWS: u8 = 2;
const HOSTS: u8 = 4;
const SHORT_MS: i32 = 250;
const LONG_MS: i32 = 600_000;
const PAUSE: Duration = Duration::from_millis(330);
const PHASE_BUDGET: Duration = Duration::from_millis(180);
const DEFAULT_SEED: u64 = 0x1ea5_e5e5_5107;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        lease: u8,
        host: u8,
        long: bool,
    },
    /// Acquire bound to owner row `row`, its key spelled `spelling`.
    AcquireBound {
        lease: u8,
        host: u8,
        long: bool,
        row: u8,
        spelling: u8,
    },
    /// Renew with the lease's current token (or one below it).
    Renew {
        lease: u8,
        host: u8,
        stale: bool,
        long: bool,
    },
    /// 120 renewals with the lease's current token in one statement: the
    /// page of the lease row fills, so renew's in-place write moves the row
    /// and indexes it itself (0.9.1); the model sees one renewal.
    RenewBurst {
        lease: u8,
        host: u8,
    },
    Release {
        lease: u8,
        host: u8,
    },
    ReleaseAll {
        host: u8,
    },
    /// `lease.heartbeat`, or `lease.renew_all` when `list`.
    Beat {
        host: u8,
        long: bool,
        list: bool,
    },
    Pause,
    /// A bound acquire (long TTL) in a transaction that then rolls back;
    /// `raise`: the owner row's token first set by hand in the transaction,
    /// in the current epoch above the counter, so the acquire moves to the
    /// next band. The token it handed out is never issued again nor
    /// undercut: every later token, of any lease, is above it (a rolled-back
    /// epoch raise once let the next tokens fall back below it).
    RolledBack {
        lease: u8,
        host: u8,
        row: u8,
        raise: bool,
    },
}

/// `$n`, or `$n COLLATE ci` (the case-insensitive collation of the test).
fn arg(n: u8, ci: bool) -> String {
    if ci {
        format!("${n} COLLATE ci")
    } else {
        format!("${n}")
    }
}

fn op() -> impl Strategy<Value = Op> {
    let l = 0..LEASES;
    let h = 0..HOSTS;
    prop_oneof![
        4 => (l.clone(), h.clone(), any::<bool>()).prop_map(|(lease, host, long)| Op::Acquire { lease, host, long }),
        3 => (l.clone(), h.clone(), any::<bool>(), 0..ROWS, 0..3u8)
            .prop_map(|(lease, host, long, row, spelling)| Op::AcquireBound { lease, host, long, row, spelling }),
        2 => (l.clone(), h.clone(), prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(lease, host, stale, long)| Op::Renew { lease, host, stale, long }),
        1 => (l.clone(), h.clone()).prop_map(|(lease, host)| Op::RenewBurst { lease, host }),
        1 => (l, h.clone()).prop_map(|(lease, host)| Op::Release { lease, host }),
        1 => h.clone().prop_map(|host| Op::ReleaseAll { host }),
        4 => (h, any::<bool>(), any::<bool>()).prop_map(|(host, long, list)| Op::Beat { host, long, list }),
        2 => Just(Op::Pause),
        2 => (0..LEASES, 0..HOSTS, 0..ROWS, any::<bool>())
            .prop_map(|(lease, host, row, raise)| Op::RolledBack { lease, host, row, raise }),
    ]
}

/// A point in model time: (phase, step), with -inf and +inf.
type T = (i64, i64);
const NEG: T = (i64::MIN, 0);
const INF: T = (i64::MAX, 0);

#[derive(Clone, Debug)]
struct Lease {
    owner: u8,
    token: i64,
    own: T,
    released: bool,
    /// The owner row it was last acquired bound to (None: unbound).
    bound: Option<u8>,
}

#[derive(Clone, Copy, Debug)]
struct Session {
    since: T,
    expires: T,
}

#[derive(Clone, Default, Debug)]
struct Model {
    /// The highest token any acquire handed out, in a transaction that
    /// committed or not: every later one must be above it.
    handed: i64,
    leases: BTreeMap<u8, Lease>,
    sessions: BTreeMap<u8, Session>,
    /// Takeovers not yet reported: (holder that lost it, lease) -> token.
    lost: BTreeMap<(u8, u8), i64>,
    /// Owner rows' tokens (absent: the row's initial token, 0).
    rows: BTreeMap<u8, i64>,
    phase: i64,
    step: i64,
}

impl Model {
    fn now(&self) -> T {
        (self.phase, self.step)
    }
    fn expiry(&self, long: bool) -> T {
        if long {
            INF
        } else {
            (self.phase + 1, -1)
        }
    }
    fn effective(&self, l: &Lease) -> T {
        match self.sessions.get(&l.owner) {
            Some(s) if l.own > s.since => l.own.max(s.expires),
            _ => l.own,
        }
    }
    fn live(&self, l: &Lease) -> bool {
        !l.released && self.effective(l) > self.now()
    }
    /// `lease` taken by `host` from its holder `cur`: a holder that did not
    /// release it hears of the loss; `host`'s own earlier loss is moot.
    fn take(&mut self, lease: u8, cur: Option<&Lease>, host: u8) {
        if let Some(l) = cur.filter(|l| l.owner != host) {
            if !l.released {
                self.lost.insert((l.owner, lease), l.token);
            }
            self.lost.remove(&(host, lease));
        }
    }
    /// Records a token handed out, which must be above every one before.
    fn handed_out(&mut self, token: i64) -> Result<(), String> {
        if token <= self.handed {
            return Err(format!(
                "token {token} not above {}, handed out before (perhaps in a rolled-back transaction)",
                self.handed
            ));
        }
        self.handed = token;
        Ok(())
    }
    fn row_token(&self, row: u8) -> i64 {
        self.rows.get(&row).copied().unwrap_or(0)
    }
    /// The unreleased lease other than `lease` whose token owner row `row`
    /// holds: the one that holds the row.
    fn row_holder(&self, row: u8, lease: u8) -> Option<(u8, Lease)> {
        let t = self.row_token(row);
        self.leases
            .iter()
            .find(|(k, l)| **k != lease && l.bound == Some(row) && l.token == t && t > 0 && !l.released)
            .map(|(k, l)| (*k, l.clone()))
    }
}

struct Case<'a> {
    c: &'a mut Client,
    id: u32,
}

impl Case<'_> {
    /// Leases and owners 2 and 3 spell 0 and 1 in upper case.
    fn name(&self, lease: u8) -> String {
        let s = format!("c{}:l{}", self.id, lease % 2);
        if lease >= 2 {
            s.to_uppercase()
        } else {
            s
        }
    }
    /// Owner row `row`'s id, as text spelled three ways.
    fn key(&self, row: u8, spelling: u8) -> String {
        let id = self.id * 10 + u32::from(row);
        match spelling {
            0 => format!("{{{id}}}"),
            1 => format!("{{0{id}}}"),
            _ => format!("{{\" {id}\"}}"),
        }
    }
    fn host(&self, host: u8) -> String {
        let s = format!("c{}:h{}", self.id, host % 2);
        if host >= 2 {
            s.to_uppercase()
        } else {
            s
        }
    }
}

fn ttl(long: bool) -> i32 {
    if long {
        LONG_MS
    } else {
        SHORT_MS
    }
}

fn code(e: &pg_lease_sessions::postgres::Error) -> String {
    e.code().map(|c| c.code().to_owned()).unwrap_or_else(|| format!("no sqlstate: {e}"))
}

/// Runs one step against the server and the model; Err on any disagreement.
fn step(case: &mut Case, m: &mut Model, op: &Op, ci: bool) -> Result<(), String> {
    let now = m.now();
    match *op {
        Op::Pause => unreachable!("pauses are handled by the runner"),
        Op::RolledBack { lease, host, row, raise } => {
            let saved = m.clone();
            case.c.batch_execute("BEGIN").map_err(|e| format!("BEGIN: {e}"))?;
            if raise {
                // (The row then names no lease: a rival holding it no longer does.)
                let id = case.id * 10 + u32::from(row);
                let raised: i64 = case
                    .c
                    .query_one(
                        &format!(
                            "UPDATE tables SET owner_fencing_token = ((lease.token_ceiling() >> 40) << 40) + (1::bigint << 39)
                              WHERE id = {id} RETURNING owner_fencing_token"
                        ),
                        &[],
                    )
                    .map_err(|e| format!("hand raise of row {id}: {e}"))?
                    .get(0);
                m.rows.insert(row, raised);
            }
            let inner = Op::AcquireBound { lease, host, long: true, row, spelling: 0 };
            let result = step(case, m, &inner, ci);
            let handed = m.handed;
            case.c.batch_execute("ROLLBACK").map_err(|e| format!("ROLLBACK: {e}"))?;
            *m = saved;
            m.handed = handed;
            result?;
        }
        Op::Acquire { lease, host, long } => {
            let (name, who) = (case.name(lease), case.host(host));
            let sql = format!("SELECT token FROM lease.acquire({}, {}, $3)", arg(1, ci), arg(2, ci));
            let got = case.c.query_one(&sql, &[&name, &who, &ttl(long)]);
            let cur = m.leases.get(&lease).cloned();
            let held_elsewhere = cur.as_ref().is_some_and(|l| m.live(l) && l.owner != host);
            match (got, held_elsewhere) {
                (Err(e), true) if code(&e) == "LF005" => {}
                (Ok(row), false) => {
                    let token: i64 = row.get(0);
                    let prev = cur.as_ref().map_or(0, |l| l.token);
                    if token <= prev {
                        return Err(format!("token {token} not above {prev}"));
                    }
                    m.handed_out(token)?;
                    m.take(lease, cur.as_ref(), host);
                    let own = m.expiry(long);
                    m.leases.insert(lease, Lease { owner: host, token, own, released: false, bound: None });
                }
                (got, expected_refusal) => {
                    return Err(format!("acquire gave {:?}, model expected LF005: {expected_refusal}", got.map(|_| ())))
                }
            }
        }
        Op::AcquireBound { lease, host, long, row, spelling } => {
            let (name, who, key) = (case.name(lease), case.host(host), case.key(row, spelling));
            let sql = format!(
                "SELECT token FROM lease.acquire({}, {}, $3, 'tables', $4::text::text[])",
                arg(1, ci),
                arg(2, ci)
            );
            let got = case.c.query_one(&sql, &[&name, &who, &ttl(long), &key]);
            let cur = m.leases.get(&lease).cloned();
            let rival = m.row_holder(row, lease).filter(|(_, r)| r.owner != host);
            let refused = cur.as_ref().is_some_and(|l| m.live(l) && l.owner != host)
                || rival.as_ref().is_some_and(|(_, r)| m.live(r));
            match (got, refused) {
                (Err(e), true) if code(&e) == "LF005" => {}
                (Ok(row_), false) => {
                    let token: i64 = row_.get(0);
                    let prev = cur.as_ref().map_or(0, |l| l.token).max(m.row_token(row));
                    if token <= prev {
                        return Err(format!("token {token} not above {prev} (the lease's and the owner row's)"));
                    }
                    m.handed_out(token)?;
                    if let Some((k, r)) = rival {
                        m.lost.insert((r.owner, k), r.token);
                    }
                    m.take(lease, cur.as_ref(), host);
                    let own = m.expiry(long);
                    m.leases.insert(lease, Lease { owner: host, token, own, released: false, bound: Some(row) });
                    m.rows.insert(row, token);
                }
                (got, expected_refusal) => {
                    return Err(format!(
                        "bound acquire gave {:?}, model expected LF005: {expected_refusal}",
                        got.map_err(|e| code(&e)).map(|_| ())
                    ))
                }
            }
        }
        Op::Renew { lease, host, stale, long } => {
            let cur = m.leases.get(&lease).cloned();
            let token = cur.as_ref().map_or(1, |l| l.token - i64::from(stale));
            let got = case.c.query_one(
                &format!("SELECT lease.renew({}, {}, $3, $4)", arg(1, ci), arg(2, ci)),
                &[&case.name(lease), &case.host(host), &token, &ttl(long)],
            );
            let ok = cur.as_ref().is_some_and(|l| l.owner == host && l.token == token && m.live(l));
            match (got, ok) {
                (Ok(_), true) => m.leases.get_mut(&lease).unwrap().own = m.expiry(long),
                (Err(e), false) if code(&e) == "LF006" => {}
                (got, ok) => return Err(format!("renew gave {:?}, model expected success: {ok}", got.map(|_| ()))),
            }
        }
        Op::RenewBurst { lease, host } => {
            let cur = m.leases.get(&lease).cloned();
            let token = cur.as_ref().map_or(1, |l| l.token);
            let got = case.c.query_one(
                &format!(
                    "SELECT count(lease.renew({}, {}, $3, $4)) FROM pg_catalog.generate_series(1, 120)",
                    arg(1, ci),
                    arg(2, ci)
                ),
                &[&case.name(lease), &case.host(host), &token, &ttl(false)],
            );
            let ok = cur.as_ref().is_some_and(|l| l.owner == host && l.token == token && m.live(l));
            match (got, ok) {
                (Ok(_), true) => m.leases.get_mut(&lease).unwrap().own = m.expiry(false),
                (Err(e), false) if code(&e) == "LF006" => {}
                (got, ok) => {
                    return Err(format!("renew burst gave {:?}, model expected success: {ok}", got.map(|_| ())))
                }
            }
        }
        Op::Release { lease, host } => {
            let cur = m.leases.get(&lease).cloned();
            let token = cur.as_ref().map_or(1, |l| l.token);
            let got: bool = case
                .c
                .query_one(
                    &format!("SELECT lease.release({}, {}, $3)", arg(1, ci), arg(2, ci)),
                    &[&case.name(lease), &case.host(host), &token],
                )
                .map_err(|e| format!("release: {e}"))?
                .get(0);
            let mut expected = false;
            if let Some(l) = cur.filter(|l| l.owner == host && !l.released) {
                expected = m.live(&l);
                let e = m.leases.get_mut(&lease).unwrap();
                e.released = true;
                e.own = e.own.min(now);
            }
            if got != expected {
                return Err(format!("release returned {got}, model {expected}"));
            }
        }
        Op::ReleaseAll { host } => {
            let got: i32 = case
                .c
                .query_one(&format!("SELECT lease.release_all({})", arg(1, ci)), &[&case.host(host)])
                .map_err(|e| format!("release_all: {e}"))?
                .get(0);
            let held: Vec<u8> =
                m.leases.iter().filter(|(_, l)| l.owner == host && !l.released).map(|(k, _)| *k).collect();
            let expected = held.iter().filter(|k| m.live(&m.leases[k])).count() as i32;
            for k in held {
                let l = m.leases.get_mut(&k).unwrap();
                l.released = true;
                l.own = l.own.min(now);
            }
            m.lost.retain(|(h, _), _| *h != host);
            if let Some(s) = m.sessions.get_mut(&host) {
                if s.expires > now {
                    s.expires = now;
                }
            }
            if got != expected {
                return Err(format!("release_all returned {got}, model {expected}"));
            }
        }
        Op::Beat { host, long, list } => {
            let who = case.host(host);
            // Model: takeovers first, then the session (a new life if it lapsed).
            let mut expected: Vec<(String, String)> = Vec::new();
            let taken: Vec<u8> = m.lost.keys().filter(|(h, _)| *h == host).map(|(_, l)| *l).collect();
            for l in taken {
                m.lost.remove(&(host, l));
                expected.push((case.name(l), "taken".into()));
            }
            let mut s = m.sessions.get(&host).copied().unwrap_or(Session { since: NEG, expires: NEG });
            if s.expires <= now {
                for (k, l) in &m.leases {
                    if l.owner == host && !l.released && l.own <= now && l.own > s.since {
                        expected.push((case.name(*k), "expired".into()));
                    }
                }
                s.since = now;
            }
            s.expires = m.expiry(long);
            m.sessions.insert(host, s);
            let sql = if list {
                format!(
                    "SELECT name, CASE WHEN renewed THEN 'renewed' ELSE 'lost' END FROM lease.renew_all({}, $2)",
                    arg(1, ci)
                )
            } else {
                format!("SELECT name, lost FROM lease.heartbeat({}, $2)", arg(1, ci))
            };
            let mut got: Vec<(String, String)> = case
                .c
                .query(&sql, &[&who, &ttl(long)])
                .map_err(|e| format!("heartbeat: {e}"))?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            if list {
                for e in &mut expected {
                    e.1 = "lost".into();
                }
                for (k, l) in &m.leases {
                    if l.owner == host && !l.released && l.own > s.since {
                        expected.push((case.name(*k), "renewed".into()));
                    }
                }
            }
            got.sort();
            expected.sort();
            if got != expected {
                return Err(format!("heartbeat returned {got:?}, model {expected:?}"));
            }
        }
    }
    Ok(())
}

/// `lease.leases` agrees with the model on holder, token and liveness.
fn check_view(case: &mut Case, m: &Model) -> Result<(), String> {
    let prefix = format!("c{}:%", case.id);
    let mut got: Vec<(String, String, i64, bool)> = case
        .c
        .query("SELECT name, owner, token, live FROM lease.leases WHERE lower(name) LIKE $1", &[&prefix])
        .map_err(|e| e.to_string())?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    got.sort();
    let mut expected: Vec<_> =
        m.leases.iter().map(|(k, l)| (case.name(*k), case.host(l.owner), l.token, m.live(l))).collect();
    expected.sort();
    if got != expected {
        return Err(format!("lease.leases {got:?}, model {expected:?}"));
    }
    // Every index of the lease rows holds exactly the rows it should.
    lease_state_amcheck(case.c)?;
    for row in 0..ROWS {
        let id = case.id as i32 * 10 + i32::from(row);
        let token: i64 = case
            .c
            .query_one("SELECT coalesce(owner_fencing_token, 0) FROM tables WHERE id = $1", &[&id])
            .map_err(|e| e.to_string())?
            .get(0);
        if token != m.row_token(row) {
            return Err(format!("owner row {id} holds token {token}, model {}", m.row_token(row)));
        }
    }
    Ok(())
}

fn run_case(c: &mut Client, id: u32, ops: &[(Op, bool)], discarded: &Cell<u32>) -> Result<(), TestCaseError> {
    for row in 0..ROWS {
        c.execute("INSERT INTO tables VALUES ($1, NULL)", &[&(id as i32 * 10 + i32::from(row))])
            .map_err(|e| TestCaseError::fail(format!("owner rows: {e}")))?;
    }
    let mut case = Case { c, id };
    let mut m = Model::default();
    let mut phase_start = Instant::now();
    for (i, (op, ci)) in ops.iter().enumerate() {
        if let Op::Pause = op {
            check_view(&mut case, &m).map_err(|e| TestCaseError::fail(format!("before pause {i}: {e}")))?;
            m.step += 1;
            if phase_start.elapsed() >= PHASE_BUDGET {
                discarded.set(discarded.get() + 1);
                return Ok(());
            }
            thread::sleep(PAUSE);
            m.phase += 1;
            m.step = 0;
            phase_start = Instant::now();
            continue;
        }
        let r = step(&mut case, &mut m, op, *ci);
        m.step += 1;
        if phase_start.elapsed() >= PHASE_BUDGET {
            // Too slow for the model's clock: this case proves nothing.
            discarded.set(discarded.get() + 1);
            return Ok(());
        }
        r.map_err(|e| TestCaseError::fail(format!("step {i} {op:?} (ci: {ci}): {e}")))?;
    }
    check_view(&mut case, &m).map_err(|e| TestCaseError::fail(format!("at the end: {e}")))?;
    m.step += 1;
    if phase_start.elapsed() >= PHASE_BUDGET {
        discarded.set(discarded.get() + 1);
    }
    Ok(())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn leases_and_heartbeat_sessions_follow_the_model() {
    let db = TestDb::new("lease_model");
    let c = RefCell::new(db.connect());
    c.borrow_mut()
        .batch_execute(
            "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
             CREATE TABLE tables (id int PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE payouts (table_id int NOT NULL, fencing_token bigint);
             SELECT lease.protect('payouts', '{table_id}', 'fencing_token', 'tables', '{id}', 'owner_fencing_token');",
        )
        .unwrap();
    pg_lease_sessions::amcheck(&mut c.borrow_mut());
    let cases = env_u64("PG_LEASE_LEASE_MODEL_CASES", 16) as u32;
    let seed = env_u64("PG_LEASE_MODEL_SEED", DEFAULT_SEED);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let next_id = Cell::new(0u32);
    let discarded = Cell::new(0u32);
    let result = runner.run(&prop::collection::vec((op(), prop::bool::weighted(0.3)), 1..36), |ops| {
        next_id.set(next_id.get() + 1);
        run_case(&mut c.borrow_mut(), next_id.get(), &ops, &discarded)
    });
    println!(
        "lease model: {} cases run, {} discarded (a phase overran {PHASE_BUDGET:?})",
        next_id.get(),
        discarded.get()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(discarded.get() * 2 <= next_id.get(), "most cases overran their time budget: the machine is too loaded");
}
