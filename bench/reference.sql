-- What a competent user would write instead of pg_lease: a PL/pgSQL fence
-- with the same semantics, and PL/pgSQL leases over a table and a sequence.

-- The fence: lock the owner row FOR SHARE, compare, raise with the same SQLSTATEs.
CREATE FUNCTION plpgsql_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cur bigint;
BEGIN
    IF NEW.fencing_token IS NULL THEN
        RAISE EXCEPTION 'MissingFencingToken' USING ERRCODE = 'LF003';
    END IF;
    SELECT owner_fencing_token INTO cur FROM tables WHERE id = NEW.table_id FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'FenceOwnerMissing' USING ERRCODE = 'LF007';
    END IF;
    IF NEW.fencing_token < cur THEN
        RAISE EXCEPTION 'StaleOwnerBoundaryWrite: token % < %', NEW.fencing_token, cur USING ERRCODE = 'LF001';
    ELSIF NEW.fencing_token > cur THEN
        RAISE EXCEPTION 'FencingTokenAhead: token % > %', NEW.fencing_token, cur USING ERRCODE = 'LF002';
    END IF;
    RETURN NEW;
END $$;

-- Leases: a row per lease, tokens from a sequence, expiry on the server clock.
CREATE TABLE leases (
    name          text PRIMARY KEY,
    owner_id      text,
    expires_at    timestamptz,
    fencing_token bigint
);
CREATE SEQUENCE lease_tokens;

CREATE FUNCTION pl_acquire(p_name text, p_owner text, p_ttl_ms int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    tok bigint;
BEGIN
    INSERT INTO leases (name) VALUES (p_name) ON CONFLICT DO NOTHING;
    UPDATE leases SET owner_id = p_owner, expires_at = clock_timestamp() + p_ttl_ms * interval '1 ms',
                      fencing_token = nextval('lease_tokens')
     WHERE name = p_name AND (owner_id IS NULL OR owner_id = p_owner OR expires_at <= clock_timestamp())
    RETURNING fencing_token INTO tok;
    IF tok IS NULL THEN
        RAISE EXCEPTION 'LeaseOwnedElsewhere' USING ERRCODE = 'LF005';
    END IF;
    RETURN tok;
END $$;

CREATE FUNCTION pl_renew(p_name text, p_owner text, p_token bigint, p_ttl_ms int) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    exp timestamptz;
BEGIN
    UPDATE leases SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 ms'
     WHERE name = p_name AND owner_id = p_owner AND fencing_token = p_token AND expires_at > clock_timestamp()
    RETURNING expires_at INTO exp;
    IF exp IS NULL THEN
        RAISE EXCEPTION 'LeaseLost' USING ERRCODE = 'LF006';
    END IF;
    RETURN exp;
END $$;

CREATE FUNCTION pl_release(p_name text, p_owner text, p_token bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE leases SET owner_id = NULL, expires_at = NULL
     WHERE name = p_name AND owner_id = p_owner AND fencing_token = p_token;
    RETURN FOUND;
END $$;

-- The least any lease store on Postgres writes for a cycle (context for the
-- acquire + release row, no checks at all): a row per name upserted with a
-- token from a sequence, then marked released, each its own transaction.
CREATE TABLE min_leases (name text PRIMARY KEY, owner_id text, fencing_token bigint, released boolean);
CREATE SEQUENCE min_tokens;
