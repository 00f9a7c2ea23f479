-- pg_lease 0.6.0 -> 0.7.0: logical replication and blue/green upgrades
-- (issue #17). Subscriptions owned by roles named in
-- pg_lease.trusted_subscription_owners are trusted like a superuser's (in the
-- library); lease.judge_replicated sets, per protected table, whether changes
-- applied by logical replication are judged (column
-- lease.protected.judge_replicated, NULL: the mode's default); pg_lease's own
-- tables keep their state local (a FOR ALL TABLES publication's changes to
-- them are skipped on the subscriber, TRUNCATE of them is refused).
\echo Use "ALTER EXTENSION pg_lease UPDATE TO '0.7.0'" to load this file. \quit

ALTER TABLE lease.protected ADD COLUMN judge_replicated boolean;

CREATE  FUNCTION "_judge_replicated"(
	"target" oid, /* pg_sys :: Oid */
	"judge" bool /* Option < bool > */
) RETURNS bool /* bool */
VOLATILE PARALLEL UNSAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'judge_replicated_wrapper';

CREATE FUNCTION lease.judge_replicated(target regclass, judge boolean) RETURNS void
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF target IS NULL THEN
        PERFORM lease._fail('22004', 'lease.judge_replicated: target must not be NULL');
    END IF;
    IF NOT lease._judge_replicated(target, judge) THEN
        PERFORM lease._fail('42704', format('pg_lease: %s is not protected', target));
    END IF;
END $$;
COMMENT ON FUNCTION lease.judge_replicated(regclass, boolean) IS
    'Whether target''s fence judges changes applied by logical replication (true), trusts them (false), or follows its mode (NULL).';

CREATE FUNCTION lease._local_state() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_local_state';
COMMENT ON FUNCTION lease._local_state() IS
    'Keeps pg_lease''s own tables local: skips replicated changes, refuses TRUNCATE (internal).';
REVOKE EXECUTE ON FUNCTION lease._local_state() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lease.judge_replicated(regclass, boolean) FROM PUBLIC;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['protected', 'high_water', 'rejected_writes', 'lost_leases', 'token_epoch',
                             'token_epoch_issued', 'deferred_checks', 'lease_state', 'session_state'] LOOP
        IF t IN ('lease_state', 'session_state') THEN
            EXECUTE format('CREATE TRIGGER pg_lease_local BEFORE INSERT OR DELETE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
            EXECUTE format('CREATE TRIGGER pg_lease_local_update AFTER UPDATE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
            EXECUTE format('ALTER TABLE lease.%I ENABLE REPLICA TRIGGER pg_lease_local_update', t);
        ELSE
            EXECUTE format('CREATE TRIGGER pg_lease_local BEFORE INSERT OR UPDATE OR DELETE ON lease.%I
                            FOR EACH ROW EXECUTE FUNCTION lease._local_state()', t);
        END IF;
        EXECUTE format('ALTER TABLE lease.%I ENABLE REPLICA TRIGGER pg_lease_local', t);
        EXECUTE format('CREATE TRIGGER pg_lease_local_truncate BEFORE TRUNCATE ON lease.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION lease._local_state()', t);
        EXECUTE format('ALTER TABLE lease.%I ENABLE ALWAYS TRIGGER pg_lease_local_truncate', t);
    END LOOP;
END $$;

-- pg_lease deletes from this table (without a primary key): a publication
-- that publishes deletes needs a replica identity for it.
ALTER TABLE lease.deferred_checks REPLICA IDENTITY FULL;

-- Lease calls in Rust (#13).
-- lease.renew, lease.release and lease.release_all are C functions
-- (src/lease_calls.rs): the same statements as saved plans, run as the
-- function's owner as SECURITY DEFINER ran them. CREATE OR REPLACE keeps
-- their owner, grants and comments.
CREATE OR REPLACE FUNCTION lease.renew(name text, owner text, token bigint, ttl_ms integer) RETURNS timestamptz
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_renew';
CREATE OR REPLACE FUNCTION lease.release(name text, owner text, token bigint) RETURNS boolean
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release';
CREATE OR REPLACE FUNCTION lease.release_all(owner text) RETURNS integer
    LANGUAGE C VOLATILE AS 'MODULE_PATHNAME', 'pg_lease_release_all';
