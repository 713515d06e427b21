// Package sink owns mandated's PostgreSQL storage at run time: the embedded
// schema and its migrator, the partition epochs that fence stale owners,
// the shards a shard map names, and the one transaction per batch that
// checks the epoch, loads the state a batch needs, writes the decided
// state, idempotency rows, outbox rows and the next Kafka offsets together
// — or nothing; the deadlines, purges and reads around it.
//
// Driver errors are translated once, by sink/pgerr (shared with admin):
// callers see ErrFenced, ErrRetryable, ErrRecordFault, ErrMoved or a
// wrapped connection error. It must never decide: the decisions come from
// lifecycle. The shard map itself (its file, edits and lock) is
// sink/shardmap's; the operators' workflows (moves, repartition, org
// settings, grantor-key writes, verify-run records) are package admin's.
//
// It stands on outbox (the rows its batch transaction writes), wire,
// lifecycle, partitioner, internal/failpoint, sink/shardmap and sink/pgerr
// (test/layout). It must never import admin (the operator layer stands on
// it), verify (the auditor checks what sink stored), processor, client or
// gateway.
package sink
