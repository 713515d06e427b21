// Package wire is mandated's wire contract, version 1: the JSON commands
// agents and grantors produce to the proposals and grants topics, the JSON
// decisions mandated publishes, and the strict decoder that turns a Kafka
// record into either a valid Command or a Rejection with a reason code.
//
// The decoder checks the raw bytes before it trusts Go's encoding/json:
// invalid UTF-8 (which encoding/json would silently replace), NUL and
// control characters, duplicate and case-variant keys (which encoding/json
// would silently merge), nesting depth and size. Unknown fields are
// rejected, never ignored. Amounts are integer minor units; floats never
// touch money.
//
// chain.go defines the decision chain's canonical form (the published
// bytes minus the hash member) and anchors; see docs/wire.md, "The decision
// chain".
//
// This package must never do I/O or read the clock.
//
// The contract is the ground floor (test/layout): it must never import any
// package of mandated's but partitioner, so whoever writes or reads the
// contract (a caller through package client, the gateway, the processor,
// the auditor) pulls in nothing that decides or stores.
package wire
