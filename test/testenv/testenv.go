// Package testenv connects tests to the Kafka brokers and the PostgreSQL server that
// test/infra starts (make test, make infra-up) and hands out uniquely named topics,
// databases, group ids and transactional ids, each removed at test cleanup.
//
// It never starts a server and never skips: when a server is unreachable the test
// fails with a message naming the make target that starts it. Names carry the
// process id, a counter and random bits, so packages that go test runs in parallel
// never share a topic, group or database.
//
// Environment (defaults match test/infra):
//
//	MANDATED_TEST_KAFKA_BROKERS        127.0.0.1:19092
//	MANDATED_TEST_KAFKA_RF             1 (replication factor for Topic)
//	MANDATED_TEST_KAFKA_SASL_BROKERS   127.0.0.1:19192 (SASL/SCRAM-SHA-256 listener)
//	MANDATED_TEST_KAFKA_SASL_USER      mandated
//	MANDATED_TEST_KAFKA_SASL_PASSWORD  mandated-secret
//	MANDATED_TEST_CLUSTER_BROKERS      127.0.0.1:29092,127.0.0.1:29094,127.0.0.1:29096
//	MANDATED_TEST_DATABASE_URL         postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable
package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Environment variable names read by this package.
const (
	EnvKafkaBrokers     = "MANDATED_TEST_KAFKA_BROKERS"
	EnvKafkaRF          = "MANDATED_TEST_KAFKA_RF"
	EnvSASLBrokers      = "MANDATED_TEST_KAFKA_SASL_BROKERS"
	EnvSASLUser         = "MANDATED_TEST_KAFKA_SASL_USER"
	EnvSASLPassword     = "MANDATED_TEST_KAFKA_SASL_PASSWORD"
	EnvClusterBrokers   = "MANDATED_TEST_CLUSTER_BROKERS"
	EnvDatabaseURL      = "MANDATED_TEST_DATABASE_URL"
	DefaultKafka        = "127.0.0.1:19092"
	DefaultSASLKafka    = "127.0.0.1:19192"
	DefaultSASLUser     = "mandated"
	DefaultSASLPassword = "mandated-secret"
	DefaultCluster      = "127.0.0.1:29092,127.0.0.1:29094,127.0.0.1:29096"
	DefaultDatabaseURL  = "postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable"
)

// PollInterval is how often WaitFor checks its condition.
const PollInterval = 20 * time.Millisecond

var nameCounter atomic.Uint64

func env(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// Name returns a name unique across tests, runs and parallel test processes:
// prefix, the test's name, the process id, a per-process counter and random hex.
// It is a valid Kafka topic, group id and transactional id (letters, digits, '-').
func Name(t testing.TB, prefix string) string {
	t.Helper()
	return fmt.Sprintf("%s-%s-%d-%d-%s", clean(prefix, 40), clean(t.Name(), 60),
		os.Getpid(), nameCounter.Add(1), randHex(4))
}

// clean keeps letters and digits, turns everything else into '-', and truncates.
func clean(s string, limit int) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	if len(b) > limit {
		b = b[:limit]
	}
	return strings.Trim(string(b), "-")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// WaitFor polls cond every PollInterval until it returns true and fails the test
// with msg if that takes longer than timeout. cond runs on the test's goroutine,
// so it may use require. This is the only waiting tests should do: no sleeps.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testenv.WaitFor: condition not met after %s: %s", timeout, msg)
		}
		time.Sleep(PollInterval)
	}
}
