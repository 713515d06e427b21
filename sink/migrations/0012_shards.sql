-- Shards (issue 17): partitions mapped to databases. Each database records
-- which shard it is and which partitions it owns, next to the partition
-- count; a partition outside that range never claims, commits or relays
-- here, whatever the process writing believes its shard map says.
--
-- A database set up before shards (or run with one --database-url) is the
-- shard "main", owning every partition (last_partition NULL: to the end),
-- and the control shard.
ALTER TABLE mandated_meta
    ADD COLUMN shard           text    NOT NULL DEFAULT 'main' CHECK (shard ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    ADD COLUMN first_partition integer NOT NULL DEFAULT 0 CHECK (first_partition >= 0),
    ADD COLUMN last_partition  integer,
    ADD COLUMN control         boolean NOT NULL DEFAULT true,
    ADD CONSTRAINT shard_range CHECK (last_partition IS NULL OR (last_partition >= first_partition AND last_partition < partition_count));

-- mandated_owns(p) raises unless this database's shard owns partition p.
-- With no mandated_meta row yet (no processor has started) nothing is
-- recorded and every partition passes, as before shards. lock_meta takes a
-- share lock on the row, so a change of the range (which locks it for
-- update and checks the partitions it gives up have no rows) cannot race
-- a first claim.
CREATE FUNCTION mandated_owns(p integer, lock_meta boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m mandated_meta%ROWTYPE;
BEGIN
    IF lock_meta THEN
        SELECT * INTO m FROM mandated_meta FOR SHARE;
    ELSE
        SELECT * INTO m FROM mandated_meta;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p < m.first_partition OR p > coalesce(m.last_partition, m.partition_count - 1) THEN
        RAISE EXCEPTION 'mandated: partition % does not belong to shard % (partitions %-%)', p, m.shard,
            m.first_partition, coalesce(m.last_partition, m.partition_count - 1)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- The fence: a claim (insert or epoch bump) and every batch's advance
-- update the partition row, so a partition this shard does not own can
-- neither claim nor commit here (a batch's mandates, authorizations, keys
-- and outbox rows are written in the transaction that advances it); its
-- relay cannot record progress here either.
CREATE FUNCTION mandated_guard_shard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME <> 'mandated_partitions' THEN
        PERFORM mandated_owns(NEW.partition, false);
    ELSIF TG_OP = 'INSERT' THEN
        PERFORM mandated_owns(NEW.partition, true);
    ELSE
        PERFORM mandated_owns(NEW.partition, NEW.epoch <> OLD.epoch);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER mandated_partitions_guard_shard BEFORE INSERT OR UPDATE ON mandated_partitions
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_shard();
CREATE TRIGGER relay_progress_guard_shard BEFORE INSERT OR UPDATE ON relay_progress
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_shard();

-- Org settings live on the control shard only, so every partition reads one
-- truth; another shard refuses them.
CREATE FUNCTION mandated_guard_control() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    m mandated_meta%ROWTYPE;
BEGIN
    SELECT * INTO m FROM mandated_meta;
    IF FOUND AND NOT m.control THEN
        RAISE EXCEPTION 'mandated: % is an org setting and lives on the control shard; this is shard %', TG_TABLE_NAME, m.shard
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER org_settings_guard_control BEFORE INSERT OR UPDATE ON org_settings
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
CREATE TRIGGER grantor_keys_guard_control BEFORE INSERT OR UPDATE ON grantor_keys
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
CREATE TRIGGER org_grant_signing_guard_control BEFORE INSERT OR UPDATE ON org_grant_signing
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
CREATE TRIGGER gateway_tokens_guard_control BEFORE INSERT OR UPDATE ON gateway_tokens
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
