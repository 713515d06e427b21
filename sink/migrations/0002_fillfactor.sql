-- Rows updated in place on every batch keep free room on their page, so the
-- update stays a HOT update (no index entries, no new page to image in the
-- WAL after a checkpoint): the partition row on every batch, a mandate on
-- every use, an authorization on each transition.
ALTER TABLE mandated_partitions SET (fillfactor = 50);
ALTER TABLE mandates SET (fillfactor = 80);
ALTER TABLE authorizations SET (fillfactor = 85);
