// Package fault is mandated's fault-injection suite: it runs the real
// mandated binary (several processes) against a private Kafka (one node, or
// the three-node cluster) and a private PostgreSQL, drives a workload of
// agents, a platform and a reconciler against an external side-effect
// ledger, injects named faults on a schedule, and judges the outcome from
// the outside.
package fault

import "github.com/mandated/mandated/test/testenv"

// The private servers live in testenv, shared with other suites.
type (
	Kafka    = testenv.Kafka
	Postgres = testenv.Postgres
)

var (
	PrivateKafka    = testenv.PrivateKafka
	PrivatePostgres = testenv.PrivatePostgres
	PrivateStandby  = testenv.PrivateStandby
	script          = testenv.Script
)
