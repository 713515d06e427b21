-- Hand-off of one shard's partitions (issue 23). Every processor writes its
-- row here once a probe interval, on every shard it reaches: when it was
-- seen and which of this shard's partitions it holds (assigned to it by the
-- consumer group, or adopted). A processor that reaches this shard adopts
-- a partition whose holder has not been seen here for the hand-off bound
-- while it is seen on another shard: a member cut from this shard alone
-- (processor/adopt.go). A holder seen nowhere is gone or restarting, which
-- is the consumer group's business. Liveness only, rebuilt within a
-- second of a restart: unlogged, never copied by a move.
CREATE UNLOGGED TABLE mandated_members (
    owner   text        PRIMARY KEY,
    seen_at timestamptz NOT NULL,
    holding integer[]   NOT NULL DEFAULT '{}' CHECK (0 <= ALL (holding))
);
