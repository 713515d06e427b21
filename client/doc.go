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
// closed (ErrInDoubt) without running the side effect. It answers only
// for the request that was made: a ref taken from the replay of an intent
// whose recorded authorization differs from the request (Decision.Differs)
// is refused with a *ReplayDiffersError unless the caller accepts the
// fields (AcceptDiffers), and a loser whose winner has not finished within
// Config.LoserWait gets an *InProgressError naming the executor, since
// when, and when the execution becomes reconcilable.
//
// Read keeps a read-only call's answer under its intent (a recorded read):
// it looks the record up, and only when there is none runs the read and
// records its answer, so a restored or resumed agent sees the first answer
// again instead of fetching a new one.
//
// The client sits outside the single writer: it never decides anything, and
// it never reads PostgreSQL. It must never retry a command under a new
// idempotency key on its own.
//
// Callers import it, so it must never import any package of mandated's but
// wire and partitioner (test/layout): importing the client pulls in no
// processor, no PostgreSQL, nothing that decides.
package client
