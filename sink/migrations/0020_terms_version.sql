-- Signed grants bound to the mandate's version (issue 23, item 7): a grant
-- names the mandate version it was based on, and is refused stale_grant
-- when the mandate's terms changed after it. terms_version is the version
-- the mandate's last grant made: a grant based on an older version is a
-- replay or did not see a newer grant. Rows granted before this migration
-- keep 0 (their next bound grant sets it).
--
-- Like the execution counter, it never goes back: a stale grant cannot be
-- made fresh again by any write. The execution guard of migration 0005
-- already runs on every mandate update, so it takes this check too rather
-- than a second trigger.
ALTER TABLE mandates ADD COLUMN terms_version bigint NOT NULL DEFAULT 0
    CONSTRAINT terms_version_within_version CHECK (terms_version >= 0 AND terms_version <= version);

CREATE OR REPLACE FUNCTION mandated_guard_execution() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'mandates' THEN
        IF NEW.executions < OLD.executions THEN
            RAISE EXCEPTION 'mandated: the execution counter of %/% cannot go back from % to %', NEW.org, NEW.mandate_id, OLD.executions, NEW.executions
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.terms_version < OLD.terms_version THEN
            RAISE EXCEPTION 'mandated: the terms version of %/% cannot go back from % to %', NEW.org, NEW.mandate_id, OLD.terms_version, NEW.terms_version
                USING ERRCODE = 'check_violation';
        END IF;
    ELSIF OLD.execution_token <> 0 AND (NEW.execution_token <> OLD.execution_token OR NEW.begin_key <> OLD.begin_key) THEN
        RAISE EXCEPTION 'mandated: the execution (token %, executor %) of %/% cannot change', OLD.execution_token, OLD.begin_key, OLD.mandate_id, OLD.authorization_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
