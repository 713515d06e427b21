// Package lifecycle is mandated's decision logic: a pure, deterministic
// state machine over mandates, authorizations and idempotency records.
//
// Given the state a batch loaded, one command and the processor's clock
// reading, it changes that state in memory and returns the decisions. It
// does no I/O, starts no goroutines and never reads the clock: the same
// state, command and time always give the same decisions, which is what
// lets a batch be retried after a serialization failure and lets tests put a
// deadline exactly between two commands.
//
// The deadline rule: a deadline is met when the command is decided strictly
// before it (now < deadline). At now == deadline the reservation has expired.
//
// The executor rule: the first begin on a reservation wins and takes the
// mandate's next execution token; only that executor, carrying that token,
// may commit, cancel or report the execution (a commit or cancel straight
// from reserved carries none, and is possible only while nobody has begun).
// Every other begin is refused already_executing and shown the winner; every
// command with another token is refused stale_execution_token and changes
// nothing, as is the executor's own once reconciliation resolved its
// execution.
//
// The record rule: a record (a recorded read) takes no authority. Its
// intent lives in a scope of its own (RecordScopePrefix); the first one
// with a result creates an authorization that is terminal (recorded) from
// the start, and every later one is answered with it. It moves no counter
// and no version of its mandate, whatever the mandate's state.
//
// It stands on the ground floor with the contract (test/layout): it must
// never import any package of mandated's but partitioner and wire — no
// storage, no Kafka, no clock, no failpoint.
package lifecycle
