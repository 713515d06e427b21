// Package processor is mandated's single writer: it consumes the proposals
// and grants topics in one consumer group, claims each assigned partition's
// epoch in PostgreSQL, and runs one worker per owned partition that decides
// batches of commands (lifecycle) and commits them through the sink in one
// fenced transaction. It wakes the outbox relay in memory after
// every commit.
//
// It must never write mandate state outside sink.Commit, never trust the
// partition a record arrived on (it recomputes the home partition from the
// key), and never consume a partition it does not hold an epoch for.
//
// It stands on every floor below it (test/layout): wire, lifecycle,
// partitioner, internal/clock and internal/failpoint, outbox, sink, verify.
// It must never import client or gateway (callers and doors stand beside
// it, on the contract, not on the processor), cmd or test packages.
package processor
