-- Idempotency keys and intents are scoped by their mandate (issue 23).
--
-- A key was unique per (org, operation) in one database, so on one
-- database the same key on two mandates of an org was a conflict, and the
-- same intent a replay of the other mandate's authorization; on a shard map
-- each database bound it once, so the answer depended on the layout. No
-- transaction spans two databases, so the scope that holds in every layout
-- is the one a partition can check alone: the mandate (a mandate has one
-- home partition, its rows live in one database, and they move with it).
--
-- Every existing row stays valid: unique per (org, operation, key) implies
-- unique per (org, mandate_id, operation, key). The new primary keys lead
-- with (org, mandate_id), which is also how every lookup reads them.
-- Intents bound before this migration by a fork on another mandate keep
-- their head_mandate_id; every intent bound from now on has its lineage on
-- its own mandate.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey,
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (org, mandate_id, operation, idempotency_key);

ALTER TABLE intents DROP CONSTRAINT intents_pkey,
    ADD CONSTRAINT intents_pkey PRIMARY KEY (org, mandate_id, operation, run_id, step, action);
