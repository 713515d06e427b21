-- Bearer tokens of the HTTP gateway (cmd/mandate-gateway), one org each.
-- Only the SHA-256 of a token is stored: a leaked table grants nothing.
-- mandatectl tokens create|revoke|list writes them; the gateway only reads.
CREATE TABLE gateway_tokens (
    token_id   text        PRIMARY KEY CHECK (token_id ~ '^gt_[a-z2-7]{16}$'),
    org        text        NOT NULL CHECK (org ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name       text        NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    token_hash bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CHECK (revoked_at IS NULL OR revoked_at >= created_at)
);
CREATE INDEX gateway_tokens_org ON gateway_tokens (org, created_at);
