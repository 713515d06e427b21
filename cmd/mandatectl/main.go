// Command mandatectl is the operator's tool for mandated: it applies the
// schema, creates and checks the topics, sends commands and waits for their
// decisions, follows the decisions topic, and answers the questions an
// on-call engineer asks (who owns which partition, how far behind is it,
// what is in doubt, what happened to this mandate, what was parked).
//
// It connects like the daemon: the same --brokers, Kafka TLS/SASL, database
// and topic flags, each also read from the same MANDATED_* environment
// variable (--brokers is MANDATED_BROKERS), so it runs unchanged inside a
// mandated pod or next to the compose stack. Its database queries run in
// read-only transactions, except migrate, org-settings set and repartition.
//
// Exit codes: 0 success (for a command: reserved, granted, executing,
// committed, cancelled, revoked or replayed), 1 a refusal or an operational
// failure (denied, refused, conflict, stale_version, in_doubt, expired; an
// unreachable broker), 2 a usage error or a rejected command, 3 a timeout
// waiting for a decision.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/sink/shardmap"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // an operational failure, or a decision that said no
	exitUsage   = 2 // a usage error, or a command the processor rejected
	exitTimeout = 3 // no decision within --timeout
)

func main() {
	// Fault injection for tests (processor/failpoint), as the daemon's: a
	// test kills mandatectl at a named point of an operator step.
	if v := os.Getenv(failpoint.EnvVar); v != "" {
		if err := failpoint.EnableFromEnv(v); err != nil {
			fmt.Fprintf(os.Stderr, "mandatectl: %s: %v\n", failpoint.EnvVar, err)
			os.Exit(exitUsage)
		}
		fmt.Fprintf(os.Stderr, "mandatectl: fault injection is enabled: %s\n", v)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs mandatectl with args (without the program name) and returns its
// exit code. Tests call it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{ctx: ctx, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		a.usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			return runContext(ctx, append(rest, "--help"), stdout, stderr)
		}
		a.usage(stdout)
		return exitOK
	}
	cmd, ok := commands()[name]
	if !ok {
		fmt.Fprintf(stderr, "mandatectl: unknown command %q\n\n", name)
		a.usage(stderr)
		return exitUsage
	}
	return cmd.run(a, rest)
}

// app is one invocation's context and output streams.
type app struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	hooks  hooks
}

// hooks are the tests' seams in operator steps; nil in production.
type hooks struct {
	mapRead        func() // shards move has read the shard map file
	mapLockWait    func() // shards move waits for the map's lock, held by another edit
	beforeMapWrite func() // shards move is about to write the shard map file
}

func call(f func()) {
	if f != nil {
		f()
	}
}

// errorf prints an error. A password in it (a connection URL or string an
// error quotes, a shard map's url:) is replaced by "***".
func (a *app) errorf(format string, args ...any) {
	fmt.Fprint(a.stderr, "mandatectl: "+shardmap.RedactSecrets(fmt.Sprintf(format, args...))+"\n")
}

type command struct {
	summary string
	group   string
	run     func(a *app, args []string) int
}

// Command groups, in the order the top-level usage lists them.
var groups = []string{"Setup", "Commands (produce, then wait for the decision)", "Operations"}

func commands() map[string]command {
	return map[string]command{
		"migrate":        {"apply the embedded schema migrations (--print shows them)", groups[0], runMigrate},
		"topics":         {"create or check the proposals, grants, decisions and dead-letter topics", groups[0], runTopics},
		"grant":          {"create a mandate or replace its terms (grants topic)", groups[1], commandRunner(specGrant)},
		"revoke":         {"revoke a mandate's unused authority (grants topic)", groups[1], commandRunner(specRevoke)},
		"propose":        {"ask for one use of a mandate", groups[1], commandRunner(specPropose)},
		"begin":          {"move a reserved authorization to executing", groups[1], commandRunner(specBegin)},
		"commit":         {"record that the external call happened", groups[1], commandRunner(specCommit)},
		"cancel":         {"give up an authorization", groups[1], commandRunner(specCancel)},
		"report-unknown": {"say an executing call's outcome is unknown (in doubt)", groups[1], commandRunner(specReportUnknown)},
		"resolve":        {"settle an in-doubt authorization as committed or cancelled", groups[1], commandRunner(specResolve)},
		"tail":           {"follow the decisions topic", groups[2], runTail},
		"partitions":     {"per partition: owner, epoch, offsets, lag, outbox backlog, in-doubt", groups[2], runPartitions},
		"in-doubt":       {"list in-doubt authorizations older than a threshold", groups[2], runInDoubt},
		"reconcile":      {"list in-doubt executions with their tokens; resolve one on the operator's decision", groups[2], runReconcile},
		"inspect":        {"show a mandate, its authorizations and its decision history", groups[2], runInspect},
		"parked":         {"list outbox rows the broker refused for good", groups[2], runParked},
		"org-settings":   {"show or change an org's settings (idempotency-key retention, possible-replay window and policy)", groups[2], runOrgSettings},
		"acls":           {"print or create the Kafka ACLs of each role (plan, apply)", groups[0], runACLs},
		"decision-keys":  {"the deployment's keys that sign every published record (generate, add, revoke, list)", groups[0], runDecisionKeys},
		"grantor-keys":   {"grantor signing keys and each org's grant_signing (generate, add, revoke, list, require, relax)", groups[0], runGrantorKeys},
		"shards":         {"move a partition to another shard; drop the copy a move left (move, drop-moved, moves)", groups[2], runShards},
		"verify":         {"prove the decisions' hash chain and find drift from PostgreSQL", groups[2], runVerify},
		"recover":        {"rebuild partitions whose database went back in time from the decisions topic", groups[2], runRecover},
		"tokens":         {"create, revoke or list the HTTP gateway's per-org bearer tokens", groups[0], runTokens},
		"repartition":    {"change the partition count (fenced, drained, one transaction; then the topics grow)", groups[2], runRepartition},
	}
}

func (a *app) usage(w io.Writer) {
	fmt.Fprint(w, `usage: mandatectl <command> [flags]

mandatectl operates mandated: schema, topics, commands and their decisions,
and what the on-call engineer needs to see. Connection flags (--brokers, the
Kafka TLS/SASL flags, --database-url, the topic names) are the daemon's and
also read its MANDATED_* environment variables.
`)
	byGroup := map[string][]string{}
	cmds := commands()
	for name, c := range cmds {
		byGroup[c.group] = append(byGroup[c.group], name)
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		names := byGroup[g]
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(w, "  %-15s %s\n", n, cmds[n].summary)
		}
	}
	fmt.Fprint(w, `
Run 'mandatectl <command> --help' for a command's flags and examples.

Exit codes: 0 success or a positive decision; 1 a negative decision (denied,
refused, conflict, stale_version, in_doubt, expired) or a failure; 2 a usage
error or a rejected command; 3 no decision within --timeout.
`)
}

// plural returns "1 thing" or "n things".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}
