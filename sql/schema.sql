-- pg_lease state. Everything lives in schema "lease" (the control file's schema).

-- One row per protected table: how its fence finds the current token.
CREATE TABLE lease.protected (
    relid              regclass    PRIMARY KEY,
    mode               text        NOT NULL CHECK (mode IN ('owner', 'high_water')),
    key_columns        text[]      NOT NULL CHECK (cardinality(key_columns) > 0),
    token_column       text,
    owner_table        regclass,
    owner_key_columns  text[],
    owner_token_column text,
    protected_at       timestamptz NOT NULL DEFAULT now(),
    protected_by       name        NOT NULL DEFAULT current_user,
    -- The fenced columns' types when protected (since 0.3.0): a retype would
    -- change what a resource is, so the DDL guard refuses it.
    key_types          regtype[],
    token_type         regtype,
    owner_key_types    regtype[],
    owner_token_type   regtype,
    -- Whether changes applied by logical replication are judged here too
    -- (since 0.7.0; NULL: the mode's default, judged in high-water mode
    -- only). Set with lease.judge_replicated.
    judge_replicated   boolean,
    CHECK ((mode = 'owner') = (owner_table IS NOT NULL)),
    CHECK (mode <> 'owner' OR cardinality(owner_key_columns) = cardinality(key_columns))
);
COMMENT ON TABLE lease.protected IS 'Tables fenced by pg_lease; change only through lease.protect*/lease.unprotect.';

-- High-water marks: the highest token ever accepted per (table, resource).
-- Never deleted by unprotect, so a mark cannot start over. `resource` holds
-- each key value in its canonical form (src/fence/identity.rs): equal values
-- of the key type have one form, whatever the session's settings.
CREATE TABLE lease.high_water (
    target     regclass    NOT NULL,
    resource   text[]      NOT NULL,
    token      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, resource)
);
COMMENT ON TABLE lease.high_water IS 'Highest fencing token accepted per resource of tables protected with lease.protect_high_water.';

-- Written only by lease.protect*/unprotect (through lease._register and
-- lease._unregister, which check the caller's ownership) and the DDL guards.
REVOKE ALL ON lease.protected, lease.high_water FROM PUBLIC;
GRANT SELECT ON lease.protected TO PUBLIC;

-- pg_dump carries this state with the database (pg_restore recreates the
-- extension empty, then loads these rows).
SELECT pg_catalog.pg_extension_config_dump('lease.protected', '');
SELECT pg_catalog.pg_extension_config_dump('lease.high_water', '');
