package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Kafka ACLs: who may do what on mandated's topics. The list of ACLs each
// role needs follows from the topic names, mandated's group and its relay's
// transactional ids (processor.GroupDefault, outbox.TransactionalIDDefault);
// 'mandatectl acls plan|apply' prints and creates them. Every entry is an
// ALLOW from any host; a broker with allow.everyone.if.no.acl.found=false
// then refuses the rest.

// ACLRoles names the principals ("User:<name>") of each role.
type ACLRoles struct {
	// Agents propose: write the proposals topic, nothing else.
	Agents []string
	// Platforms run the actions: write the proposals topic (begin, commit,
	// cancel, report_unknown) and read the decisions topic.
	Platforms []string
	// Grantors grant and revoke: write the grants topic and read the
	// decisions topic (to see their answer).
	Grantors []string
	// Reconcilers resolve in-doubt authorizations: write the grants topic
	// and read the decisions topic.
	Reconcilers []string
	// Auditors read the decisions and dead-letter topics.
	Auditors []string
	// Mandated is the daemon: it reads both inputs in its consumer group,
	// and writes (and reads back, to resume) the decisions and dead-letter
	// topics under its relay's transactional ids.
	Mandated []string
}

// ACLScope names the resources the ACLs are about.
type ACLScope struct {
	ProposalsTopic, GrantsTopic, DecisionsTopic, DeadLetterTopic string
	// Group is mandated's consumer group.
	Group string
	// TransactionalIDPrefix is the relay's transactional id prefix; the
	// ACL covers "<prefix>." (ids are "<prefix>.<decisions topic>.<partition>").
	TransactionalIDPrefix string
	// ReaderGroupPrefix, when set, lets platforms and auditors read decisions
	// in consumer groups whose ids start with it. Defaults to none (readers
	// assign partitions, as mandatectl does).
	ReaderGroupPrefix string
}

// ACL is one ALLOW entry.
type ACL struct {
	Role      string
	Principal string
	Operation kadm.ACLOperation
	Resource  kmsg.ACLResourceType
	Name      string
	Pattern   kadm.ACLPattern
}

// String renders an entry as 'mandatectl acls plan' prints it.
func (a ACL) String() string {
	return fmt.Sprintf("%-12s allow %-28s %-6s %-16s %s (%s)", a.Role, a.Principal, strings.ToUpper(a.Operation.String()),
		strings.ToLower(a.Resource.String()), a.Name, strings.ToLower(a.Pattern.String()))
}

// NormalizePrincipal turns "name" into "User:name"; "Type:name" stays.
func NormalizePrincipal(p string) (string, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		return "", errors.New("an empty principal")
	}
	if !strings.Contains(p, ":") {
		p = "User:" + p
	}
	if typ, name, _ := strings.Cut(p, ":"); typ == "" || name == "" || name == "*" {
		return "", fmt.Errorf("principal %q must be Type:name with a name (no wildcards)", p)
	}
	return p, nil
}

// PlanACLs returns the ACLs of every role, in a stable order.
func PlanACLs(roles ACLRoles, scope ACLScope) ([]ACL, error) {
	for name, v := range map[string]string{"ProposalsTopic": scope.ProposalsTopic, "GrantsTopic": scope.GrantsTopic,
		"DecisionsTopic": scope.DecisionsTopic, "DeadLetterTopic": scope.DeadLetterTopic, "Group": scope.Group,
		"TransactionalIDPrefix": scope.TransactionalIDPrefix} {
		if v == "" {
			return nil, fmt.Errorf("acls: %s is required", name)
		}
	}
	var out []ACL
	topic := func(role string, ps []string, op kadm.ACLOperation, name string) {
		for _, p := range ps {
			out = append(out, ACL{Role: role, Principal: p, Operation: op, Resource: kmsg.ACLResourceTypeTopic, Name: name, Pattern: kadm.ACLPatternLiteral})
		}
	}
	readerGroups := func(role string, ps []string) {
		if scope.ReaderGroupPrefix == "" {
			return
		}
		for _, p := range ps {
			out = append(out, ACL{Role: role, Principal: p, Operation: kadm.OpRead, Resource: kmsg.ACLResourceTypeGroup,
				Name: scope.ReaderGroupPrefix, Pattern: kadm.ACLPatternPrefixed})
		}
	}
	norm := func(role string, ps []string) ([]string, error) {
		seen := map[string]bool{}
		var out []string
		for _, p := range ps {
			n, err := NormalizePrincipal(p)
			if err != nil {
				return nil, fmt.Errorf("acls: %s: %w", role, err)
			}
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
		sort.Strings(out)
		return out, nil
	}
	var err error
	r := roles
	for _, x := range []struct {
		role string
		ps   *[]string
	}{{"agents", &r.Agents}, {"platforms", &r.Platforms}, {"grantors", &r.Grantors}, {"reconcilers", &r.Reconcilers},
		{"auditors", &r.Auditors}, {"mandated", &r.Mandated}} {
		if *x.ps, err = norm(x.role, *x.ps); err != nil {
			return nil, err
		}
	}

	topic("agents", r.Agents, kadm.OpWrite, scope.ProposalsTopic)

	topic("platforms", r.Platforms, kadm.OpWrite, scope.ProposalsTopic)
	topic("platforms", r.Platforms, kadm.OpRead, scope.DecisionsTopic)
	readerGroups("platforms", r.Platforms)

	for _, g := range []struct {
		role string
		ps   []string
	}{{"grantors", r.Grantors}, {"reconcilers", r.Reconcilers}} {
		topic(g.role, g.ps, kadm.OpWrite, scope.GrantsTopic)
		topic(g.role, g.ps, kadm.OpRead, scope.DecisionsTopic)
	}

	topic("auditors", r.Auditors, kadm.OpRead, scope.DecisionsTopic)
	topic("auditors", r.Auditors, kadm.OpRead, scope.DeadLetterTopic)
	readerGroups("auditors", r.Auditors)

	topic("mandated", r.Mandated, kadm.OpRead, scope.ProposalsTopic)
	topic("mandated", r.Mandated, kadm.OpRead, scope.GrantsTopic)
	for _, t := range []string{scope.DecisionsTopic, scope.DeadLetterTopic} {
		topic("mandated", r.Mandated, kadm.OpWrite, t)
		topic("mandated", r.Mandated, kadm.OpRead, t) // the relay resumes after what it finds there
		// Start checks they can back a recovery: not compacted, retained long enough.
		topic("mandated", r.Mandated, kadm.OpDescribeConfigs, t)
	}
	for _, p := range r.Mandated {
		out = append(out,
			ACL{Role: "mandated", Principal: p, Operation: kadm.OpRead, Resource: kmsg.ACLResourceTypeGroup, Name: scope.Group, Pattern: kadm.ACLPatternLiteral},
			ACL{Role: "mandated", Principal: p, Operation: kadm.OpWrite, Resource: kmsg.ACLResourceTypeTransactionalId,
				Name: scope.TransactionalIDPrefix + ".", Pattern: kadm.ACLPatternPrefixed})
	}
	return out, nil
}

// ApplyACLs creates the plan's ACLs (creating an existing ACL again is a
// no-op on the broker) and returns the first failure.
func ApplyACLs(ctx context.Context, adm *kadm.Client, plan []ACL) error {
	for _, a := range plan {
		b := kadm.NewACLs().Allow(a.Principal).AllowHosts("*").Operations(a.Operation).ResourcePatternType(a.Pattern)
		switch a.Resource {
		case kmsg.ACLResourceTypeTopic:
			b = b.Topics(a.Name)
		case kmsg.ACLResourceTypeGroup:
			b = b.Groups(a.Name)
		case kmsg.ACLResourceTypeTransactionalId:
			b = b.TransactionalIDs(a.Name)
		default:
			return fmt.Errorf("acls: resource type %s is not planned", a.Resource)
		}
		res, err := adm.CreateACLs(ctx, b)
		if err != nil {
			return fmt.Errorf("acls: create %s: %w", a, err)
		}
		for _, r := range res {
			if r.Err != nil {
				return fmt.Errorf("acls: create %s: %w %s", a, r.Err, r.ErrMessage)
			}
		}
	}
	return nil
}
