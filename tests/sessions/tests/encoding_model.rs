//! Property test of resource identity across database encodings: *a name or
//! key is never taken for another, whatever bytes it holds.* (Attack reviews
//! 18 to 20 found look-alike rows, tables and columns, and refusals lost,
//! through text that does not survive the trip to UTF-8 and back.)
//!
//! proptest generates a case: a database encoding, up to four owner keys
//! spelled from that encoding's hazards (EUC_JP's NEC duplicate and its JIS
//! X 0208 twin, a user-defined character; SQL_ASCII bytes that are not
//! UTF-8 beside UTF-8 that looks like U+FFFD; EUC_JIS_2004's characters that
//! convert to two code points beside the pairs that make the same points;
//! LATIN1; MULE_INTERNAL, which a UTF-8 client cannot reach, is attack20's),
//! and up to ten
//! steps: `lease.acquire` bound to a key's owner row, a write with the
//! current, an older or a newer token, or DDL that renames the owner table,
//! moves it to another schema or renames its schema, to a name spelled like
//! a key (attack21: an owner table renamed to a name with no exact UTF-8
//! form silenced the fence). A small model predicts each outcome:
//! `acquire` bumps exactly that row when the key has an exact UTF-8 form
//! (it converts back to the same bytes; the model knows which characters do)
//! and is refused with `22P05` otherwise, touching no row; a write is
//! accepted with the current token and refused `LF001`/`LF002` otherwise;
//! the DDL is accepted when the new name has an exact UTF-8 form and refused
//! with `LF008` otherwise, leaving the name as it was. `lease.stats` must
//! read at every step.
//! After every step each owner row's token must equal the model's, and at the
//! end every refusal must be in the audit, distinct keys under distinct
//! `resource_key`s.
//!
//! Environment: `PG_LEASE_TEST_PORT` (required), `PG_LEASE_ENCODING_CASES`
//! (24 per encoding), `PG_LEASE_MODEL_SEED` (fixed default).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::{failure, must_run, one_i64, TestDb};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Encoding {
    EucJp,
    SqlAscii,
    EucJis2004,
    Latin1,
}

impl Encoding {
    const ALL: [Encoding; 4] = [Encoding::EucJp, Encoding::SqlAscii, Encoding::EucJis2004, Encoding::Latin1];

    fn name(self) -> &'static str {
        match self {
            Encoding::EucJp => "EUC_JP",
            Encoding::SqlAscii => "SQL_ASCII",
            Encoding::EucJis2004 => "EUC_JIS_2004",
            Encoding::Latin1 => "LATIN1",
        }
    }

    /// The characters keys are spelled from (each one character of the
    /// encoding, as bytes).
    fn alphabet(self) -> &'static [&'static [u8]] {
        match self {
            // NEC √, JIS √, a user-defined character, あ, ASCII, a backslash.
            Encoding::EucJp => &[b"\xad\xf5", b"\xa2\xe5", b"\xf5\xa1", b"\xa4\xa2", b"a", b"\\"],
            // Latin-1 é (not UTF-8), UTF-8 é, UTF-8 U+FFFD, ASCII.
            Encoding::SqlAscii => &[b"\xe9", b"\xc3\xa9", b"\xef\xbf\xbd", b"a"],
            // ˥ (U+02E5), ˩ (U+02E9), ˩˥ (one character: U+02E9 U+02E5), ASCII.
            Encoding::EucJis2004 => &[b"\xab\xe0", b"\xab\xe4", b"\xab\xe5", b"a"],
            Encoding::Latin1 => &[b"\xe9", b"\xe8", b"a"],
        }
    }

    /// Whether the key spelled by `symbols` converts to UTF-8 and back to
    /// the same bytes.
    fn exact(self, symbols: &[usize]) -> bool {
        let a = self.alphabet();
        match self {
            Encoding::EucJp => symbols.iter().all(|&s| a[s] != b"\xad\xf5" && a[s] != b"\xf5\xa1"),
            Encoding::SqlAscii => symbols.iter().all(|&s| a[s] != b"\xe9"),
            Encoding::Latin1 => true,
            Encoding::EucJis2004 => {
                // UTF-8 back to EUC_JIS_2004 takes two code points as one
                // character where JIS X 0213 has one for them, left to right:
                // U+02E9 U+02E5 is 0xABE5 and U+02E5 U+02E9 is 0xABE6.
                let points: Vec<u32> = symbols
                    .iter()
                    .flat_map(|&s| match a[s] {
                        b"\xab\xe0" => vec![0x2E5],
                        b"\xab\xe4" => vec![0x2E9],
                        b"\xab\xe5" => vec![0x2E9, 0x2E5],
                        _ => vec![u32::from(b'a')],
                    })
                    .collect();
                let mut back: Vec<u8> = vec![];
                let mut i = 0;
                while i < points.len() {
                    match (points[i], points.get(i + 1)) {
                        (0x2E9, Some(0x2E5)) => (back.extend_from_slice(b"\xab\xe5"), i += 2),
                        (0x2E5, Some(0x2E9)) => (back.extend_from_slice(b"\xab\xe6"), i += 2),
                        (0x2E5, _) => (back.extend_from_slice(b"\xab\xe0"), i += 1),
                        (0x2E9, _) => (back.extend_from_slice(b"\xab\xe4"), i += 1),
                        _ => (back.push(b'a'), i += 1),
                    };
                }
                back == bytes(self, symbols)
            }
        }
    }
}

fn bytes(enc: Encoding, symbols: &[usize]) -> Vec<u8> {
    symbols.iter().flat_map(|&s| enc.alphabet()[s].iter().copied()).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key as SQL (its bytes, in the database's encoding).
fn key_sql(enc: Encoding, symbols: &[usize]) -> String {
    format!("convert_from('\\x{}'::bytea, '{}')", hex(&bytes(enc, symbols)), enc.name())
}

#[derive(Clone, Debug)]
enum Step {
    Acquire(usize),
    /// A write for key `.0` with the current token plus `.1` (-1, 0, 1).
    Write(usize, i64),
    /// The owner table's qualified name changed to one holding key `.0`'s
    /// spelling: `.1` 0 renames the table, 1 moves it to a new schema, 2
    /// renames its schema.
    Rename(usize, u8),
}

#[derive(Clone, Debug)]
struct Case {
    keys: Vec<Vec<usize>>,
    steps: Vec<Step>,
}

fn case(enc: Encoding) -> impl Strategy<Value = Case> {
    let n = enc.alphabet().len();
    (
        prop::collection::vec(prop::collection::vec(0..n, 1..=3), 1..=4),
        prop::collection::vec((0..4usize, 0..5u8, 0..3u8), 1..=10),
    )
        .prop_map(move |(keys, steps)| {
            // Keys are rows: one per distinct spelling.
            let mut distinct: Vec<Vec<usize>> = vec![];
            for k in keys {
                if !distinct.iter().any(|d| bytes(enc, d) == bytes(enc, &k)) {
                    distinct.push(k);
                }
            }
            let steps = steps
                .into_iter()
                .map(|(k, what, kind)| {
                    let k = k % distinct.len();
                    match what {
                        0 => Step::Acquire(k),
                        4 => Step::Rename(k, kind),
                        w => Step::Write(k, i64::from(w) - 2),
                    }
                })
                .collect();
            Case { keys: distinct, steps }
        })
}

/// The owner table's qualified name now, as SQL (only names with an exact
/// UTF-8 form are ever given to it, so the client's UTF-8 text names it).
fn owner_name(c: &mut Client, oid: u32) -> String {
    c.query_one(&format!("SELECT {oid}::pg_catalog.regclass::text"), &[]).unwrap().get(0)
}

/// Runs one case on fresh tables `s{n}.t{n}` (owner rows) and `p{n}` (fenced).
fn run_case(c: &mut Client, enc: Encoding, n: u32, case: &Case) -> Result<(), TestCaseError> {
    let p = format!("p{n}");
    must_run(
        c,
        &format!(
            "CREATE SCHEMA s{n};
             CREATE TABLE s{n}.t{n} (id text PRIMARY KEY, owner_fencing_token bigint);
             CREATE TABLE {p} (k text NOT NULL, tok bigint);
             SELECT lease.protect('{p}', '{{k}}', 'tok', 's{n}.t{n}');"
        ),
    );
    let oid = one_i64(c, &format!("SELECT 's{n}.t{n}'::regclass::oid::bigint")) as u32;
    let mut t = owner_name(c, oid);
    let mut model: Vec<i64> = vec![5; case.keys.len()];
    for k in &case.keys {
        must_run(c, &format!("INSERT INTO {t} VALUES ({}, 5)", key_sql(enc, k)));
    }
    let (mut refused, mut issued) = (BTreeMap::<usize, usize>::new(), 0i64);
    for (i, step) in case.steps.iter().enumerate() {
        match *step {
            Step::Acquire(k) => {
                let key = key_sql(enc, &case.keys[k]);
                let name = format!("c{n}_{i}");
                let got = c
                    .query_one(
                        &format!("SELECT token FROM lease.acquire('{name}', 'h', 60000, '{t}', ARRAY[{key}])"),
                        &[],
                    )
                    .map(|r| r.get::<_, i64>(0));
                if enc.exact(&case.keys[k]) {
                    let token = got.map_err(|e| TestCaseError::fail(format!("step {i}: acquire {step:?}: {e}")))?;
                    prop_assert!(token > model[k] && token > issued, "step {i}: token {token} not above {model:?}");
                    model[k] = token;
                    issued = token;
                    must_run(c, &format!("SELECT lease.release('{name}', 'h', {token})"));
                } else {
                    let code = got.err().and_then(|e| e.code().map(|c| c.code().to_owned()));
                    prop_assert_eq!(code.as_deref(), Some("22P05"), "step {}: acquire {:?}", i, step);
                }
            }
            Step::Rename(k, kind) => {
                let name = format!("'r{n}_{i}_' || {}", key_sql(enc, &case.keys[k]));
                let ddl = match kind {
                    0 => format!("EXECUTE format('ALTER TABLE %s RENAME TO %I', {oid}::regclass, {name})"),
                    1 => format!(
                        "EXECUTE format('CREATE SCHEMA %I', {name});
                         EXECUTE format('ALTER TABLE %s SET SCHEMA %I', {oid}::regclass, {name})"
                    ),
                    _ => format!(
                        "EXECUTE format('ALTER SCHEMA %I RENAME TO %I',
                                        (SELECT n.nspname FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
                                          WHERE r.oid = {oid}), {name})"
                    ),
                };
                let sql = format!("DO $$ BEGIN {ddl}; END $$");
                let code = failure(c, &sql).map(|[code, _]| code);
                let expected = (!enc.exact(&case.keys[k])).then_some("LF008");
                prop_assert_eq!(code.as_deref(), expected, "step {}: {}", i, sql);
                let now = owner_name(c, oid);
                prop_assert!((now != t) == expected.is_none(), "step {i}: owner table {t} is now {now}");
                t = now;
            }
            Step::Write(k, delta) => {
                let token = model[k] + delta;
                let sql = format!("INSERT INTO {p} VALUES ({}, {token})", key_sql(enc, &case.keys[k]));
                let code = failure(c, &sql).map(|[code, _]| code);
                let expected = match delta {
                    0 => None,
                    d if d < 0 => Some("LF001"),
                    _ => Some("LF002"),
                };
                prop_assert_eq!(code.as_deref(), expected, "step {}: {}", i, sql);
                if expected.is_some() {
                    *refused.entry(k).or_default() += 1;
                }
            }
        }
        // Every owner row holds the model's token: no token reached another row.
        let rows = c
            .query(
                &format!(
                    "SELECT encode(convert_to(id, pg_catalog.getdatabaseencoding()), 'hex'), owner_fencing_token FROM {t}"
                ),
                &[],
            )
            .unwrap();
        let got: BTreeMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        // lease.stats reads whatever names the owner table had.
        prop_assert!(failure(c, "SELECT count(*) FROM lease.stats").is_none(), "step {}: lease.stats", i);
        let want: BTreeMap<String, i64> =
            case.keys.iter().zip(&model).map(|(k, &tok)| (hex(&bytes(enc, k)), tok)).collect();
        prop_assert_eq!(&got, &want, "after step {}", i);
    }
    // Every refusal audited; distinct keys under distinct resource_keys
    // (a key with a backslash may read like another's written-out bytes).
    let total: usize = refused.values().sum();
    let audited = format!("SELECT count(*) FROM lease.rejected_writes WHERE target_table = 'public.{p}'");
    for _ in 0..150 {
        if one_i64(c, &audited) as usize >= total {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    prop_assert_eq!(one_i64(c, &audited) as usize, total, "refusals audited");
    let backslash = case.keys.iter().any(|k| bytes(enc, k).contains(&b'\\'));
    if !backslash {
        let shown = one_i64(
            c,
            &format!(
                "SELECT count(DISTINCT resource_key) FROM lease.rejected_writes WHERE target_table = 'public.{p}'"
            ),
        );
        prop_assert_eq!(shown as usize, refused.len(), "distinct keys audited as distinct resource_keys");
    }
    Ok(())
}

#[test]
fn names_and_keys_keep_their_identity_in_every_encoding() {
    let cases: u32 = std::env::var("PG_LEASE_ENCODING_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let seed: u64 = std::env::var("PG_LEASE_MODEL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261130);
    for enc in Encoding::ALL {
        let db = TestDb::with_options(
            &format!("encmodel_{}", enc.name().to_lowercase()),
            &format!("ENCODING '{}' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'", enc.name()),
        );
        let c = std::cell::RefCell::new(db.connect());
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let mut runner = TestRunner::new_with_rng(
            Config { cases, failure_persistence: None, max_shrink_iters: 200, ..Config::default() },
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        );
        let n = Cell::new(0u32);
        let result = runner.run(&case(enc), |case| {
            n.set(n.get() + 1);
            run_case(&mut c.borrow_mut(), enc, n.get(), &case)
        });
        if let Err(e) = result {
            panic!("{}: {e}", enc.name());
        }
    }
}
