-- Signed grants (issue 18): the public keys grantors sign grant, revoke and
-- resolve commands with, per org, and each org's signing policy.

-- A grantor key. Rotation: add the new key with a valid_from, move
-- grantors to it, set the old key's valid_until (or revoke it). Rows are
-- never deleted, so a decision's signed_by always names a key on record.
CREATE TABLE grantor_keys (
    org         text        NOT NULL CHECK (org ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    key_id      text        NOT NULL CHECK (key_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    alg         text        NOT NULL DEFAULT 'ed25519' CHECK (alg = 'ed25519'),
    public_key  bytea       NOT NULL CHECK (length(public_key) = 32),
    valid_from  timestamptz NOT NULL,
    valid_until timestamptz,
    revoked_at  timestamptz,
    note        text        NOT NULL DEFAULT '' CHECK (length(note) <= 512),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, key_id),
    CHECK (valid_until IS NULL OR valid_until > valid_from)
);

-- The org setting grant_signing: 'required' refuses unsigned grantor
-- commands; 'off' (the default, also for an org without a row) accepts them,
-- and still verifies a signature that is present.
CREATE TABLE org_grant_signing (
    org        text        PRIMARY KEY CHECK (org ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    mode       text        NOT NULL CHECK (mode IN ('off', 'required')),
    updated_at timestamptz NOT NULL DEFAULT now()
);
