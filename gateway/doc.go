// Package gateway is mandated's HTTP gateway: callers that cannot speak
// Kafka get one decision with one HTTP call.
//
// A command arrives on the authorization's resource
// (POST /v1/orgs/{org}/mandates/{mandate}/proposals with an Idempotency-Key,
// POST .../authorizations/{id}/begin|commit|cancel|report-unknown), is
// checked with the contract's own decoder (wire), produced by the Go client, and
// answered 200 with the decision when it comes within the caller's
// Prefer: wait=N (bounded), else 202 Accepted with Location: a stable status
// URL. GET on a status URL reads PostgreSQL with read-only transactions: the
// authorization row is the source of truth, not anything the gateway kept.
// Errors are RFC 9457 problem details carrying the wire's reason codes.
//
// Callers authenticate with per-org bearer tokens (stored hashed, created
// and revoked with mandatectl tokens). A token acts for its org only, and
// only as an agent or platform: the gateway has no way to write grants or
// resolve, which stay on the grants topic (the control plane).
//
// The gateway decides nothing and writes nothing to PostgreSQL.
//
// It stands on client, wire and partitioner, and may stand on sink and
// internal (test/layout). It must never import processor, lifecycle, outbox
// or verify: a door decides and publishes nothing itself.
package gateway
