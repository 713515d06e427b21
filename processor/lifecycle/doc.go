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
package lifecycle
