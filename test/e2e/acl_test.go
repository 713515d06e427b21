package e2e

import (
	"context"
	"errors"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// aclScope is the 'mandatectl acls' flags naming a harness's topics, group
// and relay.
func aclScope(h *harness.Harness) []string {
	return []string{"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
		"--group", h.Group, "--relay-transactional-id-prefix", h.TxnPrefix}
}

// mandatectlACLs runs 'mandatectl acls args...' (apply connects as the SASL
// broker's super user) and returns what it printed.
func mandatectlACLs(t *testing.T, sasl testenv.SASLKafka, args ...string) string {
	t.Helper()
	if len(args) > 0 && args[0] == "apply" {
		args = append([]string{"apply", "--brokers", joinComma(sasl.Brokers), "--kafka-sasl-mechanism", "scram-sha-256",
			"--kafka-sasl-user", sasl.User}, args[1:]...)
	}
	c := exec.Command(procs.Binary(t, "mandatectl"), append([]string{"acls"}, args...)...)
	c.Env = []string{"PATH=/usr/bin:/bin", "MANDATED_KAFKA_SASL_PASSWORD=" + sasl.Password}
	out, err := c.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func client(t *testing.T, u testenv.SASLKafka, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(u.Opts(), append([]kgo.Opt{kgo.ProducerLinger(0), kgo.RequestRetries(2)}, opts...)...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func produce(t *testing.T, cl *kgo.Client, topic string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("acme/m"), Value: []byte(`{}`)}).FirstErr()
}

// consume reads one record (or the first error) of topic's partition 0.
func consume(t *testing.T, u testenv.SASLKafka, topic string) error {
	t.Helper()
	cl := client(t, u, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if errs := fs.Errors(); len(errs) > 0 {
			return errs[0].Err
		}
		if fs.NumRecords() > 0 {
			return nil
		}
	}
}

// TestTheBrokerRefusesWhatARoleIsNotGranted: with the planned ACLs on a
// broker that denies what no ACL allows, the broker itself refuses an
// agent's write to the grants topic, an agent's use of mandated's
// transactional ids, and readers outside their topics; what the roles are
// granted works.
func TestTheBrokerRefusesWhatARoleIsNotGranted(t *testing.T) {
	t.Parallel()
	sasl := testenv.SASLBrokers(t)
	sasl.RequireAuthorizer(t)
	h := harness.New(t, harness.Options{Brokers: sasl.Brokers, KafkaOpts: sasl.Opts(), Partitions: 1})
	agent, grantor, auditor := sasl.NewUser(t, "agent"), sasl.NewUser(t, "grantor"), sasl.NewUser(t, "auditor")
	mandatectlACLs(t, sasl, append([]string{"apply", "--timeout", "1m", "--agent", agent.Principal(),
		"--grantor", grantor.Principal(), "--auditor", auditor.Principal()}, aclScope(h)...)...)

	agentCl := client(t, agent)
	testenv.WaitFor(t, 30*time.Second, func() bool { return produce(t, agentCl, h.Spec.Proposals) == nil },
		"an agent may write the proposals topic (ACLs propagate)")
	require.ErrorIs(t, produce(t, agentCl, h.Spec.Grants), kerr.TopicAuthorizationFailed, "an agent cannot write the grants topic")

	// An agent claiming one of mandated's transactional ids (to fence the
	// relay or forge decisions) is refused by the broker.
	txn := client(t, agent, kgo.TransactionalID(h.TxnPrefix+"."+h.Spec.Decisions+".0"))
	err := txn.BeginTransaction()
	if err == nil {
		err = produce(t, txn, h.Spec.Proposals)
	}
	require.True(t, errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || err != nil && strings.Contains(err.Error(), kerr.TransactionalIDAuthorizationFailed.Message),
		"an agent cannot use mandated's transactional ids: %v", err)
	require.ErrorIs(t, produce(t, agentCl, h.Spec.Decisions), kerr.TopicAuthorizationFailed, "an agent cannot forge decisions")
	require.ErrorIs(t, consume(t, agent, h.Spec.Decisions), kerr.TopicAuthorizationFailed, "agents read no decisions")

	grantorCl := client(t, grantor)
	require.NoError(t, produce(t, grantorCl, h.Spec.Grants), "a grantor may write the grants topic")
	require.ErrorIs(t, produce(t, grantorCl, h.Spec.Proposals), kerr.TopicAuthorizationFailed, "a grantor does not propose")

	h.ProduceRaw(h.Spec.Decisions, []byte("acme/m"), []byte(`{}`), 0)
	require.NoError(t, consume(t, auditor, h.Spec.Decisions), "an auditor reads decisions")
	require.ErrorIs(t, consume(t, auditor, h.Spec.Proposals), kerr.TopicAuthorizationFailed, "an auditor reads no proposals")
	require.ErrorIs(t, consume(t, auditor, h.Spec.Grants), kerr.TopicAuthorizationFailed, "an auditor reads no grants")
	require.ErrorIs(t, produce(t, client(t, auditor), h.Spec.Grants), kerr.TopicAuthorizationFailed, "an auditor writes nothing")
}

// TestMandatedWorksWithExactlyThePlannedACLs: 'mandatectl acls apply'
// creates on the broker exactly what 'mandatectl acls plan' prints, and the
// daemon, connecting as a principal with only those ACLs, decides and
// publishes.
func TestMandatedWorksWithExactlyThePlannedACLs(t *testing.T) {
	t.Parallel()
	sasl := testenv.SASLBrokers(t)
	sasl.RequireAuthorizer(t)
	h := harness.New(t, harness.Options{Brokers: sasl.Brokers, KafkaOpts: sasl.Opts()})
	svc := sasl.NewUser(t, "mandated-svc")

	flags := append([]string{"--mandated", svc.Principal()}, aclScope(h)...)
	planned := strings.Split(strings.TrimSpace(mandatectlACLs(t, sasl, append([]string{"plan"}, flags...)...)), "\n")
	applied := mandatectlACLs(t, sasl, append([]string{"apply"}, flags...)...)
	require.Equal(t, "created "+strings.Join(planned, "\ncreated ")+"\n", applied)

	// The broker holds exactly the plan for this principal.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sasl.Admin(t).DescribeACLs(ctx, kadm.NewACLs().Allow(svc.Principal()).AllowHosts().AnyResource().
		ResourcePatternType(kadm.ACLPatternAny).Operations(kadm.OpAny))
	require.NoError(t, err)
	// A planned line is "<role> allow <principal> <OPERATION> <resource> <name> (<pattern>)".
	var onBroker, plannedEntries []string
	for _, r := range res {
		require.NoError(t, r.Err)
		for _, d := range r.Described {
			onBroker = append(onBroker, strings.Join([]string{d.Principal, strings.ToUpper(d.Operation.String()),
				strings.ToLower(d.Type.String()), d.Name, "(" + strings.ToLower(d.Pattern.String()) + ")"}, " "))
		}
	}
	for _, line := range planned {
		f := strings.Fields(line)
		require.Len(t, f, 7, "a planned ACL: %q", line)
		plannedEntries = append(plannedEntries, strings.Join(f[2:], " "))
	}
	sort.Strings(onBroker)
	sort.Strings(plannedEntries)
	require.Equal(t, plannedEntries, onBroker)

	args := append(mandatedArgs(h), "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", svc.User,
		"--kafka-sasl-password-file", writeSecret(t, svc.Password))
	p := procs.StartMandated(t, "acl", args, nil)
	p.WaitReady(90 * time.Second)
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", "m", 1)).Outcome)
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(proposeCmd("acme", "m", "k", 100)).Outcome)
	p.Signal(syscall.SIGTERM)
	code, err := p.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, "a SIGTERM is a clean exit")
	require.NotContains(t, p.Log(), svc.Password)
}
