-- Hand-off of one shard's partitions (issue 23). Every processor writes its
-- row here once a probe interval, on every shard it reaches: when it was
-- seen, the partitions it decides (claimed, or adopted), the partitions the
-- consumer group assigns it (whatever their shard, decided or not), and
-- the shards it has handed off because it cannot reach them. A processor
-- that reaches a shard adopts the partitions of that shard that a
-- processor seen within the bound, on any shard, says it handed off, unless
-- someone this shard sees decides them (processor/adopt.go). Liveness only,
-- rebuilt within a probe interval of a restart: unlogged, never copied by a
-- move.
CREATE UNLOGGED TABLE mandated_members (
    owner    text        PRIMARY KEY,
    seen_at  timestamptz NOT NULL,
    deciding integer[]   NOT NULL DEFAULT '{}' CHECK (0 <= ALL (deciding)),
    assigned integer[]   NOT NULL DEFAULT '{}' CHECK (0 <= ALL (assigned)),
    cut      text[]      NOT NULL DEFAULT '{}'
);
