-- The outbox is written and emptied all the time: give it statistics and a
-- vacuum early, not after a fifth of a possibly huge table has changed.
ALTER TABLE outbox SET (autovacuum_analyze_threshold = 1000, autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_scale_factor = 0);
