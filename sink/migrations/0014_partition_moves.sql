-- Moving a partition to another shard (issue 17, `mandatectl shards move`).
--
-- A shard owns a SET of partitions: mandated_meta.partitions lists it when
-- it is not one range (NULL: first_partition..last_partition, as before).
--
-- mandated_moves records, per partition, the moves that concern this
-- database: on the source, 'moving_out' (the epoch is bumped and nothing
-- of the partition is written here any more, the copy is under way),
-- 'moved_out' (the target holds it; the rows here are a read-only copy
-- until `mandatectl shards drop-moved`), 'dropped' (that copy is deleted;
-- the partition never comes back here except by a move in); on the target,
-- 'moved_in' (owned here, whatever the recorded set says). The row stays:
-- it is what keeps a process with an old shard map from writing the
-- partition where it no longer lives.
ALTER TABLE mandated_meta ADD COLUMN partitions integer[] CHECK (partitions IS NULL OR 0 <= ALL (partitions));

CREATE TABLE mandated_moves (
    partition  integer     PRIMARY KEY CHECK (partition >= 0),
    state      text        NOT NULL CHECK (state IN ('moving_out', 'moved_out', 'dropped', 'moved_in')),
    peer       text        NOT NULL, -- out: the shard it moved to; in: the shard it came from
    epoch      bigint      NOT NULL, -- the epoch the move fenced
    rows       bigint      NOT NULL DEFAULT 0, -- rows copied
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- mandated_owns(p) raises unless this database's shard owns partition p: a
-- partition moved away raises 'partition P moved to shard X' (SQLSTATE
-- MD001, which the processor reads as "reload the shard map and claim it
-- there"); a partition moved in is owned; otherwise the recorded set (or
-- range) decides, as in 0012.
CREATE OR REPLACE FUNCTION mandated_owns(p integer, lock_meta boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m  mandated_meta%ROWTYPE;
    mv mandated_moves%ROWTYPE;
BEGIN
    IF lock_meta THEN
        SELECT * INTO m FROM mandated_meta FOR SHARE;
    ELSE
        SELECT * INTO m FROM mandated_meta;
    END IF;
    SELECT * INTO mv FROM mandated_moves WHERE partition = p;
    IF FOUND THEN
        IF mv.state = 'moved_in' THEN
            RETURN;
        END IF;
        RAISE EXCEPTION 'mandated: partition % moved to shard % (epoch %, %): this copy is read-only', p, mv.peer, mv.epoch, mv.state
            USING ERRCODE = 'MD001', HINT = mv.peer;
    END IF;
    IF m.shard IS NULL THEN
        RETURN;
    END IF;
    IF m.partitions IS NOT NULL THEN
        IF NOT p = ANY (m.partitions) THEN
            RAISE EXCEPTION 'mandated: partition % does not belong to shard % (partitions %)', p, m.shard, m.partitions
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN;
    END IF;
    IF p < m.first_partition OR p > coalesce(m.last_partition, m.partition_count - 1) THEN
        RAISE EXCEPTION 'mandated: partition % does not belong to shard % (partitions %-%)', p, m.shard,
            m.first_partition, coalesce(m.last_partition, m.partition_count - 1)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- A terminal authorization never changes and no authorization is deleted,
-- except with the read-only copy of a partition that moved to another shard:
-- `mandatectl shards drop-moved` says so in its transaction (SET LOCAL
-- mandated.drop_moved = P, after checking P is recorded moved out here), and
-- the guard does not run for that partition's rows. A WHEN condition, not a
-- change of mandated_guard_terminal(), so later versions of that function
-- keep it; on every other update it costs one current_setting().
DROP TRIGGER authorizations_guard_terminal ON authorizations;
CREATE TRIGGER authorizations_guard_terminal BEFORE UPDATE OR DELETE ON authorizations
    FOR EACH ROW WHEN (current_setting('mandated.drop_moved', true) IS DISTINCT FROM OLD.partition::text)
    EXECUTE FUNCTION mandated_guard_terminal();
