//! Attack review 20: pg_lease 0.9.2's text crossing between the database's
//! encoding and UTF-8 (`pg::from_server`, `exact_from_server`, `to_server`,
//! the `\xadf5` escapes), in databases whose encoding is not UTF-8, over real
//! connections. attack18.rs, attack19.rs and encoding.rs hold what earlier
//! reviews found; none is repeated here. Tests marked **Hole** failed
//! against the code reviewed; **Defence holds** pass. Fixed since: the
//! MULE_INTERNAL holes but the last (to_server never raises; text there is
//! read as ASCII with every other byte written out), EUC_JIS_2004's
//! combined characters (a character that does not come back after the one
//! before it is written out), fenced partitions and schemas with such names
//! (a fenced table's name is only shown, never put into SQL), lease-name
//! length (counted in characters, not escapes), row_data stays an object.
//! Open, `#[ignore]`d: a literal `\xadf5` text looks like the escape; MULE_INTERNAL
//! refuses non-ASCII names (README, Limits). Most severe first:
//!
//! - medium: MULE_INTERNAL database (a server encoding PostgreSQL has no
//!   conversion to or from UTF-8 for): any stale writer keeps its refusals
//!   out of `lease.rejected_writes` with `pg_lease.audit_statement` on by
//!   ending its statement with a comment `-- é©` (MULE bytes 81 E9 81 A9,
//!   whose tail reads as valid UTF-8), with `audit_row` on by such a value
//!   in any column, and always when its role name has an accent: the audit
//!   writer's `to_server` raises `XX000 pg_lease: no conversion from UTF8
//!   to the database's encoding` and drops the record (README: a character
//!   the audit database cannot hold becomes `?`)
//!   (`mule_internal_stale_writers_keep_their_refusals_in_the_audit`);
//! - medium: MULE_INTERNAL, refusals lose their LF codes and their audit:
//!   a key or lease name whose MULE bytes read in part as valid UTF-8
//!   (`é©`, 81 E9 81 A9: `\x81` then `適`) makes `LF001`, `LF004`, `LF005`,
//!   `LF006` (and `fenced_boundary_write`'s `23502`) `XX000 pg_lease: no conversion
//!   from UTF8 to the database's encoding`; the LF001 is not audited
//!   (`mule_internal_refusals_keep_their_lf_codes`);
//! - medium: MULE_INTERNAL database named with an accent from a UTF-8
//!   session: `CREATE EXTENSION pg_lease` fails (`XX000 ... no conversion
//!   from UTF8`); renamed so after the extension was created, its refusals
//!   are never recorded and `lease.audit_status()` fails (the EUC_JP twin
//!   was fixed after attack19)
//!   (`mule_internal_database_with_an_accented_name_keeps_its_audit`);
//! - medium: two resources audited as one by the escape itself: EUC_JP
//!   owner rows for NEC `√` (0xADF5) and for the ASCII text `\xadf5` are
//!   both recorded as `(k)=(\xadf5)` (README: "kept as its bytes written
//!   out, `\xadf5`, so two keys that differ stay two keys")
//!   (`euc_jp_audit_tells_an_nec_key_from_its_escape_written_out`);
//! - medium: two resources audited as one with no escape at all: an
//!   EUC_JIS_2004 character that converts to two code points (0xABE5) and
//!   the two characters that make the same code points (0xABE4 0xABE0) are
//!   both recorded as 0xABE5 (each character of the pair comes back alone,
//!   so `from_server` shows no `\x..`); acquire's 22P05 for the pair shows
//!   no `\x..` either
//!   (`euc_jis_2004_audit_tells_a_combined_character_from_its_parts`);
//! - medium (availability; refusals lose their LF code and audit): EUC_JP,
//!   the DDL guard accepts a partition of a fenced table named with a NEC
//!   character (CREATE ... PARTITION OF, RENAME of a partition) and a
//!   RENAME of a fenced table's schema to such a name, and every
//!   write through it, the current token too, then fails `22P05` instead
//!   of being judged; stale writes are not `LF001`, not audited
//!   (`euc_jp_fenced_table_partition_or_schema_with_an_nec_name`);
//! - medium (availability, monitoring): MULE_INTERNAL database: `lease.stats`
//!   fails with `XX000 pg_lease: no conversion from UTF8 to the database's
//!   encoding` as soon as any other database of the cluster has a protected
//!   table with a non-ASCII name (`payé` in a UTF-8 database), and
//!   `lease.audit_databases()` as soon as a database named with an accent
//!   has refused a write
//!   (`mule_internal_stats_survive_another_databases_accented_names`);
//! - low: MULE_INTERNAL, every non-ASCII table name and owner key is refused
//!   (`22P05 ... no exact UTF-8 form`), a LATIN1 `é` (MULE 81 E9) included,
//!   though README says non-ASCII names can be fenced outside UTF-8 and names
//!   only NEC/user-defined/SQL_ASCII characters as refused
//!   (`mule_internal_fences_latin1_names_and_keys`);
//! - low: a lease name or owner of 50 EUC_JP characters with no exact UTF-8
//!   form is refused as "300 characters long; at most 256 are allowed" (the
//!   length is counted on the `\xadf5` escapes, not the characters), though
//!   README says lease names and owners are compared as stored, are "not
//!   affected", and allows 256 characters
//!   (`euc_jp_lease_names_are_limited_by_their_characters_not_their_escapes`);
//! - low: EUC_JP with `pg_lease.audit_row` on, a refused row holding a NEC
//!   character is recorded as a JSON string of the row's text, not an
//!   object (the `\xadf5` escape makes the JSON invalid)
//!   (`euc_jp_audit_row_with_an_nec_character_stays_an_object`);
//! - low: the LF005 refusal of the lease named NEC `n√` and of the lease
//!   named `n\xadf5` (ASCII) are the same words: a client cannot tell which
//!   lease is meant (`euc_jp_lease_refusals_tell_an_nec_name_from_its_escape`).
//!
//! Defences that hold: `lease.heartbeat` and `lease.renew_all` hand back the
//! lease names as stored (NEC `√` as its bytes, not the escape), so a client
//! can renew what they report
//! (`euc_jp_heartbeat_and_renew_all_return_names_as_stored`); in
//! EUC_JIS_2004, `acquire` bound to a combined character bumps that row and
//! not the row of the pair that converts alike, and the pair is refused as
//! an owner key and as a key column (`22P05`)
//! (`euc_jis_2004_acquire_names_the_row_it_was_given`); there too,
//! `fenced_boundary_write` stores a combined character as given and refuses
//! the pair, and high-water marks (INSERT, MERGE) keep the two apart
//! (`euc_jis_2004_boundary_write_and_high_water_keep_combined_and_pair_apart`);
//! `ATTACH PARTITION` of a NEC-named table holding stale rows is `LF008`
//! (`euc_jp_attach_of_an_nec_named_table_with_stale_rows_is_refused`);
//! `unprotect` of a
//! fenced table renamed to a NEC name works (tried with psql, not kept).

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

const EUC_JP: &str = "ENCODING 'EUC_JP' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";
const MULE: &str = "ENCODING 'MULE_INTERNAL' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'";

/// EUC_JP NEC `√` (row 13, 0xADF5), as SQL.
const NEC_ROOT: &str = r"convert_from('\xadf5'::bytea, 'EUC_JP')";
/// An EUC_JP user-defined character (0xF5A1): no UTF-8 twin.
const UDC: &str = r"convert_from('\xf5a1'::bytea, 'EUC_JP')";

/// A payout table `pay` fenced against `tables` (text keys).
const PAY: &str = "
    CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
    CREATE TABLE pay (k text NOT NULL, tok bigint);
    SELECT lease.protect('pay', '{k}', 'tok');
";

use pg_lease_sessions::{failure as run, must_fail as refusal, must_run as ok};

/// Waits (up to 15 s) until `lease.rejected_writes` holds `n` rows; how many
/// it holds then.
fn audited(c: &mut Client, n: i64) -> i64 {
    let mut got = 0;
    for _ in 0..150 {
        got = one_i64(c, "SELECT count(*) FROM lease.rejected_writes");
        if got >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    got
}

/// A database created by this test (any encoding, so not through
/// [`TestDb`], whose Rust client speaks UTF-8 only), dropped on drop.
struct RawDb(String);

impl RawDb {
    fn create(label: &str, options: &str) -> RawDb {
        let name = format!("a20_{label}_{}", std::process::id());
        let mut admin = connect_to("postgres", "postgres");
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name} {options}")).unwrap();
        RawDb(name)
    }
}

impl Drop for RawDb {
    fn drop(&mut self) {
        let _ = connect_to("postgres", "postgres")
            .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0));
    }
}

/// A login role of this test's own, dropped on drop (after its databases).
struct RawRole(String);

impl Drop for RawRole {
    fn drop(&mut self) {
        let _ = connect_to("postgres", "postgres").batch_execute(&format!("DROP ROLE IF EXISTS \"{}\"", self.0));
    }
}

/// **Hole (medium): stale writers escape the audit.** A MULE_INTERNAL
/// database (a server encoding PostgreSQL converts to and from no UTF-8),
/// `pay (k, tok, note)` fenced against `tables`, row `a` at token 5,
/// `pg_lease.audit_row` and `audit_statement` on for the database (a DBA's
/// choice). Three stale writes (token 4), each refused with `LF001`:
/// - by a login role `rolé_…` (created from a UTF-8 database, as any role
///   with an accent is: role names are shared);
/// - by `postgres`, whose statement ends in a comment `-- é©` (MULE bytes
///   81 E9 81 A9, whose tail E9 81 A9 reads as valid UTF-8);
/// - by `postgres`, whose row's `note` is `é©`.
///
/// None reaches `lease.rejected_writes`: the audit writer's `to_server`
/// raises `XX000 pg_lease: no conversion from UTF8 to the database's
/// encoding` on the record's role, statement or row text, and drops the
/// record (`lease.audit_databases()` says so); the same stale write in
/// ASCII is recorded. Any writer keeps its stale writes out of the audit by
/// a comment. Expected (README, audit: "a character the audit database's
/// encoding cannot hold becomes `?`"): four records.
#[test]
fn mule_internal_stale_writers_keep_their_refusals_in_the_audit() {
    let role = RawRole(format!("rolé_a20_{}", std::process::id()));
    let db = RawDb::create("mule_role", MULE);
    connect_to("postgres", "postgres").batch_execute(&format!("CREATE ROLE \"{}\" LOGIN", role.0)).unwrap();
    let e = r"convert_from('\x81e981a9'::bytea, 'MULE_INTERNAL')";
    let (_, err) = psql(
        &db.0,
        "postgres",
        "MULE_INTERNAL",
        format!(
            "\\set ON_ERROR_STOP 1
             CREATE EXTENSION pg_lease;
             {PAY}
             ALTER TABLE pay ADD COLUMN note text;
             INSERT INTO tables VALUES ('a', 5);
             GRANT INSERT ON pay TO \"{}\";
             ALTER DATABASE {} SET pg_lease.audit_row = on;
             ALTER DATABASE {} SET pg_lease.audit_statement = on;",
            role.0, db.0, db.0
        ),
    );
    assert!(!err.contains("ERROR"), "{err}");
    // The role's name goes to the server as UTF-8 bytes, as it is stored.
    let (_, by_role) = psql(&db.0, &role.0, "SQL_ASCII", "INSERT INTO pay VALUES ('a', 4);");
    let (_, by_comment) =
        psql(&db.0, "postgres", "MULE_INTERNAL", b"INSERT INTO pay VALUES ('a', 4) -- \x81\xe9\x81\xa9\n;\n");
    let (_, by_row) = psql(&db.0, "postgres", "MULE_INTERNAL", format!("INSERT INTO pay VALUES ('a', 4, {e});"));
    // A control: the same stale write, all ASCII.
    let (_, plain) = psql(&db.0, "postgres", "MULE_INTERNAL", "INSERT INTO pay VALUES ('a', 4);");
    for err in [&by_role, &by_comment, &by_row, &plain] {
        assert!(err.contains("StaleOwnerBoundaryWrite"), "{err}");
    }
    let mut recorded = String::new();
    for _ in 0..60 {
        recorded = psql(&db.0, "postgres", "MULE_INTERNAL", "SELECT count(*) FROM lease.rejected_writes;").0;
        if recorded == "4" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status =
        psql(&db.0, "postgres", "MULE_INTERNAL", "SELECT status FROM lease.audit_databases() WHERE database_oid = (SELECT oid FROM pg_database WHERE datname = current_database());").0;
    assert_eq!(recorded, "4", "refusals not recorded: {status}");
}

/// The SQLSTATEs of the errors psql reported on stderr (`\set VERBOSITY
/// verbose` puts each right after `ERROR:  `), in order.
fn error_codes(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.split("ERROR:  ").nth(1))
        .map(|rest| rest.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

/// **Hole (medium): refusals lose their LF codes and their audit.** A
/// MULE_INTERNAL database, `pay` fenced against `tables`, the owner row for
/// the key `é©` (MULE bytes 81 E9 81 A9, LATIN1 é and ©) at token 5. With
/// no conversion to UTF-8, `from_server` reads the bytes as UTF-8: `\x81`
/// then E9 81 A9, which is valid UTF-8 (`適`), so the refusal's text holds a
/// non-ASCII character that `to_server` cannot write back (no conversion
/// from UTF-8 either): the stale write (token 4) is refused with `XX000
/// pg_lease: no conversion from UTF8 to the database's encoding` instead of
/// `LF001`, and its audit record is dropped. Likewise the lease named `é©`:
/// another owner's `acquire` gets `XX000` instead of `LF005`, a `renew`
/// with a wrong token `XX000` instead of `LF006`; and
/// `fenced_boundary_write` leaving out a NOT NULL column of a table whose
/// default holds `é©` gets `XX000` instead of `23502`; lowering the token
/// of the owner row `é©` gets `XX000` instead of `LF004`. Expected:
/// `LF001` (audited), `LF005`, `LF006`, `23502`, `LF004`.
#[test]
fn mule_internal_refusals_keep_their_lf_codes() {
    let db = RawDb::create("mule_codes", MULE);
    let e = r"convert_from('\x81e981a9'::bytea, 'MULE_INTERNAL')";
    let (_, err) = psql(
        &db.0,
        "postgres",
        "MULE_INTERNAL",
        format!(
            "\\set ON_ERROR_STOP 1
             CREATE EXTENSION pg_lease;
             {PAY}
             INSERT INTO tables VALUES ({e}, 5);
             INSERT INTO pay VALUES ({e}, 5);
             CREATE TABLE bw (k text NOT NULL, n int NOT NULL, note text DEFAULT {e}, tok bigint);
             SELECT lease.protect('bw', '{{k}}', 'tok');
             INSERT INTO tables VALUES ('a', 5);
             SELECT lease.acquire({e}, 'h1', 60000);"
        ),
    );
    assert!(!err.contains("ERROR"), "{err}");
    let (_, err) = psql(
        &db.0,
        "postgres",
        "MULE_INTERNAL",
        format!(
            "\\set VERBOSITY verbose
             INSERT INTO pay VALUES ({e}, 4);
             SELECT lease.acquire({e}, 'h2', 60000);
             SELECT lease.renew({e}, 'h1', 5, 60000);
             SELECT lease.fenced_boundary_write('bw', 5, '[{{\"k\": \"a\"}}]');
             UPDATE tables SET owner_fencing_token = 4 WHERE id = {e};"
        ),
    );
    assert_eq!(error_codes(&err), ["LF001", "LF005", "LF006", "23502", "LF004"], "{err}");
    // The stale write and the lowered owner token: both refusals are audited.
    let mut recorded = String::new();
    for _ in 0..60 {
        recorded = psql(
            &db.0,
            "postgres",
            "MULE_INTERNAL",
            "SELECT string_agg(sqlstate, ',' ORDER BY sqlstate) FROM lease.rejected_writes;",
        )
        .0;
        if recorded == "LF001,LF004" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(recorded, "LF001,LF004");
}

/// A database `name` (non-ASCII) of this test's own, dropped on drop.
struct NamedDb(String);

impl Drop for NamedDb {
    fn drop(&mut self) {
        let _ = connect_to("postgres", "postgres")
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.0));
    }
}

/// **Hole (medium): no extension, then no audit, by the database's name.**
/// A MULE_INTERNAL database named `a20_mulé_…` from a UTF-8 session (the
/// cluster keeps the name's UTF-8 bytes; PostgreSQL runs such a database):
/// `CREATE EXTENSION pg_lease` fails with `XX000 pg_lease: no conversion
/// from UTF8 to the database's encoding` (the install script's
/// `lease.audit_status()` returns the name through `to_server`). A
/// MULE_INTERNAL database with the extension, renamed so afterwards:
/// `lease.audit_status()` fails the same way, and a stale write, refused
/// `LF001`, is never recorded (the audit writer drops the record on the
/// database's name). attack19 fixed the EUC_JP twin of this (`22021`).
/// Expected: the extension created; the refusal recorded; the status shown.
#[test]
fn mule_internal_database_with_an_accented_name_keeps_its_audit() {
    let fresh = NamedDb(format!("a20_mulé_{}", std::process::id()));
    let renamed = NamedDb(format!("a20_mulé2_{}", std::process::id()));
    let ascii = RawDb::create("mule_renamed", MULE);
    let mut admin = connect_to("postgres", "postgres");
    admin.batch_execute(&format!("CREATE DATABASE \"{}\" {MULE}", fresh.0)).unwrap();
    let (_, created) =
        psql(&fresh.0, "postgres", "MULE_INTERNAL", "\\set VERBOSITY verbose\nCREATE EXTENSION pg_lease;");
    let (_, err) = psql(
        &ascii.0,
        "postgres",
        "MULE_INTERNAL",
        format!("\\set ON_ERROR_STOP 1\nCREATE EXTENSION pg_lease;\n{PAY}\nINSERT INTO tables VALUES ('a', 5);"),
    );
    assert!(!err.contains("ERROR"), "{err}");
    admin.batch_execute(&format!("ALTER DATABASE {} RENAME TO \"{}\"", ascii.0, renamed.0)).unwrap();
    let (_, stale) =
        psql(&renamed.0, "postgres", "MULE_INTERNAL", "\\set VERBOSITY verbose\nINSERT INTO pay VALUES ('a', 4);");
    let mut recorded = String::new();
    for _ in 0..60 {
        recorded = psql(&renamed.0, "postgres", "MULE_INTERNAL", "SELECT count(*) FROM lease.rejected_writes;").0;
        if recorded == "1" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, status) = psql(
        &renamed.0,
        "postgres",
        "MULE_INTERNAL",
        "\\set VERBOSITY verbose\nSELECT status FROM lease.audit_status();",
    );
    assert_eq!(
        (error_codes(&created), error_codes(&stale), recorded.as_str(), error_codes(&status)),
        (vec![], vec!["LF001".to_owned()], "1", vec![]),
        "{created}\n{status}"
    );
}

/// **Hole (medium): two resources audited as one, by the escape itself.**
/// EUC_JP database, owner rows for NEC `√` (0xADF5, no exact UTF-8 form)
/// and for the ASCII text `\xadf5` (what a key may hold: a hex dump, a path),
/// both at token 5. A stale write (token 4) for each is refused (`LF001`),
/// and both are recorded with `resource_key` `(k)=(\xadf5)`, byte for byte
/// the same: the NEC character's escape is indistinguishable from the text
/// that spells it (the LF001 messages too). README (audit): "a character
/// with no exact UTF-8 form ... is kept as its bytes written out, `\xadf5`,
/// so two keys that differ stay two keys". Expected: two different
/// `resource_key`s (e.g. a literal backslash escaped as `\\`).
#[test]
#[ignore = "open: a text that literally reads \\xadf5 looks like the escape of a character with no exact UTF-8 form (README, Limits); telling them apart means escaping every backslash shown"]
fn euc_jp_audit_tells_an_nec_key_from_its_escape_written_out() {
    let (_db, mut c) =
        db_with("a20_escape", EUC_JP, &format!(r"{PAY} INSERT INTO tables VALUES ({NEC_ROOT}, 5), ('\xadf5', 5);"));
    let nec = refusal(&mut c, &format!("INSERT INTO pay VALUES ({NEC_ROOT}, 4)"));
    let ascii = refusal(&mut c, r"INSERT INTO pay VALUES ('\xadf5', 4)");
    assert_eq!((nec[0].as_str(), ascii[0].as_str()), ("LF001", "LF001"));
    assert_eq!(audited(&mut c, 2), 2);
    let distinct = one_i64(&mut c, "SELECT count(DISTINCT resource_key) FROM lease.rejected_writes");
    assert_eq!(distinct, 2, "both refusals recorded under one key; messages: {nec:?} / {ascii:?}");
}

/// **Hole (medium): two resources audited as one, with no escape.** An
/// EUC_JIS_2004 database (a server encoding whose conversion to UTF-8 turns
/// one character into two code points and back: `˥˩` 0xABE5 is U+02E9
/// U+02E5, and the two characters `˩` 0xABE4 and `˥` 0xABE0 make the same
/// two code points), owner rows for the one-character key 0xABE5 and the
/// two-character key 0xABE4 0xABE0, both at token 5. A stale write (token
/// 4) for each is refused (`LF001`), and both are recorded with the same
/// `resource_key` (`(k)=(` 0xABE5 `)`): each character of the pair comes
/// back alone, so `from_server` shows no `\x..`, and the audit writes the
/// pair back as the one character. `lease.acquire` bound to the pair is
/// refused (`22P05`, rightly), but its message says the characters "shown
/// as \x.." are the culprits and shows none. Expected: two different
/// `resource_key`s (the pair shown as its bytes, as README says of text
/// that would come back as another).
#[test]
fn euc_jis_2004_audit_tells_a_combined_character_from_its_parts() {
    let (_db, mut c) = db_with(
        "a20_jis2004",
        "ENCODING 'EUC_JIS_2004' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'",
        &format!(
            r"{PAY} INSERT INTO tables VALUES (convert_from('\xabe5', 'EUC_JIS_2004'), 5),
                                          (convert_from('\xabe4abe0', 'EUC_JIS_2004'), 5);"
        ),
    );
    for key in [r"'\xabe5'", r"'\xabe4abe0'"] {
        let r = refusal(&mut c, &format!("INSERT INTO pay VALUES (convert_from({key}, 'EUC_JIS_2004'), 4)"));
        assert_eq!(r[0], "LF001", "{key}: {r:?}");
    }
    assert_eq!(audited(&mut c, 2), 2);
    let keys: String = c
        .query_one(
            "SELECT string_agg(encode(convert_to(resource_key, 'EUC_JIS_2004'), 'hex'), ' ' ORDER BY id)
               FROM lease.rejected_writes",
            &[],
        )
        .unwrap()
        .get(0);
    let bound = refusal(
        &mut c,
        r"SELECT lease.acquire('L', 'h', 60000, 'tables', ARRAY[convert_from('\xabe4abe0', 'EUC_JIS_2004')])",
    );
    assert_eq!(bound[0], "22P05", "{bound:?}");
    assert_eq!(one_i64(&mut c, "SELECT count(DISTINCT resource_key) FROM lease.rejected_writes"), 2, "{keys}");
}

/// **Hole (medium, availability; refusals lose their code and audit).**
/// EUC_JP database, `pay` partitioned by key and fenced against `tables`
/// (rows `a`, `b` at token 5), partition `pay_a`, and `s.pay2` fenced
/// against `tables` too. The DDL guard accepts `CREATE TABLE "pp<NEC √>"
/// PARTITION OF pay FOR VALUES IN ('b')`, `ALTER TABLE pay_a RENAME TO
/// "pa<NEC √>"` and `ALTER SCHEMA s RENAME TO "s<NEC √>"`; from then on
/// every write to those tables, with the current token too, fails with
/// `22P05 pg_lease:
/// table name "pa\xadf5" has a character with no exact UTF-8 form`: a stale
/// write is no longer `LF001` (a client that freezes on LF001 retries) and
/// is neither audited nor counted. The fenced table's (or partition's) own
/// name and schema are not put into SQL by the fence (`config::build` reads
/// them, through the exact `relation_names`, for messages and the stats
/// slot, where `from_server` could show `\xadf5`). (Attaching such a partition to an
/// *owner* table is refused at DDL time with 22P05, a clear error.)
/// Expected: either the DDL refused (22P05, nothing fenced breaks), or the
/// writes judged: current token accepted, stale `LF001` and audited.
#[test]
fn euc_jp_fenced_table_partition_or_schema_with_an_nec_name() {
    let (_db, mut c) = db_with(
        "a20_nec_part",
        EUC_JP,
        "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
         INSERT INTO tables VALUES ('a', 5), ('b', 5);
         CREATE TABLE pay (k text NOT NULL, tok bigint) PARTITION BY LIST (k);
         CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
         SELECT lease.protect('pay', '{k}', 'tok');
         INSERT INTO pay VALUES ('a', 5);
         CREATE SCHEMA s;
         CREATE TABLE s.pay2 (k text NOT NULL, tok bigint);
         SELECT lease.protect('s.pay2', '{k}', 'tok', 'public.tables');
         INSERT INTO s.pay2 VALUES ('a', 5);
         CREATE FUNCTION ins(target text, k text, t bigint) RETURNS void LANGUAGE plpgsql AS $f$
           BEGIN
             IF target = 'pay' THEN INSERT INTO pay VALUES (k, t);
             ELSE EXECUTE format('INSERT INTO %I.pay2 VALUES ($1, $2)', 's' || convert_from('\\xadf5'::bytea, 'EUC_JP')) USING k, t;
             END IF;
           END $f$;",
    );
    let mut broken = vec![];
    for (ddl, target, key) in [
        (format!("CREATE TABLE %I PARTITION OF pay FOR VALUES IN (''b'')', 'pp' || {NEC_ROOT}"), "pay", "b"),
        (format!("ALTER TABLE pay_a RENAME TO %I', 'pa' || {NEC_ROOT}"), "pay", "a"),
        (format!("ALTER SCHEMA s RENAME TO %I', 's' || {NEC_ROOT}"), "pay2", "a"),
    ] {
        let sql = format!("DO $$ BEGIN EXECUTE format('{ddl}); END $$");
        match run(&mut c, &sql) {
            Some(r) if r[0] == "22P05" => continue,
            Some(r) => panic!("{sql}: {r:?}"),
            None => {}
        }
        let current = run(&mut c, &format!("SELECT ins('{target}', '{key}', 5)")).map(|r| r[0].clone());
        let stale = run(&mut c, &format!("SELECT ins('{target}', '{key}', 4)")).map(|r| r[0].clone());
        if (current.as_deref(), stale.as_deref()) != (None, Some("LF001")) {
            broken.push(format!("after {ddl}: current token {current:?}, stale {stale:?}"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// **Hole (medium, availability: monitoring).** A MULE_INTERNAL database
/// with pg_lease, and in another database (UTF-8) of the same cluster a
/// protected table `"payé"` that has been written to (its stats slot is
/// claimed). `SELECT ... FROM lease.stats` in the MULE_INTERNAL database
/// fails with `XX000 pg_lease: no conversion from UTF8 to the database's
/// encoding`: every database's rows are converted with `to_server`, which
/// raises when PostgreSQL has no conversion. One database's table names
/// break another's monitoring (attack18 fixed this for EUC_JP; README:
/// characters the encoding cannot hold become `?`). The same for
/// `lease.audit_databases()` once a database named with an accent
/// (`a20_dbé_…`, UTF-8) has refused a write. Expected: the rows, the
/// accented names shown with `?`.
#[test]
fn mule_internal_stats_survive_another_databases_accented_names() {
    let (_utf8, mut u) = db_with(
        "a20_stats_u8",
        "ENCODING 'UTF8' TEMPLATE template0",
        "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
         CREATE TABLE \"payé\" (k text NOT NULL, tok bigint);
         SELECT lease.protect('\"payé\"', '{k}', 'tok');
         INSERT INTO tables VALUES ('a', 5);
         INSERT INTO \"payé\" VALUES ('a', 5);",
    );
    assert_eq!(
        one_i64(
            &mut u,
            "SELECT count(*) FROM lease.stats WHERE database = current_database() AND table_name = 'public.\"payé\"'"
        ),
        1
    );
    // A UTF-8 database named with an accent, where a write was refused.
    let named = NamedDb(format!("a20_dbé_{}", std::process::id()));
    connect_to("postgres", "postgres").batch_execute(&format!("CREATE DATABASE \"{}\"", named.0)).unwrap();
    let mut n = connect_to(&named.0, "postgres");
    ok(&mut n, &format!("CREATE EXTENSION pg_lease; {PAY} INSERT INTO tables VALUES ('a', 5);"));
    assert_eq!(refusal(&mut n, "INSERT INTO pay VALUES ('a', 4)")[0], "LF001");
    let db = RawDb::create("mule_stats", MULE);
    let (_, err) = psql(&db.0, "postgres", "MULE_INTERNAL", "\\set ON_ERROR_STOP 1\nCREATE EXTENSION pg_lease;");
    assert!(!err.contains("ERROR"), "{err}");
    let (stats, stats_err) = psql(&db.0, "postgres", "MULE_INTERNAL", "SELECT count(*) > 0 FROM lease.stats;");
    let (dbs, dbs_err) = psql(&db.0, "postgres", "MULE_INTERNAL", "SELECT count(*) > 0 FROM lease.audit_databases();");
    assert_eq!((stats.as_str(), dbs.as_str()), ("t", "t"), "{stats_err}\n{dbs_err}");
}

/// **Hole (low): a refusal where README promises success.** EUC_JP
/// database: `lease.acquire(repeat(<NEC √>, 50), 'h1', 60000)` and
/// `lease.acquire('z', repeat(<user-defined character>, 50), 60000)` are
/// refused with `22023 pg_lease: lease name is 300 characters long; at most
/// 256 are allowed` (and the same for the owner): the length is counted on
/// the text as `from_server` shows it, each character as a 6-character
/// `\xadf5`. README (Limits): lease names and owners "are compared as stored
/// and are not affected", and may be up to 256 characters. Expected: both
/// acquired (a name of 257 such characters refused as 257 long).
#[test]
fn euc_jp_lease_names_are_limited_by_their_characters_not_their_escapes() {
    let (_db, mut c) = db_with("a20_length", EUC_JP, "");
    let mut failed = vec![];
    for sql in [
        format!("SELECT lease.acquire(repeat({NEC_ROOT}, 50), 'h1', 60000)"),
        format!("SELECT lease.acquire('z', repeat({UDC}, 50), 60000)"),
    ] {
        if let Some(r) = run(&mut c, &sql) {
            failed.push(format!("{sql}: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// **Hole (low): two leases, one message.** EUC_JP database: owner `h1`
/// holds the lease named `n` and NEC `√` (0xADF5) and the lease named
/// `n\xadf5` (ASCII). `h2`'s acquire of each is refused with `LF005`, and
/// the two refusals read the same, message and DETAIL alike but for the
/// expiry (`lease "n\xadf5" is held by h1`): the client (and a log reader)
/// cannot tell which lease is meant. Expected: two different names in the
/// two messages.
#[test]
#[ignore = "open: as euc_jp_audit_tells_an_nec_key_from_its_escape_written_out (README, Limits)"]
fn euc_jp_lease_refusals_tell_an_nec_name_from_its_escape() {
    let (_db, mut c) = db_with("a20_lf005", EUC_JP, "");
    ok(&mut c, &format!("SELECT lease.acquire('n' || {NEC_ROOT}, 'h1', 60000)"));
    ok(&mut c, r"SELECT lease.acquire('n\xadf5', 'h1', 60000)");
    let nec = refusal(&mut c, &format!("SELECT lease.acquire('n' || {NEC_ROOT}, 'h2', 60000)"));
    let ascii = refusal(&mut c, r"SELECT lease.acquire('n\xadf5', 'h2', 60000)");
    assert_eq!((nec[0].as_str(), ascii[0].as_str()), ("LF005", "LF005"));
    assert_ne!(nec[1], ascii[1], "one message for two leases");
}

/// **Defence holds.** EUC_JP database: owner `h5` holds the lease named
/// `n` and NEC `√` (0xADF5) and the lease named `n\xadf5` (ASCII); the NEC one
/// expires and `h6` takes it. `lease.heartbeat('h5', ...)` reports the NEC
/// lease as `taken` under its stored name (bytes 6E ADF5, not the escape),
/// `renew_all('h5', ...)` lists the ASCII one as stored (6E 5C 78 ...), and
/// `renew_all('h6', ...)` the NEC one: each name reported can be renewed.
#[test]
fn euc_jp_heartbeat_and_renew_all_return_names_as_stored() {
    let (_db, mut c) = db_with("a20_heartbeat", EUC_JP, "");
    let hex = |c: &mut Client, sql: &str| -> Vec<String> {
        c.query(sql, &[]).unwrap().iter().map(|r| r.get::<_, String>(0)).collect()
    };
    ok(&mut c, &format!("SELECT lease.acquire('n' || {NEC_ROOT}, 'h5', 100)"));
    ok(&mut c, r"SELECT lease.acquire('n\xadf5', 'h5', 60000)");
    std::thread::sleep(Duration::from_millis(300));
    ok(&mut c, &format!("SELECT lease.acquire('n' || {NEC_ROOT}, 'h6', 60000)"));
    let lost = hex(
        &mut c,
        "SELECT encode(convert_to(name, 'EUC_JP'), 'hex') || ' ' || lost FROM lease.heartbeat('h5', 60000)",
    );
    assert_eq!(lost, ["6eadf5 taken"]);
    let h5 =
        hex(&mut c, "SELECT encode(convert_to(name, 'EUC_JP'), 'hex') FROM lease.renew_all('h5', 60000) WHERE renewed");
    assert_eq!(h5, ["6e5c7861646635"]);
    let h6 =
        hex(&mut c, "SELECT encode(convert_to(name, 'EUC_JP'), 'hex') FROM lease.renew_all('h6', 60000) WHERE renewed");
    assert_eq!(h6, ["6eadf5"]);
}

/// **Defence holds.** EUC_JIS_2004 database, owner rows for the
/// one-character key 0xABE5 (`˥˩`, two code points in UTF-8) and for the
/// two-character key 0xABE4 0xABE0 (the same two code points), both at
/// token 5. `lease.acquire` bound to the one character writes its new token
/// into that row only (the pair's row keeps 5) and the previous holder's
/// token 5 is then refused for it (`LF001`) while still accepted for the
/// pair; bound to the pair it is refused (`22P05`), no row changed; and
/// `lease.protect` with a key column named by the pair is refused (`22P05`).
#[test]
fn euc_jis_2004_acquire_names_the_row_it_was_given() {
    let one = r"convert_from('\xabe5', 'EUC_JIS_2004')";
    let pair = r"convert_from('\xabe4abe0', 'EUC_JIS_2004')";
    let (_db, mut c) = db_with(
        "a20_jis2004_acquire",
        "ENCODING 'EUC_JIS_2004' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'",
        &format!(
            "{PAY} INSERT INTO tables VALUES ({one}, 5), ({pair}, 5);
             DO $$ BEGIN EXECUTE format('CREATE TABLE pay2 (%I text NOT NULL, tok bigint)', 'k' || {pair}); END $$;"
        ),
    );
    let token = one_i64(&mut c, &format!("SELECT token FROM lease.acquire('L1', 'h', 60000, 'tables', ARRAY[{one}])"));
    let tok = |c: &mut Client, k: &str| one_i64(c, &format!("SELECT owner_fencing_token FROM tables WHERE id = {k}"));
    assert_eq!((tok(&mut c, one), tok(&mut c, pair)), (token, 5));
    assert_eq!(refusal(&mut c, &format!("INSERT INTO pay VALUES ({one}, 5)"))[0], "LF001");
    ok(&mut c, &format!("INSERT INTO pay VALUES ({pair}, 5)"));
    let bound = refusal(&mut c, &format!("SELECT lease.acquire('L2', 'h', 60000, 'tables', ARRAY[{pair}])"));
    assert_eq!(bound[0], "22P05", "{bound:?}");
    assert_eq!((tok(&mut c, one), tok(&mut c, pair)), (token, 5));
    let protect = refusal(&mut c, &format!("SELECT lease.protect('pay2', ARRAY['k' || {pair}], 'tok')"));
    assert_eq!(protect[0], "22P05", "{protect:?}");
}

/// **Hole (low): a refusal where README promises success.** MULE_INTERNAL
/// database: `lease.protect` of a table `"payé"` (MULE bytes 81 E9, LATIN1
/// `é`, which has an exact UTF-8 form, U+00E9) is refused with `22P05 ...
/// has a character with no exact UTF-8 form`, and so is `lease.acquire`
/// bound to an owner key `é`: pg_lease finds no conversion from MULE to
/// UTF-8 and reads the bytes as UTF-8, so every non-ASCII name or key is
/// refused. README (Limits): "tables and columns with non-ASCII names can be
/// fenced" in a database whose encoding is not UTF-8, and only characters
/// with no exact UTF-8 form (EUC_JP's NEC duplicates and user-defined
/// characters, SQL_ASCII bytes that are not UTF-8) are refused; MULE is not
/// named. Expected: both succeed (PostgreSQL converts MULE to LATIN1 to
/// UTF-8), or README's Limits say that MULE_INTERNAL takes ASCII names and
/// keys only.
#[test]
#[ignore = "open: PostgreSQL has no conversion between MULE_INTERNAL and UTF-8, so pg_lease refuses (22P05) every non-ASCII name and key there (README, Limits)"]
fn mule_internal_fences_latin1_names_and_keys() {
    let db = RawDb::create("mule_names", MULE);
    let (_, err) = psql(
        &db.0,
        "postgres",
        "MULE_INTERNAL",
        b"\\set ON_ERROR_STOP 1
          CREATE EXTENSION pg_lease;
          CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
          INSERT INTO tables VALUES ('\x81\xe9', 5);
          CREATE TABLE pay (k text NOT NULL, tok bigint);
          SELECT lease.protect('pay', '{k}', 'tok');
          CREATE TABLE \"pay\x81\xe9\" (k text NOT NULL, tok bigint);"
            .as_slice(),
    );
    assert!(!err.contains("ERROR"), "{err}");
    let (_, err) = psql(
        &db.0,
        "postgres",
        "MULE_INTERNAL",
        b"\\set VERBOSITY verbose
          SELECT lease.protect('\"pay\x81\xe9\"', '{k}', 'tok');
          SELECT lease.acquire('L', 'h', 60000, 'tables', ARRAY['\x81\xe9']);"
            .as_slice(),
    );
    assert_eq!(error_codes(&err), Vec::<String>::new(), "{err}");
}

/// **Hole (low): the audited row loses its shape.** EUC_JP database,
/// `pg_lease.audit_row` on, `pay (k, tok, note)` fenced, row `a` at token 5.
/// A stale write (token 4) whose `note` is `x` + NEC `√` (0xADF5) is
/// refused (`LF001`) and recorded, but its `row_data` is a JSON *string*
/// holding the row's text (`"{\"k\":\"a\",...,\"note\":\"x\\xadf5\"}"`),
/// not an object: the escape `\xadf5` is put into the JSON text as it is,
/// which makes it invalid JSON (`\x` is no JSON escape), so the whole row
/// falls back to README's "cannot be taken apart at all" case (meant for a
/// lone surrogate or 128 levels of nesting). `row_data->>'k'` is then NULL
/// for a perfectly ordinary row. Expected: an object, `note` holding the
/// escape as text.
#[test]
fn euc_jp_audit_row_with_an_nec_character_stays_an_object() {
    let (_db, mut c) = db_with(
        "a20_audit_row",
        EUC_JP,
        &format!("{PAY} ALTER TABLE pay ADD COLUMN note text; INSERT INTO tables VALUES ('a', 5);"),
    );
    let r =
        refusal(&mut c, &format!("SET pg_lease.audit_row = on; INSERT INTO pay VALUES ('a', 4, 'x' || {NEC_ROOT})"));
    assert_eq!(r[0], "LF001", "{r:?}");
    assert_eq!(audited(&mut c, 1), 1);
    let kind: String = c
        .query_one("SELECT jsonb_typeof(row_data) || ' ' || row_data::text FROM lease.rejected_writes", &[])
        .unwrap()
        .get(0);
    assert!(kind.starts_with("object "), "{kind}");
}

/// **Defence holds.** EUC_JIS_2004 database. `fenced_boundary_write` into a
/// table with a column named `c` + 0xABE5 (a combined character) stores the
/// row as given (value 0xABE5 into that column), and refuses rows holding
/// the pair 0xABE4 0xABE0 (`22P05`, nothing written). A high-water table
/// keeps the combined key and the pair apart: a mark of 10 on 0xABE5 does
/// not refuse token 3 on the pair, and INSERT and MERGE below the mark of
/// 0xABE5 are `LF001`.
#[test]
fn euc_jis_2004_boundary_write_and_high_water_keep_combined_and_pair_apart() {
    let one = r"convert_from('\xabe5', 'EUC_JIS_2004')";
    let pair = r"convert_from('\xabe4abe0', 'EUC_JIS_2004')";
    let (_db, mut c) = db_with(
        "a20_jis2004_bw",
        "ENCODING 'EUC_JIS_2004' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'",
        &format!(
            "{PAY} INSERT INTO tables VALUES ('a', 5);
             DO $$ BEGIN EXECUTE format('CREATE TABLE bw (k text NOT NULL, %I text, tok bigint)', 'c' || {one}); END $$;
             SELECT lease.protect('bw', '{{k}}', 'tok');
             CREATE TABLE hw (k text NOT NULL, tok bigint);
             SELECT lease.protect_high_water('hw', '{{k}}', 'tok');"
        ),
    );
    let rows = |v: &str| format!("jsonb_build_array(jsonb_build_object('k', 'a', 'c' || {one}, {v}))");
    ok(&mut c, &format!("SELECT lease.fenced_boundary_write('bw', 5, {})", rows(one)));
    let r = refusal(&mut c, &format!("SELECT lease.fenced_boundary_write('bw', 5, {})", rows(pair)));
    assert_eq!(r[0], "22P05", "{r:?}");
    let stored: String = c
        .query_one("SELECT string_agg(encode(convert_to(bw::text, 'EUC_JIS_2004'), 'hex'), ' ') FROM bw", &[])
        .unwrap()
        .get(0);
    // "(a," 0xABE5 ",5)"
    assert_eq!(stored, "28612cabe52c3529");
    ok(&mut c, &format!("INSERT INTO hw VALUES ({one}, 10)"));
    ok(&mut c, &format!("INSERT INTO hw VALUES ({pair}, 3)"));
    assert_eq!(refusal(&mut c, &format!("INSERT INTO hw VALUES ({one}, 9)"))[0], "LF001");
    let merge =
        format!("MERGE INTO hw USING (SELECT {one} AS k) s ON false WHEN NOT MATCHED THEN INSERT VALUES (s.k, 8)");
    assert_eq!(refusal(&mut c, &merge)[0], "LF001");
}

/// **Defence holds.** EUC_JP database, `pay` partitioned by key and fenced
/// against `tables` (rows at token 5). A table named with a NEC `√`
/// (0xADF5) holding a stale row (token 4), created so or renamed so, is
/// refused as a partition: `ALTER TABLE pay ATTACH PARTITION "pb<NEC √>"
/// ...` is `LF008` and `pay` stays empty.
#[test]
fn euc_jp_attach_of_an_nec_named_table_with_stale_rows_is_refused() {
    let (_db, mut c) = db_with(
        "a20_nec_attach",
        EUC_JP,
        &format!(
            "CREATE TABLE tables (id text PRIMARY KEY, owner_fencing_token bigint);
             INSERT INTO tables VALUES ('a', 5), ('b', 5), ('c', 5);
             CREATE TABLE pay (k text NOT NULL, tok bigint) PARTITION BY LIST (k);
             CREATE TABLE pay_a PARTITION OF pay FOR VALUES IN ('a');
             SELECT lease.protect('pay', '{{k}}', 'tok');
             DO $$ BEGIN
               EXECUTE format('CREATE TABLE %I (k text NOT NULL, tok bigint)', 'pb' || {NEC_ROOT});
               EXECUTE format('INSERT INTO %I VALUES (''b'', 4)', 'pb' || {NEC_ROOT});
             END $$;
             CREATE TABLE pc (k text NOT NULL, tok bigint);
             INSERT INTO pc VALUES ('c', 4);
             DO $$ BEGIN EXECUTE format('ALTER TABLE pc RENAME TO %I', 'pc' || {NEC_ROOT}); END $$;"
        ),
    );
    for (name, key) in [("pb", "b"), ("pc", "c")] {
        let sql = format!(
            "DO $$ BEGIN EXECUTE format('ALTER TABLE pay ATTACH PARTITION %I FOR VALUES IN (''{key}'')', '{name}' || {NEC_ROOT}); END $$"
        );
        assert_eq!(refusal(&mut c, &sql)[0], "LF008", "{sql}");
    }
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM pay"), 0);
}
