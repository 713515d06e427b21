package admin

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func testScope() ACLScope {
	return ACLScope{ProposalsTopic: "p", GrantsTopic: "g", DecisionsTopic: "d", DeadLetterTopic: "dl",
		Group: "mandated", TransactionalIDPrefix: "relay"}
}

// TestEachRoleIsPlannedExactlyWhatItNeeds: a role's ACLs follow from the
// scope alone, principals are normalized and deduplicated, and readers get
// a group prefix only when one is named.
func TestEachRoleIsPlannedExactlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	topic := func(role, p string, op kadm.ACLOperation, name string) ACL {
		return ACL{Role: role, Principal: p, Operation: op, Resource: kmsg.ACLResourceTypeTopic, Name: name, Pattern: kadm.ACLPatternLiteral}
	}
	plan, err := PlanACLs(ACLRoles{Agents: []string{"alice", "User:alice"}, Grantors: []string{"User:carol", "bob"}}, testScope())
	require.NoError(t, err)
	require.Equal(t, []ACL{
		topic("agents", "User:alice", kadm.OpWrite, "p"),
		topic("grantors", "User:bob", kadm.OpWrite, "g"),
		topic("grantors", "User:carol", kadm.OpWrite, "g"),
		topic("grantors", "User:bob", kadm.OpRead, "d"),
		topic("grantors", "User:carol", kadm.OpRead, "d"),
	}, plan)

	scope := testScope()
	scope.ReaderGroupPrefix = "rd"
	plan, err = PlanACLs(ACLRoles{Auditors: []string{"aud"}, Mandated: []string{"svc"}}, scope)
	require.NoError(t, err)
	require.Contains(t, plan, ACL{Role: "auditors", Principal: "User:aud", Operation: kadm.OpRead, Resource: kmsg.ACLResourceTypeGroup,
		Name: "rd", Pattern: kadm.ACLPatternPrefixed})
	require.Contains(t, plan, ACL{Role: "mandated", Principal: "User:svc", Operation: kadm.OpWrite,
		Resource: kmsg.ACLResourceTypeTransactionalId, Name: "relay.", Pattern: kadm.ACLPatternPrefixed})
	require.Contains(t, plan, topic("mandated", "User:svc", kadm.OpDescribeConfigs, "dl"))
	require.Len(t, plan, 3+10, "auditors: two topics and the group prefix; mandated: ten")
}

func TestAPlanNamesWhatItCannotBeMadeOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		roles ACLRoles
		scope func(*ACLScope)
		err   string
	}{
		{"a scope without its group", ACLRoles{Agents: []string{"a"}}, func(s *ACLScope) { s.Group = "" }, "acls: Group is required"},
		{"an empty principal", ACLRoles{Agents: []string{" "}}, func(*ACLScope) {}, "acls: agents: an empty principal"},
		{"a wildcard principal", ACLRoles{Auditors: []string{"User:*"}}, func(*ACLScope) {}, `acls: auditors: principal "User:*" must be Type:name with a name (no wildcards)`},
	} {
		scope := testScope()
		c.scope(&scope)
		_, err := PlanACLs(c.roles, scope)
		require.EqualError(t, err, c.err, c.name)
	}
}
