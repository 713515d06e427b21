package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// reachable caches one Ping per broker list and process: tests then fail fast.
var reachable sync.Map // string -> error

// KafkaBrokers returns the seed brokers of the single-node test broker
// (MANDATED_TEST_KAFKA_BROKERS, default 127.0.0.1:19092). It fails the test if no
// broker answers a metadata request.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	brokers := splitBrokers(env(EnvKafkaBrokers, DefaultKafka))
	requireKafka(t, brokers, EnvKafkaBrokers, "make kafka-up")
	return brokers
}

// ClusterBrokers returns the seed brokers of the three-node test cluster
// (MANDATED_TEST_CLUSTER_BROKERS, default ports 29092, 29094, 29096). It fails the
// test if no broker answers a metadata request.
func ClusterBrokers(t testing.TB) []string {
	t.Helper()
	brokers := splitBrokers(env(EnvClusterBrokers, DefaultCluster))
	requireKafka(t, brokers, EnvClusterBrokers, "make cluster-up")
	return brokers
}

// SASLKafka describes the broker instance with a SASL/SCRAM-SHA-256 listener.
type SASLKafka struct {
	Brokers  []string
	User     string
	Password string
}

// Opts returns the client options to reach the SASL broker as User.
func (s SASLKafka) Opts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(s.Brokers...),
		kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()),
	}
}

// SASLBrokers returns the SASL/SCRAM broker instance (MANDATED_TEST_KAFKA_SASL_*,
// default 127.0.0.1:19192, user mandated). It fails the test if it does not answer
// an authenticated metadata request.
func SASLBrokers(t testing.TB) SASLKafka {
	t.Helper()
	s := SASLKafka{
		Brokers:  splitBrokers(env(EnvSASLBrokers, DefaultSASLKafka)),
		User:     env(EnvSASLUser, DefaultSASLUser),
		Password: env(EnvSASLPassword, DefaultSASLPassword),
	}
	requireKafka(t, s.Brokers, EnvSASLBrokers, "make kafka-up", s.Opts()...)
	return s
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func requireKafka(t testing.TB, brokers []string, envName, target string, opts ...kgo.Opt) {
	t.Helper()
	key := strings.Join(brokers, ",")
	v, ok := reachable.Load(key)
	if !ok {
		v, _ = reachable.LoadOrStore(key, ping(brokers, opts))
	}
	if err, _ := v.(error); err != nil {
		t.Fatalf("Kafka is not reachable at %s (%s): %v\n"+
			"Run the tests with `make test`, which starts everything, or start the servers with `make infra-up` (or `%s`).",
			key, envName, err, target)
	}
}

func ping(brokers []string, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// Topic creates a uniquely named topic with the given partition count on the
// single-node broker (replication factor MANDATED_TEST_KAFKA_RF, default 1) and
// deletes it at cleanup. It returns once every partition has a leader.
func Topic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	rf := int16(1)
	if s := env(EnvKafkaRF, ""); s != "" {
		n, err := strconv.ParseInt(s, 10, 16)
		require.NoError(t, err, "%s must be an integer", EnvKafkaRF)
		rf = int16(n)
	}
	return TopicOn(t, KafkaBrokers(t), prefix, partitions, rf)
}

// TopicOn is Topic on the given brokers with an explicit replication factor.
func TopicOn(t testing.TB, brokers []string, prefix string, partitions int32, rf int16) string {
	t.Helper()
	name := Name(t, prefix)
	adm := newAdmin(t, brokers)
	defer adm.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, rf, nil, name)
	require.NoError(t, err, "create topic %s", name)
	require.NoError(t, resp.Err, "create topic %s", name)

	t.Cleanup(func() {
		adm := newAdmin(t, brokers)
		defer adm.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopic(ctx, name); err != nil {
			t.Logf("testenv: could not delete topic %s: %v", name, err)
		}
	})

	WaitFor(t, 30*time.Second, func() bool {
		td, err := adm.ListTopics(ctx, name)
		if err != nil || td[name].Err != nil || len(td[name].Partitions) != int(partitions) {
			return false
		}
		for _, p := range td[name].Partitions {
			if p.Leader < 0 || p.Err != nil {
				return false
			}
		}
		return true
	}, fmt.Sprintf("topic %s has a leader for each of its %d partitions", name, partitions))
	return name
}

func newAdmin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	return kadm.NewClient(cl)
}
