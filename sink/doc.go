// Package sink owns mandated's PostgreSQL storage: the embedded schema and
// its migrator, the partition epochs that fence stale owners, and the one
// transaction per batch that checks the epoch, loads the state a batch
// needs, writes the decided state, idempotency rows, outbox rows and the
// next Kafka offsets together — or nothing.
//
// Driver errors are translated here and nowhere else: callers see
// ErrFenced, ErrRetryable, ErrRecordFault or a wrapped connection error.
// It must never decide: the decisions come from lifecycle.
//
// It stands on outbox (the rows its batch transaction writes), wire,
// lifecycle, partitioner and internal/failpoint (test/layout). It must never
// import verify (the auditor checks what sink stored), processor, client or
// gateway.
package sink
