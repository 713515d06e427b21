package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

// cmd/mandated retries a start that failed (Kafka without the topics yet,
// an ACL missing) with the same registry: a failed start leaves nothing
// registered, so the next one does not panic on a duplicate collector.
func TestAFailedStartCanBeTriedAgainWithTheSameRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cfg := processor.ServiceConfig{
		Sink: sink.Config{DatabaseURL: testdb.Migrated(t)},
		Processor: processor.Config{Brokers: testenv.KafkaBrokers(t), Group: testenv.Name(t, "group"),
			ProposalsTopic: testenv.Name(t, "missing-p"), GrantsTopic: testenv.Name(t, "missing-g"),
			DecisionsTopic: testenv.Name(t, "missing-d"), DeadLetterTopic: testenv.Name(t, "missing-dl")},
		Registerer: reg,
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := processor.StartService(ctx, cfg, zerolog.Nop())
		cancel()
		require.ErrorContains(t, err, "is not usable")
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Empty(t, mfs, "nothing stays registered")
}
