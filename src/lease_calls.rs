//! The hot lease calls in Rust: `lease.acquire`, `lease.try_acquire`,
//! `lease.renew`, `lease.release`, `lease.release_all`, and the heartbeat
//! (`lease.heartbeat`, `lease.renew_all`, their step `lease._beat`) (issue #13).
//!
//! They keep the PL/pgSQL versions' contract (sql/lease.sql) exactly: the
//! same statements, now saved SPI plans prepared once per backend (the plan
//! cache re-plans them after DDL on the tables they read), run as the
//! function's owner the way SECURITY DEFINER ran them ([`as_definer`]), but
//! without the per-call GUC save and restore a `SET search_path` clause
//! costs. Nothing here depends on the caller's search_path: every table,
//! function, operator and type in the plans is schema-qualified.

use crate::errors::{Failure, Invalid, LeaseError, Refusal};
use crate::lease::EPOCH_SHIFT;
use crate::lease_owner::{lock_owner_row_of, same_owner_row, set_owner_token_of, texts, visible_to};
use crate::pg::{
    as_definer, exec_saved, now, prepare_saved, result_datum, result_rows, result_text, row_datum, set_guc,
    spi_connected, subtransaction, update_own_row, with_pinned_search_path, OwnRow, ServerText, END_TIMESTAMP,
};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::FromDatum;
use std::cell::Cell;
use std::ffi::CStr;

/// A lease name or owner argument that passed `lease::check_label`: its
/// datum, handed to the plans as it came (text, the default collation).
#[derive(Clone, Copy)]
pub struct Label(pub pg_sys::Datum);

impl Label {
    /// The label's text, for messages (server encoding, as PL/pgSQL's
    /// `format` built them).
    fn text(self) -> String {
        // SAFETY: the datum is a non-NULL text argument of the current call
        // (the caller's contract for constructing a Label); text_to_cstring
        // returns a palloc'd copy, copied again at once.
        unsafe { crate::pg::owned(pg_sys::text_to_cstring(self.0.cast_mut_ptr())) }
    }

    /// The label's bytes (server encoding): what text equality compares
    /// under the deterministic default collation. Its text, read as UTF-8
    /// with replacement, would make distinct non-UTF-8 labels equal.
    fn bytes(self) -> Vec<u8> {
        // SAFETY: as for `text`.
        unsafe { text_bytes(self.0) }
    }
}

/// The bytes of a non-NULL text datum.
///
/// # Safety
/// `datum` is a valid, non-NULL text value.
unsafe fn text_bytes(datum: pg_sys::Datum) -> Vec<u8> {
    // SAFETY: the caller's contract; text_to_cstring returns a palloc'd,
    // NUL-terminated copy (text holds no NUL), copied at once.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::text_to_cstring(datum.cast_mut_ptr())).to_bytes().to_vec() }
}

#[derive(Clone, Copy)]
struct Plans {
    /// renew's common case, one statement (see sql/lease.sql, lease.renew).
    renew: pg_sys::SPIPlanPtr,
    /// The lease row, locked: renew's judgement of the other cases.
    lock_lease: pg_sys::SPIPlanPtr,
    /// The owner's session row, locked for share.
    lock_session: pg_sys::SPIPlanPtr,
    /// Why a renew is refused (NULL: it is not), worded as before.
    why_lost: pg_sys::SPIPlanPtr,
    /// renew's write after the judgement.
    renew_judged: pg_sys::SPIPlanPtr,
    release: pg_sys::SPIPlanPtr,
    /// release_all's three statements, in the lock order of every lease
    /// function: lease rows, then the session row, then lost_leases.
    release_all: [pg_sys::SPIPlanPtr; 3],
}

thread_local! {
    static PLANS: Cell<Option<Plans>> = const { Cell::new(None) };
}

/// The saved plans; call inside an SPI connection.
fn plans() -> Plans {
    if let Some(p) = PLANS.with(|p| p.get()) {
        return p;
    }
    use pg_sys::{BOOLOID, INT4OID, INT8OID, TEXTOID, TIMESTAMPTZOID};
    let p = Plans {
        renew: prepare_saved(
            // The clock is read under the row lock (a lock wait re-evaluates
            // the row, and both reads, after it); `(… = $2) IS TRUE` keeps the
            // owner index out of the plan (see lease.renew in sql/lease.sql).
            c"UPDATE lease.lease_state l
                 SET (renewed_at, expires_at) =
                     (SELECT c.t, c.t OPERATOR(pg_catalog.+) ($4 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval)
                        FROM (SELECT pg_catalog.clock_timestamp() AS t WHERE l.name IS NOT NULL) c)
               WHERE l.name OPERATOR(pg_catalog.=) $1 AND (l.owner OPERATOR(pg_catalog.=) $2) IS TRUE
                 AND l.token OPERATOR(pg_catalog.=) $3 AND l.released_at IS NULL
                 AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
              RETURNING l.expires_at",
            &mut [TEXTOID, TEXTOID, INT8OID, INT4OID],
            "lease.renew",
        ),
        lock_lease: prepare_saved(
            c"SELECT l.owner, l.token, l.released_at, l.expires_at FROM lease.lease_state l
               WHERE l.name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
            &mut [TEXTOID],
            "lease.renew",
        ),
        lock_session: prepare_saved(
            c"SELECT s.live_since, s.expires_at FROM lease.session_state s
               WHERE s.owner OPERATOR(pg_catalog.=) $1 FOR SHARE",
            &mut [TEXTOID],
            "lease.renew",
        ),
        why_lost: prepare_saved(
            // $1 found, $2 holder, $3 its token, $4 owner, $5 token,
            // $6 released_at, $7 expiry, $8 now.
            c"SELECT CASE
                WHEN NOT $1 THEN 'it never existed'
                WHEN $2 OPERATOR(pg_catalog.<>) $4 THEN pg_catalog.format('it was taken by %s with token %s', $2, $3)
                WHEN $3 OPERATOR(pg_catalog.>) $5 THEN pg_catalog.format('%s re-acquired it since, with token %s', $2, $3)
                WHEN $3 OPERATOR(pg_catalog.<) $5
                    THEN pg_catalog.format('token %s was never issued for it (current token %s)', $5, $3)
                WHEN $6 IS NOT NULL THEN pg_catalog.format('it was released at %s', $6)
                WHEN $7 OPERATOR(pg_catalog.<=) $8
                    THEN pg_catalog.format('it expired at %s, %s ago', $7,
                                           pg_catalog.date_trunc('millisecond', $8 OPERATOR(pg_catalog.-) $7))
              END",
            &mut [BOOLOID, TEXTOID, INT8OID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
            "lease.renew",
        ),
        renew_judged: prepare_saved(
            c"UPDATE lease.lease_state l
                 SET renewed_at = $2,
                     expires_at = $2 OPERATOR(pg_catalog.+) ($3 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval)
               WHERE l.name OPERATOR(pg_catalog.=) $1 RETURNING l.expires_at",
            &mut [TEXTOID, TIMESTAMPTZOID, INT4OID],
            "lease.renew",
        ),
        release: prepare_saved(
            // An expired lease of this holder is marked released too, but
            // only a live one counts (see lease.release in sql/lease.sql).
            c"UPDATE lease.lease_state l SET released_at = $4, expires_at = LEAST(l.expires_at, $4)
               WHERE l.name OPERATOR(pg_catalog.=) $1 AND (l.owner OPERATOR(pg_catalog.=) $2) IS TRUE
                 AND l.token OPERATOR(pg_catalog.=) $3 AND l.released_at IS NULL
              RETURNING l.expires_at OPERATOR(pg_catalog.=) $4
                        OR EXISTS (SELECT FROM lease.session_state s
                                    WHERE s.owner OPERATOR(pg_catalog.=) l.owner
                                      AND lease._expiry(l.expires_at, s.live_since, s.expires_at) OPERATOR(pg_catalog.>) $4)",
            &mut [TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID],
            "lease.release",
        ),
        release_all: [
            prepare_saved(
                c"WITH held AS (
                    SELECT l.name, lease._expiry(l.expires_at, s.live_since, s.expires_at) OPERATOR(pg_catalog.>) $2 AS was_live
                      FROM lease.lease_state l LEFT JOIN lease.session_state s ON s.owner OPERATOR(pg_catalog.=) l.owner
                     WHERE l.owner OPERATOR(pg_catalog.=) $1 AND l.released_at IS NULL FOR UPDATE OF l
                  ), done AS (
                    UPDATE lease.lease_state l SET released_at = $2, expires_at = LEAST(l.expires_at, $2)
                      FROM held WHERE l.name OPERATOR(pg_catalog.=) held.name
                    RETURNING held.was_live
                  )
                  SELECT pg_catalog.count(*) FILTER (WHERE d.was_live)::pg_catalog.int4 FROM done d",
                &mut [TEXTOID, TIMESTAMPTZOID],
                "lease.release_all",
            ),
            // The process is going away: so does its session.
            prepare_saved(
                c"UPDATE lease.session_state s SET expires_at = $2
                   WHERE s.owner OPERATOR(pg_catalog.=) $1 AND s.expires_at OPERATOR(pg_catalog.>) $2",
                &mut [TEXTOID, TIMESTAMPTZOID],
                "lease.release_all",
            ),
            prepare_saved(
                c"DELETE FROM lease.lost_leases x WHERE x.owner OPERATOR(pg_catalog.=) $1",
                &mut [TEXTOID],
                "lease.release_all",
            ),
        ],
    };
    PLANS.with(|c| c.set(Some(p)));
    p
}

/// The first row's column `col` as a timestamp (NULL: None).
fn timestamp(col: i32) -> Option<i64> {
    // SAFETY: called right after an exec_saved that returned a row with a
    // timestamptz (by value) in column `col`.
    unsafe { result_datum(col) }.map(|d| d.value() as i64)
}

/// lease._expiry(own, live_since, session expires_at): a lease's own expiry,
/// or its owner session's when the session carries it (no session row: its
/// own).
fn carried(own: i64, since: Option<i64>, until: Option<i64>) -> i64 {
    match (since, until) {
        (Some(since), Some(until)) if own > since => own.max(until),
        _ => own,
    }
}

/// The effective expiry of a lease of holder `holder_d` past its own expiry
/// `own`: carried by the holder's session while that lives, judged under
/// the session row's share lock; and the clock, read after that lock.
fn session_expiry(p: Plans, holder_d: pg_sys::Datum, own: i64, what: &str) -> (i64, pg_sys::TimestampTz) {
    // SAFETY: inside spi_connected (every caller's); lock_session takes the
    // owner's text and returns (live_since, expires_at), timestamptz.
    let session = unsafe { exec_saved(p.lock_session, &[Some(holder_d)], what) };
    let now_ts = now();
    (if session { carried(own, timestamp(1), timestamp(2)) } else { own }, now_ts)
}

/// `lease.renew(name, owner, token, ttl_ms)` as the function's owner
/// `definer`; the new expiry (a timestamptz datum) or LeaseLost.
pub fn renew(definer: pg_sys::Oid, name: Label, owner: Label, token: i64, ttl: i32) -> Result<pg_sys::Datum, Refusal> {
    as_definer(definer, || match renew_in_place(name, owner, token, ttl) {
        Some(expires_at) => Ok(expires_at.into()),
        None => spi_connected(|| renew_connected(name, owner, token, ttl)),
    })
}

/// The common renew without a statement: the plan `renew`'s conditions
/// (this owner, this token, not released, not expired on the clock read
/// now) judged on the row a fresh snapshot sees, and its two columns
/// written by the table AM ([`update_own_row`]). None whenever the plan must
/// run instead: the row is missing or judged otherwise (renew_connected
/// then judges it as a whole: carried by a session, or lost, with its
/// message), changed concurrently (the plan follows the update chain or
/// fails to serialize), or the expiry would leave the timestamp range.
fn renew_in_place(name: Label, owner: Label, token: i64, ttl: i32) -> Option<pg_sys::TimestampTz> {
    use pg_sys::TIMESTAMPTZOID;
    // SAFETY: the name is a non-NULL text argument of this call; we run as
    // the function's owner, inside the caller's transaction.
    unsafe {
        update_own_row(c"lease_state", c"name", name.0, |row| {
            if !unreleased_of(row, owner, token) {
                return None;
            }
            let now_ts = now();
            let expires_at = row.attr(c"expires_at", TIMESTAMPTZOID)?.value() as i64;
            let renewed = now_ts.checked_add(i64::from(ttl) * 1000).filter(|&e| e < END_TIMESTAMP)?;
            (expires_at > now_ts).then(|| {
                (
                    vec![
                        (c"renewed_at", TIMESTAMPTZOID, now_ts.into()),
                        (c"expires_at", TIMESTAMPTZOID, renewed.into()),
                    ],
                    renewed,
                )
            })
        })
    }
}

/// Whether `row` (of `lease.lease_state`) is an unreleased lease of `owner`
/// with `token`: the plans' `(l.owner = $2) IS TRUE AND l.token = $3 AND
/// l.released_at IS NULL` (owners compare as bytes: the deterministic
/// default collation).
fn unreleased_of(row: &OwnRow, owner: Label, token: i64) -> bool {
    use pg_sys::{INT8OID, TEXTOID, TIMESTAMPTZOID};
    row.attr(c"released_at", TIMESTAMPTZOID).is_none()
        && row.attr(c"token", INT8OID).map(|d| d.value() as i64) == Some(token)
        // SAFETY: owner is a NOT NULL text column.
        && row.attr(c"owner", TEXTOID).map(|d| unsafe { text_bytes(d) }) == Some(owner.bytes())
}

/// The common release without a statement: a lease of `owner` with `token`,
/// unreleased and live on its own expiry at `now_ts` (the plan `release`'s
/// conditions, and its `l.expires_at = $4` answer true), marked released
/// at `now_ts` with its expiry cut there ([`update_own_row`]). False
/// whenever the plan must run instead: no such row, a lease past its own
/// expiry (whether its owner's session still carried it is the plan's to
/// judge), or any reason `update_own_row` declines.
fn release_in_place(name: Label, owner: Label, token: i64, now_ts: pg_sys::TimestampTz) -> bool {
    use pg_sys::TIMESTAMPTZOID;
    // SAFETY: as in renew_in_place.
    unsafe {
        update_own_row(c"lease_state", c"name", name.0, |row| {
            let expires_at = row.attr(c"expires_at", TIMESTAMPTZOID)?.value() as i64;
            (unreleased_of(row, owner, token) && expires_at >= now_ts).then(|| {
                let changes = vec![
                    (c"released_at", TIMESTAMPTZOID, now_ts.into()),
                    (c"expires_at", TIMESTAMPTZOID, now_ts.into()),
                ];
                (changes, ())
            })
        })
    }
    .is_some()
}

fn renew_connected(name: Label, owner: Label, token: i64, ttl: i32) -> Result<pg_sys::Datum, Refusal> {
    let p = plans();
    let (name_d, owner_d) = (Some(name.0), Some(owner.0));
    let renewed = {
        // SAFETY: inside spi_connected; the parameters are of the types the
        // plan was prepared with (as for every exec_saved below).
        unsafe { exec_saved(p.renew, &[name_d, owner_d, Some(token.into()), Some(ttl.into())], "lease.renew") }
    };
    if renewed {
        // SAFETY: the RETURNING row, a timestamptz column.
        return Ok(unsafe { result_datum(1) }.expect("expires_at is NOT NULL"));
    }
    // Otherwise judged as a whole: carried by the owner's session, or lost.
    // SAFETY: as above.
    let found = unsafe { exec_saved(p.lock_lease, &[name_d], "lease.renew") };
    let mut now_ts = now();
    let (mut holder_d, mut holder_token, mut released, mut expiry) = (None, None, None, None);
    if found {
        // SAFETY: the locked row: owner text, token int8, released_at and
        // expires_at timestamptz. The holder's datum stays valid until the
        // connection ends.
        let (d, t) = unsafe { (result_datum(1), result_datum(2)) };
        holder_d = d;
        holder_token = t.map(|d| d.value() as i64);
        released = timestamp(3);
        expiry = timestamp(4);
        let own = expiry.expect("expires_at is NOT NULL");
        if released.is_none()
            && own <= now_ts
            && holder_d.map(|h| {
                // SAFETY: the holder's datum (owner is NOT NULL text).
                unsafe { text_bytes(h) }
            }) == Some(owner.bytes())
        {
            // Maybe carried by the owner's session: judged under its lock.
            let (carried_until, at) = session_expiry(p, owner.0, own, "lease.renew");
            (expiry, now_ts) = (Some(carried_until), at);
        }
    }
    let ts = |t: Option<i64>| t.map(pg_sys::Datum::from);
    let params = [
        Some(found.into()),
        holder_d,
        holder_token.map(pg_sys::Datum::from),
        owner_d,
        Some(token.into()),
        ts(released),
        ts(expiry),
        Some(now_ts.into()),
    ];
    // SAFETY: as above; one row, one text column.
    let why = unsafe {
        exec_saved(p.why_lost, &params, "lease.renew");
        result_text(1)
    };
    if let Some(why) = why {
        return Err(Refusal::new(
            LeaseError::LeaseLost,
            format!("{} no longer holds lease \"{}\" with token {token}", owner.text(), name.text()),
            format!("Lease {}: {why}.", name.text()),
        ));
    }
    // SAFETY: as above; the lease row exists (locked above).
    unsafe {
        exec_saved(p.renew_judged, &[name_d, Some(now_ts.into()), Some(ttl.into())], "lease.renew");
        Ok(result_datum(1).expect("expires_at is NOT NULL"))
    }
}

/// `lease.release(name, owner, token)` as the function's owner `definer`:
/// whether a live lease was released.
pub fn release(definer: pg_sys::Oid, name: Label, owner: Label, token: Option<i64>) -> bool {
    let now_ts = now();
    as_definer(definer, || {
        if token.is_some_and(|t| release_in_place(name, owner, t, now_ts)) {
            return true;
        }
        spi_connected(|| {
            let params = [Some(name.0), Some(owner.0), token.map(pg_sys::Datum::from), Some(now_ts.into())];
            // SAFETY: inside spi_connected, parameters of the plan's types;
            // the RETURNING row has one boolean column.
            unsafe {
                exec_saved(plans().release, &params, "lease.release") && result_datum(1).is_some_and(|d| d.value() != 0)
            }
        })
    })
}

/// `lease.release_all(owner)` as the function's owner `definer`: how many of
/// owner's leases were live when released.
pub fn release_all(definer: pg_sys::Oid, owner: Label) -> i32 {
    let now_ts = now();
    as_definer(definer, || {
        spi_connected(|| {
            let [leases, session, lost] = plans().release_all;
            let params = [Some(owner.0), Some(now_ts.into())];
            // SAFETY: inside spi_connected, parameters of the plans' types;
            // the first returns one row with one int4 column (a count, never
            // NULL), read before the next statement runs.
            unsafe {
                exec_saved(leases, &params, "lease.release_all");
                let released = result_datum(1).map_or(0, |d| d.value() as i32);
                exec_saved(session, &params, "lease.release_all");
                exec_saved(lost, &params[..1], "lease.release_all");
                released
            }
        })
    })
}

/// `lease.acquire`'s statements besides the lease and session row locks it
/// shares with renew ([`Plans`]); prepared on a backend's first acquire.
#[derive(Clone, Copy)]
struct AcquirePlans {
    /// An owner table's binding, and whether owner_key fits its key columns.
    binding: pg_sys::SPIPlanPtr,
    /// The lease row a bound lease's first acquire creates (released), so
    /// that the owner row is locked under its lock.
    placeholder: pg_sys::SPIPlanPtr,
    /// The new holder's session row (exists from its first lease on).
    session: pg_sys::SPIPlanPtr,
    /// The issued-epoch row, locked at REPEATABLE READ and above.
    issued_share: pg_sys::SPIPlanPtr,
    /// A name's first acquire without an owner row: both rows in one statement.
    fresh: pg_sys::SPIPlanPtr,
    raise_base: pg_sys::SPIPlanPtr,
    issued: pg_sys::SPIPlanPtr,
    /// The lease row's update to the new holder and token.
    take: pg_sys::SPIPlanPtr,
    lost: pg_sys::SPIPlanPtr,
    lost_moot: pg_sys::SPIPlanPtr,
    notify: pg_sys::SPIPlanPtr,
    /// A rival lease's row, locked unless another transaction holds it.
    rival_lock: pg_sys::SPIPlanPtr,
    /// Unreleased leases of other names bound to an owner table whose token
    /// an owner row holds (name, owner_key).
    rivals: pg_sys::SPIPlanPtr,
    /// The texts of a refusal's timestamps (LF005's DETAIL).
    held_texts: pg_sys::SPIPlanPtr,
    /// The texts of an owner table, owner key and key columns, for messages.
    owner_texts: pg_sys::SPIPlanPtr,
}

thread_local! {
    static ACQUIRE_PLANS: Cell<Option<AcquirePlans>> = const { Cell::new(None) };
    static ABSORB_PLAN: Cell<Option<pg_sys::SPIPlanPtr>> = const { Cell::new(None) };
    static ISSUED_PLAN: Cell<Option<pg_sys::SPIPlanPtr>> = const { Cell::new(None) };
}

/// The saved plan in `cell`, prepared from `sql` on first use (a plan only
/// some acquires need: it is not prepared by [`acquire_plans`], and it may
/// name a table that a schema before 0.9.2 lacks). Call inside an SPI
/// connection.
fn lazy_saved(
    cell: &'static std::thread::LocalKey<Cell<Option<pg_sys::SPIPlanPtr>>>,
    sql: &CStr,
    types: &mut [pg_sys::Oid],
) -> pg_sys::SPIPlanPtr {
    cell.with(|c| {
        c.get().unwrap_or_else(|| {
            let p = prepare_saved(sql, types, "lease.acquire");
            c.set(Some(p));
            p
        })
    })
}

/// Records the epoch an acquire issued in as the highest issued, written by
/// this incarnation `origin` (`lease::epoch_tables` reads the origin back).
/// With a schema before 0.9.2 (the library updated, `ALTER EXTENSION
/// pg_lease UPDATE` not run yet: no `lease.token_origin`, no origin column,
/// `origin` None), the epoch alone. Call inside an SPI connection.
fn record_issued(a: &AcquirePlans, epoch: i64, origin: Option<i64>) {
    let Some(origin) = origin else {
        // SAFETY: a saved plan of one int8 parameter, inside SPI.
        unsafe { exec_saved(a.issued, &[Some(epoch.into())], "lease.acquire") };
        return;
    };
    let plan = lazy_saved(
        &ISSUED_PLAN,
        c"INSERT INTO lease.token_epoch_issued AS i (epoch, origin) VALUES ($1, $2)
          ON CONFLICT (singleton) DO UPDATE SET epoch = GREATEST(i.epoch, excluded.epoch), origin = excluded.origin",
        &mut [pg_sys::INT8OID, pg_sys::INT8OID],
    );
    // SAFETY: a saved plan of two int8 parameters, inside SPI.
    unsafe { exec_saved(plan, &[Some(epoch.into()), Some(origin.into())], "lease.acquire") };
}

/// Forgets another incarnation's lease state once an acquire's raise has
/// taken the epoch past it (lease::token_rule): only this database's own
/// incarnation `origin` is left in lease.token_origin. Call inside an SPI
/// connection.
fn absorb_foreign(origin: i64) {
    let plan = lazy_saved(
        &ABSORB_PLAN,
        c"WITH gone AS (DELETE FROM lease.token_origin o WHERE o.origin OPERATOR(pg_catalog.<>) $1)
          INSERT INTO lease.token_origin (origin) VALUES ($1) ON CONFLICT DO NOTHING",
        &mut [pg_sys::INT8OID],
    );
    // SAFETY: a saved plan of one int8 parameter, inside SPI.
    unsafe { exec_saved(plan, &[Some(origin.into())], "lease.acquire") };
}

/// The saved plans of acquire; call inside an SPI connection.
fn acquire_plans() -> AcquirePlans {
    if let Some(p) = ACQUIRE_PLANS.with(|p| p.get()) {
        return p;
    }
    use pg_sys::{INT4OID, INT8OID, REGCLASSOID, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID};
    const WHAT: &str = "lease.acquire";
    let p = AcquirePlans {
        binding: prepare_saved(
            // Not IS DISTINCT FROM: it looks `=` up on the caller's
            // search_path. ($2's cardinality is never NULL.)
            // (A key of more than one dimension does not match, before
            // array_position could refuse it with its own error.)
            c"SELECT p.owner_key_columns,
                     CASE WHEN COALESCE(pg_catalog.array_ndims($2), 0) OPERATOR(pg_catalog.<>) 1 THEN true
                          ELSE (pg_catalog.cardinality($2) OPERATOR(pg_catalog.=) pg_catalog.cardinality(p.owner_key_columns)) IS NOT TRUE
                               OR pg_catalog.array_position($2, NULL) IS NOT NULL END,
                     (SELECT pg_catalog.string_agg(DISTINCT q.owner_key_columns::pg_catalog.text, ', ')
                        FROM lease.protected q WHERE q.owner_table OPERATOR(pg_catalog.=) $1
                      HAVING pg_catalog.count(DISTINCT q.owner_key_columns) OPERATOR(pg_catalog.>) 1)
                FROM lease.protected p WHERE p.owner_table OPERATOR(pg_catalog.=) $1 LIMIT 1",
            &mut [REGCLASSOID, TEXTARRAYOID],
            WHAT,
        ),
        placeholder: prepare_saved(
            c"INSERT INTO lease.lease_state AS l (name, owner, token, acquired_at, renewed_at, expires_at, released_at)
              VALUES ($1, $2, 0, '-infinity', '-infinity', '-infinity', '-infinity')
              ON CONFLICT (name) DO NOTHING",
            &mut [TEXTOID, TEXTOID],
            WHAT,
        ),
        session: prepare_saved(
            c"INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
              VALUES ($1, '-infinity', '-infinity', '-infinity') ON CONFLICT (owner) DO NOTHING",
            &mut [TEXTOID],
            WHAT,
        ),
        issued_share: prepare_saved(c"SELECT FROM lease.token_epoch_issued i FOR SHARE", &mut [], WHAT),
        fresh: prepare_saved(
            // The lease row, then (only if it was inserted) the session row.
            c"WITH ins AS (
                INSERT INTO lease.lease_state AS l (name, owner, token, acquired_at, renewed_at, expires_at)
                VALUES ($1, $2, $3, $4, $4, $4 OPERATOR(pg_catalog.+) ($5 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval))
                ON CONFLICT (name) DO NOTHING
                RETURNING l.token, l.expires_at
              ), sess AS (
                INSERT INTO lease.session_state AS s (owner, live_since, renewed_at, expires_at)
                SELECT $2, '-infinity', '-infinity', '-infinity' FROM ins
                ON CONFLICT (owner) DO NOTHING
              )
              SELECT i.token, i.expires_at FROM ins i",
            &mut [TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, INT4OID],
            WHAT,
        ),
        raise_base: prepare_saved(
            c"INSERT INTO lease.token_epoch (base) VALUES ($1) ON CONFLICT DO NOTHING",
            &mut [INT8OID],
            WHAT,
        ),
        issued: prepare_saved(
            // (Before 0.9.2's schema: no origin column; see record_issued.)
            c"INSERT INTO lease.token_epoch_issued AS i (epoch) VALUES ($1)
              ON CONFLICT (singleton) DO UPDATE SET epoch = GREATEST(i.epoch, excluded.epoch)",
            &mut [INT8OID],
            WHAT,
        ),
        take: prepare_saved(
            c"UPDATE lease.lease_state l
                 SET owner = $2, token = $3, acquired_at = $4, renewed_at = $4,
                     expires_at = $4 OPERATOR(pg_catalog.+) ($5 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval),
                     released_at = NULL, owner_table = $6, owner_key = $7
               WHERE l.name OPERATOR(pg_catalog.=) $1
              RETURNING l.token, l.expires_at",
            &mut [TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, INT4OID, REGCLASSOID, TEXTARRAYOID],
            WHAT,
        ),
        lost: prepare_saved(
            c"INSERT INTO lease.lost_leases AS x (owner, name, token, lost_at) VALUES ($1, $2, $3, $4)
              ON CONFLICT (owner, name) DO UPDATE SET token = excluded.token, lost_at = excluded.lost_at",
            &mut [TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID],
            WHAT,
        ),
        lost_moot: prepare_saved(
            c"DELETE FROM lease.lost_leases x
               WHERE x.owner OPERATOR(pg_catalog.=) $1 AND x.name OPERATOR(pg_catalog.=) $2",
            &mut [TEXTOID, TEXTOID],
            WHAT,
        ),
        notify: prepare_saved(
            c"SELECT pg_catalog.pg_notify('pg_lease', pg_catalog.json_build_object(
                'event', 'taken', 'name', $1, 'owner', $2, 'token', $3,
                'previous_owner', $4, 'previous_token', $5, 'expires_at', $6)::pg_catalog.text)",
            &mut [TEXTOID, TEXTOID, INT8OID, TEXTOID, INT8OID, TIMESTAMPTZOID],
            WHAT,
        ),
        rivals: prepare_saved(
            // Run only when an owner row holds a token that is not this
            // lease's (a first binding, or a rival): lease_state_bound finds
            // the owner table's live bindings.
            c"SELECT l.name, l.owner_key FROM lease.lease_state l
               WHERE l.owner_table OPERATOR(pg_catalog.=) $1 AND l.token OPERATOR(pg_catalog.=) $2
                 AND l.name OPERATOR(pg_catalog.<>) $3 AND l.released_at IS NULL",
            &mut [REGCLASSOID, INT8OID, TEXTOID],
            WHAT,
        ),
        rival_lock: prepare_saved(
            c"SELECT l.owner, l.token, l.released_at, l.expires_at FROM lease.lease_state l
               WHERE l.name OPERATOR(pg_catalog.=) $1 FOR UPDATE SKIP LOCKED",
            &mut [TEXTOID],
            WHAT,
        ),
        held_texts: prepare_saved(
            c"SELECT $1::pg_catalog.text,
                     pg_catalog.date_trunc('millisecond', $1 OPERATOR(pg_catalog.-) $2)::pg_catalog.text",
            &mut [TIMESTAMPTZOID, TIMESTAMPTZOID],
            WHAT,
        ),
        owner_texts: prepare_saved(
            c"SELECT $1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text",
            &mut [REGCLASSOID, TEXTARRAYOID, TEXTARRAYOID],
            WHAT,
        ),
    };
    ACQUIRE_PLANS.with(|c| c.set(Some(p)));
    p
}

/// What `lease.acquire` was asked, its arguments checked.
pub struct Acquire {
    /// The WAL timeline (`lease._token_floor() >> 40`).
    pub timeline: i64,
    pub ttl: i32,
    pub name: Label,
    pub owner: Label,
    /// The owner table and key (a text[] datum), given together or not at all.
    pub bound: Option<(pg_sys::Oid, pg_sys::Datum)>,
}

/// What `lease.acquire` returns: the new token and the lease's expiry (a
/// timestamptz datum).
pub struct Acquired {
    pub token: i64,
    pub expires_at: pg_sys::Datum,
}

/// `lease.acquire(...)` as the function's owner `definer`.
pub fn acquire(definer: pg_sys::Oid, call: &Acquire) -> Result<Acquired, Failure> {
    if let Some((table, _)) = call.bound {
        may_bind(table)?;
    }
    // SAFETY: reads a backend global: the calling role, before the switch.
    let caller = unsafe { pg_sys::GetUserId() };
    as_definer(definer, || spi_connected(|| acquire_connected(call, caller)))
}

/// A lease bound to an owner row writes its tokens there, fencing out every
/// writer of that row: the caller must have some right on the owner table
/// (SELECT or UPDATE, on the table or on any of its columns); 42501 otherwise.
fn may_bind(table: pg_sys::Oid) -> Result<(), Invalid> {
    // SAFETY: a syscache lookup; the name (palloc'd) is only tested for NULL.
    if unsafe { pg_sys::get_rel_name(table) }.is_null() {
        // A regclass given as a number (0, a dropped table's OID).
        return Err(invalid(
            "42P01",
            format!("pg_lease: owner_table {} is not a relation (no relation has that OID)", u32::from(table)),
        ));
    }
    let mode = (pg_sys::ACL_SELECT | pg_sys::ACL_UPDATE) as pg_sys::AclMode;
    // SAFETY: privilege lookups of the calling role (the function's caller:
    // acquire has not switched user yet) on a relation that exists (checked
    // just above; aclchk raises 42P01 itself for one dropped since).
    let allowed = unsafe {
        let role = pg_sys::GetUserId();
        pg_sys::pg_class_aclcheck(table, role, mode) == pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::pg_attribute_aclcheck_all(table, role, mode, pg_sys::AclMaskHow::ACLMASK_ANY)
                == pg_sys::AclResult::ACLCHECK_OK
    };
    if allowed {
        return Ok(());
    }
    // SAFETY: reads a backend global.
    let role = unsafe { pg_sys::GetUserId() };
    let mut e = invalid(
        "42501",
        format!(
            "pg_lease: permission denied to bind a lease to owner rows of {} (role {})",
            crate::pg::display(table),
            crate::pg::role_name(role)
        ),
    );
    e.hint = Some(
        "Binding a lease to an owner row writes its tokens there: grant SELECT or UPDATE on the owner table.".into(),
    );
    Err(e)
}

/// `lease.try_acquire(...)` as the function's owner `definer`: acquire in a
/// subtransaction (as the PL/pgSQL version's EXCEPTION block ran it), None
/// (everything it did undone) when another live owner holds the lease.
pub fn try_acquire(definer: pg_sys::Oid, call: &Acquire) -> Result<Option<Acquired>, Failure> {
    match subtransaction(|| acquire(definer, call)) {
        Ok(Ok(acquired)) => Ok(Some(acquired)),
        Ok(Err(Failure::Refused(r))) if r.error == LeaseError::LeaseOwnedElsewhere => Ok(None),
        Ok(Err(failure)) => Err(failure),
        Err(raised) => std::panic::resume_unwind(raised),
    }
}

/// The lease row as acquire found it (or, fresh, as it judges the row it
/// will create).
struct Current {
    /// The holder's text (for messages), bytes (compared) and datum.
    owner: String,
    owner_bytes: Vec<u8>,
    owner_d: pg_sys::Datum,
    token: i64,
    released: Option<i64>,
    expiry: Option<i64>,
}

impl Current {
    /// The row `lock_lease` just returned.
    fn read() -> Current {
        // SAFETY: called right after lock_lease returned its row: owner
        // text, token int8 (both NOT NULL), released_at and expires_at
        // timestamptz. The owner datum stays valid until the SPI connection
        // ends.
        unsafe {
            let owner_d = result_datum(1).expect("owner is NOT NULL");
            Current {
                owner: result_text(1).expect("owner is NOT NULL"),
                owner_bytes: text_bytes(owner_d),
                owner_d,
                token: result_datum(2).expect("token is NOT NULL").value() as i64,
                released: timestamp(3),
                expiry: timestamp(4),
            }
        }
    }
}

fn acquire_connected(call: &Acquire, caller: pg_sys::Oid) -> Result<Acquired, Failure> {
    let (p, a) = (plans(), acquire_plans());
    let (name_d, owner_d) = (Some(call.name.0), Some(call.owner.0));
    let (name, owner, owner_bytes) = (call.name.text(), call.owner.text(), call.owner.bytes());
    // The binding's key columns (a text[] datum) and the key as text.
    let mut bound = None;
    if let Some((table, key)) = call.bound {
        // SAFETY: inside spi_connected; the parameters are of the types the
        // plan was prepared with (as for every exec_saved below).
        let found = unsafe { exec_saved(a.binding, &[Some(table.into()), Some(key)], "lease.acquire") };
        if !found {
            let (table_text, _, _) = owner_texts(a, table, key, None);
            return Err(invalid(
                "55000",
                format!("pg_lease: {table_text} is not the owner table of any table protected with lease.protect"),
            )
            .into());
        }
        // SAFETY: the row just returned: key columns text[], mismatch
        // boolean, the key column sets (text) when there are several.
        let (columns, mismatch, sets) =
            unsafe { (result_datum(1), result_datum(2).is_some_and(|d| d.value() != 0), result_text(3)) };
        if let Some(sets) = sets {
            // Tables fenced against it by different owner key columns: which
            // row owner_key names would depend on which protection is read.
            let (table_text, _, _) = owner_texts(a, table, key, None);
            let mut e = invalid(
                "55000",
                format!("pg_lease: owner table {table_text} is fenced under several owner key column sets ({sets}): owner_key cannot name one row"),
            );
            e.hint = Some(
                "Bind leases to an owner table whose fenced tables all use the same owner key columns (lease.protect ... owner_key_columns), or to a table of its own for each key."
                    .into(),
            );
            return Err(e.into());
        }
        if mismatch {
            let (table_text, key_text, columns_text) = owner_texts(a, table, key, columns);
            return Err(invalid(
                "22023",
                format!("pg_lease: owner_key {key_text} does not match the key columns {columns_text} of {table_text}"),
            )
            .into());
        }
        // SAFETY: a non-NULL text[] argument of the call.
        let key_values =
            texts(unsafe { Vec::<Option<ServerText>>::from_datum(key, false) }.expect("owner_key is not NULL"));
        match with_pinned_search_path(|| visible_to(caller, table, &key_values)) {
            Some(true) => {}
            Some(false) => return Err(owner_missing(a, &call.name.text(), (table, key, columns)).into()),
            None => {
                let (table_text, _, _) = owner_texts(a, table, key, None);
                let mut e = invalid(
                    "42501",
                    format!(
                        "pg_lease: permission denied to bind a lease to owner rows of {table_text} under row-level security (role {})",
                        crate::pg::role_name(caller)
                    ),
                );
                e.hint = Some("Row-level security applies to this role on the owner table: binding needs SELECT on its key columns, to see the row its policies let it see.".into());
                return Err(e.into());
            }
        }
        bound = Some((table, key, columns, key_values));
    }

    loop {
        // The lease row, locked (created on first use): racing acquires queue here.
        // SAFETY: as above.
        let found = unsafe { exec_saved(p.lock_lease, &[name_d], "lease.acquire") };
        let fresh = !found && bound.is_none();
        let mut cur = if fresh {
            Current {
                owner: owner.clone(),
                owner_bytes: owner_bytes.clone(),
                owner_d: call.owner.0,
                token: 0,
                released: Some(i64::MIN),
                expiry: None,
            }
        } else if !found {
            // SAFETY: as above; the row exists after the insert (this
            // transaction's, or a committed one's it waited for).
            unsafe {
                exec_saved(a.placeholder, &[name_d, owner_d], "lease.acquire");
                exec_saved(p.lock_lease, &[name_d], "lease.acquire");
            }
            Current::read()
        } else {
            Current::read()
        };
        // The new holder's session row exists from its first lease on, so the
        // takeover check below can always lock it. Fresh: after its row.
        // Re-taken by the owner that holds it: the row is there already (its
        // acquire wrote it with the lease row; pg_lease never deletes one).
        let holds = found && cur.released.is_none() && cur.owner_bytes == owner_bytes;
        if !fresh && !holds {
            // SAFETY: as above.
            unsafe { exec_saved(a.session, &[owner_d], "lease.acquire") };
        }
        let mut now_ts = now(); // read after the lock wait
        let mut live = cur.released.is_none() && cur.expiry.is_some_and(|e| e > now_ts);
        if cur.released.is_none() && !live && cur.owner_bytes != owner_bytes {
            // Past its own expiry, another owner's lease may still be
            // carried by that owner's session: judged under its lock, on the
            // clock read after it.
            let own = cur.expiry.expect("expires_at is NOT NULL");
            let (carried_until, at) = session_expiry(p, cur.owner_d, own, "lease.acquire");
            (cur.expiry, now_ts) = (Some(carried_until), at);
            live = carried_until > now_ts;
        }
        if live && cur.owner_bytes != owner_bytes {
            return Err(held_elsewhere(a, &name, &cur, now_ts).into());
        }

        let mut owner_token = None;
        if let Some((table, key, columns, key_values)) = &bound {
            // FOR UPDATE waits for writers still fenced under the old token;
            // read as the owner table's owner (crate::lease_owner), with the
            // search_path the SECURITY DEFINER version ran it with.
            let row = with_pinned_search_path(|| lock_owner_row_of(*table, key_values));
            let Some(&token) = row.first() else {
                return Err(owner_missing(a, &name, (*table, *key, *columns)).into());
            };
            owner_token = token;
            if let Some(t) = token.filter(|&t| t > 0 && t != cur.token) {
                rival_on_row(a, p, (&name, call.name.0), &owner_bytes, (*table, *key, key_values), t)?;
            }
        }

        // Epoch = base + timeline, raised above a stored token's or an issued
        // epoch when needed: the rule is crate::lease::token_rule.
        let stored = cur.token.max(owner_token.unwrap_or(0)).max(0);
        // A REPEATABLE READ or SERIALIZABLE transaction reads the epoch in
        // its snapshot, which may be older than a raise: every raise writes
        // the issued-epoch row, so locking it is a serialization failure then.
        // SAFETY: reads a backend global.
        if unsafe { pg_sys::XactIsoLevel } != pg_sys::XACT_READ_COMMITTED as i32 {
            // SAFETY: as above.
            unsafe { exec_saved(a.issued_share, &[], "lease.acquire") };
        }
        // The epoch tables read as a statement now would (after the lock waits).
        let crate::lease::NextToken { token: new_token, epoch, issued, raise_base: high, foreign, origin } =
            crate::lease::issue_token(stored, call.timeline);
        let Some(new_token) = new_token else {
            let e = if stored == i64::MAX {
                let mut e = invalid(
                    "22003",
                    format!("pg_lease: lease \"{name}\" has no fencing token left (current {stored})"),
                );
                e.hint = Some("Fencing tokens are bigints; this resource's token is at the top of their range.".into());
                e
            } else {
                let mut e = invalid(
                    "22003",
                    format!("pg_lease: this database has no fencing token epoch left for lease \"{name}\""),
                );
                e.detail = Some(format!("The next epoch would be {epoch}; epochs stay below 2^23."));
                e.hint = Some(format!(
                    "Every cutover raise (lease.issue_tokens_above) and every restored or upgraded copy takes a band of {} epochs.",
                    crate::lease::EPOCH_BAND
                ));
                e
            };
            return Err(e.into());
        };
        let mut acquired = None;
        if fresh {
            let params = [name_d, owner_d, Some(new_token.into()), Some(now_ts.into()), Some(call.ttl.into())];
            // SAFETY: as above; the row returned is (token, expires_at).
            if !unsafe { exec_saved(a.fresh, &params, "lease.acquire") } {
                // Another acquire created the row since (nothing is written
                // yet): judge again, under its lock.
                continue;
            }
            acquired = Some(returned());
        }
        if let Some(base) = high {
            // SAFETY: as above.
            unsafe { exec_saved(a.raise_base, &[Some(base.into())], "lease.acquire") };
        }
        if let (true, Some(origin)) = (foreign, origin) {
            absorb_foreign(origin);
        }
        if epoch > issued.unwrap_or(0) {
            record_issued(&a, epoch, origin);
        }
        if let Some((table, key, _, key_values)) = &bound {
            let landed = bump_owner_row(*table, key_values, new_token)?;
            if landed != Some(new_token) {
                // A trigger or rule on the owner table swallowed or changed
                // the bump: the old holder's token would still be current.
                let (table_text, key_text, _) = owner_texts(a, *table, *key, None);
                return Err(Refusal::new(
                    LeaseError::FenceTampering,
                    format!("lease \"{name}\": the token bump to {new_token} did not reach owner row {key_text} of {table_text}"),
                    format!("Lease {name}, owner table {table_text}: a trigger or rule on it skipped or changed the UPDATE of its token column."),
                )
                .into());
            }
        }
        let acquired = match acquired {
            Some(acquired) => acquired,
            None => {
                let (table, key) = (bound.as_ref().map(|b| b.0.into()), bound.as_ref().map(|b| b.1));
                let params =
                    [name_d, owner_d, Some(new_token.into()), Some(now_ts.into()), Some(call.ttl.into()), table, key];
                // SAFETY: as above; the row exists (locked above).
                unsafe { exec_saved(a.take, &params, "lease.acquire") };
                returned()
            }
        };
        if cur.owner_bytes != owner_bytes {
            // Taken from a holder that did not release it: its next heartbeat
            // hears so. This owner's own report of an earlier loss of the
            // lease is moot now that it holds the lease again.
            // SAFETY: as above.
            unsafe {
                if cur.released.is_none() {
                    let params = [Some(cur.owner_d), name_d, Some(cur.token.into()), Some(now_ts.into())];
                    exec_saved(a.lost, &params, "lease.acquire");
                }
                exec_saved(a.lost_moot, &[owner_d, name_d], "lease.acquire");
            }
        }
        // Changed hands from a holder that did not release it (it expired, or
        // its owner re-took it from another process): tell a live previous
        // holder, so it can freeze before its next write is refused.
        if cur.released.is_none() && cur.token > 0 {
            let params = [
                name_d,
                owner_d,
                Some(acquired.token.into()),
                Some(cur.owner_d),
                Some(cur.token.into()),
                Some(acquired.expires_at),
            ];
            // SAFETY: as above.
            unsafe { exec_saved(a.notify, &params, "lease.acquire") };
        }
        // A token must be durable before the client sees it committed:
        // ForceSyncCommit makes this transaction's commit wait for its WAL
        // flush whatever synchronous_commit says when it commits (a later
        // SET LOCAL synchronous_commit = off in the same transaction cannot
        // undo it); the setting is raised to local too, as before, for what
        // the session shows.
        // SAFETY: sets a flag of the current transaction; reads a backend global.
        unsafe {
            pg_sys::ForceSyncCommit();
            if pg_sys::synchronous_commit == pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32 {
                set_guc(c"synchronous_commit", c"local", pg_sys::GucAction::GUC_ACTION_LOCAL);
            }
        }
        return Ok(acquired);
    }
}

/// The (token, expires_at) row the last statement returned.
fn returned() -> Acquired {
    // SAFETY: called right after a statement that returned one row of an
    // int8 and a timestamptz (by value), neither NULL.
    unsafe {
        Acquired {
            token: result_datum(1).expect("token is NOT NULL").value() as i64,
            expires_at: result_datum(2).expect("expires_at is NOT NULL"),
        }
    }
}

fn invalid(sqlstate: &str, message: String) -> Invalid {
    Invalid::new(sqlstate, message).expect("a valid SQLSTATE")
}

/// An owner row is one resource, so one lease: when the owner row locked for
/// lease `name` holds token `t`, not this lease's, and an unreleased lease of
/// another name issued it, that lease is judged as a holder of `name` would
/// be: live (on its own, or carried by its owner's session) and held by
/// another owner, LF005 naming it; else its holder hears of the loss at its
/// next heartbeat, as from a takeover. Tokens are unique (drawn from
/// `lease.token_counter`), so the token names the lease; only tokens issued
/// before 0.9.0 (each lease counted for itself) or set by hand can be shared,
/// and then the leases' keys tell (`lease_owner::same_owner_row`, the key
/// columns' own `=`). The rival's row is locked, without waiting: one that
/// another transaction is changing (a renew in flight, a re-take waiting for
/// the owner row this acquire holds) counts as held; at REPEATABLE READ or
/// above a change since the snapshot fails to serialize.
fn rival_on_row(
    a: AcquirePlans,
    p: Plans,
    (name, name_d): (&str, pg_sys::Datum),
    owner_bytes: &[u8],
    (table, key_d, key): (pg_sys::Oid, pg_sys::Datum, &[Option<String>]),
    t: i64,
) -> Result<(), Refusal> {
    // SAFETY: inside spi_connected; the parameters are of the plan's types;
    // the rows are (name text NOT NULL, owner_key text[]); the name datums
    // stay valid until the SPI connection ends.
    let candidates: Vec<(pg_sys::Datum, Vec<Option<String>>)> = unsafe {
        exec_saved(a.rivals, &[Some(table.into()), Some(t.into()), Some(name_d)], "lease.acquire");
        (0..result_rows())
            .map(|r| {
                let key = texts(
                    row_datum(r, 2).and_then(|d| Vec::<Option<ServerText>>::from_datum(d, false)).unwrap_or_default(),
                );
                (row_datum(r, 1).expect("name is NOT NULL"), key)
            })
            .collect()
    };
    let shared = candidates.len() > 1;
    for (rival_d, rival_key) in candidates {
        if shared && !with_pinned_search_path(|| same_owner_row(table, key, &rival_key)) {
            continue;
        }
        // SAFETY: as above; rival_lock returns (owner, token, released_at,
        // expires_at) of the locked row, or none when another transaction
        // holds its lock.
        if !unsafe { exec_saved(a.rival_lock, &[Some(rival_d)], "lease.acquire") } {
            // Being changed right now (renewed, released, re-taken): judged
            // held. Waiting could deadlock, as a re-take of that lease waits
            // for the owner row this acquire holds.
            let rival = Label(rival_d).text();
            let detail = format!("Lease {rival} is being changed by another transaction right now.");
            return Err(row_held(a, name, (table, key_d), &rival, None, detail));
        }
        let mut cur = Current::read();
        if cur.released.is_some() || cur.token != t || cur.owner_bytes == owner_bytes {
            // Released or re-taken meanwhile; or the same owner under another
            // name: its own to re-take.
            continue;
        }
        let (expiry, now_ts) =
            session_expiry(p, cur.owner_d, cur.expiry.expect("expires_at is NOT NULL"), "lease.acquire");
        cur.expiry = Some(expiry);
        if expiry > now_ts {
            let rival = Label(rival_d).text();
            let detail = held_elsewhere(a, &rival, &cur, now_ts).detail;
            return Err(row_held(a, name, (table, key_d), &rival, Some(&cur.owner), detail));
        }
        let params = [Some(cur.owner_d), Some(rival_d), Some(cur.token.into()), Some(now_ts.into())];
        // SAFETY: as above.
        unsafe { exec_saved(a.lost, &params, "lease.acquire") };
    }
    Ok(())
}

/// LF005: lease `name` may not bind the owner row `key` of `table`, which
/// lease `rival` (of `holder`, when known) holds; `detail` says how.
fn row_held(
    a: AcquirePlans,
    name: &str,
    (table, key): (pg_sys::Oid, pg_sys::Datum),
    rival: &str,
    holder: Option<&str>,
    detail: String,
) -> Refusal {
    let (table_text, key_text, _) = owner_texts(a, table, key, None);
    let by = holder.map(|h| format!(" by {h}")).unwrap_or_default();
    Refusal::new(
        LeaseError::LeaseOwnedElsewhere,
        format!("lease \"{name}\": owner row {key_text} of {table_text} is held{by} through lease \"{rival}\""),
        format!("{detail} One owner row is one resource: acquire it by the lease name that holds it."),
    )
}

/// LF007: lease `name` is bound to an owner row that does not exist (or that
/// row-level security hides from its caller).
fn owner_missing(
    a: AcquirePlans,
    name: &str,
    (table, key, columns): (pg_sys::Oid, pg_sys::Datum, Option<pg_sys::Datum>),
) -> Refusal {
    let (table_text, key_text, columns_text) = owner_texts(a, table, key, columns);
    Refusal::new(
        LeaseError::FenceOwnerMissing,
        format!("lease \"{name}\" is bound to owner row {key_text} of {table_text}, which does not exist"),
        format!("Lease {name}, owner table {table_text}, key {columns_text} = {key_text}."),
    )
}

/// LF005: `name` is held by another live owner, as `cur` says.
fn held_elsewhere(a: AcquirePlans, name: &str, cur: &Current, now_ts: i64) -> Refusal {
    let expiry = cur.expiry.expect("a live lease has an expiry");
    // SAFETY: inside spi_connected; two timestamptz parameters, one row of
    // two text columns.
    let (at, left) = unsafe {
        exec_saved(a.held_texts, &[Some(expiry.into()), Some(now_ts.into())], "lease.acquire");
        (result_text(1).unwrap_or_default(), result_text(2).unwrap_or_default())
    };
    Refusal::new(
        LeaseError::LeaseOwnedElsewhere,
        format!("lease \"{name}\" is held by {}", cur.owner),
        format!("Lease {name}, holder {}, token {}, expires at {at} (in {left}).", cur.owner, cur.token),
    )
}

/// The texts of an owner table (a regclass), owner key and key columns (text
/// arrays; None: empty) as the SECURITY DEFINER version's messages printed
/// them (its search_path decides how a table name is qualified).
fn owner_texts(
    a: AcquirePlans,
    table: pg_sys::Oid,
    key: pg_sys::Datum,
    columns: Option<pg_sys::Datum>,
) -> (String, String, String) {
    with_pinned_search_path(|| {
        // SAFETY: inside spi_connected; a regclass and two text[] (or NULL)
        // parameters, one row of three text columns.
        unsafe {
            exec_saved(a.owner_texts, &[Some(table.into()), Some(key), columns], "lease.acquire");
            (result_text(1).unwrap_or_default(), result_text(2).unwrap_or_default(), result_text(3).unwrap_or_default())
        }
    })
}

/// Writes `token` into the owner row (crate::lease_owner) in a
/// subtransaction, as the PL/pgSQL version's EXCEPTION block did: the owner
/// guard's LF004 (a trigger on the owner table lowered the bump) comes back
/// from the owner row's UPDATE as XX000 and is raised again with its own
/// code. The token the row holds afterwards (None: no row was written).
fn bump_owner_row(table: pg_sys::Oid, key: &[Option<String>], token: i64) -> Result<Option<i64>, Refusal> {
    const PREFIX: &str = "FencingTokenRegression: ";
    let written = subtransaction(|| {
        Ok::<_, std::convert::Infallible>(with_pinned_search_path(|| set_owner_token_of(table, key, token)))
    });
    match written {
        Ok(Ok(landed)) => Ok(landed),
        Ok(Err(never)) => match never {},
        Err(raised) => match raised.downcast::<CaughtError>() {
            Ok(caught) => match *caught {
                CaughtError::PostgresError(ref report) | CaughtError::ErrorReport(ref report)
                    if report.sql_error_code() == pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR
                        && report.message().starts_with(PREFIX) =>
                {
                    Err(Refusal::new(
                        LeaseError::FencingTokenRegression,
                        &report.message()[PREFIX.len()..],
                        report.detail().unwrap_or_default(),
                    ))
                }
                other => other.rethrow(),
            },
            Err(raised) => std::panic::resume_unwind(raised),
        },
    }
}

/// The WAL timeline a token is issued on (`lease._token_floor() >> 40`;
/// refuses on a standby).
pub fn timeline() -> i64 {
    crate::lease::token_floor() >> EPOCH_SHIFT
}

/// The heartbeat's statements (sql/lease.sql, lease._beat).
#[derive(Clone, Copy)]
struct BeatPlans {
    /// The owner's session row, locked.
    lock: pg_sys::SPIPlanPtr,
    /// Leases the lapsed session carried past their own expiry, skipping
    /// those being changed right now.
    expired: pg_sys::SPIPlanPtr,
    /// The session's one row write.
    extend: pg_sys::SPIPlanPtr,
    /// Takeovers to report, each once.
    taken: pg_sys::SPIPlanPtr,
    /// renew_all's list of what the session carries.
    carried: pg_sys::SPIPlanPtr,
}

thread_local! {
    static BEAT_PLANS: Cell<Option<BeatPlans>> = const { Cell::new(None) };
}

/// The saved plans of the heartbeat; call inside an SPI connection.
fn beat_plans() -> BeatPlans {
    if let Some(p) = BEAT_PLANS.with(|p| p.get()) {
        return p;
    }
    use pg_sys::{INT4OID, TEXTOID, TIMESTAMPTZOID};
    const WHAT: &str = "lease.heartbeat";
    let p = BeatPlans {
        lock: prepare_saved(
            c"SELECT s.live_since, s.expires_at FROM lease.session_state s
               WHERE s.owner OPERATOR(pg_catalog.=) $1 FOR UPDATE",
            &mut [TEXTOID],
            WHAT,
        ),
        expired: prepare_saved(
            // $2, $3: the session's live_since and expires_at; $4 the clock.
            c"SELECT l.name, l.token, lease._expiry(l.expires_at, $2, $3)
                FROM lease.lease_state l
               WHERE l.owner OPERATOR(pg_catalog.=) $1 AND l.released_at IS NULL
                 AND l.expires_at OPERATOR(pg_catalog.<=) $4 AND l.expires_at OPERATOR(pg_catalog.>) $2
                 FOR SHARE SKIP LOCKED",
            &mut [TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
            WHAT,
        ),
        extend: prepare_saved(
            c"UPDATE lease.session_state s
                 SET live_since = $2, renewed_at = $3,
                     expires_at = $3 OPERATOR(pg_catalog.+) ($4 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval)
               WHERE s.owner OPERATOR(pg_catalog.=) $1",
            &mut [TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID],
            WHAT,
        ),
        taken: prepare_saved(
            c"DELETE FROM lease.lost_leases x WHERE x.owner OPERATOR(pg_catalog.=) $1 RETURNING x.name, x.token",
            &mut [TEXTOID],
            WHAT,
        ),
        carried: prepare_saved(
            c"SELECT l.name, l.token, GREATEST(l.expires_at, s.expires_at)
                FROM lease.session_state s JOIN lease.lease_state l ON l.owner OPERATOR(pg_catalog.=) s.owner
               WHERE s.owner OPERATOR(pg_catalog.=) $1 AND l.released_at IS NULL
                 AND l.expires_at OPERATOR(pg_catalog.>) s.live_since",
            &mut [TEXTOID],
            "lease.renew_all",
        ),
    };
    BEAT_PLANS.with(|c| c.set(Some(p)));
    p
}

/// A row of the heartbeat: a lease lost since the last heartbeat (taken
/// over, or expired with a session that lapsed), or, for renew_all, one the
/// session carries. Its datums live until the call's SPI connection ends.
pub struct BeatRow {
    /// The lease's name (a text datum).
    pub name: pg_sys::Datum,
    pub token: i64,
    /// Its expiry (a timestamptz datum); None for a takeover.
    pub expires_at: Option<pg_sys::Datum>,
    /// Lost: taken over (true) or expired (false); None: carried (renewed).
    pub lost: Option<bool>,
}

/// The heartbeat: extends owner's session with one row update and hands
/// `emit` the leases it lost since its last heartbeat, each once (expired
/// ones, then takeovers), then with `list_carried` (renew_all) every lease
/// the session carries. Runs as `definer` (heartbeat, renew_all), or as
/// the caller (`lease._beat`, which only the extension owner may execute).
pub fn beat(definer: Option<pg_sys::Oid>, owner: Label, ttl: i32, list_carried: bool, emit: &mut dyn FnMut(BeatRow)) {
    let mut run = || spi_connected(|| beat_connected(owner, ttl, list_carried, emit));
    match definer {
        Some(definer) => as_definer(definer, run),
        None => run(),
    }
}

fn beat_connected(owner: Label, ttl: i32, list_carried: bool, emit: &mut dyn FnMut(BeatRow)) {
    let p = beat_plans();
    let owner_d = Some(owner.0);
    // Lock order, as in every lease function: lease rows, then session
    // rows, then lost_leases.
    // SAFETY: inside spi_connected; the parameters are of the types the plan
    // was prepared with (as for every exec_saved below).
    let found = unsafe { exec_saved(p.lock, &[owner_d], WHAT_BEAT) };
    if !found {
        // SAFETY: as above; the row exists after the insert.
        unsafe {
            exec_saved(acquire_plans().session, &[owner_d], WHAT_BEAT);
            exec_saved(p.lock, &[owner_d], WHAT_BEAT);
        }
    }
    let (mut live_since, expires) =
        (timestamp(1).expect("live_since is NOT NULL"), timestamp(2).expect("expires_at is NOT NULL"));
    let now_ts = now(); // read after the lock wait
    if expires <= now_ts {
        // A first heartbeat, or the session lapsed: the leases it carried
        // past their own expiry died with it, reported this once; a new life
        // begins now (see lease._beat in sql/lease.sql).
        let params = [owner_d, Some(live_since.into()), Some(expires.into()), Some(now_ts.into())];
        // SAFETY: as above; rows of (name text, token int8, expiry timestamptz).
        unsafe {
            exec_saved(p.expired, &params, WHAT_BEAT);
            emit_rows(emit, Some(false), true);
        }
        live_since = now_ts;
    }
    let params = [owner_d, Some(live_since.into()), Some(now_ts.into()), Some(ttl.into())];
    // SAFETY: as above.
    unsafe { exec_saved(p.extend, &params, WHAT_BEAT) };
    // Takeovers, read after the session lock: one that committed while this
    // heartbeat waited for it is reported now.
    // SAFETY: as above; rows of (name text, token int8).
    unsafe {
        exec_saved(p.taken, &[owner_d], WHAT_BEAT);
        emit_rows(emit, Some(true), false);
    }
    if list_carried {
        // SAFETY: as above; rows of (name text, token int8, expiry timestamptz).
        unsafe {
            exec_saved(p.carried, &[owner_d], "lease.renew_all");
            emit_rows(emit, None, true);
        }
    }
}

const WHAT_BEAT: &str = "lease.heartbeat";

/// Hands `emit` every row the last statement returned: (name, token) and,
/// `with_expiry`, the lease's expiry, each as a row `lost` says.
///
/// # Safety
/// Right after an exec_saved whose rows have a text and an int8 column (and
/// a timestamptz third, `with_expiry`), name and token NOT NULL.
unsafe fn emit_rows(emit: &mut dyn FnMut(BeatRow), lost: Option<bool>, with_expiry: bool) {
    for row in 0..result_rows() {
        // SAFETY: the caller's contract; `row` is below the row count.
        unsafe {
            emit(BeatRow {
                name: row_datum(row, 1).expect("name is NOT NULL"),
                token: row_datum(row, 2).expect("token is NOT NULL").value() as i64,
                expires_at: if with_expiry { row_datum(row, 3) } else { None },
                lost,
            });
        }
    }
}
