// Package client is the Go client of mandated: the way a platform or an
// agent gets one decision with one call.
//
// A Client holds one Kafka producer (Kafka's default partitioner: murmur2 of
// the mandate key, the same function as package partitioner) and one shared
// read_committed consumer of the decisions topic. Every call produces one
// command and waits for the decision whose source is the produced record
// (topic, partition, offset): answers are matched by position, never by
// guessing from ids. When no decision comes before the caller's deadline, the
// call returns ErrNoDecision; the command was produced and will still be
// decided, and a retry with the same idempotency key replays that answer.
//
// Execute runs the executor boundary of seed 002 in one call: one attempt
// wins the begin and runs the side effect, every other attempt waits for the
// winner's outcome and returns it, and an attempt that cannot tell fails
// closed (ErrInDoubt) without running the side effect.
//
// The client sits outside the single writer: it never decides anything, and
// it never reads PostgreSQL. It must never retry a command under a new
// idempotency key on its own.
//
// Callers import it, so it must never import any package of mandated's but
// wire and partitioner (test/layout): importing the client pulls in no
// processor, no PostgreSQL, nothing that decides.
package client
