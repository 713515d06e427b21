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
	"strings"
	"syscall"
	"time"

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
	return newTree().execute(&app{ctx: ctx, stdout: stdout, stderr: stderr}, args)
}

// newTree builds mandatectl's command tree: every command, in the order
// docs/cli lists them (the help sorts each group by name).
func newTree() *command {
	return group(&command{
		name:  "mandatectl",
		usage: "<command> [flags]",
		description: `mandatectl operates mandated: schema, topics, commands and their decisions,
and what the on-call engineer needs to see. Connection flags (--brokers, the
Kafka TLS/SASL flags, --database-url, the topic names) are the daemon's and
also read its MANDATED_* environment variables.`,
	},
		migrateCommand(),
		topicsCommand(),
		aclsCommand(),
		decisionKeysCommand(),
		grantorKeysCommand(),
		tokensCommand(),
		sendCommand(specGrant, "create a mandate or replace its terms (grants topic)"),
		sendCommand(specRevoke, "revoke a mandate's unused authority (grants topic)"),
		sendCommand(specPropose, "ask for one use of a mandate"),
		sendCommand(specBegin, "move a reserved authorization to executing"),
		sendCommand(specCommit, "record that the external call happened"),
		sendCommand(specCancel, "give up an authorization"),
		sendCommand(specReportUnknown, "say an executing call's outcome is unknown (in doubt)"),
		sendCommand(specResolve, "settle an in-doubt authorization as committed or cancelled"),
		tailCommand(),
		partitionsCommand(),
		inDoubtCommand(),
		reconcileCommand(),
		inspectCommand(),
		parkedCommand(),
		orgSettingsCommand(),
		shardsCommand(),
		verifyCommand(),
		recoverCommand(),
		repartitionCommand(),
		docsCommand(),
	).link()
}

// app is one invocation's context and output streams.
type app struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	hooks  hooks
	path   string // the leaf command running ("shards move"), for its usage errors
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

// usageErr reports a usage error of the running command and returns its
// exit code.
func (a *app) usageErr(format string, args ...any) int {
	a.errorf("%s: "+format, append([]any{a.path}, args...)...)
	fmt.Fprintf(a.stderr, "run 'mandatectl %s --help' for usage\n", a.path)
	return exitUsage
}

// plural returns "1 thing" or "n things".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// withTimeout bounds ctx by d when d is positive.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}
