-- The HTTP gateway's PostgreSQL role: it reads, and writes only the
-- console's sign-in sessions (console_sessions: a session opened at
-- sign-in, ended at sign-out); its connections are read-only by default,
-- and only the session writes open a read-write transaction. Create the role once
-- per server, then run the GRANTs in every mandated database: the one
-- database, or every shard of a shard map (the gateway reads each
-- mandate's status on its partition's shard, the tokens and the partition
-- count on the control shard). gateway/shards_test.go creates exactly this
-- role (under another name) and runs the gateway with it.
--
--   CREATE ROLE mandated_gateway LOGIN PASSWORD '...';
--
-- mandate-gateway --database-url postgres://mandated_gateway@...; with a
-- shard map, --shard-user mandated_gateway --shard-password-file FILE.

GRANT USAGE ON SCHEMA public TO mandated_gateway;
-- Tokens, the partition count and the decision keys the gateway checks
-- every decision's signature with (read on the control shard).
GRANT SELECT ON gateway_tokens, mandated_meta, decision_keys TO mandated_gateway;
-- Status reads: an authorization, a proposal's key, a request's answer and
-- how far its partition is consumed; a partition moved to another shard.
GRANT SELECT ON authorizations, idempotency_keys, request_answers, mandated_partitions, mandated_moves TO mandated_gateway;
-- The operators' console (/console, on by default): operator tokens, the
-- in-doubt queue and a mandate's page (its terms and authorizations), the
-- partitions (the outbox backlog, the relay's progress, parked rows), the
-- orgs' signing modes and the last verify (mandatectl verify --record).
-- gateway/console's tests run the console as this role.
GRANT SELECT ON operator_tokens, mandates, outbox, outbox_parked, relay_progress, org_grant_signing, verify_runs TO mandated_gateway;
-- The console's decision history, search and overview (migration 0051):
-- the decisions housekeeping moved out of the outbox, their counts per
-- minute, and how long they are kept.
GRANT SELECT ON decision_history, decision_counts, decision_history_settings TO mandated_gateway;
-- The console's sessions: opened at sign-in, ended at sign-out, expired
-- ones purged (on the control shard).
GRANT SELECT, INSERT, UPDATE, DELETE ON console_sessions TO mandated_gateway;
