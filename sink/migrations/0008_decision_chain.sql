-- The decision chain (README, "The decision chain"): every record mandated
-- publishes for a partition carries the hash of the partition's previous
-- record. The head of each partition's chain lives with its fence, so the
-- single writer reads it in the batch transaction under the partition lock
-- and a new owner (another epoch) continues the chain where it stands.

-- The anchor: the prev_hash of the first chained record after sequence
-- `after`, SHA-256 of "mandated/chain/v1/partition/<p>/after/<after>"
-- (wire.Anchor computes the same).
CREATE FUNCTION mandated_chain_anchor(p integer, after bigint) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT sha256(convert_to(format('mandated/chain/v1/partition/%s/after/%s', p, after), 'UTF8'))
$$;

-- Where each partition's chain starts: recorded once, never changed.
CREATE TABLE chain_anchors (
    partition   integer PRIMARY KEY CHECK (partition >= 0),
    after_seq   bigint  NOT NULL CHECK (after_seq >= 0),
    anchor_hash bytea   NOT NULL CHECK (length(anchor_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- head_hash is the hash of record next_seq - 1 (or the anchor).
ALTER TABLE mandated_partitions ADD COLUMN head_hash bytea CHECK (length(head_hash) = 32);

-- Partitions that already have decisions: their chain starts after what
-- they have written so far.
INSERT INTO chain_anchors (partition, after_seq, anchor_hash)
SELECT partition, next_seq - 1, mandated_chain_anchor(partition, next_seq - 1) FROM mandated_partitions;
UPDATE mandated_partitions SET head_hash = mandated_chain_anchor(partition, next_seq - 1);
ALTER TABLE mandated_partitions ALTER COLUMN head_hash SET NOT NULL;

-- A partition claimed for the first time starts its chain at its anchor.
CREATE FUNCTION mandated_chain_start() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.head_hash IS NULL THEN
        NEW.head_hash := mandated_chain_anchor(NEW.partition, NEW.next_seq - 1);
        INSERT INTO chain_anchors (partition, after_seq, anchor_hash)
        VALUES (NEW.partition, NEW.next_seq - 1, NEW.head_hash)
        ON CONFLICT (partition) DO NOTHING;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER mandated_partitions_chain_start BEFORE INSERT ON mandated_partitions
    FOR EACH ROW EXECUTE FUNCTION mandated_chain_start();

-- Each outbox row keeps its chain members: a dead letter's go in its
-- headers, and a parked row keeps them for verify. NULL on rows written
-- before the chain.
ALTER TABLE outbox ADD COLUMN prev_hash bytea CHECK (length(prev_hash) = 32),
                   ADD COLUMN hash bytea CHECK (length(hash) = 32);
ALTER TABLE outbox_parked ADD COLUMN prev_hash bytea, ADD COLUMN hash bytea;
