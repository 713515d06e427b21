-- Changing the partition count (issue 17, `mandatectl repartition --to M`):
-- one transaction moves every mandate, with its authorizations, idempotency
-- keys and intents, to its home under the new count. Everywhere else a row's
-- partition never changes; the guards below let exactly that move through,
-- and nothing more:
--
--  * the transaction says it is the repartition (SET LOCAL
--    mandated.repartition = 'on') after recording the new count in
--    mandated_meta (locked FOR UPDATE for the whole transaction);
--  * a row may then change its partition column only, and only to
--    murmur2(org/mandate_id) % the recorded count: the same check the
--    home-partition guard makes on every insert;
--  * a terminal authorization, otherwise immutable, may change its
--    partition column and nothing else.

CREATE OR REPLACE FUNCTION mandated_guard_partition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    writer text := current_setting('mandated.partition', true);
    n integer;
BEGIN
    IF TG_OP = 'UPDATE' AND current_setting('mandated.repartition', true) = 'on' THEN
        SELECT partition_count INTO n FROM mandated_meta;
        IF NEW.partition <> mandated_home_partition(NEW.org || '/' || NEW.mandate_id, n) THEN
            RAISE EXCEPTION 'mandated: repartition may not move %/% to partition % (its home of % is %)', NEW.org, NEW.mandate_id,
                NEW.partition, n, mandated_home_partition(NEW.org || '/' || NEW.mandate_id, n)
                USING ERRCODE = 'check_violation';
        END IF;
        IF (to_jsonb(NEW) - 'partition') IS DISTINCT FROM (to_jsonb(OLD) - 'partition') THEN
            RAISE EXCEPTION 'mandated: repartition may change only the partition of %/%', NEW.org, NEW.mandate_id
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
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

CREATE OR REPLACE FUNCTION mandated_guard_terminal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('committed', 'cancelled', 'expired', 'revoked') THEN
        IF TG_OP = 'UPDATE' AND current_setting('mandated.repartition', true) = 'on'
            AND (to_jsonb(NEW) - 'partition') IS NOT DISTINCT FROM (to_jsonb(OLD) - 'partition') THEN
            RETURN NEW; -- moved to its new home partition (checked by mandated_guard_partition)
        END IF;
        RAISE EXCEPTION 'mandated: authorization %/% is % (terminal) and cannot change', OLD.mandate_id, OLD.authorization_id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'mandated: authorizations are never deleted'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

-- A mandate and its authorizations move in one transaction: the foreign key
-- that ties an authorization to its mandate's partition is checked at its
-- end (SET CONSTRAINTS ... DEFERRED), not after each of the two updates.
DO $$
DECLARE
    fk text;
BEGIN
    SELECT conname INTO STRICT fk FROM pg_constraint
    WHERE conrelid = 'authorizations'::regclass AND confrelid = 'mandates'::regclass AND contype = 'f';
    EXECUTE format('ALTER TABLE authorizations ALTER CONSTRAINT %I DEFERRABLE INITIALLY IMMEDIATE', fk);
    IF fk <> 'authorizations_mandate_partition_fkey' THEN
        EXECUTE format('ALTER TABLE authorizations RENAME CONSTRAINT %I TO authorizations_mandate_partition_fkey', fk);
    END IF;
END $$;

-- Every partition count change, for the operator and for a re-run after a
-- crash (the row is written in the transaction that moves the rows).
CREATE TABLE mandated_repartitions (
    from_count      integer     NOT NULL CHECK (from_count > 0),
    to_count        integer     NOT NULL PRIMARY KEY,
    mandates        bigint      NOT NULL,
    authorizations  bigint      NOT NULL,
    keys            bigint      NOT NULL,
    intents         bigint      NOT NULL,
    operator        text        NOT NULL DEFAULT '',
    done_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (to_count > from_count)
);
