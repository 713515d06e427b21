-- Request records of the HTTP gateway (issue 24). The gateway produces a
-- command with its request's nonce in the Kafka header mandated-request;
-- the processor keeps the decision answering that record here, in the
-- batch transaction that decides it, so any gateway instance can answer
-- the request's status URL with that request's own decision (not the
-- idempotency key's or the authorization's), for the org's retention.
-- Records without the header (the Go client, any other producer) cost
-- nothing here.
CREATE TABLE request_answers (
    request_id       text        PRIMARY KEY CHECK (request_id ~ '^[a-z0-9]{16,64}$'),
    partition        integer     NOT NULL, -- the partition that decided it: its shard holds the row
    org              text        NOT NULL,
    mandate_id       text        NOT NULL,
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL CHECK (source_offset >= 0),
    decision_id      text        NOT NULL,
    decision         bytea       NOT NULL, -- the decision as published
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
CREATE INDEX request_answers_expiry ON request_answers (partition, expires_at);

