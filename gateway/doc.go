// Package gateway is mandated's HTTP gateway: callers that cannot speak
// Kafka get one decision with one HTTP call.
//
// A command arrives on the authorization's resource
// (POST /v1/orgs/{org}/mandates/{mandate}/proposals with an Idempotency-Key,
// POST .../authorizations/{id}/begin|commit|cancel|report-unknown). The
// body's exact bytes are checked with the contract's scanner, the record is
// the members the URL and headers give followed by the body's members byte
// for byte, it is decoded with the contract's decoder (wire) and exactly it
// is produced by the Go client, with the request's nonce in the
// mandated-request header: the gateway produces only what the processor
// accepts and refuses the rest with the processor's reason. A begin is one
// executor attempt (the Executor header, the body's executor, or one the
// gateway mints), never the intent's Idempotency-Key. The produce and the
// wait for the decision share the caller's Prefer: wait=N (bounded; 503
// with Retry-After when Kafka does not acknowledge in time); the answer is
// 200 with the decision, or 202 Accepted with Location: the request's
// status URL, which answers from PostgreSQL (request_answers, written by the
// processor in the batch that decides the record) with that request's own
// decision, on any gateway instance. Other status reads (an authorization's
// row, a proposal's key) go to the mandate's partition's database (the
// partitioner and, with Shards, the shard map). Errors are RFC 9457 problem
// details carrying the wire's reason codes, also for what net/http refuses
// before a handler runs (Serve).
//
// Callers authenticate with per-org bearer tokens (stored hashed, created
// and revoked with mandatectl tokens). A token acts for its org only, and
// only as an agent or platform: the gateway has no way to write grants or
// resolve, which stay on the grants topic (the control plane).
//
// The gateway decides nothing. What this package writes to PostgreSQL is
// never a decision: the console's sessions, and the API and operator tokens
// (CreateToken, CreateOperatorToken and RevokeToken, which mandatectl tokens
// calls).
//
// It stands on client, wire and partitioner, and may stand on sink and
// internal (test/layout). It must never import processor, lifecycle, outbox
// or verify: a door decides and publishes nothing itself.
package gateway
