package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestMandatedAuthenticatesToASASLSCRAMBrokerWithASecretFromAFile(t *testing.T) {
	t.Parallel()
	sasl := testenv.SASLBrokers(t)
	h := harness.New(t, harness.Options{Brokers: sasl.Brokers, KafkaOpts: sasl.Opts()})
	args := append(mandatedArgs(h), "--kafka-sasl-mechanism", "scram-sha-256",
		"--kafka-sasl-user", sasl.User, "--kafka-sasl-password-file", writeSecret(t, sasl.Password))
	p := procs.StartMandated(t, "sasl", args, nil)
	p.WaitReady(90 * time.Second)

	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", "m", 1)).Outcome)
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(proposeCmd("acme", "m", "k", 100)).Outcome)

	p.Signal(syscall.SIGTERM)
	code, err := p.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, "a SIGTERM is a clean exit")
	require.NotContains(t, p.Log(), sasl.Password, "the secret never reaches the logs")
}

func TestMandatedRefusesAWrongSASLPasswordWithoutLoggingIt(t *testing.T) {
	t.Parallel()
	sasl := testenv.SASLBrokers(t)
	h := harness.New(t, harness.Options{Brokers: sasl.Brokers, KafkaOpts: sasl.Opts()})
	const wrong = "not-the-password-4711"
	args := append(mandatedArgs(h), "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", sasl.User)
	p := procs.StartMandated(t, "sasl-wrong", args, []string{"MANDATED_KAFKA_SASL_PASSWORD=" + wrong})
	code, err := p.Wait(90 * time.Second)
	require.NoError(t, err)
	require.NotZero(t, code)
	log := p.Log()
	require.True(t, strings.Contains(log, "SASL") || strings.Contains(log, "auth"), "the failure says why: %s", log)
	require.NotContains(t, log, wrong)
}
