-- Intents (issue 13): an action of a workflow run, named by the
-- orchestrator's stable facts (run_id, step, action), bound like an
-- idempotency key (scoped by org and operation) to the first authorization
-- it produced. head_* is that authorization or the latest fork that
-- superseded it; every other authorization of the lineage is terminal.
CREATE TABLE intents (
    org                   text        NOT NULL,
    operation             text        NOT NULL,
    run_id                text        NOT NULL,
    step                  text        NOT NULL,
    action                text        NOT NULL,
    mandate_id            text        NOT NULL,
    authorization_id      text        NOT NULL,
    decision_id           text        NOT NULL,
    head_mandate_id       text        NOT NULL,
    head_authorization_id text        NOT NULL,
    partition             integer     NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    PRIMARY KEY (org, operation, run_id, step, action),
    CHECK (expires_at > created_at)
);
CREATE INDEX intents_expiry ON intents (partition, expires_at);

-- A fork names the authorization of its intent it superseded.
ALTER TABLE authorizations ADD COLUMN fork_of text NOT NULL DEFAULT '';

-- Possible replays without intents: the recent authorizations of a mandate.
-- Only immutable columns, so transitions stay HOT updates.
CREATE INDEX authorizations_recent ON authorizations (org, mandate_id, created_at);

-- Per-org possible-replay window and policy (NULL window: off). An org may
-- set them without overriding its idempotency retention.
ALTER TABLE org_settings ALTER COLUMN idempotency_retention DROP NOT NULL;
ALTER TABLE org_settings
    ADD COLUMN replay_window interval CHECK (replay_window > interval '0'),
    ADD COLUMN replay_policy text NOT NULL DEFAULT 'deny' CHECK (replay_policy IN ('deny', 'flag'));
