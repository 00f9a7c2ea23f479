//! The lease calls written in Rust (lease.renew, lease.release and
//! lease.release_all since 0.7.0,
//! issue #13) keep what their SECURITY DEFINER PL/pgSQL versions guaranteed:
//! they run as the function's owner (the caller needs no table privileges,
//! and is itself again after the call, also after an error it caught), the
//! caller's search_path cannot redirect them, and their saved plans follow
//! the extension being dropped and created again in the same session.

use pg_lease_sessions::postgres::Client;
use pg_lease_sessions::*;

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
