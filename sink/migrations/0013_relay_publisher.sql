-- One Kafka transaction per relay process (issue 15): a relay publishes
-- every partition its process owns with one transactional producer, whose
-- transactional id is new at every start. Which id publishes a partition is
-- recorded here by that relay, under the partition's epoch (the relay's
-- UPDATE ... WHERE epoch = its epoch), before its first transaction carries
-- the partition. The next owner reads it and fences that id
-- (InitProducerID) before it resumes from the partition's Kafka tail.
-- publisher_epoch says under which epoch it was recorded: when it is not the
-- previous epoch, an owner in between did not record one (a relay of an
-- earlier version, which publishes under the per-partition id
-- "<prefix>.<decisions>.<partition>"), so the next owner fences that id too.
ALTER TABLE mandated_partitions
    ADD COLUMN publisher       text,
    ADD COLUMN publisher_epoch bigint;
