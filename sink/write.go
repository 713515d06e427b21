package sink

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Every write of a batch is one multi-row statement per table, sent in one
// pipeline with the COMMIT. Updates compare-and-set on the version loaded,
// so a write that raced anything is caught rather than applied: each write
// counts the rows it touched in the database (mandated_expect_rows,
// migration 0036), so that a count other than the batch's aborts the
// transaction before the COMMIT behind it runs.

const listSep = "\x1f" // cannot occur in an id (see partitioner's grammar)

const insertMandatesRows = `INSERT INTO mandates (org, mandate_id, partition, version, status, operations, targets, currency,
  max_amount, total_limit, uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent,
  valid_from, valid_until, release_on_cancel, hold_window_ms, execution_timeout_ms, last_authorization_id, created_at, updated_at,
  executions, terms_version)
SELECT org, mandate_id, partition, version, status, string_to_array(operations, E'\x1f'), string_to_array(targets, E'\x1f'),
  currency, max_amount, NULLIF(total_limit, 0), uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent,
  valid_from, valid_until, release_on_cancel, hold_window_ms, execution_timeout_ms, NULLIF(last_authorization_id, ''), created_at, updated_at,
  executions, terms_version
FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[],
  $17::timestamptz[], $18::timestamptz[], $19::bool[], $20::bigint[], $21::bigint[], $22::text[], $23::timestamptz[], $24::timestamptz[],
  $25::bigint[], $26::bigint[])
  AS u(org, mandate_id, partition, version, status, operations, targets, currency, max_amount, total_limit, uses_allowed,
       uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, valid_from, valid_until, release_on_cancel,
       hold_window_ms, execution_timeout_ms, last_authorization_id, created_at, updated_at, executions, terms_version)`

const insertMandatesSQL = `WITH w AS (` + insertMandatesRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $27, 'insert mandates') FROM w`

// updateMandatesRows names each row by its key and by the address (ctid)
// the batch loaded it at: the planner may then find it with a TID scan, no
// index descent, and the key keeps the statement right whatever plan it
// takes. Nothing else moves a row while the transaction holds its
// partition; a row another writer did update is no longer at that address,
// and the count of rows written says so (mandated_expect_rows). The
// authorizations and intents are updated the same way.
const updateMandatesRows = `UPDATE mandates m SET version = u.version, status = u.status,
  operations = string_to_array(u.operations, E'\x1f'), targets = string_to_array(u.targets, E'\x1f'), currency = u.currency,
  max_amount = u.max_amount, total_limit = NULLIF(u.total_limit, 0), uses_allowed = u.uses_allowed, uses_held = u.uses_held,
  uses_spent = u.uses_spent, uses_in_doubt = u.uses_in_doubt, amount_held = u.amount_held, amount_spent = u.amount_spent,
  valid_from = u.valid_from, valid_until = u.valid_until, release_on_cancel = u.release_on_cancel,
  hold_window_ms = u.hold_window_ms, execution_timeout_ms = u.execution_timeout_ms,
  last_authorization_id = NULLIF(u.last_authorization_id, ''), updated_at = u.updated_at, executions = u.executions,
  terms_version = u.terms_version
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[],
  $17::timestamptz[], $18::timestamptz[], $19::bool[], $20::bigint[], $21::bigint[], $22::text[], $23::timestamptz[],
  $24::bigint[], $25::bigint[], $26::tid[])
  AS u(org, mandate_id, loaded_version, version, status, operations, targets, currency, max_amount, total_limit, uses_allowed,
       uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, valid_from, valid_until, release_on_cancel,
       hold_window_ms, execution_timeout_ms, last_authorization_id, updated_at, executions, terms_version, tid)
WHERE m.ctid = u.tid AND m.org = u.org AND m.mandate_id = u.mandate_id AND m.version = u.loaded_version`

const updateMandatesSQL = `WITH w AS (` + updateMandatesRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $27, 'update mandates') FROM w`

const insertAuthsRows = `INSERT INTO authorizations (org, mandate_id, authorization_id, partition, state, version, operation, target,
  amount, currency, idempotency_key, mandate_version, deadline, execution_deadline, begin_key, external_ref, detail,
  decision_id, created_at, updated_at, execution_token, result, resolved, fork_of, reported, resolved_by)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::bigint[], $7::text[], $8::text[],
  $9::bigint[], $10::text[], $11::text[], $12::bigint[], $13::timestamptz[], $14::timestamptz[], $15::text[], $16::text[],
  $17::text[], $18::text[], $19::timestamptz[], $20::timestamptz[], $21::bigint[], $22::text[], $23::bool[], $24::text[],
  $25::text[], $26::text[])`

const insertAuthsSQL = `WITH w AS (` + insertAuthsRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $27, 'insert authorizations') FROM w`

const updateAuthsRows = `UPDATE authorizations a SET state = u.state, version = u.version, execution_deadline = u.execution_deadline,
  begin_key = u.begin_key, external_ref = u.external_ref, detail = u.detail, updated_at = u.updated_at,
  execution_token = u.execution_token, result = u.result, resolved = u.resolved, reported = u.reported, resolved_by = u.resolved_by
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::timestamptz[], $8::text[],
  $9::text[], $10::text[], $11::timestamptz[], $12::bigint[], $13::text[], $14::bool[], $15::tid[], $16::text[], $17::text[])
  AS u(org, mandate_id, authorization_id, loaded_version, state, version, execution_deadline, begin_key, external_ref, detail, updated_at,
       execution_token, result, resolved, tid, reported, resolved_by)
WHERE a.ctid = u.tid AND a.org = u.org AND a.mandate_id = u.mandate_id AND a.authorization_id = u.authorization_id
  AND a.version = u.loaded_version`

const updateAuthsSQL = `WITH w AS (` + updateAuthsRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $18, 'update authorizations') FROM w`

const insertIdemRows = `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition,
  authorization_id, decision_id, outcome, reason, created_at, expires_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::int[], $7::text[], $8::text[],
  $9::text[], $10::text[], $11::timestamptz[], $12::timestamptz[])
ON CONFLICT DO NOTHING`

const insertIdemSQL = `WITH w AS (` + insertIdemRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $13, 'insert idempotency keys') FROM w`

const insertOutboxRows = `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
  source_partition, source_offset, created_at, prev_hash, hash)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
  $9::text[], $10::int[], $11::bigint[], $12::timestamptz[], $13::bytea[], $14::bytea[])`

const insertOutboxSQL = `WITH w AS (` + insertOutboxRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $15, 'insert outbox') FROM w`

// insertOutboxTracedRows is insertOutboxRows for a batch with a traced
// record: the rows' W3C trace context too (NULL for the others, migration
// 0042). A batch with none writes no trace column at all: tracing off
// costs nothing here.
const insertOutboxTracedRows = `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
  source_partition, source_offset, created_at, prev_hash, hash, trace_parent)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
  $9::text[], $10::int[], $11::bigint[], $12::timestamptz[], $13::bytea[], $14::bytea[], $15::text[])`

const insertOutboxTracedSQL = `WITH w AS (` + insertOutboxTracedRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $16, 'insert outbox') FROM w`

const advancePartitionRows = `UPDATE mandated_partitions SET proposals_offset = $3, grants_offset = $4, next_seq = $5, head_hash = $9, updated_at = now()
WHERE partition = $1 AND epoch = $2 AND proposals_offset = $6 AND grants_offset = $7 AND next_seq = $8`

const advancePartitionSQL = `WITH w AS (` + advancePartitionRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), 1, 'advance partition') FROM w`

// tstz maps the zero time to NULL.
func tstz(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t.UTC(), Valid: true}
}

const insertIntentsRows = `INSERT INTO intents (org, operation, run_id, step, action, mandate_id, authorization_id, decision_id,
  head_mandate_id, head_authorization_id, partition, created_at, updated_at, expires_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::text[], $10::text[], $11::int[], $12::timestamptz[], $13::timestamptz[], $14::timestamptz[])
ON CONFLICT DO NOTHING`

const insertIntentsSQL = `WITH w AS (` + insertIntentsRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $15, 'insert intents') FROM w`

// updateIntentsSQL moves a lineage's head to its fork, compare-and-set on
// the head loaded.
const updateIntentsRows = `UPDATE intents i SET head_mandate_id = u.head_mandate_id, head_authorization_id = u.head_authorization_id,
  updated_at = u.updated_at, expires_at = u.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
  $10::timestamptz[], $11::timestamptz[], $12::tid[], $13::text[])
  AS u(org, operation, run_id, step, action, loaded_mandate_id, loaded_authorization_id, head_mandate_id, head_authorization_id,
       updated_at, expires_at, tid, mandate_id)
WHERE i.ctid = u.tid AND i.org = u.org AND i.mandate_id = u.mandate_id AND i.operation = u.operation AND i.run_id = u.run_id
  AND i.step = u.step AND i.action = u.action AND i.head_mandate_id = u.loaded_mandate_id AND i.head_authorization_id = u.loaded_authorization_id`

const updateIntentsSQL = `WITH w AS (` + updateIntentsRows + ` RETURNING 1)
SELECT mandated_expect_rows(count(*), $14, 'update intents') FROM w`

// insertAnswersSQL keeps the decisions that answer gateway requests
// (migration 0024), keyed by the record's position.
const insertAnswersSQL = `INSERT INTO request_answers (source_partition, source_offset, request_id, partition, org, mandate_id,
  decision, created_at, expires_at)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::text[], $7::bytea[], $8::timestamptz[],
  $9::timestamptz[])
ON CONFLICT DO NOTHING`
