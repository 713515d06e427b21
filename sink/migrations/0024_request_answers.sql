-- Request records of the HTTP gateway (issue 24). The gateway produces a
-- command with its request's nonce in the Kafka header mandated-request;
-- the processor keeps the decision answering that record here, in the
-- batch transaction that decides it, so any gateway instance can answer
-- the request's status URL with that request's own decision (not the
-- idempotency key's or the authorization's), for the org's retention.
-- Records without the header (the Go client, any other producer) cost
-- nothing here.
--
-- Keyed by the record's position on the proposals topic (the request id
-- names it): a record is decided once, and positions grow per partition,
-- so the key is appended to like the outbox's, not scattered like a
-- random id's would be. The nonce's grammar is the processor's
-- (wire.ValidRequestID); the database checks its length only: a regular
-- expression CHECK doubled the cost of the insert (pgbench, 500 rows of
-- 1.2 KB: 12-22 ms against 5-8, an outbox insert of the same payloads 5-8).
CREATE TABLE request_answers (
    source_partition integer     NOT NULL CHECK (source_partition >= 0),
    source_offset    bigint      NOT NULL CHECK (source_offset >= 0),
    request_id       text        NOT NULL CHECK (length(request_id) BETWEEN 16 AND 64), -- the header's nonce
    partition        integer     NOT NULL, -- the mandate's partition: its shard holds the row
    org              text        NOT NULL,
    mandate_id       text        NOT NULL,
    decision         bytea       NOT NULL, -- the decision as published
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (source_partition, source_offset),
    CHECK (expires_at > created_at)
);
CREATE INDEX request_answers_expiry ON request_answers (partition, expires_at);
