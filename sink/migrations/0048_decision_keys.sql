-- Decision signatures (issue 40): the public keys of the deployment that
-- sign every record mandated publishes (decisions and dead letters), over
-- the record's chain hash (wire/decisionsig.go). The private key is
-- mandated's (--decision-signing-key-file); a Kafka credential cannot sign.
--
-- key_id is derived from the public key (the first 8 bytes of its SHA-256,
-- hex), so one key has one id everywhere. Rotation: register the next key
-- (valid_from), give it to mandated, set the old key's valid_until. Rows
-- are never deleted: the records an old key signed keep verifying. A key
-- revoked (it leaked) does not count for records made at or after
-- revoked_at.
CREATE TABLE decision_keys (
    key_id      text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    alg         text        NOT NULL DEFAULT 'ed25519' CHECK (alg = 'ed25519'),
    public_key  bytea       NOT NULL UNIQUE CHECK (length(public_key) = 32),
    valid_from  timestamptz NOT NULL,
    valid_until timestamptz,
    revoked_at  timestamptz,
    note        text        NOT NULL DEFAULT '' CHECK (length(note) <= 512),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (valid_until IS NULL OR valid_until > valid_from)
);

-- A key's public half never changes under its id.
CREATE FUNCTION decision_keys_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key_id <> OLD.key_id OR NEW.public_key <> OLD.public_key OR NEW.alg <> OLD.alg THEN
        RAISE EXCEPTION 'mandated: a decision key''s id and public key never change (key %)', OLD.key_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER decision_keys_immutable BEFORE UPDATE ON decision_keys
    FOR EACH ROW EXECUTE FUNCTION decision_keys_immutable();

-- Like the grantor keys, the deployment's keys live on the control shard.
CREATE TRIGGER decision_keys_guard_control BEFORE INSERT OR UPDATE ON decision_keys
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
