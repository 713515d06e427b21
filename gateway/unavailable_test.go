package gateway_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

// Kafka unreachable (a private broker, paused): a command is answered 503
// with Retry-After within its wait, not held until the client gives up,
// and its in-flight slot is free again at once.
func TestGatewayKafkaDownIs503WithinTheWaitAndFreesTheSlot(t *testing.T) {
	t.Parallel()
	k := testenv.PrivateKafka(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := processor.TopicSpec{Proposals: testenv.Name(t, "proposals"), Grants: testenv.Name(t, "grants"),
		Decisions: testenv.Name(t, "decisions"), DeadLetter: testenv.Name(t, "deadletter"), Partitions: 2, ReplicationFactor: 1}
	_, err := processor.EnsureTopics(ctx, k.Brokers, nil, spec)
	require.NoError(t, err)
	dbURL := testdb.Migrated(t)
	rw, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer rw.Close(context.Background())
	_, err = sink.Migrate(ctx, rw)
	require.NoError(t, err)
	_, token, err := gateway.CreateToken(ctx, rw, "acme", "down")
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cl, err := client.New(ctx, client.Config{Brokers: k.Brokers, ProposalsTopic: spec.Proposals, GrantsTopic: spec.Grants,
		DecisionsTopic: spec.Decisions, FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	reg := prometheus.NewRegistry()
	srv, err := gateway.New(gateway.Config{MaxInFlightPerOrg: 1, MaxWait: 10 * time.Second}, cl, pool, reg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	b := &testBundle{base: "http://" + ln.Addr().String(), tokens: map[string]string{"acme": token},
		http: &http.Client{Timeout: 40 * time.Second}}
	b.spec = openAPIValidator(t)

	require.NoError(t, k.Do(ctx, "pause", 0))
	t.Cleanup(func() { _ = k.Do(context.Background(), "resume", 0) })
	for i := range 2 { // the second finds the slot free: 503 again, not 429
		start := time.Now()
		r := b.propose(t, "m-down", "down-1", 100, map[string]string{"Prefer": "wait=2"})
		r.problem(t, http.StatusServiceUnavailable, gateway.ReasonUnavailable)
		require.NotEmpty(t, r.header.Get("Retry-After"))
		require.Less(t, time.Since(start), 15*time.Second, "request %d: bounded by its wait, not the client's patience", i)
		require.Zero(t, testutil.ToFloat64(inFlight(t, reg)), "the slot is released")
	}

	require.NoError(t, k.Do(ctx, "resume", 0))
	testenv.WaitFor(t, time.Minute, func() bool {
		r := b.propose(t, "m-down", "down-1", 100, map[string]string{"Prefer": "wait=1"})
		return r.status == http.StatusAccepted // produced; no processor decides here
	}, "the gateway produces again once Kafka is back")
}
