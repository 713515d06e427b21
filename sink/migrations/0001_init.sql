-- mandated schema, version 1.
-- The invariants live here as well as in the Go state machine: if the code
-- ever tried to overspend a mandate, change a terminal authorization or write
-- a mandate from a partition that is not its home, PostgreSQL refuses.

CREATE TABLE mandated_meta (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer NOT NULL CHECK (partition_count > 0),
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per Kafka partition: who owns it (epoch), how far it has been
-- consumed (the source of truth for progress, not Kafka's group offsets) and
-- the next outbox sequence.
CREATE TABLE mandated_partitions (
    partition        integer PRIMARY KEY CHECK (partition >= 0),
    epoch            bigint  NOT NULL CHECK (epoch > 0),
    owner            text    NOT NULL,
    proposals_offset bigint  NOT NULL DEFAULT 0 CHECK (proposals_offset >= 0),
    grants_offset    bigint  NOT NULL DEFAULT 0 CHECK (grants_offset >= 0),
    next_seq         bigint  NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    claimed_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Kafka's default partitioner (murmur2, toPositive, modulo), in SQL, so the
-- database itself can refuse a mandate row on a partition that is not its
-- home. Agrees with partitioner.Murmur2 (tested against the same vectors).
CREATE FUNCTION mandated_murmur2(data bytea) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    m   constant bigint := 1540483477;            -- 0x5bd1e995
    len integer := length(data);
    h   bigint := (2538058380 # len) & 4294967295; -- seed 0x9747b28c
    k   bigint;
    i   integer := 0;
    n4  integer := (len / 4) * 4;
    rem integer := len % 4;
BEGIN
    WHILE i < n4 LOOP
        k := get_byte(data, i)::bigint
           | (get_byte(data, i + 1)::bigint << 8)
           | (get_byte(data, i + 2)::bigint << 16)
           | (get_byte(data, i + 3)::bigint << 24);
        k := (k * m) & 4294967295;
        k := k # (k >> 24);
        k := (k * m) & 4294967295;
        h := (h * m) & 4294967295;
        h := h # k;
        i := i + 4;
    END LOOP;
    IF rem = 3 THEN h := h # (get_byte(data, n4 + 2)::bigint << 16); END IF;
    IF rem >= 2 THEN h := h # (get_byte(data, n4 + 1)::bigint << 8); END IF;
    IF rem >= 1 THEN
        h := h # get_byte(data, n4)::bigint;
        h := (h * m) & 4294967295;
    END IF;
    h := h # (h >> 13);
    h := (h * m) & 4294967295;
    h := h # (h >> 15);
    IF h >= 2147483648 THEN h := h - 4294967296; END IF;
    RETURN h::integer;
END $$;

CREATE FUNCTION mandated_home_partition(mandate_key text, partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT (mandated_murmur2(convert_to(mandate_key, 'UTF8')) & 2147483647) % partitions
$$;

CREATE TABLE mandates (
    org                  text    NOT NULL,
    mandate_id           text    NOT NULL,
    partition            integer NOT NULL,
    version              bigint  NOT NULL CHECK (version > 0),
    status               text    NOT NULL CHECK (status IN ('active', 'revoked')),
    operations           text[]  NOT NULL CHECK (cardinality(operations) > 0),
    targets              text[]  NOT NULL,
    currency             text    NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    max_amount           bigint  NOT NULL CHECK (max_amount > 0),
    total_limit          bigint  CHECK (total_limit > 0),
    uses_allowed         bigint  NOT NULL CHECK (uses_allowed > 0),
    uses_held            bigint  NOT NULL CHECK (uses_held >= 0),
    uses_spent           bigint  NOT NULL CHECK (uses_spent >= 0),
    uses_in_doubt        bigint  NOT NULL CHECK (uses_in_doubt >= 0),
    amount_held          bigint  NOT NULL CHECK (amount_held >= 0),
    amount_spent         bigint  NOT NULL CHECK (amount_spent >= 0),
    valid_from           timestamptz,
    valid_until          timestamptz,
    release_on_cancel    boolean NOT NULL,
    hold_window_ms       bigint  NOT NULL CHECK (hold_window_ms > 0),
    execution_timeout_ms bigint  NOT NULL CHECK (execution_timeout_ms > 0),
    last_authorization_id text,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    PRIMARY KEY (org, mandate_id),
    UNIQUE (org, mandate_id, partition),
    CONSTRAINT mandate_uses_within_grant CHECK (uses_held + uses_spent <= uses_allowed),
    CONSTRAINT mandate_in_doubt_within_held CHECK (uses_in_doubt <= uses_held),
    CONSTRAINT mandate_amount_within_limit CHECK (total_limit IS NULL OR amount_held + amount_spent <= total_limit)
);

CREATE TABLE authorizations (
    org                text    NOT NULL,
    mandate_id         text    NOT NULL,
    authorization_id   text    NOT NULL,
    partition          integer NOT NULL,
    state              text    NOT NULL CHECK (state IN ('reserved', 'executing', 'committed', 'cancelled', 'expired', 'revoked', 'in_doubt')),
    version            bigint  NOT NULL CHECK (version > 0),
    operation          text    NOT NULL,
    target             text    NOT NULL,
    amount             bigint  NOT NULL CHECK (amount > 0),
    currency           text    NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    idempotency_key    text    NOT NULL,
    mandate_version    bigint  NOT NULL,
    deadline           timestamptz NOT NULL,
    execution_deadline timestamptz,
    begin_key          text    NOT NULL DEFAULT '',
    external_ref       text    NOT NULL DEFAULT '',
    detail             text    NOT NULL DEFAULT '',
    decision_id        text    NOT NULL,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    PRIMARY KEY (org, mandate_id, authorization_id),
    FOREIGN KEY (org, mandate_id, partition) REFERENCES mandates (org, mandate_id, partition),
    CONSTRAINT committed_has_external_ref CHECK (state <> 'committed' OR external_ref <> ''),
    CONSTRAINT executing_has_deadline CHECK (state NOT IN ('executing', 'in_doubt') OR execution_deadline IS NOT NULL)
);
CREATE INDEX authorizations_reserved_deadline ON authorizations (partition, deadline) WHERE state = 'reserved';
CREATE INDEX authorizations_executing_deadline ON authorizations (partition, execution_deadline) WHERE state = 'executing';
CREATE INDEX authorizations_held ON authorizations (org, mandate_id, state) WHERE state IN ('reserved', 'in_doubt');
CREATE INDEX authorizations_in_doubt ON authorizations (partition, updated_at) WHERE state = 'in_doubt';

-- Writes to mandate state come only from the owner of the mandate's home
-- partition: the batch transaction says which partition it writes for
-- (SET LOCAL mandated.partition), and a row for another partition, or a
-- mandate row whose partition is not murmur2(key) % partition_count, is
-- refused.
CREATE FUNCTION mandated_guard_partition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    writer text := current_setting('mandated.partition', true);
    n integer;
BEGIN
    IF writer IS NULL OR writer = '' THEN
        RAISE EXCEPTION 'mandated: % of %.% outside a partition batch (mandated.partition is not set)', TG_OP, NEW.org, NEW.mandate_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.partition <> writer::integer THEN
        RAISE EXCEPTION 'mandated: partition % may not write %/% (its partition is %)', writer, NEW.org, NEW.mandate_id, NEW.partition
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.partition <> OLD.partition THEN
        RAISE EXCEPTION 'mandated: the partition of %/% cannot change', NEW.org, NEW.mandate_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_TABLE_NAME = 'mandates' AND TG_OP = 'INSERT' THEN
        SELECT partition_count INTO n FROM mandated_meta;
        IF n IS NULL OR NEW.partition <> mandated_home_partition(NEW.org || '/' || NEW.mandate_id, n) THEN
            RAISE EXCEPTION 'mandated: %/% is not at home on partition % of %', NEW.org, NEW.mandate_id, NEW.partition, n
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER mandates_guard_partition BEFORE INSERT OR UPDATE ON mandates
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_partition();
CREATE TRIGGER authorizations_guard_partition BEFORE INSERT OR UPDATE ON authorizations
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_partition();

-- A terminal authorization never changes and is never deleted.
CREATE FUNCTION mandated_guard_terminal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('committed', 'cancelled', 'expired', 'revoked') THEN
        RAISE EXCEPTION 'mandated: authorization %/% is % (terminal) and cannot change', OLD.mandate_id, OLD.authorization_id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mandated: authorizations are never deleted'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER authorizations_guard_terminal BEFORE UPDATE OR DELETE ON authorizations
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_terminal();

-- An idempotency key is bound to the first decision about its intent.
CREATE TABLE idempotency_keys (
    org              text    NOT NULL,
    operation        text    NOT NULL,
    idempotency_key  text    NOT NULL,
    fingerprint      bytea   NOT NULL CHECK (length(fingerprint) = 32),
    mandate_id       text    NOT NULL,
    partition        integer NOT NULL,
    authorization_id text    NOT NULL DEFAULT '',
    decision_id      text    NOT NULL,
    outcome          text    NOT NULL,
    reason           text    NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (org, operation, idempotency_key),
    CHECK (expires_at > created_at)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (partition, expires_at);

-- Per-org idempotency retention; orgs without a row use the configured default.
CREATE TABLE org_settings (
    org                   text PRIMARY KEY,
    idempotency_retention interval NOT NULL CHECK (idempotency_retention >= interval '1 hour')
);

-- The transactional outbox: decisions (kind 0) and dead letters (kind 1),
-- one gapless sequence per partition, written in the batch transaction.
CREATE TABLE outbox (
    partition        integer  NOT NULL,
    seq              bigint   NOT NULL CHECK (seq > 0),
    epoch            bigint   NOT NULL,
    kind             smallint NOT NULL CHECK (kind IN (0, 1)),
    record_key       bytea,
    payload          bytea    NOT NULL,
    reason           text     NOT NULL DEFAULT '',
    detail           text     NOT NULL DEFAULT '',
    source_topic     text     NOT NULL DEFAULT '',
    source_partition integer  NOT NULL DEFAULT -1,
    source_offset    bigint   NOT NULL DEFAULT -1,
    created_at       timestamptz NOT NULL,
    PRIMARY KEY (partition, seq)
);

-- How far the relay has published each partition (housekeeping deletes
-- outbox rows at or below it). The decisions topic itself is the authority
-- the relay resumes from; this row is its lower bound.
CREATE TABLE relay_progress (
    partition     integer PRIMARY KEY,
    published_seq bigint  NOT NULL DEFAULT 0 CHECK (published_seq >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Outbox rows the broker refused for good (too large, invalid): parked with
-- the reason so the rest of the partition keeps flowing.
CREATE TABLE outbox_parked (
    partition  integer NOT NULL,
    seq        bigint  NOT NULL,
    epoch      bigint  NOT NULL,
    kind       smallint NOT NULL,
    record_key bytea,
    payload    bytea   NOT NULL,
    reason     text    NOT NULL,
    created_at timestamptz NOT NULL,
    original   jsonb   NOT NULL DEFAULT '{}',
    parked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, seq)
);
