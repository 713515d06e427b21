-- Recorded reads (issue 42 item 4, seed 003): a read-only tool's result
-- kept under its intent, returned again on every repeat. A record is an
-- authorization in the state 'recorded': terminal from its creation, it
-- holds the read's result, no amount (0, currency '') and never an
-- execution; it takes no use, so no counter of its mandate counts it.
-- Its intent lives in the intents table under the operation
-- 'record:<operation>', a scope no proposal can name.
--
-- The column checks of 0001 are replaced by named ones that say so. The
-- new checks only widen the old ones for 'recorded' rows, so the rows
-- already there satisfy them (PostgreSQL still scans the table once).
ALTER TABLE authorizations
    DROP CONSTRAINT authorizations_state_check,
    DROP CONSTRAINT authorizations_amount_check,
    DROP CONSTRAINT authorizations_currency_check,
    DROP CONSTRAINT result_only_when_committed,
    ADD CONSTRAINT authorizations_state_check
        CHECK (state IN ('reserved', 'executing', 'committed', 'cancelled', 'expired', 'revoked', 'in_doubt', 'recorded')),
    ADD CONSTRAINT amount_unless_recorded CHECK (CASE WHEN state = 'recorded'
        THEN amount = 0 AND currency = '' AND execution_token = 0 AND begin_key = '' AND external_ref = '' AND result IS NOT NULL
        ELSE amount > 0 AND currency ~ '^[A-Z]{3}$' END),
    ADD CONSTRAINT result_only_when_committed
        CHECK (result IS NULL OR (state IN ('committed', 'recorded') AND octet_length(result) <= 8192));

-- A recorded read never changes, as every terminal authorization: the
-- terminal guard (0015's function, 0038's WHEN condition) names it too.
CREATE OR REPLACE FUNCTION mandated_guard_terminal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('committed', 'cancelled', 'expired', 'revoked', 'recorded') THEN
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

DROP TRIGGER authorizations_guard_terminal ON authorizations;
CREATE TRIGGER authorizations_guard_terminal BEFORE UPDATE ON authorizations
    FOR EACH ROW WHEN (OLD.state IN ('committed', 'cancelled', 'expired', 'revoked', 'recorded')
        AND current_setting('mandated.drop_moved', true) IS DISTINCT FROM OLD.partition::text)
    EXECUTE FUNCTION mandated_guard_terminal();
