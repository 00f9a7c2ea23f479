//! The hot lease calls in Rust: `lease.renew`, `lease.release` and
//! `lease.release_all` (issue #13).
//!
//! They keep the PL/pgSQL versions' contract (sql/lease.sql) exactly: the
//! same statements, now saved SPI plans prepared once per backend (the plan
//! cache re-plans them after DDL on the tables they read), run as the
//! function's owner the way SECURITY DEFINER ran them ([`as_definer`]), but
//! without the per-call GUC save and restore a `SET search_path` clause
//! costs. Nothing here depends on the caller's search_path: every table,
//! function, operator and type in the plans is schema-qualified.

use crate::errors::{LeaseError, Refusal};
use crate::pg::{as_definer, exec_saved, now, prepare_saved, result_datum, result_text, spi_connected};
use pgrx::pg_sys;
use std::cell::Cell;

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

/// `lease.renew(name, owner, token, ttl_ms)` as the function's owner
/// `definer`; the new expiry (a timestamptz datum) or LeaseLost.
pub fn renew(definer: pg_sys::Oid, name: Label, owner: Label, token: i64, ttl: i32) -> Result<pg_sys::Datum, Refusal> {
    as_definer(definer, || spi_connected(|| renew_connected(name, owner, token, ttl)))
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
        let (holder, d, t) = unsafe { (result_text(1), result_datum(1), result_datum(2)) };
        holder_d = d;
        holder_token = t.map(|d| d.value() as i64);
        released = timestamp(3);
        expiry = timestamp(4);
        let own = expiry.expect("expires_at is NOT NULL");
        if released.is_none() && own <= now_ts && holder.as_deref() == Some(owner.text().as_str()) {
            // Maybe carried by the owner's session: judged under its lock.
            // SAFETY: as above.
            let session = unsafe { exec_saved(p.lock_session, &[owner_d], "lease.renew") };
            now_ts = now();
            if session {
                // lease._expiry(own, live_since, session expires_at).
                if let (Some(since), Some(until)) = (timestamp(1), timestamp(2)) {
                    if own > since {
                        expiry = Some(own.max(until));
                    }
                }
            }
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
