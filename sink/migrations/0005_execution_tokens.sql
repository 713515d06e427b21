-- The executor boundary (issue 12): one winner per authorization, fenced by
-- an execution token that is monotonic per mandate, and the winner's result
-- recorded for every later caller.
--
-- mandates.executions is the last token handed out on the mandate. An
-- authorization's execution_token is 0 until a begin wins (rows begun before
-- this migration keep 0 and are committed without a token, as before);
-- begin_key now holds the winning executor's id. result is the winning
-- commit's result, a compact JSON object of at most 8 KiB, as the decoder
-- re-encoded it (text, not jsonb, so every later answer carries the same
-- bytes). resolved marks an execution settled by reconciliation: its
-- executor's token acts no more.
ALTER TABLE mandates ADD COLUMN executions bigint NOT NULL DEFAULT 0 CHECK (executions >= 0);

ALTER TABLE authorizations
    ADD COLUMN execution_token bigint NOT NULL DEFAULT 0 CHECK (execution_token >= 0),
    ADD COLUMN result text,
    ADD COLUMN resolved boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT result_only_when_committed CHECK (result IS NULL OR (state = 'committed' AND octet_length(result) <= 8192));

-- Once handed out, an execution token and its executor never change, and a
-- mandate's counter never goes back: a stale executor cannot be made current
-- by any write.
CREATE FUNCTION mandated_guard_execution() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'mandates' THEN
        IF NEW.executions < OLD.executions THEN
            RAISE EXCEPTION 'mandated: the execution counter of %/% cannot go back from % to %', NEW.org, NEW.mandate_id, OLD.executions, NEW.executions
                USING ERRCODE = 'check_violation';
        END IF;
    ELSIF OLD.execution_token <> 0 AND (NEW.execution_token <> OLD.execution_token OR NEW.begin_key <> OLD.begin_key) THEN
        RAISE EXCEPTION 'mandated: the execution (token %, executor %) of %/% cannot change', OLD.execution_token, OLD.begin_key, OLD.mandate_id, OLD.authorization_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER mandates_guard_execution BEFORE UPDATE ON mandates
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_execution();
CREATE TRIGGER authorizations_guard_execution BEFORE UPDATE ON authorizations
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_execution();
