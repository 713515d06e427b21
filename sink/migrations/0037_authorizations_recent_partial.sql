-- authorizations_recent serves the possible-replay check: the committed and
-- executing authorizations of a mandate created since a moment
-- (loadRecentSQL). On (org, mandate_id, created_at) for every state it also
-- matched each lookup of one authorization by its key, and on a table
-- without statistics (a new database, until autovacuum first analyses it)
-- the planner took it over the primary key for the batches' generic plans
-- (issue 26): every authorization of the mandate read for each one looked
-- up. Partial on the two states the check reads, it cannot match those
-- lookups, and a reservation no longer inserts into it.
DROP INDEX authorizations_recent;
CREATE INDEX authorizations_recent ON authorizations (org, mandate_id, created_at) WHERE state IN ('committed', 'executing');
