package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Admin returns an admin client on the SASL broker as its (super) user,
// closed at cleanup.
func (s SASLKafka) Admin(t testing.TB) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(s.Opts()...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// RequireAuthorizer fails the test unless the SASL broker authorizes
// requests with ACLs (test/infra/kafka.sh with KAFKA_SASL=1 configures an
// authorizer that denies what no ACL allows; a broker started by an older
// script must be restarted).
func (s SASLKafka) RequireAuthorizer(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := s.Admin(t)
	brokers, err := adm.ListBrokers(ctx)
	require.NoError(t, err)
	rcs, err := adm.DescribeBrokerConfigs(ctx, brokers.NodeIDs()...)
	require.NoError(t, err)
	got := map[string]string{}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Value != nil {
				got[c.Key] = *c.Value
			}
		}
	}
	// allow.everyone.if.no.acl.found is the authorizer's own setting, which
	// DescribeConfigs does not show; the tests' refusals prove it.
	if got["authorizer.class.name"] == "" {
		t.Fatalf("the SASL broker at %v runs without an authorizer (authorizer.class.name is empty): "+
			"restart it with the current test/infra/kafka.sh (KAFKA_SASL=1 ... kafka.sh down && up)", s.Brokers)
	}
}

// NewUser creates a SCRAM-SHA-256 user with a random password on the SASL
// broker and returns how to connect as it. At cleanup every ACL naming its
// principal is deleted; the user itself is left (a unique name, without
// ACLs it can do nothing): with Kafka 4.4.0, once any SCRAM credential has
// been deleted, a restarted KRaft broker no longer knows the credentials
// added at format time (kafka-storage --add-scram), and the admin user the
// tests use would be locked out.
func (s SASLKafka) NewUser(t testing.TB, prefix string) SASLKafka {
	t.Helper()
	u := SASLKafka{Brokers: s.Brokers, User: Name(t, prefix), Password: "pw-" + randHex(12)}
	adm := s.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: u.User, Mechanism: kadm.ScramSha256, Iterations: 4096, Password: u.Password}})
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err, "create SCRAM user %s", u.User)
	}
	t.Cleanup(func() {
		cl, err := kgo.NewClient(s.Opts()...)
		if err != nil {
			return
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b := kadm.NewACLs().Allow(u.Principal()).AllowHosts().AnyResource().ResourcePatternType(kadm.ACLPatternAny).Operations(kadm.OpAny)
		if _, err := adm.DeleteACLs(ctx, b); err != nil {
			t.Logf("testenv: delete ACLs of %s: %v", u.User, err)
		}
	})
	return u
}

// Principal is the user's Kafka principal.
func (s SASLKafka) Principal() string { return "User:" + s.User }
