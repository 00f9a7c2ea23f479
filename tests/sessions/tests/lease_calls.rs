//! The lease calls written in Rust (lease.renew, lease.release and
//! lease.release_all since 0.7.0, lease.acquire and lease.try_acquire since
//! 0.8.0, issue #13) keep what their SECURITY DEFINER PL/pgSQL versions guaranteed:
//! they run as the function's owner (the caller needs no table privileges,
//! and is itself again after the call, also after an error it caught), the
//! caller's search_path cannot redirect them, and their saved plans follow
//! the extension being dropped and created again in the same session.

use pg_lease_sessions::postgres::fallible_iterator::FallibleIterator;
use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;
use std::time::Duration;

fn token(c: &mut Client, name: &str, owner: &str) -> i64 {
    one_i64(c, &format!("SELECT token FROM lease.acquire('{name}', '{owner}', 60000)"))
}

fn renew_ok(c: &mut Client, name: &str, owner: &str, tok: i64) -> bool {
    c.query_one(
        &format!("SELECT lease.renew('{name}', '{owner}', {tok}, 60000) > pg_catalog.clock_timestamp() + interval '50 seconds'"),
        &[],
    )
    .unwrap()
    .get(0)
}

fn release(c: &mut Client, name: &str, owner: &str, tok: &str) -> bool {
    c.query_one(&format!("SELECT lease.release('{name}', '{owner}', {tok})"), &[]).unwrap().get(0)
}

#[test]
fn renew_and_release_run_as_the_owner_and_restore_the_caller() {
    let db = TestDb::new("calls_definer");
    let mut c = db.connect();
    let role = format!("calls_role_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
               lease.renew(text, text, bigint, integer), lease.release(text, text, bigint),
               lease.release_all(text) TO {role};"
    ))
    .unwrap();
    let mut r = db.connect_as(&role);
    let t = token(&mut r, "a", "host-a");
    assert!(renew_ok(&mut r, "a", "host-a", t));
    // The caller has no privilege on pg_lease's tables: the call ran as their owner.
    expect_error(&mut r, "SELECT count(*) FROM lease.lease_state", "42501");
    let who: String = r.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    assert_eq!(who, role);
    // A refusal caught by the caller's handler leaves the caller itself again.
    r.batch_execute(
        "DO $$ BEGIN PERFORM lease.renew('a', 'host-b', 1, 1000);
           EXCEPTION WHEN SQLSTATE 'LF006' THEN PERFORM set_config('x.who', current_user, false); END $$",
    )
    .unwrap();
    let after: String = r.query_one("SELECT current_setting('x.who')", &[]).unwrap().get(0);
    assert_eq!(after, role);
    let who: String = r.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    assert_eq!(who, role);
    assert!(release(&mut r, "a", "host-a", &t.to_string()));
    assert!(!release(&mut r, "a", "host-a", &t.to_string()), "released once");
    token(&mut r, "b", "host-a");
    token(&mut r, "c", "host-a");
    assert_eq!(one_i64(&mut r, "SELECT lease.release_all('host-a')::bigint"), 2);
    let who: String = r.query_one("SELECT current_user::text", &[]).unwrap().get(0);
    assert_eq!(who, role);
    drop(r);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn the_callers_search_path_cannot_redirect_renew_or_release() {
    let db = TestDb::new("calls_search_path");
    let mut c = db.connect();
    let t = token(&mut c, "a", "host-a");
    let u = token(&mut c, "b", "host-a");
    // Look-alikes ahead of pg_catalog: a clock stuck at the epoch, a text
    // equality that always holds, and a temporary lease_state.
    c.batch_execute(
        "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT 'epoch'::timestamptz$$;
         CREATE FUNCTION public.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.always);
         CREATE TEMP TABLE lease_state (name text);
         SET search_path = public, pg_temp, pg_catalog;",
    )
    .unwrap();
    assert!(renew_ok(&mut c, "a", "host-a", t));
    let detail = expect_error(&mut c, &format!("SELECT lease.renew('a', 'host-b', {t}, 60000)"), "LF006");
    assert!(detail.contains(&format!("it was taken by host-a with token {t}")), "{detail}");
    assert!(!release(&mut c, "b", "host-b", &u.to_string()));
    assert!(release(&mut c, "b", "host-a", &u.to_string()));
    // release_all counts only host-a's live lease, not host-b's.
    token(&mut c, "c", "host-b");
    assert_eq!(one_i64(&mut c, "SELECT lease.release_all('host-a')::bigint"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE live"), 1);
    let shown: String = c.query_one("SELECT current_setting('search_path')", &[]).unwrap().get(0);
    assert_eq!(shown, "public, pg_temp, pg_catalog", "the caller's search_path is untouched");
}

#[test]
fn saved_plans_follow_the_extension_being_created_again() {
    let db = TestDb::new("calls_recreate");
    let mut c = db.connect();
    let t = token(&mut c, "a", "host-a");
    assert!(renew_ok(&mut c, "a", "host-a", t));
    assert!(release(&mut c, "a", "host-a", &t.to_string()));
    // New tables with new OIDs, in the same session whose plans were saved.
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease").unwrap();
    expect_error(&mut c, &format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), "LF006");
    let t2 = token(&mut c, "a", "host-a");
    assert!(renew_ok(&mut c, "a", "host-a", t2));
    assert!(release(&mut c, "a", "host-a", &t2.to_string()));
    // A column added to the table re-plans them as well.
    c.batch_execute("ALTER TABLE lease.lease_state ADD COLUMN extra int").unwrap();
    let t3 = token(&mut c, "a", "host-a");
    assert!(renew_ok(&mut c, "a", "host-a", t3));
    assert!(release(&mut c, "a", "host-a", &t3.to_string()));
    assert!(!release(&mut c, "a", "host-a", "NULL"), "a NULL token releases nothing");
}

fn count(c: &mut Client, sql: &str) -> i64 {
    one_i64(c, &format!("SELECT count(*) FROM ({sql}) q"))
}

fn text(c: &mut Client, sql: &str) -> String {
    c.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

#[test]
fn acquire_and_try_acquire_run_as_the_owner_for_an_execute_only_role() {
    let db = TestDb::new("calls_acquire_definer");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    let role = format!("acq_role_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
               lease.try_acquire(text, text, integer, regclass, text[]) TO {role};"
    ))
    .unwrap();
    let mut r = db.connect_as(&role);
    let t = token(&mut r, "a", "host-a");
    // Binding needs a right on the owner table (since 0.9.0: the token it
    // writes fences every writer of the row) ...
    expect_error(&mut r, "SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')", "42501");
    // ... but the owner row is read and written as the owner table's owner:
    // an UPDATE right on the token column alone does.
    c.batch_execute(&format!("GRANT UPDATE (owner_fencing_token) ON tables TO {role}")).unwrap();
    let b = one_i64(&mut r, "SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')");
    assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1"), b);
    expect_error(&mut r, "SELECT count(*) FROM tables", "42501");
    expect_error(&mut r, "SELECT count(*) FROM lease.lease_state", "42501");
    assert_eq!(count(&mut r, "SELECT * FROM lease.try_acquire('a', 'host-b', 60000)"), 0);
    assert_eq!(text(&mut r, "SELECT current_user::text"), role);
    // A refusal caught by the caller's handler leaves the caller itself again.
    r.batch_execute(
        "DO $$ BEGIN PERFORM lease.acquire('a', 'host-b', 1000);
           EXCEPTION WHEN SQLSTATE 'LF005' THEN PERFORM set_config('x.who', current_user, false); END $$",
    )
    .unwrap();
    assert_eq!(text(&mut r, "SELECT current_setting('x.who')"), role);
    let detail = expect_error(&mut r, "SELECT lease.acquire('a', 'host-b', 1000)", "LF005");
    assert!(
        detail.starts_with("LeaseOwnedElsewhere: lease \"a\" is held by host-a | Lease a, holder host-a, "),
        "{detail}"
    );
    assert!(detail.contains(&format!("token {t}, expires at ")), "{detail}");
    assert_eq!(text(&mut r, "SELECT current_user::text"), role);
    drop(r);
    c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).unwrap();
}

#[test]
fn the_callers_search_path_cannot_redirect_acquire() {
    let db = TestDb::new("calls_acquire_search_path");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute(
        "CREATE TABLE seen (path text);
         CREATE FUNCTION public.note_path() RETURNS trigger LANGUAGE plpgsql AS
           $$BEGIN INSERT INTO public.seen VALUES (current_setting('search_path')); RETURN NEW; END$$;
         CREATE TRIGGER note_path BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION public.note_path();",
    )
    .unwrap();
    let t = token(&mut c, "a", "host-a");
    one_i64(&mut c, "SELECT token FROM lease.acquire('b', 'host-a', 100)");
    let mut listener = db.connect();
    listener.batch_execute("LISTEN pg_lease").unwrap();
    // Look-alikes ahead of pg_catalog: a clock stuck at the epoch, text and
    // integer equalities that always hold, a pg_notify that does nothing,
    // and temporary lease tables.
    c.batch_execute(
        "CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT 'epoch'::timestamptz$$;
         CREATE FUNCTION public.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.always);
         CREATE FUNCTION public.always(integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE OPERATOR public.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.always);
         CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE sql AS '';
         CREATE TEMP TABLE lease_state (name text);
         CREATE TEMP TABLE lost_leases (owner text);
         CREATE TEMP TABLE session_state (owner text);
         SET search_path = public, pg_temp, pg_catalog;",
    )
    .unwrap();
    let detail = expect_error(&mut c, "SELECT lease.acquire('a', 'host-b', 60000)", "LF005");
    assert!(detail.contains(&format!("Lease a, holder host-a, token {t}")), "{detail}");
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('a', 'host-b', 60000)"), 0);
    // 'b' expired: taken over, its holder told, in pg_lease's own tables.
    std::thread::sleep(Duration::from_millis(150));
    let b2 = one_i64(&mut c, "SELECT token FROM lease.acquire('b', 'host-b', 60000)");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lost_leases WHERE owner = 'host-a' AND name = 'b'"), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE live"), 2);
    let mut notifications = listener.notifications();
    let payload =
        notifications.timeout_iter(Duration::from_secs(2)).next().unwrap().expect("notified").payload().to_owned();
    assert!(
        payload.contains(&format!(r#""token" : {b2}"#)) && payload.contains(r#""previous_owner" : "host-a""#),
        "{payload}"
    );
    // The owner row's triggers run with the path the SECURITY DEFINER
    // version gave them, and messages name tables as it did.
    one_i64(&mut c, "SELECT token FROM lease.acquire('table:1', 'host-a', 60000, 'tables', '{1}')");
    assert_eq!(text(&mut c, "SELECT string_agg(DISTINCT path, ',') FROM public.seen"), "pg_catalog, pg_temp");
    let missing = expect_error(&mut c, "SELECT lease.acquire('table:9', 'host-a', 60000, 'tables', '{9}')", "LF007");
    assert!(
        missing.contains("bound to owner row {9} of public.tables") && missing.contains("key {id} = {9}."),
        "{missing}"
    );
    let mismatch = expect_error(&mut c, "SELECT lease.acquire('table:9', 'host-a', 60000, 'tables', '{9,9}')", "22023");
    assert!(mismatch.contains("owner_key {9,9} does not match the key columns {id} of public.tables"), "{mismatch}");
    assert_eq!(text(&mut c, "SELECT current_setting('search_path')"), "public, pg_temp, pg_catalog");
}

#[test]
fn acquire_plans_follow_the_extension_and_its_tables_changing() {
    let db = TestDb::new("calls_acquire_recreate");
    let mut c = db.connect();
    let t = token(&mut c, "a", "host-a");
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('a', 'host-b', 60000)"), 0);
    c.batch_execute("DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease").unwrap();
    // New tables: the name starts over (same epoch), nothing is held.
    assert_eq!(token(&mut c, "a", "host-b"), t);
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('b', 'host-b', 60000)"), 1);
    // Columns added to the tables acquire reads and writes re-plan it.
    c.batch_execute(
        "ALTER TABLE lease.lease_state ADD COLUMN extra int;
         ALTER TABLE lease.lost_leases ADD COLUMN note text;
         ALTER TABLE lease.session_state ADD COLUMN note text;",
    )
    .unwrap();
    one_i64(&mut c, "SELECT token FROM lease.acquire('c', 'host-b', 100)");
    std::thread::sleep(Duration::from_millis(150));
    let c2 = token(&mut c, "c", "host-c");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lost_leases WHERE owner = 'host-b' AND name = 'c'"), 1);
    assert_eq!(one_i64(&mut c, "SELECT token FROM lease.leases WHERE name = 'c' AND owner = 'host-c' AND live"), c2);
    expect_error(&mut c, "SELECT lease.acquire('c', 'host-b', 60000)", "LF005");
}

#[test]
fn acquire_above_read_committed_fails_to_serialize_rather_than_go_below_a_raise() {
    let db = TestDb::new("calls_acquire_isolation");
    let mut a = db.connect();
    let mut b = db.connect();
    let first = token(&mut a, "x", "host-a");
    // A snapshot taken before issue_tokens_above committed.
    a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    let lowest = one_i64(&mut b, &format!("SELECT lease.issue_tokens_above({})", first + (5_i64 << 40)));
    expect_error(&mut a, "SELECT lease.acquire('y', 'host-a', 60000)", "40001");
    a.batch_execute("ROLLBACK").unwrap();
    // Serializable, snapshot after the raise: above it.
    a.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE").unwrap();
    let y = token(&mut a, "y", "host-a");
    a.batch_execute("COMMIT").unwrap();
    assert!(y >= lowest, "{y} < {lowest}");
    // A lease taken over after the snapshot: its row lock fails to serialize.
    a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    c_release_and_retake(&mut b, "y", y);
    expect_error(&mut a, "SELECT lease.acquire('y', 'host-a', 60000)", "40001");
    a.batch_execute("ROLLBACK").unwrap();
    // At READ COMMITTED the same acquire waits and judges the newest row.
    expect_error(&mut a, "SELECT lease.acquire('y', 'host-a', 60000)", "LF005");
}

fn c_release_and_retake(c: &mut Client, name: &str, tok: i64) {
    assert!(release(c, name, "host-a", &tok.to_string()));
    token(c, name, "host-b");
}

#[test]
fn try_acquire_inside_a_callers_transaction_that_continues() {
    let db = TestDb::new("calls_try_acquire_xact");
    let mut c = db.connect();
    c.batch_execute(POKER).unwrap();
    c.batch_execute("CREATE TABLE notes (n int)").unwrap();
    token(&mut c, "a", "host-a");
    let mut h = db.connect();
    h.batch_execute("BEGIN; INSERT INTO notes VALUES (1)").unwrap();
    assert_eq!(count(&mut h, "SELECT * FROM lease.try_acquire('a', 'host-b', 60000)"), 0);
    assert_eq!(count(&mut h, "SELECT * FROM lease.try_acquire('b', 'host-b', 60000)"), 1);
    // Bad input inside the subtransaction, caught by the caller's own block.
    h.batch_execute(
        "DO $$ BEGIN PERFORM lease.try_acquire('t', 'host-b', 60000, 'tables', '{1,2}');
           EXCEPTION WHEN invalid_parameter_value THEN INSERT INTO notes VALUES (2); END $$",
    )
    .unwrap();
    // An error from a trigger on the owner table, caught the same way.
    c.batch_execute(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'boom'; END$$;
         CREATE TRIGGER boom BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION boom();",
    )
    .unwrap();
    h.batch_execute(
        "DO $$ BEGIN PERFORM lease.try_acquire('table:1', 'host-b', 60000, 'tables', '{1}');
           EXCEPTION WHEN raise_exception THEN INSERT INTO notes VALUES (3); END $$",
    )
    .unwrap();
    // A refusal other than LF005 is raised, not swallowed.
    h.batch_execute("SAVEPOINT s").unwrap();
    c.batch_execute(
        "DROP TRIGGER boom ON tables;
         CREATE FUNCTION lower_it() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.owner_fencing_token := 1; RETURN NEW; END$$;
         CREATE TRIGGER a_lower BEFORE UPDATE ON tables FOR EACH ROW EXECUTE FUNCTION lower_it();",
    )
    .unwrap();
    let lowered =
        expect_error(&mut h, "SELECT lease.try_acquire('table:1', 'host-b', 60000, 'tables', '{1}')", "LF004");
    assert!(
        lowered.starts_with("FencingTokenRegression: owner row (id)=(1) of public.tables would lower"),
        "{lowered}"
    );
    h.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    c.batch_execute("DROP TRIGGER a_lower ON tables").unwrap();
    let t1 = one_i64(&mut h, "SELECT token FROM lease.try_acquire('table:1', 'host-b', 60000, 'tables', '{1}')");
    h.batch_execute("INSERT INTO notes VALUES (4); COMMIT").unwrap();
    assert_eq!(text(&mut c, "SELECT string_agg(n::text, ',' ORDER BY n) FROM notes"), "1,2,3,4");
    assert_eq!(one_i64(&mut c, "SELECT owner_fencing_token FROM tables WHERE id = 1"), t1);
    let held = text(&mut c, "SELECT string_agg(name || '=' || owner, ',' ORDER BY name) FROM lease.leases WHERE live");
    assert_eq!(held, "a=host-a,b=host-b,table:1=host-b");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE name = 't'"), 0, "rolled back");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lost_leases"), 0);
}

#[test]
fn acquire_makes_an_asynchronous_commit_local() {
    let db = TestDb::new("calls_acquire_durable");
    let mut c = db.connect();
    c.batch_execute("SET synchronous_commit = off; BEGIN").unwrap();
    token(&mut c, "a", "host-a");
    assert_eq!(text(&mut c, "SHOW synchronous_commit"), "local");
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(text(&mut c, "SHOW synchronous_commit"), "off", "for the transaction only");
    // A try_acquire that takes nothing changes nothing.
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('a', 'host-b', 60000)"), 0);
    assert_eq!(text(&mut c, "SHOW synchronous_commit"), "off");
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('b', 'host-b', 60000)"), 1);
    assert_eq!(text(&mut c, "SHOW synchronous_commit"), "local");
    c.batch_execute("COMMIT").unwrap();
}

#[test]
fn heartbeat_and_renew_all_run_as_the_owner_whatever_the_callers_search_path() {
    let db = TestDb::new("calls_heartbeat");
    let mut c = db.connect();
    let role = format!("beat_role_{}", std::process::id());
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT EXECUTE ON FUNCTION lease.acquire(text, text, integer, regclass, text[]),
               lease.heartbeat(text, integer), lease.renew_all(text, integer) TO {role};"
    ))
    .unwrap();
    let mut r = db.connect_as(&role);
    token(&mut r, "a", "host-a");
    token(&mut r, "b", "host-a");
    let c_first = one_i64(&mut r, "SELECT token FROM lease.acquire('c', 'host-a', 100)");
    token(&mut r, "d", "host-z");
    // Look-alikes ahead of pg_catalog, as for renew.
    r.batch_execute(
        "CREATE FUNCTION pg_temp.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT 'epoch'::timestamptz$$;
         CREATE TEMP TABLE lease_state (name text);
         CREATE TEMP TABLE session_state (owner text);
         CREATE TEMP TABLE lost_leases (owner text);
         SET search_path = pg_temp, pg_catalog;",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let c_second = token(&mut r, "c", "host-b");
    // The first heartbeat reports the takeover once, as the function's owner.
    let lost = text(&mut r, "SELECT coalesce(string_agg(name || ':' || token || ':' || lost, ','), '') FROM lease.heartbeat('host-a', 60000)");
    assert_eq!(lost, format!("c:{c_first}:taken"));
    assert_eq!(count(&mut r, "SELECT * FROM lease.heartbeat('host-a', 60000)"), 0, "reported once");
    let listed = text(
        &mut r,
        "SELECT string_agg(name || ':' || renewed, ',' ORDER BY name) FROM lease.renew_all('host-a', 60000)",
    );
    assert_eq!(listed, "a:true,b:true");
    assert_eq!(text(&mut r, "SELECT current_user::text"), role);
    expect_error(&mut r, "SELECT * FROM lease._beat('host-a', 60000)", "42501");
    expect_error(&mut r, "SELECT * FROM lease.heartbeat('host-a', 1)", "22023");
    expect_error(&mut r, "SELECT * FROM lease.renew_all(NULL, 60000)", "22004");
    // The session row is pg_lease's, extended; host-z's is untouched.
    let until =
        "SELECT (expires_at > pg_catalog.now() + interval '50 s')::int::bigint FROM lease.sessions WHERE owner = ";
    assert_eq!(one_i64(&mut c, &format!("{until}'host-a'")), 1);
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.sessions WHERE owner = 'host-z' AND live"), 0);
    // lease._beat itself runs as its caller (here the superuser).
    let e_first = one_i64(&mut c, "SELECT token FROM lease.acquire('e', 'host-y', 100)");
    std::thread::sleep(Duration::from_millis(150));
    token(&mut c, "e", "host-x");
    let step =
        text(&mut c, "SELECT string_agg(name || ':' || token || ':' || taken, ',') FROM lease._beat('host-y', 60000)");
    assert_eq!(step, format!("e:{e_first}:true"));
    // Plans follow the extension being created again in the same session.
    drop(r);
    c.batch_execute(&format!(
        "DROP OWNED BY {role}; DROP ROLE {role}; DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease"
    ))
    .unwrap();
    token(&mut c, "a", "host-a");
    assert_eq!(text(&mut c, "SELECT string_agg(name, ',') FROM lease.renew_all('host-a', 60000) WHERE renewed"), "a");
    assert_eq!(count(&mut c, "SELECT * FROM lease.heartbeat('host-a', 60000)"), 0);
    let _ = c_second;
}

#[test]
fn owners_that_differ_only_outside_ascii_stay_distinct_in_a_latin1_database() {
    let db = TestDb::with_options("calls_latin1", "ENCODING 'LATIN1' LOCALE 'C' TEMPLATE template0");
    let mut c = db.connect();
    let t = token(&mut c, "a", "hôte-é");
    // Each is one byte >= 0x80 in LATIN1, and neither is valid UTF-8 there.
    let held = expect_error(&mut c, "SELECT lease.acquire('a', 'hôte-è', 60000)", "LF005");
    assert!(held.contains(&format!("token {t}")), "{held}");
    assert_eq!(count(&mut c, "SELECT * FROM lease.try_acquire('a', 'hôte-è', 60000)"), 0);
    // Its holder re-takes it; a takeover after expiry is reported to the
    // holder it was taken from, not to the taker.
    let t2 = one_i64(&mut c, "SELECT token FROM lease.acquire('a', 'hôte-é', 100)");
    assert!(t2 > t);
    std::thread::sleep(Duration::from_millis(150));
    token(&mut c, "a", "hôte-è");
    let lost = text(&mut c, "SELECT string_agg(owner || ':' || token, ',') FROM lease.lost_leases");
    assert_eq!(lost, format!("hôte-é:{t2}"));
}

/// renew writes the lease row without a statement (issue #13) when
/// nothing stands in the way; when a renewal cannot be a HOT update (the
/// page is full: here, 400 renewals in one transaction keep every version),
/// the new version moves to another page and gets its entries in every
/// index of `lease_state`, partial ones included (amcheck: every index
/// entry points at a row, and every row its index should hold is there).
#[test]
fn renew_in_place_indexes_a_version_that_moves_to_another_page() {
    let db = TestDb::new("calls_renew_moves");
    let mut c = db.connect();
    let with_amcheck = amcheck(&mut c);
    let t = token(&mut c, "a", "host-a");
    let page = |c: &mut Client| -> String {
        c.query_one("SELECT split_part(ctid::text, ',', 1) FROM lease.lease_state WHERE name = 'a'", &[])
            .unwrap()
            .get(0)
    };
    let first = page(&mut c);
    c.batch_execute("BEGIN").unwrap();
    let renewed =
        one_i64(&mut c, &format!("SELECT count(lease.renew('a', 'host-a', {t}, 60000)) FROM generate_series(1, 400)"));
    assert_eq!(renewed, 400);
    c.batch_execute("COMMIT").unwrap();
    assert_ne!(page(&mut c), first, "the row moved: at least one renewal was not HOT");
    // Counted as updates, as the statement's were (README, Limits).
    c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    let updates =
        one_i64(&mut c, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'lease.lease_state'::regclass");
    assert!(updates >= 400, "{updates} updates counted");
    if with_amcheck {
        let checked = lease_state_amcheck(&mut c).unwrap();
        assert!(checked >= 3, "pkey, owner and bound indexes checked ({checked})");
    }
    // Found through each index again.
    c.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off").unwrap();
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE name = 'a'"), 1);
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE owner = 'host-a' AND released_at IS NULL"),
        1
    );
    assert!(renew_ok(&mut c, "a", "host-a", t));
    assert_eq!(one_i64(&mut c, "SELECT lease.release_all('host-a')::bigint"), 1);
}

/// The in-place renew waits for a transaction changing the row and then
/// judges it as the statement would: at READ COMMITTED the renewal that
/// committed meanwhile is followed (same holder and token: renewed), a
/// rolled-back one is as if it never happened, a takeover that committed
/// meanwhile is a lost lease (LF006); at REPEATABLE READ a change committed
/// after the snapshot is a serialization failure (40001), a read-only
/// transaction gets the statement's 25006, and a renew in
/// a session with `session_replication_role = replica` (where the table's
/// replica trigger fires) is the statement's.
#[test]
fn renew_in_place_waits_and_judges_as_the_statement() {
    let db = TestDb::new("calls_renew_race");
    let mut c = db.connect();
    let mut other = db.connect();
    let mut observer = db.connect();
    let t = token(&mut c, "a", "host-a");
    for end in ["COMMIT", "ROLLBACK"] {
        other.batch_execute("BEGIN").unwrap();
        assert!(renew_ok(&mut other, "a", "host-a", t));
        let mut w = connect_to(&db.name, "postgres");
        let pid = backend_pid(&mut w);
        let waiting = std::thread::spawn(move || renew_ok(&mut w, "a", "host-a", t));
        wait_until_blocked(&mut observer, pid);
        other.batch_execute(end).unwrap();
        assert!(waiting.join().unwrap(), "renewed after the other transaction's {end}");
    }
    // A takeover in flight: the lease expires, another owner takes it.
    c.batch_execute(&format!("SELECT lease.renew('a', 'host-a', {t}, 100)")).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    other.batch_execute("BEGIN").unwrap();
    let u = token(&mut other, "a", "host-b");
    let mut w = connect_to(&db.name, "postgres");
    let pid = backend_pid(&mut w);
    let waiting =
        std::thread::spawn(move || try_sql(&mut w, &format!("SELECT lease.renew('a', 'host-a', {t}, 60000)")));
    wait_until_blocked(&mut observer, pid);
    other.batch_execute("COMMIT").unwrap();
    assert_eq!(waiting.join().unwrap(), "LF006");
    // REPEATABLE READ: a renewal committed after the snapshot.
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    assert!(renew_ok(&mut other, "a", "host-b", u));
    expect_error(&mut c, &format!("SELECT lease.renew('a', 'host-b', {u}, 60000)"), "40001");
    c.batch_execute("ROLLBACK").unwrap();
    // A read-only transaction writes nothing (the statement's 25006).
    c.batch_execute("BEGIN READ ONLY").unwrap();
    expect_error(&mut c, &format!("SELECT lease.renew('a', 'host-b', {u}, 60000)"), "25006");
    c.batch_execute("ROLLBACK").unwrap();
    // With the replica trigger firing: the statement, with the same result.
    c.batch_execute("SET session_replication_role = replica").unwrap();
    assert!(renew_ok(&mut c, "a", "host-b", u));
    c.batch_execute("RESET session_replication_role").unwrap();
    assert!(renew_ok(&mut c, "a", "host-b", u));
    expect_error(&mut c, &format!("SELECT lease.renew('a', 'host-a', {t}, 60000)"), "LF006");
}

/// release writes the lease row without a statement too (issue #13) when
/// the lease is live on its own expiry, and otherwise runs its statement:
/// each answer is the statement's. Live: true, and the row leaves the
/// owner index (amcheck: every index holds exactly its rows); past its own
/// expiry: false, but released; again, another token or owner: false; in a
/// read-only transaction the statement's 25006; under a DBA's `DO ALSO`
/// rule on lease_state every release runs it.
#[test]
fn release_in_place_answers_as_the_statement() {
    let db = TestDb::new("calls_release_in_place");
    let mut c = db.connect();
    amcheck(&mut c);
    let check = |c: &mut Client| {
        lease_state_amcheck(c).unwrap();
    };
    let t = token(&mut c, "a", "host-a");
    assert!(!release(&mut c, "a", "host-a", &(t - 1).to_string()), "another token");
    assert!(!release(&mut c, "a", "host-b", &t.to_string()), "another owner");
    c.batch_execute("BEGIN READ ONLY").unwrap();
    expect_error(&mut c, &format!("SELECT lease.release('a', 'host-a', {t})"), "25006");
    c.batch_execute("ROLLBACK").unwrap();
    assert!(release(&mut c, "a", "host-a", &t.to_string()), "live: released");
    assert!(!release(&mut c, "a", "host-a", &t.to_string()), "released already");
    check(&mut c);
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE name = 'a' AND released_at IS NOT NULL AND NOT live"),
        1
    );
    // Past its own expiry: the statement marks it released and answers false.
    let u = token(&mut c, "b", "host-a");
    c.batch_execute(&format!("SELECT lease.renew('b', 'host-a', {u}, 100)")).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(!release(&mut c, "b", "host-a", &u.to_string()), "expired: not live when released");
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM lease.leases WHERE name = 'b' AND released_at IS NOT NULL"), 1);
    // A DBA's rule runs for every release, as for the statement (made after
    // the acquire: acquire's data-modifying WITH refuses DO ALSO rules).
    let v = token(&mut c, "c", "host-a");
    c.batch_execute(
        "CREATE TABLE release_log (name text);
         CREATE RULE log_release AS ON UPDATE TO lease.lease_state WHERE new.released_at IS NOT NULL
             DO ALSO INSERT INTO release_log VALUES (new.name);",
    )
    .unwrap();
    assert!(release(&mut c, "c", "host-a", &v.to_string()));
    assert_eq!(one_i64(&mut c, "SELECT count(*) FROM release_log WHERE name = 'c'"), 1);
    c.batch_execute("DROP RULE log_release ON lease.lease_state").unwrap();
    // Re-acquired after the release: found through every index again.
    let w = token(&mut c, "a", "host-b");
    assert!(w > t);
    check(&mut c);
    c.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off").unwrap();
    assert_eq!(
        one_i64(&mut c, "SELECT count(*) FROM lease.lease_state WHERE owner = 'host-b' AND released_at IS NULL"),
        1
    );
}
