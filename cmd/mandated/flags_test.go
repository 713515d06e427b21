package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func parse(t *testing.T, args ...string) config {
	t.Helper()
	var c config
	fs := flag.NewFlagSet("mandated", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.register(fs)
	require.NoError(t, fs.Parse(args))
	return c
}

// sameDefaults compares every field of a component's config that a flag
// can set: the flags' defaults, completed by WithDefaults, against the
// component's own zero value completed by WithDefaults.
func sameDefaults(t *testing.T, name string, flags, zero any, skip ...string) {
	t.Helper()
	fv, zv := reflect.ValueOf(flags), reflect.ValueOf(zero)
	for i := range fv.NumField() {
		f := fv.Type().Field(i)
		if !f.IsExported() || !f.Type.Comparable() || f.Type.Kind() == reflect.Interface || f.Type.Kind() == reflect.Pointer || f.Type.Kind() == reflect.Func {
			continue
		}
		if contains(skip, f.Name) {
			continue
		}
		require.Equal(t, zv.Field(i).Interface(), fv.Field(i).Interface(), "%s.%s: the flag's default is not the component's", name, f.Name)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestTheFlagsDefaultsAreTheComponentsDefaults: the flags are bound onto
// the components' configs, so mandated without flags runs each component
// on its own documented defaults.
func TestTheFlagsDefaultsAreTheComponentsDefaults(t *testing.T) {
	c := parse(t, "--database-url", "postgres://x@127.0.0.1/db", "--brokers", "127.0.0.1:1")
	cfg, err := c.serviceConfig(zerolog.Nop(), prometheus.NewRegistry())
	require.NoError(t, err)
	var zero = cfg
	zero.Sink.MaxConns, zero.Sink.LockTimeout, zero.Sink.IdleInTxTimeout, zero.Sink.TakeoverGrace, zero.Sink.Retention = 0, 0, 0, 0, 0
	sameDefaults(t, "sink.Config", cfg.Sink.WithDefaults(), zero.Sink.WithDefaults())
	pz := cfg.Processor
	pz.ProposalsTopic, pz.GrantsTopic, pz.DecisionsTopic, pz.DeadLetterTopic, pz.Group, pz.GroupProtocol = "", "", "", "", "", ""
	pz.RewindCheckInterval, pz.MinDecisionRetention, pz.DBUnreachableHandoff, pz.ShardHandoffAfter = 0, 0, 0, 0
	pz.ShardHandoffProbes, pz.ShardTakeBackProbes, pz.MaxBatch, pz.MaxRecordBytes = 0, 0, 0, 0
	pz.SessionTimeout, pz.RebalanceTimeout, pz.GrantorKeyRefresh = 0, 0, 0
	sameDefaults(t, "processor.Config", cfg.Processor.WithDefaults(), pz.WithDefaults())
	rz := cfg.Relay
	rz.TailCheckInterval, rz.MaxRows, rz.IdlePoll, rz.TransactionTimeout, rz.MinTxnInterval, rz.DatabaseTimeout = 0, 0, 0, 0, 0, 0
	rz.TransactionalIDPrefix = ""
	sameDefaults(t, "outbox.Config", cfg.Relay.WithDefaults(), rz.WithDefaults())
}

// TestAFlagSetsItsComponentsField: a flag lands in its component's config,
// and the relay publishes to the processor's decisions topic.
func TestAFlagSetsItsComponentsField(t *testing.T) {
	c := parse(t, "--database-url", "postgres://x@127.0.0.1/db", "--brokers", "127.0.0.1:1,127.0.0.1:2",
		"--db-max-conns", "3", "--max-batch", "7", "--relay-max-rows", "9", "--decisions-topic", "d", "--dead-letter-topic", "dl",
		"--relay-linger", "5ms")
	cfg, err := c.serviceConfig(zerolog.Nop(), prometheus.NewRegistry())
	require.NoError(t, err)
	require.EqualValues(t, 3, cfg.Sink.MaxConns)
	require.Equal(t, "postgres://x@127.0.0.1/db", cfg.Sink.DatabaseURL)
	require.Equal(t, 7, cfg.Processor.MaxBatch)
	require.Equal(t, 9, cfg.Relay.MaxRows)
	require.Equal(t, "5ms", cfg.Relay.Linger.String())
	require.Equal(t, []string{"d", "dl"}, []string{cfg.Relay.DecisionsTopic, cfg.Relay.DeadLetterTopic})
	require.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2"}, cfg.Relay.Brokers)
	require.Equal(t, cfg.Processor.Brokers, cfg.Relay.Brokers)

	bad := parse(t, "--database-url", "postgres://x@127.0.0.1/db", "--brokers", "127.0.0.1:1", "--max-batch", "-1")
	_, err = bad.serviceConfig(zerolog.Nop(), prometheus.NewRegistry())
	require.ErrorContains(t, err, "MaxBatch", "a bad flag is named by its field")
}
