package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
)

func aclsCommand() *command {
	usage := "--agent P --platform P --grantor P --reconciler P --auditor P --mandated P [flags]"
	example := func(name string) []string {
		return []string{"mandatectl " + name + " --mandated User:mandated --agent User:agent-runner --platform User:platform \\\n" +
			"    --grantor User:treasury --reconciler User:reconciler --auditor User:audit"}
	}
	return group(&command{
		name:    "acls",
		group:   groupSetup,
		summary: "print or create the Kafka ACLs of each role (plan, apply)",
		usage:   "plan|apply [flags]",
		description: `  plan    print the Kafka ACLs each role needs (nothing is contacted)
  apply   create them on the broker (needs a principal allowed to alter ACLs)

Roles: agents write proposals; platforms write proposals and read decisions;
grantors and reconcilers write grants and read decisions; auditors read
decisions and dead letters; mandated reads both inputs in its group and
writes (and reads back) decisions and dead letters under its relay's
transactional ids. Run the broker with an authorizer and
allow.everyone.if.no.acl.found=false, so that nothing else is allowed.

Run 'mandatectl acls plan --help' for the flags.`,
	},
		leafWith(&command{
			name:    "plan",
			summary: "print the Kafka ACLs each role needs (nothing is contacted)",
			usage:   usage,
			description: `Print the Kafka ACLs (all ALLOW, any host) that give each role exactly what
it needs on mandated's topics, group and transactional ids. A principal is
"User:<name>" (a bare name means User:<name>); repeat a role flag or
comma-separate. Nothing is contacted.`,
			examples: example("acls plan"),
		}, func() *aclsOptions { return &aclsOptions{} }, runACLs),
		leafWith(&command{
			name:    "apply",
			summary: "create them on the broker (needs a principal allowed to alter ACLs)",
			usage:   usage,
			description: `Create the ACLs 'mandatectl acls plan' prints with the same flags (creating
an existing ACL again changes nothing), and print each one created.
Connect as a principal allowed to alter ACLs (a super user).`,
			examples: example("acls apply"),
		}, func() *aclsOptions { return &aclsOptions{apply: true} }, runACLs),
	)
}

// aclsOptions are the flags of acls plan and acls apply (which also
// connects).
type aclsOptions struct {
	apply   bool
	kc      kafkaConn
	topics  topicNames
	roles   struct{ agents, platforms, grantors, reconcilers, auditors, mandated listFlag }
	scope   admin.ACLScope
	timeout time.Duration

	plan  []admin.ACL
	kopts []kgo.Opt
}

func (o *aclsOptions) register(f *flagSet) {
	if o.apply {
		o.kc.register(f)
	}
	o.topics.register(f)
	r := &o.roles
	f.Var(&r.agents, "agent", "an agents' `principal` (write proposals)")
	f.Var(&r.platforms, "platform", "a platforms' `principal` (write proposals, read decisions)")
	f.Var(&r.grantors, "grantor", "a grantors' `principal` (write grants, read decisions)")
	f.Var(&r.reconcilers, "reconciler", "a reconcilers' `principal` (write grants, read decisions)")
	f.Var(&r.auditors, "auditor", "an auditors' `principal` (read decisions and dead letters)")
	f.Var(&r.mandated, "mandated", "mandated's own `principal`")
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&o.scope.Group, "group", processor.GroupDefault, "mandated's consumer group id")
		fs.StringVar(&o.scope.TransactionalIDPrefix, "relay-transactional-id-prefix", outbox.TransactionalIDDefault, "prefix of the relay's transactional ids")
	})
	f.StringVar(&o.scope.ReaderGroupPrefix, "reader-group-prefix", "", "let platforms and auditors consume decisions in groups with this id prefix (default: none; they assign partitions)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on apply")
}

func (o *aclsOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	r := o.roles
	roles := admin.ACLRoles{Agents: r.agents, Platforms: r.platforms, Grantors: r.grantors, Reconcilers: r.reconcilers,
		Auditors: r.auditors, Mandated: r.mandated}
	o.scope.ProposalsTopic, o.scope.GrantsTopic = o.topics.proposals, o.topics.grants
	o.scope.DecisionsTopic, o.scope.DeadLetterTopic = o.topics.decisions, o.topics.deadLetter
	var err error
	if o.plan, err = admin.PlanACLs(roles, o.scope); err != nil {
		return err
	}
	if len(o.plan) == 0 {
		return errors.New("name at least one principal (--agent, --platform, --grantor, --reconciler, --auditor, --mandated)")
	}
	if o.apply {
		o.kopts, err = o.kc.opts()
	}
	return err
}

func runACLs(ctx context.Context, a *app, o *aclsOptions) int {
	if !o.apply {
		for _, acl := range o.plan {
			fmt.Fprintln(a.stdout, acl)
		}
		return exitOK
	}
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	cl, err := kgo.NewClient(o.kopts...)
	if err != nil {
		a.errorf("acls apply: kafka client: %v", err)
		return exitFailed
	}
	defer cl.Close()
	if err := admin.ApplyACLs(ctx, kadm.NewClient(cl), o.plan); err != nil {
		a.errorf("acls apply: %v", err)
		return exitFailed
	}
	for _, acl := range o.plan {
		fmt.Fprintf(a.stdout, "created %s\n", acl)
	}
	return exitOK
}
