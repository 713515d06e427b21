-- Operator tokens of the gateway's console (/console, issue 28): another
-- kind of token than the API's (gateway_tokens). An operator token acts
-- for the deployment, not for an org: it reads every org's in-doubt
-- executions and mandates and sends resolves to the grants topic. The
-- console takes only these ("mop_" tokens, this table), the API only
-- gateway_tokens ("mgw_"): neither kind opens the other's door. Only the
-- SHA-256 of a token is stored. mandatectl tokens create --operator writes
-- them; the gateway only reads. Org-level rows live on the control shard.
CREATE TABLE operator_tokens (
    token_id   text        PRIMARY KEY CHECK (token_id ~ '^ot_[a-z2-7]{16}$'),
    name       text        NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    token_hash bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CHECK (revoked_at IS NULL OR revoked_at >= created_at)
);
CREATE TRIGGER operator_tokens_guard_control BEFORE INSERT OR UPDATE ON operator_tokens
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
