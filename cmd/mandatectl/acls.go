package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
)

const aclsUsage = `usage: mandatectl acls plan|apply [flags]

  plan    print the Kafka ACLs each role needs (nothing is contacted)
  apply   create them on the broker (needs a principal allowed to alter ACLs)

Roles: agents write proposals; platforms write proposals and read decisions;
grantors and reconcilers write grants and read decisions; auditors read
decisions and dead letters; mandated reads both inputs in its group and
writes (and reads back) decisions and dead letters under its relay's
transactional ids. Run the broker with an authorizer and
allow.everyone.if.no.acl.found=false, so that nothing else is allowed.

Run 'mandatectl acls plan --help' for the flags.
`

func runACLs(a *app, args []string) int {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "plan":
		return runACLsCmd(a, args, false)
	case "apply":
		return runACLsCmd(a, args, true)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.stdout, aclsUsage)
		return exitOK
	}
	fmt.Fprint(a.stderr, aclsUsage)
	return exitUsage
}

func runACLsCmd(a *app, args []string, apply bool) int {
	name := "acls plan"
	description := `Print the Kafka ACLs (all ALLOW, any host) that give each role exactly what
it needs on mandated's topics, group and transactional ids. A principal is
"User:<name>" (a bare name means User:<name>); repeat a role flag or
comma-separate. Nothing is contacted.`
	if apply {
		name = "acls apply"
		description = `Create the ACLs 'mandatectl acls plan' prints with the same flags (creating
an existing ACL again changes nothing), and print each one created.
Connect as a principal allowed to alter ACLs (a super user).`
	}
	f := a.newFlagSet(name, "--agent P --platform P --grantor P --reconciler P --auditor P --mandated P [flags]", description,
		"mandatectl "+name+" --mandated User:mandated --agent User:agent-runner --platform User:platform \\\n    --grantor User:treasury --reconciler User:reconciler --auditor User:audit")
	var kc kafkaConn
	if apply {
		kc.register(f)
	}
	var topics topicNames
	topics.register(f)
	var roles admin.ACLRoles
	var agents, platforms, grantors, reconcilers, auditors, mandated listFlag
	f.Var(&agents, "agent", "an agents' `principal` (write proposals)")
	f.Var(&platforms, "platform", "a platforms' `principal` (write proposals, read decisions)")
	f.Var(&grantors, "grantor", "a grantors' `principal` (write grants, read decisions)")
	f.Var(&reconcilers, "reconciler", "a reconcilers' `principal` (write grants, read decisions)")
	f.Var(&auditors, "auditor", "an auditors' `principal` (read decisions and dead letters)")
	f.Var(&mandated, "mandated", "mandated's own `principal`")
	var scope admin.ACLScope
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&scope.Group, "group", processor.GroupDefault, "mandated's consumer group id")
		fs.StringVar(&scope.TransactionalIDPrefix, "relay-transactional-id-prefix", outbox.TransactionalIDDefault, "prefix of the relay's transactional ids")
	})
	f.StringVar(&scope.ReaderGroupPrefix, "reader-group-prefix", "", "let platforms and auditors consume decisions in groups with this id prefix (default: none; they assign partitions)")
	timeout := f.Duration("timeout", 30*time.Second, "bound on apply")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	roles = admin.ACLRoles{Agents: agents, Platforms: platforms, Grantors: grantors, Reconcilers: reconcilers,
		Auditors: auditors, Mandated: mandated}
	scope.ProposalsTopic, scope.GrantsTopic, scope.DecisionsTopic, scope.DeadLetterTopic = topics.proposals, topics.grants, topics.decisions, topics.deadLetter
	plan, err := admin.PlanACLs(roles, scope)
	if err != nil {
		return f.usageErr("%v", err)
	}
	if len(plan) == 0 {
		return f.usageErr("name at least one principal (--agent, --platform, --grantor, --reconciler, --auditor, --mandated)")
	}
	if !apply {
		for _, acl := range plan {
			fmt.Fprintln(a.stdout, acl)
		}
		return exitOK
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		a.errorf("acls apply: kafka client: %v", err)
		return exitFailed
	}
	defer cl.Close()
	if err := admin.ApplyACLs(ctx, kadm.NewClient(cl), plan); err != nil {
		a.errorf("acls apply: %v", err)
		return exitFailed
	}
	for _, acl := range plan {
		fmt.Fprintf(a.stdout, "created %s\n", acl)
	}
	return exitOK
}
