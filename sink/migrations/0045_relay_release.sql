-- A relay that stops publishing a partition hands it over instead of being
-- fenced (issue 35, item 3). One producer publishes every partition of a
-- process, so fencing it for one partition that moved restarted its
-- session for all of them: the partitions that never moved paused too.
--
-- publisher_releasing_until: the recorded publisher was told the partition
-- is revoked and drains what its process committed until then (the
-- database's clock). A new owner waits for its release until then, and
-- fences it only when it did not release in time (a dead or paused relay
-- never writes this, and is fenced at once).
--
-- publisher_released_seq: the recorded publisher released the partition
-- after publishing up to this sequence. It writes it only once every Kafka
-- transaction of its producer that carried the partition has committed or
-- aborted, and it never carries the partition again; the next owner
-- resumes after it without fencing that producer. Recording a publisher
-- clears both.
ALTER TABLE mandated_partitions
    ADD COLUMN publisher_releasing_until timestamptz,
    ADD COLUMN publisher_released_seq    bigint;
