-- pg_lease's own tables hold this node's state: protections, high-water
-- marks, leases and their tokens, the audit. None of it may come from another
-- node (since 0.7.0). A `FOR ALL TABLES` publication publishes these tables
-- too; on a subscriber, the changes its logical replication workers apply to
-- them are skipped (ENABLE REPLICA row triggers: they fire only where
-- session_replication_role is replica, which is what those workers run in,
-- and lease._local_state() skips only a real worker's own changes). The two
-- tables renewals and heartbeats update, lease.lease_state and
-- lease.session_state, take no BEFORE UPDATE trigger (it would lock every
-- renewed row once more): a replicated UPDATE finds no row there unless this
-- node holds one of the same name (it took a lease or session under it, or
-- a pg_createsubscriber conversion copied it), and then its AFTER UPDATE
-- trigger writes the old row back, which skips the change. TRUNCATE, which no row trigger
-- sees and a publication replicates as is, is refused on every one of them.
CREATE FUNCTION lease._local_state() RETURNS trigger
    LANGUAGE C AS 'MODULE_PATHNAME', 'pg_lease_local_state';
COMMENT ON FUNCTION lease._local_state() IS
    'Keeps pg_lease''s own tables local: skips replicated changes, refuses TRUNCATE (internal).';
REVOKE EXECUTE ON FUNCTION lease._local_state() FROM PUBLIC;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['protected', 'high_water', 'rejected_writes', 'lost_leases', 'token_epoch',
                             'token_epoch_issued', 'token_origin', 'deferred_checks', 'lease_state', 'session_state'] LOOP
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
