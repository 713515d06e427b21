-- The row guards run their PL/pgSQL only for a row that breaks their rule
-- (issue 26). A WHEN condition is evaluated by the executor itself, without
-- calling the function; before this, every authorization a batch inserted
-- and every mandate it updated called mandated_guard_partition (and each
-- update mandated_guard_execution, each authorization update
-- mandated_guard_terminal), a PL/pgSQL call per row per guard, to find
-- nothing wrong. The functions are unchanged and decide as before: they
-- now run exactly when a row would be refused, or needs their repartition
-- rules (a row whose partition changes). What each guard refuses is what it
-- refused.

-- The partition guard: a row for a partition the transaction did not
-- declare (mandated.partition), or whose partition changes. A new mandate
-- is always checked: its home partition is murmur2(key) % the count (a
-- grant that creates a mandate is rare; the hash is worth its cost there).
--
-- mandated.partition may now name several partitions, comma-separated: a
-- merged group commit writes the rows of several partitions in one
-- statement, each after its own partition's fence, and declares them all.
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
    IF NOT (NEW.partition::text = ANY (string_to_array(writer, ','))) THEN
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

DROP TRIGGER mandates_guard_partition ON mandates;
DROP TRIGGER authorizations_guard_partition ON authorizations;
CREATE TRIGGER mandates_guard_partition BEFORE INSERT ON mandates
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_partition();
CREATE TRIGGER mandates_guard_partition_update BEFORE UPDATE ON mandates
    FOR EACH ROW WHEN (NEW.partition IS DISTINCT FROM OLD.partition
        OR NOT coalesce(NEW.partition::text = ANY (string_to_array(current_setting('mandated.partition', true), ',')), false))
    EXECUTE FUNCTION mandated_guard_partition();
CREATE TRIGGER authorizations_guard_partition BEFORE INSERT ON authorizations
    FOR EACH ROW WHEN (NOT coalesce(NEW.partition::text = ANY (string_to_array(current_setting('mandated.partition', true), ',')), false))
    EXECUTE FUNCTION mandated_guard_partition();
CREATE TRIGGER authorizations_guard_partition_update BEFORE UPDATE ON authorizations
    FOR EACH ROW WHEN (NEW.partition IS DISTINCT FROM OLD.partition
        OR NOT coalesce(NEW.partition::text = ANY (string_to_array(current_setting('mandated.partition', true), ',')), false))
    EXECUTE FUNCTION mandated_guard_partition();

-- The execution guard: a mandate's execution counter or terms version
-- (migration 0020) going back, a token or its executor changing once set.
DROP TRIGGER mandates_guard_execution ON mandates;
DROP TRIGGER authorizations_guard_execution ON authorizations;
CREATE TRIGGER mandates_guard_execution BEFORE UPDATE ON mandates
    FOR EACH ROW WHEN (NEW.executions < OLD.executions OR NEW.terms_version < OLD.terms_version)
    EXECUTE FUNCTION mandated_guard_execution();
CREATE TRIGGER authorizations_guard_execution BEFORE UPDATE ON authorizations
    FOR EACH ROW WHEN (OLD.execution_token <> 0
        AND (NEW.execution_token <> OLD.execution_token OR NEW.begin_key <> OLD.begin_key))
    EXECUTE FUNCTION mandated_guard_execution();

-- The terminal guard: an update of a terminal authorization, any delete
-- (both except the rows of a partition `shards drop-moved` drops, as
-- migration 0014 made it).
DROP TRIGGER authorizations_guard_terminal ON authorizations;
CREATE TRIGGER authorizations_guard_terminal BEFORE UPDATE ON authorizations
    FOR EACH ROW WHEN (OLD.state IN ('committed', 'cancelled', 'expired', 'revoked')
        AND current_setting('mandated.drop_moved', true) IS DISTINCT FROM OLD.partition::text)
    EXECUTE FUNCTION mandated_guard_terminal();
CREATE TRIGGER authorizations_guard_terminal_delete BEFORE DELETE ON authorizations
    FOR EACH ROW WHEN (current_setting('mandated.drop_moved', true) IS DISTINCT FROM OLD.partition::text)
    EXECUTE FUNCTION mandated_guard_terminal();
