//! The lease service's rules: the token epoch and the token rule, label and
//! TTL bounds. The calls that apply them are `lease_calls` (Rust since 0.7.0
//! and 0.8.0) and sql/lease.sql.

use crate::errors::Invalid;
use crate::gucs;
use pgrx::prelude::*;

/// Tokens are `epoch << EPOCH_SHIFT | counter`. The epoch is the WAL timeline,
/// which rises at every standby promotion and point-in-time recovery, so a
/// token issued after a failover beats every token of the old timeline even
/// if the WAL that recorded them was lost. The counter is the database's one
/// sequence (`lease.token_counter`, since 0.9.0): 2^40 acquisitions per
/// database, 2^23 epochs.
pub const EPOCH_SHIFT: u32 = 40;

/// The highest fencing token a role other than a superuser may write into an
/// owner row (2^62 - 1). `lease.acquire` (which runs as the extension's
/// superuser owner) issues tokens up to bigint's maximum, so from any token
/// set by hand it can still issue 2^62 more: no one can poison a resource.
pub const MAX_TOKEN: i64 = (1 << 62) - 1;

/// `lease._bound_token()`: the token bound to the current transaction (see
/// [`gucs::bound_token`]: a value left from an earlier transaction is none).
#[pg_extern(name = "_bound_token", stable, parallel_safe)]
pub fn bound_token() -> Option<i64> {
    gucs::bound_token()
}

/// `lease._token_floor()`: the smallest token of the current epoch. Every new
/// token is above it and above every token this database has recorded.
#[pg_extern(name = "_token_floor", volatile, parallel_unsafe)]
pub fn token_floor() -> i64 {
    if crate::pg::in_recovery() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "pg_lease: leases can only be taken on the primary",
            "This server is a standby in recovery."
        );
    }
    // SAFETY: reads the WAL insertion timeline; on a primary (checked above)
    // it is set once recovery has ended.
    let timeline = unsafe { pg_sys::GetWALInsertionTimeLine() } as i64;
    timeline << EPOCH_SHIFT
}

/// Epochs stay below 2^23, so that `epoch << EPOCH_SHIFT` is a bigint.
pub const EPOCH_LIMIT: i64 = 1 << 23;

/// A raise of the base for a cutover (`lease.issue_tokens_above`) or for
/// lease state from another incarnation (a restore, pg_upgrade) lands on a
/// multiple of this band. The epoch is base + timeline, so while timelines
/// stay below the band an epoch tells the band apart from the timeline: a
/// raise whose WAL a promoted standby never received, or that a
/// point-in-time recovery undid, leaves every epoch of the new timeline
/// (the old base, a higher timeline) apart from every epoch the raise gave
/// out, and no token is issued twice (a raise by one epoch would equal the
/// next timeline's). 2^13 bands in all.
pub const EPOCH_BAND: i64 = 1 << 10;

/// The smallest multiple of [`EPOCH_BAND`] above `epoch`.
pub fn band_above(epoch: i64) -> i64 {
    (epoch.div_euclid(EPOCH_BAND) + 1).saturating_mul(EPOCH_BAND)
}

/// `lease._epoch_band_above(epoch) → bigint`: [`band_above`], for
/// `lease.issue_tokens_above` (not executable by PUBLIC).
#[pg_extern(name = "_epoch_band_above", immutable, parallel_safe)]
pub fn band_above_sql(epoch: i64) -> i64 {
    band_above(epoch)
}

/// This database incarnation, as one bigint: the cluster's system
/// identifier (new at every initdb; a standby, a promoted standby and a
/// point-in-time recovery keep it) XORed with the database's OID in the
/// high half and pg_lease's extension OID in the low half (a restore
/// creates the extension again, so its OID is new; ALTER EXTENSION UPDATE
/// keeps it). `lease.token_origin` holds the incarnations whose lease state
/// this database holds.
pub fn origin() -> i64 {
    // SAFETY: reads the control file's identifier (set at startup), this
    // backend's database, and the extension's OID by a catalog lookup
    // (missing_ok false: an ERROR if pg_lease is not installed here).
    let (sysid, db, ext) = unsafe {
        (pg_sys::GetSystemIdentifier(), pg_sys::MyDatabaseId, pg_sys::get_extension_oid(c"pg_lease".as_ptr(), false))
    };
    (sysid as i64) ^ (i64::from(db.to_u32()) << 32) ^ i64::from(ext.to_u32())
}

/// `lease._origin() → bigint`: [`origin`] (not executable by PUBLIC).
#[pg_extern(name = "_origin", stable, parallel_safe)]
pub fn origin_sql() -> i64 {
    origin()
}

/// What the token rule gives for one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextToken {
    /// The next token; None when none is left (the stored token at bigint's
    /// top, or the epoch at [`EPOCH_LIMIT`]).
    pub token: Option<i64>,
    /// The epoch the token is issued in.
    pub epoch: i64,
    /// `lease.token_epoch_issued`'s epoch (None before the first token).
    pub issued: Option<i64>,
    /// The base the epoch had to rise to (the caller records it in
    /// `lease.token_epoch` when it issues), None when no raise is needed.
    pub raise_base: Option<i64>,
    /// The lease state came from another incarnation (`lease.token_origin`):
    /// the caller that issues forgets those rows with the raise.
    pub foreign: bool,
    /// This incarnation ([`origin`]) when the 0.9.2 schema is installed
    /// (`lease.token_origin` exists), which the caller records with what it
    /// issues; None before `ALTER EXTENSION pg_lease UPDATE` (and from
    /// [`token_rule`] itself, which reads no table).
    pub origin: Option<i64>,
}

/// A token's counter: its low 40 bits.
pub const COUNTER_MASK: i64 = (1 << EPOCH_SHIFT) - 1;

/// The token rule, in one place (lease.acquire issues with it;
/// `lease._next_token`, for lease.token_ceiling and lease.issue_tokens_above,
/// judges with it). For a lease whose highest stored token (its own, its
/// owner row's) is `stored`, on WAL timeline `timeline`, with `max_base` the
/// highest base in `lease.token_epoch` and `issued` the issued epoch: the
/// epoch is max_base (0 without any) + the timeline; a stored token from a
/// higher epoch, or a higher epoch issued before (restored from a dump, or
/// carried through pg_upgrade, where timelines restart), raises the base to
/// that epoch, and the epoch is then above it, and above what any earlier,
/// lower timeline computed from the same stored token. The token is
/// `epoch << 40 | counter`, `counter` drawn from the database's one counter
/// (`lease.token_counter`), so that no two acquires are ever given the same
/// token. A stored token in that epoch at or above it (set by hand, or
/// issued before 0.9.0, when each lease counted for itself) raises the base
/// to the next band, as a cutover does, with the same counter: still above
/// it, still unique, and the counter is never pushed up by a value someone
/// wrote (a hand-set owner token near 2^40 would otherwise use up the
/// counter of every lease). (Before 0.9.2 it moved to the next epoch, which
/// is the next timeline's own: a standby promoted after it received that
/// raise but not the tokens issued after it issued them again, with a
/// counter behind the old primary's.) The issued epoch then records it, as
/// for any raise.
///
/// `foreign`: the lease state came from another incarnation (a dump
/// restored, pg_upgrade; `lease.token_origin`), whose source may have gone
/// on issuing after the state was taken, in its epoch or a later one (its
/// own failovers, a cutover): the base then rises to the second band above
/// every epoch seen, past both.
pub fn token_rule(
    stored: i64,
    timeline: i64,
    max_base: Option<i64>,
    issued: Option<i64>,
    counter: i64,
    foreign: bool,
) -> NextToken {
    let current = max_base.unwrap_or(0).saturating_add(timeline);
    let high = issued.map_or(stored >> EPOCH_SHIFT, |i| i.max(stored >> EPOCH_SHIFT));
    let (epoch, raise_base) = if foreign {
        let base = band_above(high.max(current)).saturating_add(EPOCH_BAND);
        (base.saturating_add(timeline), Some(base))
    } else if high > current {
        (high.saturating_add(timeline), Some(high))
    } else {
        (current, None)
    };
    let counter = counter & COUNTER_MASK;
    let (epoch, raise_base) = if epoch < EPOCH_LIMIT && (epoch << EPOCH_SHIFT) | counter <= stored {
        let base = band_above(epoch);
        (base.saturating_add(timeline), Some(base))
    } else {
        (epoch, raise_base)
    };
    let token = (epoch < EPOCH_LIMIT).then_some((epoch << EPOCH_SHIFT) | counter);
    NextToken { token, epoch, issued, raise_base, foreign, origin: None }
}

/// The epoch tables as a statement run now reads them (fresh at READ
/// COMMITTED: read after the lease row's lock wait).
struct EpochTables {
    /// The highest base in `lease.token_epoch`.
    max_base: Option<i64>,
    /// `lease.token_epoch_issued`'s epoch.
    issued: Option<i64>,
    /// This incarnation ([`origin`]), None before the 0.9.2 schema.
    origin: Option<i64>,
    /// This database's lease state came from another incarnation (a dump,
    /// pg_upgrade, a template copy), whose source may have issued tokens
    /// since that this state does not record: `lease.token_origin` holds
    /// another incarnation's row, or the issued epoch's row was written by
    /// another one, or before 0.9.2 (origin NULL: a 0.9.1 dump restored, or
    /// an update in place, which cannot tell itself from a copy's). Before
    /// `ALTER EXTENSION pg_lease UPDATE` to 0.9.2 there is neither table nor
    /// column: not foreign.
    foreign: bool,
}

/// Reads [`EpochTables`]; the issued row (epoch, origin) in one scan, this
/// incarnation's origin looked up once.
fn epoch_tables() -> EpochTables {
    let origins = crate::pg::lease_relid_if_any(c"token_origin");
    let columns: &[i16] = if origins.is_some() { &[2, 3] } else { &[2] };
    let issued_rows =
        crate::pg::own_table_int8_rows(crate::pg::lease_relid(c"token_epoch_issued"), c"token_epoch_issued", columns);
    let origin = origins.map(|_| origin());
    let foreign = origins.is_some_and(|relid| {
        crate::pg::own_table_int8_rows(relid, c"token_origin", &[1]).iter().any(|row| row[0] != origin)
            || issued_rows.iter().any(|row| row[1] != origin)
    });
    EpochTables {
        max_base: crate::pg::own_table_max_int8(c"token_epoch", 1),
        issued: issued_rows.iter().filter_map(|row| row[0]).max(),
        origin,
        foreign,
    }
}

/// `lease.token_epoch_floor`: the highest epoch a token was issued in, and
/// the WAL timeline it was issued on, kept in a sequence so that no rollback
/// lowers it. The epoch tables are transactional: an acquire that raised the
/// epoch (above a hand-set owner token, after `lease.issue_tokens_above` in
/// the same transaction) and then rolled back had handed its token out, and
/// the lease's next token came from the lower epoch, below it (a stale
/// holder then won every high-water comparison). Every token is issued at
/// or above the floor's epoch: in it on the floor's own timeline (the
/// counter, drawn later, keeps the new token above every one issued in it),
/// above it on another (a promoted standby's counter may be behind the
/// floor's, so the floor then counts as an issued epoch).
struct EpochFloor(crate::pg::OwnSequence);

impl EpochFloor {
    /// The floor sequence; None before the 0.9.2 schema (`ALTER EXTENSION
    /// pg_lease UPDATE` not run yet: no `lease.token_origin` either). Gone
    /// from a 0.9.2 schema (only a superuser can take an extension's member
    /// away) is an error, not the rule of an older schema.
    fn find() -> Option<EpochFloor> {
        if crate::pg::lease_relid_if_any(c"token_epoch_floor").is_some() {
            return Some(EpochFloor(crate::pg::own_sequence(c"token_epoch_floor")));
        }
        if crate::pg::lease_relid_if_any(c"token_origin").is_some() {
            pgrx::error!(
                "pg_lease: lease.token_epoch_floor is missing: no token can be issued without it (restore pg_lease's schema)"
            );
        }
        None
    }

    /// (epoch, timeline), None while no token was issued with the floor.
    fn read(&self) -> Option<(i64, i64)> {
        self.0.last_value().filter(|&v| v > 0).map(|v| (v >> 32, v & 0xFFFF_FFFF))
    }

    /// Raised to `epoch` on `timeline` unless `seen` (what [`Self::read`]
    /// gave before the token was drawn) is there already: nearly every token
    /// is issued in the floor's epoch, and then nothing is locked or read
    /// again (`raise_to` reads it again under the raisers' lock).
    fn raise(&self, seen: Option<(i64, i64)>, epoch: i64, timeline: i64) {
        let encode = |epoch: i64, timeline: i64| (epoch << 32) | (timeline & 0xFFFF_FFFF);
        let value = encode(epoch, timeline);
        if seen.is_none_or(|(e, t)| encode(e, t) < value) {
            self.0.raise_to(value);
        }
    }
}

/// The epoch tables' values with the floor folded in: on the floor's own
/// timeline its epoch is the lowest to issue in (as a base would make it);
/// on another (a promoted standby, whose counter may be behind the tokens
/// the old timeline issued in it) the lowest is the epoch above it (see
/// [`EpochFloor`]).
fn with_floor(
    (max_base, issued): (Option<i64>, Option<i64>),
    floor: Option<(i64, i64)>,
    timeline: i64,
) -> (Option<i64>, Option<i64>) {
    let lowest = match floor {
        Some((epoch, on)) if on == timeline => epoch,
        Some((epoch, _)) => epoch.saturating_add(1),
        None => return (max_base, issued),
    };
    (Some(max_base.unwrap_or(0).max(lowest - timeline)), issued)
}

/// [`token_rule`] over the epoch tables read now and the floor (read just
/// before, by the caller), then the
/// counter value `counter` gives (in that order, as ever). `issued` is the
/// highest epoch known issued, the table's or the floor's: the caller
/// records its epoch in the table only above it (an acquire issuing in the
/// epoch another, uncommitted one raised the floor to need not wait for
/// that one's row of `lease.token_epoch_issued`).
fn rule_now(stored: i64, timeline: i64, floor: Option<(i64, i64)>, counter: impl FnOnce() -> i64) -> NextToken {
    let t = epoch_tables();
    let (max_base, issued) = with_floor((t.max_base, t.issued), floor, timeline);
    let known = match (t.issued, floor) {
        (Some(i), Some((f, _))) => Some(i.max(f)),
        (i, f) => i.or(f.map(|(f, _)| f)),
    };
    NextToken {
        origin: t.origin,
        issued: known,
        ..token_rule(stored, timeline, max_base, issued, counter(), t.foreign)
    }
}

/// The next token [`token_rule`] would issue now, without issuing it (the
/// counter's next value, read, not drawn): for lease.token_ceiling and
/// lease.issue_tokens_above.
pub fn next_token(stored: i64, timeline: i64) -> NextToken {
    rule_now(stored, timeline, EpochFloor::find().and_then(|f| f.read()), || {
        pgrx::spi::Spi::get_one::<i64>(
            "SELECT CASE WHEN c.is_called THEN c.last_value OPERATOR(pg_catalog.+) 1 ELSE c.last_value END
               FROM lease.token_counter c",
        )
        .unwrap_or_else(|e| error!("pg_lease: reading lease.token_counter: {e}"))
        .unwrap_or(1)
    })
}

/// Issues a token by [`token_rule`] (lease.acquire): its counter drawn from
/// `lease.token_counter`, a sequence, which no rollback gives back: a token
/// an acquire returned is never issued again, even if its transaction then
/// rolls back (and its caller used it anyway). WAL is flushed up to the
/// sequence's last change (a record every 32 values) before the token is
/// returned, so no crash gives a counter value back either.
pub fn issue_token(stored: i64, timeline: i64) -> NextToken {
    let counter = crate::pg::own_sequence(c"token_counter");
    let floor = EpochFloor::find();
    let seen = floor.as_ref().and_then(EpochFloor::read);
    let next = rule_now(stored, timeline, seen, || counter.next());
    // Before the token is returned, and whatever becomes of this
    // transaction: every later token stays in this epoch or above it.
    if let (Some(floor), Some(_)) = (&floor, next.token) {
        floor.raise(seen, next.epoch, timeline);
    }
    // The record that covers the value drawn may be another backend's, not
    // flushed yet: flush up to the sequence page's LSN (nothing to do, and
    // no I/O, when a commit since has flushed past it, which is the rule).
    counter.flush_wal();
    next
}

/// `lease._next_token(stored, timeline)`: [`next_token`] as a row (for
/// lease.token_ceiling and lease.issue_tokens_above; not executable by
/// PUBLIC). Issues nothing.
#[pg_extern(name = "_next_token", volatile, parallel_unsafe)]
#[allow(clippy::type_complexity)] // pgrx reads the row's columns from the literal tuple
pub fn next_token_sql(
    stored: i64,
    timeline: i64,
) -> TableIterator<
    'static,
    (name!(token, Option<i64>), name!(epoch, i64), name!(issued, Option<i64>), name!(raise_base, Option<i64>)),
> {
    let n = next_token(stored, timeline);
    TableIterator::once((n.token, n.epoch, n.issued, n.raise_base))
}

/// The longest lease name or owner, in characters.
pub const MAX_LABEL_CHARS: usize = 256;

/// The rule for lease names and owners (`what` says which): not NULL, not
/// blank (Unicode whitespace only), no control characters, at most
/// [`MAX_LABEL_CHARS`] characters. `lease._check_label(what, value)`.
pub fn check_label(what: &str, value: Option<&str>) -> Result<(), Invalid> {
    let invalid = |code, message: String| Err(Invalid::new(code, message).expect("a valid SQLSTATE"));
    // `what` is "name" or "owner" from pg_lease's own SQL; bounded anyway.
    let what: String = what.chars().take(32).collect();
    let Some(value) = value else {
        return invalid("22004", format!("pg_lease: lease {what} must not be NULL"));
    };
    if value.trim().is_empty() {
        return invalid("22023", format!("pg_lease: lease {what} must not be blank"));
    }
    // Control characters, and the line and paragraph separators, which break
    // a name across lines in logs as a newline does. The value is not echoed.
    let breaks = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if let Some((at, c)) = value.chars().enumerate().find(|&(_, c)| breaks(c)) {
        return invalid(
            "22023",
            format!("pg_lease: lease {what} contains a control character (U+{:04X} at character {})", c as u32, at + 1),
        );
    }
    let chars = value.chars().count();
    if chars > MAX_LABEL_CHARS {
        return invalid(
            "22023",
            format!("pg_lease: lease {what} is {chars} characters long; at most {MAX_LABEL_CHARS} are allowed"),
        );
    }
    Ok(())
}

/// `lease._check_ttl(ttl_ms)`: the TTL if within `pg_lease.min_ttl_ms` ..
/// `pg_lease.max_ttl_ms`, else a clear 22004/22023 error.
pub fn check_ttl(ttl_ms: Option<i32>) -> Result<i32, Invalid> {
    let (min, max) = (gucs::MIN_TTL_MS.get(), gucs::MAX_TTL_MS.get());
    match ttl_ms {
        None => Err(Invalid::new("22004", "pg_lease: ttl_ms must not be NULL").expect("a valid SQLSTATE")),
        Some(ttl) if ttl < min || ttl > max => {
            Err(Invalid::new("22023", format!("pg_lease: ttl_ms {ttl} is out of range"))
                .expect("a valid SQLSTATE")
                .with_detail(format!("pg_lease.min_ttl_ms = {min}, pg_lease.max_ttl_ms = {max}.")))
        }
        Some(ttl) => Ok(ttl),
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn token_floor_is_the_timeline_epoch() {
        let floor = Spi::get_one::<i64>("SELECT lease._token_floor()").unwrap().unwrap();
        let timeline = Spi::get_one::<i64>("SELECT timeline_id::bigint FROM pg_control_checkpoint()").unwrap().unwrap();
        assert_eq!(floor, timeline << super::EPOCH_SHIFT);
    }

    /// The Rust rule's epoch is what 0.8.0's SQL `lease._next_token` gave,
    /// over the edges (bigint's top, epoch 2^23, raises by a stored token or an
    /// issued epoch, no base/issued rows), the SQL run here on the same
    /// inputs; its token is the epoch with the counter drawn, or the next
    /// epoch with it when that is not above stored.
    #[pg_test]
    fn the_token_rule_keeps_the_epoch_rule_and_draws_the_counter() {
        use super::{token_rule, COUNTER_MASK, EPOCH_SHIFT};
        let edges = [0_i64, 1, (1 << 40) - 1, 1 << 40, (5 << 40) + 7, (1 << 62) - 1, i64::MAX - 1, i64::MAX];
        let bases = [None, Some(1), Some(3), Some((1 << 23) - 2)];
        let issueds = [None, Some(0), Some(2), Some(9), Some((1 << 23) - 1)];
        for stored in edges {
            for timeline in [1_i64, 2, 7] {
                for base in bases {
                    for issued in issueds {
                        // 0.8.0's body of lease._next_token, with the two
                        // tables' values as parameters.
                        let (token, epoch, issued_sql, raise) = Spi::connect(|c| {
                            let row = c
                                .select(
                                    "SELECT CASE WHEN $1 = 9223372036854775807 OR r.epoch >= 8388608 THEN NULL
                                                 ELSE greatest($1, r.epoch << 40) + 1 END,
                                            r.epoch, r.issued, r.raise_base
                                       FROM (SELECT CASE WHEN h.high > c.epoch THEN h.high + $2 ELSE c.epoch END AS epoch,
                                                    c.issued,
                                                    CASE WHEN h.high > c.epoch THEN h.high END AS raise_base
                                               FROM (SELECT coalesce($3, 0) + $2 AS epoch, $4 AS issued) c
                                              CROSS JOIN LATERAL (SELECT greatest($1 >> 40, c.issued) AS high) h) r",
                                    None,
                                    &[stored.into(), timeline.into(), base.into(), issued.into()],
                                )
                                .unwrap()
                                .first();
                            (
                                row.get::<i64>(1).unwrap(),
                                row.get::<i64>(2).unwrap().unwrap(),
                                row.get::<i64>(3).unwrap(),
                                row.get::<i64>(4).unwrap(),
                            )
                        });
                        for counter in [1_i64, 5, COUNTER_MASK] {
                            let rule = token_rule(stored, timeline, base, issued, counter, false);
                            let at = format!("{stored} {timeline} {base:?} {issued:?} {counter}");
                            // The epoch's token with the counter drawn, or
                            // (since 0.9.2) the next band's epoch, the base
                            // raised to it, when that is not above stored.
                            let bumped = epoch < super::EPOCH_LIMIT && (epoch << EPOCH_SHIFT) | counter <= stored;
                            let (e, raise) = if bumped {
                                let band = super::band_above(epoch);
                                (band + timeline, Some(band))
                            } else {
                                (epoch, raise)
                            };
                            assert_eq!((rule.issued, rule.raise_base), (issued_sql, raise), "{at}");
                            assert_eq!(rule.epoch, e, "{at}");
                            let expected = (e < super::EPOCH_LIMIT).then_some((e << EPOCH_SHIFT) | counter);
                            assert_eq!(rule.token, expected, "{at}");
                            if token.is_none() && stored != i64::MAX {
                                assert_eq!(rule.token, None, "{at}: 0.8.0 had no token left");
                            }
                            if let Some(t) = rule.token {
                                assert!(t > stored, "{at}: {t} not above {stored}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Bands: a raise for a cutover or a restore lands on a multiple of
    /// EPOCH_BAND; lease state from another incarnation jumps two bands above
    /// every epoch seen (the stored token's, the issued one, the current).
    #[pg_test]
    fn foreign_lease_state_jumps_two_bands_above_every_epoch_seen() {
        use super::{band_above, token_rule, EPOCH_BAND, EPOCH_LIMIT, EPOCH_SHIFT};
        assert_eq!((band_above(0), band_above(1023), band_above(1024)), (EPOCH_BAND, EPOCH_BAND, 2 * EPOCH_BAND));
        let r = token_rule((5 << EPOCH_SHIFT) | 9, 1, Some(3), Some(4), 7, true);
        assert_eq!(
            (r.raise_base, r.epoch, r.token, r.foreign),
            (Some(2048), 2049, Some((2049 << EPOCH_SHIFT) | 7), true)
        );
        // The current epoch counts too (a base already high, a later timeline).
        let r = token_rule(0, 3, Some(1030), None, 1, true);
        assert_eq!((r.raise_base, r.epoch), (Some(3072), 3075));
        // Not foreign: the rule as before.
        assert_eq!(token_rule(0, 3, Some(1030), None, 1, false).raise_base, None);
        // No band left: no token.
        assert_eq!(token_rule(0, 1, Some(EPOCH_LIMIT - EPOCH_BAND), None, 1, true).token, None);
    }

    /// The floor on the token's own timeline is the lowest epoch to issue
    /// in (the token rule then raises nothing); from another timeline it is
    /// an issued epoch, issued above; issuing in it keeps tokens rising by
    /// the counter alone.
    #[pg_test]
    fn the_floor_is_a_lowest_epoch_on_its_timeline_and_an_issued_one_on_another() {
        use super::{token_rule, with_floor, EPOCH_SHIFT};
        assert_eq!(with_floor((Some(3), Some(4)), None, 1), (Some(3), Some(4)));
        assert_eq!(with_floor((Some(3), Some(4)), Some((9, 1)), 1), (Some(8), Some(4)));
        // Another timeline: the epoch above the floor's at least (a standby
        // promoted onto timeline 2 whose base + 2 equals the floor's epoch).
        assert_eq!(with_floor((None, None), Some((9, 1)), 2), (Some(8), None));
        assert_eq!(with_floor((Some(0), Some(2)), Some((2, 1)), 2), (Some(1), Some(2)));
        assert_eq!(with_floor((Some(30), Some(12)), Some((9, 2)), 1), (Some(30), Some(12)));
        // Same timeline: issued in the floor's epoch, above a token drawn
        // earlier in it, no base raise.
        let (base, issued) = with_floor((Some(0), Some(1)), Some((5, 1)), 1);
        let r = token_rule((5 << EPOCH_SHIFT) | 7, 1, base, issued, 8, false);
        assert_eq!((r.epoch, r.token, r.raise_base), (5, Some((5 << EPOCH_SHIFT) | 8), None));
        // Another timeline: above the floor's epoch, even when the new
        // timeline's own epoch is the floor's.
        let (base, issued) = with_floor((Some(3), Some(5)), Some((5, 2)), 3);
        let r = token_rule(0, 3, base, issued, 8, false);
        assert_eq!(r.epoch, 6, "{r:?}");
    }

    /// CREATE EXTENSION records this database's incarnation, and only it.
    #[pg_test]
    fn create_extension_records_this_incarnation() {
        let mine = Spi::get_one::<bool>("SELECT bool_and(origin = lease._origin()) FROM lease.token_origin").unwrap();
        assert_eq!(mine, Some(true));
        assert_eq!(Spi::get_one::<i64>("SELECT lease._epoch_band_above(1)").unwrap(), Some(super::EPOCH_BAND));
    }

    /// lease._next_token reads the epoch tables, this transaction's writes
    /// included, and the counter's next value, without drawing it.
    #[pg_test]
    fn next_token_reads_the_epoch_tables_and_the_counter() {
        let row = |sql: &str| Spi::get_two::<i64, i64>(sql).unwrap();
        let next = || {
            Spi::get_one::<i64>(
                "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM lease.token_counter",
            )
            .unwrap()
            .unwrap()
        };
        let n = next();
        assert_eq!(row("SELECT token, epoch FROM lease._next_token(0, 1)"), (Some((1 << 40) | n), Some(1)));
        assert_eq!(next(), n, "nothing drawn");
        Spi::run("INSERT INTO lease.token_epoch (base) VALUES (4)").unwrap();
        assert_eq!(row("SELECT token, epoch FROM lease._next_token(0, 1)"), (Some((5 << 40) | n), Some(5)));
        Spi::run("INSERT INTO lease.token_epoch_issued (epoch, origin) VALUES (9, lease._origin())").unwrap();
        let raised = Spi::get_one::<i64>("SELECT raise_base FROM lease._next_token(0, 1)").unwrap();
        assert_eq!(raised, Some(9));
        assert_eq!(row("SELECT token, epoch FROM lease._next_token(0, 1)"), (Some((10 << 40) | n), Some(10)));
        // Written by another incarnation (or before 0.9.2: NULL): two bands
        // above every epoch seen.
        Spi::run("UPDATE lease.token_epoch_issued SET origin = NULL").unwrap();
        assert_eq!(row("SELECT token, epoch FROM lease._next_token(0, 1)"), (Some((2049 << 40) | n), Some(2049)));
        assert_eq!(next(), n, "nothing drawn");
    }

    #[pg_test]
    fn labels_follow_one_rule() {
        use super::check_label;
        assert!(check_label("name", Some("room:1")).is_ok());
        assert!(check_label("name", Some(&"x".repeat(256))).is_ok());
        assert!(check_label("name", Some(&"é".repeat(256))).is_ok());
        for bad in [
            None,
            Some(""),
            Some("   "),
            Some("\t"),
            Some("\u{a0}"),
            Some("a\nb"),
            Some("a\u{85}b"),
            Some("a\u{2028}b"),
            Some(&*"x".repeat(257)),
        ] {
            assert!(check_label("owner", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[pg_test]
    fn ttl_bounds_come_from_the_settings() {
        assert_eq!(super::check_ttl(Some(1000)).ok(), Some(1000));
        assert!(super::check_ttl(Some(5)).unwrap_err().message.contains("ttl_ms 5 is out of range"));
        assert!(super::check_ttl(None).is_err());
    }
}
